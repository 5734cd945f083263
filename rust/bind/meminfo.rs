// SPDX-License-Identifier: GPL-2.0

//! How much memory the machine has.
//!
//! C header: [`include/linux/mm.h`](srctree/include/linux/mm.h) (`si_meminfo`)

use kernel::bindings;

/// The machine's usable RAM, in bytes (what `/proc/meminfo` calls `MemTotal`).
pub(crate) fn total_ram_bytes() -> u64 {
    let mut info = bindings::sysinfo::default();
    // SAFETY: `si_meminfo` fills in the structure it is given, which is valid and ours.
    unsafe { bindings::si_meminfo(&mut info) };
    // CAST: `c_ulong` is at most 64 bits on every kernel ruvm builds for.
    (info.totalram as u64).saturating_mul(u64::from(info.mem_unit))
}
