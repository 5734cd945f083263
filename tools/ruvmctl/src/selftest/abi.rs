// SPDX-License-Identifier: GPL-2.0

//! The ABI's common rules, for every command at once, from one table: a `flags` bit the
//! command does not know, and a non-zero byte in any padding or reserved field, are `EINVAL`,
//! and an argument pointer that cannot be read is `EFAULT` (`ENOSYS` first for a test-only
//! command while test ioctls are off), before the command does anything.
//!
//! Each row gives a template that the command would accept (or refuse with another errno), so a
//! module that let a bad field through would answer something other than `EINVAL`.

use libruvm::{cmd, uapi, Cmd, IoctlArg, Ruvm};
use nix::errno::Errno;

use super::{
    audit::test_ioctls,
    harness::{cases, expect_errno, Case, Context, TestResult},
};

pub fn cases() -> Vec<Case> {
    cases![
        abi_unknown_flags_are_einval,
        abi_nonzero_pad_and_reserved_are_einval,
        abi_unreadable_argument_is_efault,
    ]
}

/// A field that must be zero: how many elements it has, and how to make element `i` non-zero.
trait Poke {
    fn elements(&self) -> usize;
    fn poke(&mut self, i: usize);
}

impl Poke for u32 {
    fn elements(&self) -> usize {
        1
    }
    fn poke(&mut self, _: usize) {
        *self = 1 << 31;
    }
}

impl Poke for u16 {
    fn elements(&self) -> usize {
        1
    }
    fn poke(&mut self, _: usize) {
        *self = 1 << 15;
    }
}

impl Poke for u64 {
    fn elements(&self) -> usize {
        1
    }
    fn poke(&mut self, _: usize) {
        *self = 1 << 63;
    }
}

impl<const N: usize> Poke for [u64; N] {
    fn elements(&self) -> usize {
        N
    }
    fn poke(&mut self, i: usize) {
        self[i] = 1;
    }
}

/// What one command's row checks.
pub(super) enum Probe {
    /// Every unknown bit of `flags`, one at a time.
    Flags,
    /// Every element of every zero field, one at a time.
    Zeroes,
    /// A NULL argument pointer.
    Fault,
}

/// One row: `cmd` with `template`, whose known flags are `known` and zero fields are listed.
macro_rules! row {
    ($d:expr, $probe:expr, $want:expr, $cmd:expr, $template:expr, known: $known:expr,
     zero: [$($f:ident),*]) => {{
        let template = $template;
        let (probe, only): &(Probe, Option<&str>) = $probe;
        match probe {
            _ if only.is_some_and(|n| n != $cmd.name) => {}
            Probe::Flags => {
                for bit in 0..32 {
                    let flag = 1u32 << bit;
                    if u64::from(flag) & ($known as u64) != 0 {
                        continue;
                    }
                    let mut a = template;
                    a.flags = flag;
                    check_one($d, $cmd, &mut a, $want, &format!("flags bit {bit}"))?;
                }
            }
            Probe::Zeroes => {
                $(
                    for i in 0..template.$f.elements() {
                        let mut a = template;
                        a.$f.poke(i);
                        check_one($d, $cmd, &mut a, $want, &format!("{}[{i}]", stringify!($f)))?;
                    }
                )*
            }
            Probe::Fault => {
                let want = if $want == Errno::ENOSYS { $want } else { Errno::EFAULT };
                // SAFETY: NULL is never mapped: the kernel's copy of the argument faults.
                let r = unsafe { $d.ioctl_ptr($cmd.nr, core::ptr::null_mut()) };
                expect_errno(r, want, &format!("{} with a NULL argument", $cmd.name))?;
            }
        }
    }};
}

fn check_one<T: IoctlArg>(d: &Ruvm, c: Cmd<T>, a: &mut T, want: Errno, what: &str) -> TestResult {
    expect_errno(d.call(c, a), want, &format!("{} with {what}", c.name))
}

/// Runs `probe` over the table (only the rows of the command named `only`, if given).
pub(super) fn sweep(probe: Probe, only: Option<&str>) -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let e = Errno::EINVAL;
    // A test-only command is refused before its arguments are read while they are off.
    let t = if test_ioctls(&d)? { e } else { Errno::ENOSYS };
    let p = &(probe, only);
    row!(&d, p, e, cmd::INFO, uapi::ruvm_info::default(), known: 0, zero: [pad, reserved]);
    let alloc = uapi::ruvm_mem_alloc {
        size: 4096,
        ..Default::default()
    };
    row!(&d, p, e, cmd::MEM_ALLOC, alloc,
        known: uapi::ruvm_alloc_flags_RUVM_ALLOC_FLAGS_ALL, zero: [pad, user_addr, reserved]);
    for c in [
        cmd::MEM_FREE,
        cmd::MEM_MAP_CPU_KERNEL,
        cmd::MEM_UNMAP_CPU_KERNEL,
    ] {
        row!(&d, p, e, c, uapi::ruvm_mem_handle::default(), known: 0, zero: [pad, reserved]);
    }
    row!(&d, p, e, cmd::MEM_QUERY, uapi::ruvm_mem_query::default(), known: 0, zero: [reserved]);
    for c in [cmd::MEM_FILL, cmd::MEM_VERIFY] {
        row!(&d, p, e, c, uapi::ruvm_mem_fill::default(), known: 0, zero: [reserved]);
    }
    row!(&d, p, e, cmd::MEM_COPY, uapi::ruvm_mem_copy::default(), known: 0, zero: [pad, reserved]);
    row!(&d, p, e, cmd::MEM_RANGE, uapi::ruvm_mem_range::default(), known: 0, zero: [reserved]);
    row!(&d, p, e, cmd::MEM_REGISTER, uapi::ruvm_mem_register::default(), known: 0, zero: [pad, reserved]);
    row!(&d, p, e, cmd::VIDMEM_LIMIT, uapi::ruvm_vidmem_limit::default(),
        known: uapi::ruvm_vidmem_limit_flags_RUVM_VIDMEM_LIMIT_SET, zero: [reserved]);
    row!(&d, p, e, cmd::GPU_LIST, uapi::ruvm_gpu_list::default(), known: 0, zero: [reserved]);
    // An address with no device: a bad field let through would be ENODEV or ENOENT.
    let attach = uapi::ruvm_gpu_attach {
        pci_bus: 0xff,
        pci_devfn: 0xff,
        ..Default::default()
    };
    for c in [cmd::GPU_ATTACH, cmd::GPU_DETACH] {
        row!(&d, p, e, c, attach, known: 0, zero: [pad, reserved]);
    }
    for c in [cmd::MEM_MAP_GPU, cmd::MEM_UNMAP_GPU] {
        row!(&d, p, e, c, uapi::ruvm_mem_gpu::default(), known: 0, zero: [reserved]);
    }
    row!(&d, p, e, cmd::MEM_DMA_ADDRS, uapi::ruvm_mem_dma_addrs::default(),
        known: 0, zero: [reserved]);
    row!(&d, p, e, cmd::CE_COPY, uapi::ruvm_ce_copy::default(),
        known: uapi::ruvm_op_flags_RUVM_OP_DST_PTR | uapi::ruvm_op_flags_RUVM_OP_SRC_PTR,
        zero: [reserved]);
    row!(&d, p, e, cmd::MEM_GPU_PHYS, uapi::ruvm_mem_gpu_phys::default(),
        known: 0, zero: [pad, reserved]);
    for c in [
        cmd::MEM_MAP_GPU_KERNEL,
        cmd::MEM_UNMAP_GPU_KERNEL,
        cmd::MEM_UNMAP_GPU_USER,
    ] {
        row!(&d, p, e, c, uapi::ruvm_mem_gpu::default(), known: 0, zero: [reserved]);
    }
    // Pools: every template is a call that would succeed (or fail otherwise than EINVAL) if
    // a bad field were let through.
    let (pool, _) = d
        .pool_create_flags(0, 0, uapi::ruvm_pool_create_flags_RUVM_POOL_EXPORTABLE)
        .ctx("POOL_CREATE")?;
    row!(&d, p, e, cmd::POOL_CREATE, uapi::ruvm_pool_create::default(),
        known: uapi::ruvm_pool_create_flags_RUVM_POOL_EXPORTABLE, zero: [pad, reserved]);
    let handle = uapi::ruvm_pool_handle {
        handle: pool,
        ..Default::default()
    };
    // `reuse` and `pending_bytes` (the old pad and reserved[0]) are outputs now, and
    // `pool_flags` (the old reserved[1]) is an output that must be 0 on input.
    row!(&d, p, e, cmd::POOL_GET, uapi::ruvm_pool_info {
        handle: pool,
        ..Default::default()
    }, known: 0, zero: [pool_flags, pad]);
    row!(&d, p, e, cmd::POOL_EXPORT, uapi::ruvm_pool_export {
        handle: pool,
        ..Default::default()
    }, known: 0, zero: [reserved]);
    let pool_fd = d.pool_export(pool).ctx("POOL_EXPORT")?;
    row!(&d, p, e, cmd::POOL_IMPORT, uapi::ruvm_pool_import {
        fd: std::os::fd::AsRawFd::as_raw_fd(&pool_fd),
        ..Default::default()
    }, known: 0, zero: [reserved]);
    let shared = d
        .pool_alloc(pool, 4096, 0)
        .ctx("MEM_ALLOC from an exportable pool")?;
    row!(&d, p, e, cmd::MEM_EXPORT, uapi::ruvm_mem_export {
        handle: shared.handle,
        ..Default::default()
    }, known: 0, zero: [pad, reserved]);
    let (_, data) = d.mem_export(shared.handle).ctx("MEM_EXPORT")?;
    row!(&d, p, e, cmd::MEM_IMPORT, uapi::ruvm_mem_import {
        pool,
        data,
        ..Default::default()
    }, known: 0, zero: [pad, reserved]);
    row!(&d, p, e, cmd::MEM_EXPORT_DMABUF, uapi::ruvm_mem_export_dmabuf {
        handle: shared.handle,
        ..Default::default()
    }, known: 0, zero: [reserved]);
    let buf = d
        .mem_export_dmabuf(shared.handle)
        .ctx("MEM_EXPORT_DMABUF")?;
    row!(&d, p, e, cmd::MEM_IMPORT_DMABUF, uapi::ruvm_mem_import_dmabuf {
        fd: std::os::fd::AsRawFd::as_raw_fd(&buf),
        ..Default::default()
    }, known: 0, zero: [reserved]);
    drop(buf);
    d.mem_free(shared.handle).ctx("MEM_FREE")?;
    row!(&d, p, e, cmd::POOL_SET, uapi::ruvm_pool_set {
        handle: pool,
        attr: uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RELEASE_THRESHOLD,
        ..Default::default()
    }, known: 0, zero: [reserved]);
    row!(&d, p, e, cmd::POOL_TRIM, uapi::ruvm_pool_trim {
        handle: pool,
        ..Default::default()
    }, known: 0, zero: [pad, reserved]);
    row!(&d, p, e, cmd::POOL_SET_ACCESS, uapi::ruvm_pool_access {
        handle: pool,
        gpu: 63,
        ..Default::default()
    }, known: uapi::ruvm_pool_access_flags_RUVM_POOL_ACCESS_REVOKE, zero: [reserved]);
    row!(&d, p, e, cmd::POOL_DESTROY, handle, known: 0, zero: [pad, reserved]);
    let user = uapi::ruvm_va_space_flags_RUVM_VA_USER;
    row!(&d, p, e, cmd::MEM_MAP_GPU_USER, uapi::ruvm_mem_gpu_user::default(),
        known: uapi::ruvm_gpu_user_flags_RUVM_GPU_USER_READ_ONLY, zero: [reserved]);
    row!(&d, p, e, cmd::MEM_GPU_VA, uapi::ruvm_mem_gpu_va::default(),
        known: user, zero: [reserved]);
    let copy_va = uapi::ruvm_ce_copy_va {
        length: 8,
        ..Default::default()
    };
    row!(&d, p, e, cmd::CE_COPY_VA, copy_va, known: user, zero: [reserved]);
    row!(&d, p, e, cmd::GPU_PT_WALK, uapi::ruvm_gpu_pt_walk::default(),
        known: user, zero: [reserved]);
    row!(&d, p, e, cmd::PMM_STATS, uapi::ruvm_pmm_stats::default(), known: 0, zero: [reserved]);
    let check_leak = uapi::ruvm_pmm_check_leak {
        chunk_size: 4096,
        alloc_limit: 1,
        ..Default::default()
    };
    row!(&d, p, e, cmd::PMM_CHECK_LEAK, check_leak, known: 0, zero: [reserved]);
    row!(&d, p, e, cmd::AUDIT, uapi::ruvm_audit::default(),
        known: uapi::ruvm_audit_flags_RUVM_AUDIT_WALK, zero: [pad, reserved]);
    row!(&d, p, e, cmd::STATS, uapi::ruvm_stats::default(),
        known: uapi::ruvm_stats_flags_RUVM_STATS_RESET_PEAKS, zero: [reserved]);
    row!(&d, p, e, cmd::REGISTER_UNLOAD_STATE, uapi::ruvm_register_unload_state::default(),
        known: 0, zero: [pad, reserved]);
    let bench = uapi::ruvm_bench {
        op: uapi::ruvm_bench_op_RUVM_BENCH_PAGES,
        count: 1,
        iterations: 1,
        ..Default::default()
    };
    row!(&d, p, e, cmd::BENCH, bench, known: 0, zero: [reserved]);
    let plant = uapi::ruvm_test_plant {
        what: uapi::ruvm_plant_RUVM_PLANT_WARN,
        ..Default::default()
    };
    row!(&d, p, t, cmd::TEST_PLANT, plant, known: 0, zero: [reserved]);
    let leak = uapi::ruvm_test_leak {
        what: uapi::ruvm_leak_RUVM_LEAK_CHUNK,
        count: 1,
        ..Default::default()
    };
    row!(&d, p, t, cmd::TEST_LEAK, leak,
        known: uapi::ruvm_leak_flags_RUVM_LEAK_LOST | uapi::ruvm_leak_flags_RUVM_LEAK_MAPPED,
        zero: [pad, reserved]);
    let raw = uapi::ruvm_test_ce_raw {
        len: 1,
        ..Default::default()
    };
    row!(&d, p, t, cmd::TEST_CE_RAW, raw, known: 0, zero: [reserved]);
    row!(&d, p, t, cmd::TEST_PT_WRITE, uapi::ruvm_test_pt_write::default(),
        known: user, zero: [reserved]);
    // Adding a simulated GPU that is there: EEXIST if a bad field were let through.
    let sim = uapi::ruvm_test_sim_gpu {
        gpu: d
            .gpus()
            .ctx("GPU_LIST")?
            .iter()
            .find(|g| super::gpu::sim(g))
            .map_or(0, |g| g.id),
        op: uapi::ruvm_sim_gpu_op_RUVM_SIM_GPU_ADD,
        ..Default::default()
    };
    row!(&d, p, t, cmd::TEST_SIM_GPU, sim, known: 0, zero: [pad, reserved]);
    let features = d.info().ctx("INFO")?.features;
    if features & u64::from(uapi::RUVM_FEATURE_STREAMS) != 0 {
        stream_rows(&d, p)?;
    }
    if features & u64::from(uapi::RUVM_FEATURE_PTR_ATTRS) != 0 {
        // Address 0, never ruvm memory: a bad field let through would succeed.
        row!(&d, p, e, cmd::PTR_ATTRS, uapi::ruvm_ptr_attrs::default(), known: 0, zero: [reserved]);
    }
    if features & u64::from(uapi::RUVM_FEATURE_STREAM_ALLOC) != 0 {
        // A GPU that is not there: ENODEV if a bad field were let through (and no default
        // pool is made).
        let gpus = d.gpus().ctx("GPU_LIST")?;
        let absent = (0..uapi::RUVM_MAX_GPUS)
            .find(|id| !gpus.iter().any(|g| g.id == *id))
            .unwrap_or(u32::MAX);
        let gpu_pool = uapi::ruvm_gpu_pool {
            gpu: absent,
            ..Default::default()
        };
        row!(&d, p, e, cmd::GPU_POOL, gpu_pool,
            known: uapi::ruvm_gpu_pool_flags_RUVM_GPU_POOL_SET, zero: [reserved]);
    }
    Ok(())
}

/// The stream and event commands: each template names no stream, event or GPU that exists
/// (ENOENT, ENODEV), but for EVENT_CREATE, which would succeed.
fn stream_rows(d: &Ruvm, p: &(Probe, Option<&str>)) -> TestResult {
    let e = Errno::EINVAL;
    let absent = {
        let gpus = d.gpus().ctx("GPU_LIST")?;
        (0..uapi::RUVM_MAX_GPUS)
            .find(|id| !gpus.iter().any(|g| g.id == *id))
            .unwrap_or(u32::MAX)
    };
    let create = uapi::ruvm_stream_create {
        gpu: absent,
        ..Default::default()
    };
    row!(d, p, e, cmd::STREAM_CREATE, create, known: 0, zero: [reserved]);
    row!(d, p, e, cmd::STREAM_DESTROY, uapi::ruvm_stream_handle::default(),
        known: 0, zero: [pad, reserved]);
    let event = d.event_create().ctx("EVENT_CREATE")?;
    let ops = [libruvm::op::record(event)];
    let submit = uapi::ruvm_stream_submit {
        count: 1,
        ops: ops.as_ptr() as u64,
        ..Default::default()
    };
    row!(d, p, e, cmd::STREAM_SUBMIT, submit, known: 0, zero: [reserved]);
    row!(d, p, e, cmd::STREAM_QUERY, uapi::ruvm_stream_query::default(),
        known: 0, zero: [reserved]);
    let sync = uapi::ruvm_stream_sync {
        timeout_ms: 1,
        ..Default::default()
    };
    row!(d, p, e, cmd::STREAM_SYNC, sync,
        known: uapi::ruvm_sync_flags_RUVM_SYNC_EVERY_STREAM, zero: [reserved]);
    row!(d, p, e, cmd::EVENT_CREATE, uapi::ruvm_event::default(), known: 0, zero: [reserved]);
    for c in [cmd::EVENT_DESTROY, cmd::EVENT_QUERY, cmd::EVENT_EXPORT] {
        row!(d, p, e, c, uapi::ruvm_event::default(), known: 0, zero: [reserved]);
    }
    let sync = uapi::ruvm_event {
        timeout_ms: 1,
        ..Default::default()
    };
    row!(d, p, e, cmd::EVENT_SYNC, sync, known: 0, zero: [reserved]);
    d.event_destroy(event).ctx("EVENT_DESTROY")
}

fn abi_unknown_flags_are_einval() -> TestResult {
    sweep(Probe::Flags, None)
}

fn abi_nonzero_pad_and_reserved_are_einval() -> TestResult {
    sweep(Probe::Zeroes, None)
}

fn abi_unreadable_argument_is_efault() -> TestResult {
    sweep(Probe::Fault, None)
}
