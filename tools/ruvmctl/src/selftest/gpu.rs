// SPDX-License-Identifier: GPL-2.0

//! The GPU registry: ruvm's test GPUs (QEMU edu devices) as sysfs sees them, and across unbind
//! and rebind.

use nix::errno::Errno;

use nix::unistd::{setuid, Uid};

use super::harness::{cases, check, child_checks, expect_errno, Case, Context, Stop, TestResult};
use libruvm::{pci_name, uapi, Ruvm, UserMap};

use crate::pattern;

mod dma;
mod engine;
mod host;
use dma::*;
use engine::*;
use host::*;

pub fn cases() -> Vec<Case> {
    cases![
        gpu_list_matches_sysfs,
        gpu_unbind_and_rebind_keep_the_id,
        gpu_list_bad_inputs,
        gpu_dma_map_is_idempotent_and_in_the_window,
        gpu_dma_bad_inputs,
        gpu_dma_free_while_mapped_everywhere,
        gpu_dma_unbind_while_mapped,
        gpu_ce_copy_moves_bytes_both_ways,
        gpu_two_gpus_two_address_spaces,
        gpu_ce_copy_bad_inputs,
        gpu_iommu_faults_after_unmap,
        gpu_sim_faults_after_unmap,
        gpu_host_gpu_maps_without_binding,
        gpu_host_detach_drops_tables_and_attach_keeps_the_id,
        gpu_attach_bad_inputs,
        gpu_attach_into_a_full_registry,
        gpu_attach_unbound_edu_keeps_ruvm_edu_off_it,
    ]
}

pub(super) const DRIVER: &str = "/sys/bus/pci/drivers/ruvm-edu";

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

fn present(g: &uapi::ruvm_gpu_info) -> bool {
    g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
}

/// Bound by ruvm's edu driver (so it can be unbound through it, and has an engine).
pub(super) fn bound_edu(g: &uapi::ruvm_gpu_info) -> bool {
    present(g) && g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU
}

/// Present, with a copy engine (an edu GPU or a simulated one).
fn has_engine(g: &uapi::ruvm_gpu_info) -> bool {
    present(g) && g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE != 0
}

/// A present simulated GPU.
pub(super) fn sim(g: &uapi::ruvm_gpu_info) -> bool {
    present(g) && g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM
}

fn gpu_list_matches_sysfs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let want = edu_devices()?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    if want.is_empty() && gpus.is_empty() {
        return Err(Stop::Skip("no GPUs in this machine".into()));
    }
    // Every edu device is a GPU: bound by ruvm-edu, or named as a host GPU.
    let mut got: Vec<String> = gpus
        .iter()
        .filter(|g| present(g) && g.kind != uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM)
        .map(pci_name)
        .collect();
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
            g.page_sizes == (4 << 10) | (64 << 10) | (2 << 20),
            "GPU {} page sizes {:#x}",
            g.id,
            g.page_sizes
        );
        let name = pci_name(g);
        let bound = std::path::Path::new(&format!("{DRIVER}/{name}")).exists();
        let engine = g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE != 0;
        if g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM {
            // A faux device with the CPU as its engine, 47-bit DMA, no PCI address, no IOMMU.
            let faux = format!("/sys/bus/faux/devices/ruvm-sim{}", g.pci_devfn);
            check!(
                std::path::Path::new(&faux).exists()
                    && engine
                    && g.dma_mask_bits == 47
                    && (g.vendor, g.device, g.pci_bus) == (0, 0, 0),
                "simulated GPU {}: {faux} exists {}, engine {engine}, DMA {} bits",
                g.id,
                std::path::Path::new(&faux).exists(),
                g.dma_mask_bits
            );
            continue;
        }
        check!(
            g.kind != uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU
                || (g.vendor, g.device) == (0x1234, 0x11e8),
            "edu GPU {} is {:04x}:{:04x}",
            g.id,
            g.vendor,
            g.device
        );
        match g.kind {
            // Bound by ruvm's driver, with edu's engine and 28-bit DMA.
            uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU => {
                check!(
                    bound && engine && g.dma_mask_bits == 28,
                    "edu GPU {}: bound {bound}, engine {engine}, DMA {} bits",
                    g.id,
                    g.dma_mask_bits
                );
            }
            // Named by host_gpus: not bound, no engine, the device's own DMA mask.
            uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST => {
                check!(
                    !bound && !engine && g.dma_mask_bits >= 28,
                    "host GPU {}: bound {bound}, engine {engine}, DMA {} bits",
                    g.id,
                    g.dma_mask_bits
                );
            }
            k => return Err(Stop::Fail(format!("GPU {} has kind {k}", g.id))),
        }

        // Each in its own IOMMU group.
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
    let Some(g) = before.iter().find(|g| bound_edu(g)) else {
        return Err(Stop::Skip("no GPU bound by ruvm-edu".into()));
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
    // Unknown flags and non-zero reserved fields: the ABI table (`abi_*`).
    // No room: only the count comes back.
    let mut a = uapi::ruvm_gpu_list::default();
    d.call(libruvm::cmd::GPU_LIST, &mut a).ctx("count only")?;
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
    d.call(libruvm::cmd::GPU_LIST, &mut a).ctx("room for one")?;
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
        d.call(libruvm::cmd::GPU_LIST, &mut a),
        Errno::EFAULT,
        "array at an unmapped address",
    )
}

const DMA_MAPPINGS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS as usize;
const DMA_BYTES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_DMA_BYTES as usize;

/// The ids of the GPUs that `keep` accepts; skips the case (saying `none`) without any.
fn gpu_ids(d: &Ruvm, keep: fn(&uapi::ruvm_gpu_info) -> bool, none: &str) -> Result<Vec<u32>, Stop> {
    let ids: Vec<u32> = d
        .gpus()
        .ctx("GPU_LIST")?
        .iter()
        .filter(|g| keep(g))
        .map(|g| g.id)
        .collect();
    if ids.is_empty() {
        return Err(Stop::Skip(none.into()));
    }
    Ok(ids)
}

/// The ids of the bound GPUs with a copy engine.
fn engine_gpus(d: &Ruvm) -> Result<Vec<u32>, Stop> {
    gpu_ids(d, has_engine, "no GPU with a copy engine")
}

/// The ids of the bound GPUs.
fn bound_gpus(d: &Ruvm) -> Result<Vec<u32>, Stop> {
    gpu_ids(d, present, "no GPU bound")
}

pub(super) fn dma_live(d: &Ruvm) -> Result<(u64, u64), Stop> {
    let a = d.audit(false).ctx("AUDIT")?;
    Ok((a.live[DMA_MAPPINGS], a.live[DMA_BYTES]))
}
