// SPDX-License-Identifier: GPL-2.0

//! Another exporter's dma-buf, held ([`DmaBuf`]), and attached and mapped for one of ruvm's
//! devices ([`Attachment`]): ruvm as an importer.
//!
//! C header: [`include/linux/dma-buf.h`](srctree/include/linux/dma-buf.h)
//!
//! An attachment is static (no `importer_ops`): the exporter keeps the buffer's pages where
//! they are while it is mapped (the dma-buf core pins them for a static importer). Only the
//! DMA addresses of the exporter's scatter table are read, never its page links (which
//! `CONFIG_DMABUF_DEBUG` scrambles, as importers must not use them). Mapping and unmapping
//! take the buffer's reservation lock (`_unlocked` calls): no lock of ruvm's is held around
//! them.

use core::ptr::NonNull;

use kernel::{bindings, page::PAGE_SIZE, prelude::*};

use super::dma::DmaDevice;

/// A reference on a dma-buf (its file's).
///
/// # Invariants
///
/// `self.0` is a live dma-buf on whose file this object holds one reference.
pub(crate) struct DmaBuf(NonNull<bindings::dma_buf>);

// SAFETY: a dma-buf reference may be used and dropped from any thread.
unsafe impl Send for DmaBuf {}
// SAFETY: `&DmaBuf` reads only fields fixed at export (size, reservation object).
unsafe impl Sync for DmaBuf {}

impl DmaBuf {
    /// Takes over a reference the caller owns.
    ///
    /// # Safety
    ///
    /// `buf` is a live dma-buf the caller holds a reference on (`dma_buf_get`), given up.
    pub(super) unsafe fn from_owned(buf: NonNull<bindings::dma_buf>) -> Self {
        // INVARIANT: the reference is handed over.
        Self(buf)
    }

    pub(super) fn as_ptr(&self) -> *mut bindings::dma_buf {
        self.0.as_ptr()
    }

    /// Its size in bytes.
    pub(crate) fn size(&self) -> usize {
        // SAFETY: by the type invariant the buffer is live; its size never changes.
        unsafe { (*self.as_ptr()).size }
    }

    /// Its reservation object, live as long as the buffer.
    pub(super) fn resv(&self) -> *mut bindings::dma_resv {
        // SAFETY: by the type invariant the buffer is live; `resv` is set at export.
        unsafe { (*self.as_ptr()).resv }
    }
}

impl Clone for DmaBuf {
    fn clone(&self) -> Self {
        // SAFETY: the buffer is live; one more reference on its file (`get_dma_buf`).
        unsafe { bindings::get_file((*self.as_ptr()).file) };
        // INVARIANT: the reference just taken.
        Self(self.0)
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: this object's reference, given back once.
        unsafe { bindings::dma_buf_put(self.as_ptr()) };
    }
}

/// A dma-buf attached to one device and mapped for it (bidirectional): the DMA address of each
/// of its pages, in order.
///
/// # Invariants
///
/// `attach` is an attachment of `buf` to a device, `sgt` its mapping (both undone by `Drop`
/// only); `addrs` holds the DMA address of every page of the buffer, read from `sgt`.
pub(crate) struct Attachment {
    buf: DmaBuf,
    attach: NonNull<bindings::dma_buf_attachment>,
    sgt: NonNull<bindings::sg_table>,
    addrs: KVVec<u64>,
}

// SAFETY: an attachment may be unmapped and detached from any thread (its calls take the
// buffer's reservation lock); the addresses are plain data.
unsafe impl Send for Attachment {}
// SAFETY: `&Attachment` only reads the addresses.
unsafe impl Sync for Attachment {}

const BIDIRECTIONAL: bindings::dma_data_direction = bindings::dma_data_direction_DMA_BIDIRECTIONAL;

impl Attachment {
    /// Attaches `buf` to `dev` and maps it. Every page must be page-aligned in the device's
    /// address space and at most `limit` (the GPU's window: `EFAULT`); a buffer whose size is
    /// not whole pages, or whose table does not cover it in page-aligned pieces, is `EINVAL`.
    /// The caller keeps the device bound meanwhile, and until the attachment is dropped.
    pub(crate) fn new(buf: &DmaBuf, dev: &DmaDevice, limit: u64) -> Result<Self> {
        let size = buf.size();
        if size == 0 || size % PAGE_SIZE != 0 {
            return Err(EINVAL);
        }
        let pages = size / PAGE_SIZE;
        let mut addrs = KVVec::with_capacity(pages, GFP_KERNEL_ACCOUNT)?;
        let buf = buf.clone();
        // SAFETY: the buffer is live (`buf`); the device is bound (the caller's guard) and
        // outlives the attachment.
        let attach = unsafe { bindings::dma_buf_attach(buf.as_ptr(), dev.raw()) };
        kernel::error::from_err_ptr(attach)?;
        let attach = NonNull::new(attach).ok_or(ENOMEM)?;
        // SAFETY: a live attachment of ours; the call takes the reservation lock itself.
        let sgt =
            unsafe { bindings::dma_buf_map_attachment_unlocked(attach.as_ptr(), BIDIRECTIONAL) };
        if let Err(e) = kernel::error::from_err_ptr(sgt) {
            // SAFETY: attached above, not mapped.
            unsafe { bindings::dma_buf_detach(buf.as_ptr(), attach.as_ptr()) };
            return Err(e);
        }
        let Some(sgt) = NonNull::new(sgt) else {
            // SAFETY: as above.
            unsafe { bindings::dma_buf_detach(buf.as_ptr(), attach.as_ptr()) };
            return Err(ENOMEM);
        };
        // INVARIANT: attached and mapped; from here `Drop` undoes both.
        let mut this = Self {
            buf,
            attach,
            sgt,
            addrs: KVVec::new(),
        };
        this.read_addrs(&mut addrs, pages, limit)?;
        this.addrs = addrs;
        Ok(this)
    }

    /// Reads the address of each of `pages` pages from the mapping into `out`.
    fn read_addrs(&self, out: &mut KVVec<u64>, pages: usize, limit: u64) -> Result {
        let page = PAGE_SIZE as u64;
        // SAFETY: the mapping is live while `self` is; `nents` entries are DMA-mapped.
        let (mut sg, n) = unsafe { ((*self.sgt.as_ptr()).sgl, (*self.sgt.as_ptr()).nents) };
        for _ in 0..n {
            if sg.is_null() || out.len() == pages {
                break;
            }
            // SAFETY: `sg` is an entry of the live table.
            let (addr, len) = unsafe { (bindings::sg_dma_address(sg), bindings::sg_dma_len(sg)) };
            let len = u64::from(len);
            if addr % page != 0 || len % page != 0 {
                return Err(EINVAL);
            }
            let mut at = 0;
            while at < len && out.len() < pages {
                let a = addr.checked_add(at).ok_or(EFAULT)?;
                match a.checked_add(page - 1) {
                    Some(end) if end <= limit => {}
                    _ => return Err(EFAULT),
                }
                out.push(a, GFP_KERNEL_ACCOUNT)?;
                at += page;
            }
            // SAFETY: as above; the next entry (chained tables followed).
            sg = unsafe { bindings::sg_next(sg) };
        }
        if out.len() != pages {
            return Err(EINVAL);
        }
        Ok(())
    }

    /// How many pages (one DMA address each).
    pub(crate) fn count(&self) -> usize {
        self.addrs.len()
    }

    /// The DMA address of page `i`.
    pub(crate) fn addr(&self, i: usize) -> Option<u64> {
        self.addrs.get(i).copied()
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        // SAFETY: by the type invariant `sgt` is the attachment's mapping and `attach` an
        // attachment of `buf`, each undone once, here (the calls take the reservation lock).
        unsafe {
            bindings::dma_buf_unmap_attachment_unlocked(
                self.attach.as_ptr(),
                self.sgt.as_ptr(),
                BIDIRECTIONAL,
            );
            bindings::dma_buf_detach(self.buf.as_ptr(), self.attach.as_ptr());
        }
    }
}
