// SPDX-License-Identifier: GPL-2.0

//! The mem ioctls: allocate, free, query, the CPU kernel mapping, and the kernel-side fill,
//! verify and copy.

use kernel::{fs::File, prelude::*, uaccess::UserSlice};

use crate::{
    mem::{cpu::Fill, AllocRequest, Handle, Mem, Origin},
    uapi,
};

use super::{args, max_alloc_bytes, RuvmFile};

impl RuvmFile {
    /// `RUVM_IOCTL_MEM_ALLOC`.
    pub(super) fn mem_alloc(&self, file: &File, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_alloc>(user)?;
        // A sparse mem is sysmem of no pool and one chunk size: refused before anything is
        // looked up.
        let sparse = args.flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_SPARSE != 0;
        let fallback = args.flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK != 0;
        let map_user = args.flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_MAP_USER != 0;
        let sysmem = args.backing == uapi::ruvm_backing_RUVM_BACKING_SYSMEM;
        if sparse && (!sysmem || args.pool != 0 || fallback) {
            return Err(EINVAL);
        }
        // The CPU maps sysmem only.
        if map_user && !sysmem {
            return Err(EINVAL);
        }
        let gpu = match args.backing {
            uapi::ruvm_backing_RUVM_BACKING_SYSMEM if args.gpu == 0 => None,
            uapi::ruvm_backing_RUVM_BACKING_VIDMEM => Some(crate::gpu::get(args.gpu)?),
            _ => return Err(EINVAL),
        };
        let pool = match args.pool {
            0 => None,
            h => Some(self.own_pool(h)?),
        };
        let req = AllocRequest {
            gpu,
            size: args.size,
            page_size: args.page_size,
            zero: args.flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO != 0,
            fallback,
            sparse,
            map_user,
            max_bytes: max_alloc_bytes(),
            pool,
        };
        let mem = Mem::alloc(&req, &self.quota, Origin::here("MEM_ALLOC"))?;
        let layout = mem.layout();
        args.chunk_size = layout.chunk_size;
        args.chunk_count = layout.chunk_count;
        args.mmap_offset = mem.mmap_offset();
        // Kept to commit it once the caller knows the handle.
        let made = mem.clone();
        let handle = self.insert(mem)?;
        args.handle = handle.0;
        if map_user {
            // No lock of the file's or the mem's is held: the mmap handler runs under the
            // caller's mmap lock and takes them.
            match made.map_into_caller(file) {
                Ok(addr) => args.user_addr = addr as u64,
                Err(e) => {
                    self.free_unlearned(file, handle);
                    return Err(e);
                }
            }
        }
        if let Err(e) = writer.write(&args) {
            self.free_unlearned(file, handle);
            return Err(e);
        }
        made.commit();
        Ok(())
    }

    /// Frees a new mem whose handle its caller could not learn: nothing half-done stays behind.
    /// Freed as `MEM_FREE` frees: another thread may have guessed the mmap offset and mapped it
    /// meanwhile, and its pages are zapped like any freed mem's.
    pub(super) fn free_unlearned(&self, file: &File, handle: Handle) {
        if let Some(mem) = self.remove(handle) {
            let mut retired = mem.retire();
            let _ = mem.zap_user(file, &mut retired);
            drop(retired);
            mem.unmap_from_caller();
        }
    }

    /// `RUVM_IOCTL_MEM_FREE`, in uvm_mem's order: the handle goes, the mem is marked freed, its
    /// user mappings are zapped (later accesses fault), then its kernel mapping and DMA tables
    /// go; the chunks go when the last reference does.
    pub(super) fn mem_free(&self, file: &File, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_mem_handle>(user)?;
        let mem = self.remove(Handle(args.handle)).ok_or(ENOENT)?;
        let mut retired = mem.retire();
        let zapped = mem.zap_user(file, &mut retired);
        drop(retired);
        mem.unmap_from_caller();
        zapped
    }

    /// `RUVM_IOCTL_MEM_RANGE`: populates or releases a range of a sparse mem.
    pub(super) fn mem_range(&self, file: &File, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_range>(user)?;
        let mem = self.mem(args.handle)?;
        args.resident = match args.op {
            uapi::ruvm_range_op_RUVM_RANGE_POPULATE => {
                mem.populate(&self.quota, args.offset, args.length)?
            }
            uapi::ruvm_range_op_RUVM_RANGE_RELEASE => {
                mem.release(file, args.offset, args.length)?
            }
            _ => return Err(EINVAL),
        };
        writer.write(&args)
    }

    /// `RUVM_IOCTL_MEM_QUERY`.
    pub(super) fn mem_query(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_query>(user)?;
        let info = self.mem(args.handle)?.info();
        (args.backing, args.gpu) = match info.vidmem_gpu {
            None => (uapi::ruvm_backing_RUVM_BACKING_SYSMEM, 0),
            Some(gpu) => (uapi::ruvm_backing_RUVM_BACKING_VIDMEM, gpu),
        };
        args.pad = 0;
        args.size = info.size;
        args.physical_size = info.layout.physical_size;
        args.chunk_size = info.layout.chunk_size;
        args.chunk_count = info.layout.chunk_count;
        args.mmap_offset = info.mmap_offset;
        args.mapped = 0;
        if info.cpu_kernel {
            args.mapped |= u64::from(uapi::ruvm_mapped_RUVM_MAPPED_CPU_KERNEL);
        }
        if info.user_mappings > 0 {
            args.mapped |= u64::from(uapi::ruvm_mapped_RUVM_MAPPED_CPU_USER);
        }
        args.gpu_kernel_va = 0;
        if let Some(va) = info.gpu_kernel {
            args.mapped |= u64::from(uapi::ruvm_mapped_RUVM_MAPPED_GPU_KERNEL);
            args.gpu_kernel_va = va;
        }
        if info.gpu_user {
            args.mapped |= u64::from(uapi::ruvm_mapped_RUVM_MAPPED_GPU_USER);
        }
        args.user_mappings = info.user_mappings;
        args.alloc_flags = info.alloc_flags;
        args.mapped_gpus = info.mapped_gpus.bits();
        writer.write(&args)
    }

    /// `RUVM_IOCTL_MEM_MAP_CPU_KERNEL` and `RUVM_IOCTL_MEM_UNMAP_CPU_KERNEL`, both idempotent.
    pub(super) fn mem_map_cpu_kernel(&self, user: UserSlice, map: bool) -> Result {
        let args = args::read::<uapi::ruvm_mem_handle>(user)?;
        let mem = self.mem(args.handle)?;
        if map {
            mem.map_cpu_kernel()
        } else {
            mem.unmap_cpu_kernel();
            Ok(())
        }
    }

    /// `RUVM_IOCTL_MEM_FILL` and `RUVM_IOCTL_MEM_VERIFY`.
    pub(super) fn mem_fill(&self, user: UserSlice, verify: bool) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_fill>(user)?;
        let fill = match args.kind {
            uapi::ruvm_fill_kind_RUVM_FILL_PATTERN => Fill::Pattern(args.seed),
            // CAST: the byte fill uses the seed's low 8 bits, as documented.
            uapi::ruvm_fill_kind_RUVM_FILL_BYTE => Fill::Byte(args.seed as u8),
            _ => return Err(EINVAL),
        };
        let mem = self.mem(args.handle)?;
        if verify {
            (args.mismatches, args.first_mismatch) = mem.verify(args.offset, args.length, fill)?;
            writer.write(&args)
        } else {
            mem.fill(args.offset, args.length, fill)
        }
    }

    /// `RUVM_IOCTL_MEM_COPY`.
    pub(super) fn mem_copy(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_mem_copy>(user)?;
        let dst = self.mem(args.dst_handle)?;
        let src = self.mem(args.src_handle)?;
        Mem::copy(&dst, args.dst_offset, &src, args.src_offset, args.length)
    }
}
