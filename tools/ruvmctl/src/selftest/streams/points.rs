// SPDX-License-Identifier: GPL-2.0

//! The fences of a stream's points not reached yet, made on demand (an event's export, a
//! wait): kept by seqno however they are asked for, one a point, signalled in seqno order.

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
