// SPDX-License-Identifier: GPL-2.0

//! The `ipc` group of `ruvmctl bench`: IPC pools (CUDA's on an H100: export pointer 31.6 us,
//! import pointer 4.3 us, import pool 242 us), each against a bare ioctl of the same file
//! (`POOL_GET` of the same pool), for information: no goal yet.
//!
//! - `ipc.export_pool`: `POOL_EXPORT` of an exportable pool and the close of its descriptor.
//! - `ipc.import_pool`: `POOL_IMPORT` of that descriptor into a third open file and the
//!   `POOL_DESTROY` that takes it out again (an import into a file that has the pool only
//!   answers its handle).
//! - `ipc.export_mem`: `MEM_EXPORT` of a 64 KiB mem of the pool (its key made at the first).
//! - `ipc.import_mem`: `MEM_IMPORT` of it into the second file and the import's `MEM_FREE`.
//!
//! Everything a case makes is freed or destroyed when it ends, failed or not.

use std::os::fd::AsFd;

use anyhow::{Context as _, Result};
use libruvm::{uapi, Ruvm};

use super::cases::{per_op, Ctx};
use super::{pairs, Case};

const K: u64 = 1 << 10;
/// Operations per sample.
const OPS: u64 = 256;

/// The pool and the mem a case shares, destroyed and freed on drop.
struct Made<'a> {
    d: &'a Ruvm,
    pool: u64,
    mem: u64,
}

impl Drop for Made<'_> {
    fn drop(&mut self) {
        let _ = self.d.mem_free(self.mem);
        let _ = self.d.pool_destroy(self.pool);
    }
}

/// The `ipc` group: skipped, with the reason printed, by a module without IPC pools.
pub(super) fn ipc(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let features = c.d.info().context("INFO")?.features;
    if features & u64::from(uapi::RUVM_FEATURE_IPC_POOLS) == 0 {
        eprintln!("bench: ipc skipped: the module has no IPC pools (RUVM_FEATURE_IPC_POOLS)");
        return Ok(());
    }
    let (pool, _) =
        c.d.pool_create_flags(0, 0, uapi::ruvm_pool_create_flags_RUVM_POOL_EXPORTABLE)
            .context("POOL_CREATE (exportable)")?;
    let made = Made {
        d: c.d,
        pool,
        mem: 0,
    };
    let mem = c.d.pool_alloc(pool, 64 * K, 0).context("MEM_ALLOC")?.handle;
    let made = Made { mem, ..made };
    let other = Ruvm::open().context("open a second file")?;
    let fd = c.d.pool_export(made.pool).context("POOL_EXPORT")?;
    let (_, data) = c.d.mem_export(made.mem).context("MEM_EXPORT")?;
    let ip = other.pool_import(fd.as_fd()).context("POOL_IMPORT")?;
    let third = Ruvm::open().context("open a third file")?;
    let bare = "POOL_GET of the same pool (a bare ioctl)";
    let mut base = || {
        per_op(OPS, &mut || {
            c.d.pool_get(made.pool).context("POOL_GET")?;
            Ok(())
        })
    };
    let mut one = |id: &str, what: &str, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        let mut case = c.case(id.into(), what, bare, "ns");
        (case.ruvm, case.base) = pairs(c.spec.reps, &mut || per_op(OPS, &mut *f), &mut base)?;
        out(case);
        Ok(())
    };
    one(
        "ipc.export_pool",
        "POOL_EXPORT of an exportable pool + close of the descriptor",
        &mut || {
            drop(c.d.pool_export(made.pool).context("POOL_EXPORT")?);
            Ok(())
        },
    )?;
    one(
        "ipc.import_pool",
        "POOL_IMPORT into another file + POOL_DESTROY of the import",
        &mut || {
            let h = third.pool_import(fd.as_fd()).context("POOL_IMPORT")?;
            third.pool_destroy(h).context("POOL_DESTROY")?;
            Ok(())
        },
    )?;
    one(
        "ipc.export_mem",
        "MEM_EXPORT of a 64K mem of the pool (export data)",
        &mut || {
            c.d.mem_export(made.mem).context("MEM_EXPORT")?;
            Ok(())
        },
    )?;
    one(
        "ipc.import_mem",
        "MEM_IMPORT of it into the second file + MEM_FREE of the import",
        &mut || {
            let m = other.mem_import(ip, &data).context("MEM_IMPORT")?;
            other.mem_free(m.handle).context("MEM_FREE")?;
            Ok(())
        },
    )?;
    drop((other, third));
    drop(fd);
    drop(made);
    Ok(())
}
