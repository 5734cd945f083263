// SPDX-License-Identifier: GPL-2.0

//! A mem: ruvm's `uvm_mem_t`, one allocation made of equal physical chunks, and its mappings.
//!
//! # Lifetime
//!
//! A [`Mem`] is shared (`Arc`) by the handle table of the file that allocated it and by every
//! user VMA that maps it (see [`crate::bind::vma`]). `RUVM_IOCTL_MEM_FREE` removes the handle,
//! drops the CPU kernel mapping and zaps every user mapping (later accesses fault); the chunks go
//! back to the page allocator when the last holder is gone, which is at once unless a VMA still
//! exists. So nothing a process maps can outlive the mem that accounts for it.
//!
//! # Locking
//!
//! One mutex per mem ([`MemState`]), taken after the file's mutex is released (never nested in
//! it), and never held while touching user memory. The `mmap` path takes it under the mmap lock.
//! `unmap_mapping_range` (the zap) runs without it.

use core::num::NonZeroUsize;

use kernel::{
    mm::virt::{flags as vm_flags, VmaNew},
    new_mutex,
    page::{BorrowedPage, PAGE_SIZE},
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc, Mutex,
    },
};

use crate::{
    audit::{self, Class, Counted, StatsBacking, Usage, CLASSES},
    bind::{
        dma::{ChunkSource, DmaTable},
        globals::MEM_REGISTRY,
        pages::{Chunk, ChunkFlags},
        task,
        vma::{self, VmaOwner},
        vmap::{PageSource, VMap},
    },
    gpu::{pmm::VidChunk, GpuDev},
    uapi,
};

pub(crate) mod pattern;
pub(crate) mod policy;

use policy::{Backing, Layout, PolicyError};

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

/// Bytes of mems a file may hold at once, shared by the file and its mems: a mem gives its
/// bytes back when it is dropped, even after the file's table let it go.
pub(crate) struct Quota {
    used: Atomic<u64>,
    limit: u64,
}

impl Quota {
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            used: Atomic::new(0),
            limit,
        }
    }

    /// Takes `bytes` from the quota, or fails with `ENOSPC`.
    fn charge(self: &Arc<Self>, bytes: u64) -> Result<Charge> {
        reserve(&self.used, bytes, self.limit)?;
        Ok(Charge {
            quota: self.clone(),
            bytes,
        })
    }
}

/// Adds `n` to `counter` unless the sum would pass `limit` (`ENOSPC`); returns the old value.
fn reserve(counter: &Atomic<u64>, n: u64, limit: u64) -> Result<u64> {
    let mut cur = counter.load(Relaxed);
    loop {
        let next = cur.checked_add(n).filter(|&v| v <= limit).ok_or(ENOSPC)?;
        match counter.cmpxchg(cur, next, Relaxed) {
            Ok(_) => return Ok(cur),
            Err(now) => cur = now,
        }
    }
}

/// Bytes taken from a [`Quota`], given back on drop.
struct Charge {
    quota: Arc<Quota>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.quota.used.fetch_sub(self.bytes, Relaxed);
    }
}

/// Where a mem can be mapped with `mmap`: offsets are handed out once per module lifetime, so
/// zapping a mem's range of the device file hits that mem's mappings and no other's.
fn new_mmap_offset(len: u64) -> Result<u64> {
    static NEXT: Atomic<u64> = Atomic::new(0);
    // File offsets are `loff_t`.
    reserve(&NEXT, len, i64::MAX as u64)
}

/// The chunks of a sysmem mem, in order.
pub(crate) struct SysPages {
    chunks: KVVec<Chunk>,
    /// Pages per chunk, as a shift.
    order: u32,
    _audit: Counted,
}

impl SysPages {
    /// Takes ownership of allocated chunks of `2^order` pages each.
    fn new(chunks: KVVec<Chunk>, order: u32) -> Self {
        let n = chunks.len() as u64;
        Self {
            chunks,
            order,
            _audit: Counted::new(Class::SysmemChunks(order), n),
        }
    }
}

impl SysPages {
    /// The `i`-th `PAGE_SIZE` page of the mem.
    fn page(&self, i: usize) -> Option<BorrowedPage<'_>> {
        self.chunks
            .get(i >> self.order)?
            .page(i & ((1 << self.order) - 1))
    }
}

impl ChunkSource for SysPages {
    fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    fn chunk_len(&self) -> usize {
        PAGE_SIZE << self.order
    }

    fn chunk_page(&self, i: usize) -> Option<core::ptr::NonNull<kernel::bindings::page>> {
        self.chunks.get(i)?.page_ptr(0)
    }
}

impl PageSource for SysPages {
    fn page_count(&self) -> usize {
        self.chunks.len() << self.order
    }

    fn page_ptr(&self, i: usize) -> Option<core::ptr::NonNull<kernel::bindings::page>> {
        self.chunks
            .get(i >> self.order)?
            .page_ptr(i & ((1 << self.order) - 1))
    }
}

/// The chunks of a vidmem mem, in order, from its GPU's PMM.
pub(crate) struct VidPages {
    /// The GPU whose memory it is (as it was bound when the mem was made).
    gpu: Arc<GpuDev>,
    chunks: KVVec<VidChunk>,
    _audit: Counted,
}

/// What holds a mem's bytes.
enum Storage {
    Sys(Arc<SysPages>),
    Vid(VidPages),
}

impl VidPages {
    /// `ENODEV` unless `gpu` is this mem's GPU, still bound (the same binding: a GPU that was
    /// unbound took its memory with it, even if it is back); `EINVAL` for another GPU (peer
    /// access is not supported).
    fn check_gpu(&self, gpu: &GpuDev) -> Result {
        if self.gpu.id != gpu.id {
            return Err(EINVAL);
        }
        if !core::ptr::eq(&*self.gpu, gpu) {
            return Err(ENODEV);
        }
        Ok(())
    }

    /// The vidmem address of byte `offset` (of a chunk of `chunk` bytes).
    fn phys(&self, offset: usize, chunk: NonZeroUsize) -> Result<u64> {
        let c = self.chunks.get(offset / chunk).ok_or(EINVAL)?;
        Ok(c.phys() + (offset % chunk) as u64)
    }
}

/// The DMA address of byte `offset` of a mem (chunks of `chunk` bytes) in its table `t`.
fn table_addr(t: &DmaTable<SysPages>, offset: usize, chunk: NonZeroUsize) -> Result<u64> {
    Ok(t.addrs().get(offset / chunk).ok_or(EINVAL)? + (offset % chunk) as u64)
}

/// How a GPU's engine reaches one mem: through its DMA table, or in its own memory.
enum EngineView<'a> {
    Table(Arc<DmaTable<SysPages>>),
    Vid(&'a VidPages),
}

impl EngineView<'_> {
    /// The DMA address at which the engine reaches byte `offset` (chunks of `chunk` bytes).
    fn addr(&self, offset: usize, chunk: NonZeroUsize) -> Result<u64> {
        match self {
            EngineView::Table(t) => table_addr(t, offset, chunk),
            EngineView::Vid(v) => {
                let pmm = v.gpu.pmm.as_ref().ok_or(ENODEV)?;
                pmm.engine_addr(v.phys(offset, chunk)?)
            }
        }
    }
}

/// The CPU kernel mapping of a sysmem mem.
type KernelMap = VMap<SysPages>;

/// A CPU kernel mapping, counted by the audit.
pub(crate) struct KernelMapping {
    map: KernelMap,
    _audit: Counted,
}

impl KernelMapping {
    fn new(pages: Arc<SysPages>) -> Result<Self> {
        Ok(Self {
            map: KernelMap::new(pages)?,
            _audit: Counted::new(Class::KernelMaps, 1),
        })
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
}

fn policy_error(e: PolicyError) -> Error {
    match e {
        PolicyError::ZeroSize | PolicyError::BadPageSize => EINVAL,
        PolicyError::Overflow => EOVERFLOW,
    }
}

/// Where a mem came from, for the level-2 audit report.
pub(crate) struct Origin {
    pid: i32,
    ioctl: &'static str,
    born: kernel::time::Instant<kernel::time::Monotonic>,
}

impl Origin {
    /// The calling task, now.
    pub(crate) fn here(ioctl: &'static str) -> Self {
        Self {
            pid: task::current_pid(),
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

/// The state of a mem that the audit's registry can see. It lives exactly as long as its
/// [`Mem`]: the registry's reference is removed when the `Mem` goes.
#[pin_data]
pub(crate) struct MemCore {
    serial: u64,
    size: u64,
    layout: Layout,
    alloc_flags: u32,
    mmap_offset: u64,
    storage: Storage,
    /// How many user VMAs map the mem.
    user_mappings: Atomic<u32>,
    #[pin]
    state: Mutex<MemState>,
    origin: Origin,
    _mems: Counted,
    _bytes: Counted,
    _usage: Usage,
}

/// One mem, as its holders (a file's table, user VMAs) see it.
pub(crate) struct Mem {
    core: Arc<MemCore>,
    _charge: Charge,
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
        let _core = MEM_REGISTRY
            .lock()
            .as_mut()
            .and_then(|r| r.remove(&self.core.serial));
    }
}

/// The mutable part of a mem.
struct MemState {
    /// The CPU kernel mapping; an `Arc` so that an operation in flight keeps it while another
    /// thread unmaps.
    kmap: Option<Arc<KernelMapping>>,
    /// The DMA address table of each GPU the mem is mapped on, by GPU id. An `Arc`, so that a
    /// copy in flight keeps its table while another thread unmaps.
    gpus: KVec<(u32, Arc<DmaTable<SysPages>>)>,
    /// Freed by its owner (or never had one): no handle, no new mappings.
    freed: bool,
}

impl MemState {
    /// Takes the DMA table for GPU `id` out of the mem, if it has one.
    fn take_gpu(&mut self, id: u32) -> Option<Arc<DmaTable<SysPages>>> {
        let at = self.gpus.iter().position(|(g, _)| *g == id)?;
        self.gpus.remove(at).ok().map(|(_, t)| t)
    }

    /// Bit `n` set: a DMA table for GPU `n`.
    fn gpu_mask(&self) -> u64 {
        self.gpus
            .iter()
            .fold(0, |m, (id, _)| m | 1u64.checked_shl(*id).unwrap_or(0))
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
    pub(crate) mapped_gpus: u64,
    /// The GPU of a vidmem mem.
    pub(crate) vidmem_gpu: Option<u32>,
}

impl Mem {
    /// Allocates a sysmem mem, charging its physical size to `quota`. On error nothing is left
    /// behind: chunks already allocated are freed, the charge is given back.
    pub(crate) fn alloc(
        req: &AllocRequest,
        quota: &Arc<Quota>,
        origin: Origin,
    ) -> Result<Arc<Mem>> {
        let r = Self::try_alloc(req, quota, origin);
        if r.is_err() {
            audit::alloc_failed(stats_backing(req));
        }
        r
    }

    fn try_alloc(req: &AllocRequest, quota: &Arc<Quota>, origin: Origin) -> Result<Arc<Mem>> {
        static SERIAL: Atomic<u64> = Atomic::new(1);
        let page = PAGE_SIZE as u64;
        let backing = match &req.gpu {
            None => Backing::Sysmem,
            Some(gpu) => Backing::Vidmem {
                gpu_page_sizes: gpu.page_sizes,
                numa: false,
            },
        };
        let layout =
            policy::layout(backing, req.size, req.page_size, page).map_err(policy_error)?;
        if layout.physical_size > req.max_bytes {
            return Err(ENOSPC);
        }
        let charge = quota.charge(layout.physical_size)?;
        let (layout, storage) = match &req.gpu {
            None => {
                let (layout, pages) = alloc_chunks(req, layout)?;
                (layout, Storage::Sys(Arc::new(pages, GFP_KERNEL)?))
            }
            Some(gpu) => (layout, Storage::Vid(alloc_vidmem(gpu, &layout)?)),
        };
        let bytes_class = match storage {
            Storage::Sys(_) => Class::SysmemBytes,
            Storage::Vid(_) => Class::VidmemBytes,
        };
        let mmap_offset = new_mmap_offset(layout.physical_size)?;
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
                mmap_offset,
                storage,
                user_mappings: Atomic::new(0),
                state <- new_mutex!(MemState {
                    kmap: None,
                    gpus: KVec::new(),
                    freed: false,
                }),
                origin,
                _mems: Counted::new(Class::Mems, 1),
                _bytes: Counted::new(bytes_class, layout.physical_size),
                _usage: Usage::new(stats_backing(req), layout.physical_size, req.size),
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
        let mut registry = MEM_REGISTRY.lock();
        let r = registry.get_or_insert_with(kernel::rbtree::RBTree::new);
        r.try_create_and_insert(serial, core, GFP_KERNEL)?;
        drop(registry);
        Ok(mem)
    }

    /// Where the mem is mapped with `mmap`.
    pub(crate) fn mmap_offset(&self) -> u64 {
        self.mmap_offset
    }

    /// The mem's layout (chunk size, count, physical size).
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// The chunk size, as a non-zero `usize` (for offsets within the mem).
    fn chunk_len(&self) -> Result<NonZeroUsize> {
        NonZeroUsize::new(usize::try_from(self.layout.chunk_size)?).ok_or(EINVAL)
    }

    /// The sysmem pages, or `EOPNOTSUPP` for vidmem (which the CPU cannot map: as in uvm_mem
    /// for GPUs whose memory is not CPU-coherent).
    fn sys_pages(&self) -> Result<&Arc<SysPages>> {
        match &self.storage {
            Storage::Sys(p) => Ok(p),
            Storage::Vid(_) => Err(eopnotsupp()),
        }
    }

    /// Everything the mem knows about itself.
    pub(crate) fn info(&self) -> MemInfo {
        let (cpu_kernel, mapped_gpus) = {
            let st = self.state.lock();
            (st.kmap.is_some(), st.gpu_mask())
        };
        MemInfo {
            size: self.size,
            layout: self.layout,
            mmap_offset: self.mmap_offset,
            cpu_kernel,
            user_mappings: self.user_mappings.load(Relaxed),
            alloc_flags: self.alloc_flags,
            mapped_gpus,
            vidmem_gpu: match &self.storage {
                Storage::Sys(_) => None,
                Storage::Vid(v) => Some(v.gpu.id),
            },
        }
    }

    /// Maps the mem for the CPU kernel (vmap of every page). Idempotent.
    pub(crate) fn map_cpu_kernel(&self) -> Result {
        let mut st = self.state.lock();
        if st.freed {
            return Err(ENOENT);
        }
        if st.kmap.is_none() {
            let map = KernelMapping::new(self.sys_pages()?.clone())?;
            st.kmap = Some(Arc::new(map, GFP_KERNEL)?);
        }
        Ok(())
    }

    /// Removes the CPU kernel mapping. Idempotent; an operation in flight keeps the mapping
    /// until it is done.
    pub(crate) fn unmap_cpu_kernel(&self) {
        // Dropped after the lock is released.
        let _old = self.state.lock().kmap.take();
    }

    /// The CPU kernel mapping, or `ENXIO` if there is none.
    fn kmap(&self) -> Result<Arc<KernelMapping>> {
        self.state.lock().kmap.clone().ok_or(ENXIO)
    }

    /// Checks that `[offset, offset + len)` is inside the physical size; returns it as `usize`s.
    fn range(&self, offset: u64, len: u64) -> Result<(usize, usize)> {
        let end = offset.checked_add(len).ok_or(EOVERFLOW)?;
        if end > self.layout.physical_size {
            return Err(EINVAL);
        }
        Ok((usize::try_from(offset)?, usize::try_from(len)?))
    }

    /// Writes the pattern (or a byte) over a range, through the CPU kernel mapping.
    pub(crate) fn fill(&self, offset: u64, len: u64, fill: Fill) -> Result {
        let (offset, len) = self.range(offset, len)?;
        let map = self.kmap()?;
        let mut buf = [0u8; 512];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len());
            let piece = buf.get_mut(..n).ok_or(EINVAL)?;
            fill.generate(offset + done, piece);
            map.map.write(offset + done, piece)?;
            done += n;
        }
        Ok(())
    }

    /// Compares a range with the pattern (or a byte) through the CPU kernel mapping: returns
    /// how many bytes differ and the offset of the first (`u64::MAX` if none).
    pub(crate) fn verify(&self, offset: u64, len: u64, fill: Fill) -> Result<(u64, u64)> {
        let (offset, len) = self.range(offset, len)?;
        let map = self.kmap()?;
        let mut want = [0u8; 256];
        let mut got = [0u8; 256];
        let (mut mismatches, mut first) = (0u64, u64::MAX);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(want.len());
            let (w, g) = (
                want.get_mut(..n).ok_or(EINVAL)?,
                got.get_mut(..n).ok_or(EINVAL)?,
            );
            fill.generate(offset + done, w);
            map.map.read(offset + done, g)?;
            for (i, (a, b)) in w.iter().zip(g.iter()).enumerate() {
                if a != b {
                    if mismatches == 0 {
                        first = (offset + done + i) as u64;
                    }
                    mismatches += 1;
                }
            }
            done += n;
        }
        Ok((mismatches, first))
    }

    /// Copies `len` bytes from `src` to `dst` through their CPU kernel mappings.
    pub(crate) fn copy(dst: &Mem, dst_offset: u64, src: &Mem, src_offset: u64, len: u64) -> Result {
        let (dst_offset, len) = dst.range(dst_offset, len)?;
        let (src_offset, _) = src.range(src_offset, len as u64)?;
        let (dst_map, src_map) = (dst.kmap()?, src.kmap()?);
        KernelMap::copy(&dst_map.map, dst_offset, &src_map.map, src_offset, len)
    }

    /// Marks the mem as having no owner (no handle) while keeping its mappings: for leaks
    /// planted on purpose.
    fn disown(&self) {
        self.state.lock().freed = true;
    }

    /// Marks the mem freed by its owner, drops its CPU kernel mapping, then its DMA tables (uvm_mem's
    /// order after the user mapping, which the caller zapped first). The chunks go with the last
    /// reference.
    pub(crate) fn retire(&self) {
        let _old = {
            let mut st = self.state.lock();
            st.freed = true;
            let kmap = st.kmap.take();
            let gpus = core::mem::replace(&mut st.gpus, KVec::new());
            (kmap, gpus)
        };
    }

    /// Makes (if it has none yet) the mem's DMA address table for `gpu`. Idempotent. For
    /// vidmem: nothing to do on its own GPU, `EINVAL` on another.
    pub(crate) fn map_gpu(&self, gpu: &GpuDev) -> Result {
        // Held across the mapping: the GPU cannot be removed meanwhile.
        let alive = gpu.alive.lock();
        if !*alive {
            return Err(ENODEV);
        }
        let pages = match &self.storage {
            Storage::Sys(p) => p,
            Storage::Vid(v) => return v.check_gpu(gpu),
        };
        let mut st = self.state.lock();
        if st.freed {
            return Err(ENOENT);
        }
        if st.gpus.iter().any(|(id, _)| *id == gpu.id) {
            return Ok(());
        }
        let table = DmaTable::new(gpu.dma.clone(), pages.clone(), gpu.limit)?;
        st.gpus
            .push((gpu.id, Arc::new(table, GFP_KERNEL)?), GFP_KERNEL)?;
        Ok(())
    }

    /// Drops the mem's DMA address table for GPU `id`, unmapping it. Idempotent.
    pub(crate) fn unmap_gpu(&self, id: u32) {
        // Dropped (unmapped) after the lock is released.
        let _old = self.state.lock().take_gpu(id);
    }

    /// The mem's DMA table for GPU `id`, or `ENXIO`.
    fn gpu_table(&self, id: u32) -> Result<Arc<DmaTable<SysPages>>> {
        let st = self.state.lock();
        st.gpus
            .iter()
            .find(|(g, _)| *g == id)
            .map(|(_, t)| t.clone())
            .ok_or(ENXIO)
    }

    /// Copies `len` bytes from `src` to `dst` with `gpu`'s copy engine, addressing both only
    /// through their DMA tables for that GPU. The GPU cannot be removed meanwhile.
    pub(crate) fn ce_copy(
        gpu: &GpuDev,
        dst: &Mem,
        dst_offset: u64,
        src: &Mem,
        src_offset: u64,
        len: u64,
    ) -> Result {
        let engine = gpu.engine.as_ref().ok_or(ENODEV)?;
        let alive = gpu.alive.lock();
        if !*alive {
            return Err(ENODEV);
        }
        let (dst_offset, len) = dst.range(dst_offset, len)?;
        let (src_offset, _) = src.range(src_offset, len as u64)?;
        let (dt, st) = (dst.engine_view(gpu)?, src.engine_view(gpu)?);
        let (dc, sc) = (dst.chunk_len()?, src.chunk_len()?);
        let mut done = 0;
        while done < len {
            let (s, d) = (src_offset + done, dst_offset + done);
            // A piece stays inside one chunk of each mem: chunks are contiguous only inside.
            let piece = (len - done)
                .min(engine.max_piece())
                .min(sc.get() - s % sc)
                .min(dc.get() - d % dc);
            let (s_addr, d_addr) = (st.addr(s, sc)?, dt.addr(d, dc)?);
            engine.copy(&gpu.dma, d_addr, s_addr, piece)?;
            done += piece;
        }
        drop(alive);
        Ok(())
    }

    /// How `gpu`'s engine reaches the mem: its DMA table for the GPU (`ENXIO` without one), or,
    /// for vidmem, the GPU's own memory (see [`VidPages::check_gpu`]).
    fn engine_view(&self, gpu: &GpuDev) -> Result<EngineView<'_>> {
        match &self.storage {
            Storage::Sys(_) => Ok(EngineView::Table(self.gpu_table(gpu.id)?)),
            Storage::Vid(v) => v.check_gpu(gpu).map(|()| EngineView::Vid(v)),
        }
    }

    /// The GPU address of `[offset, offset + len)`, which must lie in one chunk (`EINVAL`):
    /// for sysmem its DMA address on `gpu` (`ENXIO` if not mapped there), for vidmem its vidmem
    /// address (`gpu` must be its GPU). Returns the address and its `enum ruvm_aperture`.
    pub(crate) fn gpu_phys(&self, gpu: &GpuDev, offset: u64, len: u64) -> Result<(u64, u32)> {
        if len == 0 {
            return Err(EINVAL);
        }
        let (offset, len) = self.range(offset, len)?;
        let chunk = self.chunk_len()?;
        if offset / chunk != (offset + len - 1) / chunk {
            return Err(EINVAL);
        }
        match &self.storage {
            Storage::Sys(_) => {
                let table = self.gpu_table(gpu.id)?;
                Ok((
                    table_addr(&table, offset, chunk)?,
                    uapi::ruvm_aperture_RUVM_APERTURE_SYS,
                ))
            }
            Storage::Vid(v) => {
                v.check_gpu(gpu)?;
                Ok((
                    v.phys(offset, chunk)?,
                    uapi::ruvm_aperture_RUVM_APERTURE_VID,
                ))
            }
        }
    }

    /// The DMA addresses of chunks `first..` on GPU `id`, at most `max`; `ENXIO` if the mem is not
    /// mapped on it (a vidmem mem never is: it has no DMA addresses).
    pub(crate) fn dma_addrs(&self, id: u32, first: u64, max: usize) -> Result<KVVec<u64>> {
        let table = self.gpu_table(id)?;
        let first = usize::try_from(first).map_err(|_| EINVAL)?;
        let addrs = table.addrs().get(first..).ok_or(EINVAL)?;
        let n = addrs.len().min(max);
        let mut out = KVVec::with_capacity(n, GFP_KERNEL)?;
        for a in addrs.iter().take(n) {
            out.push(*a, GFP_KERNEL)?;
        }
        Ok(out)
    }

    /// Maps the whole mem into a VMA being created by `mmap`. The VMA must be shared, as long as
    /// the physical size, and not executable; it is never copied to a child (`VM_DONTCOPY`),
    /// never made executable (`VM_MAYEXEC` cleared), never expanded, never split.
    pub(crate) fn map_user(self: &Arc<Self>, vma: &VmaNew) -> Result {
        let len = vma.end().checked_sub(vma.start()).ok_or(EINVAL)?;
        if len as u64 != self.layout.physical_size {
            return Err(EINVAL);
        }
        if vma.flags() & vm_flags::SHARED == 0 {
            return Err(EINVAL);
        }
        if vma.executable() {
            return Err(EPERM);
        }
        vma.try_clear_mayexec()?;
        vma.set_dontcopy();
        vma.set_dontexpand();
        let pages = self.sys_pages()?;
        if self.state.lock().freed {
            return Err(ENXIO);
        }
        let map = vma.set_mixedmap();
        let mut addr = vma.start();
        for i in 0..pages.page_count() {
            let page = pages.page(i).ok_or(EINVAL)?;
            map.vm_insert_page(addr, &page)?;
            addr += PAGE_SIZE;
        }
        // Last: from here the VMA holds a reference on the mem.
        vma::install(vma, self.clone());
        Ok(())
    }

    /// Zaps every user mapping of the mem (in any process): later accesses get `SIGBUS`.
    pub(crate) fn zap_user(&self, file: &kernel::fs::File) -> Result {
        vma::zap(file, self.mmap_offset, self.layout.physical_size)
    }
}

impl VmaOwner for Mem {
    fn vma_opened(&self) {
        self.user_mappings.fetch_add(1, Relaxed);
        audit::add(Class::UserMappings, 1);
    }

    fn vma_closed(&self) {
        self.user_mappings.fetch_sub(1, Relaxed);
        audit::sub(Class::UserMappings, 1);
    }
}

/// Counts the real objects: every mem in the registry (its chunks, kernel mapping, user
/// mappings, and its handle unless freed), plus the planted leaks the audit still holds.
/// Compared with the counters by the audit's consistency check.
pub(crate) fn walk() -> [u64; CLASSES] {
    let mut v = [0u64; CLASSES];
    let mut bump = |class: Class, n: u64| {
        if let Some(x) = v.get_mut(class.index()) {
            *x += n;
        }
    };
    {
        let registry = MEM_REGISTRY.lock();
        for core in registry.iter().flat_map(|r| r.values()) {
            bump(Class::Mems, 1);
            match &core.storage {
                Storage::Sys(pages) => {
                    bump(Class::SysmemBytes, core.layout.physical_size);
                    bump(Class::SysmemChunks(pages.order), pages.chunks.len() as u64);
                }
                Storage::Vid(v) => {
                    bump(Class::VidmemBytes, core.layout.physical_size);
                    bump(Class::VidmemChunks, v.chunks.len() as u64);
                }
            }
            bump(Class::UserMappings, core.user_mappings.load(Relaxed).into());
            let st = core.state.lock();
            bump(Class::KernelMaps, u64::from(st.kmap.is_some()));
            bump(Class::Handles, u64::from(!st.freed));
            for (_, table) in st.gpus.iter() {
                let n = table.addrs().len() as u64;
                bump(Class::DmaMappings, n);
                bump(Class::DmaBytes, n * core.layout.chunk_size);
            }
        }
    }
    // Vidmem storage: counted per root chunk, and DMA-mapped (one 2 MiB mapping each).
    let (roots, mapped) = crate::gpu::walk_vidmem();
    bump(Class::VidmemRoots, roots);
    bump(Class::DmaMappings, mapped);
    bump(Class::DmaBytes, mapped * policy::CHUNK_MAX);
    for p in crate::bind::globals::UNLOAD.lock().planted.iter() {
        match p {
            // Its core is in the registry, counted above; it has no handle.
            Planted::Mem { .. } => {}
            Planted::Chunk { chunk, .. } => bump(Class::SysmemChunks(chunk.order()), 1),
            Planted::KernelMap(m) => {
                bump(Class::KernelMaps, 1);
                bump(
                    Class::SysmemChunks(m.map_pages().order),
                    m.map_pages().chunks.len() as u64,
                );
            }
        }
    }
    v
}

/// Drops every mem's DMA table for GPU `id` (the GPU is being removed, still bound).
pub(crate) fn drop_gpu_tables(id: u32) {
    let registry = MEM_REGISTRY.lock();
    for core in registry.iter().flat_map(|r| r.values()) {
        let _old = core.state.lock().take_gpu(id);
    }
}

/// Logs one line per live mem with its origin (the level-2 unload report).
pub(crate) fn report_objects() {
    let registry = MEM_REGISTRY.lock();
    for core in registry.iter().flat_map(|r| r.values()) {
        pr_err!(
            "audit: leaked object class=mems id={} bytes={} size={} {}\n",
            core.serial,
            core.layout.physical_size,
            core.size,
            core.origin
        );
    }
}

/// Empties the registry at unload (what it holds can then be freed).
pub(crate) fn drain_registry() {
    let _all = MEM_REGISTRY.lock().take();
}

/// A resource leaked on purpose by `RUVM_IOCTL_TEST_LEAK` and held for the unload audit.
pub(crate) enum Planted {
    /// Held so that it stays alive; its core is in the registry.
    Mem {
        _held: Arc<Mem>,
    },
    Chunk {
        chunk: Chunk,
        _audit: Counted,
    },
    KernelMap(KernelMapping),
}

impl KernelMapping {
    fn map_pages(&self) -> &SysPages {
        self.map.pages()
    }
}

/// What `RUVM_IOCTL_TEST_LEAK` asks for.
pub(crate) enum LeakKind {
    Mem { size: u64, mapped: bool },
    Chunk { order: u32 },
    KernelMap,
}

/// Makes one leaked resource of `kind`; `lost` forgets it for good (for kmemleak), otherwise it
/// is returned to be held until unload.
pub(crate) fn plant(kind: &LeakKind, lost: bool) -> Result<Option<Planted>> {
    let planted = match *kind {
        LeakKind::Mem { size, mapped } => {
            let req = AllocRequest {
                gpu: None,
                size,
                page_size: 0,
                zero: false,
                fallback: false,
                max_bytes: crate::max_alloc_bytes(),
            };
            let quota = Arc::new(Quota::new(u64::MAX), GFP_KERNEL)?;
            let mem = Mem::alloc(&req, &quota, Origin::here("TEST_LEAK"))?;
            if mapped {
                mem.map_cpu_kernel()?;
            }
            mem.disown();
            Planted::Mem { _held: mem }
        }
        LeakKind::Chunk { order } => {
            let flags = ChunkFlags {
                zero: false,
                fail_fast: false,
            };
            Planted::Chunk {
                chunk: Chunk::alloc(order, flags)?,
                _audit: Counted::new(Class::SysmemChunks(order), 1),
            }
        }
        LeakKind::KernelMap => {
            let flags = ChunkFlags {
                zero: false,
                fail_fast: false,
            };
            let mut chunks = KVVec::with_capacity(1, GFP_KERNEL)?;
            chunks.push(Chunk::alloc(0, flags)?, GFP_KERNEL)?;
            let pages = Arc::new(SysPages::new(chunks, 0), GFP_KERNEL)?;
            Planted::KernelMap(KernelMapping::new(pages)?)
        }
    };
    if lost {
        core::mem::forget(planted);
        return Ok(None);
    }
    Ok(Some(planted))
}

/// What `fill` writes and `verify` expects.
#[derive(Clone, Copy)]
pub(crate) enum Fill {
    /// The seeded pattern ([`pattern`]).
    Pattern(u64),
    /// One byte everywhere.
    Byte(u8),
}

impl Fill {
    fn generate(self, offset: usize, buf: &mut [u8]) {
        match self {
            Fill::Pattern(seed) => pattern::fill(seed, offset as u64, buf),
            Fill::Byte(b) => buf.fill(b),
        }
    }
}

/// `EOPNOTSUPP`, which the kernel crate has no constant for.
fn eopnotsupp() -> Error {
    // CAST: EOPNOTSUPP is 95, which fits a `c_int`.
    Error::from_errno(-(kernel::bindings::EOPNOTSUPP as i32))
}

/// Which statistics an allocation request counts in.
fn stats_backing(req: &AllocRequest) -> StatsBacking {
    match req.gpu {
        None => StatsBacking::Sysmem,
        Some(_) => StatsBacking::Vidmem,
    }
}

/// Allocates every chunk of a vidmem mem from `gpu`'s PMM, each with storage. `ENOMEM` when
/// the GPU has no vidmem or not enough is free, `ENODEV` once it is gone. On failure the chunks
/// allocated so far go back (dropped with the vector).
fn alloc_vidmem(gpu: &Arc<GpuDev>, layout: &Layout) -> Result<VidPages> {
    let pmm = gpu.pmm.as_ref().ok_or(ENOMEM)?;
    let count = usize::try_from(layout.chunk_count)?;
    let mut chunks = KVVec::with_capacity(count, GFP_KERNEL)?;
    // Held across the allocation: the GPU cannot be removed meanwhile.
    let alive = gpu.alive.lock();
    if !*alive {
        return Err(ENODEV);
    }
    for _ in 0..count {
        if kernel::current!().signal_pending() {
            return Err(ERESTARTSYS);
        }
        chunks.push(pmm.alloc(layout.chunk_size, true)?, GFP_KERNEL)?;
    }
    drop(alive);
    let n = chunks.len() as u64;
    Ok(VidPages {
        gpu: gpu.clone(),
        chunks,
        _audit: Counted::new(Class::VidmemChunks, n),
    })
}

/// Allocates the chunks for `layout`, halving the chunk size on `ENOMEM` when the request
/// allows a fallback. Returns the layout it settled on.
fn alloc_chunks(req: &AllocRequest, mut layout: Layout) -> Result<(Layout, SysPages)> {
    let page = PAGE_SIZE as u64;
    loop {
        let fallback_left = req.fallback && layout.chunk_size > page;
        match try_alloc_chunks(&layout, req.zero, fallback_left) {
            Err(e) if e == ENOMEM && fallback_left => {
                layout = policy::layout_with_chunk(req.size, layout.chunk_size / 2)
                    .map_err(policy_error)?;
            }
            r => return r.map(|p| (layout, p)),
        }
    }
}

/// One attempt at allocating every chunk of `layout`. On failure the chunks allocated so far are
/// freed (dropped with the vector).
fn try_alloc_chunks(layout: &Layout, zero: bool, fail_fast: bool) -> Result<SysPages> {
    let count = usize::try_from(layout.chunk_count)?;
    let order = policy::chunk_order(layout.chunk_size, PAGE_SIZE as u64);
    let flags = ChunkFlags { zero, fail_fast };
    let mut chunks = KVVec::with_capacity(count, GFP_KERNEL)?;
    for _ in 0..count {
        // A large allocation is interruptible: a signal stops it and the syscall restarts
        // (or fails with EINTR), with nothing left behind.
        if kernel::current!().signal_pending() {
            return Err(ERESTARTSYS);
        }
        chunks.push(Chunk::alloc(order, flags)?, GFP_KERNEL)?;
    }
    Ok(SysPages::new(chunks, order))
}
