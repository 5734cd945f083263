// SPDX-License-Identifier: GPL-2.0

//! Regressions: a mapped mem, GPU VA mappings and a destroyed stream's frees.

use super::*;

// --- regressions: a mapped mem, GPU VA mappings, a destroyed stream --------------------------

/// Checks pool `p`'s counts, in chunks of [`SIZE`]: `used`, `pending` and `cached`, and
/// reserved their sum.
pub(super) fn pool_is(
    d: &Ruvm,
    p: u64,
    (used, pending, cached): (u64, u64, u64),
    what: &str,
) -> TestResult {
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
pub(super) fn freed_mapping_answers(
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
pub(super) fn salloc_free_of_a_mapped_mem_keeps_its_chunks_until_unmapped() -> TestResult {
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
pub(super) const GPU_USER_VA: u64 = 0x20_0000_0000;

/// A pool mem mapped at a GPU user VA (`MEM_MAP_GPU_USER`) and freed by a FREE queued behind a
/// gate, after a COPY_VA that reads it through that VA: its GPU mapping and the DMA table under
/// it stay until the stream reaches the free, whatever happens to the pool meanwhile. Its GPU
/// is revoked from the pool (whose cached and pending chunks' tables for the GPU go), then the
/// pool is destroyed (no mem of it holds chunks: the freed one's are pending, so no `EBUSY`;
/// its pending frees are dropped). Released, the copy completes without a fault and its
/// bytes are the mem's, and once everything is done nothing is left.
pub(super) fn salloc_free_keeps_gpu_va_mappings_until_reached() -> TestResult {
    let (d, g) = setup()?;
    need_mmu(&d, g)?;
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
    super::super::shared::fill(&d, m, SIZE, seed)?;
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
pub(super) fn salloc_destroyed_streams_frees_are_cached_at_the_next_sync() -> TestResult {
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
