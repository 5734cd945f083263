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
    pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{ordering::Relaxed, Atomic},
        Arc,
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
    pdev: ARef<pci::Device>,
    mapped: Atomic<u64>,
}

impl DmaDevice {
    /// The device being bound.
    pub(crate) fn new(pdev: &pci::Device<Core<'_>>) -> Self {
        let normal: &pci::Device = pdev;
        Self {
            pdev: normal.into(),
            mapped: Atomic::new(0),
        }
    }

    /// A device ruvm does not bind (a host GPU).
    pub(crate) fn from_pci(pdev: ARef<pci::Device>) -> Self {
        Self {
            pdev,
            mapped: Atomic::new(0),
        }
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
        let dev: &device::Device = self.pdev.as_ref();
        // CAST: `device::Device` is `#[repr(transparent)]` over `Opaque<bindings::device>`, so a
        // pointer to it is a pointer to the C `struct device`.
        core::ptr::from_ref(dev)
            .cast::<bindings::device>()
            .cast_mut()
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
