/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * ruvm: a Rust re-creation of NVIDIA UVM's uvm_mem memory manager.
 *
 * This header is the one source of truth for the ABI of /dev/ruvm. The module and
 * ruvmctl both turn it into Rust with bindgen at build time; nothing is hand-copied.
 *
 * Conventions (Documentation/ruvm.rst has the full ABI):
 *  - Every command is _IOWR(RUVM_IOCTL_MAGIC, nr, struct ...) and returns 0 or -errno.
 *  - Fields are __u8..__u64 only, 64-bit fields 8-byte aligned, padding explicit, so the
 *    layout is the same for 32- and 64-bit callers.
 *  - Every struct has a `flags` field and reserved space; today both must be zero (EINVAL
 *    otherwise), so later versions can give them meaning without a new command.
 *  - (in) fields are read by the module, (out) fields are written by it.
 */
#ifndef _UAPI_LINUX_RUVM_H
#define _UAPI_LINUX_RUVM_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* Bumped on any incompatible change; compatible additions add feature bits instead. */
#define RUVM_ABI_VERSION 3

#define RUVM_IOCTL_MAGIC 0xD7

/* Length of the module version string in struct ruvm_info, NUL included. */
#define RUVM_VERSION_LEN 32

/**
 * struct ruvm_info - what the loaded module is and can do (RUVM_IOCTL_INFO)
 * @abi_version:  (out) RUVM_ABI_VERSION of the module
 * @flags:        (in)  must be 0
 * @features:     (out) RUVM_FEATURE_* bits of what this module supports
 * @test_ioctls:  (out) 1 if the module was loaded with enable_test_ioctls=1
 * @pad:          (in)  must be 0
 * @version:      (out) module version, NUL-terminated
 * @live_mems:    (out) mems alive in the whole module (all files), freed or not by their
 *                      owner but still mapped included
 * @live_bytes:   (out) their physical bytes
 * @max_alloc_bytes: (out) largest physical size of one mem (module parameter max_alloc_mib)
 * @max_file_bytes:  (out) most physical bytes one open file may hold (max_file_mib)
 * @reserved:     (in)  must be 0
 */
struct ruvm_info {
	__u32 abi_version;
	__u32 flags;
	__u64 features;
	__u32 test_ioctls;
	__u32 pad;
	__u8 version[RUVM_VERSION_LEN];
	__u64 live_mems;
	__u64 live_bytes;
	__u64 max_alloc_bytes;
	__u64 max_file_bytes;
	__u64 reserved[4];
};

/*
 * Feature bits reported in ruvm_info.features, and their union. Each capability adds its bit
 * when it lands.
 */
/* Sysmem mems: alloc, free, query, CPU kernel mapping (with fill/verify/copy), mmap. */
#define RUVM_FEATURE_SYSMEM (1ULL << 0)
/* The leak audit and statistics: AUDIT, STATS, REGISTER_UNLOAD_STATE, the unload report. */
#define RUVM_FEATURE_AUDIT (1ULL << 1)
/* The GPU registry: RUVM_IOCTL_GPU_LIST (test GPUs: QEMU edu devices bound by ruvm). */
#define RUVM_FEATURE_GPU_LIST (1ULL << 2)
/* Per-GPU DMA address tables of sysmem mems: MEM_MAP_GPU, MEM_UNMAP_GPU, MEM_DMA_ADDRS. */
#define RUVM_FEATURE_GPU_DMA (1ULL << 3)
/* Copies by a GPU's copy engine through its DMA tables: RUVM_IOCTL_CE_COPY. */
#define RUVM_FEATURE_CE_COPY (1ULL << 4)
/*
 * Vidmem: each GPU's memory, managed by a PMM; RUVM_BACKING_VIDMEM mems, MEM_GPU_PHYS,
 * PMM_STATS, PMM_CHECK_LEAK, CE copies to and from vidmem.
 */
#define RUVM_FEATURE_VIDMEM (1ULL << 5)
/* In-kernel timing of ruvm's paths against the kernel's own: RUVM_IOCTL_BENCH. */
#define RUVM_FEATURE_BENCH (1ULL << 6)
/* Host GPUs attached and detached at run time: RUVM_IOCTL_GPU_ATTACH, RUVM_IOCTL_GPU_DETACH. */
#define RUVM_FEATURE_GPU_ATTACH (1ULL << 7)
/*
 * GPU virtual mappings on GPUs with an MMU (RUVM_GPU_MMU): MEM_MAP_GPU_KERNEL,
 * MEM_UNMAP_GPU_KERNEL, MEM_MAP_GPU_USER, MEM_UNMAP_GPU_USER, MEM_GPU_VA, CE_COPY_VA,
 * GPU_PT_WALK.
 */
#define RUVM_FEATURE_GPU_VA (1ULL << 8)
/*
 * Memory pools (CUDA's cudaMemPool_t): POOL_CREATE, POOL_DESTROY, POOL_GET, POOL_SET,
 * POOL_TRIM, POOL_SET_ACCESS, and ruvm_mem_alloc.pool.
 */
#define RUVM_FEATURE_POOLS (1ULL << 9)
/*
 * Streams and events on kernel fences (CUDA's streams and events): STREAM_CREATE,
 * STREAM_DESTROY, STREAM_SUBMIT, STREAM_QUERY, STREAM_SYNC, EVENT_CREATE, EVENT_DESTROY,
 * EVENT_QUERY, EVENT_SYNC, EVENT_EXPORT.
 */
#define RUVM_FEATURE_STREAMS (1ULL << 10)
/*
 * Stream-ordered allocation (CUDA's cudaMallocAsync and cudaFreeAsync): RUVM_OP_ALLOC,
 * RUVM_OP_FREE, RUVM_IOCTL_GPU_POOL, the reuse attributes of RUVM_IOCTL_POOL_SET and
 * ruvm_pool_info.pending_bytes.
 */
#define RUVM_FEATURE_STREAM_ALLOC (1ULL << 11)
/* Pointer attributes (CUDA's cudaPointerGetAttributes): PTR_ATTRS. */
#define RUVM_FEATURE_PTR_ATTRS (1ULL << 12)
/*
 * IPC pools (CUDA's cudaMemPoolExportToShareableHandle, ImportFromShareableHandle,
 * ExportPointer, ImportPointer): RUVM_POOL_EXPORTABLE, POOL_EXPORT, POOL_IMPORT, MEM_EXPORT,
 * MEM_IMPORT, ruvm_pool_info.pool_flags, RUVM_PTR_IMPORTED.
 */
#define RUVM_FEATURE_IPC_POOLS (1ULL << 13)
/*
 * Mems as dma-bufs: RUVM_IOCTL_MEM_EXPORT_DMABUF, RUVM_IOCTL_MEM_IMPORT_DMABUF, and implicit
 * sync on the buffers' reservation objects.
 */
#define RUVM_FEATURE_DMABUF (1ULL << 14)
/*
 * The stream status page: each stream's completed point published in a read-only page of the
 * file (RUVM_IOCTL_STREAM_STATUS, mmap at RUVM_STATUS_MMAP_OFFSET).
 */
#define RUVM_FEATURE_STATUS_PAGE (1ULL << 15)
/*
 * Sparse mems: RUVM_ALLOC_SPARSE, and RUVM_IOCTL_MEM_RANGE to populate and release ranges of
 * their chunks.
 */
#define RUVM_FEATURE_SPARSE (1ULL << 16)
/*
 * Copies that name a side by an address of the caller's: RUVM_OP_DST_PTR and RUVM_OP_SRC_PTR
 * in ruvm_ce_copy.flags and in the flags of RUVM_OP_COPY.
 */
#define RUVM_FEATURE_COPY_PTR (1ULL << 17)
/*
 * RUVM_IOCTL_MEM_REGISTER: memory the caller already has (anonymous or file-backed) made a
 * mem; RUVM_PTR_REGISTERED in ruvm_ptr_attrs.ptr_flags.
 */
#define RUVM_FEATURE_REGISTER (1ULL << 18)
/*
 * Vidmem bounded per caller: each GPU's vidmem is a region of the kernel's dmem cgroup
 * controller where the kernel has it (dmem.max), and ruvm's per-user limit of each GPU holds
 * on every kernel (RUVM_IOCTL_VIDMEM_LIMIT).
 */
#define RUVM_FEATURE_VIDMEM_LIMITS (1ULL << 19)
#define RUVM_FEATURES_ALL                                                                   \
	(RUVM_FEATURE_SYSMEM | RUVM_FEATURE_AUDIT | RUVM_FEATURE_GPU_LIST | RUVM_FEATURE_GPU_DMA | \
	 RUVM_FEATURE_CE_COPY | RUVM_FEATURE_VIDMEM | RUVM_FEATURE_BENCH |                      \
	 RUVM_FEATURE_GPU_ATTACH | RUVM_FEATURE_GPU_VA | RUVM_FEATURE_POOLS |                   \
	 RUVM_FEATURE_STREAMS | RUVM_FEATURE_STREAM_ALLOC | RUVM_FEATURE_PTR_ATTRS |           \
	 RUVM_FEATURE_IPC_POOLS | RUVM_FEATURE_DMABUF | RUVM_FEATURE_STATUS_PAGE |             \
	 RUVM_FEATURE_SPARSE | RUVM_FEATURE_COPY_PTR | RUVM_FEATURE_REGISTER |                 \
	 RUVM_FEATURE_VIDMEM_LIMITS)

/* What backs a mem (ruvm_mem_alloc.backing). */
enum ruvm_backing {
	/* Kernel pages (the CPU's memory). */
	RUVM_BACKING_SYSMEM = 0,
	/*
	 * A GPU's memory (vidmem), from that GPU's PMM (ruvm_mem_alloc.gpu). Not CPU-mappable:
	 * its bytes move with the GPU's copy engine (RUVM_IOCTL_CE_COPY).
	 */
	RUVM_BACKING_VIDMEM = 1,
};

/* ruvm_mem_alloc.flags */
enum ruvm_alloc_flags {
	/* Zero the memory. */
	RUVM_ALLOC_ZERO = 1 << 0,
	/*
	 * If a chunk of the chosen size cannot be had (fragmentation), retry the whole allocation
	 * with chunks half the size, down to PAGE_SIZE, instead of failing with ENOMEM. The chunk
	 * size it settled on is returned.
	 */
	RUVM_ALLOC_FALLBACK = 1 << 1,
	/*
	 * A sparse mem: sysmem of no pool, made with every chunk absent (no chunk allocated; one
	 * page charged to the file's quota for the mem itself). RUVM_IOCTL_MEM_RANGE populates
	 * ranges of it with zeroed chunks and releases them again. Refused (EINVAL, before the
	 * GPU or pool is looked up) with RUVM_ALLOC_FALLBACK, with vidmem and with a pool. A sparse mem cannot be mapped in the CPU kernel, in a GPU VA
	 * space, exported or shared as a dma-buf (EOPNOTSUPP); its chunks are DMA-mapped for a GPU
	 * (RUVM_IOCTL_MEM_MAP_GPU) as they become resident. See struct ruvm_mem_range.
	 */
	RUVM_ALLOC_SPARSE = 1 << 2,
	/*
	 * Also map the mem into the calling process (shared, read and write, where the kernel
	 * chooses, as mmap of its mmap_offset would) and return the address in @user_addr: one
	 * call where an allocation and an mmap were two. RUVM_IOCTL_MEM_FREE of the mem by that
	 * process unmaps the mapping if it is still there, whole, at that address. Sysmem only
	 * (EINVAL with vidmem). On a failure to map, nothing is left (the mem is freed).
	 */
	RUVM_ALLOC_MAP_USER = 1 << 3,
	/*
	 * Never asked for (EINVAL in ruvm_mem_alloc.flags): reported in
	 * ruvm_mem_query.alloc_flags for a mem made by RUVM_IOCTL_MEM_REGISTER.
	 */
	RUVM_ALLOC_REGISTERED = 1 << 4,
	/* Every flag MEM_ALLOC takes. */
	RUVM_ALLOC_FLAGS_ALL = RUVM_ALLOC_ZERO | RUVM_ALLOC_FALLBACK | RUVM_ALLOC_SPARSE |
			       RUVM_ALLOC_MAP_USER,
};

/**
 * struct ruvm_mem_alloc - allocate a mem (RUVM_IOCTL_MEM_ALLOC)
 *
 * The mem is made of chunk_count chunks of chunk_size bytes (physical size = chunk_count *
 * chunk_size >= size). Sysmem chunk size: PAGE_SIZE by default; an explicit page_size must be
 * a power of two from PAGE_SIZE to 2 MiB. Vidmem chunk size: by default 4 KiB below 64 KiB,
 * 64 KiB below the GPU's biggest page size up to 2 MiB, else that size; an explicit page_size
 * must be one of the GPU's page sizes up to 2 MiB. Vidmem is always zeroed (the PMM scrubs
 * chunks when they are freed). The handle belongs to the file that made it.
 *
 * @size:        (in)  bytes wanted, > 0
 * @page_size:   (in)  chunk size wanted, 0 for the default
 * @backing:     (in)  enum ruvm_backing
 * @flags:       (in)  enum ruvm_alloc_flags
 * @handle:      (out) the mem's handle, never 0
 * @chunk_size:  (out) bytes per chunk
 * @chunk_count: (out) number of chunks
 * @mmap_offset: (out) the offset to mmap the mem at (length: the physical size)
 * @gpu:         (in)  RUVM_BACKING_VIDMEM: the GPU whose memory backs the mem; else 0
 * @pad:         (in)  must be 0
 * @pool:        (in)  a pool of the calling file (RUVM_IOCTL_POOL_CREATE) to take the chunks
 *                     from, or 0; @backing and @gpu must be the pool's, @page_size 0 or its
 *                     chunk size, and RUVM_ALLOC_FALLBACK is refused (a pool's chunks have one
 *                     size)
 * @user_addr:   (in)  must be 0; (out) with RUVM_ALLOC_MAP_USER, the mem's address in the
 *                     calling process
 * @reserved:    (in)  must be 0
 */
struct ruvm_mem_alloc {
	__u64 size;
	__u64 page_size;
	__u32 backing;
	__u32 flags;
	__u64 handle;
	__u64 chunk_size;
	__u64 chunk_count;
	__u64 mmap_offset;
	__u32 gpu;
	__u32 pad;
	__u64 pool;
	__u64 user_addr;
	__u64 reserved[1];
};

/* ruvm_mem_range.op */
enum ruvm_range_op {
	/* Make every absent chunk of the range resident: allocated, zeroed, charged. */
	RUVM_RANGE_POPULATE = 1,
	/* Give every resident chunk of the range back. */
	RUVM_RANGE_RELEASE = 2,
};

/**
 * struct ruvm_mem_range - populate or release a range of a sparse mem (RUVM_IOCTL_MEM_RANGE)
 *
 * @offset and @length are multiples of the mem's chunk size, @length > 0, the range inside the
 * physical size.
 *
 * POPULATE allocates each absent chunk of the range zeroed, charges it to the file's quota and
 * memory cgroup, and DMA-maps it for every GPU the mem is mapped on (RUVM_IOCTL_MEM_MAP_GPU);
 * resident chunks keep their bytes. All or nothing: on any error (ENOMEM, ENOSPC beyond the
 * file's quota, EINTR/restart on a signal, ENODEV a mapped GPU going) the chunks made by the
 * call are gone again and the mem is as it was. A user mapping of the mem reaches a chunk made
 * resident from its next access.
 *
 * RELEASE gives every resident chunk of the range back: its user mappings are zapped (a later
 * access gets SIGBUS until the range is populated again, then reads zeroes), its DMA mappings
 * for every GPU are removed, its charge is given back and it is freed, before the call
 * returns. It neither waits for nor cancels work: EBUSY, and nothing released, while a copy or
 * a fill planned on any chunk of the range (queued on a stream, or running) still holds it;
 * synchronize the streams that use the range first. Absent chunks are skipped.
 *
 * Errors: ENOENT no such mem (or freed); EINVAL a bad @op (after the mem is found), non-zero
 * @flags or @reserved (before); EOPNOTSUPP a mem that is not sparse (before its range is
 * checked); EOVERFLOW @offset + @length overflows; EINVAL a range not chunk-aligned, empty or
 * outside the mem.
 *
 * @handle:   (in)  the mem, made with RUVM_ALLOC_SPARSE
 * @offset:   (in)  the range's first byte
 * @length:   (in)  its bytes
 * @op:       (in)  enum ruvm_range_op
 * @flags:    (in)  must be 0
 * @resident: (out) the mem's resident bytes after the call
 * @reserved: (in)  must be 0
 */
struct ruvm_mem_range {
	__u64 handle;
	__u64 offset;
	__u64 length;
	__u32 op;
	__u32 flags;
	__u64 resident;
	__u64 reserved[2];
};

/**
 * struct ruvm_mem_register - make memory the caller already has a mem (RUVM_IOCTL_MEM_REGISTER)
 *
 * cudaHostRegister: the pages the calling process maps at [@addr, @addr + @size) (anonymous,
 * shared memory, or a file's) are pinned long-term, writable (devices and the kernel write
 * them: every mapping of the range must be readable and writable, and a private mapping's
 * pages are the process's own copies, as for a write), and become the chunks of a new sysmem mem
 * of one-page chunks. The mem is then any mem of the file's: MEM_MAP_GPU DMA-maps it for a GPU,
 * CE_COPY and stream COPY and FILL reach it (by handle, or by address with RUVM_OP_*_PTR),
 * MEM_MAP_CPU_KERNEL maps it; its bytes are the process's, at their addresses (nothing is
 * copied). It cannot be mmapped through /dev/ruvm or exported as a dma-buf (EOPNOTSUPP).
 * The pins count in the address space's VmPin, bounded by RLIMIT_MEMLOCK without CAP_IPC_LOCK
 * (pages already charged to a memory cgroup stay charged there); the mem charges one page to
 * the file's quota (max_file_mib), as a sparse mem.
 *
 * It ends with MEM_FREE of its handle (cudaHostUnregister), the file's close, or as soon as
 * any part of the range stops being mapped (munmap, mremap away, mmap MAP_FIXED over it, the
 * process's exit): the handle is then freed as MEM_FREE frees it, from a work item (at most
 * moments later; MEM_FREE of it is ENOENT after). Work queued before the end (copies, fills)
 * completes on the pages it was given, which stay pinned until it is done, then the pins go.
 * Other changes to the range leave the registration on the pages it pinned: after
 * MADV_DONTNEED or a truncation of the file, the process's addresses show other pages than
 * the mem's. fork: the parent keeps its pages (the kernel copies pinned pages for the child
 * at fork, or the child gets no mapping at all with MADV_DONTFORK); the child's file
 * descriptor names the same mem (whose pages are the parent's).
 *
 * Errors: EINVAL non-zero @flags, @pad or @reserved, @addr or @size not a multiple of
 * PAGE_SIZE, @size 0; EOVERFLOW @addr + @size wraps; ENOSPC @size beyond max_alloc_mib or the
 * file's quota; EFAULT a page of the range is in no mapping (or the range is unmapped before
 * the handle enters the file's table: after, the call succeeds and is revoked); EACCES a
 * mapping of the range is not readable and writable (a read-only mapping cannot be
 * registered: nothing may write what its process may not); EOPNOTSUPP a mapping whose pages
 * cannot be pinned long-term (VM_IO or VM_PFNMAP, fs-dax, secretmem, a shared writable
 * mapping of a file on a filesystem that tracks dirty pages, pages past the end of a mapped
 * file); EEXIST the range overlaps one this file registered in the same process, or a
 * mapping of a mem; ENOMEM beyond RLIMIT_MEMLOCK, or out of memory;
 * EINTR/ERESTARTSYS a signal. On error nothing stays pinned or charged.
 *
 * @addr:     (in)  the range's start, page-aligned
 * @size:     (in)  its length in bytes, a multiple of PAGE_SIZE
 * @flags:    (in)  must be 0
 * @pad:      (in)  must be 0
 * @handle:   (out) the new mem's handle
 * @reserved: (in)  must be 0
 */
struct ruvm_mem_register {
	__u64 addr;
	__u64 size;
	__u32 flags;
	__u32 pad;
	__u64 handle;
	__u64 reserved[2];
};

/**
 * struct ruvm_mem_handle - name a mem (MEM_FREE, MEM_MAP_CPU_KERNEL, MEM_UNMAP_CPU_KERNEL)
 * @handle:   (in) the mem
 * @flags:    (in) must be 0
 * @pad:      (in) must be 0
 * @reserved: (in) must be 0
 */
struct ruvm_mem_handle {
	__u64 handle;
	__u32 flags;
	__u32 pad;
	__u64 reserved[2];
};

/* ruvm_mem_query.mapped: which mappings of the mem exist. */
enum ruvm_mapped {
	RUVM_MAPPED_CPU_KERNEL = 1 << 0,
	RUVM_MAPPED_CPU_USER = 1 << 1,
	/* Mapped in the GPU kernel VA window of at least one GPU (RUVM_IOCTL_MEM_MAP_GPU_KERNEL). */
	RUVM_MAPPED_GPU_KERNEL = 1 << 2,
	/* Mapped in its file's user VA space of at least one GPU (RUVM_IOCTL_MEM_MAP_GPU_USER). */
	RUVM_MAPPED_GPU_USER = 1 << 3,
};

/**
 * struct ruvm_mem_query - what a mem is (RUVM_IOCTL_MEM_QUERY)
 * @handle:        (in)  the mem
 * @flags:         (in)  must be 0
 * @backing:       (out) enum ruvm_backing
 * @size:          (out) bytes asked for
 * @physical_size: (out) chunk_count * chunk_size
 * @chunk_size:    (out) bytes per chunk
 * @chunk_count:   (out) number of chunks
 * @mmap_offset:   (out) where to mmap it
 * @mapped:        (out) enum ruvm_mapped bits
 * @user_mappings: (out) how many user VMAs map it
 * @alloc_flags:   (out) the enum ruvm_alloc_flags it was allocated with
 * @mapped_gpus:   (out) bit n set: the mem has a DMA address table for GPU n (sysmem only)
 * @gpu:           (out) vidmem: the GPU whose memory backs it; sysmem: 0
 * @pad:           (out) 0
 * @gpu_kernel_va: (out) while any GPU has it mapped in its kernel VA space: its GPU kernel VA
 *                 (the same on every GPU, RUVM_IOCTL_MEM_MAP_GPU_KERNEL); else 0
 * @reserved:      (in)  must be 0
 */
struct ruvm_mem_query {
	__u64 handle;
	__u32 flags;
	__u32 backing;
	__u64 size;
	__u64 physical_size;
	__u64 chunk_size;
	__u64 chunk_count;
	__u64 mmap_offset;
	__u64 mapped;
	__u32 user_mappings;
	__u32 alloc_flags;
	__u64 mapped_gpus;
	__u32 gpu;
	__u32 pad;
	__u64 gpu_kernel_va;
	__u64 reserved[1];
};

/* ruvm_mem_fill.kind */
enum ruvm_fill_kind {
	/*
	 * The seeded pattern: the byte at mem offset o is byte (o % 8) of the little-endian
	 * 64-bit value (seed + o / 8). With seed = size this is uvm_mem_test's pattern.
	 */
	RUVM_FILL_PATTERN = 0,
	/* Every byte is the low 8 bits of seed. */
	RUVM_FILL_BYTE = 1,
};

/**
 * struct ruvm_mem_fill - write or check a range through the CPU kernel mapping
 *                        (RUVM_IOCTL_MEM_FILL, RUVM_IOCTL_MEM_VERIFY)
 *
 * The range [offset, offset + length) must lie within the physical size. The mem must be
 * mapped for the CPU kernel (ENXIO otherwise). VERIFY writes nothing to the mem.
 *
 * @handle:         (in)  the mem
 * @offset:         (in)  first byte
 * @length:         (in)  bytes
 * @seed:           (in)  the pattern's seed (see enum ruvm_fill_kind)
 * @kind:           (in)  enum ruvm_fill_kind
 * @flags:          (in)  must be 0
 * @mismatches:     (out) VERIFY: bytes that differ from the pattern
 * @first_mismatch: (out) VERIFY: offset of the first that differs, or ~0
 * @reserved:       (in)  must be 0
 */
struct ruvm_mem_fill {
	__u64 handle;
	__u64 offset;
	__u64 length;
	__u64 seed;
	__u32 kind;
	__u32 flags;
	__u64 mismatches;
	__u64 first_mismatch;
	__u64 reserved[2];
};

/**
 * struct ruvm_mem_copy - copy bytes between mems through their CPU kernel mappings
 *                        (RUVM_IOCTL_MEM_COPY)
 *
 * Both ranges must lie within their mem's physical size; both mems must be mapped for the
 * CPU kernel (ENXIO otherwise). Source and destination may be the same mem, and may overlap.
 *
 * @dst_handle: (in) destination mem
 * @dst_offset: (in) destination offset
 * @src_handle: (in) source mem
 * @src_offset: (in) source offset
 * @length:     (in) bytes
 * @flags:      (in) must be 0
 * @pad:        (in) must be 0
 * @reserved:   (in) must be 0
 */
struct ruvm_mem_copy {
	__u64 dst_handle;
	__u64 dst_offset;
	__u64 src_handle;
	__u64 src_offset;
	__u64 length;
	__u32 flags;
	__u32 pad;
	__u64 reserved[2];
};

/*
 * Audit classes: what the leak audit counts. Indexes of ruvm_audit.live, ruvm_audit.walked and
 * ruvm_unload_state.leaked.
 */
enum ruvm_audit_class {
	RUVM_AUDIT_MEMS = 0,		/* mems alive */
	RUVM_AUDIT_SYSMEM_BYTES = 1,	/* their physical bytes (sysmem) */
	RUVM_AUDIT_HANDLES = 2,		/* handles in files' tables */
	RUVM_AUDIT_KERNEL_MAPS = 3,	/* CPU kernel mappings (vmaps) */
	RUVM_AUDIT_USER_MAPPINGS = 4,	/* user VMAs mapping a mem */
	/*
	 * Sysmem chunks of order n (2^n pages) are class RUVM_AUDIT_SYSMEM_CHUNKS_ORDER0 + n, for
	 * n from 0 to RUVM_AUDIT_SYSMEM_CHUNKS_MAX_ORDER (an order, not a class).
	 */
	RUVM_AUDIT_SYSMEM_CHUNKS_ORDER0 = 5,
	RUVM_AUDIT_SYSMEM_CHUNKS_MAX_ORDER = 10,
	RUVM_AUDIT_DMA_MAPPINGS = 16,	/* chunks DMA-mapped for a GPU (all GPUs) */
	RUVM_AUDIT_DMA_BYTES = 17,	/* their bytes */
	RUVM_AUDIT_VIDMEM_BYTES = 18,	/* physical bytes of vidmem mems */
	RUVM_AUDIT_VIDMEM_CHUNKS = 19,	/* vidmem chunks held by mems */
	RUVM_AUDIT_VIDMEM_ROOTS = 20,	/* vidmem root chunks with storage (2 MiB each) */
	RUVM_AUDIT_PT_TABLES = 21,	/* GPU page tables and directories (all GPUs) */
	RUVM_AUDIT_PT_BYTES = 22,	/* the memory they take */
	RUVM_AUDIT_GPU_KERNEL_VAS = 23,	/* mems holding an offset of the GPU kernel VA window */
	RUVM_AUDIT_POOLS = 24,		/* memory pools */
	RUVM_AUDIT_POOL_CHUNKS = 25,	/* chunks cached by pools (free, kept for reuse) */
	RUVM_AUDIT_POOL_BYTES = 26,	/* their bytes */
	RUVM_AUDIT_VIDMEM_KEPT = 27,	/* root storage kept for reuse, its root empty (2 MiB each) */
	RUVM_AUDIT_STREAM_OPS = 28,	/* operations queued on streams, not yet retired */
	RUVM_AUDIT_STREAM_MEMS = 29,	/* references to mems those operations hold */
	/* pool chunks pending a free on a stream (RUVM_OP_FREE; ruvm_pool_info.pending_bytes) */
	RUVM_AUDIT_POOL_PENDING = 30,
	RUVM_AUDIT_CLASSES = 31,
};

/* ruvm_audit.flags */
enum ruvm_audit_flags {
	/*
	 * Also count the real objects (every live mem, its chunks and mappings) into walked[], to
	 * check the counters against them. Test-only: needs enable_test_ioctls=1 (ENOSYS).
	 */
	RUVM_AUDIT_WALK = 1 << 0,
};

/**
 * struct ruvm_audit - the leak audit's counters (RUVM_IOCTL_AUDIT)
 * @flags:    (in)  enum ruvm_audit_flags
 * @classes:  (out) RUVM_AUDIT_CLASSES
 * @live:     (out) live resources per enum ruvm_audit_class
 * @walked:   (out) with RUVM_AUDIT_WALK: the same, counted from the objects themselves
 * @level:    (out) the leak_checker module parameter
 * @pad:      (in)  must be 0
 * @reserved: (in)  must be 0
 */
struct ruvm_audit {
	__u32 flags;
	__u32 classes;
	__u64 live[RUVM_AUDIT_CLASSES];
	__u64 walked[RUVM_AUDIT_CLASSES];
	__u32 level;
	__u32 pad;
	__u64 reserved[4];
};

/* ruvm_stats.flags */
enum ruvm_stats_flags {
	/* After reading, restart the high watermarks from the current values. */
	RUVM_STATS_RESET_PEAKS = 1 << 0,
};

/**
 * struct ruvm_stats - usage statistics of one backing (RUVM_IOCTL_STATS)
 *
 * Reserved bytes are what the mems hold (physical size); used bytes are what was asked for
 * (size). Peaks are high watermarks since load or the last RUVM_STATS_RESET_PEAKS.
 *
 * @backing:         (in)  enum ruvm_backing
 * @flags:           (in)  enum ruvm_stats_flags
 * @reserved_bytes:  (out) current reserved bytes
 * @reserved_peak:   (out) high watermark of reserved_bytes
 * @used_bytes:      (out) current used bytes
 * @used_peak:       (out) high watermark of used_bytes
 * @mems:            (out) current mems
 * @mems_peak:       (out) high watermark of mems
 * @allocs:          (out) successful allocations since load
 * @frees:           (out) mems released since load (their last reference gone)
 * @alloc_failures:  (out) refused or failed allocations since load
 * @reserved:        (in)  must be 0
 */
struct ruvm_stats {
	__u32 backing;
	__u32 flags;
	__u64 reserved_bytes;
	__u64 reserved_peak;
	__u64 used_bytes;
	__u64 used_peak;
	__u64 mems;
	__u64 mems_peak;
	__u64 allocs;
	__u64 frees;
	__u64 alloc_failures;
	__u64 reserved[6];
};

/* ruvm_unload_state.state */
enum ruvm_unload_state_bits {
	/* The module has unloaded and written its verdict. */
	RUVM_UNLOAD_DONE = 1 << 0,
	/* Something was still alive at unload: see leaked[]. */
	RUVM_UNLOAD_LEAKED = 1 << 1,
};

/**
 * struct ruvm_unload_state - the audit's verdict, written into the caller's memory at unload
 * @state:  enum ruvm_unload_state_bits, 0 until the module unloads
 * @leaked: live resources per enum ruvm_audit_class at unload
 */
struct ruvm_unload_state {
	__u64 state;
	__u64 leaked[RUVM_AUDIT_CLASSES];
};

/**
 * struct ruvm_register_unload_state - where to write the unload verdict
 *                                     (RUVM_IOCTL_REGISTER_UNLOAD_STATE)
 *
 * The struct ruvm_unload_state at @addr is zeroed now and written when the module unloads,
 * so that a process that outlives the module gets a verdict without reading the kernel log.
 * The page stays pinned until then. One registration per module load; CAP_SYS_ADMIN only.
 *
 * @addr:     (in) user address, 8-byte aligned, the structure not crossing a page
 * @flags:    (in) must be 0
 * @pad:      (in) must be 0
 * @reserved: (in) must be 0
 */
struct ruvm_register_unload_state {
	__u64 addr;
	__u32 flags;
	__u32 pad;
	__u64 reserved[2];
};

/* What RUVM_IOCTL_BENCH times. */
enum ruvm_bench_op {
	/*
	 * The kernel's page allocator alone: `count` blocks of 2^order pages from alloc_pages
	 * with the flags ruvm's chunks use (and __GFP_ZERO if `zero`, however ruvm zeroes: see
	 * the `zeroing` module parameter), then each freed: the floor under a sysmem mem of
	 * `count` chunks of that order.
	 */
	RUVM_BENCH_PAGES = 1,
	/*
	 * ruvm's own path for the same: a sysmem mem of `count` chunks of 2^order pages made as
	 * RUVM_IOCTL_MEM_ALLOC makes it (limits, accounting, audit, mmap offset) and freed, with
	 * no handle and no user copy. Counts against the caller's file like any mem.
	 */
	RUVM_BENCH_MEM = 2,
	/* vm_map_ram of the pages of the caller's mem `handle` (array built untimed), unmapped. */
	RUVM_BENCH_VMAP = 3,
	/* ruvm's CPU kernel mapping of mem `handle` made (as MEM_MAP_CPU_KERNEL) and dropped. */
	RUVM_BENCH_KMAP = 4,
};

/**
 * struct ruvm_bench - time one of ruvm's paths, or the kernel's own, in the kernel
 *                     (RUVM_IOCTL_BENCH)
 *
 * Runs @op @iterations times and returns the total time. For benchmarks (ruvmctl bench): the
 * difference between two ops is ruvm's overhead over the kernel, without the syscall. Needs
 * CAP_SYS_ADMIN (EPERM otherwise). A pending signal stops it between iterations (EINTR).
 *
 * @op:         (in)  enum ruvm_bench_op
 * @flags:      (in)  must be 0
 * @order:      (in)  PAGES, MEM: pages per chunk as a shift, 0 to 9 (4 KiB to 2 MiB)
 * @zero:       (in)  PAGES, MEM: 1 to zero the pages, else 0
 * @count:      (in)  PAGES, MEM: chunks, 1 or more, at most max_alloc_bytes in all
 * @handle:     (in)  VMAP, KMAP: a sysmem mem of the calling file; else 0
 * @iterations: (in)  1 to 1048576
 * @ns:         (out) nanoseconds all iterations took
 * @reserved:   (in)  must be 0
 */
struct ruvm_bench {
	__u32 op;
	__u32 flags;
	__u32 order;
	__u32 zero;
	__u64 count;
	__u64 handle;
	__u64 iterations;
	__u64 ns;
	__u64 reserved[2];
};

/* What RUVM_IOCTL_TEST_LEAK leaks. */
enum ruvm_leak {
	/* A sysmem mem of `size` bytes (its chunks and, with RUVM_LEAK_MAPPED, a kernel map). */
	RUVM_LEAK_MEM = 1,
	/* One sysmem chunk of order `order`. */
	RUVM_LEAK_CHUNK = 2,
	/* A CPU kernel mapping of a one-page chunk (so a chunk of order 0 leaks with it). */
	RUVM_LEAK_KERNEL_MAP = 3,
};

/* ruvm_test_leak.flags */
enum ruvm_leak_flags {
	/* Forget the object for good (for kmemleak) instead of keeping it for the unload audit
	 * to report and free. */
	RUVM_LEAK_LOST = 1 << 0,
	/* RUVM_LEAK_MEM: map it for the CPU kernel first. */
	RUVM_LEAK_MAPPED = 1 << 1,
};

/**
 * struct ruvm_test_leak - deliberately leak resources (RUVM_IOCTL_TEST_LEAK)
 *
 * Test-only, gated like RUVM_IOCTL_TEST_PLANT. Leaks @count objects of one audit class, to
 * prove that the audit (and kmemleak) report exactly what leaked.
 *
 * @what:     (in) enum ruvm_leak
 * @flags:    (in) enum ruvm_leak_flags
 * @count:    (in) how many, 1 to 64
 * @size:     (in) RUVM_LEAK_MEM: the mem's size
 * @order:    (in) RUVM_LEAK_CHUNK: the chunk's order
 * @pad:      (in) must be 0
 * @reserved: (in) must be 0
 */
struct ruvm_test_leak {
	__u32 what;
	__u32 flags;
	__u64 count;
	__u64 size;
	__u32 order;
	__u32 pad;
	__u64 reserved[2];
};

/* The most GPUs the registry holds. */
#define RUVM_MAX_GPUS 32

/* ruvm_gpu_info.kind */
enum ruvm_gpu_kind {
	/* A QEMU edu PCI device (1234:11e8) bound by ruvm's own PCI driver: a test GPU. */
	RUVM_GPU_KIND_EDU = 1,
	/*
	 * A PCI device named by the host_gpus module parameter or attached with
	 * RUVM_IOCTL_GPU_ATTACH (e.g. an NVIDIA GPU, which its own driver owns): not bound by
	 * ruvm, used for DMA mapping only, no copy engine.
	 */
	RUVM_GPU_KIND_HOST = 2,
	/*
	 * A simulated GPU (sim_gpus module parameter): a faux device with real DMA mappings
	 * (dma-direct, 47-bit mask) whose copy engine is the CPU, reaching memory only through
	 * the DMA addresses it is given. Its PCI fields are 0 but for pci_devfn, its index.
	 */
	RUVM_GPU_KIND_SIM = 3,
};

/* ruvm_gpu_info.flags */
enum ruvm_gpu_flags {
	/* Bound now. An unbound GPU keeps its id and its entry, for when it comes back. */
	RUVM_GPU_PRESENT = 1 << 0,
	/* Has a copy engine (RUVM_IOCTL_CE_COPY). */
	RUVM_GPU_COPY_ENGINE = 1 << 1,
	/*
	 * Has an MMU: GPU virtual mappings (RUVM_IOCTL_MEM_MAP_GPU_KERNEL), copies through virtual
	 * addresses (RUVM_IOCTL_CE_COPY_VA). The simulated GPUs have one; the test GPUs (edu) and
	 * host GPUs do not.
	 */
	RUVM_GPU_MMU = 1 << 2,
};

/**
 * struct ruvm_gpu_info - one GPU of the registry
 * @id:            stable id (the same across unbind and rebind of the same PCI device)
 * @kind:          enum ruvm_gpu_kind
 * @flags:         enum ruvm_gpu_flags
 * @vendor:        PCI vendor id
 * @device:        PCI device id
 * @pci_domain:    PCI domain (segment)
 * @pci_bus:       PCI bus number
 * @pci_devfn:     PCI device and function (device << 3 | function)
 * @dma_mask_bits: width of the device's DMA addresses
 * @page_sizes:    bitmask of the GPU's page sizes (bit n: 2^n bytes)
 * @dma_mapped_bytes: bytes DMA-mapped for the GPU now: sysmem mems' tables and the storage of
 *                 its vidmem root chunks (0 once it is unbound)
 * @vidmem_size:   bytes of vidmem (its PMM's capacity; 0: none)
 */
struct ruvm_gpu_info {
	__u32 id;
	__u32 kind;
	__u32 flags;
	__u16 vendor;
	__u16 device;
	__u32 pci_domain;
	__u8 pci_bus;
	__u8 pci_devfn;
	__u16 pad;
	__u32 dma_mask_bits;
	__u32 pad2;
	__u64 page_sizes;
	__u64 dma_mapped_bytes;
	__u64 vidmem_size;
};

/**
 * struct ruvm_gpu_list - the GPU registry (RUVM_IOCTL_GPU_LIST)
 * @flags:    (in)     must be 0
 * @count:    (in/out) in: room in @gpus; out: how many GPUs the registry has (only as many as
 *                     there was room for are written)
 * @gpus:     (in)     user pointer to an array of struct ruvm_gpu_info
 * @reserved: (in)     must be 0
 */
struct ruvm_gpu_list {
	__u32 flags;
	__u32 count;
	__u64 gpus;
	__u64 reserved[2];
};

/**
 * struct ruvm_gpu_attach - a host GPU by PCI address (RUVM_IOCTL_GPU_ATTACH,
 *                          RUVM_IOCTL_GPU_DETACH)
 *
 * ATTACH registers the PCI device at the address as a host GPU (RUVM_GPU_KIND_HOST: DMA
 * mapping only, never bound), as the host_gpus parameter does at load; a device attached
 * before gets its id back. DETACH removes a host GPU as an unbind does: every DMA table made
 * for it is dropped first, its mems stay and can be freed. Both need CAP_SYS_ADMIN.
 *
 * @flags:      (in)  must be 0
 * @pci_domain: (in)  PCI domain (segment), 0 to 0xffff
 * @pci_bus:    (in)  PCI bus number
 * @pci_devfn:  (in)  PCI device and function (device << 3 | function)
 * @pad:        (in)  must be 0
 * @id:         (out) the GPU's id
 * @reserved:   (in)  must be 0
 */
struct ruvm_gpu_attach {
	__u32 flags;
	__u32 pci_domain;
	__u8 pci_bus;
	__u8 pci_devfn;
	__u16 pad;
	__u32 id;
	__u64 reserved[2];
};

/**
 * struct ruvm_mem_gpu - a mem and a GPU (RUVM_IOCTL_MEM_MAP_GPU, RUVM_IOCTL_MEM_UNMAP_GPU)
 *
 * MAP_GPU DMA-maps every chunk of a sysmem mem for the GPU's device and keeps the addresses
 * (GPU-relative) in the mem's table for that GPU; UNMAP_GPU unmaps them and drops the table.
 * Both are idempotent. For a mem of another exporter's dma-buf (RUVM_IOCTL_MEM_IMPORT_DMABUF),
 * MAP_GPU attaches the buffer to the GPU's device and maps it (EOPNOTSUPP on a simulated GPU;
 * EINVAL a scatter table not in whole pages; the exporter's own errors), and the unmap, once
 * the table's last user lets go, is done on a work queue (the GPU's removal waits for it).
 *
 * @handle:   (in) the mem
 * @gpu:      (in) the GPU's id
 * @flags:    (in) must be 0
 * @reserved: (in) must be 0
 */
struct ruvm_mem_gpu {
	__u64 handle;
	__u32 gpu;
	__u32 flags;
	__u64 reserved[2];
};

/**
 * struct ruvm_mem_dma_addrs - a mem's DMA addresses for a GPU (RUVM_IOCTL_MEM_DMA_ADDRS)
 *
 * Privileged (CAP_SYS_ADMIN): bus addresses are not for everyone.
 *
 * @handle:      (in)     the mem
 * @gpu:         (in)     the GPU's id
 * @flags:       (in)     must be 0
 * @first_chunk: (in)     the first chunk to report
 * @count:       (in/out) in: room in @addrs; out: how many were written
 * @addrs:       (in)     user pointer to __u64[count]: chunk i's GPU-relative DMA address
 *                        (RUVM_DMA_ADDR_ABSENT for an absent chunk of a sparse mem)
 * @reserved:    (in)     must be 0
 */
#define RUVM_DMA_ADDR_ABSENT 0xffffffffffffffffULL
struct ruvm_mem_dma_addrs {
	__u64 handle;
	__u32 gpu;
	__u32 flags;
	__u64 first_chunk;
	__u64 count;
	__u64 addrs;
	__u64 reserved[2];
};

/**
 * struct ruvm_ce_copy - copy bytes with a GPU's copy engine (RUVM_IOCTL_CE_COPY)
 *
 * The GPU's engine moves the bytes, addressing both mems only through GPU addresses: a sysmem
 * mem through the DMA addresses in its table for that GPU (it must be mapped on it:
 * RUVM_IOCTL_MEM_MAP_GPU), a vidmem mem through its vidmem addresses (it must be that GPU's
 * memory; the engine reaches a root chunk's storage at its DMA address). For the test GPUs
 * the engine is edu's DMA engine: each piece (under 4096 bytes, within one chunk of each mem)
 * goes memory -> device buffer -> memory, and each transfer takes about 100 ms of the
 * machine's clock, so copies are slow: meant for checking addresses, not for bulk data. A
 * simulated GPU's engine is the CPU, in pieces of up to 2 MiB.
 *
 * Either side may be named by an address of the caller's instead (RUVM_OP_DST_PTR,
 * RUVM_OP_SRC_PTR): an address inside the calling process's mapping of a mem of this file (one
 * RUVM_IOCTL_PTR_ATTRS names with a handle of this file: a pinned heap's pointer, say), its
 * offset field 0; the copy is then to (from) that mem at the address's offset. ENOENT if the
 * address is in no such mapping (unmapped, another file's or a freed mem's, another driver's
 * mapping), EINVAL for a non-zero offset field; the flags and offsets are checked before any
 * mem is looked up.
 *
 * @gpu:        (in) the GPU's id
 * @flags:      (in) RUVM_OP_DST_PTR, RUVM_OP_SRC_PTR (enum ruvm_op_flags), or 0
 * @dst_handle: (in) destination mem; with RUVM_OP_DST_PTR, the destination address
 * @dst_offset: (in) destination offset (0 with RUVM_OP_DST_PTR)
 * @src_handle: (in) source mem; with RUVM_OP_SRC_PTR, the source address
 * @src_offset: (in) source offset (0 with RUVM_OP_SRC_PTR)
 * @length:     (in) bytes
 * @reserved:   (in) must be 0
 */
struct ruvm_ce_copy {
	__u32 gpu;
	__u32 flags;
	__u64 dst_handle;
	__u64 dst_offset;
	__u64 src_handle;
	__u64 src_offset;
	__u64 length;
	__u64 reserved[2];
};

/* ruvm_mem_gpu_phys.aperture: what a GPU address points into. */
enum ruvm_aperture {
	/* System memory, at a DMA address of the GPU's (GPU-relative). */
	RUVM_APERTURE_SYS = 0,
	/* The GPU's own memory, at a vidmem (GPU physical) address. */
	RUVM_APERTURE_VID = 1,
};

/**
 * struct ruvm_mem_gpu_phys - where a GPU reaches a range of a mem (RUVM_IOCTL_MEM_GPU_PHYS)
 *
 * Privileged (CAP_SYS_ADMIN). The range must lie inside one chunk. For sysmem the mem must be
 * mapped on the GPU (its DMA address); for vidmem the GPU must be the backing GPU (its
 * vidmem address).
 *
 * @handle:   (in)  the mem
 * @gpu:      (in)  the GPU's id
 * @flags:    (in)  must be 0
 * @offset:   (in)  first byte
 * @length:   (in)  bytes, > 0
 * @address:  (out) the GPU address of the first byte
 * @aperture: (out) enum ruvm_aperture
 * @pad:      (out) 0
 * @reserved: (in)  must be 0
 */
struct ruvm_mem_gpu_phys {
	__u64 handle;
	__u32 gpu;
	__u32 flags;
	__u64 offset;
	__u64 length;
	__u64 address;
	__u32 aperture;
	__u32 pad;
	__u64 reserved[2];
};

/* ruvm_pmm_stats.allocated[] and ruvm_pmm_check_leak.chunk_size: the PMM's chunk sizes. */
#define RUVM_PMM_CHUNK_SIZES 3 /* 4 KiB, 64 KiB, 2 MiB */

/**
 * struct ruvm_pmm_stats - a GPU's vidmem manager (RUVM_IOCTL_PMM_STATS)
 * @gpu:           (in)  the GPU's id
 * @flags:         (in)  must be 0
 * @capacity:      (out) vidmem bytes
 * @free:          (out) free bytes
 * @allocated:     (out) chunks allocated now: of 4 KiB, 64 KiB, 2 MiB
 * @roots:         (out) 2 MiB root chunks (capacity / 2 MiB)
 * @roots_used:    (out) root chunks holding at least one chunk
 * @roots_split:   (out) of those, the ones split into smaller chunks
 * @roots_stored:  (out) root chunks with storage (kernel pages) now
 * @pt_tables:     (out) the GPU's page tables and directories now (vidmem chunks of 4 KiB)
 * @pt_bytes:      (out) their bytes
 * @reserved:      (in)  must be 0
 */
struct ruvm_pmm_stats {
	__u32 gpu;
	__u32 flags;
	__u64 capacity;
	__u64 free;
	__u64 allocated[RUVM_PMM_CHUNK_SIZES];
	__u64 roots;
	__u64 roots_used;
	__u64 roots_split;
	__u64 roots_stored;
	__u64 pt_tables;
	__u64 pt_bytes;
	__u64 reserved[2];
};

/**
 * struct ruvm_pmm_check_leak - allocate a GPU's chunks until a limit, then free them all
 *                              (RUVM_IOCTL_PMM_CHECK_LEAK)
 *
 * uvm's PMM_CHECK_LEAK: the PMM hands out chunks of @chunk_size (without storage) until
 * @alloc_limit of them or until none is left, then takes them all back. Comparing @allocated
 * and @free_after across runs shows a leak. Privileged (CAP_SYS_ADMIN): it briefly takes the
 * GPU's whole memory.
 *
 * @gpu:         (in)  the GPU's id
 * @flags:       (in)  must be 0
 * @chunk_size:  (in)  4 KiB, 64 KiB or 2 MiB
 * @alloc_limit: (in)  most chunks to take; ~0 for "until none is left"
 * @allocated:   (out) chunks taken
 * @free_before: (out) the PMM's free bytes before
 * @free_after:  (out) and after
 * @reserved:    (in)  must be 0
 */
struct ruvm_pmm_check_leak {
	__u32 gpu;
	__u32 flags;
	__u64 chunk_size;
	__u64 alloc_limit;
	__u64 allocated;
	__u64 free_before;
	__u64 free_after;
	__u64 reserved[2];
};

/* ruvm_vidmem_limit.flags */
enum ruvm_vidmem_limit_flags {
	/* Set the per-user limit to @user_limit (CAP_SYS_ADMIN; EPERM otherwise). */
	RUVM_VIDMEM_LIMIT_SET = 1 << 0,
};

/**
 * struct ruvm_vidmem_limit - what bounds the caller's vidmem of a GPU (RUVM_IOCTL_VIDMEM_LIMIT)
 *
 * Every vidmem chunk a GPU hands out for a mem (a pool's cache's included; not a GPU page
 * table's) is charged to the task that takes it, until it goes back to the GPU: to its cgroup in the GPU's dmem
 * region (the kernel's dmem controller, where the kernel has it: dmem.max, dmem.current), and
 * to its effective user's use of the GPU, which ruvm bounds by the per-user limit on every
 * kernel (the module parameter vidmem_user_mib, then this call with RUVM_VIDMEM_LIMIT_SET).
 * An allocation beyond either fails with ENOMEM and takes nothing. A lowered limit takes
 * nothing back: later allocations fail until the user's use is below it. With
 * RUVM_VIDMEM_LIMIT_SET the limit changes only once the structure is written back.
 *
 * Errors: EINVAL unknown @flags, non-zero @reserved; ENODEV the GPU is not present; ENXIO it
 * has no vidmem; EPERM RUVM_VIDMEM_LIMIT_SET without CAP_SYS_ADMIN.
 *
 * @gpu:        (in)  the GPU
 * @flags:      (in)  enum ruvm_vidmem_limit_flags
 * @user_limit: (in)  with RUVM_VIDMEM_LIMIT_SET: the new per-user limit in bytes (0: none);
 *              (out) the per-user limit in force (the same for every GPU and user)
 * @user_used:  (out) the calling task's effective user's vidmem of the GPU, in bytes
 * @capacity:   (out) the GPU's vidmem, in bytes
 * @uid:        (out) that user (the effective uid, in the caller's user namespace)
 * @dmem:       (out) 1 if the GPU's vidmem is a dmem region (named @region), else 0
 * @region:     (out) the region's name as dmem.capacity lists it ("ruvm/gpu<id>"),
 *              NUL-terminated; empty without the controller
 * @reserved:   (in)  must be 0
 */
struct ruvm_vidmem_limit {
	__u32 gpu;
	__u32 flags;
	__u64 user_limit;
	__u64 user_used;
	__u64 capacity;
	__u32 uid;
	__u32 dmem;
	__u8 region[32];
	__u64 reserved[2];
};

/*
 * The GPU kernel VA window (uvm_mem's internal VA): a mem mapped with
 * RUVM_IOCTL_MEM_MAP_GPU_KERNEL gets one offset in it, aligned to its chunk size and the same on
 * every GPU, and is mapped at RUVM_GPU_KERNEL_VA_BASE + offset.
 */
#define RUVM_GPU_KERNEL_VA_BASE (384ULL << 40)
#define RUVM_GPU_KERNEL_VA_SIZE (128ULL << 30)
/* The width of a GPU virtual address (NVIDIA's MMU version 2, Pascal and later). */
#define RUVM_GPU_VA_BITS 49

/*
 * Which of a GPU's VA spaces an address is in (the flags of ruvm_mem_gpu_va, ruvm_ce_copy_va,
 * ruvm_gpu_pt_walk, ruvm_test_pt_write). Without it: the GPU's kernel VA space.
 */
enum ruvm_va_space_flags {
	/* The calling file's user VA space on that GPU (RUVM_IOCTL_MEM_MAP_GPU_USER). */
	RUVM_VA_USER = 1 << 0,
};

/* ruvm_mem_gpu_user.flags */
enum ruvm_gpu_user_flags {
	/* Map read-only: the GPU's writes through the mapping fault. */
	RUVM_GPU_USER_READ_ONLY = 1 << 0,
};

/**
 * struct ruvm_mem_gpu_user - map a mem at a user-chosen GPU VA (RUVM_IOCTL_MEM_MAP_GPU_USER)
 *
 * uvm_mem's map_gpu_user: the mem (sysmem, whose size is a whole number of chunks) is mapped
 * at @va of the calling file's user VA space on the GPU, DMA-mapped for it first. The first
 * GPU mapping fixes the VA: the mem has one user VA on every GPU. Unmapped with
 * RUVM_IOCTL_MEM_UNMAP_GPU_USER (struct ruvm_mem_gpu); the file's close tears its VA spaces
 * down.
 *
 * @handle:   (in) the mem
 * @gpu:      (in) the GPU's id
 * @flags:    (in) enum ruvm_gpu_user_flags
 * @va:       (in) where, aligned to the chunk size, below 2^RUVM_GPU_VA_BITS
 * @reserved: (in) must be 0
 */
struct ruvm_mem_gpu_user {
	__u64 handle;
	__u32 gpu;
	__u32 flags;
	__u64 va;
	__u64 reserved[2];
};

/**
 * struct ruvm_mem_gpu_va - where a GPU sees a mem (RUVM_IOCTL_MEM_GPU_VA)
 *
 * ENXIO unless the mem is mapped in that VA space of the GPU.
 *
 * @handle:    (in)  the mem
 * @gpu:       (in)  the GPU's id
 * @flags:     (in)  enum ruvm_va_space_flags: RUVM_VA_USER for the user VA
 * @va:        (out) the GPU virtual address of the mem's first byte
 * @page_size: (out) the size of the GPU pages mapping it
 * @reserved:  (in)  must be 0
 */
struct ruvm_mem_gpu_va {
	__u64 handle;
	__u32 gpu;
	__u32 flags;
	__u64 va;
	__u64 page_size;
	__u64 reserved[2];
};

/**
 * struct ruvm_ce_copy_va - copy bytes with a GPU's copy engine through GPU virtual addresses
 *                          (RUVM_IOCTL_CE_COPY_VA)
 *
 * Privileged (CAP_SYS_ADMIN) in the kernel VA space, which holds every file's mems; with
 * RUVM_VA_USER, in the calling file's user VA space, open to anyone. The engine translates
 * both addresses by walking the page tables in memory (through its TLB); an address no valid PTE maps, a write through a read-only PTE, or
 * an address past RUVM_GPU_VA_BITS is an MMU fault: EFAULT, and a line
 * "ruvm: sim GPU N: MMU fault at VA 0x..., <reason>" in the kernel log. Bytes before the
 * faulting piece may have been copied. EOPNOTSUPP on a GPU without an MMU.
 *
 * @gpu:      (in) the GPU's id
 * @flags:    (in) enum ruvm_va_space_flags
 * @dst_va:   (in) destination GPU virtual address
 * @src_va:   (in) source GPU virtual address
 * @length:   (in) bytes, > 0
 * @reserved: (in) must be 0
 */
struct ruvm_ce_copy_va {
	__u32 gpu;
	__u32 flags;
	__u64 dst_va;
	__u64 src_va;
	__u64 length;
	__u64 reserved[2];
};

/* ruvm_gpu_pt_walk.fault: how a walk ended. */
enum ruvm_mmu_fault {
	RUVM_MMU_OK = 0,		/* translated */
	RUVM_MMU_FAULT_VA_RANGE = 1,	/* past RUVM_GPU_VA_BITS */
	RUVM_MMU_FAULT_PDE = 2,		/* an invalid page-directory entry */
	RUVM_MMU_FAULT_PTE = 3,		/* no valid PTE */
	RUVM_MMU_FAULT_READ_ONLY = 4,	/* a write to a read-only page */
	RUVM_MMU_FAULT_TABLE = 5,	/* a directory points at no memory */
};

/* The most words one walk reads: PDE3, PDE2, PDE1, both halves of PDE0, two PTEs. */
#define RUVM_PT_WALK_MAX 8

/**
 * struct ruvm_gpu_pt_walk - the MMU's walk of one address, word by word (RUVM_IOCTL_GPU_PT_WALK)
 *
 * Privileged (CAP_SYS_ADMIN). The GPU's MMU walks @va in its kernel VA space (or with
 * RUVM_VA_USER the calling file's user VA space) as the copy engine would (no TLB) and reports every 8-byte word it read, in order: PDE3, PDE2, PDE1,
 * the two halves of the PDE0 entry (big-page table, small-page table), then the 64K PTE
 * and/or the 4K PTE. The entries are in NVIDIA's MMU version 2 format (Documentation/ruvm.rst,
 * "GPU virtual mappings"). A fault is reported in @fault, not as an error.
 *
 * @gpu:            (in)  the GPU's id
 * @flags:          (in)  enum ruvm_va_space_flags
 * @va:             (in)  the GPU virtual address
 * @count:          (out) words read (at most RUVM_PT_WALK_MAX)
 * @fault:          (out) enum ruvm_mmu_fault
 * @page_size:      (out) translated: the page's size; else 0
 * @address:        (out) translated: where @va goes (a DMA address or a vidmem address)
 * @aperture:       (out) translated: enum ruvm_aperture of @address
 * @pad:            (out) 0
 * @entry_addr:     (out) where each word was read
 * @entry:          (out) the word
 * @entry_aperture: (out) enum ruvm_aperture of each @entry_addr
 * @reserved:       (in)  must be 0
 */
struct ruvm_gpu_pt_walk {
	__u32 gpu;
	__u32 flags;
	__u64 va;
	__u32 count;
	__u32 fault;
	__u64 page_size;
	__u64 address;
	__u32 aperture;
	__u32 pad;
	__u64 entry_addr[RUVM_PT_WALK_MAX];
	__u64 entry[RUVM_PT_WALK_MAX];
	__u8 entry_aperture[RUVM_PT_WALK_MAX];
	__u64 reserved[2];
};

/**
 * struct ruvm_test_pt_write - overwrite the PTE that maps a GPU VA (RUVM_IOCTL_TEST_PT_WRITE)
 *
 * Test-only, gated like RUVM_IOCTL_TEST_PLANT: the leaf entry for @va in the GPU's kernel VA
 * space (or with RUVM_VA_USER the calling file's user VA space) (the PTE, or the PDE0 half of a 2 MiB page; for an address that does not translate,
 * the PTE or PDE0 slot where the MMU's walk ended) is overwritten with @value and the GPU's
 * TLB invalidated, as a driver changing a PTE would. ENXIO if the walk ends above the leaf
 * level (a directory is missing). Used to prove that the engine reads the tables as written;
 * the entry should be put back before the mem is unmapped.
 *
 * @gpu:      (in)  the GPU's id
 * @flags:    (in)  enum ruvm_va_space_flags
 * @va:       (in)  a mapped GPU virtual address
 * @value:    (in)  the new entry
 * @old:      (out) the entry it replaced
 * @reserved: (in)  must be 0
 */
struct ruvm_test_pt_write {
	__u32 gpu;
	__u32 flags;
	__u64 va;
	__u64 value;
	__u64 old;
	__u64 reserved[2];
};

/**
 * struct ruvm_test_ce_raw - one copy-engine transfer at raw addresses (RUVM_IOCTL_TEST_CE_RAW)
 *
 * Test-only, gated like RUVM_IOCTL_TEST_PLANT: reads @len bytes at DMA address @src into the
 * engine, bypassing every table. Used to prove that an unmapped address really is unmapped
 * (the IOMMU faults).
 *
 * @gpu:      (in) the GPU's id
 * @flags:    (in) must be 0
 * @src:      (in) the DMA address to read
 * @len:      (in) bytes, 1 to 4095
 * @reserved: (in) must be 0
 */
struct ruvm_test_ce_raw {
	__u32 gpu;
	__u32 flags;
	__u64 src;
	__u64 len;
	__u64 reserved[2];
};

/*
 * Memory pools: chunks kept for reuse, already zeroed and DMA-mapped, with CUDA's pool
 * semantics (Documentation/ruvm.rst, "Memory pools"). A pool belongs to the file that made it.
 */

/* The most pools one open file may hold at once: RUVM_IOCTL_POOL_CREATE beyond it is ENOSPC. */
#define RUVM_MAX_FILE_POOLS 1024

/**
 * struct ruvm_pool_create - make a pool (RUVM_IOCTL_POOL_CREATE)
 *
 * @page_size:         (in)  the chunk size of every mem of the pool, 0 for the default; the
 *                           same rules as ruvm_mem_alloc.page_size for @backing
 * @backing:           (in)  enum ruvm_backing
 * @gpu:               (in)  RUVM_BACKING_VIDMEM: the GPU whose memory it holds; else 0
 * @release_threshold: (in)  bytes the pool may keep reserved before a free gives memory back
 *                           (CUDA's cudaMemPoolAttrReleaseThreshold; ~0: never)
 * @handle:            (out) the pool's handle, never 0
 * @chunk_size:        (out) its chunk size
 * @flags:             (in)  enum ruvm_pool_create_flags
 * @pad:               (in)  must be 0
 * @reserved:          (in)  must be 0
 */
struct ruvm_pool_create {
	__u64 page_size;
	__u32 backing;
	__u32 gpu;
	__u64 release_threshold;
	__u64 handle;
	__u64 chunk_size;
	__u32 flags;
	__u32 pad;
	__u64 reserved[2];
};

/* ruvm_pool_create.flags */
enum ruvm_pool_create_flags {
	/*
	 * The pool can be shared with other files (RUVM_IOCTL_POOL_EXPORT) and its mems with
	 * them (RUVM_IOCTL_MEM_EXPORT): CUDA's cudaMemHandleTypePosixFileDescriptor. Sysmem
	 * pools only (EINVAL for a vidmem pool).
	 */
	RUVM_POOL_EXPORTABLE = 1 << 0,
};

/**
 * struct ruvm_pool_handle - name a pool (RUVM_IOCTL_POOL_DESTROY)
 * @handle:   (in) the pool's handle
 * @flags:    (in) must be 0
 * @pad:      (in) must be 0
 * @reserved: (in) must be 0
 */
struct ruvm_pool_handle {
	__u64 handle;
	__u32 flags;
	__u32 pad;
	__u64 reserved[2];
};

/**
 * struct ruvm_pool_info - a pool's attributes (RUVM_IOCTL_POOL_GET)
 *
 * CUDA's attributes, in bytes: reserved = held by the pool (in use + pending + cached), used =
 * held by mems of the pool (a mem freed by RUVM_IOCTL_MEM_FREE counts until its chunks are
 * back: a user mapping or queued work may keep them; one freed by RUVM_OP_FREE stops counting
 * when the free is submitted, unless a user mapping still holds it: then when it goes), each
 * with its high watermark since creation or the last reset.
 * Pending = freed by RUVM_OP_FREE (or chunks an ALLOC took from such a free, given back by the
 * mem's RUVM_IOCTL_MEM_FREE or a failed submission), the free's (and the ALLOC's) completion
 * not yet observed by a synchronize
 * (RUVM_IOCTL_STREAM_SYNC, RUVM_IOCTL_EVENT_SYNC): reusable only under the pool's reuse
 * policies (@reuse), never given back by a trim, the release threshold or the shrinker. At all
 * times reserved_current = used_current + pending_bytes + cached_chunks * chunk_size.
 *
 * @handle:            (in)  the pool's handle
 * @flags:             (in)  must be 0
 * @backing:           (out) enum ruvm_backing
 * @release_threshold: (out) cudaMemPoolAttrReleaseThreshold
 * @reserved_current:  (out) cudaMemPoolAttrReservedMemCurrent
 * @reserved_high:     (out) cudaMemPoolAttrReservedMemHigh
 * @used_current:      (out) cudaMemPoolAttrUsedMemCurrent
 * @used_high:         (out) cudaMemPoolAttrUsedMemHigh
 * @hits:              (out) chunks handed out from the cache or a pending free
 * @misses:            (out) chunks allocated because the cache had none
 * @cached_chunks:     (out) chunks in the cache now ((reserved - used - pending) / chunk_size)
 * @chunk_size:        (out) the pool's chunk size
 * @access:            (out) bit n set: the pool's mems are DMA-mapped for GPU n
 * @gpu:               (out) RUVM_BACKING_VIDMEM: the pool's GPU
 * @reuse:             (out) enum ruvm_pool_reuse: the reuse policies that are on
 * @pending_bytes:     (out) bytes of chunks pending a free (above)
 * @pool_flags:        (in)  must be 0; (out) enum ruvm_pool_flags
 * @pad:               (in)  must be 0
 */
struct ruvm_pool_info {
	__u64 handle;
	__u32 flags;
	__u32 backing;
	__u64 release_threshold;
	__u64 reserved_current;
	__u64 reserved_high;
	__u64 used_current;
	__u64 used_high;
	__u64 hits;
	__u64 misses;
	__u64 cached_chunks;
	__u64 chunk_size;
	__u64 access;
	__u32 gpu;
	__u32 reuse;
	__u64 pending_bytes;
	__u32 pool_flags;
	__u32 pad;
};

/* ruvm_pool_info.pool_flags */
enum ruvm_pool_flags {
	/* Made with RUVM_POOL_EXPORTABLE. */
	RUVM_POOL_FLAG_EXPORTABLE = 1 << 0,
	/*
	 * Another file's pool, imported into this one (RUVM_IOCTL_POOL_IMPORT): the attributes
	 * are the exporting pool's.
	 */
	RUVM_POOL_FLAG_IMPORTED = 1 << 1,
};

/*
 * ruvm_pool_info.reuse: CUDA's reuse policies for chunks freed on a stream (RUVM_OP_FREE),
 * all on when a pool is made. An allocation on stream S (RUVM_OP_ALLOC) takes a pending free's
 * chunks when: the free was queued on S (always: S's order keeps the uses apart); S has waited
 * (RUVM_OP_WAIT_EVENT) for an event recorded on the freeing stream at or after the free
 * (FOLLOW_EVENT_DEPENDENCIES); the freeing stream has already reached the free
 * (ALLOW_OPPORTUNISTIC); or the pool cannot otherwise get the memory (the file's quota or the
 * page allocator refused it), and then the allocation waits in S for the free
 * (ALLOW_INTERNAL_DEPENDENCIES). Otherwise the allocation takes cached or new memory. A free
 * observed by a synchronize is cached: reusable by any allocation, policies or not.
 */
enum ruvm_pool_reuse {
	RUVM_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1 << 0,
	RUVM_POOL_REUSE_ALLOW_OPPORTUNISTIC = 1 << 1,
	RUVM_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 1 << 2,
};

/* ruvm_pool_set.attr: the attributes RUVM_IOCTL_POOL_SET changes. */
enum ruvm_pool_attr {
	/* Any value; a lower one gives back what the cache holds above it at once. */
	RUVM_POOL_ATTR_RELEASE_THRESHOLD = 1,
	/* Only 0, which resets the watermark to the current value (as in CUDA). */
	RUVM_POOL_ATTR_RESERVED_HIGH = 2,
	RUVM_POOL_ATTR_USED_HIGH = 3,
	/* 1 turns the policy on, 0 off (enum ruvm_pool_reuse; sysmem and vidmem pools alike). */
	RUVM_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 4,
	RUVM_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 5,
	RUVM_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 6,
};

/**
 * struct ruvm_pool_set - change an attribute of a pool (RUVM_IOCTL_POOL_SET)
 * @handle:   (in) the pool's handle
 * @attr:     (in) enum ruvm_pool_attr
 * @flags:    (in) must be 0
 * @value:    (in) the new value
 * @reserved: (in) must be 0
 */
struct ruvm_pool_set {
	__u64 handle;
	__u32 attr;
	__u32 flags;
	__u64 value;
	__u64 reserved[2];
};

/**
 * struct ruvm_pool_trim - give back cached memory (RUVM_IOCTL_POOL_TRIM)
 *
 * cudaMemPoolTrimTo: cached chunks are released until at most @min_bytes_to_keep stay
 * reserved; memory in use is never released.
 *
 * @handle:            (in)  the pool's handle
 * @min_bytes_to_keep: (in)  reserved bytes the pool may keep
 * @released:          (out) bytes given back
 * @flags:             (in)  must be 0
 * @pad:               (in)  must be 0
 * @reserved:          (in)  must be 0
 */
struct ruvm_pool_trim {
	__u64 handle;
	__u64 min_bytes_to_keep;
	__u64 released;
	__u32 flags;
	__u32 pad;
	__u64 reserved[2];
};

/* ruvm_pool_access.flags */
enum ruvm_pool_access_flags {
	/* Take the GPU out of the access set (without: put it in). */
	RUVM_POOL_ACCESS_REVOKE = 1 << 0,
};

/**
 * struct ruvm_pool_access - which GPUs a pool's chunks stay DMA-mapped for
 *                           (RUVM_IOCTL_POOL_SET_ACCESS)
 *
 * cudaMemPoolSetAccess for a sysmem pool: a mem allocated from the pool is DMA-mapped for
 * every GPU of the set as it is made (as by RUVM_IOCTL_MEM_MAP_GPU), and its chunks keep those
 * mappings while cached, so a mem that reuses them is mapped without a new mapping. Granting
 * changes the mems allocated from then on; revoking drops the cached chunks' mappings for the
 * GPU at once (the pool's live mems keep theirs until freed).
 *
 * @handle:   (in) the pool's handle
 * @gpu:      (in) the GPU's id
 * @flags:    (in) enum ruvm_pool_access_flags
 * @reserved: (in) must be 0
 */
struct ruvm_pool_access {
	__u64 handle;
	__u32 gpu;
	__u32 flags;
	__u64 reserved[2];
};

/* ruvm_gpu_pool.flags */
enum ruvm_gpu_pool_flags {
	/* Make @pool the GPU's current pool (0: its default pool again). Without: read it. */
	RUVM_GPU_POOL_SET = 1 << 0,
};

/**
 * struct ruvm_gpu_pool - a GPU's current pool for the calling file (RUVM_IOCTL_GPU_POOL)
 *
 * cudaDeviceGetMemPool / cudaDeviceSetMemPool: RUVM_OP_ALLOC with @src 0 takes its chunks from
 * the current pool of the stream's GPU. Each GPU has a default pool per file, made the first
 * time it is needed (read here, or an allocation from it): a sysmem pool of the default chunk
 * size, DMA-mapped for the GPU (its access set: granted again when the GPU comes back after
 * a removal), release threshold 0, all reuse policies on; it cannot be destroyed (EBUSY) and
 * goes with the file. A current pool destroyed leaves the GPU's default pool current. Errors:
 * EINVAL unknown @flags, non-zero @reserved; ENODEV the GPU is not present; ENOENT @pool is
 * not a pool of the file; EINVAL a vidmem pool; ENOSPC the default pool would exceed
 * RUVM_MAX_FILE_POOLS; ENOMEM.
 *
 * @gpu:      (in)  the GPU's id
 * @flags:    (in)  enum ruvm_gpu_pool_flags
 * @pool:     (in)  with RUVM_GPU_POOL_SET: the pool, or 0; (out) otherwise: the current pool
 * @reserved: (in)  must be 0
 */
struct ruvm_gpu_pool {
	__u32 gpu;
	__u32 flags;
	__u64 pool;
	__u64 reserved[2];
};

/* ruvm_ptr_attrs.type */
enum ruvm_ptr_type {
	/* Not ruvm memory: any address that is not in a user mapping of a mem (mapped or not). */
	RUVM_PTR_NONE = 0,
	/* In a user mapping of a mem (mmap of /dev/ruvm at its mmap offset), or in a range of
	 * the calling process registered through the calling file (RUVM_PTR_REGISTERED). */
	RUVM_PTR_MEM = 1,
};

/* ruvm_ptr_attrs.ptr_flags */
enum ruvm_ptr_flags {
	/* The mem is not the calling file's (a mapping made through another open file of
	 * /dev/ruvm, or inherited): @handle is 0. */
	RUVM_PTR_OTHER_FILE = 1 << 0,
	/* The mem was freed: its handle is gone (@handle is 0) and the mapping faults (SIGBUS);
	 * RUVM_PTR_OTHER_FILE is then not set, whichever file's it was. */
	RUVM_PTR_FREED = 1 << 1,
	/* The mem is an imported one (RUVM_IOCTL_MEM_IMPORT): its chunks are those of a mem of
	 * an exporting pool, @pool is that pool (the handle its import has in any file). */
	RUVM_PTR_IMPORTED = 1 << 2,
	/* The address is in a range of the calling process that the calling file registered
	 * (RUVM_IOCTL_MEM_REGISTER): @base is the range's start, @offset the byte of it. */
	RUVM_PTR_REGISTERED = 1 << 3,
};

/**
 * struct ruvm_ptr_attrs - what a user address is (RUVM_IOCTL_PTR_ATTRS)
 *
 * cudaPointerGetAttributes for an address of the calling process: whether it is ruvm memory
 * and, if so, which mem and where in it. Any other address (unmapped, the stack, another
 * file's or driver's mapping) answers RUVM_PTR_NONE with every other output 0 (@backing too,
 * which then means nothing): never an error. Errors: EINVAL (non-zero @flags or @reserved),
 * EFAULT.
 *
 * @addr:          (in)  the address
 * @flags:         (in)  must be 0
 * @type:          (out) enum ruvm_ptr_type
 * @handle:        (out) RUVM_PTR_MEM: the mem's handle in the calling file (0: see @ptr_flags)
 * @offset:        (out) RUVM_PTR_MEM: the byte of the mem @addr is (0 for its first)
 * @base:          (out) RUVM_PTR_MEM: the address of the mem's first byte in this mapping
 * @size:          (out) RUVM_PTR_MEM: the mem's size (bytes asked for)
 * @physical_size: (out) RUVM_PTR_MEM: its physical size (what the mapping covers)
 * @chunk_size:    (out) RUVM_PTR_MEM: its chunk size
 * @pool:          (out) RUVM_PTR_MEM: the pool its chunks came from (0: none, or the mem is
 *                       another file's: RUVM_PTR_OTHER_FILE)
 * @mapped_gpus:   (out) RUVM_PTR_MEM: bit n set: DMA-mapped for GPU n (0 once freed)
 * @backing:       (out) RUVM_PTR_MEM: enum ruvm_backing (user mappings are of sysmem)
 * @ptr_flags:     (out) RUVM_PTR_MEM: enum ruvm_ptr_flags
 * @reserved:      (in)  must be 0
 */
struct ruvm_ptr_attrs {
	__u64 addr;
	__u32 flags;
	__u32 type;
	__u64 handle;
	__u64 offset;
	__u64 base;
	__u64 size;
	__u64 physical_size;
	__u64 chunk_size;
	__u64 pool;
	__u64 mapped_gpus;
	__u32 backing;
	__u32 ptr_flags;
	__u64 reserved[2];
};

/*
 * IPC pools (CUDA's IPC memory pools; Documentation/ruvm.rst, "Sharing pools between
 * processes"). A pool made with RUVM_POOL_EXPORTABLE is exported as a file descriptor, which is
 * the capability: whoever holds it can import the pool into an open file of /dev/ruvm
 * (typically another process's, after SCM_RIGHTS). An imported pool cannot allocate. A mem of
 * an exportable pool is exported as RUVM_EXPORT_DATA_LEN bytes (layout below: pass them whole), which may travel by any
 * means; imported through the imported pool, they make a mem of the importer's file that shares
 * the exporter's chunks (mmap, GPU mappings and copies work on it as on any sysmem mem).
 */

/* Bytes of a mem's export data (cudaMemPoolPtrExportData). */
#define RUVM_EXPORT_DATA_LEN 64

/*
 * Export data, every word little-endian: bytes 0-7 RUVM_EXPORT_DATA_VERSION; 8-15 the exporting
 * pool's handle (RUVM_IOCTL_MEM_EXPORT's @pool); 16-23 the mem's serial (module-wide, never
 * reused while the module is loaded); 24-39 a random key made at the mem's first export; 40-63
 * zero. Pass it whole, never build it. It is good for the module load that made it, while the mem
 * is exported and no free of it has begun. A later layout gets a new version word; a module
 * refuses any but its own (EINVAL).
 */
#define RUVM_EXPORT_DATA_VERSION 0x7275766d65780001ULL

/**
 * struct ruvm_pool_export - a pool as a file descriptor (RUVM_IOCTL_POOL_EXPORT)
 *
 * cudaMemPoolExportToShareableHandle: a new close-on-exec descriptor for the pool, each call.
 * It keeps the pool's bookkeeping (not its memory) until it is closed, and the module loaded
 * (rmmod fails with EBUSY while one is open). Errors: EINVAL non-zero @flags or @reserved, or
 * a pool made without RUVM_POOL_EXPORTABLE, or an imported pool; ENOENT not a pool of the file;
 * EMFILE; ENOMEM.
 *
 * @handle:   (in)  a pool of the calling file
 * @flags:    (in)  must be 0
 * @fd:       (out) the descriptor
 * @reserved: (in)  must be 0
 */
struct ruvm_pool_export {
	__u64 handle;
	__u32 flags;
	__s32 fd;
	__u64 reserved[2];
};

/**
 * struct ruvm_pool_import - import a pool from its descriptor (RUVM_IOCTL_POOL_IMPORT)
 *
 * cudaMemPoolImportFromShareableHandle: the pool enters the calling file's pool table (counted
 * in RUVM_MAX_FILE_POOLS) under its own handle, the same in every file; importing it again,
 * or into the file that made it, returns that handle and changes nothing. An imported pool
 * serves RUVM_IOCTL_POOL_GET (the exporting pool's attributes, RUVM_POOL_FLAG_IMPORTED),
 * RUVM_IOCTL_MEM_IMPORT and RUVM_IOCTL_POOL_DESTROY (which takes it out of the importing file
 * only); anything else that names it is EINVAL: allocations (RUVM_IOCTL_MEM_ALLOC,
 * RUVM_OP_ALLOC), RUVM_IOCTL_GPU_POOL, POOL_SET, POOL_TRIM, POOL_SET_ACCESS. Errors: EINVAL
 * non-zero @flags or @reserved, or @fd is not a ruvm pool descriptor; EBADF @fd is not open;
 * ENOENT the pool was destroyed (or its file closed) and the file has it not; ENOSPC the
 * file's pool table is full;
 * ENOMEM.
 *
 * @fd:       (in)  a descriptor from RUVM_IOCTL_POOL_EXPORT
 * @flags:    (in)  must be 0
 * @handle:   (out) the pool's handle in the calling file
 * @reserved: (in)  must be 0
 */
struct ruvm_pool_import {
	__s32 fd;
	__u32 flags;
	__u64 handle;
	__u64 reserved[2];
};

/**
 * struct ruvm_mem_export - a mem's export data (RUVM_IOCTL_MEM_EXPORT)
 *
 * cudaMemPoolExportPointer: the same data for the mem at each call. The data names the mem
 * with a random key: it is not a handle, and is refused once the mem's handle leaves its file
 * (RUVM_IOCTL_MEM_FREE, a RUVM_OP_FREE submitted, even in a submission that fails, or the
 * file's close). Errors: EINVAL non-zero @flags, @pad or @reserved, or a mem of no pool made
 * with RUVM_POOL_EXPORTABLE (an imported mem included); ENOENT not a mem of the file.
 *
 * @handle:   (in)  a mem of the calling file, allocated from an exportable pool
 * @flags:    (in)  must be 0
 * @pad:      (in)  must be 0
 * @pool:     (out) the pool's handle
 * @data:     (out) the export data
 * @reserved: (in)  must be 0
 */
struct ruvm_mem_export {
	__u64 handle;
	__u32 flags;
	__u32 pad;
	__u64 pool;
	__u8 data[RUVM_EXPORT_DATA_LEN];
	__u64 reserved[2];
};

/**
 * struct ruvm_mem_import - a mem from another's export data (RUVM_IOCTL_MEM_IMPORT)
 *
 * cudaMemPoolImportPointer: a new mem of the calling file, under a new handle, that shares the
 * exported mem's chunks (sysmem, the same size and layout; not zeroed, not mapped for any GPU).
 * Its physical size counts in the calling file's limit (max_file_mib) too. It is freed as any
 * mem; the chunks live until the last of the exporter's mem and its imports lets go of them.
 * CUDA's rule is that importers free first: an exporter that frees (or closes its file) while
 * imports of the mem live is said once in the kernel log, and its chunks stay, counted in its
 * pool's used bytes and its file's limit, until the last import is freed. Errors: EINVAL
 * non-zero @flags, @pad or @reserved, @pool is a pool of the file that is not exportable, or
 * @data is not export data (bytes 0-7 not RUVM_EXPORT_DATA_VERSION, or a non-zero byte from 40
 * on: checked before its names); ENOENT @pool is not a pool of the file, was destroyed or its
 * file closed, or @data names no live exported mem of @pool with that key (its pool word is not
 * @pool, no mem of @pool has its serial, never exported, a free begun, another key; forged,
 * stale, another pool's or another load's alike); ENOSPC the file's limit; ENOMEM.
 *
 * @pool:        (in)  the exporting pool, imported (or the file's own exportable pool)
 * @flags:       (in)  must be 0
 * @pad:         (in)  must be 0
 * @data:        (in)  export data from RUVM_IOCTL_MEM_EXPORT
 * @handle:      (out) the new mem's handle
 * @mmap_offset: (out) its mmap offset
 * @size:        (out) its size
 * @reserved:    (in)  must be 0
 */
struct ruvm_mem_import {
	__u64 pool;
	__u32 flags;
	__u32 pad;
	__u8 data[RUVM_EXPORT_DATA_LEN];
	__u64 handle;
	__u64 mmap_offset;
	__u64 size;
	__u64 reserved[2];
};

/**
 * struct ruvm_mem_export_dmabuf - a mem as a dma-buf (RUVM_IOCTL_MEM_EXPORT_DMABUF)
 *
 * A new dma-buf of the whole mem (its physical size), opened read-write, with a close-on-exec
 * descriptor: another process (after SCM_RIGHTS) or another device's driver imports it. Its
 * operations: map for an importing device (a scatter table of the pages, DMA-mapped through
 * that device's IOMMU), mmap, vmap, and CPU access begin/end (DMA_BUF_IOCTL_SYNC). Its
 * reservation object carries the fences of the mem's queued work (DMA_BUF_IOCTL_EXPORT_SYNC_FILE
 * and poll() see them); every dma-buf of a mem, and every mem imported from one, shares it.
 * The buffer holds the mem's chunks (charged to the exporting file until the last holder goes:
 * the mem, its imports or a buffer), and holds the module: rmmod fails with EBUSY while a
 * buffer ruvm exported lives. Freeing the mem while a buffer lives is allowed (the buffer
 * keeps the pages). Its mmap maps every frame at once (VM_PFNMAP: its pages cannot be pinned,
 * nor dropped: madvise(MADV_DONTNEED or MADV_FREE) on it is EINVAL). Errors: EINVAL
 * non-zero @flags or @reserved; ENOENT not a mem of the file, or a RUVM_OP_FREE of it was
 * submitted; EOPNOTSUPP a vidmem mem or another exporter's buffer; ENOMEM; EMFILE no
 * descriptor.
 *
 * @handle:   (in)  a sysmem mem of the calling file
 * @flags:    (in)  must be 0
 * @fd:       (out) the dma-buf's descriptor
 * @reserved: (in)  must be 0
 */
struct ruvm_mem_export_dmabuf {
	__u64 handle;
	__u32 flags;
	__s32 fd;
	__u64 reserved[2];
};

/**
 * struct ruvm_mem_import_dmabuf - a mem from a dma-buf (RUVM_IOCTL_MEM_IMPORT_DMABUF)
 *
 * A dma-buf becomes a new mem of the calling file, under a new handle, not mapped for any GPU.
 * One that ruvm exported (in any process) shares the buffer's pages (sysmem, the same size and
 * layout as the exported mem; not zeroed). Another exporter's (udmabuf, a GPU driver's) is held
 * as is: its size in 4 KiB chunks, reached only by GPUs' copy engines through RUVM_IOCTL_MEM_MAP_GPU,
 * which attaches the buffer to that GPU and maps it through the GPU's IOMMU (EOPNOTSUPP on a
 * simulated GPU); mmap through /dev/ruvm, the kernel mapping, GPU VA mappings and a dma-buf
 * export of it are EOPNOTSUPP (map the buffer's own descriptor instead). Its size counts in
 * the calling file's limit (max_file_mib). It is freed as any mem, in any order with the
 * exporter's. Work on it follows the buffer's reservation object (implicit sync). Errors:
 * EINVAL non-zero @flags or @reserved, @fd is not a dma-buf, or another exporter's buffer is
 * not whole pages; EBADF @fd is not open; ENOSPC the file's limit; ENOMEM.
 *
 * @fd:          (in)  a dma-buf's descriptor
 * @flags:       (in)  must be 0
 * @handle:      (out) the new mem's handle
 * @mmap_offset: (out) its mmap offset
 * @size:        (out) its size (the exported mem's)
 * @reserved:    (in)  must be 0
 */
struct ruvm_mem_import_dmabuf {
	__s32 fd;
	__u32 flags;
	__u64 handle;
	__u64 mmap_offset;
	__u64 size;
	__u64 reserved[2];
};

/* What RUVM_IOCTL_TEST_SIM_GPU does. */
enum ruvm_sim_gpu_op {
	/* Remove the simulated GPU, as an unbind removes a test GPU. */
	RUVM_SIM_GPU_REMOVE = 1,
	/* Bring a removed simulated GPU back, under the same id. */
	RUVM_SIM_GPU_ADD = 2,
};

/**
 * struct ruvm_test_sim_gpu - remove a simulated GPU, or bring it back (RUVM_IOCTL_TEST_SIM_GPU)
 *
 * Test-only, gated like RUVM_IOCTL_TEST_PLANT. Simulated GPUs sit on the faux bus, which user
 * space cannot unbind; this removes one the way an unbind removes a test GPU (marked gone: its
 * GPU virtual mappings, page tables, DMA tables and vidmem storage dropped; its mems stay, free
 * to free), or brings a removed one back under the same id with empty vidmem and page tables.
 * Errors: EINVAL an unknown @op, non-zero @flags/@pad/@reserved, @gpu not a simulated GPU;
 * ENODEV removing one that is removed already; EEXIST adding one that is there.
 *
 * @gpu:      (in) the simulated GPU's id
 * @op:       (in) enum ruvm_sim_gpu_op
 * @flags:    (in) must be 0
 * @pad:      (in) must be 0
 * @reserved: (in) must be 0
 */
struct ruvm_test_sim_gpu {
	__u32 gpu;
	__u32 op;
	__u32 flags;
	__u32 pad;
	__u64 reserved[2];
};

/* What RUVM_IOCTL_TEST_PLANT makes the module do. */
enum ruvm_plant {
	/* Hit a WARN_ON in the module: proves the test runner fails on kernel warnings. */
	RUVM_PLANT_WARN = 1,
	/*
	 * The next RUVM_IOCTL_STREAM_SUBMIT (to any stream) holds its stream's turn for
	 * RUVM_PLANT_SLOW_SUBMIT_MS once it is planned, before it is queued, or until its caller
	 * gets a signal (it then fails with EINTR, or restarts, nothing submitted): a long
	 * submission for a test to wait behind.
	 */
	RUVM_PLANT_SLOW_SUBMIT = 2,
};

/* How long RUVM_PLANT_SLOW_SUBMIT holds a stream's turn. */
#define RUVM_PLANT_SLOW_SUBMIT_MS 10000

/**
 * struct ruvm_test_plant - deliberately misbehave (RUVM_IOCTL_TEST_PLANT)
 *
 * Test-only: refused with ENOSYS unless the module was loaded with enable_test_ioctls=1,
 * and with EPERM without CAP_SYS_ADMIN. Used to prove that the harness catches what it
 * claims to catch.
 *
 * @what:     (in) one of enum ruvm_plant
 * @flags:    (in) must be 0
 * @reserved: (in) must be 0
 */
struct ruvm_test_plant {
	__u32 what;
	__u32 flags;
	__u64 reserved[2];
};

/*
 * Streams and events (Documentation/ruvm.rst, "Streams and events"). A stream is a queue of
 * operations of one file on one GPU's copy engine, run in order and asynchronously; an event
 * is a point recorded on a stream: a dma_fence, which can be exported as a sync_file.
 */

/* The most streams one open file may hold: RUVM_IOCTL_STREAM_CREATE beyond it is ENOSPC. */
#define RUVM_MAX_FILE_STREAMS 64
/* The most events one open file may hold: RUVM_IOCTL_EVENT_CREATE beyond it is ENOSPC. */
#define RUVM_MAX_FILE_EVENTS 4096
/* The most operations one RUVM_IOCTL_STREAM_SUBMIT carries. */
#define RUVM_MAX_SUBMIT_OPS 256
/*
 * The most operations queued on one file's streams, not yet retired (destroyed streams' work
 * included): a submit beyond it is EAGAIN.
 */
#define RUVM_MAX_STREAM_OPS 16384
/* The longest any wait may be (ms): a wait op, RUVM_IOCTL_STREAM_SYNC, RUVM_IOCTL_EVENT_SYNC. */
#define RUVM_WAIT_MAX_MS 60000

/**
 * struct ruvm_stream_create - make a stream on a GPU (RUVM_IOCTL_STREAM_CREATE)
 *
 * ENODEV if the GPU is not present, EOPNOTSUPP if it has no copy engine, ENOSPC at
 * RUVM_MAX_FILE_STREAMS.
 *
 * @gpu:      (in)  the GPU's id
 * @flags:    (in)  must be 0
 * @handle:   (out) the stream's handle, never 0
 * @context:  (out) the dma_fence context of the stream's timeline
 * @reserved: (in)  must be 0
 */
struct ruvm_stream_create {
	__u32 gpu;
	__u32 flags;
	__u64 handle;
	__u64 context;
	__u64 reserved[2];
};

/**
 * struct ruvm_stream_handle - name a stream (RUVM_IOCTL_STREAM_DESTROY)
 *
 * DESTROY returns at once, as cudaStreamDestroy does: the handle is gone, and the work
 * already queued runs to its end (or until the file is closed), every fence signalling.
 *
 * @handle:   (in) the stream
 * @flags:    (in) must be 0
 * @pad:      (in) must be 0
 * @reserved: (in) must be 0
 */
struct ruvm_stream_handle {
	__u64 handle;
	__u32 flags;
	__u32 pad;
	__u64 reserved[2];
};

/* ruvm_op.kind */
enum ruvm_op_kind {
	/*
	 * Engine copy of @length bytes from mem @src at @src_offset to mem @dst at @dst_offset,
	 * as RUVM_IOCTL_CE_COPY does (a sysmem mem must be mapped on the stream's GPU when the op
	 * is submitted, a vidmem mem must be that GPU's).
	 */
	RUVM_OP_COPY = 1,
	/*
	 * Engine copy of @length bytes from GPU VA @src to @dst, as RUVM_IOCTL_CE_COPY_VA does:
	 * @flags is enum ruvm_va_space_flags (the kernel VA space needs CAP_SYS_ADMIN); an MMU
	 * fault fails the op with EFAULT.
	 */
	RUVM_OP_COPY_VA = 2,
	/*
	 * Writes @length bytes of mem @dst at @dst_offset with enum ruvm_fill_kind @fill_kind and
	 * seed @value, as RUVM_IOCTL_MEM_FILL does (the mem must be mapped for the CPU kernel
	 * when the op is submitted).
	 */
	RUVM_OP_FILL = 3,
	/* Records event @value at this point of the stream (cudaEventRecord). */
	RUVM_OP_RECORD = 4,
	/*
	 * Waits for the point event @value was last recorded at when the op was submitted
	 * (cudaStreamWaitEvent); an event never recorded is complete.
	 */
	RUVM_OP_WAIT_EVENT = 5,
	/* Waits for the fence of sync_file fd @value (any driver's). */
	RUVM_OP_WAIT_FD = 6,
	/*
	 * Allocates a mem of @length bytes from sysmem pool @src (0: the current pool of the
	 * stream's GPU, RUVM_IOCTL_GPU_POOL), as RUVM_IOCTL_MEM_ALLOC with ruvm_mem_alloc.pool
	 * does (cudaMallocAsync); @flags: RUVM_ALLOC_ZERO or 0. The mem is made when the op is
	 * submitted: its handle is written to the op's @dst and its mmap offset to @dst_offset
	 * (their input is ignored: the ops array must be writable), and is in the file's table
	 * once the submission returns. Its chunks may still be in use by work queued before the
	 * free that gave them back (the pool's reuse policies, enum ruvm_pool_reuse): the memory
	 * may be used only by operations after the ALLOC in its stream, or after an event
	 * recorded after it (an ALLOC takes first the chunks of a FREE earlier in its own
	 * submission, of the same pool and size; right after a FREE by index of a mem of its
	 * submission, of the same pool, @length and @flags, it takes that mem whole: its chunks
	 * and mmap offset, under a new handle); RUVM_ALLOC_ZERO zeroes reused chunks when the stream reaches the
	 * op (a stream in error retires it without running it: the chunks then hold what an
	 * earlier mem of the file left). A vidmem pool is EOPNOTSUPP.
	 */
	RUVM_OP_ALLOC = 7,
	/*
	 * Frees mem @dst when the stream reaches the op (cudaFreeAsync): its handle is gone at
	 * once (ENOENT for later operations and calls), its user mappings are zapped at once
	 * (SIGBUS), its CPU kernel and GPU mappings stay until the stream reaches the free. A
	 * sysmem pool mem's chunks are pending in its pool from then on (enum ruvm_pool_reuse),
	 * or, if a user VMA still maps the mem (zapped), once that VMA goes; others go (to the
	 * page allocator, or a vidmem pool's cache) once their last holder lets go: the work
	 * queued on them, a user VMA. Any mem of the file may be freed this way.
	 */
	RUVM_OP_FREE = 8,
};

/*
 * ruvm_op.flags of COPY and FREE: the mem is that of an earlier RUVM_OP_ALLOC of the same
 * submission, @dst (@src) being that op's index in the ops array (0 for the first) rather than
 * a handle. (A FILL needs a CPU kernel mapping, which an ALLOC's mem cannot have yet.)
 *
 * ruvm_op.flags of COPY, and ruvm_ce_copy.flags: RUVM_OP_DST_PTR (RUVM_OP_SRC_PTR) names that
 * side by an address of the submitting process, @dst (@src) being the address and @dst_offset
 * (@src_offset) 0, as struct ruvm_ce_copy says; resolved when the op is submitted (the mem
 * then stays the op's whatever becomes of the mapping). A side with both its INDEX and PTR
 * flags is EINVAL.
 */
enum ruvm_op_flags {
	RUVM_OP_DST_INDEX = 1 << 8,
	RUVM_OP_SRC_INDEX = 1 << 9,
	RUVM_OP_DST_PTR = 1 << 10,
	RUVM_OP_SRC_PTR = 1 << 11,
};

/**
 * struct ruvm_op - one operation of RUVM_IOCTL_STREAM_SUBMIT
 *
 * Every field an operation's kind does not name must be 0 (EINVAL otherwise).
 *
 * @kind:       enum ruvm_op_kind
 * @flags:      COPY_VA: enum ruvm_va_space_flags; ALLOC: RUVM_ALLOC_ZERO or 0; COPY: enum
 *              ruvm_op_flags; FREE: RUVM_OP_DST_INDEX or 0; otherwise 0
 * @dst:        COPY, FILL, FREE: the (destination) mem's handle (COPY: or its address, with
 *              RUVM_OP_DST_PTR); COPY_VA: the destination VA; ALLOC: (out) the new mem's handle
 * @dst_offset: COPY, FILL: the offset in it (0 with RUVM_OP_DST_PTR); ALLOC: (out) the new
 *              mem's mmap offset
 * @src:        COPY: the source mem's handle (or its address, with RUVM_OP_SRC_PTR); COPY_VA:
 *              the source VA; ALLOC: the pool, or 0
 * @src_offset: COPY: the offset in it (0 with RUVM_OP_SRC_PTR)
 * @length:     COPY, COPY_VA, FILL, ALLOC: bytes, > 0
 * @value:      FILL: the seed; RECORD, WAIT_EVENT: the event's handle; WAIT_FD: the fd
 * @fill_kind:  FILL: enum ruvm_fill_kind
 * @timeout_ms: WAIT_EVENT, WAIT_FD: how long the wait may last, 1 to RUVM_WAIT_MAX_MS; when
 *              it passes first, the op fails with ETIMEDOUT
 * @reserved:   0
 */
struct ruvm_op {
	__u32 kind;
	__u32 flags;
	__u64 dst;
	__u64 dst_offset;
	__u64 src;
	__u64 src_offset;
	__u64 length;
	__u64 value;
	__u32 fill_kind;
	__u32 timeout_ms;
	__u64 reserved;
};

/**
 * struct ruvm_stream_submit - queue operations on a stream (RUVM_IOCTL_STREAM_SUBMIT)
 *
 * Every operation is checked before any is queued: on an error nothing is queued, no handle
 * is given or taken (the mems ALLOCs made are freed again: a handle written back names
 * nothing), and the pools hold what they held (but for their high watermarks). Returns at once; the operations run in order, after every operation
 * submitted to the stream before them (on a stream with nothing queued, the records,
 * satisfied waits and FREEs at the head of the submission are retired before it returns). Errors: ENOENT (no such stream, mem, pool or event; a COPY's address in no mapping of a mem of the file),
 * EINVAL (a bad field, a range outside a mem, an fd that is not a sync_file, @count 0 or above
 * RUVM_MAX_SUBMIT_OPS, an index flag naming an op that is not an earlier ALLOC), EOVERFLOW
 * (COPY, FILL: an offset + length past 2^64, as RUVM_IOCTL_CE_COPY; ALLOC: a size past what
 * a mem can be, as RUVM_IOCTL_MEM_ALLOC), ENXIO (a mem not mapped as
 * the op needs), ENODEV (the stream's GPU is gone or its removal has begun, also once it is
 * bound again: said before EIO), EPERM (the kernel VA space without CAP_SYS_ADMIN),
 * EIO (the stream is in error, its GPU present: RUVM_IOCTL_STREAM_QUERY says why), EAGAIN (RUVM_MAX_STREAM_OPS
 * would be queued), EOPNOTSUPP (ALLOC from a vidmem pool), EINTR (a signal came while the call
 * waited for its turn behind another submission to the same stream: submissions to a stream
 * are planned one at a time, and the wait is interruptible), ENOSPC, ENOMEM and EINTR (ALLOC, as
 * RUVM_IOCTL_MEM_ALLOC: a signal stops a large allocation; ENOSPC also when the GPU's default
 * pool would exceed RUVM_MAX_FILE_POOLS), EFAULT (@ops unreadable, or, with an ALLOC, not writable; or this
 * structure not writable: checked before anything is queued).
 *
 * @handle:      (in)  the stream
 * @flags:       (in)  must be 0
 * @count:       (in)  operations
 * @ops:         (in)  user pointer to @count struct ruvm_op
 * @first_seqno: (out) the stream timeline's seqno of the first operation; operation i has
 *                     @first_seqno + i (a stream's first operation has seqno 1)
 * @reserved:    (in)  must be 0
 */
struct ruvm_stream_submit {
	__u64 handle;
	__u32 flags;
	__u32 count;
	__u64 ops;
	__u64 first_seqno;
	__u64 reserved[2];
};

/**
 * struct ruvm_stream_query - a stream's state (RUVM_IOCTL_STREAM_QUERY)
 *
 * @handle:       (in)  the stream
 * @flags:        (in)  must be 0
 * @gpu:          (out) its GPU
 * @submitted:    (out) the seqno of the last operation submitted (0: none yet)
 * @completed:    (out) the seqno of the last operation retired, run or not
 * @error:        (out) 0, or the errno of the first operation that failed: from then on the
 *                      stream is in error (Documentation/ruvm.rst, "Errors are sticky")
 * @pad:          (out) 0
 * @failed_seqno: (out) with @error: the seqno of the operation that failed
 * @current_seqno: (out) the seqno of the operation the engine is on (running, or waiting for
 *                      a fence), 0 if none
 * @current_done: (out) bytes it has moved
 * @current_len:  (out) bytes it moves (0 for operations that move none)
 * @reserved:     (in)  must be 0
 */
struct ruvm_stream_query {
	__u64 handle;
	__u32 flags;
	__u32 gpu;
	__u64 submitted;
	__u64 completed;
	__u32 error;
	__u32 pad;
	__u64 failed_seqno;
	__u64 current_seqno;
	__u64 current_done;
	__u64 current_len;
	__u64 reserved[2];
};

/*
 * The stream status page (Documentation/ruvm.rst, "The stream status page"): one page of the
 * file, mapped read-only with mmap(NULL, page size, PROT_READ, MAP_SHARED, fd,
 * RUVM_STATUS_MMAP_OFFSET), an array of RUVM_STATUS_SLOTS struct ruvm_status_slot. A stream
 * given a slot by RUVM_IOCTL_STREAM_STATUS publishes its completed point there, so a process
 * learns how far a stream is without a system call.
 */
#define RUVM_STATUS_MMAP_OFFSET 0x7ffffffffff00000ULL
#define RUVM_STATUS_SLOTS 128

/**
 * struct ruvm_status_slot - one stream's entry of the status page
 *
 * @handle:    the stream's handle while the slot is its (from its RUVM_IOCTL_STREAM_STATUS
 *             until RUVM_IOCTL_STREAM_DESTROY or the file's close), else 0. Written after the
 *             other words when the slot is given, and set to 0 first when it is taken back:
 *             a reader that loads, each an acquire load, @handle, @completed, @error,
 *             @failed_seqno and @handle again, and sees the stream's handle both times, read
 *             that stream's words.
 * @completed: the seqno its work is complete up to, as RUVM_IOCTL_STREAM_QUERY's @completed
 *             (every operation up to it retired, run or not, and its fences signalled); it
 *             only grows.
 * @error:     0, or the errno that put the stream in error (STREAM_QUERY's @error), written
 *             before the @completed that covers @failed_seqno
 * @failed_seqno: with @error, the seqno of the operation that failed
 */
struct ruvm_status_slot {
	__u64 handle;
	__u64 completed;
	__u64 error;
	__u64 failed_seqno;
};

/**
 * struct ruvm_stream_status - give a stream a slot of the status page
 * (RUVM_IOCTL_STREAM_STATUS)
 *
 * The file's status page is made at the first call (or the first mmap of it: EINVAL for any
 * length but one page, EPERM for PROT_WRITE or PROT_EXEC, ENOMEM). EINVAL for flags or
 * reserved bits, ENOENT for a
 * handle that is not a stream of the file (or a destroyed one), ENOSPC when every slot is
 * taken (it cannot be: a file has at most RUVM_MAX_FILE_STREAMS streams), ENOMEM when the page
 * cannot be had.
 *
 * @handle:    (in)  the stream
 * @flags:     (in)  must be 0
 * @slot:      (out) its slot (the same on every call for the stream)
 * @offset:    (out) RUVM_STATUS_MMAP_OFFSET: where to mmap the page
 * @completed: (out) its completed point now (what the slot says)
 * @reserved:  (in)  must be 0
 */
struct ruvm_stream_status {
	__u64 handle;
	__u32 flags;
	__u32 slot;
	__u64 offset;
	__u64 completed;
	__u64 reserved[2];
};

/* ruvm_stream_sync.flags */
enum ruvm_sync_flags {
	/* Every stream of the file (cudaDeviceSynchronize): @handle must be 0. */
	RUVM_SYNC_EVERY_STREAM = 1 << 0,
};

/**
 * struct ruvm_stream_sync - wait until a stream's work is done (RUVM_IOCTL_STREAM_SYNC)
 *
 * Waits until every operation submitted before the call has retired (every fence among them
 * signalled). 0 if they all ran; EIO if the stream is (with RUVM_SYNC_EVERY_STREAM: any
 * stream is) in error; ETIMEDOUT when @timeout_ms passed first; EINTR on a signal. When the
 * wait ends with 0 or EIO (as RUVM_IOCTL_EVENT_SYNC's), the frees (RUVM_OP_FREE) it waited for
 * are observed: their chunks are cached, and every pool of the file gives back what it holds
 * above its release threshold (cudaStreamSynchronize, cudaDeviceSynchronize). With
 * RUVM_SYNC_EVERY_STREAM, every free whose stream has reached it is observed too (a
 * destroyed stream's included); a stream whose own wait ended is observed even if another's
 * timed out.
 *
 * @handle:     (in) the stream (0 with RUVM_SYNC_EVERY_STREAM)
 * @flags:      (in) enum ruvm_sync_flags
 * @timeout_ms: (in) 1 to RUVM_WAIT_MAX_MS
 * @reserved:   (in) must be 0
 */
struct ruvm_stream_sync {
	__u64 handle;
	__u32 flags;
	__u32 timeout_ms;
	__u64 reserved[2];
};

/**
 * struct ruvm_event - an event (RUVM_IOCTL_EVENT_CREATE, _DESTROY, _QUERY, _SYNC, _EXPORT)
 *
 * An event holds the point it was last recorded at (RUVM_OP_RECORD), a dma_fence of the
 * stream's timeline; an event never recorded is complete. CREATE: ENOSPC at
 * RUVM_MAX_FILE_EVENTS. DESTROY: the point lives on in whoever holds its fence. QUERY: @status,
 * @stream, @seqno. SYNC: waits for the point: 0 if it signalled without an error, EIO if it
 * signalled with one (QUERY's @status says which), ETIMEDOUT if @timeout_ms passed first, or
 * EINTR; with 0 or EIO the frees of the point's stream up to the point are observed, as by
 * RUVM_IOCTL_STREAM_SYNC. EXPORT: a new sync_file fd (close-on-exec) of the point (a signalled
 * fence if never recorded). SYNC and EXPORT make the point's fence the first time one is needed: ENOMEM.
 *
 * @handle:     (in) the event; (out) for CREATE, never 0 (its input is ignored)
 * @flags:      (in)  must be 0
 * @timeout_ms: (in)  SYNC: 1 to RUVM_WAIT_MAX_MS; otherwise 0
 * @status:     (out) QUERY: 0 pending, 1 signalled, or -errno it signalled with
 * @fd:         (out) EXPORT: the sync_file
 * @stream:     (out) QUERY: the stream it was last recorded on (0: never)
 * @seqno:      (out) QUERY: the point's seqno on that stream's timeline
 * @reserved:   (in)  must be 0
 */
struct ruvm_event {
	__u64 handle;
	__u32 flags;
	__u32 timeout_ms;
	__s32 status;
	__s32 fd;
	__u64 stream;
	__u64 seqno;
	__u64 reserved[2];
};

/* Command numbers, also in an enum so that bindgen sees them as constants. */
enum {
	RUVM_IOCTL_INFO = _IOWR(RUVM_IOCTL_MAGIC, 0x00, struct ruvm_info),
	RUVM_IOCTL_MEM_ALLOC = _IOWR(RUVM_IOCTL_MAGIC, 0x01, struct ruvm_mem_alloc),
	RUVM_IOCTL_MEM_FREE = _IOWR(RUVM_IOCTL_MAGIC, 0x02, struct ruvm_mem_handle),
	RUVM_IOCTL_MEM_QUERY = _IOWR(RUVM_IOCTL_MAGIC, 0x03, struct ruvm_mem_query),
	RUVM_IOCTL_MEM_MAP_CPU_KERNEL = _IOWR(RUVM_IOCTL_MAGIC, 0x04, struct ruvm_mem_handle),
	RUVM_IOCTL_MEM_UNMAP_CPU_KERNEL = _IOWR(RUVM_IOCTL_MAGIC, 0x05, struct ruvm_mem_handle),
	RUVM_IOCTL_MEM_FILL = _IOWR(RUVM_IOCTL_MAGIC, 0x06, struct ruvm_mem_fill),
	RUVM_IOCTL_MEM_VERIFY = _IOWR(RUVM_IOCTL_MAGIC, 0x07, struct ruvm_mem_fill),
	RUVM_IOCTL_MEM_COPY = _IOWR(RUVM_IOCTL_MAGIC, 0x08, struct ruvm_mem_copy),
	RUVM_IOCTL_MEM_RANGE = _IOWR(RUVM_IOCTL_MAGIC, 0x09, struct ruvm_mem_range),
	RUVM_IOCTL_MEM_REGISTER = _IOWR(RUVM_IOCTL_MAGIC, 0x0a, struct ruvm_mem_register),
	RUVM_IOCTL_GPU_LIST = _IOWR(RUVM_IOCTL_MAGIC, 0x20, struct ruvm_gpu_list),
	RUVM_IOCTL_MEM_MAP_GPU = _IOWR(RUVM_IOCTL_MAGIC, 0x21, struct ruvm_mem_gpu),
	RUVM_IOCTL_MEM_UNMAP_GPU = _IOWR(RUVM_IOCTL_MAGIC, 0x22, struct ruvm_mem_gpu),
	RUVM_IOCTL_MEM_DMA_ADDRS = _IOWR(RUVM_IOCTL_MAGIC, 0x23, struct ruvm_mem_dma_addrs),
	RUVM_IOCTL_CE_COPY = _IOWR(RUVM_IOCTL_MAGIC, 0x24, struct ruvm_ce_copy),
	RUVM_IOCTL_MEM_GPU_PHYS = _IOWR(RUVM_IOCTL_MAGIC, 0x25, struct ruvm_mem_gpu_phys),
	RUVM_IOCTL_PMM_STATS = _IOWR(RUVM_IOCTL_MAGIC, 0x26, struct ruvm_pmm_stats),
	RUVM_IOCTL_PMM_CHECK_LEAK = _IOWR(RUVM_IOCTL_MAGIC, 0x27, struct ruvm_pmm_check_leak),
	RUVM_IOCTL_GPU_ATTACH = _IOWR(RUVM_IOCTL_MAGIC, 0x28, struct ruvm_gpu_attach),
	RUVM_IOCTL_GPU_DETACH = _IOWR(RUVM_IOCTL_MAGIC, 0x29, struct ruvm_gpu_attach),
	RUVM_IOCTL_MEM_MAP_GPU_KERNEL = _IOWR(RUVM_IOCTL_MAGIC, 0x2a, struct ruvm_mem_gpu),
	RUVM_IOCTL_MEM_UNMAP_GPU_KERNEL = _IOWR(RUVM_IOCTL_MAGIC, 0x2b, struct ruvm_mem_gpu),
	RUVM_IOCTL_MEM_GPU_VA = _IOWR(RUVM_IOCTL_MAGIC, 0x2c, struct ruvm_mem_gpu_va),
	RUVM_IOCTL_CE_COPY_VA = _IOWR(RUVM_IOCTL_MAGIC, 0x2d, struct ruvm_ce_copy_va),
	RUVM_IOCTL_VIDMEM_LIMIT = _IOWR(RUVM_IOCTL_MAGIC, 0x38, struct ruvm_vidmem_limit),
	RUVM_IOCTL_GPU_PT_WALK = _IOWR(RUVM_IOCTL_MAGIC, 0x2e, struct ruvm_gpu_pt_walk),
	RUVM_IOCTL_MEM_MAP_GPU_USER = _IOWR(RUVM_IOCTL_MAGIC, 0x2f, struct ruvm_mem_gpu_user),
	RUVM_IOCTL_MEM_UNMAP_GPU_USER = _IOWR(RUVM_IOCTL_MAGIC, 0x30, struct ruvm_mem_gpu),
	RUVM_IOCTL_POOL_CREATE = _IOWR(RUVM_IOCTL_MAGIC, 0x31, struct ruvm_pool_create),
	RUVM_IOCTL_POOL_DESTROY = _IOWR(RUVM_IOCTL_MAGIC, 0x32, struct ruvm_pool_handle),
	RUVM_IOCTL_POOL_GET = _IOWR(RUVM_IOCTL_MAGIC, 0x33, struct ruvm_pool_info),
	RUVM_IOCTL_POOL_SET = _IOWR(RUVM_IOCTL_MAGIC, 0x34, struct ruvm_pool_set),
	RUVM_IOCTL_POOL_TRIM = _IOWR(RUVM_IOCTL_MAGIC, 0x35, struct ruvm_pool_trim),
	RUVM_IOCTL_POOL_SET_ACCESS = _IOWR(RUVM_IOCTL_MAGIC, 0x36, struct ruvm_pool_access),
	RUVM_IOCTL_GPU_POOL = _IOWR(RUVM_IOCTL_MAGIC, 0x37, struct ruvm_gpu_pool),
	RUVM_IOCTL_PTR_ATTRS = _IOWR(RUVM_IOCTL_MAGIC, 0x50, struct ruvm_ptr_attrs),
	RUVM_IOCTL_POOL_EXPORT = _IOWR(RUVM_IOCTL_MAGIC, 0x51, struct ruvm_pool_export),
	RUVM_IOCTL_POOL_IMPORT = _IOWR(RUVM_IOCTL_MAGIC, 0x52, struct ruvm_pool_import),
	RUVM_IOCTL_MEM_EXPORT = _IOWR(RUVM_IOCTL_MAGIC, 0x53, struct ruvm_mem_export),
	RUVM_IOCTL_MEM_IMPORT = _IOWR(RUVM_IOCTL_MAGIC, 0x54, struct ruvm_mem_import),
	RUVM_IOCTL_MEM_EXPORT_DMABUF = _IOWR(RUVM_IOCTL_MAGIC, 0x55, struct ruvm_mem_export_dmabuf),
	RUVM_IOCTL_MEM_IMPORT_DMABUF = _IOWR(RUVM_IOCTL_MAGIC, 0x56, struct ruvm_mem_import_dmabuf),
	RUVM_IOCTL_STREAM_CREATE = _IOWR(RUVM_IOCTL_MAGIC, 0x40, struct ruvm_stream_create),
	RUVM_IOCTL_STREAM_DESTROY = _IOWR(RUVM_IOCTL_MAGIC, 0x41, struct ruvm_stream_handle),
	RUVM_IOCTL_STREAM_SUBMIT = _IOWR(RUVM_IOCTL_MAGIC, 0x42, struct ruvm_stream_submit),
	RUVM_IOCTL_STREAM_QUERY = _IOWR(RUVM_IOCTL_MAGIC, 0x43, struct ruvm_stream_query),
	RUVM_IOCTL_STREAM_SYNC = _IOWR(RUVM_IOCTL_MAGIC, 0x44, struct ruvm_stream_sync),
	RUVM_IOCTL_EVENT_CREATE = _IOWR(RUVM_IOCTL_MAGIC, 0x45, struct ruvm_event),
	RUVM_IOCTL_EVENT_DESTROY = _IOWR(RUVM_IOCTL_MAGIC, 0x46, struct ruvm_event),
	RUVM_IOCTL_EVENT_QUERY = _IOWR(RUVM_IOCTL_MAGIC, 0x47, struct ruvm_event),
	RUVM_IOCTL_EVENT_SYNC = _IOWR(RUVM_IOCTL_MAGIC, 0x48, struct ruvm_event),
	RUVM_IOCTL_EVENT_EXPORT = _IOWR(RUVM_IOCTL_MAGIC, 0x49, struct ruvm_event),
	RUVM_IOCTL_STREAM_STATUS = _IOWR(RUVM_IOCTL_MAGIC, 0x4a, struct ruvm_stream_status),
	RUVM_IOCTL_AUDIT = _IOWR(RUVM_IOCTL_MAGIC, 0x10, struct ruvm_audit),
	RUVM_IOCTL_STATS = _IOWR(RUVM_IOCTL_MAGIC, 0x11, struct ruvm_stats),
	RUVM_IOCTL_REGISTER_UNLOAD_STATE =
		_IOWR(RUVM_IOCTL_MAGIC, 0x12, struct ruvm_register_unload_state),
	RUVM_IOCTL_BENCH = _IOWR(RUVM_IOCTL_MAGIC, 0x13, struct ruvm_bench),
	RUVM_IOCTL_TEST_PLANT = _IOWR(RUVM_IOCTL_MAGIC, 0x80, struct ruvm_test_plant),
	RUVM_IOCTL_TEST_LEAK = _IOWR(RUVM_IOCTL_MAGIC, 0x81, struct ruvm_test_leak),
	RUVM_IOCTL_TEST_CE_RAW = _IOWR(RUVM_IOCTL_MAGIC, 0x82, struct ruvm_test_ce_raw),
	RUVM_IOCTL_TEST_PT_WRITE = _IOWR(RUVM_IOCTL_MAGIC, 0x83, struct ruvm_test_pt_write),
	RUVM_IOCTL_TEST_SIM_GPU = _IOWR(RUVM_IOCTL_MAGIC, 0x84, struct ruvm_test_sim_gpu),
};

#endif /* _UAPI_LINUX_RUVM_H */
