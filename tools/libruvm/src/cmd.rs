// SPDX-License-Identifier: GPL-2.0

//! Every ioctl command of `/dev/ruvm`, typed by its argument structure.
//!
//! A [`Cmd`] pairs a command number of the uapi header with the structure it carries; building
//! one checks, at compile time, that the size encoded in the number is the structure's size.

use std::marker::PhantomData;

use crate::uapi;

/// One ioctl command whose argument structure is `T`.
pub struct Cmd<T> {
    /// The command number (`_IOWR(RUVM_IOCTL_MAGIC, nr, T)`).
    pub nr: u32,
    /// Its name in the header, for messages.
    pub name: &'static str,
    _arg: PhantomData<fn(&mut T)>,
}

impl<T> Clone for Cmd<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Cmd<T> {}

impl<T> Cmd<T> {
    /// The command `nr` carrying a `T`; fails to compile (in a `const`) if the size encoded in
    /// `nr` is not `T`'s.
    pub const fn new(nr: u32, name: &'static str) -> Self {
        // _IOC_SIZE: bits 16..30 of the number.
        assert!((nr >> 16) & 0x3fff == std::mem::size_of::<T>() as u32);
        Self {
            nr,
            name,
            _arg: PhantomData,
        }
    }
}

macro_rules! commands {
    ($($(#[$doc:meta])* $name:ident: $t:ident = $nr:ident;)*) => {$(
        $(#[$doc])*
        pub const $name: Cmd<uapi::$t> = Cmd::new(uapi::$nr, stringify!($nr));
    )*};
}

commands! {
    /// What the module is and can do.
    INFO: ruvm_info = RUVM_IOCTL_INFO;
    /// Allocate a mem.
    MEM_ALLOC: ruvm_mem_alloc = RUVM_IOCTL_MEM_ALLOC;
    /// Free a mem.
    MEM_FREE: ruvm_mem_handle = RUVM_IOCTL_MEM_FREE;
    /// What a mem is.
    MEM_QUERY: ruvm_mem_query = RUVM_IOCTL_MEM_QUERY;
    /// Map a mem for the CPU kernel.
    MEM_MAP_CPU_KERNEL: ruvm_mem_handle = RUVM_IOCTL_MEM_MAP_CPU_KERNEL;
    /// Remove a mem's CPU kernel mapping.
    MEM_UNMAP_CPU_KERNEL: ruvm_mem_handle = RUVM_IOCTL_MEM_UNMAP_CPU_KERNEL;
    /// Write a pattern through the kernel mapping.
    MEM_FILL: ruvm_mem_fill = RUVM_IOCTL_MEM_FILL;
    /// Check a pattern through the kernel mapping.
    MEM_VERIFY: ruvm_mem_fill = RUVM_IOCTL_MEM_VERIFY;
    /// Copy between mems through their kernel mappings.
    MEM_COPY: ruvm_mem_copy = RUVM_IOCTL_MEM_COPY;
    /// Populate or release a range of a sparse mem.
    MEM_RANGE: ruvm_mem_range = RUVM_IOCTL_MEM_RANGE;
    /// Make memory the process already has a mem.
    MEM_REGISTER: ruvm_mem_register = RUVM_IOCTL_MEM_REGISTER;
    /// The GPU registry.
    GPU_LIST: ruvm_gpu_list = RUVM_IOCTL_GPU_LIST;
    /// Attach a host GPU by PCI address.
    GPU_ATTACH: ruvm_gpu_attach = RUVM_IOCTL_GPU_ATTACH;
    /// Detach a host GPU by PCI address.
    GPU_DETACH: ruvm_gpu_attach = RUVM_IOCTL_GPU_DETACH;
    /// DMA-map a mem for a GPU.
    MEM_MAP_GPU: ruvm_mem_gpu = RUVM_IOCTL_MEM_MAP_GPU;
    /// Drop a mem's DMA table for a GPU.
    MEM_UNMAP_GPU: ruvm_mem_gpu = RUVM_IOCTL_MEM_UNMAP_GPU;
    /// A mem's DMA addresses for a GPU.
    MEM_DMA_ADDRS: ruvm_mem_dma_addrs = RUVM_IOCTL_MEM_DMA_ADDRS;
    /// Copy with a GPU's copy engine.
    CE_COPY: ruvm_ce_copy = RUVM_IOCTL_CE_COPY;
    /// Map a mem in a GPU's kernel VA space.
    MEM_MAP_GPU_KERNEL: ruvm_mem_gpu = RUVM_IOCTL_MEM_MAP_GPU_KERNEL;
    /// Remove a mem's mapping in a GPU's kernel VA space.
    MEM_UNMAP_GPU_KERNEL: ruvm_mem_gpu = RUVM_IOCTL_MEM_UNMAP_GPU_KERNEL;
    /// Map a mem at a user-chosen VA of a GPU.
    MEM_MAP_GPU_USER: ruvm_mem_gpu_user = RUVM_IOCTL_MEM_MAP_GPU_USER;
    /// Remove a mem's GPU user mapping.
    MEM_UNMAP_GPU_USER: ruvm_mem_gpu = RUVM_IOCTL_MEM_UNMAP_GPU_USER;
    /// Make a memory pool.
    POOL_CREATE: ruvm_pool_create = RUVM_IOCTL_POOL_CREATE;
    /// Destroy a memory pool.
    POOL_DESTROY: ruvm_pool_handle = RUVM_IOCTL_POOL_DESTROY;
    /// A pool's attributes.
    POOL_GET: ruvm_pool_info = RUVM_IOCTL_POOL_GET;
    /// Change a pool's attribute.
    POOL_SET: ruvm_pool_set = RUVM_IOCTL_POOL_SET;
    /// Give back a pool's cached memory.
    POOL_TRIM: ruvm_pool_trim = RUVM_IOCTL_POOL_TRIM;
    /// Which GPUs a pool's chunks stay DMA-mapped for.
    POOL_SET_ACCESS: ruvm_pool_access = RUVM_IOCTL_POOL_SET_ACCESS;
    /// A GPU's current pool for stream-ordered allocation, read or set.
    GPU_POOL: ruvm_gpu_pool = RUVM_IOCTL_GPU_POOL;
    /// What an address of the calling process is (pointer attributes).
    PTR_ATTRS: ruvm_ptr_attrs = RUVM_IOCTL_PTR_ATTRS;
    /// An exportable pool as a file descriptor.
    POOL_EXPORT: ruvm_pool_export = RUVM_IOCTL_POOL_EXPORT;
    /// Import a pool from its descriptor.
    POOL_IMPORT: ruvm_pool_import = RUVM_IOCTL_POOL_IMPORT;
    /// A mem's export data.
    MEM_EXPORT: ruvm_mem_export = RUVM_IOCTL_MEM_EXPORT;
    /// A mem of this file sharing an exported mem's chunks.
    MEM_IMPORT: ruvm_mem_import = RUVM_IOCTL_MEM_IMPORT;
    /// A mem as a dma-buf.
    MEM_EXPORT_DMABUF: ruvm_mem_export_dmabuf = RUVM_IOCTL_MEM_EXPORT_DMABUF;
    /// A mem of this file sharing a dma-buf's pages.
    MEM_IMPORT_DMABUF: ruvm_mem_import_dmabuf = RUVM_IOCTL_MEM_IMPORT_DMABUF;
    /// Make a stream on a GPU.
    STREAM_CREATE: ruvm_stream_create = RUVM_IOCTL_STREAM_CREATE;
    /// Destroy a stream (its queued work runs on).
    STREAM_DESTROY: ruvm_stream_handle = RUVM_IOCTL_STREAM_DESTROY;
    /// Queue operations on a stream.
    STREAM_SUBMIT: ruvm_stream_submit = RUVM_IOCTL_STREAM_SUBMIT;
    /// A stream's progress and error.
    STREAM_QUERY: ruvm_stream_query = RUVM_IOCTL_STREAM_QUERY;
    /// A stream's slot of the file's status page.
    STREAM_STATUS: ruvm_stream_status = RUVM_IOCTL_STREAM_STATUS;
    /// Wait until a stream's (or every stream's) work is done.
    STREAM_SYNC: ruvm_stream_sync = RUVM_IOCTL_STREAM_SYNC;
    /// Make an event.
    EVENT_CREATE: ruvm_event = RUVM_IOCTL_EVENT_CREATE;
    /// Destroy an event.
    EVENT_DESTROY: ruvm_event = RUVM_IOCTL_EVENT_DESTROY;
    /// Where an event was last recorded, and whether that point has signalled.
    EVENT_QUERY: ruvm_event = RUVM_IOCTL_EVENT_QUERY;
    /// Wait for an event's point.
    EVENT_SYNC: ruvm_event = RUVM_IOCTL_EVENT_SYNC;
    /// An event's point as a sync_file.
    EVENT_EXPORT: ruvm_event = RUVM_IOCTL_EVENT_EXPORT;
    /// Where a GPU sees a mem in its kernel VA space.
    MEM_GPU_VA: ruvm_mem_gpu_va = RUVM_IOCTL_MEM_GPU_VA;
    /// Copy with a GPU's copy engine through GPU virtual addresses.
    CE_COPY_VA: ruvm_ce_copy_va = RUVM_IOCTL_CE_COPY_VA;
    /// The MMU's walk of one GPU VA.
    GPU_PT_WALK: ruvm_gpu_pt_walk = RUVM_IOCTL_GPU_PT_WALK;
    /// Where a GPU reaches a range of a mem.
    MEM_GPU_PHYS: ruvm_mem_gpu_phys = RUVM_IOCTL_MEM_GPU_PHYS;
    /// A GPU's PMM.
    PMM_STATS: ruvm_pmm_stats = RUVM_IOCTL_PMM_STATS;
    /// What bounds the caller's vidmem of a GPU; set the per-user limit.
    VIDMEM_LIMIT: ruvm_vidmem_limit = RUVM_IOCTL_VIDMEM_LIMIT;
    /// uvm's PMM leak check.
    PMM_CHECK_LEAK: ruvm_pmm_check_leak = RUVM_IOCTL_PMM_CHECK_LEAK;
    /// The audit's counters.
    AUDIT: ruvm_audit = RUVM_IOCTL_AUDIT;
    /// Usage statistics.
    STATS: ruvm_stats = RUVM_IOCTL_STATS;
    /// In-kernel timing (privileged).
    BENCH: ruvm_bench = RUVM_IOCTL_BENCH;
    /// Where the module writes its unload verdict.
    REGISTER_UNLOAD_STATE: ruvm_register_unload_state = RUVM_IOCTL_REGISTER_UNLOAD_STATE;
    /// Test-only: misbehave on purpose.
    TEST_PLANT: ruvm_test_plant = RUVM_IOCTL_TEST_PLANT;
    /// Test-only: leak on purpose.
    TEST_LEAK: ruvm_test_leak = RUVM_IOCTL_TEST_LEAK;
    /// Test-only: one raw engine transfer.
    TEST_CE_RAW: ruvm_test_ce_raw = RUVM_IOCTL_TEST_CE_RAW;
    /// Test-only: overwrite a page-table entry.
    TEST_PT_WRITE: ruvm_test_pt_write = RUVM_IOCTL_TEST_PT_WRITE;
    /// Test-only: remove a simulated GPU, or bring it back.
    TEST_SIM_GPU: ruvm_test_sim_gpu = RUVM_IOCTL_TEST_SIM_GPU;
}
