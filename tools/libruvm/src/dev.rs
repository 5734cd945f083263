// SPDX-License-Identifier: GPL-2.0

//! `/dev/ruvm` and its ioctls: the only place that calls `ioctl(2)`.
//!
//! [`Ruvm::call`] is the one typed ioctl call; the other methods are conveniences built on it
//! for the common argument shapes (they fill in only the fields they take, so callers, and
//! negative tests, control every other one).

use std::{
    fs::{File, OpenOptions},
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    path::PathBuf,
};

use std::num::NonZeroUsize;

use nix::{
    errno::Errno,
    sys::mman::{mmap, munmap, MapFlags, ProtFlags},
};

use crate::{
    cmd::{self, Cmd},
    uapi,
};

/// Where the device node is: `$RUVM_DEV` or `/dev/ruvm`.
pub fn path() -> PathBuf {
    std::env::var_os("RUVM_DEV").map_or_else(|| PathBuf::from("/dev/ruvm"), PathBuf::from)
}

/// A mem's export data (`RUVM_IOCTL_MEM_EXPORT`): opaque bytes that may travel by any means.
pub type ExportData = [u8; uapi::RUVM_EXPORT_DATA_LEN as usize];

/// One open file of `/dev/ruvm`.
pub struct Ruvm {
    file: File,
}

/// A structure that is an ioctl argument: plain old data from the uapi header.
///
/// # Safety
///
/// Implementors must be `#[repr(C)]` structures of integers and integer arrays only, so that
/// the kernel may write any bytes into them.
pub unsafe trait IoctlArg: Default {}

/// Marks uapi structures as ioctl arguments.
macro_rules! ioctl_args {
    ($($t:ty),* $(,)?) => {$(
        // SAFETY: generated from the uapi header, whose structures hold only __u8..__u64 fields.
        unsafe impl IoctlArg for $t {}
    )*};
}

ioctl_args!(
    uapi::ruvm_info,
    uapi::ruvm_mem_alloc,
    uapi::ruvm_mem_handle,
    uapi::ruvm_mem_query,
    uapi::ruvm_mem_fill,
    uapi::ruvm_mem_copy,
    uapi::ruvm_mem_range,
    uapi::ruvm_mem_register,
    uapi::ruvm_audit,
    uapi::ruvm_bench,
    uapi::ruvm_stats,
    uapi::ruvm_register_unload_state,
    uapi::ruvm_test_leak,
    uapi::ruvm_gpu_list,
    uapi::ruvm_gpu_attach,
    uapi::ruvm_mem_gpu,
    uapi::ruvm_mem_dma_addrs,
    uapi::ruvm_ce_copy,
    uapi::ruvm_test_ce_raw,
    uapi::ruvm_test_plant,
    uapi::ruvm_mem_gpu_phys,
    uapi::ruvm_pmm_stats,
    uapi::ruvm_vidmem_limit,
    uapi::ruvm_pmm_check_leak,
    uapi::ruvm_mem_gpu_va,
    uapi::ruvm_ce_copy_va,
    uapi::ruvm_gpu_pt_walk,
    uapi::ruvm_test_pt_write,
    uapi::ruvm_mem_gpu_user,
    uapi::ruvm_test_sim_gpu,
    uapi::ruvm_pool_create,
    uapi::ruvm_pool_handle,
    uapi::ruvm_pool_info,
    uapi::ruvm_pool_set,
    uapi::ruvm_pool_trim,
    uapi::ruvm_pool_access,
    uapi::ruvm_gpu_pool,
    uapi::ruvm_ptr_attrs,
    uapi::ruvm_pool_export,
    uapi::ruvm_pool_import,
    uapi::ruvm_mem_export,
    uapi::ruvm_mem_import,
    uapi::ruvm_mem_export_dmabuf,
    uapi::ruvm_mem_import_dmabuf,
    uapi::ruvm_stream_create,
    uapi::ruvm_stream_handle,
    uapi::ruvm_stream_submit,
    uapi::ruvm_stream_query,
    uapi::ruvm_stream_status,
    uapi::ruvm_stream_sync,
    uapi::ruvm_event,
);

/// The `enum ruvm_va_space_flags` of a VA space: the caller's user VA space, or the kernel's.
fn space_flags(user: bool) -> u32 {
    if user {
        uapi::ruvm_va_space_flags_RUVM_VA_USER
    } else {
        0
    }
}

mod gpu;
mod pools;

impl Ruvm {
    /// Uses a descriptor of `/dev/ruvm` that this process inherited (`ruvmctl --fd N`), so that
    /// mems outlive one ruvmctl command: a shell keeps the file open, as in `exec 3<>/dev/ruvm`.
    pub fn from_inherited_fd(fd: i32) -> std::io::Result<Self> {
        use std::os::fd::FromRawFd;
        // Check that it is an open descriptor before taking it over.
        // SAFETY: F_GETFD only reads the descriptor's flags; any number is accepted.
        let rc = unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) };
        Errno::result(rc).map_err(|e| std::io::Error::other(format!("--fd {fd}: {}", e.desc())))?;
        // SAFETY: the descriptor is open (checked above) and nothing else in this process owns it.
        Ok(Self {
            file: unsafe { File::from_raw_fd(fd) },
        })
    }

    /// Takes an open file of the device (received over a socket, say).
    pub fn from_owned_fd(fd: std::os::fd::OwnedFd) -> std::io::Result<Self> {
        Ok(Self {
            file: File::from(fd),
        })
    }

    /// Opens the device for reading and writing.
    pub fn open() -> std::io::Result<Self> {
        let p = path();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot open {}: {e}", p.display()))
            })?;
        Ok(Self { file })
    }

    /// Issues `cmd` with `arg` as its in/out structure: the one typed ioctl call.
    pub fn call<T: IoctlArg>(&self, cmd: Cmd<T>, arg: &mut T) -> Result<(), Errno> {
        // SAFETY: `Cmd::new` checked that the size `cmd` encodes is `T`'s, so the kernel
        // reads and writes exactly `*arg`, which is plain data (`IoctlArg`) borrowed for the
        // call.
        unsafe { self.ioctl_ptr(cmd.nr, std::ptr::from_mut(arg).cast()) }
    }

    /// Issues any command number with any argument address: for tests of bad pointers and
    /// unknown commands.
    ///
    /// # Safety
    ///
    /// The kernel may read and write as many bytes at `arg` as `cmd` encodes: `arg` must be an
    /// address that faults (unmapped, not writable, a kernel address), or point to that many
    /// bytes that nothing else in this process uses during the call.
    pub unsafe fn ioctl_ptr(&self, cmd: u32, arg: *mut std::ffi::c_void) -> Result<(), Errno> {
        // SAFETY: the descriptor is open for the life of `self`; the kernel accesses `arg` only
        // through copy_{from,to}_user, within what the caller promised.
        let rc = unsafe { nix::libc::ioctl(self.file.as_raw_fd(), cmd.into(), arg) };
        Errno::result(rc).map(drop)
    }

    /// `RUVM_IOCTL_INFO` with all inputs zero.
    pub fn info(&self) -> Result<uapi::ruvm_info, Errno> {
        let mut args = uapi::ruvm_info::default();
        self.call(cmd::INFO, &mut args)?;
        Ok(args)
    }

    /// The descriptor, for `mmap`.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.file.as_fd()
    }

    /// `RUVM_IOCTL_MEM_ALLOC` of sysmem.
    pub fn mem_alloc(
        &self,
        size: u64,
        page_size: u64,
        flags: u32,
    ) -> Result<uapi::ruvm_mem_alloc, Errno> {
        let mut a = uapi::ruvm_mem_alloc {
            size,
            page_size,
            flags,
            backing: uapi::ruvm_backing_RUVM_BACKING_SYSMEM,
            ..Default::default()
        };
        self.call(cmd::MEM_ALLOC, &mut a)?;
        Ok(a)
    }

    /// A `struct ruvm_mem_handle` command (free, map/unmap CPU kernel).
    pub fn mem_handle_cmd(
        &self,
        cmd: Cmd<uapi::ruvm_mem_handle>,
        handle: u64,
    ) -> Result<(), Errno> {
        let mut a = uapi::ruvm_mem_handle {
            handle,
            ..Default::default()
        };
        self.call(cmd, &mut a)
    }

    /// `RUVM_IOCTL_MEM_FREE`.
    pub fn mem_free(&self, handle: u64) -> Result<(), Errno> {
        self.mem_handle_cmd(cmd::MEM_FREE, handle)
    }

    /// `RUVM_IOCTL_MEM_RANGE`: populates (`populate`) or releases a range of a sparse mem;
    /// returns the mem's resident bytes.
    pub fn mem_range(
        &self,
        handle: u64,
        offset: u64,
        length: u64,
        populate: bool,
    ) -> Result<u64, Errno> {
        let mut a = uapi::ruvm_mem_range {
            handle,
            offset,
            length,
            op: if populate {
                uapi::ruvm_range_op_RUVM_RANGE_POPULATE
            } else {
                uapi::ruvm_range_op_RUVM_RANGE_RELEASE
            },
            ..Default::default()
        };
        self.call(cmd::MEM_RANGE, &mut a)?;
        Ok(a.resident)
    }

    /// `RUVM_IOCTL_MEM_REGISTER`: makes `[addr, addr + size)` of this process (page-aligned,
    /// readable and writable) a mem, its pages pinned; returns the handle. `MEM_FREE` of it
    /// unregisters.
    pub fn mem_register(&self, addr: u64, size: u64) -> Result<u64, Errno> {
        let mut a = uapi::ruvm_mem_register {
            addr,
            size,
            ..Default::default()
        };
        self.call(cmd::MEM_REGISTER, &mut a)?;
        Ok(a.handle)
    }

    /// `RUVM_IOCTL_MEM_MAP_CPU_KERNEL`.
    pub fn map_kernel(&self, handle: u64) -> Result<(), Errno> {
        self.mem_handle_cmd(cmd::MEM_MAP_CPU_KERNEL, handle)
    }

    /// `RUVM_IOCTL_MEM_UNMAP_CPU_KERNEL`.
    pub fn unmap_kernel(&self, handle: u64) -> Result<(), Errno> {
        self.mem_handle_cmd(cmd::MEM_UNMAP_CPU_KERNEL, handle)
    }

    /// `RUVM_IOCTL_MEM_QUERY`.
    pub fn mem_query(&self, handle: u64) -> Result<uapi::ruvm_mem_query, Errno> {
        let mut a = uapi::ruvm_mem_query {
            handle,
            ..Default::default()
        };
        self.call(cmd::MEM_QUERY, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_MEM_FILL` (`verify` false) or `RUVM_IOCTL_MEM_VERIFY` (true).
    pub fn mem_fill(
        &self,
        verify: bool,
        mut args: uapi::ruvm_mem_fill,
    ) -> Result<uapi::ruvm_mem_fill, Errno> {
        let cmd = if verify {
            cmd::MEM_VERIFY
        } else {
            cmd::MEM_FILL
        };
        self.call(cmd, &mut args)?;
        Ok(args)
    }

    /// `RUVM_IOCTL_MEM_COPY`.
    pub fn mem_copy(
        &self,
        dst: u64,
        dst_offset: u64,
        src: u64,
        src_offset: u64,
        length: u64,
    ) -> Result<(), Errno> {
        let mut a = uapi::ruvm_mem_copy {
            dst_handle: dst,
            dst_offset,
            src_handle: src,
            src_offset,
            length,
            ..Default::default()
        };
        self.call(cmd::MEM_COPY, &mut a)
    }

    /// `RUVM_IOCTL_AUDIT`, with the test-only walk of the real objects when `walk`.
    pub fn audit(&self, walk: bool) -> Result<uapi::ruvm_audit, Errno> {
        let mut a = uapi::ruvm_audit {
            flags: if walk {
                uapi::ruvm_audit_flags_RUVM_AUDIT_WALK
            } else {
                0
            },
            ..Default::default()
        };
        self.call(cmd::AUDIT, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_STATS` of sysmem.
    pub fn stats(&self, reset_peaks: bool) -> Result<uapi::ruvm_stats, Errno> {
        self.stats_of(uapi::ruvm_backing_RUVM_BACKING_SYSMEM, reset_peaks)
    }

    /// `RUVM_IOCTL_BENCH`: runs `a.op` `a.iterations` times in the kernel; returns the
    /// nanoseconds it took (privileged).
    pub fn bench(&self, mut a: uapi::ruvm_bench) -> Result<u64, Errno> {
        self.call(cmd::BENCH, &mut a)?;
        Ok(a.ns)
    }

    /// `RUVM_IOCTL_STATS` of one backing.
    pub fn stats_of(&self, backing: u32, reset_peaks: bool) -> Result<uapi::ruvm_stats, Errno> {
        let mut a = uapi::ruvm_stats {
            backing,
            flags: if reset_peaks {
                uapi::ruvm_stats_flags_RUVM_STATS_RESET_PEAKS
            } else {
                0
            },
            ..Default::default()
        };
        self.call(cmd::STATS, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_REGISTER_UNLOAD_STATE` for a structure that must stay where it is until
    /// the module unloads (the kernel writes it then).
    pub fn register_unload_state(&self, state: &mut UnloadState) -> Result<(), Errno> {
        let mut a = uapi::ruvm_register_unload_state {
            addr: std::ptr::from_mut(&mut state.0) as u64,
            ..Default::default()
        };
        self.call(cmd::REGISTER_UNLOAD_STATE, &mut a)
    }

    /// `RUVM_IOCTL_TEST_LEAK`.
    pub fn test_leak(
        &self,
        what: u32,
        flags: u32,
        count: u64,
        size: u64,
        order: u32,
    ) -> Result<(), Errno> {
        let mut a = uapi::ruvm_test_leak {
            what,
            flags,
            count,
            size,
            order,
            ..Default::default()
        };
        self.call(cmd::TEST_LEAK, &mut a)
    }

    /// `RUVM_IOCTL_TEST_PLANT`.
    pub fn test_plant(&self, what: u32) -> Result<(), Errno> {
        let mut args = uapi::ruvm_test_plant {
            what,
            ..Default::default()
        };
        self.call(cmd::TEST_PLANT, &mut args)
    }
}

/// The `RUVM_IOCTL_POOL_SET` attribute (`enum ruvm_pool_attr`) of reuse policy `policy` (one
/// bit of `enum ruvm_pool_reuse`, as `ruvm_pool_info.reuse` reports it).
pub fn reuse_attr(policy: u32) -> Option<u32> {
    match policy {
        uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES => {
            Some(uapi::ruvm_pool_attr_RUVM_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES)
        }
        uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_OPPORTUNISTIC => {
            Some(uapi::ruvm_pool_attr_RUVM_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC)
        }
        uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            Some(uapi::ruvm_pool_attr_RUVM_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES)
        }
        _ => None,
    }
}

/// A `struct ruvm_unload_state` placed so that it never crosses a page boundary, as the module
/// requires (256 divides every page size, and the structure is smaller).
#[repr(C, align(256))]
#[derive(Default)]
pub struct UnloadState(pub uapi::ruvm_unload_state);

const _: () = assert!(std::mem::size_of::<uapi::ruvm_unload_state>() <= 256);

/// Unloads ruvm and returns the verdict it wrote at unload into memory registered with
/// `RUVM_IOCTL_REGISTER_UNLOAD_STATE`. No file of the device may be open (`EBUSY` otherwise).
pub fn unload_with_verdict() -> Result<uapi::ruvm_unload_state, String> {
    // The kernel writes this at unload; it must stay put until then.
    let mut state = Box::new(UnloadState::default());
    {
        let d = Ruvm::open().map_err(|e| e.to_string())?;
        d.register_unload_state(&mut state)
            .map_err(|e| format!("RUVM_IOCTL_REGISTER_UNLOAD_STATE: {e}"))?;
    }
    nix::kmod::delete_module(c"ruvm", nix::kmod::DeleteModuleFlags::O_NONBLOCK)
        .map_err(|e| format!("unloading ruvm: {e} (is /dev/ruvm still open somewhere?)"))?;
    // SAFETY: `state` is ours and live; the kernel wrote it during the unload, which returned.
    Ok(unsafe { std::ptr::read_volatile(&state.0) })
}

/// Loads ruvm from `$RUVM_KO` (default `/ruvm/ruvm.ko`, where the test guest keeps it).
pub fn load_module(params: &str) -> Result<(), String> {
    let path = std::env::var("RUVM_KO").unwrap_or_else(|_| "/ruvm/ruvm.ko".to_owned());
    let f = File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    let params = std::ffi::CString::new(params).map_err(|e| e.to_string())?;
    nix::kmod::finit_module(&f, &params, nix::kmod::ModuleInitFlags::empty())
        .map_err(|e| format!("loading {path}: {e}"))
}

/// A GPU's PCI address as sysfs names it (`dddd:bb:dd.f`).
pub fn pci_name(g: &uapi::ruvm_gpu_info) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{}",
        g.pci_domain,
        g.pci_bus,
        g.pci_devfn >> 3,
        g.pci_devfn & 7
    )
}

/// A user mapping of (part of) the device file, unmapped on drop.
pub struct UserMap {
    ptr: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
}

impl UserMap {
    /// `mmap(NULL, len, prot, flags, fd, offset)` of the device.
    pub fn new(
        dev: &Ruvm,
        offset: u64,
        len: usize,
        prot: ProtFlags,
        flags: MapFlags,
    ) -> Result<Self, Errno> {
        let nz = NonZeroUsize::new(len).ok_or(Errno::EINVAL)?;
        let off = i64::try_from(offset).map_err(|_| Errno::EOVERFLOW)?;
        // SAFETY: a new mapping at an address the kernel chooses aliases nothing in this process.
        let ptr = unsafe { mmap(None, nz, prot, flags, dev.as_fd(), off) }?;
        Ok(Self { ptr, len })
    }

    /// A shared read-write mapping of a whole mem.
    pub fn of_mem(dev: &Ruvm, q: &uapi::ruvm_mem_query) -> Result<Self, Errno> {
        let len = usize::try_from(q.physical_size).map_err(|_| Errno::EOVERFLOW)?;
        Self::new(
            dev,
            q.mmap_offset,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
        )
    }

    /// Its length in bytes (never 0).
    #[expect(clippy::len_without_is_empty, reason = "a mapping is never empty")]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Its first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr().cast()
    }

    /// Reads the byte at `i` (volatile: the kernel writes these pages too).
    pub fn read(&self, i: usize) -> u8 {
        assert!(i < self.len);
        // SAFETY: `i` is inside the mapping, which lives as long as `self`.
        unsafe { self.as_ptr().add(i).read_volatile() }
    }

    /// Writes the byte at `i`.
    pub fn write(&self, i: usize, v: u8) {
        assert!(i < self.len);
        // SAFETY: as in `read`; the mapping is writable (callers map it so).
        unsafe { self.as_ptr().add(i).write_volatile(v) }
    }
}

impl Drop for UserMap {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `new` and is not used after this.
        let _ = unsafe { munmap(self.ptr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_string_stops_at_nul() {
        use crate::c_string;
        assert_eq!(c_string(b"0.1.0\0junk"), "0.1.0");
        assert_eq!(c_string(b"abc"), "abc");
        assert_eq!(c_string(b"\0abc"), "");
    }

    #[test]
    fn ioctl_numbers_encode_the_structure_size() {
        // _IOC_SIZE is bits 16..30 of the number; _IOC_DIR (bits 30..32) is read|write.
        let size = |cmd: u32| (cmd >> 16) & 0x3fff;
        assert_eq!(
            size(uapi::RUVM_IOCTL_INFO) as usize,
            std::mem::size_of::<uapi::ruvm_info>()
        );
        assert_eq!(
            size(uapi::RUVM_IOCTL_TEST_PLANT) as usize,
            std::mem::size_of::<uapi::ruvm_test_plant>()
        );
        assert_eq!(uapi::RUVM_IOCTL_INFO >> 30, 3);
        assert_eq!((uapi::RUVM_IOCTL_INFO >> 8) & 0xff, uapi::RUVM_IOCTL_MAGIC);
    }

    #[test]
    fn structures_have_the_documented_layout() {
        assert_eq!(std::mem::size_of::<uapi::ruvm_info>(), 120);
        assert_eq!(std::mem::size_of::<uapi::ruvm_mem_alloc>(), 88);
        assert_eq!(std::mem::size_of::<uapi::ruvm_mem_handle>(), 32);
        assert_eq!(std::mem::size_of::<uapi::ruvm_mem_query>(), 104);
        assert_eq!(std::mem::size_of::<uapi::ruvm_mem_fill>(), 72);
        assert_eq!(std::mem::size_of::<uapi::ruvm_mem_copy>(), 64);
        assert_eq!(std::mem::size_of::<uapi::ruvm_audit>(), 544);
        assert_eq!(std::mem::size_of::<uapi::ruvm_stats>(), 128);
        assert_eq!(std::mem::size_of::<uapi::ruvm_unload_state>(), 256);
        assert_eq!(std::mem::size_of::<uapi::ruvm_pool_create>(), 64);
        assert_eq!(std::mem::size_of::<uapi::ruvm_pool_handle>(), 32);
        assert_eq!(std::mem::size_of::<uapi::ruvm_pool_info>(), 120);
        assert_eq!(std::mem::size_of::<uapi::ruvm_pool_set>(), 40);
        assert_eq!(std::mem::size_of::<uapi::ruvm_pool_trim>(), 48);
        assert_eq!(std::mem::size_of::<uapi::ruvm_pool_access>(), 32);
        assert_eq!(std::mem::size_of::<uapi::ruvm_gpu_pool>(), 32);
        assert_eq!(std::mem::size_of::<uapi::ruvm_test_sim_gpu>(), 32);
        assert_eq!(std::mem::size_of::<uapi::ruvm_register_unload_state>(), 32);
        assert_eq!(std::mem::size_of::<uapi::ruvm_test_leak>(), 48);
        assert_eq!(std::mem::size_of::<uapi::ruvm_gpu_info>(), 56);
        assert_eq!(std::mem::size_of::<uapi::ruvm_gpu_list>(), 32);
        assert_eq!(std::mem::size_of::<uapi::ruvm_gpu_attach>(), 32);
        assert_eq!(std::mem::size_of::<uapi::ruvm_mem_gpu>(), 32);
        assert_eq!(std::mem::size_of::<uapi::ruvm_mem_dma_addrs>(), 56);
        assert_eq!(std::mem::size_of::<uapi::ruvm_ce_copy>(), 64);
        assert_eq!(std::mem::size_of::<uapi::ruvm_test_plant>(), 24);
        assert_eq!(std::mem::align_of::<uapi::ruvm_info>(), 8);
    }

    #[test]
    fn the_pool_info_ends_with_its_reuse_policies_and_pending_bytes() {
        use std::mem::offset_of;
        use uapi::ruvm_pool_info as P;
        assert_eq!(offset_of!(P, access), 88);
        assert_eq!(offset_of!(P, gpu), 96);
        assert_eq!(offset_of!(P, reuse), 100);
        assert_eq!(offset_of!(P, pending_bytes), 104);
        assert_eq!(offset_of!(P, pool_flags), 112);
        use uapi::ruvm_gpu_pool as G;
        assert_eq!(offset_of!(G, flags), 4);
        assert_eq!(offset_of!(G, pool), 8);
        assert_eq!(offset_of!(G, reserved), 16);
    }

    #[test]
    fn the_pointer_attributes_have_the_documented_layout() {
        use std::mem::offset_of;
        use uapi::ruvm_ptr_attrs as A;
        assert_eq!(std::mem::size_of::<A>(), 104);
        assert_eq!(std::mem::align_of::<A>(), 8);
        assert_eq!(offset_of!(A, addr), 0);
        assert_eq!(offset_of!(A, flags), 8);
        assert_eq!(offset_of!(A, type_), 12);
        assert_eq!(offset_of!(A, handle), 16);
        assert_eq!(offset_of!(A, offset), 24);
        assert_eq!(offset_of!(A, base), 32);
        assert_eq!(offset_of!(A, size), 40);
        assert_eq!(offset_of!(A, physical_size), 48);
        assert_eq!(offset_of!(A, chunk_size), 56);
        assert_eq!(offset_of!(A, pool), 64);
        assert_eq!(offset_of!(A, mapped_gpus), 72);
        assert_eq!(offset_of!(A, backing), 80);
        assert_eq!(offset_of!(A, ptr_flags), 84);
        assert_eq!(offset_of!(A, reserved), 88);
        assert_eq!(uapi::ruvm_ptr_type_RUVM_PTR_NONE, 0);
        assert_eq!(uapi::ruvm_ptr_type_RUVM_PTR_MEM, 1);
        assert_eq!(uapi::ruvm_ptr_flags_RUVM_PTR_OTHER_FILE, 1);
        assert_eq!(uapi::ruvm_ptr_flags_RUVM_PTR_FREED, 2);
        assert_eq!(u64::from(uapi::RUVM_FEATURE_PTR_ATTRS), 1 << 12);
        assert_ne!(
            u64::from(uapi::RUVM_FEATURES_ALL) & u64::from(uapi::RUVM_FEATURE_PTR_ATTRS),
            0
        );
    }

    #[test]
    fn the_ptr_attrs_command_is_0x50() {
        let c = cmd::PTR_ATTRS.nr;
        assert_eq!(c & 0xff, 0x50);
        assert_eq!((c >> 8) & 0xff, uapi::RUVM_IOCTL_MAGIC);
        assert_eq!(c >> 30, 3, "read-write");
        assert_eq!(((c >> 16) & 0x3fff) as usize, 104);
    }

    #[test]
    fn the_dmabuf_commands_are_0x55_and_0x56_with_their_layouts() {
        use std::mem::{offset_of, size_of};
        for (c, nr, size) in [
            (cmd::MEM_EXPORT_DMABUF.nr, 0x55, 32),
            (cmd::MEM_IMPORT_DMABUF.nr, 0x56, 48),
        ] {
            assert_eq!(c & 0xff, nr);
            assert_eq!((c >> 8) & 0xff, uapi::RUVM_IOCTL_MAGIC);
            assert_eq!(c >> 30, 3, "read-write");
            assert_eq!(((c >> 16) & 0x3fff) as usize, size);
        }
        assert_eq!(size_of::<uapi::ruvm_mem_export_dmabuf>(), 32);
        assert_eq!(size_of::<uapi::ruvm_mem_import_dmabuf>(), 48);
        assert_eq!(offset_of!(uapi::ruvm_mem_export_dmabuf, fd), 12);
        assert_eq!(offset_of!(uapi::ruvm_mem_import_dmabuf, handle), 8);
        assert_eq!(u64::from(uapi::RUVM_FEATURE_DMABUF), 1 << 14);
    }

    #[test]
    fn the_ipc_pool_commands_are_0x51_to_0x54_with_their_layouts() {
        use std::mem::{offset_of, size_of};
        for (c, nr, size) in [
            (cmd::POOL_EXPORT.nr, 0x51, 32),
            (cmd::POOL_IMPORT.nr, 0x52, 32),
            (cmd::MEM_EXPORT.nr, 0x53, 104),
            (cmd::MEM_IMPORT.nr, 0x54, 120),
        ] {
            assert_eq!(c & 0xff, nr);
            assert_eq!((c >> 8) & 0xff, uapi::RUVM_IOCTL_MAGIC);
            assert_eq!(c >> 30, 3, "read-write");
            assert_eq!(((c >> 16) & 0x3fff) as usize, size);
        }
        assert_eq!(size_of::<uapi::ruvm_pool_export>(), 32);
        assert_eq!(size_of::<uapi::ruvm_pool_import>(), 32);
        assert_eq!(size_of::<uapi::ruvm_mem_export>(), 104);
        assert_eq!(size_of::<uapi::ruvm_mem_import>(), 120);
        assert_eq!(offset_of!(uapi::ruvm_pool_export, fd), 12);
        assert_eq!(offset_of!(uapi::ruvm_mem_export, data), 24);
        assert_eq!(offset_of!(uapi::ruvm_mem_import, data), 16);
        assert_eq!(offset_of!(uapi::ruvm_mem_import, handle), 80);
        assert_eq!(offset_of!(uapi::ruvm_pool_info, pool_flags), 112);
        assert_eq!(uapi::RUVM_EXPORT_DATA_LEN, 64);
        assert_eq!(uapi::ruvm_pool_create_flags_RUVM_POOL_EXPORTABLE, 1);
        assert_eq!(uapi::ruvm_pool_flags_RUVM_POOL_FLAG_EXPORTABLE, 1);
        assert_eq!(uapi::ruvm_pool_flags_RUVM_POOL_FLAG_IMPORTED, 2);
        assert_eq!(uapi::ruvm_ptr_flags_RUVM_PTR_IMPORTED, 4);
        assert_eq!(u64::from(uapi::RUVM_FEATURE_IPC_POOLS), 1 << 13);
        assert_ne!(
            u64::from(uapi::RUVM_FEATURES_ALL) & u64::from(uapi::RUVM_FEATURE_IPC_POOLS),
            0
        );
    }

    #[test]
    fn the_gpu_pool_command_is_0x37() {
        let c = cmd::GPU_POOL.nr;
        assert_eq!(c & 0xff, 0x37);
        assert_eq!((c >> 8) & 0xff, uapi::RUVM_IOCTL_MAGIC);
        assert_eq!(c >> 30, 3, "read-write");
    }

    #[test]
    fn each_reuse_policy_has_its_attribute() {
        let bits = [
            uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES,
            uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_OPPORTUNISTIC,
            uapi::ruvm_pool_reuse_RUVM_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
        ];
        let attrs: Vec<Option<u32>> = bits.iter().map(|&b| reuse_attr(b)).collect();
        assert_eq!(attrs, [Some(4), Some(5), Some(6)]);
        assert_eq!(reuse_attr(0), None);
        assert_eq!(reuse_attr(3), None);
        assert_eq!(reuse_attr(1 << 3), None);
        // The unload verdict still fits the 256 bytes it may not cross a page boundary in.
        assert!(std::mem::size_of::<uapi::ruvm_unload_state>() <= 256);
    }

    #[test]
    fn ruvmctl_and_module_share_one_version() {
        let file = include_str!("../../../VERSION").trim();
        assert_eq!(
            env!("CARGO_PKG_VERSION"),
            file,
            "Cargo.toml and VERSION disagree"
        );
        assert_eq!(env!("RUVM_VERSION"), file);
    }
}
