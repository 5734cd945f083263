// SPDX-License-Identifier: GPL-2.0

//! `RUVM_IOCTL_BENCH`: every op times what it says and leaves nothing behind; bad input is
//! refused with the documented errno.

use libruvm::{uapi, Ruvm};
use nix::{
    errno::Errno,
    unistd::{setuid, Uid},
};

use super::harness::{cases, check, child_checks, expect_errno, Case, Context, Stop, TestResult};

pub fn cases() -> Vec<Case> {
    cases![bench_ops_time_and_leave_nothing, bench_bad_inputs,]
}

fn op(op: u32, order: u32, zero: u32, count: u64, handle: u64) -> uapi::ruvm_bench {
    uapi::ruvm_bench {
        op,
        order,
        zero,
        count,
        handle,
        iterations: 3,
        ..Default::default()
    }
}

const PAGES: u32 = uapi::ruvm_bench_op_RUVM_BENCH_PAGES;
const MEM: u32 = uapi::ruvm_bench_op_RUVM_BENCH_MEM;
const VMAP: u32 = uapi::ruvm_bench_op_RUVM_BENCH_VMAP;
const KMAP: u32 = uapi::ruvm_bench_op_RUVM_BENCH_KMAP;

fn counts(
    d: &Ruvm,
) -> Result<
    (
        u64,
        [u64; uapi::ruvm_audit_class_RUVM_AUDIT_CLASSES as usize],
    ),
    Stop,
> {
    let i = d.info().ctx("INFO")?;
    let a = d.audit(false).ctx("AUDIT")?;
    Ok((i.live_mems, a.live))
}

fn bench_ops_time_and_leave_nothing() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    check!(
        info.features & u64::from(uapi::RUVM_FEATURE_BENCH) != 0,
        "RUVM_FEATURE_BENCH not reported"
    );
    let m = d.mem_alloc(1 << 20, 0, 0).ctx("alloc")?;
    let before = counts(&d)?;
    let allocs = d.stats(false).ctx("STATS")?.allocs;
    for (what, a) in [
        ("PAGES order 0", op(PAGES, 0, 0, 16, 0)),
        ("PAGES order 9 zeroed", op(PAGES, 9, 1, 2, 0)),
        ("MEM order 0", op(MEM, 0, 0, 16, 0)),
        ("MEM order 4 zeroed", op(MEM, 4, 1, 4, 0)),
        ("VMAP", op(VMAP, 0, 0, 0, m.handle)),
        ("KMAP", op(KMAP, 0, 0, 0, m.handle)),
    ] {
        let ns = d.bench(a).ctx(what)?;
        check!(ns > 0, "{what}: took {ns} ns");
    }
    // Two MEM runs of three iterations: six mems made and freed, counted like any.
    let after = d.stats(false).ctx("STATS")?.allocs;
    check!(
        after == allocs + 6,
        "MEM made {} mems, wanted 6",
        after - allocs
    );
    check!(
        counts(&d)? == before,
        "the bench left something: {before:?} -> {:?}",
        counts(&d)?
    );
    let q = d.mem_query(m.handle).ctx("query")?;
    check!(
        q.mapped & u64::from(uapi::ruvm_mapped_RUVM_MAPPED_CPU_KERNEL) == 0,
        "KMAP left the mem kernel-mapped"
    );
    d.mem_free(m.handle).ctx("free")?;
    Ok(())
}

fn bench_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let m = d.mem_alloc(4096, 0, 0).ctx("alloc")?;
    let max = d.info().ctx("INFO")?.max_alloc_bytes;
    let e = Errno::EINVAL;
    let mut bad = vec![
        ("op 0", op(0, 0, 0, 1, 0), e),
        ("op 5", op(5, 0, 0, 1, 0), e),
        ("order 10", op(PAGES, 10, 0, 1, 0), e),
        ("order 64", op(MEM, 64, 0, 1, 0), e),
        ("zero 2", op(PAGES, 0, 2, 1, 0), e),
        ("count 0", op(PAGES, 0, 0, 0, 0), e),
        (
            "more than max_alloc_bytes",
            op(MEM, 0, 0, max / 4096 + 1, 0),
            e,
        ),
        ("count overflowing", op(PAGES, 9, 0, u64::MAX, 0), e),
        ("a handle for PAGES", op(PAGES, 0, 0, 1, m.handle), e),
        ("an order for VMAP", op(VMAP, 1, 0, 0, m.handle), e),
        ("a count for KMAP", op(KMAP, 0, 0, 1, m.handle), e),
        (
            "no such mem",
            op(KMAP, 0, 0, 0, m.handle + 1000),
            Errno::ENOENT,
        ),
    ];
    let mut it0 = op(PAGES, 0, 0, 1, 0);
    it0.iterations = 0;
    bad.push(("0 iterations", it0, e));
    let mut many = op(PAGES, 0, 0, 1, 0);
    many.iterations = (1 << 20) + 1;
    bad.push(("too many iterations", many, e));
    for (what, a, want) in bad {
        expect_errno(d.bench(a), want, what)?;
    }
    let vid_gpu = d
        .gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .find(|g| g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0 && g.vidmem_size > 0);
    if let Some(g) = vid_gpu {
        let v = d.vidmem_alloc(g.id, 4096, 0, 0).ctx("vidmem")?.handle;
        expect_errno(
            d.bench(op(KMAP, 0, 0, 0, v)),
            Errno::EOPNOTSUPP,
            "KMAP of vidmem",
        )?;
        d.mem_free(v).ctx("free vidmem")?;
    }
    d.mem_free(m.handle).ctx("free")?;
    // Without CAP_SYS_ADMIN, EPERM before the arguments are looked at.
    child_checks("an unprivileged bench was not refused with EPERM", || {
        setuid(Uid::from_raw(65534)).is_ok() && d.bench(op(0, 99, 9, 0, 0)) == Err(Errno::EPERM)
    })
}
