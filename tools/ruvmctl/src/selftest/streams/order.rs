// SPDX-License-Identifier: GPL-2.0

//! Order, overlap and waits: a chain of copies in order, two GPUs' streams at once, waits for
//! another stream's event and for a sw_sync fence.

use super::*;

// --- order, overlap, waits -------------------------------------------------------------------

/// COPY A->B, RECORD e1, COPY B->C, RECORD e2, COPY C->D, RECORD e3 in one submit: D ends as
/// A (each copy read what the one before wrote), and the three fences signalled in order, at
/// times between the submit and now, every one already when STREAM_SYNC returned.
pub(super) fn stream_copy_chain_in_order() -> TestResult {
    let (d, g) = setup()?;
    // An odd size over 64 KiB chunks: the engine's 2 MiB pieces cross chunks.
    let size = 3 * M + 5 * K + 17;
    let seed = 0x5eed_c0de;
    let a = mem_of(&d, g, size, 64 * K, Some(1))?;
    user_fill(&d, a, size, seed)?;
    let b = mem_of(&d, g, size, 64 * K, Some(2))?;
    let c = mem_of(&d, g, size, 64 * K, Some(3))?;
    let dd = mem_of(&d, g, size, 64 * K, Some(4))?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?;
    check!(s.handle != 0, "stream handle 0");
    let e: Vec<u64> = (0..3)
        .map(|_| d.event_create())
        .collect::<Result<_, _>>()
        .ctx("EVENT_CREATE")?;
    let before = monotonic_ns();
    let first = d
        .stream_submit(
            s.handle,
            &[
                op::copy(b, 0, a, 0, size),
                op::record(e[0]),
                op::copy(c, 0, b, 0, size),
                op::record(e[1]),
                op::copy(dd, 0, c, 0, size),
                op::record(e[2]),
            ],
        )
        .ctx("STREAM_SUBMIT")?;
    check!(first >= 1, "first seqno {first}");
    d.stream_sync(s.handle, WAIT_MS).ctx("STREAM_SYNC")?;
    let after = monotonic_ns();
    let q = d.stream_query(s.handle).ctx("STREAM_QUERY")?;
    check!(
        q.gpu == g
            && q.submitted == first + 5
            && q.completed == first + 5
            && q.error == 0
            && q.current_seqno == 0
            && q.current_len == 0,
        "after the sync: {q:?}, wanted gpu {g}, submitted = completed = {}, no error, none running",
        first + 5
    );
    for (h, name) in [(b, "B"), (c, "C"), (dd, "D")] {
        let bad = mismatches(&d, h, size, seed)?;
        check!(bad == 0, "{name}: {bad} bytes are not A's");
    }
    // STREAM_SYNC returned: every operation is retired, and the module signals a record's
    // fence before it counts the record retired, so every one has signalled (checked at once,
    // not polled).
    let mut times = Vec::new();
    for (i, &ev) in e.iter().enumerate() {
        let qe = d.event_query(ev).ctx("EVENT_QUERY")?;
        let seqno = first + 1 + 2 * i as u64;
        check!(
            qe.status == 1 && qe.stream == s.handle && qe.seqno == seqno,
            "e{}: {qe:?}, wanted status 1 on stream {} seqno {seqno}",
            i + 1,
            s.handle
        );
        let (_f, info) = exported(&d, ev, &format!("e{}", i + 1))?;
        check!(info.status == 1, "e{}: status {}", i + 1, info.status);
        d.event_sync(ev, 1)
            .ctx(&format!("EVENT_SYNC of e{}, signalled", i + 1))?;
        times.push(info.timestamp_ns);
    }
    check!(
        before <= times[0] && times[0] <= times[1] && times[1] <= times[2] && times[2] <= after,
        "signal times {times:?} are not in order between the submit ({before}) and the sync's return ({after})"
    );
    check!(
        times[0] < times[2],
        "e1 and e3 signalled at the same ns ({}) with two copies between",
        times[0]
    );
    d.stream_destroy(s.handle).ctx("STREAM_DESTROY")?;
    for h in [a, b, c, dd] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    drained(&d, "after the chain")
}

/// One stream on each of two simulated GPUs, 32 MiB each: their copies run at the same time
/// (each one's [start, end] overlaps the other's), and both are right.
pub(super) fn stream_two_gpus_overlap() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    need_streams(&d)?;
    let gpus = sim_gpus(&d)?;
    let [g1, g2] = match gpus.as_slice() {
        [a, b, ..] => [a.id, b.id],
        _ => return Err(Stop::Skip("needs two simulated GPUs (sim_gpus=2)".into())),
    };
    let size = 32 * M;
    let gate = sw_sync_or_none()?;
    let mut last = String::new();
    // The workers may be late to start on a busy host: three tries before calling the
    // streams serialised.
    for attempt in 1..=3 {
        let mut runs = Vec::new();
        for (i, g) in [g1, g2].into_iter().enumerate() {
            let seed = 0x1000 * (attempt + 1) + i as u64;
            let src = mem_on(&d, g, size, Some(seed))?;
            let dst = mem_on(&d, g, size, None)?;
            let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
            let start = d.event_create().ctx("EVENT_CREATE")?;
            let end = d.event_create().ctx("EVENT_CREATE")?;
            runs.push((g, seed, src, dst, s, start, end));
        }
        // With sw_sync both streams start on one fence; without, one after the other.
        let fence = match &gate {
            Some(t) => Some(
                t.create_fence(attempt as u32, "start")
                    .ctx("CREATE_FENCE")?,
            ),
            None => None,
        };
        for &(_, _, src, dst, s, start, end) in &runs {
            let mut ops = Vec::new();
            if let Some(f) = &fence {
                ops.push(op::wait_fd(f.as_fd(), WAIT_MS));
            }
            ops.extend([
                op::record(start),
                op::copy(dst, 0, src, 0, size),
                op::record(end),
            ]);
            d.stream_submit(s, &ops).ctx("STREAM_SUBMIT")?;
        }
        if let Some(t) = &gate {
            t.inc(1).ctx("SW_SYNC_IOC_INC")?;
        }
        d.sync_every_stream(60_000)
            .ctx("STREAM_SYNC of every stream")?;
        let mut spans = Vec::new();
        for &(g, seed, src, dst, s, start, end) in &runs {
            let t0 = settled(&d, start, "start")?;
            let t1 = settled(&d, end, "end")?;
            check!(
                t0.status == 1 && t1.status == 1 && t0.timestamp_ns <= t1.timestamp_ns,
                "GPU {g}: start {t0:?}, end {t1:?}"
            );
            spans.push((t0.timestamp_ns, t1.timestamp_ns));
            let bad = mismatches(&d, dst, size, seed)?;
            check!(bad == 0, "GPU {g}: {bad} bytes of the copy are wrong");
            let (ubad, at) = user_samples(&d, dst, size, 4093, |o| pattern::byte_at(seed, o))?;
            check!(
                ubad == 0,
                "GPU {g}: the user mapping sees {ubad} wrong bytes, the first at {at:?}"
            );
            d.stream_destroy(s).ctx("STREAM_DESTROY")?;
            for h in [src, dst] {
                d.mem_free(h).ctx("MEM_FREE")?;
            }
        }
        let ((s1, e1), (s2, e2)) = (spans[0], spans[1]);
        let base = s1.min(s2);
        let ms = |ns: u64| (ns - base) as f64 / 1e6;
        last = format!(
            "GPU {g1} copied over [{:.3}, {:.3}] ms, GPU {g2} over [{:.3}, {:.3}] ms",
            ms(s1),
            ms(e1),
            ms(s2),
            ms(e2)
        );
        if s1 < e2 && s2 < e1 {
            println!("# {last}");
            return drained(&d, "after the two streams");
        }
        println!("# attempt {attempt}: no overlap: {last}");
    }
    Err(Stop::Fail(format!(
        "the two GPUs' streams never ran at once in 3 tries: {last}"
    )))
}

/// Stream 1 waits for a sw_sync fence, then FILLs A with 0x5a and records e; stream 2 (of
/// another GPU if there is one) waits for e, then copies A to B. Nothing moves while the fence
/// is held (each stream's engine stays on its wait: `current_seqno`; EVENT_SYNC of e ends with
/// ETIMEDOUT, its own timeout); everything does once it signals.
pub(super) fn stream_waits_for_another_streams_event() -> TestResult {
    let (d, g) = setup()?;
    let tl = sw_sync()?;
    let g2 = sim_gpus(&d)?
        .iter()
        .map(|x| x.id)
        .find(|&x| x != g)
        .unwrap_or(g);
    let size = M + 3 * K;
    let a = mem_on(&d, g2, size, Some(21))?;
    let b = mem_on(&d, g2, size, Some(22))?;
    let s1 = d.stream_create(g).ctx("STREAM_CREATE 1")?;
    let s2 = d.stream_create(g2).ctx("STREAM_CREATE 2")?;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let fence = tl.create_fence(1, "gate").ctx("CREATE_FENCE")?;
    let first1 = d
        .stream_submit(
            s1.handle,
            &[
                op::wait_fd(fence.as_fd(), WAIT_MS),
                op::fill_byte(a, 0, size, 0x5a),
                op::record(e),
            ],
        )
        .ctx("STREAM_SUBMIT 1")?;
    // The fence was taken at submit: the descriptor may go.
    drop(fence);
    let first2 = d
        .stream_submit(
            s2.handle,
            &[op::wait_event(e, WAIT_MS), op::copy(b, 0, a, 0, size)],
        )
        .ctx("STREAM_SUBMIT 2")?;
    let qe = d.event_query(e).ctx("EVENT_QUERY")?;
    check!(
        qe.status == 0 && qe.stream == s1.handle && qe.seqno == first1 + 2,
        "e while held: {qe:?}, wanted pending on stream {} seqno {}",
        s1.handle,
        first1 + 2
    );
    let (ef, _) = exported(&d, e, "e")?;
    check_pending_names(&ef, g, &s1, first1 + 2, "e")?;
    // Each engine stays on its stream's wait: stream 1's WAIT_FD, stream 2's WAIT_EVENT.
    engine_on(&d, s1.handle, first1, "stream 1's WAIT_FD")?;
    engine_on(&d, s2.handle, first2, "stream 2's WAIT_EVENT")?;
    std::thread::sleep(Duration::from_millis(200));
    let q1 = d.stream_query(s1.handle).ctx("STREAM_QUERY 1")?;
    let q2 = d.stream_query(s2.handle).ctx("STREAM_QUERY 2")?;
    check!(
        q1.completed + 1 == first1
            && q1.submitted == first1 + 2
            && q1.current_seqno == first1
            && q1.current_len == 0,
        "stream 1 moved while held: {q1:?}, wanted its engine on the WAIT_FD, seqno {first1}"
    );
    check!(
        q2.completed + 1 == first2 && q2.submitted == first2 + 1 && q2.current_seqno == first2,
        "stream 2 moved while stream 1 was held: {q2:?}, wanted its engine on the WAIT_EVENT, seqno {first2}"
    );
    // EVENT_SYNC of the held point: ETIMEDOUT once its own timeout passed, not before.
    let t = Instant::now();
    expect_errno(
        d.event_sync(e, 50),
        Errno::ETIMEDOUT,
        "EVENT_SYNC of a held point, 50 ms",
    )?;
    let took = t.elapsed();
    check!(
        took >= Duration::from_millis(45),
        "EVENT_SYNC of 50 ms timed out after {took:?}"
    );
    check!(
        mismatches(&d, a, size, 21)? == 0,
        "A changed while its FILL was held"
    );
    let (bad, at) = user_mismatches(&d, b, size, |o| pattern::byte_at(22, o))?;
    check!(
        bad == 0,
        "B changed ({bad} bytes, the first at {at:?}) while its copy waited"
    );
    tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
    d.event_sync(e, WAIT_MS)
        .ctx("EVENT_SYNC once the fence signalled")?;
    d.stream_sync(s1.handle, WAIT_MS).ctx("STREAM_SYNC 1")?;
    d.stream_sync(s2.handle, WAIT_MS).ctx("STREAM_SYNC 2")?;
    check!(byte_mismatches(&d, a, size, 0x5a)? == 0, "A is not 0x5a");
    let (bad, at) = user_mismatches(&d, b, size, |_| 0x5a)?;
    check!(
        bad == 0,
        "B: {bad} bytes are not 0x5a through the user mapping, the first at {at:?}"
    );
    let info = signalled(&ef, "e")?;
    check!(info.status == 1, "e signalled with {}", info.status);
    for s in [s1.handle, s2.handle] {
        d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    }
    for h in [a, b] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    drained(&d, "after the waits")
}

/// WAIT_FD on a sw_sync fence, then a copy: held while the fence is, done once it signals.
pub(super) fn stream_waits_for_sw_sync() -> TestResult {
    let (d, g) = setup()?;
    let tl = sw_sync()?;
    let size = 256 * K + 7;
    let a = mem_on(&d, g, size, Some(31))?;
    let b = mem_on(&d, g, size, Some(32))?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let fence = tl.create_fence(2, "gate").ctx("CREATE_FENCE")?;
    let first = d
        .stream_submit(
            s,
            &[
                op::wait_fd(fence.as_fd(), WAIT_MS),
                op::copy(b, 0, a, 0, size),
            ],
        )
        .ctx("STREAM_SUBMIT")?;
    engine_on(&d, s, first, "the WAIT_FD")?;
    std::thread::sleep(Duration::from_millis(200));
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.submitted == first + 1
            && q.completed + 1 == first
            && q.error == 0
            && q.current_seqno == first
            && q.current_len == 0,
        "while the fence is held: {q:?}, wanted the engine on the WAIT_FD, seqno {first}"
    );
    check!(
        mismatches(&d, b, size, 32)? == 0,
        "B changed while the copy waited for the fence"
    );
    // One step short of the fence's value: still held.
    tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
    std::thread::sleep(Duration::from_millis(50));
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.completed < q.submitted && q.current_seqno == first,
        "the wait ended before the fence's value: {q:?}"
    );
    tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.completed == first + 1 && q.error == 0 && q.current_seqno == 0,
        "after the fence: {q:?}, wanted everything retired, the engine on nothing"
    );
    let (bad, at) = user_mismatches(&d, b, size, |o| pattern::byte_at(31, o))?;
    check!(
        bad == 0,
        "B: {bad} bytes are not A's through the user mapping, the first at {at:?}"
    );
    check!(
        fence_of(&fence, "the sw_sync fence")?.status == 1,
        "the sw_sync fence is not signalled"
    );
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    for h in [a, b] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    drained(&d, "after the wait")
}
