// SPDX-License-Identifier: GPL-2.0

//! A mem in GPU virtual address spaces: its offset in the GPU kernel VA window (one per mem,
//! the same on every GPU: uvm_mem's `kernel.range_alloc`), its user VA (chosen by its file,
//! one for every GPU: uvm_mem's `user` struct), and its mapping in one VA space of a GPU with
//! an MMU.
//!
//! The window is `RUVM_GPU_KERNEL_VA_SIZE` (128 GiB) at `RUVM_GPU_KERNEL_VA_BASE` of every
//! GPU's VA space, handed out by the kernel's maple tree in 4 KiB units, first fit: an offset
//! given back and asked for again with nothing else in between comes back the same (uvm_mem's
//! test checks that a remap gives the same VA). The maple tree does not align ranges, so a
//! range is taken `align - 4 KiB` longer than the mem and the offset is its first aligned unit.

use kernel::{prelude::*, sync::Arc};

use crate::{
    audit::{Class, Counted},
    bind::{global::global, maple::RangeAlloc},
    gpu::mmu::Mmu,
    uapi,
};

/// Where the window starts in every GPU's VA space.
pub(crate) const KERNEL_VA_BASE: u64 = uapi::RUVM_GPU_KERNEL_VA_BASE;

/// The window's size.
pub(crate) const KERNEL_VA_SIZE: u64 = uapi::RUVM_GPU_KERNEL_VA_SIZE;

/// The allocator's unit.
const UNIT: u64 = 4096;

global! {
    /// The window's allocator, while loaded.
    static WINDOW: Mutex<Option<Arc<RangeAlloc>>> = None;
}

/// Makes the window (module init).
pub(super) fn init() -> Result {
    WINDOW.init();
    let space = Arc::pin_init(RangeAlloc::new(), GFP_KERNEL)?;
    *WINDOW.lock().ok_or(ENODEV)? = Some(space);
    Ok(())
}

/// Lets go of the window at unload (offsets still held keep it).
pub(super) fn exit() {
    let _space = WINDOW.lock().and_then(|mut s| s.take());
}

/// A mem's offset in the window, given back on drop.
pub(crate) struct KernelVa {
    space: Arc<RangeAlloc>,
    /// The range's first unit.
    index: usize,
    /// The mem's offset: the range's first unit aligned up.
    offset: u64,
    _count: Counted,
}

impl KernelVa {
    /// An offset for `len` bytes aligned to `align` (a power of two, at least 4 KiB);
    /// `ENOSPC` when the window has no room.
    pub(super) fn new(len: u64, align: u64) -> Result<Self> {
        if len == 0 || len % UNIT != 0 || !align.is_power_of_two() || align < UNIT {
            return Err(EINVAL);
        }
        let units = len.checked_add(align - UNIT).ok_or(ENOSPC)? / UNIT;
        if units > KERNEL_VA_SIZE / UNIT {
            return Err(ENOSPC);
        }
        // CAST: the window's units fit a `usize` on the 64-bit kernels ruvm builds for.
        let (units, last) = (units as usize, (KERNEL_VA_SIZE / UNIT - 1) as usize);
        let space = WINDOW.lock().and_then(|s| s.clone()).ok_or(ENODEV)?;
        let index = space.alloc(units, 0, last)?;
        let start = index as u64 * UNIT;
        let offset = start.next_multiple_of(align);
        Ok(Self {
            space,
            index,
            offset,
            _count: Counted::new(Class::GpuKernelVas, 1),
        })
    }

    /// The mem's first byte in any GPU's VA space.
    pub(crate) fn va(&self) -> u64 {
        KERNEL_VA_BASE + self.offset
    }
}

impl Drop for KernelVa {
    fn drop(&mut self) {
        self.space.free(self.index);
    }
}

/// Where a mem is in its file's user VA spaces: the same VA on every GPU it is mapped on.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct UserVa {
    /// The file's VA space id.
    pub(crate) space: u64,
    pub(crate) va: u64,
}

/// A mem mapped in one VA space of one GPU; unmapped on drop.
pub(crate) struct GpuMapping {
    mmu: Arc<Mmu>,
    space: u64,
    va: u64,
    len: u64,
    page_size: u64,
}

impl GpuMapping {
    /// Maps `len` bytes at `va` of VA space `space` on `mmu` with pages of `page_size`, page
    /// `i` as `pte_of(i)` says; all or nothing.
    pub(super) fn new(
        mmu: Arc<Mmu>,
        space: u64,
        va: u64,
        len: u64,
        page_size: u64,
        pte_of: impl FnMut(u64) -> Result<crate::gpu::mmu::fmt::Pte>,
    ) -> Result<Self> {
        mmu.map(space, va, page_size, len / page_size, pte_of)?;
        Ok(Self {
            mmu,
            space,
            va,
            len,
            page_size,
        })
    }

    /// Its VA and page size.
    pub(crate) fn va(&self) -> (u64, u64) {
        (self.va, self.page_size)
    }
}

impl Drop for GpuMapping {
    fn drop(&mut self) {
        self.mmu.unmap(self.space, self.va, self.len);
    }
}
