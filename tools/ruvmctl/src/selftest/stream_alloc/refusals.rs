// SPDX-License-Identifier: GPL-2.0

//! Every refusal of a stream ALLOC or FREE, with its errno.

use super::*;

// --- refusals ------------------------------------------------------------------------------

/// Submits `o` raw: `count` operations at address `at`.
pub(super) fn submit_raw(d: &Ruvm, s: u64, count: usize, at: u64) -> Result<u64, Errno> {
    let mut a = uapi::ruvm_stream_submit {
        handle: s,
        count: count as u32,
        ops: at,
        ..Default::default()
    };
    d.call(cmd::STREAM_SUBMIT, &mut a).map(|()| a.first_seqno)
}

/// Submits `ops` from a page mapped read-only (written, then `mprotect(PROT_READ)`).
pub(super) fn submit_read_only(
    d: &Ruvm,
    s: u64,
    ops: &[uapi::ruvm_op],
) -> Result<Result<u64, Errno>, Stop> {
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
pub(super) fn poked(mut o: uapi::ruvm_op, field: &str) -> uapi::ruvm_op {
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
pub(super) fn salloc_bad_inputs() -> TestResult {
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
