// SPDX-License-Identifier: GPL-2.0

//! One open file of `/dev/ruvm`: its table of mems, the ioctl dispatcher and `mmap`.
//!
//! This file owns the per-file state and the dispatch; each ioctl group has a file of its own
//! ([`mem_ioctls`], [`gpu_ioctls`], [`audit_ioctls`], [`test_ioctls`]), and every argument
//! structure is read through [`args`]. Unknown commands are `ENOTTY`
//! (Documentation/driver-api/ioctl.rst). It must not reach into a mem's or a GPU's insides:
//! it calls their methods with validated values.
//!
//! Locking: the file's mutex guards its tables only; it is released before a mem is worked on
//! (the mem has its own mutex) and before user memory is touched.
//!
//! The handle table is an `RBTree`, not the kernel's `XArray`: 7.2's `XArray` has no way to
//! walk its entries, which closing a file needs (the reclaim report).

use kernel::{
    fs::File,
    ioctl::_IOC_SIZE,
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    rbtree::{RBTree, RBTreeNodeReservation},
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc, Mutex,
    },
    uaccess::{UserPtr, UserSlice},
};

use crate::{
    audit::{self, Class, Counted},
    bind::{fops, ratelimit, vma},
    gpu::mmu::{self, Mmu},
    mem::{
        pool::{self, Pool},
        quota::Quota,
        tree::KeptTree,
        Handle, Mem, Origin,
    },
    uapi,
};

mod args;
mod audit_ioctls;
mod bench_ioctls;
mod gpu_ioctls;
mod mem_ioctls;
mod pool_ioctls;
mod register_ioctls;
mod share_ioctls;
mod stream_ioctls;
mod test_ioctls;

/// What the module's parameters say about files (set once at module init).
pub(crate) struct Settings {
    /// Test-only ioctls are allowed (`enable_test_ioctls`).
    pub(crate) test_ioctls: bool,
    /// The largest physical size of one mem (`max_alloc_mib`).
    pub(crate) max_alloc_bytes: u64,
    /// The most physical bytes of mems one file may hold (`max_file_mib`).
    pub(crate) max_file_bytes: u64,
}

static TEST_IOCTLS: Atomic<u32> = Atomic::new(0);
static MAX_ALLOC_BYTES: Atomic<u64> = Atomic::new(0);
static MAX_FILE_BYTES: Atomic<u64> = Atomic::new(0);

/// Applies the module's settings (module init, before `/dev/ruvm` is registered).
pub(crate) fn configure(s: Settings) {
    TEST_IOCTLS.store(u32::from(s.test_ioctls), Relaxed);
    MAX_ALLOC_BYTES.store(s.max_alloc_bytes, Relaxed);
    MAX_FILE_BYTES.store(s.max_file_bytes, Relaxed);
}

/// Whether test-only ioctls are allowed.
pub(crate) fn test_ioctls_enabled() -> bool {
    TEST_IOCTLS.load(Relaxed) != 0
}

fn max_alloc_bytes() -> u64 {
    MAX_ALLOC_BYTES.load(Relaxed)
}

fn max_file_bytes() -> u64 {
    MAX_FILE_BYTES.load(Relaxed)
}

/// The state of one open file of `/dev/ruvm`.
///
/// Dropping it (the last close) drops its mems: no user mapping can exist by then, since each
/// VMA holds a reference on the file. Mems still there are reported as reclaimed.
#[pin_data(PinnedDrop)]
pub(crate) struct RuvmFile {
    /// Its tables; an `Arc` so that a registration's revocation reaches them through `link`.
    inner: Arc<Mutex<FileInner>>,
    /// How a registered mem's revocation finds the tables ([`register_ioctls`]), cut at close.
    link: Arc<register_ioctls::FileLink>,
    quota: Arc<Quota>,
    /// Who opened the file, for the reclaim report.
    opener: Origin,
}

/// A mem in a file's table, and its handle's count in the audit.
struct Entry {
    mem: Arc<Mem>,
    _handle: Counted,
    /// A registered mem's key in the file's index of registered ranges.
    registered: Option<register_ioctls::RangeKey>,
}

/// The tables of a file's mems, its user VA spaces and its pools. Field order is teardown
/// order: the mems (and their GPU user mappings) go before the spaces, and before the pools
/// their chunks go back to.
struct FileInner {
    /// Its streams (cancelled first at close: their queued work holds mems) and events.
    streams: stream_ioctls::FileStreams,
    /// Every mem of the file, by handle.
    mems: KeptTree<Handle, Entry>,
    /// The handle of the mem at each mmap offset.
    offsets: KeptTree<u64, Handle>,
    spaces: UserSpaces,
    pools: FilePools,
    /// The registered mems, by address space and range ([`register_ioctls`]).
    registered: register_ioctls::Ranges,
}

/// How many nodes of each of its tables a file keeps from freed mems for the next ones (whose
/// entries then allocate nothing).
const SPARE: usize = 8;

/// A file's pools, by handle, at most [`pool::MAX_FILE_POOLS`]; each is closed (its cache
/// given back) on drop.
struct FilePools {
    /// Its own pools and those it imported ([`crate::mem::share`]).
    pools: RBTree<u64, Arc<Pool>>,
    /// The file's [`Quota::id`]: its own pools are those of its quota.
    owner: u64,
    /// Entries in `pools`, and places taken for ones being made.
    count: usize,
    /// Each GPU's pools for `RUVM_OP_ALLOC` (`RUVM_IOCTL_GPU_POOL`).
    gpus: KVec<GpuPools>,
}

/// A GPU's pools for a file: its default (0: not made yet) and its current one (0: the
/// default).
struct GpuPools {
    gpu: u32,
    default: u64,
    current: u64,
}

/// A place in a file's pool table, taken before the pool is made.
struct PoolSlot(RBTreeNodeReservation<u64, Arc<Pool>>);

impl FilePools {
    /// A place for one more pool: `ENOSPC` at the file's limit; its node charged to the
    /// caller's memory cgroup.
    fn slot(&mut self) -> Result<PoolSlot> {
        if self.count >= pool::MAX_FILE_POOLS {
            return Err(ENOSPC);
        }
        let node = RBTreeNodeReservation::new(GFP_KERNEL_ACCOUNT)?;
        self.count += 1;
        Ok(PoolSlot(node))
    }

    /// Gives back a place that was not used.
    fn unused(&mut self, slot: PoolSlot) {
        drop(slot);
        self.count -= 1;
    }

    /// Enters `pool` at the place taken for it (allocates nothing).
    fn insert(&mut self, slot: PoolSlot, pool: Arc<Pool>) {
        // Handles are unique: nothing is replaced.
        let _ = self.pools.insert(slot.0.into_node(pool.id(), pool));
    }

    /// Takes pool `handle` out; what is returned is dropped by the caller with the file's lock
    /// released.
    fn remove(&mut self, handle: u64) -> Option<Arc<Pool>> {
        let pool = self.pools.remove(&handle)?;
        self.count -= 1;
        Some(pool)
    }

    fn get(&self, handle: u64) -> Option<Arc<Pool>> {
        self.pools.get(&handle).cloned()
    }

    /// GPU `gpu`'s pools, if the file has any yet.
    fn of_gpu(&mut self, gpu: u32) -> Option<&mut GpuPools> {
        self.gpus.iter_mut().find(|g| g.gpu == gpu)
    }
}

impl Drop for FilePools {
    fn drop(&mut self) {
        // An imported pool is its own file's to close.
        for pool in self.pools.values().filter(|p| p.made_by(self.owner)) {
            pool.close();
        }
    }
}

/// A file's user VA space on every GPU it mapped a mem on (`RUVM_IOCTL_MEM_MAP_GPU_USER`):
/// one id, and the MMUs that may hold tables of it, whose space is destroyed on drop.
struct UserSpaces {
    id: u64,
    mmus: KVec<Arc<Mmu>>,
}

impl Drop for UserSpaces {
    fn drop(&mut self) {
        for mmu in self.mmus.iter() {
            mmu.destroy_space(self.id);
        }
    }
}

#[vtable]
impl MiscDevice for RuvmFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        let quota = Arc::new(Quota::new(max_file_bytes()), GFP_KERNEL_ACCOUNT)?;
        let tables = FileInner {
            streams: stream_ioctls::FileStreams::new()?,
            mems: KeptTree::new(SPARE)?,
            offsets: KeptTree::new(SPARE)?,
            spaces: UserSpaces {
                id: mmu::new_space_id(),
                mmus: KVec::new(),
            },
            pools: FilePools {
                pools: RBTree::new(),
                owner: quota.id(),
                count: 0,
                gpus: KVec::new(),
            },
            registered: register_ioctls::Ranges::new(),
        };
        let inner = Arc::pin_init(new_mutex!(tables), GFP_KERNEL_ACCOUNT)?;
        let link = register_ioctls::FileLink::new(inner.clone())?;
        let me = KBox::try_pin_init(
            try_pin_init!(RuvmFile {
                inner,
                link,
                quota,
                opener: Origin::here("open"),
            }),
            GFP_KERNEL_ACCOUNT,
        )?;
        // Last, so that a failure before it leaves no module reference behind.
        fops::pin_module::<Self>(file)?;
        Ok(me)
    }

    fn ioctl(me: Pin<&RuvmFile>, file: &File, cmd: u32, arg: usize) -> Result<isize> {
        // The command number encodes the argument size, so matching the whole number also
        // checks that the caller was built against the same structure layout.
        let user = UserSlice::new(UserPtr::from_addr(arg), _IOC_SIZE(cmd));
        match cmd {
            uapi::RUVM_IOCTL_INFO => audit_ioctls::info(user)?,
            uapi::RUVM_IOCTL_MEM_ALLOC => me.mem_alloc(file, user)?,
            uapi::RUVM_IOCTL_MEM_FREE => me.mem_free(file, user)?,
            uapi::RUVM_IOCTL_MEM_QUERY => me.mem_query(user)?,
            uapi::RUVM_IOCTL_MEM_MAP_CPU_KERNEL => me.mem_map_cpu_kernel(user, true)?,
            uapi::RUVM_IOCTL_MEM_UNMAP_CPU_KERNEL => me.mem_map_cpu_kernel(user, false)?,
            uapi::RUVM_IOCTL_MEM_FILL => me.mem_fill(user, false)?,
            uapi::RUVM_IOCTL_MEM_VERIFY => me.mem_fill(user, true)?,
            uapi::RUVM_IOCTL_MEM_COPY => me.mem_copy(user)?,
            uapi::RUVM_IOCTL_MEM_RANGE => me.mem_range(file, user)?,
            uapi::RUVM_IOCTL_MEM_REGISTER => me.mem_register(file, user)?,
            uapi::RUVM_IOCTL_GPU_LIST => gpu_ioctls::gpu_list(user)?,
            uapi::RUVM_IOCTL_GPU_ATTACH => gpu_ioctls::gpu_attach(user, true)?,
            uapi::RUVM_IOCTL_GPU_DETACH => gpu_ioctls::gpu_attach(user, false)?,
            uapi::RUVM_IOCTL_MEM_MAP_GPU => me.mem_map_gpu(user, true)?,
            uapi::RUVM_IOCTL_MEM_UNMAP_GPU => me.mem_map_gpu(user, false)?,
            uapi::RUVM_IOCTL_MEM_DMA_ADDRS => me.mem_dma_addrs(user)?,
            uapi::RUVM_IOCTL_CE_COPY => me.ce_copy(user)?,
            uapi::RUVM_IOCTL_MEM_GPU_PHYS => me.mem_gpu_phys(user)?,
            uapi::RUVM_IOCTL_MEM_MAP_GPU_KERNEL => me.mem_map_gpu_kernel(user, true)?,
            uapi::RUVM_IOCTL_MEM_UNMAP_GPU_KERNEL => me.mem_map_gpu_kernel(user, false)?,
            uapi::RUVM_IOCTL_MEM_MAP_GPU_USER => me.mem_map_gpu_user(user)?,
            uapi::RUVM_IOCTL_MEM_UNMAP_GPU_USER => me.mem_unmap_gpu_user(user)?,
            uapi::RUVM_IOCTL_POOL_CREATE => me.pool_create(user)?,
            uapi::RUVM_IOCTL_POOL_DESTROY => me.pool_destroy(user)?,
            uapi::RUVM_IOCTL_POOL_GET => me.pool_get(user)?,
            uapi::RUVM_IOCTL_POOL_SET => me.pool_set(user)?,
            uapi::RUVM_IOCTL_POOL_TRIM => me.pool_trim(user)?,
            uapi::RUVM_IOCTL_POOL_SET_ACCESS => me.pool_set_access(user)?,
            uapi::RUVM_IOCTL_GPU_POOL => me.gpu_pool(user)?,
            uapi::RUVM_IOCTL_PTR_ATTRS => me.ptr_attrs(user)?,
            uapi::RUVM_IOCTL_POOL_EXPORT => me.pool_export(user)?,
            uapi::RUVM_IOCTL_POOL_IMPORT => me.pool_import(user)?,
            uapi::RUVM_IOCTL_MEM_EXPORT => me.mem_export(user)?,
            uapi::RUVM_IOCTL_MEM_IMPORT => me.mem_import(file, user)?,
            uapi::RUVM_IOCTL_MEM_EXPORT_DMABUF => me.mem_export_dmabuf(user)?,
            uapi::RUVM_IOCTL_MEM_IMPORT_DMABUF => me.mem_import_dmabuf(file, user)?,
            uapi::RUVM_IOCTL_STREAM_CREATE => me.stream_create(user)?,
            uapi::RUVM_IOCTL_STREAM_DESTROY => me.stream_destroy(user)?,
            uapi::RUVM_IOCTL_STREAM_SUBMIT => me.stream_submit(file, user, arg)?,
            uapi::RUVM_IOCTL_STREAM_QUERY => me.stream_query(user)?,
            uapi::RUVM_IOCTL_STREAM_STATUS => me.stream_status(user)?,
            uapi::RUVM_IOCTL_STREAM_SYNC => me.stream_sync(user)?,
            uapi::RUVM_IOCTL_EVENT_CREATE => me.event_create(user)?,
            uapi::RUVM_IOCTL_EVENT_DESTROY => me.event_destroy(user)?,
            uapi::RUVM_IOCTL_EVENT_QUERY => me.event_query(user)?,
            uapi::RUVM_IOCTL_EVENT_SYNC => me.event_sync(user)?,
            uapi::RUVM_IOCTL_EVENT_EXPORT => me.event_export(user)?,
            uapi::RUVM_IOCTL_MEM_GPU_VA => me.mem_gpu_va(user)?,
            uapi::RUVM_IOCTL_CE_COPY_VA => me.ce_copy_va(user)?,
            uapi::RUVM_IOCTL_GPU_PT_WALK => me.gpu_pt_walk(user)?,
            uapi::RUVM_IOCTL_PMM_STATS => gpu_ioctls::pmm_stats(user)?,
            uapi::RUVM_IOCTL_VIDMEM_LIMIT => gpu_ioctls::vidmem_limit(user)?,
            uapi::RUVM_IOCTL_PMM_CHECK_LEAK => gpu_ioctls::pmm_check_leak(user)?,
            uapi::RUVM_IOCTL_AUDIT => audit_ioctls::audit(user)?,
            uapi::RUVM_IOCTL_STATS => audit_ioctls::stats(user)?,
            uapi::RUVM_IOCTL_REGISTER_UNLOAD_STATE => audit_ioctls::register_unload_state(user)?,
            uapi::RUVM_IOCTL_BENCH => me.bench(user)?,
            uapi::RUVM_IOCTL_TEST_PLANT => test_ioctls::plant(user)?,
            uapi::RUVM_IOCTL_TEST_LEAK => test_ioctls::leak(user)?,
            uapi::RUVM_IOCTL_TEST_CE_RAW => test_ioctls::ce_raw(user)?,
            uapi::RUVM_IOCTL_TEST_PT_WRITE => me.test_pt_write(user)?,
            uapi::RUVM_IOCTL_TEST_SIM_GPU => test_ioctls::sim_gpu(user)?,
            _ => return Err(ENOTTY),
        }
        Ok(0)
    }

    fn mmap(me: Pin<&RuvmFile>, _file: &File, vma: &VmaNew) -> Result {
        let offset = vma::offset(vma).ok_or(EINVAL)?;
        if offset == uapi::RUVM_STATUS_MMAP_OFFSET {
            return me.status_page()?.map(vma);
        }
        let mem = {
            let inner = me.inner.lock();
            let handle = inner.offsets.get(&offset).copied();
            handle.and_then(|h| inner.mems.get(&h).map(|e| e.mem.clone()))
        };
        // No mem of this file starts at this offset (never was, or freed).
        mem.ok_or(ENXIO)?.map_user(vma)
    }
}

impl RuvmFile {
    /// The mem named `handle`, if this file has it.
    fn mem(&self, handle: u64) -> Result<Arc<Mem>> {
        self.inner
            .lock()
            .mems
            .get(&Handle(handle))
            .map(|e| e.mem.clone())
            .ok_or(ENOENT)
    }

    /// Enters a new mem in the tables under a new handle.
    fn insert(&self, mem: Arc<Mem>) -> Result<Handle> {
        let handle = Handle::new();
        let offset = mem.mmap_offset();
        let entry = Entry {
            mem,
            _handle: Counted::new(Class::Handles, 1),
            registered: None,
        };
        self.inner.lock().enter(handle, offset, entry)?;
        Ok(handle)
    }

    /// The file's user VA space, noting that `mmu` may hold tables of it from now on.
    fn user_space(&self, mmu: &Arc<Mmu>) -> Result<u64> {
        let mut inner = self.inner.lock();
        let spaces = &mut inner.spaces;
        if !spaces.mmus.iter().any(|m| Arc::ptr_eq(m, mmu)) {
            spaces.mmus.push(mmu.clone(), GFP_KERNEL)?;
        }
        Ok(spaces.id)
    }

    /// The VA space `flags` (`enum ruvm_va_space_flags`) names: the file's user VA space, or
    /// the kernel VA space (privileged).
    fn va_space(&self, flags: u32) -> Result<u64> {
        if flags & uapi::ruvm_va_space_flags_RUVM_VA_USER != 0 {
            Ok(self.inner.lock().spaces.id)
        } else {
            crate::bind::cred::require_sys_admin()?;
            Ok(mmu::KERNEL_SPACE)
        }
    }

    /// Takes a mem out of the tables; its owner can no longer name it.
    fn remove(&self, handle: Handle) -> Option<Arc<Mem>> {
        self.inner.lock().remove(handle)
    }
}

impl FileInner {
    /// Enters a mem under `handle` at mmap offset `offset` (both unique: a new handle, a live
    /// mem's range); nothing is entered on failure.
    fn enter(&mut self, handle: Handle, offset: u64, entry: Entry) -> Result {
        let at_handle = self.mems.slot()?;
        let at_offset = match self.offsets.slot() {
            Ok(s) => s,
            Err(e) => {
                self.mems.unused(at_handle);
                return Err(e);
            }
        };
        self.mems.insert(at_handle, handle, entry);
        self.offsets.insert(at_offset, offset, handle);
        Ok(())
    }

    /// Takes a mem out of the tables (see [`RuvmFile::remove`]).
    fn remove(&mut self, handle: Handle) -> Option<Arc<Mem>> {
        // The reference returned; the entry's own is dropped with the lock held, which is
        // never the last.
        let (mem, key) = self
            .mems
            .remove_with(&handle, |e| (e.mem.clone(), e.registered))?;
        let _ = self.offsets.remove_with(&mem.mmap_offset(), |_| ());
        if let Some(key) = key {
            self.registered.remove(key);
        }
        Some(mem)
    }
}

#[pinned_drop]
impl PinnedDrop for RuvmFile {
    fn drop(self: Pin<&mut Self>) {
        // No revocation reaches the tables from now on (one running has finished with them).
        drop(self.link.cut());
        let level = audit::level();
        if level == 0 {
            return;
        }
        let inner = self.inner.lock();
        let (mut mems, mut bytes) = (0u64, 0u64);
        for e in inner.mems.values() {
            mems += 1;
            bytes += e.mem.layout().physical_size;
        }
        if mems > 0 && ratelimit::printk_ok() {
            pr_info!(
                "audit: reclaimed mems={mems} bytes={bytes} {}\n",
                self.opener
            );
            if level >= 2 {
                for (h, e) in inner.mems.iter() {
                    pr_info!(
                        "audit: reclaimed object class=mems handle={} bytes={}\n",
                        h.0,
                        e.mem.layout().physical_size
                    );
                }
            }
        }
    }
}
