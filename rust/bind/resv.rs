// SPDX-License-Identifier: GPL-2.0

//! Reservation objects (`dma_resv`, which the 7.2 `kernel` crate does not wrap): the fences of
//! the work on a buffer, for implicit sync.
//!
//! C header: [`include/linux/dma-resv.h`](srctree/include/linux/dma-resv.h)
//!
//! [`Resv`]: its fences for an access, a bounded wait for them, a fence added. Its lock (a
//! `ww_mutex`) is taken only to add a fence, without an acquire context and never with another
//! reservation lock held, so it cannot take part in a wound/wait cycle.

use core::ptr;

use kernel::{bindings, ffi::c_uint, prelude::*, sync::Arc, time::msecs_to_jiffies, types::Opaque};

use super::{attach::DmaBuf, fence::Fence};

/// A reservation object ruvm made, which lives as long as its last holder (a mem, or a buffer
/// exported with it).
///
/// # Invariants
///
/// `obj` was initialised by `dma_resv_init` and is finished by `Drop` only.
#[pin_data(PinnedDrop)]
struct Own {
    #[pin]
    obj: Opaque<bindings::dma_resv>,
}

#[pinned_drop]
impl PinnedDrop for Own {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: by the type invariant the object was initialised; no holder is left (a
        // buffer exported with it holds it), so nothing uses it any more.
        unsafe { bindings::dma_resv_fini(self.obj.get()) };
    }
}

/// A reservation object: one ruvm made (for the buffers of a mem it exports), or another
/// exporter's buffer's, held by a reference on the buffer.
pub(crate) struct Resv(Kind);

enum Kind {
    Own(Pin<KBox<Own>>),
    Of(DmaBuf),
}

// SAFETY: a reservation object is used from any thread under its own lock (or RCU).
unsafe impl Send for Own {}
// SAFETY: as above.
unsafe impl Sync for Own {}

/// The fences an access must wait for: a write waits for every fence (readers' and
/// writers'), a read for writers' only.
fn usage(write: bool) -> bindings::dma_resv_usage {
    if write {
        bindings::dma_resv_usage_DMA_RESV_USAGE_READ
    } else {
        bindings::dma_resv_usage_DMA_RESV_USAGE_WRITE
    }
}

impl Resv {
    /// A new, empty reservation object (charged to the caller's memory cgroup).
    pub(crate) fn new() -> Result<Arc<Self>> {
        let own = KBox::pin_init(
            pin_init!(Own {
                // SAFETY: `slot` is valid, pinned memory for a `dma_resv`.
                obj <- Opaque::ffi_init(|slot| unsafe { bindings::dma_resv_init(slot) }),
            }),
            GFP_KERNEL_ACCOUNT,
        )?;
        Ok(Arc::new(Resv(Kind::Own(own)), GFP_KERNEL_ACCOUNT)?)
    }

    /// The reservation object of another exporter's buffer `buf` (held).
    pub(crate) fn of(buf: DmaBuf) -> Result<Arc<Self>> {
        Ok(Arc::new(Resv(Kind::Of(buf)), GFP_KERNEL_ACCOUNT)?)
    }

    pub(super) fn as_ptr(&self) -> *mut bindings::dma_resv {
        match &self.0 {
            Kind::Own(o) => o.obj.get(),
            Kind::Of(b) => b.resv(),
        }
    }

    /// Waits for what an access must wait for, at most `timeout_ms`: `ETIMEDOUT`, or
    /// `ERESTARTSYS` on a signal.
    pub(crate) fn wait(&self, write: bool, timeout_ms: u32) -> Result {
        let jiffies = msecs_to_jiffies(timeout_ms);
        // SAFETY: by the type invariant the object is live; an interruptible wait of at most
        // `jiffies`, without the lock.
        let left =
            unsafe { bindings::dma_resv_wait_timeout(self.as_ptr(), usage(write), true, jiffies) };
        match left {
            l if l < 0 => Err(ERESTARTSYS),
            0 => Err(ETIMEDOUT),
            _ => Ok(()),
        }
    }

    /// Under the object's lock, at once: the fences an access (a write, or a read) must wait
    /// for (each a new reference), then `fence`, that access's own, added. So two accesses
    /// each see the other's fence, whatever their order. Fails (`ENOMEM`) with nothing added.
    pub(crate) fn exchange(&self, fence: &Fence, write: bool) -> Result<KVec<Fence>> {
        let obj = self.as_ptr();
        let kind = if write {
            bindings::dma_resv_usage_DMA_RESV_USAGE_WRITE
        } else {
            bindings::dma_resv_usage_DMA_RESV_USAGE_READ
        };
        // SAFETY: the object is live; without an acquire context the lock is a plain mutex
        // (no other reservation lock is held here, so none is waited for while holding one).
        unsafe { bindings::dma_resv_lock(obj, ptr::null_mut()) };
        let r = self.fences(write).and_then(|before| {
            // SAFETY: the lock is held; the room is used at once, under the same lock.
            let r = unsafe { bindings::dma_resv_reserve_fences(obj, 1) };
            kernel::error::to_result(r)?;
            // SAFETY: the lock is held, with room for one fence; the object takes its own
            // reference on the live `fence`.
            unsafe { bindings::dma_resv_add_fence(obj, fence.as_ptr(), kind) };
            Ok(before)
        });
        // SAFETY: locked above.
        unsafe { bindings::dma_resv_unlock(obj) };
        r
    }

    /// The fences an access (a write, or a read) must wait for now, each a new reference.
    fn fences(&self, write: bool) -> Result<KVec<Fence>> {
        let mut count: c_uint = 0;
        let mut array: *mut *mut bindings::dma_fence = ptr::null_mut();
        // SAFETY: by the type invariant the object is live; the fences are read under RCU; on
        // success `array` holds `count` new references, and is ours to free.
        let r = unsafe {
            bindings::dma_resv_get_fences(self.as_ptr(), usage(write), &mut count, &mut array)
        };
        kernel::error::to_result(r)?;
        let mut out = KVec::new();
        let mut failed = None;
        for i in 0..count as usize {
            // SAFETY: entry `i` of the array, a new reference handed over.
            let fence = unsafe { Fence::from_owned(*array.add(i)) };
            if let Some(f) = fence {
                // On failure the fence is dropped (its reference given back), as are the rest.
                if let Err(e) = out.push(f, GFP_KERNEL_ACCOUNT) {
                    failed = Some(e);
                }
            }
        }
        // SAFETY: the array the call allocated, its references taken over above.
        unsafe { bindings::kfree(array.cast()) };
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(out),
        }
    }
}
