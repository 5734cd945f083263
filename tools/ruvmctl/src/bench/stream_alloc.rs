// SPDX-License-Identifier: GPL-2.0

//! The `stream_alloc` group of `ruvmctl bench`: stream-ordered allocation (`RUVM_OP_ALLOC`,
//! `RUVM_OP_FREE`), against the synchronous way in the same run.
//!
//! - `stream_alloc.pool_hit`: 64 KiB `ALLOC` + `FREE` (by the ALLOC's index) pairs from a
//!   sysmem pool of the default chunk size (a page, uvm_mem's rule) mapped for the stream's
//!   GPU, 64 pairs a submission, per pair, against a fresh synchronous mapped allocation
//!   (`MEM_ALLOC` of 64 KiB, no pool, default chunks, + `MEM_MAP_GPU` on the same GPU +
//!   `MEM_FREE`). The GPU is an edu GPU when there is one (behind the IOMMU, as a real GPU
//!   is: a mapping costs what it costs there), else a simulated GPU.
//! - `stream_alloc.sync_pool_hit`: for reference, the synchronous pool hit (`MEM_ALLOC` from
//!   the same pool + `MEM_FREE`) against the same baseline.
//! - `stream_alloc.footprint`: the pool's `reserved_high` after 1000 submissions of (`ALLOC`
//!   1 MiB, `COPY` 4 KiB into it, `FREE` it) on one stream, against its `used_high` (bytes):
//!   each allocation takes what the free before it gave back, so both are 1 MiB.
//!
//! Everything a case makes is destroyed or freed when it ends, failed or not.

use anyhow::{Context as _, Result};
use libruvm::{op, uapi};

use super::cases::{per_op, Ctx};
use super::{held::Held, pairs, time, Case};

const K: u64 = 1 << 10;
const M: u64 = 1 << 20;
/// The bound of every wait.
const WAIT_MS: u32 = uapi::RUVM_WAIT_MAX_MS;
/// (`ALLOC` + `FREE`) pairs in one submission.
const PAIRS: usize = 64;
/// Submissions per sample of `stream_alloc.pool_hit`, the stream synced after each sample.
const SUBMITS: usize = 16;
/// Synchronous allocations per sample of the baselines.
const SYNC_OPS: u64 = 256;
/// Submissions of the footprint loop.
const LOOP: usize = 1000;

// One submission carries the pairs; a sample's submissions fit in a stream's queue.
const _: () = assert!(2 * PAIRS <= uapi::RUVM_MAX_SUBMIT_OPS as usize);
const _: () = assert!(SUBMITS * 2 * PAIRS <= uapi::RUVM_MAX_STREAM_OPS as usize);

/// The `stream_alloc` group: skipped, with the reason printed, by a module without streams or
/// stream-ordered allocation.
pub(super) fn stream_alloc(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let features = c.d.info().context("INFO")?.features;
    let need = u64::from(uapi::RUVM_FEATURE_STREAMS | uapi::RUVM_FEATURE_STREAM_ALLOC);
    if features & need != need {
        eprintln!(
            "bench: stream_alloc skipped: the module has no stream-ordered allocation (RUVM_FEATURE_STREAM_ALLOC)"
        );
        return Ok(());
    }
    pool_hit(c, out)?;
    footprint(c, out)
}

/// The batch of one `stream_alloc.pool_hit` submission: [`PAIRS`] (`ALLOC` 64 KiB from `pool`,
/// `FREE` of it by index).
fn hit_batch(pool: u64) -> Vec<uapi::ruvm_op> {
    (0..PAIRS)
        .flat_map(|i| [op::alloc(pool, 64 * K, false), op::free_index(2 * i)])
        .collect()
}

/// `stream_alloc.pool_hit` and `stream_alloc.sync_pool_hit`.
fn pool_hit(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let mut held = Held::new(c.d);
    let engine = |id: u32| -> Result<bool> {
        Ok(c.d
            .gpus()
            .context("GPU_LIST")?
            .iter()
            .any(|g| g.id == id && g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE != 0))
    };
    let (gpu, gpu_name) = match c.edu {
        Some(g) if engine(g)? => (g, "an edu GPU (behind the IOMMU)"),
        _ => (c.sim, "a simulated GPU"),
    };
    let p = held.pool(0, gpu)?;
    let s = held.stream(gpu)?;
    // Warm: the pool holds a chunk, observed by the sync.
    let mut ops = hit_batch(p);
    c.d.stream_submit_mut(s, &mut ops)
        .context("STREAM_SUBMIT")?;
    c.d.stream_sync(s, WAIT_MS).context("STREAM_SYNC")?;
    let fresh = |c: &Ctx| {
        per_op(SYNC_OPS, &mut || {
            let a = c.d.mem_alloc(64 * K, 0, 0).context("MEM_ALLOC")?;
            c.d.mem_gpu(true, a.handle, gpu).context("MEM_MAP_GPU")?;
            c.d.mem_free(a.handle).context("MEM_FREE")?;
            Ok(())
        })
    };
    let baseline =
        "MEM_ALLOC of 64K (no pool, default chunks) + MEM_MAP_GPU on the same GPU + MEM_FREE";
    let mut case = c.case(
        "stream_alloc.pool_hit".into(),
        &format!(
            "64K ALLOC + FREE (by index) from a pool (default chunks) mapped for {gpu_name}, {PAIRS} pairs a submission, per pair"
        ),
        baseline,
        "ns",
    );
    case.size = 64 * K;
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || {
            let t = time(&mut || {
                for _ in 0..SUBMITS {
                    // The module writes each ALLOC's results over the last ones'.
                    c.d.stream_submit_mut(s, &mut ops)
                        .context("STREAM_SUBMIT")?;
                }
                Ok(())
            })?;
            c.d.stream_sync(s, WAIT_MS).context("STREAM_SYNC")?;
            Ok(t / (SUBMITS * PAIRS) as f64)
        },
        &mut || fresh(c),
    )?;
    out(case);
    let mut case = c.case(
        "stream_alloc.sync_pool_hit".into(),
        "64K MEM_ALLOC from the same pool + MEM_FREE (the synchronous pool hit)",
        baseline,
        "ns",
    );
    case.size = 64 * K;
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || {
            per_op(SYNC_OPS, &mut || {
                let a = c.d.pool_alloc(p, 64 * K, 0).context("MEM_ALLOC (pool)")?;
                c.d.mem_free(a.handle).context("MEM_FREE")?;
                Ok(())
            })
        },
        &mut || fresh(c),
    )?;
    out(case);
    Ok(())
}

/// `stream_alloc.footprint`: per sample, a new pool and [`LOOP`] submissions of (`ALLOC`
/// 1 MiB, `COPY` 4 KiB into it, `FREE` it) on one stream, then a sync: the pool's
/// `reserved_high` (ruvm) and `used_high` (base), in bytes.
fn footprint(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let mut case = c.case(
        "stream_alloc.footprint".into(),
        &format!("reserved_high after {LOOP} x (ALLOC 1M, COPY 4K into it, FREE) on one stream"),
        "used_high of the same pool",
        "B",
    );
    let mut held = Held::new(c.d);
    let src = held.mem(4 * K, 0, c.sim)?;
    let s = held.stream(c.sim)?;
    for _ in 0..c.spec.reps.max(1) {
        let mut one = Held::new(c.d);
        let p = one.pool(64 * K, c.sim)?;
        let mut ops = [
            op::alloc(p, M, false),
            op::with_dst_index(op::copy(0, 0, src, 0, 4 * K), 0),
            op::free_index(0),
        ];
        for _ in 0..LOOP {
            c.d.stream_submit_mut(s, &mut ops)
                .context("STREAM_SUBMIT")?;
        }
        c.d.stream_sync(s, WAIT_MS).context("STREAM_SYNC")?;
        let info = c.d.pool_get(p).context("POOL_GET")?;
        case.ruvm.push(info.reserved_high as f64);
        case.base.push(info.used_high as f64);
    }
    out(case);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_batch_frees_each_alloc_by_its_index() {
        let ops = hit_batch(7);
        assert_eq!(ops.len(), 2 * PAIRS);
        for (i, pair) in ops.chunks(2).enumerate() {
            assert_eq!(pair[0].kind, uapi::ruvm_op_kind_RUVM_OP_ALLOC);
            assert_eq!((pair[0].src, pair[0].length), (7, 64 * K));
            assert_eq!(pair[1].kind, uapi::ruvm_op_kind_RUVM_OP_FREE);
            assert_eq!(pair[1].flags, uapi::ruvm_op_flags_RUVM_OP_DST_INDEX);
            assert_eq!(pair[1].dst, 2 * i as u64);
        }
    }
}
