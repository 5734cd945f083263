// SPDX-License-Identifier: GPL-2.0

//! Sysmem chunks: naturally aligned blocks of `2^order` pages from the page allocator.
//!
//! C header: [`include/linux/gfp.h`](srctree/include/linux/gfp.h)
//!
//! The 7.2 `kernel::page::Page` covers order-0 pages only. A chunk here is one high-order
//! allocation made with `__GFP_COMP` (so that each of its pages can be mapped on its own, as
//! `vm_insert_page` requires), freed with `__free_pages` of the same order.

use core::ptr::NonNull;

use kernel::{
    bindings,
    page::{BorrowedPage, PAGE_SIZE},
    prelude::*,
};

/// How the chunks of a mem are allocated.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkFlags {
    /// Zero the pages (`__GFP_ZERO`).
    pub(crate) zero: bool,
    /// Fail fast rather than reclaim and compact hard (`__GFP_NORETRY` instead of
    /// `__GFP_RETRY_MAYFAIL`): for a high-order attempt that has a smaller fallback.
    pub(crate) fail_fast: bool,
}

const fn gfp_bit(bit: u32) -> bindings::gfp_t {
    1 << bit
}

/// One chunk: `2^order` contiguous pages.
///
/// # Invariants
///
/// `page` is the first page of a block of `2^order` pages returned by `alloc_pages(.., order)`
/// (a compound page when `order > 0`), owned by this object and freed by its `Drop`.
pub(crate) struct Chunk {
    page: NonNull<bindings::page>,
    order: u32,
}

// SAFETY: a block of pages may be freed from any thread.
unsafe impl Send for Chunk {}
// SAFETY: `&Chunk` only gives out pointers to, and shared borrows of, the pages; it never
// touches their contents.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// Allocates `2^order` pages. Charged to the calling task's memory cgroup, never from the
    /// emergency reserves, and never by invoking the OOM killer: under pressure it fails with
    /// `ENOMEM` instead.
    pub(crate) fn alloc(order: u32, flags: ChunkFlags) -> Result<Self> {
        if order > bindings::MAX_PAGE_ORDER {
            return Err(EINVAL);
        }
        let mut gfp = bindings::GFP_KERNEL
            | gfp_bit(bindings::___GFP_ACCOUNT_BIT)
            | gfp_bit(bindings::___GFP_NOMEMALLOC_BIT)
            | bindings::__GFP_NOWARN;
        gfp |= if flags.fail_fast {
            gfp_bit(bindings::___GFP_NORETRY_BIT)
        } else {
            gfp_bit(bindings::___GFP_RETRY_MAYFAIL_BIT)
        };
        if order > 0 {
            gfp |= gfp_bit(bindings::___GFP_COMP_BIT);
        }
        if flags.zero {
            gfp |= bindings::__GFP_ZERO;
        }
        // SAFETY: `alloc_pages` accepts any flags and any order up to `MAX_PAGE_ORDER`.
        let page = unsafe { bindings::alloc_pages(gfp, order) };
        let page = NonNull::new(page).ok_or(ENOMEM)?;
        // INVARIANT: `page` heads a fresh block of `2^order` pages that we now own.
        Ok(Self { page, order })
    }

    /// The allocation order.
    pub(crate) fn order(&self) -> u32 {
        self.order
    }

    /// The number of `PAGE_SIZE` pages.
    pub(crate) fn pages(&self) -> usize {
        1 << self.order
    }

    /// The `i`-th page of the chunk, as a raw pointer (for mapping functions).
    pub(crate) fn page_ptr(&self, i: usize) -> Option<NonNull<bindings::page>> {
        if i >= self.pages() {
            return None;
        }
        // SAFETY: the block's `struct page`s are contiguous (a buddy block never crosses a
        // memory section), and `i` is inside the block.
        Some(unsafe { self.page.add(i) })
    }

    /// The `i`-th page of the chunk, borrowed for as long as the chunk lives.
    pub(crate) fn page(&self, i: usize) -> Option<BorrowedPage<'_>> {
        let p = self.page_ptr(i)?;
        // SAFETY: `p` is a page of this chunk, valid until the chunk is dropped, which the
        // borrow of `self` outlives.
        Some(unsafe { BorrowedPage::from_raw(p) })
    }
}

impl Chunk {
    /// Zeroes `len` bytes from byte `offset` of the chunk. The caller owns that range: nothing
    /// else reads or writes it meanwhile (for a vidmem chunk being handed back: its mem is
    /// gone, and the copy engine only reaches chunks of live mems).
    pub(crate) fn zero(&self, offset: usize, len: usize) -> Result {
        let end = offset.checked_add(len).ok_or(EINVAL)?;
        if end > self.pages() * PAGE_SIZE {
            return Err(EINVAL);
        }
        let mut at = offset;
        while at < end {
            let (index, in_page) = (at / PAGE_SIZE, at % PAGE_SIZE);
            let n = (end - at).min(PAGE_SIZE - in_page);
            let page = self.page(index).ok_or(EINVAL)?;
            // SAFETY: the range is inside the chunk and, by this function's contract, no one
            // else accesses it now.
            unsafe { page.fill_zero_raw(in_page, n)? };
            at += n;
        }
        Ok(())
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: by the type invariant we own the block, allocated with this order.
        unsafe { bindings::__free_pages(self.page.as_ptr(), self.order) };
    }
}
