// SPDX-License-Identifier: GPL-2.0

//! GPU virtual mappings: mems mapped in the GPU kernel VA window of the simulated GPUs (which
//! have an MMU), copies by the engine through those VAs, the walk of the page tables as
//! written, and the page-table memory given back. uvm_mem_test's `test_map_gpu` first.

use nix::{
    errno::Errno,
    unistd::{setuid, Uid},
};

use super::harness::{check, child_checks, expect_errno, Case, Context, Stop, TestResult};
use super::shared::{fill, live, mismatches};
use libruvm::{cmd, uapi, Ruvm};

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
    vec![
        Case {
            name: "gpu_va_test_map_gpu_matrix",
            run: gpu_va_test_map_gpu_matrix,
        },
        Case {
            name: "gpu_va_data_through_vas",
            run: gpu_va_data_through_vas,
        },
        Case {
            name: "gpu_va_mixed_page_sizes_share_a_pde0",
            run: gpu_va_mixed_page_sizes_share_a_pde0,
        },
        Case {
            name: "gpu_va_walk_reads_the_tables_as_written",
            run: gpu_va_walk_reads_the_tables_as_written,
        },
        Case {
            name: "gpu_va_no_stale_tlb_entry",
            run: gpu_va_no_stale_tlb_entry,
        },
        Case {
            name: "gpu_va_teardown_order",
            run: gpu_va_teardown_order,
        },
        Case {
            name: "gpu_va_bad_inputs",
            run: gpu_va_bad_inputs,
        },
        Case {
            name: "gpu_va_unmap_walk_and_pt_write_errnos",
            run: gpu_va_unmap_walk_and_pt_write_errnos,
        },
        Case {
            name: "gpu_va_gpu_removed_while_mapped",
            run: gpu_va_gpu_removed_while_mapped,
        },
        Case {
            name: "gpu_va_user_map_rules",
            run: gpu_va_user_map_rules,
        },
        Case {
            name: "gpu_va_user_data_read_only_and_separate_spaces",
            run: gpu_va_user_data_read_only_and_separate_spaces,
        },
        Case {
            name: "gpu_va_user_space_goes_with_the_file",
            run: gpu_va_user_space_goes_with_the_file,
        },
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

/// `ENOSYS`: the test ioctls are off; skip.
fn test_ioctls(r: Result<u64, Errno>) -> Result<u64, Stop> {
    match r {
        Err(Errno::ENOSYS) => Err(Stop::Skip("needs enable_test_ioctls=1".into())),
        r => r.ctx("TEST_PT_WRITE"),
    }
}

fn gpu_va_walk_reads_the_tables_as_written() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for g in mmu_gpus(&d)? {
        for chunk in [4 * K, 64 * K, 2 * M] {
            let (src, src_va) = mapped_source(&d, g.id, 2 * chunk, chunk, 7)?;
            let (dst, dst_va) = mapped_source(&d, g.id, 2 * chunk, chunk, 8)?;
            d.ce_copy_va(g.id, dst_va, src_va, 16, false)
                .ctx("copy before")?;
            // An invalid PTE: the next copy faults, with the TLB filled a moment ago.
            let old = test_ioctls(d.test_pt_write(g.id, src_va + chunk, 0, false))?;
            check!(old & 1 == 1, "old entry {old:#x} not a valid PTE");
            expect_errno(
                d.ce_copy_va(g.id, dst_va, src_va + chunk, 16, false),
                Errno::EFAULT,
                "copy through an invalidated PTE",
            )?;
            let w = d.pt_walk(g.id, src_va + chunk, false).ctx("PT_WALK")?;
            check!(
                w.fault == uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_PTE
                    || w.fault == uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_PDE,
                "walk of an invalidated page: fault {}",
                w.fault
            );
            // The first page is untouched; restoring the entry restores the copy.
            d.ce_copy_va(g.id, dst_va, src_va, 16, false)
                .ctx("copy of the other page")?;
            test_ioctls(d.test_pt_write(g.id, src_va + chunk, old, false))?;
            d.ce_copy_va(g.id, dst_va, src_va + chunk, 16, false)
                .ctx("copy after restoring")?;
            // Read-only: reading works, writing faults.
            test_ioctls(d.test_pt_write(
                g.id,
                dst_va,
                old_entry(&d, g.id, dst_va)? | PTE_READ_ONLY,
                false,
            ))?;
            d.ce_copy_va(g.id, src_va, dst_va, 16, false)
                .ctx("read from a read-only page")?;
            expect_errno(
                d.ce_copy_va(g.id, dst_va, src_va, 16, false),
                Errno::EFAULT,
                "write to a read-only page",
            )?;
            let w = d.pt_walk(g.id, dst_va, false).ctx("PT_WALK")?;
            check!(
                w.fault == 0,
                "read walk of a read-only page faulted {}",
                w.fault
            );
            for h in [src, dst] {
                d.mem_free(h).ctx("free")?;
            }
        }
    }
    check_no_page_tables(&d, "after")
}

/// The leaf entry mapping `va` now.
fn old_entry(d: &Ruvm, gpu: u32, va: u64) -> Result<u64, Stop> {
    let w = d.pt_walk(gpu, va, false).ctx("PT_WALK")?;
    check!(
        w.fault == 0 && w.count >= 5,
        "walk of {va:#x}: fault {}",
        w.fault
    );
    let leaf = if w.page_size == 2 * M {
        3
    } else {
        w.count as usize - 1
    };
    Ok(w.entry[leaf])
}

fn gpu_va_no_stale_tlb_entry() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for g in mmu_gpus(&d)? {
        let (a, a_va) = mapped_source(&d, g.id, 64 * K, 4 * K, 100)?;
        let b = d.mem_alloc(64 * K, 4 * K, 0).ctx("alloc")?;
        fill(&d, b.handle, 64 * K, 200)?;
        let dst = d
            .mem_alloc(64 * K, 4 * K, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
            .ctx("alloc")?;
        d.map_kernel(dst.handle).ctx("MAP_CPU_KERNEL")?;
        d.mem_gpu_kernel(true, dst.handle, g.id)
            .ctx("MAP_GPU_KERNEL")?;
        let (dst_va, _) = d.gpu_va(dst.handle, g.id, false).ctx("GPU_VA")?;
        // Fill the TLB with A's translations.
        d.ce_copy_va(g.id, dst_va, a_va, 64 * K, false)
            .ctx("copy A")?;
        check!(
            mismatches(&d, dst.handle, 64 * K, 100)? == 0,
            "A's bytes not copied"
        );
        // A goes (its DMA mapping stays: the stale translation would still reach A's bytes),
        // B takes the same VA.
        d.mem_gpu_kernel(false, a, g.id).ctx("UNMAP_GPU_KERNEL")?;
        expect_errno(
            d.ce_copy_va(g.id, dst_va, a_va, 16, false),
            Errno::EFAULT,
            "copy through an unmapped VA",
        )?;
        d.mem_gpu_kernel(true, b.handle, g.id)
            .ctx("MAP_GPU_KERNEL B")?;
        let (b_va, _) = d.gpu_va(b.handle, g.id, false).ctx("GPU_VA")?;
        check!(
            b_va == a_va,
            "B got {b_va:#x}, A had {a_va:#x}: the test needs the same VA"
        );
        d.ce_copy_va(g.id, dst_va, b_va, 64 * K, false)
            .ctx("copy B")?;
        let bad = mismatches(&d, dst.handle, 64 * K, 200)?;
        check!(
            bad == 0,
            "{bad} bytes are not B's: a stale TLB entry was used"
        );
        for h in [a, b.handle, dst.handle] {
            d.mem_free(h).ctx("free")?;
        }
    }
    check_no_page_tables(&d, "after")
}

fn gpu_va_teardown_order() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = mmu_gpus(&d)?;
    let (h, va) = mapped_source(&d, gpus[0].id, 256 * K, 64 * K, 5)?;
    for g in &gpus {
        d.mem_gpu_kernel(true, h, g.id).ctx("MAP_GPU_KERNEL")?;
    }
    // Dropping a GPU's DMA table drops its virtual mapping first; the other GPUs keep theirs.
    d.mem_gpu(false, h, gpus[0].id).ctx("UNMAP_GPU")?;
    expect_errno(
        d.gpu_va(h, gpus[0].id, false),
        Errno::ENXIO,
        "GPU_VA after UNMAP_GPU",
    )?;
    expect_errno(
        d.ce_copy_va(gpus[0].id, va, va, 8, false),
        Errno::EFAULT,
        "copy after UNMAP_GPU",
    )?;
    for g in gpus.iter().skip(1) {
        check!(
            d.gpu_va(h, g.id, false).ctx("GPU_VA")?.0 == va,
            "GPU {} lost its mapping",
            g.id
        );
    }
    // The implicit DMA map of MAP_GPU_KERNEL.
    let q = d.mem_query(h).ctx("query")?;
    let others: u64 = gpus.iter().skip(1).map(|g| 1u64 << g.id).sum();
    check!(
        q.mapped_gpus == others,
        "DMA tables {:#x}, wanted {others:#x}",
        q.mapped_gpus
    );
    d.mem_free(h).ctx("free with mappings alive")?;
    check_no_page_tables(&d, "after")?;
    let l = live(&d)?;
    check!(
        l[uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS as usize] == 0,
        "DMA mappings left: {}",
        l[uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS as usize]
    );
    Ok(())
}

fn gpu_va_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let all = d.gpus().ctx("GPU_LIST")?;
    let a = d.mem_alloc(64 * K, 0, 0).ctx("alloc")?;
    // A GPU without an MMU (the edu test GPUs): EOPNOTSUPP, checked wherever there is one.
    for g in all.iter().filter(|g| present(g) && !has_mmu(g)) {
        expect_errno(
            d.mem_gpu_kernel(true, a.handle, g.id),
            Errno::EOPNOTSUPP,
            "map on a GPU without an MMU",
        )?;
        expect_errno(
            d.ce_copy_va(g.id, BASE, BASE, 8, false),
            Errno::EOPNOTSUPP,
            "copy on a GPU without an MMU",
        )?;
    }
    let gpus = mmu_gpus(&d)?;
    let g = gpus[0].id;
    expect_errno(
        d.mem_gpu_kernel(true, a.handle, 31),
        Errno::ENODEV,
        "unknown GPU",
    )?;
    expect_errno(
        d.mem_gpu_kernel(true, 0xdead, g),
        Errno::ENOENT,
        "unknown handle",
    )?;
    expect_errno(
        d.gpu_va(a.handle, g, false),
        Errno::ENXIO,
        "GPU_VA of an unmapped mem",
    )?;
    // Reserved fields and flags.
    let mut m = uapi::ruvm_mem_gpu {
        handle: a.handle,
        gpu: g,
        ..Default::default()
    };
    m.reserved[1] = 1;
    expect_errno(
        d.call(cmd::MEM_MAP_GPU_KERNEL, &mut m),
        Errno::EINVAL,
        "reserved field",
    )?;
    m.reserved[1] = 0;
    m.flags = 1;
    expect_errno(
        d.call(cmd::MEM_MAP_GPU_KERNEL, &mut m),
        Errno::EINVAL,
        "unknown flag",
    )?;
    let mut c = uapi::ruvm_ce_copy_va {
        gpu: g,
        dst_va: BASE,
        src_va: BASE,
        length: 8,
        ..Default::default()
    };
    c.reserved[0] = 1;
    expect_errno(
        d.call(cmd::CE_COPY_VA, &mut c),
        Errno::EINVAL,
        "CE_COPY_VA reserved",
    )?;
    // Another file's mem.
    let other = Ruvm::open().ctx("open")?;
    let b = other.mem_alloc(4 * K, 0, 0).ctx("alloc")?;
    expect_errno(
        d.mem_gpu_kernel(true, b.handle, g),
        Errno::ENOENT,
        "another file's mem",
    )?;
    // Copies: length 0, overflow, past the VA width, unmapped.
    d.mem_gpu_kernel(true, a.handle, g).ctx("MAP_GPU_KERNEL")?;
    let (va, _) = d.gpu_va(a.handle, g, false).ctx("GPU_VA")?;
    expect_errno(
        d.ce_copy_va(g, va, va + 4 * K, 0, false),
        Errno::EINVAL,
        "length 0",
    )?;
    expect_errno(
        d.ce_copy_va(g, u64::MAX - 4, va, 8, false),
        Errno::EINVAL,
        "range wraps",
    )?;
    expect_errno(
        d.ce_copy_va(g, va, 1 << 49, 8, false),
        Errno::EFAULT,
        "VA past 49 bits",
    )?;
    expect_errno(
        d.ce_copy_va(g, va, va + 64 * K, 8, false),
        Errno::EFAULT,
        "past the mem's end",
    )?;
    let w = d.pt_walk(g, 1 << 49, false).ctx("PT_WALK")?;
    check!(
        w.fault == uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_VA_RANGE,
        "walk past the VA width: fault {}",
        w.fault
    );
    // A freed mem is gone, mappings and all.
    d.mem_free(a.handle).ctx("free")?;
    expect_errno(
        d.mem_gpu_kernel(true, a.handle, g),
        Errno::ENOENT,
        "freed mem",
    )?;
    expect_errno(
        d.ce_copy_va(g, va, va, 8, false),
        Errno::EFAULT,
        "copy through a freed mem's VA",
    )?;
    // Vidmem of another GPU.
    if let Some(vg) = gpus.iter().find(|g| g.vidmem_size > 0) {
        if let Some(o) = gpus.iter().find(|o| o.id != vg.id) {
            let v = d.vidmem_alloc(vg.id, 64 * K, 0, 0).ctx("vidmem alloc")?;
            expect_errno(
                d.mem_gpu_kernel(true, v.handle, o.id),
                Errno::EINVAL,
                "vidmem on another GPU",
            )?;
            d.mem_free(v.handle).ctx("free")?;
        }
    }
    other.mem_free(b.handle).ctx("free")?;
    check_no_page_tables(&d, "after")
}

/// The errnos of the commands besides the maps: unmaps, walks and the test PTE write.
fn gpu_va_unmap_walk_and_pt_write_errnos() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let all = d.gpus().ctx("GPU_LIST")?;
    for g in all.iter().filter(|g| present(g) && !has_mmu(g)) {
        expect_errno(
            d.pt_walk(g.id, BASE, false),
            Errno::EOPNOTSUPP,
            "walk on a GPU without an MMU",
        )?;
        match d.test_pt_write(g.id, BASE, 0, false) {
            Err(Errno::ENOSYS) => {}
            r => expect_errno(r, Errno::EOPNOTSUPP, "PTE write on a GPU without an MMU")?,
        }
    }
    let gpus = mmu_gpus(&d)?;
    let g = gpus[0].id;
    // Unmaps: an unknown handle is ENOENT; a GPU that is not there has nothing mapped.
    for user in [false, true] {
        let r = if user {
            d.unmap_gpu_user(0xdead, g)
        } else {
            d.mem_gpu_kernel(false, 0xdead, g)
        };
        expect_errno(r, Errno::ENOENT, "unmap of an unknown handle")?;
    }
    let a = d.mem_alloc(64 * K, 0, 0).ctx("alloc")?;
    d.mem_gpu_kernel(false, a.handle, 31)
        .ctx("UNMAP_GPU_KERNEL on a GPU that is not there")?;
    d.unmap_gpu_user(a.handle, 31)
        .ctx("UNMAP_GPU_USER on a GPU that is not there")?;
    let mut m = uapi::ruvm_mem_gpu {
        handle: a.handle,
        gpu: g,
        flags: 1,
        ..Default::default()
    };
    for nr in [cmd::MEM_UNMAP_GPU_KERNEL, cmd::MEM_UNMAP_GPU_USER] {
        expect_errno(d.call(nr, &mut m), Errno::EINVAL, "unmap with a flag")?;
    }
    // Walks: unknown GPU, reserved; a walk of nothing mapped is a fault, not an error.
    expect_errno(d.pt_walk(31, BASE, false), Errno::ENODEV, "walk on GPU 31")?;
    let mut w = uapi::ruvm_gpu_pt_walk {
        gpu: g,
        va: BASE,
        ..Default::default()
    };
    w.reserved[0] = 1;
    expect_errno(
        d.call(cmd::GPU_PT_WALK, &mut w),
        Errno::EINVAL,
        "walk reserved",
    )?;
    let w = d.pt_walk(g, BASE, false).ctx("PT_WALK of nothing")?;
    check!(
        w.fault == uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_PDE,
        "walk of an empty space: fault {}",
        w.fault
    );
    // The test PTE write: ENXIO wherever the walk ends above the leaf level.
    match d.test_pt_write(g, BASE, 0, false) {
        Err(Errno::ENOSYS) => {}
        r => {
            expect_errno(r, Errno::ENXIO, "PTE write in an empty space")?;
            d.mem_gpu_kernel(true, a.handle, g).ctx("MAP_GPU_KERNEL")?;
            let (va, _) = d.gpu_va(a.handle, g, false).ctx("GPU_VA")?;
            // 512 MiB on: another PDE1 entry, with no PDE0 table under it.
            expect_errno(
                d.test_pt_write(g, va + 512 * M, 0, false),
                Errno::ENXIO,
                "PTE write where the walk ends at PDE1",
            )?;
            expect_errno(
                d.test_pt_write(31, va, 0, false),
                Errno::ENODEV,
                "PTE write on GPU 31",
            )?;
            // The mapping is intact.
            let w = d.pt_walk(g, va, false).ctx("PT_WALK")?;
            check!(
                w.fault == uapi::ruvm_mmu_fault_RUVM_MMU_OK,
                "the mapping after refused writes: fault {}",
                w.fault
            );
            d.mem_gpu_kernel(false, a.handle, g)
                .ctx("UNMAP_GPU_KERNEL")?;
        }
    }
    // Without CAP_SYS_ADMIN: walks and kernel-space copies are refused, user-space copies are
    // not (nothing is mapped there: a fault).
    child_checks(
        "unprivileged walk or kernel VA copy not refused with EPERM",
        || {
            setuid(Uid::from_raw(65534)).is_ok()
                && d.pt_walk(g, BASE, false).err() == Some(Errno::EPERM)
                && d.pt_walk(g, BASE, true).err() == Some(Errno::EPERM)
                && d.ce_copy_va(g, BASE, BASE + 8, 8, false) == Err(Errno::EPERM)
                && d.ce_copy_va(g, 0x10_0000_0000, 0x10_0000_1000, 8, true) == Err(Errno::EFAULT)
                && matches!(
                    d.test_pt_write(g, BASE, 0, false),
                    Err(Errno::EPERM | Errno::ENOSYS)
                )
        },
    )?;
    d.mem_free(a.handle).ctx("free")?;
    check_no_page_tables(&d, "after")
}

/// Brings a removed simulated GPU back when dropped (so a failed case leaves it there).
struct BringBack<'a>(&'a Ruvm, u32);

impl Drop for BringBack<'_> {
    fn drop(&mut self) {
        // EEXIST: back already.
        let _ = self.0.test_sim_gpu(self.1, true);
    }
}

/// uvm_mem's rule for a GPU that goes while mems are mapped on it: its virtual mappings and
/// page tables go with it, the mems stay usable on the other GPUs and free to free. The
/// simulated GPU is removed as an unbind would (`TEST_SIM_GPU`), then brought back.
fn gpu_va_gpu_removed_while_mapped() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = mmu_gpus(&d)?;
    let Some(victim) = gpus.last().map(|g| g.id) else {
        return Err(Stop::Skip("no GPU with an MMU".into()));
    };
    match d.test_sim_gpu(u32::MAX, true) {
        Err(Errno::ENOSYS) => return Err(Stop::Skip("needs enable_test_ioctls=1".into())),
        r => expect_errno(r, Errno::EINVAL, "TEST_SIM_GPU of no GPU")?,
    }
    expect_errno(
        d.test_sim_gpu(victim, true),
        Errno::EEXIST,
        "adding a GPU that is there",
    )?;
    for g in d
        .gpus()
        .ctx("GPU_LIST")?
        .iter()
        .filter(|g| present(g) && !has_mmu(g))
    {
        expect_errno(
            d.test_sim_gpu(g.id, false),
            Errno::EINVAL,
            "removing a GPU that is not simulated",
        )?;
    }
    let mut bad = uapi::ruvm_test_sim_gpu {
        gpu: victim,
        op: 3,
        ..Default::default()
    };
    expect_errno(d.call(cmd::TEST_SIM_GPU, &mut bad), Errno::EINVAL, "op 3")?;
    let other = gpus.first().map(|g| g.id).filter(|&g| g != victim);
    let size = 256 * K;
    let (a, va) = mapped_source(&d, victim, size, 64 * K, 11)?;
    d.map_gpu_user(a, victim, USER_VA, false)
        .ctx("MAP_GPU_USER")?;
    if let Some(o) = other {
        d.mem_gpu_kernel(true, a, o)
            .ctx("MAP_GPU_KERNEL on the other GPU")?;
    }
    let vid = if gpus.last().is_some_and(|g| g.vidmem_size > 0) {
        let v = d
            .vidmem_alloc(victim, 2 * M, 64 * K, 0)
            .ctx("vidmem alloc")?;
        d.mem_gpu_kernel(true, v.handle, victim)
            .ctx("MAP_GPU_KERNEL of vidmem")?;
        Some(v.handle)
    } else {
        None
    };
    let before = live(&d)?;
    check!(before[PT_TABLES] > 0, "no page table before the removal");
    d.test_sim_gpu(victim, false).ctx("TEST_SIM_GPU remove")?;
    let _back = BringBack(&d, victim);
    expect_errno(
        d.test_sim_gpu(victim, false),
        Errno::ENODEV,
        "removing a removed GPU",
    )?;
    let gone = d.gpus().ctx("GPU_LIST")?;
    check!(
        gone.iter().any(|g| g.id == victim && !present(g)),
        "GPU {victim} still listed as present"
    );
    expect_errno(
        d.gpu_va(a, victim, false),
        Errno::ENODEV,
        "GPU_VA on a gone GPU",
    )?;
    let q = d.mem_query(a).ctx("MEM_QUERY")?;
    check!(
        q.mapped & u64::from(uapi::ruvm_mapped_RUVM_MAPPED_GPU_USER) == 0,
        "the user mapping on the gone GPU is still reported (mapped {:#x})",
        q.mapped
    );
    check!(
        q.mapped_gpus & (1 << victim) == 0,
        "the gone GPU is still in mapped_gpus {:#x}",
        q.mapped_gpus
    );
    match other {
        Some(o) => {
            // Still mapped at the same VA on the other GPU, the data intact through it.
            check!(
                q.mapped & u64::from(uapi::ruvm_mapped_RUVM_MAPPED_GPU_KERNEL) != 0,
                "the kernel mapping on GPU {o} went with GPU {victim}"
            );
            let (va_o, _) = d.gpu_va(a, o, false).ctx("GPU_VA on the other GPU")?;
            check!(va_o == va, "VA {va_o:#x} on GPU {o}, was {va:#x}");
            let b = d
                .mem_alloc(size, 64 * K, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
                .ctx("alloc")?;
            d.mem_gpu_kernel(true, b.handle, o).ctx("MAP_GPU_KERNEL")?;
            let (vb, _) = d.gpu_va(b.handle, o, false).ctx("GPU_VA")?;
            d.ce_copy_va(o, vb, va, size, false)
                .ctx("CE_COPY_VA on the other GPU")?;
            let bad = mismatches(&d, b.handle, size, 11)?;
            check!(bad == 0, "{bad} bytes wrong after the copy on GPU {o}");
            d.mem_free(b.handle).ctx("free")?;
        }
        None => check!(
            q.mapped & u64::from(uapi::ruvm_mapped_RUVM_MAPPED_GPU_KERNEL) == 0,
            "a kernel mapping is reported with its only GPU gone (mapped {:#x})",
            q.mapped
        ),
    }
    let bad = mismatches(&d, a, size, 11)?;
    check!(bad == 0, "{bad} bytes of the mem changed by the removal");
    if let Some(v) = vid {
        expect_errno(
            d.mem_gpu_kernel(true, v, victim),
            Errno::ENODEV,
            "mapping vidmem of a gone GPU",
        )?;
        d.mem_free(v).ctx("free of vidmem of a gone GPU")?;
    }
    d.mem_free(a).ctx("free")?;
    check_no_page_tables(&d, "after the removal and the frees")?;
    // Back under the same id, with an MMU and empty tables, and usable.
    d.test_sim_gpu(victim, true).ctx("TEST_SIM_GPU add")?;
    let back = d.gpus().ctx("GPU_LIST")?;
    check!(
        back.iter().any(|g| g.id == victim && has_mmu(g)),
        "GPU {victim} not back with an MMU"
    );
    let (c, vc) = mapped_source(&d, victim, 2 * M, 2 * M, 12)?;
    let e = d
        .mem_alloc(2 * M, 2 * M, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
        .ctx("alloc")?;
    d.mem_gpu_kernel(true, e.handle, victim)
        .ctx("MAP_GPU_KERNEL")?;
    let (ve, _) = d.gpu_va(e.handle, victim, false).ctx("GPU_VA")?;
    d.ce_copy_va(victim, ve, vc, 2 * M, false)
        .ctx("CE_COPY_VA on the GPU brought back")?;
    let bad = mismatches(&d, e.handle, 2 * M, 12)?;
    check!(
        bad == 0,
        "{bad} bytes wrong after a copy on the GPU brought back"
    );
    for h in [c, e.handle] {
        d.mem_free(h).ctx("free")?;
    }
    check_no_page_tables(&d, "after")
}

/// A user VA for the tests, well away from 0 and from the kernel window.
const USER_VA: u64 = 0x10_0000_0000;

fn gpu_va_user_map_rules() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let all = d.gpus().ctx("GPU_LIST")?;
    let a = d.mem_alloc(128 * K, 64 * K, 0).ctx("alloc")?;
    for g in all.iter().filter(|g| present(g) && !has_mmu(g)) {
        expect_errno(
            d.map_gpu_user(a.handle, g.id, USER_VA, false),
            Errno::EOPNOTSUPP,
            "user map on a GPU without an MMU",
        )?;
    }
    let gpus = mmu_gpus(&d)?;
    let g = gpus[0].id;
    expect_errno(
        d.map_gpu_user(a.handle, 31, USER_VA, false),
        Errno::ENODEV,
        "unknown GPU",
    )?;
    expect_errno(
        d.map_gpu_user(0xdead, g, USER_VA, false),
        Errno::ENOENT,
        "unknown handle",
    )?;
    expect_errno(
        d.map_gpu_user(a.handle, g, USER_VA + 4 * K, false),
        Errno::EINVAL,
        "VA not aligned to the chunk size",
    )?;
    expect_errno(
        d.map_gpu_user(a.handle, g, (1 << 49) - 64 * K, false),
        Errno::ERANGE,
        "mapping past the VA width",
    )?;
    expect_errno(
        d.map_gpu_user(a.handle, g, 1 << 49, false),
        Errno::ERANGE,
        "VA past the VA width",
    )?;
    let mut m = uapi::ruvm_mem_gpu_user {
        handle: a.handle,
        gpu: g,
        va: USER_VA,
        flags: 2,
        ..Default::default()
    };
    expect_errno(
        d.call(cmd::MEM_MAP_GPU_USER, &mut m),
        Errno::EINVAL,
        "unknown flag",
    )?;
    m.flags = 0;
    m.reserved[0] = 1;
    expect_errno(
        d.call(cmd::MEM_MAP_GPU_USER, &mut m),
        Errno::EINVAL,
        "reserved field",
    )?;
    // A size that is not whole chunks cannot be user-mapped (uvm_mem's rule).
    let odd = d.mem_alloc(5000, 4 * K, 0).ctx("alloc")?;
    expect_errno(
        d.map_gpu_user(odd.handle, g, USER_VA, false),
        Errno::EINVAL,
        "size not whole chunks",
    )?;
    // Mapped; again is a no-op; the VA is the mem's on every GPU.
    d.map_gpu_user(a.handle, g, USER_VA, false)
        .ctx("MAP_GPU_USER")?;
    d.map_gpu_user(a.handle, g, USER_VA, false)
        .ctx("second MAP_GPU_USER")?;
    check!(
        d.gpu_va(a.handle, g, true).ctx("GPU_VA user")? == (USER_VA, 64 * K),
        "user VA or page size wrong"
    );
    expect_errno(
        d.gpu_va(a.handle, g, false),
        Errno::ENXIO,
        "kernel VA of a user-only mapping",
    )?;
    let q = d.mem_query(a.handle).ctx("query")?;
    check!(
        q.mapped & u64::from(uapi::ruvm_mapped_RUVM_MAPPED_GPU_USER) != 0
            && q.mapped_gpus & (1 << g) != 0,
        "query after a user map: mapped {:#x}, DMA tables {:#x}",
        q.mapped,
        q.mapped_gpus
    );
    if let Some(o) = gpus.get(1) {
        expect_errno(
            d.map_gpu_user(a.handle, o.id, USER_VA + 2 * M, false),
            Errno::EINVAL,
            "another VA on another GPU",
        )?;
        d.map_gpu_user(a.handle, o.id, USER_VA, false)
            .ctx("the same VA on another GPU")?;
        d.unmap_gpu_user(a.handle, o.id).ctx("UNMAP_GPU_USER")?;
    }
    expect_errno(
        d.map_gpu_user(a.handle, g, USER_VA + 2 * M, false),
        Errno::EINVAL,
        "a second VA on the same GPU",
    )?;
    // Overlap, with a page of any size.
    let b = d.mem_alloc(8 * K, 4 * K, 0).ctx("alloc")?;
    expect_errno(
        d.map_gpu_user(b.handle, g, USER_VA + 4 * K, false),
        Errno::EEXIST,
        "overlapping VA",
    )?;
    d.map_gpu_user(b.handle, g, USER_VA + 128 * K, false)
        .ctx("the VA right after")?;
    // Vidmem is not user-mapped.
    if let Some(vg) = gpus.iter().find(|g| g.vidmem_size > 0) {
        let v = d.vidmem_alloc(vg.id, 64 * K, 0, 0).ctx("vidmem alloc")?;
        expect_errno(
            d.map_gpu_user(v.handle, vg.id, USER_VA + 4 * M, false),
            Errno::EOPNOTSUPP,
            "vidmem user map",
        )?;
        d.mem_free(v.handle).ctx("free")?;
    }
    // Another file's mem.
    let other = Ruvm::open().ctx("open")?;
    let c = other.mem_alloc(4 * K, 0, 0).ctx("alloc")?;
    expect_errno(
        d.map_gpu_user(c.handle, g, USER_VA + 8 * M, false),
        Errno::ENOENT,
        "another file's mem",
    )?;
    // Unmapped, the VA is free again, for any VA.
    d.unmap_gpu_user(a.handle, g).ctx("UNMAP_GPU_USER")?;
    d.unmap_gpu_user(a.handle, g).ctx("second UNMAP_GPU_USER")?;
    expect_errno(
        d.gpu_va(a.handle, g, true),
        Errno::ENXIO,
        "user VA after unmap",
    )?;
    d.map_gpu_user(a.handle, g, USER_VA + 2 * M, false)
        .ctx("a new VA once unmapped")?;
    for h in [a.handle, odd.handle, b.handle] {
        d.mem_free(h).ctx("free")?;
    }
    other.mem_free(c.handle).ctx("free")?;
    check_no_page_tables(&d, "after")
}

fn gpu_va_user_data_read_only_and_separate_spaces() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for g in mmu_gpus(&d)? {
        let g = g.id;
        let size = 256 * K;
        let a = d.mem_alloc(size, 64 * K, 0).ctx("alloc")?;
        fill(&d, a.handle, size, 31)?;
        let b = d
            .mem_alloc(size, 64 * K, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
            .ctx("alloc")?;
        let ro = d.mem_alloc(size, 64 * K, 0).ctx("alloc")?;
        fill(&d, ro.handle, size, 47)?;
        d.map_gpu_user(a.handle, g, USER_VA, false).ctx("map A")?;
        d.map_gpu_user(b.handle, g, USER_VA + M, false)
            .ctx("map B")?;
        d.map_gpu_user(ro.handle, g, USER_VA + 2 * M, true)
            .ctx("map RO")?;
        d.ce_copy_va(g, USER_VA + M, USER_VA, size, true)
            .ctx("copy A -> B")?;
        check!(
            mismatches(&d, b.handle, size, 31)? == 0,
            "GPU {g}: B is not A after a user VA copy"
        );
        d.ce_copy_va(g, USER_VA + M, USER_VA + 2 * M, size, true)
            .ctx("read the read-only mem")?;
        check!(
            mismatches(&d, b.handle, size, 47)? == 0,
            "GPU {g}: B is not RO after the copy"
        );
        expect_errno(
            d.ce_copy_va(g, USER_VA + 2 * M, USER_VA, 8, true),
            Errno::EFAULT,
            "write through a read-only user mapping",
        )?;
        check!(
            mismatches(&d, ro.handle, size, 47)? == 0,
            "GPU {g}: the read-only mem changed"
        );
        // The kernel VA space does not see the user VAs.
        expect_errno(
            d.ce_copy_va(g, USER_VA + M, USER_VA, 8, false),
            Errno::EFAULT,
            "user VA in the kernel space",
        )?;
        // Another file, the same VA: its own space, its own mem.
        let other = Ruvm::open().ctx("open")?;
        let x = other.mem_alloc(size, 64 * K, 0).ctx("alloc")?;
        fill(&other, x.handle, size, 99)?;
        let y = other
            .mem_alloc(size, 64 * K, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
            .ctx("alloc")?;
        other
            .map_gpu_user(x.handle, g, USER_VA, false)
            .ctx("other file: map at A's VA")?;
        other
            .map_gpu_user(y.handle, g, USER_VA + M, false)
            .ctx("other file: map at B's VA")?;
        other
            .ce_copy_va(g, USER_VA + M, USER_VA, size, true)
            .ctx("other file: copy")?;
        check!(
            mismatches(&other, y.handle, size, 99)? == 0,
            "GPU {g}: the other file's copy is not its own mem"
        );
        check!(
            mismatches(&d, b.handle, size, 47)? == 0,
            "GPU {g}: the other file's copy reached this file's B"
        );
        let w = other.pt_walk(g, USER_VA, true).ctx("PT_WALK user")?;
        let (dma, _) = other.gpu_phys(x.handle, g, 0, 1).ctx("GPU_PHYS")?;
        check!(
            w.fault == 0 && w.address == dma,
            "the other file's walk of {USER_VA:#x} goes to {:#x}, not {dma:#x}",
            w.address
        );
        drop(other);
        for h in [a.handle, b.handle, ro.handle] {
            d.mem_free(h).ctx("free")?;
        }
    }
    check_no_page_tables(&d, "after")
}

fn gpu_va_user_space_goes_with_the_file() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = mmu_gpus(&d)?;
    check_no_page_tables(&d, "before")?;
    {
        let f = Ruvm::open().ctx("open")?;
        for (i, g) in gpus.iter().enumerate() {
            let a = f.mem_alloc(2 * M, 2 * M, 0).ctx("alloc")?;
            f.map_gpu_user(a.handle, g.id, USER_VA, false).ctx("map")?;
            let k = f.mem_alloc(64 * K, 4 * K, 0).ctx("alloc")?;
            f.map_gpu_user(k.handle, g.id, USER_VA + 4 * M + i as u64 * M, false)
                .ctx("map")?;
            f.mem_gpu_kernel(true, k.handle, g.id).ctx("kernel map")?;
        }
        // A DMA unmap drops the GPU's user and kernel mappings of that mem.
        let l = live(&d)?;
        check!(l[PT_TABLES] > 0, "no page tables while mapped");
        // The file goes with everything mapped.
    }
    check_no_page_tables(&d, "after the file closed with its mems mapped")?;
    // MEM_UNMAP_GPU drops a user mapping first.
    let g = gpus[0].id;
    let a = d.mem_alloc(64 * K, 64 * K, 0).ctx("alloc")?;
    d.map_gpu_user(a.handle, g, USER_VA, false).ctx("map")?;
    d.mem_gpu(false, a.handle, g).ctx("UNMAP_GPU")?;
    expect_errno(
        d.gpu_va(a.handle, g, true),
        Errno::ENXIO,
        "user VA after UNMAP_GPU",
    )?;
    expect_errno(
        d.ce_copy_va(g, USER_VA, USER_VA, 8, true),
        Errno::EFAULT,
        "copy after UNMAP_GPU",
    )?;
    check_no_page_tables(&d, "after UNMAP_GPU")?;
    // Freed with a user mapping alive.
    d.map_gpu_user(a.handle, g, USER_VA, false)
        .ctx("map again")?;
    d.mem_free(a.handle).ctx("free")?;
    check_no_page_tables(&d, "after freeing a user-mapped mem")
}
