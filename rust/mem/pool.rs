// SPDX-License-Identifier: GPL-2.0

//! Memory pools: CUDA's `cudaMemPool_t` for ruvm's mems. A pool keeps the chunks of its freed
//! mems for reuse (sysmem lists still DMA-mapped for the GPUs of its access set, or a GPU's
//! vidmem chunks), and gives them back above its release threshold, on a trim, and under
//! memory pressure (the shrinker).
//!
//! This file holds the pool itself: its attributes, its access set and the one rule of which
//! GPUs its cached chunks may stay mapped for ([`PoolState::keeps`]), and the give-backs. The
//! parts: [`fifo`] (the queue of cached lists), [`sys`] (the sysmem cache: take and give back
//! lists), [`vid`] (the vidmem cache), [`registry`] (every pool: GPU removal, the shrinker,
//! the audit's walk, the debugfs view).
//!
//! # Accounting (CUDA's attributes)
//!
//! `used` is the bytes of the chunks lent to mems: from the allocation until the chunks are
//! back, which is when the mem's last holder (its handle, a user VMA) lets go, or until a free
//! on a stream hands them to the pending list ([`pending`]). `reserved` is `used` plus the
//! pending and the cached bytes. The high watermarks follow both and are reset to the
//! current values. Hits and misses count chunks (a pending free reused counts as hits).
//!
//! # Bounds
//!
//! Everything a pool holds is charged to its file: its cached bytes count in the file's quota
//! (a mem's charge moves into the cache with its chunks, and out again with them), and its
//! memory (the pool, its queue, its registry entry) in the creating process's memory cgroup.
//!
//! # Stale data
//!
//! A pool belongs to one file and its chunks serve that file's mems only (an exportable pool's
//! mem is shared with its imports, [`crate::mem::share`], but its chunks are reused only once
//! none holds them); what a pool gives
//! back goes to the page allocator, as a freed mem's chunks do. A reused chunk is zeroed when
//! the mem asks for zeroed memory (`RUVM_ALLOC_ZERO`); otherwise it holds what an earlier mem
//! of the same file left.
//!
//! # Locking
//!
//! A pool's mutex (the crate's lock order: under the pool registry, above a mem's) is held for
//! its bookkeeping only: chunks are allocated, zeroed and freed, and tables made and dropped,
//! outside it. The shrinker only tries the locks (reclaim may run under them).

use kernel::{
    new_mutex,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc, Mutex,
    },
};

use crate::{
    audit::{Class, Counted},
    bind::lru::Anchor,
    gpu::{dma::GpuTable, set::GpuSet, GpuDev},
};

use super::{
    policy::{self, Backing},
    quota::Quota,
};

mod fifo;
pub(crate) mod pending;
pub(crate) mod registry;
pub(crate) mod sys;
pub(crate) mod vid;

use fifo::Fifo;
pub(crate) use sys::Taken;

/// The one rule for giving a sysmem chunk list a new owner, wherever that happens: into a
/// pool's cache ([`Pool::give_back`]) or pending list ([`Pool::give_back_tagged`]), to a later
/// ALLOC of the submission that frees its mem ([`crate::mem::Mem::borrowable`]), or to the
/// ALLOC that takes a freed mem whole ([`crate::mem::Mem::take_whole`]). Nothing but the list
/// may hold a page of it ([`ChunkList::held_elsewhere`](crate::bind::pages::ChunkList)): a
/// pipe that `vmsplice` filled from a user mapping of the old mem, an `O_DIRECT` read in
/// flight, a long-term pin. Whoever holds such a page keeps the bytes of that time; the chunks
/// then go back to the page allocator, never to another mem. Asked with no user mapping of
/// the chunks left, and none able to come (a new reference needs one).
pub(crate) fn may_pass_on(pages: &crate::gpu::dma::Pages) -> bool {
    !pages.held_elsewhere()
}

/// The most pools one open file may hold; `POOL_CREATE` beyond it is `ENOSPC`.
pub(crate) const MAX_FILE_POOLS: usize = crate::uapi::RUVM_MAX_FILE_POOLS as usize;

/// A pool's attributes (`RUVM_IOCTL_POOL_GET`).
#[derive(Clone, Copy, Default)]
pub(crate) struct Attrs {
    pub(crate) release_threshold: u64,
    pub(crate) reserved: u64,
    pub(crate) reserved_high: u64,
    pub(crate) used: u64,
    pub(crate) used_high: u64,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) cached_chunks: u64,
    pub(crate) access: GpuSet,
    /// Bytes pending a free ([`pending`]).
    pub(crate) pending: u64,
    /// The reuse policies that are on (`enum ruvm_pool_reuse`).
    pub(crate) reuse: u32,
}

/// A pool's state, under its lock.
struct PoolState {
    /// The sysmem cache: lists, oldest first.
    cache: Fifo<sys::Entry>,
    /// Bytes of the cache's entries (sysmem lists or vidmem chunks).
    cached: u64,
    /// Bytes taken out of the cache by an allocation still being made.
    inflight: u64,
    used: u64,
    used_high: u64,
    reserved_high: u64,
    threshold: u64,
    hits: u64,
    misses: u64,
    /// The GPUs the pool's mems are DMA-mapped for (a vidmem pool: its GPU).
    access: GpuSet,
    /// A vidmem pool's cached chunks (a flat free list; its room is kept at least the pool's
    /// reserved chunks, so that chunks coming back never need an allocation).
    vcache: KVVec<vid::CachedVid>,
    /// Sysmem lists freed on a stream, not yet observed ([`pending`]), and their bytes.
    pending: KVec<pending::Pending>,
    pending_bytes: u64,
    /// Room in `pending` kept for frees being submitted ([`pending::Promise`]).
    promised: usize,
    /// The reuse policies that are on (`enum ruvm_pool_reuse`).
    reuse: u32,
    /// A sysmem pool's place on the shrinker's list (its cached pages, for the count).
    anchor: Option<Anchor>,
    /// Destroyed, or its file closed: chunks that come back are freed.
    closed: bool,
    /// A vidmem pool whose GPU went: chunks that come back are freed, none are handed out.
    dead: bool,
    /// Its count in the audit's pools, until it is closed (and leaves the registry the audit
    /// walks), though an exported descriptor or another file's import may hold it longer.
    counted: Option<Counted>,
}

impl PoolState {
    fn reserved(&self) -> u64 {
        self.used + self.cached + self.inflight + self.pending_bytes
    }

    fn note_highs(&mut self) {
        self.used_high = self.used_high.max(self.used);
        self.reserved_high = self.reserved_high.max(self.reserved());
    }

    /// Whether the cache may keep `table`, of GPU `id`, with the chunks it maps: the one rule
    /// for which GPUs a pool's chunks stay mapped for right now. The GPU is in the access set
    /// (both read under the pool's lock, which revoking it takes), and its removal has not
    /// begun (see [`GpuTable::keepable`]: the removal visits every pool under this lock after
    /// marking the GPU).
    fn keeps(&self, id: u32, table: &GpuTable) -> bool {
        self.access.contains(id) && table.keepable()
    }

    /// Takes out of `tables` those the cache may not keep, into `gone` (to be dropped, that
    /// is unmapped, once the lock is released; a table with no room there is dropped here).
    fn sort_tables(&self, tables: &mut KVec<(u32, Arc<GpuTable>)>, gone: &mut KVec<Arc<GpuTable>>) {
        let mut i = 0;
        while i < tables.len() {
            match tables.get(i) {
                Some((id, t)) if !self.keeps(*id, t) => {
                    if let Ok((_, t)) = tables.remove(i) {
                        let _ = gone.push(t, GFP_KERNEL);
                    }
                }
                _ => i += 1,
            }
        }
    }

    /// Applies [`Self::keeps`] to every cached list's tables (after the access set shrank or
    /// a GPU's removal began); what goes is returned, to be dropped with the lock released.
    fn prune(&mut self) -> KVec<Arc<GpuTable>> {
        let mut gone = KVec::new();
        let access = self.access;
        for e in self.cache.iter_mut() {
            let mut tables = core::mem::replace(&mut e.tables, KVec::new());
            tables.retain(|(id, t)| {
                access.contains(*id) && t.keepable() || {
                    let _ = gone.push(t.clone(), GFP_KERNEL);
                    false
                }
            });
            e.tables = tables;
        }
        for p in self.pending.iter_mut() {
            let mut tables = core::mem::replace(&mut p.tables, KVec::new());
            tables.retain(|(id, t)| {
                access.contains(*id) && t.keepable() || {
                    let _ = gone.push(t.clone(), GFP_KERNEL);
                    false
                }
            });
            p.tables = tables;
        }
        gone
    }
}

/// What one give-back takes out of a cache: a sysmem list or a vidmem chunk.
#[allow(
    dead_code,
    reason = "held only to be dropped, with the pool's lock released"
)]
enum Unit {
    Sys(sys::Entry),
    Vid(vid::CachedVid),
}

/// A memory pool of sysmem chunks of one size, or of one GPU's vidmem chunks, owned by a file.
#[pin_data]
pub(crate) struct Pool {
    id: u64,
    /// The process that made it (for the debugfs view).
    pid: i32,
    /// Sysmem chunks of `2^order` pages (`vid` is `None`), or vidmem chunks of that GPU.
    order: u32,
    vid: Option<Arc<GpuDev>>,
    chunk_size: u64,
    /// The file's quota, which the cache's bytes count in.
    quota: Arc<Quota>,
    /// The access set as of its last change, for readers that do not take the lock (a free
    /// sorting its tables early; the lock's copy decides).
    access: Atomic<u64>,
    /// Made with `RUVM_POOL_EXPORTABLE`: it and its mems may be shared with other files
    /// ([`crate::mem::share`]).
    exportable: bool,
    #[pin]
    state: Mutex<PoolState>,
}

/// A new sysmem pool of a file with quota `quota`, chunks of `page_size` bytes (uvm_mem's
/// rules; 0 for the default) and release threshold `threshold`; `exportable`: it may be shared
/// with other files.
pub(crate) fn create(
    quota: &Arc<Quota>,
    page_size: u64,
    threshold: u64,
    exportable: bool,
) -> Result<Arc<Pool>> {
    let page = kernel::page::PAGE_SIZE as u64;
    let layout =
        policy::layout(Backing::Sysmem, 1, page_size, page).map_err(super::policy_error)?;
    Pool::new(
        quota,
        policy::chunk_order(layout.chunk_size, page),
        None,
        layout.chunk_size,
        (threshold, exportable),
    )
}

/// A new pool of `gpu`'s vidmem, chunks of `page_size` bytes (uvm_mem's vidmem rules; 0 for
/// the default). `ENXIO` if the GPU has no vidmem.
pub(crate) fn create_vid(
    quota: &Arc<Quota>,
    gpu: Arc<GpuDev>,
    page_size: u64,
    threshold: u64,
) -> Result<Arc<Pool>> {
    gpu.access()?.pmm().map_err(|_| ENXIO)?;
    let page = kernel::page::PAGE_SIZE as u64;
    let backing = Backing::Vidmem {
        gpu_page_sizes: gpu.page_sizes,
        numa: false,
    };
    // The default for a mem of one chunk's worth: the rules' size-independent choice.
    let layout = policy::layout(backing, 1, page_size, page).map_err(super::policy_error)?;
    Pool::new(quota, 0, Some(gpu), layout.chunk_size, (threshold, false))
}

/// A new pool handle, never 0 and never reused while the module is loaded.
fn new_id() -> u64 {
    static NEXT: Atomic<u64> = Atomic::new(1);
    NEXT.fetch_add(1, Relaxed)
}

impl Pool {
    /// A pool of sysmem chunks of `2^order` pages, or (with `vid`) of that GPU's vidmem chunks
    /// of `chunk_size` bytes, registered module-wide. Charged to the caller's memory cgroup.
    fn new(
        quota: &Arc<Quota>,
        order: u32,
        vid: Option<Arc<GpuDev>>,
        chunk_size: u64,
        (threshold, exportable): (u64, bool),
    ) -> Result<Arc<Pool>> {
        // A vidmem pool's access set is its GPU (no peer access).
        let initial = vid.as_ref().map_or(GpuSet::EMPTY, |g| GpuSet::of(g.id));
        let pool = Arc::pin_init(
            try_pin_init!(Pool {
                id: new_id(),
                pid: super::caller_pid(),
                order,
                vid,
                chunk_size,
                quota: quota.clone(),
                access: Atomic::new(initial.bits()),
                exportable,
                state <- new_mutex!(PoolState {
                    cache: Fifo::new(),
                    cached: 0,
                    inflight: 0,
                    used: 0,
                    used_high: 0,
                    reserved_high: 0,
                    threshold,
                    hits: 0,
                    misses: 0,
                    access: initial,
                    vcache: KVVec::new(),
                    pending: KVec::new(),
                    pending_bytes: 0,
                    promised: 0,
                    reuse: pending::ALL_POLICIES,
                    anchor: None,
                    closed: false,
                    dead: false,
                    counted: Some(Counted::new(Class::Pools, 1)),
                }),
            }),
            GFP_KERNEL_ACCOUNT,
        )?;
        if pool.vid.is_none() {
            // Vidmem is not the system's memory: not the shrinker's.
            let anchor = registry::anchor(pool.id)?;
            pool.state.lock().anchor = Some(anchor);
        }
        registry::insert(&pool)?;
        Ok(pool)
    }

    /// The pool's handle.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Bytes per chunk.
    pub(crate) fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// The quota of the pool's file, which its cached bytes count in.
    pub(crate) fn quota(&self) -> &Arc<Quota> {
        &self.quota
    }

    /// Whether the file of quota `id` made the pool (its own pool, where another file's is
    /// an import): the one rule for which file may change, close or export a pool.
    pub(crate) fn made_by(&self, id: u64) -> bool {
        self.quota.id() == id
    }

    /// The GPU of a vidmem pool.
    pub(crate) fn vid_gpu(&self) -> Option<&Arc<GpuDev>> {
        self.vid.as_ref()
    }

    /// Whether it was made exportable.
    pub(crate) fn exportable(&self) -> bool {
        self.exportable
    }

    /// Whether it was destroyed, or its file closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// The access set as of its last change (the pool's lock decides what is kept).
    pub(crate) fn access(&self) -> GpuSet {
        GpuSet::from_bits(self.access.load(Relaxed))
    }

    /// The attributes now.
    pub(crate) fn attrs(&self) -> Attrs {
        let st = self.state.lock();
        Attrs {
            release_threshold: st.threshold,
            reserved: st.reserved(),
            reserved_high: st.reserved_high,
            used: st.used,
            used_high: st.used_high,
            hits: st.hits,
            misses: st.misses,
            // Chunks an allocation under way took out of the cache count as cached until it
            // ends, so that `reserved == used + cached_chunks * chunk_size` holds at all times,
            // as ruvm.rst promises.
            cached_chunks: (st.cached + st.inflight)
                .checked_div(self.chunk_size)
                .unwrap_or(0),
            access: st.access,
            pending: st.pending_bytes,
            reuse: st.reuse,
        }
    }

    /// Notes the cached pages for the shrinker (under the pool's lock, so that the anchor's
    /// changes come in order).
    fn publish(&self, st: &PoolState) {
        if let Some(a) = &st.anchor {
            a.set_pages(st.cached / kernel::page::PAGE_SIZE as u64);
        }
    }

    /// Gives back cache lists, oldest first, one at a time (each dropped with the lock
    /// released, so nothing is allocated to defer it), until at most `keep` bytes stay
    /// reserved (`None`: the release threshold) or the cache is empty. How many bytes went.
    ///
    /// A list whose chunks a freed mem still pins (see [`crate::bind::pages::ChunkList::pin`])
    /// stays, with its quota charge, until that mem is gone; but for a closing pool, which
    /// gives back everything.
    fn release(&self, keep: Option<u64>) -> u64 {
        let mut bytes = 0;
        loop {
            let mut st = self.state.lock();
            let keep = keep.unwrap_or(st.threshold);
            if st.reserved() <= keep {
                self.fit_vcache(&mut st);
                return bytes;
            }
            let all = st.closed || st.dead;
            let Some((unit, b)) = self.take_unit(&mut st, all) else {
                self.fit_vcache(&mut st);
                return bytes;
            };
            self.publish(&st);
            drop(st);
            bytes += b;
            drop(unit);
        }
    }

    /// The oldest sysmem list (not pinned, unless `all`), or a vidmem chunk, out of the cache,
    /// and its bytes.
    fn take_unit(&self, st: &mut PoolState, all: bool) -> Option<(Unit, u64)> {
        if let Some(v) = st.vcache.pop() {
            st.cached -= self.chunk_size;
            return Some((Unit::Vid(v), self.chunk_size));
        }
        let i = st.cache.iter().position(|e| all || !e.pinned())?;
        let e = st.take_entry(i)?;
        let b = e.bytes();
        Some((Unit::Sys(e), b))
    }

    /// `cudaMemPoolTrimTo`: gives back cached chunks until at most `keep` bytes stay
    /// reserved; how many bytes went.
    pub(crate) fn trim(&self, keep: u64) -> u64 {
        self.release(Some(keep))
    }

    /// Sets the release threshold, giving back at once what the cache holds above it.
    pub(crate) fn set_threshold(&self, threshold: u64) {
        self.state.lock().threshold = threshold;
        self.release(None);
    }

    /// A mem of a stream allocation takes `count` chunks a free earlier in its submission gives
    /// up (see `Mem::free_ordered`): counted hits; they stay counted used, the freed mem's
    /// bytes becoming the new one's. `undo`: the allocation failed, the free did not happen.
    pub(crate) fn borrowed(&self, count: usize, undo: bool) {
        let mut st = self.state.lock();
        if undo {
            st.hits = st.hits.saturating_sub(count as u64);
        } else {
            st.hits += count as u64;
        }
    }

    /// A lent mem's `bytes` are let go without coming back (freed with the mem).
    pub(crate) fn forget(&self, bytes: u64) {
        let mut st = self.state.lock();
        st.used = st.used.saturating_sub(bytes);
    }

    /// Resets the reserved (`reserved`) or used high watermark to the current value.
    pub(crate) fn reset_high(&self, reserved: bool) {
        let mut st = self.state.lock();
        if reserved {
            st.reserved_high = st.reserved();
        } else {
            st.used_high = st.used;
        }
    }

    /// Puts GPU `id` in the access set, or takes it out (dropping the cached tables of it).
    /// `ENODEV` for an id no set can hold.
    pub(crate) fn set_access(&self, id: u32, on: bool) -> Result {
        let mut st = self.state.lock();
        st.access = if on {
            st.access.with(id).ok_or(ENODEV)?
        } else {
            st.access.without(id)
        };
        self.access.store(st.access.bits(), Relaxed);
        let gone = if on { KVec::new() } else { st.prune() };
        drop(st);
        drop(gone);
        Ok(())
    }

    /// GPU `id` is going: it leaves the access set and the cached tables of it go (the GPU is
    /// marked, so none can be cached again); a vidmem pool of it gives its cache back to the
    /// PMM now (before the PMM's storage goes), and frees chunks that come back later.
    fn drop_gpu(&self, id: u32) {
        let mut st = self.state.lock();
        st.access = st.access.without(id);
        self.access.store(st.access.bits(), Relaxed);
        let gone = st.prune();
        let vid_of_it = self.vid.as_ref().is_some_and(|g| g.id == id);
        if vid_of_it {
            st.dead = true;
        }
        drop(st);
        drop(gone);
        if vid_of_it {
            self.release(Some(0));
        }
    }

    /// Marks the pool destroyed, unless a chunk of it is lent to a mem (`EBUSY`), or it was
    /// destroyed already (`ENOENT`): from now on it hands out nothing. The caller then takes
    /// its handle out and gives its cache back ([`Pool::close`]), with no lock held.
    pub(crate) fn begin_destroy(&self) -> Result {
        let mut st = self.state.lock();
        if st.closed {
            return Err(ENOENT);
        }
        if st.used > 0 || st.inflight > 0 {
            return Err(EBUSY);
        }
        st.closed = true;
        Ok(())
    }

    /// Closes the pool (destroyed, or its file closed): the cache is given back now, chunks
    /// that come back later are freed; it leaves the registry.
    pub(crate) fn close(self: &Arc<Self>) {
        let (pending, counted) = {
            let mut st = self.state.lock();
            st.closed = true;
            let p = Self::drain_pending(&mut st);
            self.publish(&st);
            (p, st.counted.take())
        };
        drop(pending);
        self.release(Some(0));
        registry::remove(self);
        drop(counted);
    }
}
