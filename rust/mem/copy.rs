// SPDX-License-Identifier: GPL-2.0

//! Copies by a GPU's copy engine between two mems ([`EngineCopy`]), planned when they are asked
//! for and run piece by piece, synchronously ([`Mem::ce_copy`]) or on a stream; each mem
//! reached through its DMA table for the GPU, or, for vidmem, the GPU's own memory.

use kernel::{prelude::*, sync::Arc};

use crate::gpu::{dma::GpuTable, GpuAccess, GpuDev};

use super::{sparse::Held, storage::Storage, Life, Mem, MemCore};

/// How a plan reaches one mem on its GPU: through its DMA table, in the GPU's own memory
/// (vidmem), or, for a sparse mem, through each chunk of the range, held with its table.
enum Reach {
    Table(Arc<GpuTable>),
    Vid,
    Chunks {
        first: usize,
        held: KVVec<(Held, Arc<GpuTable>)>,
    },
}

impl Reach {
    /// How `gpu`'s engine reaches `[offset, offset + len)` of `mem`:
    /// its DMA table for the GPU (`ENXIO` without one; a sparse mem: also for an absent
    /// chunk), or, for vidmem, the GPU's own memory (see [`super::storage::VidPages::check_gpu`]).
    fn of(mem: &Mem, gpu: &GpuDev, offset: usize, len: usize) -> Result<Self> {
        match &mem.storage {
            Storage::Sys(_) | Storage::Buf(_) => Ok(Reach::Table(mem.gpu_table(gpu.id)?)),
            Storage::Vid(v) => v.check_gpu(gpu).map(|()| Reach::Vid),
            Storage::Sparse => {
                let st = mem.state.lock();
                let sp = st.sparse.as_ref().ok_or(EINVAL)?;
                if st.life == Life::Freed {
                    return Err(ENXIO);
                }
                let (first, chunks) = Mem::hold_range(sp, offset, len)?;
                let mut held = KVVec::with_capacity(chunks.len(), GFP_KERNEL_ACCOUNT)?;
                for (i, h) in (first..).zip(chunks) {
                    let _ = held.push_within_capacity((h, sp.table(gpu.id, i)?));
                }
                Ok(Reach::Chunks { first, held })
            }
        }
    }

    /// The DMA address at which the engine (of the GPU `access` guards) reaches byte `offset`
    /// of `mem` (chunks of `chunk` bytes).
    fn addr(&self, mem: &Mem, access: &GpuAccess<'_>, offset: usize, chunk: usize) -> Result<u64> {
        match (self, &mem.storage) {
            (Reach::Table(t), _) => t.addr(offset),
            (Reach::Vid, Storage::Vid(v)) => access.pmm()?.engine_addr(v.phys(offset, chunk)?),
            (Reach::Chunks { first, held }, _) => {
                let i = (offset / chunk).checked_sub(*first).ok_or(EINVAL)?;
                let (_, t) = held.get(i).ok_or(EINVAL)?;
                t.addr(offset % chunk)
            }
            (Reach::Vid, _) => Err(ENXIO),
        }
    }
}

/// A copy by a GPU's copy engine between two mems, planned when it is asked for: both ranges
/// checked, each mem's view on the GPU taken (a sysmem mem's DMA table is held, so the mapping
/// outlives the copy whatever the mems' owner does meanwhile, and both mems stay alive until
/// the plan goes). Run piece by piece ([`EngineCopy::piece`]), synchronously or on a stream.
pub(crate) struct EngineCopy {
    dst: Arc<Mem>,
    src: Arc<Mem>,
    /// How the GPU reaches each mem.
    dst_reach: Reach,
    src_reach: Reach,
    dst_offset: usize,
    src_offset: usize,
    len: usize,
    /// The engine's largest piece.
    max: usize,
}

impl EngineCopy {
    /// Plans the copy of `len` bytes from `src` at `src_offset` to `dst` at `dst_offset` by
    /// `gpu`'s engine: `EINVAL`/`EOVERFLOW` for a range outside a mem, `ENXIO` for a sysmem mem
    /// not mapped on the GPU, `EINVAL`/`ENODEV` for a vidmem mem of another GPU or of a GPU
    /// unbound since, `ENODEV` if the GPU has no engine or is going.
    pub(crate) fn plan(
        gpu: &GpuDev,
        dst: Arc<Mem>,
        dst_offset: u64,
        src: Arc<Mem>,
        src_offset: u64,
        len: u64,
    ) -> Result<Self> {
        let max = gpu.access()?.max_piece()?;
        let (dst_offset, len) = dst.range(dst_offset, len)?;
        let (src_offset, _) = src.range(src_offset, len as u64)?;
        // Both chunk sizes are checked here, so `piece` cannot fail on them.
        dst.chunk_len()?;
        src.chunk_len()?;
        let dst_reach = Reach::of(&dst, gpu, dst_offset, len)?;
        let src_reach = Reach::of(&src, gpu, src_offset, len)?;
        if let Storage::Vid(v) = &dst.storage {
            v.may_be_written();
        }
        Ok(Self {
            dst,
            src,
            dst_reach,
            src_reach,
            dst_offset,
            src_offset,
            len,
            max,
        })
    }

    /// Bytes to copy.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Moves the next piece, from byte `done` of the copy on; returns its length. A piece
    /// stays inside one chunk of each mem (chunks are contiguous only inside). `ENODEV` once
    /// the GPU's removal has begun.
    pub(crate) fn piece(&self, access: &GpuAccess<'_>, done: usize) -> Result<usize> {
        if done >= self.len {
            return Err(EINVAL);
        }
        let (dc, sc) = (self.dst.chunk_len()?, self.src.chunk_len()?);
        let (s, d) = (self.src_offset + done, self.dst_offset + done);
        let piece = (self.len - done)
            .min(self.max)
            .min(sc - s % sc)
            .min(dc - d % dc);
        let s_addr = self.src_reach.addr(&self.src, access, s, sc)?;
        let d_addr = self.dst_reach.addr(&self.dst, access, d, dc)?;
        access.copy(d_addr, s_addr, piece)?;
        Ok(piece)
    }
}

impl Mem {
    /// Copies `len` bytes from `src` to `dst` with `gpu`'s copy engine, addressing both only
    /// through their DMA tables for that GPU (or its own memory). The GPU cannot be removed
    /// meanwhile; other users of the GPU go on between pieces; a signal stops the copy between
    /// pieces (the call restarts, or fails with `EINTR`).
    pub(crate) fn ce_copy(
        gpu: &GpuDev,
        dst: &Arc<Mem>,
        dst_offset: u64,
        src: &Arc<Mem>,
        src_offset: u64,
        len: u64,
    ) -> Result {
        let plan = || EngineCopy::plan(gpu, dst.clone(), dst_offset, src.clone(), src_offset, len);
        let mut copy = plan()?;
        // Shared as dma-bufs: their users' work first, once the copy is known to be valid,
        // with nothing of the GPU held meanwhile (its removal would wait for the tables), then
        // planned again.
        if dst.resv().is_some() || src.resv().is_some() {
            drop(copy);
            MemCore::wait_implicit(&[(dst, true), (src, false)])?;
            copy = plan()?;
        }
        let access = gpu.access()?;
        let mut done = 0;
        while done < copy.len() {
            if kernel::current!().signal_pending() {
                return Err(ERESTARTSYS);
            }
            done += copy.piece(&access, done)?;
        }
        // The plan (and any table it holds) goes before the access guard.
        drop(copy);
        drop(access);
        Ok(())
    }
}
