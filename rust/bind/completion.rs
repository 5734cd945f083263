// SPDX-License-Identifier: GPL-2.0

//! A completion with a bounded wait (the 7.2 crate's `Completion` waits without a timeout):
//! what an interrupt handler signals and a driver's thread waits for.

use kernel::{bindings, prelude::*, time::msecs_to_jiffies, types::Opaque};

/// A `struct completion`.
#[pin_data]
pub(crate) struct Done {
    #[pin]
    inner: Opaque<bindings::completion>,
}

// SAFETY: a completion is made to be signalled from any context (IRQ included) and waited for
// from another thread; its own lock guards it.
unsafe impl Send for Done {}
// SAFETY: as above.
unsafe impl Sync for Done {}

impl Done {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            // SAFETY: `slot` is valid memory for a completion, initialised here.
            inner <- Opaque::ffi_init(|slot| unsafe { bindings::init_completion(slot) }),
        })
    }

    /// Forgets any earlier signal (`reinit_completion`: the count only, the lock untouched,
    /// so a late signal racing it is harmless: the waiter then confirms with the device).
    pub(crate) fn reset(&self) {
        // SAFETY: the completion is initialised; `done` is what `reinit_completion` clears.
        unsafe { core::ptr::addr_of_mut!((*self.inner.get()).done).write_volatile(0) };
    }

    /// Signals one waiter. Any context.
    pub(crate) fn signal(&self) {
        // SAFETY: the completion is initialised.
        unsafe { bindings::complete(self.inner.get()) };
    }

    /// Waits for a signal, at most `ms` milliseconds (uninterruptibly: bounded); whether it
    /// came.
    pub(crate) fn wait(&self, ms: u32) -> bool {
        // SAFETY: the completion is initialised.
        unsafe {
            bindings::wait_for_completion_timeout(self.inner.get(), msecs_to_jiffies(ms)) != 0
        }
    }
}
