// SPDX-License-Identifier: GPL-2.0

//! A page of 64-bit words the kernel writes and user space maps read-only: each store is one
//! atomic, aligned 8-byte write, so a reader never sees half of one.
//!
//! C header: [`include/linux/highmem.h`](srctree/include/linux/highmem.h)

use core::sync::atomic::{AtomicU64, Ordering};

use kernel::{
    bindings,
    page::{BorrowedPage, Page, PAGE_SIZE},
    prelude::*,
};

/// One zeroed page, charged to the memory cgroup of the task that made it.
pub(crate) struct Words {
    page: Page,
}

impl Words {
    /// Words in the page.
    pub(crate) const COUNT: usize = PAGE_SIZE / 8;

    /// A new page of zero words (`ENOMEM` if the page allocator or the cgroup says no).
    pub(crate) fn new() -> Result<Self> {
        let page = Page::alloc_page(GFP_KERNEL_ACCOUNT | __GFP_ZERO)?;
        Ok(Self { page })
    }

    /// Runs `f` on word `i` (`None` past the page).
    fn with_word<R>(&self, i: usize, f: impl FnOnce(&AtomicU64) -> R) -> Option<R> {
        if i >= Self::COUNT {
            return None;
        }
        // SAFETY: the page is ours while `self` lives; `kmap_local_page` maps it (its direct
        // map address without highmem) until the `kunmap_local` below, in this context only.
        let base = unsafe { bindings::kmap_local_page(self.page.as_ptr()) };
        // SAFETY: word `i` is inside the page and 8-byte aligned (a page is); every access to
        // the page's words, ours and user space's (a read-only mapping), is atomic and aligned,
        // so an `AtomicU64` there races with none.
        let r = f(unsafe { AtomicU64::from_ptr(base.cast::<u64>().add(i)) });
        // SAFETY: `base` is the mapping made above, in this context, unmapped once.
        unsafe { bindings::kunmap_local(base) };
        Some(r)
    }

    /// Stores `v` in word `i` (release: what was written before it is seen with it). Nothing
    /// past the page.
    pub(crate) fn store(&self, i: usize, v: u64) {
        self.with_word(i, |w| w.store(v, Ordering::Release));
    }

    /// The page, for a user mapping.
    pub(crate) fn page(&self) -> BorrowedPage<'_> {
        // SAFETY: `Page` holds a valid, non-null page while `self` lives, which the borrow's
        // lifetime is tied to.
        unsafe { BorrowedPage::from_raw(core::ptr::NonNull::new_unchecked(self.page.as_ptr())) }
    }
}
