// SPDX-License-Identifier: GPL-2.0

//! Registering memory the caller already has (`RUVM_IOCTL_MEM_REGISTER`; the mem layer's
//! `register`), the file's index of its registered ranges, and the link a registration's
//! revocation reaches the file's tables through.
//!
//! The index maps (address space, range end) to the range's start and the mem's handle: an
//! address of the calling process is found in it by the first range ending after it, and two
//! registrations of one file in one address space never overlap (`EEXIST`). A revocation (the
//! range unmapped) frees the handle through [`FileLink`], which the file's close cuts: one
//! running then has finished with the tables, and later ones find nothing.

use kernel::{
    fs::File,
    new_mutex,
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
    sync::{Arc, Mutex},
    uaccess::UserSlice,
};

use crate::{
    bind::vma,
    mem::{
        register::{RegisterRequest, Registered, Revoke, Unregister},
        Handle, Mem, Origin,
    },
    uapi,
};

use super::{args, max_alloc_bytes, Entry, FileInner, RuvmFile};
use crate::audit::{Class, Counted};

/// A registered range's key in the index: its address space's identity and its end.
pub(super) type RangeKey = (usize, u64);

/// A registered range in the index: its start, its mem's handle, and its revocation (which
/// says whether the range was unmapped).
struct Range {
    start: u64,
    handle: Handle,
    revoke: Arc<Revoke>,
}

/// A file's registered ranges: by (address space, end).
pub(super) struct Ranges {
    tree: RBTree<RangeKey, Range>,
}

impl Ranges {
    pub(super) fn new() -> Self {
        Self {
            tree: RBTree::new(),
        }
    }

    /// The registration of address space `mm` holding `addr` (not unmapped): its handle and
    /// `addr`'s offset in it.
    fn at(&self, mm: usize, addr: u64) -> Option<(Handle, u64)> {
        let cursor = self.tree.cursor_lower_bound(&(mm, addr.checked_add(1)?))?;
        let (&(m, _end), r) = cursor.current();
        (m == mm && r.start <= addr && !r.revoke.ended()).then(|| (r.handle, addr - r.start))
    }

    /// The first registered range of `mm` overlapping `[start, end)`: its handle and whether
    /// it was unmapped (its revocation pending).
    fn first_overlap(&self, mm: usize, start: u64, end: u64) -> Option<(Handle, bool)> {
        let c = self.tree.cursor_lower_bound(&(mm, start.checked_add(1)?))?;
        let (&(m, _), r) = c.current();
        (m == mm && r.start < end).then(|| (r.handle, r.revoke.ended()))
    }

    /// Whether `[start, end)` of `mm` overlaps a registered range not unmapped yet (ranges
    /// unmapped but not revoked yet are taken out when a registration is entered).
    fn overlaps_live(&self, mm: usize, start: u64, end: u64) -> bool {
        // Ends are unique within an address space: the next range is the first ending after.
        let mut from = start;
        while let Some(c) = from
            .checked_add(1)
            .and_then(|k| self.tree.cursor_lower_bound(&(mm, k)))
        {
            let (&(m, e), r) = c.current();
            if m != mm || r.start >= end {
                return false;
            }
            if !r.revoke.ended() {
                return true;
            }
            from = e;
        }
        false
    }

    pub(super) fn remove(&mut self, key: RangeKey) {
        let _ = self.tree.remove(&key);
    }
}

/// How a registration's revocation reaches its file's tables: cut when the file closes.
#[pin_data]
pub(crate) struct FileLink {
    #[pin]
    tables: Mutex<Option<Arc<Mutex<FileInner>>>>,
}

impl FileLink {
    pub(super) fn new(tables: Arc<Mutex<FileInner>>) -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                tables <- new_mutex!(Some(tables)),
            }),
            GFP_KERNEL_ACCOUNT,
        )
    }

    /// Cuts the link (the file's close); returns the tables' reference it held, to drop.
    pub(super) fn cut(&self) -> Option<Arc<Mutex<FileInner>>> {
        self.tables.lock().take()
    }
}

impl Unregister for FileLink {
    fn unregister(&self, handle: Handle) {
        let mem = {
            let link = self.tables.lock();
            link.as_ref()
                .and_then(|tables| tables.lock().remove(handle))
        };
        // Freed as `MEM_FREE` frees, with no lock held: a registered mem has no user mapping
        // of ruvm's to zap (it cannot be mmapped), nor one made by `RUVM_ALLOC_MAP_USER`.
        if let Some(mem) = mem {
            drop(mem.retire());
        }
    }
}

impl RuvmFile {
    /// `RUVM_IOCTL_MEM_REGISTER`.
    pub(super) fn mem_register(&self, file: &File, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_register>(user)?;
        let req = RegisterRequest {
            addr: args.addr,
            size: args.size,
            max_bytes: max_alloc_bytes(),
        };
        let mm = vma::current_mm_id();
        // Shape errors first (`Mem::register` checks them again): an overlap is only asked
        // of a well-formed range.
        let end = args.addr.checked_add(args.size).ok_or(EOVERFLOW)?;
        let page = kernel::page::PAGE_SIZE as u64;
        if args.size == 0 || args.addr % page != 0 || args.size % page != 0 {
            return Err(EINVAL);
        }
        if self
            .inner
            .lock()
            .registered
            .overlaps_live(mm, args.addr, end)
        {
            return Err(EEXIST);
        }
        let link: Arc<dyn Unregister> = self.link.clone();
        let made = Mem::register(&req, &self.quota, link, Origin::here("MEM_REGISTER"))?;
        let mem = made.mem.clone();
        let mut stale = KVec::new();
        let entered = self.insert_registered(&made, (mm, end), args.addr, &mut stale);
        // Registrations of the range unmapped but not revoked yet were revoked here instead.
        for m in stale {
            drop(m.retire());
        }
        let handle = entered?;
        // Unmapped before the handle was known: undone here (nothing was queued for it).
        if let Err(e) = made.publish(handle) {
            self.free_unlearned(file, handle);
            return Err(e);
        }
        args.handle = handle.0;
        if let Err(e) = writer.write(&args) {
            self.free_unlearned(file, handle);
            return Err(e);
        }
        mem.commit();
        Ok(())
    }

    /// Enters a registered mem in the tables under a new handle, its range in the index:
    /// `EEXIST` if a live registration of the same address space overlapping it got there
    /// first. Registrations it overlaps whose ranges were unmapped (their revocations not run
    /// yet) are taken out of the tables first, into `stale`, for the caller to retire with the
    /// lock released (their revocations then find nothing).
    fn insert_registered(
        &self,
        made: &Registered,
        key: RangeKey,
        start: u64,
        stale: &mut KVec<Arc<Mem>>,
    ) -> Result<Handle> {
        let handle = Handle::new();
        let mem = made.mem.clone();
        let offset = mem.mmap_offset();
        let range = Range {
            start,
            handle,
            revoke: made.revoke(),
        };
        let node = RBTreeNode::new(key, range, GFP_KERNEL_ACCOUNT)?;
        let entry = Entry {
            mem,
            _handle: Counted::new(Class::Handles, 1),
            registered: Some(key),
        };
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        while let Some((h, ended)) = inner.registered.first_overlap(key.0, start, key.1) {
            if !ended {
                return Err(EEXIST);
            }
            // Room first: a mem taken out must reach the caller, to be retired unlocked.
            stale.reserve(1, GFP_KERNEL)?;
            match inner.remove(h) {
                Some(m) => {
                    let _ = stale.push_within_capacity(m);
                }
                // Not in the tables: its index entry is a leftover (never: they go together).
                None => return Err(EEXIST),
            }
        }
        inner.enter(handle, offset, entry)?;
        let _ = inner.registered.tree.insert(node);
        Ok(handle)
    }

    /// The calling file's registration holding `addr` in the calling process: its handle
    /// and `addr`'s offset in it.
    pub(super) fn registered_at(&self, addr: u64) -> Option<(Handle, u64)> {
        let mm = vma::current_mm_id();
        self.inner.lock().registered.at(mm, addr)
    }
}
