// SPDX-License-Identifier: GPL-2.0

//! The GPU ioctls: the registry and the host GPUs attached to it, a mem's DMA tables, GPU
//! virtual mappings and GPU addresses, copy-engine copies, the MMU's walk, and the PMM's
//! statistics and leak check.

use kernel::{
    prelude::*,
    sync::Arc,
    uaccess::{UserPtr, UserSlice},
};

use crate::{bind::cred, gpu, mem::Mem, uapi};

use super::{args, RuvmFile};

/// `RUVM_OP_DST_PTR` and `RUVM_OP_SRC_PTR`: a copy's side named by an address of the caller's.
const DST_PTR: u32 = uapi::ruvm_op_flags_RUVM_OP_DST_PTR;
const SRC_PTR: u32 = uapi::ruvm_op_flags_RUVM_OP_SRC_PTR;

impl RuvmFile {
    /// `RUVM_IOCTL_MEM_MAP_GPU` and `RUVM_IOCTL_MEM_UNMAP_GPU`, both idempotent.
    pub(super) fn mem_map_gpu(&self, user: UserSlice, map: bool) -> Result {
        let args = args::read::<uapi::ruvm_mem_gpu>(user)?;
        let mem = self.mem(args.handle)?;
        if map {
            let gpu = gpu::get(args.gpu)?;
            mem.map_gpu(&gpu)
        } else {
            // Unmapping needs no GPU: after a removal there is nothing left to unmap.
            mem.unmap_gpu(args.gpu);
            Ok(())
        }
    }

    /// `RUVM_IOCTL_MEM_MAP_GPU_KERNEL` and `RUVM_IOCTL_MEM_UNMAP_GPU_KERNEL`, both idempotent.
    pub(super) fn mem_map_gpu_kernel(&self, user: UserSlice, map: bool) -> Result {
        let args = args::read::<uapi::ruvm_mem_gpu>(user)?;
        let mem = self.mem(args.handle)?;
        if map {
            let gpu = gpu::get(args.gpu)?;
            mem.map_gpu_kernel(&gpu)
        } else {
            // As for the DMA table: a removed GPU left nothing to unmap.
            mem.unmap_gpu_kernel(args.gpu);
            Ok(())
        }
    }

    /// `RUVM_IOCTL_MEM_MAP_GPU_USER`.
    pub(super) fn mem_map_gpu_user(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_mem_gpu_user>(user)?;
        let mem = self.mem(args.handle)?;
        let gpu = gpu::get(args.gpu)?;
        let mmu = gpu.access()?.mmu()?.clone();
        let space = self.user_space(&mmu)?;
        let read_only = args.flags & uapi::ruvm_gpu_user_flags_RUVM_GPU_USER_READ_ONLY != 0;
        mem.map_gpu_user(&gpu, space, args.va, read_only)
    }

    /// `RUVM_IOCTL_MEM_UNMAP_GPU_USER`, idempotent.
    pub(super) fn mem_unmap_gpu_user(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_mem_gpu>(user)?;
        self.mem(args.handle)?.unmap_gpu_user(args.gpu);
        Ok(())
    }

    /// `RUVM_IOCTL_MEM_GPU_VA`.
    pub(super) fn mem_gpu_va(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_gpu_va>(user)?;
        let mem = self.mem(args.handle)?;
        gpu::get(args.gpu)?;
        let in_user = args.flags & uapi::ruvm_va_space_flags_RUVM_VA_USER != 0;
        (args.va, args.page_size) = mem.gpu_va(args.gpu, in_user)?;
        writer.write(&args)
    }

    /// `RUVM_IOCTL_CE_COPY_VA`: a copy through the GPU's kernel VA space (privileged) or the
    /// file's user VA space.
    pub(super) fn ce_copy_va(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_ce_copy_va>(user)?;
        let space = self.va_space(args.flags)?;
        let gpu = gpu::get(args.gpu)?;
        // Held across the copy: the GPU (and its page tables) cannot go meanwhile.
        let access = gpu.access()?;
        access
            .mmu()?
            .copy(space, args.dst_va, args.src_va, args.length)
    }

    /// `RUVM_IOCTL_GPU_PT_WALK` (privileged): the MMU's walk of one address, word by word.
    pub(super) fn gpu_pt_walk(&self, user: UserSlice) -> Result {
        cred::require_sys_admin()?;
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_gpu_pt_walk>(user)?;
        let space = self.va_space(args.flags)?;
        let gpu = gpu::get(args.gpu)?;
        let access = gpu.access()?;
        let w = access.mmu()?.walk(space, args.va);
        drop(access);
        args.count = u32::try_from(w.count)?;
        for (i, (ap, addr, value)) in w.reads.iter().take(w.count).enumerate() {
            if let (Some(a), Some(v), Some(p)) = (
                args.entry_addr.get_mut(i),
                args.entry.get_mut(i),
                args.entry_aperture.get_mut(i),
            ) {
                *a = *addr;
                *v = *value;
                // CAST: the two apertures are 0 and 1.
                *p = aperture(*ap) as u8;
            }
        }
        (args.fault, args.page_size, args.address, args.aperture) = match w.result {
            Ok(t) => (
                uapi::ruvm_mmu_fault_RUVM_MMU_OK,
                t.page_size,
                t.addr,
                aperture(t.pte.aperture),
            ),
            Err(f) => (fault_code(f), 0, 0, 0),
        };
        writer.write(&args)
    }

    /// `RUVM_IOCTL_CE_COPY`.
    pub(super) fn ce_copy(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_ce_copy>(user)?;
        let (dst_ptr, src_ptr) = (args.flags & DST_PTR != 0, args.flags & SRC_PTR != 0);
        // A side named by its address has no offset of its own: refused before any lookup.
        if (dst_ptr && args.dst_offset != 0) || (src_ptr && args.src_offset != 0) {
            return Err(EINVAL);
        }
        let (dst, dst_offset) = self.side(args.dst_handle, args.dst_offset, dst_ptr)?;
        let (src, src_offset) = self.side(args.src_handle, args.src_offset, src_ptr)?;
        let gpu = gpu::get(args.gpu)?;
        Mem::ce_copy(&gpu, &dst, dst_offset, &src, src_offset, args.length)
    }

    /// `RUVM_IOCTL_MEM_DMA_ADDRS` (privileged).
    pub(super) fn mem_dma_addrs(&self, user: UserSlice) -> Result {
        cred::require_sys_admin()?;
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_dma_addrs>(user)?;
        let mem = self.mem(args.handle)?;
        let room = usize::try_from(args.count).map_err(|_| EINVAL)?;
        let addrs = mem.dma_addrs(args.gpu, args.first_chunk, room)?;
        write_array(args.addrs, &addrs)?;
        args.count = addrs.len() as u64;
        writer.write(&args)
    }

    /// `RUVM_IOCTL_MEM_GPU_PHYS` (privileged).
    pub(super) fn mem_gpu_phys(&self, user: UserSlice) -> Result {
        cred::require_sys_admin()?;
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_mem_gpu_phys>(user)?;
        let mem = self.mem(args.handle)?;
        let gpu = gpu::get(args.gpu)?;
        (args.address, args.aperture) = mem.gpu_phys(&gpu, args.offset, args.length)?;
        writer.write(&args)
    }
}

/// The `enum ruvm_aperture` of an MMU aperture.
fn aperture(ap: gpu::mmu::fmt::Aperture) -> u32 {
    match ap {
        gpu::mmu::fmt::Aperture::Video | gpu::mmu::fmt::Aperture::Peer => {
            uapi::ruvm_aperture_RUVM_APERTURE_VID
        }
        _ => uapi::ruvm_aperture_RUVM_APERTURE_SYS,
    }
}

/// The `enum ruvm_mmu_fault` of a fault.
fn fault_code(f: gpu::mmu::fmt::Fault) -> u32 {
    use gpu::mmu::fmt::Fault;
    match f {
        Fault::VaRange => uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_VA_RANGE,
        Fault::NoPde(_) => uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_PDE,
        Fault::NoPte(_) => uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_PTE,
        Fault::ReadOnly => uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_READ_ONLY,
        Fault::BadTable(_) => uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_TABLE,
    }
}

/// Writes `items` to the user array at `addr`.
fn write_array<T: kernel::transmute::AsBytes>(addr: u64, items: &[T]) -> Result {
    let bytes = items
        .len()
        .checked_mul(core::mem::size_of::<T>())
        .ok_or(EOVERFLOW)?;
    let ptr = usize::try_from(addr).map_err(|_| EFAULT)?;
    let mut out = UserSlice::new(UserPtr::from_addr(ptr), bytes).writer();
    for item in items {
        out.write(item)?;
    }
    Ok(())
}

/// `RUVM_IOCTL_GPU_ATTACH` and `RUVM_IOCTL_GPU_DETACH` (privileged): a host GPU by PCI address.
pub(super) fn gpu_attach(user: UserSlice, attach: bool) -> Result {
    cred::require_sys_admin()?;
    let (mut args, mut writer) = args::read_write::<uapi::ruvm_gpu_attach>(user)?;
    let addr = gpu::PciAddr {
        domain: u16::try_from(args.pci_domain).map_err(|_| EINVAL)?,
        bus: args.pci_bus,
        devfn: args.pci_devfn,
    };
    args.id = if attach {
        gpu::host::attach(addr)?
    } else {
        gpu::host::detach(addr)?
    };
    writer.write(&args)
}

/// `RUVM_IOCTL_GPU_LIST`: the GPU registry, into the caller's array.
pub(super) fn gpu_list(user: UserSlice) -> Result {
    let (mut args, mut writer) = args::read_write::<uapi::ruvm_gpu_list>(user)?;
    // Mapped bytes counted after the releases of tables dropped before the call.
    gpu::dma::settle_releases();
    let gpus = gpu::list()?;
    let n = gpus.len().min(usize::try_from(args.count)?);
    write_array(args.gpus, gpus.get(..n).ok_or(EINVAL)?)?;
    args.count = u32::try_from(gpus.len())?;
    writer.write(&args)
}

/// The PMM of GPU `id`: `ENODEV` if it is not bound, `ENXIO` if it has no vidmem.
fn pmm_of(id: u32) -> Result<Arc<gpu::pmm::Pmm>> {
    let gpu = gpu::get(id)?;
    let access = gpu.access()?;
    let pmm = access.pmm()?.clone();
    Ok(pmm)
}

/// `RUVM_IOCTL_PMM_STATS`.
pub(super) fn pmm_stats(user: UserSlice) -> Result {
    let (mut args, mut writer) = args::read_write::<uapi::ruvm_pmm_stats>(user)?;
    let gpu = gpu::get(args.gpu)?;
    let access = gpu.access()?;
    let s = access.pmm()?.stats();
    (args.pt_tables, args.pt_bytes) = match access.mmu() {
        Ok(mmu) => {
            let (tables, _) = mmu.tables();
            (tables, tables * gpu::mmu::TABLE_BYTES)
        }
        Err(_) => (0, 0),
    };
    drop(access);
    args.capacity = s.capacity;
    args.free = s.free;
    args.allocated = s.allocated;
    args.roots = s.roots;
    args.roots_used = s.roots_used;
    args.roots_split = s.roots_split;
    args.roots_stored = s.roots_stored;
    writer.write(&args)
}

/// `RUVM_IOCTL_VIDMEM_LIMIT`: what bounds the caller's vidmem of a GPU; sets the per-user
/// limit (privileged).
pub(super) fn vidmem_limit(user: UserSlice) -> Result {
    let (mut args, mut writer) = args::read_write::<uapi::ruvm_vidmem_limit>(user)?;
    let gpu = gpu::get(args.gpu)?;
    let access = gpu.access()?;
    let pmm = access.pmm().map_err(|_| ENXIO)?;
    let set = args.flags & uapi::ruvm_vidmem_limit_flags_RUVM_VIDMEM_LIMIT_SET != 0;
    if set {
        cred::require_sys_admin()?;
    } else {
        args.user_limit = gpu::limit::user_limit();
    }
    args.capacity = pmm.capacity();
    args.region = [0; 32];
    args.dmem = 0;
    if let Some(name) = pmm.limits().region_name() {
        args.dmem = 1;
        for (d, s) in args.region.iter_mut().zip(name.to_bytes()) {
            *d = *s;
        }
    }
    drop(access);
    (args.uid, args.user_used) = gpu::limit::caller_use(args.gpu);
    writer.write(&args)?;
    // Set once the caller has the answer (the limit it set is what `user_limit` says).
    if set {
        gpu::limit::set_user_limit(args.user_limit);
    }
    Ok(())
}

/// `RUVM_IOCTL_PMM_CHECK_LEAK` (privileged).
pub(super) fn pmm_check_leak(user: UserSlice) -> Result {
    cred::require_sys_admin()?;
    let (mut args, mut writer) = args::read_write::<uapi::ruvm_pmm_check_leak>(user)?;
    if !gpu::pmm::CHUNK_SIZES.contains(&args.chunk_size) {
        return Err(EINVAL);
    }
    let (got, before, after) = pmm_of(args.gpu)?.check_leak(args.chunk_size, args.alloc_limit)?;
    args.allocated = got;
    args.free_before = before;
    args.free_after = after;
    writer.write(&args)
}
