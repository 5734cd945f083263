// SPDX-License-Identifier: GPL-2.0

//! The kernel's fences as file descriptors: sync_file (C header:
//! `include/uapi/linux/sync_file.h`) and sw_sync (`drivers/dma-buf/sw_sync.c`, a timeline
//! that user space advances, under debugfs).
//!
//! ruvm exports an event's point as a sync_file ([`crate::Ruvm::event_export`]) and waits for
//! any driver's ([`crate::op::wait_fd`]); [`info`] reads what a sync_file holds, [`wait`]
//! polls it, and [`SwSyncTimeline`] makes fences of another driver that signal when the caller
//! says so. The structures are the headers' own, by hand: neither header is in the uapi one
//! bindgen reads.
//!
//! ```no_run
//! use libruvm::sync_file::{self, SwSyncTimeline};
//!
//! let tl = SwSyncTimeline::open()?;
//! let fence = tl.create_fence(1, "held")?;
//! assert_eq!(sync_file::info(&fence)?.status, 0);
//! tl.inc(1)?;
//! assert_eq!(sync_file::info(&fence)?.status, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{
    fs::{File, OpenOptions},
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use nix::errno::Errno;

use crate::c_string;

/// `struct sync_fence_info`: one fence of a sync_file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncFenceInfo {
    /// Its timeline's name (`dma_fence_timeline_name`).
    pub obj_name: [u8; 32],
    /// Its driver's name.
    pub driver_name: [u8; 32],
    /// 0 pending, 1 signalled, a negative errno: signalled with that error.
    pub status: i32,
    /// Must be 0.
    pub flags: u32,
    /// When it signalled (CLOCK_MONOTONIC, ns); 0 while pending.
    pub timestamp_ns: u64,
}

/// `struct sync_file_info`: `SYNC_IOC_FILE_INFO`'s argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncFileInfo {
    /// The sync_file's name.
    pub name: [u8; 32],
    /// 0 pending, 1 signalled, a negative errno.
    pub status: i32,
    /// Must be 0.
    pub flags: u32,
    /// In: room at `sync_fence_info` (0: only count); out: the fences.
    pub num_fences: u32,
    /// Must be 0.
    pub pad: u32,
    /// User pointer to `num_fences` [`SyncFenceInfo`].
    pub sync_fence_info: u64,
}

/// `struct sync_merge_data`: `SYNC_IOC_MERGE`'s argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncMergeData {
    /// The new sync_file's name.
    pub name: [u8; 32],
    /// The other sync_file.
    pub fd2: i32,
    /// Out: the new sync_file.
    pub fence: i32,
    /// Must be 0.
    pub flags: u32,
    /// Must be 0.
    pub pad: u32,
}

/// `struct sw_sync_create_fence_data`: `SW_SYNC_IOC_CREATE_FENCE`'s argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SwSyncCreateFenceData {
    /// The timeline value at which the fence signals.
    pub value: u32,
    /// The fence's name.
    pub name: [u8; 32],
    /// Out: the new sync_file.
    pub fence: i32,
}

const _: () = {
    assert!(std::mem::size_of::<SyncFenceInfo>() == 80);
    assert!(std::mem::size_of::<SyncFileInfo>() == 56);
    assert!(std::mem::size_of::<SyncMergeData>() == 48);
    assert!(std::mem::size_of::<SwSyncCreateFenceData>() == 40);
};

/// The command numbers, as the C headers define them.
mod ioctl {
    use super::{SwSyncCreateFenceData, SyncFileInfo, SyncMergeData};

    const SYNC_IOC_MAGIC: u8 = b'>';
    const SW_SYNC_IOC_MAGIC: u8 = b'W';

    nix::ioctl_readwrite!(
        /// `SYNC_IOC_MERGE`.
        sync_ioc_merge,
        SYNC_IOC_MAGIC,
        3,
        SyncMergeData
    );
    nix::ioctl_readwrite!(
        /// `SYNC_IOC_FILE_INFO`.
        sync_ioc_file_info,
        SYNC_IOC_MAGIC,
        4,
        SyncFileInfo
    );
    nix::ioctl_readwrite!(
        /// `SW_SYNC_IOC_CREATE_FENCE`.
        sw_sync_ioc_create_fence,
        SW_SYNC_IOC_MAGIC,
        0,
        SwSyncCreateFenceData
    );
    nix::ioctl_write_ptr!(
        /// `SW_SYNC_IOC_INC`.
        sw_sync_ioc_inc,
        SW_SYNC_IOC_MAGIC,
        1,
        u32
    );
}

/// A fence of a sync_file, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceInfo {
    /// Its timeline's name (after it signalled the kernel says `signaled-timeline`).
    pub timeline: String,
    /// Its driver's name (after it signalled: `detached-driver`).
    pub driver: String,
    /// 0 pending, 1 signalled, a negative errno.
    pub status: i32,
    /// When it signalled (CLOCK_MONOTONIC, ns); 0 while pending.
    pub timestamp_ns: u64,
}

/// What a sync_file holds (`SYNC_IOC_FILE_INFO`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// Its name: the merge's, or `driver-timeline<context>-<seqno>` of its fence, cut at 31
    /// bytes.
    pub name: String,
    /// 0 pending, 1 signalled, a negative errno (the first fence's error).
    pub status: i32,
    /// Its fences.
    pub fences: Vec<FenceInfo>,
}

impl Info {
    /// Its one fence, if it holds exactly one (a ruvm export does).
    pub fn fence(&self) -> Option<&FenceInfo> {
        match self.fences.as_slice() {
            [f] => Some(f),
            _ => None,
        }
    }
}

/// A name into a fixed array, cut to leave its NUL.
fn c_name(name: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    let n = name.len().min(out.len() - 1);
    out[..n].copy_from_slice(&name.as_bytes()[..n]);
    out
}

/// `SYNC_IOC_FILE_INFO` of `fd` with room for `room` fences.
fn file_info(fd: i32, room: &mut [SyncFenceInfo]) -> Result<SyncFileInfo, Errno> {
    let mut a = SyncFileInfo {
        num_fences: u32::try_from(room.len()).map_err(|_| Errno::EINVAL)?,
        sync_fence_info: room.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `a` is the structure the command's number encodes; the kernel writes at most
    // `num_fences` entries at `sync_fence_info`, which is `room`, borrowed for the call.
    unsafe { ioctl::sync_ioc_file_info(fd, &mut a) }?;
    Ok(a)
}

/// What sync_file `fd` holds. `EINVAL` (or `ENOTTY`) if it is not a sync_file.
pub fn info(fd: &impl AsFd) -> Result<Info, Errno> {
    let raw = fd.as_fd().as_raw_fd();
    // First the count, then every fence (a sync_file's fences never change).
    let n = file_info(raw, &mut [])?.num_fences;
    let mut room = vec![SyncFenceInfo::default(); n as usize];
    let a = file_info(raw, &mut room)?;
    room.truncate(a.num_fences as usize);
    Ok(Info {
        name: c_string(&a.name),
        status: a.status,
        fences: room
            .iter()
            .map(|f| FenceInfo {
                timeline: c_string(&f.obj_name),
                driver: c_string(&f.driver_name),
                status: f.status,
                timestamp_ns: f.timestamp_ns,
            })
            .collect(),
    })
}

/// `SYNC_IOC_MERGE`: a new sync_file that signals when both `a` and `b` have.
pub fn merge(a: &impl AsFd, b: &impl AsFd, name: &str) -> Result<OwnedFd, Errno> {
    let mut m = SyncMergeData {
        name: c_name(name),
        fd2: b.as_fd().as_raw_fd(),
        ..Default::default()
    };
    // SAFETY: `m` is the structure the command's number encodes, borrowed for the call.
    unsafe { ioctl::sync_ioc_merge(a.as_fd().as_raw_fd(), &mut m) }?;
    // SAFETY: the kernel installed `m.fence` for this call; this is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(m.fence) })
}

/// Waits until sync_file `fd` has signalled (`poll` for `POLLIN`), at most `timeout`: whether
/// it did. Signals that interrupt the wait do not shorten it.
pub fn wait(fd: &impl AsFd, timeout: Duration) -> Result<bool, Errno> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        let mut p = nix::libc::pollfd {
            fd: fd.as_fd().as_raw_fd(),
            events: nix::libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, borrowed for the call.
        let rc = unsafe { nix::libc::poll(&mut p, 1, ms) };
        match Errno::result(rc) {
            Ok(0) if left.is_zero() => return Ok(false),
            Ok(0) => continue,
            Ok(_) => return Ok(p.revents & nix::libc::POLLIN != 0),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Where sw_sync lives (debugfs; `CONFIG_SW_SYNC`, which Debian's kernels lack).
pub const SW_SYNC_PATH: &str = "/sys/kernel/debug/sync/sw_sync";

/// A sw_sync timeline: one per open of [`SW_SYNC_PATH`]. Its value starts at 0; a fence of
/// value v signals once [`inc`](Self::inc) brought the timeline to v. Closing it (drop)
/// signals the fences still pending with `ENOENT`.
pub struct SwSyncTimeline {
    file: File,
}

impl SwSyncTimeline {
    /// Opens a new timeline.
    pub fn open() -> std::io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(SW_SYNC_PATH)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{SW_SYNC_PATH}: {e}")))?;
        Ok(Self { file })
    }

    /// A new sync_file (close-on-exec) whose fence signals when the timeline reaches `value`.
    pub fn create_fence(&self, value: u32, name: &str) -> Result<OwnedFd, Errno> {
        let mut a = SwSyncCreateFenceData {
            value,
            name: c_name(name),
            fence: -1,
        };
        // SAFETY: `a` is the structure the command's number encodes, borrowed for the call.
        unsafe { ioctl::sw_sync_ioc_create_fence(self.file.as_raw_fd(), &mut a) }?;
        // SAFETY: the kernel installed `a.fence` for this call; this is its only owner.
        Ok(unsafe { OwnedFd::from_raw_fd(a.fence) })
    }

    /// Advances the timeline by `by`, signalling the fences it reaches.
    pub fn inc(&self, by: u32) -> Result<(), Errno> {
        // SAFETY: the kernel reads one u32 at the pointer, which is `by`, borrowed for the call.
        unsafe { ioctl::sw_sync_ioc_inc(self.file.as_raw_fd(), &by) }?;
        Ok(())
    }
}

impl AsFd for SwSyncTimeline {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_numbers_are_the_c_headers() {
        // The values C computes from the headers' _IOWR/_IOW lines.
        let size = std::mem::size_of::<SyncMergeData>();
        assert_eq!(nix::request_code_readwrite!(b'>', 3, size), 0xc030_3e03);
        let size = std::mem::size_of::<SyncFileInfo>();
        assert_eq!(nix::request_code_readwrite!(b'>', 4, size), 0xc038_3e04);
        let size = std::mem::size_of::<SwSyncCreateFenceData>();
        assert_eq!(nix::request_code_readwrite!(b'W', 0, size), 0xc028_5700);
        let size = std::mem::size_of::<u32>();
        assert_eq!(nix::request_code_write!(b'W', 1, size), 0x4004_5701);
    }

    #[test]
    fn names_keep_their_nul() {
        assert_eq!(&c_name("abc")[..4], b"abc\0");
        let long = c_name(&"x".repeat(40));
        assert_eq!(long[31], 0);
        assert_eq!(long[30], b'x');
    }

    #[test]
    fn a_pipe_is_not_a_sync_file() {
        let (r, _w) = nix::unistd::pipe().expect("pipe");
        assert!(info(&r).is_err());
    }

    #[test]
    fn wait_on_a_pipe_times_out_then_sees_data() {
        let (r, w) = nix::unistd::pipe().expect("pipe");
        assert_eq!(wait(&r, Duration::from_millis(10)), Ok(false));
        nix::unistd::write(&w, b"x").expect("write");
        assert_eq!(wait(&r, Duration::from_millis(10)), Ok(true));
    }
}
