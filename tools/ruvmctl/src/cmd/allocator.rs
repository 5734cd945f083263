// SPDX-License-Identifier: GPL-2.0

//! `ruvmctl allocator ...`: libruvm's user-space stream-ordered allocator driven by an
//! allocation trace ([`crate::trace`]), one call at a time, with its statistics; and the same
//! trace through fresh mems (`MEM_ALLOC` + `MEM_MAP_GPU` ... `MEM_FREE`) for a baseline. The
//! bench's `ualloc` group replays through here too.
//!
//! Only the allocator's calls are timed (alloc, free, trim, and a synchronize once the
//! stream's work is done: its give-back); the work a trace submits (`use`: the engine copies
//! 4 KiB into the block; records, waits) and the wait for it are not, on either side.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{anyhow, Context as _, Result};
use libruvm::alloc::{Allocator, Block, Config, Reuse, Stats};
use libruvm::{op, uapi, Ruvm};
use serde::Serialize;

use crate::output::{fields, Report};
use crate::trace::{Event, Trace};
use crate::units::show_size;

/// Bytes a `use` copies into its block.
const USE_LEN: u64 = 4096;
const WAIT_MS: u32 = uapi::RUVM_WAIT_MAX_MS;

/// The GPU a replay runs on: `want`, or the first with a copy engine (a simulated GPU first:
/// its engine is the faster).
pub fn engine_gpu(d: &Ruvm, want: Option<u32>) -> Result<u32> {
    let gpus = d.gpus().context("GPU_LIST")?;
    let engine = |g: &&uapi::ruvm_gpu_info| {
        g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
            && g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE != 0
    };
    if let Some(w) = want {
        return gpus
            .iter()
            .filter(engine)
            .find(|g| g.id == w)
            .map(|g| g.id)
            .ok_or_else(|| anyhow!("GPU {w} is not a present GPU with a copy engine"));
    }
    let sim = |g: &&uapi::ruvm_gpu_info| g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM;
    gpus.iter()
        .filter(engine)
        .find(sim)
        .or_else(|| gpus.iter().find(engine))
        .map(|g| g.id)
        .ok_or_else(|| anyhow!("no GPU with a copy engine (load ruvm with sim_gpus=N)"))
}

/// What a replay works with: the trace's streams and events on one GPU, and the mem a `use`
/// copies from; all destroyed on drop, after the streams' work.
struct Rig<'d> {
    d: &'d Ruvm,
    streams: Vec<u64>,
    events: Vec<u64>,
    src: u64,
}

impl<'d> Rig<'d> {
    fn new(d: &'d Ruvm, gpu: u32, trace: &Trace) -> Result<Self> {
        let mut rig = Self {
            d,
            streams: Vec::new(),
            events: Vec::new(),
            src: 0,
        };
        rig.src = d.mem_alloc(USE_LEN, 0, 0).context("MEM_ALLOC")?.handle;
        d.mem_gpu(true, rig.src, gpu).context("MEM_MAP_GPU")?;
        for _ in 0..trace.streams {
            rig.streams
                .push(d.stream_create(gpu).context("STREAM_CREATE")?.handle);
        }
        let events = trace
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Record { event, .. } | Event::Wait { event, .. } => Some(*event + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        for _ in 0..events {
            rig.events.push(d.event_create().context("EVENT_CREATE")?);
        }
        Ok(rig)
    }
}

impl Drop for Rig<'_> {
    fn drop(&mut self) {
        let _ = self.d.sync_every_stream(WAIT_MS);
        for &s in &self.streams {
            let _ = self.d.stream_destroy(s);
        }
        for &e in &self.events {
            let _ = self.d.event_destroy(e);
        }
        if self.src != 0 {
            let _ = self.d.mem_free(self.src);
        }
    }
}

/// A replay's figures.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Timing {
    /// Allocations replayed.
    pub allocs: u64,
    /// Nanoseconds of the timed calls per allocation (an alloc + free pair and its share of
    /// the rest).
    pub ns_per_pair: f64,
}

/// A cheap clock for timing one call: the time-stamp counter where there is one. In the
/// guests, reading the kernel's clock can cost more than an allocator's hit (the clocksource
/// is an emulated device under TCG), and would be most of what is measured.
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC reads a counter; it touches no memory, and every x86-64 CPU has it.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Sums the ticks of the timed calls; converts them to nanoseconds by the rate the clock ran
/// at over the whole replay.
pub(crate) struct Meter {
    ticks: u64,
    t0: (Instant, u64),
}

impl Meter {
    pub(crate) fn new() -> Self {
        Self {
            ticks: 0,
            t0: (Instant::now(), ticks()),
        }
    }

    /// Runs `f`, adding its ticks.
    pub(crate) fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t = ticks();
        let r = f();
        self.ticks += ticks().wrapping_sub(t);
        r
    }

    /// Nanoseconds of the timed calls.
    pub(crate) fn ns(&self) -> f64 {
        let wall = self.t0.0.elapsed().as_nanos() as f64;
        let all = ticks().wrapping_sub(self.t0.1) as f64;
        if all > 0.0 {
            self.ticks as f64 * wall / all
        } else {
            0.0
        }
    }
}

/// `trace` through libruvm's allocator on `gpu` (its segments DMA-mapped there).
pub fn replay_ualloc(d: &Ruvm, gpu: u32, trace: &Trace, cfg: Config) -> Result<(Timing, Stats)> {
    let rig = Rig::new(d, gpu, trace)?;
    let a = Allocator::new(
        d,
        Config {
            gpus: vec![gpu],
            ..cfg
        },
    );
    let mut live: HashMap<u32, Block> = HashMap::new();
    let mut ns = Meter::new();
    for (n, e) in trace.events.iter().enumerate() {
        let at = || format!("event {}: {e:?}", n + 1);
        match *e {
            Event::Alloc { id, size, stream } => {
                let b = ns
                    .time(|| a.alloc(size, rig.streams[stream as usize]))
                    .with_context(at)?;
                live.insert(id, b);
            }
            Event::Use { id, stream } => {
                let b = live[&id];
                let len = b.len().min(USE_LEN);
                a.submit(
                    rig.streams[stream as usize],
                    &[op::copy(b.mem(), b.offset(), rig.src, 0, len)],
                )
                .with_context(at)?;
            }
            Event::Free { id, stream } => {
                let b = live.remove(&id).ok_or_else(|| anyhow!("{}", at()))?;
                ns.time(|| a.free(b, rig.streams[stream as usize]))
                    .with_context(at)?;
            }
            Event::Record { event, stream } => a
                .record_event(rig.streams[stream as usize], rig.events[event as usize])
                .with_context(at)?,
            Event::Wait { event, stream } => a
                .wait_event(rig.streams[stream as usize], rig.events[event as usize])
                .with_context(at)?,
            Event::Sync { stream } => {
                let s = rig.streams[stream as usize];
                d.stream_sync(s, WAIT_MS).with_context(at)?;
                ns.time(|| a.synchronize(s)).with_context(at)?;
            }
            Event::Trim { keep } => {
                ns.time(|| a.trim(keep)).with_context(at)?;
            }
            Event::Mark => ns = Meter::new(),
        }
    }
    let stats = a.stats();
    drop(a);
    drop(rig);
    Ok((timing(trace, &ns), stats))
}

/// `trace` through fresh mems: `MEM_ALLOC` (default chunks) + `MEM_MAP_GPU` on `gpu` for an
/// alloc, `MEM_FREE` for a free.
pub fn replay_fresh(d: &Ruvm, gpu: u32, trace: &Trace) -> Result<Timing> {
    let rig = Rig::new(d, gpu, trace)?;
    let mut live: HashMap<u32, (u64, u64)> = HashMap::new();
    let mut ns = Meter::new();
    let result = (|| -> Result<()> {
        for (n, e) in trace.events.iter().enumerate() {
            let at = || format!("event {}: {e:?}", n + 1);
            match *e {
                Event::Alloc { id, size, .. } => {
                    ns.time(|| -> Result<()> {
                        let h = d.mem_alloc(size, 0, 0).context("MEM_ALLOC")?.handle;
                        live.insert(id, (h, size));
                        d.mem_gpu(true, h, gpu).context("MEM_MAP_GPU")
                    })
                    .with_context(at)?;
                }
                Event::Use { id, stream } => {
                    let (h, size) = live[&id];
                    d.stream_submit(
                        rig.streams[stream as usize],
                        &[op::copy(h, 0, rig.src, 0, size.min(USE_LEN))],
                    )
                    .with_context(at)?;
                }
                Event::Free { id, .. } => {
                    let (h, _) = live.remove(&id).ok_or_else(|| anyhow!("{}", at()))?;
                    ns.time(|| d.mem_free(h)).with_context(at)?;
                }
                Event::Record { event, stream } => {
                    d.stream_submit(
                        rig.streams[stream as usize],
                        &[op::record(rig.events[event as usize])],
                    )
                    .with_context(at)?;
                }
                Event::Wait { event, stream } => {
                    d.stream_submit(
                        rig.streams[stream as usize],
                        &[op::wait_event(rig.events[event as usize], WAIT_MS)],
                    )
                    .with_context(at)?;
                }
                Event::Sync { stream } => {
                    let s = rig.streams[stream as usize];
                    d.stream_sync(s, WAIT_MS).with_context(at)?;
                    ns.time(|| d.stream_sync(s, WAIT_MS)).with_context(at)?;
                }
                Event::Trim { .. } => {}
                Event::Mark => ns = Meter::new(),
            }
        }
        Ok(())
    })();
    for (_, (h, _)) in live {
        let _ = d.mem_free(h);
    }
    result?;
    Ok(timing(trace, &ns))
}

fn timing(trace: &Trace, ns: &Meter) -> Timing {
    Timing {
        allocs: trace.allocs,
        ns_per_pair: ns.ns() / trace.allocs.max(1) as f64,
    }
}

/// What `ruvmctl allocator replay` prints.
#[derive(Serialize)]
pub struct Replayed {
    pub trace: String,
    pub gpu: u32,
    pub allocs: u64,
    pub streams: u32,
    pub peak_live: u64,
    pub ns_per_pair: f64,
    /// With --baseline: the same trace through fresh mems, and the ratio.
    pub fresh_ns_per_pair: Option<f64>,
    pub ratio: Option<f64>,
    pub reserved_peak: u64,
    /// reserved_peak / peak_live.
    pub footprint: f64,
    pub hits: u64,
    pub misses: u64,
    pub cross_stream: u64,
    pub waits_inserted: u64,
    pub segments_released: u64,
}

impl Report for Replayed {
    fn render(&self) -> String {
        let mut rows = vec![
            ("trace", self.trace.clone()),
            (
                "calls",
                format!(
                    "{} allocations on {} stream(s), GPU {}",
                    self.allocs, self.streams, self.gpu
                ),
            ),
            (
                "time",
                format!("{:.0} ns per alloc + free pair", self.ns_per_pair),
            ),
        ];
        if let (Some(f), Some(r)) = (self.fresh_ns_per_pair, self.ratio) {
            rows.push((
                "fresh mems",
                format!("{f:.0} ns per MEM_ALLOC + MEM_MAP_GPU + MEM_FREE (ratio {r:.4})"),
            ));
        }
        let total = (self.hits + self.misses).max(1);
        rows.extend([
            (
                "hits",
                format!(
                    "{} of {} ({:.1} %); {} from another stream, {} waits inserted",
                    self.hits,
                    total,
                    100.0 * self.hits as f64 / total as f64,
                    self.cross_stream,
                    self.waits_inserted
                ),
            ),
            (
                "footprint",
                format!(
                    "{} reserved at most for {} live at most ({:.3}x)",
                    show_size(self.reserved_peak),
                    show_size(self.peak_live),
                    self.footprint
                ),
            ),
            ("given back", format!("{} segments", self.segments_released)),
        ]);
        fields(rows)
    }
}

/// The reuse rules as `ruvmctl allocator replay` takes them.
pub struct Rules {
    pub threshold: u64,
    pub reuse: Reuse,
}

/// `ruvmctl allocator replay`.
pub fn replay(
    d: &Ruvm,
    name: String,
    trace: &Trace,
    gpu: Option<u32>,
    rules: Rules,
    baseline: bool,
) -> Result<Replayed> {
    let gpu = engine_gpu(d, gpu)?;
    let cfg = Config {
        gpus: Vec::new(),
        release_threshold: rules.threshold,
        reuse: rules.reuse,
        reserve_limit: None,
    };
    let (t, s) = replay_ualloc(d, gpu, trace, cfg)?;
    let fresh = if baseline {
        Some(replay_fresh(d, gpu, trace)?.ns_per_pair)
    } else {
        None
    };
    Ok(Replayed {
        trace: name,
        gpu,
        allocs: t.allocs,
        streams: trace.streams,
        peak_live: trace.peak_live,
        ns_per_pair: t.ns_per_pair,
        fresh_ns_per_pair: fresh,
        ratio: fresh.map(|f| t.ns_per_pair / f),
        reserved_peak: s.reserved_peak,
        footprint: s.reserved_peak as f64 / trace.peak_live.max(1) as f64,
        hits: s.hits,
        misses: s.misses,
        cross_stream: s.cross_stream,
        waits_inserted: s.waits_inserted,
        segments_released: s.released,
    })
}
