// SPDX-License-Identifier: GPL-2.0

//! Learning that a range of a process's address space was unmapped: an MMU interval notifier.
//!
//! C header: [`include/linux/mmu_notifier.h`](srctree/include/linux/mmu_notifier.h)
//!
//! The 7.2 crate has no MMU notifier abstraction. A [`RangeWatch`] is an interval notifier
//! on a range of the calling process's address space, inserted when it is made and removed
//! when it drops (which waits for a callback in flight; never drop one from its own
//! callback). It tells its owner ([`Unmapped::unmapped`]) when the range, or any part of it,
//! stops being mapped: `munmap`, `mremap` moving it away, a `MAP_FIXED` mapping over it, the
//! address space's end. Other invalidations (write-protection at `fork`, `mprotect`,
//! `MADV_DONTNEED`, truncation of a file, reclaim's and migration's attempts) leave the
//! range mapped and are not reported: reclaim and migration try pinned pages too, and give
//! up on them only after invalidating.
//!
//! The callback runs under the mmap lock, or from the OOM reaper, where it may not sleep or
//! allocate: [`Unmapped::unmapped`] must do neither.

use kernel::{bindings, prelude::*, types::Opaque};

use super::vma::current_mm;

/// Told when a watched range is unmapped.
pub(crate) trait Unmapped: Send + Sync + 'static {
    /// The range, or part of it, was unmapped. Any context: must not sleep or allocate.
    fn unmapped(&self);
}

/// An interval notifier on a range of a process's address space, reporting to `owner`.
///
/// # Invariants
///
/// `sub` was inserted with [`Self::OPS`] for the calling process's address space when this
/// was made, and is removed by `drop`; it is pinned meanwhile (the notifier tree points at
/// it).
#[pin_data(PinnedDrop)]
pub(crate) struct RangeWatch<T: Unmapped> {
    #[pin]
    sub: Opaque<bindings::mmu_interval_notifier>,
    owner: T,
}

// SAFETY: the notifier is only touched by the kernel's notifier code and by `drop`; the
// owner is `Send + Sync`.
unsafe impl<T: Unmapped> Send for RangeWatch<T> {}
// SAFETY: as above; `&RangeWatch` reaches only the owner.
unsafe impl<T: Unmapped> Sync for RangeWatch<T> {}

impl<T: Unmapped> RangeWatch<T> {
    const OPS: bindings::mmu_interval_notifier_ops = bindings::mmu_interval_notifier_ops {
        invalidate: Some(Self::invalidate),
        invalidate_start: None,
        invalidate_finish: None,
    };

    /// Watches `[start, start + len)` of the calling process's address space for `owner`.
    /// `EFAULT` for a task without one, `ENOMEM`.
    pub(crate) fn new(start: usize, len: usize, owner: T) -> Result<Pin<KBox<Self>>> {
        let mm = current_mm().ok_or(EFAULT)?;
        KBox::try_pin_init(
            // The owner first: the callback may run as soon as `sub` is inserted. If the
            // insertion fails, the owner is dropped and `drop` (which removes) does not run.
            try_pin_init!(Self {
                owner,
                sub <- Opaque::try_ffi_init(|sub| {
                    // SAFETY: `sub` is the pinned slot of the notifier, removed by `drop` once
                    // the whole structure is made; `mm` is the calling process's (held);
                    // `OPS` is a constant with a static address (promoted) whose callback
                    // takes a `sub` of this type.
                    let r = unsafe {
                        bindings::mmu_interval_notifier_insert(
                            sub,
                            mm.as_raw(),
                            start,
                            len,
                            &Self::OPS,
                        )
                    };
                    kernel::error::to_result(r)
                }),
            }),
            GFP_KERNEL_ACCOUNT,
        )
    }

    /// # Safety
    ///
    /// Called by the notifier code with the `sub` of a live [`RangeWatch<T>`] inserted with
    /// [`Self::OPS`] and a valid range.
    unsafe extern "C" fn invalidate(
        sub: *mut bindings::mmu_interval_notifier,
        range: *const bindings::mmu_notifier_range,
        _seq: kernel::ffi::c_ulong,
    ) -> bool {
        // SAFETY: by the contract, `range` is valid for the call.
        let event = unsafe { (*range).event };
        if event == bindings::mmu_notifier_event_MMU_NOTIFY_UNMAP
            || event == bindings::mmu_notifier_event_MMU_NOTIFY_RELEASE
        {
            // SAFETY: `sub` is the `sub` field of a live `RangeWatch<T>` (`Opaque` is
            // `repr(transparent)`), which its removal (in `drop`) keeps alive until every
            // callback in flight has returned.
            let this = unsafe { &*kernel::container_of!(sub.cast::<Opaque<_>>(), Self, sub) };
            this.owner.unmapped();
        }
        true
    }
}

#[pinned_drop]
impl<T: Unmapped> PinnedDrop for RangeWatch<T> {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: inserted when made (the type invariant); removed once here, from process
        // context and never from its own callback, which this waits for.
        unsafe { bindings::mmu_interval_notifier_remove(self.sub.get()) };
    }
}
