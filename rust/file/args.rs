// SPDX-License-Identifier: GPL-2.0

//! The one validated reader of ioctl arguments, and the one gate of test-only ioctls.
//!
//! Each argument structure says once, in the table at the end of this file, which `flags` bits
//! it knows and which fields must be zero (padding and reserved space); [`read`] and
//! [`read_write`] copy a structure in and refuse it (`EINVAL`) unless it obeys, before any
//! handler sees it.

use kernel::{
    prelude::*,
    transmute::{AsBytes, FromBytes},
    uaccess::{UserSlice, UserSliceWriter},
};

use crate::{bind::cred, uapi};

/// An ioctl argument structure of the uapi header.
pub(crate) trait Args: FromBytes + AsBytes {
    /// The `flags` bits the command knows.
    const KNOWN_FLAGS: u64;
    /// Its `flags` field.
    fn flags(&self) -> u64;
    /// Whether every field that must be zero is.
    fn zeroes_ok(&self) -> bool;

    /// `EINVAL` unless the flags are known and the zero fields are zero.
    fn check(&self) -> Result {
        if self.flags() & !Self::KNOWN_FLAGS != 0 || !self.zeroes_ok() {
            return Err(EINVAL);
        }
        Ok(())
    }
}

/// True if every byte of `v` is zero.
fn zero<T: AsBytes + ?Sized>(v: &T) -> bool {
    v.as_bytes().iter().all(|&b| b == 0)
}

/// Reads an input-only structure and checks it.
pub(crate) fn read<T: Args>(user: UserSlice) -> Result<T> {
    let args: T = user.reader().read()?;
    args.check()?;
    Ok(args)
}

/// Reads an in/out structure and checks it; returns it with the writer for the answer.
pub(crate) fn read_write<T: Args>(user: UserSlice) -> Result<(T, UserSliceWriter)> {
    let (mut reader, writer) = user.reader_writer();
    let args: T = reader.read()?;
    args.check()?;
    Ok((args, writer))
}

/// `ENOSYS`, which the kernel crate has no constant for: what a disabled test ioctl returns,
/// as in UVM.
pub(crate) fn enosys() -> Error {
    // CAST: ENOSYS is 38, which fits a `c_int`.
    Error::from_errno(-(kernel::bindings::ENOSYS as i32))
}

/// The gate of every test-only ioctl: `ENOSYS` unless the module was loaded with
/// `enable_test_ioctls`, then `EPERM` without `CAP_SYS_ADMIN`.
pub(crate) fn test_gate() -> Result {
    if !super::test_ioctls_enabled() {
        return Err(enosys());
    }
    cred::require_sys_admin()
}

/// `spec! { struct { flags: KNOWN, zero: [field, ...] } ... }`: the table of argument rules.
macro_rules! spec {
    ($($t:ident { flags: $known:expr, zero: [$($f:ident),*] })*) => {$(
        impl Args for uapi::$t {
            // CAST: every flags enum of the header fits 32 bits.
            const KNOWN_FLAGS: u64 = ($known) as u64;

            fn flags(&self) -> u64 {
                self.flags.into()
            }

            fn zeroes_ok(&self) -> bool {
                true $(&& zero(&self.$f))*
            }
        }
    )*};
}

spec! {
    ruvm_info { flags: 0, zero: [pad, reserved] }
    ruvm_mem_alloc { flags: uapi::ruvm_alloc_flags_RUVM_ALLOC_FLAGS_ALL, zero: [pad, user_addr, reserved] }
    ruvm_mem_handle { flags: 0, zero: [pad, reserved] }
    ruvm_mem_query { flags: 0, zero: [reserved] }
    ruvm_mem_fill { flags: 0, zero: [reserved] }
    ruvm_mem_copy { flags: 0, zero: [pad, reserved] }
    ruvm_mem_range { flags: 0, zero: [reserved] }
    ruvm_mem_register { flags: 0, zero: [pad, reserved] }
    ruvm_audit { flags: uapi::ruvm_audit_flags_RUVM_AUDIT_WALK, zero: [pad, reserved] }
    ruvm_stats { flags: uapi::ruvm_stats_flags_RUVM_STATS_RESET_PEAKS, zero: [reserved] }
    ruvm_register_unload_state { flags: 0, zero: [pad, reserved] }
    ruvm_bench { flags: 0, zero: [reserved] }
    ruvm_test_leak {
        flags: uapi::ruvm_leak_flags_RUVM_LEAK_LOST | uapi::ruvm_leak_flags_RUVM_LEAK_MAPPED,
        zero: [pad, reserved]
    }
    ruvm_gpu_list { flags: 0, zero: [reserved] }
    ruvm_gpu_attach { flags: 0, zero: [pad, reserved] }
    ruvm_mem_gpu { flags: 0, zero: [reserved] }
    ruvm_mem_dma_addrs { flags: 0, zero: [reserved] }
    ruvm_ce_copy {
        flags: uapi::ruvm_op_flags_RUVM_OP_DST_PTR | uapi::ruvm_op_flags_RUVM_OP_SRC_PTR,
        zero: [reserved]
    }
    ruvm_mem_gpu_phys { flags: 0, zero: [pad, reserved] }
    ruvm_pmm_stats { flags: 0, zero: [reserved] }
    ruvm_pmm_check_leak { flags: 0, zero: [reserved] }
    ruvm_vidmem_limit {
        flags: uapi::ruvm_vidmem_limit_flags_RUVM_VIDMEM_LIMIT_SET,
        zero: [reserved]
    }
    ruvm_test_ce_raw { flags: 0, zero: [reserved] }
    ruvm_test_plant { flags: 0, zero: [reserved] }
    ruvm_mem_gpu_va { flags: uapi::ruvm_va_space_flags_RUVM_VA_USER, zero: [reserved] }
    ruvm_ce_copy_va { flags: uapi::ruvm_va_space_flags_RUVM_VA_USER, zero: [reserved] }
    ruvm_gpu_pt_walk { flags: uapi::ruvm_va_space_flags_RUVM_VA_USER, zero: [reserved] }
    ruvm_test_pt_write { flags: uapi::ruvm_va_space_flags_RUVM_VA_USER, zero: [reserved] }
    ruvm_test_sim_gpu { flags: 0, zero: [pad, reserved] }
    ruvm_pool_create { flags: uapi::ruvm_pool_create_flags_RUVM_POOL_EXPORTABLE, zero: [pad, reserved] }
    ruvm_pool_handle { flags: 0, zero: [pad, reserved] }
    ruvm_pool_info { flags: 0, zero: [pool_flags, pad] }
    ruvm_gpu_pool { flags: uapi::ruvm_gpu_pool_flags_RUVM_GPU_POOL_SET, zero: [reserved] }
    ruvm_ptr_attrs { flags: 0, zero: [reserved] }
    ruvm_pool_export { flags: 0, zero: [reserved] }
    ruvm_pool_import { flags: 0, zero: [reserved] }
    ruvm_mem_export { flags: 0, zero: [pad, reserved] }
    ruvm_mem_import { flags: 0, zero: [pad, reserved] }
    ruvm_mem_export_dmabuf { flags: 0, zero: [reserved] }
    ruvm_mem_import_dmabuf { flags: 0, zero: [reserved] }
    ruvm_pool_set { flags: 0, zero: [reserved] }
    ruvm_pool_trim { flags: 0, zero: [pad, reserved] }
    ruvm_pool_access {
        flags: uapi::ruvm_pool_access_flags_RUVM_POOL_ACCESS_REVOKE,
        zero: [reserved]
    }
    ruvm_mem_gpu_user {
        flags: uapi::ruvm_gpu_user_flags_RUVM_GPU_USER_READ_ONLY,
        zero: [reserved]
    }
    ruvm_stream_create { flags: 0, zero: [reserved] }
    ruvm_stream_handle { flags: 0, zero: [pad, reserved] }
    ruvm_stream_submit { flags: 0, zero: [reserved] }
    ruvm_stream_query { flags: 0, zero: [reserved] }
    ruvm_stream_status { flags: 0, zero: [reserved] }
    ruvm_stream_sync { flags: uapi::ruvm_sync_flags_RUVM_SYNC_EVERY_STREAM, zero: [reserved] }
    ruvm_event { flags: 0, zero: [reserved] }
}
