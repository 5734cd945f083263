// SPDX-License-Identifier: GPL-2.0

//! ruvm's PCI driver for the test GPUs: QEMU `edu` devices (PCI 1234:11e8).
//!
//! Binding one enables it (memory decoding, bus mastering), sets its DMA mask (edu's engine
//! addresses 28 bits, so in the test guest every DMA address comes through the IOMMU) and
//! enters it in the GPU registry; unbinding it marks it gone there.
//!
//! The 7.2 `pci::Vendor` has no constant for QEMU's 0x1234 and no public constructor, so the
//! driver matches edu's class code (0x00ff00) and checks the ids in `probe`.

use kernel::{device::Core, pci, prelude::*};

use kernel::sync::Arc;

use crate::{
    bind::dma::{self, DmaDevice},
    gpu::{self, GpuDev, GpuInfo},
    uapi,
};

const EDU_VENDOR: u16 = 0x1234;
const EDU_DEVICE: u16 = 0x11e8;
const EDU_CLASS: u32 = 0x00ff00;
/// The width of edu's DMA addresses (QEMU's default for the device).
const EDU_DMA_BITS: u32 = 28;

/// The driver.
pub(crate) struct EduDriver;

/// A bound edu device: its registry entry, unregistered when it is unbound (dropping its
/// mappings while the device is still bound).
pub(crate) struct EduGpu {
    dev: Arc<GpuDev>,
}

impl Drop for EduGpu {
    fn drop(&mut self) {
        gpu::unregister(&self.dev);
    }
}

kernel::pci_device_table!(
    EDU_TABLE,
    MODULE_EDU_TABLE,
    <EduDriver as pci::Driver>::IdInfo,
    [(pci::DeviceId::from_class(EDU_CLASS, 0xffffff), ())]
);

impl pci::Driver for EduDriver {
    type IdInfo = ();
    type Data<'bound> = EduGpu;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &EDU_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: &'bound Self::IdInfo,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        probe(pdev)
    }
}

fn probe(pdev: &pci::Device<Core<'_>>) -> Result<EduGpu> {
    let (vendor, device) = (pdev.vendor_id().as_raw(), pdev.device_id());
    if (vendor, device) != (EDU_VENDOR, EDU_DEVICE) {
        // Same class, another device: not ours.
        return Err(ENODEV);
    }
    pdev.enable_device_mem()?;
    pdev.set_master();
    dma::set_mask::<EDU_DMA_BITS>(pdev)?;
    let bdf = pdev.dev_id();
    let dev = gpu::register(
        GpuInfo {
            kind: uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU,
            vendor,
            device,
            domain: 0,
            // CAST: `dev_id` is bus << 8 | devfn; each part is a byte.
            bus: (bdf >> 8) as u8,
            devfn: (bdf & 0xff) as u8,
            dma_mask_bits: EDU_DMA_BITS,
            page_sizes: gpu::TEST_PAGE_SIZES,
        },
        DmaDevice::new(pdev),
    )?;
    dev_info!(pdev, "test GPU {} (edu)\n", dev.id);
    Ok(EduGpu { dev })
}
