// SPDX-License-Identifier: GPL-2.0

//! dma-buf glue (the 7.2 `kernel` crate has none): the buffers ruvm exports.
//!
//! C header: [`include/linux/dma-buf.h`](srctree/include/linux/dma-buf.h)
//!
//! - [`Buffer`]: what a dma-buf ruvm exports holds: an owner's token (which keeps the chunks
//!   and their accounting), the pages, the reservation object, the kernel mapping while one is
//!   asked for, and the mappings made for importing devices.
//! - [`BufOps`]: the `dma_buf_ops` of such buffers: map for an importing device (a scatter
//!   table of the pages, DMA-mapped for the importer's device, through its IOMMU), `mmap`
//!   (the pages' frames mapped at once, so nothing can pin them), `vmap`, CPU access begin/end
//!   (the importers' mappings synced), release. The table's owner is this module: each buffer
//!   holds a reference on it until its release (`dma_buf_export` takes it), so the module
//!   cannot unload while a buffer it exported lives.
//!
//! `map_dma_buf`, `vmap` and `mmap` run with the buffer's reservation lock held (or the mmap
//! lock): they allocate, but take no lock of ruvm's except the buffer's own leaf mutexes.

use core::ptr::{self, NonNull};

use kernel::{
    bindings,
    ffi::{c_int, c_uint, c_ulong},
    fs::{file::FileDescriptorReservation, File},
    new_mutex,
    page::PAGE_SIZE,
    prelude::*,
    sync::{aref::ARef, Arc, ArcBorrow, Mutex},
};

use super::{anon::Exported, attach::DmaBuf, pages::ChunkList, resv::Resv, vmap::VMap};

/// An importing device's mapping of a buffer: its scatter table, mapped for `dev`.
struct Mapped {
    dev: *mut bindings::device,
    sgt: *mut bindings::sg_table,
    dir: bindings::dma_data_direction,
}

/// What a dma-buf of ruvm's holds (its private data is an `Arc` of it).
///
/// `T` is the owner's token (dropped with the buffer: the chunks' accounting goes with it),
/// `P` the pages' tag.
#[pin_data]
pub(crate) struct Buffer<T, P> {
    /// Before `owner`: the pages go first, so the owner's last hold finds them unshared.
    pages: Arc<ChunkList<P>>,
    owner: T,
    resv: Arc<Resv>,
    /// The kernel mapping, while `vmap` asked for one (the dma-buf core counts its users).
    #[pin]
    vmap: Mutex<Option<VMap<P>>>,
    /// The importers' mappings now, synced around CPU access. A leaf lock.
    #[pin]
    maps: Mutex<KVec<Mapped>>,
}

// SAFETY: the raw pointers in `maps` are devices and tables the dma-buf core keeps alive while
// they are listed (an attachment's mapping is unmapped, and unlisted, before it goes); the rest
// is `Send`/`Sync` by its own types.
unsafe impl<T: Send, P: Send + Sync> Send for Buffer<T, P> {}
// SAFETY: as above; the lists are reached under their mutexes.
unsafe impl<T: Sync, P: Send + Sync> Sync for Buffer<T, P> {}

impl<T: Send + Sync, P: Send + Sync> Buffer<T, P> {
    /// A buffer of `pages` whose fences are kept in `resv`, holding `owner` until released.
    pub(crate) fn new(owner: T, pages: Arc<ChunkList<P>>, resv: Arc<Resv>) -> Result<Arc<Self>> {
        Arc::pin_init(
            try_pin_init!(Self {
                owner,
                pages,
                resv,
                vmap <- new_mutex!(None),
                maps <- new_mutex!(KVec::new()),
            }),
            GFP_KERNEL_ACCOUNT,
        )
    }

    /// The owner's token.
    pub(crate) fn owner(&self) -> &T {
        &self.owner
    }

    /// A scatter table of every page, DMA-mapped for `dev`.
    fn map(
        &self,
        dev: *mut bindings::device,
        dir: bindings::dma_data_direction,
    ) -> Result<*mut bindings::sg_table> {
        let n = self.pages.page_count();
        let count = c_uint::try_from(n).map_err(|_| EOVERFLOW)?;
        let len = c_ulong::try_from(self.pages.len()).map_err(|_| EOVERFLOW)?;
        // Transient, freed before the call returns (the table holds the pages).
        let mut ptrs = KVVec::with_capacity(n, GFP_KERNEL)?;
        for i in 0..n {
            ptrs.push(self.pages.page_ptr(i).ok_or(EINVAL)?.as_ptr(), GFP_KERNEL)?;
        }
        // The importer's limits on one segment, as `drm_prime_pages_to_sg` reads them.
        // SAFETY: `dev` is live for the call; `dma_parms` is null or the device's.
        let max_seg = unsafe {
            let parms = (*dev).dma_parms;
            let seg = if parms.is_null() {
                64 * 1024
            } else {
                (*parms).max_segment_size as usize
            };
            seg.min(bindings::dma_max_mapping_size(dev))
        };
        let max_seg = c_uint::try_from(max_seg)
            .unwrap_or(c_uint::MAX)
            .max(PAGE_SIZE as c_uint)
            & !(PAGE_SIZE as c_uint - 1);
        // SAFETY: all-zero is the state `sg_alloc_table*` expects of a new table.
        let zeroed: bindings::sg_table = unsafe { core::mem::zeroed() };
        // Kept while the importer has it mapped: charged to the importer's memory cgroup (its
        // syscall maps it).
        let table = KBox::new(zeroed, GFP_KERNEL_ACCOUNT)?;
        let sgt = KBox::into_raw(table);
        // SAFETY: `sgt` is a zeroed table of ours; `ptrs` holds `count` pages, live while the
        // buffer is (and so while the table is); segments are at most `c_uint::MAX` bytes.
        let r = unsafe {
            bindings::sg_alloc_table_from_pages_segment(
                sgt,
                ptrs.as_mut_ptr(),
                count,
                0,
                len,
                max_seg,
                bindings::GFP_KERNEL | (1 << bindings::___GFP_ACCOUNT_BIT),
            )
        };
        if r != 0 {
            // SAFETY: the table was not allocated; its box is ours.
            drop(unsafe { KBox::from_raw(sgt) });
            return Err(Error::from_errno(r));
        }
        // SAFETY: `dev` is the attachment's device, live while it is attached; `sgt` is a
        // filled table of ours.
        let r = unsafe { bindings::dma_map_sgtable(dev, sgt, dir, 0) };
        if r != 0 {
            // SAFETY: filled, not mapped: freed, then its box.
            unsafe { bindings::sg_free_table(sgt) };
            // SAFETY: as above.
            drop(unsafe { KBox::from_raw(sgt) });
            return Err(Error::from_errno(r));
        }
        let listed = self
            .maps
            .lock()
            .push(Mapped { dev, sgt, dir }, GFP_KERNEL_ACCOUNT);
        if let Err(e) = listed {
            // SAFETY: mapped above for `dev` with `dir`, in no list: undone, then freed.
            unsafe {
                bindings::dma_unmap_sgtable(dev, sgt, dir, 0);
                bindings::sg_free_table(sgt);
                drop(KBox::from_raw(sgt));
            }
            return Err(e.into());
        }
        Ok(sgt)
    }

    /// Undoes [`Buffer::map`] for table `sgt`.
    fn unmap(
        &self,
        dev: *mut bindings::device,
        sgt: *mut bindings::sg_table,
        dir: bindings::dma_data_direction,
    ) {
        {
            let mut maps = self.maps.lock();
            if let Some(i) = maps.iter().position(|m| m.sgt == sgt) {
                let _ = maps.remove(i);
            }
        }
        // SAFETY: `sgt` is a table `map` made and mapped for `dev` with `dir`, handed back once.
        unsafe {
            bindings::dma_unmap_sgtable(dev, sgt, dir, 0);
            bindings::sg_free_table(sgt);
            drop(KBox::from_raw(sgt));
        }
    }

    /// Syncs every importer's mapping for the CPU (`for_cpu`) or back for the devices.
    fn sync(&self, for_cpu: bool) {
        let maps = self.maps.lock();
        for m in maps.iter() {
            // SAFETY: a listed mapping is live (see `Send`); `orig_nents` entries as mapped.
            unsafe {
                let sgl = (*m.sgt).sgl;
                let n = (*m.sgt).orig_nents as c_int;
                if for_cpu {
                    bindings::__dma_sync_sg_for_cpu(m.dev, sgl, n, m.dir);
                } else {
                    bindings::__dma_sync_sg_for_device(m.dev, sgl, n, m.dir);
                }
            }
        }
    }
}

/// What a descriptor [`BufOps::get`] was given is.
pub(crate) enum Got<T, P> {
    /// A buffer of this table: its private data.
    Own(Arc<Buffer<T, P>>),
    /// Another exporter's buffer, held.
    Foreign(DmaBuf),
}

/// The `dma_buf_ops` of ruvm's buffers holding owner tokens `T` over pages tagged `P`; its
/// address tells them apart from any other exporter's.
pub(crate) struct BufOps<T, P>(bindings::dma_buf_ops, core::marker::PhantomData<(T, P)>);

// SAFETY: the table holds function pointers only, never written after it is made.
unsafe impl<T, P> Sync for BufOps<T, P> {}

/// `ERR_PTR(e)`.
fn err_ptr<U>(e: Error) -> *mut U {
    // CAST: an errno is small and negative; the pointer only carries it back to C.
    ptr::null_mut::<u8>()
        .wrapping_offset(e.to_errno() as isize)
        .cast()
}

impl<T: Send + Sync + 'static, P: Send + Sync + 'static> BufOps<T, P> {
    /// The table.
    pub(crate) const fn new() -> Self {
        // SAFETY: all-zero is a valid `dma_buf_ops` (every callback absent).
        let mut ops: bindings::dma_buf_ops = unsafe { core::mem::zeroed() };
        ops.map_dma_buf = Some(Self::map_dma_buf);
        ops.unmap_dma_buf = Some(Self::unmap_dma_buf);
        ops.release = Some(Self::release);
        ops.mmap = Some(Self::mmap);
        ops.vmap = Some(Self::vmap);
        ops.vunmap = Some(Self::vunmap);
        ops.begin_cpu_access = Some(Self::begin_cpu_access);
        ops.end_cpu_access = Some(Self::end_cpu_access);
        Self(ops, core::marker::PhantomData)
    }

    /// A new dma-buf of `buf` (read-write, its size the pages'), with a close-on-exec
    /// descriptor reserved for it.
    pub(crate) fn export(&'static self, buf: Arc<Buffer<T, P>>) -> Result<Exported> {
        let fd = FileDescriptorReservation::get_unused_fd_flags(bindings::O_CLOEXEC)?;
        let size = buf.pages.len();
        let resv = buf.resv.as_ptr();
        let raw = Arc::into_raw(buf);
        // SAFETY: all-zero is a valid `dma_buf_export_info`; every field used is set below.
        let mut info: bindings::dma_buf_export_info = unsafe { core::mem::zeroed() };
        info.exp_name = c"ruvm".as_char_ptr();
        info.owner = crate::THIS_MODULE.as_ptr();
        info.ops = &self.0;
        info.size = size;
        info.flags = bindings::O_RDWR as c_int;
        info.resv = resv;
        info.priv_ = raw.cast_mut().cast();
        // SAFETY: `info` is complete; on success the buffer takes over the reference `raw`
        // carries (its release gives it back) and one on this module; `resv` lives as long
        // as the buffer, which holds it.
        let dmabuf = unsafe { bindings::dma_buf_export(&info) };
        if let Err(e) = kernel::error::from_err_ptr(dmabuf) {
            // SAFETY: not exported: the reference is still ours.
            drop(unsafe { Arc::from_raw(raw) });
            return Err(e);
        }
        // SAFETY: a live buffer; its file holds the buffer's one reference.
        let file = unsafe { (*dmabuf).file };
        let file = NonNull::new(file.cast::<File>()).ok_or(ENOMEM)?;
        // SAFETY: the file's reference is handed over: dropped (fput), it releases the buffer.
        let file = unsafe { ARef::from_raw(file) };
        Ok(Exported::new(fd, file))
    }

    /// What descriptor `fd` of the calling process is: `EBADF` not open, `EINVAL` not a
    /// dma-buf.
    pub(crate) fn get(&'static self, fd: i32) -> Result<Got<T, P>> {
        // SAFETY: returns a new reference on the buffer of `fd`, or an error pointer.
        let dmabuf = unsafe { bindings::dma_buf_get(fd) };
        kernel::error::from_err_ptr(dmabuf)?;
        // SAFETY: the buffer is live while our reference is held; `ops` never changes.
        let ours = core::ptr::eq(unsafe { (*dmabuf).ops }, &self.0);
        let Some(held) = NonNull::new(dmabuf) else {
            return Err(EBADF);
        };
        // SAFETY: the reference `dma_buf_get` took, handed over.
        let held = unsafe { DmaBuf::from_owned(held) };
        if !ours {
            return Ok(Got::Foreign(held));
        }
        // SAFETY: a buffer of this table holds, in its private data, a reference on an
        // `Arc<Buffer>` that lasts until its release, which `held` holds off.
        let buf = unsafe { ArcBorrow::from_raw((*dmabuf).priv_.cast::<Buffer<T, P>>()) };
        Ok(Got::Own(buf.into()))
    }

    /// The buffer of a dma-buf of this table.
    ///
    /// # Safety
    ///
    /// `dmabuf` is a live buffer of this table, not released before the borrow ends.
    unsafe fn buffer<'a>(dmabuf: *mut bindings::dma_buf) -> ArcBorrow<'a, Buffer<T, P>> {
        // SAFETY: the private data is the reference `export` handed over (see above).
        unsafe { ArcBorrow::from_raw((*dmabuf).priv_.cast::<Buffer<T, P>>()) }
    }

    /// # Safety
    ///
    /// Called by the dma-buf core for a live attachment of a buffer of this table.
    unsafe extern "C" fn map_dma_buf(
        attach: *mut bindings::dma_buf_attachment,
        dir: bindings::dma_data_direction,
    ) -> *mut bindings::sg_table {
        // SAFETY: the attachment and its buffer are live for the call.
        let (buf, dev) = unsafe { (Self::buffer((*attach).dmabuf), (*attach).dev) };
        buf.map(dev, dir).unwrap_or_else(err_ptr)
    }

    /// # Safety
    ///
    /// Called by the dma-buf core with a table `map_dma_buf` returned for `attach`.
    unsafe extern "C" fn unmap_dma_buf(
        attach: *mut bindings::dma_buf_attachment,
        sgt: *mut bindings::sg_table,
        dir: bindings::dma_data_direction,
    ) {
        // SAFETY: as above.
        let (buf, dev) = unsafe { (Self::buffer((*attach).dmabuf), (*attach).dev) };
        buf.unmap(dev, sgt, dir);
    }

    /// # Safety
    ///
    /// Called once, as the buffer's file is released.
    unsafe extern "C" fn release(dmabuf: *mut bindings::dma_buf) {
        // SAFETY: the reference `export` handed over, given back once, here.
        drop(unsafe { Arc::from_raw((*dmabuf).priv_.cast::<Buffer<T, P>>()) });
    }

    /// Maps every page the VMA covers (the dma-buf core checked its range against the
    /// buffer's size) by frame number, each run of neighbouring frames at once: the VMA
    /// becomes `VM_PFNMAP | VM_IO | VM_DONTEXPAND | VM_DONTDUMP` (`remap_pfn_range`), so no
    /// `struct page` reference is taken through it, `get_user_pages` refuses it (no pin can
    /// outlive the buffer and see the chunks reused), and it never grows; with no fault
    /// handler its pages are never dropped (the kernel refuses `MADV_DONTNEED` and
    /// `MADV_FREE` on `VM_PFNMAP` with `EINVAL`). The VMA holds the buffer's file, which holds
    /// the pages.
    ///
    /// # Safety
    ///
    /// Called by the dma-buf core with the mmap lock held for writing, for a new VMA.
    unsafe extern "C" fn mmap(
        dmabuf: *mut bindings::dma_buf,
        vma: *mut bindings::vm_area_struct,
    ) -> c_int {
        // SAFETY: as above.
        let buf = unsafe { Self::buffer(dmabuf) };
        // SAFETY: the VMA is live and ours to fill for the call (the mmap lock is held).
        let (start, end, pgoff, prot, flags) = unsafe {
            let range = &(*vma).__bindgen_anon_1.__bindgen_anon_1;
            let flags = (*vma).__bindgen_anon_2.vm_flags;
            (
                range.vm_start,
                range.vm_end,
                (*vma).vm_pgoff,
                (*vma).vm_page_prot,
                flags,
            )
        };
        // A private (copy-on-write) mapping of frames cannot be made in pieces: shared only.
        if flags & bindings::VM_SHARED as kernel::ffi::c_ulong == 0 {
            return EINVAL.to_errno();
        }
        let page = PAGE_SIZE as c_ulong;
        // A page offset inside the buffer (the core checked it).
        let mut i = pgoff;
        let mut addr = start;
        while addr < end {
            let Some(first) = buf.pages.page_ptr(i).map(super::dma::page_pfn) else {
                return EINVAL.to_errno();
            };
            let mut run: c_ulong = 1;
            while addr + run * page < end
                && buf
                    .pages
                    .page_ptr(i + run as usize)
                    .map(super::dma::page_pfn)
                    == Some(first + run)
            {
                run += 1;
            }
            // SAFETY: `[addr, addr + run pages)` is inside the VMA and `first..` are the frames
            // of `run` pages of the buffer, live while the VMA (which holds its file) is; the
            // mmap lock is held for writing.
            let r = unsafe { bindings::remap_pfn_range(vma, addr, first, run * page, prot) };
            if r != 0 {
                return r;
            }
            addr += run * page;
            i += run as usize;
        }
        0
    }

    /// # Safety
    ///
    /// Called by the dma-buf core (its lock held; once until `vunmap`).
    unsafe extern "C" fn vmap(
        dmabuf: *mut bindings::dma_buf,
        map: *mut bindings::iosys_map,
    ) -> c_int {
        // SAFETY: as above.
        let buf = unsafe { Self::buffer(dmabuf) };
        let mut slot = buf.vmap.lock();
        if slot.is_none() {
            match VMap::new(buf.pages.clone()) {
                Ok(m) => *slot = Some(m),
                Err(e) => return e.to_errno(),
            }
        }
        let Some(m) = slot.as_ref() else {
            return ENOMEM.to_errno();
        };
        // SAFETY: `map` is the caller's to fill: a system-memory address.
        unsafe {
            (*map).__bindgen_anon_1.vaddr = m.addr().cast();
            (*map).is_iomem = false;
        }
        0
    }

    /// # Safety
    ///
    /// Called by the dma-buf core as its last kernel mapping's user goes.
    unsafe extern "C" fn vunmap(dmabuf: *mut bindings::dma_buf, _map: *mut bindings::iosys_map) {
        // SAFETY: as above.
        let buf = unsafe { Self::buffer(dmabuf) };
        let old = buf.vmap.lock().take();
        drop(old);
    }

    /// # Safety
    ///
    /// Called by the dma-buf core for a live buffer of this table.
    unsafe extern "C" fn begin_cpu_access(
        dmabuf: *mut bindings::dma_buf,
        _dir: bindings::dma_data_direction,
    ) -> c_int {
        // SAFETY: as above.
        unsafe { Self::buffer(dmabuf) }.sync(true);
        0
    }

    /// # Safety
    ///
    /// As for `begin_cpu_access`.
    unsafe extern "C" fn end_cpu_access(
        dmabuf: *mut bindings::dma_buf,
        _dir: bindings::dma_data_direction,
    ) -> c_int {
        // SAFETY: as above.
        unsafe { Self::buffer(dmabuf) }.sync(false);
        0
    }
}
