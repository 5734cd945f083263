// SPDX-License-Identifier: GPL-2.0

//! The GPU registry: every GPU ruvm knows, under a stable id.
//!
//! A GPU enters the registry when its driver binds it and stays when it is unbound (marked not
//! present), so that a rebind of the same PCI device gets the same id back. Sources: the test
//! GPUs, QEMU `edu` devices bound by ruvm's own PCI driver ([`edu`]); host GPUs named by
//! `host_gpus` ([`HostGpus`]); simulated GPUs on the faux bus ([`sim`]).
//!
//! Locking: one module-wide mutex (`bind::globals::GPUS`), a leaf: nothing else is taken under it.

use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
};

use crate::{
    bind::{dma::DmaDevice, globals::GPUS},
    uapi,
};

pub(crate) mod edu;
pub(crate) mod pmm;
pub(crate) mod sim;

/// The most GPUs the registry holds.
const MAX_GPUS: usize = uapi::RUVM_MAX_GPUS as usize;

/// The page sizes of a test GPU: 4K, 64K and 2M, as on Turing and later.
pub(crate) const TEST_PAGE_SIZES: u64 = (4 << 10) | (64 << 10) | (2 << 20);

/// What the registry knows of a GPU, besides its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GpuInfo {
    pub(crate) kind: u32,
    pub(crate) vendor: u16,
    pub(crate) device: u16,
    /// PCI domain; 0 for the test GPUs (7.2 exposes no domain accessor yet).
    pub(crate) domain: u32,
    pub(crate) bus: u8,
    pub(crate) devfn: u8,
    pub(crate) dma_mask_bits: u32,
    pub(crate) page_sizes: u64,
}

impl GpuInfo {
    fn same_device(&self, other: &GpuInfo) -> bool {
        (self.kind, self.domain, self.bus, self.devfn)
            == (other.kind, other.domain, other.bus, other.devfn)
    }
}

/// A GPU's copy engine.
pub(crate) enum Engine {
    /// edu's DMA engine, through the IOMMU.
    Edu(edu::EduEngine),
    /// A simulated GPU's: the CPU, through the GPU's DMA address translation.
    Sim,
}

impl Engine {
    /// The largest piece one [`Self::copy`] moves.
    pub(crate) fn max_piece(&self) -> usize {
        match self {
            Engine::Edu(_) => edu::EduEngine::MAX_PIECE,
            Engine::Sim => sim::MAX_PIECE,
        }
    }

    /// Copies `len` bytes (at most [`Self::max_piece`]) from DMA address `src` to `dst`.
    pub(crate) fn copy(&self, dma: &DmaDevice, dst: u64, src: u64, len: usize) -> Result {
        match self {
            Engine::Edu(e) => e.copy(dst, src, len),
            Engine::Sim => sim::check_piece(len).and_then(|()| dma.sim_copy(dst, src, len)),
        }
    }

    /// Reads `len` bytes at DMA address `src` into the engine, bypassing every table (to aim
    /// it at an unmapped address on purpose).
    pub(crate) fn read_raw(&self, dma: &DmaDevice, src: u64, len: usize) -> Result {
        match self {
            Engine::Edu(e) => e.read_into_device(src, len),
            Engine::Sim => sim::check_piece(len).and_then(|()| dma.sim_read(src, len)),
        }
    }
}

/// A bound GPU, as mappings use it.
///
/// `alive` is held across every DMA mapping made for the GPU and by its removal, so that no
/// mapping is made once removal has begun, and removal waits for one in flight. Lock order:
/// a GPU's `alive`, then the mem registry, then a mem's state.
#[pin_data]
pub(crate) struct GpuDev {
    pub(crate) id: u32,
    pub(crate) dma: Arc<DmaDevice>,
    /// The highest DMA address the GPU can use.
    pub(crate) limit: u64,
    /// Its copy engine.
    pub(crate) engine: Option<Engine>,
    /// Its page sizes (bit n: 2^n bytes).
    pub(crate) page_sizes: u64,
    /// Its vidmem manager, if it has vidmem.
    pub(crate) pmm: Option<Arc<pmm::Pmm>>,
    #[pin]
    pub(crate) alive: Mutex<bool>,
}

/// One registry entry.
pub(crate) struct GpuEntry {
    id: u32,
    info: GpuInfo,
    /// While bound.
    dev: Option<Arc<GpuDev>>,
}

/// Adds a GPU that was just bound, or brings back the entry of the same PCI device; returns
/// it. `ENOSPC` when the registry is full.
pub(crate) fn register(
    info: GpuInfo,
    dma: DmaDevice,
    engine: Option<Engine>,
) -> Result<Arc<GpuDev>> {
    let dma = Arc::new(dma, GFP_KERNEL)?;
    let limit = match info.dma_mask_bits {
        64.. => u64::MAX,
        bits => (1u64 << bits) - 1,
    };
    let mut gpus = GPUS.lock();
    let index = match gpus.iter().position(|e| e.info.same_device(&info)) {
        Some(i) => i,
        None => {
            if gpus.len() >= MAX_GPUS {
                return Err(ENOSPC);
            }
            let id = u32::try_from(gpus.len())?;
            gpus.push(
                GpuEntry {
                    id,
                    info,
                    dev: None,
                },
                GFP_KERNEL,
            )?;
            gpus.len() - 1
        }
    };
    let entry = gpus.get_mut(index).ok_or(EINVAL)?;
    let id = entry.id;
    let pmm = match crate::vidmem_bytes(id) {
        0 => None,
        bytes => Some(pmm::Pmm::new(bytes, dma.clone(), limit)?),
    };
    let dev = Arc::pin_init(
        try_pin_init!(GpuDev {
            id,
            dma,
            limit,
            engine,
            page_sizes: info.page_sizes,
            pmm,
            alive <- new_mutex!(true),
        }),
        GFP_KERNEL,
    )?;
    entry.info = info;
    entry.dev = Some(dev.clone());
    Ok(dev)
}

/// Removes a GPU that is being unbound: no new mapping can start, the mappings every mem has
/// for it are dropped and its vidmem's storage freed (while the device is still bound), and its
/// entry stays, marked gone. Its vidmem mems stay, unusable (`ENODEV`) but free to free.
pub(crate) fn unregister(dev: &GpuDev) {
    let mut alive = dev.alive.lock();
    *alive = false;
    crate::mem::drop_gpu_tables(dev.id);
    if let Some(pmm) = &dev.pmm {
        pmm.kill();
    }
    drop(alive);
    if let Some(e) = GPUS.lock().iter_mut().find(|e| e.id == dev.id) {
        e.dev = None;
    }
}

/// The bound GPU `id`, or `ENODEV` (no such GPU, or unbound).
pub(crate) fn get(id: u32) -> Result<Arc<GpuDev>> {
    GPUS.lock()
        .iter()
        .find(|e| e.id == id)
        .and_then(|e| e.dev.clone())
        .ok_or(ENODEV)
}

/// Every GPU of the registry, as `RUVM_IOCTL_GPU_LIST` reports them.
pub(crate) fn list() -> Result<KVec<uapi::ruvm_gpu_info>> {
    let gpus = GPUS.lock();
    let mut out = KVec::with_capacity(gpus.len(), GFP_KERNEL)?;
    for e in gpus.iter() {
        let i = &e.info;
        out.push(
            uapi::ruvm_gpu_info {
                id: e.id,
                kind: i.kind,
                flags: e.dev.as_ref().map_or(0, |d| {
                    let ce = if d.engine.is_some() {
                        uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE
                    } else {
                        0
                    };
                    uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT | ce
                }),
                vendor: i.vendor,
                device: i.device,
                pci_domain: i.domain,
                pci_bus: i.bus,
                pci_devfn: i.devfn,
                dma_mask_bits: i.dma_mask_bits,
                page_sizes: i.page_sizes,
                dma_mapped_bytes: e.dev.as_ref().map_or(0, |d| d.dma.mapped_bytes()),
                vidmem_size: e
                    .dev
                    .as_ref()
                    .and_then(|d| d.pmm.as_ref())
                    .map_or(0, |p| p.capacity()),
                pad: 0,
                pad2: 0,
            },
            GFP_KERNEL,
        )?;
    }
    Ok(out)
}

/// The PCI addresses (bus << 8 | devfn, domain 0) named by `host_gpus`: up to four 16-bit
/// fields of the parameter, 0 meaning none (00:00.0 is never a GPU).
pub(crate) fn host_addresses(param: u64) -> impl Iterator<Item = (u8, u8)> {
    (0..4)
        .map(move |i| crate::param_field(param, i))
        .filter(|&a| a != 0)
        // CAST: each part is masked to a byte.
        .map(|a| ((a >> 8) as u8, (a & 0xff) as u8))
}

/// Whether `host_gpus` names the device at `bus`/`devfn` (the edu driver leaves those alone).
pub(crate) fn is_host(bus: u8, devfn: u8) -> bool {
    host_addresses(crate::host_gpus_param()).any(|a| a == (bus, devfn))
}

/// The host GPUs of `host_gpus`, registered for DMA mapping only, unregistered on drop.
pub(crate) struct HostGpus {
    gpus: KVec<Arc<GpuDev>>,
}

impl HostGpus {
    /// Finds and registers every device `host_gpus` names; `ENODEV` (with an error line) if one
    /// does not exist or has no DMA mask, so that a mistyped address fails the load.
    pub(crate) fn new(param: u64) -> Result<Self> {
        let mut gpus = KVec::new();
        for (bus, devfn) in host_addresses(param) {
            let Some(pdev) = crate::bind::dma::find_pci(bus, devfn) else {
                pr_err!(
                    "host_gpus: no PCI device at 0000:{bus:02x}:{:02x}.{}\n",
                    devfn >> 3,
                    devfn & 7
                );
                return Err(ENODEV);
            };
            let (vendor, device) = (pdev.vendor_id().as_raw(), pdev.device_id());
            let dma = DmaDevice::from_pci(pdev);
            let Some(mask) = dma.dma_mask() else {
                pr_err!(
                    "host_gpus: 0000:{bus:02x}:{:02x}.{} has no DMA mask\n",
                    devfn >> 3,
                    devfn & 7
                );
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
                page_sizes: TEST_PAGE_SIZES,
            };
            let dev = register(info, dma, None)?;
            pr_info!(
                "host GPU {} at 0000:{bus:02x}:{:02x}.{} (DMA mapping only)\n",
                dev.id,
                devfn >> 3,
                devfn & 7
            );
            gpus.push(dev, GFP_KERNEL)?;
        }
        Ok(Self { gpus })
    }
}

impl Drop for HostGpus {
    fn drop(&mut self) {
        for dev in self.gpus.iter() {
            unregister(dev);
        }
    }
}

/// For the audit's walk: every present GPU's vidmem root chunks with storage, and the DMA
/// mappings of that storage.
pub(crate) fn walk_vidmem() -> (u64, u64) {
    let gpus = GPUS.lock();
    gpus.iter()
        .filter_map(|e| e.dev.as_ref()?.pmm.as_ref().map(|p| p.walk()))
        .fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
}

/// Empties the registry at unload, after the drivers have let their GPUs go.
pub(crate) fn drain() {
    let _all = core::mem::replace(&mut *GPUS.lock(), KVec::new());
}
