// SPDX-License-Identifier: GPL-2.0

//! What holds a mem's bytes: sysmem chunks from the page allocator, or vidmem chunks from its
//! GPU's PMM; and the allocation paths (uvm_mem's fallback to smaller chunks included).

use kernel::{
    page::PAGE_SIZE,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc,
    },
};

use crate::{
    audit::{Class, Counted},
    bind::{
        attach::DmaBuf,
        errno,
        pages::{ChunkFlags, ChunkList},
    },
    gpu::{dma::Pages, pmm::VidChunk, GpuDev},
};

use super::{
    policy::{self, Layout},
    policy_error,
    pool::{Pool, Taken},
    quota::Charge,
    AllocRequest,
};

/// What holds a mem's bytes.
pub(crate) enum Storage {
    /// Sysmem chunks, counted by order while any holder (a mapping, a table) has them.
    Sys(Arc<Pages>),
    Vid(VidPages),
    /// Another exporter's dma-buf (its pages are the exporter's, never seen: the mem is
    /// reached only through each GPU's attachment, by DMA address).
    Buf(DmaBuf),
    /// A sparse mem: its resident chunks are in its state ([`super::sparse`]).
    Sparse,
}

impl Storage {
    /// The GPU of a vidmem mem.
    pub(super) fn vidmem_gpu(&self) -> Option<u32> {
        match self {
            Storage::Sys(_) | Storage::Buf(_) | Storage::Sparse => None,
            Storage::Vid(v) => Some(v.gpu.id),
        }
    }

    /// The sysmem pages, or `EOPNOTSUPP` for vidmem (which the CPU cannot map: as in uvm_mem
    /// for GPUs whose memory is not CPU-coherent), for another exporter's buffer (whose
    /// pages an importer never sees) and for a sparse mem (whose chunks are not one list).
    pub(super) fn sys(&self) -> Result<&Arc<Pages>> {
        match self {
            Storage::Sys(p) => Ok(p),
            Storage::Vid(_) | Storage::Buf(_) | Storage::Sparse => Err(errno::eopnotsupp()),
        }
    }
}

/// The chunks of a vidmem mem, in order, from its GPU's PMM (or its pool, which gets them
/// back when this drops).
pub(crate) struct VidPages {
    /// The GPU whose memory it is (as it was bound when the mem was made).
    gpu: Arc<GpuDev>,
    chunks: KVVec<VidChunk>,
    pool: Option<Arc<Pool>>,
    /// From a pool: the quota charge of the chunks, which goes back with them.
    charge: Option<Charge>,
    /// From a pool: how many of the chunks came from its cache (the first ones). Whether the
    /// mem was made: else, dropped, the pool's allocation is undone, or (without a pool) the
    /// chunks' root storage is not kept for reuse.
    reused: usize,
    made: Atomic<bool>,
    /// Something may have written the chunks: a copy engine copied into them, or a GPU mapped
    /// them in a VA space. Else, without a pool, they go back to the PMM known to be zero.
    written: Atomic<bool>,
    _audit: Counted,
}

impl Drop for VidPages {
    fn drop(&mut self) {
        let made = self.made.load(Relaxed);
        // Every writer held the mem, so its writes came before this drop.
        let unwritten = !self.written.load(Relaxed);
        if let Some(pool) = self.pool.take() {
            let undo = (!made).then_some(self.reused);
            let charge = self.charge.take().unwrap_or_else(|| pool.quota().nothing());
            pool.give_back_vid(
                core::mem::replace(&mut self.chunks, KVVec::new()),
                undo,
                charge,
            );
        } else {
            for c in self.chunks.iter_mut() {
                if made {
                    c.keep_storage();
                }
                if unwritten {
                    c.unwritten();
                }
            }
        }
    }
}

impl VidPages {
    /// The mem these chunks are for was made: from now on they go back to their pool as a
    /// freed mem's, or leave their root storage to be kept for reuse.
    pub(super) fn made(&self) {
        self.made.store(true, Relaxed);
    }

    /// Something is about to be given a way to write the chunks (a copy into them, a GPU VA
    /// mapping): said before it can.
    pub(super) fn may_be_written(&self) {
        self.written.store(true, Relaxed);
    }

    /// How many chunks.
    pub(super) fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// `ENODEV` unless `gpu` is this mem's GPU, still bound (the same binding: a GPU that was
    /// unbound took its memory with it, even if it is back); `EINVAL` for another GPU (peer
    /// access is not supported).
    pub(super) fn check_gpu(&self, gpu: &GpuDev) -> Result {
        if self.gpu.id != gpu.id {
            return Err(EINVAL);
        }
        if !core::ptr::eq(&*self.gpu, gpu) {
            return Err(ENODEV);
        }
        Ok(())
    }

    /// The vidmem address of byte `offset` (of chunks of `chunk` bytes).
    pub(super) fn phys(&self, offset: usize, chunk: usize) -> Result<u64> {
        let c = self.chunks.get(offset / chunk).ok_or(EINVAL)?;
        Ok(c.phys() + (offset % chunk) as u64)
    }
}

/// `ERESTARTSYS` if a signal is pending: asked before each chunk of a large allocation, which
/// a signal stops (the syscall restarts, or fails with `EINTR`) with nothing left behind.
pub(super) fn stop_on_signal() -> Result {
    if kernel::current!().signal_pending() {
        Err(ERESTARTSYS)
    } else {
        Ok(())
    }
}

/// [`stop_on_signal`], and `ENODEV` once `gpu`'s removal has begun: asked before each chunk of
/// a vidmem allocation, which holds the GPU's access guard (a removal waits for it) and gives it
/// up at once rather than after every chunk.
fn stop_vid(gpu: &GpuDev) -> Result {
    stop_on_signal()?;
    if gpu.going() {
        return Err(ENODEV);
    }
    Ok(())
}

/// Allocates the storage `req` asks for, shaped by `layout` (which a sysmem fallback may
/// shrink: the layout it settled on is returned).
pub(super) fn alloc(req: &AllocRequest, layout: Layout) -> Result<(Layout, Storage)> {
    match &req.gpu {
        None => {
            let (layout, pages) = alloc_chunks(req, layout)?;
            Ok((layout, Storage::Sys(pages)))
        }
        Some(gpu) => Ok((layout, Storage::Vid(alloc_vidmem(gpu, &layout)?))),
    }
}

/// Allocates every chunk of a vidmem mem from `gpu`'s PMM, each with storage. `ENOMEM` when
/// the GPU has no vidmem or not enough is free, `ENODEV` once it is gone. On failure the chunks
/// allocated so far go back (dropped with the vector).
fn alloc_vidmem(gpu: &Arc<GpuDev>, layout: &Layout) -> Result<VidPages> {
    let count = usize::try_from(layout.chunk_count)?;
    let mut chunks = KVVec::with_capacity(count, GFP_KERNEL_ACCOUNT)?;
    // Held across the allocation: the GPU cannot be removed meanwhile.
    let access = gpu.access()?;
    let pmm = access.pmm().map_err(|_| ENOMEM)?;
    for _ in 0..count {
        stop_vid(gpu)?;
        chunks.push(pmm.alloc(layout.chunk_size, true)?, GFP_KERNEL)?;
    }
    drop(access);
    let n = chunks.len() as u64;
    Ok(VidPages {
        gpu: gpu.clone(),
        chunks,
        pool: None,
        charge: None,
        reused: 0,
        made: Atomic::new(false),
        written: Atomic::new(false),
        _audit: Counted::new(Class::VidmemChunks, n),
    })
}

/// Takes every chunk of a vidmem mem of `layout` from `pool` (of the mem's GPU, `gpu`).
pub(super) fn from_vid_pool(
    pool: &Arc<Pool>,
    gpu: &Arc<GpuDev>,
    layout: &Layout,
) -> Result<VidPages> {
    let count = usize::try_from(layout.chunk_count)?;
    let (chunks, reused, charge) = pool.take_vid(count, || stop_vid(gpu))?;
    let n = chunks.len() as u64;
    Ok(VidPages {
        gpu: gpu.clone(),
        chunks,
        pool: Some(pool.clone()),
        charge: Some(charge),
        reused,
        made: Atomic::new(false),
        written: Atomic::new(false),
        _audit: Counted::new(Class::VidmemChunks, n),
    })
}

/// Takes the chunks of `layout` from `pool` (sysmem), zeroing the reused ones (the file's own
/// earlier bytes) when `req` asks for zeroed memory; new ones are always allocated zeroed.
pub(super) fn from_pool(pool: &Pool, req: &AllocRequest, layout: &Layout) -> Result<Taken> {
    let count = usize::try_from(layout.chunk_count)?;
    let taken = pool.take(count, stop_on_signal)?;
    if req.zero && taken.reused > 0 {
        let len = taken.reused * taken.pages.chunk_len();
        let zeroed = taken.pages.bytes().zero(0, len);
        if let Err(e) = zeroed {
            let Taken {
                pages,
                tables,
                range,
                reused,
                charge,
            } = taken;
            pool.give_back(pages, tables, (range, Some(reused)), charge);
            return Err(e);
        }
    }
    Ok(taken)
}

/// Allocates the chunks for `layout`, halving the chunk size on `ENOMEM` when the request
/// allows a fallback. Returns the layout it settled on.
fn alloc_chunks(req: &AllocRequest, mut layout: Layout) -> Result<(Layout, Arc<Pages>)> {
    let page = PAGE_SIZE as u64;
    loop {
        let fallback_left = req.fallback && layout.chunk_size > page;
        // Every fresh chunk is zeroed, asked or not: a page the allocator hands out may hold
        // another file's bytes, or the kernel's (uvm_mem zeroes what it exposes to user space).
        match try_alloc_chunks(&layout, true, fallback_left) {
            Err(e) if e == ENOMEM && fallback_left => {
                layout = policy::layout_with_chunk(req.size, layout.chunk_size / 2)
                    .map_err(policy_error)?;
            }
            r => return r.map(|p| (layout, p)),
        }
    }
}

/// One attempt at allocating every chunk of `layout`. On failure the chunks allocated so far are
/// freed.
fn try_alloc_chunks(layout: &Layout, zero: bool, fail_fast: bool) -> Result<Arc<Pages>> {
    let count = usize::try_from(layout.chunk_count)?;
    let order = policy::chunk_order(layout.chunk_size, PAGE_SIZE as u64);
    sys_pages(order, count, ChunkFlags { zero, fail_fast })
}

/// A sysmem chunk list of `count` chunks of order `order`, counted by the audit. A large
/// allocation is interruptible: a signal stops it and the syscall restarts (or fails with
/// `EINTR`), with nothing left behind.
pub(super) fn sys_pages(order: u32, count: usize, flags: ChunkFlags) -> Result<Arc<Pages>> {
    let audit = Counted::new(Class::SysmemChunks(order), count as u64);
    ChunkList::alloc(order, count, flags, audit, stop_on_signal)
}
