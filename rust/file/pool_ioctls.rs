// SPDX-License-Identifier: GPL-2.0

//! The pool ioctls: make and destroy a file's pools, read and set their attributes, trim
//! them, and set which GPUs their chunks stay DMA-mapped for.

use kernel::{prelude::*, sync::Arc, uaccess::UserSlice};

use crate::{
    gpu::{self, set::GpuSet},
    mem::pool::{self, pending, Pool},
    uapi,
};

use super::{args, RuvmFile};

impl RuvmFile {
    /// The file's pool `handle` (its own, or imported), or `ENOENT`.
    pub(super) fn pool(&self, handle: u64) -> Result<Arc<Pool>> {
        self.inner.lock().pools.get(handle).ok_or(ENOENT)
    }

    /// The file's own pool `handle`: `ENOENT` if the file has none of that handle, `EINVAL`
    /// if it is imported (an imported pool serves `POOL_GET`, `MEM_IMPORT` and
    /// `POOL_DESTROY` only).
    pub(super) fn own_pool(&self, handle: u64) -> Result<Arc<Pool>> {
        let pool = self.pool(handle)?;
        if !self.owns(&pool) {
            return Err(EINVAL);
        }
        Ok(pool)
    }

    /// Whether the file made `pool` (else it imported it): [`Pool::made_by`].
    fn owns(&self, pool: &Pool) -> bool {
        pool.made_by(self.quota.id())
    }

    /// `RUVM_IOCTL_POOL_CREATE`.
    pub(super) fn pool_create(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_pool_create>(user)?;
        let quota = &self.quota;
        let (threshold, page_size) = (args.release_threshold, args.page_size);
        // A place in the file's table first: the file's limit, and memory for the entry
        // (charged to the caller), are had before the pool is made.
        let slot = self.inner.lock().pools.slot()?;
        let exportable = args.flags & uapi::ruvm_pool_create_flags_RUVM_POOL_EXPORTABLE != 0;
        let made = match args.backing {
            uapi::ruvm_backing_RUVM_BACKING_SYSMEM if args.gpu == 0 => {
                pool::create(quota, page_size, threshold, exportable)
            }
            // Only sysmem chunks can be shared.
            uapi::ruvm_backing_RUVM_BACKING_VIDMEM if !exportable => {
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

    /// `RUVM_IOCTL_POOL_DESTROY`: `EBUSY` while a mem of the pool holds its chunks, or for a
    /// GPU's default pool.
    pub(super) fn pool_destroy(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_pool_handle>(user)?;
        let pool = {
            let mut inner = self.inner.lock();
            let pool = inner.pools.get(args.handle).ok_or(ENOENT)?;
            if !self.owns(&pool) {
                // An imported pool leaves this file only (its mems keep their chunks).
                let _gone = inner.pools.remove(args.handle);
                drop(inner);
                return Ok(());
            }
            if inner.pools.gpus.iter().any(|g| g.default == args.handle) {
                return Err(EBUSY);
            }
            pool
        };
        // Marked under the pool's lock alone (it hands out nothing from now on), its handle
        // taken out under the file's, and its cache given back with neither held: the file's
        // other calls do not wait for the give-back.
        pool.begin_destroy()?;
        let _gone = {
            let mut inner = self.inner.lock();
            // A GPU whose current pool it was has its default again.
            for g in inner.pools.gpus.iter_mut() {
                if g.current == args.handle {
                    g.current = 0;
                }
            }
            inner.pools.remove(args.handle)
        };
        pool.close();
        Ok(())
    }

    /// The current pool of GPU `gpu` for the file (`RUVM_OP_ALLOC` from pool 0): the one set,
    /// else its default, made now if it was not yet.
    pub(super) fn current_pool(&self, gpu: u32) -> Result<Arc<Pool>> {
        {
            let mut inner = self.inner.lock();
            let pools = &mut inner.pools;
            let handle = pools.of_gpu(gpu).map(|g| match g.current {
                0 => (g.default, true),
                h => (h, false),
            });
            if let Some((h, default)) = handle.filter(|&(h, _)| h != 0) {
                if let Some(p) = pools.get(h) {
                    drop(inner);
                    if default && !p.access().contains(gpu) {
                        // Its GPU was removed (which took it out of the set) and came back:
                        // the default pool is the GPU's again.
                        let dev = gpu::get(gpu)?;
                        let _access = dev.access()?;
                        p.set_access(gpu, true)?;
                    }
                    return Ok(p);
                }
            }
        }
        self.default_pool(gpu)
    }

    /// Makes GPU `gpu`'s default pool for the file: sysmem, DMA-mapped for the GPU, release
    /// threshold 0 (CUDA's default), counted in the file's pools.
    fn default_pool(&self, gpu: u32) -> Result<Arc<Pool>> {
        let dev = gpu::get(gpu)?;
        let slot = {
            let mut inner = self.inner.lock();
            let pools = &mut inner.pools;
            if pools.of_gpu(gpu).is_none() {
                pools.gpus.push(
                    super::GpuPools {
                        gpu,
                        default: 0,
                        current: 0,
                    },
                    GFP_KERNEL_ACCOUNT,
                )?;
            }
            pools.slot()?
        };
        let made = pool::create(&self.quota, 0, 0, false).and_then(|p| {
            // Granted under an access guard, as POOL_SET_ACCESS grants.
            let granted = dev.access().and_then(|_access| p.set_access(gpu, true));
            match granted {
                Ok(()) => Ok(p),
                Err(e) => {
                    p.close();
                    Err(e)
                }
            }
        });
        let pool = match made {
            Ok(p) => p,
            Err(e) => {
                self.inner.lock().pools.unused(slot);
                return Err(e);
            }
        };
        let mut inner = self.inner.lock();
        let pools = &mut inner.pools;
        let raced = match pools.of_gpu(gpu) {
            Some(g) if g.default == 0 => {
                g.default = pool.id();
                None
            }
            Some(g) => Some(g.default),
            // Entered above, and entries never go.
            None => None,
        };
        let raced = raced.and_then(|h| pools.get(h));
        if let Some(p) = raced {
            // Another call made it meanwhile.
            pools.unused(slot);
            drop(inner);
            pool.close();
            return Ok(p);
        }
        pools.insert(slot, pool.clone());
        Ok(pool)
    }

    /// `RUVM_IOCTL_GPU_POOL`: reads a GPU's current pool (its default made if need be), or sets
    /// it.
    pub(super) fn gpu_pool(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_gpu_pool>(user)?;
        gpu::get(args.gpu)?;
        if args.flags & uapi::ruvm_gpu_pool_flags_RUVM_GPU_POOL_SET == 0 {
            args.pool = self.current_pool(args.gpu)?.id();
            return writer.write(&args);
        }
        if args.pool != 0 && self.own_pool(args.pool)?.vid_gpu().is_some() {
            return Err(EINVAL);
        }
        let mut inner = self.inner.lock();
        let pools = &mut inner.pools;
        // Destroyed meanwhile.
        if args.pool != 0 && pools.get(args.pool).is_none() {
            return Err(ENOENT);
        }
        match pools.of_gpu(args.gpu) {
            Some(g) => g.current = args.pool,
            None if args.pool == 0 => {}
            None => pools.gpus.push(
                super::GpuPools {
                    gpu: args.gpu,
                    default: 0,
                    current: args.pool,
                },
                GFP_KERNEL_ACCOUNT,
            )?,
        }
        Ok(())
    }

    /// After a synchronize (`every`: of every stream of the file): every pool of the file
    /// caches the frees observed, and gives back what it holds above its release threshold.
    /// Without memory to list them, the pools settle at the next synchronize (what was
    /// observed stays so).
    pub(super) fn settle_pools(&self, every: bool) {
        let pools = {
            let inner = self.inner.lock();
            let Ok(mut v) = KVec::with_capacity(inner.pools.count, GFP_KERNEL) else {
                return;
            };
            // An imported pool's frees are its own file's to observe.
            for p in inner.pools.pools.values().filter(|p| self.owns(p)) {
                // Within the room reserved: cannot fail.
                let _ = v.push_within_capacity(p.clone());
            }
            v
        };
        for p in pools.iter() {
            p.settle(every);
        }
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
        args.reuse = a.reuse;
        args.pending_bytes = a.pending;
        if pool.exportable() {
            args.pool_flags |= uapi::ruvm_pool_flags_RUVM_POOL_FLAG_EXPORTABLE;
        }
        if !self.owns(&pool) {
            args.pool_flags |= uapi::ruvm_pool_flags_RUVM_POOL_FLAG_IMPORTED;
        }
        writer.write(&args)
    }

    /// `RUVM_IOCTL_POOL_SET`.
    pub(super) fn pool_set(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_pool_set>(user)?;
        let pool = self.own_pool(args.handle)?;
        match (args.attr, args.value) {
            (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RELEASE_THRESHOLD, v) => pool.set_threshold(v),
            (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RESERVED_HIGH, 0) => pool.reset_high(true),
            (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_USED_HIGH, 0) => pool.reset_high(false),
            (attr, v @ (0 | 1)) => {
                let bit = match attr {
                    uapi::ruvm_pool_attr_RUVM_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES => {
                        pending::FOLLOW_EVENTS
                    }
                    uapi::ruvm_pool_attr_RUVM_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC => {
                        pending::OPPORTUNISTIC
                    }
                    uapi::ruvm_pool_attr_RUVM_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                        pending::INTERNAL_DEPS
                    }
                    _ => return Err(EINVAL),
                };
                pool.set_reuse(bit, v == 1);
            }
            _ => return Err(EINVAL),
        }
        Ok(())
    }

    /// `RUVM_IOCTL_POOL_TRIM`.
    pub(super) fn pool_trim(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_pool_trim>(user)?;
        let pool = self.own_pool(args.handle)?;
        args.released = pool.trim(args.min_bytes_to_keep);
        writer.write(&args)
    }

    /// `RUVM_IOCTL_POOL_SET_ACCESS`, in the order ruvm.rst lists: `ENOENT` not a pool of the
    /// file; `EINVAL` an imported or a vidmem pool; `ENODEV` a GPU id no set can hold (64 or more), or
    /// granting a GPU that is not bound. Any other id may be revoked.
    pub(super) fn pool_set_access(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_pool_access>(user)?;
        let pool = self.own_pool(args.handle)?;
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
