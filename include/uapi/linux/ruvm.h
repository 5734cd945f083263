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
#define RUVM_ABI_VERSION 1

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
 * @reserved:     (in)  must be 0
 */
struct ruvm_info {
	__u32 abi_version;
	__u32 flags;
	__u64 features;
	__u32 test_ioctls;
	__u32 pad;
	__u8 version[RUVM_VERSION_LEN];
	__u64 reserved[4];
};

/*
 * Feature bits reported in ruvm_info.features, and their union. None is defined yet: each
 * later capability (sysmem mems, GPUs, vidmem, ...) adds its bit when it lands.
 */
#define RUVM_FEATURES_ALL 0

/* What RUVM_IOCTL_TEST_PLANT makes the module do. */
enum ruvm_plant {
	/* Hit a WARN_ON in the module: proves the test runner fails on kernel warnings. */
	RUVM_PLANT_WARN = 1,
};

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

/* Command numbers, also in an enum so that bindgen sees them as constants. */
enum {
	RUVM_IOCTL_INFO = _IOWR(RUVM_IOCTL_MAGIC, 0x00, struct ruvm_info),
	RUVM_IOCTL_TEST_PLANT = _IOWR(RUVM_IOCTL_MAGIC, 0x80, struct ruvm_test_plant),
};

#endif /* _UAPI_LINUX_RUVM_H */
