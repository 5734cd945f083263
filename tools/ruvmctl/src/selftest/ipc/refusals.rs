// SPDX-License-Identifier: GPL-2.0

//! What an importer may not do: allocate from an imported pool; forged, stale and foreign
//! export data refused.

use super::*;

/// An imported pool (in another file of this process) serves POOL_GET, MEM_IMPORT and
/// POOL_DESTROY only: allocations, GPU_POOL, POOL_SET, POOL_TRIM and POOL_SET_ACCESS are
/// EINVAL; importing it again (or into its own file) answers the same handle; destroying it
/// in the importer leaves the exporter's pool as it was.
pub(super) fn ipc_imported_pool_cannot_allocate() -> TestResult {
    let d = setup()?;
    let (p, q, map) = exported_mem(&d, 7)?;
    let fd = d.pool_export(p).ctx("POOL_EXPORT")?;
    let other = Ruvm::open().ctx("open a second file")?;
    let ip = other.pool_import(fd.as_fd()).ctx("POOL_IMPORT")?;
    check!(ip == p, "the import's handle {ip} is not the pool's {p}");
    let again = other.pool_import(fd.as_fd()).ctx("POOL_IMPORT again")?;
    check!(again == p, "a second import answered {again}");
    let own = d
        .pool_import(fd.as_fd())
        .ctx("POOL_IMPORT into its own file")?;
    check!(
        own == p,
        "an import into the pool's own file answered {own}"
    );
    let mine = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        mine.pool_flags == FLAG_EXPORTABLE,
        "the exporter's pool flags are {:#x}",
        mine.pool_flags
    );
    let theirs = other.pool_get(ip).ctx("POOL_GET of the import")?;
    check!(
        theirs.pool_flags == FLAG_EXPORTABLE | FLAG_IMPORTED
            && theirs.used_current == mine.used_current
            && theirs.reserved_current == mine.reserved_current
            && theirs.chunk_size == mine.chunk_size,
        "the import's attributes {theirs:?} are not the pool's {mine:?} with IMPORTED"
    );
    let e = Errno::EINVAL;
    expect_errno(
        other.pool_alloc(ip, SIZE, 0),
        e,
        "MEM_ALLOC from an imported pool",
    )?;
    expect_errno(
        other.pool_set(ip, uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RELEASE_THRESHOLD, 0),
        e,
        "POOL_SET",
    )?;
    expect_errno(other.pool_trim(ip, 0), e, "POOL_TRIM")?;
    expect_errno(other.pool_access(ip, 0, true), e, "POOL_SET_ACCESS")?;
    expect_errno(
        other.pool_export(ip).map(drop),
        e,
        "POOL_EXPORT of an imported pool",
    )?;
    if let Ok(g) = super::super::shared::sim_gpu(&other) {
        expect_errno(
            other.gpu_pool_set(g, ip),
            e,
            "GPU_POOL SET of an imported pool",
        )?;
        if let Ok(s) = other.stream_create(g) {
            let mut ops = vec![libruvm::op::alloc(ip, SIZE, false)];
            expect_errno(
                other.stream_submit_mut(s.handle, &mut ops),
                e,
                "RUVM_OP_ALLOC from an imported pool",
            )?;
            other.stream_destroy(s.handle).ctx("STREAM_DESTROY")?;
        }
    }
    other.pool_destroy(ip).ctx("POOL_DESTROY of the import")?;
    expect_errno(
        other.pool_get(ip),
        Errno::ENOENT,
        "POOL_GET after the import's destroy",
    )?;
    let still = d.pool_get(p).ctx("POOL_GET of the exporter's pool")?;
    check!(
        still.used_current == SIZE,
        "the exporter's pool after the import's destroy: {still:?}"
    );
    // A non-exportable pool is not exported; another kind of descriptor is not a pool's.
    let (plain, _) = d.pool_create(0, 0).ctx("POOL_CREATE")?;
    expect_errno(
        d.pool_export(plain).map(drop),
        e,
        "POOL_EXPORT of a pool made without EXPORTABLE",
    )?;
    expect_errno(
        d.pool_export(0xdead_beef).map(drop),
        Errno::ENOENT,
        "POOL_EXPORT of no pool of the file",
    )?;
    expect_errno(
        other.pool_export(p).map(drop),
        Errno::ENOENT,
        "POOL_EXPORT of the handle of an import destroyed",
    )?;
    let null = std::fs::File::open("/dev/null").ctx("/dev/null")?;
    expect_errno(
        other.pool_import(null.as_fd()),
        e,
        "POOL_IMPORT of /dev/null",
    )?;
    expect_errno(
        other.pool_import(d.as_fd()),
        e,
        "POOL_IMPORT of a /dev/ruvm file",
    )?;
    expect_errno(
        other.pool_import_raw(-1),
        Errno::EBADF,
        "POOL_IMPORT of fd -1",
    )?;
    expect_errno(
        other.pool_import_raw(100_000),
        Errno::EBADF,
        "POOL_IMPORT of a closed fd",
    )?;
    drop(map);
    d.mem_free(q.handle).ctx("MEM_FREE")?;
    d.pool_destroy(plain).ctx("POOL_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    // The pool is gone: its descriptor imports nothing.
    expect_errno(
        other.pool_import(fd.as_fd()),
        Errno::ENOENT,
        "POOL_IMPORT of a destroyed pool",
    )?;
    Ok(())
}

/// Export data is refused unless it names a live exported mem of the pool it is imported
/// through, with the right key: forged keys, another pool's data, a freed mem's, a corrupted
/// version, and mems that cannot be exported.
pub(super) fn ipc_forged_stale_and_foreign_data_refused() -> TestResult {
    let d = setup()?;
    let before = counts(&d)?;
    let (p, q, map) = exported_mem(&d, 9)?;
    let (p2, q2, map2) = exported_mem(&d, 10)?;
    let fd = d.pool_export(p).ctx("POOL_EXPORT")?;
    let other = Ruvm::open().ctx("open a second file")?;
    let ip = other.pool_import(fd.as_fd()).ctx("POOL_IMPORT")?;
    let (pool_of, data) = d.mem_export(q.handle).ctx("MEM_EXPORT")?;
    check!(pool_of == p, "MEM_EXPORT names pool {pool_of}, not {p}");
    let (_, data2) = d
        .mem_export(q2.handle)
        .ctx("MEM_EXPORT of the other pool's mem")?;
    let n = Errno::ENOENT;
    for byte in 24..40 {
        let mut forged = data;
        forged[byte] ^= 0x5a;
        expect_errno(
            other.mem_import(ip, &forged),
            n,
            &format!("MEM_IMPORT with key byte {byte} changed"),
        )?;
    }
    let mut forged = data;
    forged[16] ^= 1;
    expect_errno(
        other.mem_import(ip, &forged),
        n,
        "MEM_IMPORT naming another mem",
    )?;
    expect_errno(
        other.mem_import(ip, &data2),
        n,
        "MEM_IMPORT of another pool's data",
    )?;
    let mut forged = data;
    forged[0] ^= 1;
    expect_errno(
        other.mem_import(ip, &forged),
        Errno::EINVAL,
        "MEM_IMPORT with a wrong version",
    )?;
    let mut forged = data;
    forged[63] = 1;
    expect_errno(
        other.mem_import(ip, &forged),
        Errno::EINVAL,
        "MEM_IMPORT with a non-zero tail",
    )?;
    expect_errno(
        other.mem_import(ip + 1_000_000, &data),
        n,
        "MEM_IMPORT through no pool",
    )?;
    // The right data imports; the imported mem cannot be exported again.
    let m = other.mem_import(ip, &data).ctx("MEM_IMPORT")?;
    expect_errno(
        other.mem_export(m.handle),
        Errno::EINVAL,
        "MEM_EXPORT of an imported mem",
    )?;
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    // A mem of no pool, or of a pool that is not exportable, has no export data.
    let plain = d.mem_alloc(SIZE, 0, 0).ctx("MEM_ALLOC")?.handle;
    expect_errno(
        d.mem_export(plain),
        Errno::EINVAL,
        "MEM_EXPORT of a mem of no pool",
    )?;
    let (np, _) = d.pool_create(0, 0).ctx("POOL_CREATE")?;
    let pm = d.pool_alloc(np, SIZE, 0).ctx("MEM_ALLOC from it")?.handle;
    expect_errno(
        d.mem_export(pm),
        Errno::EINVAL,
        "MEM_EXPORT of a non-exportable pool's mem",
    )?;
    expect_errno(
        d.mem_import(np, &data),
        Errno::EINVAL,
        "MEM_IMPORT through a non-exportable pool",
    )?;
    expect_errno(d.mem_export(u64::MAX), n, "MEM_EXPORT of no mem")?;
    // Freed: its data is stale, and its handle exports nothing.
    drop(map);
    d.mem_free(q.handle).ctx("MEM_FREE")?;
    expect_errno(
        other.mem_import(ip, &data),
        n,
        "MEM_IMPORT of a freed mem's data",
    )?;
    drop(map2);
    for h in [q2.handle, plain, pm] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    for pool in [p, p2, np] {
        d.pool_destroy(pool).ctx("POOL_DESTROY")?;
    }
    drop((other, fd));
    unchanged(&d, &before)?;
    Ok(())
}
