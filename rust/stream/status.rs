// SPDX-License-Identifier: GPL-2.0

//! A file's stream status page: where its streams publish how far they are, for user space to
//! read without a system call (`RUVM_IOCTL_STREAM_STATUS`, `mmap` at
//! `RUVM_STATUS_MMAP_OFFSET`, read-only).
//!
//! One page a file, made at the first ask and charged to the asker's memory cgroup:
//! `RUVM_STATUS_SLOTS` slots of (`handle`, `completed`, `error`, `failed_seqno`), four words
//! each. A stream given a slot holds it ([`Slot`]) until it is destroyed (or dropped, at the
//! file's close); its `completed` is stored whenever the stream's completed point moves (where
//! `StreamCore::reached` is), the stream's sticky error before it. A slot is given with its
//! other words stored first and the handle last, and taken back with the handle cleared
//! first. The file, each slot and each user mapping (a VMA owner) hold the page: it goes with
//! the last of them.

use kernel::{
    mm::virt::VmaNew,
    new_spinlock,
    page::PAGE_SIZE,
    prelude::*,
    sync::{Arc, SpinLock},
};

use crate::{
    bind::{
        vma::{self, VmaOwner, VmaPages},
        words::Words,
    },
    uapi,
};

/// Slots in the page.
const SLOTS: usize = uapi::RUVM_STATUS_SLOTS as usize;
/// Words a slot: handle, completed, error, failed seqno.
const WORDS: usize = 4;
const _: () = assert!(WORDS * SLOTS <= Words::COUNT);
// Every live stream of a file can have a slot: destroyed ones give theirs back.
const _: () = assert!(uapi::RUVM_MAX_FILE_STREAMS as usize <= SLOTS);
const _: () = assert!(core::mem::size_of::<uapi::ruvm_status_slot>() == 8 * WORDS);

/// The page and which slots are taken.
#[pin_data]
pub(crate) struct Status {
    words: Words,
    #[pin]
    taken: SpinLock<[u64; SLOTS.div_ceil(64)]>,
}

static VM_OPS: vma::Ops<Status> = vma::Ops::new();

impl Status {
    /// A file's page, all slots free (`ENOMEM` without a page).
    pub(crate) fn new() -> Result<Arc<Self>> {
        let words = Words::new()?;
        Arc::pin_init(
            pin_init!(Status {
                words,
                taken <- new_spinlock!([0; SLOTS.div_ceil(64)]),
            }),
            GFP_KERNEL_ACCOUNT,
        )
    }

    /// A free slot for stream `handle`, whose completed point is `completed` and sticky error
    /// `error` (`ENOSPC` if every slot is taken).
    pub(crate) fn take(
        self: &Arc<Self>,
        handle: u64,
        completed: u64,
        error: Option<(Error, u64)>,
    ) -> Result<Slot> {
        let index = {
            let mut taken = self.taken.lock();
            let index = (0..SLOTS)
                .find(|&i| taken[i / 64] & (1 << (i % 64)) == 0)
                .ok_or(ENOSPC)?;
            taken[index / 64] |= 1 << (index % 64);
            index
        };
        let slot = Slot {
            status: self.clone(),
            index,
        };
        slot.publish(completed, error);
        self.words.store(WORDS * index, handle);
        Ok(slot)
    }

    /// Maps the page into a new VMA: one page, never writable or executable (`EPERM` for
    /// `PROT_WRITE`/`PROT_EXEC`; `mprotect` cannot add them later), not copied by `fork` (as a
    /// mem's mapping; `MADV_DOFORK` can undo that, harmlessly: the child shares the page).
    pub(crate) fn map(self: &Arc<Self>, vma: &VmaNew) -> Result {
        let len = vma.end().checked_sub(vma.start()).ok_or(EINVAL)?;
        if len != PAGE_SIZE {
            return Err(EINVAL);
        }
        if vma.writable() || vma.executable() {
            return Err(EPERM);
        }
        vma.try_clear_maywrite()?;
        vma.try_clear_mayexec()?;
        vma.set_dontcopy();
        vma.set_dontexpand();
        vma::new_pages(vma).insert(0, &self.words.page())?;
        vma::install(vma, self.clone(), &VM_OPS);
        Ok(())
    }
}

impl VmaOwner for Status {
    fn vma_opened(&self) {}

    fn vma_closed(&self) {}

    /// The page again after a zap (the VMA is one page).
    fn fault(&self, index: usize, vma: &VmaPages<'_>) -> Result {
        if index != 0 {
            return Err(EFAULT);
        }
        vma.insert(0, &self.words.page())
    }
}

/// A stream's slot of its file's page.
pub(crate) struct Slot {
    status: Arc<Status>,
    index: usize,
}

impl Slot {
    /// The slot's number.
    pub(crate) fn index(&self) -> u32 {
        // CAST: below `SLOTS` (128).
        self.index as u32
    }

    /// Publishes the stream's completed point, its sticky error first (if it has one).
    pub(crate) fn publish(&self, completed: u64, error: Option<(Error, u64)>) {
        let at = WORDS * self.index;
        if let Some((e, seqno)) = error {
            // CAST: an errno, positive and small.
            self.status.words.store(at + 3, seqno);
            self.status.words.store(at + 2, (-e.to_errno()) as u64);
        }
        self.status.words.store(at + 1, completed);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let at = WORDS * self.index;
        self.status.words.store(at, 0);
        for w in 1..WORDS {
            self.status.words.store(at + w, 0);
        }
        let mut taken = self.status.taken.lock();
        taken[self.index / 64] &= !(1 << (self.index % 64));
    }
}

/// The stream's side: publishing its points, and its slot.
impl super::StreamCore {
    /// Notes the completed point `st` reached, under its lock: for a pool's opportunistic
    /// reuse (`reached`) and in the stream's slot of the status page, if it has one.
    pub(super) fn reached_now(&self, st: &super::StreamState) {
        self.reached
            .store(st.completed, kernel::sync::atomic::ordering::Release);
        if let Some(slot) = &st.slot {
            slot.publish(st.completed, st.error);
        }
    }

    /// Its slot of the file's status page `page` (given at the first call: `ENOSPC` if none
    /// is free), and its completed point; `ENOENT` once destroyed (a destroy racing the call
    /// gave its slot back already).
    pub(crate) fn status_slot(&self, page: &Arc<Status>) -> Result<(u32, u64)> {
        let mut st = self.state.lock();
        if st.destroyed || st.cancelled {
            return Err(ENOENT);
        }
        let completed = st.completed;
        let index = match &st.slot {
            Some(slot) => slot.index(),
            None => {
                let slot = page.take(self.handle, completed, st.error)?;
                let index = slot.index();
                st.slot = Some(slot);
                index
            }
        };
        Ok((index, completed))
    }
}
