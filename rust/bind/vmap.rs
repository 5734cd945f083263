// SPDX-License-Identifier: GPL-2.0

//! Contiguous kernel virtual mappings of scattered pages: a mem's CPU kernel mapping.
//!
//! C header: [`include/linux/vmalloc.h`](srctree/include/linux/vmalloc.h)
//!
//! `vmalloc.h` is not in the 7.2 bindings, so the two exported functions used here are declared
//! below. `vm_map_ram` maps with `PAGE_KERNEL`, which is what uvm_mem's `vmap` asks for, without
//! needing the `pgprot_t` value (a macro that bindgen cannot see).
//!
//! The bytes behind a mapping may be read and written by user space at the same time (the same
//! pages can be `mmap`ed): every access here is a raw copy, never a Rust reference to the memory.

use core::ptr::NonNull;

use kernel::{
    bindings,
    ffi::{c_int, c_uint, c_void},
    page::PAGE_SIZE,
    prelude::*,
    sync::Arc,
};

extern "C" {
    // `pages` is `struct page **`, passed as opaque pointers.
    fn vm_map_ram(pages: *const *mut c_void, count: c_uint, node: c_int) -> *mut c_void;
    fn vm_unmap_ram(mem: *const c_void, count: c_uint);
}

/// Anything that owns a list of pages that a [`VMap`] can map.
pub(crate) trait PageSource: Send + Sync {
    /// The number of pages.
    fn page_count(&self) -> usize;
    /// The `i`-th page; valid for as long as `self` lives.
    fn page_ptr(&self, i: usize) -> Option<NonNull<bindings::page>>;
}

/// A kernel virtual mapping of all the pages of a [`PageSource`], in order.
///
/// # Invariants
///
/// `addr` is the start of a `vm_map_ram` mapping of `count` pages, all of them pages of
/// `pages`, which this object keeps alive; the mapping is removed by `Drop`.
pub(crate) struct VMap<P: PageSource> {
    addr: NonNull<u8>,
    count: c_uint,
    pages: Arc<P>,
}

// SAFETY: the mapping may be used and removed from any thread; `P` is `Send + Sync`.
unsafe impl<P: PageSource> Send for VMap<P> {}
// SAFETY: shared access only copies bytes in and out with raw copies.
unsafe impl<P: PageSource> Sync for VMap<P> {}

impl<P: PageSource> VMap<P> {
    /// Maps every page of `pages`.
    pub(crate) fn new(pages: Arc<P>) -> Result<Self> {
        let n = pages.page_count();
        let count = c_uint::try_from(n).map_err(|_| EOVERFLOW)?;
        if n == 0 {
            return Err(EINVAL);
        }
        // A temporary array of page pointers, as uvm_mem builds for chunks > PAGE_SIZE.
        let mut ptrs = KVVec::with_capacity(n, GFP_KERNEL)?;
        for i in 0..n {
            ptrs.push(
                pages.page_ptr(i).ok_or(EINVAL)?.as_ptr().cast::<c_void>(),
                GFP_KERNEL,
            )?;
        }
        // SAFETY: `ptrs` holds `count` valid pages, kept alive by `pages` (held below) for as
        // long as the mapping exists; -1 is NUMA_NO_NODE.
        let addr = unsafe { vm_map_ram(ptrs.as_ptr(), count, -1) };
        let addr = NonNull::new(addr.cast::<u8>()).ok_or(ENOMEM)?;
        // INVARIANT: `addr` maps the `count` pages of `pages`.
        Ok(Self { addr, count, pages })
    }

    /// The pages it maps.
    pub(crate) fn pages(&self) -> &P {
        &self.pages
    }

    /// Length of the mapping in bytes.
    pub(crate) fn len(&self) -> usize {
        self.pages.page_count() * PAGE_SIZE
    }

    /// Checks that `[offset, offset + len)` is inside the mapping.
    fn check(&self, offset: usize, len: usize) -> Result {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            Some(_) => Err(EINVAL),
            None => Err(EOVERFLOW),
        }
    }

    /// Copies `src` into the mapping at `offset`.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result {
        self.check(offset, src.len())?;
        // SAFETY: the range is inside the mapping (checked); `src` is a separate kernel buffer.
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr(), self.addr.as_ptr().add(offset), src.len())
        };
        Ok(())
    }

    /// Copies bytes at `offset` out of the mapping into `dst`.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result {
        self.check(offset, dst.len())?;
        // SAFETY: the range is inside the mapping (checked); `dst` is a separate kernel buffer.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.addr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    /// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`. The two may be the
    /// same mapping, and the ranges may overlap.
    pub(crate) fn copy(
        dst: &Self,
        dst_offset: usize,
        src: &Self,
        src_offset: usize,
        len: usize,
    ) -> Result {
        dst.check(dst_offset, len)?;
        src.check(src_offset, len)?;
        // SAFETY: both ranges are inside their mappings (checked); `copy` allows overlap.
        unsafe {
            core::ptr::copy(
                src.addr.as_ptr().add(src_offset),
                dst.addr.as_ptr().add(dst_offset),
                len,
            )
        };
        Ok(())
    }
}

impl<P: PageSource> Drop for VMap<P> {
    fn drop(&mut self) {
        // SAFETY: by the type invariant, `addr` maps `count` pages made by `vm_map_ram`.
        unsafe { vm_unmap_ram(self.addr.as_ptr().cast(), self.count) };
    }
}
