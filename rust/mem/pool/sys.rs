// SPDX-License-Identifier: GPL-2.0

//! A sysmem pool's cache: freed mems' chunk lists, with their DMA tables for the pool's GPUs.
//!
//! A freed mem's chunks come back as they were: one list (in order), with the DMA tables the
//! pool keeps ([`PoolState::keeps`]), the mem's mmap offset range and its quota charge. An
//! allocation of the same number of chunks takes such a list whole (no page allocation, no DMA
//! mapping, no offset range to find); any other takes lists apart into chunks (their tables
//! unmapped), uses as many as it needs, and caches the rest as a list of its own. So chunks
//! are reused whatever the sizes, and a steady alloc/free of one size reuses the mappings too.

use kernel::{prelude::*, sync::Arc};

use crate::{
    audit::{Class, Counted},
    bind::pages::{Chunk, ChunkFlags, ChunkList, Patience},
    gpu::dma::{GpuTable, Pages},
};

use super::{
    super::{offsets::MmapRange, quota::Charge},
    Pool, PoolState,
};

/// What one cache entry holds: a freed mem's chunks, their DMA tables for the pool's GPUs,
/// the mem's mmap offset range (for the next mem of the same size, which then needs no range
/// of its own), and the quota charge of its bytes. Dropped: the tables go (unmapped), then the
/// chunks, the range and the charge.
pub(super) struct Entry {
    pub(super) tables: KVec<(u32, Arc<GpuTable>)>,
    pages: Arc<Pages>,
    range: Option<MmapRange>,
    charge: Charge,
    _chunks: Counted,
    _bytes: Counted,
}

impl Entry {
    pub(super) fn new(
        pages: Arc<Pages>,
        tables: KVec<(u32, Arc<GpuTable>)>,
        range: Option<MmapRange>,
        charge: Charge,
    ) -> Self {
        let n = pages.chunk_count() as u64;
        let bytes = pages.len() as u64;
        Self {
            tables,
            pages,
            range,
            charge,
            _chunks: Counted::new(Class::PoolChunks, n),
            _bytes: Counted::new(Class::PoolBytes, bytes),
        }
    }

    pub(super) fn bytes(&self) -> u64 {
        self.pages.len() as u64
    }

    /// Whether a freed mem still pins its chunks (it is not to be given back yet).
    pub(super) fn pinned(&self) -> bool {
        self.pages.pinned()
    }

    /// Counts the entry into `bump` (the audit's walk).
    pub(super) fn walk(&self, chunk_size: u64, bump: &mut impl FnMut(Class, u64)) {
        let n = self.pages.chunk_count() as u64;
        bump(Class::PoolChunks, n);
        bump(Class::PoolBytes, self.bytes());
        bump(Class::SysmemChunks(self.pages.order()), n);
        for (_, t) in self.tables.iter() {
            bump(Class::DmaMappings, t.count() as u64);
            bump(Class::DmaBytes, t.count() as u64 * chunk_size);
        }
    }
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
    /// The quota charge of `pages`' bytes: moved out of the cache for the reused chunks,
    /// charged anew for the others.
    pub(crate) charge: Charge,
}

impl PoolState {
    pub(super) fn take_entry(&mut self, i: usize) -> Option<Entry> {
        let e = self.cache.remove(i)?;
        self.cached -= e.bytes();
        Some(e)
    }

    /// Caches `e` as the newest entry; what could not be cached is returned, to be dropped
    /// once the lock is released.
    pub(super) fn cache(&mut self, e: Entry) -> Option<Entry> {
        let bytes = e.bytes();
        let refused = self.cache.push_back(e);
        if refused.is_none() {
            self.cached += bytes;
        }
        refused
    }
}

impl Pool {
    /// Puts back the hit and miss counts of an allocation that failed after taking `pages`, of
    /// which the first `reused` chunks were cached. Returns whether the list is all new
    /// chunks, then let go (no longer counted used), not to be cached.
    pub(super) fn undo_counts(&self, pages: &Pages, reused: usize) -> bool {
        let n = pages.chunk_count();
        let mut st = self.state.lock();
        st.hits = st.hits.saturating_sub(reused as u64);
        st.misses = st.misses.saturating_sub(n.saturating_sub(reused) as u64);
        if reused == 0 {
            st.used = st.used.saturating_sub(pages.len() as u64);
            return true;
        }
        false
    }

    /// Takes `count` chunks for a mem: a cached list of exactly `count` chunks whole (with the
    /// tables the pool may keep), else cached chunks first and new ones (always zeroed: fresh
    /// pages may hold another file's bytes) for the rest, charged to the file's quota first
    /// (`ENOSPC`). `stop` is asked before each new chunk. On failure the pool holds what it held
    /// (but for tables dropped to take lists apart), its attributes unchanged; `ENOENT` if the
    /// pool was destroyed meanwhile.
    pub(crate) fn take(&self, count: usize, mut stop: impl FnMut() -> Result) -> Result<Taken> {
        let bytes = (count as u64)
            .checked_mul(self.chunk_size)
            .ok_or(EOVERFLOW)?;
        let mut st = self.state.lock();
        if st.closed {
            return Err(ENOENT);
        }
        // An exact fit, newest first: taken whole, with the tables the pool may keep.
        let fit = st.cache.rposition(|e| e.pages.chunk_count() == count);
        if let Some(mut e) = fit.and_then(|i| st.take_entry(i)) {
            let mut gone = KVec::new();
            st.sort_tables(&mut e.tables, &mut gone);
            st.used += bytes;
            st.hits += count as u64;
            st.note_highs();
            self.publish(&st);
            drop(st);
            drop(gone);
            let Entry {
                tables,
                pages,
                range,
                charge,
                ..
            } = e;
            return Ok(Taken {
                pages,
                tables,
                reused: count,
                range,
                charge,
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
        // Everything the rest needs is allocated now, before the cache changes (a failure from
        // here on never loses a cached chunk to a failed allocation), and with the lock
        // released (a reclaim this allocation triggers may then take this pool's cache). So is
        // the charge of the chunks the cache cannot give.
        drop(st);
        let fresh = (count.saturating_sub(have) as u64) * self.chunk_size;
        let mut charge = self.quota.charge(fresh)?;
        let mut list = ChunkList::slot(count)?;
        let mut back = ChunkList::slot(have)?;
        let mut chunks: KVVec<Chunk> = KVVec::with_capacity(count.max(have), GFP_KERNEL_ACCOUNT)?;
        let mut lists = KVec::with_capacity(n, GFP_KERNEL)?;
        let mut st = self.state.lock();
        if st.closed {
            return Err(ENOENT);
        }
        // The cache may have changed meanwhile: lists are taken, newest first, only as far as
        // the room made for them goes (fewer chunks than counted are made up with new ones).
        let mut held = 0;
        let mut apart_room = have;
        while lists.len() < n {
            let fits = st
                .cache
                .iter()
                .next_back()
                .is_some_and(|e| e.pages.chunk_count() <= apart_room && !e.pinned());
            let taken = fits
                .then(|| st.cache.len().checked_sub(1))
                .flatten()
                .and_then(|i| st.take_entry(i));
            let Some(e) = taken else {
                break;
            };
            apart_room -= e.pages.chunk_count();
            held += e.bytes();
            // Room was reserved: this does not allocate.
            let _ = lists.push(e, GFP_KERNEL);
        }
        st.inflight += held;
        self.publish(&st);
        drop(st);
        let mut cached_charge = self.quota.nothing();
        for e in lists {
            let Entry {
                tables,
                pages,
                charge,
                ..
            } = e;
            // Unmapped first: then nothing else holds the list. A list still held elsewhere
            // (a copy in flight) is not reused: its last holder frees it.
            drop(tables);
            let before = chunks.len();
            ChunkList::take_chunks(pages, &mut chunks);
            let mut charge = charge;
            cached_charge.merge(charge.split((chunks.len() - before) as u64 * self.chunk_size));
        }
        let apart = chunks.len();
        let reused = apart.min(count);
        // A list held elsewhere left chunks short: charged now, or the allocation fails.
        let short = (count - reused) as u64 * self.chunk_size;
        let topped = short
            .checked_sub(charge.bytes())
            .filter(|&b| b > 0)
            .map(|b| self.quota.charge(b));
        let flags = ChunkFlags {
            zero: true,
            fail_fast: false,
        };
        let mut failed = match topped {
            Some(Err(e)) => Some(e),
            Some(Ok(c)) => {
                charge.merge(c);
                None
            }
            None => None,
        };
        let mut patience = Patience::new();
        while failed.is_none() && chunks.len() < count {
            if let Err(e) = stop().and_then(|()| {
                let c = patience.chunk(self.order, flags)?;
                // Room was reserved: this does not allocate.
                let _ = chunks.push(c, GFP_KERNEL);
                Ok(())
            }) {
                failed = Some(e);
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
        let spare_charge = match failed {
            Some(_) => core::mem::replace(&mut cached_charge, self.quota.nothing()),
            None => cached_charge.split((back.len() as u64) * self.chunk_size),
        };
        let spare = back
            .finish(spare_tag)
            .map(|p| Entry::new(p, KVec::new(), None, spare_charge));
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
        // Destroyed meanwhile (a destroy that found nothing lent out): the mem is not made,
        // its new list freed with the lock released.
        let mut late = None;
        let r = match made {
            Ok(pages) if st.closed => {
                late = Some(pages);
                Err(ENOENT)
            }
            Ok(pages) => {
                st.used += bytes;
                st.hits += reused as u64;
                st.misses += (count - reused) as u64;
                st.note_highs();
                charge.merge(cached_charge);
                Ok(Taken {
                    pages,
                    tables: KVec::new(),
                    reused,
                    range: None,
                    charge,
                })
            }
            Err(e) => Err(e),
        };
        self.publish(&st);
        drop(st);
        drop(refused);
        drop(late);
        r
    }

    /// A mem's chunks come back (its last holder let go), with its tables and its quota
    /// charge: cached with the tables the pool may keep ([`PoolState::keeps`], decided under
    /// the pool's lock), then whatever the cache holds above the release threshold is given
    /// back.
    ///
    /// With `undo`, the list comes from an allocation that failed after taking it, of which
    /// the first `undo` chunks were cached: the hit and miss counts are put back, and a list
    /// of new chunks only is freed rather than cached (one of cached and new chunks is cached
    /// whole: splitting it would need memory).
    ///
    /// (A list that waits for points of streams goes back through
    /// [`Pool::give_back_tagged`].)
    pub(crate) fn give_back(
        &self,
        pages: Arc<Pages>,
        mut tables: KVec<(u32, Arc<GpuTable>)>,
        (range, undo): (Option<MmapRange>, Option<usize>),
        charge: Charge,
    ) {
        let bytes = pages.len() as u64;
        if let Some(reused) = undo {
            if self.undo_counts(&pages, reused) {
                drop(tables);
                drop(pages);
                return;
            }
        }
        // Chunks someone still holds a page of (a pin through a user mapping made before the
        // free) are never handed to another mem: not cached, given back. Read before the lock
        // (a walk of every page); no new pin can come, no mapping of them is left. This and
        // `give_back_tagged` are the ways into the cache (a list taken apart puts back only
        // chunks that came from it).
        let held = !super::may_pass_on(&pages);
        // The tables the pool may not keep, dropped outside its lock (rare: room for them is
        // made only then).
        let mut gone = KVec::new();
        let mut st = self.state.lock();
        st.sort_tables(&mut tables, &mut gone);
        let entry = Entry::new(pages, tables, range, charge);
        st.used = st.used.saturating_sub(bytes);
        let refused = if st.closed || held {
            Some(entry)
        } else {
            st.cache(entry)
        };
        self.publish(&st);
        // Whoever raises the reserved bytes or lowers the threshold later releases too.
        let over = st.reserved() > st.threshold;
        drop(st);
        drop(gone);
        drop(refused);
        if over {
            self.release(None);
        }
    }

    /// Takes the oldest cache list out, if the lock is free (the shrinker's scan).
    pub(super) fn take_oldest(&self) -> Option<Entry> {
        if self.vid.is_some() {
            return None;
        }
        let mut st = self.state.try_lock()?;
        let i = st.cache.iter().position(|e| !e.pinned())?;
        let e = st.take_entry(i)?;
        self.publish(&st);
        Some(e)
    }
}
