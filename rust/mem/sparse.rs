// SPDX-License-Identifier: GPL-2.0

//! Sparse mems (`RUVM_ALLOC_SPARSE`): mems whose chunks may be absent, made resident and given
//! back range by range (`RUVM_IOCTL_MEM_RANGE`), as a caching allocator's one large segment
//! needs.
//!
//! Each resident chunk is a [`Piece`] of its own: a one-chunk list (so that it can go back
//! alone), its quota charge and its place in the statistics, and, for each GPU the mem is
//! mapped on, its own DMA table. The mem's lock guards the slots. A plan that reaches a piece
//! (a copy, a fill) holds it ([`Held`]) until the plan goes: a release refuses a range with a
//! held piece (`EBUSY`), so no chunk is freed, or unmapped for a GPU, under queued work. User
//! mappings are filled on fault from the resident pieces, under the mem's lock; a release takes
//! its pieces out under that lock and zaps the range before dropping them, so every page a
//! fault inserted is found, and later faults on the range get `SIGBUS` until it is populated
//! again.

use kernel::{
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc,
    },
};

use crate::{
    audit::{
        stats::{Resident, StatsBacking},
        Class, Counted,
    },
    bind::{pages::ChunkFlags, vma},
    gpu::{
        dma::{GpuTable, Pages},
        GpuAccess, GpuDev,
    },
};

use super::{
    quota::{Charge, Quota},
    storage::{stop_on_signal, sys_pages, Storage},
    Life, Mem, MemState,
};

/// One resident chunk of a sparse mem.
pub(crate) struct Piece {
    pages: Arc<Pages>,
    /// Plans holding it ([`Held`]); changed up only under the mem's lock.
    users: Atomic<u32>,
    _charge: Charge,
    _bytes: Counted,
    _usage: Resident,
}

/// A plan's hold on a piece: the chunk stays resident, and keeps its DMA tables, until it goes.
pub(crate) struct Held {
    piece: Arc<Piece>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.piece.users.fetch_sub(1, Relaxed);
    }
}

impl Held {
    /// The chunk's pages.
    pub(crate) fn pages(&self) -> &Pages {
        &self.piece.pages
    }
}

/// One GPU's DMA tables of a sparse mem, one per resident chunk (by chunk index).
type GpuTables = KVVec<Option<Arc<GpuTable>>>;

/// A sparse mem's chunks, under the mem's lock.
pub(crate) struct Sparse {
    /// Each GPU the mem is mapped on, and its tables (dropped before the pieces they map).
    gpus: KVec<(u32, GpuTables)>,
    slots: KVVec<Option<Arc<Piece>>>,
    order: u32,
    chunk: usize,
    resident: usize,
}

impl Sparse {
    /// `count` absent chunks of `chunk` bytes.
    pub(super) fn new(count: usize, chunk: usize) -> Result<Self> {
        let mut slots = KVVec::with_capacity(count, GFP_KERNEL_ACCOUNT)?;
        for _ in 0..count {
            slots.push(None, GFP_KERNEL_ACCOUNT)?;
        }
        let pages = chunk / kernel::page::PAGE_SIZE;
        Ok(Self {
            gpus: KVec::new(),
            slots,
            order: pages.trailing_zeros(),
            chunk,
            resident: 0,
        })
    }

    /// Resident bytes.
    pub(crate) fn resident_bytes(&self) -> u64 {
        (self.resident as u64).saturating_mul(self.chunk as u64)
    }

    /// The GPUs it is mapped on.
    pub(super) fn gpu_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.gpus.iter().map(|(id, _)| *id)
    }

    /// Takes every GPU's tables out (a free: the mem keeps no DMA mapping).
    pub(super) fn take_tables(&mut self) -> KVec<(u32, GpuTables)> {
        core::mem::replace(&mut self.gpus, KVec::new())
    }

    /// Takes GPU `id`'s tables out (its unmapping or removal).
    pub(super) fn take_gpu(&mut self, id: u32) -> Option<GpuTables> {
        let at = self.gpus.iter().position(|(g, _)| *g == id)?;
        self.gpus.remove(at).ok().map(|(_, t)| t)
    }

    /// The piece holding chunk `index`, if resident.
    fn piece(&self, index: usize) -> Option<&Arc<Piece>> {
        self.slots.get(index).and_then(Option::as_ref)
    }

    /// The pages of the chunk holding page `page` of the mem, if resident.
    pub(super) fn pages_at(&self, page: usize) -> Option<&Pages> {
        let per_chunk = 1usize << self.order;
        self.piece(page / per_chunk).map(|p| &*p.pages)
    }

    /// Holds every chunk of `[first, first + count)`: `ENXIO` if one is absent.
    pub(super) fn hold(&self, first: usize, count: usize) -> Result<KVVec<Held>> {
        let mut held = KVVec::with_capacity(count, GFP_KERNEL_ACCOUNT)?;
        for i in first..first.checked_add(count).ok_or(EOVERFLOW)? {
            let piece = self.piece(i).ok_or(ENXIO)?.clone();
            piece.users.fetch_add(1, Relaxed);
            // Room was made for `count`.
            let _ = held.push_within_capacity(Held { piece });
        }
        Ok(held)
    }

    /// GPU `id`'s table of chunk `index`: `ENXIO` if the mem is not mapped on it or the chunk
    /// is absent.
    pub(super) fn table(&self, id: u32, index: usize) -> Result<Arc<GpuTable>> {
        let (_, tables) = self.gpus.iter().find(|(g, _)| *g == id).ok_or(ENXIO)?;
        tables.get(index).and_then(Option::clone).ok_or(ENXIO)
    }

    /// Maps every resident chunk for the GPU `access` guards (id `id`), unless it is already.
    pub(super) fn map_gpu(&mut self, access: &GpuAccess<'_>, id: u32) -> Result {
        if self.gpus.iter().any(|(g, _)| *g == id) {
            return Ok(());
        }
        let mut tables = KVVec::with_capacity(self.slots.len(), GFP_KERNEL_ACCOUNT)?;
        for slot in self.slots.iter() {
            let t = match slot {
                Some(p) => Some(Arc::new(access.map(p.pages.clone())?, GFP_KERNEL_ACCOUNT)?),
                None => None,
            };
            let _ = tables.push_within_capacity(t);
        }
        self.gpus.push((id, tables), GFP_KERNEL_ACCOUNT)?;
        Ok(())
    }

    /// The DMA addresses of chunks `first..` on GPU `id`, at most `max`
    /// (`RUVM_DMA_ADDR_ABSENT` for an absent one); `ENXIO` if not mapped on it.
    pub(super) fn dma_addrs(&self, id: u32, first: usize, max: usize) -> Result<KVVec<u64>> {
        let (_, tables) = self.gpus.iter().find(|(g, _)| *g == id).ok_or(ENXIO)?;
        if first > tables.len() {
            return Err(EINVAL);
        }
        let n = (tables.len() - first).min(max);
        let mut out = KVVec::with_capacity(n, GFP_KERNEL)?;
        for t in tables.iter().skip(first).take(n) {
            let a = match t {
                Some(t) => t.addr(0)?,
                // `RUVM_DMA_ADDR_ABSENT` (bindgen types the all-ones macro as `-1`).
                None => u64::MAX,
            };
            out.push(a, GFP_KERNEL)?;
        }
        Ok(out)
    }

    /// Counts what it holds into `bump` (the audit's walk).
    pub(super) fn walk(&self, bump: &mut impl FnMut(Class, u64)) {
        let chunk = self.chunk as u64;
        bump(Class::SysmemBytes, self.resident_bytes());
        bump(Class::SysmemChunks(self.order), self.resident as u64);
        walk_tables(&self.gpus, chunk, bump);
    }
}

/// Counts the DMA mappings of `gpus` (tables of `chunk`-byte chunks) into `bump`.
pub(super) fn walk_tables(
    gpus: &[(u32, GpuTables)],
    chunk: u64,
    bump: &mut impl FnMut(Class, u64),
) {
    for (_, tables) in gpus.iter() {
        let n = tables.iter().flatten().count() as u64;
        bump(Class::DmaMappings, n);
        bump(Class::DmaBytes, n * chunk);
    }
}

/// What a populate made before it could install it: the pieces by chunk index, and each GPU's
/// tables of them (in the order of `gpus`).
struct Made {
    pieces: KVVec<(usize, Arc<Piece>)>,
    tables: KVec<(u32, KVVec<Arc<GpuTable>>)>,
}

impl Mem {
    /// The sparse chunks of the mem (under its lock), or `EOPNOTSUPP`.
    fn sparse_of(st: &mut MemState) -> Result<&mut Sparse> {
        st.sparse
            .as_mut()
            .ok_or_else(crate::bind::errno::eopnotsupp)
    }

    /// `EOPNOTSUPP` unless the mem is sparse (checked before its range).
    fn is_sparse(&self) -> Result {
        match self.storage {
            Storage::Sparse => Ok(()),
            _ => Err(crate::bind::errno::eopnotsupp()),
        }
    }

    /// The chunks a plan of `[offset, offset + len)` (a copy, a fill) holds, from the first:
    /// none for an empty range. `ENXIO` if one is absent.
    pub(super) fn hold_range(
        sp: &Sparse,
        offset: usize,
        len: usize,
    ) -> Result<(usize, KVVec<Held>)> {
        let first = offset / sp.chunk;
        if len == 0 {
            return Ok((first, KVVec::new()));
        }
        let last = offset.checked_add(len - 1).ok_or(EOVERFLOW)? / sp.chunk;
        Ok((first, sp.hold(first, last - first + 1)?))
    }

    /// The chunk indices of `[offset, offset + length)`: `EINVAL` unless chunk-aligned, not
    /// empty and inside the mem.
    fn chunk_range(&self, offset: u64, length: u64) -> Result<(usize, usize)> {
        let chunk = self.layout.chunk_size;
        let end = offset.checked_add(length).ok_or(EOVERFLOW)?;
        if length == 0 || offset % chunk != 0 || length % chunk != 0 {
            return Err(EINVAL);
        }
        if end > self.layout.physical_size {
            return Err(EINVAL);
        }
        Ok((
            usize::try_from(offset / chunk)?,
            usize::try_from(length / chunk)?,
        ))
    }

    /// Makes every absent chunk of `[offset, offset + length)` resident (`RUVM_RANGE_POPULATE`):
    /// zeroed, charged to `quota`, DMA-mapped for each GPU the mem is mapped on. All or nothing.
    /// Returns the mem's resident bytes.
    pub(crate) fn populate(&self, quota: &Arc<Quota>, offset: u64, length: u64) -> Result<u64> {
        self.is_sparse()?;
        let (first, count) = self.chunk_range(offset, length)?;
        // A GPU mapped meanwhile makes the tables made for the old set fall short: made again.
        for _ in 0..4 {
            let (absent, ids, order) = {
                let mut st = self.state.lock();
                st.mappable()?;
                let sp = Self::sparse_of(&mut st)?;
                let n = (first..first + count)
                    .filter(|&i| sp.piece(i).is_none())
                    .count();
                let mut absent = KVVec::with_capacity(n, GFP_KERNEL_ACCOUNT)?;
                for i in (first..first + count).filter(|&i| sp.piece(i).is_none()) {
                    let _ = absent.push_within_capacity(i);
                }
                if absent.is_empty() {
                    return Ok(sp.resident_bytes());
                }
                let mut ids = KVec::new();
                for id in sp.gpu_ids() {
                    ids.push(id, GFP_KERNEL)?;
                }
                (absent, ids, sp.order)
            };
            let made = self.make_pieces(quota, &absent, &ids, order)?;
            if let Some(resident) = self.install(made, &ids)? {
                return Ok(resident);
            }
        }
        Err(EAGAIN)
    }

    /// Allocates the pieces of chunks `absent` (of `order`) and their DMA tables on GPUs `ids`,
    /// with no lock of the mem held. `ENODEV` if one of the GPUs is going.
    fn make_pieces(
        &self,
        quota: &Arc<Quota>,
        absent: &[usize],
        ids: &[u32],
        order: u32,
    ) -> Result<Made> {
        let chunk = self.layout.chunk_size;
        let mut pieces = KVVec::with_capacity(absent.len(), GFP_KERNEL_ACCOUNT)?;
        for &i in absent {
            stop_on_signal()?;
            let charge = quota.charge(chunk)?;
            let flags = ChunkFlags {
                zero: true,
                fail_fast: false,
            };
            let pages = sys_pages(order, 1, flags)?;
            let piece = Arc::new(
                Piece {
                    pages,
                    users: Atomic::new(0),
                    _charge: charge,
                    _bytes: Counted::new(Class::SysmemBytes, chunk),
                    _usage: Resident::new(StatsBacking::Sysmem, chunk),
                },
                GFP_KERNEL_ACCOUNT,
            )?;
            let _ = pieces.push_within_capacity((i, piece));
        }
        let mut tables = KVec::with_capacity(ids.len(), GFP_KERNEL)?;
        for &id in ids {
            let gpu: Arc<GpuDev> = crate::gpu::get(id)?;
            let access = gpu.access()?;
            let mut per = KVVec::with_capacity(pieces.len(), GFP_KERNEL_ACCOUNT)?;
            for (_, piece) in pieces.iter() {
                let t = Arc::new(access.map(piece.pages.clone())?, GFP_KERNEL_ACCOUNT)?;
                let _ = per.push_within_capacity(t);
            }
            drop(access);
            let _ = tables.push_within_capacity((id, per));
        }
        Ok(Made { pieces, tables })
    }

    /// Installs what [`Mem::make_pieces`] made for GPUs `ids`, under the mem's lock; a chunk a
    /// concurrent populate made resident keeps its piece (ours is dropped). `None` if the mem's
    /// GPUs are no longer `ids` (nothing installed: made again). Returns the resident bytes.
    fn install(&self, made: Made, ids: &[u32]) -> Result<Option<u64>> {
        let Made { pieces, mut tables } = made;
        let mut st = self.state.lock();
        st.mappable()?;
        let sp = Self::sparse_of(&mut st)?;
        let same = sp.gpus.len() == ids.len() && sp.gpu_ids().all(|id| ids.contains(&id));
        // A table of a GPU whose removal began is not kept (see `GpuTable::keepable`).
        let keepable = tables
            .iter()
            .all(|(_, per)| per.iter().all(|t| t.keepable()));
        if !same || !keepable {
            drop(st);
            drop(tables);
            drop(pieces);
            return if keepable { Ok(None) } else { Err(ENODEV) };
        }
        let mut extra = KVVec::new();
        for (n, (i, piece)) in pieces.into_iter().enumerate() {
            let slot = sp.slots.get_mut(i).ok_or(EINVAL)?;
            if slot.is_some() {
                extra.push(piece, GFP_KERNEL_ACCOUNT).ok();
                continue;
            }
            *slot = Some(piece);
            sp.resident += 1;
            for (id, per) in tables.iter_mut() {
                let Some((_, dst)) = sp.gpus.iter_mut().find(|(g, _)| *g == *id) else {
                    continue;
                };
                if let (Some(d), Some(t)) = (dst.get_mut(i), per.get(n)) {
                    // `tables` (with the tables of chunks not installed) drops after the lock.
                    *d = Some(t.clone());
                }
            }
        }
        let resident = sp.resident_bytes();
        drop(st);
        drop(tables);
        drop(extra);
        Ok(Some(resident))
    }

    /// Gives back every resident chunk of `[offset, offset + length)` (`RUVM_RANGE_RELEASE`):
    /// `EBUSY`, and nothing released, while a plan holds one. The user mappings of the range
    /// are zapped (through `file`'s mapping) before the chunks go. Returns the resident bytes.
    pub(crate) fn release(&self, file: &kernel::fs::File, offset: u64, length: u64) -> Result<u64> {
        let (first, count) = self.chunk_range(offset, length)?;
        // Checked before anything changes: the zap below cannot fail on them.
        let start = self.mmap_offset().checked_add(offset).ok_or(EOVERFLOW)?;
        if i64::try_from(start).is_err() || i64::try_from(length).is_err() {
            return Err(EOVERFLOW);
        }
        let (tables, pieces, resident) = {
            let mut st = self.state.lock();
            st.mappable()?;
            let sp = Self::sparse_of(&mut st)?;
            let range = first..first + count;
            let mut n = 0;
            for i in range.clone() {
                if let Some(p) = sp.piece(i) {
                    if p.users.load(Relaxed) != 0 {
                        return Err(EBUSY);
                    }
                    n += 1;
                }
            }
            // Room first: nothing below fails once a piece is out.
            let mut pieces = KVVec::with_capacity(n, GFP_KERNEL_ACCOUNT)?;
            let n_tables = n.saturating_mul(sp.gpus.len());
            let mut tables = KVVec::with_capacity(n_tables, GFP_KERNEL_ACCOUNT)?;
            for i in range {
                let Some(piece) = sp.slots.get_mut(i).and_then(Option::take) else {
                    continue;
                };
                sp.resident -= 1;
                for (_, per) in sp.gpus.iter_mut() {
                    if let Some(t) = per.get_mut(i).and_then(Option::take) {
                        let _ = tables.push_within_capacity(t);
                    }
                }
                let _ = pieces.push_within_capacity(piece);
            }
            (tables, pieces, sp.resident_bytes())
        };
        // The pages may be in user page tables until zapped: they go after.
        let zapped = if self.user_mappings.load(Relaxed) != 0 {
            vma::zap(file, start, length)
        } else {
            Ok(())
        };
        drop(tables);
        if let Err(e) = zapped {
            // Not zapped (its bounds were checked above, so never): the pages stay allocated,
            // counted as leaked, rather than freed under user page tables.
            for p in pieces {
                core::mem::forget(p);
            }
            return Err(e);
        }
        drop(pieces);
        Ok(resident)
    }

    /// Whether a user fault may insert page `page`: the mem not freed and its chunk resident.
    pub(super) fn sparse_fault(st: &MemState, page: usize) -> Option<&Pages> {
        if st.life == Life::Freed {
            return None;
        }
        st.sparse.as_ref()?.pages_at(page)
    }
}
