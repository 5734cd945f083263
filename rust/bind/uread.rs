// SPDX-License-Identifier: GPL-2.0

//! Reading an array of plain structures from user memory, a word at a time.
//!
//! C header: [`include/linux/mm.h`](srctree/include/linux/mm.h) (`pin_user_pages_fast`)
//!
//! `copy_from_user` on an x86 CPU with FSRM is one `rep movsb`, which QEMU's TCG (the CPU of
//! the test guests) runs a byte at a time: 4 to 8 ns a byte, the largest part of what reading
//! a submission's operations cost there. [`read_array`] reads them instead from the pages that
//! hold them, pinned for the call (`pin_user_pages_fast`, `unpin_user_pages`) and read with
//! 8-byte loads (on hardware the two cost about the same). What it cannot pin (a range not
//! 8-aligned or longer than [`MAX_PAGES`], memory of no `struct page`, memory not there) it
//! reads with `copy_from_user`, which fails as it always did (`EFAULT`); and an array shorter
//! than [`MIN_LEN`], for which that is cheaper.
//!
//! Pinned, not referenced: a reference (`get_user_pages_fast`) is dropped with `put_page`,
//! which the 7.2 bindings lack, and `release_pages` skips the huge zero page, whose references
//! `get_user_pages` does take (a leak, found in review, on any kernel with THP's zero page: an
//! untouched 2 MiB-aligned array). A pin of an anonymous page shared copy-on-write copies it
//! first, as `O_DIRECT` does.
//!
//! The loads have no machine-check recovery, where `copy_from_user`'s faults have: an
//! uncorrectable memory error in the caller's array, which no process can cause, is met here
//! as anywhere in the kernel.

use core::mem::{size_of, MaybeUninit};

use kernel::{
    alloc::KVec,
    bindings,
    page::PAGE_SIZE,
    prelude::*,
    transmute::FromBytes,
    uaccess::{UserPtr, UserSlice},
};

/// The pages one call pins at most (32 KiB).
const MAX_PAGES: usize = 8;

/// The word a read moves.
const WORD: usize = size_of::<u64>();

/// Arrays shorter than this are read with `copy_from_user`: under TCG taking a page costs
/// about 1.6 us and a byte of `rep movsb` about 4 ns, so the pages pay from about 500 bytes
/// (7 operations) on.
const MIN_LEN: usize = 512;

/// Reads `n` values of `T` at `ptr` in user memory into a new vector (`EFAULT` if the range is
/// not readable user memory). Each byte is read once: a thread of the caller writing the array
/// meanwhile changes at most what is read, never what was checked after.
///
/// The vector is transient and bounded by the call (at most [`MAX_PAGES`] pages' worth read
/// through the pinned pages), and charged to the caller's memory cgroup either way: the call
/// may hold it while it waits (for its stream's turn, its write-back, or, with
/// `copy_from_user`, the caller's own memory). Through the pinned pages it is allocated only
/// once they are pinned.
pub(crate) fn read_array<T: FromBytes>(ptr: UserPtr, n: usize) -> Result<KVec<T>> {
    let len = n.checked_mul(size_of::<T>()).ok_or(EINVAL)?;
    // CAST: a user address, as `UserPtr::from_addr` took it.
    let addr = ptr.as_const_ptr() as usize;
    if let Some(pinned) = Pinned::new(addr, len) {
        let mut v = KVec::<T>::with_capacity(n, GFP_KERNEL_ACCOUNT)?;
        pinned.read(spare_bytes(&mut v, n)?);
        // SAFETY: `n <= capacity` (the vector was made with room for `n`); every byte of the
        // `n` elements was written by `read`, and any bytes are a valid `T` (`FromBytes`).
        unsafe { v.inc_len(n) };
        return Ok(v);
    }
    let mut v = KVec::<T>::with_capacity(n, GFP_KERNEL_ACCOUNT)?;
    UserSlice::new(ptr, len)
        .reader()
        .read_raw(spare_bytes(&mut v, n)?)?;
    // SAFETY: as above, every byte written by `read_raw`, which succeeded.
    unsafe { v.inc_len(n) };
    Ok(v)
}

/// The bytes of the first `n` free elements of `v`.
fn spare_bytes<T>(v: &mut KVec<T>, n: usize) -> Result<&mut [MaybeUninit<u8>]> {
    let len = n.checked_mul(size_of::<T>()).ok_or(EINVAL)?;
    let spare = v.spare_capacity_mut().get_mut(..n).ok_or(EINVAL)?;
    // SAFETY: the `n` elements are `len` bytes of the vector's buffer, which `spare` borrows
    // mutably; bytes need no alignment, and `MaybeUninit<u8>` holds any byte or none.
    Ok(unsafe { core::slice::from_raw_parts_mut(spare.as_mut_ptr().cast(), len) })
}

/// The pages that hold `[addr, addr + len)` of the calling process, pinned while this lives.
///
/// # Invariants
///
/// The first `npages` entries of `pages` were pinned by `pin_user_pages_fast`, in order from
/// the page of `addr`, and hold every byte of the range; `addr` and `len` are 8-aligned.
struct Pinned {
    pages: [*mut bindings::page; MAX_PAGES],
    npages: usize,
    addr: usize,
    len: usize,
}

impl Pinned {
    /// Pins the range's pages: `None` if it is shorter than [`MIN_LEN`] or not 8-aligned,
    /// spans more than [`MAX_PAGES`] pages, or could not all be pinned (then none is).
    fn new(addr: usize, len: usize) -> Option<Self> {
        if len < MIN_LEN || addr % WORD != 0 || len % WORD != 0 {
            return None;
        }
        let end = addr.checked_add(len)?;
        let first = addr - addr % PAGE_SIZE;
        let npages = (end - first).div_ceil(PAGE_SIZE);
        if npages > MAX_PAGES {
            return None;
        }
        let mut pages = [core::ptr::null_mut::<bindings::page>(); MAX_PAGES];
        // CAST: at most MAX_PAGES.
        let want = npages as i32;
        // SAFETY: asks for `npages` pages of the current process from a page-aligned address
        // (`pin_user_pages_fast` checks that the range is user memory, readable); `pages` has
        // room for them.
        let got = unsafe { bindings::pin_user_pages_fast(first, want, 0, pages.as_mut_ptr()) };
        let got = usize::try_from(got).unwrap_or(0).min(npages);
        if got < npages {
            if got > 0 {
                // SAFETY: the first `got` entries were pinned above; each is unpinned once.
                unsafe { bindings::unpin_user_pages(pages.as_mut_ptr(), got) };
            }
            return None;
        }
        // INVARIANT: every page of the range pinned, in order; the range 8-aligned (checked).
        Some(Self {
            pages,
            npages,
            addr,
            len,
        })
    }

    /// Copies the range into `out` (`len` bytes; a shorter `out` gets its length) with 8-byte
    /// loads.
    fn read(&self, out: &mut [MaybeUninit<u8>]) {
        let len = self.len.min(out.len()) / WORD * WORD;
        let first = self.addr - self.addr % PAGE_SIZE;
        let end = self.addr + len;
        let mut done = 0;
        for (i, page) in self.pages.iter().take(self.npages).enumerate() {
            let start = first + i * PAGE_SIZE;
            let (from, to) = (self.addr.max(start), end.min(start + PAGE_SIZE));
            if from >= to {
                break;
            }
            // SAFETY: the page is pinned while `self` lives (type invariant).
            let base = unsafe { bindings::kmap_local_page(*page) }.cast::<u8>();
            let words = (to - from) / WORD;
            // SAFETY: `from - start` is 8-aligned (as `addr` and `start` are), and the `words`
            // words from it end at `to - start`, within the page mapped at `base`.
            let src = unsafe { base.add(from - start) }.cast::<u64>();
            // SAFETY: `done + 8 * words <= len <= out.len()`: the pages' ranges, in order, are
            // the first `len` bytes of the range.
            let dst = unsafe { out.as_mut_ptr().add(done) }.cast::<u64>();
            for k in 0..words {
                // SAFETY: word `k` of both ranges above. A thread of the caller may write the
                // word meanwhile: the volatile load reads one value of it, as
                // `copy_from_user` would.
                unsafe { dst.add(k).write_unaligned(src.add(k).read_volatile()) };
            }
            done += words * WORD;
            // SAFETY: mapped above, in this function, the last mapping made.
            unsafe { bindings::kunmap_local(base.cast()) };
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: the first `npages` entries of `pages` are pinned (type invariant); each is
        // unpinned once, here.
        unsafe { bindings::unpin_user_pages(self.pages.as_mut_ptr(), self.npages) };
    }
}
