// SPDX-License-Identifier: GPL-2.0

//! `/dev/ruvm` and its ioctls: the only place in ruvmctl that calls `ioctl(2)`.
//!
//! Command numbers and structures come from the uapi header (through [`crate::uapi`]); each
//! typed method fills in nothing on its own, so callers (and negative tests) control every field.

use std::{
    fs::{File, OpenOptions},
    os::fd::AsRawFd,
    path::PathBuf,
};

use nix::errno::Errno;

use crate::uapi;

/// Where the device node is: `$RUVM_DEV` or `/dev/ruvm`.
pub fn path() -> PathBuf {
    std::env::var_os("RUVM_DEV").map_or_else(|| PathBuf::from("/dev/ruvm"), PathBuf::from)
}

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

// SAFETY: generated from the uapi header, whose structures hold only __u8..__u64 fields.
unsafe impl IoctlArg for uapi::ruvm_info {}
// SAFETY: as above.
unsafe impl IoctlArg for uapi::ruvm_test_plant {}

impl Ruvm {
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

    /// Issues `cmd` with `arg` as its in/out structure.
    pub fn ioctl<T: IoctlArg>(&self, cmd: u32, arg: &mut T) -> Result<(), Errno> {
        self.ioctl_ptr(cmd, std::ptr::from_mut(arg).cast())
    }

    /// Issues `cmd` with an arbitrary argument address: for tests of bad pointers.
    ///
    /// The kernel only reads or writes memory at `arg` through its user-copy routines, so a
    /// bad address yields `EFAULT`, never undefined behaviour in this process, as long as
    /// `arg` does not point into memory this process uses for anything else.
    pub fn ioctl_ptr(&self, cmd: u32, arg: *mut std::ffi::c_void) -> Result<(), Errno> {
        // SAFETY: the descriptor is open for the life of `self`; the kernel validates `cmd`
        // and accesses `arg` only through copy_{from,to}_user (see above).
        let rc = unsafe { nix::libc::ioctl(self.file.as_raw_fd(), cmd.into(), arg) };
        Errno::result(rc).map(drop)
    }

    /// `RUVM_IOCTL_INFO` with all inputs zero.
    pub fn info(&self) -> Result<uapi::ruvm_info, Errno> {
        let mut args = uapi::ruvm_info::default();
        self.ioctl(uapi::RUVM_IOCTL_INFO, &mut args)?;
        Ok(args)
    }

    /// `RUVM_IOCTL_TEST_PLANT`.
    pub fn test_plant(&self, what: u32) -> Result<(), Errno> {
        let mut args = uapi::ruvm_test_plant {
            what,
            ..Default::default()
        };
        self.ioctl(uapi::RUVM_IOCTL_TEST_PLANT, &mut args)
    }
}

/// The NUL-terminated string in a fixed-size byte array, lossily decoded.
pub fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_string_stops_at_nul() {
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
        assert_eq!(std::mem::size_of::<uapi::ruvm_info>(), 88);
        assert_eq!(std::mem::size_of::<uapi::ruvm_test_plant>(), 24);
        assert_eq!(std::mem::align_of::<uapi::ruvm_info>(), 8);
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
