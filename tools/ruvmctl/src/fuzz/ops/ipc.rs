// SPDX-License-Identifier: GPL-2.0

//! IPC pools and dma-bufs in the fuzzer: a worker exports its pools and mems (as export data
//! and as dma-bufs) and imports them into its own other open files (the isolation oracle stays
//! whole: the bytes shared are the worker's own, tagged with its tag). Each call names the
//! errnos ruvm.rst allows; forged export data must be refused, and an imported pool must refuse
//! to allocate. A few dma-bufs are kept open, so that the worker's stream copies and fills of
//! those mems go through implicit sync, and its frees leave the buffers holding the chunks.

use std::os::fd::AsFd;

use libruvm::{uapi, Errno, Ruvm};

use super::{Rng, World};

use Errno::*;

/// One IPC step on file `d` of worker `w`.
pub(super) fn one(w: &World, d: &Ruvm, rng: &mut Rng) {
    let pool = w.pool(rng);
    let Some(other) = w.file(rng) else { return };
    match rng.below(6) {
        4 | 5 => dmabuf(w, d, &other, rng),
        0 => {
            // An exportable pool, kept with the worker's pools.
            let r = d.pool_create_flags(
                rng.pick(&[0, 4096, 65536]),
                rng.pick(&[0, 1 << 20, u64::MAX]),
                uapi::ruvm_pool_create_flags_RUVM_POOL_EXPORTABLE,
            );
            if let Some((h, _)) = w.check("POOL_CREATE (exportable)", r, &[ENOSPC]) {
                if let Ok(mut p) = w.pools.lock() {
                    p.push(h);
                }
            }
        }
        1 => {
            // A pool of this file into another of the worker's files (or the same one).
            let Some(fd) = w.check(
                "POOL_EXPORT",
                d.pool_export(pool),
                &[ENOENT, EINVAL, EMFILE],
            ) else {
                return;
            };
            if let Some(h) = w.check(
                "POOL_IMPORT",
                other.pool_import(fd.as_fd()),
                &[ENOENT, ENOSPC],
            ) {
                if h != pool {
                    w.problem(format!("POOL_IMPORT of pool {pool} answered handle {h}"));
                }
                // An imported pool never allocates (the file's own pool does).
                if let Ok(i) = other.pool_get(h) {
                    let imported = i.pool_flags & uapi::ruvm_pool_flags_RUVM_POOL_FLAG_IMPORTED;
                    if imported != 0 {
                        if let Ok(a) = other.pool_alloc(h, 4096, 0) {
                            w.problem(format!("MEM_ALLOC from imported pool {h}: {a:?}"));
                            let _ = other.mem_free(a.handle);
                        }
                    }
                }
            }
        }
        _ => {
            // A mem of this file into another file through the pool it names.
            let h = w.handle(rng);
            let Some((p, mut data)) = w.check("MEM_EXPORT", d.mem_export(h), &[ENOENT, EINVAL])
            else {
                return;
            };
            if rng.one_in(4) {
                // Forged: a key byte changed.
                let at = 24 + rng.below(16) as usize;
                data[at] ^= 1 << rng.below(8);
                match other.mem_import(p, &data) {
                    Err(ENOENT | ENOMEM) => {}
                    Ok(m) => {
                        w.problem(format!("MEM_IMPORT of forged data of mem {h}: {m:?}"));
                        let _ = other.mem_free(m.handle);
                    }
                    Err(e) => w.problem(format!("MEM_IMPORT of forged data: unexpected {e}")),
                }
                return;
            }
            if let Some(m) = w.check("MEM_IMPORT", other.mem_import(p, &data), &[ENOENT, ENOSPC]) {
                w.read_check_mem(&other, m.handle, " (imported)");
                if let Ok(mut hs) = w.handles.lock() {
                    hs.push(m.handle);
                }
            }
        }
    }
}

/// The most dma-bufs a worker keeps open.
const KEPT_BUFS: usize = 8;

/// A mem of file `d` as a dma-buf: imported into `other` (and read by the isolation oracle),
/// mapped and read through the buffer, or kept open for a while.
fn dmabuf(w: &World, d: &Ruvm, other: &Ruvm, rng: &mut Rng) {
    let h = w.handle(rng);
    let Some(buf) = w.check(
        "MEM_EXPORT_DMABUF",
        d.mem_export_dmabuf(h),
        &[ENOENT, EOPNOTSUPP, EMFILE],
    ) else {
        return;
    };
    match rng.below(3) {
        0 => {
            let r = other.mem_import_dmabuf(std::os::fd::AsRawFd::as_raw_fd(&buf));
            if let Some(m) = w.check("MEM_IMPORT_DMABUF", r, &[ENOSPC]) {
                w.read_check_mem(other, m.handle, " (imported from a dma-buf)");
                if let Ok(mut hs) = w.handles.lock() {
                    hs.push(m.handle);
                }
            }
        }
        1 => {
            // The buffer's own mapping, of its first page.
            let map = libruvm::dmabuf::cpu_access(&buf, false).and_then(|()| {
                // SAFETY: a new shared mapping of the buffer; nothing else is placed there.
                unsafe {
                    nix::sys::mman::mmap(
                        None,
                        std::num::NonZeroUsize::MIN.saturating_add(4095),
                        nix::sys::mman::ProtFlags::PROT_READ,
                        nix::sys::mman::MapFlags::MAP_SHARED,
                        &buf,
                        0,
                    )
                }
            });
            match map {
                Ok(p) => {
                    let mut bytes = [0u8; 4096];
                    // SAFETY: the page just mapped, read once, then unmapped.
                    unsafe {
                        core::ptr::copy_nonoverlapping(
                            p.as_ptr().cast::<u8>(),
                            bytes.as_mut_ptr(),
                            4096,
                        );
                        let _ = nix::sys::mman::munmap(p, 4096);
                    }
                    if let Some((o, id)) = super::oracle::foreign(&bytes, w.id) {
                        w.problem(format!(
                            "the dma-buf of mem {h} holds worker {id:#x}'s tag at offset {o:#x}: another file's bytes"
                        ));
                    }
                    let _ = libruvm::dmabuf::cpu_access(&buf, true);
                }
                Err(ENOMEM | EINTR) => {}
                Err(e) => w.problem(format!("mmap of the dma-buf of mem {h}: unexpected {e}")),
            }
        }
        _ => {
            if let Ok(mut kept) = w.bufs.lock() {
                if kept.len() >= KEPT_BUFS {
                    kept.remove(0);
                }
                kept.push(buf);
            }
        }
    }
}
