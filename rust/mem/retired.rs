// SPDX-License-Identifier: GPL-2.0

//! What a freed mem gives up ([`Retired`]): its CPU kernel mapping, GPU virtual mappings and
//! DMA tables, dropped by a synchronous free once the user mappings are zapped, or parked in
//! the mem by a free on a stream until the stream reaches it.

use kernel::{mm::Mm, prelude::*, sync::aref::ARef, sync::Arc};

use crate::{audit::Class, gpu::dma::GpuTable};

use super::{cpu, give_tables, gpu, gpu_va, Life, Mem, MemState};

/// The mappings a freed mem gave up, dropped in field order (uvm_mem's): the CPU kernel
/// mapping, the GPU user mappings, the GPU kernel mappings and their VA offset, then the DMA
/// tables. It also holds the address space whose `mmap` filled a VMA of the mem, for the zap.
#[must_use = "drop it after zapping the user mappings"]
pub(crate) struct Retired {
    pub(super) filled_by: Option<ARef<Mm>>,
    pub(super) _kmap: Option<Arc<cpu::KernelMapping>>,
    pub(super) _gpu_user: KVec<(u32, gpu_va::GpuMapping)>,
    pub(super) _gpu_kernel: KVec<(u32, gpu_va::GpuMapping)>,
    pub(super) _kva: Option<gpu_va::KernelVa>,
    pub(super) _gpus: KVec<(u32, Arc<GpuTable>)>,
    /// A sparse mem's tables, per GPU and chunk.
    pub(super) _sparse: KVec<(u32, KVVec<Option<Arc<GpuTable>>>)>,
    /// A registered mem's watch on its range (removed when dropped, which waits for a
    /// notification in flight: never under a lock such a notification's revocation takes).
    pub(super) _user: Option<super::register::UserRange>,
}

impl Retired {
    /// Takes the mappings of GPU `id` out (a GPU's removal), the GPU kernel VA offset with the
    /// last GPU kernel mapping.
    pub(super) fn take_gpu(&mut self, id: u32) -> gpu::Parked {
        fn take<T>(v: &mut KVec<(u32, T)>, id: u32) -> Option<T> {
            let at = v.iter().position(|(g, _)| *g == id)?;
            v.remove(at).ok().map(|(_, t)| t)
        }
        let user = take(&mut self._gpu_user, id);
        let kernel = take(&mut self._gpu_kernel, id);
        let kva = if self._gpu_kernel.is_empty() {
            self._kva.take()
        } else {
            None
        };
        gpu::Parked {
            user,
            kernel,
            kva,
            table: take(&mut self._gpus, id),
            sparse: take(&mut self._sparse, id),
        }
    }

    /// Counts what it holds into `bump` (the audit's walk): `chunk_size` per DMA-mapped chunk.
    pub(super) fn walk(&self, chunk_size: u64, bump: &mut impl FnMut(Class, u64)) {
        bump(Class::KernelMaps, u64::from(self._kmap.is_some()));
        bump(Class::GpuKernelVas, u64::from(self._kva.is_some()));
        for (_, table) in self._gpus.iter() {
            let n = table.count() as u64;
            bump(Class::DmaMappings, n);
            bump(Class::DmaBytes, n * chunk_size);
        }
        super::sparse::walk_tables(&self._sparse, chunk_size, bump);
    }
}

impl Mem {
    /// Frees the mem in its owner's name: it becomes [`Life::Freed`] and gives up its CPU
    /// kernel mapping, GPU user and kernel mappings and DMA tables, which the caller drops after
    /// zapping the user mappings (uvm_mem's order: CPU user, CPU kernel, GPU user, GPU kernel,
    /// GPU phys). The chunks go with the last reference.
    pub(crate) fn retire(&self) -> Retired {
        let mut st = self.state.lock();
        self.withdraw(&mut st);
        Self::retire_locked(&mut st, false)
    }

    /// [`Mem::retire`], under the mem's lock. With `parking` (a free on a stream, whose
    /// mappings stay until the stream reaches it), the table of a GPU the mem has a virtual
    /// mapping on stays with the mappings rather than going to the pool.
    pub(super) fn retire_locked(st: &mut MemState, parking: bool) -> Retired {
        st.life = Life::Freed;
        if let Some(access) = st.lease.as_ref().map(|l| l.pool.access()) {
            // The tables of the pool's GPUs stay, for the pool's cache (which decides, under
            // its lock, what it keeps of them: `pool::PoolState::keeps`).
            let virt: crate::gpu::set::GpuSet = if parking {
                Iterator::chain(st.gpu_user.iter(), st.gpu_kernel.iter())
                    .map(|(id, _)| *id)
                    .collect()
            } else {
                crate::gpu::set::GpuSet::EMPTY
            };
            let kept = |id: u32| access.contains(id) && !virt.contains(id);
            let mine = core::mem::replace(&mut st.gpus, KVec::new());
            if mine.iter().all(|(id, _)| kept(*id)) {
                if let Some(l) = st.lease.as_mut() {
                    give_tables(&mut l.tables, mine);
                }
            } else {
                // The tables that stay with the mem stay in their own vector (no allocation: a
                // table dropped here could be one a parked mapping still uses); those for the
                // pool go to the lease, in room made first, else stay too.
                let mut mine = mine;
                if let Some(l) = st.lease.as_mut() {
                    let n = mine.iter().filter(|(id, _)| kept(*id)).count();
                    if l.tables.reserve(n, GFP_KERNEL).is_ok() {
                        mine.retain(|(id, t)| {
                            !kept(*id) || l.tables.push_within_capacity((*id, t.clone())).is_err()
                        });
                    }
                }
                st.gpus = mine;
            }
        }
        // INVARIANT: a freed mem keeps no mapping, no VA offset and no table.
        Retired {
            filled_by: st.filled_by.take(),
            _kmap: st.kmap.take(),
            _gpu_user: {
                st.user_va = None;
                core::mem::replace(&mut st.gpu_user, KVec::new())
            },
            _gpu_kernel: core::mem::replace(&mut st.gpu_kernel, KVec::new()),
            _kva: st.kva.take(),
            _gpus: core::mem::replace(&mut st.gpus, KVec::new()),
            _sparse: st
                .sparse
                .as_mut()
                .map(super::sparse::Sparse::take_tables)
                .unwrap_or_default(),
            _user: st.user.take(),
        }
    }

    /// What a free on a stream parked ([`Mem::free_ordered`]), to be dropped (the stream
    /// reached the free).
    pub(crate) fn unpark(&self) -> Option<Retired> {
        self.state.lock().parked.take()
    }
}
