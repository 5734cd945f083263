// SPDX-License-Identifier: GPL-2.0

//! The stream status page (`RUVM_IOCTL_STREAM_STATUS`, `mmap` at `RUVM_STATUS_MMAP_OFFSET`):
//! each stream given a slot publishes its completed point there, read without a system call.

use nix::errno::Errno;

use crate::{uapi, Ruvm, UserMap};

/// The file's stream status page, mapped read-only: how far each stream given a slot
/// ([`Ruvm::stream_status`]) is, read without a system call.
pub struct StatusPage {
    map: UserMap,
}

// SAFETY: the mapping is read-only and the kernel writes each word atomically; reading it from
// any thread is what it is for.
unsafe impl Send for StatusPage {}
// SAFETY: as above: shared reads of atomic words.
unsafe impl Sync for StatusPage {}

impl StatusPage {
    /// Maps `dev`'s status page (`mmap` at `RUVM_STATUS_MMAP_OFFSET`, `PROT_READ`).
    pub fn map(dev: &Ruvm) -> Result<Self, Errno> {
        use nix::sys::mman::{MapFlags, ProtFlags};
        let len = page_size().ok_or(Errno::EINVAL)?;
        let map = UserMap::new(
            dev,
            uapi::RUVM_STATUS_MMAP_OFFSET,
            len,
            ProtFlags::PROT_READ,
            MapFlags::MAP_SHARED,
        )?;
        Ok(Self { map })
    }

    /// Word `i` of the page.
    fn word(&self, i: usize) -> Option<u64> {
        use std::sync::atomic::{AtomicU64, Ordering};
        if (i + 1) * 8 > self.map.len() {
            return None;
        }
        // SAFETY: the word is inside the mapping, 8-byte aligned (the mapping is page-aligned),
        // and the kernel only ever stores it atomically; the mapping lives as long as `self`.
        let w = unsafe { AtomicU64::from_ptr(self.map.as_ptr().cast::<u64>().add(i)) };
        Some(w.load(Ordering::Acquire))
    }

    /// What slot `slot` publishes for stream `stream`: `None` if the slot is not that
    /// stream's (any more), or past the page.
    pub fn read(&self, slot: u32, stream: u64) -> Option<SlotState> {
        let i = 4 * usize::try_from(slot).ok()?;
        if self.word(i)? != stream {
            return None;
        }
        // The point first: the error that a point covers was stored before it.
        let completed = self.word(i + 1)?;
        let error = self.word(i + 2)?;
        let failed_seqno = self.word(i + 3)?;
        // The same handle after the reads: what was read was that stream's.
        (self.word(i)? == stream).then_some(SlotState {
            completed,
            error: i32::try_from(error).unwrap_or(i32::MAX),
            failed_seqno,
        })
    }

    /// The completed point slot `slot` publishes for stream `stream` (see [`StatusPage::read`]).
    pub fn completed(&self, slot: u32, stream: u64) -> Option<u64> {
        self.read(slot, stream).map(|s| s.completed)
    }
}

/// One stream's entry of the status page, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotState {
    /// The seqno its work is complete up to (run or not).
    pub completed: u64,
    /// 0, or the errno that put it in error.
    pub error: i32,
    /// With `error`: the seqno of the operation that failed.
    pub failed_seqno: u64,
}

/// The system's page size (the status page's length), `None` if it cannot be read.
pub fn page_size() -> Option<usize> {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|n| usize::try_from(n).ok())
}
