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
    os::fd::{AsFd, OwnedFd},
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

use super::harness::{check, expect_errno, Case, Context, Stop, TestResult};
use super::shared::{live, readable, vid_pool, vidmem_gpu};
use super::streams::{
    drained, engine_on, errno_of, mem_on, remove_gpu, signalled, sw_sync, user_mismatches,
    BringBack, K, M, SIGNAL_BOUND, STREAM_MEMS, STREAM_OPS, WAIT_MS,
};
use crate::pattern;
use libruvm::{cmd, op, sync_file::SwSyncTimeline, uapi, Ruvm, UserMap};

mod held;
mod whole;

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
    vec![
        Case {
            name: "salloc_same_stream_reuses_at_once",
            run: salloc_same_stream_reuses_at_once,
        },
        Case {
            name: "salloc_reuse_follows_event_dependencies",
            run: salloc_reuse_follows_event_dependencies,
        },
        Case {
            name: "salloc_reuse_opportunistic_once_the_free_is_reached",
            run: salloc_reuse_opportunistic_once_the_free_is_reached,
        },
        Case {
            name: "salloc_reuse_internal_dependencies_only_without_memory",
            run: salloc_reuse_internal_dependencies_only_without_memory,
        },
        Case {
            name: "salloc_reuse_internal_dependencies_when_the_quota_is_full",
            run: salloc_reuse_internal_dependencies_when_the_quota_is_full,
        },
        Case {
            name: "salloc_reuse_after_synchronize_needs_no_policy",
            run: salloc_reuse_after_synchronize_needs_no_policy,
        },
        Case {
            name: "salloc_free_never_hands_queued_chunks",
            run: salloc_free_never_hands_queued_chunks,
        },
        Case {
            name: "salloc_zero_reuses_in_stream_order",
            run: salloc_zero_reuses_in_stream_order,
        },
        Case {
            name: "salloc_threshold_at_synchronize",
            run: salloc_threshold_at_synchronize,
        },
        Case {
            name: "salloc_footprint_1000",
            run: salloc_footprint_1000,
        },
        Case {
            name: "salloc_footprint_1000_batched",
            run: salloc_footprint_1000_batched,
        },
        Case {
            name: "salloc_freed_chunks_keep_their_charge_while_pinned",
            run: salloc_freed_chunks_keep_their_charge_while_pinned,
        },
        Case {
            name: "salloc_bad_inputs",
            run: salloc_bad_inputs,
        },
        Case {
            name: "salloc_default_pool",
            run: salloc_default_pool,
        },
        Case {
            name: "salloc_teardown_close",
            run: salloc_teardown_close,
        },
        Case {
            name: "salloc_teardown_kill",
            run: salloc_teardown_kill,
        },
        Case {
            name: "salloc_teardown_gpu_removal",
            run: salloc_teardown_gpu_removal,
        },
        Case {
            name: "salloc_sync_memfree_waits_safe",
            run: salloc_sync_memfree_waits_safe,
        },
        Case {
            name: "salloc_free_of_a_mapped_mem_keeps_its_chunks_until_unmapped",
            run: salloc_free_of_a_mapped_mem_keeps_its_chunks_until_unmapped,
        },
        Case {
            name: "salloc_free_keeps_gpu_va_mappings_until_reached",
            run: salloc_free_keeps_gpu_va_mappings_until_reached,
        },
        Case {
            name: "salloc_destroyed_streams_frees_are_cached_at_the_next_sync",
            run: salloc_destroyed_streams_frees_are_cached_at_the_next_sync,
        },
        Case {
            name: "salloc_whole_takes_the_freed_mem",
            run: whole::salloc_whole_takes_the_freed_mem,
        },
        Case {
            name: "salloc_whole_undone_by_a_failed_submission",
            run: whole::salloc_whole_undone_by_a_failed_submission,
        },
        Case {
            name: "salloc_whole_failed_pair_makes_no_pool",
            run: whole::salloc_whole_failed_pair_makes_no_pool,
        },
        Case {
            name: "salloc_free_on_an_idle_stream_is_reached_at_submit",
            run: whole::salloc_free_on_an_idle_stream_is_reached_at_submit,
        },
        Case {
            name: "salloc_borrow_never_passes_on_a_held_page",
            run: held::salloc_borrow_never_passes_on_a_held_page,
        },
        Case {
            name: "salloc_whole_never_passes_on_a_held_page",
            run: held::salloc_whole_never_passes_on_a_held_page,
        },
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

/// A sw_sync fence that holds the streams waiting for it until released (on drop at the
/// latest, so that a failed case leaves no stream held).
struct Gate {
    tl: SwSyncTimeline,
    fence: OwnedFd,
    open: bool,
}

impl Gate {
    /// A new gate, or a skip without sw_sync.
    fn new() -> Result<Self, Stop> {
        let tl = sw_sync()?;
        let fence = tl.create_fence(1, "gate").ctx("SW_SYNC_IOC_CREATE_FENCE")?;
        Ok(Self {
            tl,
            fence,
            open: false,
        })
    }

    /// A `WAIT_FD` on the gate.
    fn wait(&self) -> uapi::ruvm_op {
        op::wait_fd(self.fence.as_fd(), GATE_MS)
    }

    fn release(&mut self) -> TestResult {
        if !self.open {
            self.tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
            self.open = true;
        }
        Ok(())
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if !self.open {
            let _ = self.tl.inc(1);
        }
    }
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

// --- the same stream -----------------------------------------------------------------------

/// A free queued on stream S, not reached (S held before it), gives its chunk to the next ALLOC
/// on S at once: S's order keeps the two uses apart. The pool counts the chunk pending between
/// the two, and the reuse as a hit.
fn salloc_same_stream_reuses_at_once() -> TestResult {
    let (d, g) = setup()?;
    check_class_name()?;
    let mut gate = Gate::new()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let m1 = alloc_on(&d, s, p, SIZE, "m1")?;
    let a1 = chunks(&d, m1, g, "m1")?;
    let (first, _) = submit(&d, s, vec![gate.wait(), op::free(m1)], "WAIT_FD + FREE m1")?;
    engine_on(&d, s, first, "the gate")?;
    expect_errno(d.mem_query(m1), Errno::ENOENT, "MEM_QUERY of m1, freed")?;
    let at_free = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        at_free.pending_bytes == SIZE
            && at_free.used_current == 0
            && at_free.reserved_current == SIZE
            && at_free.cached_chunks == 0,
        "after the FREE was submitted (S held before it): {at_free:?}, wanted {SIZE} pending, 0 used, {SIZE} reserved"
    );
    let l = live(&d)?;
    check!(
        l[POOL_PENDING] == before[POOL_PENDING] + 1,
        "the audit counts {} pending chunks, wanted {} + 1",
        l[POOL_PENDING],
        before[POOL_PENDING]
    );
    let m2 = alloc_on(&d, s, p, SIZE, "m2")?;
    let a2 = chunks(&d, m2, g, "m2")?;
    expect_reuse(&a2, &a1, true, "the next ALLOC on the same stream")?;
    not_reached(&d, s, first + 1, "S")?;
    let after = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        after.hits == at_free.hits + 1
            && after.misses == at_free.misses
            && after.pending_bytes == 0
            && after.used_current == SIZE
            && after.reserved_current == SIZE,
        "after the reuse: {after:?}, wanted one more hit, no more misses, nothing pending, {SIZE} used and reserved"
    );
    gate.release()?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    d.mem_free(m2).ctx("MEM_FREE m2")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "after the reuse")?;
    settled(&d, &before, "at the end")
}

// --- the reuse policies, across streams ----------------------------------------------------

/// Where stream A's free of m1 stands when stream B allocates.
#[derive(Clone, Copy, Debug)]
enum Free {
    /// A is held before the free; B waits for an event A records after it, then allocates.
    HeldFollowed,
    /// A is held before the free; B has no dependency on A.
    Held,
    /// A ran past the free (polled with STREAM_QUERY, not synchronized).
    Reached,
    /// A was synchronized after the free (STREAM_SYNC: observed).
    Synced,
}

/// One row of CUDA's reuse matrix, in a file of its own: a pool with exactly the policies
/// `reuse`, m1 allocated on stream A and freed there (behind a gate), the free in state
/// `state` when stream B allocates as much. B must get m1's chunk (`same`) or new memory.
fn reuse_row(g: u32, reuse: u32, state: Free, same: bool) -> TestResult {
    let what = format!(
        "reuse {:?}, the free {state:?}",
        libruvm::names::bit_names(libruvm::names::POOL_REUSE, reuse.into())
    );
    let probe = Ruvm::open().ctx("open")?;
    let before = live(&probe)?;
    let d = Ruvm::open().ctx("open")?;
    let mut gate = Gate::new()?;
    let p = pool_for(&d, g, u64::MAX, reuse)?;
    let a = d.stream_create(g).ctx("STREAM_CREATE A")?.handle;
    let b = d.stream_create(g).ctx("STREAM_CREATE B")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let m1 = alloc_on(&d, a, p, SIZE, "m1")?;
    let a1 = chunks(&d, m1, g, "m1")?;
    let (first, _) = submit(
        &d,
        a,
        vec![gate.wait(), op::free(m1), op::record(e)],
        "A's WAIT_FD + FREE m1 + RECORD",
    )?;
    let free_seqno = first + 1;
    match state {
        Free::Held | Free::HeldFollowed => {
            engine_on(&d, a, first, "A's gate")?;
        }
        Free::Reached => {
            gate.release()?;
            reached(&d, a, free_seqno, "A's free")?;
        }
        Free::Synced => {
            gate.release()?;
            d.stream_sync(a, WAIT_MS).ctx("STREAM_SYNC A")?;
            let info = d.pool_get(p).ctx("POOL_GET")?;
            check!(
                info.pending_bytes == 0 && info.cached_chunks == 1,
                "{what}: after STREAM_SYNC of A: {info:?}, wanted the free observed (its chunk cached)"
            );
        }
    }
    let mut ops = Vec::new();
    if let Free::HeldFollowed = state {
        ops.push(op::wait_event(e, GATE_MS));
    }
    ops.push(op::alloc(p, SIZE, false));
    let i = ops.len() - 1;
    let (_, ops) = submit(&d, b, ops, "B's ALLOC")?;
    let m2 = made(&d, &ops, i, "m2")?;
    let a2 = chunks(&d, m2, g, "m2")?;
    expect_reuse(&a2, &a1, same, &format!("B's ALLOC ({what})"))?;
    if let Free::Held | Free::HeldFollowed = state {
        not_reached(&d, a, free_seqno, &format!("A ({what})"))?;
    }
    let info = d.pool_get(p).ctx("POOL_GET")?;
    let pending = if same || !matches!(state, Free::Held | Free::HeldFollowed | Free::Reached) {
        0
    } else {
        SIZE
    };
    check!(
        info.pending_bytes == pending && info.used_current == SIZE,
        "{what}: after B's ALLOC: {info:?}, wanted {pending} pending and {SIZE} used"
    );
    gate.release()?;
    d.sync_every_stream(WAIT_MS)
        .ctx("STREAM_SYNC of every stream")?;
    let end = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        end.pending_bytes == 0,
        "{what}: {} bytes still pending after every stream was synchronized",
        end.pending_bytes
    );
    drop(d);
    settled(&probe, &before, &format!("{what}: once its file closed"))?;
    println!(
        "# {what}: {}",
        if same { "the same chunk" } else { "new memory" }
    );
    Ok(())
}

/// FOLLOW_EVENT_DEPENDENCIES: B waits for an event A records after its free, then allocates:
/// m1's chunk, even with A still held (B's ALLOC is ordered after the event, which is after
/// the free). Off (the other two on): new memory.
fn salloc_reuse_follows_event_dependencies() -> TestResult {
    let (_d, g) = setup()?;
    reuse_row(g, FOLLOW, Free::HeldFollowed, true)?;
    reuse_row(g, OPPORTUNISTIC | INTERNAL, Free::HeldFollowed, false)
}

/// ALLOW_OPPORTUNISTIC: A ran past its free (STREAM_QUERY, no synchronize): B gets m1's chunk
/// with no dependency. Every policy off: new memory. On, but A held before its free: new
/// memory.
fn salloc_reuse_opportunistic_once_the_free_is_reached() -> TestResult {
    let (_d, g) = setup()?;
    reuse_row(g, OPPORTUNISTIC, Free::Reached, true)?;
    reuse_row(g, 0, Free::Reached, false)?;
    reuse_row(g, OPPORTUNISTIC, Free::Held, false)
}

/// ALLOW_INTERNAL_DEPENDENCIES with memory to spare: new memory (a dependency is the last
/// resort).
fn salloc_reuse_internal_dependencies_only_without_memory() -> TestResult {
    let (_d, g) = setup()?;
    reuse_row(g, INTERNAL, Free::Held, false)
}

/// A free observed by a synchronize is cached: any allocation takes it, every policy off.
fn salloc_reuse_after_synchronize_needs_no_policy() -> TestResult {
    let (_d, g) = setup()?;
    reuse_row(g, 0, Free::Synced, true)
}

/// Fills file `d`'s quota with plain mems until not even 4 KiB more fits: their handles.
fn fill_quota(d: &Ruvm, max_alloc: u64) -> Result<Vec<u64>, Stop> {
    let mut held = Vec::new();
    let mut piece = max_alloc.min(4 * M);
    while piece >= 4 * K {
        match d.mem_alloc(piece, 0, 0) {
            Ok(a) => held.push(a.handle),
            Err(Errno::ENOSPC) => piece /= 2,
            Err(e) => return Err(Stop::Fail(format!("filling the quota: MEM_ALLOC: {e}"))),
        }
    }
    Ok(held)
}

/// ALLOW_INTERNAL_DEPENDENCIES when the file's quota (`max_file_mib`) is full: B's ALLOC takes
/// m1's chunk, still pending behind A's gate, and B waits for A's free (B's copy into the new
/// mem does not run until the gate is released, then lands). Off: the submission fails with
/// ENOSPC and changes nothing. Runs with `max_file_mib=64` or less.
fn salloc_reuse_internal_dependencies_when_the_quota_is_full() -> TestResult {
    let (d, g) = setup()?;
    let info = d.info().ctx("INFO")?;
    if info.max_file_bytes > 64 * M {
        return Err(Stop::Skip(format!(
            "the file quota is {} MiB; this case runs with max_file_mib=64 or less",
            info.max_file_bytes / M
        )));
    }
    let mut gate = Gate::new()?;
    let p = pool_for(&d, g, u64::MAX, 0)?;
    let a = d.stream_create(g).ctx("STREAM_CREATE A")?.handle;
    let b = d.stream_create(g).ctx("STREAM_CREATE B")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let seed = 0x5a110c;
    let src = mem_on(&d, g, SIZE, Some(seed))?;
    let m1 = alloc_on(&d, a, p, SIZE, "m1")?;
    let a1 = chunks(&d, m1, g, "m1")?;
    let (first, _) = submit(&d, a, vec![gate.wait(), op::free(m1)], "A's FREE")?;
    let free_seqno = first + 1;
    engine_on(&d, a, first, "A's gate")?;
    let held = fill_quota(&d, info.max_alloc_bytes)?;
    expect_errno(
        d.mem_alloc(4 * K, 0, 0),
        Errno::ENOSPC,
        "MEM_ALLOC of 4 KiB, the quota full",
    )?;
    let b_ops = |record: bool| {
        let mut v = vec![
            op::alloc(p, SIZE, false),
            op::with_dst_index(op::copy(0, 0, src, 0, SIZE), 0),
        ];
        if record {
            v.push(op::record(e));
        }
        v
    };
    // Off: ENOSPC, and nothing changes.
    let pool_before = pool_state(&d, p)?;
    let live_before = live(&d)?;
    let qb = d.stream_query(b).ctx("STREAM_QUERY B")?;
    expect_errno(
        d.stream_submit(b, &b_ops(false)),
        Errno::ENOSPC,
        "B's ALLOC with the quota full and ALLOW_INTERNAL_DEPENDENCIES off",
    )?;
    check!(
        pool_state(&d, p)? == pool_before,
        "the refused ALLOC changed the pool: {:?}, was {pool_before:?}",
        pool_state(&d, p)?
    );
    check!(
        live(&d)? == live_before,
        "the refused ALLOC changed the audit's counts"
    );
    check!(
        d.stream_query(b).ctx("STREAM_QUERY B")?.submitted == qb.submitted,
        "the refused submission queued something"
    );
    // On: m1's chunk, B waiting for A's free.
    d.pool_set_reuse(p, INTERNAL, true)
        .ctx("POOL_SET ALLOW_INTERNAL_DEPENDENCIES on")?;
    let (bfirst, ops) = submit(&d, b, b_ops(true), "B's ALLOC + COPY + RECORD")?;
    let m2 = made(&d, &ops, 0, "m2")?;
    let a2 = chunks(&d, m2, g, "m2")?;
    expect_reuse(&a2, &a1, true, "B's ALLOC with the quota full")?;
    std::thread::sleep(Duration::from_millis(200));
    not_reached(&d, b, bfirst + 1, "B's copy into the reused chunk, A held")?;
    not_reached(&d, a, free_seqno, "A")?;
    gate.release()?;
    d.stream_sync(b, WAIT_MS).ctx("STREAM_SYNC B")?;
    d.stream_sync(a, WAIT_MS).ctx("STREAM_SYNC A")?;
    let (bad, at) = user_mismatches(&d, m2, SIZE, |o| pattern::byte_at(seed, o))?;
    check!(
        bad == 0,
        "B's copy into the reused chunk: {bad} bytes wrong through the user mapping, the first at {at:?}"
    );
    for h in held.into_iter().chain([m2, src]) {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")
}

/// The attributes of pool `p` that an operation may change.
fn pool_state(d: &Ruvm, p: u64) -> Result<[u64; 11], Stop> {
    let a = d.pool_get(p).ctx("POOL_GET")?;
    Ok([
        a.reserved_current,
        a.reserved_high,
        a.used_current,
        a.used_high,
        a.hits,
        a.misses,
        a.cached_chunks,
        a.pending_bytes,
        a.release_threshold,
        a.access,
        a.reuse.into(),
    ])
}

// --- data ----------------------------------------------------------------------------------

/// A free never hands out chunks that work queued before it still uses: A copies a pattern into
/// m1, is held, then would copy m1 out and free it; B (every policy on, but no event and A not
/// at its free) allocates as much and writes another pattern into its mem. Once A runs on, what
/// it copied out of m1 is A's pattern, byte for byte.
fn salloc_free_never_hands_queued_chunks() -> TestResult {
    let (d, g) = setup()?;
    let mut gate = Gate::new()?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let (seed_a, seed_b) = (0xa11c, 0xb0b);
    let src = mem_on(&d, g, SIZE, Some(seed_a))?;
    let other = mem_on(&d, g, SIZE, Some(seed_b))?;
    let out = mem_on(&d, g, SIZE, None)?;
    let a = d.stream_create(g).ctx("STREAM_CREATE A")?.handle;
    let b = d.stream_create(g).ctx("STREAM_CREATE B")?.handle;
    let m1 = alloc_on(&d, a, p, SIZE, "m1")?;
    let a1 = chunks(&d, m1, g, "m1")?;
    // m1 holds A's pattern before the gate: a chunk handed out under A would be overwritten
    // between A's two copies.
    let (first, _) = submit(
        &d,
        a,
        vec![
            op::copy(m1, 0, src, 0, SIZE),
            gate.wait(),
            op::copy(out, 0, m1, 0, SIZE),
            op::free(m1),
        ],
        "A's COPY, WAIT_FD, COPY, FREE",
    )?;
    engine_on(&d, a, first + 1, "A's gate")?;
    let (_, ops) = submit(
        &d,
        b,
        vec![
            op::alloc(p, SIZE, false),
            op::with_dst_index(op::copy(0, 0, other, 0, SIZE), 0),
        ],
        "B's ALLOC + COPY",
    )?;
    let m2 = made(&d, &ops, 0, "m2")?;
    let a2 = chunks(&d, m2, g, "m2")?;
    d.stream_sync(b, WAIT_MS).ctx("STREAM_SYNC B")?;
    expect_reuse(&a2, &a1, false, "B's ALLOC, A held before its free")?;
    gate.release()?;
    d.stream_sync(a, WAIT_MS).ctx("STREAM_SYNC A")?;
    let (bad, at) = user_mismatches(&d, out, SIZE, |o| pattern::byte_at(seed_a, o))?;
    check!(
        bad == 0,
        "what A copied out of m1: {bad} bytes are not A's, the first at {at:?} (B wrote into m1's chunk)"
    );
    let (bad, at) = user_mismatches(&d, m2, SIZE, |o| pattern::byte_at(seed_b, o))?;
    check!(
        bad == 0,
        "B's mem: {bad} bytes are not B's, the first at {at:?}"
    );
    for h in [m2, src, other, out] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")
}

/// A mem freed on stream A while work queued on stream B still holds it: once A's free is
/// observed its chunks are cached, but with the threshold 0 they are not given back (nor by a
/// trim) while B's work pins them: their quota charge stays until the last holder lets go;
/// then the next synchronize (B's) gives them back.
fn salloc_freed_chunks_keep_their_charge_while_pinned() -> TestResult {
    let (d, g) = setup()?;
    let mut gate = Gate::new()?;
    let p = pool_for(&d, g, 0, ALL)?;
    let out = mem_on(&d, g, SIZE, None)?;
    let a = d.stream_create(g).ctx("STREAM_CREATE A")?.handle;
    let b = d.stream_create(g).ctx("STREAM_CREATE B")?.handle;
    let m = alloc_on(&d, a, p, SIZE, "m")?;
    d.stream_sync(a, WAIT_MS).ctx("STREAM_SYNC A (the ALLOC)")?;
    let (first, _) = submit(
        &d,
        b,
        vec![gate.wait(), op::copy(out, 0, m, 0, SIZE)],
        "B's WAIT_FD, COPY out of m",
    )?;
    engine_on(&d, b, first, "B's gate")?;
    submit(&d, a, vec![op::free(m)], "A's FREE")?;
    d.stream_sync(a, WAIT_MS).ctx("STREAM_SYNC A")?;
    let held = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        held.reserved_current == SIZE && held.pending_bytes == 0 && held.used_current == 0,
        "A's free observed while B's COPY holds m: {held:?}, wanted {SIZE} reserved, cached"
    );
    let trimmed = d.pool_trim(p, 0).ctx("POOL_TRIM")?;
    check!(
        trimmed == 0 && d.pool_get(p).ctx("POOL_GET")?.reserved_current == SIZE,
        "a trim while B's work pins m's chunks released {trimmed} bytes, wanted none"
    );
    gate.release()?;
    d.stream_sync(b, WAIT_MS).ctx("STREAM_SYNC B")?;
    let after = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        after.reserved_current == 0 && after.cached_chunks == 0,
        "after B's synchronize (its work let go of m): {after:?}, wanted nothing reserved"
    );
    d.mem_free(out).ctx("MEM_FREE")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")
}

/// The seed of the pattern [`salloc_zero_reuses_in_stream_order`] copies: every byte of its
/// `u64` words non-zero but the lowest (which passes 0 once in 256 words), so that zeroes and
/// the pattern differ almost everywhere.
const ZERO_CASE_SEED: u64 = 0xa5c3_96e1_7b2d_4f18;

/// `RUVM_ALLOC_ZERO` zeroes a reused chunk when the stream reaches the ALLOC, after the work
/// queued before it: stream S, held by a gate, copies a pattern into m1 and frees it; still
/// held, S allocates m2 (m1's chunk: same-stream reuse, read from the DMA addresses) and copies
/// m2 out. With the flag, what comes out is zeroes (zeroing when the ALLOC was submitted
/// would have been overwritten by the copy into m1); without it, the pattern (a reused chunk
/// keeps the file's bytes, here the ones that copy wrote, in stream order). The output mem
/// holds another pattern going in, so a copy that did not run shows.
fn salloc_zero_reuses_in_stream_order() -> TestResult {
    let (d, g) = setup()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let stale = 0x0ff5_e7e5;
    let src = mem_on(&d, g, SIZE, Some(ZERO_CASE_SEED))?;
    let out = mem_on(&d, g, SIZE, None)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    for zero in [true, false] {
        let what = if zero {
            "with RUVM_ALLOC_ZERO"
        } else {
            "without RUVM_ALLOC_ZERO"
        };
        let mut gate = Gate::new()?;
        let f = uapi::ruvm_mem_fill {
            handle: out,
            length: SIZE,
            seed: stale,
            ..Default::default()
        };
        d.mem_fill(false, f).ctx("MEM_FILL of the output")?;
        // m1 in a submission of its own: a mem freed in the submission that made it never
        // enters the file's table, and its DMA address is wanted.
        let m1 = alloc_on(&d, s, p, SIZE, &format!("{what}: m1"))?;
        let a1 = chunks(&d, m1, g, "m1")?;
        let (first, _) = submit(
            &d,
            s,
            vec![gate.wait(), op::copy(m1, 0, src, 0, SIZE), op::free(m1)],
            "WAIT_FD + COPY src to m1 + FREE m1",
        )?;
        engine_on(&d, s, first, &format!("{what}: the gate"))?;
        pool_is(
            &d,
            p,
            (0, 1, 0),
            &format!("{what}: m1's FREE queued behind the gate"),
        )?;
        let (second, ops) = submit(
            &d,
            s,
            vec![
                op::alloc(p, SIZE, zero),
                op::with_src_index(op::copy(out, 0, 0, 0, SIZE), 0),
            ],
            &format!("ALLOC m2 {what} + COPY m2 to the output"),
        )?;
        let m2 = made(&d, &ops, 0, &format!("{what}: m2"))?;
        let a2 = chunks(&d, m2, g, "m2")?;
        expect_reuse(
            &a2,
            &a1,
            true,
            &format!("{what}: m2, allocated on S behind m1's free"),
        )?;
        pool_is(&d, p, (1, 0, 0), &format!("{what}: m2 took m1's chunk"))?;
        not_reached(&d, s, first + 1, &format!("{what}: the copy into m1"))?;
        let (bad, at) = user_mismatches(&d, out, SIZE, |o| pattern::byte_at(stale, o))?;
        check!(
            bad == 0,
            "{what}: the output changed while S was held: {bad} bytes, the first at {at:?}"
        );
        gate.release()?;
        d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
        let q = d.stream_query(s).ctx("STREAM_QUERY")?;
        check!(
            q.error == 0 && q.completed == second + 1,
            "{what}: the stream after its two submissions: {q:?}, wanted seqno {} completed",
            second + 1
        );
        let want = |o: u64| {
            if zero {
                0
            } else {
                pattern::byte_at(ZERO_CASE_SEED, o)
            }
        };
        let whose = if zero {
            "zero (the ALLOC zeroes when S reaches it, after the copy into m1)"
        } else {
            "the pattern copied into m1 (a reused chunk keeps the file's bytes)"
        };
        let (bad, at) = user_mismatches(&d, out, SIZE, want)?;
        check!(
            bad == 0,
            "{what}: {bad} bytes S copied out of m2 are not {whose}, the first at {at:?}"
        );
        let (bad, at) = user_mismatches(&d, m2, SIZE, want)?;
        check!(
            bad == 0,
            "{what}: {bad} bytes of m2 are not {whose}, the first at {at:?}"
        );
        d.mem_free(m2).ctx("MEM_FREE m2")?;
        pool_is(
            &d,
            p,
            (0, 0, 1),
            &format!("{what}: m2 freed, S synchronized"),
        )?;
    }
    for h in [src, out] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
}

// --- the release threshold ------------------------------------------------------------------

/// A pending free is never given back (a trim releases nothing, nor does the threshold of 0
/// while the stream runs past the free unobserved); a synchronize that observes it gives it
/// back at once (threshold 0): STREAM_SYNC, EVENT_SYNC, and the device's synchronize.
fn salloc_threshold_at_synchronize() -> TestResult {
    let (d, g) = setup()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, 0, ALL)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    for how in ["STREAM_SYNC", "EVENT_SYNC", "STREAM_SYNC of every stream"] {
        let mut gate = Gate::new()?;
        let (first, _) = submit(
            &d,
            s,
            vec![
                gate.wait(),
                op::alloc(p, SIZE, false),
                op::free_index(1),
                op::record(e),
            ],
            "WAIT_FD + ALLOC + FREE + RECORD",
        )?;
        let held = d.pool_get(p).ctx("POOL_GET")?;
        check!(
            held.reserved_current == SIZE
                && held.pending_bytes == SIZE
                && held.used_current == 0
                && held.cached_chunks == 0,
            "{how}: with the ALLOC and FREE queued behind the gate: {held:?}, wanted {SIZE} reserved and pending, 0 used"
        );
        check!(
            live(&d)?[POOL_PENDING] == before[POOL_PENDING] + 1,
            "{how}: the audit does not count the pending chunk"
        );
        let released = d.pool_trim(p, 0).ctx("POOL_TRIM")?;
        let trimmed = d.pool_get(p).ctx("POOL_GET")?;
        check!(
            released == 0 && trimmed.reserved_current == SIZE,
            "{how}: POOL_TRIM(0) of a pool whose chunk is pending released {released}, {} reserved after",
            trimmed.reserved_current
        );
        // Run past the free, unobserved: still pending.
        gate.release()?;
        reached(&d, s, first + 3, how)?;
        let ran = d.pool_get(p).ctx("POOL_GET")?;
        check!(
            ran.pending_bytes == SIZE && ran.reserved_current == SIZE,
            "{how}: the stream ran past the free, not synchronized: {ran:?}, wanted it still pending"
        );
        match how {
            "STREAM_SYNC" => d.stream_sync(s, WAIT_MS).ctx(how)?,
            "EVENT_SYNC" => d.event_sync(e, WAIT_MS).ctx(how)?,
            _ => d.sync_every_stream(WAIT_MS).ctx(how)?,
        }
        let after = d.pool_get(p).ctx("POOL_GET")?;
        check!(
            after.reserved_current == 0 && after.pending_bytes == 0 && after.cached_chunks == 0,
            "{how} observed the free: {after:?}, wanted everything given back (threshold 0)"
        );
        check!(
            live(&d)?[POOL_PENDING] == before[POOL_PENDING],
            "{how}: the audit still counts a pending chunk"
        );
    }
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
}

// --- footprint ---------------------------------------------------------------------------------

/// 1000 submissions of (ALLOC 1 MiB, COPY 4 KiB into it, FREE it) on one stream: each ALLOC
/// takes the chunks the FREE before it gave back, so the pool never holds more than 1 MiB
/// (reserved_high), and the audit ends where it began.
fn salloc_footprint_1000() -> TestResult {
    let (d, g) = setup()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let src = mem_on(&d, g, 4 * K, Some(0xf007))?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let ops = [
        op::alloc(p, M, false),
        op::with_dst_index(op::copy(0, 0, src, 0, 4 * K), 0),
        op::free_index(0),
    ];
    let t = Instant::now();
    for i in 0..1000 {
        d.stream_submit(s, &ops)
            .ctx(&format!("STREAM_SUBMIT {i} of 1000"))?;
    }
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    println!(
        "# 1000 (ALLOC 1 MiB + COPY + FREE) submissions and their sync: {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    footprint_is_one_mib(d.pool_get(p).ctx("POOL_GET")?, "1000 x 1 MiB on one stream")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.mem_free(src).ctx("MEM_FREE")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    settled(&d, &before, "at the end")?;
    let end = live(&d)?;
    check!(
        super::shared::same_but(&end, &before, super::shared::VIDMEM_KEPT),
        "the audit ends at {end:?}, began at {before:?}"
    );
    Ok(())
}

/// Checks a footprint loop's pool after its sync: exactly 1 MiB reserved and used at the
/// high, the first MiB's chunks its only misses, nothing pending or used (`what` ran).
fn footprint_is_one_mib(info: uapi::ruvm_pool_info, what: &str) -> TestResult {
    check!(
        info.reserved_high == M && info.used_high == M,
        "reserved_high {} and used_high {} after {what}, wanted exactly {M} each",
        info.reserved_high,
        info.used_high
    );
    check!(
        info.misses == M / SIZE && info.pending_bytes == 0 && info.used_current == 0,
        "after the sync: {info:?}, wanted {} misses (the first MiB only), nothing pending or used",
        M / SIZE
    );
    Ok(())
}

/// The footprint with the triples batched, 85 to a submission (255 operations): an ALLOC takes
/// the chunks of the FREE before it in its own submission, so one MiB stays reserved. A
/// submission that fails at its last operation (an unknown kind) after its ALLOCs borrowed
/// those chunks leaves the pool exactly as it was.
fn salloc_footprint_1000_batched() -> TestResult {
    const TRIPLES: usize = 85;
    let (d, g) = setup()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let src = mem_on(&d, g, 4 * K, Some(0xf00d))?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let mut ops = Vec::with_capacity(3 * TRIPLES);
    for i in 0..TRIPLES {
        ops.extend([
            op::alloc(p, M, false),
            op::with_dst_index(op::copy(0, 0, src, 0, 4 * K), 3 * i),
            op::free_index(3 * i),
        ]);
    }
    let mut done = 0;
    while done < 1000 {
        d.stream_submit(s, &ops)
            .ctx(&format!("STREAM_SUBMIT after {done} triples"))?;
        done += TRIPLES;
    }
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    let info = d.pool_get(p).ctx("POOL_GET")?;
    footprint_is_one_mib(info, &format!("{done} x 1 MiB, {TRIPLES} to a submission"))?;
    // A failed submission whose ALLOCs borrowed: nothing changes.
    let mut bad = ops.clone();
    if let Some(last) = bad.last_mut() {
        *last = uapi::ruvm_op {
            kind: 99,
            ..Default::default()
        };
    }
    let at = d.pool_get(p).ctx("POOL_GET")?;
    let r = d.stream_submit(s, &bad);
    check!(
        r == Err(Errno::EINVAL),
        "a submission ending with an unknown kind gave {r:?}, wanted EINVAL"
    );
    let after = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        (
            after.reserved_current,
            after.used_current,
            after.pending_bytes,
            after.cached_chunks,
            after.hits,
            after.misses
        ) == (
            at.reserved_current,
            at.used_current,
            at.pending_bytes,
            at.cached_chunks,
            at.hits,
            at.misses
        ),
        "a failed submission changed the pool: {at:?} -> {after:?}"
    );
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.mem_free(src).ctx("MEM_FREE")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    settled(&d, &before, "at the end")?;
    let end = live(&d)?;
    check!(
        super::shared::same_but(&end, &before, super::shared::VIDMEM_KEPT),
        "the audit ends at {end:?}, began at {before:?}"
    );
    Ok(())
}

// --- refusals ------------------------------------------------------------------------------

/// Submits `o` raw: `count` operations at address `at`.
fn submit_raw(d: &Ruvm, s: u64, count: usize, at: u64) -> Result<u64, Errno> {
    let mut a = uapi::ruvm_stream_submit {
        handle: s,
        count: count as u32,
        ops: at,
        ..Default::default()
    };
    d.call(cmd::STREAM_SUBMIT, &mut a).map(|()| a.first_seqno)
}

/// Submits `ops` from a page mapped read-only (written, then `mprotect(PROT_READ)`).
fn submit_read_only(d: &Ruvm, s: u64, ops: &[uapi::ruvm_op]) -> Result<Result<u64, Errno>, Stop> {
    use nix::sys::mman::{mmap_anonymous, mprotect, munmap, MapFlags, ProtFlags};
    let page = 4096;
    check!(
        std::mem::size_of_val(ops) <= page,
        "{} operations do not fit a page",
        ops.len()
    );
    let len = std::num::NonZeroUsize::new(page).ok_or(Stop::Fail("page 0".into()))?;
    // SAFETY: a fresh private anonymous mapping, used through its own pointer only.
    let base = unsafe {
        mmap_anonymous(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
        )
    }
    .ctx("mmap")?;
    let at = base.as_ptr().cast::<uapi::ruvm_op>();
    for (i, o) in ops.iter().enumerate() {
        // SAFETY: inside the page just mapped, aligned (a page is a multiple of 8).
        unsafe { at.add(i).write(*o) };
    }
    // SAFETY: the mapping just made; nothing holds a reference into it.
    unsafe { mprotect(base, page, ProtFlags::PROT_READ) }.ctx("mprotect")?;
    let r = submit_raw(d, s, ops.len(), at as u64);
    // SAFETY: as above; not used after this.
    unsafe { munmap(base, page) }.ctx("munmap")?;
    Ok(r)
}

/// `o` with the field named `field` non-zero.
fn poked(mut o: uapi::ruvm_op, field: &str) -> uapi::ruvm_op {
    match field {
        "dst_offset" => o.dst_offset = 8,
        "src" => o.src = 1,
        "src_offset" => o.src_offset = 8,
        "length" => o.length = 8,
        "value" => o.value = 1,
        "fill_kind" => o.fill_kind = 1,
        "timeout_ms" => o.timeout_ms = 1,
        _ => o.reserved = 1,
    }
    o
}

/// Every documented refusal of ALLOC, FREE, the index flags and GPU_POOL, each from a
/// submission that would otherwise succeed: the errno, and nothing changed (the pool's
/// attributes, the audit's counts, the stream's queue).
fn salloc_bad_inputs() -> TestResult {
    let (d, g) = setup()?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let src = mem_on(&d, g, SIZE, Some(0xbad))?;
    let m = alloc_on(&d, s, p, SIZE, "m")?;
    // A chunk cached, the high watermarks at two: a refused submission's ALLOC takes the
    // cached chunk (a hit) and puts it back, every attribute as it was.
    let warm = alloc_on(&d, s, p, SIZE, "a second mem")?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    d.mem_free(warm).ctx("MEM_FREE")?;
    let state = || -> Result<([u64; 11], Vec<u64>, u64), Stop> {
        Ok((
            pool_state(&d, p)?,
            live(&d)?,
            d.stream_query(s).ctx("STREAM_QUERY")?.submitted,
        ))
    };
    let cases = |ops: Vec<uapi::ruvm_op>, want: Errno, what: &str| -> TestResult {
        let before = state()?;
        let r = d.stream_submit(s, &ops);
        expect_errno(r, want, what)?;
        let after = state()?;
        check!(
            after == before,
            "{what}: refused, but it changed the pool, the audit or the queue: {after:?}, was {before:?}"
        );
        Ok(())
    };
    let alloc = op::alloc(p, SIZE, false);
    let with_flags = |flags: u32| uapi::ruvm_op { flags, ..alloc };

    // ALLOC.
    cases(
        vec![op::alloc(p, 0, false)],
        Errno::EINVAL,
        "ALLOC of 0 bytes",
    )?;
    for (flags, name) in [
        (
            uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK,
            "RUVM_ALLOC_FALLBACK",
        ),
        (uapi::ruvm_op_flags_RUVM_OP_DST_INDEX, "RUVM_OP_DST_INDEX"),
        (uapi::ruvm_op_flags_RUVM_OP_SRC_INDEX, "RUVM_OP_SRC_INDEX"),
        (1 << 31, "flag bit 31"),
    ] {
        cases(
            vec![with_flags(flags)],
            Errno::EINVAL,
            &format!("ALLOC with {name}"),
        )?;
    }
    cases(
        vec![op::alloc(0xdead_beef, SIZE, false)],
        Errno::ENOENT,
        "ALLOC from no pool",
    )?;
    for field in ["src_offset", "value", "fill_kind", "timeout_ms", "reserved"] {
        let what = format!("ALLOC with {field} set");
        cases(vec![poked(alloc, field)], Errno::EINVAL, &what)?;
        cases(
            vec![alloc, op::record(e), poked(alloc, field)],
            Errno::EINVAL,
            &format!("an ALLOC and a RECORD, then {what}"),
        )?;
    }
    // A good ALLOC before a bad operation: no mem is made.
    cases(
        vec![alloc, poked(op::record(e), "reserved")],
        Errno::EINVAL,
        "an ALLOC, then a RECORD with reserved set",
    )?;
    // The same from a pool with nothing cached (new chunks): given back. Its high watermarks
    // are left out: the header does not say whether an allocation a refused submission undid
    // may raise them.
    {
        let what = "an ALLOC of new chunks, then a RECORD with reserved set";
        let empty = pool_for(&d, g, u64::MAX, ALL)?;
        let without_highs = || -> Result<([u64; 11], Vec<u64>, u64), Stop> {
            let mut a = pool_state(&d, empty)?;
            (a[1], a[3]) = (0, 0);
            Ok((
                a,
                live(&d)?,
                d.stream_query(s).ctx("STREAM_QUERY")?.submitted,
            ))
        };
        let before = without_highs()?;
        expect_errno(
            d.stream_submit(
                s,
                &[
                    op::alloc(empty, SIZE, false),
                    poked(op::record(e), "reserved"),
                ],
            ),
            Errno::EINVAL,
            what,
        )?;
        let after = without_highs()?;
        check!(
            after == before,
            "{what}: refused, but it changed the pool, the audit or the queue: {after:?}, was {before:?}"
        );
        d.pool_destroy(empty).ctx("POOL_DESTROY")?;
    }
    // Its dst and dst_offset are outputs: what they held going in is ignored.
    {
        let (_, ops) = submit(
            &d,
            s,
            vec![uapi::ruvm_op {
                dst: 0xdead_beef,
                dst_offset: 7,
                ..alloc
            }],
            "an ALLOC whose dst and dst_offset hold junk",
        )?;
        let h = made(&d, &ops, 0, "the ALLOC with junk outputs")?;
        d.mem_free(h).ctx("MEM_FREE")?;
        d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    }
    match vidmem_gpu(&d) {
        Ok(vg) => {
            let vp = vid_pool(&d, vg.id, 0, u64::MAX).ctx("POOL_CREATE (vidmem)")?;
            cases(
                vec![op::alloc(vp, SIZE, false)],
                Errno::EOPNOTSUPP,
                "ALLOC from a vidmem pool",
            )?;
            expect_errno(
                d.gpu_pool_set(g, vp),
                Errno::EINVAL,
                "GPU_POOL set to a vidmem pool",
            )?;
            d.pool_destroy(vp).ctx("POOL_DESTROY (vidmem)")?;
        }
        Err(Stop::Skip(why)) => println!("# the vidmem rows skipped: {why}"),
        Err(f) => return Err(f),
    }

    // FREE.
    cases(vec![op::free(0xdead_beef)], Errno::ENOENT, "FREE of no mem")?;
    cases(
        vec![op::free(m), op::free(m)],
        Errno::ENOENT,
        "the same mem freed twice in one submission",
    )?;
    let q = d
        .mem_query(m)
        .ctx("MEM_QUERY of the mem a refused submission would have freed twice")?;
    check!(q.size == SIZE, "the mem after the refusal: {q:?}");
    for field in [
        "dst_offset",
        "src",
        "src_offset",
        "length",
        "value",
        "fill_kind",
        "timeout_ms",
        "reserved",
    ] {
        cases(
            vec![poked(op::free(m), field)],
            Errno::EINVAL,
            &format!("FREE with {field} set"),
        )?;
    }

    // The index flags.
    let copy_in = |i: usize| op::with_dst_index(op::copy(0, 0, src, 0, 4 * K), i);
    cases(
        vec![op::record(e), copy_in(0)],
        Errno::EINVAL,
        "RUVM_OP_DST_INDEX naming a RECORD",
    )?;
    cases(
        vec![copy_in(1), alloc],
        Errno::EINVAL,
        "RUVM_OP_DST_INDEX naming a later ALLOC",
    )?;
    cases(
        vec![op::free_index(0)],
        Errno::EINVAL,
        "RUVM_OP_DST_INDEX naming the FREE itself",
    )?;
    for i in [2, 7, 1 << 40] {
        cases(
            vec![alloc, op::free_index(i)],
            Errno::EINVAL,
            &format!("RUVM_OP_DST_INDEX {i}, out of range"),
        )?;
    }
    cases(
        vec![alloc, op::with_src_index(op::copy(src, 0, 0, 0, 4 * K), 2)],
        Errno::EINVAL,
        "RUVM_OP_SRC_INDEX out of range",
    )?;
    cases(
        vec![alloc, op::with_src_index(op::free(m), 0)],
        Errno::EINVAL,
        "a FREE with RUVM_OP_SRC_INDEX (it has no source)",
    )?;
    cases(
        vec![alloc, op::with_src_index(op::fill_byte(src, 0, 8, 1), 0)],
        Errno::EINVAL,
        "a FILL with RUVM_OP_SRC_INDEX (it has no source)",
    )?;
    cases(
        vec![alloc, op::with_dst_index(op::record(e), 0)],
        Errno::EINVAL,
        "a RECORD with RUVM_OP_DST_INDEX",
    )?;

    // A read-only array: EFAULT with an ALLOC (the module must write its results), checked
    // before anything is made; without one it is fine.
    {
        let what = "an ALLOC in an array mapped read-only";
        let before = state()?;
        expect_errno(
            submit_read_only(&d, s, &[alloc, op::record(e)])?,
            Errno::EFAULT,
            what,
        )?;
        let after = state()?;
        check!(
            after == before,
            "{what}: refused, but it changed the pool, the audit or the queue: {after:?}, was {before:?}"
        );
    }
    submit_read_only(&d, s, &[op::record(e)])?
        .ctx("a RECORD alone in an array mapped read-only")?;

    // GPU_POOL.
    let current = d.gpu_pool_get(g).ctx("GPU_POOL")?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let absent = (0..uapi::RUVM_MAX_GPUS)
        .find(|id| !gpus.iter().any(|x| x.id == *id))
        .unwrap_or(u32::MAX);
    let mut a = uapi::ruvm_gpu_pool {
        gpu: g,
        flags: 1 << 1,
        ..Default::default()
    };
    expect_errno(
        d.call(cmd::GPU_POOL, &mut a),
        Errno::EINVAL,
        "GPU_POOL with an unknown flag",
    )?;
    let mut a = uapi::ruvm_gpu_pool {
        gpu: g,
        reserved: [0, 1],
        ..Default::default()
    };
    expect_errno(
        d.call(cmd::GPU_POOL, &mut a),
        Errno::EINVAL,
        "GPU_POOL with reserved[1] set",
    )?;
    expect_errno(d.gpu_pool_get(absent), Errno::ENODEV, "GPU_POOL of no GPU")?;
    expect_errno(
        d.gpu_pool_set(absent, p),
        Errno::ENODEV,
        "GPU_POOL set on no GPU",
    )?;
    expect_errno(
        d.gpu_pool_set(g, 0xdead_beef),
        Errno::ENOENT,
        "GPU_POOL set to no pool",
    )?;
    let other = Ruvm::open().ctx("open")?;
    let (theirs, _) = other.pool_create(0, 0).ctx("POOL_CREATE in another file")?;
    expect_errno(
        d.gpu_pool_set(g, theirs),
        Errno::ENOENT,
        "GPU_POOL set to another file's pool",
    )?;
    check!(
        d.gpu_pool_get(g).ctx("GPU_POOL")? == current,
        "a refused GPU_POOL changed the GPU's current pool"
    );
    expect_errno(
        d.pool_destroy(current),
        Errno::EBUSY,
        "POOL_DESTROY of the GPU's default pool",
    )?;
    check!(
        d.pool_get(current).is_ok(),
        "the default pool went with a refused POOL_DESTROY"
    );

    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    d.mem_free(m).ctx("MEM_FREE")?;
    d.mem_free(src).ctx("MEM_FREE")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")
}

// --- a GPU's current pool ------------------------------------------------------------------

/// Each GPU has a default pool per file (sysmem, mapped for it, threshold 0, every policy on)
/// that an ALLOC from pool 0 takes from; GPU_POOL makes another pool current, 0 the default
/// again, and a current pool destroyed leaves the default current.
fn salloc_default_pool() -> TestResult {
    let (d, g) = setup()?;
    let p0 = d.gpu_pool_get(g).ctx("GPU_POOL")?;
    check!(p0 != 0, "GPU {g}'s current pool is 0");
    check!(
        d.gpu_pool_get(g).ctx("GPU_POOL")? == p0,
        "a second GPU_POOL read another pool"
    );
    let i0 = d.pool_get(p0).ctx("POOL_GET of the default pool")?;
    check!(
        i0.backing == uapi::ruvm_backing_RUVM_BACKING_SYSMEM
            && i0.access & (1 << g) != 0
            && i0.release_threshold == 0
            && i0.reuse == ALL
            && i0.used_current == 0,
        "GPU {g}'s default pool: {i0:?}, wanted sysmem, mapped for GPU {g}, threshold 0, every reuse policy on, nothing used"
    );
    let used = |p: u64| -> Result<u64, Stop> { Ok(d.pool_get(p).ctx("POOL_GET")?.used_current) };
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let m0 = alloc_on(&d, s, 0, SIZE, "an ALLOC from pool 0")?;
    check!(
        used(p0)? == SIZE,
        "the default pool's used is {}, wanted {SIZE}",
        used(p0)?
    );
    // Another pool current.
    let (p1, _) = d.pool_create(SIZE, u64::MAX).ctx("POOL_CREATE")?;
    d.pool_access(p1, g, true).ctx("POOL_SET_ACCESS")?;
    d.gpu_pool_set(g, p1).ctx("GPU_POOL set")?;
    check!(
        d.gpu_pool_get(g).ctx("GPU_POOL")? == p1,
        "GPU_POOL set did not make pool {p1} current"
    );
    let m1 = alloc_on(&d, s, 0, SIZE, "an ALLOC from pool 0, another pool current")?;
    check!(
        used(p1)? == SIZE && used(p0)? == SIZE,
        "with pool {p1} current: its used {}, the default's {}",
        used(p1)?,
        used(p0)?
    );
    // 0: the default again.
    d.gpu_pool_set(g, 0).ctx("GPU_POOL set 0")?;
    check!(
        d.gpu_pool_get(g).ctx("GPU_POOL")? == p0,
        "GPU_POOL set 0 did not make the default pool current again"
    );
    let m2 = alloc_on(
        &d,
        s,
        0,
        SIZE,
        "an ALLOC from pool 0, the default current again",
    )?;
    check!(
        used(p0)? == 2 * SIZE && used(p1)? == SIZE,
        "the default current again: its used {}, pool {p1}'s {}",
        used(p0)?,
        used(p1)?
    );
    // A current pool destroyed: the default is current again.
    d.gpu_pool_set(g, p1).ctx("GPU_POOL set")?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    d.mem_free(m1).ctx("MEM_FREE")?;
    d.pool_destroy(p1).ctx("POOL_DESTROY of the current pool")?;
    check!(
        d.gpu_pool_get(g).ctx("GPU_POOL")? == p0,
        "the current pool destroyed, the GPU's current pool is not its default"
    );
    expect_errno(
        d.pool_destroy(p0),
        Errno::EBUSY,
        "POOL_DESTROY of the default pool",
    )?;
    // Per GPU, per file.
    if let Some(g2) = super::streams::sim_gpus(&d)?
        .iter()
        .map(|x| x.id)
        .find(|&x| x != g)
    {
        let q = d.gpu_pool_get(g2).ctx("GPU_POOL of another GPU")?;
        check!(
            q != p0 && q != 0,
            "GPU {g2}'s default pool is {q}, GPU {g}'s is {p0}"
        );
    }
    let other = Ruvm::open().ctx("open")?;
    let theirs = other.gpu_pool_get(g).ctx("GPU_POOL in another file")?;
    check!(
        theirs != p0,
        "another file's default pool for GPU {g} is this file's ({p0})"
    );
    expect_errno(
        d.pool_get(theirs),
        Errno::ENOENT,
        "POOL_GET of another file's default pool",
    )?;
    for h in [m0, m2] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drained(&d, "at the end")
}

// --- teardown ------------------------------------------------------------------------------

/// On a new file: a pool mapped for `g` and GPU `g`'s default pool, a stream held by `gate`
/// with ALLOCs and FREEs of both queued behind it (and a FREE of a mem allocated before it, and
/// of a plain mem), then a RECORD: the file, the stream, and the record's point exported.
fn queue_frees(g: u32, gate: &Gate) -> Result<(Ruvm, u64, OwnedFd), String> {
    let e = |what: &str, err: Errno| format!("{what}: {err}");
    let f = Ruvm::open().map_err(|x| x.to_string())?;
    let (p, _) = f
        .pool_create(SIZE, u64::MAX)
        .map_err(|x| e("POOL_CREATE", x))?;
    f.pool_access(p, g, true)
        .map_err(|x| e("POOL_SET_ACCESS", x))?;
    let s = f
        .stream_create(g)
        .map_err(|x| e("STREAM_CREATE", x))?
        .handle;
    let mut first = [op::alloc(p, SIZE, false)];
    f.stream_submit_mut(s, &mut first)
        .map_err(|x| e("STREAM_SUBMIT of an ALLOC", x))?;
    let (early, _) = op::allocated(&first[0]);
    let plain = f
        .mem_alloc(SIZE, 0, 0)
        .map_err(|x| e("MEM_ALLOC", x))?
        .handle;
    let ev = f.event_create().map_err(|x| e("EVENT_CREATE", x))?;
    let ops = [
        gate.wait(),
        op::free(early),
        op::free(plain),
        op::alloc(p, SIZE, true),
        op::free_index(3),
        op::alloc(0, SIZE, false),
        op::free_index(5),
        op::alloc(p, M, false),
        op::free_index(7),
        op::record(ev),
    ];
    f.stream_submit(s, &ops)
        .map_err(|x| e("STREAM_SUBMIT of the held ALLOCs and FREEs", x))?;
    let fd = f.event_export(ev).map_err(|x| e("EVENT_EXPORT", x))?;
    Ok((f, s, fd))
}

/// A file closed with ALLOCs and FREEs queued behind a gate: its point signals ECANCELED, and
/// the audit (pending chunks, stream operations, mems, pools) goes back to where it was.
fn salloc_teardown_close() -> TestResult {
    let (d, g) = setup()?;
    let gate = Gate::new()?;
    let before = live(&d)?;
    let (f, _, fd) = queue_frees(g, &gate).map_err(Stop::Fail)?;
    let l = live(&d)?;
    check!(
        l[POOL_PENDING] > before[POOL_PENDING] && l[STREAM_OPS] > before[STREAM_OPS],
        "with frees queued behind the gate: pool_pending {} (was {}), stream_ops {} (was {})",
        l[POOL_PENDING],
        before[POOL_PENDING],
        l[STREAM_OPS],
        before[STREAM_OPS]
    );
    drop(f);
    let info = signalled(&fd, "the record after the frees")?;
    check!(
        errno_of(info.status) == Some(Errno::ECANCELED),
        "the record signalled with {}, wanted -ECANCELED",
        info.status
    );
    settled(&d, &before, "once the file closed")
}

/// The same in a child process killed by SIGKILL.
fn salloc_teardown_kill() -> TestResult {
    let (d, g) = setup()?;
    let gate = Gate::new()?;
    let before = live(&d)?;
    let (r, w) = pipe2(OFlag::O_CLOEXEC).ctx("pipe2")?;
    // SAFETY: the runner is single-threaded when cases run; the child makes syscalls, writes
    // one byte and sleeps until killed.
    let child = match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            drop(r);
            let code = match queue_frees(g, &gate) {
                Ok(_held) => match nix::unistd::write(&w, &[1]) {
                    Ok(1) => loop {
                        std::thread::sleep(Duration::from_secs(3600));
                    },
                    _ => 3,
                },
                Err(why) => {
                    eprintln!("# child: {why}");
                    2
                }
            };
            std::process::exit(code);
        }
        ForkResult::Parent { child } => child,
    };
    drop(w);
    let mut byte = [0u8; 1];
    let ready = loop {
        match nix::unistd::read(&r, &mut byte) {
            Err(Errno::EINTR) => continue,
            other => break other,
        }
    };
    let held = match ready {
        Ok(1) => live(&d).map(|l| l[POOL_PENDING]),
        other => Err(Stop::Fail(format!(
            "the child did not queue its work ({other:?}; its stderr says why)"
        ))),
    };
    let _ = kill(child, Signal::SIGKILL);
    let status = waitpid(child, None).ctx("waitpid")?;
    let pending = held?;
    check!(
        matches!(status, WaitStatus::Signaled(_, Signal::SIGKILL, _)),
        "the child ended {status:?}, not by the SIGKILL"
    );
    check!(
        pending > before[POOL_PENDING],
        "the child's frees behind the gate left pool_pending at {pending} (was {})",
        before[POOL_PENDING]
    );
    settled(&d, &before, "once the child was killed")?;
    drop(gate);
    Ok(())
}

/// The GPU of a stream with ALLOCs and FREEs queued behind a gate is removed: the stream's
/// point signals ENODEV; a synchronize (EIO: the stream is in error) observes its frees, and
/// once the file closes and the GPU is back nothing is left.
fn salloc_teardown_gpu_removal() -> TestResult {
    let (d, g) = setup()?;
    if d.info().ctx("INFO")?.test_ioctls == 0 {
        return Err(Stop::Skip("needs enable_test_ioctls=1".into()));
    }
    let gate = Gate::new()?;
    let before = live(&d)?;
    let (f, s, fd) = queue_frees(g, &gate).map_err(Stop::Fail)?;
    check!(
        live(&d)?[POOL_PENDING] > before[POOL_PENDING],
        "no chunk pending with the frees queued behind the gate"
    );
    let back = BringBack(&d, g);
    remove_gpu(g)?;
    let info = signalled(&fd, "the record after the frees")?;
    check!(
        errno_of(info.status) == Some(Errno::ENODEV),
        "the record signalled with {} after its GPU went, wanted -ENODEV",
        info.status
    );
    expect_errno(
        f.sync_every_stream(WAIT_MS),
        Errno::EIO,
        "STREAM_SYNC of every stream after the GPU went",
    )?;
    let q = f.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.error == Errno::ENODEV as u32 && q.completed == q.submitted,
        "the stream after its GPU went: {q:?}"
    );
    check!(
        live(&d)?[POOL_PENDING] == before[POOL_PENDING],
        "the synchronize after the removal left pool_pending at {}",
        live(&d)?[POOL_PENDING]
    );
    drop(f);
    drop(back);
    check!(
        d.gpus()
            .ctx("GPU_LIST")?
            .iter()
            .any(|x| x.id == g && x.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0),
        "GPU {g} did not come back"
    );
    drop(gate);
    settled(&d, &before, "once the file closed and the GPU came back")
}

// --- a synchronous free of a reused mem -----------------------------------------------------

/// m2 takes m1's chunk on stream S (S held before m1's free), then MEM_FREE(m2) while S is
/// still held: the chunk must not reach another stream B (every policy on) before S reaches
/// m1's free. Once S runs and everything is synchronized, nothing is left.
fn salloc_sync_memfree_waits_safe() -> TestResult {
    let (d, g) = setup()?;
    let mut gate = Gate::new()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE S")?.handle;
    let b = d.stream_create(g).ctx("STREAM_CREATE B")?.handle;
    let m1 = alloc_on(&d, s, p, SIZE, "m1")?;
    let a1 = chunks(&d, m1, g, "m1")?;
    let (first, _) = submit(&d, s, vec![gate.wait(), op::free(m1)], "S's FREE m1")?;
    engine_on(&d, s, first, "S's gate")?;
    let m2 = alloc_on(&d, s, p, SIZE, "m2")?;
    let a2 = chunks(&d, m2, g, "m2")?;
    expect_reuse(&a2, &a1, true, "m2 on S")?;
    d.mem_free(m2).ctx("MEM_FREE m2, S held")?;
    let m3 = alloc_on(&d, b, p, SIZE, "m3 on B")?;
    let a3 = chunks(&d, m3, g, "m3")?;
    expect_reuse(
        &a3,
        &a1,
        false,
        "B's ALLOC after MEM_FREE of the reused m2, S not at m1's free",
    )?;
    not_reached(&d, s, first + 1, "S")?;
    gate.release()?;
    d.sync_every_stream(WAIT_MS)
        .ctx("STREAM_SYNC of every stream")?;
    d.mem_free(m3).ctx("MEM_FREE m3")?;
    let end = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        end.pending_bytes == 0 && end.used_current == 0,
        "after everything was synchronized and freed: {end:?}"
    );
    for x in [s, b] {
        d.stream_destroy(x).ctx("STREAM_DESTROY")?;
    }
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
}

// --- regressions: a mapped mem, GPU VA mappings, a destroyed stream --------------------------

/// Checks pool `p`'s counts, in chunks of [`SIZE`]: `used`, `pending` and `cached`, and
/// reserved their sum.
fn pool_is(d: &Ruvm, p: u64, (used, pending, cached): (u64, u64, u64), what: &str) -> TestResult {
    let i = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        i.used_current == used * SIZE
            && i.pending_bytes == pending * SIZE
            && i.cached_chunks == cached
            && i.reserved_current == (used + pending + cached) * SIZE,
        "{what}: {i:?}, wanted {used} chunk(s) used, {pending} pending, {cached} cached"
    );
    Ok(())
}

/// With pointer attributes: the first byte of `map`, the mapping of mem `q` of pool `p` freed
/// on a stream, answers FREED, handle 0, its pool (the mapping holds its chunks) and no GPU.
fn freed_mapping_answers(
    d: &Ruvm,
    map: &UserMap,
    q: &uapi::ruvm_mem_query,
    p: u64,
    what: &str,
) -> TestResult {
    if d.info().ctx("INFO")?.features & u64::from(uapi::RUVM_FEATURE_PTR_ATTRS) == 0 {
        return Ok(());
    }
    let base = map.as_ptr() as u64;
    let a = d.ptr_attrs(base).ctx("PTR_ATTRS")?;
    check!(
        a.type_ == uapi::ruvm_ptr_type_RUVM_PTR_MEM
            && a.ptr_flags == uapi::ruvm_ptr_flags_RUVM_PTR_FREED
            && a.handle == 0
            && a.offset == 0
            && a.base == base
            && a.size == q.size
            && a.physical_size == q.physical_size
            && a.chunk_size == q.chunk_size
            && a.pool == p
            && a.mapped_gpus == 0
            && a.backing == uapi::ruvm_backing_RUVM_BACKING_SYSMEM
            && a.reserved == [0, 0],
        "{what}: PTR_ATTRS of its mapping says {a:?}, wanted FREED with handle 0, pool {p}, no GPU, and the mem's sizes"
    );
    Ok(())
}

/// A pool mem that a user VMA still maps when a FREE on a stream frees it keeps its chunk (in
/// the pool's `used_current`, and in the file's quota) until the VMA goes, however far the
/// stream got and whatever synchronized it: its mapping faults (SIGBUS, seen through
/// /proc/self/mem) and no other allocation gets the chunk meanwhile. Once the VMA goes the
/// chunk comes back as the free's: cached at once if a synchronize observed the free already,
/// else pending until one does. Every reuse policy is off, so that only a synchronize makes
/// the chunk reusable on another stream B: B gets new memory before, the same chunk after.
fn salloc_free_of_a_mapped_mem_keeps_its_chunks_until_unmapped() -> TestResult {
    let (d, g) = setup()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, 0)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE S")?.handle;
    let b = d.stream_create(g).ctx("STREAM_CREATE B")?.handle;

    // The free synchronized while the mem is still mapped.
    let m1 = alloc_on(&d, s, p, SIZE, "m1")?;
    let a1 = chunks(&d, m1, g, "m1")?;
    let q1 = d.mem_query(m1).ctx("MEM_QUERY m1")?;
    let map1 = UserMap::of_mem(&d, &q1).ctx("mmap m1")?;
    map1.write(0, 0x5a);
    check!(
        readable(map1.as_ptr()),
        "m1's mapping cannot be read before its free"
    );
    submit(&d, s, vec![op::free(m1)], "FREE m1")?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC S")?;
    pool_is(
        &d,
        p,
        (1, 0, 0),
        "m1 freed on S, synchronized, still mapped",
    )?;
    check!(
        !readable(map1.as_ptr()),
        "m1's mapping can still be read after its free (wanted SIGBUS)"
    );
    freed_mapping_answers(&d, &map1, &q1, p, "m1, freed on S")?;
    let m2 = alloc_on(&d, b, p, SIZE, "m2 on B")?;
    let a2 = chunks(&d, m2, g, "m2")?;
    expect_reuse(
        &a2,
        &a1,
        false,
        "B's ALLOC while m1's mapping holds its chunk (its free synchronized)",
    )?;
    pool_is(&d, p, (2, 0, 0), "m2 allocated, m1 still mapped")?;
    drop(map1);
    pool_is(
        &d,
        p,
        (1, 0, 1),
        "m1's mapping gone, its free observed before",
    )?;
    let m3 = alloc_on(&d, b, p, SIZE, "m3 on B")?;
    let a3 = chunks(&d, m3, g, "m3")?;
    expect_reuse(&a3, &a1, true, "B's ALLOC once m1's mapping went")?;
    pool_is(&d, p, (2, 0, 0), "m3 took m1's chunk")?;

    // The mapping gone before any synchronize observed the free.
    let m4 = alloc_on(&d, s, p, SIZE, "m4")?;
    let a4 = chunks(&d, m4, g, "m4")?;
    let q4 = d.mem_query(m4).ctx("MEM_QUERY m4")?;
    let map4 = UserMap::of_mem(&d, &q4).ctx("mmap m4")?;
    map4.write(1, 0xa5);
    let (free4, _) = submit(&d, s, vec![op::free(m4)], "FREE m4")?;
    reached(&d, s, free4, "S's FREE of m4")?;
    pool_is(&d, p, (3, 0, 0), "m4 freed on S, reached, still mapped")?;
    check!(
        !readable(map4.as_ptr()),
        "m4's mapping can still be read after its free (wanted SIGBUS)"
    );
    freed_mapping_answers(&d, &map4, &q4, p, "m4, freed on S")?;
    let m5 = alloc_on(&d, b, p, SIZE, "m5 on B")?;
    let a5 = chunks(&d, m5, g, "m5")?;
    expect_reuse(
        &a5,
        &a4,
        false,
        "B's ALLOC while m4's mapping holds its chunk",
    )?;
    drop(map4);
    pool_is(
        &d,
        p,
        (3, 1, 0),
        "m4's mapping gone, its free not observed: pending",
    )?;
    let m6 = alloc_on(&d, b, p, SIZE, "m6 on B")?;
    let a6 = chunks(&d, m6, g, "m6")?;
    expect_reuse(
        &a6,
        &a4,
        false,
        "B's ALLOC with m4's chunk pending (every policy off)",
    )?;
    pool_is(&d, p, (4, 1, 0), "m6 allocated, m4's chunk pending")?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC S")?;
    pool_is(&d, p, (4, 0, 1), "S synchronized: m4's free observed")?;
    let m7 = alloc_on(&d, b, p, SIZE, "m7 on B")?;
    let a7 = chunks(&d, m7, g, "m7")?;
    expect_reuse(&a7, &a4, true, "B's ALLOC once m4's free was observed")?;
    pool_is(&d, p, (5, 0, 0), "m7 took m4's chunk")?;

    d.sync_every_stream(WAIT_MS)
        .ctx("STREAM_SYNC of every stream")?;
    for h in [m2, m3, m5, m6, m7] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    pool_is(&d, p, (0, 0, 5), "everything freed and synchronized")?;
    for x in [s, b] {
        d.stream_destroy(x).ctx("STREAM_DESTROY")?;
    }
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
}

/// Where the case below maps its two mems in the file's user VA space.
const GPU_USER_VA: u64 = 0x20_0000_0000;

/// A pool mem mapped at a GPU user VA (`MEM_MAP_GPU_USER`) and freed by a FREE queued behind a
/// gate, after a COPY_VA that reads it through that VA: its GPU mapping and the DMA table under
/// it stay until the stream reaches the free, whatever happens to the pool meanwhile. Its GPU
/// is revoked from the pool (whose cached and pending chunks' tables for the GPU go), then the
/// pool is destroyed (no mem of it holds chunks: the freed one's are pending, so no `EBUSY`;
/// its pending frees are dropped). Released, the copy completes without a fault and its
/// bytes are the mem's, and once everything is done nothing is left.
fn salloc_free_keeps_gpu_va_mappings_until_reached() -> TestResult {
    let (d, g) = setup()?;
    let info = d
        .gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .find(|x| x.id == g)
        .ok_or_else(|| Stop::Fail(format!("GPU {g} left the list")))?;
    if info.flags & uapi::ruvm_gpu_flags_RUVM_GPU_MMU == 0 {
        return Err(Stop::Skip(format!("GPU {g} has no MMU")));
    }
    let mut gate = Gate::new()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let seed = 0x6a7e_f00d;
    let m = d
        .pool_alloc(p, SIZE, 0)
        .ctx("MEM_ALLOC from the pool")?
        .handle;
    check!(
        d.mem_query(m).ctx("MEM_QUERY")?.mapped_gpus == 1 << g,
        "a mem of a pool granted GPU {g} is not DMA-mapped for it"
    );
    super::shared::fill(&d, m, SIZE, seed)?;
    let dst = d
        .mem_alloc(SIZE, 0, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
        .ctx("MEM_ALLOC")?
        .handle;
    let (src_va, dst_va) = (GPU_USER_VA, GPU_USER_VA + M);
    d.map_gpu_user(m, g, src_va, false)
        .ctx("MAP_GPU_USER of the pool mem")?;
    d.map_gpu_user(dst, g, dst_va, false)
        .ctx("MAP_GPU_USER of the destination")?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let (first, _) = submit(
        &d,
        s,
        vec![
            gate.wait(),
            op::copy_va(dst_va, src_va, SIZE, true),
            op::free(m),
        ],
        "WAIT_FD + COPY_VA from the mem + FREE of it",
    )?;
    engine_on(&d, s, first, "the gate")?;
    expect_errno(d.mem_query(m), Errno::ENOENT, "MEM_QUERY of the freed mem")?;
    let held = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        held.used_current == 0 && held.pending_bytes == SIZE,
        "the FREE queued behind the gate: {held:?}, wanted 0 used and {SIZE} pending"
    );
    d.pool_access(p, g, false)
        .ctx("POOL_SET_ACCESS revoking the GPU")?;
    let revoked = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        revoked.access == 0 && revoked.pending_bytes == SIZE,
        "after the revoke: {revoked:?}, wanted no GPU in the access set and the chunk still pending"
    );
    d.pool_destroy(p)
        .ctx("POOL_DESTROY with the free's chunk pending (no mem holds chunks of the pool)")?;
    expect_errno(
        d.pool_get(p),
        Errno::ENOENT,
        "POOL_GET of the destroyed pool",
    )?;
    not_reached(&d, s, first + 1, "the copy, behind the gate")?;
    gate.release()?;
    d.stream_sync(s, WAIT_MS)
        .ctx("STREAM_SYNC: the copy through the freed mem's GPU VA, then the free")?;
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.error == 0 && q.completed == first + 2,
        "the stream after the copy and the free: {q:?}"
    );
    let (bad, at) = user_mismatches(&d, dst, SIZE, |o| pattern::byte_at(seed, o))?;
    check!(
        bad == 0,
        "the copy through the freed mem's GPU VA: {bad} bytes are not the mem's, the first at {at:?}"
    );
    d.mem_free(dst).ctx("MEM_FREE")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
}

/// A stream destroyed after it reached an ALLOC and its FREE: no synchronize can name it any
/// more, so its free counts as observed once reached. It is still pending after the destroy
/// (a destroy observes nothing); the next synchronize of the file on another stream T caches
/// it: `STREAM_SYNC` of T, then (a second round) `EVENT_SYNC` of an event recorded on T.
fn salloc_destroyed_streams_frees_are_cached_at_the_next_sync() -> TestResult {
    let (d, g) = setup()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let t = d.stream_create(g).ctx("STREAM_CREATE T")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    for how in ["STREAM_SYNC of T", "EVENT_SYNC of an event recorded on T"] {
        let s = d.stream_create(g).ctx("STREAM_CREATE S")?.handle;
        let (first, _) = submit(
            &d,
            s,
            vec![op::alloc(p, SIZE, false), op::free_index(0)],
            "ALLOC + FREE on S",
        )?;
        reached(&d, s, first + 1, &format!("{how}: S's FREE"))?;
        pool_is(
            &d,
            p,
            (0, 1, 0),
            &format!("{how}: S reached its FREE, not synchronized"),
        )?;
        d.stream_destroy(s).ctx("STREAM_DESTROY S")?;
        pool_is(&d, p, (0, 1, 0), &format!("{how}: S destroyed"))?;
        check!(
            live(&d)?[POOL_PENDING] == before[POOL_PENDING] + 1,
            "{how}: the audit does not count the destroyed stream's pending chunk"
        );
        match how {
            "STREAM_SYNC of T" => d.stream_sync(t, WAIT_MS).ctx(how)?,
            _ => {
                submit(&d, t, vec![op::record(e)], "RECORD on T")?;
                d.event_sync(e, WAIT_MS).ctx(how)?;
            }
        }
        pool_is(
            &d,
            p,
            (0, 0, 1),
            &format!("{how}: the destroyed stream's free was not cached"),
        )?;
        check!(
            live(&d)?[POOL_PENDING] == before[POOL_PENDING],
            "{how}: the audit still counts a pending chunk"
        );
    }
    d.event_destroy(e).ctx("EVENT_DESTROY")?;
    d.stream_destroy(t).ctx("STREAM_DESTROY T")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
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
