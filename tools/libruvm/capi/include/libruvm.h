/* SPDX-License-Identifier: GPL-2.0 */
/*
 * libruvm's C API: the user-space stream-ordered allocator of ruvm (Documentation/ruvm.rst,
 * "ruvmctl and libruvm"). Link with -lruvm (libruvm.a or libruvm.so, built by `make libruvm`);
 * include <linux/ruvm.h> (include/uapi) for the device's own structures and ioctls.
 *
 * Blocks of any size are carved out of segments, mems of the allocator's file that the kernel
 * maps once into the process (and its own address space) and DMA-maps once for the GPUs given
 * at creation; a hit makes no system call. A block freed on a stream is that stream's at once
 * and another stream's only under CUDA's reuse rules (RUVM_POOL_REUSE_*). Work on blocks, and
 * the records of events waited on through the allocator, are submitted with
 * ruvm_allocator_submit (that is how it knows each stream's points); a block's bytes may be
 * touched by the CPU once the work on it is complete.
 *
 * Every function returns 0 or a negative errno. An allocator may be used from any thread.
 */
#ifndef LIBRUVM_H
#define LIBRUVM_H

#include <stddef.h>
#include <stdint.h>
#include <linux/ruvm.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ruvm_allocator;

/**
 * struct ruvm_allocator_config - how an allocator is made (NULL: the defaults)
 * @gpus:              the GPUs every segment is DMA-mapped for (RUVM_IOCTL_MEM_MAP_GPU)
 * @gpu_count:         how many (at most 64)
 * @reuse:             RUVM_POOL_REUSE_* bits: the cross-stream reuse rules (default none)
 * @release_threshold: idle bytes kept at a synchronize (UINT64_MAX: none given back there;
 *                     default 0, as CUDA's)
 * @reserve_limit:     the most bytes of segments held at once, 0 for none of the allocator's
 *                     own (the kernel's bounds hold always)
 */
struct ruvm_allocator_config {
	const uint32_t *gpus;
	uint32_t gpu_count;
	uint32_t reuse;
	uint64_t release_threshold;
	uint64_t reserve_limit;
};

/**
 * struct ruvm_block - a block: @len bytes at @offset in mem @mem, at @ptr in the process
 *
 * The last four fields are the allocator's own: give the block back unchanged.
 */
struct ruvm_block {
	uint64_t mem;
	uint64_t offset;
	uint64_t len;
	uint64_t ptr;
	uint32_t segment;
	uint32_t generation;
	uint32_t large;
	uint32_t pad;
};

/* struct ruvm_allocator_stats - reserved (what the kernel holds: whole segments, arenas'
 * resident chunks)/allocated/requested now and at most, segments held, hits, misses (the
 * kernel asked for memory), blocks taken from another stream's frees and waits inserted for
 * them, give-backs, free bytes in held segments and the longest free block, the streams and
 * events the allocator keeps points of (until released or forgotten). */
struct ruvm_allocator_stats {
	uint64_t reserved, reserved_peak;
	uint64_t allocated, allocated_peak;
	uint64_t requested, requested_peak;
	uint64_t segments;
	uint64_t hits, misses;
	uint64_t cross_stream, waits_inserted;
	uint64_t released;
	uint64_t free, largest_free;
	uint64_t streams_known, events_known;
};
/* The same, field for field, as libruvm's Rust Stats (which asserts 128 bytes too). */
#ifdef __cplusplus
static_assert(sizeof(struct ruvm_allocator_stats) == 16 * sizeof(uint64_t),
	      "struct ruvm_allocator_stats changed");
#else
_Static_assert(sizeof(struct ruvm_allocator_stats) == 16 * sizeof(uint64_t),
	       "struct ruvm_allocator_stats changed");
#endif

/* An allocator on open file @fd of /dev/ruvm (duplicated: the caller may close its own).
 * -EINVAL for a bad config, -EBADF for a bad descriptor. */
int ruvm_allocator_create(int fd, const struct ruvm_allocator_config *cfg,
			  struct ruvm_allocator **out);
/* Gives every segment back (blocks still in use included) and frees the allocator. */
void ruvm_allocator_destroy(struct ruvm_allocator *a);

/* A block of at least @len bytes for work on @stream (a stream handle of the file): -EINVAL
 * for 0, -ENOMEM beyond 1 TiB or when no memory can be had, the kernel's errnos for a new
 * segment (-ENODEV: a GPU going). */
int ruvm_alloc(struct ruvm_allocator *a, uint64_t len, uint64_t stream, struct ruvm_block *out);
/* Gives @b back, ordered on @stream; -EINVAL for a block not in use (freed twice, stale,
 * another allocator's). */
int ruvm_free(struct ruvm_allocator *a, const struct ruvm_block *b, uint64_t stream);

/* RUVM_IOCTL_STREAM_SUBMIT of @count operations, noted by the allocator; *@first (if not
 * NULL) gets the first one's seqno. */
int ruvm_allocator_submit(struct ruvm_allocator *a, uint64_t stream, const struct ruvm_op *ops,
			  uint32_t count, uint64_t *first);
/* A RECORD of @event on @stream, and a WAIT_EVENT of it on @stream (the waiter may then take
 * the blocks the recording stream freed before the record). */
int ruvm_allocator_record_event(struct ruvm_allocator *a, uint64_t stream, uint64_t event);
int ruvm_allocator_wait_event(struct ruvm_allocator *a, uint64_t stream, uint64_t event);
/* Waits for what was submitted to @stream through the allocator (-EIO: the stream is in
 * error); its frees become anyone's, idle segments go back above the release threshold. */
int ruvm_allocator_synchronize(struct ruvm_allocator *a, uint64_t stream);
/* Synchronizes @stream and forgets it (call it before destroying the stream; -EIO forgets it
 * all the same, another error nothing). */
int ruvm_allocator_release_stream(struct ruvm_allocator *a, uint64_t stream);
/* Forgets where @event was last recorded (call it before destroying the event). */
int ruvm_allocator_forget_event(struct ruvm_allocator *a, uint64_t event);
/* Gives idle segments back until at most @keep bytes are held; *@given (if not NULL) gets
 * the bytes given back. */
int ruvm_allocator_trim(struct ruvm_allocator *a, uint64_t keep, uint64_t *given);
int ruvm_allocator_stats(struct ruvm_allocator *a, struct ruvm_allocator_stats *out);

/*
 * Pinned heaps (Documentation/ruvm.rst, libruvm::heap): malloc-speed pinned memory,
 * DMA-mapped once for the heap's GPUs, on a mimalloc arena over a sparse mem of the file; the
 * memory mimalloc decommits (its purge, ruvm_heap_collect, ruvm_heap_destroy) goes back to the
 * kernel. Usable from any thread. A heap's arena stays reserved (its metadata resident) until
 * the process ends; the next heap of the same open file, GPUs and arena size takes it again.
 */
struct ruvm_heap;

/* struct ruvm_heap_stats - resident bytes now and at most (mimalloc's metadata included),
 * bytes in use now and at most, allocations, frees, hits (allocations that committed
 * nothing), commits and decommits mimalloc asked for since the heap was made, the arena's
 * size. */
struct ruvm_heap_stats {
	uint64_t reserved, reserved_peak;
	uint64_t in_use, in_use_peak;
	uint64_t allocs, frees, hits;
	uint64_t commits, decommits;
	uint64_t arena_size;
};

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(struct ruvm_heap_stats) == 80, "struct ruvm_heap_stats");
#elif defined(__cplusplus)
static_assert(sizeof(struct ruvm_heap_stats) == 80, "struct ruvm_heap_stats");
#endif

/* A heap over an arena (a destroyed heap's, or a new one) of @arena_size bytes (0: 256 MiB;
 * at least mimalloc's 32 MiB, at most what the module takes as one mem) of the open file @fd (duplicated), DMA-mapped for
 * the @gpu_count GPUs at @gpus (at most 64). -EINVAL a bad argument or a module without
 * sparse mems, -ENODEV a GPU that is not there, -ENOMEM mimalloc refused the arena. */
int ruvm_heap_create(int fd, const uint32_t *gpus, uint32_t gpu_count, uint64_t arena_size,
		     struct ruvm_heap **out);
/* Frees every block of the heap and gives its chunks back. */
void ruvm_heap_destroy(struct ruvm_heap *h);
/* As malloc, calloc, aligned_alloc (@align a power of two), realloc and free: NULL when the
 * arena is full or the kernel refuses memory (the quota, the memory cgroup). */
void *ruvm_heap_malloc(struct ruvm_heap *h, size_t size);
void *ruvm_heap_calloc(struct ruvm_heap *h, size_t count, size_t size);
void *ruvm_heap_aligned_alloc(struct ruvm_heap *h, size_t align, size_t size);
void *ruvm_heap_realloc(struct ruvm_heap *h, void *p, size_t size);
void ruvm_heap_free(struct ruvm_heap *h, void *p);
/* Gives back everything the heap holds free. */
int ruvm_heap_collect(struct ruvm_heap *h);
int ruvm_heap_stats(struct ruvm_heap *h, struct ruvm_heap_stats *out);
/* The mem and offset of @p if it is in a pinned heap of this process (no system call), which
 * RUVM_IOCTL_CE_COPY and stream operations take; -ENOENT otherwise. */
int ruvm_heap_locate(const void *p, uint64_t *mem, uint64_t *offset);
/* GPU @gpu's DMA address of the byte at @p of heap @h (no system call: the heap reads its
 * chunks' addresses as they are committed), good to the end of @p's 64 KiB chunk while its
 * block lives and the GPU is present; -ENOENT if @p is not in @h's arena, its chunk is not
 * resident, @h is not mapped for @gpu, the GPU went, or the heap's reads of bus addresses
 * were refused (they need CAP_SYS_ADMIN, as RUVM_IOCTL_MEM_DMA_ADDRS does); -EINVAL for a
 * NULL @h or @addr. */
int ruvm_heap_dma_addr(struct ruvm_heap *h, const void *p, uint32_t gpu, uint64_t *addr);

#ifdef __cplusplus
}
#endif

#endif /* LIBRUVM_H */
