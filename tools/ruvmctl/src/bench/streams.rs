// SPDX-License-Identifier: GPL-2.0

//! The `streams` group of `ruvmctl bench`: what queueing work on a stream costs, and what its
//! asynchrony buys, each against the synchronous way in the same run.
//!
//! - `stream.submit`: one `STREAM_SUBMIT` of 64 (`RECORD` + `WAIT_EVENT`) pairs, per pair,
//!   against one bare ioctl (`STREAM_QUERY` of the same stream).
//! - `stream.copy_async`: a 64 MiB `COPY` queued and waited for (`STREAM_SUBMIT` +
//!   `STREAM_SYNC`) on a simulated GPU, against `CE_COPY` of the same bytes.
//! - `stream.two_gpus`: 64 MiB copies on two simulated GPUs' streams at once (both submitted,
//!   then one `STREAM_SYNC` of every stream), against the same two one after the other.
//!
//! The copies are of `--max-size` if that is smaller than 64 MiB. Everything a case makes is
//! destroyed or freed when it ends, failed or not.

use anyhow::{Context as _, Result};
use libruvm::{op, uapi, Ruvm};

use super::cases::{per_op, size_name, Ctx};
use super::{held::Held, pairs, time, Case};

const M: u64 = 1 << 20;
/// The bound of every wait: work that is not done by then is a failure.
const WAIT_MS: u32 = uapi::RUVM_WAIT_MAX_MS;
/// (`RECORD` + `WAIT_EVENT`) pairs in one submit.
const PAIRS: usize = 64;
/// Submits per sample of `stream.submit`, the stream synced after each sample.
const SUBMITS: usize = 16;
/// Bare ioctls per sample of `stream.submit`'s baseline.
const IOCTLS: u64 = 256;

// One submit carries the pairs; a sample's submits fit in a stream's queue.
const _: () = assert!(2 * PAIRS <= uapi::RUVM_MAX_SUBMIT_OPS as usize);
const _: () = assert!(SUBMITS * 2 * PAIRS <= uapi::RUVM_MAX_STREAM_OPS as usize);

/// The present simulated GPUs with a copy engine.
fn sim_engines(d: &Ruvm) -> Result<Vec<u32>> {
    let want = uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT | uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE;
    Ok(d.gpus()
        .context("GPU_LIST")?
        .iter()
        .filter(|g| g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM && g.flags & want == want)
        .map(|g| g.id)
        .collect())
}

/// The `streams` group: skipped, with the reason printed, by a module without streams.
pub(super) fn streams(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    if c.d.info().context("INFO")?.features & u64::from(uapi::RUVM_FEATURE_STREAMS) == 0 {
        eprintln!("bench: streams skipped: the module has no streams (RUVM_FEATURE_STREAMS)");
        return Ok(());
    }
    submit(c, out)?;
    let size = c.spec.max_size.min(64 * M);
    copy_async(c, size, out)?;
    two_gpus(c, size, out)
}

/// `stream.submit`: the cost of queueing one (`RECORD` + `WAIT_EVENT`) pair, in submits of
/// [`PAIRS`] pairs, against one bare ioctl. A sample is [`SUBMITS`] submits in a row (the
/// engine retiring earlier ones meanwhile, as it would); the stream is synced, untimed, after
/// each, so that its queue never nears `RUVM_MAX_STREAM_OPS`.
fn submit(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let mut held = Held::new(c.d);
    let s = held.stream(c.sim)?;
    let mut ops = Vec::with_capacity(2 * PAIRS);
    for _ in 0..PAIRS {
        let e = held.event()?;
        ops.extend([op::record(e), op::wait_event(e, WAIT_MS)]);
    }
    let mut case = c.case(
        "stream.submit".into(),
        &format!("STREAM_SUBMIT of {PAIRS} (RECORD + WAIT_EVENT) pairs, per pair"),
        "one bare ioctl (STREAM_QUERY of the same stream)",
        "ns",
    );
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || {
            let t = time(&mut || {
                for _ in 0..SUBMITS {
                    c.d.stream_submit(s, &ops).context("STREAM_SUBMIT")?;
                }
                Ok(())
            })?;
            c.d.stream_sync(s, WAIT_MS).context("STREAM_SYNC")?;
            Ok(t / (SUBMITS * PAIRS) as f64)
        },
        &mut || {
            per_op(IOCTLS, &mut || {
                c.d.stream_query(s).context("STREAM_QUERY")?;
                Ok(())
            })
        },
    )?;
    out(case);
    Ok(())
}

/// `stream.copy_async`: a copy of `size` bytes queued on a simulated GPU's stream and waited
/// for, against `CE_COPY` of the same mems (times, whose inverse ratio is the throughput's).
fn copy_async(c: &Ctx, size: u64, out: &mut dyn FnMut(Case)) -> Result<()> {
    let mut held = Held::new(c.d);
    let (src, dst) = (held.mem(size, 2 * M, c.sim)?, held.mem(size, 2 * M, c.sim)?);
    let s = held.stream(c.sim)?;
    let copy = [op::copy(dst, 0, src, 0, size)];
    let n = size_name(size);
    let mut case = c.case(
        "stream.copy_async".into(),
        &format!("COPY of {n} on a simulated GPU's stream: STREAM_SUBMIT + STREAM_SYNC"),
        &format!("CE_COPY of the same {n} (synchronous)"),
        "ns",
    );
    case.size = size;
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || {
            time(&mut || {
                c.d.stream_submit(s, &copy).context("STREAM_SUBMIT")?;
                c.d.stream_sync(s, WAIT_MS).context("STREAM_SYNC")?;
                Ok(())
            })
        },
        &mut || {
            time(&mut || {
                c.d.ce_copy(c.sim, dst, 0, src, 0, size)
                    .context("CE_COPY")?;
                Ok(())
            })
        },
    )?;
    out(case);
    Ok(())
}

/// `stream.two_gpus`: copies of `size` bytes on two simulated GPUs' streams at once (both
/// submitted, then one `STREAM_SYNC` of every stream) against the same two one after the other
/// (each submitted and synced in turn). Skipped, with the reason printed, without two.
fn two_gpus(c: &Ctx, size: u64, out: &mut dyn FnMut(Case)) -> Result<()> {
    let gpus = sim_engines(c.d)?;
    let [g1, g2, ..] = gpus[..] else {
        eprintln!(
            "bench: stream.two_gpus skipped: it needs two simulated GPUs with a copy engine (load ruvm with sim_gpus=2), the module has {}",
            gpus.len()
        );
        return Ok(());
    };
    let mut held = Held::new(c.d);
    let mut runs = Vec::new();
    for g in [g1, g2] {
        let (src, dst) = (held.mem(size, 2 * M, g)?, held.mem(size, 2 * M, g)?);
        let s = held.stream(g)?;
        runs.push((s, [op::copy(dst, 0, src, 0, size)]));
    }
    let n = size_name(size);
    let mut case = c.case(
        "stream.two_gpus".into(),
        &format!(
            "COPY of {n} on each of two simulated GPUs' streams at once (submit both, sync every stream)"
        ),
        "the same two copies one after the other (submit + sync each)",
        "ns",
    );
    case.size = size;
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || {
            time(&mut || {
                for (s, copy) in &runs {
                    c.d.stream_submit(*s, copy).context("STREAM_SUBMIT")?;
                }
                c.d.sync_every_stream(WAIT_MS)
                    .context("STREAM_SYNC of every stream")?;
                Ok(())
            })
        },
        &mut || {
            time(&mut || {
                for (s, copy) in &runs {
                    c.d.stream_submit(*s, copy).context("STREAM_SUBMIT")?;
                    c.d.stream_sync(*s, WAIT_MS).context("STREAM_SYNC")?;
                }
                Ok(())
            })
        },
    )?;
    out(case);
    Ok(())
}
