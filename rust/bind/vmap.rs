// SPDX-License-Identifier: GPL-2.0

//! Contiguous kernel virtual mappings of a [`ChunkList`]'s pages: a mem's CPU kernel mapping.
//!
//! C header: [`include/linux/vmalloc.h`](srctree/include/linux/vmalloc.h)
//!
//! `vmalloc.h` is not in the 7.2 bindings, so the two exported functions used here are declared
//! below. `vm_map_ram` maps with `PAGE_KERNEL`, which is what uvm_mem's `vmap` asks for, without
//! needing the `pgprot_t` value (a macro that bindgen cannot see).
//!
//! The bytes behind a mapping are the list's: every access goes through [`VBytes`], which holds
//! the list's mutex (the same one [`crate::bind::pages::Bytes`] holds), so kernel-side accesses
//! never race; they are raw copies, never a Rust reference to the memory.

use core::ptr::NonNull;

use kernel::{
    ffi::{c_int, c_uint, c_void},
    page::PAGE_SIZE,
    prelude::*,
    sync::{lock::mutex::MutexGuard, Arc},
};

use super::pages::ChunkList;

extern "C" {
    // `pages` is `struct page **`, passed as opaque pointers.
    fn vm_map_ram(pages: *const *mut c_void, count: c_uint, node: c_int) -> *mut c_void;
    fn vm_unmap_ram(mem: *const c_void, count: c_uint);
}

/// A kernel virtual mapping of all the pages of a [`ChunkList`], in order.
///
/// # Invariants
///
/// `addr` is the start of a `vm_map_ram` mapping of `count` pages, all the pages of `pages` in
/// order, which this object keeps alive; the mapping is removed by `Drop`.
pub(crate) struct VMap<T> {
    addr: NonNull<u8>,
    count: c_uint,
    pages: Arc<ChunkList<T>>,
}

// SAFETY: the mapping may be used and removed from any thread; its bytes are reached only with
// the list's mutex held.
unsafe impl<T: Send + Sync> Send for VMap<T> {}
// SAFETY: as above; `&VMap` alone gives no access to the bytes.
unsafe impl<T: Send + Sync> Sync for VMap<T> {}

impl<T> VMap<T> {
    /// Maps every page of `pages`.
    pub(crate) fn new(pages: Arc<ChunkList<T>>) -> Result<Self> {
        let n = pages.page_count();
        let count = c_uint::try_from(n).map_err(|_| EOVERFLOW)?;
        if n == 0 {
            return Err(EINVAL);
        }
        // Chunks of one page: the list is the page array. Bigger chunks: a temporary array of
        // page pointers, as uvm_mem builds for chunks > PAGE_SIZE.
        let built;
        let ptrs: *const *mut c_void = match pages.order0_pages() {
            // CAST: `NonNull<page>` has the layout of `*mut page`.
            Some(list) => list.as_ptr().cast(),
            None => {
                let mut v = KVVec::with_capacity(n, GFP_KERNEL)?;
                for i in 0..n {
                    let page = pages.page_ptr(i).ok_or(EINVAL)?;
                    v.push(page.as_ptr().cast::<c_void>(), GFP_KERNEL)?;
                }
                built = v;
                built.as_ptr()
            }
        };
        // SAFETY: `ptrs` holds `count` valid pages, kept alive by `pages` (held below) for as
        // long as the mapping exists (and the array itself until the call returns); -1 is
        // NUMA_NO_NODE.
        let addr = unsafe { vm_map_ram(ptrs, count, -1) };
        let addr = NonNull::new(addr.cast::<u8>()).ok_or(ENOMEM)?;
        // INVARIANT: `addr` maps the `count` pages of `pages`.
        Ok(Self { addr, count, pages })
    }

    /// The pages it maps.
    pub(crate) fn pages(&self) -> &ChunkList<T> {
        &self.pages
    }

    /// Exclusive kernel-side access to the mapped bytes, until the guard goes.
    pub(crate) fn bytes(&self) -> VBytes<'_, T> {
        VBytes {
            map: self,
            _guard: self.pages.bytes_lock(),
        }
    }

    /// The mapping's first byte (for a caller that hands the address to the kernel: a
    /// dma-buf's `vmap`).
    pub(crate) fn addr(&self) -> *mut u8 {
        self.addr.as_ptr()
    }

    /// The mapping's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.count as usize * PAGE_SIZE
    }
}

/// A pointer to byte `offset` of `map` if `[offset, offset + len)` is inside it.
fn at<T>(map: &VMap<T>, offset: usize, len: usize) -> Result<*mut u8> {
    match offset.checked_add(len) {
        // SAFETY: `offset` is inside the mapping (checked), which is `map.len()` bytes long.
        Some(end) if end <= map.len() => Ok(unsafe { map.addr.as_ptr().add(offset) }),
        Some(_) => Err(EINVAL),
        None => Err(EOVERFLOW),
    }
}

/// The page pointers of a [`ChunkList`], built once, for timing the bare `vm_map_ram` against
/// a [`VMap`] (which builds its array each time).
///
/// # Invariants
///
/// `ptrs` are the pages of `pages`, in order, at least one, which `pages` keeps alive.
pub(crate) struct PageArray<T> {
    ptrs: KVVec<*mut c_void>,
    _pages: Arc<ChunkList<T>>,
}

impl<T> PageArray<T> {
    /// The page pointers of every page of `pages`.
    pub(crate) fn new(pages: &Arc<ChunkList<T>>) -> Result<Self> {
        let n = pages.page_count();
        if n == 0 || c_uint::try_from(n).is_err() {
            return Err(EINVAL);
        }
        let mut ptrs = KVVec::with_capacity(n, GFP_KERNEL)?;
        for i in 0..n {
            let page = pages.page_ptr(i).ok_or(EINVAL)?;
            ptrs.push(page.as_ptr().cast::<c_void>(), GFP_KERNEL)?;
        }
        // INVARIANT: every page of `pages`, in order, kept alive by the clone.
        Ok(Self {
            ptrs,
            _pages: pages.clone(),
        })
    }

    /// Maps the pages with `vm_map_ram` and unmaps them at once (`ENOMEM` if it cannot map).
    pub(crate) fn map_unmap(&self) -> Result {
        // CAST: checked to fit in `new`.
        let count = self.ptrs.len() as c_uint;
        // SAFETY: `ptrs` holds `count` valid pages, kept alive by `self._pages`; -1 is
        // NUMA_NO_NODE.
        let addr = unsafe { vm_map_ram(self.ptrs.as_ptr(), count, -1) };
        if addr.is_null() {
            return Err(ENOMEM);
        }
        // SAFETY: `addr` maps `count` pages, made by `vm_map_ram` just above, used by no one.
        unsafe { vm_unmap_ram(addr, count) };
        Ok(())
    }
}

// SAFETY: the pointers are to `struct page`s, which may be mapped from any thread.
unsafe impl<T: Send + Sync> Send for PageArray<T> {}
// SAFETY: `&PageArray` only maps and unmaps, which any thread may do.
unsafe impl<T: Send + Sync> Sync for PageArray<T> {}

impl<T> Drop for VMap<T> {
    fn drop(&mut self) {
        // SAFETY: by the type invariant, `addr` maps `count` pages made by `vm_map_ram`.
        unsafe { vm_unmap_ram(self.addr.as_ptr().cast(), self.count) };
    }
}

/// Exclusive kernel-side access to a [`VMap`]'s bytes (the list's mutex is held).
pub(crate) struct VBytes<'a, T> {
    map: &'a VMap<T>,
    _guard: MutexGuard<'a, ()>,
}

impl<T> VBytes<'_, T> {
    /// A pointer to byte `offset` if `[offset, offset + len)` is inside the mapping.
    fn at(&self, offset: usize, len: usize) -> Result<*mut u8> {
        at(self.map, offset, len)
    }

    /// Copies `src` into the mapping at `offset`.
    pub(crate) fn write(&mut self, offset: usize, src: &[u8]) -> Result {
        let dst = self.at(offset, src.len())?;
        // SAFETY: the range is inside the mapping (checked); `src` is a separate kernel buffer;
        // the list's mutex (held) keeps every other kernel-side access out.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies the bytes at `offset` into `dst`.
    pub(crate) fn read(&mut self, offset: usize, dst: &mut [u8]) -> Result {
        let src = self.at(offset, dst.len())?;
        // SAFETY: as in `write`, the other way.
        unsafe { core::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `len` bytes from `src_offset` to `dst_offset` inside the mapping; the ranges may
    /// overlap.
    pub(crate) fn copy_within(
        &mut self,
        dst_offset: usize,
        src_offset: usize,
        len: usize,
    ) -> Result {
        let dst = self.at(dst_offset, len)?;
        let src = self.at(src_offset, len)?;
        // SAFETY: both ranges are inside the mapping (checked); `copy` allows overlap; the
        // list's mutex (held) keeps every other kernel-side access out.
        unsafe { core::ptr::copy(src, dst, len) };
        Ok(())
    }
}
