// SPDX-License-Identifier: GPL-2.0

//! `ruvmctl dmabuf`: a mem as a dma-buf for another process or device
//! (`RUVM_IOCTL_MEM_EXPORT_DMABUF`), a dma-buf of ruvm's as a mem of this file
//! (`RUVM_IOCTL_MEM_IMPORT_DMABUF`), and the fences a buffer's users wait for
//! (`DMA_BUF_IOCTL_EXPORT_SYNC_FILE`).

use std::os::fd::BorrowedFd;

use anyhow::{bail, Context as _, Result};
use libruvm::{dmabuf, sync_file, Ruvm};
use serde::Serialize;

use crate::output::{fields, Report};

/// `dmabuf export H --run CMD`: CMD runs with the buffer's descriptor inherited, its number
/// in `RUVM_DMABUF_FD`.
pub fn export_run(d: &Ruvm, handle: u64, run: &str) -> Result<super::share::ExportRun> {
    let fd = d.mem_export_dmabuf(handle).context("MEM_EXPORT_DMABUF")?;
    let (fd, status) = super::share::run_with(fd, "RUVM_DMABUF_FD", run)?;
    Ok(super::share::ExportRun {
        exported: handle,
        fd,
        status,
    })
}

/// `dmabuf import FD`: the new mem.
#[derive(Serialize)]
pub struct Imported {
    pub handle: u64,
    pub size: u64,
    pub mmap_offset: u64,
}

impl Report for Imported {
    fn render(&self) -> String {
        fields([
            ("handle", self.handle.to_string()),
            ("size", self.size.to_string()),
            ("mmap offset", format!("{:#x}", self.mmap_offset)),
        ])
    }
}

/// `dmabuf import FD` (`RUVM_IOCTL_MEM_IMPORT_DMABUF`) of an inherited descriptor.
pub fn import(d: &Ruvm, fd: i32) -> Result<Imported> {
    let m = d.mem_import_dmabuf(fd).context("MEM_IMPORT_DMABUF")?;
    Ok(Imported {
        handle: m.handle,
        size: m.size,
        mmap_offset: m.mmap_offset,
    })
}

/// `dmabuf fences FD`: the sync_file's status and fences.
#[derive(Serialize)]
pub struct Fences {
    /// 0 pending, 1 signalled, -errno.
    pub status: i32,
    /// Each fence: driver, timeline and status.
    pub fences: Vec<(String, String, i32)>,
}

impl Report for Fences {
    fn render(&self) -> String {
        let mut rows = vec![("status", super::stream::status_text(self.status))];
        for (driver, timeline, status) in &self.fences {
            rows.push((
                "fence",
                format!(
                    "{driver} {timeline} {}",
                    super::stream::status_text(*status)
                ),
            ));
        }
        fields(rows)
    }
}

/// `dmabuf fences FD [--write]`.
pub fn fences(fd: i32, write: bool) -> Result<Fences> {
    if fd < 0 {
        bail!("{fd} is not a descriptor");
    }
    // SAFETY: the descriptor is borrowed for the calls only; it is the caller's (inherited).
    let buf = unsafe { BorrowedFd::borrow_raw(fd) };
    let file = dmabuf::export_sync_file(&buf, write).context("DMA_BUF_IOCTL_EXPORT_SYNC_FILE")?;
    let info = sync_file::info(&file).context("SYNC_IOC_FILE_INFO")?;
    Ok(Fences {
        status: info.status,
        fences: info
            .fences
            .into_iter()
            .map(|f| (f.driver, f.timeline, f.status))
            .collect(),
    })
}
