// SPDX-License-Identifier: GPL-2.0

//! What the kernel spends for a caller is charged to the caller's memory cgroup: not only a
//! mem's pages but its objects, which the file's quota does not count (it counts a mem's
//! bytes), so that a process cannot make the kernel spend memory charged to nobody by making
//! many small mems. Skipped without the cgroup2 memory controller.

use super::harness::{cases, check, in_child, Case, Context, Stop, TestResult};
use crate::cgroup::MemGroup;
use libruvm::Ruvm;

pub fn cases() -> Vec<Case> {
    cases![charge_mem_objects_to_the_callers_cgroup]
}

/// Mems of one page each, made by a child in a cgroup of its own.
const MEMS: u64 = 2000;

/// A child in a memory cgroup makes [`MEMS`] mems of 4 KiB, each DMA-mapped for no GPU: the
/// group's `memory.current` grows by each mem's page and at least 256 bytes more for its
/// objects (the mem and its state are several hundred bytes; they were charged to nobody).
fn charge_mem_objects_to_the_callers_cgroup() -> TestResult {
    if !MemGroup::available() {
        return Err(Stop::Skip("no cgroup2 memory controller".into()));
    }
    let group = MemGroup::new("ruvm-charge-objects").ctx("memory cgroup")?;
    let dir = group.dir.clone();
    let (rx, tx) = nix::unistd::pipe().ctx("pipe")?;
    // `tx` goes into the child's closure (the parent's copy closes when `in_child` returns).
    let st = in_child(move || {
        if std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).is_err() {
            return 10;
        }
        let Ok(d) = Ruvm::open() else { return 11 };
        let current = || -> u64 {
            std::fs::read_to_string(dir.join("memory.current"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        };
        // One mem first: the file's own objects and the first slabs are not the mems'.
        let Ok(_first) = d.mem_alloc(4096, 4096, 0) else {
            return 12;
        };
        let before = current();
        for _ in 0..MEMS {
            if d.mem_alloc(4096, 4096, 0).is_err() {
                return 12;
            }
        }
        let grew = current().saturating_sub(before);
        let _ = nix::unistd::write(&tx, format!("{grew}").as_bytes());
        drop(d);
        0
    })?;
    let mut buf = [0u8; 32];
    let n = nix::unistd::read(&rx, &mut buf).unwrap_or(0);
    let grew: u64 = std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    check!(
        matches!(st, nix::sys::wait::WaitStatus::Exited(_, 0)),
        "the child ended {st:?}"
    );
    println!(
        "# {MEMS} mems of 4 KiB: the group grew by {grew} bytes ({} a mem)",
        grew / MEMS
    );
    check!(
        grew >= MEMS * (4096 + 256),
        "{MEMS} mems of 4 KiB charged {grew} bytes to their maker's group: {} a mem, wanted at \
         least 4352 (the page and the mem's objects)",
        grew / MEMS
    );
    Ok(())
}
