// SPDX-License-Identifier: GPL-2.0

//! The pinned heaps' C API (`ruvm_heap_*` of `include/libruvm.h`): `libruvm::heap` for C
//! programs. A heap keeps its arena's own descriptor of the device (the caller may close its
//! own); every function returns 0 or a negative errno, or a pointer (NULL when it cannot).

use std::os::fd::BorrowedFd;

use libruvm::heap::{HeapConfig, HeapStats, PinnedHeap};
use libruvm::{Errno, Ruvm};

use super::{errno, put};

/// `struct ruvm_heap`.
pub struct RuvmHeap {
    heap: PinnedHeap,
}

// `struct ruvm_heap_stats` of the header: 10 `uint64_t`, as the header asserts too.
const _: () = assert!(core::mem::size_of::<HeapStats>() == 10 * 8);

/// `ruvm_heap_create`: a pinned heap over an arena (a destroyed heap's, or a new one) of
/// `arena_size` bytes (0: 256 MiB) of
/// the file `fd`, DMA-mapped for the `gpu_count` GPUs at `gpus` (at most 64).
///
/// # Safety
///
/// `gpus` holds `gpu_count` ids (or is NULL with 0); `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ruvm_heap_create(
    fd: i32,
    gpus: *const u32,
    gpu_count: u32,
    arena_size: u64,
    out: *mut *mut RuvmHeap,
) -> i32 {
    if out.is_null() || fd < 0 || gpu_count > 64 || (gpu_count > 0 && gpus.is_null()) {
        return errno(Errno::EINVAL);
    }
    let mut cfg = HeapConfig::default();
    if gpu_count > 0 {
        // SAFETY: `gpus` holds `gpu_count` ids (checked non-NULL above).
        cfg.gpus = unsafe { std::slice::from_raw_parts(gpus, gpu_count as usize) }.to_vec();
    }
    if arena_size != 0 {
        cfg.arena_size = arena_size;
    }
    // SAFETY: the caller's open descriptor, borrowed for the heap's making only (its arena
    // keeps a duplicate).
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let dev = match borrowed.try_clone_to_owned().and_then(Ruvm::from_owned_fd) {
        Ok(d) => d,
        Err(e) => return -e.raw_os_error().unwrap_or(Errno::EBADF as i32),
    };
    match PinnedHeap::new(&dev, &cfg) {
        Ok(heap) => {
            // SAFETY: `out` is writable (checked non-NULL).
            unsafe { *out = Box::into_raw(Box::new(RuvmHeap { heap })) };
            0
        }
        Err(e) => errno(e),
    }
}

/// `ruvm_heap_destroy`: frees every block of the heap and gives its chunks back.
///
/// # Safety
///
/// `h` is NULL or a live heap, not used again (nor its blocks).
#[no_mangle]
pub unsafe extern "C" fn ruvm_heap_destroy(h: *mut RuvmHeap) {
    if !h.is_null() {
        // SAFETY: made by `Box::into_raw` in `ruvm_heap_create`, destroyed once.
        drop(unsafe { Box::from_raw(h) });
    }
}

/// The heap behind `h`, or `None` for NULL.
///
/// # Safety
///
/// A non-NULL `h` is a live heap.
unsafe fn heap<'a>(h: *const RuvmHeap) -> Option<&'a PinnedHeap> {
    // SAFETY: by the caller's contract.
    unsafe { h.as_ref() }.map(|h| &h.heap)
}

/// `ruvm_heap_malloc`.
///
/// # Safety
///
/// `h` is NULL or a live heap.
#[no_mangle]
pub unsafe extern "C" fn ruvm_heap_malloc(h: *const RuvmHeap, size: usize) -> *mut u8 {
    // SAFETY: by the caller's contract.
    unsafe { heap(h) }.map_or(std::ptr::null_mut(), |h| h.malloc(size))
}

/// `ruvm_heap_calloc`.
///
/// # Safety
///
/// `h` is NULL or a live heap.
#[no_mangle]
pub unsafe extern "C" fn ruvm_heap_calloc(
    h: *const RuvmHeap,
    count: usize,
    size: usize,
) -> *mut u8 {
    // SAFETY: by the caller's contract.
    unsafe { heap(h) }.map_or(std::ptr::null_mut(), |h| h.calloc(count, size))
}

/// `ruvm_heap_aligned_alloc`.
///
/// # Safety
///
/// `h` is NULL or a live heap.
#[no_mangle]
pub unsafe extern "C" fn ruvm_heap_aligned_alloc(
    h: *const RuvmHeap,
    align: usize,
    size: usize,
) -> *mut u8 {
    // SAFETY: by the caller's contract.
    unsafe { heap(h) }.map_or(std::ptr::null_mut(), |h| h.malloc_aligned(size, align))
}

/// `ruvm_heap_realloc`.
///
/// # Safety
///
/// `h` is NULL or a live heap; `p` is NULL or a live block of it, not used after a non-NULL
/// return.
#[no_mangle]
pub unsafe extern "C" fn ruvm_heap_realloc(h: *const RuvmHeap, p: *mut u8, size: usize) -> *mut u8 {
    // SAFETY: by the caller's contract.
    unsafe { heap(h) }.map_or(std::ptr::null_mut(), |h| unsafe { h.realloc(p, size) })
}

/// `ruvm_heap_free`.
///
/// # Safety
///
/// `h` is NULL or a live heap; `p` is NULL or a live block of it, not used after.
#[no_mangle]
pub unsafe extern "C" fn ruvm_heap_free(h: *const RuvmHeap, p: *mut u8) {
    // SAFETY: by the caller's contract.
    if let Some(h) = unsafe { heap(h) } {
        // SAFETY: as above.
        unsafe { h.free(p) };
    }
}

/// `ruvm_heap_collect`: gives back everything the heap holds free.
///
/// # Safety
///
/// `h` is NULL or a live heap.
#[no_mangle]
pub unsafe extern "C" fn ruvm_heap_collect(h: *const RuvmHeap) -> i32 {
    // SAFETY: by the caller's contract.
    match unsafe { heap(h) } {
        Some(h) => {
            h.collect();
            0
        }
        None => errno(Errno::EINVAL),
    }
}

/// `ruvm_heap_stats`.
///
/// # Safety
///
/// `h` is NULL or a live heap; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ruvm_heap_stats(h: *const RuvmHeap, out: *mut HeapStats) -> i32 {
    // SAFETY: by the caller's contract.
    match (unsafe { heap(h) }, out.is_null()) {
        (Some(h), false) => {
            // SAFETY: `out` is writable.
            unsafe { put(out, h.stats()) };
            0
        }
        _ => errno(Errno::EINVAL),
    }
}

/// `ruvm_heap_locate`: the mem and offset of `p` if it is in a pinned heap of this process
/// (no system call); `-ENOENT` otherwise.
///
/// # Safety
///
/// `mem` and `offset` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ruvm_heap_locate(p: *const u8, mem: *mut u64, offset: *mut u64) -> i32 {
    match libruvm::heap::locate(p) {
        Some((m, o)) => {
            // SAFETY: by the caller's contract.
            unsafe {
                put(mem, m);
                put(offset, o);
            }
            0
        }
        None => errno(Errno::ENOENT),
    }
}

/// `ruvm_heap_dma_addr`: GPU `gpu`'s DMA address of the byte at `p` of heap `h` (no system
/// call); `-ENOENT` if there is none to give (see `PinnedHeap::dma_addr`), `-EINVAL` for a
/// NULL heap or a NULL `addr`.
///
/// # Safety
///
/// `h` is NULL or a live heap; `addr` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ruvm_heap_dma_addr(
    h: *const RuvmHeap,
    p: *const u8,
    gpu: u32,
    addr: *mut u64,
) -> i32 {
    // SAFETY: by the caller's contract.
    let Some(h) = (unsafe { heap(h) }) else {
        return errno(Errno::EINVAL);
    };
    if addr.is_null() {
        return errno(Errno::EINVAL);
    }
    match h.dma_addr(p, gpu) {
        Some(a) => {
            // SAFETY: by the caller's contract.
            unsafe { put(addr, a) };
            0
        }
        None => errno(Errno::ENOENT),
    }
}
