// SPDX-License-Identifier: GPL-2.0

//! A shrinker: memory reclaim asks a cache how much it could give back, then asks it to.
//!
//! C header: [`include/linux/shrinker.h`](srctree/include/linux/shrinker.h)
//!
//! The 7.2 `kernel` crate has no shrinker abstraction (Rust Binder builds its own on the same
//! calls). Reclaim runs in whatever context needed memory, possibly with locks of the cache's
//! own held: [`Shrink`] implementations must only *try* their locks, and report no progress
//! when they cannot take them.

use core::ptr::NonNull;

use kernel::{bindings, ffi, prelude::*};

/// What a shrinker asks of its cache. Both run in reclaim: they must not wait for a lock that
/// an allocating path may hold.
pub(crate) trait Shrink {
    /// What re-making one page costs, reclaim's `seeks`: `DEFAULT_SEEKS` (2) for objects read
    /// back from storage; 0 for objects that need no IO to re-make, which reclaim trims by
    /// half its count at every pass rather than by `count >> priority`.
    const SEEKS: i32;
    /// How many pages the cache could give back now.
    fn count() -> u64;
    /// Gives back up to `pages` pages; how many went.
    fn scan(pages: u64) -> u64;
}

/// A registered shrinker, unregistered (waiting for running callbacks) on drop.
///
/// # Invariants
///
/// `ptr` is a shrinker from `shrinker_alloc`, registered, whose callbacks are those of `S`.
pub(crate) struct Shrinker {
    ptr: NonNull<bindings::shrinker>,
}

// SAFETY: the shrinker is used by the kernel from any thread; this object only frees it.
unsafe impl Send for Shrinker {}
// SAFETY: `&Shrinker` gives access to nothing.
unsafe impl Sync for Shrinker {}

/// The kernel's `count_objects` callback.
///
/// # Safety
///
/// Called by reclaim for a shrinker registered by [`Shrinker::register::<S>`].
unsafe extern "C" fn count<S: Shrink>(
    _shrinker: *mut bindings::shrinker,
    _sc: *mut bindings::shrink_control,
) -> ffi::c_ulong {
    match S::count() {
        // CAST: `SHRINK_EMPTY` is `~0UL - 1`: nothing to scan at all.
        0 => !0 - 1,
        n => ffi::c_ulong::try_from(n).unwrap_or(ffi::c_ulong::MAX - 2),
    }
}

/// The kernel's `scan_objects` callback.
///
/// # Safety
///
/// Called by reclaim with a valid `sc`, for a shrinker registered by
/// [`Shrinker::register::<S>`].
unsafe extern "C" fn scan<S: Shrink>(
    _shrinker: *mut bindings::shrinker,
    sc: *mut bindings::shrink_control,
) -> ffi::c_ulong {
    // SAFETY: reclaim passes a valid `shrink_control` for the call.
    let want = unsafe { (*sc).nr_to_scan };
    scanned(S::scan(u64::try_from(want).unwrap_or(u64::MAX)))
}

/// What a scan callback returns for `freed` pages given back, which count as the reclaiming
/// task's progress: `SHRINK_STOP` (`~0UL`) for none (a lock was taken: do not insist).
pub(super) fn scanned(freed: u64) -> ffi::c_ulong {
    match freed {
        0 => !0,
        n => {
            let n = ffi::c_ulong::try_from(n).unwrap_or(ffi::c_ulong::MAX - 2);
            account_reclaimed(n);
            n
        }
    }
}

/// What the C `mm_account_reclaimed_pages` (a static inline) does: pages freed outside LRU
/// reclaim count as the reclaiming task's progress, so that a direct reclaim that got its
/// memory from us does not conclude it made none (and invoke the OOM killer).
fn account_reclaimed(pages: ffi::c_ulong) {
    let task = kernel::task::Task::current_raw();
    // SAFETY: `task` is the current task, alive for the call; `reclaim_state` is set by the
    // reclaim path this callback runs under (or NULL outside reclaim), points at that path's
    // stack object for its whole duration, and is written by the current task only.
    unsafe {
        let rs = (*task).reclaim_state;
        if !rs.is_null() {
            (*rs).reclaimed = (*rs).reclaimed.saturating_add(pages);
        }
    }
}

impl Shrinker {
    /// Registers a shrinker named `name` (shown in `/sys/kernel/debug/shrinker`) with `S`'s
    /// callbacks.
    pub(crate) fn register<S: Shrink>(name: &'static CStr) -> Result<Self> {
        // The name is a format: one with a conversion would read an argument that is not there.
        if name.to_bytes().contains(&b'%') {
            return Err(EINVAL);
        }
        // SAFETY: `name` is a NUL-terminated string without a conversion (checked above), so
        // no argument follows; `shrinker_alloc` copies it.
        let ptr = unsafe { bindings::shrinker_alloc(0, name.as_char_ptr()) };
        let ptr = NonNull::new(ptr).ok_or(ENOMEM)?;
        // SAFETY: the shrinker was just allocated and is not registered: these fields are its
        // owner's to set before `shrinker_register`.
        unsafe {
            let p = ptr.as_ptr();
            (*p).count_objects = Some(count::<S>);
            (*p).scan_objects = Some(scan::<S>);
            (*p).seeks = S::SEEKS;
        }
        // SAFETY: fully set up, registered once.
        unsafe { bindings::shrinker_register(ptr.as_ptr()) };
        // INVARIANT: registered with `S`'s callbacks.
        Ok(Self { ptr })
    }
}

impl Drop for Shrinker {
    fn drop(&mut self) {
        // SAFETY: by the type invariant the shrinker is registered; `shrinker_free`
        // unregisters it and waits for callbacks in flight before freeing it.
        unsafe { bindings::shrinker_free(self.ptr.as_ptr()) };
    }
}
