// SPDX-License-Identifier: GPL-2.0

//! Simulated GPUs (`sim_gpus=N`): for machines with neither test nor host GPUs.
//!
//! Each is a device on the kernel's faux bus (`/sys/bus/faux/devices/ruvm-simN`) with a
//! 47-bit DMA mask, so mappings made for it are real streaming DMA mappings (dma-direct: no
//! IOMMU translates for a faux device). Its copy engine is the CPU, but it reaches memory only
//! through the DMA addresses it is given, translated through the mappings that exist for the
//! device (`DmaDevice::sim_copy`): an address that no mapping covers faults (`EFAULT`, and a
//! `sim GPU: DMA fault` line), so wrong or stale addresses show as they would on hardware.
//!
//! Faux devices cannot be unbound from user space; a simulated GPU leaves the registry (marked
//! gone, its mappings dropped) when the module unloads.

use kernel::{faux, prelude::*, str::CString, sync::Arc};

use crate::{
    bind::dma::DmaDevice,
    gpu::{self, Engine, GpuDev, GpuInfo},
    uapi,
};

/// The width of a simulated GPU's DMA addresses (NVIDIA GPUs address 47 bits or more of
/// system memory).
pub(crate) const SIM_DMA_BITS: u32 = 47;

/// The most simulated GPUs `sim_gpus` may ask for.
pub(crate) const MAX_SIM_GPUS: u32 = 8;

/// The largest piece the simulated engine moves at once: the biggest chunk.
pub(crate) const MAX_PIECE: usize = 2 << 20;

/// `EINVAL` unless `len` is a piece the simulated engine moves (1 byte to [`MAX_PIECE`]).
pub(crate) fn check_piece(len: usize) -> Result {
    if len == 0 || len > MAX_PIECE {
        return Err(EINVAL);
    }
    Ok(())
}

/// One simulated GPU: its registry entry (unregistered first on drop, while the device is
/// still there), then its faux device.
struct SimGpu {
    dev: Arc<GpuDev>,
    _faux: faux::Registration,
}

impl Drop for SimGpu {
    fn drop(&mut self) {
        gpu::unregister(&self.dev);
    }
}

/// The simulated GPUs of `sim_gpus`, removed on drop.
pub(crate) struct SimGpus {
    _gpus: KVec<SimGpu>,
}

impl SimGpus {
    /// Creates and registers `count` simulated GPUs; `EINVAL` (with an error line) above
    /// [`MAX_SIM_GPUS`], so that a wrong parameter fails the load.
    pub(crate) fn new(count: u32) -> Result<Self> {
        if count > MAX_SIM_GPUS {
            pr_err!("sim_gpus={count}: at most {MAX_SIM_GPUS}\n");
            return Err(EINVAL);
        }
        // CAST: at most `MAX_SIM_GPUS`.
        let mut gpus = KVec::with_capacity(count as usize, GFP_KERNEL)?;
        for index in 0..count {
            let name = CString::try_from_fmt(fmt!("ruvm-sim{index}"))?;
            let faux = faux::Registration::new(&name, None)?;
            let dma = DmaDevice::sim(&faux, SIM_DMA_BITS)?;
            let info = GpuInfo {
                kind: uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM,
                vendor: 0,
                device: 0,
                domain: 0,
                bus: 0,
                // CAST: at most `MAX_SIM_GPUS`, which fits a byte.
                devfn: index as u8,
                dma_mask_bits: SIM_DMA_BITS,
                page_sizes: gpu::TEST_PAGE_SIZES,
            };
            let dev = gpu::register(info, dma, Some(Engine::Sim))?;
            pr_info!("simulated GPU {} ({name:?})\n", dev.id);
            gpus.push(SimGpu { dev, _faux: faux }, GFP_KERNEL)?;
        }
        Ok(Self { _gpus: gpus })
    }
}
