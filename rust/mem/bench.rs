// SPDX-License-Identifier: GPL-2.0

//! In-kernel timing of ruvm's paths against the kernel's own (`RUVM_IOCTL_BENCH`): what a
//! benchmark run from user space cannot separate from the syscall and the copies around it.

use kernel::{
    page::PAGE_SIZE,
    prelude::*,
    sync::Arc,
    time::{Instant, Monotonic},
};

use crate::bind::{
    pages::{Chunk, ChunkFlags, Zeroing},
    vmap::PageArray,
};

use super::{cpu::KernelMapping, quota::Quota, AllocRequest, Mem, Origin};

/// What to time.
pub(crate) enum Op {
    /// The page allocator alone: `count` chunks of `order` (zeroed with `__GFP_ZERO`), then each
    /// freed.
    Pages {
        order: u32,
        count: usize,
        zero: bool,
    },
    /// ruvm's sysmem path for the same: a mem made as `MEM_ALLOC` makes it, then freed.
    Mem {
        order: u32,
        count: usize,
        zero: bool,
    },
    /// `vm_map_ram` and `vm_unmap_ram` of a mem's pages.
    Vmap(Arc<Mem>),
    /// ruvm's kernel mapping of a mem, made and dropped.
    Kmap(Arc<Mem>),
}

/// Runs `op` `iterations` times; returns the nanoseconds it took. A pending signal stops it
/// between iterations (`ERESTARTSYS`). Each iteration undoes what it did.
pub(crate) fn run(op: &Op, iterations: u64, quota: &Arc<Quota>, max_bytes: u64) -> Result<u64> {
    // Set up untimed.
    let mut chunks = match op {
        Op::Pages { count, .. } => Some(KVVec::with_capacity(*count, GFP_KERNEL)?),
        _ => None,
    };
    let array = match op {
        Op::Vmap(mem) => Some(PageArray::new(mem.storage.sys()?)?),
        _ => None,
    };
    let mut total = 0u64;
    for _ in 0..iterations {
        if kernel::current!().signal_pending() {
            return Err(ERESTARTSYS);
        }
        let start = Instant::<Monotonic>::now();
        match op {
            Op::Pages { order, count, zero } => {
                let list = chunks.as_mut().ok_or(EINVAL)?;
                let flags = ChunkFlags {
                    zero: *zero,
                    fail_fast: false,
                };
                for _ in 0..*count {
                    // Zeroed by the page allocator (`__GFP_ZERO`), whichever way ruvm zeroes.
                    let chunk = Chunk::alloc_zeroed_by(*order, flags, Zeroing::PageAllocator)?;
                    list.push(chunk, GFP_KERNEL)?;
                }
                list.clear();
            }
            Op::Mem { order, count, zero } => {
                let chunk = (PAGE_SIZE as u64) << order;
                let req = AllocRequest {
                    gpu: None,
                    size: chunk.checked_mul(*count as u64).ok_or(EOVERFLOW)?,
                    page_size: chunk,
                    zero: *zero,
                    fallback: false,
                    sparse: false,
                    map_user: false,
                    max_bytes,
                    pool: None,
                };
                let mem = Mem::alloc(&req, quota, Origin::here("BENCH"))?;
                drop(mem.retire());
            }
            Op::Vmap(_) => array.as_ref().ok_or(EINVAL)?.map_unmap()?,
            Op::Kmap(mem) => drop(KernelMapping::new(mem.storage.sys()?.clone())?),
        }
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        total = total.saturating_add(ns);
    }
    Ok(total)
}
