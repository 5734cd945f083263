// SPDX-License-Identifier: GPL-2.0

//! Who may submit, and how long a caller can be made to wait to: a submission waits for its
//! stream's turn behind another's interruptibly (a killed waiter dies at once, never in D
//! state), and the streams of a GPU whose removal has begun refuse every submission with
//! `ENODEV`, before their sticky error.

use std::{
    os::fd::AsFd,
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    sys::{
        signal::{kill, Signal},
        wait::{waitpid, WaitStatus},
    },
    unistd::{fork, ForkResult, Pid},
};

use super::{
    drained, engine_on, errno_of, exported, going::remove_gpu, going::BringBack, mem_on, setup,
    signalled, sw_sync_or_none, K, M, USER_VA, WAIT_MS,
};
use crate::selftest::harness::{check, expect_errno, Context, Stop, TestResult};
use libruvm::{op, uapi, Ruvm};

/// How soon a killed waiter must be gone.
const DEATH_BOUND: Duration = Duration::from_secs(1);

/// A child of this process (sharing its open file) that submits `ops` to stream `s` and exits
/// 0 if the submission was queued, else with its errno.
fn submitter(d: &Ruvm, s: u64, ops: &[uapi::ruvm_op]) -> Result<Pid, Stop> {
    // SAFETY: the selftest runner is single-threaded when cases run; the child makes one
    // ioctl and exits without returning.
    match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            let code = match d.stream_submit(s, ops) {
                Ok(_) => 0,
                Err(e) => e as i32,
            };
            // SAFETY: `_exit` ends the child at once (no destructors of the parent's state).
            unsafe { nix::libc::_exit(code) }
        }
        ForkResult::Parent { child } => Ok(child),
    }
}

/// The state letter of process `pid` (`/proc/PID/stat`'s third field): `S` an interruptible
/// sleep, `D` an uninterruptible one.
fn state_of(pid: Pid) -> Result<char, Stop> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ctx("read /proc/PID/stat")?;
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .ok_or_else(|| Stop::Fail(format!("/proc/{pid}/stat unreadable: {stat:?}")))
}

/// Kills `pid` and waits for it: fails unless it is gone within [`DEATH_BOUND`]. How long it
/// took.
fn kill_and_time(pid: Pid, what: &str) -> Result<Duration, Stop> {
    let t = Instant::now();
    kill(pid, Signal::SIGKILL).ctx("kill")?;
    let st = waitpid(pid, None).ctx("waitpid")?;
    let took = t.elapsed();
    check!(
        matches!(st, WaitStatus::Signaled(_, Signal::SIGKILL, _)),
        "{what}: ended {st:?}, wanted killed"
    );
    check!(
        took < DEATH_BOUND,
        "{what}: died {took:?} after SIGKILL, wanted within {DEATH_BOUND:?}"
    );
    Ok(took)
}

/// A submission holds its stream's turn for 10 s (`RUVM_PLANT_SLOW_SUBMIT`); another process of
/// the same file submitting to the stream meanwhile waits interruptibly (state `S`, not `D`),
/// and dies within a second of `SIGKILL`, nothing of its submitted. The holder's submission
/// is then queued; a holder killed while it holds the turn dies at once too, nothing queued,
/// and the stream takes submissions again at once.
pub(super) fn stream_killed_waiter_dies_at_once() -> TestResult {
    let (d, g) = setup()?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    match d.test_plant(uapi::ruvm_plant_RUVM_PLANT_SLOW_SUBMIT) {
        Err(Errno::ENOSYS | Errno::EPERM) => {
            return Err(Stop::Skip("needs enable_test_ioctls=1 and root".into()))
        }
        r => r.ctx("TEST_PLANT slow submit")?,
    }
    let holder = submitter(&d, s, &[op::record(e)])?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(1000));
    let waiter = submitter(&d, s, &[op::record(e), op::record(e)])?;
    std::thread::sleep(Duration::from_millis(500));
    let state = state_of(waiter)?;
    check!(
        state == 'S',
        "the waiter behind a 10 s submission is in state {state}, wanted S (an interruptible wait)"
    );
    let took = kill_and_time(waiter, "the waiter behind a 10 s submission")?;
    check!(
        t0.elapsed() < Duration::from_millis(u64::from(uapi::RUVM_PLANT_SLOW_SUBMIT_MS)),
        "the holder's 10 s were over before the waiter was killed ({:?}): nothing was proven",
        t0.elapsed()
    );
    println!(
        "# the killed waiter was gone {:.1} ms after SIGKILL",
        took.as_secs_f64() * 1e3
    );
    let st = waitpid(holder, None).ctx("waitpid")?;
    check!(
        st == WaitStatus::Exited(holder, 0),
        "the holder's submission: {st:?}, wanted queued (exit 0)"
    );
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.submitted == 1 && q.completed == 1 && q.error == 0,
        "after the holder and the killed waiter: {q:?}, wanted the holder's one operation only"
    );
    // The holder killed while it holds the turn.
    d.test_plant(uapi::ruvm_plant_RUVM_PLANT_SLOW_SUBMIT)
        .ctx("TEST_PLANT slow submit")?;
    let holder = submitter(&d, s, &[op::record(e)])?;
    std::thread::sleep(Duration::from_millis(500));
    kill_and_time(holder, "a holder killed while it holds the turn")?;
    let t = Instant::now();
    d.stream_submit(s, &[op::record(e)])
        .ctx("STREAM_SUBMIT after the killed holder")?;
    check!(
        t.elapsed() < DEATH_BOUND,
        "a submission after the killed holder took {:?}",
        t.elapsed()
    );
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.submitted == 2 && q.completed == 2 && q.error == 0,
        "after the killed holder: {q:?}, wanted its operation not queued, the next one done"
    );
    d.event_destroy(e).ctx("EVENT_DESTROY")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drained(&d, "at the end")
}

/// How long a submission that cannot get its memory may take to fail.
const FAIL_BOUND: Duration = Duration::from_secs(10);

/// A submission of four 78 MiB `ALLOC`s (the GPU's default pool) by a process in a memory
/// cgroup of 64 MiB fails with `ENOMEM` within [`FAIL_BOUND`], nothing made, and the stream
/// takes a submission at once after it (its turn was given back).
pub(super) fn stream_failing_alloc_is_bounded() -> TestResult {
    use crate::cgroup::MemGroup;
    let (d, g) = setup()?;
    if d.info().ctx("INFO")?.features & u64::from(uapi::RUVM_FEATURE_STREAM_ALLOC) == 0 {
        return Err(Stop::Skip("no stream-ordered allocation".into()));
    }
    if !MemGroup::available() {
        return Err(Stop::Skip("no cgroup2 memory controller".into()));
    }
    let group = MemGroup::new("ruvm-failing-alloc").ctx("memory cgroup")?;
    group
        .write("memory.max", &(64 * M).to_string())
        .ctx("memory.max")?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let ops = vec![op::alloc(0, 78 * M, false); 4];
    let (rx, tx) = nix::unistd::pipe().ctx("pipe")?;
    // SAFETY: the runner is single-threaded here; the child makes syscalls and exits.
    let child = match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            let me = std::process::id().to_string();
            if std::fs::write(group.dir.join("cgroup.procs"), me).is_err() {
                // SAFETY: ends the child at once.
                unsafe { nix::libc::_exit(10) }
            }
            let t = Instant::now();
            let r = d.stream_submit(s, &ops);
            let ms = u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX);
            let errno = match r {
                Ok(_) => 0,
                Err(e) => e as u64,
            };
            let mut out = [0u8; 16];
            out[..8].copy_from_slice(&ms.to_ne_bytes());
            out[8..].copy_from_slice(&errno.to_ne_bytes());
            let _ = nix::unistd::write(&tx, &out);
            // SAFETY: ends the child at once.
            unsafe { nix::libc::_exit(0) }
        }
        ForkResult::Parent { child } => child,
    };
    drop(tx);
    let mut got = [0u8; 16];
    let n = nix::unistd::read(&rx, &mut got).ctx("read the child's result")?;
    let st = waitpid(child, None).ctx("waitpid")?;
    check!(
        n == 16 && st == WaitStatus::Exited(child, 0),
        "the submitting child: {st:?}, {n} bytes of result"
    );
    let ms = u64::from_ne_bytes(got[..8].try_into().unwrap_or([0; 8]));
    let errno = u64::from_ne_bytes(got[8..].try_into().unwrap_or([0; 8]));
    println!("# four 78 MiB ALLOCs in a 64 MiB memory cgroup failed in {ms} ms (errno {errno})");
    check!(
        errno == Errno::ENOMEM as u64,
        "the submission ended with errno {errno}, wanted ENOMEM"
    );
    check!(
        Duration::from_millis(ms) < FAIL_BOUND,
        "the failing submission took {ms} ms, wanted under {FAIL_BOUND:?}"
    );
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.submitted == 0,
        "the failed submission and the killed waiter queued something: {q:?}"
    );
    let t = Instant::now();
    let mut one = vec![op::alloc(0, 64 * K, false)];
    d.stream_submit_mut(s, &mut one)
        .ctx("STREAM_SUBMIT after the failure")?;
    check!(
        t.elapsed() < DEATH_BOUND,
        "a submission after the failed one took {:?}",
        t.elapsed()
    );
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    d.mem_free(op::allocated(&one[0]).0).ctx("MEM_FREE")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drop(group);
    drained(&d, "at the end")
}

/// A submission whose checks passed before its GPU's removal began, queued after the removal
/// failed the stream's work (it is in error `ENODEV`), is refused with `ENODEV`, not `EIO`
/// (`RUVM_PLANT_SLOW_SUBMIT` holds it between its checks and its queueing), nothing queued.
pub(super) fn stream_enodev_at_queueing_once_the_gpu_is_going() -> TestResult {
    let (d, g) = setup()?;
    if d.info().ctx("INFO")?.test_ioctls == 0 {
        return Err(Stop::Skip("needs enable_test_ioctls=1".into()));
    }
    let Some(tl) = sw_sync_or_none()? else {
        return Err(Stop::Skip("no sw_sync".into()));
    };
    let fence = tl.create_fence(1, "never").ctx("CREATE_FENCE")?;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let first = d
        .stream_submit(s, &[op::wait_fd(fence.as_fd(), WAIT_MS)])
        .ctx("STREAM_SUBMIT of the held wait")?;
    engine_on(&d, s, first, "the held wait")?;
    d.test_plant(uapi::ruvm_plant_RUVM_PLANT_SLOW_SUBMIT)
        .ctx("TEST_PLANT slow submit")?;
    let holder = submitter(&d, s, &[op::record(e)])?;
    std::thread::sleep(Duration::from_millis(500));
    let back = BringBack(&d, g);
    remove_gpu(g)?;
    let st = waitpid(holder, None).ctx("waitpid")?;
    check!(
        st == WaitStatus::Exited(holder, Errno::ENODEV as i32),
        "the submission held across the removal ended {st:?}, wanted ENODEV ({})",
        Errno::ENODEV as i32
    );
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.submitted == first && q.error == Errno::ENODEV as u32,
        "the stream after the removal: {q:?}, wanted only the wait submitted, in error ENODEV"
    );
    d.test_sim_gpu(g, true).ctx("TEST_SIM_GPU add")?;
    drop(back);
    tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.event_destroy(e).ctx("EVENT_DESTROY")?;
    drained(&d, "after the removal")
}

/// After its GPU's removal every stream of it refuses submissions with `ENODEV`, before its
/// sticky error: idle at the removal, in error before it (`EFAULT`), held by a wait the removal
/// fails (refused before and after its error is set), and again once the GPU is back.
pub(super) fn stream_submit_after_gpu_removal_is_enodev() -> TestResult {
    let (d, g) = setup()?;
    if d.info().ctx("INFO")?.test_ioctls == 0 {
        return Err(Stop::Skip("needs enable_test_ioctls=1".into()));
    }
    let size = 8 * M;
    let a = mem_on(&d, g, size, Some(61))?;
    let b = mem_on(&d, g, size, None)?;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let idle = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    d.stream_submit(idle, &[op::copy(b, 0, a, 0, 4 * K)])
        .ctx("STREAM_SUBMIT idle")?;
    d.stream_sync(idle, WAIT_MS).ctx("STREAM_SYNC idle")?;
    // In error before the removal: an MMU fault (nothing is mapped at USER_VA).
    let failed = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    d.stream_submit(failed, &[op::copy_va(USER_VA + M, USER_VA, 4 * K, true)])
        .ctx("STREAM_SUBMIT of the fault")?;
    expect_errno(
        d.stream_sync(failed, WAIT_MS),
        Errno::EIO,
        "STREAM_SYNC after the fault",
    )?;
    expect_errno(
        d.stream_submit(failed, &[op::record(e)]),
        Errno::EIO,
        "a submit to a stream in error, its GPU present",
    )?;
    let tl = sw_sync_or_none()?;
    let fence = match &tl {
        Some(t) => Some(t.create_fence(1, "never").ctx("CREATE_FENCE")?),
        None => None,
    };
    let held = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let mut ops = match &fence {
        Some(f) => vec![op::wait_fd(f.as_fd(), WAIT_MS)],
        None => vec![op::copy(b, 0, a, 0, size); 64],
    };
    ops.push(op::record(e));
    let first = d.stream_submit(held, &ops).ctx("STREAM_SUBMIT held")?;
    if fence.is_some() {
        engine_on(&d, held, first, "the held wait")?;
    }
    let (f, _) = exported(&d, e, "the record after the hold")?;
    let back = BringBack(&d, g);
    remove_gpu(g)?;
    let refused = |when: &str| -> TestResult {
        for (s, what) in [(idle, "idle"), (failed, "failed"), (held, "held")] {
            let n = d.stream_query(s).ctx("STREAM_QUERY")?.submitted;
            expect_errno(
                d.stream_submit(s, &[op::record(e)]),
                Errno::ENODEV,
                &format!("a submit to the {what} stream {when}"),
            )?;
            check!(
                d.stream_query(s).ctx("STREAM_QUERY")?.submitted == n,
                "the refused submit to the {what} stream queued something"
            );
        }
        Ok(())
    };
    refused("right after the removal")?;
    let info = signalled(&f, "the record after the hold")?;
    check!(
        errno_of(info.status) == Some(Errno::ENODEV),
        "the record signalled with {}, wanted -ENODEV",
        info.status
    );
    let q = d.stream_query(held).ctx("STREAM_QUERY")?;
    check!(
        q.error == Errno::ENODEV as u32 && q.completed == q.submitted,
        "the held stream after the removal: {q:?}"
    );
    check!(
        d.stream_query(idle).ctx("STREAM_QUERY")?.error == 0,
        "the idle stream is in error after the removal"
    );
    check!(
        d.stream_query(failed).ctx("STREAM_QUERY")?.error == Errno::EFAULT as u32,
        "the failed stream's first error changed"
    );
    refused("once the held work failed")?;
    d.stream_sync(idle, WAIT_MS)
        .ctx("STREAM_SYNC idle after the removal")?;
    for s in [failed, held] {
        expect_errno(
            d.stream_sync(s, WAIT_MS),
            Errno::EIO,
            "STREAM_SYNC of failed work",
        )?;
    }
    d.test_sim_gpu(g, true).ctx("TEST_SIM_GPU add")?;
    drop(back);
    refused("once the GPU is back under the same id")?;
    let s = d
        .stream_create(g)
        .ctx("STREAM_CREATE after the return")?
        .handle;
    d.stream_submit(s, &[op::record(e)])
        .ctx("STREAM_SUBMIT to a new stream")?;
    d.stream_sync(s, WAIT_MS)
        .ctx("STREAM_SYNC of the new stream")?;
    for x in [idle, failed, held, s] {
        d.stream_destroy(x).ctx("STREAM_DESTROY")?;
    }
    for h in [a, b] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    if let Some(t) = &tl {
        t.inc(1).ctx("SW_SYNC_IOC_INC")?;
    }
    d.event_destroy(e).ctx("EVENT_DESTROY")?;
    drained(&d, "after the removal")
}
