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

/// A GPU's device, for streaming DMA mappings (kept referenced while anything maps with it).
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

/// Every chunk of a [`ChunkList`] DMA-mapped (bidirectional) for one device, unmapped on drop.
///
/// The caller keeps the device bound while it makes and drops a table (the GPU layer's access
/// guard); a device is never released with a table of it alive.
///
/// # Invariants
///
/// `addrs[i]` is the result of a successful `dma_map_page_attrs` of chunk `i` of `pages` on
/// `dev`, `len` bytes, not yet unmapped; `pages` keeps the chunks alive while they are mapped.
pub(crate) struct DmaTable<T> {
    dev: Arc<DmaDevice>,
    pages: Arc<ChunkList<T>>,
    len: usize,
    addrs: KVVec<u64>,
}

/// `DMA_MAPPING_ERROR` (`~(dma_addr_t)0`), a macro bindgen cannot see.
const DMA_MAPPING_ERROR: bindings::dma_addr_t = !0;

impl<T> DmaTable<T> {
    /// Maps every chunk of `pages` on `dev`. An address outside `[0, limit]` (the GPU's window)
    /// is unmapped again and fails the whole table with `EFAULT`; a mapping failure is `ENOMEM`.
    /// On failure, what was mapped is unmapped.
    pub(crate) fn new(dev: Arc<DmaDevice>, pages: Arc<ChunkList<T>>, limit: u64) -> Result<Self> {
        let (count, len) = (pages.chunk_count(), pages.chunk_len());
        let bytes = u64::try_from(len)?;
        let mut table = Self {
            dev,
            pages,
            len,
            addrs: KVVec::with_capacity(count, GFP_KERNEL)?,
        };
        let raw = raw_device(&table.dev.dev);
        for i in 0..count {
            let page = table
                .pages
                .chunk(i)
                .and_then(|c| c.page_ptr(0))
                .ok_or(EINVAL)?;
            // SAFETY: `raw` is a bound device (the caller keeps it bound for the call); `page`
            // heads `len` contiguous bytes kept alive by `table.pages`.
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
                unsafe { unmap(raw, addr, len) };
            })?;
            match addr.checked_add(bytes - 1) {
                Some(end) if end <= limit => {}
                _ => {
                    if super::ratelimit::printk_ok() {
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

    /// The pages it maps.
    pub(crate) fn pages(&self) -> &Arc<ChunkList<T>> {
        &self.pages
    }

    /// Bytes per mapping (the chunk size).
    pub(crate) fn chunk_len(&self) -> usize {
        self.len
    }
}

/// Unmaps one bidirectional mapping.
///
/// # Safety
///
/// `addr` is a live mapping of `len` bytes on `dev`, made by `dma_map_page_attrs`, unmapped only
/// here.
unsafe fn unmap(dev: *mut bindings::device, addr: u64, len: usize) {
    // SAFETY: by this function's contract.
    unsafe {
        bindings::dma_unmap_page_attrs(
            dev,
            addr,
            len,
            bindings::dma_data_direction_DMA_BIDIRECTIONAL,
            0,
        )
    };
}

impl<T> Drop for DmaTable<T> {
    fn drop(&mut self) {
        let raw = raw_device(&self.dev.dev);
        for &addr in self.addrs.iter() {
            // SAFETY: by the type invariant each address is a live mapping of `len` bytes on
            // this device, unmapped only here.
            unsafe { unmap(raw, addr, self.len) };
        }
    }
}
