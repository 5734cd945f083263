// SPDX-License-Identifier: GPL-2.0

//! `stream_bad_inputs`' refusals of the stream and event objects themselves: STREAM_CREATE
//! (and the per-file limits of streams and events), STREAM_SYNC, STREAM_QUERY, STREAM_DESTROY
//! and the event commands. The submission's refusals are the parent's.

use std::os::fd::OwnedFd;

use super::*;

/// STREAM_CREATE's refusals (no GPU, an unbound one, one without a copy engine, flags and
/// reserved fields) and the per-file limits of streams and events, on GPU `g`.
pub(super) fn create_refusals(d: &Ruvm, gpus: &[uapi::ruvm_gpu_info], g: u32) -> TestResult {
    let present = |x: &uapi::ruvm_gpu_info| x.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0;
    let engine = |x: &uapi::ruvm_gpu_info| {
        present(x) && x.flags & uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE != 0
    };
    // STREAM_CREATE.
    let absent = (0..uapi::RUVM_MAX_GPUS)
        .find(|id| !gpus.iter().any(|x| x.id == *id))
        .unwrap_or(u32::MAX);
    expect_errno(
        d.stream_create(absent),
        Errno::ENODEV,
        "STREAM_CREATE on no GPU",
    )?;
    for x in gpus.iter().filter(|x| !present(x)) {
        expect_errno(
            d.stream_create(x.id),
            Errno::ENODEV,
            &format!("STREAM_CREATE on unbound GPU {}", x.id),
        )?;
    }
    for x in gpus.iter().filter(|x| present(x) && !engine(x)) {
        expect_errno(
            d.stream_create(x.id),
            Errno::EOPNOTSUPP,
            &format!("STREAM_CREATE on GPU {} (no copy engine)", x.id),
        )?;
    }
    for (what, f) in [
        (
            "flags",
            (|c| c.flags = 1) as fn(&mut uapi::ruvm_stream_create),
        ),
        ("reserved[0]", |c| c.reserved[0] = 1),
        ("reserved[1]", |c| c.reserved[1] = 1),
    ] {
        let mut c = uapi::ruvm_stream_create {
            gpu: g,
            ..Default::default()
        };
        f(&mut c);
        expect_errno(
            d.call(cmd::STREAM_CREATE, &mut c),
            Errno::EINVAL,
            &format!("STREAM_CREATE with {what}"),
        )?;
    }
    {
        // RUVM_MAX_FILE_STREAMS per file, then ENOSPC; a destroy makes room.
        let f = Ruvm::open().ctx("open")?;
        let mut v = Vec::new();
        for i in 0..uapi::RUVM_MAX_FILE_STREAMS {
            v.push(
                f.stream_create(g)
                    .ctx(&format!("STREAM_CREATE {}", i + 1))?
                    .handle,
            );
        }
        let mut sorted = v.clone();
        sorted.sort_unstable();
        sorted.dedup();
        check!(
            sorted.len() == v.len() && !v.contains(&0),
            "stream handles {v:?}"
        );
        expect_errno(
            f.stream_create(g),
            Errno::ENOSPC,
            "STREAM_CREATE beyond RUVM_MAX_FILE_STREAMS",
        )?;
        f.stream_destroy(v[7]).ctx("STREAM_DESTROY")?;
        f.stream_create(g).ctx("STREAM_CREATE after a destroy")?;
        // RUVM_MAX_FILE_EVENTS per file, then ENOSPC.
        for i in 0..uapi::RUVM_MAX_FILE_EVENTS {
            f.event_create().ctx(&format!("EVENT_CREATE {}", i + 1))?;
        }
        expect_errno(
            f.event_create(),
            Errno::ENOSPC,
            "EVENT_CREATE beyond RUVM_MAX_FILE_EVENTS",
        )?;
    }
    Ok(())
}

/// STREAM_SYNC's, STREAM_QUERY's and STREAM_DESTROY's refusals, on a new stream of GPU `g`,
/// which is returned (alive).
pub(super) fn sync_query_destroy_refusals(d: &Ruvm, g: u32) -> Result<u64, Stop> {
    // STREAM_SYNC, STREAM_QUERY, STREAM_DESTROY.
    let s2 = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    for (what, handle, flags, timeout, want) in [
        ("timeout 0", s2, 0, 0, Errno::EINVAL),
        (
            "timeout RUVM_WAIT_MAX_MS + 1",
            s2,
            0,
            uapi::RUVM_WAIT_MAX_MS + 1,
            Errno::EINVAL,
        ),
        (
            "RUVM_SYNC_EVERY_STREAM with a handle",
            s2,
            uapi::ruvm_sync_flags_RUVM_SYNC_EVERY_STREAM,
            1,
            Errno::EINVAL,
        ),
        ("flags bit 1", s2, 2, 1, Errno::EINVAL),
        ("no stream", 0xdead_beef, 0, 1, Errno::ENOENT),
        ("stream 0", 0, 0, 1, Errno::ENOENT),
    ] {
        let mut a = uapi::ruvm_stream_sync {
            handle,
            flags,
            timeout_ms: timeout,
            ..Default::default()
        };
        expect_errno(
            d.call(cmd::STREAM_SYNC, &mut a),
            want,
            &format!("STREAM_SYNC with {what}"),
        )?;
    }
    d.stream_sync(s2, 1).ctx("STREAM_SYNC of an empty stream")?;
    expect_errno(
        d.stream_query(0xdead_beef),
        Errno::ENOENT,
        "STREAM_QUERY of no stream",
    )?;
    expect_errno(
        d.stream_destroy(0xdead_beef),
        Errno::ENOENT,
        "STREAM_DESTROY of no stream",
    )?;
    let mut h = uapi::ruvm_stream_handle {
        handle: s2,
        pad: 1,
        ..Default::default()
    };
    expect_errno(
        d.call(cmd::STREAM_DESTROY, &mut h),
        Errno::EINVAL,
        "STREAM_DESTROY with pad",
    )?;
    d.stream_query(s2)
        .ctx("the stream after a refused destroy")?;
    Ok(s2)
}

/// The event commands' refusals; `e` (recorded by the parent's valid submits) is destroyed,
/// `done` (never recorded, exported as `sig`) stays; `s2` is a stream to submit to.
pub(super) fn event_refusals(d: &Ruvm, e: u64, done: u64, sig: &OwnedFd, s2: u64) -> TestResult {
    // Events.
    let none = 0xdead_beef;
    expect_errno(
        d.event_destroy(none),
        Errno::ENOENT,
        "EVENT_DESTROY of no event",
    )?;
    expect_errno(
        d.event_query(none),
        Errno::ENOENT,
        "EVENT_QUERY of no event",
    )?;
    expect_errno(
        d.event_sync(none, 1),
        Errno::ENOENT,
        "EVENT_SYNC of no event",
    )?;
    expect_errno(
        d.event_export(none),
        Errno::ENOENT,
        "EVENT_EXPORT of no event",
    )?;
    expect_errno(
        d.event_sync(e, 0),
        Errno::EINVAL,
        "EVENT_SYNC with timeout 0",
    )?;
    expect_errno(
        d.event_sync(e, uapi::RUVM_WAIT_MAX_MS + 1),
        Errno::EINVAL,
        "EVENT_SYNC with timeout RUVM_WAIT_MAX_MS + 1",
    )?;
    for (what, c) in [
        ("EVENT_CREATE", cmd::EVENT_CREATE),
        ("EVENT_QUERY", cmd::EVENT_QUERY),
        ("EVENT_EXPORT", cmd::EVENT_EXPORT),
        ("EVENT_DESTROY", cmd::EVENT_DESTROY),
    ] {
        let mut a = uapi::ruvm_event {
            handle: if c.nr == cmd::EVENT_CREATE.nr { 0 } else { e },
            timeout_ms: 1,
            ..Default::default()
        };
        expect_errno(
            d.call(c, &mut a),
            Errno::EINVAL,
            &format!("{what} with a timeout"),
        )?;
    }
    // A never-recorded event is complete: it syncs, and exports a signalled fence.
    d.event_sync(done, 1)
        .ctx("EVENT_SYNC of an event never recorded")?;
    check!(
        fence_of(&sig, "a never-recorded event")?.status == 1,
        "a never-recorded event exports a pending fence"
    );
    // Destroyed: its handle is gone, what it exported lives on.
    let (kept, _) = exported(d, e, "e")?;
    d.event_destroy(e).ctx("EVENT_DESTROY")?;
    expect_errno(d.event_query(e), Errno::ENOENT, "EVENT_QUERY after destroy")?;
    expect_errno(d.event_destroy(e), Errno::ENOENT, "EVENT_DESTROY twice")?;
    expect_errno(
        d.stream_submit(s2, &[op::record(e)]),
        Errno::ENOENT,
        "a record of a destroyed event",
    )?;
    check!(
        signalled(&kept, "a destroyed event's point")?.status == 1,
        "a destroyed event's exported point did not signal without an error"
    );
    Ok(())
}
