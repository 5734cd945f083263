// SPDX-License-Identifier: GPL-2.0

//! A GPU's physical memory manager (PMM): its vidmem, handed out in chunks of 4K, 64K and 2M.
//!
//! Which chunks are free is uvm's chunk tree ([`ChunkTree`]): 2 MiB root chunks, each handed
//! out whole or split once into 64 KiB chunks, each of those whole or split once into 4 KiB
//! ones, split lazily and merged eagerly, with no allocation to split or merge. Every chunk
//! lies inside one root chunk (`phys / 2 MiB`). The PMM keeps per root chunk what the tree
//! does not: its storage.
//!
//! # Storage
//!
//! Vidmem holds real bytes. The first chunk of a mem handed out from a root chunk gives that
//! root its storage: 2 MiB of contiguous kernel pages, DMA-mapped for the GPU (so its copy
//! engine reaches them at the root's DMA address plus the offset). The storage goes when the
//! root holds no stored chunk any more. A chunk's bytes are zeroed when it is handed out, not
//! when it comes back, so no mem ever sees an earlier one's bytes, and new storage is not
//! zeroed whole: a cold allocation of a 64 KiB chunk zeroes 64 KiB, not the root's 2 MiB.
//!
//! A chunk's bytes stay zero as long as nothing writes them, so a chunk that comes back
//! unwritten (its mem was never a copy engine's destination nor mapped in a GPU VA space:
//! [`VidChunk::unwritten`]) is remembered as zero, per 64 KiB slot of its storage
//! ([`ZeroSlots`]), and is not zeroed again when handed out, as uvm's PMM keeps zeroed chunks
//! on free lists of their own.
//!
//! Storage a root gives up is kept for the next root that needs some, already mapped, up to
//! `vidmem_keep_mib` per GPU: a cold allocation then costs no page allocation and no DMA
//! mapping. Kept storage is counted as `vidmem_kept` alone (no root's, no mem's, no DMA
//! mapping a mem made), and given back under memory pressure ([`Pmm::shrink`], the module's
//! shrinker) and when the GPU goes. Only a mem that was made keeps its storage: the chunks of
//! an allocation that failed put storage back where it came from (the kept list, or the page
//! allocator), so a failed call leaves every count as it was.
//!
//! # Locking
//!
//! One mutex per PMM (`state`, the chunk tree in it), taken under a GPU access guard (or by
//! the GPU's removal) and never with a mem's lock held. Nothing is allocated under it: a
//! stream's engine takes it to reach vidmem in its fence-signalling path. Under it only root
//! storage is unmapped and freed (and a simulated GPU's translation lock, a leaf, is taken).
//! New storage is made with it released, by an allocation that holds a GPU access guard, and
//! is either installed under it or dropped before that allocation returns; so once the GPU's
//! removal has waited for the guards, [`Pmm::kill`] (under the lock) finds every mapping
//! there is.

use kernel::{
    bitmap::BitmapVec,
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
};

use crate::{
    audit::{Class, Counted, Uncounted},
    bind::{
        dma::DmaDevice,
        pages::{ChunkFlags, ChunkList},
    },
};

use super::{
    chunks::{self, RootSet, ZeroSlots},
    dma::{GpuTable, Pages, Tracker, Unseen},
    limit::{Limits, VidCharge},
    sim::SimIommu,
};

/// The chunk tree over a PMM's roots, in kernel memory.
type ChunkTree = chunks::ChunkTree<KVVec<chunks::Root>, BitmapVec>;

impl RootSet for BitmapVec {
    fn put(&mut self, r: usize, on: bool) {
        // The tree's indexes are below its root count, the bitmap's length.
        if on {
            self.set_bit(r);
        } else {
            self.clear_bit(r);
        }
    }

    fn first(&self) -> Option<usize> {
        match self.len() {
            0 => None,
            _ => self.next_bit(0),
        }
    }
}

/// A root chunk: 2 MiB, the largest chunk.
pub(crate) const CHUNK_MAX: u64 = chunks::ROOT;

/// The chunk sizes the PMM hands out, smallest first.
pub(crate) const CHUNK_SIZES: [u64; 3] = [chunks::SMALL, chunks::MID, chunks::ROOT];

/// The page order of a root chunk's storage (2 MiB of 4 KiB pages).
const ROOT_ORDER: u32 = 9;

/// The index of `size` in [`CHUNK_SIZES`].
fn size_index(size: u64) -> Option<usize> {
    CHUNK_SIZES.iter().position(|&s| s == size)
}

/// The index of the root chunk holding vidmem address `phys`.
fn root_index(phys: u64) -> usize {
    // CAST: `phys` is below the capacity, whose root count was a `usize` (the roots' vector).
    (phys / CHUNK_MAX) as usize
}

/// A root chunk's storage: 2 MiB of kernel pages (counted as `vidmem_roots`), DMA-mapped for
/// the GPU, and which of its slots are known to be zero (kept with the storage: they are its
/// bytes, whichever root it serves).
struct RootStore {
    table: GpuTable,
    pages: Arc<Pages>,
    zero: ZeroSlots,
}

/// What the PMM knows of one root chunk's storage.
#[derive(Default)]
struct Root {
    /// Chunks allocated from it that use its storage.
    stored: u32,
    store: Option<RootStore>,
    /// Its storage came from the kept list (where a failed allocation puts it back).
    reused: bool,
}

/// A root's storage kept for reuse: counted as `vidmem_kept` alone meanwhile. Field order is
/// drop order: the storage's own counts are back before it goes.
struct Kept {
    _kept: Counted,
    _root: Uncounted,
    _unseen: Option<Unseen>,
    store: RootStore,
}

impl Kept {
    fn new(store: RootStore) -> Self {
        Self {
            _kept: Counted::new(Class::VidmemKept, 1),
            _root: Uncounted::new(Class::VidmemRoots, 1),
            _unseen: store.table.unseen(),
            store,
        }
    }
}

/// The PMM's bookkeeping, under its lock.
struct PmmState {
    /// Which chunks are handed out.
    tree: ChunkTree,
    /// Each root chunk's storage, by index.
    roots: KVVec<Root>,
    /// Storage kept for reuse, at most its capacity (the bound, reserved at creation).
    kept: KVVec<Kept>,
    /// Chunks allocated now, per [`CHUNK_SIZES`].
    allocated: [u64; 3],
    /// The GPU is gone: storage dropped, nothing more is handed out.
    dead: bool,
}

/// A GPU's PMM.
#[pin_data]
pub(crate) struct Pmm {
    capacity: u64,
    /// What bounds a caller's vidmem of this GPU: every chunk handed out is charged (but a
    /// GPU page table, see [`Pmm::alloc_table`]).
    #[pin]
    limits: Limits,
    dma: Arc<DmaDevice>,
    limit: u64,
    tracker: Arc<Tracker>,
    sim: Option<Arc<SimIommu>>,
    #[pin]
    state: Mutex<PmmState>,
}

/// A snapshot of a PMM (`RUVM_IOCTL_PMM_STATS`).
#[derive(Clone, Copy, Default)]
pub(crate) struct PmmStats {
    pub(crate) capacity: u64,
    pub(crate) free: u64,
    pub(crate) allocated: [u64; 3],
    pub(crate) roots: u64,
    pub(crate) roots_used: u64,
    pub(crate) roots_split: u64,
    pub(crate) roots_stored: u64,
}

/// One chunk of vidmem (zeroed when handed out if it uses storage), handed back on drop.
pub(crate) struct VidChunk {
    pmm: Arc<Pmm>,
    phys: u64,
    size: u64,
    stored: bool,
    /// Its mem was made: its root's storage may be kept when it goes.
    keep: bool,
    /// Nothing wrote it since it was handed out (zeroed): its bytes are still zero.
    unwritten: bool,
    /// Its bytes charged to the task that took it (dmem cgroup, user), given back with it.
    _charge: VidCharge,
}

impl Pmm {
    /// A PMM over `capacity` bytes of vidmem (a non-zero multiple of 2 MiB), keeping the
    /// storage of up to `keep` bytes of roots for reuse, for the GPU whose DMA device is `dma`,
    /// whose highest DMA address is `limit`, whose DMA tables are tracked by `tracker` and
    /// whose simulated engine (if any) is `sim`.
    pub(super) fn new(
        gpu: u32,
        capacity: u64,
        keep: u64,
        dma: Arc<DmaDevice>,
        limit: u64,
        tracker: Arc<Tracker>,
        sim: Option<Arc<SimIommu>>,
    ) -> Result<Arc<Self>> {
        if capacity == 0 || capacity % CHUNK_MAX != 0 {
            return Err(EINVAL);
        }
        let count = usize::try_from(capacity / CHUNK_MAX)?;
        let mut roots = KVVec::with_capacity(count, GFP_KERNEL)?;
        for _ in 0..count {
            roots.push(Root::default(), GFP_KERNEL)?;
        }
        // Never more than every root's storage.
        let keep = usize::try_from(keep.min(capacity) / CHUNK_MAX)?;
        let kept = KVVec::with_capacity(keep, GFP_KERNEL)?;
        let tree_roots = KVVec::from_elem(chunks::Root::default(), count, GFP_KERNEL)?;
        let sets = [
            BitmapVec::new(count, GFP_KERNEL)?,
            BitmapVec::new(count, GFP_KERNEL)?,
            BitmapVec::new(count, GFP_KERNEL)?,
        ];
        let tree = ChunkTree::new(tree_roots, sets).ok_or(EOVERFLOW)?;
        let limits = Limits::new(gpu, capacity)?;
        Arc::pin_init(
            try_pin_init!(Pmm {
                capacity,
                limits <- limits,
                dma,
                limit,
                tracker,
                sim,
                state <- new_mutex!(PmmState {
                    tree,
                    roots,
                    kept,
                    allocated: [0; 3],
                    dead: false,
                }),
            }),
            GFP_KERNEL,
        )
    }

    /// The vidmem size.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// What bounds a caller's vidmem of this GPU.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Hands out one chunk of `size` (one of [`CHUNK_SIZES`]); with `store`, its root chunk
    /// gets storage if it has none. `ENOMEM` when no free block of that size is left (or its
    /// storage cannot be had), `ENODEV` once the GPU is gone, `EINVAL` for another size.
    ///
    /// New storage is made with the PMM's lock released (it allocates and DMA-maps 2 MiB), so
    /// that the lock, which a stream's engine takes to reach vidmem, is never held across an
    /// allocation: a first try that needs storage it cannot take from the kept list gives the
    /// block back, storage is made, and the second try uses it (or a kept one, the new one then
    /// going again).
    pub(crate) fn alloc(self: &Arc<Self>, size: u64, store: bool) -> Result<VidChunk> {
        size_index(size).ok_or(EINVAL)?;
        // Charged first, with no lock held (the dmem controller may allocate): beyond a
        // limit nothing is taken.
        let charge = self.limits.charge(size)?;
        self.alloc_charged(size, store, charge)
    }

    /// A chunk for a GPU page table: as [`Pmm::alloc`], charged to no cgroup or user. A table
    /// is shared by every mapping under it (a file's user VA space is the file's, the kernel
    /// VA space every file's) and lives as long as any of them: charging it to the process
    /// whose mapping made it would leave that process (and its cgroup) paying for others'
    /// mappings after it is gone. Tables are bounded by the mappings they hold, whose mems
    /// are charged.
    pub(crate) fn alloc_table(self: &Arc<Self>, size: u64) -> Result<VidChunk> {
        size_index(size).ok_or(EINVAL)?;
        self.alloc_charged(size, true, VidCharge::none())
    }

    fn alloc_charged(
        self: &Arc<Self>,
        size: u64,
        store: bool,
        charge: VidCharge,
    ) -> Result<VidChunk> {
        let mut charge = Some(charge);
        let mut spare = None;
        loop {
            if let Some(chunk) = self.try_alloc(size, store, &mut spare, &mut charge)? {
                // An unused spare is unmapped and freed here, with the lock released.
                drop(spare);
                return Ok(chunk);
            }
            spare = Some(self.new_store()?);
        }
    }

    /// [`Self::alloc`]'s try: `None` if the chunk's root needs storage and neither the kept
    /// list nor `spare` has any (the block is given back).
    fn try_alloc(
        self: &Arc<Self>,
        size: u64,
        store: bool,
        spare: &mut Option<RootStore>,
        charge: &mut Option<VidCharge>,
    ) -> Result<Option<VidChunk>> {
        let index = size_index(size).ok_or(EINVAL)?;
        // The charge goes with the chunk this try hands out, or back to the caller's next try.
        let taken = charge.take().ok_or(EINVAL)?;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if st.dead {
            return Err(ENODEV);
        }
        let phys = st.tree.alloc(size).ok_or(ENOMEM)?;
        let Some(root) = st.roots.get_mut(root_index(phys)) else {
            st.tree.free(phys, size);
            return Err(EINVAL);
        };
        if store && root.store.is_none() {
            let (new, reused) = match st.kept.pop() {
                Some(k) => (k.store, true),
                None => match spare.take() {
                    Some(s) => (s, false),
                    None => {
                        st.tree.free(phys, size);
                        *charge = Some(taken);
                        return Ok(None);
                    }
                },
            };
            root.store = Some(new);
            root.reused = reused;
        }
        // A chunk known to be zero is handed out as it is; else it is zeroed below.
        let pages = match root.store.as_mut() {
            Some(s) if store => {
                root.stored += 1;
                let zero = s.zero.take(phys, size);
                (!zero).then(|| s.pages.clone())
            }
            _ => None,
        };
        if let Some(n) = st.allocated.get_mut(index) {
            *n += 1;
        }
        drop(guard);
        let chunk = VidChunk {
            pmm: self.clone(),
            phys,
            size,
            stored: store,
            keep: false,
            unwritten: false,
            _charge: taken,
        };
        if let Some(pages) = pages {
            // Outside the lock: the chunk is no one else's yet, and its stored count keeps the
            // storage. A failure hands the chunk back (its drop).
            // CAST: both are at most 2 MiB.
            let (offset, len) = ((phys % CHUNK_MAX) as usize, size as usize);
            pages.bytes().zero(offset, len)?;
        }
        Ok(Some(chunk))
    }

    /// Storage for a root chunk: 2 MiB of pages (not zeroed: each chunk is, as it is handed
    /// out), DMA-mapped for the GPU.
    fn new_store(&self) -> Result<RootStore> {
        let flags = ChunkFlags {
            zero: false,
            fail_fast: false,
        };
        let audit = Counted::new(Class::VidmemRoots, 1);
        let pages = ChunkList::alloc(ROOT_ORDER, 1, flags, audit, || Ok(()))?;
        let table = GpuTable::new(
            self.dma.clone(),
            pages.clone(),
            self.limit,
            self.tracker.clone(),
            self.sim.clone(),
        )?;
        // Not zeroed: no slot is known to be zero.
        Ok(RootStore {
            table,
            pages,
            zero: ZeroSlots::default(),
        })
    }

    /// Takes a chunk back (from [`VidChunk`]'s drop): its range, the counts, and the root's
    /// storage if this was its last stored chunk: kept for reuse if the chunk's mem was made
    /// (or the storage was kept before) and there is room, else unmapped and freed under the
    /// lock. Its bytes stay until the range is handed out again, zeroed then unless it came back
    /// unwritten.
    fn free(&self, chunk: &VidChunk) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if !st.tree.free(chunk.phys, chunk.size) {
            // A chunk is made only from a range the tree handed out, and freed once.
            pr_err!(
                "PMM: vidmem chunk {:#x} of {} was not handed out\n",
                chunk.phys,
                chunk.size
            );
        }
        if let Some(n) = size_index(chunk.size).and_then(|i| st.allocated.get_mut(i)) {
            *n -= 1;
        }
        if let Some(r) = st.roots.get_mut(root_index(chunk.phys)) {
            if chunk.stored {
                if chunk.unwritten {
                    if let Some(s) = r.store.as_mut() {
                        s.zero.put_back(chunk.phys, chunk.size);
                    }
                }
                r.stored -= 1;
                if r.stored == 0 {
                    let reused = core::mem::take(&mut r.reused);
                    let room = st.kept.len() < st.kept.capacity();
                    let keep = !st.dead && room && (chunk.keep || reused);
                    match r.store.take() {
                        // Room was checked: nothing is refused.
                        Some(store) if keep => {
                            let _ = st.kept.push_within_capacity(Kept::new(store));
                        }
                        // Unmapped and freed here, under the lock.
                        other => drop(other),
                    }
                }
            }
        }
    }

    /// The DMA address at which the GPU's engine reaches vidmem address `phys`, if its root
    /// chunk has storage.
    pub(crate) fn engine_addr(&self, phys: u64) -> Result<u64> {
        let st = self.state.lock();
        if st.dead {
            return Err(ENODEV);
        }
        let root = st.roots.get(root_index(phys));
        let store = root.and_then(|r| r.store.as_ref()).ok_or(ENXIO)?;
        let base = store.table.addrs().next().ok_or(ENXIO)?;
        Ok(base + phys % CHUNK_MAX)
    }

    /// The storage that holds vidmem address `phys` (if its root chunk has storage), and
    /// `phys`'s byte offset in it.
    pub(crate) fn storage_of(&self, phys: u64) -> Result<(Arc<Pages>, usize)> {
        let st = self.state.lock();
        let root = st.roots.get(root_index(phys));
        let store = root.and_then(|r| r.store.as_ref()).ok_or(ENXIO)?;
        // CAST: below 2 MiB.
        Ok((store.pages.clone(), (phys % CHUNK_MAX) as usize))
    }

    /// The GPU is going: nothing more is handed out, and the storage of every root is dropped
    /// (unmapped while the device is still bound). Chunks still held stay valid to free.
    pub(crate) fn kill(&self) {
        self.limits.end();
        let mut st = self.state.lock();
        st.dead = true;
        st.kept.clear();
        for r in st.roots.iter_mut() {
            // Unmapped and freed here, under the lock (no allocation holds a guard now).
            drop(r.store.take());
        }
    }

    /// The PMM's counters now.
    pub(crate) fn stats(&self) -> PmmStats {
        let st = self.state.lock();
        let mut s = PmmStats {
            capacity: self.capacity,
            free: st.tree.avail(),
            allocated: st.allocated,
            roots: st.tree.roots() as u64,
            ..PmmStats::default()
        };
        for (i, r) in st.roots.iter().enumerate() {
            let (used, split) = st.tree.root_state(i);
            s.roots_used += u64::from(used);
            s.roots_split += u64::from(split);
            s.roots_stored += u64::from(r.store.is_some());
        }
        s
    }

    /// Free vidmem bytes.
    fn avail(&self) -> u64 {
        self.state.lock().tree.avail()
    }

    /// Gives back up to `roots` kept storages (memory pressure), if the lock is free: how many
    /// went. Each is unmapped and freed under the lock, like all storage.
    pub(crate) fn shrink(&self, roots: usize) -> usize {
        let Some(mut st) = self.state.try_lock() else {
            return 0;
        };
        let n = roots.min(st.kept.len());
        let left = st.kept.len() - n;
        st.kept.truncate(left);
        n
    }

    /// Gives back every kept storage (at unload), waiting for the lock.
    pub(crate) fn shrink_all(&self) {
        self.state.lock().kept.clear();
    }

    /// For the audit's walk: root chunks with storage, their DMA mappings, and the storages
    /// kept for reuse (in neither).
    pub(crate) fn walk(&self) -> (u64, u64, u64) {
        let st = self.state.lock();
        let stored = st.roots.iter().filter(|r| r.store.is_some()).count() as u64;
        let mapped = st
            .roots
            .iter()
            .filter_map(|r| r.store.as_ref())
            .map(|s| s.table.count() as u64)
            .sum();
        (stored, mapped, st.kept.len() as u64)
    }

    /// The PMM_CHECK_LEAK test: hands out chunks of `size` (without storage) until `limit` of
    /// them or until none is left, then gives them all back. Returns how many it got, and the
    /// free bytes before and after.
    pub(crate) fn check_leak(self: &Arc<Self>, size: u64, limit: u64) -> Result<(u64, u64, u64)> {
        let before = self.avail();
        let mut held = KVVec::new();
        while (held.len() as u64) < limit {
            match self.alloc(size, false) {
                Ok(c) => held.push(c, GFP_KERNEL)?,
                Err(e) if e == ENOMEM => break,
                Err(e) => return Err(e),
            }
            if kernel::current!().signal_pending() {
                return Err(EINTR);
            }
        }
        let got = held.len() as u64;
        drop(held);
        Ok((got, before, self.avail()))
    }
}

impl VidChunk {
    /// Its mem was made: when the chunk goes, its root's storage may be kept for reuse.
    pub(crate) fn keep_storage(&mut self) {
        self.keep = true;
    }

    /// Nothing wrote the chunk since it was handed out (zeroed): when it goes, its slot of
    /// storage is known to be zero and is not zeroed again. Said only by the chunk's mem, which
    /// knows every way to write it (see `mem::storage::VidPages`).
    pub(crate) fn unwritten(&mut self) {
        self.unwritten = true;
    }

    /// The chunk's vidmem (GPU physical) address.
    pub(crate) fn phys(&self) -> u64 {
        self.phys
    }
}

impl Drop for VidChunk {
    fn drop(&mut self) {
        self.pmm.free(self);
    }
}
