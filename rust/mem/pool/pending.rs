// SPDX-License-Identifier: GPL-2.0

//! Chunks freed on a stream (`RUVM_OP_FREE`, CUDA's `cudaFreeAsync`): pending in their pool
//! until a synchronize observes the free, and reused before that only under CUDA's reuse
//! policies.
//!
//! A pending list is tagged with the points of stream timelines ([`Tag`]) that must be passed
//! before anything else may touch its chunks: the free's point, and for a list that a mem took
//! from a pending free and gave back, that mem's own allocation point too ([`Tags`], one point
//! per stream: a later point of a stream covers an earlier one). An allocation on a stream
//! ([`Asker`]) may take the list when every point is ordered before it: a point of its own
//! stream (the stream's order), one it waited for an event at or after
//! (`FOLLOW_EVENT_DEPENDENCIES`), or one already reached (`ALLOW_OPPORTUNISTIC`); with
//! `ALLOW_INTERNAL_DEPENDENCIES`, when the pool cannot otherwise get memory, a list with one
//! point left unordered is taken and the allocation waits for that point in its stream.
//!
//! A list whose points were all observed by a synchronize ([`Clock::observed`]) is cached
//! ([`Pool::settle`]): reusable by anyone. Pending lists are never given back by a trim, the
//! release threshold or the shrinker (their chunks may still be in use); a closed pool drops
//! them (the mems and queued work that use the chunks hold their own references).

use kernel::{prelude::*, sync::Arc};

use crate::{
    audit::{Class, Counted},
    bind::fence::Fence,
    gpu::dma::{GpuTable, Pages},
    uapi,
};

use super::{
    super::{offsets::MmapRange, quota::Charge},
    sys::{Entry, Taken},
    Pool, PoolState,
};

/// The reuse policies (`enum ruvm_pool_reuse`).
pub(crate) const FOLLOW_EVENTS: u32 =
    uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES;
pub(crate) const OPPORTUNISTIC: u32 = uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_OPPORTUNISTIC;
pub(crate) const INTERNAL_DEPS: u32 =
    uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
/// Every policy: a new pool's.
pub(crate) const ALL_POLICIES: u32 = FOLLOW_EVENTS | OPPORTUNISTIC | INTERNAL_DEPS;

/// A stream's timeline, as a pool sees it.
pub(crate) trait Clock: Send + Sync {
    /// Its dma_fence context.
    fn context(&self) -> u64;
    /// Whether the stream reached point `seqno` (the work before it retired and dropped).
    fn reached(&self, seqno: u64) -> bool;
    /// Whether a synchronize observed point `seqno` (or the stream is destroyed, so that none
    /// can, and reached it).
    fn observed(&self, seqno: u64) -> bool;
    /// A fence of point `seqno`.
    fn fence(&self, seqno: u64) -> Result<Fence>;
}

/// A point of a stream's timeline.
#[derive(Clone)]
pub(crate) struct Tag {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) seqno: u64,
}

/// The points a pending list waits for, at most one per stream.
#[derive(Default)]
pub(crate) struct Tags(KVec<Tag>);

/// An allocation on a stream, as the reuse rules see it.
pub(crate) struct Asker<'a> {
    /// The stream's timeline context.
    pub(crate) context: u64,
    /// Whether the stream waited for point `(context, seqno)` (an event recorded at or after
    /// it) before the allocation.
    pub(crate) knows: &'a dyn Fn(u64, u64) -> bool,
}

impl Tags {
    /// No point.
    pub(crate) const fn none() -> Self {
        Self(KVec::new())
    }

    /// Adds `tag`, keeping one point per stream (the later), and leaving out points already
    /// observed (those it held too): may allocate.
    pub(crate) fn add(&mut self, tag: Tag) -> Result {
        self.0.retain(|t| !t.clock.observed(t.seqno));
        if tag.clock.observed(tag.seqno) {
            return Ok(());
        }
        let ctx = tag.clock.context();
        if let Some(t) = self.0.iter_mut().find(|t| t.clock.context() == ctx) {
            t.seqno = t.seqno.max(tag.seqno);
            return Ok(());
        }
        self.0.push(tag, GFP_KERNEL_ACCOUNT)?;
        Ok(())
    }

    /// How many points.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Adds every point of `other` (see [`Self::add`]).
    pub(crate) fn merge(&mut self, other: Tags) -> Result {
        for t in other.0 {
            self.add(t)?;
        }
        Ok(())
    }

    /// Room for `n` more points (so that [`Self::add`] of a new stream's does not allocate).
    pub(crate) fn reserve(&mut self, n: usize) -> Result {
        self.0.reserve(n, GFP_KERNEL_ACCOUNT)?;
        Ok(())
    }

    /// Whether every point was observed by a synchronize.
    pub(crate) fn observed(&self) -> bool {
        self.0.iter().all(|t| t.clock.observed(t.seqno))
    }

    /// Whether every point was reached.
    fn reached(&self) -> bool {
        self.0.iter().all(|t| t.clock.reached(t.seqno))
    }

    /// The points not ordered before an allocation of `ask` under the policies `reuse`: how
    /// many (at most 2 counted), and the first.
    fn unordered(&self, ask: &Asker<'_>, reuse: u32) -> (usize, Option<&Tag>) {
        let mut n = 0;
        let mut first = None;
        for t in self.0.iter() {
            let ctx = t.clock.context();
            let ordered = ctx == ask.context
                || (reuse & FOLLOW_EVENTS != 0 && (ask.knows)(ctx, t.seqno))
                || (reuse & OPPORTUNISTIC != 0 && t.clock.reached(t.seqno));
            if !ordered {
                n += 1;
                first.get_or_insert(t);
                if n == 2 {
                    break;
                }
            }
        }
        (n, first)
    }
}

/// One pending list: a freed mem's chunks, the DMA tables the pool keeps with them, their
/// quota charge, and the points they wait for.
pub(super) struct Pending {
    pub(super) tables: KVec<(u32, Arc<GpuTable>)>,
    pages: Arc<Pages>,
    charge: Charge,
    tags: Tags,
    _chunks: Counted,
}

impl Pending {
    fn bytes(&self) -> u64 {
        self.pages.len() as u64
    }

    /// Counts the list into `bump` (the audit's walk).
    pub(super) fn walk(&self, chunk_size: u64, bump: &mut impl FnMut(Class, u64)) {
        let n = self.pages.chunk_count() as u64;
        bump(Class::PoolPending, n);
        bump(Class::SysmemChunks(self.pages.order()), n);
        for (_, t) in self.tables.iter() {
            bump(Class::DmaMappings, t.count() as u64);
            bump(Class::DmaBytes, t.count() as u64 * chunk_size);
        }
    }
}

/// Room kept in a pool's pending list ([`Pool::promise`]).
pub(crate) struct Promise {
    pool: Option<Arc<Pool>>,
}

impl Promise {
    /// Used: the room is taken (under the pool's lock).
    fn keep(mut self, st: &mut PoolState) {
        if self.pool.take().is_some() {
            st.promised -= 1;
        }
    }
}

impl Drop for Promise {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.state.lock().promised -= 1;
        }
    }
}

/// What [`Pool::take_ordered`] found.
pub(crate) struct Ordered {
    pub(crate) taken: Taken,
    /// The points of the pending list taken (none for cached or new memory).
    pub(crate) tags: Tags,
    /// The point the allocation must wait for in its stream (`ALLOW_INTERNAL_DEPENDENCIES`).
    pub(crate) wait: Option<Tag>,
}

impl PoolState {
    /// Takes pending list `i` out for a mem (counted used and a hit).
    fn take_pending(&mut self, i: usize, chunk_size: u64) -> Option<Pending> {
        if i >= self.pending.len() {
            return None;
        }
        let p = self.pending.remove(i).ok()?;
        let bytes = p.bytes();
        self.pending_bytes -= bytes;
        self.used += bytes;
        self.hits += bytes.checked_div(chunk_size).unwrap_or(0);
        self.note_highs();
        Some(p)
    }
}

impl Pool {
    /// Turns policy `bit` on or off.
    pub(crate) fn set_reuse(&self, bit: u32, on: bool) {
        let mut st = self.state.lock();
        if on {
            st.reuse |= bit;
        } else {
            st.reuse &= !bit;
        }
    }

    /// Takes `count` chunks for a mem allocated on a stream (`ask`): a pending list of exactly
    /// `count` chunks whose points are all ordered before the allocation; else cached or new
    /// chunks ([`Pool::take`], fresh ones zeroed); else, when that fails for want of memory
    /// (the quota or the page allocator) and `ALLOW_INTERNAL_DEPENDENCIES` is on, a pending
    /// list with one point left to wait for. Reused chunks are not zeroed here: a pending
    /// list's may still be written by the work before its free (the caller zeroes them in its
    /// stream).
    pub(crate) fn take_ordered(
        &self,
        count: usize,
        ask: &Asker<'_>,
        stop: impl FnMut() -> Result,
    ) -> Result<Ordered> {
        let found = {
            let mut st = self.state.lock();
            if st.closed || st.dead {
                return Err(ENOENT);
            }
            let reuse = st.reuse;
            let i = st.pending.iter().rposition(|p| {
                p.pages.chunk_count() == count && p.tags.unordered(ask, reuse).0 == 0
            });
            i.and_then(|i| self.lend_pending(&mut st, i))
        };
        if let Some((taken, tags, gone)) = found {
            drop(gone);
            return Ok(Ordered {
                taken,
                tags,
                wait: None,
            });
        }
        let e = match self.take(count, stop) {
            Ok(taken) => {
                return Ok(Ordered {
                    taken,
                    tags: Tags::none(),
                    wait: None,
                })
            }
            Err(e) => e,
        };
        if e != ENOSPC && e != ENOMEM {
            return Err(e);
        }
        let mut st = self.state.lock();
        if st.reuse & INTERNAL_DEPS == 0 || st.closed || st.dead {
            return Err(e);
        }
        let reuse = st.reuse;
        let mut wait = None;
        let i = st.pending.iter().rposition(|p| {
            p.pages.chunk_count() == count
                && match p.tags.unordered(ask, reuse) {
                    (1, t) => {
                        wait = t.cloned();
                        true
                    }
                    _ => false,
                }
        });
        let Some((taken, tags, gone)) = i.and_then(|i| self.lend_pending(&mut st, i)) else {
            return Err(e);
        };
        drop(st);
        drop(gone);
        Ok(Ordered { taken, tags, wait })
    }

    /// Lends pending list `i` to a mem: its chunks, the tables the pool may keep (the others
    /// returned, to be dropped with the lock released), its charge and its points.
    fn lend_pending(
        &self,
        st: &mut PoolState,
        i: usize,
    ) -> Option<(Taken, Tags, KVec<Arc<GpuTable>>)> {
        let p = st.take_pending(i, self.chunk_size)?;
        let Pending {
            mut tables,
            pages,
            charge,
            tags,
            ..
        } = p;
        let mut gone = KVec::new();
        st.sort_tables(&mut tables, &mut gone);
        let reused = pages.chunk_count();
        Some((
            Taken {
                pages,
                tables,
                reused,
                range: None,
                charge,
            },
            tags,
            gone,
        ))
    }

    /// A mem's chunks, freed on a stream (or given back with points not yet observed), wait
    /// for `tags` in the pending list; with no room for them there, or the pool closed, they
    /// are let go (freed once their last holder, a mem or queued work, lets go too). They were
    /// counted used until now.
    ///
    /// With `promise` (a free on a stream, which reserved the room when it was planned) this
    /// allocates nothing and the list always goes in (unless the pool closed).
    pub(super) fn pend(
        &self,
        pages: Arc<Pages>,
        mut tables: KVec<(u32, Arc<GpuTable>)>,
        charge: Charge,
        tags: Tags,
        promise: Option<Promise>,
    ) {
        let bytes = pages.len() as u64;
        let n = pages.chunk_count() as u64;
        let p = Pending {
            tables: KVec::new(),
            pages,
            charge,
            tags,
            _chunks: Counted::new(Class::PoolPending, n),
        };
        // Tables the pool may not keep are rare (a GPU going, access revoked): room for them is
        // made only then, under the lock.
        let mut gone = KVec::new();
        let mut st = self.state.lock();
        let room = match promise {
            Some(p) => {
                p.keep(&mut st);
                Ok(())
            }
            // Room for the promises made too.
            None => {
                let want = st.promised + 1;
                st.pending.reserve(want, GFP_KERNEL_ACCOUNT)
            }
        };
        st.used = st.used.saturating_sub(bytes);
        let refused = if st.closed || room.is_err() {
            Some(p)
        } else {
            st.sort_tables(&mut tables, &mut gone);
            let mut p = p;
            p.tables = tables;
            tables = KVec::new();
            match st.pending.push_within_capacity(p) {
                Ok(()) => {
                    st.pending_bytes += bytes;
                    None
                }
                Err(e) => Some(e.0),
            }
        };
        // The cached bytes (the shrinker's count) did not change.
        drop(st);
        drop(gone);
        drop(tables);
        drop(refused);
    }

    /// [`Pool::give_back`] for a list with `tags`: one whose points are not all observed
    /// (chunks a stream allocation took from a pending free, or its own allocation point, or a
    /// free's on a stream) goes back to the pending list instead, in the room `promise` kept
    /// if there is one.
    pub(crate) fn give_back_tagged(
        &self,
        pages: Arc<Pages>,
        tables: KVec<(u32, Arc<GpuTable>)>,
        (range, undo): (Option<MmapRange>, Option<usize>),
        charge: Charge,
        (tags, promise): (Tags, Option<Promise>),
    ) {
        if tags.observed() {
            return self.give_back(pages, tables, (range, undo), charge);
        }
        if let Some(reused) = undo {
            if self.undo_counts(&pages, reused) {
                return;
            }
        }
        drop(range);
        // Someone still holds a page (a pin through an importer's mapping, made before the
        // last holder let go): never lent to a later allocation, nor cached; let go. (No new
        // pin can be taken: no mapping of them is left.)
        if !super::may_pass_on(&pages) {
            drop((tables, promise));
            self.forget(pages.len() as u64);
            drop((charge, pages));
            return;
        }
        self.pend(pages, tables, charge, tags, promise);
    }

    /// Room for one more list in the pending list, until the [`Promise`] is kept or dropped:
    /// made when a free on a stream is planned, so that its hand-over cannot fail.
    pub(crate) fn promise(self: &Arc<Self>) -> Result<Promise> {
        let mut st = self.state.lock();
        let want = st.promised + 1;
        st.pending.reserve(want, GFP_KERNEL_ACCOUNT)?;
        st.promised += 1;
        Ok(Promise {
            pool: Some(self.clone()),
        })
    }

    /// Caches the pending lists whose points were all observed (with `every`, a synchronize of
    /// every stream of the file: all reached); then whatever the pool holds above its release
    /// threshold is given back (a synchronize, as CUDA's).
    pub(crate) fn settle(&self, every: bool) {
        let mut moved = false;
        // What the cache could not take (it could not grow), dropped with the lock released.
        let mut refused = KVec::new();
        {
            let mut st = self.state.lock();
            // One pass: a list that goes is swapped with the last and taken off the end.
            let mut i = 0;
            while let Some(p) = st.pending.get(i) {
                if !(p.tags.observed() || (every && p.tags.reached())) {
                    i += 1;
                    continue;
                }
                let last = st.pending.len() - 1;
                st.pending.as_mut_slice().swap(i, last);
                let Some(p) = st.pending.pop() else {
                    break;
                };
                st.pending_bytes -= p.bytes();
                let Pending {
                    tables,
                    pages,
                    charge,
                    ..
                } = p;
                if let Some(e) = st.cache(Entry::new(pages, tables, None, charge)) {
                    // Without room even here, it is dropped under the lock.
                    let _ = refused.push(e, GFP_KERNEL);
                }
                moved = true;
            }
            self.publish(&st);
        }
        drop(refused);
        let over = {
            let st = self.state.lock();
            moved || st.reserved() > st.threshold
        };
        if over {
            self.release(None);
        }
    }

    /// The pending lists out (the pool is closing), to be dropped with the lock released.
    pub(super) fn drain_pending(st: &mut PoolState) -> KVec<Pending> {
        st.pending_bytes = 0;
        core::mem::replace(&mut st.pending, KVec::new())
    }
}
