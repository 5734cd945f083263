// SPDX-License-Identifier: GPL-2.0

//! `ruvmctl heap run` and `heap copy`: a pinned heap (`libruvm::heap`) exercised on a trace
//! and inspected, its blocks copied by the engine by their pointers, and
//! the replays the `heap` bench group times: a trace through a pinned heap, through fresh
//! mems, and a trace of small blocks through glibc's `malloc` and mimalloc's own heap.

use std::collections::HashMap;

use anyhow::{anyhow, Context, Result};
use libruvm::heap::{HeapConfig, HeapStats, PinnedHeap};
use libruvm::{op, uapi, Ruvm};
use serde::Serialize;

use super::allocator::Meter;
use crate::output::Report;
use crate::trace::{Event, Trace};

/// `trace`'s allocations and frees (nothing else: pinned host memory, freed in program
/// order) through a pinned heap DMA-mapped for `gpus`, its calls timed; the heap's figures at
/// the end, before and after a collect.
pub fn replay_heap(
    d: &Ruvm,
    gpus: &[u32],
    trace: &Trace,
    arena_size: u64,
) -> Result<(f64, HeapStats, HeapStats)> {
    let heap = PinnedHeap::new(
        d,
        &HeapConfig {
            gpus: gpus.to_vec(),
            arena_size,
        },
    )
    .context("a pinned heap")?;
    let mut live: HashMap<u32, *mut u8> = HashMap::new();
    let mut ns = Meter::new();
    let mut allocs = 0u64;
    let r = (|| -> Result<()> {
        for e in &trace.events {
            match *e {
                Event::Alloc { id, size, .. } => {
                    let n = usize::try_from(size)?;
                    let p = ns.time(|| heap.malloc(n));
                    if p.is_null() {
                        return Err(anyhow!("the heap's malloc({n}) returned null"));
                    }
                    // Touched, as a program would: the first byte of each page it gets.
                    for o in (0..n).step_by(4096) {
                        // SAFETY: inside the block just made.
                        unsafe { p.add(o).write_volatile(1) };
                    }
                    live.insert(id, p);
                    allocs += 1;
                }
                Event::Free { id, .. } => {
                    let p = live.remove(&id).ok_or_else(|| anyhow!("free of {id}"))?;
                    // SAFETY: a live block of the heap, not used after.
                    ns.time(|| unsafe { heap.free(p) });
                }
                Event::Mark => {
                    ns = Meter::new();
                    allocs = 0;
                    heap.reset_peaks();
                }
                _ => {}
            }
        }
        Ok(())
    })();
    for (_, p) in live {
        // SAFETY: live blocks, not used after.
        unsafe { heap.free(p) };
    }
    r?;
    let held = heap.stats();
    heap.collect();
    Ok((ns.ns() / allocs.max(1) as f64, held, heap.stats()))
}

/// A trace of small blocks (8 B to 64 KiB, log-uniform): `ops` allocations, each block freed
/// once 256 more were made, from `seed`.
pub fn small_trace(ops: usize, seed: u64) -> Vec<(usize, usize)> {
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..ops)
        .map(|_| {
            let shift = 3 + next() % 14;
            let n = (1usize << shift) + (next() as usize & ((1 << shift) - 1));
            (n.min(64 << 10), 256)
        })
        .collect()
}

/// Nanoseconds per malloc + free pair of `trace` through `malloc` and `free`.
pub fn time_small(
    trace: &[(usize, usize)],
    malloc: &dyn Fn(usize) -> *mut u8,
    free: &dyn Fn(*mut u8),
) -> Result<f64> {
    let mut ns = Meter::new();
    let mut window: std::collections::VecDeque<*mut u8> = std::collections::VecDeque::new();
    for &(n, keep) in trace {
        let p = ns.time(|| malloc(n));
        if p.is_null() {
            return Err(anyhow!("malloc({n}) returned null"));
        }
        // SAFETY: the block's first byte.
        unsafe { p.write_volatile(1) };
        window.push_back(p);
        if window.len() > keep {
            if let Some(q) = window.pop_front() {
                ns.time(|| free(q));
            }
        }
    }
    for q in window {
        ns.time(|| free(q));
    }
    Ok(ns.ns() / trace.len().max(1) as f64)
}

/// A heap's figures, as `heap run --json` prints them (`libruvm::heap::HeapStats`).
#[derive(Serialize)]
pub struct Figures {
    pub reserved: u64,
    pub reserved_peak: u64,
    pub in_use: u64,
    pub in_use_peak: u64,
    pub allocs: u64,
    pub frees: u64,
    pub hits: u64,
    pub commits: u64,
    pub decommits: u64,
    pub arena_size: u64,
}

impl From<HeapStats> for Figures {
    fn from(s: HeapStats) -> Self {
        Self {
            reserved: s.reserved,
            reserved_peak: s.reserved_peak,
            in_use: s.in_use,
            in_use_peak: s.in_use_peak,
            allocs: s.allocs,
            frees: s.frees,
            hits: s.hits,
            commits: s.commits,
            decommits: s.decommits,
            arena_size: s.arena_size,
        }
    }
}

/// What `heap run` shows.
#[derive(Serialize)]
pub struct HeapRun {
    pub class: String,
    pub allocs: u64,
    pub ns_per_pair: f64,
    /// The heap's figures with the trace's last blocks freed, before the collect.
    pub held: Figures,
    /// After the collect: what the kernel still holds of the arena.
    pub collected: Figures,
    pub peak_live: u64,
}

impl Report for HeapRun {
    fn render(&self) -> String {
        let s = &self.held;
        format!(
            "{} trace, {} allocations through a pinned heap: {:.0} ns per malloc + free pair\n\
             arena {} bytes; resident peak {} bytes for a live peak of {} ({:.3}x); \
             {} hits, {} commits, {} decommits\n\
             after a collect: {} bytes resident",
            self.class,
            self.allocs,
            self.ns_per_pair,
            s.arena_size,
            s.reserved_peak,
            self.peak_live,
            s.reserved_peak as f64 / self.peak_live.max(1) as f64,
            s.hits,
            s.commits,
            self.collected.decommits,
            self.collected.reserved
        )
    }
}

/// `ruvmctl heap run`.
pub fn run(
    d: &Ruvm,
    class: crate::trace::Class,
    iterations: u32,
    gpus: &[u32],
    arena_size: u64,
) -> Result<HeapRun> {
    let trace = crate::trace::generate(class, iterations, 1);
    let (ns, held, collected) = replay_heap(d, gpus, &trace, arena_size)?;
    Ok(HeapRun {
        class: format!("{class:?}").to_lowercase(),
        allocs: held.allocs,
        ns_per_pair: ns,
        held: held.into(),
        collected: collected.into(),
        peak_live: trace.peak_live,
    })
}

/// What `heap copy` shows.
#[derive(Serialize)]
pub struct HeapCopy {
    pub gpu: u32,
    pub bytes: u64,
    /// `ce_copy` (at once) or `stream` (queued and waited for).
    pub how: &'static str,
    /// The blocks' addresses in ruvmctl's process.
    pub src: u64,
    pub dst: u64,
    /// The copy's time, queueing and waiting included.
    pub ns: u128,
    /// Bytes of the destination block that are not the source's.
    pub mismatches: u64,
}

impl Report for HeapCopy {
    fn render(&self) -> String {
        format!(
            "{} bytes copied on GPU {} ({}) from block {:#x} to block {:#x} by their pointers \
             in {} us: {}",
            self.bytes,
            self.gpu,
            self.how,
            self.src,
            self.dst,
            self.ns / 1000,
            if self.mismatches == 0 {
                "every byte matches".to_string()
            } else {
                format!("{} bytes differ", self.mismatches)
            }
        )
    }
}

/// `ruvmctl heap copy`: fails unless every byte arrived.
pub fn copy(d: &Ruvm, gpu: u32, size: u64, on_stream: bool) -> Result<HeapCopy> {
    let n = usize::try_from(size).context("size")?;
    if n == 0 {
        return Err(anyhow!("a copy of 0 bytes"));
    }
    // Room for both blocks beside mimalloc's metadata at the arena's start, and its
    // alignment of large blocks.
    let arena_size = size
        .checked_mul(5)
        .map(|n| n / 2 + (8 << 20))
        .ok_or_else(|| anyhow!("a copy of {size} bytes is too large"))?;
    let heap = PinnedHeap::new(
        d,
        &HeapConfig {
            gpus: vec![gpu],
            arena_size,
        },
    )
    .map_err(|e| anyhow!("a pinned heap for GPU {gpu}: {e}"))?;
    let (src, dst) = (heap.malloc(n), heap.malloc(n));
    if src.is_null() || dst.is_null() {
        return Err(anyhow!(
            "the heap's arena of {} bytes (at most the module's largest mem) has no room for \
             two blocks of {size} bytes",
            heap.stats().arena_size
        ));
    }
    for i in 0..n {
        // SAFETY: `src` is a live block of `n` bytes.
        unsafe { src.add(i).write(crate::pattern::byte_at(1, i as u64)) };
    }
    let start = std::time::Instant::now();
    let copied = if on_stream {
        let s = d.stream_create(gpu).context("STREAM_CREATE")?.handle;
        let o = op::with_dst_ptr(op::with_src_ptr(op::copy(0, 0, 0, 0, size), src), dst);
        let r = d
            .stream_submit(s, &[o])
            .and_then(|_| d.stream_sync(s, uapi::RUVM_WAIT_MAX_MS));
        let _ = d.stream_destroy(s);
        r.context("the copy on a stream")
    } else {
        let flags = uapi::ruvm_op_flags_RUVM_OP_SRC_PTR | uapi::ruvm_op_flags_RUVM_OP_DST_PTR;
        d.ce_copy_flags(gpu, flags, (dst as u64, 0), (src as u64, 0), size)
            .context("CE_COPY")
    };
    let ns = start.elapsed().as_nanos();
    // SAFETY: `dst` is a live block of `n` bytes, written by the engine before the call
    // returned (or the stream was synchronized).
    let mismatches = (0..n)
        .filter(|&i| unsafe { dst.add(i).read_volatile() } != crate::pattern::byte_at(1, i as u64))
        .count() as u64;
    // SAFETY: the blocks, not used after.
    unsafe {
        heap.free(src);
        heap.free(dst);
    }
    copied?;
    let r = HeapCopy {
        gpu,
        bytes: size,
        how: if on_stream { "stream" } else { "ce_copy" },
        src: src as u64,
        dst: dst as u64,
        ns,
        mismatches,
    };
    if r.mismatches != 0 {
        return Err(anyhow!("{}", r.render()));
    }
    Ok(r)
}
