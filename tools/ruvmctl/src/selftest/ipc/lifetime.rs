// SPDX-License-Identifier: GPL-2.0

//! Shared chunks' lifetime: the exporter freeing or closing first, a stream's free, pointer
//! attributes of an imported mem.

use super::*;

/// The exporter frees first (CUDA's rule broken): the import keeps reading the bytes, the
/// pool keeps the chunks used (no new mem of the pool gets them), the log says so once; the
/// import's free then gives them back.
pub(super) fn ipc_exporter_frees_first_chunks_live_on() -> TestResult {
    let d = setup()?;
    let before = counts(&d)?;
    let marker = kmsg::write_marker().ok();
    let (p, q, map) = exported_mem(&d, 21)?;
    let (fd, _data, other, _ip, m) = imported(&d, p, q.handle)?;
    let mq = other.mem_query(m.handle).ctx("MEM_QUERY")?;
    let view = UserMap::of_mem(&other, &mq).ctx("mmap of the import")?;
    drop(map);
    d.mem_free(q.handle).ctx("MEM_FREE by the exporter")?;
    let info = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        info.used_current == SIZE,
        "after the exporter's free the pool's used is {}",
        info.used_current
    );
    // Every new mem of the pool gets other chunks: writing them leaves the import's bytes.
    let mut fresh = Vec::new();
    for i in 0..4 {
        let h = d
            .pool_alloc(p, SIZE, 0)
            .ctx("MEM_ALLOC from the pool")?
            .handle;
        let fq = d.mem_query(h).ctx("MEM_QUERY")?;
        let fm = UserMap::of_mem(&d, &fq).ctx("mmap")?;
        write_pattern(&fm, 0, SIZE, 100 + i);
        fresh.push((h, fm));
    }
    let bad = bad_bytes(&view, 0, SIZE, 21);
    check!(
        bad == 0,
        "{bad} bytes of the import changed after the exporter freed and reallocated"
    );
    for (h, fm) in fresh {
        drop(fm);
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    let said = order_broken_since(marker.as_deref())?;
    if kmsg::read_kmsg().is_ok() {
        check!(
            said == 1,
            "the log said the order was broken {said} times, wanted once"
        );
    }
    // A trim gives back what is cached, never the chunks the import holds.
    d.pool_trim(p, 0).ctx("POOL_TRIM")?;
    let info = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        info.reserved_current == SIZE && info.used_current == SIZE,
        "after a trim with the import alive: reserved {} used {}, wanted {SIZE} and {SIZE}",
        info.reserved_current,
        info.used_current
    );
    check!(
        bad_bytes(&view, 0, SIZE, 21) == 0,
        "the import's bytes changed with the trim"
    );
    drop(view);
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    // The release threshold (0) holds for an exported pool too (CUDA's never gives back).
    let info = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        info.used_current == 0 && info.reserved_current == 0,
        "after the import's free the pool's used is {} and reserved {} (threshold 0)",
        info.used_current,
        info.reserved_current
    );
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drop((other, fd));
    unchanged(&d, &before)?;
    Ok(())
}

/// The exporter's file closes (its pool and mem with it) while an import lives: the import
/// reads the bytes (mapping and copy engine), and its free ends everything.
pub(super) fn ipc_exporter_closes_first_chunks_live_on() -> TestResult {
    let d = setup()?;
    let before = counts(&d)?;
    let g = copy_gpu(&d)?;
    let exporter = Ruvm::open().ctx("open the exporter's file")?;
    let (p, _q, map) = exported_mem(&exporter, 31)?;
    let fd = exporter.pool_export(p).ctx("POOL_EXPORT")?;
    let (_, data) = exporter.mem_export(_q.handle).ctx("MEM_EXPORT")?;
    let ip = d.pool_import(fd.as_fd()).ctx("POOL_IMPORT")?;
    let m = d.mem_import(ip, &data).ctx("MEM_IMPORT")?;
    drop(map);
    drop(exporter);
    // The pool was closed with its file: its descriptor imports nothing more
    // into a file that has it not; one that has it already keeps it, and the pool's mems are
    // not imported through it any more.
    let third = Ruvm::open().ctx("open a third file")?;
    expect_errno(
        third.pool_import(fd.as_fd()),
        Errno::ENOENT,
        "POOL_IMPORT into a new file after the exporter closed",
    )?;
    let again = d
        .pool_import(fd.as_fd())
        .ctx("POOL_IMPORT again into the importing file")?;
    check!(again == ip, "the import again answered {again}, not {ip}");
    expect_errno(
        d.mem_import(ip, &data),
        Errno::ENOENT,
        "MEM_IMPORT through the pool after its file closed",
    )?;
    drop(third);
    let mq = d.mem_query(m.handle).ctx("MEM_QUERY of the import")?;
    let view = UserMap::of_mem(&d, &mq).ctx("mmap of the import")?;
    let bad = bad_bytes(&view, 0, SIZE, 31);
    check!(
        bad == 0,
        "{bad} bytes of the import changed when the exporter closed"
    );
    if let Some(g) = g {
        let bad = engine_copy_bad_bytes(&d, g, m.handle, 31).map_err(Stop::Fail)?;
        check!(
            bad == 0,
            "the copy engine read {bad} wrong bytes from the import"
        );
    }
    drop(view);
    d.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    d.pool_destroy(ip).ctx("POOL_DESTROY of the import")?;
    drop(fd);
    unchanged(&d, &before)?;
    Ok(())
}

/// A FREE in a failed submission withdraws a mem's export data. A free on a stream of an
/// exported mem while an import lives, followed in the same submission by an allocation from
/// the pool (which would borrow the freed chunks): the new mem
/// gets other chunks, and writing it leaves the import's bytes.
pub(super) fn ipc_stream_free_never_hands_imported_chunks() -> TestResult {
    let d = setup()?;
    let Ok(g) = super::super::shared::sim_gpu(&d) else {
        return Err(Stop::Skip(
            "no simulated GPU (sim_gpus=N) for a stream".into(),
        ));
    };
    if d.info().ctx("INFO")?.features & u64::from(uapi::RUVM_FEATURE_STREAM_ALLOC) == 0 {
        return Err(Stop::Skip("no stream-ordered allocation".into()));
    }
    let before = counts(&d)?;
    let (p, q, map) = exported_mem(&d, 41)?;
    d.pool_access(p, g, true).ctx("POOL_SET_ACCESS")?;
    let (fd, _data, other, _ip, m) = imported(&d, p, q.handle)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    // A FREE in a submission that fails still withdraws the mem: it has no export data
    // after, never exported or exported (an export racing the planning of a FREE and an ALLOC
    // that borrows its chunks would otherwise share them with an import).
    for exported_before in [false, true] {
        let x = d.pool_alloc(p, SIZE, 0).ctx("MEM_ALLOC")?.handle;
        if exported_before {
            d.mem_export(x).ctx("MEM_EXPORT")?;
        }
        let mut failing = vec![
            libruvm::op::free(x),
            libruvm::op::alloc(p, SIZE, false),
            libruvm::op::copy(u64::MAX, 0, x, 0, SIZE),
        ];
        check!(
            d.stream_submit_mut(s, &mut failing).is_err(),
            "a submission copying into no mem was queued"
        );
        expect_errno(
            d.mem_export(x).map(drop),
            Errno::ENOENT,
            &format!("MEM_EXPORT after a failed FREE (exported before: {exported_before})"),
        )?;
        d.mem_free(x).ctx("MEM_FREE")?;
    }
    let mut ops = vec![
        libruvm::op::free(q.handle),
        libruvm::op::alloc(p, SIZE, false),
    ];
    drop(map);
    d.stream_submit_mut(s, &mut ops)
        .ctx("STREAM_SUBMIT of FREE, ALLOC")?;
    let (h, _) = libruvm::op::allocated(&ops[1]);
    d.stream_sync(s, 20_000).ctx("STREAM_SYNC")?;
    let hq = d.mem_query(h).ctx("MEM_QUERY of the new mem")?;
    let fresh = UserMap::of_mem(&d, &hq).ctx("mmap of the new mem")?;
    write_pattern(&fresh, 0, SIZE, 42);
    drop(fresh);
    let mq = other.mem_query(m.handle).ctx("MEM_QUERY of the import")?;
    let view = UserMap::of_mem(&other, &mq).ctx("mmap of the import")?;
    let bad = bad_bytes(&view, 0, SIZE, 41);
    check!(
        bad == 0,
        "{bad} bytes of the import were overwritten through the allocation after the free"
    );
    let a = d
        .dma_addrs(h, g, 0, 64)
        .ctx("MEM_DMA_ADDRS of the new mem")?;
    other
        .mem_gpu(true, m.handle, g)
        .ctx("MEM_MAP_GPU of the import")?;
    let b = other
        .dma_addrs(m.handle, g, 0, 64)
        .ctx("MEM_DMA_ADDRS of the import")?;
    check!(
        a.iter().all(|x| !b.contains(x)),
        "the new mem shares chunks with the import: {a:x?} / {b:x?}"
    );
    drop(view);
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    d.mem_free(h).ctx("MEM_FREE of the new mem")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drop((other, fd));
    unchanged(&d, &before)?;
    Ok(())
}

/// Pointer attributes of an imported mem's mapping: the importer's handle, the exporting pool,
/// RUVM_PTR_IMPORTED; the exporter's own mapping is not flagged.
pub(super) fn ipc_ptr_attrs_of_an_imported_mem() -> TestResult {
    let d = setup()?;
    let (p, q, map) = exported_mem(&d, 51)?;
    let (_fd, _data, other, _ip, m) = imported(&d, p, q.handle)?;
    let mq = other.mem_query(m.handle).ctx("MEM_QUERY")?;
    check!(
        mq.mmap_offset == m.mmap_offset && mq.size == SIZE,
        "MEM_QUERY of the import: {mq:?}"
    );
    let view = UserMap::of_mem(&other, &mq).ctx("mmap")?;
    let at = view.as_ptr() as u64 + 100;
    let a = other.ptr_attrs(at).ctx("PTR_ATTRS in the importer")?;
    check!(
        a.type_ == uapi::ruvm_ptr_type_RUVM_PTR_MEM
            && a.handle == m.handle
            && a.offset == 100
            && a.pool == p
            && a.ptr_flags == uapi::ruvm_ptr_flags_RUVM_PTR_IMPORTED
            && a.size == SIZE,
        "the import's byte 100: {a:?}"
    );
    let mine = d
        .ptr_attrs(map.as_ptr() as u64 + 100)
        .ctx("PTR_ATTRS in the exporter")?;
    check!(
        mine.handle == q.handle && mine.pool == p && mine.ptr_flags == 0,
        "the exporter's byte 100: {mine:?}"
    );
    drop(view);
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    drop(map);
    d.mem_free(q.handle).ctx("MEM_FREE")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    Ok(())
}
