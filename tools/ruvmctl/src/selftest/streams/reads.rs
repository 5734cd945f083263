// SPDX-License-Identifier: GPL-2.0

//! How a submission is read and what it does before the engine sees it.
//!
//! The module reads a submission's array from the pages that hold it, pinned for the call and
//! read a word at a time, and with `copy_from_user` where it cannot (an array not 8-aligned,
//! memory of no `struct page`). Each placement here (aligned, 4 bytes off, across a page
//! boundary, the largest submission over 5 pages, a read-only mapping, a shared one, a user
//! mapping of a mem) is submitted as fills of distinct bytes, and what they wrote is read back
//! through a user mapping of the mem. An array not all readable (a `PROT_NONE` page, at its
//! start or its end) is `EFAULT`, and queues and writes nothing.
//!
//! Its pages are pinned only for the call: the system's pin count is where it was after
//! hundreds of submissions, refused or not, from untouched memory (the zero page, THP's huge
//! zero page) and from written memory.
//!
//! A submission of marks (records, waits the stream's order satisfies) to an idle stream
//! retires them itself: the stream is complete and the event's fence signalled when
//! `STREAM_SUBMIT` returns; behind work not done (a sw_sync gate), they wait for it. Of two
//! threads recording one event on one stream, the later submission's point stays.

use std::os::fd::AsFd;

use nix::{
    errno::Errno,
    sys::mman::{mprotect, MapFlags, ProtFlags},
};

use super::{
    drained, exported, fence_of, mem_on, setup, signalled, sw_sync_or_none, user_mismatches,
    WAIT_MS,
};
use crate::selftest::harness::{check, Context, Stop, TestResult};
use crate::selftest::shared::UserMapAnon;
use libruvm::{cmd, op, uapi, Ruvm, UserMap};

const PAGE: usize = 4096;
/// The bytes each fill of a placement writes.
const PIECE: u64 = 64;
/// The largest submission.
const MOST: usize = uapi::RUVM_MAX_SUBMIT_OPS as usize;
const OP: usize = std::mem::size_of::<uapi::ruvm_op>();

/// `n` fills of `mem`, the `i`th writing byte `seed + i` over `[i * PIECE, (i + 1) * PIECE)`.
fn fills(mem: u64, n: usize, seed: u8) -> Vec<uapi::ruvm_op> {
    (0..n)
        .map(|i| {
            // CAST: the byte wraps, as the check's does.
            let byte = seed.wrapping_add(i as u8);
            op::fill_byte(mem, i as u64 * PIECE, PIECE, byte)
        })
        .collect()
}

/// Writes `ops` at `at`, any alignment.
///
/// # Safety
///
/// `at` is the start of `ops.len() * OP` writable bytes that nothing else uses meanwhile.
unsafe fn place(at: *mut u8, ops: &[uapi::ruvm_op]) {
    // SAFETY: the caller's promise; the source is a live slice of the same length.
    unsafe { std::ptr::copy_nonoverlapping(ops.as_ptr().cast::<u8>(), at, ops.len() * OP) };
}

/// STREAM_SUBMIT of `n` operations at address `at`, raw.
fn submit_at(d: &Ruvm, s: u64, at: *const u8, n: usize) -> Result<u64, Errno> {
    let mut a = uapi::ruvm_stream_submit {
        handle: s,
        count: u32::try_from(n).map_err(|_| Errno::EINVAL)?,
        ops: at as u64,
        ..Default::default()
    };
    d.call(cmd::STREAM_SUBMIT, &mut a).map(|()| a.first_seqno)
}

/// Each placement of a submission's array works, and what it wrote is what it said; an
/// unreadable one is EFAULT and changes nothing.
pub(super) fn stream_ops_read_from_any_placement() -> TestResult {
    let (d, g) = setup()?;
    let size = MOST as u64 * PIECE;
    let mem = mem_on(&d, g, size, None)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let wrote = |what: &str, seed: u8, n: usize| -> TestResult {
        d.stream_sync(s, WAIT_MS)
            .ctx(&format!("STREAM_SYNC ({what})"))?;
        let (bad, at) = user_mismatches(&d, mem, n as u64 * PIECE, |o| {
            // CAST: the fill's index, below 256.
            seed.wrapping_add((o / PIECE) as u8)
        })?;
        check!(
            bad == 0,
            "{what}: {bad} bytes not what its {n} fills wrote, the first at {at:?}"
        );
        Ok(())
    };

    // An 8-aligned array on the heap.
    let ops = fills(mem, 16, 1);
    d.stream_submit(s, &ops).ctx("STREAM_SUBMIT (aligned)")?;
    wrote("an 8-aligned array", 1, 16)?;

    // 4 bytes past 8-alignment.
    let mut words = vec![0u64; 16 * OP / 8 + 1];
    // SAFETY: 4 bytes into `words`, which has 16 * OP + 8 bytes.
    let at = unsafe { words.as_mut_ptr().cast::<u8>().add(4) };
    // SAFETY: `16 * OP` bytes of `words` from `at`.
    unsafe { place(at, &fills(mem, 16, 2)) };
    submit_at(&d, s, at, 16).ctx("STREAM_SUBMIT (4 bytes off)")?;
    wrote("an array 4 bytes off 8-alignment", 2, 16)?;

    // Across a page boundary: 5 operations before it, 11 after.
    let two = UserMapAnon::new(2 * PAGE, MapFlags::MAP_PRIVATE)?;
    // SAFETY: inside `two`: 16 operations from 5 before its second page.
    let at = unsafe { two.ptr.as_ptr().cast::<u8>().add(PAGE - 5 * OP) };
    // SAFETY: as above, writable.
    unsafe { place(at, &fills(mem, 16, 3)) };
    submit_at(&d, s, at, 16).ctx("STREAM_SUBMIT (across pages)")?;
    wrote("an array across a page boundary", 3, 16)?;

    // The largest submission, over 5 pages (8 bytes into the first).
    let six = UserMapAnon::new(6 * PAGE, MapFlags::MAP_PRIVATE)?;
    // SAFETY: inside `six`: MOST operations (18 KiB) from 8 bytes into it.
    let at = unsafe { six.ptr.as_ptr().cast::<u8>().add(8) };
    // SAFETY: as above, writable.
    unsafe { place(at, &fills(mem, MOST, 4)) };
    submit_at(&d, s, at, MOST).ctx("STREAM_SUBMIT (256 operations)")?;
    wrote("RUVM_MAX_SUBMIT_OPS operations over 5 pages", 4, MOST)?;

    // A read-only mapping.
    let ro = UserMapAnon::new(PAGE, MapFlags::MAP_PRIVATE)?;
    // SAFETY: `ro`'s page, writable until the mprotect.
    unsafe { place(ro.ptr.as_ptr().cast(), &fills(mem, 16, 5)) };
    // SAFETY: `ro`'s mapping; nothing holds a reference into it.
    unsafe { mprotect(ro.ptr, PAGE, ProtFlags::PROT_READ) }.ctx("mprotect")?;
    submit_at(&d, s, ro.ptr.as_ptr().cast(), 16).ctx("STREAM_SUBMIT (read-only)")?;
    wrote("an array in a read-only mapping", 5, 16)?;

    // A shared anonymous mapping.
    let shared = UserMapAnon::new(PAGE, MapFlags::MAP_SHARED)?;
    // SAFETY: `shared`'s page, writable.
    unsafe { place(shared.ptr.as_ptr().cast(), &fills(mem, 16, 6)) };
    submit_at(&d, s, shared.ptr.as_ptr().cast(), 16).ctx("STREAM_SUBMIT (shared)")?;
    wrote("an array in a shared mapping", 6, 16)?;

    // A user mapping of another mem.
    let holder = d
        .mem_alloc(PAGE as u64, 0, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
        .ctx("MEM_ALLOC of the holder")?
        .handle;
    let q = d.mem_query(holder).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(&d, &q).ctx("mmap of the holder")?;
    // SAFETY: the mapping's page, writable, used by nothing else.
    unsafe { place(map.as_ptr(), &fills(mem, 16, 7)) };
    submit_at(&d, s, map.as_ptr(), 16).ctx("STREAM_SUBMIT (in a mem's mapping)")?;
    wrote("an array in a user mapping of a mem", 7, 16)?;
    drop(map);
    d.mem_free(holder).ctx("MEM_FREE of the holder")?;

    // Refused: a PROT_NONE page at the array's start, then at its end.
    let before = d.stream_query(s).ctx("STREAM_QUERY")?.submitted;
    let none = UserMapAnon::new(2 * PAGE, MapFlags::MAP_PRIVATE)?;
    let first = none.ptr.as_ptr().cast::<u8>();
    // SAFETY: inside `none`: 16 operations from 5 before its second page.
    let straddle = unsafe { first.add(PAGE - 5 * OP) };
    // SAFETY: both pages of `none`, writable until the mprotects.
    unsafe {
        place(first, &fills(mem, 16, 8));
        place(straddle, &fills(mem, 16, 8));
    }
    // SAFETY: `none`'s mapping; nothing holds a reference into it.
    unsafe { mprotect(none.ptr, 2 * PAGE, ProtFlags::PROT_NONE) }.ctx("mprotect")?;
    let refused = [
        ("a PROT_NONE array", first.cast_const()),
        ("an array into a PROT_NONE page", straddle.cast_const()),
    ];
    for (i, (what, at)) in refused.into_iter().enumerate() {
        if i == 1 {
            // SAFETY: `none`'s first page; nothing holds a reference into it.
            unsafe { mprotect(none.ptr, PAGE, ProtFlags::PROT_READ) }.ctx("mprotect")?;
        }
        let r = submit_at(&d, s, at, 16);
        check!(r == Err(Errno::EFAULT), "{what}: {r:?}, wanted EFAULT");
        let q = d.stream_query(s).ctx("STREAM_QUERY")?;
        check!(
            q.submitted == before,
            "{what}: submitted went from {before} to {}",
            q.submitted
        );
        // The last placement's 16 fills are still what the refused one did not write.
        wrote(what, 7, 16)?;
    }
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.mem_free(mem).ctx("MEM_FREE")?;
    drained(&d, "after the placements")
}

/// Marks submitted to an idle stream are retired by the submission; behind work not done,
/// they wait for it.
pub(super) fn stream_marks_on_an_idle_stream_retire_at_submit() -> TestResult {
    let (d, g) = setup()?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let f = d.event_create().ctx("EVENT_CREATE")?;
    let ops = [
        op::record(e),
        op::wait_event(e, WAIT_MS),
        op::wait_event(f, WAIT_MS),
        op::record(f),
    ];
    for round in 0..3 {
        let first = d.stream_submit(s, &ops).ctx("STREAM_SUBMIT of marks")?;
        let q = d.stream_query(s).ctx("STREAM_QUERY")?;
        check!(
            q.submitted == first + 3 && q.completed == q.submitted && q.error == 0,
            "round {round}: marks on an idle stream not retired at submit: {q:?}"
        );
        for (ev, name) in [(e, "e"), (f, "f")] {
            let (_, info) = exported(&d, ev, name)?;
            check!(
                info.status == 1,
                "round {round}: {name}'s fence right after the submit: {info:?}"
            );
        }
    }
    let Some(tl) = sw_sync_or_none()? else {
        println!("# no sw_sync: marks behind work not done left out");
        d.stream_destroy(s).ctx("STREAM_DESTROY")?;
        return drained(&d, "after the marks");
    };
    let gate = tl.create_fence(1, "gate").ctx("CREATE_FENCE")?;
    let held = d
        .stream_submit(s, &[op::wait_fd(gate.as_fd(), WAIT_MS)])
        .ctx("STREAM_SUBMIT of the gate")?;
    let first = d
        .stream_submit(s, &ops)
        .ctx("STREAM_SUBMIT of marks behind it")?;
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.completed < held && q.submitted == first + 3,
        "marks behind a held wait: {q:?}, wanted nothing past {} completed",
        held - 1
    );
    let (fd, info) = exported(&d, e, "e behind the gate")?;
    check!(info.status == 0, "e's fence behind a held wait: {info:?}");
    tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
    let info = signalled(&fd, "e once the gate opened")?;
    check!(info.status == 1, "e once the gate opened: {info:?}");
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    let info = fence_of(&d.event_export(f).ctx("EVENT_EXPORT of f")?, "f")?;
    check!(info.status == 1, "f after the sync: {info:?}");
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drained(&d, "after the marks")
}

/// `/proc/vmstat`'s pins taken and pins dropped so far, with every CPU's pending counts
/// folded in first (`vm.stat_refresh`).
fn pins() -> Result<(i64, i64), Stop> {
    std::fs::write("/proc/sys/vm/stat_refresh", "1").ctx("vm.stat_refresh")?;
    let stat = std::fs::read_to_string("/proc/vmstat").ctx("/proc/vmstat")?;
    let field = |name: &str| -> Result<i64, Stop> {
        stat.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .ok_or_else(|| Stop::Fail(format!("/proc/vmstat has no {name}")))
    };
    Ok((
        field("nr_foll_pin_acquired")?,
        field("nr_foll_pin_released")?,
    ))
}

/// A submission pins its array's pages only for the call, whatever it meets: arrays of
/// memory never touched (the zero page, or THP's huge zero page on a kernel with it, such as
/// Debian's: 2 MiB aligned), submitted 100 times and refused (`EINVAL`, kind 0); of written
/// memory, 100 times and queued; and 100 times an array running from a written page into a
/// `PROT_NONE` one (`EFAULT`: its first page pinned, then let go). The written arrays must
/// have been pinned (100 pins taken at least: the word-read path ran), and every pin taken
/// dropped.
pub(super) fn stream_ops_read_leaves_no_pin() -> TestResult {
    let (d, g) = setup()?;
    let mem = mem_on(&d, g, MOST as u64 * PIECE, None)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let area = UserMapAnon::new(4 << 20, MapFlags::MAP_PRIVATE)?;
    let base = area.ptr.as_ptr() as usize;
    // The 2 MiB-aligned middle of the mapping: a huge zero page, where the kernel maps them.
    let huge = ((base + (2 << 20) - 1) & !((2 << 20) - 1)) as *mut u8;
    let (taken0, dropped0) = pins()?;
    for i in 0..100 {
        let r = submit_at(&d, s, huge, MOST);
        check!(
            r == Err(Errno::EINVAL),
            "round {i}: {MOST} zeroed operations (kind 0): {r:?}, wanted EINVAL"
        );
    }
    // Written: the first page of the mapping, pinned and unpinned each time.
    let first = area.ptr.as_ptr().cast::<u8>();
    let ops = fills(mem, 16, 9);
    // SAFETY: the first 16 operations' bytes of the mapping, which nothing else uses now.
    unsafe { place(first, &ops) };
    let (taken1, _) = pins()?;
    for i in 0..100 {
        submit_at(&d, s, first, 16).ctx(&format!("STREAM_SUBMIT {i} of written memory"))?;
        if i % 16 == 15 {
            d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
        }
    }
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    let (taken2, _) = pins()?;
    check!(
        taken2 - taken1 >= 100,
        "100 submissions of a written 1152-byte array took {} pins: the pages were not read",
        taken2 - taken1
    );
    // Into a PROT_NONE page: the written page pinned, the next refused, the first let go.
    let two = UserMapAnon::new(2 * PAGE, MapFlags::MAP_PRIVATE)?;
    // SAFETY: inside `two`: 16 operations from 5 before its second page.
    let straddle = unsafe { two.ptr.as_ptr().cast::<u8>().add(PAGE - 5 * OP) };
    // SAFETY: as above, writable until the mprotect.
    unsafe { place(straddle, &ops) };
    // SAFETY: `two`'s second page; nothing holds a reference into it.
    let second = unsafe { two.ptr.byte_add(PAGE) };
    // SAFETY: as above.
    unsafe { mprotect(second, PAGE, ProtFlags::PROT_NONE) }.ctx("mprotect")?;
    for i in 0..100 {
        let r = submit_at(&d, s, straddle, 16);
        check!(
            r == Err(Errno::EFAULT),
            "round {i}: an array into a PROT_NONE page: {r:?}, wanted EFAULT"
        );
    }
    let (taken3, dropped3) = pins()?;
    check!(
        taken3 - dropped3 == taken0 - dropped0,
        "pins held: {} before 300 submissions, {} after ({} taken, {} dropped)",
        taken0 - dropped0,
        taken3 - dropped3,
        taken3 - taken0,
        dropped3 - dropped0
    );
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.mem_free(mem).ctx("MEM_FREE")?;
    drained(&d, "after the pins")
}

/// Threads, more than the guest's CPUs, and the RECORDs each submits in
/// [`stream_last_record_wins`].
const THREADS: usize = 8;
const RECORDS: usize = 300;

/// Of the submissions to one stream, the last to queue a RECORD of an event is where the event
/// stays: [`THREADS`] threads each recording the same event [`RECORDS`] times, one RECORD a
/// submission; the
/// event is then at the stream's last seqno. (The events were once moved after the stream's
/// submission lock was released, so an earlier submission could move it back.)
pub(super) fn stream_last_record_wins() -> TestResult {
    let (d, g) = setup()?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let one = [op::record(e)];
    let failed = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| {
                    (0..RECORDS).find_map(|i| match d.stream_submit(s, &one) {
                        Ok(_) => None,
                        Err(Errno::EAGAIN) => {
                            // The stream's bound: let it drain.
                            d.stream_sync(s, WAIT_MS)
                                .err()
                                .map(|e| format!("sync {i}: {e}"))
                        }
                        Err(err) => Some(format!("submit {i}: {err}")),
                    })
                })
            })
            .collect();
        runs.into_iter().find_map(|r| {
            r.join()
                .unwrap_or_else(|_| Some("a thread panicked".into()))
        })
    });
    if let Some(f) = failed {
        return Err(Stop::Fail(f));
    }
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    let ev = d.event_query(e).ctx("EVENT_QUERY")?;
    check!(
        ev.stream == s && ev.seqno == q.submitted && ev.status == 1,
        "the event is at seqno {} of stream {} (status {}); the stream's last RECORD is {}",
        ev.seqno,
        ev.stream,
        ev.status,
        q.submitted
    );
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.event_destroy(e).ctx("EVENT_DESTROY")?;
    drained(&d, "after the records")
}

/// Events a submission of the largest size names: 120 recorded, waited for in the reverse
/// order, and the first 16 recorded again at the end (256 operations, every one a mark): each
/// event's point is its last record's seqno on the stream, complete once the submission
/// returns (an idle stream). The submission's table of events dedups them and finds each
/// operation's, whatever their handles' hash.
pub(super) fn stream_many_events_in_one_submission() -> TestResult {
    const EVENTS: usize = 120;
    const AGAIN: usize = 16;
    const _: () = assert!(2 * EVENTS + AGAIN == uapi::RUVM_MAX_SUBMIT_OPS as usize);
    let (d, g) = setup()?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let events = (0..EVENTS)
        .map(|_| d.event_create().ctx("EVENT_CREATE"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ops: Vec<_> = events.iter().map(|&e| op::record(e)).collect();
    ops.extend(events.iter().rev().map(|&e| op::wait_event(e, WAIT_MS)));
    ops.extend(events.iter().take(AGAIN).map(|&e| op::record(e)));
    let first = d.stream_submit(s, &ops).ctx("STREAM_SUBMIT")?;
    for (i, &e) in events.iter().enumerate() {
        let at = if i < AGAIN { 2 * EVENTS + i } else { i };
        let want = first + at as u64;
        let q = d.event_query(e).ctx("EVENT_QUERY")?;
        check!(
            q.stream == s && q.seqno == want && q.status == 1,
            "event {i}: {q:?}, wanted stream {s} seqno {want} (operation {at}) signalled"
        );
    }
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.completed == first + ops.len() as u64 - 1 && q.error == 0,
        "the stream after the submission: {q:?}"
    );
    for e in events {
        d.event_destroy(e).ctx("EVENT_DESTROY")?;
    }
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drained(&d, "after the events")
}
