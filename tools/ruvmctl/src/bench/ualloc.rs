// SPDX-License-Identifier: GPL-2.0

//! The `ualloc` group of `ruvmctl bench`: libruvm's user-space stream-ordered allocator
//! (`libruvm::alloc`) on allocation traces of the shapes programs make ([`Class`]), replayed
//! one call at a time on a simulated GPU's streams, against the same trace through fresh mems
//! (`MEM_ALLOC` + `MEM_MAP_GPU` ... `MEM_FREE`), as `ruvmctl allocator replay --baseline`
//! does: one trace of each class (seed 1), its warm-up untimed, the release threshold at its
//! maximum (as CUDA's figures were taken).
//!
//! - `ualloc.CLASS`: time per alloc + free pair, the allocator's calls only, against fresh
//!   mems (goal <= 0.05; CUDA's stream-ordered pool 0.070 of `cudaMalloc` + `cudaFree` on an
//!   H200, shared/ALLOCATORS.md).
//! - `ualloc.CLASS.footprint`: the allocator's reserved high watermark against the trace's
//!   peak of live bytes (goal <= 1.1; CUDA 1.06, PyTorch 1.60, CuPy 1.47).

use anyhow::Result;
use libruvm::alloc::Config;

use super::cases::Ctx;
use super::{pairs, Case};
use crate::cmd::allocator::{replay_fresh, replay_ualloc};
use crate::trace::{generate, Class};

/// Timed iterations of each trace (after its warm-up); a tiny run (`--max-size` below 64 MiB,
/// as `make check` runs it) takes a quarter.
const ITERATIONS: u32 = 20;

/// The classes, by id: the time cases' and the footprints'.
const CLASSES: [(Class, &str); 6] = [
    (Class::Same, "same"),
    (Class::Large, "large"),
    (Class::Training, "training"),
    (Class::Interleaved, "interleaved"),
    (Class::CrossStream, "cross_stream"),
    (Class::Pressure, "pressure"),
];

pub(super) fn ualloc(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let gpu = c.sim;
    // The release threshold at its maximum, as CUDA's figures were taken: nothing is given
    // back at a synchronize (the pressure class trims instead).
    let cfg = Config {
        release_threshold: u64::MAX,
        ..Config::default()
    };
    for (class, name) in CLASSES {
        let mut time = c.case(
            format!("ualloc.{name}"),
            &format!("{name} trace through libruvm's allocator, per alloc + free pair"),
            "the same trace through MEM_ALLOC + MEM_MAP_GPU ... MEM_FREE",
            "ns",
        );
        let mut room = c.case(
            format!("ualloc.{name}.footprint"),
            &format!("{name} trace: the allocator's reserved high watermark"),
            "the trace's peak of live bytes",
            "B",
        );
        let iterations = if c.spec.max_size < 64 << 20 {
            ITERATIONS / 4
        } else {
            ITERATIONS
        };
        let t = generate(class, iterations, 1);
        let mut peaks = Vec::new();
        (time.ruvm, time.base) = pairs(
            c.spec.reps,
            &mut || {
                let (timing, stats) = replay_ualloc(c.d, gpu, &t, cfg.clone())?;
                peaks.push(stats.reserved_peak as f64);
                Ok(timing.ns_per_pair)
            },
            &mut || Ok(replay_fresh(c.d, gpu, &t)?.ns_per_pair),
        )?;
        footprints(&mut room, peaks, c.spec.reps, t.peak_live);
        out(time);
        out(room);
    }
    Ok(())
}

/// Fills a footprint case from the reserved peaks of a time case's runs: the last `reps` (the
/// warm-up pair's is dropped as its time is), each against the trace's peak of live bytes.
pub(super) fn footprints(room: &mut Case, peaks: Vec<f64>, reps: usize, live: u64) {
    let skip = peaks.len().saturating_sub(reps);
    for r in peaks.into_iter().skip(skip) {
        room.ruvm.push(r);
        room.base.push(live as f64);
    }
}
