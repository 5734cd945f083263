// SPDX-License-Identifier: GPL-2.0

//! The kernel log's rate limit (`printk_ratelimit`), for messages a process can trigger at will.
//!
//! C header: [`include/linux/printk.h`](srctree/include/linux/printk.h)

use kernel::{bindings, prelude::*};

/// Whether a rate-limited message may be printed now (the kernel's default burst and interval,
/// shared by every caller of `printk_ratelimit`).
pub(crate) fn printk_ok() -> bool {
    // SAFETY: the argument is a NUL-terminated name used in the "callbacks suppressed" note.
    unsafe { bindings::__printk_ratelimit(c"ruvm".as_char_ptr()) != 0 }
}
