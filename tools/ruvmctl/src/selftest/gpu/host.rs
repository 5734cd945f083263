// SPDX-License-Identifier: GPL-2.0

//! Host GPUs: attached and detached at run time, their bad inputs, a full registry, an edu
//! device ruvm-edu stays off, DMA mapping without binding.

use super::*;

/// A GPU's PCI address for `RUVM_IOCTL_GPU_ATTACH`: (domain, bus, devfn).
pub(super) fn pci_of(g: &uapi::ruvm_gpu_info) -> (u32, u8, u8) {
    (g.pci_domain, g.pci_bus, g.pci_devfn)
}

pub(super) fn gpu_host_detach_drops_tables_and_attach_keeps_the_id() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let Some(g) = gpus
        .iter()
        .find(|g| g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST && present(g))
    else {
        return Err(Stop::Skip("no host GPU (load with host_gpus=...)".into()));
    };
    let (dom, bus, devfn) = pci_of(g);
    let before = dma_live(&d)?;
    let a = d.mem_alloc(3 << 20, 64 << 10, 0).ctx("alloc")?;
    d.mem_gpu(true, a.handle, g.id).ctx("map on the host GPU")?;
    expect_errno(
        d.gpu_attach(true, dom, bus, devfn),
        Errno::EEXIST,
        "attach of an attached host GPU",
    )?;
    // Detached while mapped: its table goes, the mem stays good.
    let id = d.gpu_attach(false, dom, bus, devfn).ctx("detach")?;
    check!(id == g.id, "detach returned id {id}, the GPU is {}", g.id);
    let gone = d.gpus().ctx("GPU_LIST after detach")?;
    let e = gone.iter().find(|x| x.id == g.id);
    check!(
        e.is_some_and(|e| !present(e) && e.dma_mapped_bytes == 0),
        "after detach the registry shows {e:?}"
    );
    check!(
        d.mem_query(a.handle).ctx("query")?.mapped_gpus & (1 << g.id) == 0,
        "the mem is still mapped for the detached GPU"
    );
    check!(
        dma_live(&d)?.0 == before.0,
        "the detached GPU's mappings are still counted"
    );
    expect_errno(
        d.mem_gpu(true, a.handle, g.id),
        Errno::ENODEV,
        "map on the detached GPU",
    )?;
    expect_errno(
        d.gpu_attach(false, dom, bus, devfn),
        Errno::ENOENT,
        "detach of a detached GPU",
    )?;
    // Attached again: the same id, usable.
    let id = d.gpu_attach(true, dom, bus, devfn).ctx("attach again")?;
    check!(id == g.id, "attach gave id {id}, the GPU was {}", g.id);
    d.mem_gpu(true, a.handle, g.id).ctx("map after attach")?;
    check!(
        d.dma_addrs(a.handle, g.id, 0, 100).ctx("addrs")?.len() == 3 << 4,
        "the table after attach has another size"
    );
    d.mem_free(a.handle).ctx("free")?;
    check!(dma_live(&d)?.0 == before.0, "mappings left after the free");
    Ok(())
}

/// A PCI device in no IOMMU group, if the machine has one.
pub(super) fn pci_without_iommu_group() -> Option<(u32, u8, u8)> {
    for e in std::fs::read_dir("/sys/bus/pci/devices").ok()?.flatten() {
        let name = e.file_name().into_string().ok()?;
        if e.path().join("iommu_group").exists() {
            continue;
        }
        if let Ok(a) = crate::cmd::gpu::parse_pci(&name) {
            return Some(a);
        }
    }
    None
}

pub(super) fn gpu_attach_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    check!(
        info.features & u64::from(uapi::RUVM_FEATURE_GPU_ATTACH) != 0,
        "RUVM_FEATURE_GPU_ATTACH not reported"
    );
    let before = d.gpus().ctx("GPU_LIST")?;
    expect_errno(
        d.gpu_attach(true, 0x1_0000, 0, 0),
        Errno::EINVAL,
        "domain 0x10000",
    )?;
    expect_errno(
        d.gpu_attach(false, 0x1_0000, 0, 0),
        Errno::EINVAL,
        "detach, domain 0x10000",
    )?;
    expect_errno(
        d.gpu_attach(true, 0, 0xff, 0xff),
        Errno::ENODEV,
        "no device at 0000:ff:1f.7",
    )?;
    expect_errno(
        d.gpu_attach(false, 0, 0xff, 0xff),
        Errno::ENOENT,
        "detach of 0000:ff:1f.7",
    )?;
    // A GPU ruvm's own driver bound: already there, and not a host GPU to detach.
    for g in before.iter().filter(|g| bound_edu(g)) {
        let (dom, bus, devfn) = pci_of(g);
        expect_errno(
            d.gpu_attach(true, dom, bus, devfn),
            Errno::EEXIST,
            "attach of an edu GPU",
        )?;
        expect_errno(
            d.gpu_attach(false, dom, bus, devfn),
            Errno::ENOENT,
            "detach of an edu GPU",
        )?;
    }
    match pci_without_iommu_group() {
        Some((dom, bus, devfn)) => expect_errno(
            d.gpu_attach(true, dom, bus, devfn),
            Errno::ENXIO,
            "attach of a device in no IOMMU group",
        )?,
        None => println!("# every PCI device here is in an IOMMU group: ENXIO not reachable"),
    }
    check!(
        d.gpus().ctx("GPU_LIST")?.len() == before.len(),
        "a refused attach changed the registry"
    );
    // Without CAP_SYS_ADMIN, EPERM before the arguments are looked at.
    child_checks("an unprivileged attach was not refused with EPERM", || {
        setuid(Uid::from_raw(65534)).is_ok()
            && d.gpu_attach(true, 0x1_0000, 0, 0) == Err(Errno::EPERM)
            && d.gpu_attach(false, 0, 0, 0) == Err(Errno::EPERM)
    })
}

/// A registry holding `RUVM_MAX_GPUS` GPUs (the run with 24 edu and 8 simulated GPUs) refuses
/// an attach with `ENOSPC`, says so in its error line, and lists the same GPUs after. Skips
/// while there is room.
pub(super) fn gpu_attach_into_a_full_registry() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = d.gpus().ctx("GPU_LIST")?;
    let max = uapi::RUVM_MAX_GPUS as usize;
    if before.len() < max {
        return Err(Stop::Skip(format!(
            "the registry holds {} of {max} GPUs",
            before.len()
        )));
    }
    // A PCI device that is no GPU of ruvm's and could otherwise be attached (it has an IOMMU
    // group).
    let ours: Vec<_> = before
        .iter()
        .filter(|g| g.kind != uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM)
        .map(pci_of)
        .collect();
    let other = std::fs::read_dir("/sys/bus/pci/devices")
        .ctx("/sys/bus/pci/devices")?
        .flatten()
        .filter(|e| e.path().join("iommu_group").exists())
        .filter_map(|e| e.file_name().into_string().ok())
        .find_map(|name| {
            let a = crate::cmd::gpu::parse_pci(&name).ok()?;
            (!ours.contains(&a)).then_some((name, a))
        });
    let Some((name, (dom, bus, devfn))) = other else {
        return Err(Stop::Skip("no PCI device here but ruvm's GPUs".into()));
    };
    let mark = crate::kmsg::write_marker().ctx("mark")?;
    expect_errno(
        d.gpu_attach(true, dom, bus, devfn),
        Errno::ENOSPC,
        &format!("attach of {name} with {max} GPUs registered"),
    )?;
    let log = crate::kmsg::read_kmsg().ctx("kmsg")?;
    let part = crate::kmsg::since(&log, Some(&mark)).ok_or(Stop::Fail("marker lost".into()))?;
    let line = format!("host GPU {name}: the GPU registry is full");
    check!(
        part.iter().any(|m| m.contains(&line)),
        "no '{line}' line after the refused attach"
    );
    let after = d.gpus().ctx("GPU_LIST")?;
    check!(
        after.len() == before.len()
            && after
                .iter()
                .zip(&before)
                .all(|(a, b)| a.id == b.id && a.kind == b.kind),
        "a refused attach changed the registry"
    );
    Ok(())
}

/// An edu device unbound from ruvm-edu and attached as a host GPU: ruvm-edu cannot bind it
/// while it is attached (`EEXIST`, one GPU per device), and binds it again, with its old id,
/// once it is detached.
pub(super) fn gpu_attach_unbound_edu_keeps_ruvm_edu_off_it() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = d.gpus().ctx("GPU_LIST")?;
    let Some(g) = before.iter().find(|g| bound_edu(g)) else {
        return Err(Stop::Skip("no GPU bound by ruvm-edu".into()));
    };
    if before.len() >= uapi::RUVM_MAX_GPUS as usize {
        // Attached as a host GPU, the device needs an entry of its own.
        return Err(Stop::Skip("the GPU registry is full".into()));
    }
    let name = pci_name(g);
    let (dom, bus, devfn) = pci_of(g);
    std::fs::write(format!("{DRIVER}/unbind"), &name).ctx("unbind")?;
    let attached = (|| -> TestResult {
        let h = d
            .gpu_attach(true, dom, bus, devfn)
            .ctx("attach of the unbound edu device")?;
        check!(h != g.id, "the host GPU took the edu GPU's id {h}");
        let list = d.gpus().ctx("GPU_LIST while attached")?;
        let host = list.iter().find(|x| x.id == h);
        check!(
            host.is_some_and(|x| present(x) && x.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST),
            "the attached device is listed as {host:?}"
        );
        let edu = list.iter().find(|x| x.id == g.id);
        check!(
            edu.is_some_and(|x| !present(x)),
            "the unbound edu GPU is listed as {edu:?}"
        );
        // ruvm-edu may not take the device while it is a host GPU.
        let bind = std::fs::write(format!("{DRIVER}/bind"), &name);
        check!(
            bind.as_ref().err().and_then(std::io::Error::raw_os_error)
                == Some(Errno::EEXIST as i32),
            "binding ruvm-edu to an attached host GPU: {bind:?}"
        );
        let key = |v: &[uapi::ruvm_gpu_info]| -> Vec<(u32, u32, u32)> {
            v.iter().map(|x| (x.id, x.kind, x.flags)).collect()
        };
        let after = d.gpus().ctx("GPU_LIST after the refused bind")?;
        check!(
            key(&after) == key(&list),
            "a refused bind changed the registry: {after:?}"
        );
        // The host GPU works meanwhile.
        let a = d.mem_alloc(192 << 10, 64 << 10, 0).ctx("alloc")?;
        d.mem_gpu(true, a.handle, h).ctx("map on the host GPU")?;
        check!(
            d.dma_addrs(a.handle, h, 0, 8).ctx("addrs")?.len() == 3,
            "the host GPU's table does not have 3 chunks"
        );
        d.mem_free(a.handle).ctx("free")?;
        let id = d.gpu_attach(false, dom, bus, devfn).ctx("detach")?;
        check!(id == h, "detach returned id {id}, the host GPU is {h}");
        Ok(())
    })();
    // Whatever happened: detached (if it still is attached) and bound again.
    let _ = d.gpu_attach(false, dom, bus, devfn);
    let rebind = std::fs::write(format!("{DRIVER}/bind"), &name).ctx("bind after detach");
    attached?;
    rebind?;
    let back = d.gpus().ctx("GPU_LIST after bind")?;
    let e = back.iter().find(|x| x.id == g.id);
    check!(
        e.is_some_and(bound_edu),
        "after detach and bind the edu GPU is {e:?}"
    );
    Ok(())
}

pub(super) fn gpu_host_gpu_maps_without_binding() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let hosts: Vec<&uapi::ruvm_gpu_info> = gpus
        .iter()
        .filter(|g| g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST)
        .collect();
    if hosts.is_empty() {
        return Err(Stop::Skip("no host GPU (load with host_gpus=...)".into()));
    }
    for g in hosts {
        check!(present(g), "host GPU {} not present", g.id);
        let name = pci_name(g);
        let driver = std::fs::read_link(format!("/sys/bus/pci/devices/{name}/driver")).ok();
        check!(
            driver.is_none(),
            "host GPU {name} is bound to {driver:?}: ruvm must not bind it"
        );
        let a = d.mem_alloc(3 << 20, 2 << 20, 0).ctx("alloc")?;
        d.mem_gpu(true, a.handle, g.id).ctx("map on the host GPU")?;
        let addrs = d.dma_addrs(a.handle, g.id, 0, 16).ctx("addrs")?;
        let limit = if g.dma_mask_bits >= 64 {
            u64::MAX
        } else {
            (1u64 << g.dma_mask_bits) - 1
        };
        check!(
            addrs.len() == 2 && addrs.iter().all(|&x| x + (2 << 20) - 1 <= limit),
            "addresses {addrs:x?} for a {}-bit device",
            g.dma_mask_bits
        );
        let b = d.mem_alloc(4096, 0, 0).ctx("alloc")?.handle;
        d.mem_gpu(true, b, g.id).ctx("map b")?;
        expect_errno(
            d.ce_copy(g.id, b, 0, a.handle, 0, 16),
            Errno::ENODEV,
            "copy with a host GPU (no engine)",
        )?;
        d.mem_free(a.handle).ctx("free")?;
        d.mem_free(b).ctx("free")?;
        let after = d
            .gpus()
            .ctx("GPU_LIST")?
            .into_iter()
            .find(|x| x.id == g.id)
            .map_or(1, |x| x.dma_mapped_bytes);
        check!(
            after == 0,
            "host GPU {} still reports {after} bytes mapped",
            g.id
        );
    }
    Ok(())
}
