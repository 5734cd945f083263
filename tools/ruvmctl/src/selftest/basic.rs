// SPDX-License-Identifier: GPL-2.0

//! The device itself: opening, `RUVM_IOCTL_INFO`, command decoding and bad arguments.

use std::num::NonZeroUsize;

use nix::{
    errno::Errno,
    sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags},
    unistd::{setuid, Uid},
};

use super::harness::{cases, check, child_checks, expect_errno, Case, Context, Stop, TestResult};
use libruvm::{self as dev, uapi};

pub fn cases() -> Vec<Case> {
    cases![
        info_reports_abi_and_version,
        info_limits_follow_the_machine,
        info_rejects_nonzero_flags,
        info_rejects_nonzero_pad_and_reserved,
        info_bad_pointer_is_efault,
        info_readonly_argument_is_efault,
        unknown_commands_are_enotty,
        test_plant_is_gated,
        many_open_files,
        concurrent_info,
    ]
}

/// Builds an ioctl number like C's `_IOC(dir, type, nr, size)` on x86.
fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    let size = u32::try_from(size).unwrap_or(u32::MAX) & 0x3fff;
    (dir << 30) | (size << 16) | (ty << 8) | nr
}

const IOC_READ_WRITE: u32 = 3;

fn info_reports_abi_and_version() -> TestResult {
    let d = dev::Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    check!(
        info.abi_version == uapi::RUVM_ABI_VERSION,
        "abi_version {} != header's {}",
        info.abi_version,
        uapi::RUVM_ABI_VERSION
    );
    check!(
        info.version.contains(&0),
        "version string is not NUL-terminated"
    );
    let v = dev::c_string(&info.version);
    check!(
        v == libruvm::VERSION,
        "module version {v:?} != ruvmctl's {:?}",
        libruvm::VERSION
    );
    check!(
        info.features & !u64::from(uapi::RUVM_FEATURES_ALL) == 0,
        "unknown feature bits {:#x}",
        info.features
    );
    check!(
        info.flags == 0 && info.pad == 0 && info.reserved == [0; 4],
        "inputs were not echoed unchanged"
    );
    Ok(())
}

fn info_rejects_nonzero_flags() -> TestResult {
    let d = dev::Ruvm::open().ctx("open")?;
    for bit in [0, 1, 31] {
        let mut a = uapi::ruvm_info {
            flags: 1 << bit,
            ..Default::default()
        };
        expect_errno(
            d.call(libruvm::cmd::INFO, &mut a),
            Errno::EINVAL,
            &format!("flags bit {bit}"),
        )?;
    }
    Ok(())
}

/// The limits a module loaded without `max_alloc_mib`/`max_file_mib` (or with 0) reports: half
/// the machine's memory in whole MiB (`MemTotal`), at most 1 GiB per mem and 4 GiB per file; a
/// value given at load is reported as given.
fn info_limits_follow_the_machine() -> TestResult {
    let d = dev::Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    let total_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .ok_or(Stop::Fail("cannot read MemTotal".into()))?;
    const MIB: u64 = 1 << 20;
    let half = (total_kib * 1024 / 2) / MIB * MIB;
    for (param, cap, got) in [
        ("max_alloc_mib", 1024 * MIB, info.max_alloc_bytes),
        ("max_file_mib", 4096 * MIB, info.max_file_bytes),
    ] {
        // What the module was loaded with, as the guest's init exports it (7.2's Rust modules
        // have no parameter files in sysfs).
        let args = std::env::var("RUVM_MODARGS").map_err(|_| {
            Stop::Skip("RUVM_MODARGS unknown (the test guest's init sets it)".into())
        })?;
        let given: u64 = args
            .split_whitespace()
            .find_map(|a| a.strip_prefix(&format!("{param}=")))
            .map_or(Ok(0), str::parse)
            .map_err(|e| Stop::Fail(format!("{param}: {e}")))?;
        let want = if given == 0 {
            half.min(cap)
        } else {
            given * MIB
        };
        check!(
            got == want,
            "{param}={given}: the module reports {got} bytes, wanted {want} (MemTotal {total_kib} KiB)"
        );
    }
    Ok(())
}

fn info_rejects_nonzero_pad_and_reserved() -> TestResult {
    super::abi::sweep(super::abi::Probe::Zeroes, Some("RUVM_IOCTL_INFO"))
}

/// An anonymous mapping of `pages` pages with `prot`, unmapped on drop.
struct Mapping {
    ptr: std::ptr::NonNull<std::ffi::c_void>,
    len: NonZeroUsize,
}

impl Mapping {
    fn new(len: usize, prot: ProtFlags) -> Result<Self, Stop> {
        let len = NonZeroUsize::new(len).ok_or_else(|| Stop::Fail("zero-length mapping".into()))?;
        // SAFETY: a fresh anonymous private mapping aliases nothing in this process.
        let ptr = unsafe { mmap_anonymous(None, len, prot, MapFlags::MAP_PRIVATE) }.ctx("mmap")?;
        Ok(Self { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `new` and nothing refers to it any more.
        let _ = unsafe { munmap(self.ptr, self.len.get()) };
    }
}

fn info_bad_pointer_is_efault() -> TestResult {
    let d = dev::Ruvm::open().ctx("open")?;
    // SAFETY: NULL faults.
    let r = unsafe { d.ioctl_ptr(uapi::RUVM_IOCTL_INFO, std::ptr::null_mut()) };
    expect_errno(r, Errno::EFAULT, "NULL argument")?;
    let guard = Mapping::new(4096, ProtFlags::PROT_NONE)?;
    // SAFETY: a PROT_NONE page faults.
    let r = unsafe { d.ioctl_ptr(uapi::RUVM_IOCTL_INFO, guard.ptr.as_ptr()) };
    expect_errno(r, Errno::EFAULT, "PROT_NONE argument")?;
    // A kernel address is never a valid user pointer.
    let kernel = 0xffff_8880_0000_0000_usize as *mut std::ffi::c_void;
    // SAFETY: a kernel address faults.
    let r = unsafe { d.ioctl_ptr(uapi::RUVM_IOCTL_INFO, kernel) };
    expect_errno(r, Errno::EFAULT, "kernel address")?;
    Ok(())
}

fn info_readonly_argument_is_efault() -> TestResult {
    let d = dev::Ruvm::open().ctx("open")?;
    // Zero-filled, so the module's read and validation succeed and only the write-back fails.
    let ro = Mapping::new(4096, ProtFlags::PROT_READ)?;
    // SAFETY: the page is mapped read-only and used by nothing else: the kernel can read it
    // and its write faults.
    let r = unsafe { d.ioctl_ptr(uapi::RUVM_IOCTL_INFO, ro.ptr.as_ptr()) };
    expect_errno(r, Errno::EFAULT, "read-only argument")
}

fn unknown_commands_are_enotty() -> TestResult {
    let d = dev::Ruvm::open().ctx("open")?;
    let mut buf = [0u8; 256];
    let p = buf.as_mut_ptr().cast();
    let info_size = std::mem::size_of::<uapi::ruvm_info>();
    let magic = uapi::RUVM_IOCTL_MAGIC;
    let cases = [
        (
            "unused number 0x7f",
            ioc(IOC_READ_WRITE, magic, 0x7f, info_size),
        ),
        ("INFO with a smaller size", ioc(IOC_READ_WRITE, magic, 0, 8)),
        (
            "INFO with a larger size",
            ioc(IOC_READ_WRITE, magic, 0, info_size + 8),
        ),
        ("INFO read-only direction", ioc(2, magic, 0, info_size)),
        (
            "INFO with another magic",
            ioc(IOC_READ_WRITE, magic + 1, 0, info_size),
        ),
        ("no-argument command", ioc(0, magic, 0, 0)),
    ];
    for (what, cmd) in cases {
        // SAFETY: `buf` is 256 bytes, more than any of these commands encodes, and used by
        // nothing else during the call.
        let r = unsafe { d.ioctl_ptr(cmd, p) };
        expect_errno(r, Errno::ENOTTY, what)?;
    }
    check!(
        buf.iter().all(|&b| b == 0),
        "a refused command wrote to its argument"
    );
    Ok(())
}

fn test_plant_is_gated() -> TestResult {
    let d = dev::Ruvm::open().ctx("open")?;
    if d.info().ctx("INFO")?.test_ioctls == 0 {
        return expect_errno(
            d.test_plant(uapi::ruvm_plant_RUVM_PLANT_WARN),
            Errno::ENOSYS,
            "plant with test ioctls off",
        );
    }
    if !Uid::effective().is_root() {
        return Err(Stop::Skip(
            "needs root to check the gate from both sides".into(),
        ));
    }
    let mut a = uapi::ruvm_test_plant {
        what: 0,
        ..Default::default()
    };
    expect_errno(
        d.call(libruvm::cmd::TEST_PLANT, &mut a),
        Errno::EINVAL,
        "plant what=0",
    )?;
    // Unknown flags and non-zero reserved fields: the ABI table (`abi_*`).
    // Without CAP_SYS_ADMIN: a child that gave up root must get EPERM.
    child_checks("unprivileged plant was not refused with EPERM", || {
        setuid(Uid::from_raw(65534)).is_ok()
            && d.test_plant(uapi::ruvm_plant_RUVM_PLANT_WARN) == Err(Errno::EPERM)
    })
}

fn many_open_files() -> TestResult {
    let files: Vec<dev::Ruvm> = (0..64)
        .map(|_| dev::Ruvm::open())
        .collect::<Result<_, _>>()
        .ctx("open")?;
    for (i, f) in files.iter().enumerate() {
        f.info().ctx(&format!("INFO on file {i}"))?;
    }
    Ok(())
}

fn concurrent_info() -> TestResult {
    let d = std::sync::Arc::new(dev::Ruvm::open().ctx("open")?);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let d = d.clone();
            std::thread::spawn(move || (0..500).try_for_each(|_| d.info().map(drop)))
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| Stop::Fail("thread panicked".into()))?
            .ctx("INFO in a thread")?;
    }
    Ok(())
}
