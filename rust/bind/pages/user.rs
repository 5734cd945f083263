// SPDX-License-Identifier: GPL-2.0

//! A [`ChunkList`] of a process's own pages, pinned long-term (`RUVM_IOCTL_MEM_REGISTER`).
//!
//! C header: [`include/linux/mm.h`](srctree/include/linux/mm.h) (`pin_user_pages_fast`,
//! `unpin_user_pages_dirty_lock`)
//!
//! The list's chunks are the pages a range of the calling process maps, one page a chunk,
//! pinned with `FOLL_LONGTERM` (the kernel moves them out of movable zones and CMA first, and
//! refuses mappings it cannot pin for long: fs-dax, secretmem, a shared writable mapping of a
//! file whose filesystem tracks dirty pages), always writable: a device and the kernel write
//! them, so a read-only mapping is never pinned (a private mapping's pages are broken out of
//! the file or shared page they were, as for any write). They are not the list's: its drop
//! unpins them, marking them dirty, rather than freeing them. The pins are counted in the address space's `pinned_vm` (its
//! `VmPin`), bounded by the caller's `RLIMIT_MEMLOCK` unless it has `CAP_IPC_LOCK`, as
//! RDMA's memory registration counts them.

use core::ptr::NonNull;

use kernel::{
    bindings,
    ffi::c_int,
    mm::Mm,
    prelude::*,
    sync::{aref::ARef, Arc},
};

use super::{ChunkList, HeadVec, Heads};

/// Pages pinned at one `pin_user_pages_fast` call at most.
const BATCH: c_int = 1 << 16;

/// `CAP_IPC_LOCK`, as `capable` takes it.
const CAP_IPC_LOCK: c_int = 14;
const _: () = assert!(CAP_IPC_LOCK as u32 == bindings::CAP_IPC_LOCK);

/// What a list of pinned user pages holds besides the pins: the address space whose
/// `pinned_vm` counts them.
pub(super) struct UserPins {
    mm: ARef<Mm>,
    pages: i64,
}

impl UserPins {
    /// Unpins `pages` (the list's, all of them pinned by [`ChunkList::pin_user`]), marking
    /// them dirty (a device may have written them), and takes them out of `pinned_vm`.
    /// Process context (marking a page dirty may take its lock).
    pub(super) fn unpin(self, pages: &[NonNull<bindings::page>]) {
        unpin(pages, true);
        // SAFETY: `mm` is held (`mmgrab`), so its structure is valid; `pinned_vm` is atomic.
        unsafe {
            bindings::atomic64_sub(
                self.pages,
                &raw mut (*self.mm.as_raw()).__bindgen_anon_1.pinned_vm,
            )
        };
    }
}

/// Unpins `pages`, each pinned once by `pin_user_pages_fast`.
fn unpin(pages: &[NonNull<bindings::page>], dirty: bool) {
    if pages.is_empty() {
        return;
    }
    // CAST: `NonNull<page>` has the layout of `*mut page`; the function only reads the array.
    let ptr = pages.as_ptr().cast::<*mut bindings::page>().cast_mut();
    // SAFETY: every page was pinned once by `pin_user_pages_fast` and is unpinned once here.
    unsafe { bindings::unpin_user_pages_dirty_lock(ptr, pages.len(), dirty) };
}

/// The calling task's `RLIMIT_MEMLOCK` soft limit, in pages (`u64::MAX` for unlimited).
fn memlock_limit_pages() -> usize {
    let task = kernel::current!();
    // SAFETY: the current task's `signal` is valid while it runs; the limit is read once (it
    // may change under us, as `rlimit()` allows).
    let bytes = unsafe {
        let signal = (*task.as_ptr()).signal;
        core::ptr::read_volatile(
            &raw const (*signal).rlim[bindings::RLIMIT_MEMLOCK as usize].rlim_cur,
        )
    };
    bytes / kernel::page::PAGE_SIZE
}

/// Whether the calling task may lock memory beyond its limit (`CAP_IPC_LOCK`).
fn may_lock_beyond() -> bool {
    // SAFETY: `capable` only reads the current task's credentials.
    unsafe { bindings::capable(CAP_IPC_LOCK) }
}

/// How pinning a range of the calling process failed.
pub(crate) enum PinError {
    /// Beyond `RLIMIT_MEMLOCK` (counted with the address space's other pins).
    Limit,
    /// The kernel refused to pin a page (its errno: the range changed under the call, or
    /// the mapping is one it does not pin long-term).
    Refused(Error),
    /// No memory, or a pending signal.
    Other(Error),
}

impl<T: Send + Sync> ChunkList<T> {
    /// Pins the `pages` pages from `addr` (page-aligned) of the calling process, long-term
    /// and writable (a private mapping's pages are then the process's own copies, never a
    /// file's or another process's), as a list of one-page chunks tagged `tag`. `stop` is asked
    /// between batches (a pending signal). On failure nothing stays pinned or counted.
    pub(crate) fn pin_user(
        addr: usize,
        pages: usize,
        tag: T,
        mut stop: impl FnMut() -> Result,
    ) -> core::result::Result<Arc<Self>, PinError> {
        let mm = super::super::vma::current_mm().ok_or(PinError::Other(EFAULT))?;
        let count = i64::try_from(pages).map_err(|_| PinError::Other(EINVAL))?;
        if pages == 0 {
            return Err(PinError::Other(EINVAL));
        }
        // SAFETY: `mm` is held; `pinned_vm` is atomic.
        let pinned = unsafe {
            bindings::atomic64_add_return(count, &raw mut (*mm.as_raw()).__bindgen_anon_1.pinned_vm)
        };
        let pins = UserPins { mm, pages: count };
        let undo_count = |pins: &UserPins| {
            // SAFETY: as above.
            unsafe {
                bindings::atomic64_sub(
                    pins.pages,
                    &raw mut (*pins.mm.as_raw()).__bindgen_anon_1.pinned_vm,
                )
            }
        };
        if usize::try_from(pinned).unwrap_or(usize::MAX) > memlock_limit_pages()
            && !may_lock_beyond()
        {
            undo_count(&pins);
            return Err(PinError::Limit);
        }
        let mut v = match KVVec::<NonNull<bindings::page>>::with_capacity(pages, GFP_KERNEL_ACCOUNT)
        {
            Ok(v) => v,
            Err(e) => {
                undo_count(&pins);
                return Err(PinError::Other(e.into()));
            }
        };
        let flags = bindings::FOLL_LONGTERM | bindings::FOLL_WRITE;
        while v.len() < pages {
            let failed = match stop() {
                Err(e) => Some(PinError::Other(e)),
                Ok(()) => {
                    let n = c_int::try_from(pages - v.len()).map_or(BATCH, |n| n.min(BATCH));
                    let at = addr + v.len() * kernel::page::PAGE_SIZE;
                    // SAFETY: the vector has room for `pages` pointers and holds `v.len()`, so
                    // `n` more fit after them; `pin_user_pages_fast` writes at most `n`
                    // non-null page pointers there and returns how many (or an errno).
                    let got = unsafe {
                        let out = v.as_mut_ptr().add(v.len()).cast::<*mut bindings::page>();
                        bindings::pin_user_pages_fast(at, n, flags, out)
                    };
                    match usize::try_from(got) {
                        // SAFETY: `got` (at most `n`) pointers were written, each a pinned
                        // page, never null.
                        Ok(k) if got > 0 && got <= n => unsafe {
                            v.inc_len(k);
                            None
                        },
                        Ok(_) => Some(PinError::Refused(EFAULT)),
                        Err(_) => Some(PinError::Refused(Error::from_errno(got))),
                    }
                }
            };
            if let Some(e) = failed {
                unpin(&v, false);
                undo_count(&pins);
                return Err(e);
            }
        }
        let v = if pages == 1 {
            HeadVec::One(v.first().copied())
        } else {
            HeadVec::Many(v)
        };
        // INVARIANT (of `Heads`): the pages are pins, not owned; `user` says so and unpins them.
        let heads = Heads {
            v,
            order: 0,
            blocks: KVec::new(),
            user: Some(pins),
        };
        Arc::pin_init(
            try_pin_init!(Self {
                heads,
                _tag: tag,
                bytes <- kernel::new_mutex!(()),
                pins: kernel::sync::atomic::Atomic::new(0),
            }),
            GFP_KERNEL_ACCOUNT,
        )
        .map_err(PinError::Other)
    }
}
