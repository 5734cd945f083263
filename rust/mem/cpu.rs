// SPDX-License-Identifier: GPL-2.0

//! A mem's CPU mappings: the kernel mapping (uvm_mem's `map_cpu_kernel`) with the kernel-side
//! fill, verify and copy done through it, and user mappings (`mmap`), filled on fault and
//! zapped on free.

use kernel::{
    mm::{
        virt::{flags as vm_flags, VmaNew},
        Mm,
    },
    prelude::*,
    sync::{aref::ARef, atomic::ordering::Relaxed, Arc},
};

use crate::{
    audit::{self, Class, Counted},
    bind::{
        vma::{self, VmaOwner, VmaPages},
        vmap::VMap,
    },
    gpu::dma::Pages,
};

use super::{pattern, sparse::Held, storage::Storage, Life, Mem, MemCore, Retired};

/// A CPU kernel mapping, counted by the audit.
pub(crate) struct KernelMapping {
    map: VMap<Counted>,
    _audit: Counted,
}

impl KernelMapping {
    pub(super) fn new(pages: Arc<Pages>) -> Result<Self> {
        Ok(Self {
            map: VMap::new(pages)?,
            _audit: Counted::new(Class::KernelMaps, 1),
        })
    }

    /// The pages it maps.
    pub(super) fn pages(&self) -> &Pages {
        self.map.pages()
    }
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

/// The piece a copy between two mems moves at a time: one page, read through the kernel's own
/// mapping of the source page into a buffer, then written into the destination page.
const COPY_PIECE: usize = kernel::page::PAGE_SIZE;

/// A fill of a range of a mem through its CPU kernel mapping (or, for a sparse mem, each of
/// its chunks' pages), planned when it is asked for: the range checked, the mapping (and with it
/// the pages) or the chunks held until the plan goes, whatever the mem's owner does meanwhile.
/// Run piece by piece, synchronously or on a stream.
pub(crate) struct CpuFill {
    _mem: Arc<Mem>,
    target: FillTarget,
    offset: usize,
    len: usize,
    fill: Fill,
}

/// What a [`CpuFill`] writes through.
enum FillTarget {
    Map(Arc<KernelMapping>),
    /// A sparse mem's chunks of the range, from chunk `first` on, of `chunk` bytes.
    Chunks {
        held: KVVec<Held>,
        first: usize,
        chunk: usize,
    },
}

/// The most bytes one [`CpuFill::piece`] writes.
const FILL_PIECE: usize = 2 << 20;

impl CpuFill {
    /// `EINVAL`/`EOVERFLOW` for a range outside the mem, `ENXIO` if it has no CPU kernel
    /// mapping (a sparse mem: if a chunk of the range is absent).
    pub(crate) fn plan(mem: &Arc<Mem>, offset: u64, len: u64, fill: Fill) -> Result<Self> {
        let (offset, len) = mem.range(offset, len)?;
        let target = match mem.storage {
            Storage::Sparse => {
                let chunk = mem.chunk_len()?;
                let st = mem.state.lock();
                let sp = st.sparse.as_ref().ok_or(EINVAL)?;
                if st.life == Life::Freed {
                    return Err(ENOENT);
                }
                let (first, held) = Mem::hold_range(sp, offset, len)?;
                FillTarget::Chunks { held, first, chunk }
            }
            _ => FillTarget::Map(mem.kmap()?),
        };
        Ok(Self {
            _mem: mem.clone(),
            target,
            offset,
            len,
            fill,
        })
    }

    /// Bytes to write.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Writes the next piece (at most 2 MiB), from byte `done` of the fill on; returns its
    /// length. Allocates nothing.
    pub(crate) fn piece(&self, done: usize) -> Result<usize> {
        let n = self.len.checked_sub(done).ok_or(EINVAL)?.min(FILL_PIECE);
        let start = self.offset + done;
        match &self.target {
            FillTarget::Map(map) => self.write(&mut map.map.bytes(), start, n, 0)?,
            FillTarget::Chunks { held, first, chunk } => {
                // Chunk by chunk, each chunk's bytes locked once.
                let mut at = start;
                while at < start + n {
                    let k = (start + n - at).min(chunk - at % chunk);
                    let i = (at / chunk).checked_sub(*first).ok_or(EINVAL)?;
                    let h = held.get(i).ok_or(EINVAL)?;
                    let base = at - at % chunk;
                    self.write(&mut h.pages().bytes(), at, k, base)?;
                    at += k;
                }
            }
        }
        Ok(n)
    }

    /// Writes the fill's bytes of `[at, at + n)` of the mem through `bytes`, which holds the
    /// mem's bytes from `base` on.
    fn write(&self, bytes: &mut impl FillBytes, at: usize, n: usize, base: usize) -> Result {
        let mut buf = [0u8; 256];
        let mut pos = 0;
        while pos < n {
            let k = (n - pos).min(buf.len());
            let piece = buf.get_mut(..k).ok_or(EINVAL)?;
            let o = at + pos;
            self.fill.generate(o, piece);
            bytes.put(o - base, piece)?;
            pos += k;
        }
        Ok(())
    }
}

/// Where a fill's bytes go: a kernel mapping's bytes or one chunk's.
trait FillBytes {
    fn put(&mut self, offset: usize, buf: &[u8]) -> Result;
}

impl FillBytes for crate::bind::vmap::VBytes<'_, Counted> {
    fn put(&mut self, offset: usize, buf: &[u8]) -> Result {
        self.write(offset, buf)
    }
}

impl FillBytes for crate::bind::pages::Bytes<'_, Counted> {
    fn put(&mut self, offset: usize, buf: &[u8]) -> Result {
        self.write(offset, buf)
    }
}

impl Mem {
    /// Maps the mem for the CPU kernel (vmap of every page). Idempotent.
    pub(crate) fn map_cpu_kernel(&self) -> Result {
        let mut st = self.state.lock();
        st.mappable()?;
        if st.kmap.is_none() {
            let map = KernelMapping::new(self.storage.sys()?.clone())?;
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

    /// Writes the pattern (or a byte) over a range, through the CPU kernel mapping.
    pub(crate) fn fill(self: &Arc<Self>, offset: u64, len: u64, fill: Fill) -> Result {
        let plan = CpuFill::plan(self, offset, len, fill)?;
        // Shared as a dma-buf: its users' work first.
        MemCore::wait_implicit(&[(self, true)])?;
        let mut done = 0;
        while done < plan.len() {
            done += plan.piece(done)?;
        }
        Ok(())
    }

    /// Compares a range with the pattern (or a byte) through the CPU kernel mapping: returns
    /// how many bytes differ and the offset of the first (`u64::MAX` if none).
    pub(crate) fn verify(&self, offset: u64, len: u64, fill: Fill) -> Result<(u64, u64)> {
        let (offset, len) = self.range(offset, len)?;
        let map = self.kmap()?;
        MemCore::wait_implicit(&[(self, false)])?;
        let mut bytes = map.map.bytes();
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
            bytes.read(offset + done, g)?;
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
        MemCore::wait_implicit(&[(dst, true), (src, false)])?;
        if Arc::ptr_eq(&dst_map, &src_map) {
            return dst_map.map.bytes().copy_within(dst_offset, src_offset, len);
        }
        // One page at a time through a page-sized buffer, each mem's bytes lock held in turn
        // (never both): the buffer stays in the CPU's first-level cache, so the bytes cross
        // memory once each way, as in a memcpy.
        let mut buf = KVec::from_elem(0u8, COPY_PIECE.min(len), GFP_KERNEL)?;
        let (src_pages, dst_pages) = (src_map.pages(), dst_map.pages());
        let mut done = 0;
        while done < len {
            let n = (len - done).min(COPY_PIECE);
            let piece = buf.get_mut(..n).ok_or(EINVAL)?;
            src_pages.bytes().read(src_offset + done, piece)?;
            dst_pages.bytes().write(dst_offset + done, piece)?;
            done += n;
        }
        Ok(())
    }

    /// Sets up a VMA being created by `mmap` to map the whole mem. The VMA must be shared, as
    /// long as the physical size, and not executable; it is never copied to a child
    /// (`VM_DONTCOPY`), never made executable (`VM_MAYEXEC` cleared), never expanded, never
    /// split. A mem of up to [`FILL_AT_MMAP`] pages has them all inserted here (as the kernel's
    /// fault-around would on a first touch), unless another address space's `mmap` did so and
    /// the mem has stayed mapped since; other pages are inserted on fault
    /// ([`VmaOwner::fault`]).
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
        // A registered mem's pages are mapped by their process already (and an anonymous
        // page cannot be inserted in a shared mapping).
        if self.is_registered() {
            return Err(crate::bind::errno::eopnotsupp());
        }
        // A sparse mem's chunks come and go: its pages are inserted on fault only.
        let pages = match self.storage {
            Storage::Sparse => None,
            _ => Some(self.storage.sys()?),
        };
        vma.try_clear_mayexec()?;
        vma.set_dontcopy();
        vma.set_dontexpand();
        let slots = vma::new_pages(vma);
        let mm: &Mm = vma.mm();
        let mut st = self.state.lock();
        // Freed, or its chunks promised to a later ALLOC of the submission freeing it.
        if st.life == Life::Freed || st.lending {
            return Err(ENXIO);
        }
        let fill = pages.filter(|p| p.page_count() <= FILL_AT_MMAP);
        let fill = fill.filter(|_| {
            st.filled_by
                .as_ref()
                .is_none_or(|m| core::ptr::eq(m.as_raw(), mm.as_raw()))
        });
        if let Some(pages) = fill {
            // A failure here fails the `mmap`, and the kernel unmaps what was inserted.
            for i in 0..pages.page_count() {
                slots.insert(i, &pages.page(i).ok_or(EFAULT)?)?;
            }
            if st.filled_by.is_none() {
                st.filled_by = Some(ARef::from(mm));
            }
        }
        // Last, under the lock with the fill: from here the VMA holds a reference on the mem
        // and counts in `user_mappings`, so a free after this sees both.
        vma::install(vma, self.clone(), &VM_OPS);
        Ok(())
    }

    /// Zaps every user mapping of the mem (in any process): later accesses get `SIGBUS`.
    /// Called once the mem was marked freed (under its lock, released since), with what it gave
    /// up.
    ///
    /// Nothing to zap when no VMA maps the mem: a page is inserted only by an `mmap` or a fault
    /// on a VMA counted in `user_mappings` (raised with the fill, under the lock), that saw the
    /// mem not freed under its lock, which the freeing thread took after it; a VMA's count goes
    /// down only after its page tables were cleared. A VMA installed after the mark maps
    /// nothing: its `mmap` and its faults see the mem freed.
    ///
    /// A VMA whose `mmap` inserted the pages may not be linked into the file's mappings yet
    /// when the zap walks them: its address space's mmap lock is held by that `mmap` until it
    /// is, so the zap is done again once that lock could be taken.
    pub(crate) fn zap_user(&self, file: &kernel::fs::File, retired: &mut Retired) -> Result {
        self.zap_filled(file, retired.filled_by.take())
    }

    /// [`Mem::zap_user`], with the address space whose `mmap` filled a VMA of the mem
    /// (`filled_by`, taken out of what the mem gave up).
    pub(crate) fn zap_filled(
        &self,
        file: &kernel::fs::File,
        filled_by: Option<ARef<Mm>>,
    ) -> Result {
        if self.user_mappings.load(Relaxed) == 0 {
            return Ok(());
        }
        let (offset, len) = (self.mmap_offset(), self.layout.physical_size);
        vma::zap(file, offset, len)?;
        if let Some(mm) = filled_by {
            // No user: the address space is being torn down, and no `mmap` runs in it.
            if let Some(mm) = mm.mmget_not_zero() {
                drop(mm.mmap_read_lock());
                vma::zap(file, offset, len)?;
            }
        }
        Ok(())
    }
}

impl Mem {
    /// Maps the mem into the calling process through `file` (its file), as `mmap` of its
    /// offset would, and remembers where (`RUVM_ALLOC_MAP_USER`). Returns the address.
    /// `ENOENT` (and nothing mapped) if another thread freed the mem meanwhile.
    pub(crate) fn map_into_caller(&self, file: &kernel::fs::File) -> Result<usize> {
        let addr = vma::map_into_current(file, self.mmap_offset(), self.layout.physical_size)?;
        let freed = {
            let mut st = self.state.lock();
            if st.life == Life::Freed {
                true
            } else {
                st.mapped_at = vma::current_mm().map(|mm| (mm, addr));
                false
            }
        };
        if freed {
            // Its free came between the mapping and now, and found nothing to unmap.
            let len = usize::try_from(self.layout.physical_size)?;
            let _ = vma::unmap_if_owned(addr, len, &VM_OPS, self);
            return Err(ENOENT);
        }
        Ok(addr)
    }

    /// Unmaps the mapping `RUVM_ALLOC_MAP_USER` made, if the caller is the process it was made
    /// in and it is still there, whole, at its address (a program that unmapped or moved it
    /// keeps what it has). Called by a free, after the zap; best effort (the free is done
    /// whatever the unmap says: a sealed mapping, a fatal signal).
    pub(crate) fn unmap_from_caller(&self) {
        let Some((mm, addr)) = self.state.lock().mapped_at.take() else {
            return;
        };
        if !vma::is_current_mm(&mm) {
            return;
        }
        drop(mm);
        if let Ok(len) = usize::try_from(self.layout.physical_size) {
            let _ = vma::unmap_if_owned(addr, len, &VM_OPS, self);
        }
    }
}

/// The most pages `mmap` inserts itself: 64 KiB of 4 KiB pages, the kernel's default
/// fault-around (`fault_around_bytes`).
const FILL_AT_MMAP: usize = 16;

/// What a user address of the calling process is, if it is in a user mapping of a mem
/// ([`Mem::at_user`]).
pub(crate) struct UserPtr {
    pub(crate) mem: Arc<Mem>,
    /// The byte of the mem the address is.
    pub(crate) offset: u64,
    /// The mem's pool, if its chunks came from one (0: none); an imported mem's, the
    /// exporting pool.
    pub(crate) pool: u64,
    /// An imported mem ([`super::share`]).
    pub(crate) imported: bool,
    /// Freed (its mapping faults).
    pub(crate) freed: bool,
    /// The file it was made for ([`super::quota::Quota::id`]).
    pub(crate) owner: u64,
}

impl Mem {
    /// Whether it was freed.
    pub(crate) fn is_freed(&self) -> bool {
        self.state.lock().life == Life::Freed
    }

    /// The mem whose user mapping `addr` (of the calling process) is in, and where in it; `None`
    /// for any other address.
    pub(crate) fn at_user(addr: usize) -> Option<UserPtr> {
        let (mem, file_offset) = vma::owner_at::<Mem>(addr, &VM_OPS)?;
        let offset = file_offset.checked_sub(mem.mmap_offset())?;
        if offset >= mem.layout.physical_size {
            return None;
        }
        let source = mem.source.as_ref().map(|s| s.pool());
        let (pool, freed) = {
            let st = mem.state.lock();
            (
                st.lease.as_ref().map(|l| l.pool.id()).or(source),
                st.life == Life::Freed,
            )
        };
        let owner = mem.owner;
        Some(UserPtr {
            mem,
            offset,
            pool: pool.unwrap_or(0),
            imported: source.is_some(),
            freed,
            owner,
        })
    }
}

/// The VMA operations of a mem's user mappings (one `static`: [`vma::owner_at`] knows them by
/// its address).
pub(crate) static VM_OPS: vma::Ops<Mem> = vma::Ops::new();

impl VmaOwner for Mem {
    fn vma_opened(&self) {
        self.user_mappings.fetch_add(1, Relaxed);
        audit::add(Class::UserMappings, 1);
    }

    fn vma_closed(&self) {
        // The last VMA gone: no `mmap` that filled one can still be running.
        let _filled_by = {
            let mut st = self.state.lock();
            match self.user_mappings.fetch_sub(1, Relaxed) {
                1 => st.filled_by.take(),
                _ => None,
            }
        };
        audit::sub(Class::UserMappings, 1);
    }

    /// Inserts the whole chunk holding page `index`, unless the mem was freed (`EFAULT`: the
    /// access gets `SIGBUS`). Under the mem's lock, so a free either comes after (and its zap
    /// finds these pages) or before (and this refuses).
    fn fault(&self, index: usize, vma: &VmaPages<'_>) -> Result {
        if let Storage::Sparse = self.storage {
            if index >= vma.pages() {
                return Err(EFAULT);
            }
            // Its chunk, if resident: under the lock, so a release either comes after (and its
            // zap finds these pages) or before (and this finds none).
            let st = self.state.lock();
            let chunk = Mem::sparse_fault(&st, index).ok_or(EFAULT)?;
            let per_chunk = chunk.page_count();
            let first = index - index.checked_rem(per_chunk).ok_or(EFAULT)?;
            for i in 0..per_chunk {
                vma.insert(first + i, &chunk.page(i).ok_or(EFAULT)?)?;
            }
            return Ok(());
        }
        let pages = self.storage.sys()?;
        if index >= pages.page_count() || index >= vma.pages() {
            return Err(EFAULT);
        }
        let per_chunk = 1usize << pages.order();
        let first = index - index % per_chunk;
        let st = self.state.lock();
        if st.life == Life::Freed {
            return Err(EFAULT);
        }
        for i in first..first + per_chunk {
            let page = pages.page(i).ok_or(EFAULT)?;
            vma.insert(i, &page)?;
        }
        drop(st);
        Ok(())
    }
}
