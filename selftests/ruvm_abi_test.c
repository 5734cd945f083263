// SPDX-License-Identifier: GPL-2.0
/*
 * The ruvm ABI seen from C, the way a user's program sees it: the uapi header must compile
 * on its own, have the documented layout, and the module must answer through it.
 * Built with the kernel's kselftest harness; prints KTAP.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/ruvm.h>

#include "kselftest_harness.h"

/* The layout the header promises: the same for 32- and 64-bit callers, no hidden padding. */
_Static_assert(sizeof(struct ruvm_info) == 120, "struct ruvm_info size");
_Static_assert(offsetof(struct ruvm_info, abi_version) == 0, "abi_version");
_Static_assert(offsetof(struct ruvm_info, flags) == 4, "flags");
_Static_assert(offsetof(struct ruvm_info, features) == 8, "features");
_Static_assert(offsetof(struct ruvm_info, test_ioctls) == 16, "test_ioctls");
_Static_assert(offsetof(struct ruvm_info, pad) == 20, "pad");
_Static_assert(offsetof(struct ruvm_info, version) == 24, "version");
_Static_assert(offsetof(struct ruvm_info, live_mems) == 56, "live_mems");
_Static_assert(offsetof(struct ruvm_info, live_bytes) == 64, "live_bytes");
_Static_assert(offsetof(struct ruvm_info, max_alloc_bytes) == 72, "max_alloc_bytes");
_Static_assert(offsetof(struct ruvm_info, max_file_bytes) == 80, "max_file_bytes");
_Static_assert(offsetof(struct ruvm_info, reserved) == 88, "reserved");
_Static_assert(sizeof(struct ruvm_mem_alloc) == 88, "struct ruvm_mem_alloc size");
_Static_assert(offsetof(struct ruvm_mem_alloc, handle) == 24, "alloc handle");
_Static_assert(offsetof(struct ruvm_mem_alloc, gpu) == 56, "alloc gpu");
_Static_assert(offsetof(struct ruvm_mem_alloc, pad) == 60, "alloc pad");
_Static_assert(offsetof(struct ruvm_mem_alloc, pool) == 64, "alloc pool");
_Static_assert(offsetof(struct ruvm_mem_alloc, user_addr) == 72, "alloc user_addr");
_Static_assert(offsetof(struct ruvm_mem_alloc, reserved) == 80, "alloc reserved");
_Static_assert(sizeof(struct ruvm_pool_create) == 64, "struct ruvm_pool_create size");
_Static_assert(offsetof(struct ruvm_pool_create, handle) == 24, "pool_create handle");
_Static_assert(sizeof(struct ruvm_pool_handle) == 32, "struct ruvm_pool_handle size");
_Static_assert(sizeof(struct ruvm_pool_info) == 120, "struct ruvm_pool_info size");
_Static_assert(offsetof(struct ruvm_pool_info, reserved_current) == 24, "pool_info reserved_current");
_Static_assert(offsetof(struct ruvm_pool_info, access) == 88, "pool_info access");
_Static_assert(offsetof(struct ruvm_pool_info, gpu) == 96, "pool_info gpu");
_Static_assert(offsetof(struct ruvm_pool_info, reuse) == 100, "pool_info reuse");
_Static_assert(offsetof(struct ruvm_pool_info, pending_bytes) == 104, "pool_info pending_bytes");
_Static_assert(offsetof(struct ruvm_pool_info, pool_flags) == 112, "pool_info pool_flags");
_Static_assert(offsetof(struct ruvm_pool_info, pad) == 116, "pool_info pad");
_Static_assert(sizeof(struct ruvm_gpu_pool) == 32, "struct ruvm_gpu_pool size");
_Static_assert(offsetof(struct ruvm_gpu_pool, flags) == 4, "gpu_pool flags");
_Static_assert(offsetof(struct ruvm_gpu_pool, pool) == 8, "gpu_pool pool");
_Static_assert(offsetof(struct ruvm_gpu_pool, reserved) == 16, "gpu_pool reserved");
_Static_assert(RUVM_IOCTL_GPU_POOL == _IOWR(RUVM_IOCTL_MAGIC, 0x37, struct ruvm_gpu_pool),
	       "GPU_POOL number");
_Static_assert(sizeof(struct ruvm_op) == 72, "struct ruvm_op size");
_Static_assert(offsetof(struct ruvm_op, dst) == 8, "op dst");
_Static_assert(offsetof(struct ruvm_op, dst_offset) == 16, "op dst_offset");
_Static_assert(offsetof(struct ruvm_op, src) == 24, "op src");
_Static_assert(RUVM_OP_ALLOC == 7 && RUVM_OP_FREE == 8, "op kinds");
/* An ALLOC's flags are ruvm_alloc_flags; the index flags of the others must not collide. */
_Static_assert(((RUVM_OP_DST_INDEX | RUVM_OP_SRC_INDEX) &
		(RUVM_ALLOC_FLAGS_ALL | RUVM_VA_USER)) == 0, "op index flags");
_Static_assert((RUVM_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES | RUVM_POOL_REUSE_ALLOW_OPPORTUNISTIC |
		RUVM_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES) == 7, "pool reuse bits");
_Static_assert((RUVM_FEATURES_ALL & RUVM_FEATURE_STREAM_ALLOC) != 0, "stream alloc feature");
_Static_assert(sizeof(struct ruvm_stream_status) == 48, "struct ruvm_stream_status size");
_Static_assert(offsetof(struct ruvm_stream_status, slot) == 12, "status slot");
_Static_assert(offsetof(struct ruvm_stream_status, completed) == 24, "status completed");
_Static_assert(sizeof(struct ruvm_status_slot) == 32, "struct ruvm_status_slot size");
_Static_assert(RUVM_STATUS_SLOTS * sizeof(struct ruvm_status_slot) <= 4096,
	       "the status page's slots fit a 4 KiB page");
_Static_assert(RUVM_STATUS_MMAP_OFFSET % (1 << 20) == 0 && RUVM_STATUS_MMAP_OFFSET < (1ULL << 63),
	       "status page offset aligned, a valid loff_t");
_Static_assert(RUVM_AUDIT_POOL_PENDING == RUVM_AUDIT_CLASSES - 1, "pool_pending class");
_Static_assert(sizeof(struct ruvm_pool_set) == 40, "struct ruvm_pool_set size");
_Static_assert(sizeof(struct ruvm_pool_trim) == 48, "struct ruvm_pool_trim size");
_Static_assert(sizeof(struct ruvm_pool_access) == 32, "struct ruvm_pool_access size");
_Static_assert(RUVM_AUDIT_CLASSES * 8 + 8 <= 256, "struct ruvm_unload_state fits 256 bytes");
_Static_assert(sizeof(struct ruvm_mem_handle) == 32, "struct ruvm_mem_handle size");
_Static_assert(sizeof(struct ruvm_mem_query) == 104, "struct ruvm_mem_query size");
_Static_assert(offsetof(struct ruvm_mem_query, mapped) == 56, "query mapped");
_Static_assert(offsetof(struct ruvm_mem_query, user_mappings) == 64, "query user_mappings");
_Static_assert(offsetof(struct ruvm_mem_query, gpu) == 80, "query gpu");
_Static_assert(offsetof(struct ruvm_mem_query, gpu_kernel_va) == 88, "query gpu_kernel_va");
_Static_assert(offsetof(struct ruvm_mem_query, reserved) == 96, "query reserved");
_Static_assert(sizeof(struct ruvm_gpu_info) == 56, "struct ruvm_gpu_info size");
_Static_assert(offsetof(struct ruvm_gpu_info, dma_mapped_bytes) == 40, "gpu_info dma_mapped_bytes");
_Static_assert(offsetof(struct ruvm_gpu_info, vidmem_size) == 48, "gpu_info vidmem_size");
_Static_assert(sizeof(struct ruvm_mem_gpu_phys) == 64, "struct ruvm_mem_gpu_phys size");
_Static_assert(offsetof(struct ruvm_mem_gpu_phys, address) == 32, "gpu_phys address");
_Static_assert(offsetof(struct ruvm_mem_gpu_phys, aperture) == 40, "gpu_phys aperture");
_Static_assert(sizeof(struct ruvm_pmm_stats) == 112, "struct ruvm_pmm_stats size");
_Static_assert(offsetof(struct ruvm_pmm_stats, allocated) == 24, "pmm_stats allocated");
_Static_assert(offsetof(struct ruvm_pmm_stats, roots) == 48, "pmm_stats roots");
_Static_assert(offsetof(struct ruvm_pmm_stats, pt_tables) == 80, "pmm_stats pt_tables");
_Static_assert(offsetof(struct ruvm_pmm_stats, reserved) == 96, "pmm_stats reserved");
_Static_assert(sizeof(struct ruvm_gpu_pt_walk) == 200, "struct ruvm_gpu_pt_walk size");
_Static_assert(offsetof(struct ruvm_gpu_pt_walk, entry_aperture) == 176, "pt_walk entry_aperture");
_Static_assert(sizeof(struct ruvm_ce_copy_va) == 48, "struct ruvm_ce_copy_va size");
_Static_assert(sizeof(struct ruvm_mem_gpu_va) == 48, "struct ruvm_mem_gpu_va size");
_Static_assert(sizeof(struct ruvm_pmm_check_leak) == 64, "struct ruvm_pmm_check_leak size");
_Static_assert(offsetof(struct ruvm_pmm_check_leak, free_after) == 40, "check_leak free_after");
_Static_assert(sizeof(struct ruvm_mem_fill) == 72, "struct ruvm_mem_fill size");
_Static_assert(offsetof(struct ruvm_mem_fill, mismatches) == 40, "fill mismatches");
_Static_assert(sizeof(struct ruvm_mem_copy) == 64, "struct ruvm_mem_copy size");
_Static_assert(sizeof(struct ruvm_mem_range) == 56, "struct ruvm_mem_range size");
_Static_assert(offsetof(struct ruvm_mem_range, resident) == 32, "mem_range resident");
_Static_assert(sizeof(struct ruvm_test_plant) == 24, "struct ruvm_test_plant size");
_Static_assert(offsetof(struct ruvm_test_plant, reserved) == 8, "test_plant reserved");
_Static_assert(sizeof(struct ruvm_ptr_attrs) == 104, "struct ruvm_ptr_attrs size");
_Static_assert(offsetof(struct ruvm_ptr_attrs, addr) == 0, "ptr_attrs addr");
_Static_assert(offsetof(struct ruvm_ptr_attrs, flags) == 8, "ptr_attrs flags");
_Static_assert(offsetof(struct ruvm_ptr_attrs, type) == 12, "ptr_attrs type");
_Static_assert(offsetof(struct ruvm_ptr_attrs, handle) == 16, "ptr_attrs handle");
_Static_assert(offsetof(struct ruvm_ptr_attrs, offset) == 24, "ptr_attrs offset");
_Static_assert(offsetof(struct ruvm_ptr_attrs, base) == 32, "ptr_attrs base");
_Static_assert(offsetof(struct ruvm_ptr_attrs, size) == 40, "ptr_attrs size");
_Static_assert(offsetof(struct ruvm_ptr_attrs, physical_size) == 48, "ptr_attrs physical_size");
_Static_assert(offsetof(struct ruvm_ptr_attrs, chunk_size) == 56, "ptr_attrs chunk_size");
_Static_assert(offsetof(struct ruvm_ptr_attrs, pool) == 64, "ptr_attrs pool");
_Static_assert(offsetof(struct ruvm_ptr_attrs, mapped_gpus) == 72, "ptr_attrs mapped_gpus");
_Static_assert(offsetof(struct ruvm_ptr_attrs, backing) == 80, "ptr_attrs backing");
_Static_assert(offsetof(struct ruvm_ptr_attrs, ptr_flags) == 84, "ptr_attrs ptr_flags");
_Static_assert(offsetof(struct ruvm_ptr_attrs, reserved) == 88, "ptr_attrs reserved");
_Static_assert(RUVM_IOCTL_PTR_ATTRS == _IOWR(RUVM_IOCTL_MAGIC, 0x50, struct ruvm_ptr_attrs),
	       "PTR_ATTRS number");
_Static_assert(RUVM_PTR_NONE == 0 && RUVM_PTR_MEM == 1, "ptr types");
_Static_assert(RUVM_PTR_OTHER_FILE == 1 && RUVM_PTR_FREED == 2, "ptr flags");
_Static_assert(RUVM_FEATURE_PTR_ATTRS == (1ULL << 12) &&
		       (RUVM_FEATURES_ALL & RUVM_FEATURE_PTR_ATTRS) != 0,
	       "ptr attrs feature");
_Static_assert(sizeof(struct ruvm_pool_export) == 32 && offsetof(struct ruvm_pool_export, fd) == 12,
	       "struct ruvm_pool_export");
_Static_assert(sizeof(struct ruvm_pool_import) == 32 && offsetof(struct ruvm_pool_import, handle) == 8,
	       "struct ruvm_pool_import");
_Static_assert(sizeof(struct ruvm_mem_export) == 104 && offsetof(struct ruvm_mem_export, data) == 24,
	       "struct ruvm_mem_export");
_Static_assert(sizeof(struct ruvm_mem_import) == 120 && offsetof(struct ruvm_mem_import, data) == 16 &&
		       offsetof(struct ruvm_mem_import, handle) == 80,
	       "struct ruvm_mem_import");
_Static_assert(RUVM_IOCTL_POOL_EXPORT == _IOWR(RUVM_IOCTL_MAGIC, 0x51, struct ruvm_pool_export) &&
		       RUVM_IOCTL_POOL_IMPORT == _IOWR(RUVM_IOCTL_MAGIC, 0x52, struct ruvm_pool_import) &&
		       RUVM_IOCTL_MEM_EXPORT == _IOWR(RUVM_IOCTL_MAGIC, 0x53, struct ruvm_mem_export) &&
		       RUVM_IOCTL_MEM_IMPORT == _IOWR(RUVM_IOCTL_MAGIC, 0x54, struct ruvm_mem_import),
	       "IPC pool numbers");
_Static_assert(sizeof(struct ruvm_mem_export_dmabuf) == 32 &&
		       offsetof(struct ruvm_mem_export_dmabuf, fd) == 12 &&
		       sizeof(struct ruvm_mem_import_dmabuf) == 48 &&
		       offsetof(struct ruvm_mem_import_dmabuf, handle) == 8 &&
		       RUVM_IOCTL_MEM_EXPORT_DMABUF ==
			       _IOWR(RUVM_IOCTL_MAGIC, 0x55, struct ruvm_mem_export_dmabuf) &&
		       RUVM_IOCTL_MEM_IMPORT_DMABUF ==
			       _IOWR(RUVM_IOCTL_MAGIC, 0x56, struct ruvm_mem_import_dmabuf) &&
		       RUVM_FEATURE_DMABUF == (1ULL << 14),
	       "dma-buf layouts and numbers");
_Static_assert(RUVM_EXPORT_DATA_LEN == 64 && RUVM_EXPORT_DATA_VERSION == 0x7275766d65780001ULL &&
		       RUVM_POOL_EXPORTABLE == 1 &&
		       RUVM_POOL_FLAG_EXPORTABLE == 1 && RUVM_POOL_FLAG_IMPORTED == 2 &&
		       RUVM_PTR_IMPORTED == 4,
	       "IPC pool constants");
_Static_assert(RUVM_FEATURE_IPC_POOLS == (1ULL << 13) &&
		       (RUVM_FEATURES_ALL & RUVM_FEATURE_IPC_POOLS) != 0,
	       "IPC pools feature");
_Static_assert(RUVM_IOCTL_INFO == _IOWR(RUVM_IOCTL_MAGIC, 0x00, struct ruvm_info), "INFO number");
_Static_assert(_IOC_SIZE(RUVM_IOCTL_TEST_PLANT) == sizeof(struct ruvm_test_plant), "PLANT size");

FIXTURE(ruvm) {
	int fd;
};

FIXTURE_SETUP(ruvm)
{
	self->fd = open("/dev/ruvm", O_RDWR);
	if (self->fd < 0 && errno == ENOENT)
		SKIP(return, "/dev/ruvm not present (is ruvm loaded?)");
	ASSERT_GE(self->fd, 0);
}

FIXTURE_TEARDOWN(ruvm)
{
	if (self->fd >= 0)
		close(self->fd);
}

TEST_F(ruvm, info)
{
	struct ruvm_info info;

	memset(&info, 0, sizeof(info));
	ASSERT_EQ(0, ioctl(self->fd, RUVM_IOCTL_INFO, &info));
	EXPECT_EQ((__u32)RUVM_ABI_VERSION, info.abi_version);
	EXPECT_NE(0, info.version[0]);
	EXPECT_EQ(0, info.version[RUVM_VERSION_LEN - 1]);
	EXPECT_EQ((__u64)0, info.features & ~(__u64)RUVM_FEATURES_ALL);
}

TEST_F(ruvm, info_nonzero_reserved_is_einval)
{
	struct ruvm_info info;

	memset(&info, 0, sizeof(info));
	info.reserved[3] = 1;
	EXPECT_EQ(-1, ioctl(self->fd, RUVM_IOCTL_INFO, &info));
	EXPECT_EQ(EINVAL, errno);
}

TEST_F(ruvm, unknown_command_is_enotty)
{
	char buf[sizeof(struct ruvm_info)] = { 0 };

	EXPECT_EQ(-1, ioctl(self->fd, _IOWR(RUVM_IOCTL_MAGIC, 0x7e, struct ruvm_info), buf));
	EXPECT_EQ(ENOTTY, errno);
	EXPECT_EQ(-1, ioctl(self->fd, _IO(RUVM_IOCTL_MAGIC, 0x00)));
	EXPECT_EQ(ENOTTY, errno);
}

TEST_F(ruvm, vidmem_of_an_unknown_gpu_is_enodev)
{
	struct ruvm_mem_alloc a;

	memset(&a, 0, sizeof(a));
	a.size = 4096;
	a.backing = RUVM_BACKING_VIDMEM;
	a.gpu = RUVM_MAX_GPUS + 1;
	EXPECT_EQ(-1, ioctl(self->fd, RUVM_IOCTL_MEM_ALLOC, &a));
	EXPECT_EQ(ENODEV, errno);
	a.backing = RUVM_BACKING_SYSMEM;
	EXPECT_EQ(-1, ioctl(self->fd, RUVM_IOCTL_MEM_ALLOC, &a));
	EXPECT_EQ(EINVAL, errno);
}

TEST_F(ruvm, gpu_pool_of_an_unknown_gpu_is_enodev)
{
	struct ruvm_info info;
	struct ruvm_gpu_pool p;

	memset(&info, 0, sizeof(info));
	ASSERT_EQ(0, ioctl(self->fd, RUVM_IOCTL_INFO, &info));
	if (!(info.features & RUVM_FEATURE_STREAM_ALLOC))
		SKIP(return, "the module has no stream-ordered allocation");
	memset(&p, 0, sizeof(p));
	p.gpu = RUVM_MAX_GPUS + 1;
	EXPECT_EQ(-1, ioctl(self->fd, RUVM_IOCTL_GPU_POOL, &p));
	EXPECT_EQ(ENODEV, errno);
	p.flags = RUVM_GPU_POOL_SET << 1;
	EXPECT_EQ(-1, ioctl(self->fd, RUVM_IOCTL_GPU_POOL, &p));
	EXPECT_EQ(EINVAL, errno);
}

TEST_F(ruvm, ptr_attrs_of_a_stack_address_is_none)
{
	struct ruvm_info info;
	struct ruvm_ptr_attrs a;
	int on_stack = 0;

	memset(&info, 0, sizeof(info));
	ASSERT_EQ(0, ioctl(self->fd, RUVM_IOCTL_INFO, &info));
	if (!(info.features & RUVM_FEATURE_PTR_ATTRS))
		SKIP(return, "the module has no pointer attributes");
	/* Junk in the outputs going in: every one of them comes back 0. */
	memset(&a, 0x5a, sizeof(a));
	a.addr = (__u64)(unsigned long)&on_stack;
	a.flags = 0;
	memset(a.reserved, 0, sizeof(a.reserved));
	ASSERT_EQ(0, ioctl(self->fd, RUVM_IOCTL_PTR_ATTRS, &a));
	EXPECT_EQ((__u64)(unsigned long)&on_stack, a.addr);
	EXPECT_EQ((__u32)RUVM_PTR_NONE, a.type);
	EXPECT_EQ((__u64)0, a.handle);
	EXPECT_EQ((__u64)0, a.offset);
	EXPECT_EQ((__u64)0, a.base);
	EXPECT_EQ((__u64)0, a.size);
	EXPECT_EQ((__u64)0, a.physical_size);
	EXPECT_EQ((__u64)0, a.chunk_size);
	EXPECT_EQ((__u64)0, a.pool);
	EXPECT_EQ((__u64)0, a.mapped_gpus);
	EXPECT_EQ((__u32)0, a.backing);
	EXPECT_EQ((__u32)0, a.ptr_flags);
	a.flags = 1;
	EXPECT_EQ(-1, ioctl(self->fd, RUVM_IOCTL_PTR_ATTRS, &a));
	EXPECT_EQ(EINVAL, errno);
	a.flags = 0;
	a.reserved[1] = 1;
	EXPECT_EQ(-1, ioctl(self->fd, RUVM_IOCTL_PTR_ATTRS, &a));
	EXPECT_EQ(EINVAL, errno);
}

/*
 * A pool's descriptor holds the module: with no /dev/ruvm file open, only the descriptor of an
 * exported pool (whose file, and so the pool, is gone), the module cannot be unloaded; the
 * descriptor imports nothing more (ENOENT). The unload after the suites, once it is closed,
 * checks the audit's verdict. Root only (delete_module); skipped where another process holds
 * the module (its reference count is not 0 without the descriptor).
 */
TEST(pool_descriptor_holds_the_module)
{
	struct ruvm_pool_create c;
	struct ruvm_pool_export e;
	struct ruvm_pool_import i;
	struct ruvm_info info;
	char refs[32] = { 0 };
	int fd, other, r, refcnt;

	fd = open("/dev/ruvm", O_RDWR);
	if (fd < 0)
		SKIP(return, "/dev/ruvm not present (is ruvm loaded?)");
	memset(&info, 0, sizeof(info));
	ASSERT_EQ(0, ioctl(fd, RUVM_IOCTL_INFO, &info));
	if (!(info.features & RUVM_FEATURE_IPC_POOLS)) {
		close(fd);
		SKIP(return, "the module has no IPC pools");
	}
	if (geteuid() != 0) {
		close(fd);
		SKIP(return, "not root (delete_module)");
	}
	memset(&c, 0, sizeof(c));
	c.flags = RUVM_POOL_EXPORTABLE;
	ASSERT_EQ(0, ioctl(fd, RUVM_IOCTL_POOL_CREATE, &c));
	memset(&e, 0, sizeof(e));
	e.handle = c.handle;
	ASSERT_EQ(0, ioctl(fd, RUVM_IOCTL_POOL_EXPORT, &e));
	ASSERT_GE(e.fd, 0);
	/* Close-on-exec, as the ABI says. */
	EXPECT_NE(0, fcntl(e.fd, F_GETFD) & FD_CLOEXEC);
	close(fd);
	/* Only the pool's descriptor holds the module now (and perhaps others' files). */
	other = open("/sys/module/ruvm/refcnt", O_RDONLY);
	ASSERT_GE(other, 0);
	r = read(other, refs, sizeof(refs) - 1);
	close(other);
	ASSERT_GT(r, 0);
	refcnt = atoi(refs);
	if (refcnt != 1) {
		close(e.fd);
		SKIP(return, "the module's reference count is %d with only the descriptor open", refcnt);
	}
	errno = 0;
	EXPECT_EQ(-1, syscall(SYS_delete_module, "ruvm", O_NONBLOCK));
	EXPECT_TRUE(errno == EWOULDBLOCK || errno == EBUSY);
	ASSERT_TRUE(access("/dev/ruvm", F_OK) == 0);
	/* The pool went with its file: its descriptor imports nothing. */
	other = open("/dev/ruvm", O_RDWR);
	ASSERT_GE(other, 0);
	memset(&i, 0, sizeof(i));
	i.fd = e.fd;
	EXPECT_EQ(-1, ioctl(other, RUVM_IOCTL_POOL_IMPORT, &i));
	EXPECT_EQ(ENOENT, errno);
	close(other);
	close(e.fd);
}

TEST(dmabuf_holds_the_module)
{
	struct ruvm_mem_alloc a;
	struct ruvm_mem_export_dmabuf e;
	struct ruvm_info info;
	char refs[32] = { 0 };
	int fd, other, r, refcnt;

	fd = open("/dev/ruvm", O_RDWR);
	if (fd < 0)
		SKIP(return, "/dev/ruvm not present (is ruvm loaded?)");
	memset(&info, 0, sizeof(info));
	ASSERT_EQ(0, ioctl(fd, RUVM_IOCTL_INFO, &info));
	if (!(info.features & RUVM_FEATURE_DMABUF)) {
		close(fd);
		SKIP(return, "the module has no dma-bufs");
	}
	if (geteuid() != 0) {
		close(fd);
		SKIP(return, "not root (delete_module)");
	}
	memset(&a, 0, sizeof(a));
	a.size = 65536;
	ASSERT_EQ(0, ioctl(fd, RUVM_IOCTL_MEM_ALLOC, &a));
	memset(&e, 0, sizeof(e));
	e.handle = a.handle;
	ASSERT_EQ(0, ioctl(fd, RUVM_IOCTL_MEM_EXPORT_DMABUF, &e));
	ASSERT_GE(e.fd, 0);
	EXPECT_NE(0, fcntl(e.fd, F_GETFD) & FD_CLOEXEC);
	/* The file goes (its mem with it): only the buffer holds the module and the pages. */
	close(fd);
	other = open("/sys/module/ruvm/refcnt", O_RDONLY);
	ASSERT_GE(other, 0);
	r = read(other, refs, sizeof(refs) - 1);
	close(other);
	ASSERT_GT(r, 0);
	refcnt = atoi(refs);
	if (refcnt != 1) {
		close(e.fd);
		SKIP(return, "the module's reference count is %d with only the buffer open", refcnt);
	}
	errno = 0;
	EXPECT_EQ(-1, syscall(SYS_delete_module, "ruvm", O_NONBLOCK));
	EXPECT_TRUE(errno == EWOULDBLOCK || errno == EBUSY);
	ASSERT_TRUE(access("/dev/ruvm", F_OK) == 0);
	close(e.fd);
}

TEST_HARNESS_MAIN
