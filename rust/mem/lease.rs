// SPDX-License-Identifier: GPL-2.0

//! A pool mem's tie to its pool ([`PoolLease`]), and the two ways its chunks go back: with the
//! mem's last holder (a synchronous free: cached, or pending while points they wait for are
//! not observed), or handed to the pool's pending list by a free on a stream
//! ([`Mem::free_ordered`]).

use kernel::{
    prelude::*,
    sync::{atomic::ordering::Relaxed, Arc},
};

use crate::gpu::dma::GpuTable;

use kernel::{mm::Mm, sync::aref::ARef};

use super::{
    offsets,
    pool::{
        self,
        pending::{Asker, Clock, Promise, Tag, Tags},
    },
    quota::Charge,
    Mem, MemCore, MemState,
};

/// A pool mem's tie to its pool: when it is dropped (with the mem's core, or on a failed
/// allocation) the chunks and the tables it holds go back to the pool.
pub(super) struct PoolLease {
    pub(super) pool: Arc<pool::Pool>,
    pub(super) pages: Option<Arc<crate::gpu::dma::Pages>>,
    /// Tables of the pool's GPUs mapping `pages`, not (or no longer) the mem's.
    pub(super) tables: KVec<(u32, Arc<GpuTable>)>,
    /// The mem's mmap offset range, once the mem is dropped: cached with the chunks.
    pub(super) range: Option<offsets::MmapRange>,
    /// How many chunks came from the pool's cache, and whether the mem was made (else,
    /// dropped, the pool's allocation is undone).
    pub(super) reused: usize,
    pub(super) made: bool,
    /// The quota charge of the chunks: it goes back with them, into the pool's cache.
    pub(super) charge: Option<Charge>,
    /// Chunks taken from a pending free: its points (see [`pool::pending`]), with room for
    /// `own`'s.
    pub(super) from: Tags,
    /// A mem allocated on a stream: its allocation's point. Once the mem is made, its chunks
    /// go back pending until both that point and `from`'s are observed.
    pub(super) own: Option<Tag>,
    /// The chunks are another mem's, freed earlier in the same submission, until that free
    /// is done and they are this mem's ([`Handed::give_to`]): dropped before, the lease gives
    /// nothing back (the allocation is undone).
    pub(super) borrowed: bool,
    /// Chunks the stream allocations that took the mem whole ([`Mem::take_whole`]) counted
    /// hits: undone if it is dropped unmade (its submission failed).
    pub(super) revived: usize,
}

/// A stream allocation ([`Mem::alloc_ordered`]): the stream asking (the pool's reuse rules),
/// the allocation's point, and where to borrow the chunks of a mem freed earlier in the same
/// submission (the same pool, as many chunks) before anything else.
pub(crate) struct StreamAlloc<'a, 'b> {
    pub(crate) ask: &'a Asker<'b>,
    pub(crate) own: Tag,
    pub(crate) borrow: &'a mut dyn FnMut(&Arc<pool::Pool>, usize) -> Option<Borrow>,
}

/// What a stream allocation borrows from a mem freed earlier in its submission (the same pool,
/// as many chunks): the chunks and the DMA tables of the pool's GPUs (shared with that mem).
pub(crate) struct Borrow {
    pub(crate) pool: Arc<pool::Pool>,
    pub(crate) pages: Arc<crate::gpu::dma::Pages>,
    pub(crate) tables: KVec<(u32, Arc<GpuTable>)>,
    /// How many points the chunks wait for now (room for them is made in the heir's lease).
    pub(crate) points: usize,
}

impl PoolLease {
    /// The points the chunks wait for when they go back.
    pub(super) fn tags(&mut self) -> Tags {
        let mut tags = core::mem::take(&mut self.from);
        if self.made {
            if let Some(own) = self.own.take() {
                // Room was reserved with the lease: a new stream's point does not allocate.
                let _ = tags.add(own);
            }
        }
        tags
    }
}

impl Drop for PoolLease {
    fn drop(&mut self) {
        if !self.made && self.revived > 0 {
            self.pool.borrowed(self.revived, true);
        }
        if self.borrowed {
            // The chunks are still the freed mem's: only the allocation is undone.
            self.pool.borrowed(self.reused, true);
            return;
        }
        if let Some(pages) = self.pages.take() {
            let tables = core::mem::replace(&mut self.tables, KVec::new());
            let undo = (!self.made).then_some(self.reused);
            let charge = self
                .charge
                .take()
                .unwrap_or_else(|| self.pool.quota().nothing());
            let tags = self.tags();
            self.pool.give_back_tagged(
                pages,
                tables,
                (self.range.take(), undo),
                charge,
                (tags, None),
            );
        }
    }
}

/// Adds `tables` to `to`: moved whole when `to` is empty (no allocation); a table with no
/// room to go is dropped (unmapped).
pub(super) fn give_tables(to: &mut KVec<(u32, Arc<GpuTable>)>, tables: KVec<(u32, Arc<GpuTable>)>) {
    if to.is_empty() {
        *to = tables;
        return;
    }
    for t in tables {
        let _ = to.push(t, GFP_KERNEL);
    }
}

/// A mem allocated for a stream ([`Mem::alloc_ordered`]).
pub(crate) struct Made {
    pub(crate) mem: Arc<Mem>,
    /// The point its stream must wait for before the mem is used (a pending free's, taken by
    /// `ALLOW_INTERNAL_DEPENDENCIES`).
    pub(crate) wait: Option<Tag>,
    /// How many of its chunks (the first) were reused: not zeroed.
    pub(crate) reused: usize,
}

impl Mem {
    /// Makes what [`Mem::free_ordered`] needs, when a free on a stream is planned: room for the
    /// points its chunks will wait for, and in its pool's pending list. `None` for a mem of
    /// no (sysmem) pool.
    pub(crate) fn prepare_hand_over(&self) -> Result<Option<Promise>> {
        if !self.leased {
            return Ok(None);
        }
        let pool = {
            let mut st = self.state.lock();
            // A free of it begins: no export data and no import from now on, so that the
            // holders `borrowable` counts next can only fall (see `share`).
            st.export = super::share::Export::Withdrawn;
            let Some(l) = st.lease.as_mut() else {
                return Ok(None);
            };
            // Its allocation's point and the free's.
            l.from.reserve(2)?;
            l.pool.clone()
        };
        pool.promise().map(Some)
    }

    /// The next stream allocation of the submission that made this mem (and frees it now, by
    /// index), asking for `size` bytes with `flags` from `pool`, takes the mem whole, as its
    /// own new mem: the same chunks, tables and mmap offset, under a new handle, with its
    /// point (`own`) as the allocation's. Only a mem of that pool with that size and those
    /// flags, that nothing but its submission knows (never in its file's table: no handle,
    /// mapping, export or import can have reached it), holding its own chunks (not borrowed,
    /// not handed over), with no mapping of any kind but DMA tables of exactly the pool's
    /// access set, as an allocation now would make it; `None` for any other, left as it was.
    ///
    /// Counted at once as the free of the old mem and the allocation of the new (its pool's
    /// hits, undone if the mem is dropped unmade; `RUVM_IOCTL_STATS`), the bytes staying
    /// counted used. How many chunks it has (reused: not zeroed).
    pub(crate) fn take_whole(
        &self,
        pool: &Arc<pool::Pool>,
        (size, flags): (u64, u32),
        (context, seqno, clock): (u64, u64, impl FnOnce() -> Arc<dyn Clock>),
    ) -> Option<usize> {
        if !self.leased
            || self.size != size
            || self.alloc_flags != flags
            || self.committed.load(Relaxed)
            || self.exported.load(Relaxed)
            || self.user_mappings.load(Relaxed) != 0
        {
            return None;
        }
        let count = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let l = st.lease.as_mut()?;
            let access = l.pool.access();
            let mapped: crate::gpu::set::GpuSet = st.gpus.iter().map(|(id, _)| *id).collect();
            let pristine = Arc::ptr_eq(&l.pool, pool)
                && !l.borrowed
                && mapped.bits() == access.bits()
                && matches!(st.life, super::Life::Owned)
                && matches!(st.export, super::share::Export::Never)
                && st.holders == 1
                && st.quiet == 0
                && st.kmap.is_none()
                && st.gpu_user.is_empty()
                && st.user_va.is_none()
                && st.gpu_kernel.is_empty()
                && st.kva.is_none()
                && st.filled_by.is_none()
                && st.parked.is_none()
                && st.resv.is_none()
                && st.kept_charge.is_none();
            if !pristine {
                return None;
            }
            let pages = l.pages.as_ref()?;
            // No mapping can come: the mem was never in its file's table.
            if !pool::may_pass_on(pages) {
                return None;
            }
            let count = pages.chunk_count();
            let revived = l.revived.checked_add(count)?;
            // Its allocation's point: a later one of the same stream.
            match &mut l.own {
                Some(t) if t.clock.context() == context => t.seqno = seqno,
                own => {
                    *own = Some(Tag {
                        clock: clock(),
                        seqno,
                    })
                }
            }
            l.revived = revived;
            count
        };
        pool.borrowed(count, false);
        if let Some(u) = &self._usage {
            u.again();
        }
        Some(count)
    }

    /// What a stream allocation later in the submission that frees this mem may borrow
    /// ([`Borrow`]): its chunks, and its DMA tables for its pool's GPUs. `None` for a mem of
    /// no (sysmem) pool, or without memory to list the tables; and for one that a user VMA
    /// maps, or a page of which something else holds ([`pool::may_pass_on`]). From a `Some`
    /// until the returned [`Lent`] is dropped (with its submission, queued or failed) the mem
    /// takes no new user mapping (`mmap` is `ENXIO`, as for a freed mem's offset), so that no
    /// reference to a page can be taken before the chunks change owner.
    pub(crate) fn borrowable(self: &Arc<Self>) -> Option<(Borrow, Lent)> {
        if !self.leased {
            return None;
        }
        let mut st = self.state.lock();
        // Imports share the chunks: they are not another mem's to take. A VMA (counted under
        // this lock by the `mmap` that made it) could pin a page until the free zaps it.
        if MemCore::imported(&st) || self.user_mappings.load(Relaxed) != 0 || st.lending {
            return None;
        }
        let l = st.lease.as_ref()?;
        let pages = l.pages.clone()?;
        if !pool::may_pass_on(&pages) {
            return None;
        }
        let access = l.pool.access();
        let mut tables = KVec::with_capacity(st.gpus.len(), GFP_KERNEL).ok()?;
        for (id, t) in st.gpus.iter().filter(|(id, _)| access.contains(*id)) {
            // Within the room reserved.
            let _ = tables.push_within_capacity((*id, t.clone()));
        }
        let borrow = Borrow {
            pool: l.pool.clone(),
            pages,
            tables,
            // Its points, and its allocation's.
            points: l.from.len() + 1,
        };
        st.lending = true;
        Some((borrow, Lent(self.clone())))
    }

    /// Frees the mem on a stream, at point `free` (its handle gone, in a submission queued
    /// now): it is retired and what it gave up parked until the stream reaches the free (under
    /// one acquisition of its lock, so that a GPU's removal finds the parked mappings), its
    /// user mappings zapped (`zap`, with the address space whose `mmap` filled a VMA, when a
    /// VMA maps it), and its chunks handed to its pool's pending list (in the room `promise`
    /// kept). The DMA tables of GPUs with a parked virtual mapping stay parked with it (no PTE
    /// may point at an address its pool may drop). A mem a VMA still maps keeps its chunks
    /// (and their quota charge) until the VMA goes: they come back through the lease then,
    /// pending until the free is observed.
    ///
    /// With `heir` (a stream allocation later in the submission borrowed the chunks), the
    /// chunks, their charge and their points become the heir's, mapped or not.
    pub(crate) fn free_ordered(
        &self,
        zap: impl FnOnce(Option<ARef<Mm>>),
        free: Tag,
        promise: Option<Promise>,
        heir: Option<&Mem>,
    ) {
        let mut st = self.state.lock();
        self.withdraw(&mut st);
        let imported = MemCore::imported(&st);
        let mut retired = Self::retire_locked(&mut st, true);
        let filled_by = retired.filled_by.take();
        let old = st.parked.replace(retired);
        if self.committed.load(Relaxed) {
            if let Some(l) = st.lease.as_mut() {
                l.made = true;
            }
        }
        // Read once the mem is freed: a VMA that inserted a page did so before (a fault
        // checks the mem's life under its lock), and was counted before that.
        let mapped = self.user_mappings.load(Relaxed) != 0;
        // Imports keep the chunks as a VMA does (never with an heir: `borrowable` refuses).
        let handed = if (mapped || imported) && heir.is_none() {
            // Room was made when the free was planned: this does not allocate.
            if let Some(l) = st.lease.as_mut() {
                let _ = l.from.add(free.clone());
            }
            None
        } else {
            self.take_lease(&mut st)
        };
        drop(st);
        drop(old);
        if mapped {
            zap(filled_by);
        }
        if let Some(h) = handed {
            match heir {
                Some(m) => h.give_to(m, free, promise),
                None => h.go(free, promise),
            }
        }
    }

    /// Takes the chunks out of a pool mem's lease for its pool's pending list (its lease gives
    /// nothing back any more; the audit finds them pending). `None` for a mem of no pool, or
    /// one handed over already.
    fn take_lease(&self, st: &mut MemState) -> Option<Handed> {
        if !self.leased {
            return None;
        }
        let l = st.lease.as_mut()?;
        let pages = l.pages.take()?;
        self.handed.store(true, Relaxed);
        // This mem still holds them (for the work queued before the free), uncharged now:
        // whoever holds the charge keeps it until the mem is dropped (`MemCore`'s drop).
        pages.pin();
        Some(Handed {
            pool: l.pool.clone(),
            pages,
            tables: core::mem::replace(&mut l.tables, KVec::new()),
            charge: l.charge.take(),
            tags: l.tags(),
        })
    }
}

/// A mem whose chunks a later ALLOC of its submission may borrow ([`Mem::borrowable`]): no
/// user mapping of it is made while this lives. Dropped with the submission: a queued one
/// freed the mem (its offset names nothing), a failed one leaves it as it was.
pub(crate) struct Lent(Arc<Mem>);

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.state.lock().lending = false;
    }
}

/// A freed pool mem's chunks, on their way to its pool's pending list.
struct Handed {
    pool: Arc<pool::Pool>,
    pages: Arc<crate::gpu::dma::Pages>,
    tables: KVec<(u32, Arc<GpuTable>)>,
    charge: Option<Charge>,
    tags: Tags,
}

impl Handed {
    /// The chunks become `heir`'s, which borrowed them (see [`PoolLease::borrowed`]): their
    /// charge and points go with them, the free's point `free` added. If `heir` holds no
    /// borrow (never), they go to the pending list instead.
    fn give_to(self, heir: &Mem, free: Tag, promise: Option<Promise>) {
        let mut st = heir.state.lock();
        let Some(l) = st.lease.as_mut().filter(|l| l.borrowed) else {
            drop(st);
            return self.go(free, promise);
        };
        let Handed {
            pool,
            pages,
            tables,
            charge,
            tags,
        } = self;
        l.borrowed = false;
        l.charge = charge;
        // Room was made with the heir's lease for these points, the free's and its own: this
        // does not allocate.
        let _ = l.from.merge(tags);
        let _ = l.from.add(free);
        drop(st);
        // The heir has its own references to the chunks and the tables.
        drop((pool, pages, tables));
    }

    /// The chunks go to the pool's pending list, waiting for `free` (the point of the stream
    /// that freed the mem) and the points they waited for already; the mem keeps them for the
    /// work queued before the free. With what [`Mem::prepare_hand_over`] made (`promise`),
    /// nothing is allocated; without memory to note the point, the chunks are not reused: they
    /// are freed with the mem.
    fn go(self, free: Tag, promise: Option<Promise>) {
        let Handed {
            pool,
            pages,
            tables,
            charge,
            mut tags,
        } = self;
        let charge = charge.unwrap_or_else(|| pool.quota().nothing());
        if tags.add(free).is_err() {
            // Unsafe to reuse without its point: the pool lets the chunks go.
            drop(tables);
            pool.forget(pages.len() as u64);
            drop(charge);
            drop(pages);
            return;
        }
        // Pending until the points are observed (cached at once if they were).
        pool.give_back_tagged(pages, tables, (None, None), charge, (tags, promise));
    }
}
