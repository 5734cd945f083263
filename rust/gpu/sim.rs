// SPDX-License-Identifier: GPL-2.0

//! Simulated GPUs (`sim_gpus=N`): for machines with neither test nor host GPUs.
//!
//! Each is a device on the kernel's faux bus (`/sys/bus/faux/devices/ruvm-simN`) with a
//! 47-bit DMA mask, so mappings made for it are real streaming DMA mappings (dma-direct: no
//! IOMMU translates for a faux device). Its copy engine is the CPU, but it reaches memory only
//! through the DMA addresses it is given, translated through the mappings that exist for the
//! device ([`SimIommu`]): an address that no mapping covers faults (`EFAULT`, and a
//! `sim GPU: DMA fault` line), so wrong or stale addresses show as they would on hardware.
//!
//! Faux devices cannot be unbound from user space; a simulated GPU leaves the registry (marked
//! gone, its mappings dropped) when the module unloads, or earlier when a test removes it
//! (`RUVM_IOCTL_TEST_SIM_GPU`, which can also bring it back under the same id).
//!
//! Locking: the list of simulated GPUs is held across a removal or a return (the crate's lock
//! order, level 3); the translation's mutex is a leaf, taken under a PMM's lock (storage being mapped)
//! and under nothing else; bytes are moved after it is released.

use kernel::{
    faux, new_mutex,
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
    str::CString,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc, Mutex,
    },
};

use crate::{
    audit::Counted,
    bind::{dma::DmaDevice, dma::DmaTable, global::global, pages::ChunkList, ratelimit},
    gpu::{self, Engine, GpuDev, GpuInfo},
    uapi,
};

/// What a mapping reaches: a chunk list counted by the audit (the GPU layer's `dma::Pages`).
type Pages = ChunkList<Counted>;

/// The width of a simulated GPU's DMA addresses (NVIDIA GPUs address 47 bits or more of
/// system memory).
pub(crate) const SIM_DMA_BITS: u32 = 47;

/// The most simulated GPUs `sim_gpus` may ask for.
pub(crate) const MAX_SIM_GPUS: u32 = 8;

/// The largest piece the simulated engine moves at once: the biggest chunk.
pub(crate) const MAX_PIECE: usize = 2 << 20;

/// One mapping: DMA addresses `[start, last]` are chunk `chunk` of `pages`.
struct SimMapping {
    start: u64,
    pages: Arc<Pages>,
    chunk: usize,
}

/// The DMA mappings made for a simulated GPU, keyed by (last byte, table serial): the
/// translation its engine (the CPU) uses, which, like an IOMMU, reaches nothing else. The serial
/// keeps the mappings of two tables apart when dma-direct gives them the same addresses (a
/// table remapped while the old one is still being dropped).
#[pin_data]
pub(crate) struct SimIommu {
    #[pin]
    maps: Mutex<RBTree<(u64, u64), SimMapping>>,
    serial: Atomic<u64>,
}

/// A translated range: `len` bytes at byte `offset` of `pages` (kept alive by this).
struct SimRange {
    pages: Arc<Pages>,
    offset: usize,
}

impl SimIommu {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            maps <- new_mutex!(RBTree::new()),
            serial: Atomic::new(1),
        })
    }

    /// The mapping that holds all of `[addr, addr + len)`, if any.
    fn lookup(&self, addr: u64, len: usize) -> Option<SimRange> {
        let last = u64::try_from(len)
            .ok()
            .and_then(|l| l.checked_sub(1))
            .and_then(|l| addr.checked_add(l))?;
        let maps = self.maps.lock();
        maps.cursor_lower_bound(&(addr, 0)).and_then(|c| {
            let ((end, _), m) = c.current();
            (m.start <= addr && last <= *end).then(|| SimRange {
                pages: m.pages.clone(),
                // CAST: inside one chunk, whose length is a `usize`.
                offset: m.chunk * m.pages.chunk_len() + (addr - m.start) as usize,
            })
        })
    }

    /// The mapping that holds all of `[addr, addr + len)`, or a logged fault.
    fn translate(&self, id: u32, addr: u64, len: usize) -> Result<SimRange> {
        if len == 0 {
            return Err(EINVAL);
        }
        self.lookup(addr, len).ok_or_else(|| {
            if ratelimit::printk_ok() {
                pr_err!("sim GPU: DMA fault at {addr:#x}+{len:#x}: not mapped (GPU {id})\n");
            }
            EFAULT
        })
    }

    /// The 8-byte word at DMA address `addr` (the MMU reading a page table), or `None` if no
    /// mapping holds it.
    pub(crate) fn read_word(&self, addr: u64) -> Option<u64> {
        let r = self.lookup(addr, 8)?;
        let word = r.pages.bytes().read_u64(r.offset).ok();
        word
    }

    /// Writes the 8-byte word at DMA address `addr` (a page-table entry); `EFAULT` if no
    /// mapping holds it.
    pub(crate) fn write_word(&self, addr: u64, value: u64) -> Result {
        let r = self.lookup(addr, 8).ok_or(EFAULT)?;
        let written = r.pages.bytes().write_u64(r.offset, value);
        written
    }

    /// The engine copies `len` bytes (1 to [`MAX_PIECE`]) from DMA address `src` to `dst`,
    /// allocating nothing.
    pub(crate) fn copy(&self, id: u32, dst: u64, src: u64, len: usize) -> Result {
        check_piece(len)?;
        let from = self.translate(id, src, len)?;
        let to = self.translate(id, dst, len)?;
        // A bounce buffer on the stack: the engine's pieces run in a stream's fence-signalling
        // path, which allocates nothing.
        let mut buf = [0u8; BOUNCE];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(BOUNCE);
            let piece = buf.get_mut(..n).ok_or(EINVAL)?;
            from.pages.bytes().read(from.offset + done, piece)?;
            to.pages.bytes().write(to.offset + done, piece)?;
            done += n;
        }
        Ok(())
    }

    /// The engine reads `len` bytes at DMA address `src` and drops them: faults (`EFAULT`,
    /// logged) unless a live mapping covers them.
    pub(crate) fn read(&self, id: u32, src: u64, len: usize) -> Result {
        check_piece(len)?;
        self.translate(id, src, len).map(|_| ())
    }
}

/// The bytes the simulated engine moves at a time through its bounce buffer.
const BOUNCE: usize = 512;

/// `EINVAL` unless `len` is a piece the simulated engine moves (1 byte to [`MAX_PIECE`]).
fn check_piece(len: usize) -> Result {
    if len == 0 || len > MAX_PIECE {
        return Err(EINVAL);
    }
    Ok(())
}

/// The records one table put in a [`SimIommu`], removed (exactly those) on drop.
pub(crate) struct SimRecords {
    iommu: Arc<SimIommu>,
    keys: KVVec<(u64, u64)>,
}

impl SimRecords {
    /// Records every mapping of `table`.
    pub(super) fn new(iommu: Arc<SimIommu>, table: &DmaTable<Counted>) -> Result<Self> {
        let serial = iommu.serial.fetch_add(1, Relaxed);
        let len = table.chunk_len() as u64;
        let mut records = Self {
            iommu,
            keys: KVVec::with_capacity(table.count(), GFP_KERNEL_ACCOUNT)?,
        };
        for (chunk, start) in table.addrs().enumerate() {
            let key = (start + (len - 1), serial);
            let mapping = SimMapping {
                start,
                pages: table.pages().clone(),
                chunk,
            };
            let node = RBTreeNode::new(key, mapping, GFP_KERNEL_ACCOUNT)?;
            records.keys.push(key, GFP_KERNEL)?;
            records.iommu.maps.lock().insert(node);
        }
        Ok(records)
    }
}

impl Drop for SimRecords {
    fn drop(&mut self) {
        let mut maps = self.iommu.maps.lock();
        for key in self.keys.iter() {
            maps.remove(key);
        }
    }
}

/// One simulated GPU: its registry entry while it is there (unregistered first on drop, while
/// the device is still there), then its faux device.
struct SimGpu {
    info: GpuInfo,
    id: u32,
    dma: DmaDevice,
    dev: Option<Arc<GpuDev>>,
    _faux: faux::Registration,
}

impl Drop for SimGpu {
    fn drop(&mut self) {
        if let Some(dev) = self.dev.take() {
            gpu::unregister(&dev);
        }
    }
}

global! {
    /// Every simulated GPU, there or removed (`RUVM_IOCTL_TEST_SIM_GPU`); held across a removal
    /// or a return.
    static SIMS: Mutex<KVec<SimGpu>> = KVec::new();
}

/// The simulated GPUs of `sim_gpus`, removed on drop.
pub(crate) struct SimGpus;

impl SimGpus {
    /// Creates and registers `count` simulated GPUs; `EINVAL` (with an error line) above
    /// [`MAX_SIM_GPUS`], so that a wrong parameter fails the load.
    pub(crate) fn new(count: u32) -> Result<Self> {
        if count > MAX_SIM_GPUS {
            pr_err!("sim_gpus={count}: at most {MAX_SIM_GPUS}\n");
            return Err(EINVAL);
        }
        SIMS.init();
        // From here on, a failure drops what was made (`Drop`).
        let me = Self;
        let mut sims = SIMS.lock().ok_or(ENODEV)?;
        // CAST: at most `MAX_SIM_GPUS`.
        sims.reserve(count as usize, GFP_KERNEL)?;
        for index in 0..count {
            let name = CString::try_from_fmt(fmt!("ruvm-sim{index}"))?;
            let faux = faux::Registration::new(&name, None)?;
            let dma = DmaDevice::faux(&faux, SIM_DMA_BITS)?;
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
            let dev = gpu::register(info, dma.clone(), Some(Engine::Sim))?;
            pr_info!("simulated GPU {} ({name:?})\n", dev.id);
            let sim = SimGpu {
                info,
                id: dev.id,
                dma,
                dev: Some(dev),
                _faux: faux,
            };
            sims.push(sim, GFP_KERNEL)?;
        }
        drop(sims);
        Ok(me)
    }
}

impl Drop for SimGpus {
    fn drop(&mut self) {
        let gone = SIMS
            .lock()
            .map(|mut s| core::mem::replace(&mut *s, KVec::new()));
        // Unregistered (and their faux devices removed) outside the list's lock.
        drop(gone);
    }
}

/// Removes simulated GPU `id` as an unbind would (`EINVAL` not a simulated GPU, `ENODEV`
/// removed already).
pub(crate) fn remove(id: u32) -> Result {
    let mut sims = SIMS.lock().ok_or(ENODEV)?;
    let sim = sims.iter_mut().find(|s| s.id == id).ok_or(EINVAL)?;
    let dev = sim.dev.take().ok_or(ENODEV)?;
    gpu::unregister(&dev);
    pr_info!("simulated GPU {id} removed\n");
    Ok(())
}

/// Brings removed simulated GPU `id` back under its id (`EINVAL` not a simulated GPU,
/// `EEXIST` there).
pub(crate) fn add(id: u32) -> Result {
    let mut sims = SIMS.lock().ok_or(ENODEV)?;
    let sim = sims.iter_mut().find(|s| s.id == id).ok_or(EINVAL)?;
    if sim.dev.is_some() {
        return Err(EEXIST);
    }
    let dev = gpu::register(sim.info, sim.dma.clone(), Some(Engine::Sim))?;
    if dev.id != id {
        // The registry keeps a device's id across removals: not reached.
        gpu::unregister(&dev);
        return Err(EINVAL);
    }
    sim.dev = Some(dev);
    pr_info!("simulated GPU {id} back\n");
    Ok(())
}
