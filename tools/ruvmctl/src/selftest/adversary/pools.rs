// SPDX-License-Identifier: GPL-2.0

//! Pools under attack: a revoked GPU's cached tables, a failed vidmem pool allocation, pools
//! per file bounded and charged, a cache reclaimed by its cgroup and counted in the quota, an
//! EFAULT that leaves no mapping, a destroy that does not stall the file.

use super::*;

/// Revoking a GPU from a pool while threads allocate and free from it: once the threads are
/// done, no cached list is still DMA-mapped for the GPU (a free that read the access set before
/// the revoke used to cache its table after it).
pub(super) fn adv_pool_revoke_leaves_no_cached_table() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let g = sim_gpu(&d)?;
    let before = live(&d)?;
    let (p, _) = d.pool_create(64 * K, u64::MAX).ctx("POOL_CREATE")?;
    for round in 0..20 {
        d.pool_access(p, g, true).ctx("grant")?;
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(a) = d.pool_alloc(p, 64 * K, 0) {
                            let _ = d.mem_free(a.handle);
                        }
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(20 + round));
            let _ = d.pool_access(p, g, false);
            std::thread::sleep(Duration::from_millis(5));
            stop.store(true, Ordering::Relaxed);
        });
        let now = live(&d)?;
        check!(
            now[DMA_MAPPINGS] == before[DMA_MAPPINGS],
            "round {round}: {} DMA mappings more than before, with GPU {g} revoked and no mem alive",
            now[DMA_MAPPINGS] - before[DMA_MAPPINGS]
        );
    }
    d.pool_destroy(p).ctx("POOL_DESTROY")
}

/// /proc/meminfo's VmallocUsed, in bytes.
pub(super) fn vmalloc_used() -> Result<u64, Stop> {
    super::super::shared::meminfo("VmallocUsed")
}

/// A vidmem pool allocation larger than the GPU's vidmem is refused before anything is
/// allocated, and leaves no memory behind (its cache's room used to be grown to the whole
/// request first: 16 MiB of vmalloc for 1000 MiB of 4 KiB chunks, never given back).
pub(super) fn adv_failed_vidmem_pool_alloc_keeps_nothing() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    let g = vidmem_gpu(&d)?;
    // As large as a mem may be: its chunks' bookkeeping alone is megabytes.
    let size = info.max_alloc_bytes;
    if size <= g.vidmem_size {
        return Err(Stop::Skip("max_alloc_mib is below the GPU's vidmem".into()));
    }
    let before = vmalloc_used()?;
    let mut pools = Vec::new();
    for _ in 0..8 {
        let p = vid_pool(&d, g.id, 4 * K, 0).ctx("POOL_CREATE")?;
        expect_errno(
            vid_alloc(&d, p, g.id, size),
            Errno::ENOMEM,
            "a vidmem pool allocation larger than the GPU's vidmem",
        )?;
        pools.push(p);
    }
    let grew = vmalloc_used()?.saturating_sub(before);
    check!(
        grew < 2 * M,
        "8 refused allocations left {grew} bytes of vmalloc behind"
    );
    for p in pools {
        let a = d.pool_get(p).ctx("POOL_GET")?;
        check!(
            a.reserved_current == 0 && a.misses == 0,
            "a refused allocation changed the pool: reserved {}, misses {}",
            a.reserved_current,
            a.misses
        );
        d.pool_destroy(p).ctx("POOL_DESTROY")?;
    }
    Ok(())
}

/// A file holds at most RUVM_MAX_FILE_POOLS pools (`ENOSPC` beyond, a place freed by a destroy
/// is usable again), each charged to the creating process's memory cgroup, and a file with
/// that many closes at once.
pub(super) fn adv_pools_per_file_are_bounded_and_charged() -> TestResult {
    let max = uapi::RUVM_MAX_FILE_POOLS as usize;
    let charged = MemGroup::available();
    let group = if charged {
        Some(MemGroup::new("ruvm-adv-pools").ctx("memory cgroup")?)
    } else {
        None
    };
    // The pools are made by a child in the group, which reports through its exit status.
    let dir = group.as_ref().map(|g| g.dir.clone());
    let st = super::super::harness::in_child(move || {
        if let Some(dir) = &dir {
            if std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).is_err() {
                return 10;
            }
        }
        let Ok(d) = Ruvm::open() else { return 11 };
        let current = || -> u64 {
            dir.as_ref()
                .and_then(|p| std::fs::read_to_string(p.join("memory.current")).ok())
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        };
        let before = current();
        let mut pools = Vec::new();
        for _ in 0..max {
            match d.pool_create(0, 0) {
                Ok((p, _)) => pools.push(p),
                Err(_) => return 12,
            }
        }
        if d.pool_create(0, 0) != Err(Errno::ENOSPC) {
            return 13;
        }
        let after = current();
        // At least 128 bytes a pool (each is a few hundred): charged, not free.
        if dir.is_some() && after.saturating_sub(before) < (max as u64) * 128 {
            eprintln!(
                "# {max} pools charged {} bytes",
                after.saturating_sub(before)
            );
            return 14;
        }
        if d.pool_destroy(pools[0]).is_err() || d.pool_create(0, 0).is_err() {
            return 15;
        }
        let t = Instant::now();
        drop(d);
        println!(
            "# {max} pools: {} bytes charged; the close took {:?}",
            after.saturating_sub(before),
            t.elapsed()
        );
        0
    })?;
    match st {
        nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
        nix::sys::wait::WaitStatus::Exited(_, 13) => Err(Stop::Fail(format!(
            "pool {} of one file was not refused with ENOSPC",
            max + 1
        ))),
        nix::sys::wait::WaitStatus::Exited(_, 14) => Err(Stop::Fail(
            "the pools were not charged to the creating process's memory cgroup".into(),
        )),
        st => Err(Stop::Fail(format!("the child ended {st:?}"))),
    }
}

/// In a 256 MiB memory cgroup whose pool caches 192 MiB, the same process then touching 128 MiB
/// of anonymous memory is not OOM-killed: the cgroup's own reclaim gives the cache back (the
/// shrinker is memcg-aware; it was not, and the process was killed while ruvm held reclaimable
/// memory charged to its group).
pub(super) fn adv_pool_cache_is_reclaimed_by_its_cgroup() -> TestResult {
    if !MemGroup::available() {
        return Err(Stop::Skip("no memory cgroup controller".into()));
    }
    let group = MemGroup::new("ruvm-adv-reclaim").ctx("memory cgroup")?;
    group
        .write("memory.max", &(256 * M).to_string())
        .ctx("memory.max")?;
    let dir = group.dir.clone();
    let st = super::super::harness::in_child(move || {
        if std::fs::write(dir.join("cgroup.procs"), "0").is_err() {
            return 10;
        }
        let Ok(d) = Ruvm::open() else { return 11 };
        let Ok((p, _)) = d.pool_create(64 * K, u64::MAX) else {
            return 12;
        };
        let mut hs = Vec::new();
        for _ in 0..48 {
            match d.pool_alloc(p, 4 * M, 0) {
                Ok(a) => hs.push(a.handle),
                Err(_) => return 13,
            }
        }
        for h in hs {
            if d.mem_free(h).is_err() {
                return 14;
            }
        }
        let before = d.pool_get(p).map_or(0, |a| a.cached_chunks);
        // 128 MiB of anonymous memory, touched page by page, in the same group.
        let len = (128 * M) as usize;
        // SAFETY: a fresh private anonymous mapping, written through its own pointer only.
        let Ok(ptr) = (unsafe {
            nix::sys::mman::mmap_anonymous(
                None,
                std::num::NonZeroUsize::new(len).unwrap_or(std::num::NonZeroUsize::MIN),
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }) else {
            return 15;
        };
        let base = ptr.as_ptr().cast::<u8>();
        for off in (0..len).step_by(4096) {
            // SAFETY: inside the mapping just made.
            unsafe { base.add(off).write_volatile(1) };
        }
        let after = d.pool_get(p).map_or(0, |a| a.cached_chunks);
        println!(
            "# the pool cached {} MiB, {} MiB once 128 MiB was touched",
            before * 64 / 1024,
            after * 64 / 1024
        );
        if before != 3072 || after >= before {
            return 16;
        }
        0
    })?;
    match st {
        nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
        nix::sys::wait::WaitStatus::Signaled(_, sig, _) => Err(Stop::Fail(format!(
            "the process was killed ({sig}) while its pool held reclaimable memory"
        ))),
        st => Err(Stop::Fail(format!("the child ended {st:?}"))),
    }
}

/// A pool's cached bytes count in its file's quota (`max_file_mib`): a file whose pool caches
/// its whole quota cannot allocate past it, and gets the room back by trimming the pool.
pub(super) fn adv_pool_cache_counts_in_the_file_quota() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let quota = d.info().ctx("INFO")?.max_file_bytes;
    if quota > 64 * M {
        return Err(Stop::Skip(format!(
            "the file quota is {} MiB; this case runs with max_file_mib=64 or less",
            quota / M
        )));
    }
    let (p, _) = d.pool_create(64 * K, u64::MAX).ctx("POOL_CREATE")?;
    let a = d
        .pool_alloc(p, quota, 0)
        .ctx("a pool mem of the whole quota")?;
    d.mem_free(a.handle).ctx("free")?;
    let cached = d.pool_get(p).ctx("POOL_GET")?.cached_chunks * 64 * K;
    check!(cached == quota, "the pool caches {cached} of {quota} bytes");
    expect_errno(
        d.mem_alloc(64 * K, 0, 0),
        Errno::ENOSPC,
        "a mem past the quota its pool's cache fills",
    )?;
    // A second pool cannot cache past it either.
    let (p2, _) = d.pool_create(64 * K, u64::MAX).ctx("POOL_CREATE")?;
    expect_errno(
        d.pool_alloc(p2, 64 * K, 0),
        Errno::ENOSPC,
        "a second pool's mem past the quota",
    )?;
    // The cache itself serves the same file: a hit needs no room.
    let b = d
        .pool_alloc(p, quota, 0)
        .ctx("a pool hit of the whole quota")?;
    d.mem_free(b.handle).ctx("free")?;
    d.pool_trim(p, 0).ctx("POOL_TRIM")?;
    let c = d
        .mem_alloc(64 * K, 0, 0)
        .ctx("a mem once the pool is trimmed")?;
    d.mem_free(c.handle).ctx("free")?;
    d.pool_destroy(p2).ctx("POOL_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")
}

/// `MEM_ALLOC` whose result cannot be written back (its argument in a read-only page) frees
/// the mem as `MEM_FREE` would, while another thread maps the mmap offset it would have had:
/// that mapping's pages are zapped, so it faults rather than reaching freed chunks.
pub(super) fn adv_alloc_efault_leaves_no_mapping() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let page = 4096usize;
    // A read-only page holding the argument.
    // SAFETY: a fresh private anonymous mapping of one page, used through its pointer only.
    let arg = unsafe {
        nix::sys::mman::mmap_anonymous(
            None,
            std::num::NonZeroUsize::new(page).ok_or(Stop::Fail("page".into()))?,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
        )
    }
    .ctx("mmap")?;
    let a = uapi::ruvm_mem_alloc {
        size: 4 * K,
        flags: ZERO,
        ..Default::default()
    };
    // SAFETY: the page is ours and large enough for the structure.
    unsafe { arg.as_ptr().cast::<uapi::ruvm_mem_alloc>().write(a) };
    // SAFETY: the mapping made above.
    unsafe { nix::sys::mman::mprotect(arg, page, ProtFlags::PROT_READ) }.ctx("mprotect")?;
    let stop = AtomicBool::new(false);
    let found = AtomicU64::new(0);
    let leaked = std::sync::Mutex::new(None);
    let deadline = Instant::now() + Duration::from_secs(8);
    // The allocating thread's calls: begun and returned.
    let (begun, returned) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            // The offsets handed out rise by one 2 MiB slot a mem: map the next few.
            let probe = d.mem_alloc(4 * K, 0, 0).ok();
            let base = probe.map_or(0, |p| p.mmap_offset);
            if let Some(p) = probe {
                let _ = d.mem_free(p.handle);
            }
            let mut next = base;
            while !stop.load(Ordering::Relaxed) {
                next += 2 * M;
                for _ in 0..2000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(m) = UserMap::new(
                        &d,
                        next,
                        page,
                        ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                        MapFlags::MAP_SHARED,
                    ) else {
                        continue;
                    };
                    found.fetch_add(1, Ordering::Relaxed);
                    // The mem mapped was the allocation of a call begun by now and not over when
                    // the mapping found it: once every call begun by now has returned, its
                    // pages must be gone (a fixed sleep was not enough on a loaded host).
                    let seen = begun.load(Ordering::SeqCst);
                    while returned.load(Ordering::SeqCst) < seen {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    if readable(m.as_ptr()) {
                        if let Ok(mut l) = leaked.lock() {
                            *l = Some(next);
                        }
                        stop.store(true, Ordering::Relaxed);
                    }
                    break;
                }
            }
        });
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            begun.fetch_add(1, Ordering::SeqCst);
            // SAFETY: the argument is in a page of ours that is not writable: the kernel reads
            // it and cannot write the result back (EFAULT).
            let r = unsafe { d.ioctl_ptr(cmd::MEM_ALLOC.nr, arg.as_ptr().cast()) };
            returned.fetch_add(1, Ordering::SeqCst);
            if r != Err(Errno::EFAULT) {
                stop.store(true, Ordering::Relaxed);
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    if let Some(off) = leaked.lock().ok().and_then(|l| *l) {
        return Err(Stop::Fail(format!(
            "a mapping of offset {off:#x}, made while its MEM_ALLOC failed with EFAULT, still reaches its pages"
        )));
    }
    println!(
        "# {} mappings of a failing allocation's offset made, each faulting once it failed",
        found.load(Ordering::Relaxed)
    );
    Ok(())
}

/// `POOL_DESTROY` gives its cache back without holding the file's lock: another thread's calls
/// on the file go on meanwhile (they used to wait for the whole give-back: 10 s on the debug
/// kernel for 128 MiB of 4 KiB lists).
pub(super) fn adv_pool_destroy_does_not_stall_the_file() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let (p, _) = d.pool_create(4 * K, u64::MAX).ctx("POOL_CREATE")?;
    let keep = d.mem_alloc(4 * K, 0, 0).ctx("alloc")?;
    // Lists of one chunk each, cached: 8192 (a tenth of a second or more to give back) but on a
    // kernel with kmemleak (the debug kernel), where 1024 take seconds already.
    let lists = if std::path::Path::new("/sys/kernel/debug/kmemleak").exists() {
        1024
    } else {
        8192
    };
    let mut hs = Vec::new();
    for _ in 0..lists {
        hs.push(d.pool_alloc(p, 4 * K, 0).ctx("pool alloc")?.handle);
    }
    for h in hs {
        d.mem_free(h).ctx("free")?;
    }
    let done = AtomicBool::new(false);
    let (took, worst) = std::thread::scope(|s| {
        let q = s.spawn(|| {
            let mut worst = Duration::ZERO;
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                let _ = d.mem_query(keep.handle);
                worst = worst.max(t.elapsed());
            }
            worst
        });
        std::thread::sleep(Duration::from_millis(5));
        let t = Instant::now();
        let r = d.pool_destroy(p);
        let took = t.elapsed();
        done.store(true, Ordering::Relaxed);
        (r.map(|()| took), q.join().unwrap_or(Duration::MAX))
    });
    let took = took.ctx("POOL_DESTROY")?;
    println!("# the destroy took {took:?}; the slowest MEM_QUERY meanwhile {worst:?}");
    // A query waits for bookkeeping only; a destroy that held the file's lock throughout made
    // one wait for most of it.
    check!(
        took < Duration::from_millis(20) || worst < took * 3 / 4,
        "a MEM_QUERY waited {worst:?} of the destroy's {took:?}"
    );
    d.mem_free(keep.handle).ctx("free")?;
    let now = live(&d)?;
    check!(
        now[POOL_CHUNKS] == 0,
        "{} pool chunks left",
        now[POOL_CHUNKS]
    );
    Ok(())
}
