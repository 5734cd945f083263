// SPDX-License-Identifier: GPL-2.0

//! A GPU's current pool, and what closing, killing, removing a GPU and a synchronous free do
//! to stream allocations.

use super::*;

// --- a GPU's current pool ------------------------------------------------------------------

/// Each GPU has a default pool per file (sysmem, mapped for it, threshold 0, every policy on)
/// that an ALLOC from pool 0 takes from; GPU_POOL makes another pool current, 0 the default
/// again, and a current pool destroyed leaves the default current.
pub(super) fn salloc_default_pool() -> TestResult {
    let (d, g) = setup()?;
    let p0 = d.gpu_pool_get(g).ctx("GPU_POOL")?;
    check!(p0 != 0, "GPU {g}'s current pool is 0");
    check!(
        d.gpu_pool_get(g).ctx("GPU_POOL")? == p0,
        "a second GPU_POOL read another pool"
    );
    let i0 = d.pool_get(p0).ctx("POOL_GET of the default pool")?;
    check!(
        i0.backing == uapi::ruvm_backing_RUVM_BACKING_SYSMEM
            && i0.access & (1 << g) != 0
            && i0.release_threshold == 0
            && i0.reuse == ALL
            && i0.used_current == 0,
        "GPU {g}'s default pool: {i0:?}, wanted sysmem, mapped for GPU {g}, threshold 0, every reuse policy on, nothing used"
    );
    let used = |p: u64| -> Result<u64, Stop> { Ok(d.pool_get(p).ctx("POOL_GET")?.used_current) };
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let m0 = alloc_on(&d, s, 0, SIZE, "an ALLOC from pool 0")?;
    check!(
        used(p0)? == SIZE,
        "the default pool's used is {}, wanted {SIZE}",
        used(p0)?
    );
    // Another pool current.
    let (p1, _) = d.pool_create(SIZE, u64::MAX).ctx("POOL_CREATE")?;
    d.pool_access(p1, g, true).ctx("POOL_SET_ACCESS")?;
    d.gpu_pool_set(g, p1).ctx("GPU_POOL set")?;
    check!(
        d.gpu_pool_get(g).ctx("GPU_POOL")? == p1,
        "GPU_POOL set did not make pool {p1} current"
    );
    let m1 = alloc_on(&d, s, 0, SIZE, "an ALLOC from pool 0, another pool current")?;
    check!(
        used(p1)? == SIZE && used(p0)? == SIZE,
        "with pool {p1} current: its used {}, the default's {}",
        used(p1)?,
        used(p0)?
    );
    // 0: the default again.
    d.gpu_pool_set(g, 0).ctx("GPU_POOL set 0")?;
    check!(
        d.gpu_pool_get(g).ctx("GPU_POOL")? == p0,
        "GPU_POOL set 0 did not make the default pool current again"
    );
    let m2 = alloc_on(
        &d,
        s,
        0,
        SIZE,
        "an ALLOC from pool 0, the default current again",
    )?;
    check!(
        used(p0)? == 2 * SIZE && used(p1)? == SIZE,
        "the default current again: its used {}, pool {p1}'s {}",
        used(p0)?,
        used(p1)?
    );
    // A current pool destroyed: the default is current again.
    d.gpu_pool_set(g, p1).ctx("GPU_POOL set")?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    d.mem_free(m1).ctx("MEM_FREE")?;
    d.pool_destroy(p1).ctx("POOL_DESTROY of the current pool")?;
    check!(
        d.gpu_pool_get(g).ctx("GPU_POOL")? == p0,
        "the current pool destroyed, the GPU's current pool is not its default"
    );
    expect_errno(
        d.pool_destroy(p0),
        Errno::EBUSY,
        "POOL_DESTROY of the default pool",
    )?;
    // Per GPU, per file.
    if let Some(g2) = super::super::streams::sim_gpus(&d)?
        .iter()
        .map(|x| x.id)
        .find(|&x| x != g)
    {
        let q = d.gpu_pool_get(g2).ctx("GPU_POOL of another GPU")?;
        check!(
            q != p0 && q != 0,
            "GPU {g2}'s default pool is {q}, GPU {g}'s is {p0}"
        );
    }
    let other = Ruvm::open().ctx("open")?;
    let theirs = other.gpu_pool_get(g).ctx("GPU_POOL in another file")?;
    check!(
        theirs != p0,
        "another file's default pool for GPU {g} is this file's ({p0})"
    );
    expect_errno(
        d.pool_get(theirs),
        Errno::ENOENT,
        "POOL_GET of another file's default pool",
    )?;
    for h in [m0, m2] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drained(&d, "at the end")
}

// --- teardown ------------------------------------------------------------------------------

/// On a new file: a pool mapped for `g` and GPU `g`'s default pool, a stream held by `gate`
/// with ALLOCs and FREEs of both queued behind it (and a FREE of a mem allocated before it, and
/// of a plain mem), then a RECORD: the file, the stream, and the record's point exported.
pub(super) fn queue_frees(g: u32, gate: &Gate) -> Result<(Ruvm, u64, OwnedFd), String> {
    let e = |what: &str, err: Errno| format!("{what}: {err}");
    let f = Ruvm::open().map_err(|x| x.to_string())?;
    let (p, _) = f
        .pool_create(SIZE, u64::MAX)
        .map_err(|x| e("POOL_CREATE", x))?;
    f.pool_access(p, g, true)
        .map_err(|x| e("POOL_SET_ACCESS", x))?;
    let s = f
        .stream_create(g)
        .map_err(|x| e("STREAM_CREATE", x))?
        .handle;
    let mut first = [op::alloc(p, SIZE, false)];
    f.stream_submit_mut(s, &mut first)
        .map_err(|x| e("STREAM_SUBMIT of an ALLOC", x))?;
    let (early, _) = op::allocated(&first[0]);
    let plain = f
        .mem_alloc(SIZE, 0, 0)
        .map_err(|x| e("MEM_ALLOC", x))?
        .handle;
    let ev = f.event_create().map_err(|x| e("EVENT_CREATE", x))?;
    let ops = [
        gate.wait(),
        op::free(early),
        op::free(plain),
        op::alloc(p, SIZE, true),
        op::free_index(3),
        op::alloc(0, SIZE, false),
        op::free_index(5),
        op::alloc(p, M, false),
        op::free_index(7),
        op::record(ev),
    ];
    f.stream_submit(s, &ops)
        .map_err(|x| e("STREAM_SUBMIT of the held ALLOCs and FREEs", x))?;
    let fd = f.event_export(ev).map_err(|x| e("EVENT_EXPORT", x))?;
    Ok((f, s, fd))
}

/// A file closed with ALLOCs and FREEs queued behind a gate: its point signals ECANCELED, and
/// the audit (pending chunks, stream operations, mems, pools) goes back to where it was.
pub(super) fn salloc_teardown_close() -> TestResult {
    let (d, g) = setup()?;
    let gate = Gate::new()?;
    let before = live(&d)?;
    let (f, _, fd) = queue_frees(g, &gate).map_err(Stop::Fail)?;
    let l = live(&d)?;
    check!(
        l[POOL_PENDING] > before[POOL_PENDING] && l[STREAM_OPS] > before[STREAM_OPS],
        "with frees queued behind the gate: pool_pending {} (was {}), stream_ops {} (was {})",
        l[POOL_PENDING],
        before[POOL_PENDING],
        l[STREAM_OPS],
        before[STREAM_OPS]
    );
    drop(f);
    let info = signalled(&fd, "the record after the frees")?;
    check!(
        errno_of(info.status) == Some(Errno::ECANCELED),
        "the record signalled with {}, wanted -ECANCELED",
        info.status
    );
    settled(&d, &before, "once the file closed")
}

/// The same in a child process killed by SIGKILL.
pub(super) fn salloc_teardown_kill() -> TestResult {
    let (d, g) = setup()?;
    let gate = Gate::new()?;
    let before = live(&d)?;
    let (r, w) = pipe2(OFlag::O_CLOEXEC).ctx("pipe2")?;
    // SAFETY: the runner is single-threaded when cases run; the child makes syscalls, writes
    // one byte and sleeps until killed.
    let child = match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            drop(r);
            let code = match queue_frees(g, &gate) {
                Ok(_held) => match nix::unistd::write(&w, &[1]) {
                    Ok(1) => loop {
                        std::thread::sleep(Duration::from_secs(3600));
                    },
                    _ => 3,
                },
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
    let mut byte = [0u8; 1];
    let ready = loop {
        match nix::unistd::read(&r, &mut byte) {
            Err(Errno::EINTR) => continue,
            other => break other,
        }
    };
    let held = match ready {
        Ok(1) => live(&d).map(|l| l[POOL_PENDING]),
        other => Err(Stop::Fail(format!(
            "the child did not queue its work ({other:?}; its stderr says why)"
        ))),
    };
    let _ = kill(child, Signal::SIGKILL);
    let status = waitpid(child, None).ctx("waitpid")?;
    let pending = held?;
    check!(
        matches!(status, WaitStatus::Signaled(_, Signal::SIGKILL, _)),
        "the child ended {status:?}, not by the SIGKILL"
    );
    check!(
        pending > before[POOL_PENDING],
        "the child's frees behind the gate left pool_pending at {pending} (was {})",
        before[POOL_PENDING]
    );
    settled(&d, &before, "once the child was killed")?;
    drop(gate);
    Ok(())
}

/// The GPU of a stream with ALLOCs and FREEs queued behind a gate is removed: the stream's
/// point signals ENODEV; a synchronize (EIO: the stream is in error) observes its frees, and
/// once the file closes and the GPU is back nothing is left.
pub(super) fn salloc_teardown_gpu_removal() -> TestResult {
    let (d, g) = setup()?;
    if d.info().ctx("INFO")?.test_ioctls == 0 {
        return Err(Stop::Skip("needs enable_test_ioctls=1".into()));
    }
    let gate = Gate::new()?;
    let before = live(&d)?;
    let (f, s, fd) = queue_frees(g, &gate).map_err(Stop::Fail)?;
    check!(
        live(&d)?[POOL_PENDING] > before[POOL_PENDING],
        "no chunk pending with the frees queued behind the gate"
    );
    let back = BringBack(&d, g);
    remove_gpu(g)?;
    let info = signalled(&fd, "the record after the frees")?;
    check!(
        errno_of(info.status) == Some(Errno::ENODEV),
        "the record signalled with {} after its GPU went, wanted -ENODEV",
        info.status
    );
    expect_errno(
        f.sync_every_stream(WAIT_MS),
        Errno::EIO,
        "STREAM_SYNC of every stream after the GPU went",
    )?;
    let q = f.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.error == Errno::ENODEV as u32 && q.completed == q.submitted,
        "the stream after its GPU went: {q:?}"
    );
    check!(
        live(&d)?[POOL_PENDING] == before[POOL_PENDING],
        "the synchronize after the removal left pool_pending at {}",
        live(&d)?[POOL_PENDING]
    );
    drop(f);
    drop(back);
    check!(
        d.gpus()
            .ctx("GPU_LIST")?
            .iter()
            .any(|x| x.id == g && x.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0),
        "GPU {g} did not come back"
    );
    drop(gate);
    settled(&d, &before, "once the file closed and the GPU came back")
}

// --- a synchronous free of a reused mem -----------------------------------------------------

/// m2 takes m1's chunk on stream S (S held before m1's free), then MEM_FREE(m2) while S is
/// still held: the chunk must not reach another stream B (every policy on) before S reaches
/// m1's free. Once S runs and everything is synchronized, nothing is left.
pub(super) fn salloc_sync_memfree_waits_safe() -> TestResult {
    let (d, g) = setup()?;
    let mut gate = Gate::new()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE S")?.handle;
    let b = d.stream_create(g).ctx("STREAM_CREATE B")?.handle;
    let m1 = alloc_on(&d, s, p, SIZE, "m1")?;
    let a1 = chunks(&d, m1, g, "m1")?;
    let (first, _) = submit(&d, s, vec![gate.wait(), op::free(m1)], "S's FREE m1")?;
    engine_on(&d, s, first, "S's gate")?;
    let m2 = alloc_on(&d, s, p, SIZE, "m2")?;
    let a2 = chunks(&d, m2, g, "m2")?;
    expect_reuse(&a2, &a1, true, "m2 on S")?;
    d.mem_free(m2).ctx("MEM_FREE m2, S held")?;
    let m3 = alloc_on(&d, b, p, SIZE, "m3 on B")?;
    let a3 = chunks(&d, m3, g, "m3")?;
    expect_reuse(
        &a3,
        &a1,
        false,
        "B's ALLOC after MEM_FREE of the reused m2, S not at m1's free",
    )?;
    not_reached(&d, s, first + 1, "S")?;
    gate.release()?;
    d.sync_every_stream(WAIT_MS)
        .ctx("STREAM_SYNC of every stream")?;
    d.mem_free(m3).ctx("MEM_FREE m3")?;
    let end = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        end.pending_bytes == 0 && end.used_current == 0,
        "after everything was synchronized and freed: {end:?}"
    );
    for x in [s, b] {
        d.stream_destroy(x).ctx("STREAM_DESTROY")?;
    }
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
}
