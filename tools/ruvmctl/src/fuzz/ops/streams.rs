// SPDX-License-Identifier: GPL-2.0

//! The fuzzer's stream and event operations (Documentation/ruvm.rst, "Streams and events"):
//! streams made and destroyed on random GPUs, events made, recorded, waited for and exported,
//! batches of 1 to 32 random operations submitted (copies between the worker's mems, fills,
//! records, waits for events and for sync_files of ruvm and of sw_sync, copies through user
//! VAs, stream-ordered allocations from the worker's pools or the GPU's current pool and frees
//! of its mems, by handle or by the index of an ALLOC of the batch), queries and syncs, slots
//! of the status page, mems freed under queued work, files closed with work queued, and
//! libruvm's allocator's traffic ([`ualloc`]).
//!
//! Oracles, beyond each errno being one the documentation gives for the command:
//! - a destroyed stream's or event's handle answers `ENOENT` from then on (handles are per file
//!   and never reused); so does a mem freed by a submitted `FREE` (its user mappings must fault
//!   at once, as after `MEM_FREE`), and an `ALLOC` that was submitted made a mem;
//! - what `STREAM_QUERY` and `EVENT_QUERY` report adds up, and a stream's sticky error is one
//!   the documentation lists;
//! - isolation: a copy's destination read back after a sync holds no other worker's tag (the
//!   engine moved the worker's own bytes only; see [`oracle`]);
//! - liveness: every sync_file exported from a file that is then closed with its streams busy
//!   signals within [`fences::SIGNAL_BOUND`] of the close. The sync_files handed to the parent
//!   are checked there after a kill or a GPU's removal ([`fences`]).

use std::{
    os::fd::{AsRawFd, OwnedFd},
    sync::{Arc, Mutex, Weak},
};

use libruvm::{op, sync_file, uapi, Errno, Ruvm, StatusPage};

use super::{fences, oracle, Rng, World};

mod batch;
mod busy;
mod malformed;
mod ualloc;
use batch::*;

use busy::{busy_work, close_busy, free_under_work};
pub(super) use busy::{load, load_file};
use malformed::malformed;
use ualloc::ualloc;

use Errno::*;

/// What `STREAM_CREATE` may answer (beyond `ENOMEM`, always allowed by [`World::check`]).
const CREATE: &[Errno] = &[ENODEV, EOPNOTSUPP, ENOSPC];
/// What a command naming a stream or an event by handle may answer: `STREAM_DESTROY`,
/// `STREAM_QUERY`, `EVENT_DESTROY`, `EVENT_QUERY`.
const BY_HANDLE: &[Errno] = &[ENOENT];
/// What `STREAM_SUBMIT` of well-formed structures (a readable and writable `ops`) may answer
/// (`ENOSPC`: an ALLOC past the file's quota; `EINTR`: an ALLOC, as `MEM_ALLOC` from a pool
/// may, which the fuzzer's pool allocations allow too).
const SUBMIT: &[Errno] = &[
    ENOENT, EINVAL, EOVERFLOW, ENXIO, ENODEV, EOPNOTSUPP, EPERM, EIO, EAGAIN, ENOSPC, EINTR,
];
/// The sizes a batch's ALLOCs ask for (0: `EINVAL`).
const ALLOC_SIZES: [u64; 6] = [4096, 8192, 65536, 1 << 20, 12345, 0];
/// What `STREAM_SYNC` of one stream and `EVENT_SYNC` may answer, with a valid timeout
/// (`EVENT_SYNC` makes its point's fence the first time: `ENOMEM`).
const SYNC: &[Errno] = &[EIO, ETIMEDOUT, EINTR, ENOENT, ENOMEM];
/// What `STREAM_SYNC` with `RUVM_SYNC_EVERY_STREAM` may answer.
const SYNC_ALL: &[Errno] = &[EIO, ETIMEDOUT, EINTR];
/// What `STREAM_STATUS` may answer.
const STATUS: &[Errno] = &[ENOENT, ENOSPC];
/// What `EVENT_CREATE` may answer.
const EVENT_CREATE: &[Errno] = &[ENOSPC];
/// What `EVENT_EXPORT` may answer.
const EXPORT: &[Errno] = &[ENOENT, EMFILE, ENOMEM];
/// A stream's sticky errors (`STREAM_QUERY`'s `error`, and what an event's point signals with):
/// an MMU fault, the GPU removed, a wait's timeout, the stream cancelled, and the errno of a
/// waited-for fence (a sw_sync timeline closed with it pending: `ENOENT`); a simulated engine's
/// bounce page not had (`ENOMEM`), a signal in an engine's wait (`EINTR`).
const STICKY: &[Errno] = &[EFAULT, ENODEV, ETIMEDOUT, ECANCELED, ENOENT, EINTR, ENOMEM];

/// The GPU VAs the fuzzer maps mems at in a file's user VA space (as `gpu_va` does).
const VAS: [u64; 4] = [1 << 32, (1 << 32) + 4096, 1 << 40, (1 << 49) - (64 << 10)];

/// Streams made by a worker, not yet destroyed (weak: a stream does not keep its file open).
#[derive(Clone)]
struct StreamRec {
    file: Weak<Ruvm>,
    handle: u64,
    gpu: u32,
}

/// Events made by a worker, not yet destroyed.
#[derive(Clone)]
struct EventRec {
    file: Weak<Ruvm>,
    handle: u64,
}

/// A sw_sync timeline and its value.
struct Timeline {
    tl: sync_file::SwSyncTimeline,
    value: u32,
}

/// One worker's streams, events and sw_sync timeline.
pub(super) struct State {
    streams: Mutex<Vec<StreamRec>>,
    events: Mutex<Vec<EventRec>>,
    /// Root with `CONFIG_SW_SYNC` only.
    sw_sync: Option<Mutex<Timeline>>,
    /// Whether this worker ever advances its timeline (one in three never does: every wait for
    /// it times out).
    advances: bool,
    /// The sync_files handed to the parent, kept open until it took them ([`fences`]).
    kept: fences::Kept,
}

impl State {
    pub(super) fn new(rng: &mut Rng) -> Self {
        let sw_sync = sync_file::SwSyncTimeline::open()
            .ok()
            .map(|tl| Mutex::new(Timeline { tl, value: 0 }));
        Self {
            streams: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            sw_sync,
            advances: !rng.one_in(3),
            kept: fences::Kept::default(),
        }
    }
}

/// Whether `w` is the file `f` points to.
fn same(w: &Weak<Ruvm>, f: &Arc<Ruvm>) -> bool {
    std::ptr::eq(w.as_ptr(), Arc::as_ptr(f))
}

/// A random timeout of a wait operation (ms): short, so nothing blocks long.
fn wait_ms(rng: &mut Rng) -> u32 {
    1 + rng.below(500) as u32
}

/// A random timeout of a sync (ms): at most a second.
fn sync_ms(rng: &mut Rng) -> u32 {
    1 + rng.below(1000) as u32
}

impl World {
    /// A GPU for a stream: mostly a simulated one (fast engines), sometimes any id.
    fn stream_gpu(&self, rng: &mut Rng) -> u32 {
        if self.sims.is_empty() || rng.one_in(6) {
            self.gpu(rng)
        } else {
            rng.pick(&self.sims)
        }
    }

    /// A live stream of this worker, and its file.
    fn stream(&self, rng: &mut Rng) -> Option<(Arc<Ruvm>, StreamRec)> {
        let mut list = self.streams.streams.lock().ok()?;
        list.retain(|s| s.file.strong_count() > 0);
        if list.is_empty() {
            return None;
        }
        let s = list[rng.below(list.len() as u64) as usize].clone();
        drop(list);
        Some((s.file.upgrade()?, s))
    }

    fn forget_stream(&self, handle: u64, file: &Arc<Ruvm>) {
        if let Ok(mut l) = self.streams.streams.lock() {
            l.retain(|s| !(s.handle == handle && same(&s.file, file)));
        }
    }

    /// A stream of file `d` (on `gpu` if given), made if there is none, or made again if the
    /// one found is in error.
    fn stream_on(&self, d: &Arc<Ruvm>, gpu: Option<u32>, rng: &mut Rng) -> Option<StreamRec> {
        let mine: Vec<StreamRec> = self
            .streams
            .streams
            .lock()
            .ok()?
            .iter()
            .filter(|s| same(&s.file, d) && gpu.is_none_or(|g| g == s.gpu))
            .cloned()
            .collect();
        if !mine.is_empty() {
            let s = mine[rng.below(mine.len() as u64) as usize].clone();
            match d.stream_query(s.handle) {
                Ok(q) if q.error == 0 => return Some(s),
                Ok(_) => {
                    // In error for good: destroyed and made again.
                    self.check("STREAM_DESTROY", d.stream_destroy(s.handle), BY_HANDLE);
                    self.forget_stream(s.handle, d);
                }
                Err(_) => self.forget_stream(s.handle, d),
            }
        }
        let g = gpu.unwrap_or_else(|| self.stream_gpu(rng));
        self.create_stream(d, g)
    }

    /// `STREAM_CREATE` on `gpu`, listed (at most 16 streams a file: one goes first).
    fn create_stream(&self, d: &Arc<Ruvm>, gpu: u32) -> Option<StreamRec> {
        let old = self.streams.streams.lock().ok().and_then(|l| {
            let of: Vec<&StreamRec> = l.iter().filter(|s| same(&s.file, d)).collect();
            (of.len() >= 16).then(|| of[0].handle)
        });
        if let Some(h) = old {
            self.check("STREAM_DESTROY", d.stream_destroy(h), BY_HANDLE);
            self.forget_stream(h, d);
        }
        let s = self.check("STREAM_CREATE", d.stream_create(gpu), CREATE)?;
        if s.handle == 0 {
            self.problem(format!("STREAM_CREATE on GPU {gpu} gave handle 0"));
        }
        let rec = StreamRec {
            file: Arc::downgrade(d),
            handle: s.handle,
            gpu,
        };
        if let Ok(mut l) = self.streams.streams.lock() {
            l.push(rec.clone());
        }
        Some(rec)
    }

    /// An event of file `d` (made if it has none), or now and then a handle it has not.
    fn event_of(&self, d: &Arc<Ruvm>, rng: &mut Rng) -> u64 {
        if rng.one_in(12) {
            let any = rng.next();
            return rng.pick(&[0, u64::MAX, any]);
        }
        let mine: Vec<u64> = self
            .streams
            .events
            .lock()
            .map(|l| {
                l.iter()
                    .filter(|e| same(&e.file, d))
                    .map(|e| e.handle)
                    .collect()
            })
            .unwrap_or_default();
        if mine.is_empty() || rng.one_in(16) {
            return self.create_event(d).unwrap_or(0);
        }
        mine[rng.below(mine.len() as u64) as usize]
    }

    /// `EVENT_CREATE`, listed (at most 64 events a file: one goes first).
    fn create_event(&self, d: &Arc<Ruvm>) -> Option<u64> {
        let old = self.streams.events.lock().ok().and_then(|l| {
            let of: Vec<u64> = l
                .iter()
                .filter(|e| same(&e.file, d))
                .map(|e| e.handle)
                .collect();
            (of.len() >= 64).then(|| of[0])
        });
        if let Some(h) = old {
            self.check("EVENT_DESTROY", d.event_destroy(h), BY_HANDLE);
            self.forget_event(h, d);
        }
        let h = self.check("EVENT_CREATE", d.event_create(), EVENT_CREATE)?;
        if h == 0 {
            self.problem("EVENT_CREATE gave handle 0".into());
        }
        if let Ok(mut l) = self.streams.events.lock() {
            l.push(EventRec {
                file: Arc::downgrade(d),
                handle: h,
            });
        }
        Some(h)
    }

    fn forget_event(&self, handle: u64, file: &Arc<Ruvm>) {
        if let Ok(mut l) = self.streams.events.lock() {
            l.retain(|e| !(e.handle == handle && same(&e.file, file)));
        }
    }

    /// A live event of this worker (of any of its files), and its file.
    fn event(&self, rng: &mut Rng) -> Option<(Arc<Ruvm>, u64)> {
        let mut list = self.streams.events.lock().ok()?;
        list.retain(|e| e.file.strong_count() > 0);
        if list.is_empty() {
            return None;
        }
        let e = list[rng.below(list.len() as u64) as usize].clone();
        drop(list);
        Some((e.file.upgrade()?, e.handle))
    }

    /// Up to four mems of this worker that file `d` has, with what `MEM_QUERY` says of them.
    fn mems_of(&self, d: &Ruvm, rng: &mut Rng) -> Vec<(u64, uapi::ruvm_mem_query)> {
        let hs: Vec<u64> = self.handles.lock().map(|h| h.clone()).unwrap_or_default();
        let mut out: Vec<(u64, uapi::ruvm_mem_query)> = Vec::new();
        if hs.is_empty() {
            return out;
        }
        for _ in 0..12 {
            if out.len() >= 4 {
                break;
            }
            let h = hs[rng.below(hs.len() as u64) as usize];
            if out.iter().any(|(x, _)| *x == h) {
                continue;
            }
            if let Ok(q) = d.mem_query(h) {
                out.push((h, q));
            }
        }
        out
    }

    /// Mostly maps `mems` as a stream on `gpu` needs them (on the GPU for copies, for the CPU
    /// kernel for fills, now and then one at a user VA for copies through VAs); now and then
    /// leaves one as it is (`ENXIO` at the submission).
    fn prepare(&self, d: &Ruvm, mems: &[(u64, uapi::ruvm_mem_query)], gpu: u32, rng: &mut Rng) {
        if let (Some((h, _)), true) = (mems.first(), rng.one_in(4)) {
            let r = d.map_gpu_user(*h, gpu, rng.pick(&VAS), false);
            self.check(
                "MEM_MAP_GPU_USER",
                r,
                &[ENOENT, ENODEV, EINVAL, EOPNOTSUPP, ERANGE, EEXIST, EINTR],
            );
        }
        for (h, q) in mems {
            if rng.below(8) != 0 && q.backing == uapi::ruvm_backing_RUVM_BACKING_SYSMEM {
                let r = d.mem_gpu(true, *h, gpu);
                self.check("MEM_MAP_GPU", r, &[ENOENT, ENODEV, EINVAL, EFAULT]);
            }
            if rng.below(8) != 0 {
                self.check(
                    "MEM_MAP_CPU_KERNEL",
                    d.map_kernel(*h),
                    &[ENOENT, EOPNOTSUPP],
                );
            }
        }
    }

    /// Frees mem `h` as `MEM_FREE` of the fuzzer does (listed as freed).
    fn free_mem(&self, d: &Ruvm, h: u64) {
        if self.check("MEM_FREE", d.mem_free(h), &[ENOENT]).is_some() {
            if let Ok(mut f) = self.freed.lock() {
                f.insert(h);
            }
            if let Ok(mut hs) = self.handles.lock() {
                hs.retain(|x| *x != h);
            }
        }
    }

    /// A sw_sync fence a little ahead of the timeline (it signals when the worker advances the
    /// timeline that far, if ever).
    fn sw_fence(&self, rng: &mut Rng) -> Option<OwnedFd> {
        let t = self.streams.sw_sync.as_ref()?.lock().ok()?;
        let v = t.value.saturating_add(1 + rng.below(3) as u32);
        t.tl.create_fence(v, "ruvm-fuzz").ok()
    }

    /// Advances the sw_sync timeline a little (a worker that never advances it does nothing).
    fn sw_advance(&self, rng: &mut Rng) {
        if !self.streams.advances {
            return;
        }
        let Some(t) = self.streams.sw_sync.as_ref() else {
            return;
        };
        if let Ok(mut t) = t.lock() {
            let by = 1 + rng.below(3) as u32;
            if t.tl.inc(by).is_ok() {
                t.value = t.value.saturating_add(by);
            }
        }
    }

    /// `EVENT_EXPORT` of event `e` of `d`, its sync_file checked: one fence, and while pending,
    /// ruvm's with a stream's timeline.
    fn export(&self, d: &Ruvm, e: u64) -> Option<OwnedFd> {
        let fd = self.check("EVENT_EXPORT", d.event_export(e), EXPORT)?;
        match sync_file::info(&fd) {
            Ok(i) => {
                let ok = match i.fence() {
                    None => false,
                    // Names are read before the status: pending then, they are ruvm's.
                    Some(f) if f.status == 0 => {
                        f.driver == "ruvm" && fences::timeline_gpu(&f.timeline).is_some()
                    }
                    Some(f) => f.status == 1 || status_ok(f.status),
                };
                if !ok {
                    self.problem(format!(
                        "EVENT_EXPORT of event {e}: a sync_file holding {i:?}"
                    ));
                }
            }
            Err(err) => self.problem(format!(
                "EVENT_EXPORT of event {e}: SYNC_IOC_FILE_INFO on the fd it gave: {err}"
            )),
        }
        Some(fd)
    }

    /// Hands a pending sync_file to the parent (it holds it beyond this worker's death): a
    /// duplicate stays open here until the parent took it (dropped with every cell in use).
    fn hand_over(&self, fd: &OwnedFd) {
        fences::hand_over(self.shared, self.slot, &self.streams.kept, fd);
    }

    /// After batch `b` was submitted: the mems its FREEs named by handle are gone (their
    /// handles answer `ENOENT`, their user mappings fault), and each of its ALLOCs made a mem,
    /// listed (tagged first, as every mem of the worker) unless the batch freed it too.
    fn submitted_mems(&self, d: &Ruvm, b: &Batch) {
        for &h in &b.frees {
            if let Ok(mut f) = self.freed.lock() {
                f.insert(h);
            }
            if let Ok(mut hs) = self.handles.lock() {
                hs.retain(|x| *x != h);
            }
            if let Ok(q) = d.mem_query(h) {
                self.problem(format!(
                    "MEM_QUERY of mem {h}, freed by a submitted FREE: {q:?}, wanted ENOENT"
                ));
            }
        }
        for &(i, size) in &b.allocs {
            let (h, offset) = op::allocated(&b.ops[i]);
            if h == 0 {
                self.problem(format!(
                    "STREAM_SUBMIT succeeded but its ALLOC at index {i} wrote no handle ({:?})",
                    b.ops[i]
                ));
                continue;
            }
            if b.freed_allocs.contains(&i) {
                continue;
            }
            let Ok(q) = d.mem_query(h) else {
                // Freed by another thread meanwhile (by any number, as the fuzzer does).
                continue;
            };
            if q.size != size || q.mmap_offset != offset {
                self.problem(format!(
                    "the ALLOC of {size} bytes made mem {h} (mmap offset {offset:#x}), but MEM_QUERY says {q:?}"
                ));
            }
            let a = uapi::ruvm_mem_alloc {
                handle: h,
                backing: q.backing,
                chunk_size: q.chunk_size,
                chunk_count: q.chunk_count,
                ..Default::default()
            };
            self.tag_mem(d, &a);
            if let Ok(mut hs) = self.handles.lock() {
                hs.push(h);
            }
        }
    }

    /// Checks what `STREAM_QUERY` said of stream `s`.
    fn check_query(&self, s: &StreamRec, q: &uapi::ruvm_stream_query) {
        // CAST: an errno, small.
        let err = Errno::from_raw(q.error as i32);
        let ok = q.completed <= q.submitted
            && q.gpu == s.gpu
            && q.pad == 0
            && (q.error == 0) == (q.failed_seqno == 0)
            && q.failed_seqno <= q.submitted
            && q.current_seqno <= q.submitted
            && q.current_done <= q.current_len
            && (q.error == 0 || STICKY.contains(&err));
        if !ok {
            self.problem(format!(
                "STREAM_QUERY of stream {} (GPU {}): a state that does not add up: {q:?}",
                s.handle, s.gpu
            ));
        }
    }
}

/// Whether a fence's negative status is an errno a stream may fail with.
fn status_ok(status: i32) -> bool {
    status < 0 && STICKY.contains(&Errno::from_raw(-status))
}

/// One random stream or event operation on `file` (or on the stream's own file).
pub(super) fn one(w: &World, file: &Arc<Ruvm>, rng: &mut Rng) {
    match rng.below(17) {
        16 => ualloc(w, rng),
        0 | 1 => {
            let g = w.stream_gpu(rng);
            w.create_stream(file, g);
        }
        2 => destroy_stream(w, rng),
        3 => {
            if rng.below(3) != 0 {
                w.create_event(file);
            } else {
                destroy_event(w, rng);
            }
        }
        4..=8 => submit(w, rng),
        9 | 10 => stream_wait(w, file, rng),
        11 | 12 => event_ops(w, rng),
        13 => malformed(w, rng),
        14 => free_under_work(w, rng),
        _ => {
            if rng.one_in(3) {
                close_busy(w, rng);
            } else {
                w.sw_advance(rng);
            }
        }
    }
}

/// `STREAM_DESTROY` of one of the worker's streams (sometimes busy: its work goes on); its
/// handle must answer `ENOENT` from then on.
fn destroy_stream(w: &World, rng: &mut Rng) {
    let Some((d, s)) = w.stream(rng) else { return };
    w.forget_stream(s.handle, &d);
    if rng.one_in(3) {
        busy_work(w, &d, s.handle, s.gpu, rng);
    }
    if w.check("STREAM_DESTROY", d.stream_destroy(s.handle), BY_HANDLE)
        .is_none()
    {
        return;
    }
    let h = s.handle;
    for (what, r) in [
        ("STREAM_QUERY", d.stream_query(h).map(drop)),
        (
            "STREAM_SUBMIT",
            d.stream_submit(h, &[op::record(0)]).map(drop),
        ),
        ("STREAM_SYNC", d.stream_sync(h, 1)),
        ("STREAM_DESTROY", d.stream_destroy(h)),
    ] {
        if r != Err(ENOENT) {
            w.problem(format!(
                "{what} of stream {h}, destroyed: {r:?}, wanted ENOENT"
            ));
        }
    }
}

/// `EVENT_DESTROY` of one of the worker's events; its handle must answer `ENOENT` then.
fn destroy_event(w: &World, rng: &mut Rng) {
    let Some((d, e)) = w.event(rng) else { return };
    w.forget_event(e, &d);
    if w.check("EVENT_DESTROY", d.event_destroy(e), BY_HANDLE)
        .is_none()
    {
        return;
    }
    for (what, r) in [
        ("EVENT_QUERY", d.event_query(e).map(drop)),
        ("EVENT_EXPORT", d.event_export(e).map(drop)),
        ("EVENT_SYNC", d.event_sync(e, 1)),
    ] {
        if r != Err(ENOENT) {
            w.problem(format!(
                "{what} of event {e}, destroyed: {r:?}, wanted ENOENT"
            ));
        }
    }
}

/// What a random batch needs kept until it is submitted, and what it wrote.
#[derive(Default)]
struct Batch {
    ops: Vec<uapi::ruvm_op>,
    /// The sync_files its WAIT_FDs name (the descriptors must be open at the submission).
    fds: Vec<OwnedFd>,
    /// Mems it copies into, within range.
    dsts: Vec<u64>,
    /// Mems it uses.
    used: Vec<u64>,
    /// Events it records.
    records: Vec<u64>,
    /// Whether it waits for the sw_sync timeline.
    sw: bool,
    /// The indexes of its ALLOCs and the sizes they ask for.
    allocs: Vec<(usize, u64)>,
    /// The indexes of the ALLOCs whose mems it frees by index.
    freed_allocs: Vec<usize>,
    /// The mems it frees by handle.
    frees: Vec<u64>,
}

/// A stream's query, one stream's sync, every stream's of the file, or a stream's slot of
/// the status page (read through a mapping of the page: its point never goes back, and never
/// passes what was submitted).
fn stream_wait(w: &World, file: &Arc<Ruvm>, rng: &mut Rng) {
    match rng.below(5) {
        3 => {
            let Some((d, s)) = w.stream(rng) else { return };
            let Some(st) = w.check("STREAM_STATUS", d.stream_status(s.handle), STATUS) else {
                return;
            };
            if st.offset != uapi::RUVM_STATUS_MMAP_OFFSET {
                w.problem(format!(
                    "STREAM_STATUS of stream {}: offset {:#x}",
                    s.handle, st.offset
                ));
            }
            let Some(page) = w.check("mmap of the status page", StatusPage::map(&d), &[]) else {
                return;
            };
            let (Some(seen), Ok(q)) = (page.completed(st.slot, s.handle), d.stream_query(s.handle))
            else {
                return;
            };
            if seen < st.completed || seen > q.submitted {
                w.problem(format!(
                    "status page slot {} of stream {}: {seen}, after STREAM_STATUS said {} and with {} submitted",
                    st.slot, s.handle, st.completed, q.submitted
                ));
            }
        }
        0 => {
            let Some((d, s)) = w.stream(rng) else { return };
            if let Some(q) = w.check("STREAM_QUERY", d.stream_query(s.handle), BY_HANDLE) {
                w.check_query(&s, &q);
                if q.error != 0 && rng.one_in(2) {
                    w.forget_stream(s.handle, &d);
                    w.check("STREAM_DESTROY", d.stream_destroy(s.handle), BY_HANDLE);
                }
            }
        }
        1 | 2 => {
            let Some((d, s)) = w.stream(rng) else { return };
            w.check("STREAM_SYNC", d.stream_sync(s.handle, sync_ms(rng)), SYNC);
        }
        _ => {
            let r = file.sync_every_stream(sync_ms(rng));
            w.check("STREAM_SYNC (every stream)", r, SYNC_ALL);
        }
    }
}

/// An event's query, sync or export (the sync_file checked, waited for a moment, sometimes
/// handed to the parent, then closed).
fn event_ops(w: &World, rng: &mut Rng) {
    let Some((d, e)) = w.event(rng) else { return };
    match rng.below(3) {
        0 => {
            if let Some(q) = w.check("EVENT_QUERY", d.event_query(e), BY_HANDLE) {
                let ok = match q.stream {
                    0 => q.status == 1 && q.seqno == 0,
                    _ => q.seqno >= 1 && (q.status == 0 || q.status == 1 || status_ok(q.status)),
                };
                if !ok {
                    w.problem(format!(
                        "EVENT_QUERY of event {e}: a state that does not add up: {q:?}"
                    ));
                }
            }
        }
        1 => {
            w.check("EVENT_SYNC", d.event_sync(e, sync_ms(rng)), SYNC);
        }
        _ => {
            if let Some(fd) = w.export(&d, e) {
                if rng.one_in(2) {
                    w.hand_over(&fd);
                }
                if rng.one_in(4) {
                    let t = std::time::Duration::from_millis(rng.below(50));
                    w.check(
                        "poll of an exported sync_file",
                        sync_file::wait(&fd, t),
                        &[],
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_stay_inside_and_aligned_when_they_mean_to() {
        let mut rng = Rng::new(7);
        let mut outside = 0;
        for _ in 0..10_000 {
            let most = rng.pick(&[16, 4 << 20]);
            let size = 1 + rng.below(most);
            let (off, len) = span(&mut rng, size, 1 << 20);
            if off.checked_add(len).is_some_and(|end| end <= size) && len > 0 {
                assert_eq!(off % 8, 0);
                assert!(len % 8 == 0 || (size < 8 && len <= 3), "{size} {off} {len}");
                assert!(len <= 1 << 20);
            } else {
                outside += 1;
            }
        }
        // About one in ten is meant to be refused.
        assert!((500..2000).contains(&outside), "{outside}");
    }

    #[test]
    fn sticky_statuses() {
        assert!(status_ok(-(ECANCELED as i32)));
        assert!(status_ok(-(ENODEV as i32)));
        assert!(!status_ok(-(EINVAL as i32)));
        assert!(!status_ok(0));
        assert!(!status_ok(1));
    }
}
