// SPDX-License-Identifier: GPL-2.0

//! Every bad input to the GPU VA ioctls, and the errnos of unmap, walk and page-table writes.

use super::*;

pub(super) fn gpu_va_bad_inputs() -> TestResult {
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
pub(super) fn gpu_va_unmap_walk_and_pt_write_errnos() -> TestResult {
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
