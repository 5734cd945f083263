// SPDX-License-Identifier: GPL-2.0

//! Host GPUs: PCI devices owned by another driver (the NVIDIA driver on a real host), registered
//! for DMA mapping only, never bound. Named at load by `host_gpus` (PCI addresses, as `lspci -D`
//! writes them) or attached and detached at run time (`RUVM_IOCTL_GPU_ATTACH`/`_DETACH`).
//!
//! This file owns the module-wide lock `HOSTS`, taken before the registry's `GPUS` (see the
//! crate's lock order): attach and detach are serialised, so that a detach's removal (which
//! waits for the GPU's users) cannot race an attach of the same device.

use kernel::{prelude::*, sync::Arc};

use crate::{
    bind::{
        dma::{find_pci, has_iommu_group, DmaDevice},
        global::global,
    },
    gpu::{self, GpuDev, GpuInfo, PciAddr, MAX_HOST_PARAM},
    uapi,
};

global! {
    /// The host GPUs attached now, with their addresses.
    static HOSTS: Mutex<KVec<(PciAddr, Arc<GpuDev>)>> = KVec::new();
}

/// Makes the list usable (from the registry's init).
pub(super) fn init() {
    HOSTS.init();
}

/// One hexadecimal field of a PCI address, at most `max`.
fn hex_field(s: &[u8], max: u32) -> Option<u32> {
    if s.is_empty() || s.len() > 4 {
        return None;
    }
    let mut v: u32 = 0;
    for &c in s {
        let d = char::from(c).to_digit(16)?;
        v = v.checked_mul(16)?.checked_add(d)?;
    }
    (v <= max).then_some(v)
}

/// Parses one PCI address, `DDDD:BB:SS.F` or `BB:SS.F` (domain 0), in hexadecimal as `lspci`
/// writes it.
pub(crate) fn parse_addr(s: &[u8]) -> Option<PciAddr> {
    let mut parts = s.split(|&c| c == b':');
    let (a, b, c) = (parts.next()?, parts.next()?, parts.next());
    let (domain, bus, rest) = match (c, parts.next()) {
        (Some(c), None) => (hex_field(a, 0xffff)?, b, c),
        (None, _) => (0, a, b),
        (Some(_), Some(_)) => return None,
    };
    let mut df = rest.split(|&c| c == b'.');
    let (slot, func) = (df.next()?, df.next()?);
    if df.next().is_some() || func.len() != 1 {
        return None;
    }
    let (bus, slot, func) = (
        hex_field(bus, 0xff)?,
        hex_field(slot, 0x1f)?,
        hex_field(func, 7)?,
    );
    Some(PciAddr {
        domain: u16::try_from(domain).ok()?,
        bus: u8::try_from(bus).ok()?,
        devfn: u8::try_from((slot << 3) | func).ok()?,
    })
}

/// Parses `host_gpus`: PCI addresses separated by commas (an empty value names none). `EINVAL`,
/// with an error line, for an address that does not parse, one named twice, or more than
/// [`MAX_HOST_PARAM`].
pub(crate) fn parse_list(s: &[u8]) -> Result<[Option<PciAddr>; MAX_HOST_PARAM]> {
    let mut out = [None; MAX_HOST_PARAM];
    let s = s.trim_ascii();
    if s.is_empty() {
        return Ok(out);
    }
    for (i, item) in s.split(|&c| c == b',').enumerate() {
        let item = item.trim_ascii();
        let Some(addr) = parse_addr(item) else {
            pr_err!(
                "host_gpus: '{}' is not a PCI address (DDDD:BB:SS.F, as lspci -D writes it)\n",
                kernel::str::BStr::from_bytes(item)
            );
            return Err(EINVAL);
        };
        if out.contains(&Some(addr)) {
            pr_err!("host_gpus: {addr} is named twice\n");
            return Err(EINVAL);
        }
        let Some(slot) = out.get_mut(i) else {
            pr_err!("host_gpus: more than {MAX_HOST_PARAM} addresses\n");
            return Err(EINVAL);
        };
        *slot = Some(addr);
    }
    Ok(out)
}

/// Attaches the PCI device at `addr` as a host GPU; returns its id. `EEXIST` when a GPU is
/// registered there now (attached, or an edu device ruvm's driver bound), `ENODEV` when there is
/// no such device or it has no DMA mask, `ENXIO` when it is in no IOMMU group, `ENOSPC` when the
/// registry is full. Each failure is said in an error line.
pub(crate) fn attach(addr: PciAddr) -> Result<u32> {
    let mut hosts = HOSTS.lock().ok_or(ENODEV)?;
    if gpu::pci_present(addr) {
        pr_err!("host GPU {addr}: already a GPU of ruvm's (attached, or bound by ruvm-edu)\n");
        return Err(EEXIST);
    }
    let Some(pdev) = find_pci(addr.domain, addr.bus, addr.devfn) else {
        pr_err!("host GPU {addr}: no PCI device there\n");
        return Err(ENODEV);
    };
    if !has_iommu_group(&pdev) {
        pr_err!("host GPU {addr}: in no IOMMU group (is the IOMMU on?)\n");
        return Err(ENXIO);
    }
    let (vendor, device) = (pdev.vendor_id().as_raw(), pdev.device_id());
    let dma = DmaDevice::from_pci(pdev);
    let Some(mask) = dma.dma_mask() else {
        pr_err!("host GPU {addr}: has no DMA mask\n");
        return Err(ENODEV);
    };
    let info = GpuInfo {
        kind: uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST,
        vendor,
        device,
        domain: addr.domain.into(),
        bus: addr.bus,
        devfn: addr.devfn,
        dma_mask_bits: 64 - mask.leading_zeros(),
        page_sizes: gpu::TEST_PAGE_SIZES,
    };
    hosts
        .reserve(1, GFP_KERNEL)
        .inspect_err(|_| pr_err!("host GPU {addr}: out of memory\n"))?;
    // The registry checks again, with its lock held: ruvm-edu may have bound the device since.
    let dev = gpu::register(info, dma, None).inspect_err(|e| {
        if *e == EEXIST {
            pr_err!("host GPU {addr}: already a GPU of ruvm's (bound by ruvm-edu)\n");
        } else if *e == ENOSPC {
            let max = uapi::RUVM_MAX_GPUS;
            pr_err!("host GPU {addr}: the GPU registry is full ({max} GPUs, gone ones included)\n");
        } else {
            pr_err!("host GPU {addr}: cannot be registered ({e:?})\n");
        }
    })?;
    let id = dev.id;
    if let Err(e) = hosts.push((addr, dev.clone()), GFP_KERNEL) {
        // Room was reserved above; should it still fail, the GPU must not stay registered.
        gpu::unregister(&dev);
        return Err(e.into());
    }
    pr_info!("host GPU {id} at {addr} (DMA mapping only)\n");
    Ok(id)
}

/// Detaches the host GPU at `addr` as an unbind would (its DMA tables dropped, its mems kept);
/// returns its id. `ENOENT` when no host GPU is attached there.
pub(crate) fn detach(addr: PciAddr) -> Result<u32> {
    let mut hosts = HOSTS.lock().ok_or(ENODEV)?;
    let Some(i) = hosts.iter().position(|(a, _)| *a == addr) else {
        return Err(ENOENT);
    };
    let (_, dev) = hosts.remove(i).map_err(|_| ENOENT)?;
    gpu::unregister(&dev);
    pr_info!("host GPU {} at {addr} detached\n", dev.id);
    Ok(dev.id)
}

/// Detaches every host GPU (module unload, or a load failing after some were attached), and
/// frees the list's buffer: the static that points at it goes with the module.
fn detach_all() {
    let Some(mut hosts) = HOSTS.lock() else {
        return;
    };
    for (_, dev) in core::mem::replace(&mut *hosts, KVec::new()) {
        gpu::unregister(&dev);
    }
}

/// The host GPUs of the load: those `host_gpus` names are attached by [`HostGpus::new`]; on drop,
/// every host GPU attached then (at load or since) is detached.
pub(crate) struct HostGpus(());

impl HostGpus {
    /// Attaches every address of `host_gpus`; the first failure fails the load (its error line
    /// names the address), detaching those attached before it.
    pub(crate) fn new(addresses: &[Option<PciAddr>]) -> Result<Self> {
        let me = Self(());
        for &addr in addresses.iter().flatten() {
            attach(addr).inspect_err(|_| pr_err!("host_gpus: {addr} cannot be attached\n"))?;
        }
        Ok(me)
    }
}

impl Drop for HostGpus {
    fn drop(&mut self) {
        detach_all();
    }
}
