// SPDX-License-Identifier: GPL-2.0

//! Vidmem: each GPU's memory, its PMM (uvm's chunk tree), vidmem mems, and
//! bytes moved in and out of it by the GPU's copy engine.

use nix::errno::Errno;
use nix::unistd::{setuid, Uid};

use super::harness::{check, child_checks, expect_errno, Case, Context, Stop, TestResult};
use libruvm::{pci_name, uapi, Ruvm, UserMap};

use super::shared::{drop_kept, fill, live, meminfo, same_but, touch_in_child, VIDMEM_KEPT};
use crate::pattern;

const K: u64 = 1024;
const M: u64 = 1024 * K;
/// The PMM's chunk sizes, in the order of `ruvm_pmm_stats.allocated`.
const SIZES: [u64; 3] = [4 * K, 64 * K, 2 * M];

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "vidmem_chunk_rules_for_every_page_size",
            run: vidmem_chunk_rules_for_every_page_size,
        },
        Case {
            name: "vidmem_mappings_and_addresses",
            run: vidmem_mappings_and_addresses,
        },
        Case {
            name: "vidmem_root_chunk_splits_and_merges_back",
            run: vidmem_root_chunk_splits_and_merges_back,
        },
        Case {
            name: "vidmem_storage_kept_for_reuse",
            run: vidmem_storage_kept_for_reuse,
        },
        Case {
            name: "vidmem_kept_storage_shrinks_under_memory_pressure",
            run: vidmem_kept_storage_shrinks_under_memory_pressure,
        },
        Case {
            name: "vidmem_exhaustion_and_recovery",
            run: vidmem_exhaustion_and_recovery,
        },
        Case {
            name: "vidmem_ce_round_trip_through_vidmem",
            run: vidmem_ce_round_trip_through_vidmem,
        },
        Case {
            name: "vidmem_known_zero_chunks_and_every_write",
            run: vidmem_known_zero_chunks_and_every_write,
        },
        Case {
            name: "vidmem_pmm_bad_inputs",
            run: vidmem_pmm_bad_inputs,
        },
        Case {
            name: "vidmem_unbind_with_live_mems",
            run: vidmem_unbind_with_live_mems,
        },
        Case {
            name: "vidmem_none_on_a_gpu_without_any",
            run: vidmem_none_on_a_gpu_without_any,
        },
    ]
}

fn present(g: &uapi::ruvm_gpu_info) -> bool {
    g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
}

fn has_engine(g: &uapi::ruvm_gpu_info) -> bool {
    present(g) && g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE != 0
}

/// The present GPUs with vidmem; skips the case without any.
fn vid_gpus(d: &Ruvm) -> Result<Vec<uapi::ruvm_gpu_info>, Stop> {
    let v: Vec<_> = d
        .gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .filter(|g| present(g) && g.vidmem_size > 0)
        .collect();
    if v.is_empty() {
        return Err(Stop::Skip("no GPU with vidmem".into()));
    }
    Ok(v)
}

/// The present GPUs with vidmem and a copy engine; skips the case without any.
fn engine_gpus(d: &Ruvm) -> Result<Vec<uapi::ruvm_gpu_info>, Stop> {
    let v: Vec<_> = vid_gpus(d)?.into_iter().filter(has_engine).collect();
    if v.is_empty() {
        return Err(Stop::Skip("no GPU with vidmem and a copy engine".into()));
    }
    Ok(v)
}

/// A PMM that holds nothing: every byte free, no root chunk used or stored.
fn check_idle(d: &Ruvm, g: u32, when: &str) -> Result<uapi::ruvm_pmm_stats, Stop> {
    let s = d.pmm_stats(g).ctx("PMM_STATS")?;
    check!(
        s.free == s.capacity
            && s.allocated == [0; 3]
            && s.roots_used == 0
            && s.roots_split == 0
            && s.roots_stored == 0
            && s.roots * 2 * M == s.capacity,
        "GPU {g} {when}: PMM not idle: {s:?}"
    );
    Ok(s)
}

fn vidmem_chunk_rules_for_every_page_size() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for g in vid_gpus(&d)? {
        let sizes: Vec<u64> = SIZES
            .iter()
            .copied()
            .filter(|s| g.page_sizes & s != 0)
            .collect();
        let biggest = sizes.iter().copied().max().unwrap_or(0);
        // uvm_mem's default: 4K below 64K, 64K below the biggest page size, else the biggest.
        let default = |size: u64| {
            if size < 64 * K {
                4 * K
            } else if size < biggest {
                64 * K
            } else {
                biggest
            }
        };
        for &ps in &sizes {
            for size in [ps - 1, ps, 5 * biggest - 1] {
                let a = d.vidmem_alloc(g.id, size, 0, 0).ctx("alloc")?;
                let want = default(size);
                check!(
                    a.chunk_size == want && a.chunk_count == size.div_ceil(want),
                    "GPU {}: {size} bytes got {} chunks of {}, wanted chunks of {want}",
                    g.id,
                    a.chunk_count,
                    a.chunk_size
                );
                let q = d.mem_query(a.handle).ctx("query")?;
                check!(
                    q.backing == uapi::ruvm_backing_RUVM_BACKING_VIDMEM && q.gpu == g.id,
                    "query says backing {} GPU {}",
                    q.backing,
                    q.gpu
                );
                d.mem_free(a.handle).ctx("free")?;
            }
            // An explicit page size is used as is.
            let a = d.vidmem_alloc(g.id, 3 * ps + 1, ps, 0).ctx("alloc")?;
            check!(
                a.chunk_size == ps && a.chunk_count == 4,
                "page size {ps}: {} chunks of {}",
                a.chunk_count,
                a.chunk_size
            );
            d.mem_free(a.handle).ctx("free")?;
        }
        for ps in [1, 2 * K, 8 * K, 128 * K, M, 4 * M, 3 * 64 * K, u64::MAX] {
            expect_errno(
                d.vidmem_alloc(g.id, 4096, ps, 0),
                Errno::EINVAL,
                &format!("vidmem page size {ps}"),
            )?;
        }
        expect_errno(d.vidmem_alloc(g.id, 0, 0, 0), Errno::EINVAL, "size 0")?;
        expect_errno(
            d.vidmem_alloc(g.id, u64::MAX, 0, 0),
            Errno::EOVERFLOW,
            "size u64::MAX",
        )?;
        check_idle(&d, g.id, "after the rules")?;
    }
    expect_errno(
        d.vidmem_alloc(uapi::RUVM_MAX_GPUS + 1, 4096, 0, 0),
        Errno::ENODEV,
        "vidmem of an unknown GPU",
    )
}

fn vidmem_mappings_and_addresses() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = vid_gpus(&d)?;
    let all = d.gpus().ctx("GPU_LIST")?;
    for g in &gpus {
        let a = d.vidmem_alloc(g.id, 3 * 64 * K, 64 * K, 0).ctx("alloc")?;
        let h = a.handle;
        // The CPU cannot map vidmem, neither in the kernel nor in user space.
        expect_errno(d.map_kernel(h), Errno::EOPNOTSUPP, "kernel map of vidmem")?;
        let q = d.mem_query(h).ctx("query")?;
        expect_errno(
            UserMap::of_mem(&d, &q).map(drop),
            Errno::EOPNOTSUPP,
            "mmap of vidmem",
        )?;
        expect_errno(
            d.mem_fill(
                false,
                uapi::ruvm_mem_fill {
                    handle: h,
                    length: 16,
                    ..Default::default()
                },
            ),
            Errno::ENXIO,
            "CPU fill of vidmem",
        )?;
        // Its own GPU: mapping is a no-op, twice, and unmapping too; it has no DMA table.
        d.mem_gpu(true, h, g.id).ctx("map on its own GPU")?;
        d.mem_gpu(true, h, g.id).ctx("map again")?;
        check!(
            d.mem_query(h).ctx("query")?.mapped_gpus == 0,
            "vidmem has a DMA table"
        );
        expect_errno(
            d.dma_addrs(h, g.id, 0, 4),
            Errno::ENXIO,
            "DMA addresses of vidmem",
        )?;
        d.mem_gpu(false, h, g.id).ctx("unmap on its own GPU")?;
        // Another GPU: no peer access.
        for o in all.iter().filter(|o| present(o) && o.id != g.id) {
            expect_errno(
                d.mem_gpu(true, h, o.id),
                Errno::EINVAL,
                "map on another GPU",
            )?;
            expect_errno(
                d.gpu_phys(h, o.id, 0, 1),
                Errno::EINVAL,
                "address on another GPU",
            )?;
        }
        // Vidmem addresses: chunk-aligned, inside the GPU's memory, distinct per chunk, and a
        // range crossing a chunk is refused.
        let mut chunks = Vec::new();
        for c in 0..a.chunk_count {
            let (addr, ap) = d
                .gpu_phys(h, g.id, c * a.chunk_size, a.chunk_size)
                .ctx("gpu phys")?;
            check!(
                ap == uapi::ruvm_aperture_RUVM_APERTURE_VID
                    && addr % a.chunk_size == 0
                    && addr + a.chunk_size <= g.vidmem_size,
                "chunk {c}: aperture {ap} address {addr:#x} (vidmem {:#x})",
                g.vidmem_size
            );
            chunks.push(addr);
        }
        let mut sorted = chunks.clone();
        sorted.sort_unstable();
        sorted.dedup();
        check!(sorted.len() == chunks.len(), "chunks share an address");
        let (inside, _) = d.gpu_phys(h, g.id, 64 * K + 5, 7).ctx("inside")?;
        check!(
            inside == chunks[1] + 5,
            "offset 64K+5 at {inside:#x}, chunk 1 at {:#x}",
            chunks[1]
        );
        expect_errno(
            d.gpu_phys(h, g.id, 64 * K - 1, 2),
            Errno::EINVAL,
            "a range crossing a chunk",
        )?;
        expect_errno(d.gpu_phys(h, g.id, 0, 0), Errno::EINVAL, "an empty range")?;
        let phys_args = || uapi::ruvm_mem_gpu_phys {
            handle: h,
            gpu: g.id,
            length: 1,
            ..Default::default()
        };
        for (what, mut a) in [
            (
                "flags",
                uapi::ruvm_mem_gpu_phys {
                    flags: 1,
                    ..phys_args()
                },
            ),
            (
                "pad",
                uapi::ruvm_mem_gpu_phys {
                    pad: 1,
                    ..phys_args()
                },
            ),
            (
                "reserved",
                uapi::ruvm_mem_gpu_phys {
                    reserved: [0, 1],
                    ..phys_args()
                },
            ),
        ] {
            expect_errno(
                d.call(libruvm::cmd::MEM_GPU_PHYS, &mut a),
                Errno::EINVAL,
                &format!("gpu phys {what}"),
            )?;
        }
        expect_errno(
            d.gpu_phys(u64::MAX, g.id, 0, 1),
            Errno::ENOENT,
            "gpu phys of an unknown handle",
        )?;
        expect_errno(
            d.gpu_phys(h, g.id, 3 * 64 * K, 1),
            Errno::EINVAL,
            "past the end",
        )?;
        expect_errno(
            d.gpu_phys(h, g.id, u64::MAX, 2),
            Errno::EOVERFLOW,
            "offset overflows",
        )?;
        child_checks(
            "an unprivileged read of vidmem addresses was not refused with EPERM",
            || {
                setuid(Uid::from_raw(65534)).is_ok()
                    && d.gpu_phys(h, g.id, 0, 1).err() == Some(Errno::EPERM)
            },
        )?;
        // A sysmem mem's GPU address is its DMA address on that GPU, once mapped.
        let s = d.mem_alloc(8 * K, 0, 0).ctx("alloc sysmem")?.handle;
        expect_errno(d.gpu_phys(s, g.id, 0, 1), Errno::ENXIO, "sysmem not mapped")?;
        d.mem_gpu(true, s, g.id).ctx("map sysmem")?;
        let dma = d.dma_addrs(s, g.id, 0, 2).ctx("dma addrs")?;
        let (addr, ap) = d.gpu_phys(s, g.id, 4 * K + 9, 3).ctx("sysmem gpu phys")?;
        check!(
            ap == uapi::ruvm_aperture_RUVM_APERTURE_SYS && addr == dma[1] + 9,
            "sysmem: aperture {ap} at {addr:#x}, DMA table {dma:x?}"
        );
        // An engine reaches vidmem of its own GPU only.
        for o in all.iter().filter(|o| has_engine(o) && o.id != g.id) {
            d.mem_gpu(true, s, o.id)
                .ctx("map sysmem on the other GPU")?;
            expect_errno(
                d.ce_copy(o.id, s, 0, h, 0, 16),
                Errno::EINVAL,
                "another GPU's engine reading vidmem",
            )?;
        }
        d.mem_free(s).ctx("free")?;
        d.mem_free(h).ctx("free")?;
        check_idle(&d, g.id, "after free")?;
    }
    Ok(())
}

const VIDMEM_ROOTS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_ROOTS as usize;
const DMA_MAPPINGS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS as usize;

/// The bytes DMA-mapped for GPU `g` now.
fn mapped_bytes(d: &Ruvm, g: u32) -> Result<u64, Stop> {
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let e = gpus.iter().find(|x| x.id == g);
    e.map(|x| x.dma_mapped_bytes)
        .ok_or_else(|| Stop::Fail(format!("GPU {g} is gone")))
}

/// The storage a root gives up is kept (up to `vidmem_keep_mib`, 8 MiB unless the runner says
/// otherwise in `RUVM_EXPECT_VIDMEM_KEEP_MIB`), counted as `vidmem_kept` only, taken by the
/// next root that needs storage, zeroed as its chunks are handed out, put back by a failed
/// allocation, and given back by the shrinker.
fn vidmem_storage_kept_for_reuse() -> TestResult {
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

/// Every GPU's whole capacity allocated and freed, so that each keeps what it may; then another
/// process touches more anonymous memory than is available without the kept storage: the
/// shrinker gives at least a quarter of it back and the process is not killed. Needs kept storage
/// of at least a quarter of the available memory (the run with `vidmem_mib=128
/// vidmem_keep_mib=65534`).
fn vidmem_kept_storage_shrinks_under_memory_pressure() -> TestResult {
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
    // Beyond what is available by an eighth of the kept storage: reclaim must run, and the
    // shrinker (trimmed by half at every pass) gives back far more than that. Reclaim's OOM
    // check counts no shrinker's pages, so a child that asked for half the kept storage beyond
    // what was available met the OOM killer in 1 of 5 runs, while the storage was going.
    let want = available + kept / 8;
    let status = touch_in_child(want, || {
        live(&d).is_ok_and(|l| l[VIDMEM_KEPT] * 2 * M + kept / 4 <= kept)
    })?;
    let after = live(&d)?[VIDMEM_KEPT] * 2 * M;
    check!(
        matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)),
        "the process touching {} MiB ended {status:?} ({} MiB kept before, {} MiB after)",
        want >> 20,
        kept >> 20,
        after >> 20
    );
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
fn failed_alloc_changes_nothing(d: &Ruvm, g: u32, capacity: u64) -> TestResult {
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

fn vidmem_root_chunk_splits_and_merges_back() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for g in vid_gpus(&d)? {
        let idle = check_idle(&d, g.id, "at the start")?;
        for (i, &size) in SIZES.iter().enumerate().take(2) {
            let per_root = 2 * M / size;
            // One root chunk's worth of small chunks: the PMM splits one root, lazily, and
            // takes them all from it.
            let a = d.vidmem_alloc(g.id, 2 * M, size, 0).ctx("alloc")?;
            check!(a.chunk_count == per_root, "{} chunks", a.chunk_count);
            let s = d.pmm_stats(g.id).ctx("PMM_STATS")?;
            check!(
                s.allocated[i] == per_root
                    && s.roots_used == 1
                    && s.roots_split == 1
                    && s.roots_stored == 1
                    && s.free == idle.free - 2 * M,
                "{per_root} chunks of {size}: {s:?}"
            );
            let first = d.gpu_phys(a.handle, g.id, 0, 1).ctx("phys")?.0;
            let last = d.gpu_phys(a.handle, g.id, 2 * M - 1, 1).ctx("phys")?.0;
            check!(
                first / (2 * M) == last / (2 * M),
                "the chunks span root chunks: {first:#x} and {last:#x}"
            );
            d.mem_free(a.handle).ctx("free")?;
            // Freed, the root is whole again: the PMM is idle and hands out every root chunk
            // as one 2 MiB chunk.
            check_idle(
                &d,
                g.id,
                &format!("after freeing {per_root} chunks of {size}"),
            )?;
            let r = d
                .pmm_check_leak(g.id, 2 * M, u64::MAX)
                .ctx("PMM_CHECK_LEAK")?;
            check!(
                r.allocated == idle.roots && r.free_after == r.free_before,
                "after the merge: {r:?}, {} roots",
                idle.roots
            );
        }
    }
    Ok(())
}

fn vidmem_exhaustion_and_recovery() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for g in vid_gpus(&d)? {
        let idle = check_idle(&d, g.id, "at the start")?;
        // uvm's PMM_CHECK_LEAK, for every chunk size: as many chunks as fit, all given back.
        for size in SIZES {
            let r = d
                .pmm_check_leak(g.id, size, u64::MAX)
                .ctx("PMM_CHECK_LEAK")?;
            check!(
                r.allocated == idle.capacity / size
                    && r.free_before == idle.capacity
                    && r.free_after == idle.capacity,
                "check-leak with {size}: {r:?}"
            );
            let r = d.pmm_check_leak(g.id, size, 3).ctx("limited")?;
            check!(r.allocated == 3, "limit 3 took {}", r.allocated);
        }
        // Mems until the GPU is full.
        let failures = |d: &Ruvm| {
            d.stats_of(uapi::ruvm_backing_RUVM_BACKING_VIDMEM, false)
                .map(|s| s.alloc_failures)
        };
        let mut held = Vec::new();
        loop {
            match d.vidmem_alloc(g.id, 2 * M, 0, 0) {
                Ok(a) => held.push(a.handle),
                Err(Errno::ENOMEM) => break,
                Err(e) => return Err(Stop::Fail(format!("alloc: {e}"))),
            }
            check!(held.len() as u64 <= idle.roots, "more 2M mems than roots");
        }
        check!(
            held.len() as u64 == idle.roots,
            "{} mems of 2M in {} roots",
            held.len(),
            idle.roots
        );
        let full = d.pmm_stats(g.id).ctx("PMM_STATS")?;
        let f0 = failures(&d).ctx("STATS")?;
        expect_errno(
            d.vidmem_alloc(g.id, 1, 0, 0),
            Errno::ENOMEM,
            "4K on a full GPU",
        )?;
        check!(
            failures(&d).ctx("STATS")? == f0 + 1,
            "the failure was not counted"
        );
        // Free two roots, then ask for three chunks: two are had, the third is not, and the
        // two go back.
        check!(held.len() >= 3, "only {} root chunks", held.len());
        for h in held.split_off(held.len() - 2) {
            d.mem_free(h).ctx("free")?;
        }
        let before = d.pmm_stats(g.id).ctx("PMM_STATS")?;
        check!(
            before.free == 4 * M,
            "free {} after freeing two",
            before.free
        );
        expect_errno(
            d.vidmem_alloc(g.id, 6 * M, 0, 0),
            Errno::ENOMEM,
            "6M with 4M free",
        )?;
        let after = d.pmm_stats(g.id).ctx("PMM_STATS")?;
        check!(
            after.free == before.free
                && after.allocated == before.allocated
                && after.roots_stored == before.roots_stored,
            "a failed allocation left something: {before:?} -> {after:?}"
        );
        check!(
            full.roots_used == idle.roots && full.roots_stored == idle.roots,
            "full: {full:?}"
        );
        for h in held.drain(..) {
            d.mem_free(h).ctx("free")?;
        }
        check_idle(&d, g.id, "after freeing everything")?;
        // The whole capacity again, in one mem of 64K chunks.
        let a = d
            .vidmem_alloc(g.id, idle.capacity, 64 * K, 0)
            .ctx("the whole capacity again")?;
        let s = d.pmm_stats(g.id).ctx("PMM_STATS")?;
        check!(
            s.free == 0 && s.allocated[1] == idle.capacity / (64 * K),
            "whole capacity: {s:?}"
        );
        d.mem_free(a.handle).ctx("free")?;
        check_idle(&d, g.id, "at the end")?;
    }
    Ok(())
}

/// Copies `[off, off + len)` from `src` to `dst` with GPU `g`'s engine.
fn ce(d: &Ruvm, g: u32, dst: u64, src: u64, off: u64, len: u64) -> TestResult {
    d.ce_copy(g, dst, off, src, off, len)
        .ctx(&format!("GPU {g} copies [{off:#x}, +{len:#x})"))
}

/// How a test writes a vidmem mem before freeing it.
#[derive(Clone, Copy, Debug)]
enum Write {
    /// Not at all: its chunks come back known to be zero.
    None,
    /// A copy engine copy into it (`CE_COPY`).
    Engine,
    /// Through its GPU kernel VA mapping (`MEM_MAP_GPU_KERNEL`, then `CE_COPY_VA`).
    KernelVa,
}

/// The pieces of a chunk of `ps` bytes a test writes and reads back: its first and last 1000
/// bytes (few, as each edu transfer takes about 100 ms).
fn ends(ps: u64) -> [(u64, u64); 2] {
    [(0, 1000), (ps - 1000, 1000)]
}

/// Writes the ends of vidmem mem `v` (one chunk of `ps`) from `s` (sysmem, mapped on the GPU
/// and filled with a pattern) the way `how` says.
fn write_vid(d: &Ruvm, g: u32, v: u64, s: u64, ps: u64, how: Write) -> TestResult {
    match how {
        Write::None => {}
        Write::Engine => {
            for (off, len) in ends(ps) {
                ce(d, g, v, s, off, len)?;
            }
        }
        Write::KernelVa => {
            for h in [v, s] {
                d.mem_gpu_kernel(true, h, g).ctx("MAP_GPU_KERNEL")?;
            }
            let (vva, _) = d.gpu_va(v, g, false).ctx("GPU_VA")?;
            let (sva, _) = d.gpu_va(s, g, false).ctx("GPU_VA")?;
            for (off, len) in ends(ps) {
                d.ce_copy_va(g, vva + off, sva + off, len, false)
                    .ctx("CE_COPY_VA")?;
            }
            for h in [v, s] {
                d.mem_gpu_kernel(false, h, g).ctx("UNMAP_GPU_KERNEL")?;
            }
        }
    }
    Ok(())
}

/// Bytes of the ends of vidmem mem `v` (one chunk of `ps`) that are not zero, read through
/// `s` (sysmem, mapped on the GPU and kernel; not the mem the writes come from), which is
/// scribbled over first.
fn nonzero_ends(d: &Ruvm, g: u32, v: u64, s: u64, ps: u64) -> Result<u64, Stop> {
    let byte = |verify: bool, off: u64, len: u64, seed: u64| {
        d.mem_fill(
            verify,
            uapi::ruvm_mem_fill {
                handle: s,
                offset: off,
                length: len,
                kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
                seed,
                ..Default::default()
            },
        )
        .ctx("MEM_FILL")
    };
    let mut bad = 0;
    for (off, len) in ends(ps) {
        byte(false, off, len, 0xee)?;
        ce(d, g, s, v, off, len)?;
        bad += byte(true, off, len, 0)?.mismatches;
    }
    Ok(bad)
}

/// A vidmem chunk that comes back unwritten is handed out again as it is (known zero), and
/// every way to write one (a copy engine copy into it, a GPU kernel VA mapping) makes the next
/// mem on the same memory zeroed again: for each chunk size, a mem is written (or not) and
/// freed, and the next mem, on the same vidmem address, reads zeros. Then two 4 KiB chunks of
/// one 64 KiB slot, one written and one not: the 64 KiB chunk after them reads zeros.
fn vidmem_known_zero_chunks_and_every_write() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = engine_gpus(&d)?;
    for g in &gpus {
        let mmu = g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_MMU != 0;
        check_idle(&d, g.id, "before")?;
        // Written from (a pattern) and read back through: as big as the largest chunk.
        let s = d.mem_alloc(2 * M, 0, 0).ctx("alloc sysmem")?.handle;
        let r = d.mem_alloc(2 * M, 0, 0).ctx("alloc sysmem")?.handle;
        fill(&d, s, 2 * M, u64::from(g.id) + 7)?;
        for h in [s, r] {
            d.map_kernel(h).ctx("MAP_CPU_KERNEL")?;
            d.mem_gpu(true, h, g.id).ctx("MAP_GPU")?;
        }
        let mut ways = vec![Write::None, Write::Engine, Write::None];
        if mmu {
            ways.extend([Write::KernelVa, Write::None]);
        }
        for ps in SIZES {
            for &how in &ways {
                let a = d.vidmem_alloc(g.id, ps, ps, 0).ctx("alloc")?.handle;
                let at = d.gpu_phys(a, g.id, 0, 1).ctx("GPU_PHYS")?.0;
                write_vid(&d, g.id, a, s, ps, how)?;
                d.mem_free(a).ctx("free")?;
                let b = d.vidmem_alloc(g.id, ps, ps, 0).ctx("alloc again")?.handle;
                let again = d.gpu_phys(b, g.id, 0, 1).ctx("GPU_PHYS")?.0;
                check!(
                    again == at,
                    "GPU {}: a {ps}-byte chunk freed at {at:#x} came back at {again:#x}",
                    g.id
                );
                let bad = nonzero_ends(&d, g.id, b, r, ps)?;
                check!(
                    bad == 0,
                    "GPU {}: {bad} old bytes in a new {ps}-byte chunk at {again:#x}, the one before written {how:?}",
                    g.id
                );
                d.mem_free(b).ctx("free")?;
            }
        }
        // A 64 KiB slot known zero; split into 4 KiB chunks, one written and one not.
        let a = d.vidmem_alloc(g.id, 64 * K, 64 * K, 0).ctx("alloc")?.handle;
        d.mem_free(a).ctx("free")?;
        let x = d
            .vidmem_alloc(g.id, 4 * K, 4 * K, 0)
            .ctx("alloc 4K")?
            .handle;
        let y = d
            .vidmem_alloc(g.id, 4 * K, 4 * K, 0)
            .ctx("alloc 4K")?
            .handle;
        write_vid(&d, g.id, y, s, 4 * K, Write::Engine)?;
        let at = d.gpu_phys(y, g.id, 0, 1).ctx("GPU_PHYS")?.0;
        d.mem_free(y).ctx("free")?;
        d.mem_free(x).ctx("free")?;
        let b = d
            .vidmem_alloc(g.id, 64 * K, 64 * K, 0)
            .ctx("alloc 64K")?
            .handle;
        let base = d.gpu_phys(b, g.id, 0, 1).ctx("GPU_PHYS")?.0;
        check!(
            base + 4 * K == at,
            "GPU {}: the 4 KiB chunk at {at:#x} is not the second of the 64 KiB one at {base:#x}",
            g.id
        );
        // The written 4 KiB chunk's ends, at 4 KiB in the new chunk.
        let bad = nonzero_ends(&d, g.id, b, r, 8 * K)?;
        check!(
            bad == 0,
            "GPU {}: {bad} old bytes of a written 4 KiB chunk in a new 64 KiB chunk",
            g.id
        );
        d.mem_free(b).ctx("free")?;
        for h in [s, r] {
            d.mem_free(h).ctx("free")?;
        }
        check_idle(&d, g.id, "after")?;
    }
    Ok(())
}

fn vidmem_ce_round_trip_through_vidmem() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = engine_gpus(&d)?;
    const SIZES: [(u64, u64); 3] = [(12 * K, 4 * K), (192 * K, 64 * K), (4 * M, 2 * M)];
    for (i, g) in gpus.iter().enumerate() {
        // Every size on the first GPU; one on the others (an edu transfer costs 100 ms).
        let sizes = if i == 0 { &SIZES[..] } else { &SIZES[1..2] };
        for &(size, ps) in sizes {
            let seed = size ^ u64::from(g.id);
            let src = d.mem_alloc(size, 0, 0).ctx("alloc src")?.handle;
            let dst = d
                .mem_alloc(size, 0, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
                .ctx("alloc dst")?
                .handle;
            let vid = d.vidmem_alloc(g.id, size, ps, 0).ctx("alloc vidmem")?;
            for h in [src, dst] {
                d.map_kernel(h).ctx("map kernel")?;
                d.mem_gpu(true, h, g.id).ctx("map gpu")?;
            }
            let fill = uapi::ruvm_mem_fill {
                handle: src,
                length: size,
                seed,
                ..Default::default()
            };
            d.mem_fill(false, fill).ctx("CPU writes the pattern")?;
            // The start and end of every vidmem chunk, and a piece across the first chunk
            // boundary (split by the engine at the boundary).
            let mut pieces = Vec::new();
            for c in 0..vid.chunk_count {
                let base = c * ps;
                pieces.push((base, 2000.min(ps)));
                if ps > 4000 {
                    pieces.push((base + ps - 2000, 2000));
                }
            }
            pieces.push((ps - 1000, 2500));
            pieces.sort_unstable();
            pieces.dedup();
            for &(off, len) in &pieces {
                ce(&d, g.id, vid.handle, src, off, len)?;
            }
            for &(off, len) in &pieces {
                ce(&d, g.id, dst, vid.handle, off, len)?;
            }
            // Every byte the pieces covered came back; every other byte is still 0, and a
            // stretch of vidmem nobody wrote reads as zeros (vidmem is zeroed).
            let mut copied = vec![false; size as usize];
            for &(off, len) in &pieces {
                copied[off as usize..(off + len) as usize].fill(true);
            }
            let q = d.mem_query(dst).ctx("query")?;
            let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
            for (o, &c) in copied.iter().enumerate() {
                let want = if c {
                    pattern::byte_at(seed, o as u64)
                } else {
                    0
                };
                let got = map.read(o);
                check!(
                    got == want,
                    "GPU {}, {ps} chunks: byte {o:#x} is {got:#x} after the round trip, wanted {want:#x}",
                    g.id
                );
            }
            drop(map);
            let gap = 2000.min(ps / 2);
            if ps > 4 * gap {
                d.mem_fill(
                    false,
                    uapi::ruvm_mem_fill {
                        handle: dst,
                        offset: 2 * gap,
                        length: gap,
                        kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
                        seed: 0xee,
                        ..Default::default()
                    },
                )
                .ctx("scribble")?;
                ce(&d, g.id, dst, vid.handle, 2 * gap, gap)?;
                let r = d
                    .mem_fill(
                        true,
                        uapi::ruvm_mem_fill {
                            handle: dst,
                            offset: 2 * gap,
                            length: gap,
                            kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
                            seed: 0,
                            ..Default::default()
                        },
                    )
                    .ctx("verify zeros")?;
                check!(
                    r.mismatches == 0,
                    "unwritten vidmem is not zero: {} bytes",
                    r.mismatches
                );
            }
            for h in [src, dst, vid.handle] {
                d.mem_free(h).ctx("free")?;
            }
        }
        // A freed chunk is scrubbed: the next mem on the same memory reads zeros.
        let a = d.vidmem_alloc(g.id, 4 * K, 0, 0).ctx("alloc")?.handle;
        let s = d.mem_alloc(4 * K, 0, 0).ctx("alloc")?.handle;
        d.map_kernel(s).ctx("map")?;
        d.mem_gpu(true, s, g.id).ctx("map gpu")?;
        d.mem_fill(
            false,
            uapi::ruvm_mem_fill {
                handle: s,
                length: 4 * K,
                seed: 9,
                ..Default::default()
            },
        )
        .ctx("fill")?;
        ce(&d, g.id, a, s, 0, 2000)?;
        let phys = d.gpu_phys(a, g.id, 0, 1).ctx("phys")?.0;
        d.mem_free(a).ctx("free vidmem")?;
        let b = d.vidmem_alloc(g.id, 4 * K, 0, 0).ctx("alloc again")?.handle;
        let again = d.gpu_phys(b, g.id, 0, 1).ctx("phys")?.0;
        ce(&d, g.id, s, b, 0, 2000)?;
        let r = d
            .mem_fill(
                true,
                uapi::ruvm_mem_fill {
                    handle: s,
                    length: 2000,
                    kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
                    seed: 0,
                    ..Default::default()
                },
            )
            .ctx("verify")?;
        check!(
            r.mismatches == 0,
            "GPU {}: a new vidmem mem (at {again:#x}, the old one at {phys:#x}) holds {} old bytes",
            g.id,
            r.mismatches
        );
        d.mem_free(b).ctx("free")?;
        d.mem_free(s).ctx("free")?;
        check_idle(&d, g.id, "after the copies")?;
    }
    Ok(())
}

fn vidmem_pmm_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let g = vid_gpus(&d)?[0].id;
    // Unknown flags and non-zero reserved fields: the ABI table (`abi_*`).
    expect_errno(
        d.pmm_stats(uapi::RUVM_MAX_GPUS + 1),
        Errno::ENODEV,
        "stats of an unknown GPU",
    )?;
    for size in [0, 1, 8 * K, 128 * K, M, 4 * M] {
        expect_errno(
            d.pmm_check_leak(g, size, 1),
            Errno::EINVAL,
            &format!("check-leak chunk size {size}"),
        )?;
    }
    expect_errno(
        d.pmm_check_leak(uapi::RUVM_MAX_GPUS + 1, 4 * K, 1),
        Errno::ENODEV,
        "check-leak of an unknown GPU",
    )?;
    let r = d.pmm_check_leak(g, 4 * K, 0).ctx("limit 0")?;
    check!(r.allocated == 0, "limit 0 took {}", r.allocated);
    child_checks(
        "an unprivileged PMM_CHECK_LEAK was not refused with EPERM (and PMM_STATS was)",
        || {
            setuid(Uid::from_raw(65534)).is_ok()
                && d.pmm_check_leak(g, 4 * K, 1).err() == Some(Errno::EPERM)
                && d.pmm_stats(g).is_ok()
        },
    )?;
    // The vidmem statistics follow a mem.
    let before = d
        .stats_of(uapi::ruvm_backing_RUVM_BACKING_VIDMEM, false)
        .ctx("STATS")?;
    let a = d.vidmem_alloc(g, 100 * K, 0, 0).ctx("alloc")?;
    let during = d
        .stats_of(uapi::ruvm_backing_RUVM_BACKING_VIDMEM, false)
        .ctx("STATS")?;
    check!(
        during.reserved_bytes == before.reserved_bytes + 128 * K
            && during.used_bytes == before.used_bytes + 100 * K
            && during.mems == before.mems + 1
            && during.allocs == before.allocs + 1,
        "vidmem stats {before:?} -> {during:?}"
    );
    d.mem_free(a.handle).ctx("free")?;
    let after = d
        .stats_of(uapi::ruvm_backing_RUVM_BACKING_VIDMEM, false)
        .ctx("STATS")?;
    check!(
        after.reserved_bytes == before.reserved_bytes
            && after.mems == before.mems
            && after.frees == before.frees + 1,
        "vidmem stats after free {after:?}"
    );
    Ok(())
}

/// A GPU without vidmem (the module loaded with `vidmem_mib=0`): `GPU_LIST` shows no capacity,
/// a vidmem allocation is `ENOMEM` (counted as failed, nothing made), the PMM's commands are
/// `ENXIO`, and sysmem is DMA-mapped for it as on any GPU. Skips where every GPU has vidmem.
fn vidmem_none_on_a_gpu_without_any() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let bare: Vec<_> = d
        .gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .filter(|g| present(g) && g.vidmem_size == 0)
        .collect();
    if bare.is_empty() {
        return Err(Stop::Skip("every GPU has vidmem".into()));
    }
    let vid = uapi::ruvm_backing_RUVM_BACKING_VIDMEM;
    for g in &bare {
        let id = g.id;
        let before = d.stats_of(vid, false).ctx("STATS")?;
        let live_before = live(&d)?;
        for chunk in [0, 4 * K, 64 * K, 2 * M] {
            expect_errno(
                d.vidmem_alloc(id, 64 * K, chunk, 0),
                Errno::ENOMEM,
                &format!("vidmem of GPU {id} ({chunk}-byte chunks)"),
            )?;
        }
        let after = d.stats_of(vid, false).ctx("STATS")?;
        check!(
            after.alloc_failures == before.alloc_failures + 4
                && after.mems == before.mems
                && after.allocs == before.allocs
                && live(&d)? == live_before,
            "GPU {id}: refused vidmem left stats {before:?} -> {after:?}"
        );
        expect_errno(
            d.pmm_stats(id),
            Errno::ENXIO,
            &format!("PMM_STATS of GPU {id}"),
        )?;
        expect_errno(
            d.pmm_check_leak(id, 64 * K, 1),
            Errno::ENXIO,
            &format!("PMM_CHECK_LEAK of GPU {id}"),
        )?;
        let m = d.mem_alloc(64 * K, 0, 0).ctx("alloc")?.handle;
        d.mem_gpu(true, m, id).ctx("MAP_GPU")?;
        let q = d.mem_query(m).ctx("query")?;
        check!(
            q.mapped_gpus & (1 << id) != 0,
            "GPU {id}: a sysmem mem mapped for it shows mapped_gpus {:#x}",
            q.mapped_gpus
        );
        d.mem_free(m).ctx("free")?;
    }
    Ok(())
}

const DRIVER: &str = "/sys/bus/pci/drivers/ruvm-edu";

fn vidmem_unbind_with_live_mems() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let Some(g) = gpus.iter().find(|g| {
        present(g) && g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU && g.vidmem_size > 0
    }) else {
        return Err(Stop::Skip("no edu GPU with vidmem (to unbind)".into()));
    };
    let name = pci_name(g);
    // No storage kept anywhere at the start; one storage kept for the GPU (with keeping on).
    drop_kept(&d)?;
    let audit_before = d.audit(false).ctx("AUDIT")?.live;
    let vid = d
        .vidmem_alloc(g.id, 3 * M, 0, 0)
        .ctx("alloc vidmem")?
        .handle;
    let spare = d.vidmem_alloc(g.id, 2 * M, 0, 0).ctx("alloc vidmem")?;
    d.mem_free(spare.handle).ctx("free")?;
    let s = d.mem_alloc(8 * K, 0, 0).ctx("alloc sysmem")?.handle;
    d.mem_gpu(true, s, g.id).ctx("map sysmem")?;
    ce(&d, g.id, vid, s, 0, 16)?;
    std::fs::write(format!("{DRIVER}/unbind"), &name).ctx("unbind")?;
    let gone = (|| -> TestResult {
        // Unusable while the GPU is gone, but still there.
        expect_errno(d.ce_copy(g.id, s, 0, vid, 0, 16), Errno::ENODEV, "copy")?;
        expect_errno(d.mem_gpu(true, vid, g.id), Errno::ENODEV, "map")?;
        expect_errno(d.gpu_phys(vid, g.id, 0, 1), Errno::ENODEV, "address")?;
        expect_errno(
            d.vidmem_alloc(g.id, 4 * K, 0, 0),
            Errno::ENODEV,
            "alloc on the gone GPU",
        )?;
        let q = d.mem_query(vid).ctx("query")?;
        check!(q.gpu == g.id, "query after unbind: GPU {}", q.gpu);
        // The storage went with the GPU (unmapped while it was still bound), the kept one
        // too.
        let live = d.audit(false).ctx("AUDIT")?.live;
        let roots = uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_ROOTS as usize;
        check!(
            live[roots] == audit_before[roots] && live[VIDMEM_KEPT] == 0,
            "root storage left after unbind: {} (was {}), {} kept",
            live[roots],
            audit_before[roots],
            live[VIDMEM_KEPT]
        );
        Ok(())
    })();
    let rebind = std::fs::write(format!("{DRIVER}/bind"), &name).ctx("bind");
    gone?;
    rebind?;
    // Back (same id, a new memory): the old mem stays unusable, a new one works.
    d.mem_gpu(true, s, g.id).ctx("map sysmem again")?;
    expect_errno(
        d.ce_copy(g.id, s, 0, vid, 0, 16),
        Errno::ENODEV,
        "copy from vidmem of the earlier binding",
    )?;
    expect_errno(
        d.gpu_phys(vid, g.id, 0, 1),
        Errno::ENODEV,
        "address of vidmem of the earlier binding",
    )?;
    check_idle(&d, g.id, "after rebind")?;
    let fresh = d
        .vidmem_alloc(g.id, 4 * K, 0, 0)
        .ctx("alloc after rebind")?
        .handle;
    ce(&d, g.id, fresh, s, 0, 16)?;
    for h in [vid, s, fresh] {
        d.mem_free(h).ctx("free")?;
    }
    let live = d.audit(false).ctx("AUDIT")?.live;
    check!(
        same_but(&live, &audit_before, VIDMEM_KEPT) && live[VIDMEM_KEPT] <= 1,
        "something was left after freeing everything: {live:?} from {audit_before:?}"
    );
    drop_kept(&d)?;
    check_idle(&d, g.id, "at the end")?;
    Ok(())
}
