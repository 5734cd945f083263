// SPDX-License-Identifier: GPL-2.0

//! A red-black tree that keeps the nodes of the entries it loses for the next ones (called a
//! tree, not a table, so that no reader of a removal path mistakes it for a DMA table or a page
//! table): the indexes of live mems (the registry, a file's handles and offsets), where a freed mem's entries are
//! soon followed by a new mem's, then allocate nothing.

use kernel::{
    prelude::*,
    rbtree::{RBTree, RBTreeNodeReservation},
};

/// An [`RBTree`] and the nodes of removed entries, up to a fixed number.
pub(crate) struct KeptTree<K, V> {
    tree: RBTree<K, V>,
    spare: KVec<RBTreeNodeReservation<K, V>>,
}

/// A node for one insertion into a [`KeptTree`]: a kept one, or a new one.
pub(crate) struct Slot<K, V>(RBTreeNodeReservation<K, V>);

impl<K: Ord, V> KeptTree<K, V> {
    /// An empty table that keeps up to `keep` nodes.
    pub(crate) fn new(keep: usize) -> Result<Self> {
        Ok(Self {
            tree: RBTree::new(),
            spare: KVec::with_capacity(keep, GFP_KERNEL)?,
        })
    }

    /// The value at `key`.
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.tree.get(key)
    }

    /// Every entry, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.tree.iter()
    }

    /// Every value, in key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.tree.values()
    }

    /// `f` of the first entry at or after `key` (a walk that lets go of its lock between
    /// entries goes on from the key after the last it saw).
    pub(crate) fn first_from<R>(&self, key: &K, f: impl FnOnce(&K, &V) -> R) -> Option<R> {
        let cursor = self.tree.cursor_lower_bound(key)?;
        let (k, v) = cursor.current();
        Some(f(k, v))
    }

    /// A node for one insertion (a kept one if there is one), taken before the insertion so
    /// that nothing can fail after.
    pub(crate) fn slot(&mut self) -> Result<Slot<K, V>> {
        match self.spare.pop() {
            Some(node) => Ok(Slot(node)),
            None => Ok(Slot(RBTreeNodeReservation::new(GFP_KERNEL_ACCOUNT)?)),
        }
    }

    /// Keeps a slot that was not used (or frees it, with no room to keep it).
    pub(crate) fn unused(&mut self, slot: Slot<K, V>) {
        let _ = self.spare.push_within_capacity(slot.0);
    }

    /// Inserts `value` at `key`, which no entry has: the callers' keys are unique.
    pub(crate) fn insert(&mut self, slot: Slot<K, V>, key: K, value: V) {
        // Nothing is replaced (unique keys); were it, the old entry would be dropped.
        let _ = self.tree.insert(slot.0.into_node(key, value));
    }

    /// Removes the entry at `key`, keeping its node, and returns what `take` makes of its value
    /// (the value itself is dropped here, so `take` keeps what it needs of it: a clone).
    pub(crate) fn remove_with<R>(&mut self, key: &K, take: impl FnOnce(&V) -> R) -> Option<R> {
        let entry = self.tree.find_mut(key)?;
        let taken = take(entry.get());
        // A node with no room to be kept is freed.
        let _ = self
            .spare
            .push_within_capacity(entry.remove_node().into_reservation());
        Some(taken)
    }
}
