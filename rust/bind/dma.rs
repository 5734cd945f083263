// SPDX-License-Identifier: GPL-2.0

//! DMA setup of a device being bound.
//!
//! C header: [`include/linux/dma-mapping.h`](srctree/include/linux/dma-mapping.h)

use kernel::{
    device::Core,
    dma::{Device as _, DmaMask},
    pci,
    prelude::*,
};

/// Sets the device's streaming and coherent DMA masks to `BITS` bits. For `probe` only.
pub(crate) fn set_mask<const BITS: u32>(pdev: &pci::Device<Core<'_>>) -> Result {
    // SAFETY: called from `probe`, before the device has any DMA mapping or allocation, so
    // nothing uses the mask concurrently.
    unsafe { pdev.dma_set_mask_and_coherent(DmaMask::new::<BITS>()) }
}
