// SPDX-License-Identifier: GPL-2.0

//! Independent dma-buf parties for the sharing tests: vgem (`CONFIG_DRM_VGEM`), a DRM driver
//! with no hardware that imports dma-bufs (attaching and mapping them for its own device) and
//! attaches fences of its own to their reservation objects, and udmabuf (a memfd as a
//! dma-buf).

use std::{
    fs::{File, OpenOptions},
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
};

use nix::errno::Errno;

/// `struct drm_version`.
#[repr(C)]
#[derive(Default)]
struct DrmVersion {
    major: i32,
    minor: i32,
    patchlevel: i32,
    name_len: usize,
    name: u64,
    date_len: usize,
    date: u64,
    desc_len: usize,
    desc: u64,
}

/// `struct drm_prime_handle`.
#[repr(C)]
#[derive(Default)]
struct DrmPrimeHandle {
    handle: u32,
    flags: u32,
    fd: i32,
}

/// `struct drm_mode_create_dumb`.
#[repr(C)]
#[derive(Default)]
struct DrmCreateDumb {
    height: u32,
    width: u32,
    bpp: u32,
    flags: u32,
    handle: u32,
    pitch: u32,
    size: u64,
}

/// `struct drm_mode_map_dumb`.
#[repr(C)]
#[derive(Default)]
struct DrmMapDumb {
    handle: u32,
    pad: u32,
    offset: u64,
}

/// `struct drm_gem_close`.
#[repr(C)]
#[derive(Default)]
struct DrmGemClose {
    handle: u32,
    pad: u32,
}

/// `struct drm_vgem_fence_attach`.
#[repr(C)]
#[derive(Default)]
struct VgemFenceAttach {
    handle: u32,
    flags: u32,
    out_fence: u32,
    pad: u32,
}

/// `struct drm_vgem_fence_signal`.
#[repr(C)]
#[derive(Default)]
struct VgemFenceSignal {
    fence: u32,
    flags: u32,
}

/// `struct udmabuf_create`.
#[repr(C)]
#[derive(Default)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}

/// `VGEM_FENCE_WRITE`.
const VGEM_FENCE_WRITE: u32 = 1;
/// `UDMABUF_FLAGS_CLOEXEC`.
const UDMABUF_FLAGS_CLOEXEC: u32 = 1;

mod ioctl {
    use super::{
        DrmCreateDumb, DrmGemClose, DrmMapDumb, DrmPrimeHandle, DrmVersion, UdmabufCreate,
        VgemFenceAttach, VgemFenceSignal,
    };

    const DRM: u8 = b'd';
    /// `DRM_COMMAND_BASE`.
    const DRIVER: u8 = 0x40;

    nix::ioctl_readwrite!(drm_version, DRM, 0x00, DrmVersion);
    nix::ioctl_write_ptr!(drm_gem_close, DRM, 0x09, DrmGemClose);
    nix::ioctl_readwrite!(drm_prime_handle_to_fd, DRM, 0x2d, DrmPrimeHandle);
    nix::ioctl_readwrite!(drm_prime_fd_to_handle, DRM, 0x2e, DrmPrimeHandle);
    nix::ioctl_readwrite!(drm_mode_create_dumb, DRM, 0xb2, DrmCreateDumb);
    nix::ioctl_readwrite!(drm_mode_map_dumb, DRM, 0xb3, DrmMapDumb);
    nix::ioctl_readwrite!(vgem_fence_attach, DRM, DRIVER + 1, VgemFenceAttach);
    nix::ioctl_write_ptr!(vgem_fence_signal, DRM, DRIVER + 2, VgemFenceSignal);
    nix::ioctl_write_ptr!(udmabuf_create, b'u', 0x42, UdmabufCreate);
}

/// An open vgem device.
pub(super) struct Vgem {
    file: File,
}

impl Vgem {
    /// The vgem device among `/dev/dri/card*`, or `None` if there is none.
    pub(super) fn open() -> Option<Self> {
        let dir = std::fs::read_dir("/dev/dri").ok()?;
        for entry in dir.flatten() {
            let name = entry.file_name();
            if !name.to_string_lossy().starts_with("card") {
                continue;
            }
            let Ok(file) = OpenOptions::new().read(true).write(true).open(entry.path()) else {
                continue;
            };
            let mut buf = [0u8; 32];
            let mut v = DrmVersion {
                name_len: buf.len(),
                name: buf.as_mut_ptr() as u64,
                ..Default::default()
            };
            // SAFETY: `v` is the structure the command encodes; the kernel writes at most
            // `name_len` bytes at `name` (`buf`, borrowed for the call).
            if unsafe { ioctl::drm_version(file.as_raw_fd(), &mut v) }.is_ok()
                && buf.get(..v.name_len.min(buf.len())) == Some(b"vgem".as_slice())
            {
                return Some(Self { file });
            }
        }
        None
    }

    /// Imports dma-buf `fd` (vgem attaches and maps it for its own device): its GEM handle.
    pub(super) fn import(&self, fd: RawFd) -> Result<u32, Errno> {
        let mut a = DrmPrimeHandle {
            fd,
            ..Default::default()
        };
        // SAFETY: `a` is the structure the command encodes, borrowed for the call.
        unsafe { ioctl::drm_prime_fd_to_handle(self.file.as_raw_fd(), &mut a) }?;
        Ok(a.handle)
    }

    /// A new vgem buffer of `size` bytes (a multiple of 4096): its GEM handle.
    pub(super) fn create(&self, size: u64) -> Result<u32, Errno> {
        let mut a = DrmCreateDumb {
            height: u32::try_from(size / 4096).map_err(|_| Errno::EINVAL)?,
            width: 1024,
            bpp: 32,
            ..Default::default()
        };
        // SAFETY: `a` is the structure the command encodes, borrowed for the call.
        unsafe { ioctl::drm_mode_create_dumb(self.file.as_raw_fd(), &mut a) }?;
        Ok(a.handle)
    }

    /// Exports vgem buffer `handle` as a dma-buf (read-write, close-on-exec).
    pub(super) fn export(&self, handle: u32) -> Result<OwnedFd, Errno> {
        let mut a = DrmPrimeHandle {
            handle,
            flags: (nix::libc::O_RDWR | nix::libc::O_CLOEXEC) as u32,
            fd: -1,
        };
        // SAFETY: `a` is the structure the command encodes, borrowed for the call.
        unsafe { ioctl::drm_prime_handle_to_fd(self.file.as_raw_fd(), &mut a) }?;
        // SAFETY: the kernel installed `a.fd` for this call; this is its only owner.
        Ok(unsafe { OwnedFd::from_raw_fd(a.fd) })
    }

    /// vgem's own CPU mapping of its buffer `handle`, `len` bytes (not of an import: DRM
    /// refuses those).
    pub(super) fn map(&self, handle: u32, len: u64) -> Result<super::shared::BufMap, Errno> {
        let mut a = DrmMapDumb {
            handle,
            ..Default::default()
        };
        // SAFETY: `a` is the structure the command encodes, borrowed for the call.
        unsafe { ioctl::drm_mode_map_dumb(self.file.as_raw_fd(), &mut a) }?;
        super::shared::BufMap::new(&self.file, a.offset, len)
    }

    /// Drops GEM handle `handle` (its import goes with the last reference).
    pub(super) fn close(&self, handle: u32) -> Result<(), Errno> {
        let a = DrmGemClose { handle, pad: 0 };
        // SAFETY: `a` is the structure the command encodes, borrowed for the call.
        unsafe { ioctl::drm_gem_close(self.file.as_raw_fd(), &a) }?;
        Ok(())
    }

    /// Attaches a new vgem fence to the reservation object of `handle` (a write's, `write`):
    /// its id. vgem signals it on [`Vgem::signal`], or by itself after 10 s.
    pub(super) fn fence(&self, handle: u32, write: bool) -> Result<u32, Errno> {
        let mut a = VgemFenceAttach {
            handle,
            flags: if write { VGEM_FENCE_WRITE } else { 0 },
            ..Default::default()
        };
        // SAFETY: `a` is the structure the command encodes, borrowed for the call.
        unsafe { ioctl::vgem_fence_attach(self.file.as_raw_fd(), &mut a) }?;
        Ok(a.out_fence)
    }

    /// Signals vgem fence `fence`.
    pub(super) fn signal(&self, fence: u32) -> Result<(), Errno> {
        let a = VgemFenceSignal { fence, flags: 0 };
        // SAFETY: `a` is the structure the command encodes, borrowed for the call.
        unsafe { ioctl::vgem_fence_signal(self.file.as_raw_fd(), &a) }?;
        Ok(())
    }
}

/// A memfd of `size` bytes sealed against shrinking, and a udmabuf (a dma-buf of its pages),
/// or `None` without `/dev/udmabuf`.
pub(super) fn udmabuf(size: u64) -> Result<Option<(File, OwnedFd)>, Errno> {
    let Ok(dev) = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/udmabuf")
    else {
        return Ok(None);
    };
    let memfd = nix::sys::memfd::memfd_create(
        c"ruvm-udmabuf",
        nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING | nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
    )?;
    let memfd = File::from(memfd);
    memfd.set_len(size).map_err(|_| Errno::EIO)?;
    nix::fcntl::fcntl(
        &memfd,
        nix::fcntl::FcntlArg::F_ADD_SEALS(nix::fcntl::SealFlag::F_SEAL_SHRINK),
    )?;
    let a = UdmabufCreate {
        memfd: memfd.as_raw_fd() as u32,
        flags: UDMABUF_FLAGS_CLOEXEC,
        offset: 0,
        size,
    };
    // SAFETY: `a` is the structure the command encodes, borrowed for the call; it returns a
    // new descriptor.
    let fd = unsafe { ioctl::udmabuf_create(dev.as_raw_fd(), &a) }?;
    // SAFETY: the kernel installed `fd` for this call; this is its only owner.
    Ok(Some((memfd, unsafe { OwnedFd::from_raw_fd(fd) })))
}
