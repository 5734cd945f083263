// SPDX-License-Identifier: GPL-2.0

//! The bytes of reused chunks, their charge, the release threshold and the pool's
//! footprint.

use super::*;

// --- data ----------------------------------------------------------------------------------

/// A free never hands out chunks that work queued before it still uses: A copies a pattern into
/// m1, is held, then would copy m1 out and free it; B (every policy on, but no event and A not
/// at its free) allocates as much and writes another pattern into its mem. Once A runs on, what
/// it copied out of m1 is A's pattern, byte for byte.
pub(super) fn salloc_free_never_hands_queued_chunks() -> TestResult {
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
pub(super) fn salloc_freed_chunks_keep_their_charge_while_pinned() -> TestResult {
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
pub(super) const ZERO_CASE_SEED: u64 = 0xa5c3_96e1_7b2d_4f18;

/// `RUVM_ALLOC_ZERO` zeroes a reused chunk when the stream reaches the ALLOC, after the work
/// queued before it: stream S, held by a gate, copies a pattern into m1 and frees it; still
/// held, S allocates m2 (m1's chunk: same-stream reuse, read from the DMA addresses) and copies
/// m2 out. With the flag, what comes out is zeroes (zeroing when the ALLOC was submitted
/// would have been overwritten by the copy into m1); without it, the pattern (a reused chunk
/// keeps the file's bytes, here the ones that copy wrote, in stream order). The output mem
/// holds another pattern going in, so a copy that did not run shows.
pub(super) fn salloc_zero_reuses_in_stream_order() -> TestResult {
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
pub(super) fn salloc_threshold_at_synchronize() -> TestResult {
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
pub(super) fn salloc_footprint_1000() -> TestResult {
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
        super::super::shared::same_but(&end, &before, super::super::shared::VIDMEM_KEPT),
        "the audit ends at {end:?}, began at {before:?}"
    );
    Ok(())
}

/// Checks a footprint loop's pool after its sync: exactly 1 MiB reserved and used at the
/// high, the first MiB's chunks its only misses, nothing pending or used (`what` ran).
pub(super) fn footprint_is_one_mib(info: uapi::ruvm_pool_info, what: &str) -> TestResult {
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
pub(super) fn salloc_footprint_1000_batched() -> TestResult {
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
        super::super::shared::same_but(&end, &before, super::super::shared::VIDMEM_KEPT),
        "the audit ends at {end:?}, began at {before:?}"
    );
    Ok(())
}
