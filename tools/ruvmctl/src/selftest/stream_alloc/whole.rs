// SPDX-License-Identifier: GPL-2.0

//! An `ALLOC` right after a `FREE` (by index) of a mem of its own submission, asking for what
//! it frees (the same pool, length and flags), takes the freed mem whole: the same chunks and
//! mmap offset under a new handle, counted as a free and an allocation, undone with its
//! submission. And a FREE on an idle stream is reached before `STREAM_SUBMIT` returns.

use nix::errno::Errno;

use super::super::harness::{check, expect_errno, Context, Stop, TestResult};
use super::super::shared::live;
use super::super::streams::{drained, mem_on, user_mismatches, STREAM_MEMS, STREAM_OPS, WAIT_MS};
use super::{
    alloc_on, chunks, expect_reuse, made, pool_for, settled, setup, submit, ALL, OPPORTUNISTIC,
    SIZE,
};
use crate::pattern;
use libruvm::{op, uapi, Ruvm};

/// The audit's class of pools.
const POOLS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_POOLS as usize;

/// The seed of what the cases copy into the first mem.
const SEED: u64 = 0x6d1e_02c4_b7a9_35f8;

/// The sysmem statistics (`RUVM_IOCTL_STATS`).
fn sys_stats(d: &Ruvm) -> Result<uapi::ruvm_stats, Stop> {
    d.stats(false).ctx("RUVM_IOCTL_STATS")
}

/// (`ALLOC`, `COPY` the pattern into it, `FREE` it, `ALLOC` as much): the second `ALLOC` takes
/// the first's mem whole. Its mmap offset is the first's, its handle another (the first's
/// names nothing), and it holds the bytes the copy wrote (read through a user mapping), or
/// zeros with `RUVM_ALLOC_ZERO` (zeroed in the stream, after the copy). The pool counts two
/// allocations and one chunk used; the statistics an allocation and a free more than a plain
/// allocation.
pub(super) fn salloc_whole_takes_the_freed_mem() -> TestResult {
    let (d, g) = setup()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let src = mem_on(&d, g, SIZE, Some(SEED))?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    for zero in [false, true] {
        let what = if zero {
            "with RUVM_ALLOC_ZERO"
        } else {
            "without RUVM_ALLOC_ZERO"
        };
        // The last case's mem gone whole, so that the statistics move for this one only.
        drained(&d, what)?;
        let pool0 = d.pool_get(p).ctx("POOL_GET")?;
        let stats0 = sys_stats(&d)?;
        let ops = vec![
            op::alloc(p, SIZE, zero),
            op::with_dst_index(op::copy(0, 0, src, 0, SIZE), 0),
            op::free_index(0),
            op::alloc(p, SIZE, zero),
        ];
        let (first, ops) = submit(&d, s, ops, &format!("{what}: ALLOC + COPY + FREE + ALLOC"))?;
        let stats1 = sys_stats(&d)?;
        let (h0, off0) = op::allocated(&ops[0]);
        let m = made(&d, &ops, 3, &format!("{what}: the second ALLOC"))?;
        let (_, off3) = op::allocated(&ops[3]);
        check!(
            h0 != 0 && h0 != m && off3 == off0,
            "{what}: the first ALLOC wrote handle {h0} offset {off0:#x}, the second {m} offset {off3:#x}: wanted two handles and the same offset (the mem taken whole)"
        );
        expect_errno(
            d.mem_query(h0),
            Errno::ENOENT,
            &format!("{what}: MEM_QUERY of the first mem, freed"),
        )?;
        let pool1 = d.pool_get(p).ctx("POOL_GET")?;
        check!(
            pool1.hits + pool1.misses == pool0.hits + pool0.misses + 2
                && pool1.hits > pool0.hits
                && pool1.used_current == SIZE
                && pool1.reserved_current == SIZE
                && pool1.pending_bytes == 0
                && pool1.cached_chunks == 0
                && pool1.used_high == SIZE,
            "{what}: the pool after the submission: {pool1:?} (before {pool0:?}), wanted two more hits and misses, at least one a hit, one chunk used and reserved, none pending or cached"
        );
        check!(
            stats1.allocs == stats0.allocs + 2
                && stats1.frees == stats0.frees + 1
                && stats1.mems == stats0.mems + 1,
            "{what}: RUVM_IOCTL_STATS after the submission: {stats1:?} (before {stats0:?}), wanted two more allocations, one more free, one more mem"
        );
        d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
        let q = d.stream_query(s).ctx("STREAM_QUERY")?;
        check!(
            q.error == 0 && q.completed == first + 3,
            "{what}: the stream after the submission: {q:?}, wanted seqno {} completed",
            first + 3
        );
        let want = |o: u64| {
            if zero {
                0
            } else {
                pattern::byte_at(SEED, o)
            }
        };
        let (bad, at) = user_mismatches(&d, m, SIZE, want)?;
        check!(
            bad == 0,
            "{what}: {bad} bytes of the second mem are not {}, the first at {at:?}",
            if zero {
                "zero"
            } else {
                "what the copy wrote into the first"
            }
        );
        d.mem_free(m).ctx("MEM_FREE")?;
    }
    d.mem_free(src).ctx("MEM_FREE")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
}

/// A submission that takes mems whole and then fails (an operation names a mem a `FREE` of it
/// freed: `ENOENT`) changes nothing: the pool's attributes and the audit are as before, and
/// the statistics count each of its allocations as an allocation and a free. The same pairs
/// without the bad operation then run, and leave one chunk pending, then cached.
pub(super) fn salloc_whole_undone_by_a_failed_submission() -> TestResult {
    let (d, g) = setup()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let out = mem_on(&d, g, SIZE, None)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    // A chunk in the cache, so that the first ALLOC is a hit.
    let warm = d
        .pool_alloc(p, SIZE, 0)
        .ctx("MEM_ALLOC from the pool")?
        .handle;
    d.mem_free(warm).ctx("MEM_FREE")?;
    let pool0 = d.pool_get(p).ctx("POOL_GET")?;
    let stats0 = sys_stats(&d)?;
    let live0 = live(&d)?;
    let pairs = |n: usize| -> Vec<uapi::ruvm_op> {
        (0..n)
            .flat_map(|i| [op::alloc(p, SIZE, false), op::free_index(2 * i)])
            .collect()
    };
    let mut ops = pairs(3);
    ops.push(op::with_src_index(op::copy(out, 0, 0, 0, SIZE), 0));
    let mut bad = ops.clone();
    expect_errno(
        d.stream_submit_mut(s, &mut bad),
        Errno::ENOENT,
        "three (ALLOC, FREE) pairs and a COPY from the first mem, freed",
    )?;
    let pool1 = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        format!("{pool1:?}") == format!("{pool0:?}"),
        "the pool after the failed submission: {pool1:?}, wanted it as before: {pool0:?}"
    );
    let stats1 = sys_stats(&d)?;
    check!(
        stats1.allocs == stats0.allocs + 3
            && stats1.frees == stats0.frees + 3
            && stats1.mems == stats0.mems
            && stats1.reserved_bytes == stats0.reserved_bytes
            && stats1.used_bytes == stats0.used_bytes,
        "RUVM_IOCTL_STATS after the failed submission: {stats1:?} (before {stats0:?}), wanted three more allocations and frees, the rest as before"
    );
    let live1 = live(&d)?;
    check!(
        live1 == live0,
        "the audit after the failed submission: {live1:?}, wanted it as before: {live0:?}"
    );
    let n = 64;
    let (first, _) = submit(&d, s, pairs(n), "64 (ALLOC, FREE) pairs")?;
    let pool2 = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        pool2.hits == pool0.hits + n as u64
            && pool2.misses == pool0.misses
            && pool2.used_current == 0
            && pool2.used_high == pool0.used_high
            && pool2.reserved_current == SIZE
            && pool2.reserved_high == pool0.reserved_high
            && pool2.pending_bytes + pool2.cached_chunks * SIZE == SIZE,
        "the pool after 64 pairs: {pool2:?} (before {pool0:?}), wanted 64 more hits, no miss, nothing used, one chunk reserved (pending or cached), the high watermarks as before"
    );
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.error == 0 && q.completed == first + 2 * n as u64 - 1,
        "the stream after the pairs: {q:?}, wanted seqno {} completed",
        first + 2 * n as u64 - 1
    );
    let pool3 = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        pool3.pending_bytes == 0 && pool3.cached_chunks == 1 && pool3.used_current == 0,
        "the pool after STREAM_SYNC: {pool3:?}, wanted the chunk cached"
    );
    d.mem_free(out).ctx("MEM_FREE")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
}

/// A FREE by index that names no earlier ALLOC, before an ALLOC of the GPU's current pool
/// (`src` 0) on a file that has no default pool yet: `EINVAL`, and no pool made (the FREE
/// looks up no pool to take a mem whole).
pub(super) fn salloc_whole_failed_pair_makes_no_pool() -> TestResult {
    let (d, g) = setup()?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let before = live(&d)?;
    let mut ops = vec![op::free_index(0), op::alloc(0, SIZE, false)];
    expect_errno(
        d.stream_submit_mut(s, &mut ops),
        Errno::EINVAL,
        "a FREE of index 0 (itself) before an ALLOC of the current pool",
    )?;
    let after = live(&d)?;
    check!(
        after[POOLS] == before[POOLS],
        "the audit counts {} pools after the failed submission, {} before: a default pool was made",
        after[POOLS],
        before[POOLS]
    );
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drained(&d, "at the end")
}

/// A FREE on a stream with nothing queued is reached, retired and dropped by the submitting
/// thread: right after `STREAM_SUBMIT`, `STREAM_QUERY` has it completed, the audit has no
/// queued operation or mem held by one, the pool has the chunk pending (no synchronize
/// observed it), and an ALLOC on another stream (opportunistic reuse on) gets that chunk at
/// once.
pub(super) fn salloc_free_on_an_idle_stream_is_reached_at_submit() -> TestResult {
    let (d, g) = setup()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, OPPORTUNISTIC)?;
    let a = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let b = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let m = alloc_on(&d, a, p, SIZE, "m")?;
    let freed = chunks(&d, m, g, "m")?;
    d.stream_sync(a, WAIT_MS).ctx("STREAM_SYNC")?;
    let first = d
        .stream_submit(a, &[op::free(m)])
        .ctx("STREAM_SUBMIT of the FREE")?;
    let q = d.stream_query(a).ctx("STREAM_QUERY")?;
    check!(
        q.submitted == first && q.completed == first && q.error == 0,
        "a FREE on an idle stream, right after the submit: {q:?}, wanted seqno {first} completed"
    );
    let l = live(&d)?;
    check!(
        l[STREAM_OPS] == 0 && l[STREAM_MEMS] == 0,
        "right after the submit the audit counts {} queued operations and {} mems they hold, wanted none",
        l[STREAM_OPS],
        l[STREAM_MEMS]
    );
    let info = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        info.pending_bytes == SIZE && info.used_current == 0 && info.cached_chunks == 0,
        "the pool right after the submit: {info:?}, wanted the chunk pending"
    );
    let m2 = alloc_on(&d, b, p, SIZE, "m2 on another stream")?;
    let got = chunks(&d, m2, g, "m2")?;
    expect_reuse(
        &got,
        &freed,
        true,
        "an ALLOC on another stream, opportunistic reuse on, after the free was reached at submit",
    )?;
    d.stream_sync(b, WAIT_MS).ctx("STREAM_SYNC")?;
    d.mem_free(m2).ctx("MEM_FREE")?;
    for s in [a, b] {
        d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    }
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
}
