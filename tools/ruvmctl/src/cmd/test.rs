// SPDX-License-Identifier: GPL-2.0

//! The test-only commands (the module must be loaded with `enable_test_ioctls=1`): planted
//! leaks and planted misbehaviour.

use anyhow::Result;
use libruvm::{cmd, uapi, Ruvm};

use super::{arg, call};
use crate::{
    cli::{Leak, Plant},
    output::Done,
};

/// What `test-leak` plants.
pub struct LeakSpec {
    pub what: Leak,
    pub count: u64,
    pub size: u64,
    pub order: u32,
    pub mapped: bool,
    pub lost: bool,
}

pub fn leak(d: &Ruvm, s: &LeakSpec) -> Result<Done> {
    let mut a = arg(|a: &mut uapi::ruvm_test_leak| {
        a.what = match s.what {
            Leak::Mem => uapi::ruvm_leak_RUVM_LEAK_MEM,
            Leak::Chunk => uapi::ruvm_leak_RUVM_LEAK_CHUNK,
            Leak::KernelMap => uapi::ruvm_leak_RUVM_LEAK_KERNEL_MAP,
        };
        if s.lost {
            a.flags |= uapi::ruvm_leak_flags_RUVM_LEAK_LOST;
        }
        if s.mapped {
            a.flags |= uapi::ruvm_leak_flags_RUVM_LEAK_MAPPED;
        }
        a.count = s.count;
        a.size = s.size;
        a.order = s.order;
    });
    call(d, cmd::TEST_LEAK, &mut a)?;
    Ok(Done {})
}

pub fn plant(d: &Ruvm, what: Plant) -> Result<Done> {
    let mut a = arg(|a: &mut uapi::ruvm_test_plant| {
        a.what = match what {
            Plant::Warn => uapi::ruvm_plant_RUVM_PLANT_WARN,
            Plant::SlowSubmit => uapi::ruvm_plant_RUVM_PLANT_SLOW_SUBMIT,
        };
    });
    call(d, cmd::TEST_PLANT, &mut a)?;
    Ok(Done {})
}
