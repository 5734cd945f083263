// SPDX-License-Identifier: GPL-2.0

//! The sharing ioctls: what a user address is (pointer attributes).

use kernel::{prelude::*, sync::Arc, uaccess::UserSlice};

use crate::{mem::Handle, uapi};

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
            // The calling file's handle of the mem, if it has one: its table at the mem's
            // mmap offset names this very mem.
            let handle = {
                let inner = self.inner.lock();
                let h = inner.offsets.get(&p.mem.mmap_offset()).copied();
                h.filter(|h| {
                    inner
                        .mems
                        .get(h)
                        .is_some_and(|e| Arc::ptr_eq(&e.mem, &p.mem))
                })
            };
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
            args.offset = p.offset;
            args.base = addr - p.offset;
            args.size = info.size;
            args.physical_size = info.layout.physical_size;
            args.chunk_size = info.layout.chunk_size;
            // Another file's pool handle means nothing here (and is not this file's to know).
            args.pool = if mine { p.pool } else { 0 };
            args.mapped_gpus = info.mapped_gpus.bits();
            args.backing = uapi::ruvm_backing_RUVM_BACKING_SYSMEM;
        }
        writer.write(&args)
    }
}
