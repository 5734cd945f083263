// SPDX-License-Identifier: GPL-2.0

//! Module-wide mutexes that are safe to use: a `global_lock!` that cannot be locked before it
//! is initialised.
//!
//! C header: [`include/linux/mutex.h`](srctree/include/linux/mutex.h)
//!
//! The kernel's `global_lock!` statics must be initialised (an `unsafe` call) before their first
//! use. [`global!`] declares one wrapped in [`Global`], which remembers whether it was
//! initialised: [`Global::lock`] returns `None` before [`Global::init`] has finished, so no
//! caller can reach an uninitialised lock. The state itself is declared by the module that owns
//! it; this file holds none.

use kernel::sync::{
    atomic::{
        ordering::{Acquire, Relaxed, Release},
        Atomic,
    },
    lock::{GlobalGuard, GlobalLock, GlobalLockBackend},
};

/// Not initialised yet.
const UNINIT: u32 = 0;
/// Being initialised by one thread.
const INITIALISING: u32 = 1;
/// Usable.
const READY: u32 = 2;

/// A module-wide mutex declared with [`global!`].
///
/// # Invariants
///
/// `state` is [`READY`] only after `lock.init()` has returned, and `lock.init()` is called at
/// most once (by the one thread that moved `state` from [`UNINIT`] to [`INITIALISING`]).
pub(crate) struct Global<B: GlobalLockBackend + 'static> {
    lock: GlobalLock<B>,
    state: Atomic<u32>,
}

impl<B: GlobalLockBackend + 'static> Global<B> {
    /// A lock holding `value`, not initialised yet.
    ///
    /// # Safety
    ///
    /// The backend type `B` is used with no other lock (what [`global!`] guarantees by making a
    /// new type for each static).
    pub(crate) const unsafe fn new(value: B::Item) -> Self {
        Self {
            // SAFETY: `Self::lock` never calls a method of `lock` before `init` has returned
            // (type invariant); `B` is used with no other lock (this function's contract).
            lock: unsafe { GlobalLock::new(value) },
            state: Atomic::new(UNINIT),
        }
    }

    /// Initialises the lock; later calls do nothing. Call it from module init, before the lock
    /// is needed.
    pub(crate) fn init(&'static self) {
        if self.state.cmpxchg(UNINIT, INITIALISING, Relaxed).is_ok() {
            // SAFETY: only the thread that moved `state` away from `UNINIT` gets here, once.
            unsafe { self.lock.init() };
            // INVARIANT: `init` has returned.
            self.state.store(READY, Release);
        }
    }

    /// Locks it, or `None` if it was never initialised.
    pub(crate) fn lock(&'static self) -> Option<GlobalGuard<B>> {
        (self.state.load(Acquire) == READY).then(|| self.lock.lock())
    }

    /// Locks it if it is free, else (or if it was never initialised) `None`.
    pub(crate) fn try_lock(&'static self) -> Option<GlobalGuard<B>> {
        if self.state.load(Acquire) != READY {
            return None;
        }
        self.lock.try_lock()
    }
}

/// Declares a module-wide mutex: `global! { pub(crate) static NAME: Mutex<T> = value; }`.
///
/// The owner calls `NAME.init()` from its own init function (run from module init) and
/// `NAME.lock()` to use it.
macro_rules! global {
    {
        $(#[$meta:meta])* $vis:vis static $name:ident: Mutex<$ty:ty> = $value:expr;
    } => {
        #[allow(
            non_camel_case_types,
            unreachable_pub,
            clippy::upper_case_acronyms,
            reason = "the lock's backend type is named after its static, as global_lock! does"
        )]
        #[doc = ::core::concat!("Backend of [`", ::core::stringify!($name), "`].")]
        $vis enum $name {}

        impl ::kernel::sync::lock::GlobalLockBackend for $name {
            const NAME: &'static ::kernel::str::CStr =
                ::kernel::c_str!(::core::stringify!($name));
            type Item = $ty;
            type Backend = ::kernel::sync::lock::mutex::MutexBackend;

            fn get_lock_class() -> ::core::pin::Pin<&'static ::kernel::sync::LockClassKey> {
                ::kernel::static_lock_class!()
            }
        }

        $(#[$meta])*
        $vis static $name: $crate::bind::global::Global<$name> = {
            let value: $ty = $value;
            // SAFETY: the backend type was made just above for this one static.
            unsafe { $crate::bind::global::Global::new(value) }
        };
    };
}
pub(crate) use global;
