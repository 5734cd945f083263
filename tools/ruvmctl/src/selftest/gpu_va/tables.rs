// SPDX-License-Identifier: GPL-2.0

//! The page tables as written: walks, no stale TLB entry, uvm_mem's teardown order.

use super::*;

/// `ENOSYS`: the test ioctls are off; skip.
pub(super) fn test_ioctls(r: Result<u64, Errno>) -> Result<u64, Stop> {
    match r {
        Err(Errno::ENOSYS) => Err(Stop::Skip("needs enable_test_ioctls=1".into())),
        r => r.ctx("TEST_PT_WRITE"),
    }
}

pub(super) fn gpu_va_walk_reads_the_tables_as_written() -> TestResult {
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
pub(super) fn old_entry(d: &Ruvm, gpu: u32, va: u64) -> Result<u64, Stop> {
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

pub(super) fn gpu_va_no_stale_tlb_entry() -> TestResult {
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

pub(super) fn gpu_va_teardown_order() -> TestResult {
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
