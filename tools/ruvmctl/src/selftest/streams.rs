// SPDX-License-Identifier: GPL-2.0

//! Streams and events: operations run in order and asynchronously on a GPU's engine, streams
//! of two GPUs at once, waits on another stream's event and on another driver's fence
//! (sw_sync), sticky errors, every fence signalled when the file goes (closed, or its process
//! killed), the GPU goes or the stream is destroyed, and each command's errnos.
//!
//! Data moves through the engine and is checked through another path than the one that wrote
//! it (the user mapping against the kernel's). Fences are read back as sync_files
//! (`SYNC_IOC_FILE_INFO`): status, names while pending, signal times. sw_sync (a timeline this
//! test advances, `CONFIG_SW_SYNC`) holds a stream where a case needs it held; without it
//! those cases skip, or hold the stream with long copies.
//!
//! Here: order, overlap, waits, sticky errors, batches. [`going`]: the file, the process, the
//! GPU or the stream going with work queued. [`refusals`]: every errno of the commands.
//! [`reads`]: where a submission's array may be, and marks retired by their submission.

use std::{
    os::fd::{AsFd, OwnedFd},
    time::{Duration, Instant},
};

use nix::errno::Errno;

use super::harness::{cases, check, expect_errno, Case, Context, Stop, TestResult};
use super::shared::{live, mismatches, sim_gpu};
use crate::pattern;
use libruvm::{
    op,
    sync_file::{self, FenceInfo, SwSyncTimeline},
    uapi, Ruvm, UserMap,
};

mod errors;
mod going;
mod order;
mod points;
mod reads;
mod refusals;
mod status;
mod submitting;
use errors::*;
use order::*;

pub(super) use going::{remove_gpu, BringBack};

pub(super) const K: u64 = 1024;
pub(super) const M: u64 = 1024 * K;
pub(super) const STREAM_OPS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_STREAM_OPS as usize;
pub(super) const STREAM_MEMS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_STREAM_MEMS as usize;
/// The bound of a test's waits that something releases (a sw_sync fence, work ahead).
pub(super) const WAIT_MS: u32 = 20_000;
/// How long a stream's work may take to notice its file, GPU or fence went.
pub(super) const SIGNAL_BOUND: Duration = Duration::from_secs(10);
/// A user VA for the tests, well away from 0 and from the kernel window.
const USER_VA: u64 = 0x10_0000_0000;

pub fn cases() -> Vec<Case> {
    cases![
        stream_copy_chain_in_order,
        stream_two_gpus_overlap,
        stream_waits_for_another_streams_event,
        stream_waits_for_sw_sync,
        stream_wait_timeout_is_sticky,
        stream_fault_is_sticky,
        going::stream_kill_with_1000_ops_signals_every_fence,
        going::stream_close_with_work_queued,
        going::stream_gpu_removal_mid_stream,
        submitting::stream_submit_after_gpu_removal_is_enodev,
        submitting::stream_enodev_at_queueing_once_the_gpu_is_going,
        status::stream_status_page_follows_completion,
        status::stream_status_page_refusals,
        points::stream_point_fences_made_out_of_order,
        points::stream_marks_reached_in_order,
        submitting::stream_killed_waiter_dies_at_once,
        submitting::stream_failing_alloc_is_bounded,
        going::stream_destroy_lets_work_finish,
        refusals::stream_bad_inputs,
        stream_submit_batch_cost,
        reads::stream_ops_read_from_any_placement,
        reads::stream_marks_on_an_idle_stream_retire_at_submit,
        reads::stream_ops_read_leaves_no_pin,
        reads::stream_last_record_wins,
        reads::stream_many_events_in_one_submission,
        stream_destroyed_idle_streams_leave_the_count,
    ]
}

/// A destroyed stream counts in `RUVM_MAX_FILE_STREAMS` only while it has work: 3 x the limit of
/// streams, each given a copy, a record and a wait on its own event (both folded into the
/// copy), synchronized and destroyed, must all be made (the count of queued operations once
/// forgot the folded ones, and each such stream stayed counted).
fn stream_destroyed_idle_streams_leave_the_count() -> TestResult {
    let (d, g) = setup()?;
    let a = d.mem_alloc(64 * K, 64 * K, 0).ctx("MEM_ALLOC")?.handle;
    let b = d.mem_alloc(64 * K, 64 * K, 0).ctx("MEM_ALLOC")?.handle;
    d.mem_gpu(true, a, g).ctx("MAP_GPU")?;
    d.mem_gpu(true, b, g).ctx("MAP_GPU")?;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let rounds = 3 * uapi::RUVM_MAX_FILE_STREAMS;
    for i in 0..rounds {
        let s = match d.stream_create(g) {
            Ok(s) => s.handle,
            Err(err) => {
                return Err(Stop::Fail(format!(
                    "STREAM_CREATE {i} of {rounds}, each stream before it idle and destroyed: {err}"
                )))
            }
        };
        d.stream_submit(
            s,
            &[
                op::copy(b, 0, a, 0, 4 * K),
                op::record(e),
                op::wait_event(e, WAIT_MS),
            ],
        )
        .ctx("STREAM_SUBMIT")?;
        d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
        d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    }
    Ok(())
}

// --- what the cases share ------------------------------------------------------------------

/// Skips unless the module has streams.
fn need_streams(d: &Ruvm) -> TestResult {
    let features = d.info().ctx("INFO")?.features;
    if features & u64::from(uapi::RUVM_FEATURE_STREAMS) == 0 {
        return Err(Stop::Skip(
            "the module has no streams (RUVM_FEATURE_STREAMS)".into(),
        ));
    }
    Ok(())
}

/// The device and a simulated GPU, or a skip.
pub(super) fn setup() -> Result<(Ruvm, u32), Stop> {
    let d = Ruvm::open().ctx("open")?;
    need_streams(&d)?;
    let g = sim_gpu(&d)?;
    Ok((d, g))
}

/// A skip unless GPU `g` has an MMU (GPU VAs, COPY_VA and its faults).
pub(super) fn need_mmu(d: &Ruvm, g: u32) -> Result<(), Stop> {
    let info = d
        .gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .find(|x| x.id == g)
        .ok_or_else(|| Stop::Fail(format!("GPU {g} left the list")))?;
    if info.flags & uapi::ruvm_gpu_flags_RUVM_GPU_MMU == 0 {
        return Err(Stop::Skip(format!("GPU {g} has no MMU")));
    }
    Ok(())
}

/// Every present simulated GPU.
pub(super) fn sim_gpus(d: &Ruvm) -> Result<Vec<uapi::ruvm_gpu_info>, Stop> {
    Ok(d.gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .filter(super::gpu::sim)
        .collect())
}

/// A sysmem mem of `size` bytes (2 MiB chunks from 2 MiB on, else pages), mapped for the CPU
/// kernel and on `gpu` (MEM_MAP_GPU), holding the pattern of `seed` (written through the
/// kernel mapping), or zeroes.
pub(super) fn mem_on(d: &Ruvm, gpu: u32, size: u64, seed: Option<u64>) -> Result<u64, Stop> {
    let chunk = if size >= 2 * M { 2 * M } else { 0 };
    mem_of(d, gpu, size, chunk, seed)
}

/// [`mem_on`] with chunks of `chunk` bytes.
fn mem_of(d: &Ruvm, gpu: u32, size: u64, chunk: u64, seed: Option<u64>) -> Result<u64, Stop> {
    let flags = if seed.is_none() {
        uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO
    } else {
        0
    };
    let h = d.mem_alloc(size, chunk, flags).ctx("MEM_ALLOC")?.handle;
    d.map_kernel(h).ctx("MAP_CPU_KERNEL")?;
    d.mem_gpu(true, h, gpu).ctx("MEM_MAP_GPU")?;
    if let Some(s) = seed {
        let f = uapi::ruvm_mem_fill {
            handle: h,
            length: size,
            seed: s,
            ..Default::default()
        };
        d.mem_fill(false, f).ctx("MEM_FILL")?;
    }
    Ok(h)
}

/// Writes the pattern of `seed` into `[0, len)` of `h` through a user mapping.
fn user_fill(d: &Ruvm, h: u64, len: u64, seed: u64) -> TestResult {
    let q = d.mem_query(h).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    for o in 0..len {
        map.write(o as usize, pattern::byte_at(seed, o));
    }
    Ok(())
}

/// Bytes of `[0, len)` of `h`, read through a user mapping, that are not `want(offset)`; and
/// the first such offset.
pub(super) fn user_mismatches(
    d: &Ruvm,
    h: u64,
    len: u64,
    want: impl Fn(u64) -> u8,
) -> Result<(u64, Option<u64>), Stop> {
    user_samples(d, h, len, 1, want)
}

/// [`user_mismatches`] of every `step`th byte and the last (for mems too big to read whole
/// in an emulated guest).
fn user_samples(
    d: &Ruvm,
    h: u64,
    len: u64,
    step: usize,
    want: impl Fn(u64) -> u8,
) -> Result<(u64, Option<u64>), Stop> {
    let q = d.mem_query(h).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    let mut bad = 0;
    let mut first = None;
    for o in (0..len).step_by(step).chain(len.checked_sub(1)) {
        if map.read(o as usize) != want(o) {
            bad += 1;
            first.get_or_insert(o);
        }
    }
    Ok((bad, first))
}

/// Bytes of `[0, len)` of `h` that are not `byte`, through the kernel mapping (MEM_VERIFY).
fn byte_mismatches(d: &Ruvm, h: u64, len: u64, byte: u8) -> Result<u64, Stop> {
    let f = uapi::ruvm_mem_fill {
        handle: h,
        length: len,
        seed: u64::from(byte),
        kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
        ..Default::default()
    };
    Ok(d.mem_fill(true, f).ctx("MEM_VERIFY")?.mismatches)
}

/// CLOCK_MONOTONIC now, in ns: the clock of a fence's timestamp.
fn monotonic_ns() -> u64 {
    let mut ts = nix::libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: one timespec, written by the call.
    unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut ts) };
    // CAST: the monotonic clock is never negative.
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The one fence of sync_file `f`.
fn fence_of(f: &impl AsFd, what: &str) -> Result<FenceInfo, Stop> {
    let info = sync_file::info(f).ctx(&format!("SYNC_IOC_FILE_INFO of {what}"))?;
    check!(
        info.status == info.fences.first().map_or(99, |x| x.status),
        "{what}: the file's status {} is not its fence's ({:?})",
        info.status,
        info.fences
    );
    info.fence()
        .cloned()
        .ok_or_else(|| Stop::Fail(format!("{what}: {} fences, not one", info.fences.len())))
}

/// Event `e` exported, and its fence.
fn exported(d: &Ruvm, e: u64, what: &str) -> Result<(OwnedFd, FenceInfo), Stop> {
    let f = d.event_export(e).ctx(&format!("EVENT_EXPORT of {what}"))?;
    let info = fence_of(&f, what)?;
    Ok((f, info))
}

/// Event `e`'s point, which must have signalled already (exported and read at once, not
/// polled): after a STREAM_SYNC that covered it, even one that said EIO, as the module signals
/// a fence before it counts its operation retired.
fn settled(d: &Ruvm, e: u64, what: &str) -> Result<FenceInfo, Stop> {
    let (_, info) = exported(d, e, what)?;
    check!(
        info.status != 0,
        "{what}: still pending after a STREAM_SYNC that covered it: {info:?}"
    );
    Ok(info)
}

/// Waits (at most [`SIGNAL_BOUND`]) until sync_file `f` has signalled; its fence then.
pub(super) fn signalled(f: &impl AsFd, what: &str) -> Result<FenceInfo, Stop> {
    let t = Instant::now();
    let done = sync_file::wait(f, SIGNAL_BOUND).ctx(&format!("poll of {what}"))?;
    check!(
        done,
        "{what}: not signalled after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let info = fence_of(f, what)?;
    check!(info.status != 0, "{what}: polls ready but its status is 0");
    Ok(info)
}

/// A pending fence of ruvm's says which stream it is of: driver `ruvm`, timeline
/// `gpu<G>-stream<H>`, and (the sync_file's name, when the kernel makes it) `ruvm-<timeline>
/// <context>-<seqno>`, cut at 31 bytes.
fn check_pending_names(
    f: &impl AsFd,
    gpu: u32,
    stream: &uapi::ruvm_stream_create,
    seqno: u64,
    what: &str,
) -> TestResult {
    let info = sync_file::info(f).ctx(&format!("SYNC_IOC_FILE_INFO of {what}"))?;
    let fence = info
        .fence()
        .ok_or_else(|| Stop::Fail(format!("{what}: {} fences", info.fences.len())))?;
    check!(fence.status == 0, "{what}: not pending ({})", fence.status);
    let timeline = format!("gpu{gpu}-stream{}", stream.handle);
    check!(
        fence.driver == "ruvm" && fence.timeline == timeline,
        "{what}: driver {:?} timeline {:?}, wanted \"ruvm\" and {timeline:?}",
        fence.driver,
        fence.timeline
    );
    check!(fence.timestamp_ns == 0, "{what}: pending with a timestamp");
    let mut name = format!("ruvm-{timeline}{}-{seqno}", stream.context);
    name.truncate(31);
    // The name is read after the status: it says "detached-driver..." if the fence signalled
    // in between, which a held stream does not.
    check!(
        info.name == name,
        "{what}: sync_file name {:?}, wanted {name:?} (context {}, seqno {seqno})",
        info.name,
        stream.context
    );
    Ok(())
}

/// Waits (at most [`SIGNAL_BOUND`]) until the engine is on operation `seqno` of stream `s`
/// (`current_seqno`): for a wait held by a fence, which the engine stays on until it signals.
/// Its state then.
pub(super) fn engine_on(
    d: &Ruvm,
    s: u64,
    seqno: u64,
    what: &str,
) -> Result<uapi::ruvm_stream_query, Stop> {
    let t = Instant::now();
    loop {
        let q = d.stream_query(s).ctx("STREAM_QUERY")?;
        if q.current_seqno == seqno {
            return Ok(q);
        }
        if t.elapsed() > SIGNAL_BOUND || q.completed >= seqno || q.error != 0 {
            return Err(Stop::Fail(format!(
                "{what}: the engine is not on seqno {seqno} (current_seqno {}): {q:?}",
                q.current_seqno
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (at most 5 s) until no stream operation is queued anywhere and none holds a mem.
pub(super) fn drained(d: &Ruvm, when: &str) -> TestResult {
    let t = Instant::now();
    loop {
        let l = live(d)?;
        if l[STREAM_OPS] == 0 && l[STREAM_MEMS] == 0 {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(5) {
            return Err(Stop::Fail(format!(
                "{when}: stream_ops={} stream_mems={} after 5 s, wanted 0",
                l[STREAM_OPS], l[STREAM_MEMS]
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Mounts debugfs at /sys/kernel/debug if nothing is mounted there (root only; the test
/// guest's init mounts it).
fn ensure_debugfs() {
    let dir = std::path::Path::new("/sys/kernel/debug");
    let empty = dir.read_dir().is_ok_and(|mut d| d.next().is_none());
    if empty {
        // SAFETY: C strings that live across the call; mount(2) reads them only.
        let _ = unsafe {
            nix::libc::mount(
                c"debugfs".as_ptr(),
                c"/sys/kernel/debug".as_ptr(),
                c"debugfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
    }
}

/// A new sw_sync timeline, or a skip (Debian's kernels lack `CONFIG_SW_SYNC`).
pub(super) fn sw_sync() -> Result<SwSyncTimeline, Stop> {
    sw_sync_or_none()?
        .ok_or_else(|| Stop::Skip(format!("no {} (CONFIG_SW_SYNC)", sync_file::SW_SYNC_PATH)))
}

/// A sw_sync fence that holds the streams waiting for it until released (on drop at the
/// latest, so that a failed case leaves no stream held).
pub(super) struct Gate {
    tl: SwSyncTimeline,
    fence: OwnedFd,
    open: bool,
}

impl Gate {
    /// A new gate, or a skip without sw_sync.
    pub(super) fn new() -> Result<Self, Stop> {
        let tl = sw_sync()?;
        let fence = tl.create_fence(1, "gate").ctx("SW_SYNC_IOC_CREATE_FENCE")?;
        Ok(Self {
            tl,
            fence,
            open: false,
        })
    }

    /// A `WAIT_FD` on the gate.
    pub(super) fn wait(&self) -> uapi::ruvm_op {
        op::wait_fd(self.fence.as_fd(), uapi::RUVM_WAIT_MAX_MS)
    }

    pub(super) fn release(&mut self) -> TestResult {
        if !self.open {
            self.tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
            self.open = true;
        }
        Ok(())
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if !self.open {
            let _ = self.tl.inc(1);
        }
    }
}

/// A new sw_sync timeline, `None` without sw_sync.
fn sw_sync_or_none() -> Result<Option<SwSyncTimeline>, Stop> {
    ensure_debugfs();
    match SwSyncTimeline::open() {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Stop::Fail(format!("opening sw_sync: {e}"))),
    }
}

/// The audit names the two stream classes `stream_ops` and `stream_mems` (when debugfs says).
fn check_class_names() -> TestResult {
    if let Some(names) = libruvm::names::audit_classes() {
        check!(
            names[STREAM_OPS] == "stream_ops" && names[STREAM_MEMS] == "stream_mems",
            "audit classes {STREAM_OPS} and {STREAM_MEMS} are named {:?} and {:?}",
            names[STREAM_OPS],
            names[STREAM_MEMS]
        );
    }
    Ok(())
}

/// The errno of a negative fence status.
pub(super) fn errno_of(status: i32) -> Option<Errno> {
    (status < 0).then(|| Errno::from_raw(-status))
}

// --- batches -------------------------------------------------------------------------------------

/// One submit of 64 (FILL, RECORD e_i) pairs on one stream and one of 64 (WAIT_EVENT e_i,
/// RECORD f_i) pairs on another: every point signals, each f_i after its e_i, and the fills
/// land. Not a benchmark: the time is printed.
fn stream_submit_batch_cost() -> TestResult {
    let (d, g) = setup()?;
    let tl = sw_sync_or_none()?;
    const N: u64 = 64;
    let piece = 64 * K;
    let a = mem_on(&d, g, N * piece, None)?;
    let s1 = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let s2 = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let mut e = Vec::new();
    let mut f = Vec::new();
    for _ in 0..N {
        e.push(d.event_create().ctx("EVENT_CREATE")?);
        f.push(d.event_create().ctx("EVENT_CREATE")?);
    }
    let gate = match &tl {
        Some(t) => Some(t.create_fence(1, "gate").ctx("CREATE_FENCE")?),
        None => None,
    };
    let mut ops1: Vec<uapi::ruvm_op> = gate
        .iter()
        .map(|x| op::wait_fd(x.as_fd(), WAIT_MS))
        .collect();
    let mut ops2 = Vec::new();
    for i in 0..N {
        ops1.push(op::fill_pattern(a, i * piece, piece, 1000 + i));
        ops1.push(op::record(e[i as usize]));
        ops2.push(op::wait_event(e[i as usize], WAIT_MS));
        ops2.push(op::record(f[i as usize]));
    }
    let t = Instant::now();
    d.stream_submit(s1, &ops1)
        .ctx("STREAM_SUBMIT of the fills")?;
    let first2 = d
        .stream_submit(s2, &ops2)
        .ctx("STREAM_SUBMIT of the waits")?;
    let submitted = t.elapsed();
    if let Some(tl) = &tl {
        // The engine stays on the first WAIT_EVENT, e_0 being held behind the gate.
        engine_on(&d, s2, first2, "the first WAIT_EVENT")?;
        std::thread::sleep(Duration::from_millis(100));
        let q = d.stream_query(s2).ctx("STREAM_QUERY")?;
        check!(
            q.completed + 1 == first2 && q.current_seqno == first2,
            "the waits went on while the events' stream was held: {q:?}"
        );
        tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
    }
    d.sync_every_stream(WAIT_MS)
        .ctx("STREAM_SYNC of every stream")?;
    println!(
        "# {} operations in two submits: submitted in {:.0} us, all retired {:.1} ms after",
        ops1.len() + ops2.len(),
        submitted.as_secs_f64() * 1e6,
        t.elapsed().as_secs_f64() * 1e3
    );
    let q = d.stream_query(s2).ctx("STREAM_QUERY")?;
    check!(
        q.completed == q.submitted && q.submitted == first2 + 2 * N - 1 && q.error == 0,
        "the waiting stream after the sync: {q:?}"
    );
    for i in 0..N as usize {
        let ei = settled(&d, e[i], "e")?;
        let fi = settled(&d, f[i], "f")?;
        check!(
            ei.status == 1 && fi.status == 1 && ei.timestamp_ns <= fi.timestamp_ns,
            "pair {i}: e {ei:?}, f {fi:?}: f must signal after e"
        );
    }
    let (bad, at) = user_mismatches(&d, a, N * piece, |o| pattern::byte_at(1000 + o / piece, o))?;
    check!(
        bad == 0,
        "the 64 fills: {bad} bytes wrong through the user mapping, the first at {at:?}"
    );
    for s in [s1, s2] {
        d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    }
    d.mem_free(a).ctx("MEM_FREE")?;
    drained(&d, "after the batches")
}
