// SPDX-License-Identifier: GPL-2.0

//! The test-only ioctls (behind [`args::test_gate`]): planted misbehaviour, planted leaks, and
//! raw engine transfers, page-table entries overwritten, simulated GPUs removed and brought
//! back.

use kernel::{prelude::*, uaccess::UserSlice};

use crate::{
    audit, gpu,
    mem::plant::{self, LeakKind},
    uapi,
};

use super::{args, max_alloc_bytes, RuvmFile};

/// `RUVM_IOCTL_TEST_PLANT`: deliberately misbehave so tests can prove the harness notices.
pub(super) fn plant(user: UserSlice) -> Result {
    args::test_gate()?;
    let args = args::read::<uapi::ruvm_test_plant>(user)?;
    match args.what {
        uapi::ruvm_plant_RUVM_PLANT_WARN => {
            pr_info!("planting a WARN_ON as asked by a test\n");
            kernel::warn_on!(true);
            Ok(())
        }
        uapi::ruvm_plant_RUVM_PLANT_SLOW_SUBMIT => {
            pr_info!("the next stream submission holds its turn, as asked by a test\n");
            crate::stream::plant_slow_turn();
            Ok(())
        }
        _ => Err(EINVAL),
    }
}

/// `RUVM_IOCTL_TEST_LEAK`: leak resources on purpose, to prove the audit reports them.
pub(super) fn leak(user: UserSlice) -> Result {
    args::test_gate()?;
    let args = args::read::<uapi::ruvm_test_leak>(user)?;
    if args.count == 0 || args.count > 64 {
        return Err(EINVAL);
    }
    let mapped = args.flags & uapi::ruvm_leak_flags_RUVM_LEAK_MAPPED != 0;
    let kind = match args.what {
        uapi::ruvm_leak_RUVM_LEAK_MEM => LeakKind::Mem {
            size: args.size,
            mapped,
        },
        uapi::ruvm_leak_RUVM_LEAK_CHUNK if !mapped => {
            if args.order > audit::MAX_ORDER {
                return Err(EINVAL);
            }
            LeakKind::Chunk { order: args.order }
        }
        uapi::ruvm_leak_RUVM_LEAK_KERNEL_MAP if !mapped => LeakKind::KernelMap,
        _ => return Err(EINVAL),
    };
    let lost = args.flags & uapi::ruvm_leak_flags_RUVM_LEAK_LOST != 0;
    for _ in 0..args.count {
        plant::plant(&kind, lost, max_alloc_bytes())?;
    }
    pr_info!(
        "audit: planted a leak what={} count={} lost={}\n",
        args.what,
        args.count,
        lost
    );
    Ok(())
}

/// `RUVM_IOCTL_TEST_CE_RAW`: one engine transfer at a raw address, bypassing every table.
pub(super) fn ce_raw(user: UserSlice) -> Result {
    args::test_gate()?;
    let args = args::read::<uapi::ruvm_test_ce_raw>(user)?;
    let gpu = gpu::get(args.gpu)?;
    let access = gpu.access()?;
    let len = usize::try_from(args.len).map_err(|_| EINVAL)?;
    access.read_raw(args.src, len)
}

/// `RUVM_IOCTL_TEST_SIM_GPU`: a simulated GPU removed as an unbind would, or brought back.
pub(super) fn sim_gpu(user: UserSlice) -> Result {
    args::test_gate()?;
    let args = args::read::<uapi::ruvm_test_sim_gpu>(user)?;
    match args.op {
        uapi::ruvm_sim_gpu_op_RUVM_SIM_GPU_REMOVE => gpu::sim::remove(args.gpu),
        uapi::ruvm_sim_gpu_op_RUVM_SIM_GPU_ADD => gpu::sim::add(args.gpu),
        _ => Err(EINVAL),
    }
}

impl RuvmFile {
    /// `RUVM_IOCTL_TEST_PT_WRITE`: overwrite the leaf entry for a GPU VA.
    pub(super) fn test_pt_write(&self, user: UserSlice) -> Result {
        args::test_gate()?;
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_test_pt_write>(user)?;
        let space = self.va_space(args.flags)?;
        let gpu = gpu::get(args.gpu)?;
        let access = gpu.access()?;
        args.old = access.mmu()?.write_leaf(space, args.va, args.value)?;
        drop(access);
        writer.write(&args)
    }
}
