// SPDX-License-Identifier: GPL-2.0

//! Sharing through exportable pools (CUDA's IPC pools): a pool as a file descriptor, a mem of
//! it as export data, and imported mems that share its chunks.
//!
//! # The one rule of a shared mem's chunks
//!
//! An imported mem is a mem of the importing file (its own handle, mmap offset, kernel and GPU
//! mappings and DMA tables) whose storage is the exported mem's pages, and which holds the
//! exported mem's core ([`Source`]). A core counts its holders (its own [`Mem`], then one per
//! import) under its lock; it stays in the mem registry, with its chunks and its pool lease,
//! until the last of them lets go. So the chunks go back to the pool (and may be handed to
//! another mem) only when no import can reach them, whatever the order of the frees:
//!
//! - the exporter's free (or its file's close) while imports live retires its mem (no mapping,
//!   no table, no handle) and says so once in the kernel log: CUDA's rule is that importers
//!   free first;
//! - a free on a stream keeps the chunks with the mem while imports live (as for a user
//!   mapping: they come back, pending its point, with the core), and a later allocation of the
//!   same submission never borrows them;
//! - an import is made only while the mem is exported and no free of it has begun (checked
//!   with the holder count, under the core's lock): once a free begins, the count only falls.
//!
//! # Export data
//!
//! [`DATA_LEN`] bytes, laid out as the header says (`RUVM_EXPORT_DATA_VERSION`): a version,
//! the pool's handle, the mem's serial and a random key made at the mem's first export, then
//! zeros. It is not a capability by itself (the imported pool is), but data
//! that names another pool, a freed mem or a wrong key is refused alike (`ENOENT`).

use kernel::{
    new_mutex,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc,
    },
};

use crate::{
    audit::{Class, Counted},
    bind::{
        anon::{AnonFile, Exported},
        random, ratelimit,
    },
    uapi,
};

use super::{
    offsets, policy::Layout, pool::Pool, quota::Quota, registry, storage::Storage, Life, Mem,
    MemCore, MemState, Origin,
};

/// Bytes of a mem's export data.
pub(crate) const DATA_LEN: usize = uapi::RUVM_EXPORT_DATA_LEN as usize;

/// Bytes of an export key.
const KEY_LEN: usize = 16;

/// The first word of export data: "ruvm export", version 1 (the header's layout).
const MAGIC: u64 = uapi::RUVM_EXPORT_DATA_VERSION;

/// The files of exported pools (`RUVM_IOCTL_POOL_EXPORT`).
static POOL_FILES: AnonFile<Pool> = AnonFile::new();

/// The rate limit of the message that CUDA's free order was broken (its own: the kernel's
/// shared one is often spent by other messages).
static ORDER_LOG: ratelimit::Own = ratelimit::Own::new(10);

/// Where a mem is in its sharing (under its lock).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Export {
    /// Never exported.
    Never,
    /// Exported with this key: imports may be made.
    Open([u8; KEY_LEN]),
    /// A free of it has begun: no import may be made, nor export data again.
    Withdrawn,
}

/// A new descriptor for exportable pool `pool` (its handle checked by the caller).
pub(crate) fn export_pool(pool: Arc<Pool>) -> Result<Exported> {
    if !pool.exportable() {
        return Err(EINVAL);
    }
    POOL_FILES.create(c"ruvm-pool", pool)
}

/// The pool of descriptor `fd`: `EBADF` not open, `EINVAL` not a pool's (the caller refuses
/// a closed one, unless its file has it already).
pub(crate) fn pool_of_fd(fd: i32) -> Result<Arc<Pool>> {
    POOL_FILES.get(fd)
}

/// An imported mem's hold on the core it shares chunks with (a field of the imported mem's
/// core after its storage, so that its pages go first), and that core's pool.
pub(super) struct Source {
    pub(super) core: Arc<MemCore>,
    pool: u64,
    /// A dma-buf's hold, or a dma-buf import's: not one CUDA's free order concerns.
    quiet: bool,
}

impl Source {
    /// One more holder of `core`, whose lock the caller holds (`st`): `ENOSPC` if the count
    /// would wrap (never near: each holder is charged to some file or is a descriptor). `pool`
    /// is the handle of the pool the chunks came from (0: none); `quiet` says the holder is a
    /// dma-buf's or its import's.
    pub(super) fn hold(
        core: &Arc<MemCore>,
        st: &mut MemState,
        pool: u64,
        quiet: bool,
    ) -> Result<Self> {
        let quiet_n = if quiet {
            st.quiet.checked_add(1).ok_or(ENOSPC)?
        } else {
            st.quiet
        };
        st.holders = st.holders.checked_add(1).ok_or(ENOSPC)?;
        st.quiet = quiet_n;
        Ok(Self {
            core: core.clone(),
            pool,
            quiet,
        })
    }

    /// The handle of the pool the chunks came from.
    pub(super) fn pool(&self) -> u64 {
        self.pool
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        let last = {
            let mut st = self.core.state.lock();
            st.holders = st.holders.saturating_sub(1);
            if self.quiet {
                st.quiet = st.quiet.saturating_sub(1);
            }
            st.holders == 0
        };
        if last {
            // Its own mem went before: the core leaves the registry, and its chunks go back
            // to its pool as the last reference goes, outside the registry's lock.
            let _core = registry::remove(self.core.serial);
        }
    }
}

impl MemCore {
    /// A free of the mem (or its file's close) begins: no import may be made from now on. If
    /// imports live, CUDA's order was broken: said once in the kernel log.
    pub(super) fn withdraw(&self, st: &mut MemState) {
        st.export = Export::Withdrawn;
        // Its own mem, and the holders the order does not concern, aside.
        let imports = st.holders.saturating_sub(1).saturating_sub(st.quiet);
        if imports > 0 && !st.order_said {
            st.order_said = true;
            if ORDER_LOG.ok() {
                pr_warn!(
                    "mem serial={} freed by its exporter while {} import(s) of it live (importers must free first): its chunks stay until the last import is freed; {}\n",
                    self.serial,
                    imports,
                    self.origin
                );
            }
        }
    }

    /// Whether an import holds the core (read under its lock; it only falls once a free has
    /// begun).
    pub(super) fn imported(st: &MemState) -> bool {
        st.holders > 1
    }
}

impl Mem {
    /// The export data of a mem of an exportable pool, and the pool's handle: `EINVAL` for a
    /// mem of no exportable pool, `ENOENT` once a free of it has begun.
    pub(crate) fn export_data(&self) -> Result<(u64, [u8; DATA_LEN])> {
        let mut st = self.state.lock();
        let pool = match st.lease.as_ref() {
            Some(l) if l.pool.exportable() => l.pool.id(),
            _ => return Err(EINVAL),
        };
        if st.life != Life::Owned {
            return Err(ENOENT);
        }
        let key = match st.export {
            Export::Open(k) => k,
            Export::Withdrawn => return Err(ENOENT),
            Export::Never => {
                let k = random::bytes::<KEY_LEN>();
                st.export = Export::Open(k);
                self.exported.store(true, Relaxed);
                k
            }
        };
        drop(st);
        let mut data = [0u8; DATA_LEN];
        let parts = [MAGIC, pool, self.serial].map(u64::to_le_bytes);
        let bytes = Iterator::chain(parts.iter().flatten(), key.iter());
        for (d, b) in data.iter_mut().zip(bytes) {
            *d = *b;
        }
        Ok((pool, data))
    }

    /// A new mem of the file with quota `quota` sharing the chunks of the mem `data` names,
    /// exported through `pool` (exportable; the caller checked it is in its file's table).
    /// Its physical size is charged to `quota`.
    pub(crate) fn import(
        data: &[u8; DATA_LEN],
        pool: &Arc<Pool>,
        quota: &Arc<Quota>,
        origin: Origin,
    ) -> Result<Arc<Mem>> {
        // The layout: three words (version, pool, serial), the key, zeroes.
        let word = |at: usize| -> Result<u64> {
            let w: [u8; 8] = data
                .get(at..at + 8)
                .and_then(|s| s.try_into().ok())
                .ok_or(EINVAL)?;
            Ok(u64::from_le_bytes(w))
        };
        let key: [u8; KEY_LEN] = data
            .get(24..24 + KEY_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(EINVAL)?;
        let tail = data.get(24 + KEY_LEN..).ok_or(EINVAL)?;
        if word(0)? != MAGIC || tail.iter().any(|&b| b != 0) {
            return Err(EINVAL);
        }
        let (pool_id, serial) = (word(8)?, word(16)?);
        if pool_id != pool.id() {
            return Err(ENOENT);
        }
        // Only a mem of this very pool is looked at (another file's mems stay out of reach).
        let core = registry::get_of_pool(serial, pool.id()).ok_or(ENOENT)?;
        let source = {
            let mut st = core.state.lock();
            let of_pool = st
                .lease
                .as_ref()
                .is_some_and(|l| Arc::ptr_eq(&l.pool, pool));
            let open = matches!(st.export, Export::Open(k) if same_key(&k, &key));
            if !of_pool || !open || st.life != Life::Owned {
                return Err(ENOENT);
            }
            let source = Source::hold(&core, &mut st, pool.id(), false)?;
            drop(st);
            source
        };
        Self::view(source, quota, origin)
    }

    /// A new mem of the file with quota `quota` sharing the chunks of the core `source` holds
    /// (its physical size charged to `quota`).
    pub(super) fn view(source: Source, quota: &Arc<Quota>, origin: Origin) -> Result<Arc<Mem>> {
        let core = source.core.clone();
        let pages = core.storage.sys()?.clone();
        let borrowed = Borrowed {
            storage: Storage::Sys(pages),
            source: Some(source),
            size: core.size,
            layout: core.layout,
            state: MemState::new(None, None),
            exported: false,
        };
        borrowed.make(quota, origin)
    }
}

/// A mem whose bytes are another's: an import (its storage shares an exported mem's pages,
/// its source holds them) or another exporter's dma-buf (`mem::dmabuf`).
pub(super) struct Borrowed {
    pub(super) storage: Storage,
    pub(super) source: Option<Source>,
    pub(super) size: u64,
    pub(super) layout: Layout,
    pub(super) state: MemState,
    /// Whether its state's reservation object is to be read (see `MemCore::resv`).
    pub(super) exported: bool,
}

impl Borrowed {
    /// The mem, of the file with quota `quota`: its physical size charged to `quota`, its
    /// objects to the caller's memory cgroup (nothing else bounds how many imports of a small
    /// mem a process makes: its quota counts their bytes, not these), registered.
    pub(super) fn make(self, quota: &Arc<Quota>, origin: Origin) -> Result<Arc<Mem>> {
        let layout = self.layout;
        let charge = quota.charge(layout.physical_size)?;
        let mmap = offsets::MmapRange::new(layout.physical_size)?;
        let serial = super::new_serial();
        let core = Arc::pin_init(
            try_pin_init!(MemCore {
                serial,
                size: self.size,
                layout,
                alloc_flags: 0,
                mmap: Some(mmap),
                storage: self.storage,
                source: self.source,
                user_mappings: Atomic::new(0),
                leased: false,
                handed: Atomic::new(false),
                committed: Atomic::new(true),
                exported: Atomic::new(self.exported),
                pool: 0,
                owner: quota.id(),
                state <- new_mutex!(self.state),
                origin,
                _mems: Counted::new(Class::Mems, 1),
                // Its bytes and chunks are another mem's (counted there), or not ruvm's.
                _bytes: Counted::new(Class::SysmemBytes, 0),
                _usage: None,
            }),
            GFP_KERNEL_ACCOUNT,
        )?;
        let mem = Arc::new(
            Mem {
                core: core.clone(),
                _charge: Some(charge),
            },
            GFP_KERNEL_ACCOUNT,
        )?;
        // On failure `mem` is dropped, and its hold on what it borrows with it.
        registry::insert(serial, core)?;
        Ok(mem)
    }
}

/// Compares two keys in time independent of where they differ.
fn same_key(a: &[u8; KEY_LEN], b: &[u8; KEY_LEN]) -> bool {
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}
