// SPDX-License-Identifier: GPL-2.0

//! Errors: a wait's timeout and an engine fault, each sticky on its stream.

use super::*;

// --- errors ----------------------------------------------------------------------------------

/// A wait that times out fails its stream with ETIMEDOUT for good: the record after it
/// signals that error (EVENT_QUERY's status; EVENT_SYNC of it is EIO), submits and syncs are
/// EIO. A wait on a fence that signalled with an error (a sw_sync timeline closed: ENOENT; an
/// event that failed) fails with that error.
pub(super) fn stream_wait_timeout_is_sticky() -> TestResult {
    let (d, g) = setup()?;
    let tl = sw_sync()?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let fence = tl.create_fence(1, "never").ctx("CREATE_FENCE")?;
    let t = Instant::now();
    let first = d
        .stream_submit(s, &[op::wait_fd(fence.as_fd(), 100), op::record(e)])
        .ctx("STREAM_SUBMIT")?;
    expect_errno(
        d.stream_sync(s, 5000),
        Errno::EIO,
        "STREAM_SYNC after a wait timed out",
    )?;
    let took = t.elapsed();
    check!(
        took >= Duration::from_millis(95),
        "the 100 ms wait failed after {took:?}"
    );
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.error == Errno::ETIMEDOUT as u32
            && q.failed_seqno == first
            && q.submitted == first + 1
            && q.completed == first + 1
            && q.current_seqno == 0,
        "{q:?}: wanted error ETIMEDOUT at seqno {first}, both operations retired, the engine on nothing"
    );
    let info = settled(&d, e, "e")?;
    check!(
        errno_of(info.status) == Some(Errno::ETIMEDOUT),
        "the exported record: status {}, wanted -ETIMEDOUT",
        info.status
    );
    let qe = d.event_query(e).ctx("EVENT_QUERY")?;
    check!(
        qe.status == -(Errno::ETIMEDOUT as i32) && qe.stream == s && qe.seqno == first + 1,
        "the record after the failed wait: {qe:?}"
    );
    // EVENT_SYNC says EIO for a point that signalled with an error (ETIMEDOUT is only its
    // own timeout); EVENT_QUERY's status said which error.
    expect_errno(
        d.event_sync(e, 1000),
        Errno::EIO,
        "EVENT_SYNC of a point that failed with ETIMEDOUT",
    )?;
    let e2 = d.event_create().ctx("EVENT_CREATE")?;
    expect_errno(
        d.stream_submit(s, &[op::record(e2)]),
        Errno::EIO,
        "a submit to a stream in error",
    )?;
    expect_errno(d.stream_sync(s, 1000), Errno::EIO, "a second STREAM_SYNC")?;
    expect_errno(d.sync_every_stream(1000), Errno::EIO, "STREAM_SYNC of all")?;
    let q2 = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q2.submitted == q.submitted && q2.error == q.error && q2.failed_seqno == q.failed_seqno,
        "the refused submit changed the stream: {q2:?}"
    );
    check!(
        d.event_query(e2).ctx("EVENT_QUERY")?.stream == 0,
        "the refused submit recorded its event"
    );
    // The fence signalling later changes nothing.
    tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
    expect_errno(
        d.stream_sync(s, 1000),
        Errno::EIO,
        "STREAM_SYNC after the fence",
    )?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;

    // Waits on fences that failed: ENOENT (a sw_sync timeline closed with the fence pending),
    // and e's ETIMEDOUT through WAIT_EVENT.
    let tl2 = SwSyncTimeline::open().ctx("sw_sync")?;
    let orphan = tl2.create_fence(1, "orphan").ctx("CREATE_FENCE")?;
    drop(tl2);
    check!(
        errno_of(fence_of(&orphan, "the orphan")?.status) == Some(Errno::ENOENT),
        "a sw_sync fence of a closed timeline is not -ENOENT"
    );
    for (wait, want, what) in [
        (
            op::wait_fd(orphan.as_fd(), WAIT_MS),
            Errno::ENOENT,
            "WAIT_FD",
        ),
        (op::wait_event(e, WAIT_MS), Errno::ETIMEDOUT, "WAIT_EVENT"),
    ] {
        let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
        let r = d.event_create().ctx("EVENT_CREATE")?;
        let first = d
            .stream_submit(s, &[wait, op::record(r)])
            .ctx("STREAM_SUBMIT")?;
        expect_errno(
            d.stream_sync(s, 5000),
            Errno::EIO,
            &format!("{what} on a failed fence"),
        )?;
        let q = d.stream_query(s).ctx("STREAM_QUERY")?;
        check!(
            q.error == want as u32 && q.failed_seqno == first,
            "{what} on a fence that failed with {want}: {q:?}"
        );
        check!(
            errno_of(settled(&d, r, "the record")?.status) == Some(want),
            "{what}: the record after it did not fail with {want}"
        );
        expect_errno(
            d.event_sync(r, 1000),
            Errno::EIO,
            &format!("EVENT_SYNC of the record after {what}"),
        )?;
        d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    }
    drained(&d, "after the failed waits")
}

/// An MMU fault (COPY_VA at an unmapped user VA) fails the stream with EFAULT: the copy before
/// it ran, the FILL after it did not; the records after it signal -EFAULT (EVENT_SYNC: EIO),
/// the one before it without an error (EVENT_SYNC: 0).
pub(super) fn stream_fault_is_sticky() -> TestResult {
    let (d, g) = setup()?;
    need_mmu(&d, g)?;
    let size = 256 * K;
    let a = d.mem_alloc(size, 64 * K, 0).ctx("MEM_ALLOC")?.handle;
    let b = d.mem_alloc(size, 64 * K, 0).ctx("MEM_ALLOC")?.handle;
    d.map_kernel(b).ctx("MAP_CPU_KERNEL")?;
    user_fill(&d, a, size, 41)?;
    d.map_gpu_user(a, g, USER_VA, false).ctx("MAP_GPU_USER A")?;
    d.map_gpu_user(b, g, USER_VA + M, false)
        .ctx("MAP_GPU_USER B")?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let e: Vec<u64> = (0..3)
        .map(|_| d.event_create())
        .collect::<Result<_, _>>()
        .ctx("EVENT_CREATE")?;
    let unmapped = USER_VA + 64 * M;
    let first = d
        .stream_submit(
            s,
            &[
                op::copy_va(USER_VA + M, USER_VA, size, true),
                op::record(e[0]),
                op::copy_va(USER_VA + M, unmapped, 4 * K, true),
                op::record(e[1]),
                op::fill_byte(b, 0, size, 0x77),
                op::record(e[2]),
            ],
        )
        .ctx("STREAM_SUBMIT")?;
    expect_errno(
        d.stream_sync(s, WAIT_MS),
        Errno::EIO,
        "STREAM_SYNC after a fault",
    )?;
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.error == Errno::EFAULT as u32 && q.failed_seqno == first + 2 && q.completed == first + 5,
        "{q:?}: wanted EFAULT at seqno {}, everything retired",
        first + 2
    );
    let statuses: Vec<i32> = e
        .iter()
        .map(|&x| settled(&d, x, "a record").map(|f| f.status))
        .collect::<Result<_, _>>()?;
    let ef = -(Errno::EFAULT as i32);
    check!(
        statuses == [1, ef, ef],
        "record statuses {statuses:?}, wanted [1, {ef}, {ef}]"
    );
    d.event_sync(e[0], 1000)
        .ctx("EVENT_SYNC of the record before the fault")?;
    for (i, &x) in e.iter().enumerate().skip(1) {
        expect_errno(
            d.event_sync(x, 1000),
            Errno::EIO,
            &format!("EVENT_SYNC of record {i}, after the fault"),
        )?;
    }
    // The copy before the fault is there, the FILL after it is not (A was written through
    // the user mapping, B is read through the kernel's).
    let bad = mismatches(&d, b, size, 41)?;
    check!(
        bad == 0,
        "B: {bad} bytes are not A's: the copy before the fault did not run, or the FILL after it did"
    );
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    for h in [a, b] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    drained(&d, "after the fault")
}
