// SPDX-License-Identifier: GPL-2.0

//! The sharing ioctls: what a user address is (pointer attributes), and IPC pools (a pool as a
//! descriptor, a mem as export data, and their imports).

use kernel::{fs::File, prelude::*, sync::Arc, uaccess::UserSlice};

use crate::{
    mem::{share, Handle, Mem, Origin},
    uapi,
};

use super::{args, RuvmFile};

impl RuvmFile {
    /// `RUVM_IOCTL_PTR_ATTRS`: never an error for an address that is not ruvm memory.
    pub(super) fn ptr_attrs(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_ptr_attrs>(user)?;
        let addr = args.addr;
        // Every output starts at 0 (what an address that is not ruvm memory answers).
        (args.type_, args.handle, args.offset, args.base) = (0, 0, 0, 0);
        (args.size, args.physical_size, args.chunk_size) = (0, 0, 0);
        (args.pool, args.mapped_gpus, args.backing, args.ptr_flags) = (0, 0, 0, 0);
        let found = usize::try_from(addr)
            .ok()
            .and_then(crate::mem::Mem::at_user);
        if let Some(p) = found {
            let info = p.mem.info();
            let handle = self.handle_of(&p.mem);
            args.type_ = uapi::ruvm_ptr_type_RUVM_PTR_MEM;
            let mine = p.owner == self.quota.id();
            // Not in this file's table but made for it: being freed (its handle just went)
            // or freed; another file's: freed if it was.
            let freed = p.freed || (handle.is_none() && (mine || p.mem.is_freed()));
            args.handle = handle.map_or(0, |Handle(h)| h);
            if freed {
                args.ptr_flags |= uapi::ruvm_ptr_flags_RUVM_PTR_FREED;
            } else if handle.is_none() {
                args.ptr_flags |= uapi::ruvm_ptr_flags_RUVM_PTR_OTHER_FILE;
            }
            if p.imported {
                args.ptr_flags |= uapi::ruvm_ptr_flags_RUVM_PTR_IMPORTED;
            }
            args.offset = p.offset;
            args.base = addr - p.offset;
            args.size = info.size;
            args.physical_size = info.layout.physical_size;
            args.chunk_size = info.layout.chunk_size;
            // Another file's pool handle means nothing here (and is not this file's to know).
            args.pool = if mine { p.pool } else { 0 };
            args.mapped_gpus = info.mapped_gpus.bits();
            args.backing = uapi::ruvm_backing_RUVM_BACKING_SYSMEM;
        } else if let Some((handle, offset, mem)) = self.registration_at(addr) {
            let info = mem.info();
            args.type_ = uapi::ruvm_ptr_type_RUVM_PTR_MEM;
            args.ptr_flags = uapi::ruvm_ptr_flags_RUVM_PTR_REGISTERED;
            args.handle = handle.0;
            args.offset = offset;
            args.base = addr - offset;
            args.size = info.size;
            args.physical_size = info.layout.physical_size;
            args.chunk_size = info.layout.chunk_size;
            args.mapped_gpus = info.mapped_gpus.bits();
            args.backing = uapi::ruvm_backing_RUVM_BACKING_SYSMEM;
        }
        writer.write(&args)
    }

    /// The calling file's registration holding `addr` in the calling process: its handle,
    /// `addr`'s offset in it and the mem.
    fn registration_at(&self, addr: u64) -> Option<(Handle, u64, Arc<Mem>)> {
        let (handle, offset) = self.registered_at(addr)?;
        let mem = self.mem(handle.0).ok()?;
        Some((handle, offset, mem))
    }

    /// The calling file's handle of `mem`, if it has one: its table at the mem's mmap offset
    /// names this very mem.
    fn handle_of(&self, mem: &Arc<Mem>) -> Option<Handle> {
        let inner = self.inner.lock();
        let h = inner.offsets.get(&mem.mmap_offset()).copied();
        h.filter(|h| inner.mems.get(h).is_some_and(|e| Arc::ptr_eq(&e.mem, mem)))
    }

    /// The handle and offset of the file's mem that the calling process maps at `addr`
    /// (`RUVM_OP_*_PTR`): `ENOENT` if there is none (no mapping of a mem there, another
    /// file's mem, a freed one).
    pub(super) fn handle_at(&self, addr: u64) -> Result<(u64, u64)> {
        let Some(p) = usize::try_from(addr)
            .ok()
            .and_then(crate::mem::Mem::at_user)
        else {
            // A range the file registered in the calling process.
            let (Handle(h), offset, _) = self.registration_at(addr).ok_or(ENOENT)?;
            return Ok((h, offset));
        };
        if p.freed {
            return Err(ENOENT);
        }
        let Handle(h) = self.handle_of(&p.mem).ok_or(ENOENT)?;
        Ok((h, p.offset))
    }

    /// One side of a copy: mem `value` at `offset`, or with `by_ptr` the file's mem the
    /// calling process maps at address `value` (`offset` must be 0: `EINVAL`), at the
    /// address's offset.
    pub(super) fn side(&self, value: u64, offset: u64, by_ptr: bool) -> Result<(Arc<Mem>, u64)> {
        if !by_ptr {
            return Ok((self.mem(value)?, offset));
        }
        let (h, at) = self.handle_at(value)?;
        Ok((self.mem(h)?, at))
    }

    /// `RUVM_IOCTL_POOL_EXPORT`: a new descriptor for an exportable pool of the file.
    pub(super) fn pool_export(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_pool_export>(user)?;
        let pool = self.own_pool(args.handle)?;
        let exported = share::export_pool(pool)?;
        args.fd = i32::try_from(exported.fd())?;
        // Not installed unless the caller learns its number (dropped, the file is released).
        writer.write(&args)?;
        exported.install();
        Ok(())
    }

    /// `RUVM_IOCTL_POOL_IMPORT`: the pool of a descriptor enters the file's table (once).
    pub(super) fn pool_import(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_pool_import>(user)?;
        let pool = share::pool_of_fd(args.fd)?;
        args.handle = pool.id();
        let present = self.inner.lock().pools.get(pool.id()).is_some();
        if !present {
            // Destroyed, or its file closed (read without the file's lock: a destroy racing
            // the import may come after it, as if it had been made later).
            if pool.is_closed() {
                return Err(ENOENT);
            }
            let mut inner = self.inner.lock();
            if inner.pools.get(pool.id()).is_none() {
                let slot = inner.pools.slot()?;
                inner.pools.insert(slot, pool);
            }
        }
        // A caller that does not learn the handle can still name it (it is the pool's own,
        // the same in every file): the import stays, as a second import would.
        writer.write(&args)
    }

    /// `RUVM_IOCTL_MEM_EXPORT`.
    pub(super) fn mem_export(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_export>(user)?;
        let mem = self.mem(args.handle)?;
        (args.pool, args.data) = mem.export_data()?;
        writer.write(&args)
    }

    /// `RUVM_IOCTL_MEM_IMPORT`: a new mem of the file sharing an exported mem's chunks.
    pub(super) fn mem_import(&self, file: &File, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_import>(user)?;
        let pool = self.pool(args.pool)?;
        if !pool.exportable() {
            return Err(EINVAL);
        }
        // The exporter's file closed (its pool with it): its mems are going.
        if pool.is_closed() {
            return Err(ENOENT);
        }
        let mem = Mem::import(&args.data, &pool, &self.quota, Origin::here("MEM_IMPORT"))?;
        self.hand_out(file, mem, |h, offset, size| {
            (args.handle, args.mmap_offset, args.size) = (h, offset, size);
            writer.write(&args)
        })
    }

    /// Enters imported mem `mem` in the file's table and tells the caller (`tell`: its handle,
    /// mmap offset and size); if the caller cannot learn them, the mem is freed as `MEM_FREE`
    /// frees (see `mem_alloc`).
    fn hand_out(
        &self,
        file: &File,
        mem: Arc<Mem>,
        tell: impl FnOnce(u64, u64, u64) -> Result,
    ) -> Result {
        let (offset, size) = (mem.mmap_offset(), mem.info().size);
        let handle = self.insert(mem)?;
        if let Err(e) = tell(handle.0, offset, size) {
            self.free_unlearned(file, handle);
            return Err(e);
        }
        Ok(())
    }
}

impl RuvmFile {
    /// `RUVM_IOCTL_MEM_EXPORT_DMABUF`: a new dma-buf of a sysmem mem of the file.
    pub(super) fn mem_export_dmabuf(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_export_dmabuf>(user)?;
        let mem = self.mem(args.handle)?;
        let exported = mem.export_dmabuf()?;
        args.fd = i32::try_from(exported.fd())?;
        // Not installed unless the caller learns its number (dropped, the buffer is released).
        writer.write(&args)?;
        exported.install();
        Ok(())
    }

    /// `RUVM_IOCTL_MEM_IMPORT_DMABUF`: a new mem of the file sharing a dma-buf's pages.
    pub(super) fn mem_import_dmabuf(&self, file: &File, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_import_dmabuf>(user)?;
        let mem = Mem::import_dmabuf(args.fd, &self.quota, Origin::here("MEM_IMPORT_DMABUF"))?;
        self.hand_out(file, mem, |h, offset, size| {
            (args.handle, args.mmap_offset, args.size) = (h, offset, size);
            writer.write(&args)
        })
    }
}
