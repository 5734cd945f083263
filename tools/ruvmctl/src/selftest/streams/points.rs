// SPDX-License-Identifier: GPL-2.0

//! The fences of a stream's points not reached yet, made on demand (an event's export, a
//! wait): kept by seqno however they are asked for, one a point, signalled in seqno order. And
//! the marks (records, waits already met) that cost no operation of their own: reached no
//! earlier and no later than the stream's order says.

use std::os::fd::AsFd;

use super::{drained, engine_on, exported, setup, signalled, sw_sync_or_none, WAIT_MS};
use crate::selftest::harness::{check, Context, Stop, TestResult};
use libruvm::op;

/// How many points [`stream_point_fences_made_out_of_order`] makes fences for.
const POINTS: usize = 200;

/// Fences made for a stream's points out of order (the odd ones last first, then the even ones)
/// while the stream is held are each its own point's, shared when asked again, and signal in
/// seqno order once it goes on: the pending points are kept by seqno however they were asked
/// for.
pub(super) fn stream_point_fences_made_out_of_order() -> TestResult {
    let (d, g) = setup()?;
    let Some(tl) = sw_sync_or_none()? else {
        return Err(Stop::Skip("no sw_sync".into()));
    };
    let gate = tl.create_fence(1, "gate").ctx("CREATE_FENCE")?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let mut events = Vec::with_capacity(POINTS);
    for _ in 0..POINTS {
        events.push(d.event_create().ctx("EVENT_CREATE")?);
    }
    let mut ops = vec![op::wait_fd(gate.as_fd(), WAIT_MS)];
    ops.extend(events.iter().map(|&e| op::record(e)));
    let first = d.stream_submit(s, &ops).ctx("STREAM_SUBMIT")?;
    engine_on(&d, s, first, "the gate")?;
    // The odd points last first, then the even ones first first.
    let order: Vec<usize> = (0..POINTS)
        .rev()
        .filter(|i| i % 2 == 1)
        .chain((0..POINTS).filter(|i| i % 2 == 0))
        .collect();
    let mut files: Vec<Option<std::os::fd::OwnedFd>> = (0..POINTS).map(|_| None).collect();
    for &i in &order {
        let (f, info) = exported(&d, events[i], "a pending point")?;
        check!(
            info.status == 0,
            "point {i} signalled before the gate opened: {info:?}"
        );
        files[i] = Some(f);
    }
    // Asked again: the same fence (its seqno), still pending.
    let (again, info) = exported(&d, events[POINTS / 2], "a point asked again")?;
    check!(
        info.status == 0,
        "a point asked again signalled early: {info:?}"
    );
    tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    let mut last = 0u64;
    for (i, f) in files.iter().enumerate() {
        let f = f
            .as_ref()
            .ok_or_else(|| Stop::Fail(format!("point {i} was never asked for")))?;
        let info = signalled(f, "a point once the gate opened")?;
        check!(
            info.status == 1 && info.timestamp_ns >= last,
            "point {i} (seqno {}): {info:?}, wanted signalled without error, not before point {} ({last} ns)",
            first + 1 + i as u64,
            i.saturating_sub(1)
        );
        last = info.timestamp_ns;
    }
    let a = signalled(&again, "the point asked again")?;
    check!(
        a.status == 1,
        "the point asked again: {a:?}, wanted signalled without error"
    );
    for e in events {
        d.event_destroy(e).ctx("EVENT_DESTROY")?;
    }
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drained(&d, "at the end")
}

/// Marks a submission leads with, or is made of: on an idle stream a submission of marks only
/// is reached by the time the call returns, and so is a wait of another stream for a point
/// already reached (no fence, no runner), its fence made or not; on a busy stream the same marks wait for the work
/// before them; and marks that lead a submission are reached before what follows them, not
/// with it (a wait held after them does not hold them: two streams waiting for each other's
/// later points go on).
pub(super) fn stream_marks_reached_in_order() -> TestResult {
    let (d, g) = setup()?;
    let Some(tl) = sw_sync_or_none()? else {
        return Err(Stop::Skip("no sw_sync".into()));
    };
    let gate = tl.create_fence(1, "gate").ctx("CREATE_FENCE")?;
    let mut ev = Vec::new();
    for _ in 0..5 {
        ev.push(d.event_create().ctx("EVENT_CREATE")?);
    }
    let status = |e: u64| -> Result<i32, Stop> { Ok(d.event_query(e).ctx("EVENT_QUERY")?.status) };
    let (idle, waiter, busy, other) = (
        d.stream_create(g).ctx("STREAM_CREATE")?.handle,
        d.stream_create(g).ctx("STREAM_CREATE")?.handle,
        d.stream_create(g).ctx("STREAM_CREATE")?.handle,
        d.stream_create(g).ctx("STREAM_CREATE")?.handle,
    );
    // A submission that must be reached by the time the call returns.
    let at_once = |s: u64, ops: &[libruvm::uapi::ruvm_op], what: &str| -> TestResult {
        let at = d.stream_submit(s, ops).ctx("STREAM_SUBMIT")?;
        let q = d.stream_query(s).ctx("STREAM_QUERY")?;
        check!(
            q.completed == at,
            "{what}: {q:?}, wanted seqno {at} reached at once"
        );
        Ok(())
    };
    // Marks only, an idle stream.
    at_once(idle, &[op::record(ev[0])], "a record on an idle stream")?;
    let got = status(ev[0])?;
    check!(got == 1, "a record on an idle stream: event status {got}");
    // Another stream's wait for that point, already reached.
    let wait = [op::wait_event(ev[0], WAIT_MS)];
    at_once(waiter, &wait, "a wait for a point already reached")?;
    // The same once the point's fence was made (a synchronize of the event makes it): a fence
    // that signalled without error is the point reached.
    d.event_sync(ev[0], WAIT_MS).ctx("EVENT_SYNC")?;
    at_once(waiter, &wait, "a wait for a point reached, its fence made")?;
    // A busy stream: the same marks wait for the gate.
    let held = d
        .stream_submit(busy, &[op::wait_fd(gate.as_fd(), WAIT_MS)])
        .ctx("STREAM_SUBMIT")?;
    engine_on(&d, busy, held, "the gate")?;
    d.stream_submit(busy, &[op::record(ev[1])])
        .ctx("STREAM_SUBMIT")?;
    // Leading marks before a wait the gate holds: reached before it.
    let after = d
        .stream_submit(
            other,
            &[
                op::record(ev[2]),
                op::wait_event(ev[1], WAIT_MS),
                op::record(ev[3]),
            ],
        )
        .ctx("STREAM_SUBMIT")?;
    engine_on(
        &d,
        other,
        after + 1,
        "the wait for the busy stream's record",
    )?;
    for (e, want, what) in [
        (ev[1], 0, "a record behind the gate"),
        (
            ev[2],
            1,
            "a record that leads a submission, before a held wait",
        ),
        (ev[3], 0, "a record after a held wait"),
    ] {
        let got = status(e)?;
        check!(got == want, "{what}: status {got}, wanted {want}");
    }
    // The busy stream waits for the other's leading record: nothing waits for itself.
    d.stream_submit(busy, &[op::wait_event(ev[2], WAIT_MS), op::record(ev[4])])
        .ctx("STREAM_SUBMIT")?;
    tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
    for s in [idle, waiter, busy, other] {
        d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    }
    for (i, &e) in ev.iter().enumerate() {
        let got = status(e)?;
        check!(got == 1, "event {i} once every stream synced: status {got}");
    }
    for e in ev {
        d.event_destroy(e).ctx("EVENT_DESTROY")?;
    }
    for s in [idle, waiter, busy, other] {
        d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    }
    drained(&d, "at the end")
}
