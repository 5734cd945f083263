// SPDX-License-Identifier: GPL-2.0

//! The GPU registry: ruvm's test GPUs (QEMU edu devices) as sysfs sees them, and across unbind
//! and rebind.

use nix::errno::Errno;

use super::{check, expect_errno, Case, Context, Stop, TestResult};
use crate::{dev::Ruvm, uapi};

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "gpu_list_matches_sysfs",
            run: gpu_list_matches_sysfs,
        },
        Case {
            name: "gpu_unbind_and_rebind_keep_the_id",
            run: gpu_unbind_and_rebind_keep_the_id,
        },
        Case {
            name: "gpu_list_bad_inputs",
            run: gpu_list_bad_inputs,
        },
    ]
}

const DRIVER: &str = "/sys/bus/pci/drivers/ruvm-edu";

/// The edu devices of the machine, by PCI address, from sysfs.
fn edu_devices() -> Result<Vec<String>, Stop> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/sys/bus/pci/devices").ctx("/sys/bus/pci/devices")? {
        let p = e.ctx("readdir")?.path();
        let read = |f: &str| {
            std::fs::read_to_string(p.join(f))
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        if read("vendor") == "0x1234" && read("device") == "0x11e8" {
            v.push(
                p.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
        }
    }
    v.sort();
    Ok(v)
}

fn pci_name(g: &uapi::ruvm_gpu_info) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{}",
        g.pci_domain,
        g.pci_bus,
        g.pci_devfn >> 3,
        g.pci_devfn & 7
    )
}

fn present(g: &uapi::ruvm_gpu_info) -> bool {
    g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
}

fn gpu_list_matches_sysfs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let want = edu_devices()?;
    if want.is_empty() {
        return Err(Stop::Skip("no edu devices in this machine".into()));
    }
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let mut got: Vec<String> = gpus.iter().filter(|g| present(g)).map(pci_name).collect();
    got.sort();
    check!(
        got == want,
        "registry lists {got:?}, sysfs has edu devices {want:?}"
    );
    let mut ids: Vec<u32> = gpus.iter().map(|g| g.id).collect();
    ids.sort_unstable();
    ids.dedup();
    check!(
        ids.len() == gpus.len(),
        "ids are not unique: {:?}",
        gpus.iter().map(|g| g.id).collect::<Vec<_>>()
    );
    let mut groups = Vec::new();
    for g in &gpus {
        check!(
            g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU,
            "GPU {} kind {}",
            g.id,
            g.kind
        );
        check!(
            (g.vendor, g.device) == (0x1234, 0x11e8),
            "GPU {} is {:04x}:{:04x}",
            g.id,
            g.vendor,
            g.device
        );
        check!(
            g.dma_mask_bits == 28,
            "GPU {} DMA mask {} bits",
            g.id,
            g.dma_mask_bits
        );
        check!(
            g.page_sizes == (4 << 10) | (64 << 10) | (2 << 20),
            "GPU {} page sizes {:#x}",
            g.id,
            g.page_sizes
        );
        let name = pci_name(g);
        // Bound by ruvm's driver, and each in its own IOMMU group.
        check!(
            std::path::Path::new(&format!("{DRIVER}/{name}")).exists(),
            "{name} is not bound to ruvm-edu"
        );
        let group = std::fs::read_link(format!("/sys/bus/pci/devices/{name}/iommu_group"))
            .ctx("iommu_group")?;
        groups.push(group);
    }
    let n = groups.len();
    groups.sort();
    groups.dedup();
    check!(groups.len() == n, "GPUs share an IOMMU group");
    Ok(())
}

fn gpu_unbind_and_rebind_keep_the_id() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = d.gpus().ctx("GPU_LIST")?;
    let Some(g) = before.iter().find(|g| present(g)) else {
        return Err(Stop::Skip("no GPU bound".into()));
    };
    let name = pci_name(g);
    std::fs::write(format!("{DRIVER}/unbind"), &name).ctx("unbind")?;
    let gone = d.gpus().ctx("GPU_LIST after unbind");
    let rebind = std::fs::write(format!("{DRIVER}/bind"), &name).ctx("bind");
    let gone = gone?;
    rebind?;
    let e = gone
        .iter()
        .find(|x| x.id == g.id)
        .ok_or(Stop::Fail("GPU left the registry on unbind".into()))?;
    check!(!present(e), "GPU {} still present after unbind", g.id);
    check!(
        gone.len() == before.len(),
        "the registry changed size on unbind"
    );
    let back = d.gpus().ctx("GPU_LIST after bind")?;
    let e = back
        .iter()
        .find(|x| pci_name(x) == name)
        .ok_or(Stop::Fail("GPU missing after bind".into()))?;
    check!(
        present(e) && e.id == g.id,
        "after rebind: id {} present {} (was id {})",
        e.id,
        present(e),
        g.id
    );
    check!(back.len() == before.len(), "rebind added an entry");
    Ok(())
}

fn gpu_list_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let total = d.gpus().ctx("GPU_LIST")?.len() as u32;
    let mut a = uapi::ruvm_gpu_list {
        flags: 1,
        ..Default::default()
    };
    expect_errno(
        d.ioctl(uapi::RUVM_IOCTL_GPU_LIST, &mut a),
        Errno::EINVAL,
        "flags",
    )?;
    let mut a = uapi::ruvm_gpu_list::default();
    a.reserved[1] = 1;
    expect_errno(
        d.ioctl(uapi::RUVM_IOCTL_GPU_LIST, &mut a),
        Errno::EINVAL,
        "reserved",
    )?;
    // No room: only the count comes back.
    let mut a = uapi::ruvm_gpu_list::default();
    d.ioctl(uapi::RUVM_IOCTL_GPU_LIST, &mut a)
        .ctx("count only")?;
    check!(
        a.count == total,
        "count {} with no room, {total} GPUs",
        a.count
    );
    if total == 0 {
        return Ok(());
    }
    // Room for one: one entry written, nothing past it, the full count reported.
    let mut v = vec![
        uapi::ruvm_gpu_info {
            id: 0xdead,
            ..Default::default()
        };
        2
    ];
    let mut a = uapi::ruvm_gpu_list {
        count: 1,
        gpus: v.as_mut_ptr() as u64,
        ..Default::default()
    };
    d.ioctl(uapi::RUVM_IOCTL_GPU_LIST, &mut a)
        .ctx("room for one")?;
    check!(
        a.count == total && v[0].id != 0xdead && v[1].id == 0xdead,
        "room for one: count {}, ids {} {}",
        a.count,
        v[0].id,
        v[1].id
    );
    // An array that is not memory.
    let mut a = uapi::ruvm_gpu_list {
        count: 4,
        gpus: 8,
        ..Default::default()
    };
    expect_errno(
        d.ioctl(uapi::RUVM_IOCTL_GPU_LIST, &mut a),
        Errno::EFAULT,
        "array at an unmapped address",
    )
}
