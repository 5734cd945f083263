// SPDX-License-Identifier: GPL-2.0

//! The `heap` group of `ruvmctl bench`: libruvm's pinned heaps (`libruvm::heap`, mimalloc
//! arenas over sparse mems).
//!
//! - `heap.small`: `malloc` + `free` of small blocks (8 B to 64 KiB, each freed 256 blocks
//!   later) from a pinned heap, against glibc's `malloc` + `free` of the same trace (goal
//!   <= 1.5x).
//! - `heap.small.mimalloc`: the same trace through mimalloc's own heap (`mi_malloc`), the floor,
//!   against glibc: for information.
//! - `heap.training`: the training trace (32 blocks of 4 KiB to 4 MiB an iteration, freed
//!   shuffled) through a pinned heap DMA-mapped for a simulated GPU, against fresh
//!   `MEM_ALLOC` + `MEM_MAP_GPU` + `MEM_FREE` (goal <= 0.005; CUDA's pinned pool 0.0048 of
//!   `cudaHostAlloc` on an H200).
//! - `heap.training.footprint`: the arena's resident peak against the trace's peak of live
//!   bytes (goal <= 1.1).
//! - `heap.one_call_4k`: a 4 KiB mem allocated and mapped in one call, touched and freed,
//!   against an anonymous `mmap`, touch and `munmap` (goal <= 0.8).
//! - `heap.register_64k`, `heap.register_64m` (`super::register`): registering a program's
//!   memory and unregistering it, against `mmap(MAP_POPULATE)` + `munmap` (goal <= 2x).

use anyhow::Result;
use libruvm::heap::{HeapConfig, PinnedHeap};

use super::cases::Ctx;
use super::{pairs, Case};
use crate::cmd::allocator::replay_fresh;
use crate::cmd::heap::{replay_heap, small_trace, time_small};
use crate::trace::{generate, Class};

/// Allocations of the small trace.
const SMALL_OPS: usize = 20_000;

pub(super) fn heap(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let trace = small_trace(SMALL_OPS, 7);
    let glibc_malloc = |n: usize| -> *mut u8 {
        // SAFETY: glibc's malloc; the block goes back through `glibc_free`.
        unsafe { nix::libc::malloc(n).cast() }
    };
    let glibc_free = |p: *mut u8| {
        // SAFETY: a block of glibc's malloc, not used after.
        unsafe { nix::libc::free(p.cast()) }
    };
    let heap = PinnedHeap::new(
        c.d,
        &HeapConfig {
            gpus: vec![c.sim],
            arena_size: 256 << 20,
        },
    )?;
    let pinned_malloc = |n: usize| heap.malloc(n);
    let pinned_free = |p: *mut u8| {
        // SAFETY: a block of this heap, not used after.
        unsafe { heap.free(p) }
    };
    let mut small = c.case(
        "heap.small".into(),
        "pinned heap malloc + free, 8 B to 64 KiB",
        "glibc malloc + free of the same trace",
        "ns",
    );
    (small.ruvm, small.base) = pairs(
        c.spec.reps,
        &mut || time_small(&trace, &pinned_malloc, &pinned_free),
        &mut || time_small(&trace, &glibc_malloc, &glibc_free),
    )?;
    out(small);
    let mi_malloc = |n: usize| -> *mut u8 {
        // SAFETY: mimalloc's default heap; the block goes back through `mi_free`.
        unsafe { libmimalloc_sys::mi_malloc(n).cast() }
    };
    let mi_free = |p: *mut u8| {
        // SAFETY: a block of mimalloc's, not used after.
        unsafe { libmimalloc_sys::mi_free(p.cast()) }
    };
    let mut floor = c.case(
        "heap.small.mimalloc".into(),
        "mimalloc's own heap (the floor), 8 B to 64 KiB",
        "glibc malloc + free of the same trace",
        "ns",
    );
    (floor.ruvm, floor.base) = pairs(
        c.spec.reps,
        &mut || time_small(&trace, &mi_malloc, &mi_free),
        &mut || time_small(&trace, &glibc_malloc, &glibc_free),
    )?;
    out(floor);
    drop(heap);
    let iterations = if c.spec.max_size < 64 << 20 { 5 } else { 20 };
    let t = generate(Class::Training, iterations, 1);
    let mut time = c.case(
        "heap.training".into(),
        "training trace through a pinned heap, per malloc + free pair",
        "the same trace through MEM_ALLOC + MEM_MAP_GPU ... MEM_FREE",
        "ns",
    );
    let mut room = c.case(
        "heap.training.footprint".into(),
        "training trace: the pinned heap's resident peak",
        "the trace's peak of live bytes",
        "B",
    );
    let mut peaks = Vec::new();
    (time.ruvm, time.base) = pairs(
        c.spec.reps,
        &mut || {
            let (ns, held, _) = replay_heap(c.d, &[c.sim], &t, 256 << 20)?;
            peaks.push(held.reserved_peak as f64);
            Ok(ns)
        },
        &mut || Ok(replay_fresh(c.d, c.sim, &t)?.ns_per_pair),
    )?;
    super::ualloc::footprints(&mut room, peaks, c.spec.reps, t.peak_live);
    out(time);
    out(room);
    one_call(c, out)?;
    super::register::register(c, out)
}

/// Rounds of the one-call case.
const ONE_CALL_ROUNDS: usize = 300;

/// `heap.one_call_4k`: a 4 KiB mem allocated and mapped in one `MEM_ALLOC`
/// (`RUVM_ALLOC_MAP_USER`), touched, freed (`MEM_FREE` unmaps it), against an anonymous
/// `mmap`, a touch (the page fault) and `munmap` (goal <= 0.8).
fn one_call(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};
    let mut case = c.case(
        "heap.one_call_4k".into(),
        "4 KiB mem: MEM_ALLOC with RUVM_ALLOC_MAP_USER, touch, MEM_FREE",
        "anonymous mmap, touch, munmap",
        "ns",
    );
    let map = libruvm::uapi::ruvm_alloc_flags_RUVM_ALLOC_MAP_USER;
    let page = std::num::NonZeroUsize::new(4096).ok_or_else(|| anyhow::anyhow!("page"))?;
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || {
            let t = std::time::Instant::now();
            for _ in 0..ONE_CALL_ROUNDS {
                let a = c.d.mem_alloc(4096, 0, map)?;
                // SAFETY: the page the call mapped.
                unsafe { (a.user_addr as *mut u8).write_volatile(1) };
                c.d.mem_free(a.handle)?;
            }
            Ok(t.elapsed().as_nanos() as f64 / ONE_CALL_ROUNDS as f64)
        },
        &mut || {
            let t = std::time::Instant::now();
            for _ in 0..ONE_CALL_ROUNDS {
                // SAFETY: a new private mapping where the kernel chooses.
                let p = unsafe {
                    mmap_anonymous(
                        None,
                        page,
                        ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                        MapFlags::MAP_PRIVATE,
                    )
                }?;
                // SAFETY: the page just mapped.
                unsafe { p.cast::<u8>().as_ptr().write_volatile(1) };
                // SAFETY: the mapping, not used after.
                unsafe { munmap(p, 4096) }?;
            }
            Ok(t.elapsed().as_nanos() as f64 / ONE_CALL_ROUNDS as f64)
        },
    )?;
    out(case);
    Ok(())
}
