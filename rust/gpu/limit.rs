// SPDX-License-Identifier: GPL-2.0

//! What bounds the vidmem one caller takes: each GPU's dmem region (the kernel's dmem cgroup
//! controller, where the kernel has it: `dmem.max` of the caller's cgroup and those above it)
//! and ruvm's own per-user limit (the same on every GPU: `vidmem_user_mib` at load, changed by
//! `RUVM_IOCTL_VIDMEM_LIMIT`), which holds on every kernel, Debian's stock one (built without
//! the controller) included.
//!
//! Every vidmem chunk a PMM hands out carries a [`VidCharge`]: its bytes charged to the calling
//! task's dmem cgroup and to its effective user's use of the GPU, both given back when the
//! chunk goes back to the PMM, whichever path drops it (a free, a close, a kill, a pool's trim
//! or the shrinker, a GPU's removal, the unload). So a chunk is paid for by the task that took
//! it from the GPU: a mem's by its allocating process, a pool's cached chunk by the process
//! whose allocation brought it into the pool, a GPU page table's by the process whose mapping
//! made it; kept root storage is the module's (no vidmem is in use in it).
//!
//! The users' table is a leaf lock, taken by chunk frees in reclaim (a pool's shrinker): it is
//! never held across an allocation (a new user's entry is allocated with it released). A user
//! is its effective uid as the kernel knows it (`kuid_t`): a process that can change its uid
//! within a user namespace of its own (subordinate ids) holds each uid's share; the dmem
//! controller's cgroup limit is what bounds such a process as a whole.

use kernel::{
    new_mutex,
    prelude::*,
    rbtree::{RBTree, RBTreeNodeReservation},
    str::CString,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc, Mutex,
    },
    task::Kuid,
};

use crate::bind::{
    dmem::{self, Region},
    global::global,
};

/// The per-user limit of each GPU's vidmem, in bytes (0: none).
static USER_LIMIT: Atomic<u64> = Atomic::new(0);

/// Sets the per-user limit (module init, and `RUVM_IOCTL_VIDMEM_LIMIT`): `bytes` of each GPU's
/// vidmem per user, 0 for none. Holdings above a lowered limit stay (later allocations fail).
pub(crate) fn set_user_limit(bytes: u64) {
    USER_LIMIT.store(bytes, Relaxed);
}

/// The per-user limit, in bytes (0: none).
pub(crate) fn user_limit() -> u64 {
    USER_LIMIT.load(Relaxed)
}

/// A user's key: the kernel's uid (`kuid_t`) and the GPU.
type UserKey = (u32, u32);

global! {
    /// Each user's vidmem of each GPU, in bytes (entries at 0 removed); made at the first
    /// charge (`RBTree::new` is not `const`; it allocates nothing).
    static USERS: Mutex<Option<RBTree<UserKey, u64>>> = None;
}

/// Makes the users' table usable (module init).
pub(crate) fn init() {
    USERS.init();
}

/// The calling task's effective user, as the kernel knows it.
fn caller() -> u32 {
    Kuid::current_euid().into_raw().val
}

/// The calling task's effective uid in its own user namespace, and its use of GPU `gpu`.
pub(crate) fn caller_use(gpu: u32) -> (u32, u64) {
    let uid = Kuid::current_euid().into_uid_in_current_ns();
    let used = USERS
        .lock()
        .and_then(|t| t.as_ref()?.get(&(caller(), gpu)).copied())
        .unwrap_or(0);
    (uid, used)
}

/// `/sys/kernel/debug/ruvm/vidmem_users`: each user's vidmem of each GPU, a line each
/// (`uid=<kernel uid> gpu=<id> bytes=<n>`), and the per-user limit first.
pub(crate) struct UsersView;

impl kernel::debugfs::Writer for UsersView {
    fn write(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        writeln!(f, "limit={}", user_limit())?;
        let Some(g) = USERS.lock() else {
            return Ok(());
        };
        for (&(uid, gpu), &bytes) in g.iter().flat_map(|t| t.iter()) {
            writeln!(f, "uid={uid} gpu={gpu} bytes={bytes}")?;
        }
        Ok(())
    }
}

/// A GPU's limits: its id and its dmem region (none without the controller, and none once
/// the GPU is gone: the region is unregistered then, so that the same GPU added back registers
/// a region of the same name that `dmem.max` reaches).
#[pin_data]
pub(crate) struct Limits {
    gpu: u32,
    #[pin]
    region: Mutex<Option<Arc<Region>>>,
    name: CString,
}

impl Limits {
    /// The limits of GPU `gpu` with `capacity` bytes of vidmem: registers its dmem region,
    /// named `ruvm/gpu<id>` (as `dmem.capacity` lists it).
    pub(crate) fn new(gpu: u32, capacity: u64) -> Result<impl PinInit<Self, Error>> {
        let name = CString::try_from_fmt(fmt!("ruvm/gpu{gpu}"))?;
        let region = match Region::register(capacity, &name)? {
            Some(r) => Some(Arc::new(r, GFP_KERNEL)?),
            None => None,
        };
        Ok(try_pin_init!(Self {
            gpu,
            region <- new_mutex!(region),
            name,
        }))
    }

    /// The region's name, while the GPU has one.
    pub(crate) fn region_name(&self) -> Option<&CStr> {
        self.region.lock().as_ref().map(|_| &*self.name)
    }

    /// The GPU is going: its region is unregistered (once the charges in flight are made;
    /// chunks still charged are uncharged as they go back, which the controller allows).
    pub(crate) fn end(&self) {
        drop(self.region.lock().take());
    }

    /// Charges `size` bytes of the GPU's vidmem to the calling task: `ENOMEM` (nothing
    /// charged) beyond its user's limit or its dmem cgroup's. The region's lock is not held
    /// while charging (the controller may allocate).
    pub(crate) fn charge(&self, size: u64) -> Result<VidCharge> {
        let user = UserCharge::take(self.gpu, size)?;
        let region = self.region.lock().clone();
        let dmem = match region {
            None => None,
            Some(r) => Some(r.try_charge(size).map_err(|e| match e {
                dmem::Refused::Limit => ENOMEM,
                dmem::Refused::Error(e) => e,
            })?),
        };
        Ok(VidCharge {
            _user: Some(user),
            _dmem: dmem,
        })
    }
}

/// A vidmem chunk's charges, given back when it drops.
pub(crate) struct VidCharge {
    _user: Option<UserCharge>,
    _dmem: Option<dmem::Charge>,
}

impl VidCharge {
    /// No charge (a GPU page table's: see `Pmm::alloc_table`).
    pub(crate) fn none() -> Self {
        Self {
            _user: None,
            _dmem: None,
        }
    }
}

/// Bytes of a GPU counted in a user's use of it.
struct UserCharge {
    key: UserKey,
    bytes: u64,
}

impl UserCharge {
    /// Counts `bytes` of GPU `gpu` for the calling task's user: `ENOMEM` beyond the limit.
    fn take(gpu: u32, bytes: u64) -> Result<Self> {
        let key = (caller(), gpu);
        // A new user's entry is allocated with the lock released (see the module doc), then
        // the count is tried again.
        let mut node = None;
        loop {
            let limit = user_limit();
            let mut g = USERS.lock().ok_or(ENODEV)?;
            let t = g.get_or_insert_with(RBTree::new);
            let used = t.get(&key).copied().unwrap_or(0);
            let after = used.checked_add(bytes).ok_or(ENOMEM)?;
            if limit != 0 && after > limit {
                return Err(ENOMEM);
            }
            if let Some(v) = t.get_mut(&key) {
                *v = after;
                return Ok(Self { key, bytes });
            }
            if let Some(n) = node.take() {
                let _ = t.insert(RBTreeNodeReservation::into_node(n, key, after));
                return Ok(Self { key, bytes });
            }
            drop(g);
            node = Some(RBTreeNodeReservation::new(GFP_KERNEL_ACCOUNT)?);
        }
    }
}

impl Drop for UserCharge {
    fn drop(&mut self) {
        let Some(mut g) = USERS.lock() else {
            return;
        };
        let Some(t) = g.as_mut() else {
            return;
        };
        let left = match t.get_mut(&self.key) {
            Some(v) => {
                *v = v.saturating_sub(self.bytes);
                *v
            }
            None => return,
        };
        if left == 0 {
            // The node is freed with the lock held: freeing never reclaims.
            let _ = t.remove(&self.key);
        }
    }
}
