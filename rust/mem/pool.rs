// SPDX-License-Identifier: GPL-2.0

//! Memory pools: CUDA's `cudaMemPool_t` for ruvm's sysmem mems. A pool keeps the chunks of its
//! freed mems for reuse, still DMA-mapped for the GPUs of its access set, and gives them back
//! above its release threshold, on a trim, and under memory pressure (the shrinker).
//!
//! # What the cache holds
//!
//! A freed mem's chunks come back as they were: one list (in order), with the DMA tables of
//! the pool's GPUs still mapping it, and the mem's mmap offset range. An allocation of the same
//! number of chunks takes such a list whole (no page allocation, no DMA mapping, no offset
//! range to find); any other takes lists apart into chunks (their tables unmapped), uses as
//! many as it needs, and caches the rest as a list of its own. So chunks are reused whatever
//! the sizes, and a steady alloc/free of one size reuses the mappings too.
//!
//! # Accounting (CUDA's attributes)
//!
//! `used` is the bytes of the chunks lent to mems: from the allocation until the chunks are
//! back, which is when the mem's last holder (its handle, a user VMA) lets go. `reserved` is
//! `used` plus the cached bytes. The high watermarks follow both and are reset to the
//! current values. Hits and misses count chunks.
//!
//! # Stale data
//!
//! A pool belongs to one file and its chunks serve that file's mems only; what a pool gives
//! back goes to the page allocator, as a freed mem's chunks do. A reused chunk is zeroed when
//! the mem asks for zeroed memory (`RUVM_ALLOC_ZERO`); otherwise it holds what an earlier mem
//! of the same file left.
//!
//! # Locking
//!
//! A pool's mutex (the crate's lock order: under the pool registry, above the leaves) is held
//! for its bookkeeping only: chunks are allocated, zeroed and freed, and tables made and
//! dropped, outside it. The shrinker only tries the locks (reclaim may run under them).

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
    bind::{
        global::global,
        pages::{Chunk, ChunkFlags, ChunkList},
        shrinker::Shrink,
    },
    gpu::{
        dma::{GpuTable, Pages},
        pmm::VidChunk,
        GpuDev,
    },
};

use super::{
    offsets::MmapRange,
    policy::{self, Backing},
};

/// What one cache entry holds: a freed mem's chunks, their DMA tables for the pool's GPUs,
/// and the mem's mmap offset range (for the next mem of the same size, which then needs no
/// range of its own). Dropped: the tables go (unmapped), then the chunks and the range.
struct Entry {
    tables: KVec<(u32, Arc<GpuTable>)>,
    pages: Arc<Pages>,
    range: Option<MmapRange>,
    _chunks: Counted,
    _bytes: Counted,
}

impl Entry {
    fn new(
        pages: Arc<Pages>,
        tables: KVec<(u32, Arc<GpuTable>)>,
        range: Option<MmapRange>,
    ) -> Self {
        let n = pages.chunk_count() as u64;
        let bytes = pages.len() as u64;
        Self {
            tables,
            pages,
            range,
            _chunks: Counted::new(Class::PoolChunks, n),
            _bytes: Counted::new(Class::PoolBytes, bytes),
        }
    }

    fn bytes(&self) -> u64 {
        self.pages.len() as u64
    }
}

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
    pub(crate) access: u64,
}

/// A pool's state, under its lock.
struct PoolState {
    /// Oldest first.
    cache: Fifo<Entry>,
    /// Bytes of the cache's entries.
    cached: u64,
    /// Bytes taken out of the cache by an allocation still being made.
    inflight: u64,
    used: u64,
    used_high: u64,
    reserved_high: u64,
    threshold: u64,
    hits: u64,
    misses: u64,
    /// A vidmem pool's cached chunks (a flat free list; its room is kept at least the pool's
    /// reserved chunks, so that chunks coming back never need an allocation).
    vcache: KVVec<CachedVid>,
    /// Destroyed, or its file closed: chunks that come back are freed.
    closed: bool,
    /// A vidmem pool whose GPU went: chunks that come back are freed, none are handed out.
    dead: bool,
}

/// A vidmem chunk in a pool's cache, counted.
struct CachedVid {
    chunk: VidChunk,
    _chunks: Counted,
    _bytes: Counted,
}

impl CachedVid {
    fn new(chunk: VidChunk, bytes: u64) -> Self {
        Self {
            chunk,
            _chunks: Counted::new(Class::PoolChunks, 1),
            _bytes: Counted::new(Class::PoolBytes, bytes),
        }
    }
}

/// What one give-back takes out of a cache: a sysmem list or a vidmem chunk.
#[allow(
    dead_code,
    reason = "held only to be dropped, with the pool's lock released"
)]
enum Unit {
    Sys(Entry),
    Vid(CachedVid),
}

impl PoolState {
    fn reserved(&self) -> u64 {
        self.used + self.cached + self.inflight
    }

    fn note_highs(&mut self) {
        self.used_high = self.used_high.max(self.used);
        self.reserved_high = self.reserved_high.max(self.reserved());
    }

    fn take_entry(&mut self, i: usize) -> Option<Entry> {
        let e = self.cache.remove(i)?;
        self.cached -= e.bytes();
        Some(e)
    }

    /// Caches `e` as the newest entry; what could not be cached is returned, to be dropped
    /// once the lock is released.
    fn cache(&mut self, e: Entry) -> Option<Entry> {
        let bytes = e.bytes();
        let refused = self.cache.push_back(e);
        if refused.is_none() {
            self.cached += bytes;
        }
        refused
    }
}

/// A queue, oldest first, that also gives up its newest entry and any entry by position.
///
/// Taking the oldest leaves a hole at the front until more than half the slots are holes,
/// when they are squeezed out at once: emptying the queue from the front (a trim, the
/// shrinker) moves each entry at most about once, where removing the first element of a
/// vector each time moved all the others (quadratic in the number of cached lists).
///
/// # Invariants
///
/// The slots before `head` are `None`, those from `head` on are `Some`.
struct Fifo<T> {
    slots: KVec<Option<T>>,
    head: usize,
}

impl<T> Fifo<T> {
    const fn new() -> Self {
        Self {
            slots: KVec::new(),
            head: 0,
        }
    }

    fn len(&self) -> usize {
        self.slots.len() - self.head
    }

    /// Adds `t` as the newest; returns it if there was no room for it.
    fn push_back(&mut self, t: T) -> Option<T> {
        if self.slots.len() == self.slots.capacity() && self.head > 0 {
            self.squeeze();
        }
        if self.slots.reserve(1, GFP_KERNEL).is_err() {
            return Some(t);
        }
        // INVARIANT: a `Some` after the others. Room was reserved: this does not allocate.
        let _ = self.slots.push(Some(t), GFP_KERNEL);
        None
    }

    /// Takes the entry at position `i` (0: the oldest).
    fn remove(&mut self, i: usize) -> Option<T> {
        let at = self.head.checked_add(i)?;
        if i > 0 {
            // INVARIANT: the `Some`s after it move down one slot.
            return self.slots.remove(at).ok().flatten();
        }
        // INVARIANT: the slot at `head` becomes a hole before `head`.
        let t = self.slots.get_mut(at)?.take();
        self.head += 1;
        if self.head * 2 > self.slots.len() {
            self.squeeze();
        }
        t
    }

    /// Drops the holes at the front.
    fn squeeze(&mut self) {
        // INVARIANT: the holes are exactly the slots before `head`.
        self.slots.retain(|s| s.is_some());
        self.head = 0;
    }

    /// The position of the newest entry for which `f` is true.
    fn rposition(&self, mut f: impl FnMut(&T) -> bool) -> Option<usize> {
        let live = self.slots.get(self.head..)?;
        live.iter().rposition(|s| s.as_ref().is_some_and(&mut f))
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = &T> {
        self.slots.iter().flatten()
    }

    fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut T> {
        self.slots.iter_mut().flatten()
    }
}

/// A memory pool of sysmem chunks of one size, owned by a file.
#[pin_data]
pub(crate) struct Pool {
    id: u64,
    /// The process that made it (for the debugfs view).
    pid: i32,
    /// Sysmem chunks of `2^order` pages (`vid` is `None`), or vidmem chunks of that GPU.
    order: u32,
    vid: Option<Arc<GpuDev>>,
    chunk_size: u64,
    /// The GPUs the pool's mems are DMA-mapped for, as a bit mask by id.
    access: Atomic<u64>,
    /// The cached bytes as of the last change, for the shrinker's count (which must not wait
    /// for the lock).
    cached: Atomic<u64>,
    #[pin]
    state: Mutex<PoolState>,
    _audit: Counted,
}

/// What an allocation takes from a pool.
pub(crate) struct Taken {
    pub(crate) pages: Arc<Pages>,
    /// Tables of the pool's GPUs that still map `pages` (from the cache).
    pub(crate) tables: KVec<(u32, Arc<GpuTable>)>,
    /// The chunks from the cache come first: how many.
    pub(crate) reused: usize,
    /// The mmap offset range of the mem that freed `pages` (a list taken whole).
    pub(crate) range: Option<MmapRange>,
}

global! {
    /// Every live pool (for the shrinker, GPU removal and the audit's walk).
    static POOLS: Mutex<KVec<Arc<Pool>>> = KVec::new();
}

/// Makes the pool registry usable (module init).
pub(crate) fn init() {
    POOLS.init();
}

/// Lets go of the registry's memory at unload (every pool was closed with its file).
pub(crate) fn exit() {
    if let Some(mut pools) = POOLS.lock() {
        drop(core::mem::replace(&mut *pools, KVec::new()));
    }
}

/// A new sysmem pool with chunks of `page_size` bytes (uvm_mem's rules; 0 for the default)
/// and release threshold `threshold`.
pub(crate) fn create(page_size: u64, threshold: u64) -> Result<Arc<Pool>> {
    let page = kernel::page::PAGE_SIZE as u64;
    let layout =
        policy::layout(Backing::Sysmem, 1, page_size, page).map_err(super::policy_error)?;
    Pool::new(
        policy::chunk_order(layout.chunk_size, page),
        None,
        layout.chunk_size,
        threshold,
    )
}

/// A new pool of `gpu`'s vidmem, chunks of `page_size` bytes (uvm_mem's vidmem rules; 0 for
/// the default). `ENXIO` if the GPU has no vidmem.
pub(crate) fn create_vid(gpu: Arc<GpuDev>, page_size: u64, threshold: u64) -> Result<Arc<Pool>> {
    gpu.access()?.pmm().map_err(|_| ENXIO)?;
    let page = kernel::page::PAGE_SIZE as u64;
    let backing = Backing::Vidmem {
        gpu_page_sizes: gpu.page_sizes,
        numa: false,
    };
    // The default for a mem of one chunk's worth: the rules' size-independent choice.
    let layout = policy::layout(backing, 1, page_size, page).map_err(super::policy_error)?;
    Pool::new(0, Some(gpu), layout.chunk_size, threshold)
}

/// The cached bytes of every pool, as last published (the shrinker's count).
static CACHED: Atomic<u64> = Atomic::new(0);

/// A new pool handle, never 0 and never reused while the module is loaded.
fn new_id() -> u64 {
    static NEXT: Atomic<u64> = Atomic::new(1);
    NEXT.fetch_add(1, Relaxed)
}

impl Pool {
    /// A pool of sysmem chunks of `2^order` pages, or (with `vid`) of that GPU's vidmem chunks
    /// of `chunk_size` bytes, registered module-wide.
    pub(crate) fn new(
        order: u32,
        vid: Option<Arc<GpuDev>>,
        chunk_size: u64,
        threshold: u64,
    ) -> Result<Arc<Pool>> {
        let pool = Arc::pin_init(
            try_pin_init!(Pool {
                id: new_id(),
                pid: super::caller_pid(),
                order,
                vid,
                chunk_size,
                access: Atomic::new(0),
                cached: Atomic::new(0),
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
                    vcache: KVVec::new(),
                    closed: false,
                    dead: false,
                }),
                _audit: Counted::new(Class::Pools, 1),
            }),
            GFP_KERNEL,
        )?;
        POOLS.lock().ok_or(ENODEV)?.push(pool.clone(), GFP_KERNEL)?;
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

    /// The GPU of a vidmem pool.
    pub(crate) fn vid_gpu(&self) -> Option<&Arc<GpuDev>> {
        self.vid.as_ref()
    }

    /// The access set, as a bit mask by GPU id.
    pub(crate) fn access(&self) -> u64 {
        self.access.load(Relaxed)
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
            cached_chunks: st.cached.checked_div(self.chunk_size).unwrap_or(0),
            access: self.access(),
        }
    }

    /// Takes `count` chunks for a mem: a cached list of exactly `count` chunks whole (with its
    /// tables), else cached chunks first and new ones (zeroed with `zero`) for the rest.
    /// `stop` is asked before each new chunk. On failure the pool holds what it held (but for
    /// tables dropped to take lists apart), its attributes unchanged.
    pub(crate) fn take(
        &self,
        count: usize,
        zero: bool,
        mut stop: impl FnMut() -> Result,
    ) -> Result<Taken> {
        let bytes = (count as u64)
            .checked_mul(self.chunk_size)
            .ok_or(EOVERFLOW)?;
        let mut st = self.state.lock();
        if st.closed {
            return Err(ENOENT);
        }
        // An exact fit, newest first: taken whole, tables and all.
        let fit = st.cache.rposition(|e| e.pages.chunk_count() == count);
        if let Some(e) = fit.and_then(|i| st.take_entry(i)) {
            st.used += bytes;
            st.hits += count as u64;
            st.note_highs();
            self.publish(&st);
            drop(st);
            let Entry {
                tables,
                pages,
                range,
                ..
            } = e;
            return Ok(Taken {
                pages,
                tables,
                reused: count,
                range,
            });
        }
        // Else the newest lists, taken apart, until there are chunks enough.
        let mut n = 0;
        let mut have = 0;
        for e in st.cache.iter().rev() {
            if have >= count {
                break;
            }
            have += e.pages.chunk_count();
            n += 1;
        }
        // Everything the rest needs is allocated now, before the cache changes: a failure
        // from here on never loses a cached chunk to a failed allocation.
        let mut list = ChunkList::slot(count)?;
        let mut back = ChunkList::slot(have)?;
        let mut chunks: KVVec<Chunk> = KVVec::with_capacity(count.max(have), GFP_KERNEL)?;
        let mut lists = KVec::with_capacity(n, GFP_KERNEL)?;
        let mut held = 0;
        for _ in 0..n {
            let Some(e) = st.cache.len().checked_sub(1).and_then(|i| st.take_entry(i)) else {
                break;
            };
            held += e.bytes();
            // Room was reserved: this does not allocate.
            let _ = lists.push(e, GFP_KERNEL);
        }
        st.inflight += held;
        self.publish(&st);
        drop(st);
        for e in lists {
            let Entry { tables, pages, .. } = e;
            // Unmapped first: then nothing else holds the list. A list still held elsewhere
            // (a copy in flight) is not reused: its last holder frees it.
            drop(tables);
            ChunkList::take_chunks(pages, &mut chunks);
        }
        let apart = chunks.len();
        let reused = apart.min(count);
        let flags = ChunkFlags {
            zero,
            fail_fast: false,
        };
        let mut failed = None;
        while chunks.len() < count {
            if let Err(e) = stop().and_then(|()| {
                let c = Chunk::alloc(self.order, flags)?;
                // Room was reserved: this does not allocate.
                let _ = chunks.push(c, GFP_KERNEL);
                Ok(())
            }) {
                failed = Some(e);
                break;
            }
        }
        if failed.is_none() {
            while chunks.len() > count {
                if let Some(c) = chunks.pop() {
                    // Room for every chunk taken apart: cannot be refused.
                    let _ = back.push(c);
                }
            }
            for c in chunks.drain_all() {
                let _ = list.push(c);
            }
        } else {
            // The new chunks are freed; the cached ones go back, as one list.
            chunks.truncate(apart);
            for c in chunks.drain_all() {
                let _ = back.push(c);
            }
        }
        let order = self.order;
        let spare_tag = Counted::new(Class::SysmemChunks(order), back.len() as u64);
        let spare = back
            .finish(spare_tag)
            .map(|p| Entry::new(p, KVec::new(), None));
        let made = match failed {
            Some(e) => Err(e),
            None => {
                let tag = Counted::new(Class::SysmemChunks(order), count as u64);
                list.finish(tag).ok_or(EINVAL)
            }
        };
        let mut st = self.state.lock();
        st.inflight -= held;
        // The cache had room for the lists taken out of it: caching one back does not
        // allocate.
        let refused = match spare {
            Some(e) if !st.closed => st.cache(e),
            e => e,
        };
        let r = made.map(|pages| {
            st.used += bytes;
            st.hits += reused as u64;
            st.misses += (count - reused) as u64;
            st.note_highs();
            Taken {
                pages,
                tables: KVec::new(),
                reused,
                range: None,
            }
        });
        self.publish(&st);
        drop(st);
        drop(refused);
        r
    }

    /// Takes `count` vidmem chunks for a mem of the pool's GPU: cached ones first (zeroed
    /// again: vidmem is always zeroed), then new ones from the PMM (zeroed as they are handed
    /// out). `stop` is asked before each new chunk. `ENODEV` once the GPU went. On failure
    /// the pool is as it was.
    pub(crate) fn take_vid(
        &self,
        count: usize,
        mut stop: impl FnMut() -> Result,
    ) -> Result<(KVVec<VidChunk>, usize)> {
        let gpu = self.vid.as_ref().ok_or(EINVAL)?;
        let chunk = self.chunk_size;
        let bytes = (count as u64).checked_mul(chunk).ok_or(EOVERFLOW)?;
        let mut out = KVVec::with_capacity(count, GFP_KERNEL)?;
        let mut st = self.state.lock();
        if st.closed {
            return Err(ENOENT);
        }
        if st.dead {
            return Err(ENODEV);
        }
        // Room for every chunk of the pool once this mem's are back.
        let total = usize::try_from(st.reserved() / chunk)?
            .checked_add(count)
            .ok_or(EOVERFLOW)?;
        let more = total.saturating_sub(st.vcache.len());
        st.vcache.reserve(more, GFP_KERNEL)?;
        let reused = count.min(st.vcache.len());
        for _ in 0..reused {
            if let Some(v) = st.vcache.pop() {
                // Room was reserved: this does not allocate.
                let _ = out.push(v.chunk, GFP_KERNEL);
            }
        }
        st.cached -= reused as u64 * chunk;
        st.inflight += reused as u64 * chunk;
        drop(st);
        let r = (|| -> Result {
            // Held across the allocation: the GPU cannot be removed meanwhile.
            let access = gpu.access()?;
            let pmm = access.pmm().map_err(|_| ENXIO)?;
            for c in out.iter().take(reused) {
                let (pages, at) = pmm.storage_of(c.phys())?;
                let len = usize::try_from(chunk)?;
                let zeroed = pages.bytes().zero(at, len);
                zeroed?;
            }
            while out.len() < count {
                stop()?;
                let c = pmm.alloc(chunk, true)?;
                // Room was reserved: this does not allocate.
                let _ = out.push(c, GFP_KERNEL);
            }
            Ok(())
        })();
        let mut st = self.state.lock();
        st.inflight -= reused as u64 * chunk;
        if let Err(e) = r {
            // The new chunks go back to the PMM; the cached ones to the cache.
            out.truncate(reused);
            for c in out.drain_all() {
                // Room was reserved: this does not allocate (a chunk refused is freed).
                let _ = st.vcache.push(CachedVid::new(c, chunk), GFP_KERNEL);
                st.cached += chunk;
            }
            return Err(e);
        }
        st.used += bytes;
        st.hits += reused as u64;
        st.misses += (count - reused) as u64;
        st.note_highs();
        drop(st);
        Ok((out, reused))
    }

    /// A vidmem mem's chunks come back: cached (into the room kept for them), then what the
    /// cache holds above the release threshold is given back. Freed at once if the pool is
    /// closed or its GPU went.
    ///
    /// With `undo`, the chunks come from an allocation that failed after taking them, of
    /// which the first `undo` were cached: those are cached again, the new ones freed, and the
    /// hit and miss counts put back, so that the pool is as before the allocation.
    pub(crate) fn give_back_vid(&self, mut chunks: KVVec<VidChunk>, undo: Option<usize>) {
        let chunk = self.chunk_size;
        let mut st = self.state.lock();
        st.used = st.used.saturating_sub(chunks.len() as u64 * chunk);
        let mut refused = KVVec::new();
        if let Some(reused) = undo {
            st.hits = st.hits.saturating_sub(reused as u64);
            st.misses = st
                .misses
                .saturating_sub(chunks.len().saturating_sub(reused) as u64);
            // The new chunks go back to the PMM (outside the lock).
            while chunks.len() > reused {
                if let Some(c) = chunks.pop() {
                    let _ = refused.push(c, GFP_NOWAIT);
                }
            }
        }
        if st.closed || st.dead {
            for c in chunks {
                let _ = refused.push(c, GFP_NOWAIT);
            }
        } else {
            for c in chunks {
                // Room is kept (a chunk refused, not reached, is freed).
                if st.vcache.push(CachedVid::new(c, chunk), GFP_KERNEL).is_ok() {
                    st.cached += chunk;
                }
            }
        }
        drop(st);
        drop(refused);
        self.release(None);
    }

    /// The vidmem pool's GPU went: its cached chunks go back to the PMM now (before the
    /// PMM's storage does), and chunks coming back later are freed.
    fn kill(&self) {
        self.state.lock().dead = true;
        self.release(Some(0));
    }

    /// A mem's chunks come back (its last holder let go), with its tables for the pool's
    /// GPUs: cached, then whatever the cache holds above the release threshold is given back.
    ///
    /// With `undo`, the list comes from an allocation that failed after taking it, of which
    /// the first `undo` chunks were cached: the hit and miss counts are put back, and a list
    /// of new chunks only is freed rather than cached (one of cached and new chunks is cached
    /// whole: splitting it would need memory).
    pub(crate) fn give_back(
        &self,
        pages: Arc<Pages>,
        mut tables: KVec<(u32, Arc<GpuTable>)>,
        range: Option<MmapRange>,
        undo: Option<usize>,
    ) {
        let bytes = pages.len() as u64;
        if let Some(reused) = undo {
            let n = pages.chunk_count();
            let mut st = self.state.lock();
            st.hits = st.hits.saturating_sub(reused as u64);
            st.misses = st.misses.saturating_sub(n.saturating_sub(reused) as u64);
            if reused == 0 {
                st.used = st.used.saturating_sub(bytes);
                drop(st);
                drop(tables);
                drop(pages);
                return;
            }
        }
        let access = self.access();
        // The tables of GPUs no longer in the access set are dropped (unmapped) here.
        tables.retain(|(id, _)| access & 1u64.checked_shl(*id).unwrap_or(0) != 0);
        let entry = Entry::new(pages, tables, range);
        let mut st = self.state.lock();
        st.used = st.used.saturating_sub(bytes);
        let refused = if st.closed {
            Some(entry)
        } else {
            st.cache(entry)
        };
        self.publish(&st);
        // Whoever raises the reserved bytes or lowers the threshold later releases too.
        let over = st.reserved() > st.threshold;
        drop(st);
        drop(refused);
        if over {
            self.release(None);
        }
    }

    /// Notes the cached bytes for the shrinker's count, the pool's and every pool's.
    fn publish(&self, st: &PoolState) {
        if self.vid.is_some() {
            // Vidmem is not the system's memory: not the shrinker's.
            return;
        }
        let old = self.cached.xchg(st.cached, Relaxed);
        // Modulo 2^64: a decrease wraps back.
        CACHED.fetch_add(st.cached.wrapping_sub(old), Relaxed);
    }

    /// Gives back cache lists, oldest first, one at a time (each dropped with the lock
    /// released, so nothing is allocated to defer it), until at most `keep` bytes stay
    /// reserved (`None`: the release threshold) or the cache is empty. How many bytes went.
    fn release(&self, keep: Option<u64>) -> u64 {
        let mut bytes = 0;
        loop {
            let mut st = self.state.lock();
            let keep = keep.unwrap_or(st.threshold);
            if st.reserved() <= keep {
                return bytes;
            }
            let Some((unit, b)) = self.take_unit(&mut st) else {
                return bytes;
            };
            self.publish(&st);
            drop(st);
            bytes += b;
            drop(unit);
        }
    }

    /// The oldest sysmem list, or a vidmem chunk, out of the cache, and its bytes.
    fn take_unit(&self, st: &mut PoolState) -> Option<(Unit, u64)> {
        if let Some(v) = st.vcache.pop() {
            st.cached -= self.chunk_size;
            return Some((Unit::Vid(v), self.chunk_size));
        }
        let e = st.take_entry(0)?;
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
    pub(crate) fn set_access(&self, id: u32, on: bool) -> Result {
        let bit = 1u64.checked_shl(id).ok_or(EINVAL)?;
        let mut cur = self.access.load(Relaxed);
        loop {
            let new = if on { cur | bit } else { cur & !bit };
            match self.access.cmpxchg(cur, new, Relaxed) {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
        if !on {
            self.drop_tables(id);
        }
        Ok(())
    }

    /// Drops the cached tables of GPU `id`.
    fn drop_tables(&self, id: u32) {
        let mut gone = KVec::new();
        let mut st = self.state.lock();
        for e in st.cache.iter_mut() {
            while let Some(i) = e.tables.iter().position(|(g, _)| *g == id) {
                if let Ok(t) = e.tables.remove(i) {
                    // With no room to defer its drop, it is dropped here, under the lock (rare).
                    let _ = gone.push(t, GFP_KERNEL);
                }
            }
        }
        drop(st);
        drop(gone);
    }

    /// Destroys the pool, unless a chunk of it is lent to a mem (`EBUSY`): as [`Pool::close`].
    pub(crate) fn destroy(self: &Arc<Self>) -> Result {
        let st = self.state.lock();
        if st.used > 0 || st.inflight > 0 {
            return Err(EBUSY);
        }
        self.close_locked(st);
        Ok(())
    }

    /// Closes the pool (destroyed, or its file closed): the cache is given back now, chunks
    /// that come back later are freed; it leaves the registry.
    pub(crate) fn close(self: &Arc<Self>) {
        let st = self.state.lock();
        self.close_locked(st);
    }

    fn close_locked(self: &Arc<Self>, mut st: kernel::sync::MutexGuard<'_, PoolState>) {
        st.closed = true;
        drop(st);
        self.release(Some(0));
        if let Some(mut pools) = POOLS.lock() {
            if let Some(i) = pools.iter().position(|p| Arc::ptr_eq(p, self)) {
                let _ = pools.remove(i);
            }
        }
    }

    /// Takes the oldest cache list out, if the lock is free (the shrinker's scan).
    fn take_oldest(&self) -> Option<Entry> {
        if self.vid.is_some() {
            return None;
        }
        let mut st = self.state.try_lock()?;
        let e = st.take_entry(0)?;
        self.publish(&st);
        Some(e)
    }
}

/// GPU `id` is going: it leaves every pool's access set, and the cached tables of it are
/// dropped (before the GPU's removal waits for its tables).
pub(crate) fn drop_gpu(id: u32) {
    if let Some(pools) = POOLS.lock() {
        for pool in pools.iter() {
            let _ = pool.set_access(id, false);
            if pool.vid.as_ref().is_some_and(|g| g.id == id) {
                pool.kill();
            }
        }
    }
}

/// The pools' cache under memory pressure (registered by the module as its shrinker).
pub(crate) struct PoolShrink;

impl Shrink for PoolShrink {
    /// Cached pages of every pool, as last published (no lock).
    fn count() -> u64 {
        CACHED.load(Relaxed) / kernel::page::PAGE_SIZE as u64
    }

    /// Gives back cached lists, the oldest of the first pool with any, until `pages` pages
    /// went: how many did. Each list is taken out under the registry's and its pool's locks
    /// (only tried: another reclaimer may hold them) and dropped with both released, so that
    /// concurrent reclaimers are held up by bookkeeping only.
    fn scan(pages: u64) -> u64 {
        let page = kernel::page::PAGE_SIZE as u64;
        let mut freed = 0;
        while freed < pages {
            let entry = {
                let Some(pools) = POOLS.try_lock() else {
                    break;
                };
                pools.iter().find_map(|p| p.take_oldest())
            };
            let Some(e) = entry else {
                break;
            };
            freed += e.bytes() / page;
            drop(e);
        }
        freed
    }
}

/// Counts every pool and what its cache holds into `bump` (the audit's walk).
pub(crate) fn walk(mut bump: impl FnMut(Class, u64)) -> Result {
    let pools = POOLS.lock().ok_or(ENODEV)?;
    for pool in pools.iter() {
        bump(Class::Pools, 1);
        let st = pool.state.lock();
        bump(Class::PoolChunks, st.vcache.len() as u64);
        bump(Class::PoolBytes, st.vcache.len() as u64 * pool.chunk_size);
        for e in st.cache.iter() {
            let n = e.pages.chunk_count() as u64;
            bump(Class::PoolChunks, n);
            bump(Class::PoolBytes, e.bytes());
            bump(Class::SysmemChunks(e.pages.order()), n);
            for (_, t) in e.tables.iter() {
                bump(Class::DmaMappings, t.count() as u64);
                bump(Class::DmaBytes, t.count() as u64 * pool.chunk_size);
            }
        }
    }
    Ok(())
}

/// `/sys/kernel/debug/ruvm/pools`: one line per pool, its attributes in bytes (so that memory
/// a pool holds is seen at a glance, with the process it belongs to).
pub(crate) struct PoolsView;

impl kernel::debugfs::Writer for PoolsView {
    fn write(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let Some(pools) = POOLS.lock() else {
            return Ok(());
        };
        for p in pools.iter() {
            let a = p.attrs();
            writeln!(
                f,
                "pool={} pid={} chunk={} reserved={} used={} cached_chunks={} hits={} misses={} threshold={} access={:#x}",
                p.id,
                p.pid,
                p.chunk_size,
                a.reserved,
                a.used,
                a.cached_chunks,
                a.hits,
                a.misses,
                a.release_threshold,
                a.access
            )?;
        }
        Ok(())
    }
}
