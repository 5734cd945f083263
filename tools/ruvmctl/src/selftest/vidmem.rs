// SPDX-License-Identifier: GPL-2.0

//! Vidmem: each GPU's memory, its PMM (uvm's chunk tree), vidmem mems, and
//! bytes moved in and out of it by the GPU's copy engine.

use nix::errno::Errno;
use nix::unistd::{setuid, Uid};

use super::harness::{cases, check, child_checks, expect_errno, Case, Context, Stop, TestResult};
use libruvm::{pci_name, uapi, Ruvm, UserMap};

use super::shared::{
    drop_kept, fill, live, meminfo, reclaim_in_child, reclaim_root, same_but, VIDMEM_KEPT,
};
use crate::pattern;

mod bytes;
mod kept;
mod limits;
mod refusals;
use bytes::*;
use kept::*;
use limits::*;
use refusals::*;

const K: u64 = 1024;
const M: u64 = 1024 * K;
/// The PMM's chunk sizes, in the order of `ruvm_pmm_stats.allocated`.
const SIZES: [u64; 3] = [4 * K, 64 * K, 2 * M];

pub fn cases() -> Vec<Case> {
    cases![
        vidmem_limit_dmem_bounds_each_cgroup,
        vidmem_limit_dmem_every_path_gives_back,
        vidmem_limit_dmem_gpu_removed_and_back,
        vidmem_limit_per_user,
        vidmem_chunk_rules_for_every_page_size,
        vidmem_mappings_and_addresses,
        vidmem_root_chunk_splits_and_merges_back,
        vidmem_storage_kept_for_reuse,
        vidmem_kept_storage_shrinks_under_memory_pressure,
        vidmem_exhaustion_and_recovery,
        vidmem_ce_round_trip_through_vidmem,
        vidmem_known_zero_chunks_and_every_write,
        vidmem_pmm_bad_inputs,
        vidmem_unbind_with_live_mems,
        vidmem_none_on_a_gpu_without_any,
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
