// SPDX-License-Identifier: GPL-2.0

//! Steps several groups of cases share: the audit's live counts, and the seeded pattern
//! written and checked through a mem's kernel mapping.

use libruvm::{uapi, Ruvm};

use super::harness::{Context, Stop, TestResult};

/// The audit's live counts, by `enum ruvm_audit_class`.
pub(super) fn live(d: &Ruvm) -> Result<Vec<u64>, Stop> {
    Ok(d.audit(false).ctx("AUDIT")?.live.to_vec())
}

/// The fill of `[0, len)` of mem `h` with the pattern of `seed`.
fn pattern(h: u64, len: u64, seed: u64) -> uapi::ruvm_mem_fill {
    uapi::ruvm_mem_fill {
        handle: h,
        length: len,
        seed,
        ..Default::default()
    }
}

/// Writes the pattern of `seed` into `[0, len)` of `h` through its kernel mapping.
pub(super) fn fill(d: &Ruvm, h: u64, len: u64, seed: u64) -> TestResult {
    d.map_kernel(h).ctx("MAP_CPU_KERNEL")?;
    d.mem_fill(false, pattern(h, len, seed)).ctx("MEM_FILL")?;
    Ok(())
}

/// Bytes of `[0, len)` of `h` that differ from the pattern of `seed`.
pub(super) fn mismatches(d: &Ruvm, h: u64, len: u64, seed: u64) -> Result<u64, Stop> {
    d.map_kernel(h).ctx("MAP_CPU_KERNEL")?;
    let v = d.mem_fill(true, pattern(h, len, seed)).ctx("MEM_VERIFY")?;
    Ok(v.mismatches)
}
