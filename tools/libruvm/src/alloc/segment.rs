// SPDX-License-Identifier: GPL-2.0

//! A segment: one zeroed sysmem mem of the calling file, mapped into the process once and
//! DMA-mapped once for each of the allocator's GPUs. Blocks are carved out of it; the kernel
//! sees only the segment.
//!
//! A segment is an *arena* where the module has sparse mems (`RUVM_FEATURE_SPARSE`): a large
//! sparse mem whose 2 MiB chunks are made resident (`RUVM_RANGE_POPULATE`) as blocks are carved
//! over them and given back (`RUVM_RANGE_RELEASE`) when no block uses them, so the memory held
//! follows the blocks rather than the segments. Otherwise it is *whole*: every chunk resident
//! from the start, mapped into the kernel too (a stream's `FILL` writes through that mapping),
//! given back only with the segment.

use nix::errno::Errno;
use nix::sys::mman::{MapFlags, ProtFlags};

use crate::{uapi, Ruvm, UserMap};

/// The chunk size a segment asks for, and an arena's unit of residency.
pub(crate) const CHUNK: u64 = 2 << 20;

pub(crate) struct Segment {
    pub handle: u64,
    map: UserMap,
    /// Its chunk size: an arena's unit of residency.
    chunk: u64,
    /// An arena's resident chunks (`None`: a whole segment).
    resident: Option<Vec<bool>>,
}

// SAFETY: the mapping is the process's, usable from any thread; the segment only hands out its
// address, and unmaps it once, on drop.
unsafe impl Send for Segment {}

impl Segment {
    /// Allocates, maps and DMA-maps a whole segment of `len` bytes (a multiple of 2 MiB);
    /// on failure nothing is left.
    pub fn new(dev: &Ruvm, len: u64, gpus: &[u32]) -> Result<Self, Errno> {
        let chunk = CHUNK;
        // 2 MiB chunks (a segment is a whole number of them), smaller ones where the kernel
        // has none: one DMA entry for 2 MiB instead of 512, at making, at each GPU's
        // mapping and at its removal.
        let flags =
            uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO | uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK;
        Self::make(dev, len, chunk, flags, gpus)
    }

    /// Reserves an arena of `len` bytes (a multiple of 2 MiB) of chunks of `chunk` bytes: a
    /// sparse mem with nothing resident, mapped and DMA-mapped. `EINVAL` from a module without
    /// sparse mems.
    pub fn arena(dev: &Ruvm, len: u64, chunk: u64, gpus: &[u32]) -> Result<Self, Errno> {
        Self::make(
            dev,
            len,
            chunk,
            uapi::ruvm_alloc_flags_RUVM_ALLOC_SPARSE,
            gpus,
        )
    }

    fn make(dev: &Ruvm, len: u64, chunk: u64, flags: u32, gpus: &[u32]) -> Result<Self, Errno> {
        let sparse = flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_SPARSE != 0;
        let a = dev.mem_alloc(len, chunk, flags)?;
        let made = (|| {
            let size = usize::try_from(len).map_err(|_| Errno::ENOMEM)?;
            let map = UserMap::new(
                dev,
                a.mmap_offset,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
            )?;
            // A whole segment's kernel mapping: what a stream's FILL writes through (an
            // arena's chunks are written one by one).
            if !sparse {
                dev.map_kernel(a.handle)?;
            }
            for &g in gpus {
                dev.mem_gpu(true, a.handle, g)?;
            }
            let chunks = usize::try_from(a.chunk_count).map_err(|_| Errno::ENOMEM)?;
            Ok((map, sparse.then(|| vec![false; chunks])))
        })();
        match made {
            Ok((map, resident)) => Ok(Self {
                handle: a.handle,
                map,
                chunk: a.chunk_size,
                resident,
            }),
            Err(e) => {
                // MEM_FREE drops the kernel and GPU mappings made; the user mapping went with `made`.
                let _ = dev.mem_free(a.handle);
                Err(e)
            }
        }
    }

    /// Its chunk size.
    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// Whether it is an arena.
    pub fn is_arena(&self) -> bool {
        self.resident.is_some()
    }

    /// The address of byte `offset` in the process.
    pub fn addr(&self, offset: u64) -> usize {
        self.map.as_ptr() as usize + offset as usize
    }

    /// An arena's chunks that `[offset, offset + len)` touches and are not resident, as runs
    /// of (first chunk, count); nothing for a whole segment.
    pub fn absent_runs(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let Some(r) = &self.resident else {
            return Vec::new();
        };
        let (first, end) = (offset / self.chunk, (offset + len).div_ceil(self.chunk));
        runs(first..end, |c| !r.get(c as usize).copied().unwrap_or(true))
    }

    /// Makes the chunks `runs` (of [`Segment::absent_runs`]) resident: the bytes made
    /// resident, and the first error (the runs before it stay resident).
    pub fn populate(&mut self, dev: &Ruvm, runs: &[(u64, u64)]) -> (u64, Result<(), Errno>) {
        let mut made = 0;
        for &(c, n) in runs {
            if let Err(e) = dev.mem_range(self.handle, c * self.chunk, n * self.chunk, true) {
                return (made, Err(e));
            }
            self.mark(c, n, true);
            made += n * self.chunk;
        }
        (made, Ok(()))
    }

    /// Gives back an arena's resident chunks that lie wholly inside `[offset, offset + len)`;
    /// returns the bytes given back. A range the kernel refuses (`EBUSY`: work queued on it
    /// through another stream) stays resident.
    pub fn release(&mut self, dev: &Ruvm, offset: u64, len: u64) -> u64 {
        let Some(r) = &self.resident else {
            return 0;
        };
        let (first, end) = (offset.div_ceil(self.chunk), (offset + len) / self.chunk);
        if first >= end {
            return 0;
        }
        let todo = runs(first..end, |c| r.get(c as usize).copied().unwrap_or(false));
        let mut given = 0;
        for (c, n) in todo {
            if dev
                .mem_range(self.handle, c * self.chunk, n * self.chunk, false)
                .is_ok()
            {
                self.mark(c, n, false);
                given += n * self.chunk;
            }
        }
        given
    }

    fn mark(&mut self, c: u64, n: u64, on: bool) {
        if let Some(r) = &mut self.resident {
            for b in r.iter_mut().skip(c as usize).take(n as usize) {
                *b = on;
            }
        }
    }

    /// Unmaps the segment from the process and frees its mem.
    pub fn release_all(self, dev: &Ruvm) -> Result<(), Errno> {
        let Self { handle, map, .. } = self;
        drop(map);
        dev.mem_free(handle)
    }
}

/// The runs of consecutive chunks of `range` for which `pick` holds, as (first, count).
fn runs(range: std::ops::Range<u64>, pick: impl Fn(u64) -> bool) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = Vec::new();
    for c in range.filter(|&c| pick(c)) {
        match v.last_mut() {
            Some((f, n)) if *f + *n == c => *n += 1,
            _ => v.push((c, 1)),
        }
    }
    v
}
