// SPDX-License-Identifier: GPL-2.0

//! A mem as GPUs see it: its per-GPU DMA address tables (uvm_mem's `map_gpu_phys`), its
//! mappings in GPU kernel VA spaces (`map_gpu_kernel`) and in its file's user VA spaces
//! (`map_gpu_user`), and the addresses a GPU reaches it at (copies: [`super::copy`]).

use kernel::{prelude::*, sync::Arc};

use crate::{
    bind::attach::DmaBuf,
    gpu::{
        dma::{GpuTable, Pages},
        mmu::{
            fmt::{Aperture, Pte, VA_END},
            KERNEL_SPACE,
        },
        set::GpuSet,
        GpuAccess, GpuDev,
    },
    uapi,
};

use super::{
    gpu_va::{GpuMapping, KernelVa, UserVa},
    storage::Storage,
    Mem, MemCore, MemState,
};

/// What a mem gave up on one GPU, dropped in field order: the user VA mapping, the kernel VA
/// mapping, the VA offset (if no GPU has the mem mapped any more), then the DMA table.
pub(super) struct GpuTeardown {
    _user: Option<GpuMapping>,
    _kernel: Option<GpuMapping>,
    _kva: Option<KernelVa>,
    _table: Option<Arc<GpuTable>>,
    /// A sparse mem's tables, one per resident chunk.
    _sparse: Option<SparseTables>,
    /// Of the mappings a mem freed on a stream keeps until the stream reaches the free.
    _parked: Parked,
}

/// One GPU's tables of a sparse mem, by chunk.
type SparseTables = KVVec<Option<Arc<GpuTable>>>;

/// The mappings of one GPU out of a freed mem's parked ones ([`super::Retired`]), in drop
/// order.
#[derive(Default)]
#[allow(dead_code, reason = "held only to be dropped, in order")]
pub(super) struct Parked {
    pub(super) user: Option<GpuMapping>,
    pub(super) kernel: Option<GpuMapping>,
    pub(super) kva: Option<KernelVa>,
    pub(super) table: Option<Arc<GpuTable>>,
    pub(super) sparse: Option<SparseTables>,
}

/// Takes the user VA mapping of GPU `id` out of `st`; the user VA is forgotten with the last.
fn take_user(st: &mut MemState, id: u32) -> Option<GpuMapping> {
    let mapping = st
        .gpu_user
        .iter()
        .position(|(g, _)| *g == id)
        .and_then(|at| st.gpu_user.remove(at).ok())
        .map(|(_, m)| m);
    // INVARIANT: the user VA goes with the last GPU user mapping.
    if st.gpu_user.is_empty() {
        st.user_va = None;
    }
    mapping
}

/// Takes the kernel VA mapping of GPU `id` out of `st`, and the VA offset with the last.
fn take_kernel(st: &mut MemState, id: u32) -> (Option<GpuMapping>, Option<KernelVa>) {
    let mapping = st
        .gpu_kernel
        .iter()
        .position(|(g, _)| *g == id)
        .and_then(|at| st.gpu_kernel.remove(at).ok())
        .map(|(_, m)| m);
    // INVARIANT: the offset goes with the last GPU kernel mapping.
    let kva = if st.gpu_kernel.is_empty() {
        st.kva.take()
    } else {
        None
    };
    (mapping, kva)
}

impl MemCore {
    /// Takes everything of GPU `id` out of the mem: its user and kernel VA mappings first, then
    /// its DMA table (uvm_mem's `unmap_gpu_phys` drops the GPU's virtual mappings first).
    pub(super) fn take_gpu(&self, id: u32) -> GpuTeardown {
        let mut st = self.state.lock();
        let user = take_user(&mut st, id);
        let (kernel, kva) = take_kernel(&mut st, id);
        let table = st
            .gpus
            .iter()
            .position(|(g, _)| *g == id)
            .and_then(|at| st.gpus.remove(at).ok())
            .map(|(_, t)| t);
        // A freed pool mem's table kept for the pool goes too (the GPU is going, or the mem
        // is unmapped from it).
        let kept = st.lease.as_mut().and_then(|l| {
            l.tables
                .iter()
                .position(|(g, _)| *g == id)
                .and_then(|at| l.tables.remove(at).ok())
                .map(|(_, t)| t)
        });
        let parked = st
            .parked
            .as_mut()
            .map(|r| r.take_gpu(id))
            .unwrap_or_default();
        let sparse = st.sparse.as_mut().and_then(|s| s.take_gpu(id));
        GpuTeardown {
            _user: user,
            _kernel: kernel,
            _kva: kva,
            _table: table.or(kept),
            _sparse: sparse,
            _parked: parked,
        }
    }
}

/// The mem's DMA table for the GPU `access` guards, made now if it has none.
fn table_for(
    st: &mut MemState,
    access: &GpuAccess<'_>,
    id: u32,
    pages: &Arc<Pages>,
) -> Result<Arc<GpuTable>> {
    if let Some((_, t)) = st.gpus.iter().find(|(g, _)| *g == id) {
        return Ok(t.clone());
    }
    let table = Arc::new(access.map(pages.clone())?, GFP_KERNEL_ACCOUNT)?;
    st.gpus.push((id, table.clone()), GFP_KERNEL_ACCOUNT)?;
    Ok(table)
}

/// The GPU page size a mem's chunks are mapped with (uvm_mem's `mem_pick_gpu_page_size`):
/// vidmem chunks are GPU pages already; a sysmem chunk takes the largest GPU page size not
/// above it.
fn gpu_page_size(vidmem: bool, chunk: u64, gpu_page_sizes: u64) -> Result<u64> {
    if vidmem {
        return Ok(chunk);
    }
    let fitting = gpu_page_sizes & (chunk | (chunk - 1));
    match fitting.checked_ilog2() {
        Some(bit) => Ok(1 << bit),
        None => Err(EINVAL),
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
            Storage::Buf(b) => return self.attach_gpu(&access, gpu.id, b),
            Storage::Sparse => return self.map_sparse_gpu(&access, gpu.id),
        };
        let mut st = self.state.lock();
        st.mappable()?;
        table_for(&mut st, &access, gpu.id, pages).map(|_| ())
    }

    /// [`Mem::map_gpu`] of another exporter's buffer: attached and mapped with no lock of the
    /// mem's held (the exporter's calls take the buffer's reservation lock), then kept unless
    /// the mem was freed, or mapped by another caller, meanwhile (then dropped, unlocked).
    fn attach_gpu(&self, access: &GpuAccess<'_>, id: u32, buf: &DmaBuf) -> Result {
        {
            let st = self.state.lock();
            st.mappable()?;
            if st.gpus.iter().any(|(g, _)| *g == id) {
                return Ok(());
            }
        }
        let table = Arc::new(access.attach(buf)?, GFP_KERNEL_ACCOUNT)?;
        let mut st = self.state.lock();
        let kept = if let Err(e) = st.mappable() {
            Err(e)
        } else if st.gpus.iter().any(|(g, _)| *g == id) {
            Ok(())
        } else if !table.keepable() {
            // The GPU's removal began meanwhile.
            Err(ENODEV)
        } else {
            // Room first: the table is never dropped under the mem's lock.
            st.gpus
                .reserve(1, GFP_KERNEL_ACCOUNT)
                .map_err(Error::from)
                .map(|()| {
                    let _ = st.gpus.push_within_capacity((id, table.clone()));
                })
        };
        drop(st);
        drop(table);
        kept
    }

    /// Maps a new pool mem for every GPU of its pool's access set: with the tables the pool
    /// kept for its chunks (held by its lease), else new ones. A GPU of the set that is gone is
    /// skipped (its removal takes it out of the set). Nothing for a mem of no pool.
    pub(crate) fn map_pool_gpus(&self) -> Result {
        // The GPUs of the set with no kept table: mapped now.
        let mut dropped: KVec<(u32, Arc<GpuTable>)> = KVec::new();
        let missing = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let Some(lease) = st.lease.as_mut() else {
                return Ok(());
            };
            let access = lease.pool.access();
            // Moved whole: the mem is new (its handle not given out yet), so it has no table
            // of its own and nothing is allocated.
            super::give_tables(
                &mut st.gpus,
                core::mem::replace(&mut lease.tables, KVec::new()),
            );
            // A table of a GPU whose removal began since the pool gave it is not kept: the
            // removal may have visited the registry before this mem was in it (see
            // `GpuTable::keepable`). Dropped (unmapped) with the lock released.
            let mut i = 0;
            while i < st.gpus.len() {
                match st.gpus.get(i) {
                    Some((_, t)) if !t.keepable() => {
                        if let Ok(gone) = st.gpus.remove(i) {
                            let _ = dropped.push(gone, GFP_KERNEL);
                        }
                    }
                    _ => i += 1,
                }
            }
            let kept: GpuSet = st.gpus.iter().map(|(id, _)| *id).collect();
            access.minus(kept)
        };
        drop(dropped);
        for id in missing.ids() {
            // A GPU of the set that is not there, or whose removal has begun, is skipped: its
            // removal takes it out of the set.
            let Ok(gpu) = crate::gpu::get(id) else {
                continue;
            };
            match self.map_gpu(&gpu) {
                Err(e) if e == ENODEV => continue,
                r => r?,
            }
        }
        Ok(())
    }

    /// Drops the mem's DMA address table for GPU `id`, unmapping it, and its mapping in the
    /// GPU's kernel VA space before it. Idempotent.
    pub(crate) fn unmap_gpu(&self, id: u32) {
        // Dropped (unmapped) after the lock is released.
        let _old = self.take_gpu(id);
    }

    /// Maps the mem in `gpu`'s kernel VA space at its offset of the window (taken now if no
    /// GPU has it mapped yet), DMA-mapping it first if it is sysmem (not undone if a later
    /// step fails, as in uvm_mem). Idempotent. `EOPNOTSUPP` on a GPU without an MMU; vidmem:
    /// `EINVAL` on another GPU than its own.
    pub(crate) fn map_gpu_kernel(&self, gpu: &GpuDev) -> Result {
        // Held across the mapping: the GPU cannot be removed meanwhile.
        let access = gpu.access()?;
        let mmu = access.mmu()?.clone();
        let chunk = self.layout.chunk_size;
        let len = self.layout.physical_size;
        let mut st = self.state.lock();
        st.mappable()?;
        if st.gpu_kernel.iter().any(|(g, _)| *g == gpu.id) {
            return Ok(());
        }
        // Where page `i` of `page_size` bytes is, as a PTE: sysmem at its DMA address for this
        // GPU (not cached by the GPU), vidmem at its vidmem address.
        let (table, page_size) = match &self.storage {
            Storage::Sys(pages) => (
                Some(table_for(&mut st, &access, gpu.id, pages)?),
                gpu_page_size(false, chunk, gpu.page_sizes)?,
            ),
            Storage::Vid(v) => {
                v.check_gpu(gpu)?;
                // The GPU may write it through the mapping.
                v.may_be_written();
                (None, gpu_page_size(true, chunk, gpu.page_sizes)?)
            }
            // Reached by the copy engine only (a GPU with an MMU cannot attach it); a sparse
            // mem's chunks come and go under its mappings.
            Storage::Buf(_) | Storage::Sparse => return Err(crate::bind::errno::eopnotsupp()),
        };
        let chunk_len = self.chunk_len()?;
        let storage = &self.storage;
        let pte_of = |i: u64| -> Result<Pte> {
            let offset = usize::try_from(i.checked_mul(page_size).ok_or(EINVAL)?)?;
            match (storage, &table) {
                (Storage::Sys(_), Some(t)) => Ok(Pte {
                    volatile: true,
                    ..Pte::new(t.addr(offset)?, Aperture::SysCoherent)
                }),
                (Storage::Vid(v), _) => Ok(Pte::new(v.phys(offset, chunk_len)?, Aperture::Video)),
                (Storage::Sys(_), None) | (Storage::Buf(_) | Storage::Sparse, _) => Err(EINVAL),
            }
        };
        let kva = match st.kva.take() {
            Some(k) => k,
            None => KernelVa::new(len, chunk)?,
        };
        let mapped = GpuMapping::new(mmu, KERNEL_SPACE, kva.va(), len, page_size, pte_of);
        // INVARIANT: the offset stays only while a GPU has the mem mapped.
        if mapped.is_ok() || !st.gpu_kernel.is_empty() {
            st.kva = Some(kva);
        }
        let mapping = mapped?;
        if let Err(e) = st.gpu_kernel.push((gpu.id, mapping), GFP_KERNEL) {
            // The mapping was dropped (unmapped) by the failed push.
            if st.gpu_kernel.is_empty() {
                st.kva = None;
            }
            return Err(e.into());
        }
        drop(st);
        drop(access);
        Ok(())
    }

    /// Drops the mem's mapping in GPU `id`'s kernel VA space, and its offset of the window
    /// with the last. Idempotent.
    pub(crate) fn unmap_gpu_kernel(&self, id: u32) {
        let (mapping, kva) = take_kernel(&mut self.state.lock(), id);
        // The mapping first, then the offset: after the lock is released.
        drop(mapping);
        drop(kva);
    }

    /// Maps the mem at `va` of VA space `space` (its file's) on `gpu`, read-only if asked,
    /// DMA-mapping it first (not undone if a later step fails). The first GPU user mapping
    /// fixes the VA for every GPU. Idempotent for the same VA. `EOPNOTSUPP` on a GPU without
    /// an MMU or for vidmem (user mappings are of sysmem, as in uvm_mem); `EINVAL` a size that
    /// is not whole chunks, a VA not aligned to the chunk size or another than the mem's user
    /// VA; `ERANGE` past the GPU's VA width; `EEXIST` over another mapping.
    pub(crate) fn map_gpu_user(
        &self,
        gpu: &GpuDev,
        space: u64,
        va: u64,
        read_only: bool,
    ) -> Result {
        // Held across the mapping: the GPU cannot be removed meanwhile.
        let access = gpu.access()?;
        let mmu = access.mmu()?.clone();
        let Storage::Sys(pages) = &self.storage else {
            return Err(crate::bind::errno::eopnotsupp());
        };
        let chunk = self.layout.chunk_size;
        let len = self.layout.physical_size;
        if self.size != len || va.checked_rem(chunk) != Some(0) {
            return Err(EINVAL);
        }
        if va.checked_add(len).is_none_or(|end| end > VA_END) {
            return Err(ERANGE);
        }
        let want = UserVa { space, va };
        let mut st = self.state.lock();
        st.mappable()?;
        if st.user_va.is_some_and(|u| u != want) {
            return Err(EINVAL);
        }
        if st.gpu_user.iter().any(|(g, _)| *g == gpu.id) {
            return Ok(());
        }
        let table = table_for(&mut st, &access, gpu.id, pages)?;
        let page_size = gpu_page_size(false, chunk, gpu.page_sizes)?;
        let pte_of = |i: u64| -> Result<Pte> {
            let offset = usize::try_from(i.checked_mul(page_size).ok_or(EINVAL)?)?;
            Ok(Pte {
                volatile: true,
                read_only,
                ..Pte::new(table.addr(offset)?, Aperture::SysCoherent)
            })
        };
        let mapping = GpuMapping::new(mmu, space, va, len, page_size, pte_of)?;
        // The mapping is dropped (unmapped) if the push fails.
        st.gpu_user.push((gpu.id, mapping), GFP_KERNEL)?;
        // INVARIANT: set with the first GPU user mapping.
        st.user_va = Some(want);
        drop(st);
        drop(access);
        Ok(())
    }

    /// Drops the mem's mapping in its file's user VA space of GPU `id`. Idempotent.
    pub(crate) fn unmap_gpu_user(&self, id: u32) {
        let mapping = take_user(&mut self.state.lock(), id);
        drop(mapping);
    }

    /// Where GPU `id` sees the mem in its kernel VA space (or with `user`, its file's user VA
    /// space): the VA and the page size; `ENXIO` if it is not mapped there.
    pub(crate) fn gpu_va(&self, id: u32, user: bool) -> Result<(u64, u64)> {
        let st = self.state.lock();
        let list = if user { &st.gpu_user } else { &st.gpu_kernel };
        list.iter()
            .find(|(g, _)| *g == id)
            .map(|(_, m)| m.va())
            .ok_or(ENXIO)
    }

    /// A sparse mem's DMA table of chunk `index` for GPU `id`: `ENXIO` if the mem is not
    /// mapped on it or the chunk is absent.
    pub(super) fn sparse_table(&self, id: u32, index: usize) -> Result<Arc<GpuTable>> {
        let st = self.state.lock();
        st.sparse.as_ref().ok_or(EINVAL)?.table(id, index)
    }

    /// [`Mem::map_gpu`] of a sparse mem: a table for each resident chunk, made under the mem's
    /// lock (with `access` held: the GPU's removal waits).
    fn map_sparse_gpu(&self, access: &GpuAccess<'_>, id: u32) -> Result {
        let mut st = self.state.lock();
        st.mappable()?;
        let sp = st.sparse.as_mut().ok_or(EINVAL)?;
        sp.map_gpu(access, id)
    }

    /// The mem's DMA table for GPU `id`, or `ENXIO`.
    pub(super) fn gpu_table(&self, id: u32) -> Result<Arc<GpuTable>> {
        let st = self.state.lock();
        st.gpus
            .iter()
            .find(|(g, _)| *g == id)
            .map(|(_, t)| t.clone())
            .ok_or(ENXIO)
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
            Storage::Sys(_) | Storage::Buf(_) => Ok((
                self.gpu_table(gpu.id)?.addr(offset)?,
                uapi::ruvm_aperture_RUVM_APERTURE_SYS,
            )),
            Storage::Sparse => Ok((
                self.sparse_table(gpu.id, offset / chunk)?
                    .addr(offset % chunk)?,
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
        if let Some(sp) = st.sparse.as_ref() {
            return sp.dma_addrs(id, first, max);
        }
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
