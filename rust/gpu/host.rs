// SPDX-License-Identifier: GPL-2.0

//! Host GPUs (`host_gpus`): PCI devices owned by another driver (the NVIDIA driver on a real
//! host), registered for DMA mapping only, never bound.

use kernel::{prelude::*, sync::Arc};

use crate::{
    bind::dma::{find_pci, DmaDevice},
    gpu::{self, GpuDev, GpuInfo},
    uapi,
};

/// The host GPUs, unregistered on drop.
pub(crate) struct HostGpus {
    gpus: KVec<Arc<GpuDev>>,
}

impl HostGpus {
    /// Finds and registers every device at `addresses` (bus, devfn of domain 0); `ENODEV` (with
    /// an error line) if one does not exist or has no DMA mask, so that a mistyped address fails
    /// the load.
    pub(crate) fn new(addresses: &[Option<(u8, u8)>]) -> Result<Self> {
        let mut gpus = KVec::new();
        for &(bus, devfn) in addresses.iter().flatten() {
            let (slot, func) = (devfn >> 3, devfn & 7);
            let Some(pdev) = find_pci(bus, devfn) else {
                pr_err!("host_gpus: no PCI device at 0000:{bus:02x}:{slot:02x}.{func}\n");
                return Err(ENODEV);
            };
            let (vendor, device) = (pdev.vendor_id().as_raw(), pdev.device_id());
            let dma = DmaDevice::from_pci(pdev);
            let Some(mask) = dma.dma_mask() else {
                pr_err!("host_gpus: 0000:{bus:02x}:{slot:02x}.{func} has no DMA mask\n");
                return Err(ENODEV);
            };
            let info = GpuInfo {
                kind: uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST,
                vendor,
                device,
                domain: 0,
                bus,
                devfn,
                dma_mask_bits: 64 - mask.leading_zeros(),
                page_sizes: gpu::TEST_PAGE_SIZES,
            };
            let dev = gpu::register(info, dma, None)?;
            pr_info!(
                "host GPU {} at 0000:{bus:02x}:{slot:02x}.{func} (DMA mapping only)\n",
                dev.id
            );
            gpus.push(dev, GFP_KERNEL)?;
        }
        Ok(Self { gpus })
    }
}

impl Drop for HostGpus {
    fn drop(&mut self) {
        for dev in self.gpus.iter() {
            gpu::unregister(dev);
        }
    }
}
