// SPDX-License-Identifier: GPL-2.0

//! A segment: one zeroed sysmem mem of the calling file, mapped into the process once, into
//! the kernel once (a stream's FILL writes through that mapping), and DMA-mapped once for
//! each of the allocator's GPUs. Blocks are carved out of it; the kernel
//! sees only the segment.

use nix::errno::Errno;
use nix::sys::mman::{MapFlags, ProtFlags};

use crate::{uapi, Ruvm, UserMap};

/// The chunk size a segment asks for.
const CHUNK: u64 = 2 << 20;

pub(crate) struct Segment {
    pub handle: u64,
    map: UserMap,
}

// SAFETY: the mapping is the process's, usable from any thread; the segment only hands out its
// address, and unmaps it once, on drop.
unsafe impl Send for Segment {}

impl Segment {
    /// Allocates, maps and DMA-maps a segment of `len` bytes (a multiple of 2 MiB);
    /// on failure nothing is left.
    pub fn new(dev: &Ruvm, len: u64, gpus: &[u32]) -> Result<Self, Errno> {
        // 2 MiB chunks (a segment is a whole number of them), smaller ones where the kernel
        // has none: one DMA entry for 2 MiB instead of 512, at making, at each GPU's
        // mapping and at its removal.
        let flags =
            uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO | uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK;
        let a = dev.mem_alloc(len, CHUNK, flags)?;
        let made = (|| {
            let size = usize::try_from(len).map_err(|_| Errno::ENOMEM)?;
            let map = UserMap::new(
                dev,
                a.mmap_offset,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
            )?;
            // The kernel's mapping: what a stream's FILL writes through.
            dev.map_kernel(a.handle)?;
            for &g in gpus {
                dev.mem_gpu(true, a.handle, g)?;
            }
            Ok(map)
        })();
        match made {
            Ok(map) => Ok(Self {
                handle: a.handle,
                map,
            }),
            Err(e) => {
                // MEM_FREE drops the kernel and GPU mappings made; the user mapping went with `made`.
                let _ = dev.mem_free(a.handle);
                Err(e)
            }
        }
    }

    /// The address of byte `offset` in the process.
    pub fn addr(&self, offset: u64) -> usize {
        self.map.as_ptr() as usize + offset as usize
    }

    /// Unmaps the segment from the process and frees its mem.
    pub fn release(self, dev: &Ruvm) -> Result<(), Errno> {
        let Self { handle, map, .. } = self;
        drop(map);
        dev.mem_free(handle)
    }
}
