// SPDX-License-Identifier: GPL-2.0

//! The queue a sysmem pool keeps its cached lists in, oldest first.

use kernel::prelude::*;

/// A queue, oldest first, that also gives up its newest entry and any entry by position.
///
/// Taking the oldest leaves a hole at the front until more than half the slots are holes,
/// when they are squeezed out at once: emptying the queue from the front (a trim, the
/// shrinker) moves each entry at most about once, where removing the first element of a
/// vector each time moved all the others (quadratic in the number of cached lists).
///
/// # Invariants
///
/// The slots before `head` are `None`, those from `head` on are `Some`.
pub(super) struct Fifo<T> {
    slots: KVec<Option<T>>,
    head: usize,
}

impl<T> Fifo<T> {
    pub(super) const fn new() -> Self {
        Self {
            slots: KVec::new(),
            head: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len() - self.head
    }

    /// Adds `t` as the newest; returns it if there was no room for it.
    pub(super) fn push_back(&mut self, t: T) -> Option<T> {
        if self.slots.len() == self.slots.capacity() && self.head > 0 {
            self.squeeze();
        }
        if self.slots.reserve(1, GFP_KERNEL_ACCOUNT).is_err() {
            return Some(t);
        }
        // INVARIANT: a `Some` after the others. Room was reserved: this does not allocate.
        let _ = self.slots.push(Some(t), GFP_KERNEL);
        None
    }

    /// Takes the entry at position `i` (0: the oldest).
    pub(super) fn remove(&mut self, i: usize) -> Option<T> {
        let at = self.head.checked_add(i)?;
        if i > 0 {
            // INVARIANT: the `Some`s after it move down one slot.
            return self.slots.remove(at).ok().flatten();
        }
        // INVARIANT: the slot at `head` becomes a hole before `head`.
        let t = self.slots.get_mut(at)?.take();
        self.head += 1;
        if self.head * 2 > self.slots.len() {
            self.squeeze();
        }
        t
    }

    /// Drops the holes at the front.
    fn squeeze(&mut self) {
        // INVARIANT: the holes are exactly the slots before `head`.
        self.slots.retain(|s| s.is_some());
        self.head = 0;
    }

    /// The position of the newest entry for which `f` is true.
    pub(super) fn rposition(&self, mut f: impl FnMut(&T) -> bool) -> Option<usize> {
        let live = self.slots.get(self.head..)?;
        live.iter().rposition(|s| s.as_ref().is_some_and(&mut f))
    }

    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = &T> {
        self.slots.iter().flatten()
    }

    pub(super) fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut T> {
        self.slots.iter_mut().flatten()
    }
}
