// SPDX-License-Identifier: GPL-2.0

//! Registering memory a process already has (`RUVM_IOCTL_MEM_REGISTER`,
//! `RUVM_FEATURE_REGISTER`): the bytes the program wrote at its own addresses are what a
//! simulated GPU's engine reads (and the reverse), the pins show in `VmPin` and go with the
//! registration, an unmapping of the range ends it (work queued before still reads the pages
//! it was given), `fork` leaves the parent's view whole, a truncated file's pages stay the
//! mem's, and every refusal has its errno. Every case skips without the feature.

use std::{
    num::NonZeroUsize,
    os::fd::{AsFd, OwnedFd},
    ptr::NonNull,
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    sys::mman::{madvise, mmap_anonymous, munmap, MapFlags, MmapAdvise, ProtFlags},
};

use super::harness::{cases, check, child_checks, expect_errno, Case, Context, Stop, TestResult};
use super::shared::sim_gpu;
use super::streams::Gate;
use crate::pattern;
use libruvm::{op, uapi, Ruvm, UserMap};

const PAGE: u64 = 4096;
const LEN: u64 = 64 << 10;
const REGISTERED: u32 = uapi::ruvm_ptr_flags_RUVM_PTR_REGISTERED;

pub fn cases() -> Vec<Case> {
    cases![
        register_bytes_reach_the_engine_both_ways,
        register_refusals,
        register_munmap_with_work_queued,
        register_again_right_after_munmap,
        register_fork_keeps_the_parents_pages,
        register_file_truncated_under_it,
        register_private_file_mapping_never_writes_the_file,
        register_beyond_memlock_is_enomem,
    ]
}

/// [`expect_errno`], the case's words first.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, Errno>, want: Errno) -> TestResult {
    expect_errno(r, want, what)
}

/// The device, or a skip without the feature.
fn open() -> Result<Ruvm, Stop> {
    let d = Ruvm::open().ctx("open")?;
    let features = d.info().ctx("INFO")?.features;
    if features & u64::from(uapi::RUVM_FEATURE_REGISTER) == 0 {
        return Err(Stop::Skip("no RUVM_FEATURE_REGISTER".into()));
    }
    Ok(d)
}

/// An anonymous private mapping of this process, unmapped on drop (unless already).
struct Anon {
    ptr: NonNull<std::ffi::c_void>,
    len: usize,
    mapped: bool,
}

impl Anon {
    fn new(len: u64, prot: ProtFlags) -> Result<Self, Stop> {
        let len = len as usize;
        let nz = NonZeroUsize::new(len).ok_or_else(|| Stop::Fail("empty mapping".into()))?;
        // SAFETY: a new mapping where the kernel chooses aliases nothing of this process.
        let ptr = unsafe { mmap_anonymous(None, nz, prot, MapFlags::MAP_PRIVATE) }.ctx("mmap")?;
        Ok(Self {
            ptr,
            len,
            mapped: true,
        })
    }

    /// [`LEN`] bytes of file `fd` from its start, read-write, `flags` (shared or private).
    fn of_file(fd: &impl AsFd, flags: MapFlags) -> Result<Self, Stop> {
        let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        let len = NonZeroUsize::MIN.saturating_add(LEN as usize - 1);
        // SAFETY: a new mapping of the file where the kernel chooses, unmapped on drop.
        let ptr = unsafe { nix::sys::mman::mmap(None, len, rw, flags, fd.as_fd(), 0) }
            .ctx("mmap of a file")?;
        Ok(Self {
            ptr,
            len: LEN as usize,
            mapped: true,
        })
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn write(&self, off: u64, len: u64, seed: u64) {
        for i in 0..len {
            // SAFETY: inside the mapping (callers keep `off + len` within it), writable.
            unsafe {
                self.ptr
                    .as_ptr()
                    .cast::<u8>()
                    .add((off + i) as usize)
                    .write_volatile(pattern::byte_at(seed, i))
            };
        }
    }

    /// Bytes of `[off, off + len)` that are not `seed`'s pattern.
    fn wrong(&self, off: u64, len: u64, seed: u64) -> u64 {
        (0..len)
            .filter(|&i| {
                // SAFETY: inside the mapping, readable.
                let b = unsafe {
                    self.ptr
                        .as_ptr()
                        .cast::<u8>()
                        .add((off + i) as usize)
                        .read_volatile()
                };
                b != pattern::byte_at(seed, i)
            })
            .count() as u64
    }

    fn unmap(&mut self) -> TestResult {
        if self.mapped {
            self.mapped = false;
            // SAFETY: made by `new`, not used after this.
            unsafe { munmap(self.ptr, self.len) }.ctx("munmap")?;
        }
        Ok(())
    }
}

impl Drop for Anon {
    fn drop(&mut self) {
        let _ = self.unmap();
    }
}

/// `munmap` of `[addr, addr + len)` of this process.
fn unmap_at(addr: u64, len: u64) -> TestResult {
    let p = NonNull::new(addr as usize as *mut std::ffi::c_void)
        .ok_or_else(|| Stop::Fail("munmap of address 0".into()))?;
    // SAFETY: callers unmap only pages of mappings they own and no longer use.
    unsafe { munmap(p, len as usize) }.ctx("munmap")
}

/// A mem of [`LEN`] bytes DMA-mapped for `g` and mapped into this process.
fn target(d: &Ruvm, g: u32) -> Result<(u64, UserMap), Stop> {
    let a = d.mem_alloc(LEN, PAGE, 0).ctx("MEM_ALLOC")?;
    d.mem_gpu(true, a.handle, g).ctx("MEM_MAP_GPU")?;
    let q = d.mem_query(a.handle).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    Ok((a.handle, map))
}

fn map_wrong(map: &UserMap, from: u64, len: u64, seed: u64) -> u64 {
    (0..len)
        .filter(|&i| map.read((from + i) as usize) != pattern::byte_at(seed, i))
        .count() as u64
}

fn map_write(map: &UserMap, from: u64, len: u64, seed: u64) {
    for i in 0..len {
        map.write((from + i) as usize, pattern::byte_at(seed, i));
    }
}

/// This process's pinned pages (`VmPin` of /proc/self/status), in KiB.
fn vm_pin_kib() -> Result<u64, Stop> {
    let s = std::fs::read_to_string("/proc/self/status").ctx("/proc/self/status")?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| Stop::Fail("no VmPin in /proc/self/status".into()))
}

/// Waits (up to 5 s) until `f` holds.
fn eventually(what: &str, mut f: impl FnMut() -> Result<bool, Stop>) -> TestResult {
    let start = Instant::now();
    while !f()? {
        if start.elapsed() > Duration::from_secs(5) {
            return Err(Stop::Fail(format!("{what}: not within 5 s")));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// The program writes its memory, the engine copies it out (by handle) and back in (by
/// address), PTR_ATTRS and MEM_QUERY know it, VmPin counts it until MEM_FREE.
fn register_bytes_reach_the_engine_both_ways() -> TestResult {
    let d = open()?;
    let g = sim_gpu(&d)?;
    let pin0 = vm_pin_kib()?;
    let r = Anon::new(LEN, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
    r.write(0, LEN, 11);
    let h = d.mem_register(r.addr(), LEN).ctx("MEM_REGISTER")?;
    check!(
        vm_pin_kib()? == pin0 + LEN / 1024,
        "VmPin after registering {LEN} bytes: {} KiB, wanted {}",
        vm_pin_kib()?,
        pin0 + LEN / 1024
    );
    let q = d.mem_query(h).ctx("MEM_QUERY")?;
    check!(
        q.alloc_flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_REGISTERED != 0
            && q.physical_size == LEN
            && q.chunk_size == PAGE,
        "MEM_QUERY of a registration: flags {:#x} size {} chunk {}",
        q.alloc_flags,
        q.physical_size,
        q.chunk_size
    );
    let p = d.ptr_attrs(r.addr() + 5000).ctx("PTR_ATTRS")?;
    check!(
        p.type_ == uapi::ruvm_ptr_type_RUVM_PTR_MEM
            && p.ptr_flags == REGISTERED
            && p.handle == h
            && p.offset == 5000
            && p.base == r.addr()
            && p.size == LEN,
        "PTR_ATTRS inside the range: type {} flags {:#x} handle {} (want {h}) offset {} base {:#x}",
        p.type_,
        p.ptr_flags,
        p.handle,
        p.offset,
        p.base
    );
    d.mem_gpu(true, h, g)
        .ctx("MEM_MAP_GPU of the registration")?;
    let (b, mb) = target(&d, g)?;
    d.ce_copy(g, b, 0, h, 0, LEN)
        .ctx("CE_COPY registration -> mem")?;
    let bad = map_wrong(&mb, 0, LEN, 11);
    check!(
        bad == 0,
        "{bad} bytes the engine read from registered memory are wrong"
    );
    map_write(&mb, 0, LEN, 12);
    let dst = r.addr() + PAGE + 3;
    d.ce_copy_flags(
        g,
        uapi::ruvm_op_flags_RUVM_OP_DST_PTR,
        (dst, 0),
        (b, 0),
        LEN - PAGE - 3,
    )
    .ctx("CE_COPY mem -> registered address")?;
    let bad = r.wrong(PAGE + 3, LEN - PAGE - 3, 12);
    check!(
        bad == 0,
        "{bad} bytes the engine wrote are not what the program reads"
    );
    check!(
        r.wrong(0, PAGE + 3, 11) == 0,
        "bytes before the copy's destination changed"
    );
    d.mem_free(h).ctx("MEM_FREE of the registration")?;
    check!(
        vm_pin_kib()? == pin0,
        "VmPin after MEM_FREE: {} KiB",
        vm_pin_kib()?
    );
    let p = d.ptr_attrs(r.addr()).ctx("PTR_ATTRS after MEM_FREE")?;
    check!(
        p.type_ == uapi::ruvm_ptr_type_RUVM_PTR_NONE,
        "a freed registration still answers"
    );
    // Registered again (the range is free of it), then left to the file's close.
    d.mem_register(r.addr(), LEN).ctx("MEM_REGISTER again")?;
    // The last reference to the file (a mapping of a mem holds one).
    drop(mb);
    drop(d);
    check!(
        vm_pin_kib()? == pin0,
        "VmPin after the close: {} KiB",
        vm_pin_kib()?
    );
    Ok(())
}

/// Every refusal's errno; nothing stays pinned after any of them.
fn register_refusals() -> TestResult {
    let d = open()?;
    let pin0 = vm_pin_kib()?;
    let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    let r = Anon::new(4 * PAGE, rw)?;
    let a = r.addr();
    refused(
        "unaligned address",
        d.mem_register(a + 8, PAGE),
        Errno::EINVAL,
    )?;
    refused("size 0", d.mem_register(a, 0), Errno::EINVAL)?;
    refused("unaligned size", d.mem_register(a, PAGE + 1), Errno::EINVAL)?;
    refused(
        "a range past the address space",
        d.mem_register(!(PAGE - 1), 2 * PAGE),
        Errno::EOVERFLOW,
    )?;
    let holed = Anon::new(3 * PAGE, rw)?;
    unmap_at(holed.addr() + PAGE, PAGE)?;
    refused(
        "a hole in the range",
        d.mem_register(holed.addr(), 3 * PAGE),
        Errno::EFAULT,
    )?;
    // The pages left of it go with `holed` (a munmap of a range with a hole is fine).
    let ro = Anon::new(2 * PAGE, ProtFlags::PROT_READ)?;
    refused(
        "a read-only mapping",
        d.mem_register(ro.addr(), 2 * PAGE),
        Errno::EACCES,
    )?;
    let none = Anon::new(PAGE, ProtFlags::PROT_NONE)?;
    refused(
        "PROT_NONE",
        d.mem_register(none.addr(), PAGE),
        Errno::EACCES,
    )?;
    let h = d
        .mem_register(a + PAGE, 2 * PAGE)
        .ctx("a registration of 2 pages")?;
    refused(
        "the same range again",
        d.mem_register(a + PAGE, 2 * PAGE),
        Errno::EEXIST,
    )?;
    refused(
        "an overlapping range",
        d.mem_register(a, 2 * PAGE),
        Errno::EEXIST,
    )?;
    refused(
        "a range holding it",
        d.mem_register(a, 4 * PAGE),
        Errno::EEXIST,
    )?;
    let h2 = d
        .mem_register(a + 3 * PAGE, PAGE)
        .ctx("the page right after it")?;
    d.mem_free(h2).ctx("MEM_FREE of the page after")?;
    // A mapping of a mem is ruvm memory already.
    let m = d.mem_alloc(LEN, PAGE, 0).ctx("MEM_ALLOC")?;
    let q = d.mem_query(m.handle).ctx("MEM_QUERY")?;
    let mm = UserMap::of_mem(&d, &q).ctx("mmap")?;
    refused(
        "a mapping of a mem",
        d.mem_register(mm.as_ptr() as u64, LEN),
        Errno::EEXIST,
    )?;
    // What a registered mem cannot do.
    let rq = d.mem_query(h).ctx("MEM_QUERY of the registration")?;
    refused(
        "mmap of a registered mem",
        UserMap::of_mem(&d, &rq).map(|_| ()),
        Errno::EOPNOTSUPP,
    )?;
    refused(
        "a dma-buf of it",
        d.mem_export_dmabuf(h).map(|_| ()),
        Errno::EOPNOTSUPP,
    )?;
    d.mem_free(h).ctx("MEM_FREE")?;
    refused("MEM_FREE again", d.mem_free(h), Errno::ENOENT)?;
    // A VM_IO | VM_PFNMAP mapping: the vDSO's data pages.
    if let Some(vvar) = special_mapping("[vvar]")? {
        refused(
            "[vvar] (VM_PFNMAP)",
            d.mem_register(vvar, PAGE),
            Errno::EOPNOTSUPP,
        )?;
    }
    // secretmem, where the kernel has it (memfd_secret).
    // SAFETY: memfd_secret(0) returns a new descriptor or -1.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_memfd_secret, 0) };
    if fd >= 0 {
        // SAFETY: a descriptor just made, owned here.
        let fd: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) };
        nix::unistd::ftruncate(&fd, PAGE as i64).ctx("ftruncate secretmem")?;
        // SAFETY: a new shared mapping of that descriptor.
        let p = unsafe {
            nix::sys::mman::mmap(
                None,
                NonZeroUsize::MIN.saturating_add(PAGE as usize - 1),
                rw,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
        }
        .ctx("mmap secretmem")?;
        let r = d.mem_register(p.as_ptr() as u64, PAGE);
        // SAFETY: mapped just above.
        let _ = unsafe { munmap(p, PAGE as usize) };
        refused("secretmem", r, Errno::EOPNOTSUPP)?;
    }
    let args = |flags: u32, pad: u32, reserved: u64| uapi::ruvm_mem_register {
        addr: a,
        size: PAGE,
        flags,
        pad,
        reserved: [reserved, 0],
        ..Default::default()
    };
    for (what, mut x) in [
        ("a flag", args(1, 0, 0)),
        ("pad", args(0, 1, 0)),
        ("reserved", args(0, 0, 1)),
    ] {
        refused(
            what,
            d.call(libruvm::cmd::MEM_REGISTER, &mut x),
            Errno::EINVAL,
        )?;
    }
    drop(r);
    check!(
        vm_pin_kib()? == pin0,
        "VmPin after the refusals: {} KiB",
        vm_pin_kib()?
    );
    Ok(())
}

/// The start of this process's mapping named `name` in /proc/self/maps.
fn special_mapping(name: &str) -> Result<Option<u64>, Stop> {
    let maps = std::fs::read_to_string("/proc/self/maps").ctx("/proc/self/maps")?;
    Ok(maps
        .lines()
        .find(|l| l.ends_with(name))
        .and_then(|l| l.split('-').next())
        .and_then(|s| u64::from_str_radix(s, 16).ok()))
}

/// The program unmaps a registered range while a copy from it waits on a stream: the handle
/// goes (revoked), the copy still reads the bytes the pages had, and the pins go after it.
fn register_munmap_with_work_queued() -> TestResult {
    let d = open()?;
    let g = sim_gpu(&d)?;
    let mut gate = Gate::new()?;
    let pin0 = vm_pin_kib()?;
    let mut r = Anon::new(LEN, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
    r.write(0, LEN, 21);
    let h = d.mem_register(r.addr(), LEN).ctx("MEM_REGISTER")?;
    d.mem_gpu(true, h, g).ctx("MEM_MAP_GPU")?;
    let (b, mb) = target(&d, g)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    d.stream_submit(s, &[gate.wait(), op::copy(b, 0, h, 0, LEN)])
        .ctx("STREAM_SUBMIT wait + copy")?;
    r.unmap()?;
    eventually("the handle revoked after munmap", || {
        Ok(d.mem_query(h).err() == Some(Errno::ENOENT))
    })?;
    check!(
        vm_pin_kib()? == pin0 + LEN / 1024,
        "VmPin with the copy still queued: {} KiB, wanted {}",
        vm_pin_kib()?,
        pin0 + LEN / 1024
    );
    gate.release()?;
    d.stream_sync(s, 5000).ctx("STREAM_SYNC")?;
    let bad = map_wrong(&mb, 0, LEN, 21);
    check!(
        bad == 0,
        "{bad} bytes of the queued copy are not what the pages held"
    );
    eventually("the pins gone once the copy is", || {
        Ok(vm_pin_kib()? == pin0)
    })?;
    Ok(())
}

/// A range unmapped and mapped again at once (before its revocation has run) registers again
/// (the unmapped registration is no longer in the way), and only the old one is revoked.
fn register_again_right_after_munmap() -> TestResult {
    let d = open()?;
    let pin0 = vm_pin_kib()?;
    let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    for round in 0..20 {
        let mut r = Anon::new(LEN, rw)?;
        r.write(0, LEN, 61);
        let old = d.mem_register(r.addr(), LEN).ctx("MEM_REGISTER")?;
        let at = r.addr();
        r.unmap()?;
        let len = NonZeroUsize::MIN.saturating_add(LEN as usize - 1);
        let place =
            NonZeroUsize::new(at as usize).ok_or_else(|| Stop::Fail("mapping at 0".into()))?;
        // SAFETY: the range just unmapped (this case's own), mapped again at the same place.
        let q = unsafe {
            nix::sys::mman::mmap_anonymous(
                Some(place),
                len,
                rw,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_FIXED,
            )
        }
        .ctx("mmap MAP_FIXED")?;
        let again = Anon {
            ptr: q,
            len: LEN as usize,
            mapped: true,
        };
        let new = d.mem_register(again.addr(), LEN).ctx(&format!(
            "round {round}: MEM_REGISTER of the range mapped again"
        ))?;
        let p = d.ptr_attrs(again.addr() + 8).ctx("PTR_ATTRS")?;
        check!(
            p.handle == new && p.ptr_flags == REGISTERED,
            "round {round}: PTR_ATTRS names handle {} (flags {:#x}), wanted the new {new}",
            p.handle,
            p.ptr_flags
        );
        eventually("the old registration revoked", || {
            Ok(d.mem_query(old).err() == Some(Errno::ENOENT))
        })?;
        d.mem_query(new).ctx("the new registration stays")?;
        d.mem_free(new).ctx("MEM_FREE")?;
        drop(again);
    }
    eventually("the pins gone", || Ok(vm_pin_kib()? == pin0))?;
    Ok(())
}

/// After `fork`, the parent's registration still sees the parent's pages (the child writes
/// its copy), and with MADV_DONTFORK the child has no mapping there at all.
fn register_fork_keeps_the_parents_pages() -> TestResult {
    let d = open()?;
    let g = sim_gpu(&d)?;
    let r = Anon::new(LEN, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
    r.write(0, LEN, 31);
    let h = d.mem_register(r.addr(), LEN).ctx("MEM_REGISTER")?;
    d.mem_gpu(true, h, g).ctx("MEM_MAP_GPU")?;
    let (b, mb) = target(&d, g)?;
    child_checks("the child writes its copy of the range", || {
        r.write(0, LEN, 32);
        r.wrong(0, LEN, 32) == 0
    })?;
    r.write(0, LEN / 2, 33);
    d.ce_copy(g, b, 0, h, 0, LEN).ctx("CE_COPY after fork")?;
    let bad = map_wrong(&mb, 0, LEN / 2, 33);
    check!(
        bad == 0,
        "{bad} bytes the parent wrote after fork did not reach the engine"
    );
    let tail: u64 = (LEN / 2..LEN)
        .filter(|&i| mb.read(i as usize) != pattern::byte_at(31, i))
        .count() as u64;
    check!(
        tail == 0,
        "{tail} bytes of the parent's pages changed by the child's writes"
    );
    // SAFETY: the mapping this case owns; the advice changes only what a fork copies.
    unsafe { madvise(r.ptr, r.len, MmapAdvise::MADV_DONTFORK) }.ctx("MADV_DONTFORK")?;
    let addr = r.addr();
    child_checks("the child has no mapping of a MADV_DONTFORK range", || {
        let mut v = [0u8; 1];
        // SAFETY: mincore only reports on the range (ENOMEM where nothing is mapped).
        let rc = unsafe { nix::libc::mincore(addr as *mut _, PAGE as usize, v.as_mut_ptr()) };
        rc == -1 && Errno::last() == Errno::ENOMEM
    })?;
    map_write(&mb, 0, LEN, 34);
    d.ce_copy(g, h, 0, b, 0, LEN)
        .ctx("CE_COPY into the registration")?;
    check!(
        r.wrong(0, LEN, 34) == 0,
        "the parent does not read what the engine wrote"
    );
    d.mem_free(h).ctx("MEM_FREE")?;
    Ok(())
}

/// A shared file mapping (a memfd) registered, then the file truncated to 0: the registration
/// keeps the pages it pinned (the engine reads the old bytes) until MEM_FREE.
fn register_file_truncated_under_it() -> TestResult {
    let d = open()?;
    let g = sim_gpu(&d)?;
    let pin0 = vm_pin_kib()?;
    let fd = nix::sys::memfd::memfd_create(c"ruvm-register", nix::sys::memfd::MFdFlags::empty())
        .ctx("memfd_create")?;
    nix::unistd::ftruncate(&fd, LEN as i64).ctx("ftruncate")?;
    let r = Anon::of_file(&fd, MapFlags::MAP_SHARED)?;
    r.write(0, LEN, 41);
    let h = d
        .mem_register(r.addr(), LEN)
        .ctx("MEM_REGISTER of a file")?;
    d.mem_gpu(true, h, g).ctx("MEM_MAP_GPU")?;
    let (b, mb) = target(&d, g)?;
    nix::unistd::ftruncate(&fd, 0).ctx("ftruncate to 0")?;
    d.ce_copy(g, b, 0, h, 0, LEN)
        .ctx("CE_COPY after the truncation")?;
    let bad = map_wrong(&mb, 0, LEN, 41);
    check!(
        bad == 0,
        "{bad} bytes of the truncated file's pinned pages changed"
    );
    check!(
        vm_pin_kib()? == pin0 + LEN / 1024,
        "VmPin after the truncation: {} KiB",
        vm_pin_kib()?
    );
    d.mem_free(h).ctx("MEM_FREE")?;
    check!(
        vm_pin_kib()? == pin0,
        "VmPin after MEM_FREE: {} KiB",
        vm_pin_kib()?
    );
    drop(r);
    Ok(())
}

/// A private writable mapping of a file registered: the engine's writes land in the
/// process's own copies of the pages, never in the file (whose bytes read back unchanged).
fn register_private_file_mapping_never_writes_the_file() -> TestResult {
    use std::os::unix::fs::FileExt;
    let d = open()?;
    let g = sim_gpu(&d)?;
    let fd = nix::sys::memfd::memfd_create(c"ruvm-private", nix::sys::memfd::MFdFlags::empty())
        .ctx("memfd_create")?;
    let file = std::fs::File::from(fd);
    let bytes: Vec<u8> = (0..LEN).map(|i| pattern::byte_at(51, i)).collect();
    file.write_all_at(&bytes, 0).ctx("write the file")?;
    let r = Anon::of_file(&file, MapFlags::MAP_PRIVATE)?;
    let h = d
        .mem_register(r.addr(), LEN)
        .ctx("MEM_REGISTER of a private mapping")?;
    d.mem_gpu(true, h, g).ctx("MEM_MAP_GPU")?;
    let (b, mb) = target(&d, g)?;
    map_write(&mb, 0, LEN, 52);
    d.ce_copy(g, h, 0, b, 0, LEN)
        .ctx("CE_COPY into the registration")?;
    check!(
        r.wrong(0, LEN, 52) == 0,
        "the process does not read what the engine wrote"
    );
    let mut back = vec![0u8; LEN as usize];
    file.read_exact_at(&mut back, 0).ctx("read the file")?;
    let changed = back.iter().zip(&bytes).filter(|(a, b)| a != b).count();
    check!(
        changed == 0,
        "{changed} bytes of the file changed under a private mapping"
    );
    d.mem_free(h).ctx("MEM_FREE")?;
    Ok(())
}

/// An unprivileged process (no CAP_IPC_LOCK) cannot pin past its RLIMIT_MEMLOCK: ENOMEM,
/// nothing left pinned, and a registration within it still works.
fn register_beyond_memlock_is_enomem() -> TestResult {
    open()?;
    child_checks("an unprivileged child is bounded by RLIMIT_MEMLOCK", || {
        let limit = 16 * PAGE;
        let Ok(c) = Ruvm::open() else { return false };
        if nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK, limit, limit)
            .is_err()
            || nix::unistd::setgid(nix::unistd::Gid::from_raw(65534)).is_err()
            || nix::unistd::setuid(nix::unistd::Uid::from_raw(65534)).is_err()
        {
            return false;
        }
        let Ok(big) = Anon::new(32 * PAGE, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE) else {
            return false;
        };
        if c.mem_register(big.addr(), 32 * PAGE) != Err(Errno::ENOMEM) {
            return false;
        }
        if vm_pin_kib().ok() != Some(0) {
            return false;
        }
        let Ok(h) = c.mem_register(big.addr(), 8 * PAGE) else {
            return false;
        };
        // 8 pinned, 8 more fit, 9 do not.
        if c.mem_register(big.addr() + 8 * PAGE, 9 * PAGE) != Err(Errno::ENOMEM) {
            return false;
        }
        c.mem_free(h).is_ok() && vm_pin_kib().ok() == Some(0)
    })
}
