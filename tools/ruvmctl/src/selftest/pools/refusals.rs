// SPDX-License-Identifier: GPL-2.0

//! Bad inputs to the pool ioctls; a close, and memory pressure, give a pool's cache back.

use super::*;

pub(super) fn pool_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let mut c = uapi::ruvm_pool_create {
        backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
        gpu: 31,
        ..Default::default()
    };
    expect_errno(
        d.call(cmd::POOL_CREATE, &mut c),
        Errno::ENODEV,
        "a vidmem pool of no GPU",
    )?;
    // A GPU without vidmem (loaded with `vidmem_mib=0`) has none to cache.
    let bare = d
        .gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .find(|g| g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0 && g.vidmem_size == 0);
    if let Some(g) = bare {
        c.gpu = g.id;
        expect_errno(
            d.call(cmd::POOL_CREATE, &mut c),
            Errno::ENXIO,
            &format!("a vidmem pool of GPU {} (no vidmem)", g.id),
        )?;
    }
    c.gpu = 0;
    c.backing = 7;
    expect_errno(d.call(cmd::POOL_CREATE, &mut c), Errno::EINVAL, "backing 7")?;
    c.backing = uapi::ruvm_backing_RUVM_BACKING_SYSMEM;
    c.gpu = 1;
    expect_errno(
        d.call(cmd::POOL_CREATE, &mut c),
        Errno::EINVAL,
        "a GPU for a sysmem pool",
    )?;
    for size in [3 * K, 4 * M_, 8 * K + 1] {
        expect_errno(
            d.pool_create(size, 0),
            Errno::EINVAL,
            &format!("page size {size}"),
        )?;
    }
    let (p, chunk) = d.pool_create(0, u64::MAX).ctx("POOL_CREATE default")?;
    check!(chunk == 4 * K, "default chunk size {chunk}");
    // Allocations that do not fit the pool.
    let mut a = uapi::ruvm_mem_alloc {
        size: 8 * K,
        pool: p,
        page_size: 8 * K,
        ..Default::default()
    };
    expect_errno(
        d.call(cmd::MEM_ALLOC, &mut a),
        Errno::EINVAL,
        "another chunk size",
    )?;
    a.page_size = 0;
    a.flags = uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK;
    expect_errno(d.call(cmd::MEM_ALLOC, &mut a), Errno::EINVAL, "a fallback")?;
    a.flags = 0;
    a.pool = 0xdead_beef;
    expect_errno(
        d.call(cmd::MEM_ALLOC, &mut a),
        Errno::ENOENT,
        "no such pool",
    )?;
    a.pool = p;
    a.size = 0;
    expect_errno(d.call(cmd::MEM_ALLOC, &mut a), Errno::EINVAL, "size 0")?;
    // Commands on unknown pools, and bad attributes.
    expect_errno(
        d.pool_get(0xdead_beef),
        Errno::ENOENT,
        "POOL_GET of no pool",
    )?;
    expect_errno(
        d.pool_destroy(0xdead_beef),
        Errno::ENOENT,
        "POOL_DESTROY of no pool",
    )?;
    expect_errno(
        d.pool_trim(0xdead_beef, 0),
        Errno::ENOENT,
        "POOL_TRIM of no pool",
    )?;
    // 4 to 6 are the reuse policies (values 0 and 1 only).
    for attr in [0, 7, 99] {
        expect_errno(
            d.pool_set(p, attr, 0),
            Errno::EINVAL,
            &format!("attribute {attr}"),
        )?;
    }
    for attr in [4, 5, 6] {
        expect_errno(
            d.pool_set(p, attr, 2),
            Errno::EINVAL,
            &format!("attribute {attr} set to 2"),
        )?;
    }
    // Ids up to 63 fit the access set: granting one that is not bound is ENODEV, revoking any
    // of them succeeds; 64 or more is ENODEV either way.
    for id in [31, 32, 40, 63] {
        expect_errno(
            d.pool_access(p, id, true),
            Errno::ENODEV,
            &format!("grant GPU {id} (not bound)"),
        )?;
        d.pool_access(p, id, false)
            .ctx(&format!("revoke GPU {id}, not in the set"))?;
    }
    for id in [64, 65, u32::MAX] {
        expect_errno(
            d.pool_access(p, id, true),
            Errno::ENODEV,
            &format!("grant GPU {id}"),
        )?;
        expect_errno(
            d.pool_access(p, id, false),
            Errno::ENODEV,
            &format!("revoke GPU {id}"),
        )?;
    }
    // Another file's pool is not this file's.
    let other = Ruvm::open().ctx("open")?;
    expect_errno(other.pool_get(p), Errno::ENOENT, "another file's pool")?;
    expect_errno(
        other.pool_destroy(p),
        Errno::ENOENT,
        "destroy another file's",
    )?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    expect_errno(d.pool_destroy(p), Errno::ENOENT, "destroy twice")
}

pub(super) const M_: u64 = 1024 * K;

pub(super) fn pool_close_gives_everything_back() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = live(&d)?;
    {
        let f = Ruvm::open().ctx("open")?;
        let (p, _) = f.pool_create(64 * K, u64::MAX).ctx("POOL_CREATE")?;
        if let Ok(g) = sim_gpu(&f) {
            f.pool_access(p, g, true).ctx("POOL_SET_ACCESS")?;
        }
        let a = f.pool_alloc(p, 256 * K, 0).ctx("alloc")?;
        let b = f.pool_alloc(p, 128 * K, ZERO).ctx("alloc")?;
        f.mem_free(a.handle).ctx("free")?;
        let _live = b;
        let (q, _) = f.pool_create(4 * K, u64::MAX).ctx("POOL_CREATE")?;
        let c = f.pool_alloc(q, 8 * K, 0).ctx("alloc")?;
        f.mem_free(c.handle).ctx("free")?;
        let l = live(&f)?;
        check!(
            l[POOLS] == before[POOLS] + 2 && l[POOL_CHUNKS] == before[POOL_CHUNKS] + 6,
            "pools {} pool_chunks {}",
            l[POOLS],
            l[POOL_CHUNKS]
        );
        // Closed with a live mem and cached chunks in both pools.
    }
    let after = live(&d)?;
    check!(
        after == before,
        "closing a file with pools changed the audit:\n# before {before:?}\n# after  {after:?}"
    );
    Ok(())
}

/// A pool holding a third of the guest's available memory in its cache, then reclaim (the root
/// memory cgroup's, or another process touching more anonymous memory than is available
/// without the cache, which must not be killed): the shrinker gives the cache back.
pub(super) fn pool_shrinks_under_memory_pressure() -> TestResult {
    const CHUNK: u64 = 2 * M_;
    let d = Ruvm::open().ctx("open")?;
    let (p, _) = d.pool_create(CHUNK, u64::MAX).ctx("POOL_CREATE")?;
    // With a GPU, the cached lists keep DMA tables, which the shrinker drops in reclaim.
    if let Ok(g) = sim_gpu(&d) {
        d.pool_access(p, g, true).ctx("POOL_SET_ACCESS")?;
    }
    let cached = (meminfo("MemAvailable")? / 3) & !(CHUNK - 1);
    let mut mems = Vec::new();
    let mut held = 0;
    while held < cached {
        match d.pool_alloc(p, 16 * CHUNK, 0) {
            Ok(a) => {
                held += 16 * CHUNK;
                mems.push(a.handle);
            }
            Err(e) => return Err(Stop::Fail(format!("filling the pool: {e}"))),
        }
    }
    for h in mems {
        d.mem_free(h).ctx("free")?;
    }
    let before = attrs(&d, p)?;
    check!(
        before.reserved == held && before.used == 0,
        "the pool does not hold what was freed: {before:?}"
    );
    // Reclaim as pressure makes it (`reclaim_root`): an eighth of the cache must come back.
    // Where the kernel has no `memory.reclaim`, a child touches more than is available without
    // the cache. (A half, and then a quarter, asked for that way beside make check's other
    // guests on a busy host, each once ended in the OOM killer with the whole cache given back:
    // reclaim under TCG is slow, and MemAvailable an estimate; an eighth did too, once.)
    let enough = || attrs(&d, p).is_ok_and(|a| a.reserved + held / 8 <= before.reserved);
    if !reclaim_root(held / 4, enough) {
        let want = meminfo("MemAvailable")? + held / 8;
        let status = touch_in_child(want, enough)?;
        let after = attrs(&d, p)?;
        check!(
            matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)),
            "the process touching {} MiB ended {status:?} (pool reserved {} MiB before, {} MiB after)",
            want >> 20,
            before.reserved >> 20,
            after.reserved >> 20
        );
    }
    let after = attrs(&d, p)?;
    check!(
        after.reserved + held / 8 <= before.reserved && after.used == 0,
        "the shrinker gave back too little: {} MiB reserved before, {} MiB after",
        before.reserved >> 20,
        after.reserved >> 20
    );
    let l = live(&d)?;
    check!(
        l[POOL_BYTES] == after.reserved,
        "pool_bytes {} but the pool reserves {}",
        l[POOL_BYTES],
        after.reserved
    );
    d.pool_destroy(p).ctx("POOL_DESTROY")
}
