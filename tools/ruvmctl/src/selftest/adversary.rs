// SPDX-License-Identifier: GPL-2.0

//! ruvm tested as an adversary would test it: one file must never see another's bytes, the
//! kernel memory spent for a caller must be bounded and charged to it, and a GPU's removal must
//! finish while users keep working. Each case replays one of the defects found that way
//! (Documentation/testing.rst, "Adversary cases").

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    sys::{
        mman::{MapFlags, ProtFlags},
        signal::{kill, Signal},
        wait::waitpid,
    },
    unistd::{fork, ForkResult},
};

use super::harness::{cases, check, expect_errno, Case, Context, Stop, TestResult};
use super::shared::{live, readable, sim_gpu, vid_alloc, vid_pool, vidmem_gpu};
use crate::cgroup::MemGroup;
use libruvm::{cmd, uapi, Ruvm, UserMap};

mod pools;
use pools::*;

const K: u64 = 1024;
const M: u64 = 1024 * K;
const ZERO: u32 = uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO;
const POOL_CHUNKS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_POOL_CHUNKS as usize;
const DMA_MAPPINGS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS as usize;

/// How long a GPU's removal may take while users keep working before it counts as hung.
const REMOVAL_BOUND: Duration = Duration::from_secs(10);

pub fn cases() -> Vec<Case> {
    cases![
        adv_ce_copy_va_never_reads_another_files_bytes,
        adv_gpu_removal_finishes_while_pools_are_busy,
        adv_pool_revoke_leaves_no_cached_table,
        adv_failed_vidmem_pool_alloc_keeps_nothing,
        adv_pools_per_file_are_bounded_and_charged,
        adv_pool_cache_is_reclaimed_by_its_cgroup,
        adv_pool_cache_counts_in_the_file_quota,
        adv_alloc_efault_leaves_no_mapping,
        adv_pool_destroy_does_not_stall_the_file,
    ]
}

/// Fills `[0, len)` of `h` with `byte` through its kernel mapping.
fn fill_byte(d: &Ruvm, h: u64, len: u64, byte: u8) -> Result<(), Errno> {
    d.map_kernel(h)?;
    d.mem_fill(
        false,
        uapi::ruvm_mem_fill {
            handle: h,
            length: len,
            seed: u64::from(byte),
            kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
            ..Default::default()
        },
    )
    .map(drop)
}

/// Runs `f` in a forked child until the parent kills it; the child's pid.
fn spawn_child(f: impl FnOnce()) -> Result<nix::unistd::Pid, Stop> {
    // SAFETY: called before the case starts any thread; the child only makes syscalls and
    // touches memory, then exits without returning.
    match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            f();
            std::process::exit(0)
        }
        ForkResult::Parent { child } => Ok(child),
    }
}

/// Ends a child of [`spawn_child`].
fn end_child(pid: nix::unistd::Pid) {
    let _ = kill(pid, Signal::SIGKILL);
    let _ = waitpid(pid, None);
}

/// The victim's byte: a file that never shares anything fills its mems with it.
const VICTIM: u8 = 0xa5;
/// The copier's own byte.
const MINE: u8 = 0x11;

/// Keeps the calling thread (or process) on CPU `n`: the thread that frees the copier's source
/// and the victim share CPU 0, so that a page one frees is the next the other allocates (the
/// per-CPU free lists hand back the last page freed); the copier runs on CPU 1.
fn on_cpu(n: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(n).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// A copy through the file's user VAs (`CE_COPY_VA`, anyone's) while another thread frees the
/// source and maps a new one at the same VA, and another process keeps filling fresh mems mapped
/// for the same GPU with its own byte: every copy that succeeds moved the copier's own bytes.
/// (The engine translated a VA, let the MMU's lock go, and then reached whatever page the
/// address had come to map: another file's, after the free.)
fn adv_ce_copy_va_never_reads_another_files_bytes() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let g = sim_gpu(&d)?;
    let victim = spawn_child(move || {
        on_cpu(0);
        let Ok(v) = Ruvm::open() else { return };
        let mut ring = std::collections::VecDeque::new();
        loop {
            if let Ok(a) = v.mem_alloc(4 * K, 0, 0) {
                let _ = fill_byte(&v, a.handle, 4 * K, VICTIM);
                let _ = v.mem_gpu(true, a.handle, g);
                ring.push_back(a.handle);
            }
            if ring.len() > 32 {
                if let Some(h) = ring.pop_front() {
                    let _ = v.mem_free(h);
                }
            }
        }
    })?;
    let r = copy_race(&d, g);
    end_child(victim);
    r
}

fn copy_race(d: &Ruvm, g: u32) -> TestResult {
    const SRC: u64 = 0x10_0000_0000;
    const DST: u64 = 0x20_0000_0000;
    // One page: the victim takes the page the free gave back.
    const LEN: u64 = 4 * K;
    let dst = d.mem_alloc(LEN, 0, ZERO).ctx("alloc dst")?;
    d.map_gpu_user(dst.handle, g, DST, false)
        .ctx("MAP_GPU_USER dst")?;
    let q = d.mem_query(dst.handle).ctx("MEM_QUERY")?;
    let view = UserMap::of_mem(d, &q).ctx("mmap dst")?;
    let new_src = || -> Result<u64, Errno> {
        let a = d.mem_alloc(LEN, 0, ZERO)?;
        fill_byte(d, a.handle, LEN, MINE)?;
        d.map_gpu_user(a.handle, g, SRC, false)?;
        Ok(a.handle)
    };
    let first = new_src().ctx("source")?;
    let stop = AtomicBool::new(false);
    let src = AtomicU64::new(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    on_cpu(1);
    let (copies, wrong) = std::thread::scope(|s| {
        let churn = s.spawn(|| {
            on_cpu(0);
            while !stop.load(Ordering::Relaxed) {
                let _ = d.mem_free(src.load(Ordering::Relaxed));
                // The victim's turn: its next page is the one just freed.
                let _ = nix::sched::sched_yield();
                match new_src() {
                    Ok(h) => src.store(h, Ordering::Relaxed),
                    Err(e) => return Err(format!("a new source: {e}")),
                }
            }
            Ok(())
        });
        let mut copies = 0u64;
        let mut tries = 0u64;
        let mut wrong = None;
        let mut bytes = vec![0u8; LEN as usize];
        while Instant::now() < deadline && wrong.is_none() {
            for i in 0..bytes.len() {
                view.write(i, 0);
            }
            // EFAULT (an MMU fault) while the source is away is expected; the pieces before
            // the fault were copied, and must be the copier's own too.
            let copied = d.ce_copy_va(g, DST, SRC, LEN, true).is_ok();
            copies += u64::from(copied);
            tries += 1;
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = view.read(i);
            }
            let bad = |&b: &u8| b != MINE && (copied || b != 0);
            if let Some(i) = bytes.iter().position(bad) {
                let victims = bytes.iter().filter(|&&b| b == VICTIM).count();
                wrong = Some((i, bytes[i], victims));
            }
        }
        stop.store(true, Ordering::Relaxed);
        let churned = churn.join();
        ((copies, tries), (wrong, churned))
    });
    let (copies, tries) = copies;
    let (wrong, churned) = wrong;
    churned
        .map_err(|_| Stop::Fail("the churning thread panicked".into()))?
        .map_err(Stop::Fail)?;
    if let Some((at, b, victims)) = wrong {
        return Err(Stop::Fail(format!(
            "a copy moved byte {b:#x} at {at} ({victims} of the {LEN} bytes were another file's {VICTIM:#x})"
        )));
    }
    println!(
        "# {tries} copies through a VA whose mem was freed and replaced meanwhile ({copies} whole, the others stopped by an MMU fault)"
    );
    check!(copies > 0, "no copy succeeded");
    let _ = d.mem_free(src.load(Ordering::Relaxed));
    d.mem_free(dst.handle).ctx("free")
}

/// Removes simulated GPU `g` in a thread and waits up to [`REMOVAL_BOUND`]; `stop` is set once
/// it returned or timed out (then `on_hang` runs, which must let it finish, and the case
/// fails). The removal's time.
fn timed_removal(
    d: &Ruvm,
    g: u32,
    stop: &AtomicBool,
    on_hang: impl FnOnce(),
) -> Result<Duration, Stop> {
    let done = AtomicBool::new(false);
    let t = Instant::now();
    let (r, took) = std::thread::scope(|s| {
        let remover = s.spawn(|| {
            let r = d.test_sim_gpu(g, false);
            done.store(true, Ordering::Relaxed);
            r
        });
        while !done.load(Ordering::Relaxed) && t.elapsed() < REMOVAL_BOUND {
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        let hung = !done.load(Ordering::Relaxed);
        if hung {
            on_hang();
        }
        (remover.join(), (took, hung))
    });
    let (took, hung) = took;
    let r = r.map_err(|_| Stop::Fail("the remover panicked".into()))?;
    match r {
        Err(Errno::ENOSYS) | Err(Errno::EPERM) => {
            return Err(Stop::Skip("needs enable_test_ioctls=1 and root".into()))
        }
        r => r.ctx("TEST_SIM_GPU remove")?,
    }
    check!(
        !hung,
        "the removal of GPU {g} did not finish within {REMOVAL_BOUND:?} while users worked"
    );
    Ok(took)
}

/// A GPU's removal while threads allocate and free from a sysmem pool that maps its chunks for
/// the GPU, and from a vidmem pool of it: the removal finishes in bounded time (a table in
/// transit between a mem and the pool's cache used to escape it, and the removal slept until
/// the user freed the mem); no sysmem pool allocation fails because the GPU is going (it is
/// skipped); the vidmem pool keeps no chunk of the gone GPU.
fn adv_gpu_removal_finishes_while_pools_are_busy() -> TestResult {
    const ROUNDS: usize = 24;
    let d = Ruvm::open().ctx("open")?;
    let g = sim_gpu(&d)?;
    // Pools made before the busy one, granted the GPU: its removal visits them first, after
    // the mems, which widens the window in which a table moves from a mem the removal already
    // visited to a pool it has not (or back).
    let mut ballast = Vec::new();
    for _ in 0..900 {
        ballast.push(d.pool_create(0, 0).ctx("POOL_CREATE")?.0);
    }
    let mut slowest = Duration::ZERO;
    for round in 0..ROUNDS {
        for &p in &ballast {
            d.pool_access(p, g, true).ctx("POOL_SET_ACCESS")?;
        }
        let took = removal_round(&d, g).map_err(|e| match e {
            Stop::Fail(m) => Stop::Fail(format!("round {round}: {m}")),
            s => s,
        })?;
        slowest = slowest.max(took);
    }
    println!(
        "# {ROUNDS} removals with 3 threads allocating and freeing: the slowest took {slowest:?}"
    );
    for p in ballast {
        d.pool_destroy(p).ctx("POOL_DESTROY")?;
    }
    Ok(())
}

/// One removal of `g` under pool users, and its return.
fn removal_round(d: &Ruvm, g: u32) -> Result<Duration, Stop> {
    let (p, _) = d.pool_create(64 * K, u64::MAX).ctx("POOL_CREATE")?;
    d.pool_access(p, g, true).ctx("POOL_SET_ACCESS")?;
    let vid = match vid_pool(d, g, 64 * K, u64::MAX) {
        Ok(h) => Some(h),
        Err(Errno::ENXIO) => None,
        Err(e) => return Err(Stop::Fail(format!("vidmem POOL_CREATE: {e}"))),
    };
    let stop = AtomicBool::new(false);
    let bad = std::sync::Mutex::new(Vec::new());
    let held = std::sync::Mutex::new(Vec::new());
    let r = std::thread::scope(|s| {
        for t in 0..3u64 {
            let (stop, bad, held) = (&stop, &bad, &held);
            s.spawn(move || {
                let mut mine = std::collections::VecDeque::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = match (t, vid) {
                        (2, Some(v)) => {
                            let mut a = uapi::ruvm_mem_alloc {
                                size: 128 * K,
                                backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
                                gpu: g,
                                pool: v,
                                ..Default::default()
                            };
                            d.call(cmd::MEM_ALLOC, &mut a)
                                .map(|()| a)
                                .map_err(|e| (e, true))
                        }
                        _ => d.pool_alloc(p, 64 * K * (t + 1), 0).map_err(|e| (e, false)),
                    };
                    match r {
                        Ok(a) => mine.push_back(a.handle),
                        // A vidmem pool of a gone GPU: ENODEV, as documented.
                        Err((Errno::ENODEV, true)) => {}
                        Err((e, _)) => {
                            if let Ok(mut b) = bad.lock() {
                                b.push(format!("thread {t}: MEM_ALLOC: {e}"));
                            }
                        }
                    }
                    if mine.len() > 2 {
                        if let Some(h) = mine.pop_front() {
                            let _ = d.mem_free(h);
                        }
                    }
                }
                if let Ok(mut h) = held.lock() {
                    h.extend(mine);
                }
            });
        }
        std::thread::sleep(Duration::from_millis(100));
        // On a hang the users stop; the mems they hold are freed below, after which the
        // removal (which waited for them) finishes and the scope can end.
        timed_removal(d, g, &stop, || {
            std::thread::sleep(Duration::from_millis(200));
            for h in held.lock().map(|h| h.clone()).unwrap_or_default() {
                let _ = d.mem_free(h);
            }
        })
    });
    for h in held.lock().map(|h| h.clone()).unwrap_or_default() {
        let _ = d.mem_free(h);
    }
    let back = d.test_sim_gpu(g, true);
    let took = r?;
    back.ctx("TEST_SIM_GPU add")?;
    let bad = bad.lock().map(|b| b.clone()).unwrap_or_default();
    check!(
        bad.is_empty(),
        "{} allocations failed while the GPU went, the first: {}",
        bad.len(),
        bad.iter().take(3).cloned().collect::<Vec<_>>().join("; ")
    );
    let a = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        a.access & (1u64 << g) == 0,
        "GPU {g} is still in the pool's access set after its removal: {:#x}",
        a.access
    );
    if let Some(v) = vid {
        let a = d.pool_get(v).ctx("POOL_GET vidmem")?;
        check!(
            a.cached_chunks == 0 && a.used_current == 0,
            "the vidmem pool of the gone GPU holds {} cached chunks, {} bytes in use",
            a.cached_chunks,
            a.used_current
        );
        d.pool_destroy(v).ctx("POOL_DESTROY vidmem")?;
    }
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    Ok(took)
}
