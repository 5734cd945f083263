// SPDX-License-Identifier: GPL-2.0
/*
 * A C program on libruvm's allocator: 64 blocks of 1 byte to 2 MiB on a stream of the first
 * GPU with a copy engine, each filled by the engine with a byte of its own, read back by the
 * CPU at the block's address, freed, asked for again (hits), and the statistics printed.
 * Exits 0 when every byte is right and everything went back.
 *
 *   cc -static -I include/uapi -I tools/libruvm/capi/include alloc_example.c libruvm.a -lm
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <libruvm.h>

#define BLOCKS 64

static int fail(const char *what, int err)
{
	fprintf(stderr, "alloc_example: %s: %s\n", what, strerror(err < 0 ? -err : err));
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
		return fail("a GPU with a copy engine", ENODEV);

	struct ruvm_stream_create sc = { .gpu = gpu };
	if (ioctl(fd, RUVM_IOCTL_STREAM_CREATE, &sc))
		return fail("RUVM_IOCTL_STREAM_CREATE", errno);

	struct ruvm_allocator_config cfg = {
		.gpus = &gpu,
		.gpu_count = 1,
		.reuse = RUVM_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES |
			 RUVM_POOL_REUSE_ALLOW_OPPORTUNISTIC,
		.release_threshold = UINT64_MAX,
	};
	struct ruvm_allocator *a;
	int rc = ruvm_allocator_create(fd, &cfg, &a);
	if (rc)
		return fail("ruvm_allocator_create", rc);

	struct ruvm_block b[BLOCKS];
	uint64_t len[BLOCKS];
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < BLOCKS; i++) {
			len[i] = 1 + (((uint64_t)i * 2654435761u) % (2u << 20));
			rc = ruvm_alloc(a, len[i], sc.handle, &b[i]);
			if (rc)
				return fail("ruvm_alloc", rc);
			struct ruvm_op fill = {
				.kind = RUVM_OP_FILL,
				.flags = 0,
				.dst = b[i].mem,
				.dst_offset = b[i].offset,
				.length = len[i],
				.value = (uint64_t)(i + round * BLOCKS) & 0xff,
				.fill_kind = RUVM_FILL_BYTE,
			};
			rc = ruvm_allocator_submit(a, sc.handle, &fill, 1, NULL);
			if (rc)
				return fail("ruvm_allocator_submit (FILL)", rc);
		}
		rc = ruvm_allocator_synchronize(a, sc.handle);
		if (rc)
			return fail("ruvm_allocator_synchronize", rc);
		for (int i = 0; i < BLOCKS; i++) {
			const volatile unsigned char *p = (const void *)(uintptr_t)b[i].ptr;
			unsigned char want = (unsigned char)((i + round * BLOCKS) & 0xff);
			if (p[0] != want || p[len[i] - 1] != want) {
				fprintf(stderr, "alloc_example: block %d: %#x/%#x, wanted %#x\n", i, p[0],
					p[len[i] - 1], want);
				return 1;
			}
		}
		for (int i = 0; i < BLOCKS; i++) {
			rc = ruvm_free(a, &b[i], sc.handle);
			if (rc)
				return fail("ruvm_free", rc);
		}
		if (ruvm_free(a, &b[0], sc.handle) != -EINVAL)
			return fail("a second free of a block was not refused", EINVAL);
		rc = ruvm_allocator_synchronize(a, sc.handle);
		if (rc)
			return fail("ruvm_allocator_synchronize", rc);
	}

	struct ruvm_allocator_stats st;
	ruvm_allocator_stats(a, &st);
	printf("alloc_example: %d blocks twice on GPU %u: %llu hits, %llu misses, %llu bytes reserved at most for %llu asked at most\n",
	       BLOCKS, gpu, (unsigned long long)st.hits, (unsigned long long)st.misses,
	       (unsigned long long)st.reserved_peak, (unsigned long long)st.requested_peak);
	uint64_t given = 0;
	rc = ruvm_allocator_trim(a, 0, &given);
	if (rc)
		return fail("ruvm_allocator_trim", rc);
	ruvm_allocator_stats(a, &st);
	if (st.reserved != 0 || st.allocated != 0 || st.hits < BLOCKS)
		return fail("everything given back, the second round hits", EINVAL);
	ruvm_allocator_destroy(a);
	struct ruvm_stream_handle sh = { .handle = sc.handle };
	if (ioctl(fd, RUVM_IOCTL_STREAM_DESTROY, &sh))
		return fail("RUVM_IOCTL_STREAM_DESTROY", errno);
	close(fd);
	printf("alloc_example: ok\n");
	return 0;
}
