// SPDX-License-Identifier: GPL-2.0

//! Streams whose owner goes with work queued: the file closed, its process killed, the GPU
//! removed, the stream destroyed. Every fence exported from them signals (ECANCELED, ENODEV,
//! or without an error for a destroyed stream, whose work runs on), and nothing stays queued.
//!
//! A killed process's sync_files reach this one by `pidfd_getfd`, not `SCM_RIGHTS`: it needs no
//! `CONFIG_UNIX` (the project's kernels have had it only since IPC pools).

use std::{
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    fcntl::OFlag,
    sys::{
        signal::{kill, Signal},
        wait::waitpid,
    },
    unistd::{fork, pipe2, ForkResult, Pid},
};

use super::{
    check_class_names, check_pending_names, drained, engine_on, errno_of, exported, fence_of,
    mem_on, setup, signalled, sw_sync_or_none, user_mismatches, K, M, SIGNAL_BOUND, STREAM_MEMS,
    STREAM_OPS, WAIT_MS,
};
use crate::pattern;
use crate::selftest::harness::{check, expect_errno, Context, Stop, TestResult};
use crate::selftest::shared::{live, mismatches};
use libruvm::{op, uapi, Ruvm};

/// What a holder of queued work reports: its GPU, stream, context, and the seqno each exported
/// fence is of.
const REPORT_WORDS: usize = 3 + EVENTS;
/// Events the 1000 operations record, in turn.
const EVENTS: usize = 4;
/// Operations queued behind the first wait.
const QUEUED: usize = 1000;

/// On `d`: a stream on `g` held by a wait for `gate` (or by long copies without one), then
/// [`QUEUED`] operations (4 KiB copies and records of [`EVENTS`] events) in batches of at most
/// 256. Returns the report words and each event's last point as a sync_file.
fn queue_held_work(
    d: &Ruvm,
    g: u32,
    gate: Option<&OwnedFd>,
) -> Result<([u64; REPORT_WORDS], Vec<OwnedFd>), String> {
    let e = |what: &str, err: Errno| format!("{what}: {err}");
    let s = d.stream_create(g).map_err(|x| e("STREAM_CREATE", x))?;
    let mut mems = Vec::new();
    for big in [false, false, gate.is_none(), gate.is_none()] {
        let size = if big { 32 * M } else { 4 * K };
        let chunk = if big { 2 * M } else { 0 };
        let h = d
            .mem_alloc(size, chunk, 0)
            .map_err(|x| e("MEM_ALLOC", x))?
            .handle;
        d.mem_gpu(true, h, g).map_err(|x| e("MEM_MAP_GPU", x))?;
        mems.push(h);
    }
    let events: Vec<u64> = (0..EVENTS)
        .map(|_| d.event_create())
        .collect::<Result<_, _>>()
        .map_err(|x| e("EVENT_CREATE", x))?;
    let hold: Vec<uapi::ruvm_op> = match gate {
        Some(f) => vec![op::wait_fd(f.as_fd(), 60_000)],
        // Without sw_sync: 6 GiB of copies ahead, seconds even for a fast engine.
        None => vec![op::copy(mems[3], 0, mems[2], 0, 32 * M); 200],
    };
    d.stream_submit(s.handle, &hold)
        .map_err(|x| e("STREAM_SUBMIT of the hold", x))?;
    let mut ops = Vec::new();
    for i in 0..QUEUED / 2 {
        ops.push(op::copy(mems[1], 0, mems[0], 0, 4 * K));
        ops.push(op::record(events[i % EVENTS]));
    }
    let mut report = [0u64; REPORT_WORDS];
    report[..3].copy_from_slice(&[u64::from(g), s.handle, s.context]);
    let mut n = 0;
    for batch in ops.chunks(250) {
        let first = d
            .stream_submit(s.handle, batch)
            .map_err(|x| e("STREAM_SUBMIT", x))?;
        for (i, o) in batch.iter().enumerate() {
            if o.kind == uapi::ruvm_op_kind_RUVM_OP_RECORD {
                // The record of event n % EVENTS.
                report[3 + n % EVENTS] = first + i as u64;
                n += 1;
            }
        }
    }
    let files = events
        .iter()
        .map(|&x| d.event_export(x))
        .collect::<Result<_, _>>()
        .map_err(|x| e("EVENT_EXPORT", x))?;
    Ok((report, files))
}

/// The exported fences of held work are pending and say whose they are; the audit counts the
/// queued operations and the mems they hold.
fn check_held(d: &Ruvm, report: &[u64; REPORT_WORDS], files: &[OwnedFd]) -> TestResult {
    let (g, s) = (report[0] as u32, report[1]);
    let stream = uapi::ruvm_stream_create {
        gpu: g,
        handle: s,
        context: report[2],
        ..Default::default()
    };
    check!(
        files.len() == EVENTS,
        "{} sync_files, wanted {EVENTS}",
        files.len()
    );
    for (i, f) in files.iter().enumerate() {
        check_pending_names(f, g, &stream, report[3 + i], &format!("event {i}'s point"))?;
    }
    let l = live(d)?;
    check!(
        l[STREAM_OPS] > QUEUED as u64 && l[STREAM_MEMS] >= QUEUED as u64 / 2,
        "with {} operations queued (half of them copies): stream_ops={} stream_mems={}",
        QUEUED + 1,
        l[STREAM_OPS],
        l[STREAM_MEMS]
    );
    Ok(())
}

/// Every exported fence of work whose file went signals ECANCELED within [`SIGNAL_BOUND`],
/// and the workers drop everything.
fn check_cancelled(d: &Ruvm, files: &[OwnedFd]) -> TestResult {
    for (i, f) in files.iter().enumerate() {
        let info = signalled(f, &format!("event {i}'s point"))?;
        check!(
            errno_of(info.status) == Some(Errno::ECANCELED),
            "event {i}'s point signalled with {}, wanted -ECANCELED",
            info.status
        );
    }
    drained(d, "after the file went")
}

/// The bytes a holder of queued work writes to the pipe: the report words, then the numbers
/// of its sync_file descriptors (little-endian).
const MESSAGE_LEN: usize = REPORT_WORDS * 8 + EVENTS * 4;

/// `pidfd_open(2)`: a descriptor of process `pid` (Linux 5.3; no config option).
fn pidfd_open(pid: Pid) -> Result<OwnedFd, Errno> {
    // SAFETY: a system call without pointers; it returns a new descriptor or -1 and errno.
    let r = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid.as_raw(), 0) };
    let fd = i32::try_from(Errno::result(r)?).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel installed `fd` for this call; this is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `pidfd_getfd(2)`: a duplicate in this process (close-on-exec) of descriptor `fd` of the
/// process `pidfd` refers to (Linux 5.6; no config option; needs ptrace access to it, which a
/// parent has over its child).
fn pidfd_getfd(pidfd: &OwnedFd, fd: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: a system call without pointers; it returns a new descriptor or -1 and errno.
    let r = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    let fd = i32::try_from(Errno::result(r)?).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel installed `fd` for this call; this is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads the holder's message from pipe `r` (until it is whole or the child closed its end),
/// then takes the descriptors it names out of process `child` with `pidfd_getfd` (the child
/// must still be alive: its descriptors go with it).
fn take_report(r: &OwnedFd, child: Pid) -> Result<([u64; REPORT_WORDS], Vec<OwnedFd>), Stop> {
    let mut buf = [0u8; MESSAGE_LEN];
    let mut got = 0;
    while got < buf.len() {
        match nix::unistd::read(r, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(Stop::Fail(format!("read of the child's pipe: {e}"))),
        }
    }
    check!(
        got == buf.len(),
        "the child wrote {got} bytes of {MESSAGE_LEN}, then closed its pipe (its stderr says why)"
    );
    let (words, fds) = buf.split_at(REPORT_WORDS * 8);
    let mut report = [0u64; REPORT_WORDS];
    for (w, b) in report.iter_mut().zip(words.chunks_exact(8)) {
        *w = u64::from_le_bytes(b.try_into().unwrap_or_default());
    }
    let pidfd = pidfd_open(child).ctx("pidfd_open of the child")?;
    let files = fds
        .chunks_exact(4)
        .map(|b| {
            let n = i32::from_le_bytes(b.try_into().unwrap_or_default());
            pidfd_getfd(&pidfd, n).ctx(&format!("pidfd_getfd of the child's fd {n}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((report, files))
}

/// A child process queues 1001 operations (held by a sw_sync fence this process holds),
/// writes the numbers of its descriptors of each event's last point to a pipe, and sleeps;
/// this process takes those descriptors with `pidfd_getfd` (no `CONFIG_UNIX` needed for
/// `SCM_RIGHTS`), then SIGKILLs it: every one signals ECANCELED, and
/// nothing stays queued.
pub(super) fn stream_kill_with_1000_ops_signals_every_fence() -> TestResult {
    let (d, g) = setup()?;
    // The timeline stays open here: the child's death must not be what signals the gate.
    let tl = sw_sync_or_none()?;
    let gate = match &tl {
        Some(t) => Some(t.create_fence(1, "gate").ctx("CREATE_FENCE")?),
        None => None,
    };
    let (r, w) = pipe2(OFlag::O_CLOEXEC).ctx("pipe2")?;
    // SAFETY: the runner is single-threaded when cases run; the child makes syscalls, writes,
    // and sleeps until killed.
    let child = match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            drop(r);
            let code = match Ruvm::open()
                .map_err(|x| x.to_string())
                .and_then(|own| queue_held_work(&own, g, gate.as_ref()).map(|r| (own, r)))
            {
                Ok((_own, (report, files))) => {
                    let mut msg: Vec<u8> = report.iter().flat_map(|w| w.to_le_bytes()).collect();
                    msg.extend(files.iter().flat_map(|f| f.as_raw_fd().to_le_bytes()));
                    // One write of less than PIPE_BUF bytes: whole or not at all.
                    match nix::unistd::write(&w, &msg) {
                        Ok(n) if n == msg.len() => loop {
                            std::thread::sleep(Duration::from_secs(3600));
                        },
                        r => {
                            eprintln!("# child: write of {} bytes: {r:?}", msg.len());
                            3
                        }
                    }
                }
                Err(why) => {
                    eprintln!("# child: {why}");
                    2
                }
            };
            std::process::exit(code);
        }
        ForkResult::Parent { child } => child,
    };
    drop(w);
    // The descriptors are taken while the child lives; then it is killed whatever happened.
    let held = take_report(&r, child).and_then(|(report, files)| {
        if gate.is_some() {
            check_held(&d, &report, &files)?;
        }
        Ok(files)
    });
    let _ = kill(child, Signal::SIGKILL);
    let status = waitpid(child, None).ctx("waitpid")?;
    let files = held?;
    check!(
        matches!(
            status,
            nix::sys::wait::WaitStatus::Signaled(_, Signal::SIGKILL, _)
        ),
        "the child ended {status:?}, not by the SIGKILL"
    );
    check_cancelled(&d, &files)?;
    if let Some(t) = &tl {
        t.inc(1).ctx("SW_SYNC_IOC_INC")?;
    }
    Ok(())
}

/// The same in one process: a second open file with 1001 operations queued is closed.
pub(super) fn stream_close_with_work_queued() -> TestResult {
    let (d, g) = setup()?;
    check_class_names()?;
    let tl = sw_sync_or_none()?;
    let gate = match &tl {
        Some(t) => Some(t.create_fence(1, "gate").ctx("CREATE_FENCE")?),
        None => None,
    };
    let mems_before = live(&d)?[uapi::ruvm_audit_class_RUVM_AUDIT_MEMS as usize];
    let other = Ruvm::open().ctx("open")?;
    let (report, files) = queue_held_work(&other, g, gate.as_ref()).map_err(Stop::Fail)?;
    if gate.is_some() {
        check_held(&d, &report, &files)?;
        // The engine is on the stream's first operation (seqno 1): the wait for the gate.
        let q = engine_on(&other, report[1], 1, "the wait for the gate")?;
        check!(
            q.completed == 0 && q.submitted == QUEUED as u64 + 1 && q.current_len == 0,
            "the held stream: {q:?}, wanted {} operations submitted, none retired",
            QUEUED + 1
        );
    }
    drop(other);
    check_cancelled(&d, &files)?;
    // The mems the operations held went with them.
    let t = Instant::now();
    while live(&d)?[uapi::ruvm_audit_class_RUVM_AUDIT_MEMS as usize] > mems_before {
        check!(
            t.elapsed() < Duration::from_secs(5),
            "the closed file's mems are still alive after 5 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(t) = &tl {
        t.inc(1).ctx("SW_SYNC_IOC_INC")?;
    }
    Ok(())
}

/// Brings a removed simulated GPU back when dropped (so a failed case leaves it there).
pub(in crate::selftest) struct BringBack<'a>(
    pub(in crate::selftest) &'a Ruvm,
    pub(in crate::selftest) u32,
);

impl Drop for BringBack<'_> {
    fn drop(&mut self) {
        // EEXIST: back already.
        let _ = self.0.test_sim_gpu(self.1, true);
    }
}

/// Removes simulated GPU `g` from another thread (another open file); fails if that takes
/// longer than [`SIGNAL_BOUND`] (the thread is then left stuck).
pub(in crate::selftest) fn remove_gpu(g: u32) -> TestResult {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = Ruvm::open()
            .map_err(|_| Errno::EBADF)
            .and_then(|o| o.test_sim_gpu(g, false));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(SIGNAL_BOUND) {
        Ok(Err(Errno::ENOSYS | Errno::EPERM)) => {
            Err(Stop::Skip("needs enable_test_ioctls=1 and root".into()))
        }
        Ok(r) => r.ctx("TEST_SIM_GPU remove"),
        Err(_) => Err(Stop::Fail(format!(
            "the removal of GPU {g} did not return within {SIGNAL_BOUND:?} with a stream busy"
        ))),
    }
}

/// 64 copies of 8 MiB queued, an event recorded after them; the GPU is removed: the exported
/// point signals ENODEV within the bound, and the stream is in error ENODEV.
pub(super) fn stream_gpu_removal_mid_stream() -> TestResult {
    let (d, g) = setup()?;
    if d.info().ctx("INFO")?.test_ioctls == 0 {
        return Err(Stop::Skip("needs enable_test_ioctls=1".into()));
    }
    let size = 8 * M;
    let a = mem_on(&d, g, size, Some(51))?;
    let b = mem_on(&d, g, size, None)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let mut ops = vec![op::copy(b, 0, a, 0, size); 64];
    ops.push(op::record(e));
    let first = d.stream_submit(s, &ops).ctx("STREAM_SUBMIT")?;
    let (f, info) = exported(&d, e, "the record after the copies")?;
    check!(
        info.status == 0,
        "512 MiB of copies were done before the removal began ({info:?})"
    );
    let _back = BringBack(&d, g);
    let t = Instant::now();
    remove_gpu(g)?;
    let info = signalled(&f, "the record after the copies")?;
    check!(
        errno_of(info.status) == Some(Errno::ENODEV),
        "the record signalled with {} after its GPU went, wanted -ENODEV",
        info.status
    );
    println!(
        "# the point signalled {:.0} ms after the removal began",
        t.elapsed().as_secs_f64() * 1e3
    );
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.error == Errno::ENODEV as u32
            && (first..=first + 64).contains(&q.failed_seqno)
            && q.completed == first + 64
            && q.current_seqno == 0,
        "{q:?}: wanted ENODEV at a seqno from {first} to {}, everything retired, the engine on nothing",
        first + 64
    );
    expect_errno(
        d.stream_submit(s, &[op::record(e)]),
        Errno::ENODEV,
        "a submit to the stream of a gone GPU (in error ENODEV)",
    )?;
    expect_errno(
        d.stream_create(g),
        Errno::ENODEV,
        "STREAM_CREATE on a gone GPU",
    )?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drained(&d, "after the removal")?;
    // Back: a new stream works.
    d.test_sim_gpu(g, true).ctx("TEST_SIM_GPU add")?;
    for h in [a, b] {
        d.mem_gpu(true, h, g).ctx("MEM_MAP_GPU after the return")?;
    }
    let s = d
        .stream_create(g)
        .ctx("STREAM_CREATE after the return")?
        .handle;
    d.stream_submit(s, &[op::copy(b, 0, a, 0, size)])
        .ctx("STREAM_SUBMIT after the return")?;
    d.stream_sync(s, WAIT_MS)
        .ctx("STREAM_SYNC after the return")?;
    let (bad, at) = user_mismatches(&d, b, size, |o| pattern::byte_at(51, o))?;
    check!(
        bad == 0,
        "a copy on the GPU brought back: {bad} bytes wrong, the first at {at:?}"
    );
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    for h in [a, b] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    drained(&d, "at the end")
}

/// STREAM_DESTROY returns at once: the handle is gone, the work queued runs to its end and
/// its point signals without an error.
pub(super) fn stream_destroy_lets_work_finish() -> TestResult {
    let (d, g) = setup()?;
    let tl = sw_sync_or_none()?;
    let size = 4 * M;
    let a = mem_on(&d, g, size, Some(61))?;
    let b = mem_on(&d, g, size, Some(62))?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let gate = match &tl {
        Some(t) => Some(t.create_fence(1, "gate").ctx("CREATE_FENCE")?),
        None => None,
    };
    let mut ops: Vec<uapi::ruvm_op> = gate
        .iter()
        .map(|f| op::wait_fd(f.as_fd(), WAIT_MS))
        .collect();
    // Four copies of 1 MiB, last to first.
    ops.extend((0..4).rev().map(|i| op::copy(b, i * M, a, i * M, M)));
    ops.push(op::record(e));
    d.stream_submit(s, &ops).ctx("STREAM_SUBMIT")?;
    let (f, _) = exported(&d, e, "e")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    expect_errno(
        d.stream_query(s),
        Errno::ENOENT,
        "STREAM_QUERY after destroy",
    )?;
    expect_errno(d.stream_destroy(s), Errno::ENOENT, "STREAM_DESTROY twice")?;
    expect_errno(
        d.stream_submit(s, &[op::record(e)]),
        Errno::ENOENT,
        "STREAM_SUBMIT after destroy",
    )?;
    expect_errno(
        d.stream_sync(s, 1000),
        Errno::ENOENT,
        "STREAM_SYNC after destroy",
    )?;
    if let Some(t) = &tl {
        // Held still: nothing ran, the destroy did not wait for it nor cancel it.
        std::thread::sleep(Duration::from_millis(100));
        check!(
            fence_of(&f, "e")?.status == 0,
            "the work of the destroyed stream ran while held, or was cancelled"
        );
        check!(
            mismatches(&d, b, size, 62)? == 0,
            "B changed while the destroyed stream was held"
        );
        t.inc(1).ctx("SW_SYNC_IOC_INC")?;
    }
    let info = signalled(&f, "e")?;
    check!(
        info.status == 1,
        "the destroyed stream's record signalled with {}",
        info.status
    );
    let qe = d.event_query(e).ctx("EVENT_QUERY")?;
    check!(
        qe.stream == s && qe.status == 1,
        "the event after its stream went: {qe:?}"
    );
    let (bad, at) = user_mismatches(&d, b, size, |o| pattern::byte_at(61, o))?;
    check!(
        bad == 0,
        "B: {bad} bytes are not A's after the destroyed stream's copies, the first at {at:?}"
    );
    for h in [a, b] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    drained(&d, "after the destroyed stream's work")
}
