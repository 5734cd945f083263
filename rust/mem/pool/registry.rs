// SPDX-License-Identifier: GPL-2.0

//! Every live pool, module-wide: for a GPU's removal, the shrinker, the audit's walk and
//! `/sys/kernel/debug/ruvm/pools`. A red-black tree by handle, so that a pool leaves it in
//! O(log n) whatever the number of pools (closing a file of many pools is linear).
//!
//! The shrinker (`ruvm-pools`) is memory-cgroup aware: each sysmem pool has an anchor on the
//! list of the cgroup it was made in while its cache holds pages ([`crate::bind::lru`]), so a
//! cgroup's own reclaim (its `memory.max` reached) gives back its pools' caches, as global
//! reclaim does every cgroup's.
//!
//! This file owns the pool registry lock (`POOLS`, lock order 5), taken before a pool's, and
//! the shrinker's handle (`SHRINKER`, a leaf: held only to clone it).

use kernel::{
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
    sync::Arc,
};

use crate::{
    audit::Class,
    bind::{
        global::global,
        lru::{Anchor, LruShrink, LruShrinker},
    },
};

use super::Pool;

/// Every live pool, by handle.
type Pools = RBTree<u64, Arc<Pool>>;

global! {
    /// The registry, while the module is loaded.
    static POOLS: Mutex<Option<Pools>> = None;
}

global! {
    /// The pools' shrinker and its list, while the module is loaded.
    static SHRINKER: Mutex<Option<Arc<LruShrinker>>> = None;
}

/// Runs `f` on the registry under its lock (`None` before init and after exit).
fn with<R>(f: impl FnOnce(&mut Pools) -> R) -> Option<R> {
    POOLS.lock()?.as_mut().map(f)
}

/// Makes the pool registry usable and registers the pools' shrinker (module init).
pub(crate) fn init() -> Result {
    POOLS.init();
    SHRINKER.init();
    if let Some(mut p) = POOLS.lock() {
        *p = Some(RBTree::new());
    }
    let shrinker = LruShrinker::new::<PoolShrink>(c"ruvm-pools")?;
    if let Some(mut s) = SHRINKER.lock() {
        *s = Some(shrinker);
    }
    Ok(())
}

/// Lets go of the registry's memory and the shrinker at unload (every pool was closed with its
/// file, and its anchor went with it).
pub(crate) fn exit() {
    let _all = POOLS.lock().and_then(|mut p| p.take());
    let _shrinker = SHRINKER.lock().and_then(|mut s| s.take());
}

/// A sysmem pool's anchor on the shrinker's list (charged to the caller's memory cgroup).
pub(super) fn anchor(pool: u64) -> Result<Anchor> {
    let shrinker = SHRINKER.lock().and_then(|s| s.clone()).ok_or(ENODEV)?;
    Anchor::new(&shrinker, pool)
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

/// GPU `id` is going: it leaves every pool's access set, and the cached tables of it are
/// dropped (before the GPU's removal waits for its tables); a vidmem pool of it dies.
pub(crate) fn drop_gpu(id: u32) {
    with(|pools| {
        for pool in pools.values() {
            pool.drop_gpu(id);
        }
    });
}

/// The pools' caches under memory pressure (the module's memcg-aware shrinker).
pub(crate) struct PoolShrink;

impl LruShrink for PoolShrink {
    /// Gives back cached lists, the oldest of each pool of `keys` in turn, until `pages` pages
    /// went: how many did. Each list is taken out under the registry's and its pool's locks
    /// (only tried: another reclaimer may hold them) and dropped with both released, so that
    /// concurrent reclaimers are held up by bookkeeping only.
    fn shrink(keys: &[u64], pages: u64) -> u64 {
        let page = kernel::page::PAGE_SIZE as u64;
        let mut freed = 0;
        for key in keys {
            while freed < pages {
                let entry = {
                    let Some(guard) = POOLS.try_lock() else {
                        return freed;
                    };
                    let found = guard
                        .as_ref()
                        .and_then(|pools| pools.get(key))
                        .and_then(|p| p.take_oldest());
                    found
                };
                let Some(e) = entry else {
                    break;
                };
                freed += e.bytes() / page;
                drop(e);
            }
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
        for p in st.pending.iter() {
            p.walk(pool.chunk_size, &mut bump);
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
                "pool={} pid={} chunk={} reserved={} used={} pending={} cached_chunks={} hits={} misses={} threshold={} access={:#x} reuse={:#x}",
                p.id,
                p.pid,
                p.chunk_size,
                a.reserved,
                a.used,
                a.pending,
                a.cached_chunks,
                a.hits,
                a.misses,
                a.release_threshold,
                a.access.bits(),
                a.reuse
            )?;
        }
        Ok(())
    }
}
