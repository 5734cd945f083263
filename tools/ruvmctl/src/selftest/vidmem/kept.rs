// SPDX-License-Identifier: GPL-2.0

//! Root chunks' storage kept for reuse, and given back under memory pressure.

use super::*;

/// The storage a root gives up is kept (up to `vidmem_keep_mib`, 8 MiB unless the runner says
/// otherwise in `RUVM_EXPECT_VIDMEM_KEEP_MIB`), counted as `vidmem_kept` only, taken by the
/// next root that needs storage, zeroed as its chunks are handed out, put back by a failed
/// allocation, and given back by the shrinker.
pub(super) fn vidmem_storage_kept_for_reuse() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    if !Uid::effective().is_root() {
        return Err(Stop::Skip("drop_caches needs root".into()));
    }
    let keep_mib = match std::env::var("RUVM_EXPECT_VIDMEM_KEEP_MIB") {
        Ok(v) => v
            .parse::<u64>()
            .map_err(|_| Stop::Fail(format!("RUVM_EXPECT_VIDMEM_KEEP_MIB={v}")))?,
        Err(_) => 8,
    };
    for g in vid_gpus(&d)? {
        drop_kept(&d)?;
        let idle = check_idle(&d, g.id, "at the start")?;
        let bound = (keep_mib * M).min(idle.capacity) / (2 * M);
        let base = live(&d)?;
        let mapped = mapped_bytes(&d, g.id)?;
        // Every root given storage, then freed: `bound` storages are kept, and nothing else
        // counts them (no root's, no DMA mapping's, not in the GPU's mapped bytes).
        let all = d
            .vidmem_alloc(g.id, idle.capacity, 2 * M, 0)
            .ctx("the whole capacity")?;
        d.mem_free(all.handle).ctx("free")?;
        check_idle(&d, g.id, "after freeing the whole capacity")?;
        let l = live(&d)?;
        check!(
            l[VIDMEM_KEPT] == bound && same_but(&l, &base, VIDMEM_KEPT),
            "GPU {}: kept {} (wanted {bound}); counts {l:?} from {base:?}",
            g.id,
            l[VIDMEM_KEPT]
        );
        check!(
            mapped_bytes(&d, g.id)? == mapped,
            "GPU {}: mapped bytes {} after freeing everything, {mapped} before",
            g.id,
            mapped_bytes(&d, g.id)?
        );
        if bound == 0 {
            continue;
        }
        // A root needing storage takes a kept one.
        let a = d.vidmem_alloc(g.id, 64 * K, 64 * K, 0).ctx("alloc 64K")?;
        let l = live(&d)?;
        check!(
            l[VIDMEM_KEPT] == bound - 1
                && l[VIDMEM_ROOTS] == base[VIDMEM_ROOTS] + 1
                && l[DMA_MAPPINGS] == base[DMA_MAPPINGS] + 1
                && mapped_bytes(&d, g.id)? == mapped + 2 * M,
            "GPU {}: a new root did not take kept storage: {l:?} from {base:?}",
            g.id
        );
        // Kept storage holds the bytes of the mems that used it: the engine writes a
        // pattern, the mem goes, and its range handed out again reads as zeros.
        if has_engine(&g) {
            let len = 64 * K;
            let src = d.mem_alloc(len, 0, 0).ctx("alloc src")?.handle;
            let dst = d.mem_alloc(len, 0, 0).ctx("alloc dst")?.handle;
            for h in [src, dst] {
                d.mem_gpu(true, h, g.id).ctx("map gpu")?;
            }
            // The first and last page of the chunk (an edu engine takes 0.2 s a page).
            let pieces = [(0, 4 * K), (len - 4 * K, 4 * K)];
            fill(&d, src, len, 11)?;
            for (off, n) in pieces {
                ce(&d, g.id, a.handle, src, off, n)?;
            }
            let phys = d.gpu_phys(a.handle, g.id, 0, 1).ctx("phys")?.0;
            d.mem_free(a.handle).ctx("free")?;
            check!(
                live(&d)?[VIDMEM_KEPT] == bound,
                "the written root's storage was not kept"
            );
            let b = d.vidmem_alloc(g.id, len, len, 0).ctx("alloc 64K again")?;
            let again = d.gpu_phys(b.handle, g.id, 0, 1).ctx("phys")?.0;
            fill(&d, dst, len, 12)?;
            for (off, n) in pieces {
                ce(&d, g.id, dst, b.handle, off, n)?;
            }
            let q = d.mem_query(dst).ctx("query")?;
            let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
            let stale = pieces
                .iter()
                .flat_map(|&(off, n)| off as usize..(off + n) as usize)
                .filter(|&o| map.read(o) != 0)
                .count();
            check!(
                stale == 0,
                "GPU {}: vidmem {again:#x} (was {phys:#x}) handed out again over kept storage: \
                 {stale} bytes not zero",
                g.id
            );
            drop(map);
            for h in [src, dst, b.handle] {
                d.mem_free(h).ctx("free")?;
            }
        } else {
            d.mem_free(a.handle).ctx("free")?;
        }
        // A failed allocation puts the storage it took back where it came from, with every
        // kept storage (all go back) and with none (none is kept).
        check!(
            live(&d)?[VIDMEM_KEPT] == bound,
            "kept {}",
            live(&d)?[VIDMEM_KEPT]
        );
        failed_alloc_changes_nothing(&d, g.id, idle.capacity)?;
        // The shrinker gives everything kept back; the rest is where it started.
        drop_kept(&d)?;
        check!(
            live(&d)? == base,
            "GPU {}: after the shrinker {:?}, at the start {base:?}",
            g.id,
            live(&d)?
        );
        failed_alloc_changes_nothing(&d, g.id, idle.capacity)?;
    }
    Ok(())
}

/// Every GPU's whole capacity allocated and freed, so that each keeps what it may; then reclaim
/// (the root memory cgroup's, or memory pressure from another process, which must not be
/// killed): the shrinker gives at least a quarter of it back. Needs kept storage
/// of at least a quarter of the available memory (the run with `vidmem_mib=128
/// vidmem_keep_mib=65534`).
pub(super) fn vidmem_kept_storage_shrinks_under_memory_pressure() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    if !Uid::effective().is_root() {
        return Err(Stop::Skip("drop_caches needs root".into()));
    }
    drop_kept(&d)?;
    for g in vid_gpus(&d)? {
        let all = d
            .vidmem_alloc(g.id, g.vidmem_size, 2 * M, 0)
            .ctx("the whole capacity")?;
        d.mem_free(all.handle).ctx("free")?;
    }
    let kept = live(&d)?[VIDMEM_KEPT] * 2 * M;
    let available = meminfo("MemAvailable")?;
    if kept < available / 4 {
        drop_kept(&d)?;
        return Err(Stop::Skip(format!(
            "{} MiB kept, {} MiB available: the run with vidmem_mib=128 vidmem_keep_mib=65534 \
             keeps enough",
            kept >> 20,
            available >> 20
        )));
    }
    // Reclaim as pressure makes it: the root cgroup's (`reclaim_root`), or where the kernel
    // has none, pressure that wakes kswapd but never makes the child reclaim directly (which
    // may end in the OOM killer while the shrinker gives its pages back: reclaim's OOM
    // decision counts no shrinker's pages). Reclaim calls the shrinker, which gives back half
    // at a pass.
    let enough = || live(&d).is_ok_and(|l| l[VIDMEM_KEPT] * 2 * M + kept / 4 <= kept);
    if !reclaim_root(kept / 2, enough) {
        let status = reclaim_in_child(M / 2, enough)?;
        let after = live(&d)?[VIDMEM_KEPT] * 2 * M;
        check!(
            matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)),
            "the process making memory pressure ended {status:?} ({} MiB kept before, {} MiB after)",
            kept >> 20,
            after >> 20
        );
    }
    let after = live(&d)?[VIDMEM_KEPT] * 2 * M;
    // The shrinker gives back half at a pass (`SEEKS` 0): a quarter given back shows it
    // works, none would not.
    check!(
        after + kept / 4 <= kept,
        "the shrinker gave back too little: {} MiB kept before, {} MiB after",
        kept >> 20,
        after >> 20
    );
    drop_kept(&d)
}

/// Asks GPU `g` for more than its `capacity` (every root's storage is taken, then the
/// allocation fails) and checks that every count is as it was.
pub(super) fn failed_alloc_changes_nothing(d: &Ruvm, g: u32, capacity: u64) -> TestResult {
    let before = live(d)?;
    let stats = d.pmm_stats(g).ctx("PMM_STATS")?;
    expect_errno(
        d.vidmem_alloc(g, capacity + 2 * M, 2 * M, 0),
        Errno::ENOMEM,
        "more than the capacity",
    )?;
    let after = live(d)?;
    let stats_after = d.pmm_stats(g).ctx("PMM_STATS")?;
    check!(
        after == before && stats_after.roots_stored == stats.roots_stored,
        "GPU {g}: a failed allocation changed the counts: {before:?} -> {after:?}"
    );
    Ok(())
}
