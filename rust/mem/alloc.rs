// SPDX-License-Identifier: GPL-2.0

//! How a mem is made: uvm_mem's layout rules applied to a request, the chunks taken (fresh
//! sysmem or vidmem, a pool's cache, a stream's pending free, or a mem freed earlier in the
//! same submission), the mem's core and holder built and registered, and a pool mem mapped for
//! the pool's GPUs. Nothing is left behind on an error: chunks already taken are freed or go
//! back to their pool, the charge is given back.

use kernel::{
    new_mutex,
    prelude::*,
    sync::{atomic::Atomic, Arc},
};

use crate::{
    audit::{self, stats::Usage, Class, Counted},
    uapi,
};

use super::{
    beyond_ram, new_serial, offsets,
    policy::{self, Backing},
    policy_error,
    pool::{self, pending::Tags},
    quota::Quota,
    registry, storage,
    storage::Storage,
    AllocRequest, Made, Mem, MemCore, MemState, Origin, PoolLease, StreamAlloc,
};

impl Mem {
    /// Allocates a mem, charging its physical size to `quota`. On error nothing is left
    /// behind: chunks already allocated are freed, the charge is given back.
    pub(crate) fn alloc(
        req: &AllocRequest,
        quota: &Arc<Quota>,
        origin: Origin,
    ) -> Result<Arc<Mem>> {
        let r = Self::try_alloc(req, quota, origin, None);
        if r.is_err() {
            audit::stats::alloc_failed(req.stats_backing());
        }
        r.map(|m| m.mem)
    }

    /// Allocates a mem from a sysmem pool for a stream (`ask`, at point `own`), under the
    /// pool's reuse rules ([`pool::pending`]): `EOPNOTSUPP` for a vidmem pool. Reused chunks
    /// are not zeroed: the caller does it in the stream when asked.
    pub(crate) fn alloc_ordered(
        req: &AllocRequest,
        quota: &Arc<Quota>,
        origin: Origin,
        stream: StreamAlloc<'_, '_>,
    ) -> Result<Made> {
        if req.pool.as_ref().is_none_or(|p| p.vid_gpu().is_some()) || req.gpu.is_some() {
            return Err(crate::bind::errno::eopnotsupp());
        }
        let r = Self::try_alloc(req, quota, origin, Some(stream));
        if r.is_err() {
            audit::stats::alloc_failed(req.stats_backing());
        }
        r
    }

    fn try_alloc(
        req: &AllocRequest,
        quota: &Arc<Quota>,
        origin: Origin,
        ordered: Option<StreamAlloc<'_, '_>>,
    ) -> Result<Made> {
        let page = kernel::page::PAGE_SIZE as u64;
        let backing = match &req.gpu {
            None => Backing::Sysmem,
            Some(gpu) => Backing::Vidmem {
                gpu_page_sizes: gpu.page_sizes,
                numa: false,
            },
        };
        let page_size = match &req.pool {
            None => req.page_size,
            // A pool's mems have its backing (the same GPU binding for vidmem) and chunk size,
            // and no fallback to smaller chunks.
            Some(p) => {
                let same = match (&req.gpu, p.vid_gpu()) {
                    (None, None) => true,
                    // The pool's GPU, bound again since: its memory went with the old binding.
                    (Some(g), Some(pg)) if g.id == pg.id && !Arc::ptr_eq(g, pg) => {
                        return Err(ENODEV)
                    }
                    (Some(g), Some(pg)) => Arc::ptr_eq(g, pg),
                    _ => false,
                };
                match req.page_size {
                    _ if !same || req.fallback => return Err(EINVAL),
                    0 => p.chunk_size(),
                    s if s == p.chunk_size() => s,
                    _ => return Err(EINVAL),
                }
            }
        };
        let layout = policy::layout(backing, req.size, page_size, page).map_err(policy_error)?;
        if layout.physical_size > req.max_bytes {
            return Err(ENOSPC);
        }
        // A sparse mem is sysmem of no pool, of one chunk size; its chunks are charged as they
        // become resident.
        if req.sparse && (req.gpu.is_some() || req.pool.is_some() || req.fallback) {
            return Err(EINVAL);
        }
        // A pool mem's charge comes from the pool, with its chunks; a sparse mem's chunks are
        // charged as they become resident, and the mem itself a page (what bounds how many a
        // file may make, as for any mem).
        let charge = match &req.pool {
            None if req.sparse => Some(quota.charge(page)?),
            None => Some(quota.charge(layout.physical_size)?),
            Some(_) => None,
        };
        // Sysmem beyond the machine's memory cannot be had: refused before a page is taken,
        // rather than after draining the machine (which other tasks would meet as an OOM).
        if req.gpu.is_none() && beyond_ram(layout.physical_size) {
            return Err(ENOMEM);
        }
        let mut wait = None;
        let mut reused = 0;
        let mut sparse = None;
        let (layout, storage, mut lease) = match &req.pool {
            None if req.sparse => {
                let count = usize::try_from(layout.chunk_count)?;
                let chunk = usize::try_from(layout.chunk_size)?;
                sparse = Some(super::sparse::Sparse::new(count, chunk)?);
                (layout, Storage::Sparse, None)
            }
            None => {
                let (layout, storage) = storage::alloc(req, layout)?;
                (layout, storage, None)
            }
            Some(p) if p.vid_gpu().is_some() => {
                // The vidmem pages give their chunks back to the pool when they drop.
                let gpu = req.gpu.as_ref().ok_or(EINVAL)?;
                let pages = storage::from_vid_pool(p, gpu, &layout)?;
                (layout, Storage::Vid(pages), None)
            }
            Some(p) => {
                let mut borrowed = None;
                let (taken, from, own) = match ordered {
                    None => (storage::from_pool(p, req, &layout)?, Tags::none(), None),
                    Some(s) => {
                        let count = usize::try_from(layout.chunk_count)?;
                        match (s.borrow)(p, count) {
                            // A mem freed earlier in the submission: its chunks, once its free
                            // is done (counted a hit now, undone if the allocation fails).
                            Some(b) => {
                                p.borrowed(count, false);
                                borrowed = Some(b.points);
                                let taken = pool::Taken {
                                    pages: b.pages,
                                    tables: b.tables,
                                    reused: count,
                                    range: None,
                                    charge: p.quota().nothing(),
                                };
                                (taken, Tags::none(), Some(s.own))
                            }
                            None => {
                                let o = p.take_ordered(count, s.ask, storage::stop_on_signal)?;
                                wait = o.wait;
                                (o.taken, o.tags, Some(s.own))
                            }
                        }
                    }
                };
                // From here a failure drops the lease, which gives everything back.
                let storage = Storage::Sys(taken.pages.clone());
                reused = taken.reused;
                let mut lease = PoolLease {
                    pool: p.clone(),
                    pages: Some(taken.pages),
                    tables: taken.tables,
                    range: taken.range,
                    reused: taken.reused,
                    made: false,
                    charge: Some(taken.charge),
                    from,
                    own,
                    borrowed: borrowed.is_some(),
                    revived: 0,
                };
                if lease.own.is_some() {
                    // Its own point, and a free's on a stream (see `Mem::prepare_hand_over`),
                    // and those of a borrowed mem's chunks with its free's.
                    lease.from.reserve(3 + borrowed.map_or(0, |n| n + 1))?;
                }
                (layout, storage, Some(lease))
            }
        };
        let bytes_class = match storage {
            Storage::Sys(_) | Storage::Buf(_) | Storage::Sparse => Class::SysmemBytes,
            Storage::Vid(_) => Class::VidmemBytes,
        };
        // A sparse mem's resident bytes are counted with its chunks.
        let held = if req.sparse { 0 } else { layout.physical_size };
        // A list the pool kept whole comes with the range of the mem that freed it (the same
        // size).
        let mmap = match lease.as_mut().and_then(|l| l.range.take()) {
            Some(r) => r,
            None => offsets::MmapRange::new(layout.physical_size)?,
        };
        let mut alloc_flags = 0;
        if req.zero {
            alloc_flags |= uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO;
        }
        if req.fallback {
            alloc_flags |= uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK;
        }
        if req.sparse {
            alloc_flags |= uapi::ruvm_alloc_flags_RUVM_ALLOC_SPARSE;
        }
        if req.map_user {
            alloc_flags |= uapi::ruvm_alloc_flags_RUVM_ALLOC_MAP_USER;
        }
        let serial = new_serial();
        let pool_id = lease.as_ref().map_or(0, |l| l.pool.id());
        // The mem's objects are the caller's memory cgroup's, as an import's are.
        let gfp = origin.gfp();
        let core = Arc::pin_init(
            try_pin_init!(MemCore {
                serial,
                size: req.size,
                layout,
                alloc_flags,
                mmap: Some(mmap),
                storage,
                source: None,
                user_mappings: Atomic::new(0),
                leased: lease.is_some(),
                handed: Atomic::new(false),
                committed: Atomic::new(false),
                exported: Atomic::new(false),
                pool: pool_id,
                owner: quota.id(),
                state <- new_mutex!(MemState::new(lease, sparse)),
                origin,
                _mems: Counted::new(Class::Mems, 1),
                _bytes: Counted::new(bytes_class, held),
                _usage: Some(Usage::new(
                    req.stats_backing(),
                    held,
                    if req.sparse { 0 } else { req.size },
                )),
            }),
            gfp,
        )?;
        let mem = Arc::new(
            Mem {
                core: core.clone(),
                _charge: charge,
            },
            gfp,
        )?;
        // Registered last; on failure `mem` is dropped, and `Mem::drop` finds nothing to remove.
        registry::insert(serial, core)?;
        // On failure `mem` is dropped, and its chunks go back to the pool, which undoes the
        // allocation.
        if req.pool.is_some() {
            mem.map_pool_gpus()?;
        }
        Ok(Made { mem, wait, reused })
    }
}
