// SPDX-License-Identifier: GPL-2.0

//! What is done to every present GPU's PMM or MMU at once: the audit's walks, the vidmem
//! shrinker (kept root storage given back under memory pressure) and the unload's release of
//! that storage. The registry's lock is taken to list them and released before any PMM's or
//! MMU's lock is taken (but by the shrinker, which only tries both).

use kernel::{prelude::*, sync::Arc};

use crate::bind::shrinker::Shrink;

use super::{mmu, pmm, Registry, GPUS};

/// For the audit's walk: every present GPU's vidmem root chunks with storage, the DMA
/// mappings of that storage, and the storages kept for reuse. The PMMs' locks are taken after
/// the registry's is released.
pub(crate) fn walk_vidmem() -> Result<(u64, u64, u64)> {
    Ok(pmms()?
        .iter()
        .map(|p| p.walk())
        .fold((0, 0, 0), |(a, b, c), (x, y, z)| (a + x, b + y, c + z)))
}

/// The vidmem storage the PMMs keep for reuse, under memory pressure (registered by the module
/// as a shrinker).
pub(crate) struct VidmemShrink;

/// Pages in one root's storage.
const ROOT_PAGES: u64 = pmm::CHUNK_MAX / kernel::page::PAGE_SIZE as u64;

impl Shrink for VidmemShrink {
    /// Kept storage is free memory held for reuse, re-made with no IO: trimmed at every pass.
    /// Reclaim counts neither it nor any shrinker's pages when it decides whether to invoke
    /// the OOM killer (`should_reclaim_retry` weighs free and LRU pages only), so a cache that
    /// gives back only `count >> priority` (the default) is still holding most of its pages
    /// when an allocation that needed them kills a process: 22 of 256 MiB had gone in one run.
    const SEEKS: i32 = 0;

    /// Pages of kept storage, every GPU's (the audit's count: no lock).
    fn count() -> u64 {
        crate::audit::live_of(crate::audit::Class::VidmemKept) * ROOT_PAGES
    }

    /// Gives back kept storage, GPU by GPU, until `pages` pages went (whole roots): how many
    /// did. The registry's and each PMM's locks are only tried (reclaim may run under them);
    /// the storage is unmapped and freed under its PMM's lock, as all storage is.
    fn scan(pages: u64) -> u64 {
        let Some(reg) = GPUS.try_lock() else {
            return 0;
        };
        let mut left = usize::try_from(pages.div_ceil(ROOT_PAGES)).unwrap_or(usize::MAX);
        let mut freed = 0;
        for pmm in present_pmms(&reg) {
            if left == 0 {
                break;
            }
            let n = pmm.shrink(left);
            left -= n;
            freed += n as u64 * ROOT_PAGES;
        }
        freed
    }
}

/// Gives back the vidmem storage every PMM keeps for reuse (at unload, before the audit counts
/// what is left). The PMMs' locks are taken after the registry's is released.
pub(crate) fn release_kept() {
    // Without room for the list, the PMMs keep their storage until their GPUs go, right after
    // the report (which then counts it).
    for p in pmms().unwrap_or_default() {
        p.shrink_all();
    }
}

/// Every present GPU's PMM, taken under the registry's lock (released before any PMM's is).
fn pmms() -> Result<KVec<Arc<pmm::Pmm>>> {
    let mut pmms = KVec::new();
    let reg = GPUS.lock().ok_or(ENODEV)?;
    for p in present_pmms(&reg) {
        pmms.push(p.clone(), GFP_KERNEL)?;
    }
    Ok(pmms)
}

/// The PMMs of the present GPUs in `reg`.
fn present_pmms(reg: &Registry) -> impl Iterator<Item = &Arc<pmm::Pmm>> {
    reg.gpus
        .iter()
        .filter_map(|e| e.dev.as_ref()?.res.pmm.as_ref())
}

/// Every present GPU's MMU, with its id. Taken under the registry's lock, which is released
/// before any MMU's is.
pub(crate) fn mmus() -> Result<KVec<(u32, Arc<mmu::Mmu>)>> {
    let mut mmus = KVec::new();
    let reg = GPUS.lock().ok_or(ENODEV)?;
    for e in reg.gpus.iter() {
        if let Some(m) = e.dev.as_ref().and_then(|d| d.res.mmu.clone()) {
            mmus.push((e.id, m), GFP_KERNEL)?;
        }
    }
    Ok(mmus)
}

/// For the audit's walk: every present GPU's page tables, and of those the DMA-mapped sysmem
/// ones.
pub(crate) fn walk_page_tables() -> Result<(u64, u64)> {
    Ok(mmus()?
        .iter()
        .map(|(_, m)| m.tables())
        .fold((0, 0), |(a, b), (x, y)| (a + x, b + y)))
}
