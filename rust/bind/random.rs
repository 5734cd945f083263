// SPDX-License-Identifier: GPL-2.0

//! Random bytes from the kernel's generator (the 7.2 `kernel` crate has no wrapper).
//!
//! C header: [`include/linux/random.h`](srctree/include/linux/random.h)

use kernel::bindings;

/// `N` bytes from the kernel's cryptographically secure generator (`get_random_bytes`).
pub(crate) fn bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // SAFETY: `b` is writable for `N` bytes for the duration of the call.
    unsafe { bindings::get_random_bytes(b.as_mut_ptr().cast(), N) };
    b
}
