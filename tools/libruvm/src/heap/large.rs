// SPDX-License-Identifier: GPL-2.0

//! A pinned heap's large blocks: those beyond mimalloc's small blocks (10 KiB), which mimalloc
//! would place in pages of 512 KiB and 4 MiB, or a page of their own, each committed whole
//! (its commits through the arena's callback cannot be on demand) and purged only a second
//! after its last block went. On a program's mixed sizes that held 2.5x the live bytes
//! resident. They are carved instead from the second half of the heap's arena by a good fit,
//! split and coalesced at once ([`super::tlsf`]): 4 KiB-aligned, the chunks under a block made
//! resident as it is carved (the same commit as mimalloc's, so zeroed, charged and DMA-mapped
//! once), kept resident when it is freed while the large part holds at most a quarter of its
//! size free and resident (beyond that, the whole chunks of the free block it merged into go
//! back), all free chunks given back at [`super::PinnedHeap::collect`], when the kernel refuses
//! memory, and with the heap. In a forked child the part is the parent's: nothing is made,
//! freed or given back there (its lock may have been held at the fork).

use std::sync::{Mutex, MutexGuard};

use super::tlsf::Tlsf;

/// Blocks of more bytes than this are large: mimalloc's small blocks' largest
/// (`MI_SMALL_MAX_OBJ_SIZE`, 64 KiB pages).
pub(super) const LARGE_MIN: usize = 10 << 10;

/// A large block's unit and alignment.
const UNIT: u64 = 4096;

/// The arena's chunk (the large part starts on one).
const CHUNK: u64 = 64 << 10;

/// What the large blocks need of the arena whose second half they are in.
pub(super) trait Part {
    /// Whether the arena is this process's (not a parent's, after a fork): no system call.
    fn is_ours(&self) -> bool;
    /// The address of the large part.
    fn large_base(&self) -> usize;
    /// Whether the chunks under `[offset, offset + len)` of the large part are all resident.
    fn large_resident(&self, offset: u64, len: u64) -> bool;
    /// The large part's resident bytes (no lock).
    fn large_bytes(&self) -> u64;
    /// Makes the chunks `[at, at + len)` touches resident (`on`), or gives back those wholly
    /// inside it: whether it was done (a give-back always is).
    fn commit(&self, on: bool, at: usize, len: usize) -> bool;
}

/// The large part's blocks, under their lock, and the part's length (fixed: read with no
/// lock, as every free of the heap asks whether its block is a large one).
pub(crate) struct LargeBlocks {
    len: u64,
    state: Mutex<Large>,
}

/// The large part's blocks, in units of [`UNIT`] from the part's start.
struct Large {
    blocks: Tlsf,
    /// The bytes of the blocks in use.
    used: u64,
}

impl Large {
    /// The blocks of a part of `len` bytes (a multiple of [`UNIT`], below 2^44).
    fn new(len: u64) -> Self {
        Self {
            blocks: Tlsf::new(u32::try_from(len / UNIT).unwrap_or(u32::MAX)),
            used: 0,
        }
    }

    /// The unit of the block at byte `offset`, if it is a unit's start.
    fn unit(offset: u64) -> Option<u32> {
        (offset % UNIT == 0).then(|| u32::try_from(offset / UNIT).ok())?
    }
}

impl LargeBlocks {
    /// The blocks of a part of `len` bytes.
    pub(super) fn new(len: u64) -> Self {
        Self {
            len,
            state: Mutex::new(Large::new(len)),
        }
    }

    /// The most free bytes the part keeps resident: a quarter of it.
    fn retain(&self) -> u64 {
        self.len / 4
    }

    fn lock(&self) -> MutexGuard<'_, Large> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `p` is in the large part of `part` (a large block, if it is one in use). Takes
    /// no lock: a forked child's copy of it may be held for good.
    pub(super) fn contains(&self, part: &impl Part, p: *const u8) -> bool {
        let (a, p) = (part.large_base(), p as usize);
        p >= a && ((p - a) as u64) < self.len
    }

    /// A large block of at least `size` bytes: its address and length; `None` if the part has
    /// no room, the kernel will not make its chunks resident (even once the free ones went
    /// back), or the arena is a parent's (after a fork).
    pub(super) fn alloc(&self, part: &impl Part, size: usize) -> Option<(*mut u8, u64)> {
        if !part.is_ours() {
            return None;
        }
        let want = u64::try_from(size).ok()?.div_ceil(UNIT).max(1);
        let want = u32::try_from(want).ok()?;
        let mut l = self.lock();
        let unit = l.blocks.alloc(want)?;
        let (offset, got) = (u64::from(unit) * UNIT, u64::from(want) * UNIT);
        let at = part.large_base() + offset as usize;
        if !part.large_resident(offset, got) {
            let commit = || part.commit(true, at, got as usize);
            let mut ok = commit();
            if !ok {
                // The kernel said no (the file's quota, the memory cgroup): the free chunks go
                // back, and it is asked again.
                Self::release(part, &mut l, 0);
                ok = commit();
            }
            if !ok {
                l.blocks.free(unit);
                return None;
            }
        }
        l.used += got;
        Some((at as *mut u8, got))
    }

    /// The length of the large block in use at `p`.
    pub(super) fn len_of(&self, part: &impl Part, p: *const u8) -> Option<u64> {
        if !part.is_ours() {
            return None;
        }
        let off = (p as usize).checked_sub(part.large_base())? as u64;
        let len = self.lock().blocks.used(Large::unit(off)?)?;
        Some(u64::from(len) * UNIT)
    }

    /// Frees the large block in use at `p`: its length (`None`, and nothing changes, if there
    /// is none). Beyond what the part keeps free and resident, the whole chunks of the free
    /// block it merged into go back (only those: a free is never a walk of every free block).
    pub(super) fn free(&self, part: &impl Part, p: *const u8) -> Option<u64> {
        if !part.is_ours() {
            return None;
        }
        let off = (p as usize).checked_sub(part.large_base())? as u64;
        let unit = Large::unit(off)?;
        let mut l = self.lock();
        let len = u64::from(l.blocks.used(unit)?) * UNIT;
        let (start, merged) = l.blocks.free(unit)?;
        l.used -= len;
        if part.large_bytes().saturating_sub(l.used) > self.retain() {
            let (from, to) = (u64::from(start) * UNIT, u64::from(start + merged) * UNIT);
            let (from, to) = (from.next_multiple_of(CHUNK), to / CHUNK * CHUNK);
            if to > from {
                let at = part.large_base() + from as usize;
                part.commit(false, at, (to - from) as usize);
            }
        }
        Some(len)
    }

    /// Gives back the resident chunks wholly inside free large blocks, the longest blocks
    /// first, until at most `keep` free bytes are resident.
    pub(super) fn give_back(&self, part: &impl Part, keep: u64) {
        if !part.is_ours() {
            return;
        }
        let mut l = self.lock();
        Self::release(part, &mut l, keep);
    }

    fn release(part: &impl Part, l: &mut Large, keep: u64) {
        let mut free = l.blocks.free_blocks();
        free.sort_unstable_by_key(|&(_, len)| std::cmp::Reverse(len));
        for (unit, len) in free {
            if part.large_bytes().saturating_sub(l.used) <= keep {
                break;
            }
            let at = part.large_base() + (u64::from(unit) * UNIT) as usize;
            let len = (u64::from(len) * UNIT) as usize;
            part.commit(false, at, len);
        }
    }

    /// The heap went: every large block is free again, and every chunk of the part goes back
    /// (one the kernel keeps under queued work is owed, as mimalloc's are).
    pub(super) fn reset(&self, part: &impl Part) {
        if !part.is_ours() {
            return;
        }
        *self.lock() = Large::new(self.len);
        part.commit(false, part.large_base(), self.len as usize);
    }
}
