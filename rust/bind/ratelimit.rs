// SPDX-License-Identifier: GPL-2.0

//! The kernel log's rate limit (`printk_ratelimit`), for messages a process can trigger at will.
//!
//! C header: [`include/linux/printk.h`](srctree/include/linux/printk.h)

use kernel::{
    bindings,
    prelude::*,
    sync::atomic::{ordering::Relaxed, Atomic},
};

/// Whether a rate-limited message may be printed now (the kernel's default burst and interval,
/// shared by every caller of `printk_ratelimit`).
pub(crate) fn printk_ok() -> bool {
    // SAFETY: the argument is a NUL-terminated name used in the "callbacks suppressed" note.
    unsafe { bindings::__printk_ratelimit(c"ruvm".as_char_ptr()) != 0 }
}

/// A rate limit of one message's own (`burst` messages every 5 seconds), so that the kernel's
/// shared budget, which other messages use up, cannot hide it, while a process that triggers
/// it at will still cannot flood the log.
pub(crate) struct Own {
    /// When the current interval began (`CLOCK_MONOTONIC`, ns).
    start: Atomic<u64>,
    /// Messages asked for in it.
    count: Atomic<u32>,
    burst: u32,
}

impl Own {
    /// The interval's length, as the kernel's default (`DEFAULT_RATELIMIT_INTERVAL`).
    const INTERVAL_NS: u64 = 5_000_000_000;

    pub(crate) const fn new(burst: u32) -> Self {
        Self {
            start: Atomic::new(0),
            count: Atomic::new(0),
            burst,
        }
    }

    /// Whether the message may be printed now.
    pub(crate) fn ok(&self) -> bool {
        // SAFETY: no requirement.
        let now = u64::try_from(unsafe { bindings::ktime_get() }).unwrap_or(0);
        let start = self.start.load(Relaxed);
        if now.saturating_sub(start) >= Self::INTERVAL_NS
            && self.start.cmpxchg(start, now, Relaxed).is_ok()
        {
            // A new interval (one thread of those racing here starts it).
            self.count.store(0, Relaxed);
        }
        self.count.fetch_add(1, Relaxed) < self.burst
    }
}
