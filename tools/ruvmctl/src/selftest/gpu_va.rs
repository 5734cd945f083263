// SPDX-License-Identifier: GPL-2.0

//! GPU virtual mappings: mems mapped in the GPU kernel VA window of the simulated GPUs (which
//! have an MMU), copies by the engine through those VAs, the walk of the page tables as
//! written, and the page-table memory given back. uvm_mem_test's `test_map_gpu` first.

use nix::{
    errno::Errno,
    unistd::{setuid, Uid},
};

use super::harness::{cases, check, child_checks, expect_errno, Case, Context, Stop, TestResult};
use super::shared::{fill, live, mismatches};
use libruvm::{cmd, uapi, Ruvm};

mod refusals;
mod tables;
mod user;
use refusals::*;
use tables::*;
use user::*;

const K: u64 = 1024;
const M: u64 = 1024 * K;
const BASE: u64 = uapi::RUVM_GPU_KERNEL_VA_BASE;
const WINDOW: u64 = uapi::RUVM_GPU_KERNEL_VA_SIZE;
const PT_TABLES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_PT_TABLES as usize;
const PT_BYTES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_PT_BYTES as usize;
const KVAS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_GPU_KERNEL_VAS as usize;
/// PTE bit 6: read-only (MMU version 2).
const PTE_READ_ONLY: u64 = 1 << 6;

pub fn cases() -> Vec<Case> {
    cases![
        gpu_va_test_map_gpu_matrix,
        gpu_va_data_through_vas,
        gpu_va_mixed_page_sizes_share_a_pde0,
        gpu_va_walk_reads_the_tables_as_written,
        gpu_va_no_stale_tlb_entry,
        gpu_va_teardown_order,
        gpu_va_bad_inputs,
        gpu_va_unmap_walk_and_pt_write_errnos,
        gpu_va_gpu_removed_while_mapped,
        gpu_va_user_map_rules,
        gpu_va_user_data_read_only_and_separate_spaces,
        gpu_va_user_space_goes_with_the_file,
    ]
}

fn present(g: &uapi::ruvm_gpu_info) -> bool {
    g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
}

fn has_mmu(g: &uapi::ruvm_gpu_info) -> bool {
    present(g) && g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_MMU != 0
}

/// The present GPUs with an MMU; skips the case without any.
fn mmu_gpus(d: &Ruvm) -> Result<Vec<uapi::ruvm_gpu_info>, Stop> {
    let v: Vec<_> = d
        .gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .filter(has_mmu)
        .collect();
    if v.is_empty() {
        return Err(Stop::Skip(
            "no GPU with an MMU (simulated GPUs: sim_gpus=N)".into(),
        ));
    }
    Ok(v)
}

/// No page table, no kernel VA offset anywhere.
fn check_no_page_tables(d: &Ruvm, when: &str) -> TestResult {
    let l = live(d)?;
    check!(
        l[PT_TABLES] == 0 && l[PT_BYTES] == 0 && l[KVAS] == 0,
        "{when}: pt_tables={} pt_bytes={} gpu_kernel_vas={}, wanted 0",
        l[PT_TABLES],
        l[PT_BYTES],
        l[KVAS]
    );
    Ok(())
}

/// The GPU page size uvm_mem maps a mem's chunks with.
fn want_page_size(vidmem: bool, chunk: u64, gpu_page_sizes: u64) -> u64 {
    if vidmem {
        return chunk;
    }
    let fit = gpu_page_sizes & (chunk | (chunk - 1));
    1 << (63 - fit.leading_zeros())
}

/// uvm_mem_test's `test_map_gpu` for one mem: map on every GPU it may be mapped on, the same
/// aligned VA in the window everywhere, idempotent both ways, and the same VA after a remap.
fn check_map_gpu(d: &Ruvm, a: &uapi::ruvm_mem_alloc, gpus: &[uapi::ruvm_gpu_info]) -> TestResult {
    let vid = a.backing == uapi::ruvm_backing_RUVM_BACKING_VIDMEM;
    let mut va = None;
    for g in gpus {
        let mine = !vid || g.id == a.gpu;
        let r = d.mem_gpu_kernel(true, a.handle, g.id);
        if !mine {
            expect_errno(r, Errno::EINVAL, "vidmem kernel-mapped on another GPU")?;
            continue;
        }
        r.ctx("MAP_GPU_KERNEL")?;
        let q = d.mem_query(a.handle).ctx("query")?;
        check!(
            q.mapped & u64::from(uapi::ruvm_mapped_RUVM_MAPPED_GPU_KERNEL) != 0,
            "mem {}: mapped bits {:#x} without GPU_KERNEL",
            a.handle,
            q.mapped
        );
        let (v, ps) = d.gpu_va(a.handle, g.id, false).ctx("GPU_VA")?;
        check!(
            q.gpu_kernel_va == v,
            "mem {}: query says GPU kernel VA {:#x}, GPU_VA {v:#x}",
            a.handle,
            q.gpu_kernel_va
        );
        check!(
            v >= BASE && v + a.chunk_count * a.chunk_size <= BASE + WINDOW && v % a.chunk_size == 0,
            "mem {} ({} bytes, chunk {}): VA {v:#x} not aligned inside the window",
            a.handle,
            a.chunk_count * a.chunk_size,
            a.chunk_size
        );
        check!(
            ps == want_page_size(vid, a.chunk_size, g.page_sizes),
            "mem {} chunk {}: page size {ps}",
            a.handle,
            a.chunk_size
        );
        check!(
            *va.get_or_insert(v) == v,
            "mem {}: VA {v:#x} on GPU {}, {:#x} on another",
            a.handle,
            g.id,
            va.unwrap_or(0)
        );
        d.mem_gpu_kernel(true, a.handle, g.id)
            .ctx("second MAP_GPU_KERNEL")?;
        check!(
            d.gpu_va(a.handle, g.id, false).ctx("GPU_VA")?.0 == v,
            "a second map moved the VA"
        );
    }
    let Some(va) = va else {
        return Ok(());
    };
    // Unmap everywhere (twice), then the offset comes back the same on a remap (first fit).
    for g in gpus {
        d.mem_gpu_kernel(false, a.handle, g.id)
            .ctx("UNMAP_GPU_KERNEL")?;
        d.mem_gpu_kernel(false, a.handle, g.id)
            .ctx("second UNMAP_GPU_KERNEL")?;
        expect_errno(
            d.gpu_va(a.handle, g.id, false),
            Errno::ENXIO,
            "GPU_VA after unmap",
        )?;
    }
    let q = d.mem_query(a.handle).ctx("query")?;
    check!(
        q.mapped & u64::from(uapi::ruvm_mapped_RUVM_MAPPED_GPU_KERNEL) == 0 && q.gpu_kernel_va == 0,
        "GPU_KERNEL still set (VA {:#x}) after unmapping everywhere",
        q.gpu_kernel_va
    );
    for g in gpus.iter().filter(|g| !vid || g.id == a.gpu) {
        d.mem_gpu_kernel(true, a.handle, g.id).ctx("remap")?;
        let (v, _) = d.gpu_va(a.handle, g.id, false).ctx("GPU_VA")?;
        check!(v == va, "remap gave VA {v:#x}, first {va:#x}");
    }
    Ok(())
}

fn gpu_va_test_map_gpu_matrix() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = mmu_gpus(&d)?;
    check_no_page_tables(&d, "before")?;
    let sizes = [1, 4, 16, 1024, 4096, M, 7 * M + 17];
    let mut mems = Vec::new();
    for &size in &sizes {
        for page_size in [0, 4 * K, 64 * K, 128 * K, 2 * M] {
            mems.push(d.mem_alloc(size, page_size, 0).ctx("alloc")?);
        }
        for g in gpus.iter().filter(|g| g.vidmem_size > 0) {
            for page_size in [0, 4 * K, 64 * K, 2 * M] {
                match d.vidmem_alloc(g.id, size, page_size, 0) {
                    Ok(a) => mems.push(a),
                    // Small vidmem: the 7 MiB cases may not fit with everything else alive.
                    Err(Errno::ENOMEM) => {}
                    Err(e) => return Err(Stop::Fail(format!("vidmem alloc: {e}"))),
                }
            }
        }
    }
    // All mapped and alive at once, as uvm_mem_test keeps them.
    for a in &mems {
        check_map_gpu(&d, a, &gpus)?;
    }
    let l = live(&d)?;
    check!(
        l[PT_TABLES] > 0 && l[PT_BYTES] == l[PT_TABLES] * 4096,
        "page tables while mapped: {} tables, {} bytes",
        l[PT_TABLES],
        l[PT_BYTES]
    );
    check!(
        l[KVAS] == mems.len() as u64,
        "{} kernel VA offsets for {} mapped mems",
        l[KVAS],
        mems.len()
    );
    // Freed with their mappings alive.
    for a in &mems {
        d.mem_free(a.handle).ctx("free")?;
    }
    check_no_page_tables(&d, "after freeing every mapped mem")?;
    for g in gpus.iter().filter(|g| g.vidmem_size > 0) {
        let s = d.pmm_stats(g.id).ctx("PMM_STATS")?;
        check!(
            s.free == s.capacity && s.pt_tables == 0 && s.pt_bytes == 0,
            "GPU {}: PMM not back where it started: {s:?}",
            g.id
        );
    }
    Ok(())
}

/// A sysmem mem of `size` in chunks of `chunk`, filled with the pattern of `seed` and mapped
/// at its GPU kernel VA on `gpu`: its handle and VA.
fn mapped_source(d: &Ruvm, gpu: u32, size: u64, chunk: u64, seed: u64) -> Result<(u64, u64), Stop> {
    let a = d.mem_alloc(size, chunk, 0).ctx("alloc")?;
    fill(d, a.handle, size, seed)?;
    d.mem_gpu_kernel(true, a.handle, gpu)
        .ctx("MAP_GPU_KERNEL")?;
    let (va, _) = d.gpu_va(a.handle, gpu, false).ctx("GPU_VA")?;
    Ok((a.handle, va))
}

fn gpu_va_data_through_vas() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for g in mmu_gpus(&d)? {
        // Every page size: 4K, 64K (from 64K and from 128K chunks) and 2M.
        for (size, chunk) in [
            (3 * 4 * K + 5, 4 * K),
            (5 * 64 * K, 64 * K),
            (512 * K, 128 * K),
            (2 * 2 * M, 2 * M),
        ] {
            let seed = size ^ chunk;
            let (src, src_va) = mapped_source(&d, g.id, size, chunk, seed)?;
            let dst = d
                .mem_alloc(size, chunk, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
                .ctx("alloc")?;
            d.mem_gpu_kernel(true, dst.handle, g.id)
                .ctx("MAP_GPU_KERNEL")?;
            let (dst_va, _) = d.gpu_va(dst.handle, g.id, false).ctx("GPU_VA")?;
            d.ce_copy_va(g.id, dst_va, src_va, size, false)
                .ctx("CE_COPY_VA")?;
            let bad = mismatches(&d, dst.handle, size, seed)?;
            check!(
                bad == 0,
                "GPU {} chunk {chunk}: {bad} bytes wrong after a VA->VA copy",
                g.id
            );
            // VA -> vidmem, read back by the engine through DMA addresses.
            if g.vidmem_size > 0 {
                let v = d.vidmem_alloc(g.id, size, 0, 0).ctx("vidmem alloc")?;
                d.mem_gpu_kernel(true, v.handle, g.id)
                    .ctx("MAP_GPU_KERNEL vidmem")?;
                let (v_va, _) = d.gpu_va(v.handle, g.id, false).ctx("GPU_VA")?;
                d.ce_copy_va(g.id, v_va, src_va, size, false)
                    .ctx("CE_COPY_VA to vidmem")?;
                let back = d.mem_alloc(size, 0, 0).ctx("alloc")?;
                d.mem_gpu(true, back.handle, g.id).ctx("MAP_GPU")?;
                d.ce_copy(g.id, back.handle, 0, v.handle, 0, size)
                    .ctx("CE_COPY")?;
                let bad = mismatches(&d, back.handle, size, seed)?;
                check!(bad == 0, "GPU {}: {bad} bytes wrong through vidmem", g.id);
                for h in [v.handle, back.handle] {
                    d.mem_free(h).ctx("free")?;
                }
            }
            for h in [src, dst.handle] {
                d.mem_free(h).ctx("free")?;
            }
        }
    }
    check_no_page_tables(&d, "after")
}

fn gpu_va_mixed_page_sizes_share_a_pde0() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    check_no_page_tables(&d, "before")?;
    for g in mmu_gpus(&d)? {
        // First fit: both land in the window's first 2 MiB, one PDE0 entry with both tables.
        let (small, small_va) = mapped_source(&d, g.id, 12 * K, 4 * K, 11)?;
        let (big, big_va) = mapped_source(&d, g.id, 128 * K, 64 * K, 22)?;
        check!(
            small_va / (2 * M) == big_va / (2 * M),
            "4K mem at {small_va:#x} and 64K mem at {big_va:#x} are not in one 2 MiB range"
        );
        let ws = d.pt_walk(g.id, small_va + 4 * K, false).ctx("PT_WALK")?;
        let wb = d.pt_walk(g.id, big_va + 64 * K + 8, false).ctx("PT_WALK")?;
        check!(
            ws.fault == 0 && ws.page_size == 4 * K && wb.fault == 0 && wb.page_size == 64 * K,
            "walks: 4K mem page {} fault {}, 64K mem page {} fault {}",
            ws.page_size,
            ws.fault,
            wb.page_size,
            wb.fault
        );
        // The same PDE0 word pair: both halves set.
        check!(
            ws.entry[3] == wb.entry[3]
                && ws.entry[4] == wb.entry[4]
                && ws.entry[3] != 0
                && ws.entry[4] != 0,
            "PDE0 halves {:#x}/{:#x} and {:#x}/{:#x}",
            ws.entry[3],
            ws.entry[4],
            wb.entry[3],
            wb.entry[4]
        );
        // The walk's address is the DMA address of the chunk.
        let (dma, _) = d.gpu_phys(small, g.id, 4 * K, 1).ctx("GPU_PHYS")?;
        check!(
            ws.address == dma,
            "walk says {:#x}, DMA address {dma:#x}",
            ws.address
        );
        // Copy from the 64K-paged mem into the 4K-paged one and back.
        d.ce_copy_va(g.id, small_va, big_va, 12 * K, false)
            .ctx("CE_COPY_VA")?;
        let bad = mismatches(&d, small, 12 * K, 22)?;
        check!(bad == 0, "{bad} bytes wrong 64K->4K pages");
        for h in [small, big] {
            d.mem_free(h).ctx("free")?;
        }
    }
    check_no_page_tables(&d, "after")
}
