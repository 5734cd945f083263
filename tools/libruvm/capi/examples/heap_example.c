// SPDX-License-Identifier: GPL-2.0
/*
 * A C program on libruvm's pinned heap: blocks of 8 bytes to 4 MiB from a heap DMA-mapped for
 * the first GPU with a copy engine; each is written by the CPU, copied by the engine into the
 * next block through the mem and offset the heap reports, and read back; then everything is
 * freed and collected, and what the kernel still holds is printed. Exits 0 when every byte
 * is right and the heap gave its memory back.
 *
 *   cc -static -I include/uapi -I tools/libruvm/capi/include heap_example.c libruvm.a -lm
 *   (or: cc heap_example.c $(pkg-config --cflags --libs --static libruvm))
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <libruvm.h>

#define BLOCKS 24

static int fail(const char *what, int err)
{
	fprintf(stderr, "heap_example: %s: %s\n", what, strerror(err < 0 ? -err : err));
	return 1;
}

int main(void)
{
	int fd = open("/dev/ruvm", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return fail("open /dev/ruvm", errno);

	struct ruvm_gpu_info gpus[RUVM_MAX_GPUS];
	struct ruvm_gpu_list list = { .count = RUVM_MAX_GPUS, .gpus = (uintptr_t)gpus };
	if (ioctl(fd, RUVM_IOCTL_GPU_LIST, &list))
		return fail("RUVM_IOCTL_GPU_LIST", errno);
	uint32_t gpu = UINT32_MAX;
	for (uint32_t i = 0; i < list.count && i < RUVM_MAX_GPUS; i++)
		if ((gpus[i].flags & RUVM_GPU_PRESENT) && (gpus[i].flags & RUVM_GPU_COPY_ENGINE)) {
			gpu = gpus[i].id;
			break;
		}
	if (gpu == UINT32_MAX)
		return fail("no GPU with a copy engine", ENODEV);

	struct ruvm_heap *h;
	int rc = ruvm_heap_create(fd, &gpu, 1, 64 << 20, &h);
	if (rc)
		return fail("ruvm_heap_create", rc);
	/* The heap keeps its own descriptor. */

	unsigned char *b[BLOCKS];
	size_t len[BLOCKS];
	for (int i = 0; i < BLOCKS; i++) {
		len[i] = (size_t)8 << (i % 20);
		b[i] = ruvm_heap_malloc(h, len[i]);
		if (!b[i])
			return fail("ruvm_heap_malloc", ENOMEM);
		memset(b[i], i + 1, len[i]);
	}
	for (int i = 0; i + 1 < BLOCKS; i++) {
		size_t n = len[i] < len[i + 1] ? len[i] : len[i + 1];
		uint64_t src, src_off, dst, dst_off;
		if (ruvm_heap_locate(b[i], &src, &src_off) ||
		    ruvm_heap_locate(b[i + 1], &dst, &dst_off))
			return fail("ruvm_heap_locate", ENOENT);
		struct ruvm_ce_copy c = {
			.gpu = gpu,
			.length = n,
			.src_handle = src,
			.src_offset = src_off,
			.dst_handle = dst,
			.dst_offset = dst_off,
		};
		/* Every other copy names both blocks by their pointers instead. */
		if (i % 2)
			c = (struct ruvm_ce_copy){
				.gpu = gpu,
				.flags = RUVM_OP_SRC_PTR | RUVM_OP_DST_PTR,
				.length = n,
				.src_handle = (uintptr_t)b[i],
				.dst_handle = (uintptr_t)b[i + 1],
			};
		if (ioctl(fd, RUVM_IOCTL_CE_COPY, &c))
			return fail("RUVM_IOCTL_CE_COPY", errno);
		for (size_t k = 0; k < n; k++)
			if (b[i + 1][k] != (unsigned char)(i + 1))
				return fail("a byte the engine copied", EIO);
		memset(b[i + 1], i + 2, n);
	}
	/* A block's DMA address for the GPU, with no system call, is what the kernel says of its
	 * chunk; a caller the kernel refuses bus addresses (without CAP_SYS_ADMIN) gets none. */
	uint64_t mem, offset, dma, chunk_addr = 0;
	if (ruvm_heap_locate(b[3], &mem, &offset))
		return fail("ruvm_heap_locate", ENOENT);
	struct ruvm_mem_dma_addrs q = {
		.handle = mem,
		.gpu = gpu,
		.first_chunk = offset / (64 << 10),
		.count = 1,
		.addrs = (uintptr_t)&chunk_addr,
	};
	int kernel = ioctl(fd, RUVM_IOCTL_MEM_DMA_ADDRS, &q) ? -errno : 0;
	rc = ruvm_heap_dma_addr(h, b[3], gpu, &dma);
	if (kernel == 0 ? (rc || q.count != 1 || chunk_addr + offset % (64 << 10) != dma)
			: (kernel != -EPERM || rc != -ENOENT))
		return fail("a block's DMA address", EIO);
	int local;
	if (ruvm_heap_locate(&local, &mem, &offset) != -ENOENT)
		return fail("a stack address was found in a heap", EINVAL);

	struct ruvm_heap_stats st;
	ruvm_heap_stats(h, &st);
	printf("heap_example: %d blocks on GPU %u: %llu bytes in use, %llu resident, %llu hits of %llu\n",
	       BLOCKS, gpu, (unsigned long long)st.in_use, (unsigned long long)st.reserved,
	       (unsigned long long)st.hits, (unsigned long long)st.allocs);
	for (int i = 0; i < BLOCKS; i++)
		ruvm_heap_free(h, b[i]);
	ruvm_heap_collect(h);
	ruvm_heap_stats(h, &st);
	printf("heap_example: after free and collect: %llu bytes resident, %llu decommits\n",
	       (unsigned long long)st.reserved, (unsigned long long)st.decommits);
	if (st.in_use != 0 || st.reserved > (1 << 20))
		return fail("the heap's memory went back", EINVAL);
	ruvm_heap_destroy(h);
	close(fd);
	printf("heap_example: ok\n");
	return 0;
}
