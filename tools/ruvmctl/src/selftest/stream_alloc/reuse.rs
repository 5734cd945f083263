// SPDX-License-Identifier: GPL-2.0

//! Reuse by the stream that freed, and across streams under CUDA's three policies.

use super::*;

// --- the same stream -----------------------------------------------------------------------

/// A free queued on stream S, not reached (S held before it), gives its chunk to the next ALLOC
/// on S at once: S's order keeps the two uses apart. The pool counts the chunk pending between
/// the two, and the reuse as a hit.
pub(super) fn salloc_same_stream_reuses_at_once() -> TestResult {
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
pub(super) enum Free {
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
pub(super) fn reuse_row(g: u32, reuse: u32, state: Free, same: bool) -> TestResult {
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
pub(super) fn salloc_reuse_follows_event_dependencies() -> TestResult {
    let (_d, g) = setup()?;
    reuse_row(g, FOLLOW, Free::HeldFollowed, true)?;
    reuse_row(g, OPPORTUNISTIC | INTERNAL, Free::HeldFollowed, false)
}

/// ALLOW_OPPORTUNISTIC: A ran past its free (STREAM_QUERY, no synchronize): B gets m1's chunk
/// with no dependency. Every policy off: new memory. On, but A held before its free: new
/// memory.
pub(super) fn salloc_reuse_opportunistic_once_the_free_is_reached() -> TestResult {
    let (_d, g) = setup()?;
    reuse_row(g, OPPORTUNISTIC, Free::Reached, true)?;
    reuse_row(g, 0, Free::Reached, false)?;
    reuse_row(g, OPPORTUNISTIC, Free::Held, false)
}

/// ALLOW_INTERNAL_DEPENDENCIES with memory to spare: new memory (a dependency is the last
/// resort).
pub(super) fn salloc_reuse_internal_dependencies_only_without_memory() -> TestResult {
    let (_d, g) = setup()?;
    reuse_row(g, INTERNAL, Free::Held, false)
}

/// A free observed by a synchronize is cached: any allocation takes it, every policy off.
pub(super) fn salloc_reuse_after_synchronize_needs_no_policy() -> TestResult {
    let (_d, g) = setup()?;
    reuse_row(g, 0, Free::Synced, true)
}

/// Fills file `d`'s quota with plain mems until not even 4 KiB more fits: their handles.
pub(super) fn fill_quota(d: &Ruvm, max_alloc: u64) -> Result<Vec<u64>, Stop> {
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
pub(super) fn salloc_reuse_internal_dependencies_when_the_quota_is_full() -> TestResult {
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
pub(super) fn pool_state(d: &Ruvm, p: u64) -> Result<[u64; 11], Stop> {
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
