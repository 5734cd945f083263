// SPDX-License-Identifier: GPL-2.0

//! The dma-buf commands any dma-buf answers (`linux/dma-buf.h`): the fences of its reservation
//! object as a sync_file (`DMA_BUF_IOCTL_EXPORT_SYNC_FILE`), and CPU access begin/end
//! (`DMA_BUF_IOCTL_SYNC`).

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

/// `struct dma_buf_export_sync_file`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExportSyncFile {
    /// `DMA_BUF_SYNC_READ` (the fences a reader waits for: writers') or `DMA_BUF_SYNC_WRITE`
    /// (all).
    pub flags: u32,
    /// (out) the sync_file.
    pub fd: i32,
}

/// `struct dma_buf_sync`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Sync {
    /// `DMA_BUF_SYNC_START` or `_END`, with `_READ`, `_WRITE` or both.
    pub flags: u64,
}

/// `DMA_BUF_SYNC_READ`.
pub const SYNC_READ: u32 = 1;
/// `DMA_BUF_SYNC_WRITE`.
pub const SYNC_WRITE: u32 = 2;
/// `DMA_BUF_SYNC_END`.
const SYNC_END: u64 = 4;

mod ioctl {
    use super::{ExportSyncFile, Sync};

    const DMA_BUF_BASE: u8 = b'b';

    nix::ioctl_write_ptr!(
        /// `DMA_BUF_IOCTL_SYNC`.
        dma_buf_ioctl_sync,
        DMA_BUF_BASE,
        0,
        Sync
    );
    nix::ioctl_readwrite!(
        /// `DMA_BUF_IOCTL_EXPORT_SYNC_FILE`.
        dma_buf_ioctl_export_sync_file,
        DMA_BUF_BASE,
        2,
        ExportSyncFile
    );
}

/// A sync_file of the fences in dma-buf `buf`'s reservation object that an access waits for:
/// a write (`write`) waits for all, a read for writers'. Signalled at once if there are none.
pub fn export_sync_file(buf: &impl AsFd, write: bool) -> Result<OwnedFd, Errno> {
    let mut a = ExportSyncFile {
        flags: if write { SYNC_WRITE } else { SYNC_READ },
        fd: -1,
    };
    // SAFETY: `a` is the structure the command's number encodes, borrowed for the call.
    unsafe { ioctl::dma_buf_ioctl_export_sync_file(buf.as_fd().as_raw_fd(), &mut a) }?;
    // SAFETY: the kernel installed `a.fd` for this call; this is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(a.fd) })
}

/// `DMA_BUF_IOCTL_SYNC`: begins (`end` false) or ends CPU access to dma-buf `buf` for reading
/// and writing. A begin waits for the device work the access must follow.
pub fn cpu_access(buf: &impl AsFd, end: bool) -> Result<(), Errno> {
    let mut flags = u64::from(SYNC_READ | SYNC_WRITE);
    if end {
        flags |= SYNC_END;
    }
    let a = Sync { flags };
    // SAFETY: `a` is the structure the command's number encodes, borrowed for the call.
    unsafe { ioctl::dma_buf_ioctl_sync(buf.as_fd().as_raw_fd(), &a) }?;
    Ok(())
}

const _: () = {
    assert!(std::mem::size_of::<ExportSyncFile>() == 8);
    assert!(std::mem::size_of::<Sync>() == 8);
};
