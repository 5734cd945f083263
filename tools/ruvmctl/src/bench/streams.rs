// SPDX-License-Identifier: GPL-2.0

//! The `streams` group of `ruvmctl bench`: what queueing work on a stream costs, and what its
//! asynchrony buys, each against the synchronous way in the same run.
//!
//! - `stream.submit`: one `STREAM_SUBMIT` of 64 (`RECORD` + `WAIT_EVENT`) pairs, per pair,
//!   against one bare ioctl (`STREAM_QUERY` of the same stream).
//! - `stream.submit_one`: a `STREAM_SUBMIT` of one `RECORD`, as a program that queues one
//!   operation at a time calls it, against one bare ioctl.
//! - `stream.cross_one`: an event recorded on stream A and waited for on stream B, each its own
//!   one-operation `STREAM_SUBMIT` (two calls a pair), per pair against one bare ioctl.
//! - `stream.cross_batch`: the same across streams in batches: 64 `RECORD`s on A in one
//!   `STREAM_SUBMIT`, then the 64 `WAIT_EVENT`s on B in one, per pair against one bare ioctl.
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
/// Bare ioctls per sample of the baselines.
const IOCTLS: u64 = 256;
/// One-operation submits per sample of `stream.submit_one`.
const ONE_OP_SUBMITS: usize = 128;

// One submit carries the pairs; a sample's submits fit in a stream's queue.
const _: () = assert!(2 * PAIRS <= uapi::RUVM_MAX_SUBMIT_OPS as usize);
const _: () = assert!(SUBMITS * 2 * PAIRS <= uapi::RUVM_MAX_STREAM_OPS as usize);
const _: () = assert!(ONE_OP_SUBMITS <= uapi::RUVM_MAX_STREAM_OPS as usize);

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
    submit_one(c, out)?;
    cross(c, false, out)?;
    cross(c, true, out)?;
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
    against_bare_ioctl(c, &mut case, &[s], SUBMITS * PAIRS, &mut || {
        for _ in 0..SUBMITS {
            c.d.stream_submit(s, &ops).context("STREAM_SUBMIT")?;
        }
        Ok(())
    })?;
    out(case);
    Ok(())
}

/// Samples of a queueing case against one bare ioctl (`STREAM_QUERY` of `streams[0]`): a
/// sample is `submit` timed, then every stream synced, untimed (so that no queue nears
/// `RUVM_MAX_STREAM_OPS`), the time divided by `per` (the calls or pairs it made).
fn against_bare_ioctl(
    c: &Ctx,
    case: &mut Case,
    streams: &[u64],
    per: usize,
    submit: &mut dyn FnMut() -> Result<()>,
) -> Result<()> {
    let first = *streams.first().context("no stream")?;
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || {
            let t = time(submit)?;
            for &s in streams {
                c.d.stream_sync(s, WAIT_MS).context("STREAM_SYNC")?;
            }
            Ok(t / per as f64)
        },
        &mut || {
            per_op(IOCTLS, &mut || {
                c.d.stream_query(first).context("STREAM_QUERY")?;
                Ok(())
            })
        },
    )?;
    Ok(())
}

/// `stream.submit_one`: one `RECORD` a `STREAM_SUBMIT`, against one bare ioctl. A sample is
/// [`ONE_OP_SUBMITS`] submits in a row; the stream is synced, untimed, after each sample.
fn submit_one(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let mut held = Held::new(c.d);
    let s = held.stream(c.sim)?;
    let record = [op::record(held.event()?)];
    let mut case = c.case(
        "stream.submit_one".into(),
        "STREAM_SUBMIT of one RECORD, per call",
        "one bare ioctl (STREAM_QUERY of the same stream)",
        "ns",
    );
    against_bare_ioctl(c, &mut case, &[s], ONE_OP_SUBMITS, &mut || {
        for _ in 0..ONE_OP_SUBMITS {
            c.d.stream_submit(s, &record).context("STREAM_SUBMIT")?;
        }
        Ok(())
    })?;
    out(case);
    Ok(())
}

/// `stream.cross_one` (`batched` false) and `stream.cross_batch`: events recorded on stream A
/// and waited for on stream B of the same GPU, per pair against one bare ioctl. One at a time,
/// each pair is two one-operation submits (A's `RECORD`, then B's `WAIT_EVENT`); batched, a
/// sample's [`PAIRS`] records go to A in one submit and their waits to B in the next. Both
/// streams are synced, untimed, after each sample.
fn cross(c: &Ctx, batched: bool, out: &mut dyn FnMut(Case)) -> Result<()> {
    let mut held = Held::new(c.d);
    let a = held.stream(c.sim)?;
    let b = held.stream(c.sim)?;
    let mut records = Vec::with_capacity(PAIRS);
    let mut waits = Vec::with_capacity(PAIRS);
    for _ in 0..PAIRS {
        let e = held.event()?;
        records.push(op::record(e));
        waits.push(op::wait_event(e, WAIT_MS));
    }
    let (id, what) = if batched {
        (
            "stream.cross_batch",
            format!("{PAIRS} RECORDs on stream A in one STREAM_SUBMIT, their WAIT_EVENTs on B in one; per pair"),
        )
    } else {
        (
            "stream.cross_one",
            "RECORD on stream A and WAIT_EVENT on B, each its own STREAM_SUBMIT; per pair".into(),
        )
    };
    let mut case = c.case(
        id.into(),
        &what,
        "one bare ioctl (STREAM_QUERY of stream A)",
        "ns",
    );
    against_bare_ioctl(c, &mut case, &[a, b], PAIRS, &mut || {
        if batched {
            c.d.stream_submit(a, &records)
                .context("STREAM_SUBMIT of the records")?;
            c.d.stream_submit(b, &waits)
                .context("STREAM_SUBMIT of the waits")?;
            return Ok(());
        }
        for (r, w) in records.iter().zip(&waits) {
            c.d.stream_submit(a, std::slice::from_ref(r))
                .context("STREAM_SUBMIT of a record")?;
            c.d.stream_submit(b, std::slice::from_ref(w))
                .context("STREAM_SUBMIT of a wait")?;
        }
        Ok(())
    })?;
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
