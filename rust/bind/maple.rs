// SPDX-License-Identifier: GPL-2.0

//! A range allocator that may be shared between threads: the kernel's maple tree in
//! allocation mode.
//!
//! C header: [`include/linux/maple_tree.h`](srctree/include/linux/maple_tree.h)
//!
//! 7.2's `kernel::maple_tree::MapleTreeAlloc` is neither `Send` nor `Sync` (its raw tree is a C
//! structure with pointers), although every `mtree_*` call it makes takes the tree's own
//! spinlock. [`RangeAlloc`] says so, for the one use ruvm has: ranges of a size, given back by
//! their first index.

use kernel::{
    maple_tree::{AllocErrorKind, MapleTreeAlloc},
    prelude::*,
};

/// Ranges of indices, each remembered with its length.
#[pin_data]
pub(crate) struct RangeAlloc {
    #[pin]
    tree: MapleTreeAlloc<KBox<usize>>,
}

// SAFETY: the tree owns its entries (`KBox<usize>`, which are `Send`), and may be used and
// dropped from any thread.
unsafe impl Send for RangeAlloc {}
// SAFETY: every method of `MapleTreeAlloc` used here (`alloc_range`, `erase`) takes the tree's
// internal spinlock for its whole operation, so calls from several threads are serialised.
unsafe impl Sync for RangeAlloc {}

impl RangeAlloc {
    /// An empty allocator.
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            tree <- MapleTreeAlloc::new(),
        })
    }

    /// A free range of `len` indices in `[first, last]`; returns its first index. `ENOSPC` when
    /// none is left, `ENOMEM` when the tree cannot grow.
    pub(crate) fn alloc(&self, len: usize, first: usize, last: usize) -> Result<usize> {
        let entry = KBox::new(len, GFP_KERNEL)?;
        self.tree
            .alloc_range(len, entry, first..=last, GFP_KERNEL)
            .map_err(|e| match e.cause {
                AllocErrorKind::AllocError(_) => ENOMEM,
                _ => ENOSPC,
            })
    }

    /// Gives back the range that starts at `first`.
    pub(crate) fn free(&self, first: usize) {
        drop(self.tree.erase(first));
    }
}
