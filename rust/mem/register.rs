// SPDX-License-Identifier: GPL-2.0

//! Registered mems (`RUVM_IOCTL_MEM_REGISTER`, CUDA's `cudaHostRegister`): a range of the
//! caller's own memory made a mem.
//!
//! The range's pages are pinned long-term (`bind::pages`' user lists: one page a chunk,
//! counted in the address space's `VmPin`, bounded by `RLIMIT_MEMLOCK`) and are the mem's
//! chunks until it goes: DMA tables, the kernel mapping, copies and fills reach them as any
//! sysmem mem's. They are not ruvm's: the process keeps mapping them (ruvm never maps them
//! again: no `mmap` of the mem, no dma-buf of it) and they stay charged to whoever they were
//! charged to.
//!
//! The registration ends when its owner frees the mem (`MEM_FREE`, or the file's close) or
//! when the range, or part of it, is unmapped (`munmap`, `mremap` away, `MAP_FIXED` over
//! it, the process's exit): an interval notifier ([`RangeWatch`]) reports the unmapping, and
//! a work item ([`Revoke`]) then frees the mem's handle as `MEM_FREE` would, through the
//! file ([`Unregister`]). Either way, work queued before still holds the pages (never freed
//! under a copy: they stay pinned, no longer the process's if it unmapped them) and the pins
//! go with the last holder.

use kernel::{
    impl_has_work, new_mutex, new_work,
    prelude::*,
    sync::{
        atomic::{ordering::Full, ordering::Relaxed, Atomic},
        Arc,
    },
    workqueue::{Work, WorkItem},
};

use crate::{
    audit::{stats::Usage, Class, Counted},
    bind::{
        notifier::{RangeWatch, Unmapped},
        pages::{ChunkList, PinError},
        vma::{self, RangeKind},
        workqueue::ModuleQueue,
    },
    uapi,
};

use super::{
    new_serial, offsets, policy::Layout, quota::Quota, registry, storage::stop_on_signal,
    storage::Storage, Handle, Mem, MemCore, MemState, Origin,
};

/// The queue revocations run on (made at module init, destroyed at unload).
static REVOKES: ModuleQueue = ModuleQueue::new();

/// Makes the revocation queue (module init).
pub(super) fn init() -> Result {
    REVOKES.init(c"ruvm-revokes")
}

/// Waits for the revocations queued or running (one may still be dropping what it took out
/// of a file closed since): the unload's report sees everything they free as gone.
pub(crate) fn settle() {
    REVOKES.flush();
}

/// Waits for every revocation, then frees the queue (unload: no file is left, so no new one
/// can be queued).
pub(super) fn exit() {
    REVOKES.destroy();
}

/// What frees a registered mem's handle when its range is unmapped: its file's table.
pub(crate) trait Unregister: Send + Sync {
    /// Frees `handle` as `MEM_FREE` would, if the table still has it (the file may have been
    /// closed, or the handle freed, meanwhile). Process context, no lock held.
    fn unregister(&self, handle: Handle);
}

/// A registration's revocation: queued once, when its range is first unmapped.
#[pin_data]
pub(crate) struct Revoke {
    #[pin]
    work: Work<Revoke>,
    to: Arc<dyn Unregister>,
    /// The mem's handle once its file's table has it (0 before).
    handle: Atomic<u64>,
    /// The range was unmapped (1). Read and written only by full-barrier exchanges, as
    /// `handle` is, so that of a publication and an unmapping racing, at least one sees the
    /// other.
    fired: Atomic<u32>,
}

impl_has_work! {
    impl HasWork<Self> for Revoke { self.work }
}

impl WorkItem for Revoke {
    type Pointer = Arc<Revoke>;

    fn run(this: Arc<Revoke>) {
        this.to.unregister(Handle(this.handle.load(Relaxed)));
    }
}

impl Unmapped for Arc<Revoke> {
    fn unmapped(&self) {
        // Queued once, and only once the handle is known: before that, `Mem::register` sees
        // `fired` (after publishing the handle) and undoes the registration itself.
        if self.fired.xchg(1, Full) == 0 && self.handle.fetch_add(0, Full) != 0 {
            if let Some(q) = REVOKES.get() {
                let _ = q.enqueue(self.clone());
            }
        }
    }
}

impl Revoke {
    /// Whether the range was unmapped (the registration is over, or about to be).
    pub(crate) fn ended(&self) -> bool {
        self.fired.load(Relaxed) != 0
    }

    /// The handle reached the file's table: from now on an unmapping revokes it. `false` if
    /// the range was unmapped already (the caller undoes the registration: nothing is queued,
    /// or the queued revocation finds nothing).
    fn publish(&self, handle: Handle) -> bool {
        self.handle.xchg(handle.0, Full);
        // Fired before it could see the handle: the caller frees it (had the notification
        // seen it too, the revocation it queued finds no handle left to free).
        self.fired.fetch_add(0, Full) == 0
    }
}

/// A registered mem's range in its process, watched for unmapping (until the mem is freed).
pub(crate) struct UserRange {
    _watch: Pin<KBox<RangeWatch<Arc<Revoke>>>>,
}

/// What `RUVM_IOCTL_MEM_REGISTER` asks for, validated in shape (flags, zero fields).
pub(crate) struct RegisterRequest {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    /// Largest physical size one mem may have.
    pub(crate) max_bytes: u64,
}

/// A registered mem made but not yet in its file's table, and its revocation.
pub(crate) struct Registered {
    pub(crate) mem: Arc<Mem>,
    revoke: Arc<Revoke>,
}

impl Registered {
    /// Its revocation, which says when the range was unmapped.
    pub(crate) fn revoke(&self) -> Arc<Revoke> {
        self.revoke.clone()
    }

    /// Its handle is in the file's table: `EFAULT` if the range was unmapped meanwhile (the
    /// caller frees the handle).
    pub(crate) fn publish(&self, handle: Handle) -> Result {
        if self.revoke.publish(handle) {
            Ok(())
        } else {
            Err(EFAULT)
        }
    }
}

/// The errno of a range that cannot be registered.
fn refusal(kind: RangeKind) -> Error {
    match kind {
        RangeKind::Hole | RangeKind::Pinnable => EFAULT,
        RangeKind::NoAccess => EACCES,
        RangeKind::Unpinnable => crate::bind::errno::eopnotsupp(),
        RangeKind::Ours => EEXIST,
    }
}

impl Mem {
    /// Registers `[addr, addr + size)` of the calling process (see the module doc); `to`
    /// frees its handle if the range is unmapped. Errors: `EINVAL` unaligned or empty,
    /// `EOVERFLOW` past the address space, `ENOSPC` beyond `max_bytes` or the quota, `EFAULT`
    /// a hole, `EACCES` no read and write access, `EOPNOTSUPP` a mapping that cannot be
    /// pinned long-term, `EEXIST` a mapping of a mem, `ENOMEM` beyond `RLIMIT_MEMLOCK` or out
    /// of memory; a pending signal stops it. On error nothing stays pinned or charged.
    pub(crate) fn register(
        req: &RegisterRequest,
        quota: &Arc<Quota>,
        to: Arc<dyn Unregister>,
        origin: Origin,
    ) -> Result<Registered> {
        let page = kernel::page::PAGE_SIZE as u64;
        if req.size == 0 || req.addr % page != 0 || req.size % page != 0 {
            return Err(EINVAL);
        }
        let end = req.addr.checked_add(req.size).ok_or(EOVERFLOW)?;
        let addr = usize::try_from(req.addr).map_err(|_| EOVERFLOW)?;
        let len = usize::try_from(req.size).map_err(|_| EOVERFLOW)?;
        usize::try_from(end).map_err(|_| EOVERFLOW)?;
        if req.size > req.max_bytes {
            return Err(ENOSPC);
        }
        match vma::range_kind(addr, len, true, &super::cpu::VM_OPS) {
            RangeKind::Pinnable => {}
            other => return Err(refusal(other)),
        }
        // A page of the file's quota, as a sparse mem: what bounds how many mems it makes
        // (the pages are the process's, bounded by its limit on pinned memory).
        let charge = quota.charge(page)?;
        let revoke = Arc::pin_init(
            pin_init!(Revoke {
                work <- new_work!("ruvm revoke"),
                to,
                handle: Atomic::new(0),
                fired: Atomic::new(0),
            }),
            GFP_KERNEL_ACCOUNT,
        )?;
        // Watched before pinning: an unmapping from here on is seen.
        let watch = RangeWatch::new(addr, len, revoke.clone())?;
        let count = len / kernel::page::PAGE_SIZE;
        let audit = Counted::new(Class::SysmemChunks(0), count as u64);
        let pages =
            ChunkList::pin_user(addr, count, audit, stop_on_signal).map_err(|e| match e {
                PinError::Limit => ENOMEM,
                // The range changed since it was checked, or the kernel will not pin it for
                // long (a shared writable mapping of a file whose filesystem tracks dirty
                // pages): which, is told by the range as it is now.
                PinError::Refused(e) => {
                    match vma::range_kind(addr, len, true, &super::cpu::VM_OPS) {
                        RangeKind::Pinnable if e == EFAULT => crate::bind::errno::eopnotsupp(),
                        RangeKind::Pinnable => e,
                        other => refusal(other),
                    }
                }
                PinError::Other(e) => e,
            })?;
        // The range may have changed between the first check and the watch's insertion (a
        // mapping of a mem put there with MAP_FIXED, say): what was pinned is what the range
        // maps now only if it still passes (a change after the insertion fires the watch).
        match vma::range_kind(addr, len, true, &super::cpu::VM_OPS) {
            RangeKind::Pinnable => {}
            other => return Err(refusal(other)),
        }
        let layout = Layout {
            chunk_size: page,
            chunk_count: count as u64,
            physical_size: req.size,
        };
        let mmap = offsets::MmapRange::new(req.size)?;
        let mut state = MemState::new(None, None);
        state.user = Some(UserRange { _watch: watch });
        let serial = new_serial();
        let gfp = origin.gfp();
        let core = Arc::pin_init(
            try_pin_init!(MemCore {
                serial,
                size: req.size,
                layout,
                alloc_flags: uapi::ruvm_alloc_flags_RUVM_ALLOC_REGISTERED,
                mmap: Some(mmap),
                storage: Storage::Sys(pages),
                source: None,
                user_mappings: Atomic::new(0),
                leased: false,
                handed: Atomic::new(false),
                committed: Atomic::new(false),
                exported: Atomic::new(false),
                pool: 0,
                owner: quota.id(),
                state <- new_mutex!(state),
                origin,
                _mems: Counted::new(Class::Mems, 1),
                _bytes: Counted::new(Class::SysmemBytes, req.size),
                _usage: Some(Usage::new(
                    crate::audit::stats::StatsBacking::Sysmem,
                    req.size,
                    req.size
                )),
            }),
            gfp,
        )?;
        let mem = Arc::new(
            Mem {
                core: core.clone(),
                _charge: Some(charge),
            },
            gfp,
        )?;
        registry::insert(serial, core)?;
        Ok(Registered { mem, revoke })
    }

    /// Whether the mem is a registration of user memory.
    pub(crate) fn is_registered(&self) -> bool {
        self.alloc_flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_REGISTERED != 0
    }
}
