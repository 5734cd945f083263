// SPDX-License-Identifier: GPL-2.0

//! Pools, their sharing between processes (IPC) and as dma-bufs, a GPU's current pool, and
//! pointer attributes: `Ruvm`'s calls for them.

use super::*;

impl Ruvm {
    /// `RUVM_IOCTL_MEM_ALLOC` of sysmem from pool `pool`.
    pub fn pool_alloc(
        &self,
        pool: u64,
        size: u64,
        flags: u32,
    ) -> Result<uapi::ruvm_mem_alloc, Errno> {
        let mut a = uapi::ruvm_mem_alloc {
            size,
            flags,
            pool,
            backing: uapi::ruvm_backing_RUVM_BACKING_SYSMEM,
            ..Default::default()
        };
        self.call(cmd::MEM_ALLOC, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_POOL_CREATE` of a sysmem pool: its handle and chunk size.
    pub fn pool_create(&self, page_size: u64, release_threshold: u64) -> Result<(u64, u64), Errno> {
        self.pool_create_flags(page_size, release_threshold, 0)
    }

    /// `RUVM_IOCTL_POOL_CREATE` of a sysmem pool with `flags` (`enum ruvm_pool_create_flags`,
    /// e.g. `RUVM_POOL_EXPORTABLE`): its handle and chunk size.
    pub fn pool_create_flags(
        &self,
        page_size: u64,
        release_threshold: u64,
        flags: u32,
    ) -> Result<(u64, u64), Errno> {
        let mut a = uapi::ruvm_pool_create {
            page_size,
            release_threshold,
            backing: uapi::ruvm_backing_RUVM_BACKING_SYSMEM,
            flags,
            ..Default::default()
        };
        self.call(cmd::POOL_CREATE, &mut a)?;
        Ok((a.handle, a.chunk_size))
    }

    /// `RUVM_IOCTL_POOL_EXPORT`: a new close-on-exec descriptor for exportable pool `pool`.
    pub fn pool_export(&self, pool: u64) -> Result<OwnedFd, Errno> {
        let mut a = uapi::ruvm_pool_export {
            handle: pool,
            ..Default::default()
        };
        self.call(cmd::POOL_EXPORT, &mut a)?;
        // SAFETY: the module installed a new descriptor, now owned by the caller.
        Ok(unsafe { OwnedFd::from_raw_fd(a.fd) })
    }

    /// `RUVM_IOCTL_POOL_IMPORT`: the handle in this file of the pool of descriptor `fd`.
    pub fn pool_import(&self, fd: BorrowedFd<'_>) -> Result<u64, Errno> {
        self.pool_import_raw(fd.as_raw_fd())
    }

    /// `RUVM_IOCTL_POOL_IMPORT` of any descriptor number (bad ones included, for tests).
    pub fn pool_import_raw(&self, fd: i32) -> Result<u64, Errno> {
        let mut a = uapi::ruvm_pool_import {
            fd,
            ..Default::default()
        };
        self.call(cmd::POOL_IMPORT, &mut a)?;
        Ok(a.handle)
    }

    /// `RUVM_IOCTL_MEM_EXPORT`: the pool of mem `handle` and its export data.
    pub fn mem_export(&self, handle: u64) -> Result<(u64, ExportData), Errno> {
        let mut a = uapi::ruvm_mem_export {
            handle,
            ..Default::default()
        };
        self.call(cmd::MEM_EXPORT, &mut a)?;
        Ok((a.pool, a.data))
    }

    /// `RUVM_IOCTL_MEM_EXPORT_DMABUF`: a new dma-buf of mem `handle` (its descriptor,
    /// close-on-exec).
    pub fn mem_export_dmabuf(&self, handle: u64) -> Result<OwnedFd, Errno> {
        let mut a = uapi::ruvm_mem_export_dmabuf {
            handle,
            ..Default::default()
        };
        self.call(cmd::MEM_EXPORT_DMABUF, &mut a)?;
        // SAFETY: the module installed a new descriptor, now owned by the caller.
        Ok(unsafe { OwnedFd::from_raw_fd(a.fd) })
    }

    /// `RUVM_IOCTL_MEM_IMPORT_DMABUF`: a new mem of this file sharing the pages of the
    /// dma-buf at descriptor `fd`: its handle, mmap offset and size.
    pub fn mem_import_dmabuf(&self, fd: RawFd) -> Result<uapi::ruvm_mem_import_dmabuf, Errno> {
        let mut a = uapi::ruvm_mem_import_dmabuf {
            fd,
            ..Default::default()
        };
        self.call(cmd::MEM_IMPORT_DMABUF, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_MEM_IMPORT`: a new mem of this file sharing the chunks of the mem `data`
    /// names, through pool `pool` (imported): its handle, mmap offset and size.
    pub fn mem_import(&self, pool: u64, data: &ExportData) -> Result<uapi::ruvm_mem_import, Errno> {
        let mut a = uapi::ruvm_mem_import {
            pool,
            data: *data,
            ..Default::default()
        };
        self.call(cmd::MEM_IMPORT, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_POOL_DESTROY`.
    pub fn pool_destroy(&self, pool: u64) -> Result<(), Errno> {
        let mut a = uapi::ruvm_pool_handle {
            handle: pool,
            ..Default::default()
        };
        self.call(cmd::POOL_DESTROY, &mut a)
    }

    /// `RUVM_IOCTL_POOL_GET`.
    pub fn pool_get(&self, pool: u64) -> Result<uapi::ruvm_pool_info, Errno> {
        let mut a = uapi::ruvm_pool_info {
            handle: pool,
            ..Default::default()
        };
        self.call(cmd::POOL_GET, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_POOL_SET` of `attr` (`enum ruvm_pool_attr`).
    pub fn pool_set(&self, pool: u64, attr: u32, value: u64) -> Result<(), Errno> {
        let mut a = uapi::ruvm_pool_set {
            handle: pool,
            attr,
            value,
            ..Default::default()
        };
        self.call(cmd::POOL_SET, &mut a)
    }

    /// `RUVM_IOCTL_POOL_TRIM`: the bytes given back.
    pub fn pool_trim(&self, pool: u64, min_bytes_to_keep: u64) -> Result<u64, Errno> {
        let mut a = uapi::ruvm_pool_trim {
            handle: pool,
            min_bytes_to_keep,
            ..Default::default()
        };
        self.call(cmd::POOL_TRIM, &mut a)?;
        Ok(a.released)
    }

    /// `RUVM_IOCTL_POOL_SET_ACCESS`: grant GPU `gpu` (or revoke it).
    pub fn pool_access(&self, pool: u64, gpu: u32, grant: bool) -> Result<(), Errno> {
        let mut a = uapi::ruvm_pool_access {
            handle: pool,
            gpu,
            flags: if grant {
                0
            } else {
                uapi::ruvm_pool_access_flags_RUVM_POOL_ACCESS_REVOKE
            },
            ..Default::default()
        };
        self.call(cmd::POOL_SET_ACCESS, &mut a)
    }

    /// `RUVM_IOCTL_POOL_SET` of one of the reuse policies of chunks freed on a stream
    /// (`policy`: one bit of `enum ruvm_pool_reuse`), on or off. `EINVAL` for a `policy` that
    /// is not one known bit (not sent).
    pub fn pool_set_reuse(&self, pool: u64, policy: u32, on: bool) -> Result<(), Errno> {
        let attr = reuse_attr(policy).ok_or(Errno::EINVAL)?;
        self.pool_set(pool, attr, u64::from(on))
    }

    /// `RUVM_IOCTL_GPU_POOL` without `RUVM_GPU_POOL_SET`: the current pool of `gpu` for this
    /// file (the one `RUVM_OP_ALLOC` with pool 0 takes from; its default pool, made now if it
    /// was not yet).
    pub fn gpu_pool_get(&self, gpu: u32) -> Result<u64, Errno> {
        let mut a = uapi::ruvm_gpu_pool {
            gpu,
            ..Default::default()
        };
        self.call(cmd::GPU_POOL, &mut a)?;
        Ok(a.pool)
    }

    /// `RUVM_IOCTL_GPU_POOL` with `RUVM_GPU_POOL_SET`: makes `pool` the current pool of `gpu`
    /// for this file (0: its default pool again).
    pub fn gpu_pool_set(&self, gpu: u32, pool: u64) -> Result<(), Errno> {
        let mut a = uapi::ruvm_gpu_pool {
            gpu,
            flags: uapi::ruvm_gpu_pool_flags_RUVM_GPU_POOL_SET,
            pool,
            ..Default::default()
        };
        self.call(cmd::GPU_POOL, &mut a)
    }

    /// `RUVM_IOCTL_PTR_ATTRS`: what address `addr` of this process is (cudaPointerGetAttributes).
    /// An address that is not in a user mapping of a mem answers `RUVM_PTR_NONE` with every
    /// other output 0, never an error.
    pub fn ptr_attrs(&self, addr: u64) -> Result<uapi::ruvm_ptr_attrs, Errno> {
        let mut a = uapi::ruvm_ptr_attrs {
            addr,
            ..Default::default()
        };
        self.call(cmd::PTR_ATTRS, &mut a)?;
        Ok(a)
    }
}
