// SPDX-License-Identifier: GPL-2.0

//! A mem: ruvm's `uvm_mem_t`, one allocation made of equal physical chunks, and its life.
//!
//! This file owns the mem object and its lifecycle; its parts live beside it: [`storage`]
//! (sysmem pages and vidmem chunks), [`cpu`] (kernel and user mappings, and the kernel-side
//! byte operations), [`gpu`] (DMA tables and the copy engine's view), [`quota`] (what a file may
//! hold), [`offsets`] (where a mem is `mmap`ed), [`registry`] (every live mem, for the audit's
//! walk and GPU removal), [`plant`] (test-only leaks), [`tree`] (the tree of the registry
//! and of a file's handles, which keeps freed mems' nodes), [`lease`] (a pool mem's tie to
//! its pool, and how its chunks go back) and [`retired`] (what a freed mem gives up, dropped
//! at once or parked until a stream reaches its free). It must not touch files or ioctl
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
};

mod alloc;
pub(crate) mod bench;
pub(crate) mod copy;
pub(crate) mod cpu;
mod dmabuf;
pub(crate) mod gpu;
pub(crate) mod gpu_va;
mod lease;
pub(crate) mod offsets;
pub(crate) mod pattern;
pub(crate) mod plant;
pub(crate) mod policy;
pub(crate) mod pool;
pub(crate) mod quota;
pub(crate) mod register;
pub(crate) mod registry;
mod retired;
pub(crate) mod share;
pub(crate) mod sparse;
pub(crate) mod storage;
pub(crate) mod tree;

use lease::{give_tables, PoolLease};
pub(crate) use lease::{Borrow, Lent, Made, StreamAlloc};
use policy::{Layout, PolicyError};
use quota::Charge;
pub(crate) use retired::Retired;
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
    register::init()?;
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
    register::exit();
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

    /// How a mem's own objects are allocated: charged to the caller's memory cgroup
    /// (`__GFP_ACCOUNT`: the quota counts a mem's bytes, not these, about 1.2 KiB a mem), but
    /// for a mem `RUVM_IOCTL_TEST_LEAK` plants, whose loss kmemleak must see: it reported no
    /// accounted mem lost on purpose in 15 s on the debug kernel, and does an unaccounted one.
    pub(crate) fn gfp(&self) -> kernel::alloc::Flags {
        if self.ioctl == "TEST_LEAK" {
            GFP_KERNEL
        } else {
            GFP_KERNEL_ACCOUNT
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
    /// `RUVM_ALLOC_SPARSE`: made with every chunk absent ([`sparse`]).
    pub(crate) sparse: bool,
    /// `RUVM_ALLOC_MAP_USER`: mapped into the caller once made (by the ioctl layer); kept in
    /// the mem's flags.
    pub(crate) map_user: bool,
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
    /// Its own [`Mem`] (until dropped) and each import of it ([`share`]): the core leaves the
    /// registry when the last goes.
    holders: u32,
    /// Where it is in its sharing ([`share`]).
    export: share::Export,
    /// The exporter let go while imports lived, and the log said so.
    order_said: bool,
    /// Of the holders, those CUDA's free order does not concern: dma-bufs of the mem and
    /// their imports ([`dmabuf`]).
    quiet: u32,
    /// The reservation object of the mem's dma-bufs (made at the first export): the fences of
    /// the work on its bytes, for implicit sync ([`dmabuf`]).
    resv: Option<Arc<crate::bind::resv::Resv>>,
    /// The quota charge of a mem of no pool whose [`Mem`] went while other holders keep its
    /// chunks (a dma-buf, an import): it goes with them, so the file's limit counts them.
    kept_charge: Option<Charge>,
    /// A FREE of the mem planned in a submission lets a later ALLOC borrow its chunks: no user
    /// mapping may be made until that submission is queued or failed ([`lease::Lent`]).
    lending: bool,
    /// A sparse mem's chunks and their DMA tables ([`sparse`]).
    sparse: Option<sparse::Sparse>,
    /// Where `RUVM_ALLOC_MAP_USER` mapped the mem: the address space (held) and the address,
    /// which its `MEM_FREE` there unmaps.
    mapped_at: Option<(ARef<Mm>, usize)>,
    /// A registered mem's range in its process, watched for unmapping ([`register`]).
    user: Option<register::UserRange>,
}

impl MemState {
    /// The state of a mem just made, owned, with `lease` for a pool mem and `sparse` for a
    /// sparse one.
    fn new(lease: Option<PoolLease>, sparse: Option<sparse::Sparse>) -> Self {
        Self {
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
            holders: 1,
            export: share::Export::Never,
            order_said: false,
            quiet: 0,
            resv: None,
            kept_charge: None,
            lending: false,
            sparse,
            mapped_at: None,
            user: None,
        }
    }

    /// `ENOENT` unless the mem may gain mappings.
    fn mappable(&self) -> Result {
        match self.life {
            Life::Owned | Life::Planted => Ok(()),
            Life::Freed => Err(ENOENT),
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
    /// Its handle reached its caller: its chunks go back as a freed mem's from now on (see
    /// [`Mem::commit`]; set without the mem's lock under the file's, read under the mem's).
    committed: Atomic<bool>,
    /// Its export data was made ([`share`]): its drop takes its lock to let go.
    exported: Atomic<bool>,
    /// The handle of the sysmem pool its chunks came from (0: none), fixed when made.
    pool: u64,
    /// The file it was made for ([`quota::Quota::id`]).
    owner: u64,
    /// Dropped before the storage (field order is drop order): a mem dropped without being
    /// freed (at file close) still holds its mappings and tables, and they go before the
    /// chunks they map, as in uvm_mem.
    #[pin]
    state: Mutex<MemState>,
    storage: Storage,
    /// An imported mem: the exported mem's core, whose chunks `storage` shares (after
    /// `storage`: its pages go first).
    source: Option<share::Source>,
    origin: Origin,
    _mems: Counted,
    _bytes: Counted,
    /// Its place in the statistics (an imported mem's chunks are counted with its source).
    _usage: Option<Usage>,
}

#[pinned_drop]
impl PinnedDrop for MemCore {
    fn drop(self: Pin<&mut Self>) {
        if !self.leased {
            return;
        }
        if self.handed.load(Relaxed) {
            if let Storage::Sys(pages) = &self.storage {
                pages.unpin();
            }
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
                l.made |= this.committed.load(Relaxed);
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
        if self.core.exported.load(Relaxed) {
            // Imports may hold the core: it stays until the last of them goes, retired now (its
            // file's table, VA spaces and streams are going) if they do.
            let (last, retired) = {
                let mut st = self.core.state.lock();
                self.core.withdraw(&mut st);
                st.holders = st.holders.saturating_sub(1);
                let retired = (st.holders > 0 && st.life == Life::Owned)
                    .then(|| Self::retire_locked(&mut st, false));
                if st.holders > 0 {
                    st.kept_charge = self._charge.take();
                }
                (st.holders == 0, retired)
            };
            drop(retired);
            if !last {
                return;
            }
        }
        // Leave the registry; the core (and with it the chunks) goes when the last reference
        // does, outside the registry's lock.
        let _core = registry::remove(self.core.serial);
    }
}

/// A new mem serial (the registry's key), never reused while the module is loaded.
fn new_serial() -> u64 {
    static SERIAL: Atomic<u64> = Atomic::new(1);
    SERIAL.fetch_add(1, Relaxed)
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
    /// The caller got the mem (its handle was written back): from now on a pool mem's chunks
    /// go back to the pool as a freed mem's. Until then, dropping the mem undoes the pool's
    /// allocation.
    pub(crate) fn commit(&self) {
        self.committed.store(true, Relaxed);
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
            Storage::Vid(_) | Storage::Buf(_) | Storage::Sparse => None,
        }
    }

    /// Notes that the mem's handle is about to reach its caller (under the file's lock, before
    /// the handle enters its table): see [`Mem::commit`], which follows.
    pub(crate) fn mark_committed(&self) {
        self.committed.store(true, Relaxed);
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
            let sparse = st.sparse.iter().flat_map(|s| s.gpu_ids());
            let mask: GpuSet = Iterator::chain(st.gpus.iter().map(|(id, _)| *id), sparse).collect();
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

    /// Marks the mem as planted: no owner, mappings kept (test-only leaks).
    fn disown(&self) {
        let mut st = self.state.lock();
        if st.life == Life::Owned {
            st.life = Life::Planted;
        }
    }
}
