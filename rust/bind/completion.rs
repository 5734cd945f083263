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

    /// Forgets any earlier signal (only while nobody waits: the one waiter calls it before it
    /// starts what will signal).
    pub(crate) fn reset(&self) {
        // SAFETY: the completion is initialised and has no waiter (the caller's promise).
        unsafe { bindings::init_completion(self.inner.get()) };
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
