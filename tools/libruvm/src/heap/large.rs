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

use std::sync::MutexGuard;

use super::arena::Arena;
use super::tlsf::Tlsf;

/// Blocks of more bytes than this are large: mimalloc's small blocks' largest
/// (`MI_SMALL_MAX_OBJ_SIZE`, 64 KiB pages).
pub(super) const LARGE_MIN: usize = 10 << 10;

/// A large block's unit and alignment.
const UNIT: u64 = 4096;

/// The arena's chunk (the large part starts on one).
const CHUNK: u64 = 64 << 10;

/// The large part's blocks, in units of [`UNIT`] from the part's start.
pub(crate) struct Large {
    blocks: Tlsf,
    len: u64,
    /// The bytes of the blocks in use.
    used: u64,
}

impl Large {
    /// The blocks of a part of `len` bytes (a multiple of [`UNIT`], below 2^44).
    pub(super) fn new(len: u64) -> Self {
        Self {
            blocks: Tlsf::new(u32::try_from(len / UNIT).unwrap_or(u32::MAX)),
            len,
            used: 0,
        }
    }

    /// The unit of the block at byte `offset`, if it is a unit's start.
    fn unit(offset: u64) -> Option<u32> {
        (offset % UNIT == 0).then(|| u32::try_from(offset / UNIT).ok())?
    }

    /// The most free bytes the part keeps resident: a quarter of it.
    fn retain(&self) -> u64 {
        self.len / 4
    }
}

impl Arena {
    fn large_lock(&self) -> MutexGuard<'_, Large> {
        self.large.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `p` is in the large part (a large block, if it is one in use).
    pub(super) fn is_large(&self, p: *const u8) -> bool {
        let (a, p) = (self.large_base(), p as usize);
        p >= a && p - a < self.len() as usize / 2
    }

    /// A large block of at least `size` bytes: its address and length; `None` if the part has
    /// no room, the kernel will not make its chunks resident (even once the free ones went
    /// back), or the arena is a parent's (after a fork).
    pub(super) fn large_alloc(&self, size: usize) -> Option<(*mut u8, u64)> {
        if !self.is_ours() {
            return None;
        }
        let want = u64::try_from(size).ok()?.div_ceil(UNIT).max(1);
        let want = u32::try_from(want).ok()?;
        let mut l = self.large_lock();
        let unit = l.blocks.alloc(want)?;
        let (offset, got) = (u64::from(unit) * UNIT, u64::from(want) * UNIT);
        let at = self.large_base() + offset as usize;
        if !self.large_resident(offset, got) {
            let commit = || self.commit_range(true, at, got as usize, std::ptr::null_mut());
            let mut ok = commit();
            if !ok {
                // The kernel said no (the file's quota, the memory cgroup): the free chunks go
                // back, and it is asked again.
                self.large_release(&mut l, 0);
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
    pub(super) fn large_len(&self, p: *const u8) -> Option<u64> {
        if !self.is_ours() {
            return None;
        }
        let off = (p as usize).checked_sub(self.large_base())? as u64;
        let len = self.large_lock().blocks.used(Large::unit(off)?)?;
        Some(u64::from(len) * UNIT)
    }

    /// Frees the large block in use at `p`: its length (`None`, and nothing changes, if there
    /// is none). Beyond what the part keeps free and resident, the whole chunks of the free
    /// block it merged into go back (only those: a free is never a walk of every free block).
    pub(super) fn large_free(&self, p: *const u8) -> Option<u64> {
        if !self.is_ours() {
            return None;
        }
        let off = (p as usize).checked_sub(self.large_base())? as u64;
        let unit = Large::unit(off)?;
        let mut l = self.large_lock();
        let len = u64::from(l.blocks.used(unit)?) * UNIT;
        let (start, merged) = l.blocks.free(unit)?;
        l.used -= len;
        if self.large_bytes().saturating_sub(l.used) > l.retain() {
            let (from, to) = (u64::from(start) * UNIT, u64::from(start + merged) * UNIT);
            let (from, to) = (from.next_multiple_of(CHUNK), to / CHUNK * CHUNK);
            if to > from {
                let at = self.large_base() + from as usize;
                self.commit_range(false, at, (to - from) as usize, std::ptr::null_mut());
            }
        }
        Some(len)
    }

    /// Gives back the resident chunks wholly inside free large blocks, the longest blocks
    /// first, until at most `keep` free bytes are resident.
    pub(super) fn large_give_back(&self, keep: u64) {
        if !self.is_ours() {
            return;
        }
        let mut l = self.large_lock();
        self.large_release(&mut l, keep);
    }

    fn large_release(&self, l: &mut Large, keep: u64) {
        let mut free = l.blocks.free_blocks();
        free.sort_unstable_by_key(|&(_, len)| std::cmp::Reverse(len));
        for (unit, len) in free {
            if self.large_bytes().saturating_sub(l.used) <= keep {
                break;
            }
            let at = self.large_base() + (u64::from(unit) * UNIT) as usize;
            let len = (u64::from(len) * UNIT) as usize;
            self.commit_range(false, at, len, std::ptr::null_mut());
        }
    }

    /// The heap went: every large block is free again, and every chunk of the part goes back
    /// (one the kernel keeps under queued work is owed, as mimalloc's are).
    pub(super) fn large_reset(&self) {
        if !self.is_ours() {
            return;
        }
        let mut l = self.large_lock();
        let len = l.len;
        *l = Large::new(len);
        self.commit_range(false, self.large_base(), len as usize, std::ptr::null_mut());
    }
}
