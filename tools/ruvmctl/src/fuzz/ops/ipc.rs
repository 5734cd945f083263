// SPDX-License-Identifier: GPL-2.0

//! IPC pools in the fuzzer: a worker exports its pools and mems and imports them into its own
//! other open files (the isolation oracle stays whole: the bytes shared are the worker's own,
//! tagged with its tag). Each call names the errnos ruvm.rst allows; forged export data must be
//! refused, and an imported pool must refuse to allocate.

use std::os::fd::AsFd;

use libruvm::{uapi, Errno, Ruvm};

use super::{Rng, World};

use Errno::*;

/// One IPC step on file `d` of worker `w`.
pub(super) fn one(w: &World, d: &Ruvm, rng: &mut Rng) {
    let pool = w.pool(rng);
    let Some(other) = w.file(rng) else { return };
    match rng.below(4) {
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
