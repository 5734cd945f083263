// SPDX-License-Identifier: GPL-2.0

//! The module-wide ioctls: what the module is (`INFO`), the audit's counters, the statistics
//! and the unload-state registration.

use kernel::{prelude::*, uaccess::UserSlice};

use crate::{
    audit::{self, stats::StatsBacking},
    bind::cred,
    mem, uapi,
};

use super::{args, max_alloc_bytes, max_file_bytes, test_ioctls_enabled};

/// `RUVM_IOCTL_INFO`: what the module is and what it supports.
pub(super) fn info(user: UserSlice) -> Result {
    // live_* and max_* are outputs: whatever the caller left there is overwritten.
    let (mut args, mut writer) = args::read_write::<uapi::ruvm_info>(user)?;
    args.abi_version = uapi::RUVM_ABI_VERSION;
    args.features = uapi::RUVM_FEATURES_ALL.into();
    args.test_ioctls = u32::from(test_ioctls_enabled());
    (args.live_mems, args.live_bytes) = mem::live();
    args.max_alloc_bytes = max_alloc_bytes();
    args.max_file_bytes = max_file_bytes();
    args.version = [0; uapi::RUVM_VERSION_LEN as usize];
    // Keep the terminating NUL: copy at most `len - 1` bytes into the zeroed array.
    let room = args.version.len() - 1;
    for (dst, src) in args
        .version
        .iter_mut()
        .zip(crate::VERSION.bytes().take(room))
    {
        *dst = src;
    }
    writer.write(&args)
}

/// `RUVM_IOCTL_AUDIT`: the audit's counters, and with `RUVM_AUDIT_WALK` the same counted from
/// the objects (test-only).
pub(super) fn audit(user: UserSlice) -> Result {
    let (mut args, mut writer) = args::read_write::<uapi::ruvm_audit>(user)?;
    let walk = args.flags & uapi::ruvm_audit_flags_RUVM_AUDIT_WALK != 0;
    if walk && !test_ioctls_enabled() {
        return Err(args::enosys());
    }
    args.classes = uapi::ruvm_audit_class_RUVM_AUDIT_CLASSES;
    args.level = audit::level();
    // Tables dropped before the call are gone, their releases done.
    crate::gpu::dma::settle_releases();
    // Walk first, then read the counters: with nothing else running, they must agree.
    args.walked = if walk {
        mem::registry::walk()?
    } else {
        [0; audit::CLASSES]
    };
    args.live = audit::live();
    writer.write(&args)
}

/// `RUVM_IOCTL_STATS`.
pub(super) fn stats(user: UserSlice) -> Result {
    let (mut args, mut writer) = args::read_write::<uapi::ruvm_stats>(user)?;
    crate::gpu::dma::settle_releases();
    let backing = match args.backing {
        uapi::ruvm_backing_RUVM_BACKING_SYSMEM => StatsBacking::Sysmem,
        uapi::ruvm_backing_RUVM_BACKING_VIDMEM => StatsBacking::Vidmem,
        _ => return Err(EINVAL),
    };
    let reset = args.flags & uapi::ruvm_stats_flags_RUVM_STATS_RESET_PEAKS != 0;
    if reset {
        // The watermarks are shared by every user of the module.
        cred::require_sys_admin()?;
    }
    let s = audit::stats::stats(backing, reset);
    (args.reserved_bytes, args.reserved_peak) = s.reserved;
    (args.used_bytes, args.used_peak) = s.used;
    (args.mems, args.mems_peak) = s.mems;
    args.allocs = s.allocs;
    args.frees = s.frees;
    args.alloc_failures = s.failures;
    writer.write(&args)
}

/// `RUVM_IOCTL_REGISTER_UNLOAD_STATE` (privileged).
pub(super) fn register_unload_state(user: UserSlice) -> Result {
    cred::require_sys_admin()?;
    let args = args::read::<uapi::ruvm_register_unload_state>(user)?;
    audit::register_unload_state(args.addr)
}
