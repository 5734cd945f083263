// SPDX-License-Identifier: GPL-2.0

//! GPUs: the registry, attaching, vidmem and its PMM, DMA tables, GPU virtual mappings, copies
//! by the engine: `Ruvm`'s calls for them.

use super::*;

impl Ruvm {
    /// `RUVM_IOCTL_MEM_ALLOC` of vidmem on `gpu`.
    pub fn vidmem_alloc(
        &self,
        gpu: u32,
        size: u64,
        page_size: u64,
        flags: u32,
    ) -> Result<uapi::ruvm_mem_alloc, Errno> {
        let mut a = uapi::ruvm_mem_alloc {
            size,
            page_size,
            flags,
            backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
            gpu,
            ..Default::default()
        };
        self.call(cmd::MEM_ALLOC, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_MEM_GPU_PHYS`: the GPU address of a range and its aperture.
    pub fn gpu_phys(
        &self,
        handle: u64,
        gpu: u32,
        offset: u64,
        length: u64,
    ) -> Result<(u64, u32), Errno> {
        let mut a = uapi::ruvm_mem_gpu_phys {
            handle,
            gpu,
            offset,
            length,
            ..Default::default()
        };
        self.call(cmd::MEM_GPU_PHYS, &mut a)?;
        Ok((a.address, a.aperture))
    }

    /// `RUVM_IOCTL_PMM_STATS`.
    pub fn pmm_stats(&self, gpu: u32) -> Result<uapi::ruvm_pmm_stats, Errno> {
        let mut a = uapi::ruvm_pmm_stats {
            gpu,
            ..Default::default()
        };
        self.call(cmd::PMM_STATS, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_VIDMEM_LIMIT`: what bounds this process's vidmem of GPU `gpu`; with `set`,
    /// first sets the per-user limit to that many bytes (0: none; `CAP_SYS_ADMIN`).
    pub fn vidmem_limit(
        &self,
        gpu: u32,
        set: Option<u64>,
    ) -> Result<uapi::ruvm_vidmem_limit, Errno> {
        let mut a = uapi::ruvm_vidmem_limit {
            gpu,
            ..Default::default()
        };
        if let Some(bytes) = set {
            a.flags = uapi::ruvm_vidmem_limit_flags_RUVM_VIDMEM_LIMIT_SET;
            a.user_limit = bytes;
        }
        self.call(cmd::VIDMEM_LIMIT, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_PMM_CHECK_LEAK`.
    pub fn pmm_check_leak(
        &self,
        gpu: u32,
        chunk_size: u64,
        alloc_limit: u64,
    ) -> Result<uapi::ruvm_pmm_check_leak, Errno> {
        let mut a = uapi::ruvm_pmm_check_leak {
            gpu,
            chunk_size,
            alloc_limit,
            ..Default::default()
        };
        self.call(cmd::PMM_CHECK_LEAK, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_GPU_LIST`: the whole registry.
    pub fn gpus(&self) -> Result<Vec<uapi::ruvm_gpu_info>, Errno> {
        let mut v = vec![uapi::ruvm_gpu_info::default(); uapi::RUVM_MAX_GPUS as usize];
        let mut a = uapi::ruvm_gpu_list {
            count: uapi::RUVM_MAX_GPUS,
            gpus: v.as_mut_ptr() as u64,
            ..Default::default()
        };
        self.call(cmd::GPU_LIST, &mut a)?;
        v.truncate(a.count as usize);
        Ok(v)
    }

    /// `RUVM_IOCTL_GPU_ATTACH` (`attach`) or `RUVM_IOCTL_GPU_DETACH` of the PCI device at
    /// `domain`:`bus`:`devfn`; returns the GPU's id.
    pub fn gpu_attach(&self, attach: bool, domain: u32, bus: u8, devfn: u8) -> Result<u32, Errno> {
        let mut a = uapi::ruvm_gpu_attach {
            pci_domain: domain,
            pci_bus: bus,
            pci_devfn: devfn,
            ..Default::default()
        };
        let cmd = if attach {
            cmd::GPU_ATTACH
        } else {
            cmd::GPU_DETACH
        };
        self.call(cmd, &mut a)?;
        Ok(a.id)
    }

    /// `RUVM_IOCTL_MEM_MAP_GPU` (`map`) or `RUVM_IOCTL_MEM_UNMAP_GPU`.
    pub fn mem_gpu(&self, map: bool, handle: u64, gpu: u32) -> Result<(), Errno> {
        let mut a = uapi::ruvm_mem_gpu {
            handle,
            gpu,
            ..Default::default()
        };
        let cmd = if map {
            cmd::MEM_MAP_GPU
        } else {
            cmd::MEM_UNMAP_GPU
        };
        self.call(cmd, &mut a)
    }

    /// `RUVM_IOCTL_MEM_MAP_GPU_KERNEL` (`map`) or `RUVM_IOCTL_MEM_UNMAP_GPU_KERNEL`.
    pub fn mem_gpu_kernel(&self, map: bool, handle: u64, gpu: u32) -> Result<(), Errno> {
        let mut a = uapi::ruvm_mem_gpu {
            handle,
            gpu,
            ..Default::default()
        };
        let cmd = if map {
            cmd::MEM_MAP_GPU_KERNEL
        } else {
            cmd::MEM_UNMAP_GPU_KERNEL
        };
        self.call(cmd, &mut a)
    }

    /// `RUVM_IOCTL_MEM_MAP_GPU_USER`: map at `va` of this file's user VA space on `gpu`.
    pub fn map_gpu_user(
        &self,
        handle: u64,
        gpu: u32,
        va: u64,
        read_only: bool,
    ) -> Result<(), Errno> {
        let mut a = uapi::ruvm_mem_gpu_user {
            handle,
            gpu,
            va,
            flags: if read_only {
                uapi::ruvm_gpu_user_flags_RUVM_GPU_USER_READ_ONLY
            } else {
                0
            },
            ..Default::default()
        };
        self.call(cmd::MEM_MAP_GPU_USER, &mut a)
    }

    /// `RUVM_IOCTL_MEM_UNMAP_GPU_USER`.
    pub fn unmap_gpu_user(&self, handle: u64, gpu: u32) -> Result<(), Errno> {
        let mut a = uapi::ruvm_mem_gpu {
            handle,
            gpu,
            ..Default::default()
        };
        self.call(cmd::MEM_UNMAP_GPU_USER, &mut a)
    }

    /// `RUVM_IOCTL_MEM_GPU_VA`: the mem's GPU VA on `gpu` (kernel, or with `user` this file's
    /// user VA) and its page size.
    pub fn gpu_va(&self, handle: u64, gpu: u32, user: bool) -> Result<(u64, u64), Errno> {
        let mut a = uapi::ruvm_mem_gpu_va {
            handle,
            gpu,
            flags: space_flags(user),
            ..Default::default()
        };
        self.call(cmd::MEM_GPU_VA, &mut a)?;
        Ok((a.va, a.page_size))
    }

    /// `RUVM_IOCTL_CE_COPY_VA`: `length` bytes from GPU VA `src` to `dst` (of the kernel VA
    /// space, or with `user` this file's).
    pub fn ce_copy_va(
        &self,
        gpu: u32,
        dst: u64,
        src: u64,
        length: u64,
        user: bool,
    ) -> Result<(), Errno> {
        let mut a = uapi::ruvm_ce_copy_va {
            gpu,
            flags: space_flags(user),
            dst_va: dst,
            src_va: src,
            length,
            ..Default::default()
        };
        self.call(cmd::CE_COPY_VA, &mut a)
    }

    /// `RUVM_IOCTL_GPU_PT_WALK`: the MMU's walk of `va`, word by word.
    pub fn pt_walk(&self, gpu: u32, va: u64, user: bool) -> Result<uapi::ruvm_gpu_pt_walk, Errno> {
        let mut a = uapi::ruvm_gpu_pt_walk {
            gpu,
            va,
            flags: space_flags(user),
            ..Default::default()
        };
        self.call(cmd::GPU_PT_WALK, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_TEST_SIM_GPU`: remove simulated GPU `gpu` (`add` false) or bring it back.
    pub fn test_sim_gpu(&self, gpu: u32, add: bool) -> Result<(), Errno> {
        let mut a = uapi::ruvm_test_sim_gpu {
            gpu,
            op: if add {
                uapi::ruvm_sim_gpu_op_RUVM_SIM_GPU_ADD
            } else {
                uapi::ruvm_sim_gpu_op_RUVM_SIM_GPU_REMOVE
            },
            ..Default::default()
        };
        self.call(cmd::TEST_SIM_GPU, &mut a)
    }

    /// `RUVM_IOCTL_TEST_PT_WRITE`: overwrite the leaf entry of `va`; returns the old one.
    pub fn test_pt_write(&self, gpu: u32, va: u64, value: u64, user: bool) -> Result<u64, Errno> {
        let mut a = uapi::ruvm_test_pt_write {
            gpu,
            flags: space_flags(user),
            va,
            value,
            ..Default::default()
        };
        self.call(cmd::TEST_PT_WRITE, &mut a)?;
        Ok(a.old)
    }

    /// `RUVM_IOCTL_MEM_DMA_ADDRS`: up to `max` addresses from chunk `first` on.
    pub fn dma_addrs(
        &self,
        handle: u64,
        gpu: u32,
        first: u64,
        max: usize,
    ) -> Result<Vec<u64>, Errno> {
        let mut v = vec![0u64; max];
        let mut a = uapi::ruvm_mem_dma_addrs {
            handle,
            gpu,
            first_chunk: first,
            count: max as u64,
            addrs: v.as_mut_ptr() as u64,
            ..Default::default()
        };
        self.call(cmd::MEM_DMA_ADDRS, &mut a)?;
        v.truncate(a.count as usize);
        Ok(v)
    }

    /// `RUVM_IOCTL_MEM_DMA_ADDRS` into `out` (chunk `first` on): how many were written.
    /// Allocates nothing.
    pub fn dma_addrs_into(
        &self,
        handle: u64,
        gpu: u32,
        first: u64,
        out: &mut [u64],
    ) -> Result<usize, Errno> {
        let mut a = uapi::ruvm_mem_dma_addrs {
            handle,
            gpu,
            first_chunk: first,
            count: out.len() as u64,
            addrs: out.as_mut_ptr() as u64,
            ..Default::default()
        };
        self.call(cmd::MEM_DMA_ADDRS, &mut a)?;
        Ok(usize::try_from(a.count).unwrap_or(0).min(out.len()))
    }

    /// `RUVM_IOCTL_CE_COPY`.
    pub fn ce_copy(
        &self,
        gpu: u32,
        dst: u64,
        dst_offset: u64,
        src: u64,
        src_offset: u64,
        length: u64,
    ) -> Result<(), Errno> {
        self.ce_copy_flags(gpu, 0, (dst, dst_offset), (src, src_offset), length)
    }

    /// `RUVM_IOCTL_CE_COPY` with `flags`: `RUVM_OP_DST_PTR` (`RUVM_OP_SRC_PTR`) names that side
    /// (handle, offset) by an address of this process instead, (address, 0).
    pub fn ce_copy_flags(
        &self,
        gpu: u32,
        flags: u32,
        (dst, dst_offset): (u64, u64),
        (src, src_offset): (u64, u64),
        length: u64,
    ) -> Result<(), Errno> {
        let mut a = uapi::ruvm_ce_copy {
            gpu,
            flags,
            dst_handle: dst,
            dst_offset,
            src_handle: src,
            src_offset,
            length,
            ..Default::default()
        };
        self.call(cmd::CE_COPY, &mut a)
    }

    /// `RUVM_IOCTL_TEST_CE_RAW`: the engine reads `len` bytes at raw DMA address `src`.
    pub fn test_ce_raw(&self, gpu: u32, src: u64, len: u64) -> Result<(), Errno> {
        let mut a = uapi::ruvm_test_ce_raw {
            gpu,
            src,
            len,
            ..Default::default()
        };
        self.call(cmd::TEST_CE_RAW, &mut a)
    }
}
