// SPDX-License-Identifier: GPL-2.0

//! Mems as dma-bufs: a sysmem mem exported as a dma-buf for other processes and devices, a
//! dma-buf of ruvm's imported as a mem, and the reservation object that carries the fences of
//! the work on a shared mem's bytes (implicit sync).
//!
//! # Lifetimes
//!
//! A dma-buf holds the mem's core ([`Source`], a quiet holder: the buffer outliving the mem is
//! how dma-bufs are used, not a broken free order), so its chunks live, charged to the
//! exporter, until the last of the mem, its imports and its buffers lets go. The buffer holds
//! this module too (`dma_buf_export` takes a reference on its owner): `rmmod` is refused
//! (`EBUSY`, "Module ruvm is in use") while any buffer ruvm exported lives.
//!
//! # Implicit sync
//!
//! A mem exported as a dma-buf (and every mem imported from one of its buffers) has a
//! reservation object, the buffer's. Work on its bytes follows it: a stream operation that
//! copies into or out of it, or fills it, once queued takes the fences there it must wait for
//! (a write, all; a read, writers') and adds its own, at once under the object's lock
//! (`stream/implicit.rs`); a synchronous copy, fill or verify waits for them and, done when it
//! returns, adds none.

use kernel::{
    page::PAGE_SIZE,
    prelude::*,
    sync::{atomic::ordering::Relaxed, Arc},
    time::{Instant, Monotonic},
};

use crate::{
    audit::Counted,
    bind::{
        anon::Exported,
        attach::DmaBuf,
        dmabuf::{BufOps, Buffer, Got},
        resv::Resv,
    },
    uapi,
};

use super::{
    policy::Layout,
    quota::Quota,
    share::{Borrowed, Export, Source},
    storage::Storage,
    Life, Mem, MemCore, MemState, Origin,
};

/// The dma-buf operations of ruvm's buffers: their private data holds the mem's core.
static BUF_OPS: BufOps<Source, Counted> = BufOps::new();

impl MemCore {
    /// The core whose reservation object this mem's work follows: its own, or its source's
    /// (an imported mem shares its exporter's, however many imports deep).
    fn resv_core(&self) -> &MemCore {
        let mut core = self;
        while let Some(s) = &core.source {
            core = &s.core;
        }
        core
    }

    /// The reservation object of the mem's dma-bufs, if it has one.
    pub(crate) fn resv(&self) -> Option<Arc<Resv>> {
        let core = self.resv_core();
        // Set before a first buffer is made, never cleared: a mem never exported needs no
        // lock here.
        if !core.exported.load(Relaxed) {
            return None;
        }
        core.state.lock().resv.clone()
    }

    /// Waits for what a synchronous access to each of `mems` (a write, or a read) must wait
    /// for (see the module's doc): at most `RUVM_WAIT_MAX_MS` in all (`ETIMEDOUT`),
    /// interruptibly (`ERESTARTSYS`). Called once the access's arguments are checked.
    pub(crate) fn wait_implicit(mems: &[(&MemCore, bool)]) -> Result {
        let start = Instant::<Monotonic>::now();
        for (mem, write) in mems {
            let Some(r) = mem.resv() else {
                continue;
            };
            let spent = u32::try_from(start.elapsed().as_millis()).unwrap_or(u32::MAX);
            let left = uapi::RUVM_WAIT_MAX_MS.checked_sub(spent).ok_or(ETIMEDOUT)?;
            r.wait(*write, left.max(1))?;
        }
        Ok(())
    }
}

impl Mem {
    /// A new dma-buf of the mem (its whole physical size), with a close-on-exec descriptor
    /// reserved for it: `EOPNOTSUPP` for vidmem, `ENOENT` once a free of it has begun.
    pub(crate) fn export_dmabuf(&self) -> Result<Exported> {
        let (pages, source, resv) = {
            let mut st = self.state.lock();
            if st.life != Life::Owned || st.export == Export::Withdrawn {
                return Err(ENOENT);
            }
            // A registered mem's pages are its process's, not to be handed to other drivers.
            if self.is_registered() {
                return Err(crate::bind::errno::eopnotsupp());
            }
            let pages = self.storage.sys()?.clone();
            let pool = st.lease.as_ref().map_or(0, |l| l.pool.id());
            let source = Source::hold(&self.core, &mut st, pool, true)?;
            drop(st);
            // The reservation object is the shared one (the root source's, for an import).
            let rc = self.resv_core();
            let mut rst = rc.state.lock();
            let resv = match &rst.resv {
                Some(r) => r.clone(),
                None => {
                    let r = Resv::new()?;
                    rst.resv = Some(r.clone());
                    r
                }
            };
            // From here every access to the mem follows the object ([`MemCore::resv`]), and
            // its drop takes its lock to let go ([`Mem`]'s drop).
            rc.exported.store(true, Relaxed);
            self.exported.store(true, Relaxed);
            (pages, source, resv)
        };
        // On failure the hold is dropped with the buffer (or with `source`).
        let buf = Buffer::new(source, pages, resv)?;
        BUF_OPS.export(buf)
    }

    /// A new mem of the file with quota `quota` for the dma-buf open at descriptor `fd`: one
    /// of ruvm's shares its pages; another exporter's is held, to be attached for each GPU it
    /// is mapped on. `EBADF` not open, `EINVAL` not a dma-buf (or one of no whole pages).
    pub(crate) fn import_dmabuf(fd: i32, quota: &Arc<Quota>, origin: Origin) -> Result<Arc<Mem>> {
        let buf = match BUF_OPS.get(fd)? {
            Got::Own(b) => b,
            Got::Foreign(b) => return Self::import_foreign(b, quota, origin),
        };
        let held = buf.owner();
        let source = {
            let mut st = held.core.state.lock();
            Source::hold(&held.core, &mut st, held.pool(), true)?
        };
        Self::view(source, quota, origin)
    }

    /// A new mem of the file with quota `quota` holding another exporter's buffer `buf`: its
    /// size in whole pages (chunks of a page), charged to `quota` like any import; no CPU
    /// mapping, kernel or GPU VA mapping, or export of it (`EOPNOTSUPP`); each GPU it is
    /// mapped on (`MEM_MAP_GPU`) attaches the buffer, and copies reach it through that
    /// mapping. Its work follows the buffer's own reservation object.
    fn import_foreign(buf: DmaBuf, quota: &Arc<Quota>, origin: Origin) -> Result<Arc<Mem>> {
        let size = u64::try_from(buf.size())?;
        let page = PAGE_SIZE as u64;
        if size == 0 || size % page != 0 {
            return Err(EINVAL);
        }
        let layout = Layout {
            chunk_size: page,
            chunk_count: size / page,
            physical_size: size,
        };
        let mut state = MemState::new(None, None);
        state.resv = Some(Resv::of(buf.clone())?);
        let borrowed = Borrowed {
            storage: Storage::Buf(buf),
            source: None,
            size,
            layout,
            state,
            // Its reservation object is read as an exported mem's is.
            exported: true,
        };
        borrowed.make(quota, origin)
    }
}
