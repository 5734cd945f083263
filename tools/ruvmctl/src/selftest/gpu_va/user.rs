// SPDX-License-Identifier: GPL-2.0

//! A GPU removed while mapped, and user VA spaces: their rules, read-only data, separate
//! spaces, a space that goes with its file.

use super::*;

/// Brings a removed simulated GPU back when dropped (so a failed case leaves it there).
pub(super) struct BringBack<'a>(&'a Ruvm, u32);

impl Drop for BringBack<'_> {
    fn drop(&mut self) {
        // EEXIST: back already.
        let _ = self.0.test_sim_gpu(self.1, true);
    }
}

/// uvm_mem's rule for a GPU that goes while mems are mapped on it: its virtual mappings and
/// page tables go with it, the mems stay usable on the other GPUs and free to free. The
/// simulated GPU is removed as an unbind would (`TEST_SIM_GPU`), then brought back.
pub(super) fn gpu_va_gpu_removed_while_mapped() -> TestResult {
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
pub(super) const USER_VA: u64 = 0x10_0000_0000;

pub(super) fn gpu_va_user_map_rules() -> TestResult {
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

pub(super) fn gpu_va_user_data_read_only_and_separate_spaces() -> TestResult {
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

pub(super) fn gpu_va_user_space_goes_with_the_file() -> TestResult {
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
