// SPDX-License-Identifier: GPL-2.0

//! libruvm's C API (`include/libruvm.h`): the user-space stream-ordered allocator
//! (`libruvm::alloc`) and the pinned heaps ([`heap`]: `libruvm::heap`) for C programs, linked
//! as `-lruvm` (`libruvm.a`, `libruvm.so`).
//!
//! Every function returns 0 or a negative errno, and never unwinds: the crate is built with
//! `panic = "abort"`. An allocator owns a duplicate of the descriptor it was made from (the
//! caller may close its own), and gives every segment back when it is destroyed.

mod heap;

use std::mem::ManuallyDrop;
use std::os::fd::{BorrowedFd, OwnedFd};

use libruvm::alloc::{Allocator, Block, Config, RawBlock, Reuse, Stats};
use libruvm::{uapi, Errno, Ruvm};

/// `struct ruvm_allocator_config`.
#[repr(C)]
pub struct RuvmAllocatorConfig {
    /// The GPUs every segment is DMA-mapped for, and how many (at most 64).
    pub gpus: *const u32,
    pub gpu_count: u32,
    /// `RUVM_POOL_REUSE_*` bits: the cross-stream reuse rules.
    pub reuse: u32,
    /// Idle bytes kept at a synchronize (`UINT64_MAX`: none given back there).
    pub release_threshold: u64,
    /// The most bytes of segments held at once; 0 for no limit of the allocator's own.
    pub reserve_limit: u64,
}

/// `struct ruvm_allocator`: an allocator and the file it allocates from.
pub struct RuvmAllocator {
    /// Dropped first (see `Drop`): it borrows `*dev`.
    alloc: ManuallyDrop<Allocator<'static>>,
    dev: *mut Ruvm,
}

impl Drop for RuvmAllocator {
    fn drop(&mut self) {
        // SAFETY: `alloc` is dropped once, here, before the device it borrows, which was made
        // by `Box::into_raw` in `ruvm_allocator_create` and is freed once, after it.
        unsafe {
            ManuallyDrop::drop(&mut self.alloc);
            drop(Box::from_raw(self.dev));
        }
    }
}

fn errno(e: Errno) -> i32 {
    -(e as i32)
}

/// The allocator behind a pointer the C caller holds, or `EINVAL` for NULL.
///
/// # Safety
///
/// A non-NULL `a` was returned by `ruvm_allocator_create` and not destroyed.
unsafe fn get<'a>(a: *const RuvmAllocator) -> Result<&'a Allocator<'static>, i32> {
    // SAFETY: by the caller's contract, a live allocator (or NULL, refused).
    unsafe { a.as_ref() }
        .map(|a| &*a.alloc)
        .ok_or(errno(Errno::EINVAL))
}

/// Runs `f` on the allocator behind `a`: 0, or the negative errno of its failure (`EINVAL`
/// for a NULL allocator).
///
/// # Safety
///
/// As [`get`].
unsafe fn with(
    a: *const RuvmAllocator,
    f: impl FnOnce(&Allocator<'static>) -> Result<(), Errno>,
) -> i32 {
    // SAFETY: by the caller's contract.
    match unsafe { get(a) } {
        Ok(a) => match f(a) {
            Ok(()) => 0,
            Err(e) => errno(e),
        },
        Err(e) => e,
    }
}

/// Writes `v` through `p` unless it is NULL.
///
/// # Safety
///
/// `p` is NULL or writable.
unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: by the caller's contract.
    if let Some(p) = unsafe { p.as_mut() } {
        *p = v;
    }
}

// `struct ruvm_allocator_stats` of the header: 16 `uint64_t`, as the header asserts too.
const _: () = assert!(core::mem::size_of::<Stats>() == 16 * 8);

/// `ruvm_allocator_create`.
///
/// # Safety
///
/// `cfg` is NULL or points to a readable config whose `gpus` holds `gpu_count` ids; `out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ruvm_allocator_create(
    fd: i32,
    cfg: *const RuvmAllocatorConfig,
    out: *mut *mut RuvmAllocator,
) -> i32 {
    if out.is_null() || fd < 0 {
        return errno(Errno::EINVAL);
    }
    let mut config = Config::default();
    // SAFETY: by the caller's contract.
    if let Some(c) = unsafe { cfg.as_ref() } {
        if c.gpu_count > 64 || (c.gpu_count > 0 && c.gpus.is_null()) {
            return errno(Errno::EINVAL);
        }
        let known = uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES
            | uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_OPPORTUNISTIC
            | uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
        if c.reuse & !known != 0 {
            return errno(Errno::EINVAL);
        }
        if c.gpu_count > 0 {
            // SAFETY: `gpus` holds `gpu_count` ids (checked non-NULL above).
            config.gpus =
                unsafe { std::slice::from_raw_parts(c.gpus, c.gpu_count as usize) }.to_vec();
        }
        config.reuse = Reuse {
            follow_event_dependencies: c.reuse
                & uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES
                != 0,
            allow_opportunistic: c.reuse
                & uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_OPPORTUNISTIC
                != 0,
            allow_internal_dependencies: c.reuse
                & uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES
                != 0,
        };
        config.release_threshold = c.release_threshold;
        config.reserve_limit = (c.reserve_limit != 0).then_some(c.reserve_limit);
    }
    // SAFETY: the caller's open descriptor, borrowed for the duplicate only.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let owned: OwnedFd = match borrowed.try_clone_to_owned() {
        Ok(f) => f,
        Err(e) => return -e.raw_os_error().unwrap_or(Errno::EBADF as i32),
    };
    let dev = match Ruvm::from_owned_fd(owned) {
        Ok(d) => Box::into_raw(Box::new(d)),
        Err(e) => return -e.raw_os_error().unwrap_or(Errno::EBADF as i32),
    };
    // SAFETY: `dev` lives on the heap until `RuvmAllocator`'s drop frees it, after the
    // allocator that borrows it.
    let alloc = Allocator::new(unsafe { &*dev }, config);
    let a = Box::new(RuvmAllocator {
        alloc: ManuallyDrop::new(alloc),
        dev,
    });
    // SAFETY: `out` is writable by the caller's contract (checked non-NULL).
    unsafe { *out = Box::into_raw(a) };
    0
}

/// `ruvm_allocator_destroy`.
///
/// # Safety
///
/// `a` is NULL or a live allocator, not used again.
#[no_mangle]
pub unsafe extern "C" fn ruvm_allocator_destroy(a: *mut RuvmAllocator) {
    if !a.is_null() {
        // SAFETY: made by `Box::into_raw` in `ruvm_allocator_create`, destroyed once.
        drop(unsafe { Box::from_raw(a) });
    }
}

/// `ruvm_alloc`.
///
/// # Safety
///
/// `a` is a live allocator; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ruvm_alloc(
    a: *const RuvmAllocator,
    len: u64,
    stream: u64,
    out: *mut RawBlock,
) -> i32 {
    if out.is_null() {
        return errno(Errno::EINVAL);
    }
    // SAFETY: by the caller's contract; `out` is writable (checked non-NULL).
    unsafe { with(a, |a| a.alloc(len, stream).map(|b| put(out, b.to_raw()))) }
}

/// `ruvm_free`.
///
/// # Safety
///
/// `a` is a live allocator; `b` is readable.
#[no_mangle]
pub unsafe extern "C" fn ruvm_free(
    a: *const RuvmAllocator,
    b: *const RawBlock,
    stream: u64,
) -> i32 {
    // SAFETY: by the caller's contract (NULL refused).
    let Some(raw) = (unsafe { b.as_ref() }) else {
        return errno(Errno::EINVAL);
    };
    // SAFETY: by the caller's contract.
    unsafe { with(a, |a| a.free(Block::from_raw(raw), stream)) }
}

/// `ruvm_allocator_submit`.
///
/// # Safety
///
/// `a` is a live allocator; `ops` holds `count` operations; `first` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ruvm_allocator_submit(
    a: *const RuvmAllocator,
    stream: u64,
    ops: *const uapi::ruvm_op,
    count: u32,
    first: *mut u64,
) -> i32 {
    if ops.is_null() || count == 0 || count > uapi::RUVM_MAX_SUBMIT_OPS {
        return errno(Errno::EINVAL);
    }
    // SAFETY: `ops` holds `count` operations by the caller's contract.
    let ops = unsafe { std::slice::from_raw_parts(ops, count as usize) };
    // SAFETY: by the caller's contract.
    unsafe { with(a, |a| a.submit(stream, ops).map(|f| put(first, f))) }
}

/// `ruvm_allocator_record_event`.
///
/// # Safety
///
/// `a` is a live allocator.
#[no_mangle]
pub unsafe extern "C" fn ruvm_allocator_record_event(
    a: *const RuvmAllocator,
    stream: u64,
    event: u64,
) -> i32 {
    // SAFETY: by the caller's contract.
    unsafe { with(a, |a| a.record_event(stream, event)) }
}

/// `ruvm_allocator_wait_event`.
///
/// # Safety
///
/// `a` is a live allocator.
#[no_mangle]
pub unsafe extern "C" fn ruvm_allocator_wait_event(
    a: *const RuvmAllocator,
    stream: u64,
    event: u64,
) -> i32 {
    // SAFETY: by the caller's contract.
    unsafe { with(a, |a| a.wait_event(stream, event)) }
}

/// `ruvm_allocator_synchronize`.
///
/// # Safety
///
/// `a` is a live allocator.
#[no_mangle]
pub unsafe extern "C" fn ruvm_allocator_synchronize(a: *const RuvmAllocator, stream: u64) -> i32 {
    // SAFETY: by the caller's contract.
    unsafe { with(a, |a| a.synchronize(stream)) }
}

/// `ruvm_allocator_release_stream`.
///
/// # Safety
///
/// `a` is a live allocator.
#[no_mangle]
pub unsafe extern "C" fn ruvm_allocator_release_stream(
    a: *const RuvmAllocator,
    stream: u64,
) -> i32 {
    // SAFETY: by the caller's contract.
    unsafe { with(a, |a| a.release_stream(stream)) }
}

/// `ruvm_allocator_forget_event`.
///
/// # Safety
///
/// `a` is a live allocator.
#[no_mangle]
pub unsafe extern "C" fn ruvm_allocator_forget_event(a: *const RuvmAllocator, event: u64) -> i32 {
    // SAFETY: by the caller's contract.
    unsafe {
        with(a, |a| {
            a.forget_event(event);
            Ok(())
        })
    }
}

/// `ruvm_allocator_trim`.
///
/// # Safety
///
/// `a` is a live allocator; `given` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ruvm_allocator_trim(
    a: *const RuvmAllocator,
    keep: u64,
    given: *mut u64,
) -> i32 {
    // SAFETY: by the caller's contract.
    unsafe { with(a, |a| a.trim(keep).map(|n| put(given, n))) }
}

/// `ruvm_allocator_stats`.
///
/// # Safety
///
/// `a` is a live allocator; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ruvm_allocator_stats(a: *const RuvmAllocator, out: *mut Stats) -> i32 {
    if out.is_null() {
        return errno(Errno::EINVAL);
    }
    // SAFETY: by the caller's contract; `out` is writable (checked non-NULL).
    unsafe {
        with(a, |a| {
            put(out, a.stats());
            Ok(())
        })
    }
}
