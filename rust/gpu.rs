// SPDX-License-Identifier: GPL-2.0

//! The GPU registry: every GPU ruvm knows, under a stable id, and the access rule for a bound
//! GPU's resources.
//!
//! A GPU enters the registry when its driver binds it and stays when it is unbound (marked not
//! present), so that a rebind of the same PCI device gets the same id back. Sources: the test
//! GPUs, QEMU `edu` devices bound by ruvm's own PCI driver ([`edu`]); host GPUs named by
//! `host_gpus` ([`host`]); simulated GPUs on the faux bus ([`sim`]).
//!
//! # Access and removal
//!
//! A bound GPU's device, engine and PMM are reached only through a [`GpuAccess`] guard
//! ([`GpuDev::access`]), which fails with `ENODEV` once removal has begun; every DMA table is
//! made through one. Removal ([`unregister`]) revokes access and waits for every guard to go,
//! drops every DMA table made for the GPU (through the hook their owner installed,
//! [`set_removal_hook`]) and the PMM's storage, then waits until no table of the GPU is left
//! anywhere (one being dropped by another thread right then included: [`dma::Tracker`]), all
//! while the device is still bound; only then does the driver let the device go. So no mapping
//! of a device outlives its release. Guards may sleep (unlike `Revocable`'s RCU guard): mapping
//! and copying do.
//!
//! This file owns the module-wide registry lock `GPUS` (see the crate's lock order).

use kernel::{
    new_condvar, new_mutex,
    prelude::*,
    sync::{Arc, CondVar, Mutex},
};

use crate::{
    bind::{dma::DmaDevice, errno, global::global},
    uapi,
};

pub(crate) mod chunks;
pub(crate) mod dma;
pub(crate) mod edu;
pub(crate) mod host;
pub(crate) mod limit;
pub(crate) mod mmu;
pub(crate) mod pmm;
mod present;
pub(crate) mod set;
pub(crate) mod sim;

pub(crate) use present::{mmus, release_kept, walk_page_tables, walk_vidmem, VidmemShrink};

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

    /// The PCI address of an edu or host GPU; `None` for a simulated one.
    fn pci_addr(&self) -> Option<PciAddr> {
        let pci = [
            uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU,
            uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST,
        ];
        pci.contains(&self.kind).then_some(PciAddr {
            domain: u16::try_from(self.domain).ok()?,
            bus: self.bus,
            devfn: self.devfn,
        })
    }
}

/// A GPU's copy engine.
pub(crate) enum Engine {
    /// edu's DMA engine, through the IOMMU.
    Edu(Arc<edu::EduEngine>),
    /// A simulated GPU's: the CPU, through the GPU's DMA address translation.
    Sim,
}

/// Who is using a GPU's resources now.
struct Users {
    /// Removal has begun: no new guard.
    revoked: bool,
    /// Guards alive.
    count: u32,
}

/// A bound GPU.
#[pin_data]
pub(crate) struct GpuDev {
    pub(crate) id: u32,
    /// The highest DMA address the GPU can use.
    pub(crate) limit: u64,
    /// Its page sizes (bit n: 2^n bytes).
    pub(crate) page_sizes: u64,
    /// What it has: reached only through a guard.
    res: Resources,
    #[pin]
    users: Mutex<Users>,
    /// Signalled when the last guard goes during removal.
    #[pin]
    idle: CondVar,
}

/// A GPU's resources.
struct Resources {
    dma: Arc<DmaDevice>,
    engine: Option<Engine>,
    pmm: Option<Arc<pmm::Pmm>>,
    /// What a simulated GPU's engine can reach.
    sim: Option<Arc<sim::SimIommu>>,
    /// A simulated GPU's MMU.
    mmu: Option<Arc<mmu::Mmu>>,
    /// Its DMA tables and their bytes.
    tracker: Arc<dma::Tracker>,
}

/// Proof that a GPU is bound, and stays bound while it lives.
pub(crate) struct GpuAccess<'a> {
    gpu: &'a GpuDev,
}

impl GpuDev {
    /// Access to the bound GPU's resources; `ENODEV` once its removal has begun.
    pub(crate) fn access(&self) -> Result<GpuAccess<'_>> {
        let mut u = self.users.lock();
        if u.revoked {
            return Err(ENODEV);
        }
        u.count += 1;
        Ok(GpuAccess { gpu: self })
    }

    /// Whether its removal has begun (access is being revoked): a long use of it (an
    /// allocation of many vidmem chunks) stops then rather than make the removal wait.
    pub(crate) fn going(&self) -> bool {
        self.users.lock().revoked
    }

    /// Ends access: new guards are refused, and this waits for every guard to go.
    fn revoke(&self) {
        let mut u = self.users.lock();
        u.revoked = true;
        while u.count > 0 {
            self.idle.wait(&mut u);
        }
    }

    /// Bytes DMA-mapped for it now.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.res.tracker.bytes()
    }

    /// Whether it has a copy engine.
    pub(crate) fn has_engine(&self) -> bool {
        self.res.engine.is_some()
    }

    /// Whether it has an MMU.
    pub(crate) fn has_mmu(&self) -> bool {
        self.res.mmu.is_some()
    }

    /// Its vidmem size (0 without vidmem).
    pub(crate) fn vidmem_size(&self) -> u64 {
        self.res.pmm.as_ref().map_or(0, |p| p.capacity())
    }
}

impl Drop for GpuAccess<'_> {
    fn drop(&mut self) {
        let mut u = self.gpu.users.lock();
        u.count -= 1;
        if u.count == 0 && u.revoked {
            self.gpu.idle.notify_all();
        }
    }
}

impl GpuAccess<'_> {
    /// The GPU's copy engine, or `ENODEV`.
    pub(crate) fn engine(&self) -> Result<&Engine> {
        self.gpu.res.engine.as_ref().ok_or(ENODEV)
    }

    /// The GPU's PMM, or `ENXIO` if it has no vidmem.
    pub(crate) fn pmm(&self) -> Result<&Arc<pmm::Pmm>> {
        self.gpu.res.pmm.as_ref().ok_or(ENXIO)
    }

    /// The GPU's MMU, or `EOPNOTSUPP` (the test and host GPUs have none).
    pub(crate) fn mmu(&self) -> Result<&Arc<mmu::Mmu>> {
        self.gpu.res.mmu.as_ref().ok_or_else(errno::eopnotsupp)
    }

    /// DMA-maps every chunk of `pages` for the GPU.
    pub(crate) fn map(&self, pages: Arc<dma::Pages>) -> Result<dma::GpuTable> {
        let r = &self.gpu.res;
        dma::GpuTable::new(
            r.dma.clone(),
            pages,
            self.gpu.limit,
            r.tracker.clone(),
            r.sim.clone(),
        )
    }

    /// Attaches another exporter's dma-buf to the GPU and maps it (`EOPNOTSUPP` on a simulated
    /// GPU; see [`dma::GpuTable::attach`]).
    pub(crate) fn attach(&self, buf: &crate::bind::attach::DmaBuf) -> Result<dma::GpuTable> {
        let r = &self.gpu.res;
        dma::GpuTable::attach(
            &r.dma,
            buf,
            self.gpu.limit,
            r.tracker.clone(),
            r.sim.is_some(),
        )
    }

    /// Largest piece one [`Self::copy`] moves.
    pub(crate) fn max_piece(&self) -> Result<usize> {
        Ok(match self.engine()? {
            Engine::Edu(_) => edu::EduEngine::MAX_PIECE,
            Engine::Sim => sim::MAX_PIECE,
        })
    }

    /// Copies `len` bytes (at most [`Self::max_piece`]) from DMA address `src` to `dst` with
    /// the GPU's engine; `ENODEV` once the GPU's removal has begun (a long copy stops at its
    /// next piece, so the removal waits for one piece only).
    pub(crate) fn copy(&self, dst: u64, src: u64, len: usize) -> Result {
        if self.gpu.res.tracker.is_closed() {
            return Err(ENODEV);
        }
        match (self.engine()?, &self.gpu.res.sim) {
            (Engine::Edu(e), _) => e.copy(dst, src, len),
            (Engine::Sim, Some(sim)) => sim.copy(self.gpu.id, dst, src, len),
            (Engine::Sim, None) => Err(ENODEV),
        }
    }

    /// Reads `len` bytes at DMA address `src` into the engine, bypassing every table (to aim
    /// it at an unmapped address on purpose).
    pub(crate) fn read_raw(&self, src: u64, len: usize) -> Result {
        match (self.engine()?, &self.gpu.res.sim) {
            (Engine::Edu(e), _) => e.read_into_device(src, len),
            (Engine::Sim, Some(sim)) => sim.read(self.gpu.id, src, len),
            (Engine::Sim, None) => Err(ENODEV),
        }
    }
}

/// One registry entry.
struct GpuEntry {
    id: u32,
    info: GpuInfo,
    /// While bound.
    dev: Option<Arc<GpuDev>>,
}

/// The registry and what it needs to make a GPU.
struct Registry {
    gpus: KVec<GpuEntry>,
    config: Config,
    /// Called with a GPU's id during its removal, to drop every DMA table made for it.
    on_remove: Option<fn(u32)>,
}

/// The most host GPUs `host_gpus` names.
pub(crate) const MAX_HOST_PARAM: usize = 8;

/// A PCI device's address: domain (segment), bus, device and function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PciAddr {
    pub(crate) domain: u16,
    pub(crate) bus: u8,
    pub(crate) devfn: u8,
}

impl kernel::fmt::Display for PciAddr {
    /// As `lspci -D` writes it: `0000:65:00.0`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{}",
            self.domain,
            self.bus,
            self.devfn >> 3,
            self.devfn & 7
        )
    }
}

/// What the module's parameters say about GPUs.
#[derive(Clone, Copy)]
pub(crate) struct Config {
    /// Vidmem of each GPU, in bytes.
    pub(crate) vidmem: u64,
    /// Bytes of root storage each GPU's PMM keeps for reuse.
    pub(crate) vidmem_keep: u64,
    /// Bytes of each GPU's vidmem one user may hold (0: no limit), `vidmem_user_mib`.
    pub(crate) vidmem_user: u64,
    /// The host GPUs `host_gpus` names, which the edu driver leaves alone.
    pub(crate) host: [Option<PciAddr>; MAX_HOST_PARAM],
}

impl Config {
    const fn none() -> Self {
        Self {
            vidmem: 0,
            vidmem_keep: 0,
            vidmem_user: 0,
            host: [None; MAX_HOST_PARAM],
        }
    }
}

global! {
    /// Every GPU ruvm knows.
    static GPUS: Mutex<Registry> = Registry {
        gpus: KVec::new(),
        config: Config::none(),
        on_remove: None,
    };
}

/// Makes the registry usable with the module's GPU settings (module init, before any driver).
pub(crate) fn init(config: Config) {
    GPUS.init();
    limit::init();
    limit::set_user_limit(config.vidmem_user);
    host::init();
    if let Some(mut r) = GPUS.lock() {
        r.config = config;
    }
}

/// Installs the function that drops every DMA table made for a GPU being removed (the owner of
/// the tables calls this at init).
pub(crate) fn set_removal_hook(hook: fn(u32)) {
    if let Some(mut r) = GPUS.lock() {
        r.on_remove = Some(hook);
    }
}

/// Whether `host_gpus` names the device at `bus`/`devfn` of domain 0 (the edu driver, which
/// sees domain 0 only, leaves those alone).
pub(crate) fn is_host(bus: u8, devfn: u8) -> bool {
    let addr = PciAddr {
        domain: 0,
        bus,
        devfn,
    };
    GPUS.lock()
        .is_some_and(|r| r.config.host.contains(&Some(addr)))
}

/// Whether a PCI GPU (edu or host) at `addr` is registered and present now.
pub(crate) fn pci_present(addr: PciAddr) -> bool {
    GPUS.lock().is_some_and(|r| r.pci_present(addr))
}

impl Registry {
    /// Whether a PCI GPU (edu or host) at `addr` is present.
    fn pci_present(&self, addr: PciAddr) -> bool {
        self.gpus
            .iter()
            .any(|e| e.dev.is_some() && e.info.pci_addr() == Some(addr))
    }
}

/// Adds a GPU that was just bound, or brings back the entry of the same PCI device; returns
/// it. `EEXIST` when a GPU is present at the same PCI address now, of either kind (a device
/// attached as a host GPU is not bound by ruvm-edu too, nor the other way round: the check and
/// the registration are one step under the registry's lock). `ENOSPC` when the registry is full.
pub(crate) fn register(
    info: GpuInfo,
    dma: DmaDevice,
    engine: Option<Engine>,
) -> Result<Arc<GpuDev>> {
    let dma = Arc::new(dma, GFP_KERNEL)?;
    let tracker = Arc::pin_init(dma::Tracker::new(), GFP_KERNEL)?;
    let limit = match info.dma_mask_bits {
        64.. => u64::MAX,
        bits => (1u64 << bits) - 1,
    };
    // A simulated engine reaches memory through the translation its GPU's tables record.
    let sim = match engine {
        Some(Engine::Sim) => Some(Arc::pin_init(sim::SimIommu::new(), GFP_KERNEL)?),
        _ => None,
    };
    let mut reg = GPUS.lock().ok_or(ENODEV)?;
    if info.pci_addr().is_some_and(|a| reg.pci_present(a)) {
        return Err(EEXIST);
    }
    let index = match reg.gpus.iter().position(|e| e.info.same_device(&info)) {
        Some(i) => i,
        None => {
            if reg.gpus.len() >= MAX_GPUS {
                return Err(ENOSPC);
            }
            let id = u32::try_from(reg.gpus.len())?;
            reg.gpus.push(
                GpuEntry {
                    id,
                    info,
                    dev: None,
                },
                GFP_KERNEL,
            )?;
            reg.gpus.len() - 1
        }
    };
    let (vidmem, keep) = (reg.config.vidmem, reg.config.vidmem_keep);
    let entry = reg.gpus.get_mut(index).ok_or(EINVAL)?;
    let id = entry.id;
    let pmm = match vidmem {
        0 => None,
        bytes => Some(pmm::Pmm::new(
            id,
            bytes,
            keep,
            dma.clone(),
            limit,
            tracker.clone(),
            sim.clone(),
        )?),
    };
    let mmu = match &sim {
        Some(s) => Some(mmu::Mmu::new(
            id,
            dma.clone(),
            limit,
            tracker.clone(),
            s.clone(),
            pmm.clone(),
        )?),
        None => None,
    };
    let dev = Arc::pin_init(
        try_pin_init!(GpuDev {
            id,
            limit,
            page_sizes: info.page_sizes,
            res: Resources {
                dma,
                engine,
                pmm,
                sim,
                mmu,
                tracker,
            },
            users <- new_mutex!(Users {
                revoked: false,
                count: 0,
            }),
            idle <- new_condvar!(),
        }),
        GFP_KERNEL,
    )?;
    entry.info = info;
    entry.dev = Some(dev.clone());
    Ok(dev)
}

/// Removes a GPU that is being unbound: access is revoked (waiting for users), every DMA table
/// made for it is dropped and its vidmem's storage freed, and this waits until no table of it
/// is left (all while the device is still bound); its entry stays, marked gone. Its vidmem mems
/// stay, unusable (`ENODEV`) but free to free.
pub(crate) fn unregister(dev: &GpuDev) {
    // Before the guards are waited for: a copy in flight stops at its next piece (so removal
    // waits for one piece, not a whole copy), and before the hook visits the tables' holders
    // (see `GpuTable::keepable`).
    dev.res.tracker.close();
    dev.revoke();
    let hook = GPUS.lock().and_then(|r| r.on_remove);
    if let Some(hook) = hook {
        hook(dev.id);
    }
    // Its page tables, now that no mem is mapped on it, before the memory they live in.
    if let Some(mmu) = &dev.res.mmu {
        mmu.kill();
    }
    if let Some(pmm) = &dev.res.pmm {
        pmm.kill();
    }
    dev.res.tracker.wait_empty();
    if let Some(mut r) = GPUS.lock() {
        if let Some(e) = r.gpus.iter_mut().find(|e| e.id == dev.id) {
            e.dev = None;
        }
    }
}

/// The bound GPU `id`, or `ENODEV` (no such GPU, or unbound).
pub(crate) fn get(id: u32) -> Result<Arc<GpuDev>> {
    GPUS.lock()
        .ok_or(ENODEV)?
        .gpus
        .iter()
        .find(|e| e.id == id)
        .and_then(|e| e.dev.clone())
        .ok_or(ENODEV)
}

/// Every GPU of the registry, as `RUVM_IOCTL_GPU_LIST` reports them.
pub(crate) fn list() -> Result<KVec<uapi::ruvm_gpu_info>> {
    let reg = GPUS.lock().ok_or(ENODEV)?;
    let mut out = KVec::with_capacity(reg.gpus.len(), GFP_KERNEL)?;
    for e in reg.gpus.iter() {
        let i = &e.info;
        let dev = e.dev.as_deref();
        let flags = dev.map_or(0, |d| {
            let ce = if d.has_engine() {
                uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE
            } else {
                0
            };
            let mmu = if d.has_mmu() {
                uapi::ruvm_gpu_flags_RUVM_GPU_MMU
            } else {
                0
            };
            uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT | ce | mmu
        });
        out.push(
            uapi::ruvm_gpu_info {
                id: e.id,
                kind: i.kind,
                flags,
                vendor: i.vendor,
                device: i.device,
                pci_domain: i.domain,
                pci_bus: i.bus,
                pci_devfn: i.devfn,
                dma_mask_bits: i.dma_mask_bits,
                page_sizes: i.page_sizes,
                dma_mapped_bytes: dev.map_or(0, |d| d.mapped_bytes()),
                vidmem_size: dev.map_or(0, |d| d.vidmem_size()),
                pad: 0,
                pad2: 0,
            },
            GFP_KERNEL,
        )?;
    }
    Ok(out)
}

/// Empties the registry at unload, after the drivers have let their GPUs go.
pub(crate) fn drain() {
    let _all = GPUS
        .lock()
        .map(|mut r| core::mem::replace(&mut r.gpus, KVec::new()));
}
