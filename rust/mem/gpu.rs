// SPDX-License-Identifier: GPL-2.0

//! A mem as GPUs see it: its per-GPU DMA address tables (uvm_mem's `map_gpu_phys`), the
//! addresses a GPU reaches it at, and copies by a GPU's copy engine.

use kernel::{prelude::*, sync::Arc};

use crate::{
    gpu::{dma::GpuTable, GpuAccess, GpuDev},
    uapi,
};

use super::{storage::Storage, storage::VidPages, Mem, MemCore};

/// How a GPU's engine reaches one mem: through its DMA table, or in its own memory.
enum EngineView<'a> {
    Table(Arc<GpuTable>),
    Vid(&'a VidPages),
}

impl EngineView<'_> {
    /// The DMA address at which the engine (of the GPU `access` guards) reaches byte `offset`
    /// (chunks of `chunk` bytes).
    fn addr(&self, access: &GpuAccess<'_>, offset: usize, chunk: usize) -> Result<u64> {
        match self {
            EngineView::Table(t) => t.addr(offset),
            EngineView::Vid(v) => access.pmm()?.engine_addr(v.phys(offset, chunk)?),
        }
    }
}

impl MemCore {
    /// Takes the DMA table for GPU `id` out of the mem, if it has one.
    pub(super) fn take_gpu(&self, id: u32) -> Option<Arc<GpuTable>> {
        let mut st = self.state.lock();
        let at = st.gpus.iter().position(|(g, _)| *g == id)?;
        st.gpus.remove(at).ok().map(|(_, t)| t)
    }
}

impl Mem {
    /// Makes (if it has none yet) the mem's DMA address table for `gpu`. Idempotent. For
    /// vidmem: nothing to do on its own GPU, `EINVAL` on another.
    pub(crate) fn map_gpu(&self, gpu: &GpuDev) -> Result {
        // Held across the mapping: the GPU cannot be removed meanwhile.
        let access = gpu.access()?;
        let pages = match &self.storage {
            Storage::Sys(p) => p,
            Storage::Vid(v) => return v.check_gpu(gpu),
        };
        let mut st = self.state.lock();
        st.mappable()?;
        if st.gpus.iter().any(|(id, _)| *id == gpu.id) {
            return Ok(());
        }
        let table = Arc::new(access.map(pages.clone())?, GFP_KERNEL)?;
        st.gpus.push((gpu.id, table), GFP_KERNEL)?;
        Ok(())
    }

    /// Drops the mem's DMA address table for GPU `id`, unmapping it. Idempotent.
    pub(crate) fn unmap_gpu(&self, id: u32) {
        // Dropped (unmapped) after the lock is released.
        let _old = self.take_gpu(id);
    }

    /// The mem's DMA table for GPU `id`, or `ENXIO`.
    fn gpu_table(&self, id: u32) -> Result<Arc<GpuTable>> {
        let st = self.state.lock();
        st.gpus
            .iter()
            .find(|(g, _)| *g == id)
            .map(|(_, t)| t.clone())
            .ok_or(ENXIO)
    }

    /// How `gpu`'s engine reaches the mem: its DMA table for the GPU (`ENXIO` without one), or,
    /// for vidmem, the GPU's own memory (see [`VidPages::check_gpu`]).
    fn engine_view(&self, gpu: &GpuDev) -> Result<EngineView<'_>> {
        match &self.storage {
            Storage::Sys(_) => Ok(EngineView::Table(self.gpu_table(gpu.id)?)),
            Storage::Vid(v) => v.check_gpu(gpu).map(|()| EngineView::Vid(v)),
        }
    }

    /// Copies `len` bytes from `src` to `dst` with `gpu`'s copy engine, addressing both only
    /// through their DMA tables for that GPU (or its own memory). The GPU cannot be removed
    /// meanwhile; other users of the GPU go on between pieces; a signal stops the copy between
    /// pieces (the call restarts, or fails with `EINTR`).
    pub(crate) fn ce_copy(
        gpu: &GpuDev,
        dst: &Mem,
        dst_offset: u64,
        src: &Mem,
        src_offset: u64,
        len: u64,
    ) -> Result {
        let access = gpu.access()?;
        let max = access.max_piece()?;
        let (dst_offset, len) = dst.range(dst_offset, len)?;
        let (src_offset, _) = src.range(src_offset, len as u64)?;
        let (dv, sv) = (dst.engine_view(gpu)?, src.engine_view(gpu)?);
        let (dc, sc) = (dst.chunk_len()?, src.chunk_len()?);
        let mut done = 0;
        while done < len {
            if kernel::current!().signal_pending() {
                return Err(ERESTARTSYS);
            }
            let (s, d) = (src_offset + done, dst_offset + done);
            // A piece stays inside one chunk of each mem: chunks are contiguous only inside.
            let piece = (len - done).min(max).min(sc - s % sc).min(dc - d % dc);
            let (s_addr, d_addr) = (sv.addr(&access, s, sc)?, dv.addr(&access, d, dc)?);
            access.copy(d_addr, s_addr, piece)?;
            done += piece;
        }
        // The views (and any table they hold) go before the access guard.
        drop((dv, sv));
        drop(access);
        Ok(())
    }

    /// The GPU address of `[offset, offset + len)`, which must lie in one chunk (`EINVAL`):
    /// for sysmem its DMA address on `gpu` (`ENXIO` if not mapped there), for vidmem its vidmem
    /// address (`gpu` must be its GPU). Returns the address and its `enum ruvm_aperture`.
    pub(crate) fn gpu_phys(&self, gpu: &GpuDev, offset: u64, len: u64) -> Result<(u64, u32)> {
        if len == 0 {
            return Err(EINVAL);
        }
        let (offset, len) = self.range(offset, len)?;
        let chunk = self.chunk_len()?;
        if offset / chunk != (offset + len - 1) / chunk {
            return Err(EINVAL);
        }
        match &self.storage {
            Storage::Sys(_) => Ok((
                self.gpu_table(gpu.id)?.addr(offset)?,
                uapi::ruvm_aperture_RUVM_APERTURE_SYS,
            )),
            Storage::Vid(v) => {
                v.check_gpu(gpu)?;
                Ok((
                    v.phys(offset, chunk)?,
                    uapi::ruvm_aperture_RUVM_APERTURE_VID,
                ))
            }
        }
    }

    /// The DMA addresses of chunks `first..` on GPU `id`, at most `max`; `ENXIO` if the mem is
    /// not mapped on it (a vidmem mem never is: it has no DMA addresses). Copied under the
    /// mem's lock: no reference to the table outlives the call.
    pub(crate) fn dma_addrs(&self, id: u32, first: u64, max: usize) -> Result<KVVec<u64>> {
        let first = usize::try_from(first).map_err(|_| EINVAL)?;
        let st = self.state.lock();
        let table = st.gpus.iter().find(|(g, _)| *g == id).ok_or(ENXIO)?;
        let count = table.1.count();
        if first > count {
            return Err(EINVAL);
        }
        let n = (count - first).min(max);
        let mut out = KVVec::with_capacity(n, GFP_KERNEL)?;
        for a in table.1.addrs().skip(first).take(n) {
            out.push(a, GFP_KERNEL)?;
        }
        Ok(out)
    }
}
