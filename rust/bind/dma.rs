// SPDX-License-Identifier: GPL-2.0

//! DMA for the GPUs: the mask set at bind, and streaming mappings of a mem's chunks.
//!
//! C header: [`include/linux/dma-mapping.h`](srctree/include/linux/dma-mapping.h)
//!
//! 7.2 has no streaming single-page DMA abstraction, so [`DmaTable`] calls
//! `dma_map_page_attrs`/`dma_unmap_page_attrs` itself, and does what the inline C
//! `dma_mapping_error` does (tell the DMA-API debugger, compare with `DMA_MAPPING_ERROR`).

use core::ptr::NonNull;

use kernel::{
    bindings, device,
    device::Core,
    dma::{Device as _, DmaMask},
    faux, new_mutex,
    page::{BorrowedPage, PAGE_SIZE},
    pci,
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
    sync::{
        aref::ARef,
        atomic::{ordering::Relaxed, Atomic},
        Arc, Mutex,
    },
};

use crate::audit::Class;

/// Sets the device's streaming and coherent DMA masks to `BITS` bits. For `probe` only.
pub(crate) fn set_mask<const BITS: u32>(pdev: &pci::Device<Core<'_>>) -> Result {
    // SAFETY: called from `probe`, before the device has any DMA mapping or allocation, so
    // nothing uses the mask concurrently.
    unsafe { pdev.dma_set_mask_and_coherent(DmaMask::new::<BITS>()) }
}

/// The PCI device at `bus`/`devfn` of domain 0, referenced, if there is one (for host GPUs,
/// which ruvm does not bind).
pub(crate) fn find_pci(bus: u8, devfn: u8) -> Option<ARef<pci::Device>> {
    // SAFETY: looks the device up and takes a reference on it (or returns NULL).
    let raw = unsafe { bindings::pci_get_domain_bus_and_slot(0, bus.into(), devfn.into()) };
    let raw = NonNull::new(raw)?;
    // SAFETY: `raw` is a valid `struct pci_dev` whose reference we now own, given to the `ARef`;
    // `pci::Device` is `#[repr(transparent)]` over `Opaque<bindings::pci_dev>`.
    Some(unsafe { ARef::from_raw(raw.cast::<pci::Device>()) })
}

/// A GPU's device, for streaming DMA mappings (kept referenced while anything maps with it),
/// and the bytes mapped for it now.
pub(crate) struct DmaDevice {
    dev: ARef<device::Device>,
    mapped: Atomic<u64>,
    /// For a simulated GPU: what its engine can reach.
    sim: Option<Pin<KBox<SimIommu>>>,
}

impl DmaDevice {
    /// The device being bound.
    pub(crate) fn new(pdev: &pci::Device<Core<'_>>) -> Self {
        let normal: &pci::Device = pdev;
        let dev: &device::Device = normal.as_ref();
        Self {
            dev: dev.into(),
            mapped: Atomic::new(0),
            sim: None,
        }
    }

    /// A device ruvm does not bind (a host GPU).
    pub(crate) fn from_pci(pdev: ARef<pci::Device>) -> Self {
        let dev: &device::Device = pdev.as_ref();
        Self {
            dev: dev.into(),
            mapped: Atomic::new(0),
            sim: None,
        }
    }

    /// A simulated GPU's faux device, given a DMA mask of `bits` bits (faux devices have none:
    /// the mask lives in the device's `coherent_dma_mask`, as platform code does it). Its
    /// mappings go through dma-direct and are recorded for [`Self::sim_copy`].
    pub(crate) fn sim(faux: &faux::Registration, bits: u32) -> Result<Self> {
        let dev: &device::Device = faux.as_ref();
        let raw = raw_device(dev);
        let mask = DmaMask::try_new(bits)?.value();
        // SAFETY: the faux device was just created by the caller and has no driver of its own
        // that uses DMA; nothing maps with it yet, so setting its masks races with nothing.
        // `dma_mask` points into the device itself, which lives as long as the device.
        let r = unsafe {
            (*raw).dma_mask = &raw mut (*raw).coherent_dma_mask;
            let r = bindings::dma_set_mask(raw, mask);
            if r == 0 {
                bindings::dma_set_coherent_mask(raw, mask)
            } else {
                r
            }
        };
        kernel::error::to_result(r)?;
        Ok(Self {
            dev: dev.into(),
            mapped: Atomic::new(0),
            sim: Some(KBox::pin_init(SimIommu::new(), GFP_KERNEL)?),
        })
    }

    /// The device's streaming DMA mask, if it has one.
    pub(crate) fn dma_mask(&self) -> Option<u64> {
        let raw = self.raw();
        // SAFETY: the device is referenced by `self`; `dma_mask` points at the device's mask (in
        // the device itself) or is NULL, and is set by its driver before it does DMA.
        unsafe {
            let mask = (*raw).dma_mask;
            (!mask.is_null()).then(|| *mask)
        }
    }

    /// Bytes mapped for this device now.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.mapped.load(Relaxed)
    }

    fn raw(&self) -> *mut bindings::device {
        raw_device(&self.dev)
    }

    /// A simulated GPU's engine: copies `len` bytes from DMA address `src` to `dst` with the
    /// CPU, translating both through the device's live mappings. An address range that no
    /// mapping covers is a DMA fault: logged, and `EFAULT`. `ENODEV` for a real device.
    pub(crate) fn sim_copy(&self, dst: u64, src: u64, len: usize) -> Result {
        let sim = self.sim.as_ref().ok_or(ENODEV)?;
        let maps = sim.maps.lock();
        let from = SimIommu::translate(&maps, src, len)?;
        let to = SimIommu::translate(&maps, dst, len)?;
        let mut buf = KVec::from_elem(0u8, PAGE_SIZE, GFP_KERNEL)?;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(PAGE_SIZE);
            let piece = buf.get_mut(..n).ok_or(EINVAL)?;
            from.access(done, piece, false)?;
            to.access(done, piece, true)?;
            done += n;
        }
        Ok(())
    }

    /// A simulated GPU's engine reading `len` bytes at DMA address `src` and dropping them:
    /// faults (`EFAULT`, logged) unless a live mapping covers them.
    pub(crate) fn sim_read(&self, src: u64, len: usize) -> Result {
        let sim = self.sim.as_ref().ok_or(ENODEV)?;
        let maps = sim.maps.lock();
        SimIommu::translate(&maps, src, len).map(|_| ())
    }
}

/// The C `struct device` of `dev`.
fn raw_device(dev: &device::Device) -> *mut bindings::device {
    // CAST: `device::Device` is `#[repr(transparent)]` over `Opaque<bindings::device>`, so a
    // pointer to it is a pointer to the C `struct device`.
    core::ptr::from_ref(dev)
        .cast::<bindings::device>()
        .cast_mut()
}

/// A page pointer held in a simulated GPU's mapping record.
struct PagePtr(NonNull<bindings::page>);

// SAFETY: a `struct page` pointer may be used from any thread; the page itself is kept alive
// by the `DmaTable` that made the record, which removes the record before it lets go.
unsafe impl Send for PagePtr {}

/// The DMA mappings made for a simulated GPU, keyed by their last byte: the translation its
/// engine (the CPU) uses, which, like an IOMMU, reaches nothing else.
#[pin_data]
struct SimIommu {
    #[pin]
    maps: Mutex<RBTree<u64, SimMapping>>,
}

/// One mapping: DMA addresses `[start, key]` are the contiguous pages from `page`.
struct SimMapping {
    start: u64,
    page: PagePtr,
}

/// A translated range of a simulated GPU's DMA space: `len` bytes at byte `offset` of the
/// contiguous pages from `page`. Valid while the mapping lock is held.
struct SimRange {
    page: NonNull<bindings::page>,
    offset: usize,
    len: usize,
}

impl SimIommu {
    fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            maps <- new_mutex!(RBTree::new()),
        })
    }

    /// The mapping that holds all of `[addr, addr + len)`, or a logged fault.
    fn translate(maps: &RBTree<u64, SimMapping>, addr: u64, len: usize) -> Result<SimRange> {
        let last = u64::try_from(len)
            .ok()
            .and_then(|l| l.checked_sub(1))
            .and_then(|l| addr.checked_add(l))
            .ok_or(EINVAL)?;
        let hit = maps.cursor_lower_bound(&addr).and_then(|c| {
            let (end, m) = c.current();
            (m.start <= addr && last <= *end).then(|| SimRange {
                page: m.page.0,
                // CAST: inside one mapping, whose length was a `usize`.
                offset: (addr - m.start) as usize,
                len,
            })
        });
        hit.ok_or_else(|| {
            if crate::bind::ratelimit::printk_ok() {
                pr_err!("sim GPU: DMA fault at {addr:#x}+{len:#x}: not mapped\n");
            }
            EFAULT
        })
    }
}

impl SimRange {
    /// Reads (or with `write`, writes) `buf.len()` bytes at byte `at` of the range.
    fn access(&self, at: usize, buf: &mut [u8], write: bool) -> Result {
        if at.checked_add(buf.len()).is_none_or(|e| e > self.len) {
            return Err(EINVAL);
        }
        let mut done = 0;
        while done < buf.len() {
            let pos = self.offset + at + done;
            let (index, in_page) = (pos / PAGE_SIZE, pos % PAGE_SIZE);
            let n = (buf.len() - done).min(PAGE_SIZE - in_page);
            let piece = buf.get_mut(done..done + n).ok_or(EINVAL)?;
            // SAFETY: the range lies in one mapping (checked by `translate`), whose pages are
            // contiguous and kept alive by its table while the caller holds the mapping lock.
            let page = unsafe { BorrowedPage::from_raw(self.page.add(index)) };
            // SAFETY: `piece` is valid for `n` bytes and no other reference to it exists; the
            // page is only ever accessed bytewise.
            unsafe {
                if write {
                    page.write_raw(piece.as_ptr(), in_page, n)?;
                } else {
                    page.read_raw(piece.as_mut_ptr(), in_page, n)?;
                }
            }
            done += n;
        }
        Ok(())
    }
}

/// What a [`DmaTable`] maps: physically contiguous chunks of pages.
pub(crate) trait ChunkSource: Send + Sync {
    /// How many chunks.
    fn chunk_count(&self) -> usize;
    /// Bytes per chunk.
    fn chunk_len(&self) -> usize;
    /// The first page of chunk `i`; valid for as long as `self` lives.
    fn chunk_page(&self, i: usize) -> Option<NonNull<bindings::page>>;
}

/// Every chunk of a [`ChunkSource`] DMA-mapped (bidirectional) for one device, unmapped on drop.
///
/// Each mapping is counted by the audit (`dma_mappings`, `dma_bytes`) from map to unmap.
///
/// # Invariants
///
/// `addrs[i]` is the result of a successful `dma_map_page_attrs` of chunk `i` of `pages` on
/// `dev`, `len` bytes, not yet unmapped; `pages` keeps the chunks alive while they are mapped.
pub(crate) struct DmaTable<P: ChunkSource> {
    dev: Arc<DmaDevice>,
    pages: Arc<P>,
    len: usize,
    addrs: KVVec<u64>,
}

/// `DMA_MAPPING_ERROR` (`~(dma_addr_t)0`), a macro bindgen cannot see.
const DMA_MAPPING_ERROR: bindings::dma_addr_t = !0;

impl<P: ChunkSource> DmaTable<P> {
    /// Maps every chunk of `pages` on `dev`. An address outside `[0, limit]` (the GPU's window)
    /// is unmapped again and fails the whole table with `EFAULT`; a mapping failure is `ENOMEM`.
    /// On failure, what was mapped is unmapped.
    pub(crate) fn new(dev: Arc<DmaDevice>, pages: Arc<P>, limit: u64) -> Result<Self> {
        let (count, len) = (pages.chunk_count(), pages.chunk_len());
        let bytes = u64::try_from(len)?;
        let mut table = Self {
            dev,
            pages,
            len,
            addrs: KVVec::with_capacity(count, GFP_KERNEL)?,
        };
        for i in 0..count {
            let page = table.pages.chunk_page(i).ok_or(EINVAL)?;
            let raw = table.dev.raw();
            // SAFETY: `raw` is a bound device (the caller holds the GPU alive for the call);
            // `page` heads `len` contiguous bytes kept alive by `table.pages`.
            let addr = unsafe {
                bindings::dma_map_page_attrs(
                    raw,
                    page.as_ptr(),
                    0,
                    len,
                    bindings::dma_data_direction_DMA_BIDIRECTIONAL,
                    0,
                )
            };
            // What the C `dma_mapping_error` does: tell the DMA-API debugger the result was
            // checked, then check it.
            #[cfg(CONFIG_DMA_API_DEBUG)]
            // SAFETY: as above; `addr` is what the device's mapping returned.
            unsafe {
                bindings::debug_dma_mapping_error(raw, addr)
            };
            if addr == DMA_MAPPING_ERROR {
                return Err(ENOMEM);
            }
            // INVARIANT: from here the address is in the table and unmapped by `Drop`.
            table.addrs.push(addr, GFP_KERNEL).inspect_err(|_| {
                // SAFETY: the mapping was just made and is in no table.
                unsafe {
                    bindings::dma_unmap_page_attrs(
                        raw,
                        addr,
                        len,
                        bindings::dma_data_direction_DMA_BIDIRECTIONAL,
                        0,
                    )
                };
            })?;
            audit_add(bytes);
            table.dev.mapped.fetch_add(bytes, Relaxed);
            // INVARIANT: recorded for a simulated GPU's engine until `Drop` removes it.
            if let Some(sim) = &table.dev.sim {
                let record = SimMapping {
                    start: addr,
                    page: PagePtr(page),
                };
                let node = RBTreeNode::new(addr + (bytes - 1), record, GFP_KERNEL)?;
                sim.maps.lock().insert(node);
            }
            match addr.checked_add(bytes - 1) {
                Some(end) if end <= limit => {}
                _ => {
                    if crate::bind::ratelimit::printk_ok() {
                        pr_err!(
                            "DMA address {addr:#x}+{bytes:#x} is outside the GPU's window [0, {limit:#x}]\n"
                        );
                    }
                    return Err(EFAULT);
                }
            }
        }
        Ok(table)
    }

    /// The DMA address of every chunk.
    pub(crate) fn addrs(&self) -> &[u64] {
        &self.addrs
    }
}

fn audit_add(bytes: u64) {
    crate::audit::add(Class::DmaMappings, 1);
    crate::audit::add(Class::DmaBytes, bytes);
}

impl<P: ChunkSource> Drop for DmaTable<P> {
    fn drop(&mut self) {
        let raw = self.dev.raw();
        if let Some(sim) = &self.dev.sim {
            let mut maps = sim.maps.lock();
            for &addr in self.addrs.iter() {
                maps.remove(&(addr + (self.len as u64 - 1)));
            }
        }
        for &addr in self.addrs.iter() {
            // SAFETY: by the type invariant each address is a live mapping of `len` bytes on
            // this device, unmapped only here.
            unsafe {
                bindings::dma_unmap_page_attrs(
                    raw,
                    addr,
                    self.len,
                    bindings::dma_data_direction_DMA_BIDIRECTIONAL,
                    0,
                )
            };
            crate::audit::sub(Class::DmaMappings, 1);
            crate::audit::sub(Class::DmaBytes, self.len as u64);
            self.dev.mapped.fetch_sub(self.len as u64, Relaxed);
        }
    }
}
