// SPDX-License-Identifier: GPL-2.0

//! `RUVM_IOCTL_BENCH`: in-kernel timing of ruvm's paths and of the kernel's own (privileged).

use kernel::{prelude::*, uaccess::UserSlice};

use crate::{
    bind::cred,
    mem::{
        bench::{self, Op},
        policy::{self, CHUNK_MAX},
    },
    uapi,
};

use super::{args, max_alloc_bytes, RuvmFile};

/// Most iterations one call may ask for.
const MAX_ITERATIONS: u64 = 1 << 20;

impl RuvmFile {
    /// `RUVM_IOCTL_BENCH`.
    pub(super) fn bench(&self, user: UserSlice) -> Result {
        cred::require_sys_admin()?;
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_bench>(user)?;
        if args.iterations == 0 || args.iterations > MAX_ITERATIONS || args.zero > 1 {
            return Err(EINVAL);
        }
        let zero = args.zero == 1;
        let page = kernel::page::PAGE_SIZE as u64;
        let op = match args.op {
            uapi::ruvm_bench_op_RUVM_BENCH_PAGES | uapi::ruvm_bench_op_RUVM_BENCH_MEM => {
                // Orders 0 to that of the largest chunk: 4 KiB to 2 MiB.
                if args.order > policy::chunk_order(CHUNK_MAX, page)
                    || args.handle != 0
                    || args.count == 0
                {
                    return Err(EINVAL);
                }
                let bytes = (page << args.order).checked_mul(args.count).ok_or(EINVAL)?;
                if bytes > max_alloc_bytes() {
                    return Err(EINVAL);
                }
                let (order, count) = (args.order, usize::try_from(args.count)?);
                if args.op == uapi::ruvm_bench_op_RUVM_BENCH_PAGES {
                    Op::Pages { order, count, zero }
                } else {
                    Op::Mem { order, count, zero }
                }
            }
            uapi::ruvm_bench_op_RUVM_BENCH_VMAP | uapi::ruvm_bench_op_RUVM_BENCH_KMAP => {
                if args.order != 0 || args.count != 0 || zero {
                    return Err(EINVAL);
                }
                let mem = self.mem(args.handle)?;
                if args.op == uapi::ruvm_bench_op_RUVM_BENCH_VMAP {
                    Op::Vmap(mem)
                } else {
                    Op::Kmap(mem)
                }
            }
            _ => return Err(EINVAL),
        };
        args.ns = bench::run(&op, args.iterations, &self.quota, max_alloc_bytes())?;
        writer.write(&args)
    }
}
