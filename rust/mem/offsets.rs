// SPDX-License-Identifier: GPL-2.0

//! Where mems are `mmap`ed: ranges of the device file's offsets, from the kernel's maple tree
//! range allocator.
//!
//! Every open file of `/dev/ruvm` shares the device inode's mapping, so zapping a mem's range
//! (`unmap_mapping_range`) hits every process's mappings of that range: ranges are module-wide,
//! and a mem keeps its range until it is dropped (after its last VMA), so a zap never hits
//! another mem's mapping. A pool mem's range then stays with its chunks in the pool's cache,
//! for the next mem that takes them. A range is counted in pages; offsets stay below `i64::MAX` (`loff_t`).

use kernel::{page::PAGE_SIZE, prelude::*, sync::Arc};

use crate::bind::{global::global, maple::RangeAlloc};

/// The allocator, in pages.
type Space = RangeAlloc;

global! {
    /// The module's offset space, while loaded.
    static SPACE: Mutex<Option<Arc<Space>>> = None;
}

/// Makes the offset space (module init).
pub(super) fn init() -> Result {
    SPACE.init();
    let space = Arc::pin_init(RangeAlloc::new(), GFP_KERNEL)?;
    *SPACE.lock().ok_or(ENODEV)? = Some(space);
    Ok(())
}

/// Lets go of the offset space at unload (mems still alive keep it).
pub(super) fn exit() {
    let _space = SPACE.lock().and_then(|mut s| s.take());
}

/// One mem's range of offsets, given back on drop.
pub(crate) struct MmapRange {
    space: Arc<Space>,
    /// The first page.
    index: usize,
}

impl MmapRange {
    /// A free range of `len` bytes (a multiple of `PAGE_SIZE`); `ENOSPC` when none is left.
    pub(super) fn new(len: u64) -> Result<Self> {
        let pages = usize::try_from(len / PAGE_SIZE as u64)?;
        if pages == 0 || len % PAGE_SIZE as u64 != 0 {
            return Err(EINVAL);
        }
        // CAST: `i64::MAX / PAGE_SIZE` fits a `usize` on the 64-bit kernels ruvm builds for.
        let last = (i64::MAX as u64 / PAGE_SIZE as u64) as usize;
        let space = SPACE.lock().and_then(|s| s.clone()).ok_or(ENODEV)?;
        let index = space.alloc(pages, last)?;
        Ok(Self { space, index })
    }

    /// The first byte's offset.
    pub(crate) fn offset(&self) -> u64 {
        self.index as u64 * PAGE_SIZE as u64
    }
}

impl Drop for MmapRange {
    fn drop(&mut self) {
        self.space.free(self.index);
    }
}
