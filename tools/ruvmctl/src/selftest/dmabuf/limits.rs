// SPDX-License-Identifier: GPL-2.0

//! dma-bufs and the file's limit (`max_file_mib`), run where the limit is small: a freed mem
//! whose buffer lives keeps counting, and an import counts in the importing file.

use std::os::fd::AsRawFd;

use nix::errno::Errno;

use super::setup;
use crate::selftest::harness::{check, expect_errno, Context, Stop, TestResult};
use crate::selftest::shared::live;
use libruvm::Ruvm;

/// The file limit, if the module runs with one of at most 256 MiB (else the case skips).
fn small_limit(d: &Ruvm) -> Result<u64, Stop> {
    let limit = d.info().ctx("INFO")?.max_file_bytes;
    if limit == 0 || limit > 256 << 20 {
        return Err(Stop::Skip("needs max_file_mib at most 256".into()));
    }
    Ok(limit)
}

/// A mem freed while its dma-buf lives keeps counting in its file's limit (`max_file_mib`):
/// with four quarters of the limit allocated, exported and freed (the buffers kept), a fifth
/// allocation is `ENOSPC`; once the buffers are closed it succeeds. Run where the limit is
/// small (`max_file_mib` at most 256).
pub(super) fn dmabuf_kept_chunks_count_in_the_file_limit() -> TestResult {
    let d = setup()?;
    let limit = small_limit(&d)?;
    let quarter = limit / 4;
    let mut bufs = Vec::new();
    for _ in 0..4 {
        let h = d
            .mem_alloc(quarter, 0, 0)
            .ctx("MEM_ALLOC a quarter")?
            .handle;
        bufs.push(d.mem_export_dmabuf(h).ctx("MEM_EXPORT_DMABUF")?);
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    expect_errno(
        d.mem_alloc(quarter, 0, 0).map(|_| ()),
        Errno::ENOSPC,
        "a fifth quarter with four freed mems' buffers alive",
    )?;
    drop(bufs);
    let h = d
        .mem_alloc(quarter, 0, 0)
        .ctx("MEM_ALLOC once the buffers are closed")?
        .handle;
    d.mem_free(h).ctx("MEM_FREE")?;
    Ok(())
}

/// An imported dma-buf counts its size in the importing file's limit: a file holding three
/// quarters of its limit cannot import a buffer of half of it (`ENOSPC`, the audit's counts
/// unchanged: nothing made); with
/// that freed it can, and then cannot allocate past the rest.
pub(super) fn dmabuf_import_counts_in_the_file_limit() -> TestResult {
    let d = setup()?;
    let limit = small_limit(&d)?;
    let half = limit / 2;
    let h = d
        .mem_alloc(half, 0, 0)
        .ctx("MEM_ALLOC of half the limit")?
        .handle;
    let buf = d.mem_export_dmabuf(h).ctx("MEM_EXPORT_DMABUF")?;
    let other = Ruvm::open().ctx("open a second file")?;
    let most = other
        .mem_alloc(limit / 4 * 3, 0, 0)
        .ctx("MEM_ALLOC of three quarters in the second file")?
        .handle;
    let before = live(&other)?;
    expect_errno(
        other.mem_import_dmabuf(buf.as_raw_fd()).map(|_| ()),
        Errno::ENOSPC,
        "an import of half the limit into a file holding three quarters",
    )?;
    let after = live(&other)?;
    check!(
        after == before,
        "the refused import changed the audit:\n# before {before:?}\n# after  {after:?}"
    );
    other.mem_free(most).ctx("MEM_FREE")?;
    let import = other
        .mem_import_dmabuf(buf.as_raw_fd())
        .ctx("MEM_IMPORT_DMABUF once there is room")?;
    expect_errno(
        other.mem_alloc(half + (64 << 10), 0, 0).map(|_| ()),
        Errno::ENOSPC,
        "half the limit and 64 KiB beside an import of half",
    )?;
    other
        .mem_free(import.handle)
        .ctx("MEM_FREE of the import")?;
    let h2 = other
        .mem_alloc(half + (64 << 10), 0, 0)
        .ctx("MEM_ALLOC once the import is freed")?
        .handle;
    other.mem_free(h2).ctx("MEM_FREE")?;
    drop(buf);
    d.mem_free(h).ctx("MEM_FREE of the exported mem")
}
