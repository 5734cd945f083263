// SPDX-License-Identifier: GPL-2.0

//! Stream-ordered allocation (`RUVM_OP_ALLOC`, `RUVM_OP_FREE`: CUDA's cudaMallocAsync and
//! cudaFreeAsync), a GPU's current pool (`RUVM_IOCTL_GPU_POOL`), and the pools' reuse policies
//! of chunks freed on a stream.
//!
//! Whether an allocation got the chunk a free gave back or new memory is read from the DMA
//! addresses of the two mems (`MEM_DMA_ADDRS`: the test pools keep their chunks DMA-mapped for
//! the stream's GPU), the freed mem's read before its free. A sw_sync fence (`WAIT_FD`) holds a
//! stream before its free, so "the free is not reached yet" is a fact, not a race; a free is
//! "reached" when `STREAM_QUERY`'s `completed` is past it (polled: a synchronize would observe
//! it). Data is checked through a user mapping, another path than the engine that wrote it.
//! Every case skips without `RUVM_FEATURE_STREAM_ALLOC`, streams, a simulated GPU or sw_sync.

use std::{
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    fcntl::OFlag,
    sys::{
        signal::{kill, Signal},
        wait::{waitpid, WaitStatus},
    },
    unistd::{fork, pipe2, ForkResult},
};

use super::harness::{cases, check, expect_errno, Case, Context, Stop, TestResult};
use super::shared::{live, readable, vid_pool, vidmem_gpu};
use super::streams::{
    drained, engine_on, errno_of, mem_on, need_mmu, remove_gpu, signalled, user_mismatches,
    BringBack, Gate, K, M, SIGNAL_BOUND, STREAM_MEMS, STREAM_OPS, WAIT_MS,
};
use crate::pattern;
use libruvm::{cmd, op, uapi, Ruvm, UserMap};

mod data;
mod held;
mod lifetime;
mod refusals;
mod regressions;
mod reuse;
mod whole;
use data::*;
use lifetime::*;
use refusals::*;
use regressions::*;
use reuse::*;

const FOLLOW: u32 = uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES;
const OPPORTUNISTIC: u32 = uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_OPPORTUNISTIC;
const INTERNAL: u32 = uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
/// Every reuse policy: what a pool starts with.
const ALL: u32 = FOLLOW | OPPORTUNISTIC | INTERNAL;
/// What most cases allocate: one chunk of their pools.
const SIZE: u64 = 64 * K;
const POOL_PENDING: usize = uapi::ruvm_audit_class_RUVM_AUDIT_POOL_PENDING as usize;
const MEMS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_MEMS as usize;
/// The audit classes a file's going must bring back to where they were.
const TEARDOWN_CLASSES: [usize; 12] = [
    MEMS,
    uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_BYTES as usize,
    uapi::ruvm_audit_class_RUVM_AUDIT_HANDLES as usize,
    uapi::ruvm_audit_class_RUVM_AUDIT_KERNEL_MAPS as usize,
    uapi::ruvm_audit_class_RUVM_AUDIT_USER_MAPPINGS as usize,
    uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS as usize,
    uapi::ruvm_audit_class_RUVM_AUDIT_POOLS as usize,
    uapi::ruvm_audit_class_RUVM_AUDIT_POOL_CHUNKS as usize,
    uapi::ruvm_audit_class_RUVM_AUDIT_POOL_BYTES as usize,
    POOL_PENDING,
    STREAM_OPS,
    STREAM_MEMS,
];
/// How long a gate may hold a stream (a case releases it well before).
const GATE_MS: u32 = uapi::RUVM_WAIT_MAX_MS;

pub fn cases() -> Vec<Case> {
    cases![
        salloc_same_stream_reuses_at_once,
        salloc_reuse_follows_event_dependencies,
        salloc_reuse_opportunistic_once_the_free_is_reached,
        salloc_reuse_internal_dependencies_only_without_memory,
        salloc_reuse_internal_dependencies_when_the_quota_is_full,
        salloc_reuse_after_synchronize_needs_no_policy,
        salloc_free_never_hands_queued_chunks,
        salloc_zero_reuses_in_stream_order,
        salloc_threshold_at_synchronize,
        salloc_footprint_1000,
        salloc_footprint_1000_batched,
        salloc_freed_chunks_keep_their_charge_while_pinned,
        salloc_bad_inputs,
        salloc_default_pool,
        salloc_teardown_close,
        salloc_teardown_kill,
        salloc_teardown_gpu_removal,
        salloc_sync_memfree_waits_safe,
        salloc_free_of_a_mapped_mem_keeps_its_chunks_until_unmapped,
        salloc_free_keeps_gpu_va_mappings_until_reached,
        salloc_destroyed_streams_frees_are_cached_at_the_next_sync,
        whole::salloc_whole_takes_the_freed_mem,
        whole::salloc_whole_undone_by_a_failed_submission,
        whole::salloc_whole_failed_pair_makes_no_pool,
        whole::salloc_free_on_an_idle_stream_is_reached_at_submit,
        held::salloc_borrow_never_passes_on_a_held_page,
        held::salloc_whole_never_passes_on_a_held_page,
    ]
}

// --- what the cases share ------------------------------------------------------------------

/// Skips unless the module has stream-ordered allocation.
fn need_stream_alloc(d: &Ruvm) -> TestResult {
    let features = d.info().ctx("INFO")?.features;
    if features & u64::from(uapi::RUVM_FEATURE_STREAM_ALLOC) == 0 {
        return Err(Stop::Skip(
            "the module has no stream-ordered allocation (RUVM_FEATURE_STREAM_ALLOC)".into(),
        ));
    }
    Ok(())
}

/// The device and a simulated GPU with streams and stream-ordered allocation, or a skip.
fn setup() -> Result<(Ruvm, u32), Stop> {
    let (d, g) = super::streams::setup()?;
    need_stream_alloc(&d)?;
    Ok((d, g))
}

/// A sysmem pool of [`SIZE`] chunks, release threshold `threshold`, DMA-mapped for `g`, with
/// exactly the reuse policies `reuse` on (a new pool has them all: checked).
fn pool_for(d: &Ruvm, g: u32, threshold: u64, reuse: u32) -> Result<u64, Stop> {
    let (p, chunk) = d.pool_create(SIZE, threshold).ctx("POOL_CREATE")?;
    check!(chunk == SIZE, "a pool of {SIZE}-byte chunks has {chunk}");
    d.pool_access(p, g, true).ctx("POOL_SET_ACCESS")?;
    let made = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        made.reuse == ALL && made.pending_bytes == 0,
        "a new pool: reuse {:#x} pending {}, wanted every policy on ({ALL:#x}) and nothing pending",
        made.reuse,
        made.pending_bytes
    );
    for bit in [FOLLOW, OPPORTUNISTIC, INTERNAL] {
        d.pool_set_reuse(p, bit, reuse & bit != 0)
            .ctx("POOL_SET of a reuse policy")?;
    }
    let got = d.pool_get(p).ctx("POOL_GET")?.reuse;
    check!(
        got == reuse,
        "POOL_GET says reuse {got:#x} after setting {reuse:#x}"
    );
    Ok(p)
}

/// Submits `ops` to stream `s`, the module writing into them: the first seqno and the ops as
/// it left them.
fn submit(
    d: &Ruvm,
    s: u64,
    mut ops: Vec<uapi::ruvm_op>,
    what: &str,
) -> Result<(u64, Vec<uapi::ruvm_op>), Stop> {
    let first = d
        .stream_submit_mut(s, &mut ops)
        .ctx(&format!("STREAM_SUBMIT of {what}"))?;
    Ok((first, ops))
}

/// The mem the ALLOC at index `i` of `ops` (submitted) made.
fn made(d: &Ruvm, ops: &[uapi::ruvm_op], i: usize, what: &str) -> Result<u64, Stop> {
    let (h, offset) = op::allocated(&ops[i]);
    check!(h != 0, "{what}: the ALLOC wrote no handle: {:?}", ops[i]);
    let q = d.mem_query(h).ctx(&format!("MEM_QUERY of {what}"))?;
    check!(
        q.size == ops[i].length
            && q.mmap_offset == offset
            && q.backing == uapi::ruvm_backing_RUVM_BACKING_SYSMEM,
        "{what}: the ALLOC of {} bytes wrote handle {h} and mmap offset {offset:#x}, MEM_QUERY says {q:?}",
        ops[i].length
    );
    Ok(h)
}

/// One ALLOC of `len` bytes from `pool` on stream `s`: the new mem.
fn alloc_on(d: &Ruvm, s: u64, pool: u64, len: u64, what: &str) -> Result<u64, Stop> {
    let (_, ops) = submit(d, s, vec![op::alloc(pool, len, false)], what)?;
    made(d, &ops, 0, what)
}

/// The DMA addresses of mem `h`'s chunks for `g`, sorted.
fn chunks(d: &Ruvm, h: u64, g: u32, what: &str) -> Result<Vec<u64>, Stop> {
    let mut v = d
        .dma_addrs(h, g, 0, 64)
        .ctx(&format!("MEM_DMA_ADDRS of {what}"))?;
    check!(!v.is_empty(), "{what}: no DMA address for GPU {g}");
    v.sort_unstable();
    Ok(v)
}

/// Checks that a new mem's chunks `got` are the freed mem's (`same`) or none of them.
fn expect_reuse(got: &[u64], freed: &[u64], same: bool, what: &str) -> TestResult {
    if same {
        check!(
            got == freed,
            "{what}: wanted the freed mem's chunk, got new memory ({got:x?}, the freed {freed:x?})"
        );
    } else {
        check!(
            got.iter().all(|a| !freed.contains(a)),
            "{what}: wanted new memory, got the freed mem's chunk ({got:x?}, the freed {freed:x?})"
        );
    }
    Ok(())
}

/// Waits (at most [`SIGNAL_BOUND`]) until stream `s` has retired operation `seqno`, without a
/// synchronize (which would observe its frees).
fn reached(d: &Ruvm, s: u64, seqno: u64, what: &str) -> TestResult {
    let t = Instant::now();
    loop {
        let q = d.stream_query(s).ctx("STREAM_QUERY")?;
        if q.completed >= seqno {
            check!(q.error == 0, "{what}: the stream failed: {q:?}");
            return Ok(());
        }
        check!(
            t.elapsed() < SIGNAL_BOUND && q.error == 0,
            "{what}: seqno {seqno} not retired after {:.1} s: {q:?}",
            t.elapsed().as_secs_f64()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Checks that stream `s` has not retired operation `seqno` (held before it).
fn not_reached(d: &Ruvm, s: u64, seqno: u64, what: &str) -> TestResult {
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.completed < seqno && q.error == 0,
        "{what}: the stream retired seqno {seqno} while held: {q:?}"
    );
    Ok(())
}

/// Waits (at most [`SIGNAL_BOUND`]) until every class of [`TEARDOWN_CLASSES`] is back at
/// `before`'s value.
fn settled(d: &Ruvm, before: &[u64], what: &str) -> TestResult {
    let t = Instant::now();
    loop {
        let l = live(d)?;
        let off: Vec<String> = TEARDOWN_CLASSES
            .iter()
            .filter(|&&c| l[c] != before[c])
            .map(|&c| {
                format!(
                    "{}: {} (was {})",
                    libruvm::names::audit_class(libruvm::names::audit_classes().as_deref(), c),
                    l[c],
                    before[c]
                )
            })
            .collect();
        if off.is_empty() {
            return Ok(());
        }
        if t.elapsed() > SIGNAL_BOUND {
            return Err(Stop::Fail(format!(
                "{what}: after {SIGNAL_BOUND:?}, {}",
                off.join(", ")
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The audit's class 30 is `pool_pending` (when debugfs says).
fn check_class_name() -> TestResult {
    if let Some(names) = libruvm::names::audit_classes() {
        check!(
            names[POOL_PENDING] == "pool_pending",
            "audit class {POOL_PENDING} is named {:?}, wanted pool_pending",
            names[POOL_PENDING]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_checks_tell_the_same_chunk_from_new_memory() {
        assert!(expect_reuse(&[1, 2], &[1, 2], true, "x").is_ok());
        assert!(expect_reuse(&[3, 4], &[1, 2], true, "x").is_err());
        assert!(expect_reuse(&[3, 4], &[1, 2], false, "x").is_ok());
        // One chunk in common is not new memory.
        assert!(expect_reuse(&[2, 3], &[1, 2], false, "x").is_err());
    }

    #[test]
    fn poked_fields_are_the_named_ones() {
        let a = op::alloc(3, 4096, false);
        assert_eq!(poked(a, "src_offset").src_offset, 8);
        assert_eq!(poked(a, "timeout_ms").timeout_ms, 1);
        assert_eq!(poked(a, "reserved").reserved, 1);
        let f = poked(op::free(9), "length");
        assert_eq!((f.dst, f.length), (9, 8));
    }

    #[test]
    fn the_zero_case_pattern_is_almost_never_zero() {
        let zeroes = (0..SIZE)
            .filter(|&o| pattern::byte_at(ZERO_CASE_SEED, o) == 0)
            .count() as u64;
        assert!(zeroes <= SIZE / 8 / 256 + 1, "{zeroes} zero bytes");
    }

    #[test]
    fn the_teardown_classes_include_the_pending_chunks() {
        assert!(TEARDOWN_CLASSES.contains(&POOL_PENDING));
        assert!(TEARDOWN_CLASSES
            .iter()
            .all(|&c| c < uapi::ruvm_audit_class_RUVM_AUDIT_CLASSES as usize));
    }
}
