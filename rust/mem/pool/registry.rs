// SPDX-License-Identifier: GPL-2.0

//! Every live pool, module-wide: for a GPU's removal, the shrinker, the audit's walk and
//! `/sys/kernel/debug/ruvm/pools`. A red-black tree by handle, so that a pool leaves it in
//! O(log n) whatever the number of pools (closing a file of many pools is linear).
//!
//! This file owns the pool registry lock (`POOLS`, lock order 5), taken before a pool's.

use kernel::{
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc,
    },
};

use crate::{
    audit::Class,
    bind::{global::global, shrinker::Shrink},
};

use super::Pool;

/// Every live pool, by handle.
type Pools = RBTree<u64, Arc<Pool>>;

global! {
    /// The registry, while the module is loaded.
    static POOLS: Mutex<Option<Pools>> = None;
}

/// Runs `f` on the registry under its lock (`None` before init and after exit).
fn with<R>(f: impl FnOnce(&mut Pools) -> R) -> Option<R> {
    POOLS.lock()?.as_mut().map(f)
}

/// The cached bytes of every sysmem pool, as last published (the shrinker's count).
static CACHED: Atomic<u64> = Atomic::new(0);

/// Makes the pool registry usable (module init).
pub(crate) fn init() {
    POOLS.init();
    if let Some(mut p) = POOLS.lock() {
        *p = Some(RBTree::new());
    }
}

/// Lets go of the registry's memory at unload (every pool was closed with its file).
pub(crate) fn exit() {
    let _all = POOLS.lock().and_then(|mut p| p.take());
}

/// Enters a new pool (its node charged to the caller's memory cgroup).
pub(super) fn insert(pool: &Arc<Pool>) -> Result {
    let node = RBTreeNode::new(pool.id, pool.clone(), GFP_KERNEL_ACCOUNT)?;
    // Handles are unique: nothing is replaced.
    with(|p| p.insert(node)).ok_or(ENODEV)?;
    Ok(())
}

/// Takes a closed pool out.
pub(super) fn remove(pool: &Pool) {
    // Dropped with the lock released: it may be the pool's last reference.
    let _node = with(|p| p.remove_node(&pool.id)).flatten();
}

/// A pool's cached bytes went from `old` to `new`.
pub(super) fn published(old: u64, new: u64) {
    // Modulo 2^64: a decrease wraps back.
    CACHED.fetch_add(new.wrapping_sub(old), Relaxed);
}

/// GPU `id` is going: it leaves every pool's access set, and the cached tables of it are
/// dropped (before the GPU's removal waits for its tables); a vidmem pool of it dies.
pub(crate) fn drop_gpu(id: u32) {
    with(|pools| {
        for pool in pools.values() {
            pool.drop_gpu(id);
        }
    });
}

/// The pools' cache under memory pressure (registered by the module as its shrinker).
pub(crate) struct PoolShrink;

impl Shrink for PoolShrink {
    /// Cached pages of every pool, as last published (no lock).
    fn count() -> u64 {
        CACHED.load(Relaxed) / kernel::page::PAGE_SIZE as u64
    }

    /// Gives back cached lists, the oldest of the first pool with any, until `pages` pages
    /// went: how many did. Each list is taken out under the registry's and its pool's locks
    /// (only tried: another reclaimer may hold them) and dropped with both released, so that
    /// concurrent reclaimers are held up by bookkeeping only.
    fn scan(pages: u64) -> u64 {
        let page = kernel::page::PAGE_SIZE as u64;
        let mut freed = 0;
        while freed < pages {
            let entry = {
                let Some(guard) = POOLS.try_lock() else {
                    break;
                };
                let found = guard
                    .as_ref()
                    .and_then(|pools| pools.values().find_map(|p| p.take_oldest()));
                found
            };
            let Some(e) = entry else {
                break;
            };
            freed += e.bytes() / page;
            drop(e);
        }
        freed
    }
}

/// Counts every pool and what its cache holds into `bump` (the audit's walk).
pub(crate) fn walk(mut bump: impl FnMut(Class, u64)) -> Result {
    let guard = POOLS.lock().ok_or(ENODEV)?;
    let pools = guard.as_ref().ok_or(ENODEV)?;
    for pool in pools.values() {
        bump(Class::Pools, 1);
        let st = pool.state.lock();
        bump(Class::PoolChunks, st.vcache.len() as u64);
        bump(Class::PoolBytes, st.vcache.len() as u64 * pool.chunk_size);
        for e in st.cache.iter() {
            e.walk(pool.chunk_size, &mut bump);
        }
    }
    Ok(())
}

/// `/sys/kernel/debug/ruvm/pools`: one line per pool, its attributes in bytes (so that memory
/// a pool holds is seen at a glance, with the process it belongs to).
pub(crate) struct PoolsView;

impl kernel::debugfs::Writer for PoolsView {
    fn write(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let Some(guard) = POOLS.lock() else {
            return Ok(());
        };
        let Some(pools) = guard.as_ref() else {
            return Ok(());
        };
        for p in pools.values() {
            let a = p.attrs();
            writeln!(
                f,
                "pool={} pid={} chunk={} reserved={} used={} cached_chunks={} hits={} misses={} threshold={} access={:#x}",
                p.id,
                p.pid,
                p.chunk_size,
                a.reserved,
                a.used,
                a.cached_chunks,
                a.hits,
                a.misses,
                a.release_threshold,
                a.access.bits()
            )?;
        }
        Ok(())
    }
}
