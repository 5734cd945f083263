// SPDX-License-Identifier: GPL-2.0

//! A small structure in user memory that the kernel writes later: a pinned user page.
//!
//! C header: [`include/linux/mm.h`](srctree/include/linux/mm.h) (`pin_user_pages_fast`)
//!
//! Used for the unload-state buffer: the page is pinned (`FOLL_LONGTERM`) when the structure is
//! registered and written and unpinned at unload, so a process that outlives the module learns
//! the audit's verdict without reading the kernel log.

use core::ptr::NonNull;

use kernel::{
    bindings,
    page::{BorrowedPage, PAGE_SIZE},
    prelude::*,
};

/// `len` bytes at a user address, inside one page that stays pinned while this lives.
///
/// # Invariants
///
/// `page` was pinned by `pin_user_pages_fast` (writable, long-term) and is unpinned by `Drop`;
/// `offset + len <= PAGE_SIZE`.
pub(crate) struct PinnedUser {
    page: NonNull<bindings::page>,
    offset: usize,
    len: usize,
}

// SAFETY: a pinned page may be written and unpinned from any thread.
unsafe impl Send for PinnedUser {}

impl PinnedUser {
    /// Pins the page holding `[addr, addr + len)`, which must be `align`-aligned and not cross a
    /// page boundary (`EINVAL`); `EFAULT` if it is not writable user memory.
    pub(crate) fn new(addr: u64, len: usize, align: usize) -> Result<Self> {
        let addr = usize::try_from(addr).map_err(|_| EINVAL)?;
        if align == 0 || addr % align != 0 || len > PAGE_SIZE {
            return Err(EINVAL);
        }
        let offset = addr % PAGE_SIZE;
        if offset + len > PAGE_SIZE {
            return Err(EINVAL);
        }
        let mut page: *mut bindings::page = core::ptr::null_mut();
        let flags = bindings::FOLL_WRITE | bindings::FOLL_LONGTERM;
        // SAFETY: asks for one page at a user address of the current process; `page` has room
        // for one pointer.
        let n = unsafe { bindings::pin_user_pages_fast(addr - offset, 1, flags, &mut page) };
        if n != 1 {
            return Err(EFAULT);
        }
        let page = NonNull::new(page).ok_or(EFAULT)?;
        // INVARIANT: one page pinned writable and long-term; the range fits in it (checked).
        Ok(Self { page, offset, len })
    }

    /// Writes `data` (at most the registered length) at the start of the structure.
    pub(crate) fn write(&self, data: &[u8]) -> Result {
        if data.len() > self.len {
            return Err(EINVAL);
        }
        // SAFETY: the page is pinned for as long as `self` lives.
        let page = unsafe { BorrowedPage::from_raw(self.page) };
        // SAFETY: the range is inside the page (type invariant). User space may read the bytes
        // at the same time; they are plain integers it polls after unload.
        unsafe { page.write_raw(data.as_ptr(), self.offset, data.len()) }
    }
}

impl Drop for PinnedUser {
    fn drop(&mut self) {
        let mut page = self.page.as_ptr();
        // SAFETY: by the type invariant the page is pinned by us; marking it dirty since we
        // wrote to it.
        unsafe { bindings::unpin_user_pages_dirty_lock(&mut page, 1, true) };
    }
}
