// SPDX-License-Identifier: GPL-2.0

//! A vidmem pool's cache: its GPU's vidmem chunks, one flat free list (vidmem chunks are not
//! DMA-mapped, and any of them fits any allocation of the pool).
//!
//! Chunks coming back must never need an allocation (a free cannot fail), so the list's room
//! is kept at least the pool's reserved chunks: grown, charged to the caller's memory cgroup,
//! only once an allocation has its chunks (never for a request the GPU cannot hold), and shrunk
//! again when the pool gives chunks back.

use kernel::prelude::*;

use crate::{
    audit::{Class, Counted},
    gpu::pmm::VidChunk,
};

use super::{super::quota::Charge, Pool, PoolState};

/// A vidmem chunk in a pool's cache, counted, with its quota charge.
pub(crate) struct CachedVid {
    chunk: VidChunk,
    _charge: Charge,
    _chunks: Counted,
    _bytes: Counted,
}

impl CachedVid {
    fn new(chunk: VidChunk, bytes: u64, charge: Charge) -> Self {
        Self {
            chunk,
            _charge: charge,
            _chunks: Counted::new(Class::PoolChunks, 1),
            _bytes: Counted::new(Class::PoolBytes, bytes),
        }
    }
}

impl PoolState {
    /// Caches `chunks` (into the room kept), each with its share of `charge`, unless the pool
    /// is closed or its GPU went: then they are returned, to be freed with the lock released.
    fn cache_vid(
        &mut self,
        chunks: impl Iterator<Item = VidChunk>,
        chunk: u64,
        charge: &mut Charge,
        refused: &mut KVVec<VidChunk>,
    ) {
        for c in chunks {
            if self.closed || self.dead {
                // Room was reserved for every chunk of the allocation: not refused.
                let _ = refused.push(c, GFP_NOWAIT);
                continue;
            }
            // Room is kept (a chunk refused, never reached, is freed).
            let cached = CachedVid::new(c, chunk, charge.split(chunk));
            if self.vcache.push(cached, GFP_NOWAIT).is_ok() {
                self.cached += chunk;
            }
        }
    }
}

impl Pool {
    /// Takes `count` vidmem chunks for a mem of the pool's GPU: cached ones first (zeroed
    /// again: vidmem is always zeroed), then new ones from the PMM (zeroed as they are handed
    /// out), charged to the file's quota first (`ENOSPC`); a request beyond the GPU's vidmem is
    /// `ENOMEM` before anything is allocated. `stop` is asked before each chunk is zeroed or
    /// allocated (a signal, the GPU's removal beginning). `ENODEV`
    /// once the GPU went. On failure the pool is as it was. Returns the chunks, how many came
    /// from the cache, and their charge.
    pub(crate) fn take_vid(
        &self,
        count: usize,
        mut stop: impl FnMut() -> Result,
    ) -> Result<(KVVec<VidChunk>, usize, Charge)> {
        let gpu = self.vid.as_ref().ok_or(EINVAL)?;
        let chunk = self.chunk_size;
        let bytes = (count as u64).checked_mul(chunk).ok_or(EOVERFLOW)?;
        if bytes > gpu.vidmem_size() {
            return Err(ENOMEM);
        }
        let mut out = KVVec::with_capacity(count, GFP_KERNEL_ACCOUNT)?;
        let mut st = self.state.lock();
        if st.closed {
            return Err(ENOENT);
        }
        if st.dead {
            return Err(ENODEV);
        }
        let reused = count.min(st.vcache.len());
        let mut charge = self.quota.nothing();
        for _ in 0..reused {
            if let Some(v) = st.vcache.pop() {
                let CachedVid { chunk, _charge, .. } = v;
                charge.merge(_charge);
                // Room was reserved: this does not allocate.
                let _ = out.push(chunk, GFP_KERNEL);
            }
        }
        st.cached -= reused as u64 * chunk;
        st.inflight += reused as u64 * chunk;
        drop(st);
        let r = (|| -> Result {
            charge.merge(self.quota.charge((count - reused) as u64 * chunk)?);
            // Held across the allocation: the GPU cannot be removed meanwhile.
            let access = gpu.access()?;
            let pmm = access.pmm().map_err(|_| ENXIO)?;
            for c in out.iter().take(reused) {
                // A removal waits for this guard: stopped (`ENODEV`), as before a new chunk.
                stop()?;
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
        // Room for every chunk of the pool once this mem's are back, now that they are had.
        let r = r.and_then(|()| {
            let total = usize::try_from((st.reserved() + bytes) / chunk)?;
            let more = total.saturating_sub(st.vcache.len());
            st.vcache.reserve(more, GFP_KERNEL_ACCOUNT)?;
            Ok(())
        });
        if let Err(e) = r {
            // The new chunks go back to the PMM; the cached ones to the cache (or, if the
            // pool closed or its GPU went meanwhile, to the PMM too).
            let mut refused =
                KVVec::with_capacity(out.len(), GFP_NOWAIT).unwrap_or_else(|_| KVVec::new());
            let fresh = out.len().saturating_sub(reused);
            for _ in 0..fresh {
                if let Some(c) = out.pop() {
                    let _ = refused.push(c, GFP_NOWAIT);
                }
            }
            st.cache_vid(out.drain_all(), chunk, &mut charge, &mut refused);
            drop(st);
            drop(refused);
            return Err(e);
        }
        if st.closed {
            // Destroyed meanwhile: the mem is not made, its chunks go back to the PMM.
            drop(st);
            drop(out);
            return Err(ENOENT);
        }
        st.used += bytes;
        st.hits += reused as u64;
        st.misses += (count - reused) as u64;
        st.note_highs();
        drop(st);
        Ok((out, reused, charge))
    }

    /// A vidmem mem's chunks come back, with their quota charge: cached (into the room kept
    /// for them), then what the cache holds above the release threshold is given back. Freed
    /// at once if the pool is closed or its GPU went.
    ///
    /// With `undo`, the chunks come from an allocation that failed after taking them, of
    /// which the first `undo` were cached: those are cached again, the new ones freed, and the
    /// hit and miss counts put back, so that the pool is as before the allocation.
    pub(crate) fn give_back_vid(
        &self,
        mut chunks: KVVec<VidChunk>,
        undo: Option<usize>,
        mut charge: Charge,
    ) {
        let chunk = self.chunk_size;
        let mut refused = KVVec::new();
        let mut st = self.state.lock();
        st.used = st.used.saturating_sub(chunks.len() as u64 * chunk);
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
        st.cache_vid(chunks.drain_all(), chunk, &mut charge, &mut refused);
        drop(st);
        drop(refused);
        drop(charge);
        self.release(None);
    }

    /// Lets the cache's room shrink to what the pool's reserved chunks need, once it is more
    /// than twice that (after a give-back).
    pub(super) fn fit_vcache(&self, st: &mut PoolState) {
        let Some(need) = st.reserved().checked_div(self.chunk_size) else {
            return;
        };
        let need = usize::try_from(need).unwrap_or(usize::MAX);
        if st.vcache.capacity() / 2 > need {
            let _ = st.vcache.shrink_to(need, GFP_KERNEL_ACCOUNT);
        }
    }
}
