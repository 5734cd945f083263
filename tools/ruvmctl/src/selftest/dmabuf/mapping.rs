// SPDX-License-Identifier: GPL-2.0

//! A dma-buf's CPU mapping keeps its pages: every page is mapped by the `mmap` call itself
//! (`VM_PFNMAP`, no fault handler), so what would take them out is refused and the bytes stay.

use nix::{
    errno::Errno,
    sys::mman::{madvise, MmapAdvise},
};

use super::{bad, patterned, setup, SIZE};
use crate::selftest::harness::{check, expect_errno, Context, Stop, TestResult};
use crate::selftest::shared::BufMap;

/// `MADV_DONTNEED` and `MADV_FREE` on the buffer's mapping are `EINVAL` (the kernel's rule for
/// `VM_PFNMAP`) and every byte stays the mem's. Skipped (said) on a kernel without madvise
/// (`ENOSYS`: `CONFIG_ADVISE_SYSCALLS` off).
pub(super) fn dmabuf_mmap_pages_cannot_be_dropped() -> TestResult {
    let d = setup()?;
    let seed = 0xd1d;
    let (b, bmap) = patterned(&d, seed)?;
    let buf = d.mem_export_dmabuf(b).ctx("MEM_EXPORT_DMABUF")?;
    let map = BufMap::new(&buf, 0, SIZE).ctx("mmap of the dma-buf")?;
    // SAFETY: a length of 0 on a page-aligned mapping of ours: a probe that changes nothing.
    if unsafe { madvise(map.addr.cast(), 0, MmapAdvise::MADV_NORMAL) } == Err(Errno::ENOSYS) {
        return Err(Stop::Skip(
            "no madvise in this kernel (CONFIG_ADVISE_SYSCALLS)".into(),
        ));
    }
    for (advice, name) in [
        (MmapAdvise::MADV_DONTNEED, "MADV_DONTNEED"),
        (MmapAdvise::MADV_FREE, "MADV_FREE"),
    ] {
        // SAFETY: the mapping `map` owns, alive across the call; were the advice taken, the
        // case only reads the range again.
        let r = unsafe { madvise(map.addr.cast(), SIZE as usize, advice) };
        expect_errno(
            r,
            Errno::EINVAL,
            &format!("{name} on the dma-buf's mapping"),
        )?;
        let n = bad(|i| map.read(i), 0, SIZE, seed);
        check!(
            n == 0,
            "after {name}, {n} bytes of the dma-buf's mapping are not the mem's"
        );
    }
    drop((map, bmap, buf));
    d.mem_free(b).ctx("MEM_FREE")?;
    Ok(())
}
