// SPDX-License-Identifier: GPL-2.0

//! Leaks planted on purpose (`RUVM_IOCTL_TEST_LEAK`, test-only): resources held until unload so
//! that the audit must report them, or lost for good so that kmemleak must.
//!
//! This file owns the module-wide lock `PLANTED` (a leaf).

use kernel::{prelude::*, sync::Arc};

use crate::{
    audit::{Class, Counted},
    bind::{
        global::global,
        pages::{Chunk, ChunkFlags},
    },
};

use super::{cpu::KernelMapping, quota::Quota, storage, AllocRequest, Mem, Origin};

/// A resource leaked on purpose and held for the unload audit.
enum Planted {
    /// Held so that it stays alive; its core is in the registry.
    Mem {
        _held: Arc<Mem>,
    },
    Chunk {
        chunk: Chunk,
        _audit: Counted,
    },
    KernelMap(KernelMapping),
}

global! {
    /// The planted leaks held until unload.
    static PLANTED: Mutex<KVec<Planted>> = KVec::new();
}

/// Makes the planted leaks' lock usable (module init).
pub(super) fn init() {
    PLANTED.init();
}

/// What `RUVM_IOCTL_TEST_LEAK` asks for.
pub(crate) enum LeakKind {
    Mem { size: u64, mapped: bool },
    Chunk { order: u32 },
    KernelMap,
}

/// Makes one leaked resource of `kind`; with `lost` it is forgotten for good (for kmemleak),
/// otherwise held until unload. `max_bytes` bounds a planted mem as it bounds any.
pub(crate) fn plant(kind: &LeakKind, lost: bool, max_bytes: u64) -> Result {
    let flags = ChunkFlags {
        zero: false,
        fail_fast: false,
    };
    let planted = match *kind {
        LeakKind::Mem { size, mapped } => {
            let req = AllocRequest {
                gpu: None,
                size,
                page_size: 0,
                zero: false,
                fallback: false,
                sparse: false,
                map_user: false,
                max_bytes,
                pool: None,
            };
            let quota = Arc::new(Quota::new(u64::MAX), GFP_KERNEL)?;
            let mem = Mem::alloc(&req, &quota, Origin::here("TEST_LEAK"))?;
            if mapped {
                mem.map_cpu_kernel()?;
            }
            mem.disown();
            Planted::Mem { _held: mem }
        }
        LeakKind::Chunk { order } => Planted::Chunk {
            chunk: Chunk::alloc(order, flags)?,
            _audit: Counted::new(Class::SysmemChunks(order), 1),
        },
        LeakKind::KernelMap => {
            Planted::KernelMap(KernelMapping::new(storage::sys_pages(0, 1, flags)?)?)
        }
    };
    if lost {
        core::mem::forget(planted);
        return Ok(());
    }
    PLANTED.lock().ok_or(ENODEV)?.push(planted, GFP_KERNEL)?;
    Ok(())
}

/// The planted leaks' share of the audit's walk (a planted mem is in the registry already).
pub(super) fn walk(bump: &mut impl FnMut(Class, u64)) {
    let Some(planted) = PLANTED.lock() else {
        return;
    };
    for p in planted.iter() {
        match p {
            Planted::Mem { .. } => {}
            Planted::Chunk { chunk, .. } => bump(Class::SysmemChunks(chunk.order()), 1),
            Planted::KernelMap(m) => {
                bump(Class::KernelMaps, 1);
                let pages = m.pages();
                bump(
                    Class::SysmemChunks(pages.order()),
                    pages.chunk_count() as u64,
                );
            }
        }
    }
}

/// Frees the planted leaks at unload (after the audit reported them); returns how many.
pub(super) fn drain() -> usize {
    let all = PLANTED
        .lock()
        .map(|mut p| core::mem::replace(&mut *p, KVec::new()));
    all.map_or(0, |a| a.len())
}
