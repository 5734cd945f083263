// SPDX-License-Identifier: GPL-2.0

//! The GPU ioctls: the registry and the host GPUs attached to it, a mem's DMA tables and GPU
//! addresses, copy-engine copies and the PMM's statistics and leak check.

use kernel::{
    prelude::*,
    sync::Arc,
    uaccess::{UserPtr, UserSlice},
};

use crate::{bind::cred, gpu, mem::Mem, uapi};

use super::{args, RuvmFile};

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

    /// `RUVM_IOCTL_CE_COPY`.
    pub(super) fn ce_copy(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_ce_copy>(user)?;
        let dst = self.mem(args.dst_handle)?;
        let src = self.mem(args.src_handle)?;
        let gpu = gpu::get(args.gpu)?;
        Mem::ce_copy(
            &gpu,
            &dst,
            args.dst_offset,
            &src,
            args.src_offset,
            args.length,
        )
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
    let s = pmm_of(args.gpu)?.stats();
    args.capacity = s.capacity;
    args.free = s.free;
    args.allocated = s.allocated;
    args.roots = s.roots;
    args.roots_used = s.roots_used;
    args.roots_split = s.roots_split;
    args.roots_stored = s.roots_stored;
    writer.write(&args)
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
