// SPDX-License-Identifier: GPL-2.0

//! A mem: ruvm's `uvm_mem_t`, one allocation made of equal physical chunks, and its life.
//!
//! This file owns the mem object and its lifecycle; its parts live beside it: [`storage`]
//! (sysmem pages and vidmem chunks), [`cpu`] (kernel and user mappings, and the kernel-side
//! byte operations), [`gpu`] (DMA tables and the copy engine's view), [`quota`] (what a file may
//! hold), [`offsets`] (where a mem is `mmap`ed), [`registry`] (every live mem, for the audit's
//! walk and GPU removal), [`plant`] (test-only leaks) and [`table`] (the tree of the registry
//! and of a file's handles, which keeps freed mems' nodes). It must not touch files or ioctl
//! structures: the ioctl layer above calls it with validated values.
//!
//! # Life
//!
//! A [`Mem`] is shared (`Arc`) by the handle table of the file that allocated it and by every
//! user VMA that maps it. Its state ([`Life`]) is checked under its lock by every operation:
//! only an owned (or planted) mem can gain mappings. `RUVM_IOCTL_MEM_FREE` moves it to
//! [`Life::Freed`] and drops its kernel mapping and DMA tables under that same lock, then zaps
//! every user mapping: a user page is inserted only by a fault that saw the mem not freed under
//! the lock, so every page inserted before the free is found by the zap, and every later fault
//! gets `SIGBUS`. The chunks go back when the last holder is gone, which is at once unless a
//! VMA still exists. So nothing a process maps can outlive the mem that accounts for it.
//!
//! # Locking
//!
//! One mutex per mem ([`MemState`]), taken after the file's mutex is released (never nested in
//! it), under the mmap lock by a user fault, and never held while touching user memory.
//! `unmap_mapping_range` (the zap) runs without it. See the crate's lock order.

use kernel::{
    mm::Mm,
    new_mutex,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{ordering::Relaxed, Atomic},
        Arc, Mutex,
    },
};

use crate::{
    audit::{
        self,
        stats::{StatsBacking, Usage},
        Class, Counted,
    },
    gpu::{dma::GpuTable, set::GpuSet, GpuDev},
    uapi,
};

pub(crate) mod bench;
pub(crate) mod cpu;
pub(crate) mod gpu;
pub(crate) mod gpu_va;
pub(crate) mod offsets;
pub(crate) mod pattern;
pub(crate) mod plant;
pub(crate) mod policy;
pub(crate) mod pool;
pub(crate) mod quota;
pub(crate) mod registry;
pub(crate) mod storage;
pub(crate) mod tree;

use policy::{Backing, Layout, PolicyError};
use pool::pending::{Asker, Tag, Tags};
use quota::{Charge, Quota};
use storage::Storage;

/// Makes the mem layer's module-wide state usable (module init): the registry, the mmap offset
/// space and the planted leaks; tells the GPU registry how to drop a removed GPU's tables.
pub(crate) fn init() -> Result {
    RAM_AT_LOAD.store(crate::bind::meminfo::total_ram_bytes(), Relaxed);
    registry::init()?;
    plant::init();
    offsets::init()?;
    gpu_va::init()?;
    pool::registry::init()?;
    crate::gpu::set_removal_hook(drop_gpu);
    Ok(())
}

/// The machine's memory when the module was loaded: a sysmem request above it is checked
/// against the memory now (`si_meminfo` walks every block device under a lock, too much for
/// each allocation).
static RAM_AT_LOAD: Atomic<u64> = Atomic::new(0);

/// Whether `bytes` of sysmem are more than the machine has (now, and when the module was
/// loaded).
fn beyond_ram(bytes: u64) -> bool {
    bytes > RAM_AT_LOAD.load(Relaxed) && bytes > crate::bind::meminfo::total_ram_bytes()
}

/// GPU `id` is going: every mem's tables of it, then every pool's, are dropped.
fn drop_gpu(id: u32) {
    registry::drop_gpu_tables(id);
    pool::registry::drop_gpu(id);
}

/// Lets go of the mem layer's module-wide state at unload, planted leaks first; returns how
/// many planted leaks it freed.
pub(crate) fn exit() -> usize {
    let planted = plant::drain();
    registry::drain();
    offsets::exit();
    gpu_va::exit();
    pool::registry::exit();
    planted
}

/// A mem's handle, as user space names it. Unique across the module (never reused while it is
/// loaded), so a handle of another file is never found in this one's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Handle(pub(crate) u64);

impl Handle {
    /// A new handle, never 0.
    pub(crate) fn new() -> Self {
        static NEXT: Atomic<u64> = Atomic::new(1);
        Handle(NEXT.fetch_add(1, Relaxed))
    }
}

/// How many mems are alive, and their physical bytes (from the audit's counters).
pub(crate) fn live() -> (u64, u64) {
    let l = audit::live();
    (l[Class::Mems.index()], l[Class::SysmemBytes.index()])
}

/// Where a mem came from, for the level-2 audit report.
pub(crate) struct Origin {
    pid: i32,
    ioctl: &'static str,
    born: kernel::time::Instant<kernel::time::Monotonic>,
}

/// The calling process's id in the initial PID namespace (its thread group leader's PID), as
/// the kernel log's reader on the host knows it.
pub(crate) fn caller_pid() -> i32 {
    kernel::current!().group_leader().pid()
}

impl Origin {
    /// The calling task, now.
    pub(crate) fn here(ioctl: &'static str) -> Self {
        Self {
            pid: caller_pid(),
            ioctl,
            born: kernel::time::Instant::now(),
        }
    }
}

impl kernel::fmt::Display for Origin {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "pid={} ioctl={} age_ms={}",
            self.pid,
            self.ioctl,
            self.born.elapsed().as_millis()
        )
    }
}

/// What an allocation asks for, validated from `struct ruvm_mem_alloc`.
pub(crate) struct AllocRequest {
    /// The GPU whose memory backs a vidmem mem; `None` for sysmem.
    pub(crate) gpu: Option<Arc<GpuDev>>,
    pub(crate) size: u64,
    pub(crate) page_size: u64,
    pub(crate) zero: bool,
    pub(crate) fallback: bool,
    /// Largest physical size one mem may have.
    pub(crate) max_bytes: u64,
    /// The pool to take the chunks from (sysmem).
    pub(crate) pool: Option<Arc<pool::Pool>>,
}

impl AllocRequest {
    /// Which statistics the request counts in.
    fn stats_backing(&self) -> StatsBacking {
        match self.gpu {
            None => StatsBacking::Sysmem,
            Some(_) => StatsBacking::Vidmem,
        }
    }
}

fn policy_error(e: PolicyError) -> Error {
    match e {
        PolicyError::ZeroSize | PolicyError::BadPageSize => EINVAL,
        PolicyError::Overflow => EOVERFLOW,
    }
}

/// Where a mem is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Life {
    /// Named by a handle in its file's table: anything may be done with it.
    Owned,
    /// Leaked on purpose by a test (no handle); keeps whatever mappings it was given.
    Planted,
    /// Freed by its owner: no handle, no kernel mapping, no DMA table, and none can be made;
    /// user mappings are zapped and refault with `SIGBUS`. Waits for its last VMA to go.
    Freed,
}

/// The mutable part of a mem, under its lock.
///
/// # Invariants
///
/// When `life` is [`Life::Freed`], `kmap`, `user_va`, `kva` and `filled_by` are `None` and `gpus`,
/// `gpu_user` and `gpu_kernel` are empty. A pool mem's lease holds tables only for GPUs of
/// the pool's access set: those the pool kept for its chunks until the mem takes them (at
/// allocation), those the mem gave up when freed. `kva` is `Some` exactly while `gpu_kernel` is not
/// empty, `user_va` exactly while `gpu_user` is not. Every GPU in `gpu_kernel` or `gpu_user`
/// of a sysmem mem is in `gpus` (a GPU mapping needs the DMA table).
pub(crate) struct MemState {
    life: Life,
    /// The CPU kernel mapping; an `Arc` so that an operation in flight keeps it while another
    /// thread unmaps.
    kmap: Option<Arc<cpu::KernelMapping>>,
    /// The mem's mapping in its file's user VA space of each GPU it is mapped on there.
    gpu_user: KVec<(u32, gpu_va::GpuMapping)>,
    /// Its user VA, fixed by the first GPU user mapping.
    user_va: Option<gpu_va::UserVa>,
    /// The mem's mapping in the kernel VA space of each GPU it is mapped on there, by GPU id.
    gpu_kernel: KVec<(u32, gpu_va::GpuMapping)>,
    /// Its offset in the GPU kernel VA window, while any GPU has it mapped there.
    kva: Option<gpu_va::KernelVa>,
    /// The DMA address table of each GPU the mem is mapped on, by GPU id. An `Arc`, so that a
    /// copy in flight keeps its table while another thread unmaps.
    gpus: KVec<(u32, Arc<GpuTable>)>,
    /// For a pool mem: its tie to the pool, where the chunks go back.
    lease: Option<PoolLease>,
    /// The address space whose `mmap` inserted the mem's pages itself ([`cpu`]), while any VMA
    /// maps the mem: a free must wait for that `mmap` to be over before zapping again.
    filled_by: Option<ARef<Mm>>,
    /// A mem freed on a stream: the mappings it gave up, kept until the stream reaches the free
    /// ([`Mem::park`]); a GPU's removal takes its own out.
    parked: Option<Retired>,
}

impl MemState {
    /// `ENOENT` unless the mem may gain mappings.
    fn mappable(&self) -> Result {
        match self.life {
            Life::Owned | Life::Planted => Ok(()),
            Life::Freed => Err(ENOENT),
        }
    }
}

/// A pool mem's tie to its pool: when it is dropped (with the mem's core, or on a failed
/// allocation) the chunks and the tables it holds go back to the pool.
struct PoolLease {
    pool: Arc<pool::Pool>,
    pages: Option<Arc<crate::gpu::dma::Pages>>,
    /// Tables of the pool's GPUs mapping `pages`, not (or no longer) the mem's.
    tables: KVec<(u32, Arc<GpuTable>)>,
    /// The mem's mmap offset range, once the mem is dropped: cached with the chunks.
    range: Option<offsets::MmapRange>,
    /// How many chunks came from the pool's cache, and whether the mem was made (else,
    /// dropped, the pool's allocation is undone).
    reused: usize,
    made: bool,
    /// The quota charge of the chunks: it goes back with them, into the pool's cache.
    charge: Option<Charge>,
    /// Chunks taken from a pending free: its points (see [`pool::pending`]), with room for
    /// `own`'s.
    from: Tags,
    /// A mem allocated on a stream: its allocation's point. Once the mem is made, its chunks
    /// go back pending until both that point and `from`'s are observed.
    own: Option<Tag>,
}

impl PoolLease {
    /// The points the chunks wait for when they go back.
    fn tags(&mut self) -> Tags {
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
        if let Some(pages) = self.pages.take() {
            let tables = core::mem::replace(&mut self.tables, KVec::new());
            let undo = (!self.made).then_some(self.reused);
            let charge = self
                .charge
                .take()
                .unwrap_or_else(|| self.pool.quota().nothing());
            let tags = self.tags();
            self.pool
                .give_back(pages, tables, self.range.take(), undo, charge, tags);
        }
    }
}

/// The state of a mem that the audit's registry can see. It lives exactly as long as its
/// [`Mem`]: the registry's reference is removed when the `Mem` goes.
#[pin_data(PinnedDrop)]
pub(crate) struct MemCore {
    serial: u64,
    size: u64,
    layout: Layout,
    alloc_flags: u32,
    /// Where the mem is `mmap`ed; `None` only while the core is being dropped (a pool mem's
    /// range goes back to the pool with its chunks).
    mmap: Option<offsets::MmapRange>,
    /// How many user VMAs map the mem.
    user_mappings: Atomic<u32>,
    /// Whether its chunks came from a sysmem pool (its state holds a lease), fixed when made:
    /// a mem without one need not take its lock to commit or to be dropped.
    leased: bool,
    /// Freed on a stream: its chunks went to its pool's pending list (which the audit's walk
    /// counts them in) while this core still holds them for the work queued before the free.
    handed: Atomic<bool>,
    /// Dropped before the storage (field order is drop order): a mem dropped without being
    /// freed (at file close) still holds its mappings and tables, and they go before the
    /// chunks they map, as in uvm_mem.
    #[pin]
    state: Mutex<MemState>,
    storage: Storage,
    origin: Origin,
    _mems: Counted,
    _bytes: Counted,
    _usage: Usage,
}

#[pinned_drop]
impl PinnedDrop for MemCore {
    fn drop(self: Pin<&mut Self>) {
        if !self.leased {
            return;
        }
        let this = self.project();
        // Every table left goes back with the chunks (a mem dropped without being freed, at
        // file close, still has them in `gpus`); the pool keeps those of its GPUs, and the
        // mmap offset range with the chunks.
        // Its GPU virtual mappings go first, as in a free (uvm_mem's order: user, kernel, then
        // the VA offset, then the tables): no PTE may still point at an address the pool is
        // given (and may give back) with the tables.
        let (mappings, lease) = {
            let mut st = this.state.lock();
            let mappings = (
                core::mem::replace(&mut st.gpu_user, KVec::new()),
                core::mem::replace(&mut st.gpu_kernel, KVec::new()),
                st.kva.take(),
            );
            st.user_va = None;
            let mut lease = st.lease.take();
            if let Some(l) = lease.as_mut() {
                let gpus = core::mem::replace(&mut st.gpus, KVec::new());
                give_tables(&mut l.tables, gpus);
                l.range = this.mmap.take();
            }
            (mappings, lease)
        };
        // Unmapped, then given back, with the lock released.
        drop(mappings);
        drop(lease);
    }
}

/// Adds `tables` to `to`: moved whole when `to` is empty (no allocation); a table with no
/// room to go is dropped (unmapped).
fn give_tables(to: &mut KVec<(u32, Arc<GpuTable>)>, tables: KVec<(u32, Arc<GpuTable>)>) {
    if to.is_empty() {
        *to = tables;
        return;
    }
    for t in tables {
        let _ = to.push(t, GFP_KERNEL);
    }
}

/// One mem, as its holders (a file's table, user VMAs) see it.
pub(crate) struct Mem {
    core: Arc<MemCore>,
    /// The quota charge of a mem of no pool (a pool mem's goes with its chunks).
    _charge: Option<Charge>,
}

impl core::ops::Deref for Mem {
    type Target = MemCore;

    fn deref(&self) -> &MemCore {
        &self.core
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // Leave the registry; the core (and with it the chunks) goes when the last reference
        // does, outside the registry's lock.
        let _core = registry::remove(self.core.serial);
    }
}

/// The mappings a freed mem gave up, dropped in field order (uvm_mem's): the CPU kernel
/// mapping, the GPU user mappings, the GPU kernel mappings and their VA offset, then the DMA
/// tables. It also holds the address space whose `mmap` filled a VMA of the mem, for the zap.
#[must_use = "drop it after zapping the user mappings"]
pub(crate) struct Retired {
    filled_by: Option<ARef<Mm>>,
    _kmap: Option<Arc<cpu::KernelMapping>>,
    _gpu_user: KVec<(u32, gpu_va::GpuMapping)>,
    _gpu_kernel: KVec<(u32, gpu_va::GpuMapping)>,
    _kva: Option<gpu_va::KernelVa>,
    _gpus: KVec<(u32, Arc<GpuTable>)>,
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

impl Retired {
    /// Takes the mappings of GPU `id` out (a GPU's removal), the GPU kernel VA offset with the
    /// last GPU kernel mapping.
    fn take_gpu(&mut self, id: u32) -> gpu::Parked {
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
        }
    }

    /// Counts what it holds into `bump` (the audit's walk): `chunk_size` per DMA-mapped chunk.
    fn walk(&self, chunk_size: u64, bump: &mut impl FnMut(Class, u64)) {
        bump(Class::KernelMaps, u64::from(self._kmap.is_some()));
        bump(Class::GpuKernelVas, u64::from(self._kva.is_some()));
        for (_, table) in self._gpus.iter() {
            let n = table.count() as u64;
            bump(Class::DmaMappings, n);
            bump(Class::DmaBytes, n * chunk_size);
        }
    }
}

/// What `RUVM_IOCTL_MEM_QUERY` reports.
pub(crate) struct MemInfo {
    pub(crate) size: u64,
    pub(crate) layout: Layout,
    pub(crate) mmap_offset: u64,
    pub(crate) cpu_kernel: bool,
    pub(crate) user_mappings: u32,
    pub(crate) alloc_flags: u32,
    pub(crate) mapped_gpus: GpuSet,
    /// Its GPU kernel VA, while any GPU has it mapped in its kernel VA space.
    pub(crate) gpu_kernel: Option<u64>,
    /// Whether any GPU has it mapped in its file's user VA space.
    pub(crate) gpu_user: bool,
    /// The GPU of a vidmem mem.
    pub(crate) vidmem_gpu: Option<u32>,
}

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
        ask: &Asker<'_>,
        own: Tag,
    ) -> Result<Made> {
        if req.pool.as_ref().is_none_or(|p| p.vid_gpu().is_some()) || req.gpu.is_some() {
            return Err(crate::bind::errno::eopnotsupp());
        }
        let r = Self::try_alloc(req, quota, origin, Some((ask, own)));
        if r.is_err() {
            audit::stats::alloc_failed(req.stats_backing());
        }
        r
    }

    fn try_alloc(
        req: &AllocRequest,
        quota: &Arc<Quota>,
        origin: Origin,
        ordered: Option<(&Asker<'_>, Tag)>,
    ) -> Result<Made> {
        static SERIAL: Atomic<u64> = Atomic::new(1);
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
        // A pool mem's charge comes from the pool, with its chunks.
        let charge = match &req.pool {
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
        let (layout, storage, mut lease) = match &req.pool {
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
                let (taken, from, own) = match ordered {
                    None => (storage::from_pool(p, req, &layout)?, Tags::none(), None),
                    Some((ask, own)) => {
                        let count = usize::try_from(layout.chunk_count)?;
                        let o = p.take_ordered(count, ask, storage::stop_on_signal)?;
                        wait = o.wait;
                        (o.taken, o.tags, Some(own))
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
                };
                if lease.own.is_some() {
                    lease.from.reserve(1)?;
                }
                (layout, storage, Some(lease))
            }
        };
        let bytes_class = match storage {
            Storage::Sys(_) => Class::SysmemBytes,
            Storage::Vid(_) => Class::VidmemBytes,
        };
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
        let serial = SERIAL.fetch_add(1, Relaxed);
        let core = Arc::pin_init(
            try_pin_init!(MemCore {
                serial,
                size: req.size,
                layout,
                alloc_flags,
                mmap: Some(mmap),
                storage,
                user_mappings: Atomic::new(0),
                leased: lease.is_some(),
                handed: Atomic::new(false),
                state <- new_mutex!(MemState {
                    life: Life::Owned,
                    kmap: None,
                    gpu_user: KVec::new(),
                    user_va: None,
                    gpu_kernel: KVec::new(),
                    kva: None,
                    gpus: KVec::new(),
                    lease,
                    filled_by: None,
                    parked: None,
                }),
                origin,
                _mems: Counted::new(Class::Mems, 1),
                _bytes: Counted::new(bytes_class, layout.physical_size),
                _usage: Usage::new(req.stats_backing(), layout.physical_size, req.size),
            }),
            GFP_KERNEL,
        )?;
        let mem = Arc::new(
            Mem {
                core: core.clone(),
                _charge: charge,
            },
            GFP_KERNEL,
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

    /// The caller got the mem (its handle was written back): from now on a pool mem's chunks
    /// go back to the pool as a freed mem's. Until then, dropping the mem undoes the pool's
    /// allocation.
    pub(crate) fn commit(&self) {
        if self.leased {
            if let Some(l) = self.state.lock().lease.as_mut() {
                l.made = true;
            }
        }
        if let Storage::Vid(v) = &self.storage {
            v.made();
        }
    }

    /// A sysmem mem's chunks.
    pub(crate) fn sys_pages(&self) -> Option<Arc<crate::gpu::dma::Pages>> {
        match &self.storage {
            Storage::Sys(p) => Some(p.clone()),
            Storage::Vid(_) => None,
        }
    }

    /// Where the mem is mapped with `mmap`.
    pub(crate) fn mmap_offset(&self) -> u64 {
        self.mmap.as_ref().map_or(0, offsets::MmapRange::offset)
    }

    /// The mem's layout (chunk size, count, physical size).
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// Everything the mem knows about itself.
    pub(crate) fn info(&self) -> MemInfo {
        let (cpu_kernel, mapped_gpus, gpu_kernel, gpu_user) = {
            let st = self.state.lock();
            let mask: GpuSet = st.gpus.iter().map(|(id, _)| *id).collect();
            (
                st.kmap.is_some(),
                mask,
                st.kva.as_ref().map(gpu_va::KernelVa::va),
                !st.gpu_user.is_empty(),
            )
        };
        MemInfo {
            size: self.size,
            layout: self.layout,
            mmap_offset: self.mmap_offset(),
            cpu_kernel,
            user_mappings: self.user_mappings.load(Relaxed),
            alloc_flags: self.alloc_flags,
            mapped_gpus,
            gpu_kernel,
            gpu_user,
            vidmem_gpu: self.storage.vidmem_gpu(),
        }
    }

    /// Checks that `[offset, offset + len)` is inside the physical size; returns it as `usize`s.
    fn range(&self, offset: u64, len: u64) -> Result<(usize, usize)> {
        let end = offset.checked_add(len).ok_or(EOVERFLOW)?;
        if end > self.layout.physical_size {
            return Err(EINVAL);
        }
        Ok((usize::try_from(offset)?, usize::try_from(len)?))
    }

    /// The chunk size as a `usize` (non-zero by the policy).
    fn chunk_len(&self) -> Result<usize> {
        match usize::try_from(self.layout.chunk_size)? {
            0 => Err(EINVAL),
            n => Ok(n),
        }
    }

    /// Frees the mem in its owner's name: it becomes [`Life::Freed`] and gives up its CPU
    /// kernel mapping, GPU user and kernel mappings and DMA tables, which the caller drops after
    /// zapping the user mappings (uvm_mem's order: CPU user, CPU kernel, GPU user, GPU kernel,
    /// GPU phys). The chunks go with the last reference.
    pub(crate) fn retire(&self) -> Retired {
        let mut st = self.state.lock();
        st.life = Life::Freed;
        if let Some(access) = st.lease.as_ref().map(|l| l.pool.access()) {
            // The tables of the pool's GPUs stay, for the pool's cache (which decides, under
            // its lock, what it keeps of them: `pool::PoolState::keeps`).
            let kept = |id: u32| access.contains(id);
            let mine = core::mem::replace(&mut st.gpus, KVec::new());
            if mine.iter().all(|(id, _)| kept(*id)) {
                if let Some(l) = st.lease.as_mut() {
                    give_tables(&mut l.tables, mine);
                }
            } else {
                for (id, t) in mine {
                    // A table with no room to go anywhere is dropped (unmapped) here.
                    let _ = match st.lease.as_mut() {
                        Some(l) if kept(id) => l.tables.push((id, t), GFP_KERNEL),
                        _ => st.gpus.push((id, t), GFP_KERNEL),
                    };
                }
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
        }
    }

    /// A freed pool mem's chunks go to its pool's pending list, waiting for `free` (the point
    /// of the stream that freed it) and the points they waited for already; the mem keeps them
    /// for the work queued before the free. Called once the mem is retired and its user
    /// mappings zapped (nothing but queued work may touch the chunks then). Nothing for a mem
    /// of no pool. Without memory to note the point, the chunks are not reused: they are
    /// freed with the mem.
    pub(crate) fn hand_over(&self, free: Tag) {
        if !self.leased {
            return;
        }
        let taken = {
            let mut st = self.state.lock();
            let Some(l) = st.lease.as_mut() else {
                return;
            };
            let Some(pages) = l.pages.take() else {
                return;
            };
            // The lease gives nothing back any more; the audit finds the chunks pending.
            self.handed.store(true, Relaxed);
            let tables = core::mem::replace(&mut l.tables, KVec::new());
            let charge = l.charge.take();
            let tags = l.tags();
            (l.pool.clone(), pages, tables, charge, tags)
        };
        let (pool, pages, tables, charge, mut tags) = taken;
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
        pool.give_back(pages, tables, None, None, charge, tags);
    }

    /// Keeps what a mem freed on a stream gave up (its mappings), until [`Mem::unpark`] when
    /// the stream reaches the free.
    pub(crate) fn park(&self, retired: Retired) {
        let old = self.state.lock().parked.replace(retired);
        drop(old);
    }

    /// What [`Mem::park`] kept, to be dropped (the stream reached the free).
    pub(crate) fn unpark(&self) -> Option<Retired> {
        self.state.lock().parked.take()
    }

    /// Marks the mem as planted: no owner, mappings kept (test-only leaks).
    fn disown(&self) {
        let mut st = self.state.lock();
        if st.life == Life::Owned {
            st.life = Life::Planted;
        }
    }
}
