// SPDX-License-Identifier: GPL-2.0

//! DMA for the GPUs: the mask set at bind, and streaming mappings of a [`ChunkList`]'s chunks.
//!
//! C header: [`include/linux/dma-mapping.h`](srctree/include/linux/dma-mapping.h)
//!
//! 7.2 has no streaming single-page DMA abstraction, so [`DmaTable`] calls
//! `dma_map_page_attrs`/`dma_unmap_page_attrs` itself, and does what the inline C
//! `dma_mapping_error` does (tell the DMA-API debugger, compare with `DMA_MAPPING_ERROR`).
//! (`kernel::scatterlist::SGTable` maps a whole table at once, and the IOMMU may then merge
//! chunks into one range; ruvm's ABI reports one address per chunk, so each chunk is mapped
//! on its own.)

use core::ptr::NonNull;

use kernel::{
    bindings, device,
    device::Core,
    dma::{Device as _, DmaMask},
    faux, pci,
    prelude::*,
    sync::{aref::ARef, Arc},
};

use super::pages::ChunkList;

/// Sets the device's streaming and coherent DMA masks to `BITS` bits. For `probe` only.
pub(crate) fn set_mask<const BITS: u32>(pdev: &pci::Device<Core<'_>>) -> Result {
    // SAFETY: called from `probe`, before the device has any DMA mapping or allocation, so
    // nothing uses the mask concurrently.
    unsafe { pdev.dma_set_mask_and_coherent(DmaMask::new::<BITS>()) }
}

/// The PCI device at `domain`/`bus`/`devfn`, referenced, if there is one (for host GPUs, which
/// ruvm does not bind).
pub(crate) fn find_pci(domain: u16, bus: u8, devfn: u8) -> Option<ARef<pci::Device>> {
    // SAFETY: looks the device up and takes a reference on it (or returns NULL).
    let raw =
        unsafe { bindings::pci_get_domain_bus_and_slot(domain.into(), bus.into(), devfn.into()) };
    let raw = NonNull::new(raw)?;
    // SAFETY: `raw` is a valid `struct pci_dev` whose reference we now own, given to the `ARef`;
    // `pci::Device` is `#[repr(transparent)]` over `Opaque<bindings::pci_dev>`.
    Some(unsafe { ARef::from_raw(raw.cast::<pci::Device>()) })
}

/// Whether `pdev` is in an IOMMU group (it is not when no IOMMU translates for it).
pub(crate) fn has_iommu_group(pdev: &pci::Device) -> bool {
    let dev: &device::Device = pdev.as_ref();
    // SAFETY: `dev` is a valid device; `iommu_group_get` returns its group referenced, or NULL.
    let group = unsafe { bindings::iommu_group_get(raw_device(dev)) };
    if group.is_null() {
        return false;
    }
    // SAFETY: `group` was referenced by `iommu_group_get` just above; this drops that reference.
    unsafe { bindings::iommu_group_put(group) };
    true
}

/// A GPU's device, for streaming DMA mappings (kept referenced while anything maps with it).
#[derive(Clone)]
pub(crate) struct DmaDevice {
    dev: ARef<device::Device>,
}

impl DmaDevice {
    /// The device being bound.
    pub(crate) fn new(pdev: &pci::Device<Core<'_>>) -> Self {
        let normal: &pci::Device = pdev;
        let dev: &device::Device = normal.as_ref();
        Self { dev: dev.into() }
    }

    /// A device ruvm does not bind (a host GPU).
    pub(crate) fn from_pci(pdev: ARef<pci::Device>) -> Self {
        let dev: &device::Device = pdev.as_ref();
        Self { dev: dev.into() }
    }

    /// A simulated GPU's faux device, given a DMA mask of `bits` bits (faux devices have none:
    /// the mask lives in the device's `coherent_dma_mask`, as platform code does it).
    pub(crate) fn faux(faux: &faux::Registration, bits: u32) -> Result<Self> {
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
        Ok(Self { dev: dev.into() })
    }

    /// The C `struct device`, for the binding layer's calls.
    pub(super) fn raw(&self) -> *mut bindings::device {
        raw_device(&self.dev)
    }

    /// The device's streaming DMA mask, if it has one.
    pub(crate) fn dma_mask(&self) -> Option<u64> {
        let raw = raw_device(&self.dev);
        // SAFETY: the device is referenced by `self`; `dma_mask` points at the device's mask (in
        // the device itself) or is NULL, and is set by its driver before it does DMA.
        unsafe {
            let mask = (*raw).dma_mask;
            (!mask.is_null()).then(|| *mask)
        }
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

/// The frame number of a page.
#[cfg(CONFIG_X86_64)]
pub(super) fn page_pfn(page: NonNull<bindings::page>) -> kernel::ffi::c_ulong {
    // CAST: a frame number fits the kernel's `unsigned long` (it is one).
    (page_phys(page) >> bindings::PAGE_SHIFT) as kernel::ffi::c_ulong
}

/// The physical address of a page.
///
/// `page_to_phys` is a macro; on x86-64 the page array is virtually contiguous
/// (`SPARSEMEM_VMEMMAP`, always on there) from `vmemmap_base`, so a page's frame number is its
/// index in that array, which is what the macro computes.
#[cfg(CONFIG_X86_64)]
fn page_phys(page: NonNull<bindings::page>) -> u64 {
    // SAFETY: `vmemmap_base` is set once at boot, before any module loads, and never written
    // again.
    let base: usize = unsafe { bindings::vmemmap_base };
    let index = (page.as_ptr() as usize - base) / core::mem::size_of::<bindings::page>();
    (index as u64) << bindings::PAGE_SHIFT
}

/// How a table's chunks are mapped.
enum Mapping {
    /// One IOVA range for the whole table, each chunk linked into it at its offset (the
    /// device is behind an IOMMU): chunk `i` is at `state.addr + i * len`. `linked` bytes from
    /// the start are linked.
    Iova {
        state: bindings::dma_iova_state,
        linked: usize,
    },
    /// One `dma_map_page_attrs` per chunk (a device without an IOMMU, or one whose IOVA space
    /// cannot hold the range in one piece).
    Pages(KVVec<u64>),
}

/// Every chunk of a [`ChunkList`] DMA-mapped (bidirectional) for one device, unmapped on drop.
///
/// Behind an IOMMU the whole table is one IOVA range: one allocation of address space, the
/// chunks linked into it (chunks that are neighbours in memory as one run), one IOTLB sync,
/// and no per-chunk address to keep. Otherwise each chunk is mapped on its own and its address
/// kept. Either way each chunk has one DMA address
/// ([`Self::addr`]), which is what the ABI reports.
///
/// The caller keeps the device bound while it makes and drops a table (the GPU layer's access
/// guard); a device is never released with a table of it alive.
///
/// # Invariants
///
/// `Mapping::Iova`: `state` is an IOVA range of `count * len` bytes allocated on `dev` by
/// `dma_iova_try_alloc`, of which the first `linked` bytes are linked to the chunks of `pages`
/// in order. `Mapping::Pages`: entry `i` is the result of a successful `dma_map_page_attrs` of
/// chunk `i` of `pages` on `dev`, `len` bytes, not yet unmapped. `pages` keeps the chunks alive
/// while they are mapped.
pub(crate) struct DmaTable<T> {
    dev: Arc<DmaDevice>,
    pages: Arc<ChunkList<T>>,
    len: usize,
    map: Mapping,
}

/// `DMA_MAPPING_ERROR` (`~(dma_addr_t)0`), a macro bindgen cannot see.
const DMA_MAPPING_ERROR: bindings::dma_addr_t = !0;

const BIDIRECTIONAL: bindings::dma_data_direction = bindings::dma_data_direction_DMA_BIDIRECTIONAL;

impl<T> DmaTable<T> {
    /// Maps every chunk of `pages` on `dev`. An address outside `[0, limit]` (the GPU's window)
    /// fails the whole table with `EFAULT`; a mapping failure is `ENOMEM`. On failure, what was
    /// mapped is unmapped.
    pub(crate) fn new(dev: Arc<DmaDevice>, pages: Arc<ChunkList<T>>, limit: u64) -> Result<Self> {
        let (count, len) = (pages.chunk_count(), pages.chunk_len());
        let total = count.checked_mul(len).ok_or(EOVERFLOW)?;
        if count == 0 {
            return Err(EINVAL);
        }
        let raw = raw_device(&dev.dev);
        #[cfg(CONFIG_X86_64)]
        {
            let mut state = bindings::dma_iova_state::default();
            // SAFETY: `raw` is a bound device (the caller keeps it bound for the call); `state`
            // is ours. The phys argument only sets the offset inside the first IOMMU page (0:
            // chunks are page-aligned).
            if unsafe { bindings::dma_iova_try_alloc(raw, &mut state, 0, total) } {
                // INVARIANT: an IOVA range of `total` bytes, nothing linked yet.
                let mut table = Self {
                    dev,
                    pages,
                    len,
                    map: Mapping::Iova { state, linked: 0 },
                };
                table.link_all(raw, count, limit)?;
                return Ok(table);
            }
        }
        let mut table = Self {
            dev,
            pages,
            len,
            map: Mapping::Pages(KVVec::with_capacity(count, GFP_KERNEL_ACCOUNT)?),
        };
        table.map_each(raw, count, limit)?;
        Ok(table)
    }

    /// Links every chunk into the table's IOVA range, then syncs the IOTLB once.
    #[cfg(CONFIG_X86_64)]
    fn link_all(&mut self, raw: *mut bindings::device, count: usize, limit: u64) -> Result {
        let len = self.len;
        let Mapping::Iova { state, linked } = &mut self.map else {
            return Err(EINVAL);
        };
        let end = state
            .addr
            .checked_add((count * len) as u64 - 1)
            .ok_or(EFAULT)?;
        if end > limit {
            return Err(window_error(state.addr, end, limit));
        }
        let mut i = 0;
        while i < count {
            // Chunks that follow each other in memory are linked as one run.
            let phys = page_phys(self.pages.chunk_page(i).ok_or(EINVAL)?);
            let mut run = 1;
            while i + run < count
                && self
                    .pages
                    .chunk_page(i + run)
                    .is_some_and(|p| page_phys(p) == phys + (run * len) as u64)
            {
                run += 1;
            }
            // SAFETY: the range is ours, `[i * len, (i + run) * len)` is inside it and not
            // linked yet; the run's bytes are contiguous (checked above) and kept alive by
            // `self.pages`.
            let r = unsafe {
                bindings::dma_iova_link(raw, state, phys, i * len, run * len, BIDIRECTIONAL, 0)
            };
            if r != 0 {
                return Err(ENOMEM);
            }
            // INVARIANT: `run` more chunks linked, in order.
            *linked += run * len;
            i += run;
        }
        // SAFETY: the whole range is linked.
        let r = unsafe { bindings::dma_iova_sync(raw, state, 0, *linked) };
        kernel::error::to_result(r).map_err(|_| ENOMEM)
    }

    /// Maps every chunk on its own.
    fn map_each(&mut self, raw: *mut bindings::device, count: usize, limit: u64) -> Result {
        let len = self.len;
        let bytes = len as u64;
        let Mapping::Pages(addrs) = &mut self.map else {
            return Err(EINVAL);
        };
        for i in 0..count {
            let page = self.pages.chunk_page(i).ok_or(EINVAL)?;
            // SAFETY: `raw` is a bound device (the caller keeps it bound for the call); `page`
            // heads `len` contiguous bytes kept alive by `self.pages`.
            let addr = unsafe {
                bindings::dma_map_page_attrs(raw, page.as_ptr(), 0, len, BIDIRECTIONAL, 0)
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
            addrs.push(addr, GFP_KERNEL_ACCOUNT).inspect_err(|_| {
                // SAFETY: the mapping was just made and is in no table.
                unsafe { unmap(raw, addr, len) };
            })?;
            match addr.checked_add(bytes - 1) {
                Some(end) if end <= limit => {}
                _ => return Err(window_error(addr, addr.saturating_add(bytes - 1), limit)),
            }
        }
        Ok(())
    }

    /// How many chunks (each one DMA address).
    pub(crate) fn count(&self) -> usize {
        self.pages.chunk_count()
    }

    /// The DMA address of chunk `i`.
    pub(crate) fn addr(&self, i: usize) -> Option<u64> {
        match &self.map {
            Mapping::Iova { state, .. } => {
                (i < self.count()).then(|| state.addr + (i * self.len) as u64)
            }
            Mapping::Pages(addrs) => addrs.get(i).copied(),
        }
    }

    /// The DMA address of every chunk, in order.
    pub(crate) fn addrs(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.count()).filter_map(|i| self.addr(i))
    }

    /// The pages it maps.
    pub(crate) fn pages(&self) -> &Arc<ChunkList<T>> {
        &self.pages
    }

    /// Bytes per mapping (the chunk size).
    pub(crate) fn chunk_len(&self) -> usize {
        self.len
    }
}

/// Reports a DMA range outside a GPU's window; `EFAULT`.
fn window_error(addr: u64, end: u64, limit: u64) -> Error {
    if super::ratelimit::printk_ok() {
        pr_err!("DMA range {addr:#x}..={end:#x} is outside the GPU's window [0, {limit:#x}]\n");
    }
    EFAULT
}

/// Unmaps one bidirectional mapping.
///
/// # Safety
///
/// `addr` is a live mapping of `len` bytes on `dev`, made by `dma_map_page_attrs`, unmapped only
/// here.
unsafe fn unmap(dev: *mut bindings::device, addr: u64, len: usize) {
    // SAFETY: by this function's contract.
    unsafe { bindings::dma_unmap_page_attrs(dev, addr, len, BIDIRECTIONAL, 0) };
}

impl<T> Drop for DmaTable<T> {
    fn drop(&mut self) {
        let raw = raw_device(&self.dev.dev);
        match &mut self.map {
            Mapping::Iova { state, linked } => {
                // SAFETY: by the type invariant the range is ours with `linked` bytes linked;
                // this unlinks them, syncs the IOTLB once and frees the range.
                unsafe { bindings::dma_iova_destroy(raw, state, *linked, BIDIRECTIONAL, 0) };
            }
            Mapping::Pages(addrs) => {
                for &addr in addrs.iter() {
                    // SAFETY: by the type invariant each address is a live mapping of `len`
                    // bytes on this device, unmapped only here.
                    unsafe { unmap(raw, addr, self.len) };
                }
            }
        }
    }
}
