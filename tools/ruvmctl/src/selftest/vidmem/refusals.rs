// SPDX-License-Identifier: GPL-2.0

//! Bad inputs to the PMM ioctls, GPUs without vidmem, a GPU unbound with live vidmem mems.

use super::*;

pub(super) fn vidmem_pmm_bad_inputs() -> TestResult {
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
pub(super) fn vidmem_none_on_a_gpu_without_any() -> TestResult {
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

pub(super) const DRIVER: &str = "/sys/bus/pci/drivers/ruvm-edu";

pub(super) fn vidmem_unbind_with_live_mems() -> TestResult {
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
