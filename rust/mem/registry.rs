// SPDX-License-Identifier: GPL-2.0

//! Every live mem of the module, by serial: what the audit's walk counts, what a GPU's removal
//! drops tables from, and what the level-2 unload report lists.
//!
//! This file owns the module-wide lock `MEMS` (see the crate's lock order): taken after a GPU's
//! removal has begun and before a mem's lock; nothing else is taken under it.

use kernel::{
    prelude::*,
    sync::{atomic::ordering::Relaxed, Arc},
};

use crate::{
    audit::{Class, CLASSES},
    bind::global::global,
    gpu::{mmu::TABLE_BYTES, pmm::CHUNK_MAX},
};

use super::{plant, storage::Storage, tree::KeptTree, Life, MemCore};

/// Every live mem by serial, with the nodes of mems that left kept for the next ones (a mem's
/// insertion then allocates nothing).
struct Registry {
    mems: KeptTree<u64, Arc<MemCore>>,
}

/// How many nodes the registry keeps for reuse.
const SPARE: usize = 32;

global! {
    /// Every live mem.
    static MEMS: Mutex<Option<Registry>> = None;
}

/// Makes the registry usable (module init).
pub(super) fn init() -> Result {
    MEMS.init();
    *MEMS.lock().ok_or(ENODEV)? = Some(Registry {
        mems: KeptTree::new(SPARE)?,
    });
    Ok(())
}

/// Adds a mem just made.
pub(super) fn insert(serial: u64, core: Arc<MemCore>) -> Result {
    let mut reg = MEMS.lock().ok_or(ENODEV)?;
    let reg = reg.as_mut().ok_or(ENODEV)?;
    let slot = reg.mems.slot()?;
    // Serials are never reused.
    reg.mems.insert(slot, serial, core);
    Ok(())
}

/// Takes a mem out (its `Mem` is going); the caller drops it outside the lock.
pub(super) fn remove(serial: u64) -> Option<Arc<MemCore>> {
    let mut reg = MEMS.lock()?;
    let reg = reg.as_mut()?;
    // The registry's reference is the one returned; the node's own is dropped with the lock
    // held, which is never the last.
    reg.mems.remove_with(&serial, Arc::clone)
}

/// The live mem of serial `serial` whose chunks came from pool `pool` (an import's lookup,
/// [`super::share`]).
pub(super) fn get_of_pool(serial: u64, pool: u64) -> Option<Arc<MemCore>> {
    let reg = MEMS.lock()?;
    reg.as_ref()?
        .mems
        .get(&serial)
        .filter(|c| c.pool == pool)
        .cloned()
}

/// Counts the real objects: every mem in the registry (its chunks, kernel mapping, user
/// mappings, and its handle if it is owned), the vidmem storage of every GPU, and the planted
/// leaks. Compared with the counters by the audit's consistency check.
pub(crate) fn walk() -> Result<[u64; CLASSES]> {
    let mut v = [0u64; CLASSES];
    let mut bump = |class: Class, n: u64| {
        if let Some(x) = v.get_mut(class.index()) {
            *x += n;
        }
    };
    {
        let mems = MEMS.lock().ok_or(ENODEV)?;
        for core in mems.iter().flat_map(|r| r.mems.values()) {
            bump(Class::Mems, 1);
            match &core.storage {
                // An imported mem's chunks are counted with the mem it shares them with.
                Storage::Sys(_) if core.source.is_some() => {}
                Storage::Sys(pages) => {
                    bump(Class::SysmemBytes, core.layout.physical_size);
                    // Chunks handed to a pool's pending list are counted there.
                    if !core.handed.load(Relaxed) {
                        bump(
                            Class::SysmemChunks(pages.order()),
                            pages.chunk_count() as u64,
                        );
                    }
                }
                Storage::Vid(v) => {
                    bump(Class::VidmemBytes, core.layout.physical_size);
                    bump(Class::VidmemChunks, v.chunk_count() as u64);
                }
                // Another exporter's memory: no bytes or chunks of ruvm's.
                Storage::Buf(_) => {}
                // Counted from its resident chunks, under its lock below.
                Storage::Sparse => {}
            }
            bump(Class::UserMappings, core.user_mappings.load(Relaxed).into());
            let st = core.state.lock();
            bump(Class::KernelMaps, u64::from(st.kmap.is_some()));
            bump(Class::Handles, u64::from(st.life == Life::Owned));
            bump(Class::GpuKernelVas, u64::from(st.kva.is_some()));
            if let Some(r) = st.parked.as_ref() {
                r.walk(core.layout.chunk_size, &mut bump);
            }
            if let Some(sp) = st.sparse.as_ref() {
                sp.walk(&mut bump);
            }
            let leased = st.lease.as_ref().map(|l| &l.tables[..]).unwrap_or(&[]);
            for (_, table) in Iterator::chain(st.gpus.iter(), leased.iter()) {
                let n = table.count() as u64;
                bump(Class::DmaMappings, n);
                bump(Class::DmaBytes, n * core.layout.chunk_size);
            }
        }
    }
    super::pool::registry::walk(&mut bump)?;
    // Vidmem storage: counted per root chunk, and DMA-mapped (one 2 MiB mapping each); kept
    // storage only as such.
    let (roots, mapped, kept) = crate::gpu::walk_vidmem()?;
    bump(Class::VidmemRoots, roots);
    bump(Class::VidmemKept, kept);
    bump(Class::DmaMappings, mapped);
    bump(Class::DmaBytes, mapped * CHUNK_MAX);
    // Page tables: every one counted, the sysmem ones DMA-mapped (one page each).
    let (tables, sys) = crate::gpu::walk_page_tables()?;
    bump(Class::PtTables, tables);
    bump(Class::PtBytes, tables * TABLE_BYTES);
    bump(Class::DmaMappings, sys);
    bump(Class::DmaBytes, sys * TABLE_BYTES);
    plant::walk(&mut bump);
    Ok(v)
}

/// How many mems a GPU's removal takes from the registry at a time.
const BATCH: usize = 64;

/// Drops every mem's mappings on GPU `id`, virtual then DMA (the GPU is being removed, still
/// bound): [`BATCH`] mems at a time are taken (referenced) under the registry's lock and
/// unmapped with it released, so that mems made and freed meanwhile (which take the lock) do
/// not wait for the unmapping of every mem. A mem made after the removal began gets no mapping
/// of the GPU; one that leaves meanwhile is unmapped by whoever drops it last.
pub(crate) fn drop_gpu_tables(id: u32) {
    let Ok(mut batch) = KVec::<Arc<MemCore>>::with_capacity(BATCH, GFP_KERNEL) else {
        // No memory for a batch: every mem is unmapped under the lock.
        let Some(mems) = MEMS.lock() else {
            return;
        };
        for core in mems.iter().flat_map(|r| r.mems.values()) {
            let _old = core.take_gpu(id);
        }
        return;
    };
    let mut from = 0u64;
    loop {
        let mut end = false;
        {
            let Some(mems) = MEMS.lock() else {
                return;
            };
            let Some(reg) = mems.as_ref() else {
                return;
            };
            while batch.len() < BATCH {
                let next = reg
                    .mems
                    .first_from(&from, |serial, core| (*serial, core.clone()));
                let Some((serial, core)) = next else {
                    end = true;
                    break;
                };
                // Within the room reserved: cannot fail.
                let _ = batch.push_within_capacity(core);
                match serial.checked_add(1) {
                    Some(n) => from = n,
                    None => {
                        end = true;
                        break;
                    }
                }
            }
        }
        for core in batch.drain_all() {
            let _old = core.take_gpu(id);
        }
        if end {
            return;
        }
    }
}

/// Logs one line per live mem with its origin (the level-2 unload report).
pub(crate) fn report_objects() {
    let Some(mems) = MEMS.lock() else {
        return;
    };
    for core in mems.iter().flat_map(|r| r.mems.values()) {
        pr_err!(
            "audit: leaked object class=mems id={} bytes={} size={} {}\n",
            core.serial,
            core.layout.physical_size,
            core.size,
            core.origin
        );
    }
}

/// Empties the registry at unload (what it holds can then be freed).
pub(super) fn drain() {
    let _all = MEMS.lock().and_then(|mut m| m.take());
}
