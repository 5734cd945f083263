// SPDX-License-Identifier: GPL-2.0

//! The pool ioctls: make and destroy a file's pools, read and set their attributes, trim
//! them, and set which GPUs their chunks stay DMA-mapped for.

use kernel::{prelude::*, sync::Arc, uaccess::UserSlice};

use crate::{
    gpu::{self, set::GpuSet},
    mem::pool::{self, Pool},
    uapi,
};

use super::{args, RuvmFile};

impl RuvmFile {
    /// The file's pool `handle`, or `ENOENT`.
    pub(super) fn pool(&self, handle: u64) -> Result<Arc<Pool>> {
        self.inner.lock().pools.get(handle).ok_or(ENOENT)
    }

    /// `RUVM_IOCTL_POOL_CREATE`.
    pub(super) fn pool_create(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_pool_create>(user)?;
        let quota = &self.quota;
        let (threshold, page_size) = (args.release_threshold, args.page_size);
        // A place in the file's table first: the file's limit, and memory for the entry
        // (charged to the caller), are had before the pool is made.
        let slot = self.inner.lock().pools.slot()?;
        let made = match args.backing {
            uapi::ruvm_backing_RUVM_BACKING_SYSMEM if args.gpu == 0 => {
                pool::create(quota, page_size, threshold)
            }
            uapi::ruvm_backing_RUVM_BACKING_VIDMEM => {
                gpu::get(args.gpu).and_then(|g| pool::create_vid(quota, g, page_size, threshold))
            }
            _ => Err(EINVAL),
        };
        let pool = match made {
            Ok(p) => p,
            Err(e) => {
                self.inner.lock().pools.unused(slot);
                return Err(e);
            }
        };
        args.handle = pool.id();
        args.chunk_size = pool.chunk_size();
        self.inner.lock().pools.insert(slot, pool.clone());
        if let Err(e) = writer.write(&args) {
            // The caller cannot learn the handle: the pool goes again.
            let _gone = self.inner.lock().pools.remove(pool.id());
            pool.close();
            return Err(e);
        }
        Ok(())
    }

    /// `RUVM_IOCTL_POOL_DESTROY`: `EBUSY` while a mem of the pool holds its chunks.
    pub(super) fn pool_destroy(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_pool_handle>(user)?;
        let pool = self.pool(args.handle)?;
        // Marked under the pool's lock alone (it hands out nothing from now on), its handle
        // taken out under the file's, and its cache given back with neither held: the file's
        // other calls do not wait for the give-back.
        pool.begin_destroy()?;
        let _gone = self.inner.lock().pools.remove(args.handle);
        pool.close();
        Ok(())
    }

    /// `RUVM_IOCTL_POOL_GET`.
    pub(super) fn pool_get(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_pool_info>(user)?;
        let pool = self.pool(args.handle)?;
        let a = pool.attrs();
        (args.backing, args.gpu) = match pool.vid_gpu() {
            None => (uapi::ruvm_backing_RUVM_BACKING_SYSMEM, 0),
            Some(g) => (uapi::ruvm_backing_RUVM_BACKING_VIDMEM, g.id),
        };
        args.release_threshold = a.release_threshold;
        args.reserved_current = a.reserved;
        args.reserved_high = a.reserved_high;
        args.used_current = a.used;
        args.used_high = a.used_high;
        args.hits = a.hits;
        args.misses = a.misses;
        args.cached_chunks = a.cached_chunks;
        args.chunk_size = pool.chunk_size();
        args.access = a.access.bits();
        writer.write(&args)
    }

    /// `RUVM_IOCTL_POOL_SET`.
    pub(super) fn pool_set(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_pool_set>(user)?;
        let pool = self.pool(args.handle)?;
        match (args.attr, args.value) {
            (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RELEASE_THRESHOLD, v) => pool.set_threshold(v),
            (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RESERVED_HIGH, 0) => pool.reset_high(true),
            (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_USED_HIGH, 0) => pool.reset_high(false),
            _ => return Err(EINVAL),
        }
        Ok(())
    }

    /// `RUVM_IOCTL_POOL_TRIM`.
    pub(super) fn pool_trim(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_pool_trim>(user)?;
        let pool = self.pool(args.handle)?;
        args.released = pool.trim(args.min_bytes_to_keep);
        writer.write(&args)
    }

    /// `RUVM_IOCTL_POOL_SET_ACCESS`, in the order ruvm.rst lists: `ENOENT` not a pool of the
    /// file; `EINVAL` a vidmem pool; `ENODEV` a GPU id no set can hold (64 or more), or
    /// granting a GPU that is not bound. Any other id may be revoked.
    pub(super) fn pool_set_access(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_pool_access>(user)?;
        let pool = self.pool(args.handle)?;
        let revoke = args.flags & uapi::ruvm_pool_access_flags_RUVM_POOL_ACCESS_REVOKE != 0;
        if pool.vid_gpu().is_some() {
            // Vidmem is reached by its own GPU only (no peer access).
            return Err(EINVAL);
        }
        if args.gpu >= GpuSet::IDS {
            return Err(ENODEV);
        }
        if revoke {
            return pool.set_access(args.gpu, false);
        }
        // Granted under an access guard: a GPU whose removal has begun is refused (`ENODEV`),
        // and one that is bound stays so until the grant is in the set, where its removal
        // finds it.
        let gpu = gpu::get(args.gpu)?;
        let _access = gpu.access()?;
        pool.set_access(args.gpu, true)
    }
}
