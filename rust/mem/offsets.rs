// SPDX-License-Identifier: GPL-2.0

//! Where mems are `mmap`ed: ranges of the device file's offsets.
//!
//! Every open file of `/dev/ruvm` shares the device inode's mapping, so zapping a mem's range
//! (`unmap_mapping_range`) hits every process's mappings of that range: ranges are module-wide,
//! and a mem keeps its range until it is dropped (after its last VMA), so a zap never hits
//! another mem's mapping. A pool mem's range then stays with its chunks in the pool's cache,
//! for the next mem that takes them. Offsets stay below `i64::MAX` (`loff_t`).
//!
//! Two regions. A mem of at most [`SLOT`] bytes (the largest chunk: most mems) takes a slot of
//! that size below [`SLOTS_END`], numbered by a bitmap of the kernel's ID pool: a few bit
//! operations under a spinlock, where the kernel's maple tree range allocator cost about 2 us
//! to allocate and give back in the fast guest, a third of a small mem's own cost. Larger mems
//! take a range of their size above [`SLOTS_END`] from the maple tree.

use kernel::{
    id_pool::IdPool,
    new_spinlock,
    page::PAGE_SIZE,
    prelude::*,
    sync::{Arc, SpinLock},
};

use crate::{
    bind::{global::global, maple::RangeAlloc},
    uapi,
};

/// Bytes per slot: the largest chunk, so that a mem of one chunk of any size fits one.
const SLOT: u64 = super::policy::CHUNK_MAX;

/// The end of the slot region, where the maple tree's ranges begin. Slot `i` starts at
/// `i * SLOT`; there are at most `i32::MAX` slots (the ID pool's limit), so they end below
/// `2^31 * 2 MiB`.
const SLOTS_END: u64 = (1 << 31) * SLOT;

/// The slots in use, and where to look for a free one next.
struct Slots {
    ids: IdPool,
    /// The slot after the last one handed out: a search starts there, so a slot given back is
    /// not handed out again at once (and finding one stays a word or two of the bitmap).
    next: usize,
}

/// The module's offset space.
#[pin_data]
struct Space {
    /// Ranges of pages from [`SLOTS_END`] on.
    #[pin]
    ranges: RangeAlloc,
    #[pin]
    slots: SpinLock<Slots>,
}

global! {
    /// The module's offset space, while loaded.
    static SPACE: Mutex<Option<Arc<Space>>> = None;
}

/// Makes the offset space (module init).
pub(super) fn init() -> Result {
    SPACE.init();
    let space = Arc::pin_init(
        pin_init!(Space {
            ranges <- RangeAlloc::new(),
            slots <- new_spinlock!(Slots {
                ids: IdPool::new(),
                next: 0,
            }),
        }),
        GFP_KERNEL,
    )?;
    *SPACE.lock().ok_or(ENODEV)? = Some(space);
    Ok(())
}

/// Lets go of the offset space at unload (mems still alive keep it).
pub(super) fn exit() {
    let _space = SPACE.lock().and_then(|mut s| s.take());
}

impl Space {
    /// A free slot; `ENOSPC` when every one is taken.
    fn alloc_slot(&self) -> Result<usize> {
        let mut s = self.slots.lock();
        loop {
            let cap = s.ids.capacity();
            let from = if s.next < cap { s.next } else { 0 };
            let mut id = s.ids.find_unused_id(from).map(|u| u.acquire());
            if id.is_none() && from > 0 {
                id = s.ids.find_unused_id(0).map(|u| u.acquire());
            }
            if let Some(id) = id {
                s.next = id + 1;
                return Ok(id);
            }
            // Full: a bitmap twice the size, allocated with the lock released.
            let request = s.ids.grow_request().ok_or(ENOSPC)?;
            drop(s);
            let bigger = request.realloc(GFP_KERNEL)?;
            s = self.slots.lock();
            s.ids.grow(bigger);
        }
    }
}

/// Where a range lies.
enum At {
    /// Slot `i`.
    Slot(usize),
    /// The maple tree's range that starts at this page.
    Pages(usize),
}

/// One mem's range of offsets, given back on drop.
pub(crate) struct MmapRange {
    space: Arc<Space>,
    at: At,
}

impl MmapRange {
    /// A free range of `len` bytes (a multiple of `PAGE_SIZE`); `ENOSPC` when none is left.
    pub(super) fn new(len: u64) -> Result<Self> {
        let page = PAGE_SIZE as u64;
        if len == 0 || len % page != 0 {
            return Err(EINVAL);
        }
        let space = SPACE.lock().and_then(|s| s.clone()).ok_or(ENODEV)?;
        let at = if len <= SLOT {
            At::Slot(space.alloc_slot()?)
        } else {
            let pages = usize::try_from(len / page)?;
            // CAST: both fit a `usize` on the 64-bit kernels ruvm builds for.
            let (first, last) = (
                (SLOTS_END / page) as usize,
                // Below the status page's offset, which no mem's range reaches.
                (uapi::RUVM_STATUS_MMAP_OFFSET / page - 1) as usize,
            );
            At::Pages(space.ranges.alloc(pages, first, last)?)
        };
        Ok(Self { space, at })
    }

    /// The first byte's offset.
    pub(crate) fn offset(&self) -> u64 {
        match self.at {
            // CAST: fewer than `i32::MAX` slots (the ID pool's limit): the product stays below
            // `SLOTS_END`.
            At::Slot(i) => i as u64 * SLOT,
            At::Pages(p) => p as u64 * PAGE_SIZE as u64,
        }
    }
}

impl Drop for MmapRange {
    fn drop(&mut self) {
        match self.at {
            At::Slot(i) => self.space.slots.lock().ids.release_id(i),
            At::Pages(p) => self.space.ranges.free(p),
        }
    }
}
