// SPDX-License-Identifier: GPL-2.0

//! One open file of `/dev/ruvm`: its mems, the ioctl dispatcher and `mmap`.
//!
//! Each command has one small handler that reads its argument structure from user space,
//! validates every field (reserved and unknown bits included) before acting, and writes the
//! structure back. Unknown commands are `ENOTTY` (Documentation/driver-api/ioctl.rst).
//!
//! Locking: the file's mutex guards its tables only; it is released before a mem is worked on
//! (the mem has its own mutex) and before user memory is touched.

use kernel::{
    fs::File,
    ioctl::_IOC_SIZE,
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    rbtree::RBTree,
    sync::{Arc, Mutex},
    uaccess::{UserPtr, UserSlice},
};

use crate::{
    audit::{self, Class, Counted},
    bind::{cred, fops, globals::UNLOAD, ratelimit, upin::PinnedUser},
    mem::{self, AllocRequest, Fill, Handle, LeakKind, Mem, Origin, Quota},
    uapi,
};

/// The state of one open file of `/dev/ruvm`.
///
/// Dropping it (the last close) drops its mems: no user mapping can exist by then, since each
/// VMA holds a reference on the file. Mems still there are reported as reclaimed.
#[pin_data(PinnedDrop)]
pub(crate) struct RuvmFile {
    #[pin]
    inner: Mutex<FileInner>,
    quota: Arc<Quota>,
    /// Who opened the file, for the reclaim report.
    opener: Origin,
}

/// A mem in a file's table, and its handle's count in the audit.
struct Entry {
    mem: Arc<Mem>,
    _handle: Counted,
}

/// The tables of a file's mems.
struct FileInner {
    /// Every mem of the file, by handle.
    mems: RBTree<Handle, Entry>,
    /// The handle of the mem at each mmap offset.
    offsets: RBTree<u64, Handle>,
}

#[vtable]
impl MiscDevice for RuvmFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        let quota = Arc::new(Quota::new(crate::max_file_bytes()), GFP_KERNEL)?;
        let me = KBox::try_pin_init(
            try_pin_init!(RuvmFile {
                inner <- new_mutex!(FileInner {
                    mems: RBTree::new(),
                    offsets: RBTree::new(),
                }),
                quota,
                opener: Origin::here("open"),
            }),
            GFP_KERNEL,
        )?;
        // Last, so that a failure before it leaves no module reference behind.
        fops::pin_module(file)?;
        Ok(me)
    }

    fn ioctl(me: Pin<&RuvmFile>, file: &File, cmd: u32, arg: usize) -> Result<isize> {
        // The command number encodes the argument size, so matching the whole number also
        // checks that the caller was built against the same structure layout.
        let user = UserSlice::new(UserPtr::from_addr(arg), _IOC_SIZE(cmd));
        match cmd {
            uapi::RUVM_IOCTL_INFO => info(user)?,
            uapi::RUVM_IOCTL_MEM_ALLOC => me.mem_alloc(user)?,
            uapi::RUVM_IOCTL_MEM_FREE => me.mem_free(file, user)?,
            uapi::RUVM_IOCTL_MEM_QUERY => me.mem_query(user)?,
            uapi::RUVM_IOCTL_MEM_MAP_CPU_KERNEL => me.mem_map_cpu_kernel(user, true)?,
            uapi::RUVM_IOCTL_MEM_UNMAP_CPU_KERNEL => me.mem_map_cpu_kernel(user, false)?,
            uapi::RUVM_IOCTL_MEM_FILL => me.mem_fill(user, false)?,
            uapi::RUVM_IOCTL_MEM_VERIFY => me.mem_fill(user, true)?,
            uapi::RUVM_IOCTL_MEM_COPY => me.mem_copy(user)?,
            uapi::RUVM_IOCTL_GPU_LIST => gpu_list(user)?,
            uapi::RUVM_IOCTL_MEM_MAP_GPU => me.mem_map_gpu(user, true)?,
            uapi::RUVM_IOCTL_MEM_UNMAP_GPU => me.mem_map_gpu(user, false)?,
            uapi::RUVM_IOCTL_MEM_DMA_ADDRS => me.mem_dma_addrs(user)?,
            uapi::RUVM_IOCTL_CE_COPY => me.ce_copy(user)?,
            uapi::RUVM_IOCTL_MEM_GPU_PHYS => me.mem_gpu_phys(user)?,
            uapi::RUVM_IOCTL_PMM_STATS => pmm_stats(user)?,
            uapi::RUVM_IOCTL_PMM_CHECK_LEAK => pmm_check_leak(user)?,
            uapi::RUVM_IOCTL_AUDIT => audit_ioctl(user)?,
            uapi::RUVM_IOCTL_STATS => stats(user)?,
            uapi::RUVM_IOCTL_REGISTER_UNLOAD_STATE => register_unload_state(user)?,
            uapi::RUVM_IOCTL_TEST_PLANT => test_plant(user)?,
            uapi::RUVM_IOCTL_TEST_LEAK => test_leak(user)?,
            uapi::RUVM_IOCTL_TEST_CE_RAW => test_ce_raw(user)?,
            _ => return Err(ENOTTY),
        }
        Ok(0)
    }

    fn mmap(me: Pin<&RuvmFile>, _file: &File, vma: &VmaNew) -> Result {
        let offset = crate::bind::vma::offset(vma).ok_or(EINVAL)?;
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

    /// `RUVM_IOCTL_MEM_ALLOC`.
    fn mem_alloc(&self, user: UserSlice) -> Result {
        let (mut reader, mut writer) = user.reader_writer();
        let mut args: uapi::ruvm_mem_alloc = reader.read()?;
        if args.flags & !uapi::ruvm_alloc_flags_RUVM_ALLOC_FLAGS_ALL != 0
            || args.pad != 0
            || !all_zero(&args.reserved)
        {
            return Err(EINVAL);
        }
        let gpu = match args.backing {
            uapi::ruvm_backing_RUVM_BACKING_SYSMEM if args.gpu == 0 => None,
            uapi::ruvm_backing_RUVM_BACKING_VIDMEM => Some(crate::gpu::get(args.gpu)?),
            _ => return Err(EINVAL),
        };
        let req = AllocRequest {
            gpu,
            size: args.size,
            page_size: args.page_size,
            zero: args.flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO != 0,
            fallback: args.flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK != 0,
            max_bytes: crate::max_alloc_bytes(),
        };
        let mem = Mem::alloc(&req, &self.quota, Origin::here("MEM_ALLOC"))?;
        let handle = Handle::new();
        {
            let entry = Entry {
                mem: mem.clone(),
                _handle: Counted::new(Class::Handles, 1),
            };
            let mut inner = self.inner.lock();
            inner
                .mems
                .try_create_and_insert(handle, entry, GFP_KERNEL)?;
            if let Err(e) =
                inner
                    .offsets
                    .try_create_and_insert(mem.mmap_offset(), handle, GFP_KERNEL)
            {
                inner.mems.remove(&handle);
                return Err(e);
            }
        }
        let layout = mem.layout();
        args.handle = handle.0;
        args.chunk_size = layout.chunk_size;
        args.chunk_count = layout.chunk_count;
        args.mmap_offset = mem.mmap_offset();
        if let Err(e) = writer.write(&args) {
            // The caller cannot learn the handle: nothing half-done stays behind.
            self.remove(handle);
            return Err(e);
        }
        Ok(())
    }

    /// Takes a mem out of the tables; its owner can no longer name it.
    fn remove(&self, handle: Handle) -> Option<Arc<Mem>> {
        let mut inner = self.inner.lock();
        let entry = inner.mems.remove(&handle)?;
        inner.offsets.remove(&entry.mem.mmap_offset());
        Some(entry.mem)
    }

    /// `RUVM_IOCTL_MEM_FREE`: in uvm_mem's order, the user mapping goes first (zapped, so later
    /// accesses fault), then the kernel mapping, then the chunks (when the last reference goes).
    fn mem_free(&self, file: &File, user: UserSlice) -> Result {
        let args = read_handle(user)?;
        let mem = self.remove(Handle(args.handle)).ok_or(ENOENT)?;
        mem.zap_user(file)?;
        mem.retire();
        Ok(())
    }

    /// `RUVM_IOCTL_MEM_QUERY`.
    fn mem_query(&self, user: UserSlice) -> Result {
        let (mut reader, mut writer) = user.reader_writer();
        let mut args: uapi::ruvm_mem_query = reader.read()?;
        if args.flags != 0 || !all_zero(&args.reserved) {
            return Err(EINVAL);
        }
        let info = self.mem(args.handle)?.info();
        (args.backing, args.gpu) = match info.vidmem_gpu {
            None => (uapi::ruvm_backing_RUVM_BACKING_SYSMEM, 0),
            Some(gpu) => (uapi::ruvm_backing_RUVM_BACKING_VIDMEM, gpu),
        };
        args.pad = 0;
        args.size = info.size;
        args.physical_size = info.layout.physical_size;
        args.chunk_size = info.layout.chunk_size;
        args.chunk_count = info.layout.chunk_count;
        args.mmap_offset = info.mmap_offset;
        args.mapped = 0;
        if info.cpu_kernel {
            args.mapped |= u64::from(uapi::ruvm_mapped_RUVM_MAPPED_CPU_KERNEL);
        }
        if info.user_mappings > 0 {
            args.mapped |= u64::from(uapi::ruvm_mapped_RUVM_MAPPED_CPU_USER);
        }
        args.user_mappings = info.user_mappings;
        args.alloc_flags = info.alloc_flags;
        args.mapped_gpus = info.mapped_gpus;
        writer.write(&args)
    }

    /// `RUVM_IOCTL_MEM_MAP_CPU_KERNEL` and `RUVM_IOCTL_MEM_UNMAP_CPU_KERNEL`, both idempotent.
    fn mem_map_cpu_kernel(&self, user: UserSlice, map: bool) -> Result {
        let args = read_handle(user)?;
        let mem = self.mem(args.handle)?;
        if map {
            mem.map_cpu_kernel()
        } else {
            mem.unmap_cpu_kernel();
            Ok(())
        }
    }

    /// `RUVM_IOCTL_MEM_MAP_GPU` and `RUVM_IOCTL_MEM_UNMAP_GPU`, both idempotent.
    fn mem_map_gpu(&self, user: UserSlice, map: bool) -> Result {
        let args: uapi::ruvm_mem_gpu = user.reader().read()?;
        if args.flags != 0 || !all_zero(&args.reserved) {
            return Err(EINVAL);
        }
        let mem = self.mem(args.handle)?;
        if map {
            let gpu = crate::gpu::get(args.gpu)?;
            mem.map_gpu(&gpu)
        } else {
            // Unmapping needs no GPU: after a removal there is nothing left to unmap.
            mem.unmap_gpu(args.gpu);
            Ok(())
        }
    }

    /// `RUVM_IOCTL_CE_COPY`.
    fn ce_copy(&self, user: UserSlice) -> Result {
        let args: uapi::ruvm_ce_copy = user.reader().read()?;
        if args.flags != 0 || !all_zero(&args.reserved) {
            return Err(EINVAL);
        }
        let dst = self.mem(args.dst_handle)?;
        let src = self.mem(args.src_handle)?;
        let gpu = crate::gpu::get(args.gpu)?;
        Mem::ce_copy(
            &gpu,
            &dst,
            args.dst_offset,
            &src,
            args.src_offset,
            args.length,
        )
    }

    /// `RUVM_IOCTL_MEM_DMA_ADDRS` (privileged).
    fn mem_dma_addrs(&self, user: UserSlice) -> Result {
        cred::require_sys_admin()?;
        let (mut reader, mut writer) = user.reader_writer();
        let mut args: uapi::ruvm_mem_dma_addrs = reader.read()?;
        if args.flags != 0 || !all_zero(&args.reserved) {
            return Err(EINVAL);
        }
        let mem = self.mem(args.handle)?;
        let room = usize::try_from(args.count).map_err(|_| EINVAL)?;
        let addrs = mem.dma_addrs(args.gpu, args.first_chunk, room)?;
        let bytes = addrs.len().checked_mul(8).ok_or(EOVERFLOW)?;
        let ptr = usize::try_from(args.addrs).map_err(|_| EFAULT)?;
        let mut out = UserSlice::new(UserPtr::from_addr(ptr), bytes).writer();
        for a in addrs.iter() {
            out.write(a)?;
        }
        args.count = addrs.len() as u64;
        writer.write(&args)
    }

    /// `RUVM_IOCTL_MEM_GPU_PHYS` (privileged).
    fn mem_gpu_phys(&self, user: UserSlice) -> Result {
        cred::require_sys_admin()?;
        let (mut reader, mut writer) = user.reader_writer();
        let mut args: uapi::ruvm_mem_gpu_phys = reader.read()?;
        if args.flags != 0 || args.pad != 0 || !all_zero(&args.reserved) {
            return Err(EINVAL);
        }
        let mem = self.mem(args.handle)?;
        let gpu = crate::gpu::get(args.gpu)?;
        (args.address, args.aperture) = mem.gpu_phys(&gpu, args.offset, args.length)?;
        writer.write(&args)
    }

    /// `RUVM_IOCTL_MEM_FILL` and `RUVM_IOCTL_MEM_VERIFY`.
    fn mem_fill(&self, user: UserSlice, verify: bool) -> Result {
        let (mut reader, mut writer) = user.reader_writer();
        let mut args: uapi::ruvm_mem_fill = reader.read()?;
        if args.flags != 0 || !all_zero(&args.reserved) {
            return Err(EINVAL);
        }
        let fill = match args.kind {
            uapi::ruvm_fill_kind_RUVM_FILL_PATTERN => Fill::Pattern(args.seed),
            // CAST: the byte fill uses the seed's low 8 bits, as documented.
            uapi::ruvm_fill_kind_RUVM_FILL_BYTE => Fill::Byte(args.seed as u8),
            _ => return Err(EINVAL),
        };
        let mem = self.mem(args.handle)?;
        if verify {
            let (mismatches, first) = mem.verify(args.offset, args.length, fill)?;
            args.mismatches = mismatches;
            args.first_mismatch = first;
            writer.write(&args)
        } else {
            mem.fill(args.offset, args.length, fill)
        }
    }

    /// `RUVM_IOCTL_MEM_COPY`.
    fn mem_copy(&self, user: UserSlice) -> Result {
        let args: uapi::ruvm_mem_copy = user.reader().read()?;
        if args.flags != 0 || args.pad != 0 || !all_zero(&args.reserved) {
            return Err(EINVAL);
        }
        let dst = self.mem(args.dst_handle)?;
        let src = self.mem(args.src_handle)?;
        Mem::copy(&dst, args.dst_offset, &src, args.src_offset, args.length)
    }
}

#[pinned_drop]
impl PinnedDrop for RuvmFile {
    fn drop(self: Pin<&mut Self>) {
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

/// `RUVM_IOCTL_GPU_LIST`: the GPU registry, into the caller's array.
fn gpu_list(user: UserSlice) -> Result {
    let (mut reader, mut writer) = user.reader_writer();
    let mut args: uapi::ruvm_gpu_list = reader.read()?;
    if args.flags != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    let gpus = crate::gpu::list()?;
    let n = gpus.len().min(usize::try_from(args.count)?);
    let bytes = n
        .checked_mul(core::mem::size_of::<uapi::ruvm_gpu_info>())
        .ok_or(EOVERFLOW)?;
    let addr = usize::try_from(args.gpus).map_err(|_| EFAULT)?;
    let mut out = UserSlice::new(UserPtr::from_addr(addr), bytes).writer();
    for g in gpus.iter().take(n) {
        out.write(g)?;
    }
    args.count = u32::try_from(gpus.len())?;
    writer.write(&args)
}

/// `RUVM_IOCTL_AUDIT`: the audit's counters, and with `RUVM_AUDIT_WALK` the same counted from
/// the objects (test-only).
fn audit_ioctl(user: UserSlice) -> Result {
    let (mut reader, mut writer) = user.reader_writer();
    let mut args: uapi::ruvm_audit = reader.read()?;
    let walk_flag = uapi::ruvm_audit_flags_RUVM_AUDIT_WALK;
    if args.flags & !walk_flag != 0 || args.pad != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    let walk = args.flags & walk_flag != 0;
    if walk && !crate::test_ioctls_enabled() {
        return Err(enosys());
    }
    args.classes = uapi::ruvm_audit_class_RUVM_AUDIT_CLASSES;
    args.level = audit::level();
    // Walk first, then read the counters: with nothing else running, they must agree.
    args.walked = if walk {
        mem::walk()
    } else {
        [0; audit::CLASSES]
    };
    args.live = audit::live();
    writer.write(&args)
}

/// `RUVM_IOCTL_STATS`.
fn stats(user: UserSlice) -> Result {
    let (mut reader, mut writer) = user.reader_writer();
    let mut args: uapi::ruvm_stats = reader.read()?;
    let reset_flag = uapi::ruvm_stats_flags_RUVM_STATS_RESET_PEAKS;
    if args.flags & !reset_flag != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    let backing = match args.backing {
        uapi::ruvm_backing_RUVM_BACKING_SYSMEM => audit::StatsBacking::Sysmem,
        uapi::ruvm_backing_RUVM_BACKING_VIDMEM => audit::StatsBacking::Vidmem,
        _ => return Err(EINVAL),
    };
    let reset = args.flags & reset_flag != 0;
    if reset {
        // The watermarks are shared by every user of the module.
        cred::require_sys_admin()?;
    }
    let s = audit::stats(backing, reset);
    (args.reserved_bytes, args.reserved_peak) = s.reserved;
    (args.used_bytes, args.used_peak) = s.used;
    (args.mems, args.mems_peak) = s.mems;
    args.allocs = s.allocs;
    args.frees = s.frees;
    args.alloc_failures = s.failures;
    writer.write(&args)
}

/// The PMM of GPU `id`: `ENODEV` if it is not bound, `ENXIO` if it has no vidmem.
fn pmm_of(id: u32) -> Result<Arc<crate::gpu::pmm::Pmm>> {
    crate::gpu::get(id)?.pmm.clone().ok_or(ENXIO)
}

/// `RUVM_IOCTL_PMM_STATS`.
fn pmm_stats(user: UserSlice) -> Result {
    let (mut reader, mut writer) = user.reader_writer();
    let mut args: uapi::ruvm_pmm_stats = reader.read()?;
    if args.flags != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    let s = pmm_of(args.gpu)?.stats();
    args.capacity = s.capacity;
    args.free = s.free;
    args.allocated = s.allocated;
    args.roots = s.roots;
    args.roots_used = s.roots_used;
    args.roots_split = s.roots_split;
    args.roots_stored = s.roots_stored;
    writer.write(&args)
}

/// `RUVM_IOCTL_PMM_CHECK_LEAK` (privileged).
fn pmm_check_leak(user: UserSlice) -> Result {
    cred::require_sys_admin()?;
    let (mut reader, mut writer) = user.reader_writer();
    let mut args: uapi::ruvm_pmm_check_leak = reader.read()?;
    if args.flags != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    if !crate::gpu::pmm::CHUNK_SIZES.contains(&args.chunk_size) {
        return Err(EINVAL);
    }
    let (got, before, after) = pmm_of(args.gpu)?.check_leak(args.chunk_size, args.alloc_limit)?;
    args.allocated = got;
    args.free_before = before;
    args.free_after = after;
    writer.write(&args)
}

/// `RUVM_IOCTL_REGISTER_UNLOAD_STATE`.
fn register_unload_state(user: UserSlice) -> Result {
    cred::require_sys_admin()?;
    let args: uapi::ruvm_register_unload_state = user.reader().read()?;
    if args.flags != 0 || args.pad != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    let mut unload = UNLOAD.lock();
    if unload.state.is_some() {
        return Err(EBUSY);
    }
    let size = core::mem::size_of::<uapi::ruvm_unload_state>();
    let pinned = PinnedUser::new(args.addr, size, 8)?;
    pinned.write(&[0u8; core::mem::size_of::<uapi::ruvm_unload_state>()])?;
    unload.state = Some(pinned);
    Ok(())
}

/// `RUVM_IOCTL_TEST_LEAK`: leak resources on purpose, to prove the audit reports them.
fn test_leak(user: UserSlice) -> Result {
    if !crate::test_ioctls_enabled() {
        return Err(enosys());
    }
    cred::require_sys_admin()?;
    let args: uapi::ruvm_test_leak = user.reader().read()?;
    let known = uapi::ruvm_leak_flags_RUVM_LEAK_LOST | uapi::ruvm_leak_flags_RUVM_LEAK_MAPPED;
    if args.flags & !known != 0 || args.pad != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    if args.count == 0 || args.count > 64 {
        return Err(EINVAL);
    }
    let mapped = args.flags & uapi::ruvm_leak_flags_RUVM_LEAK_MAPPED != 0;
    let kind = match args.what {
        uapi::ruvm_leak_RUVM_LEAK_MEM => LeakKind::Mem {
            size: args.size,
            mapped,
        },
        uapi::ruvm_leak_RUVM_LEAK_CHUNK if !mapped => {
            if args.order > audit::MAX_ORDER {
                return Err(EINVAL);
            }
            LeakKind::Chunk { order: args.order }
        }
        uapi::ruvm_leak_RUVM_LEAK_KERNEL_MAP if !mapped => LeakKind::KernelMap,
        _ => return Err(EINVAL),
    };
    let lost = args.flags & uapi::ruvm_leak_flags_RUVM_LEAK_LOST != 0;
    for _ in 0..args.count {
        if let Some(p) = mem::plant(&kind, lost)? {
            UNLOAD.lock().planted.push(p, GFP_KERNEL)?;
        }
    }
    pr_info!(
        "audit: planted a leak what={} count={} lost={}\n",
        args.what,
        args.count,
        lost
    );
    Ok(())
}

/// `RUVM_IOCTL_TEST_CE_RAW`: one engine transfer at a raw address, bypassing every table.
fn test_ce_raw(user: UserSlice) -> Result {
    if !crate::test_ioctls_enabled() {
        return Err(enosys());
    }
    cred::require_sys_admin()?;
    let args: uapi::ruvm_test_ce_raw = user.reader().read()?;
    if args.flags != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    let gpu = crate::gpu::get(args.gpu)?;
    let engine = gpu.engine.as_ref().ok_or(ENODEV)?;
    let alive = gpu.alive.lock();
    if !*alive {
        return Err(ENODEV);
    }
    let len = usize::try_from(args.len).map_err(|_| EINVAL)?;
    engine.read_raw(&gpu.dma, args.src, len)?;
    drop(alive);
    Ok(())
}

/// Reads a `struct ruvm_mem_handle` and checks its reserved fields.
fn read_handle(user: UserSlice) -> Result<uapi::ruvm_mem_handle> {
    let args: uapi::ruvm_mem_handle = user.reader().read()?;
    if args.flags != 0 || args.pad != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    Ok(args)
}

/// `ENOSYS`, which the kernel crate has no constant for: what a disabled test ioctl returns,
/// as in UVM.
fn enosys() -> Error {
    // CAST: ENOSYS is 38, which fits a `c_int`.
    Error::from_errno(-(kernel::bindings::ENOSYS as i32))
}

/// True if every element of a reserved field is zero.
fn all_zero<T: Default + PartialEq>(fields: &[T]) -> bool {
    fields.iter().all(|f| *f == T::default())
}

/// `RUVM_IOCTL_INFO`: what the module is and what it supports.
fn info(user: UserSlice) -> Result {
    let (mut reader, mut writer) = user.reader_writer();
    let mut args: uapi::ruvm_info = reader.read()?;
    // live_* and max_* are outputs: whatever the caller left there is overwritten.
    if args.flags != 0 || args.pad != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    args.abi_version = uapi::RUVM_ABI_VERSION;
    args.features = uapi::RUVM_FEATURES_ALL.into();
    args.test_ioctls = u32::from(crate::test_ioctls_enabled());
    (args.live_mems, args.live_bytes) = crate::mem::live();
    args.max_alloc_bytes = crate::max_alloc_bytes();
    args.max_file_bytes = crate::max_file_bytes();
    args.version = [0; uapi::RUVM_VERSION_LEN as usize];
    // Keep the terminating NUL: copy at most `len - 1` bytes into the zeroed array.
    let room = args.version.len() - 1;
    for (dst, src) in args
        .version
        .iter_mut()
        .zip(crate::VERSION.bytes().take(room))
    {
        *dst = src;
    }
    writer.write(&args)
}

/// `RUVM_IOCTL_TEST_PLANT`: deliberately misbehave so tests can prove the harness notices.
fn test_plant(user: UserSlice) -> Result {
    if !crate::test_ioctls_enabled() {
        return Err(enosys());
    }
    cred::require_sys_admin()?;
    let args: uapi::ruvm_test_plant = user.reader().read()?;
    if args.flags != 0 || !all_zero(&args.reserved) {
        return Err(EINVAL);
    }
    match args.what {
        uapi::ruvm_plant_RUVM_PLANT_WARN => {
            pr_info!("planting a WARN_ON as asked by a test\n");
            kernel::warn_on!(true);
            Ok(())
        }
        _ => Err(EINVAL),
    }
}
