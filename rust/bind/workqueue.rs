// SPDX-License-Identifier: GPL-2.0

//! A workqueue of the module's own (the 7.2 crate offers only the system queues).
//!
//! Work queued on a system queue may still be running module code when the module is
//! unloaded; destroying a queue of one's own waits for every item on it to end. The queue is
//! unbound (its items run on any CPU, so two GPUs' engines run at once) and reclaim-safe
//! (`WQ_MEM_RECLAIM`: it has a rescuer, as a queue that signals fences must, since reclaim may
//! wait on those fences).

use core::ptr;

use kernel::{
    bindings,
    prelude::*,
    sync::atomic::{ordering::Acquire, ordering::Release, Atomic},
    workqueue::Queue,
};

/// A queue made at module init and destroyed at unload, reachable from any context.
pub(crate) struct ModuleQueue {
    ptr: Atomic<*mut bindings::workqueue_struct>,
}

// SAFETY: the pointer is set once before use and cleared at unload; the queue is thread-safe.
unsafe impl Sync for ModuleQueue {}

impl ModuleQueue {
    pub(crate) const fn new() -> Self {
        Self {
            ptr: Atomic::new(ptr::null_mut()),
        }
    }

    /// Makes the queue, named `name` (module init, before any work is queued).
    pub(crate) fn init(&self, name: &'static CStr) -> Result {
        let flags = bindings::wq_flags_WQ_UNBOUND | bindings::wq_flags_WQ_MEM_RECLAIM;
        // SAFETY: a "%s" format with one string argument, which outlives the queue (static);
        // max_active 0 is the default.
        let wq = unsafe {
            bindings::alloc_workqueue_noprof(c"%s".as_char_ptr(), flags, 0, name.as_char_ptr())
        };
        if wq.is_null() {
            return Err(ENOMEM);
        }
        self.ptr.store(wq, Release);
        Ok(())
    }

    /// The queue; `None` before init and after unload.
    pub(crate) fn get(&'static self) -> Option<&'static Queue> {
        let wq = self.ptr.load(Acquire);
        if wq.is_null() {
            return None;
        }
        // SAFETY: set by `init`, live until `destroy`, which runs at unload after every user
        // of the queue is gone (no file, no stream, no fence pending).
        Some(unsafe { Queue::from_raw(wq) })
    }

    /// Waits for every item queued so far to end (nothing if the queue is not made).
    pub(crate) fn flush(&self) {
        let wq = self.ptr.load(Acquire);
        if !wq.is_null() {
            // SAFETY: made by `init`, live until `destroy`, which the caller does not race (it
            // runs at unload, when no ioctl can be in flight).
            unsafe { bindings::__flush_workqueue(wq) };
        }
    }

    /// Waits for every item on the queue to end, then frees it (unload).
    pub(crate) fn destroy(&self) {
        let wq = self
            .ptr
            .xchg(ptr::null_mut(), kernel::sync::atomic::ordering::Full);
        if !wq.is_null() {
            // SAFETY: made by `init`, and no longer reachable through `get`.
            unsafe { bindings::destroy_workqueue(wq) };
        }
    }
}
