// SPDX-License-Identifier: GPL-2.0

//! Streams and events: ordered, asynchronous work of a file on a GPU's engine, on kernel fences
//! (CUDA's streams and events; UVM's channels and trackers).
//!
//! A stream ([`StreamCore`]) is a queue of operations ([`op`]) of one file on one GPU, and a
//! dma_fence timeline of its own: operation n of the stream has seqno n on it. Its GPU's engine
//! ([`engine`]) runs the operations in order, a piece at a time, going round the GPU's streams.
//! An event ([`event`]) is the point a RECORD operation put it at: that operation's fence,
//! which user space can hold as a sync_file.
//!
//! # Errors are sticky
//!
//! The first operation that fails (an MMU fault, the GPU removed, a wait that timed out or
//! whose fence failed) puts the stream in error: its errno and seqno are kept; every later
//! operation of the stream is retired without running, the fences of the points it covers signalled
//! with the same errno; submitting to it fails with `EIO` (`ENODEV` first once its GPU is going).
//!
//! # Teardown: every fence signals
//!
//! A destroyed stream's work goes on to its end (as `cudaStreamDestroy`'s). Cancelling a stream
//! (its file's release) retires every queued operation at once with `ECANCELED`; the one the
//! engine is running stops at its next piece. A GPU's removal fails the operations of its
//! streams with `ENODEV` (a blocked wait within one tick). At unload no stream is left and the
//! runners are waited for ([`engine::exit`]).

use kernel::{
    list::{
        impl_list_arc_safe, impl_list_item, AtomicTracker, List, ListArc, ListLinks, TryNewListArc,
    },
    new_condvar, new_mutex,
    prelude::*,
    rbtree::RBTree,
    sync::{
        atomic::{
            ordering::{Relaxed, Release},
            Atomic,
        },
        Arc, CondVar, Mutex,
    },
    time::msecs_to_jiffies,
};

use crate::{
    bind::fence::{self, OwnFence, NAME_LEN},
    uapi,
};

pub(crate) mod alloc;
mod budget;
pub(crate) mod engine;
pub(crate) mod event;
mod few;
mod implicit;
pub(crate) mod lookup;
mod named;
pub(crate) mod op;
pub(crate) mod plan;
pub(crate) mod status;
mod submit;
mod timeline;
mod turn;

pub(crate) use turn::plant_slow_turn;

pub(crate) use budget::{Budget, Units};
use timeline::{timeline_name, TIMES};

use alloc::Known;
use engine::Engine;
use op::{Op, Step};

/// Makes the layer's module-wide state: the engines' queue and registry, and the lock of
/// implicit exchanges with several objects (module init).
pub(crate) fn init() -> Result {
    implicit::init();
    engine::init()
}

/// The most operations of one submission.
pub(crate) const MAX_SUBMIT: u32 = uapi::RUVM_MAX_SUBMIT_OPS;
/// The most operations one step of the engine retires without running them (a stream in
/// error, records): then the engine goes on to the next stream.
const RETIRE_BATCH: usize = 64;

/// A stream's queue and counters.
struct StreamState {
    /// Operations not retired, in order; the engine takes the first while it runs a piece.
    queue: List<Op>,
    /// How many (bounded by the file's [`Budget`]).
    queued: u64,
    /// The seqno of the last operation submitted, and of the last retired.
    submitted: u64,
    completed: u64,
    /// The first failure: its error and seqno.
    error: Option<(Error, u64)>,
    /// Cancelled (its file is going): nothing more runs.
    cancelled: bool,
    /// Destroyed: its handle is gone, nothing more is submitted.
    destroyed: bool,
    /// The seqno of the operation the engine is on (0: none), its bytes moved and length.
    current: u64,
    /// The engine is running a piece of it now (it is out of the queue meanwhile).
    running: bool,
    progress: (u64, u64),
    /// The fences made for points not reached yet, by seqno (see [`event`]).
    points: RBTree<u64, OwnFence>,
    /// When recent points were reached: (`completed` then, time), the last [`TIMES`], oldest
    /// first from `times_at` (for a fence made after its point was reached).
    times: [(u64, i64); TIMES],
    times_at: usize,
    /// Cancelled: the first seqno that was not reached (its fence says `ECANCELED`).
    cancelled_from: u64,
    /// The last seqno of the operations retired (under the lock; `completed` follows once they
    /// are dropped).
    retired_to: u64,
    /// Its slot of the file's status page, once asked for: `completed` is published there.
    slot: Option<status::Slot>,
}

impl StreamState {
    /// `ENOENT` once destroyed or cancelled (the handle is gone), `ENODEV` once the GPU is
    /// going (before the sticky error, whatever it is: the stream can never run again, also
    /// once the GPU is bound again), `EIO` in error. With `first` (a submission's first check)
    /// a GPU going is `ENODEV` in any case; at its queueing, only for a stream in error (a
    /// submission that passed its first check before the removal began is queued, and fails
    /// as the work queued before it does).
    fn may_submit(&self, engine: &Engine, first: bool) -> Result {
        if self.destroyed || self.cancelled {
            return Err(ENOENT);
        }
        if first {
            drop(engine.gpu().access()?);
        }
        if self.error.is_some() {
            return Err(if engine.gpu().going() { ENODEV } else { EIO });
        }
        Ok(())
    }
}

/// A stream.
#[pin_data]
pub(crate) struct StreamCore {
    handle: u64,
    context: u64,
    name: [u8; NAME_LEN],
    engine: Arc<Engine>,
    /// Its file's budget of queued operations.
    budget: Arc<Budget>,
    /// Taken across one submission's checks and planning, so that submissions to the stream
    /// take their seqnos one after the other (the engine never takes it); a caller waits for
    /// it interruptibly ([`turn`]).
    #[pin]
    turns: turn::Turns,
    /// The points of other timelines the stream's submissions waited for: taken only with the
    /// turn (never waited for).
    #[pin]
    submitting: Mutex<Known>,
    /// The last seqno reached (as `StreamState::completed`, read without the lock: a pool's
    /// opportunistic reuse), and the last a synchronize observed.
    reached: Atomic<u64>,
    observed: Atomic<u64>,
    /// Destroyed or cancelled: no synchronize can observe it any more, so its points count as
    /// observed once reached (a pending free's points do not pin a stream that is gone).
    gone: Atomic<bool>,
    #[pin]
    state: Mutex<StreamState>,
    /// Notified when an operation retires.
    #[pin]
    retired: CondVar,
    #[pin]
    links: ListLinks,
    #[pin]
    tracker: AtomicTracker,
}

impl_list_arc_safe! {
    impl ListArcSafe<0> for StreamCore { tracked_by tracker: AtomicTracker; }
}
impl_list_item! {
    impl ListItem<0> for StreamCore { using ListLinks { self.links }; }
}

/// Where the engine puts a stream after a step.
pub(crate) enum After {
    /// Back on the ready list.
    Ready,
    /// On the blocked list.
    Blocked,
    /// On no list (nothing to run now).
    Idle,
}

/// What `RUVM_IOCTL_STREAM_QUERY` reports.
pub(crate) struct StreamInfo {
    pub(crate) gpu: u32,
    pub(crate) submitted: u64,
    pub(crate) completed: u64,
    pub(crate) error: Option<(Error, u64)>,
    pub(crate) current: u64,
    pub(crate) progress: (u64, u64),
}

impl StreamCore {
    /// A stream `handle` on GPU `gpu`: `ENODEV` if it is not present, `EOPNOTSUPP` without a
    /// copy engine.
    pub(crate) fn new(gpu: u32, handle: u64, budget: Arc<Budget>) -> Result<Arc<Self>> {
        let dev = plan::engine_gpu(gpu)?;
        let engine = engine::of(dev)?;
        let name = timeline_name(gpu, handle);
        Arc::pin_init(
            try_pin_init!(StreamCore {
                handle,
                context: fence::new_context(),
                name,
                engine,
                budget,
                turns <- turn::Turns::new(),
                submitting <- new_mutex!(Known::new()),
                reached: Atomic::new(0),
                observed: Atomic::new(0),
                gone: Atomic::new(false),
                state <- new_mutex!(StreamState {
                    queue: List::new(),
                    queued: 0,
                    submitted: 0,
                    completed: 0,
                    error: None,
                    cancelled: false,
                    destroyed: false,
                    current: 0,
                    running: false,
                    progress: (0, 0),
                    points: RBTree::new(),
                    times: [(0, 0); TIMES],
                    times_at: 0,
                    cancelled_from: 0,
                    retired_to: 0,
                    slot: None,
                }),
                retired <- new_condvar!(),
                links <- ListLinks::new(),
                tracker <- AtomicTracker::new(),
            }),
            GFP_KERNEL_ACCOUNT,
        )
    }

    /// Its dma_fence context.
    pub(crate) fn context(&self) -> u64 {
        self.context
    }

    /// Notes that a synchronize observed the stream up to `seqno` (under its lock).
    fn observe_locked(&self, _st: &StreamState, seqno: u64) {
        if self.observed.load(Relaxed) < seqno {
            self.observed.store(seqno, Release);
        }
    }

    /// Its counters now.
    pub(crate) fn info(&self) -> StreamInfo {
        let st = self.state.lock();
        StreamInfo {
            gpu: self.engine.gpu().id,
            submitted: st.submitted,
            completed: st.completed,
            error: st.error,
            current: st.current,
            progress: st.progress,
        }
    }

    /// Waits until every operation submitted before the call is retired: `EIO` if the stream
    /// is in error, `ETIMEDOUT`, `EINTR`.
    pub(crate) fn sync(&self, timeout_ms: u32) -> Result {
        let mut left = msecs_to_jiffies(timeout_ms);
        let mut st = self.state.lock();
        let target = st.submitted;
        while st.completed < target {
            match self.retired.wait_interruptible_timeout(&mut st, left) {
                kernel::sync::CondVarTimeoutResult::Timeout => {
                    if st.completed >= target {
                        break;
                    }
                    return Err(ETIMEDOUT);
                }
                kernel::sync::CondVarTimeoutResult::Signal { .. } => return Err(EINTR),
                kernel::sync::CondVarTimeoutResult::Woken { jiffies } => left = jiffies,
            }
        }
        // What was waited for is observed (its frees' chunks may be cached).
        self.observe_locked(&st, target);
        // In error by one of the operations waited for (one submitted after the call may
        // have failed too: not this call's business).
        if st.error.is_some_and(|(_, seqno)| seqno <= target) {
            return Err(EIO);
        }
        Ok(())
    }

    /// Its handle is gone: nothing more is submitted; queued work goes on. Its slot of the
    /// status page is given back (nothing can name the stream any more).
    pub(crate) fn destroy(&self) {
        let slot = {
            let mut st = self.state.lock();
            st.destroyed = true;
            st.slot.take()
        };
        drop(slot);
        self.gone.store(true, Release);
    }

    /// Whether it has work not retired.
    pub(crate) fn busy(&self) -> bool {
        self.state.lock().queued > 0
    }

    /// Cancels it (its file is going): every queued operation is retired now with `ECANCELED`;
    /// the one the engine runs stops at its next piece. The points of what was retired before
    /// signal with its result; the points after it with `ECANCELED`, in order: those of the
    /// operation the engine runs (and after) only once it is dropped (see [`Self::step`]), so
    /// no fence says the work is over while a piece of it may still write.
    pub(crate) fn cancel(self: &Arc<Self>) {
        self.gone.store(true, Release);
        let taken = {
            let mut st = self.state.lock();
            st.cancelled = true;
            if st.cancelled_from == 0 {
                st.cancelled_from = st.retired_to + 1;
            }
            core::mem::replace(&mut st.queue, List::new())
        };
        // What they held goes with the lock released, before the stream says it is idle.
        drop(taken);
        {
            let mut st = self.state.lock();
            // Operations retired but not yet dropped (a step's, or a submitter's retired
            // marks) are reached by whoever drops them (to `submitted`: the stream is
            // cancelled), not before; the one the engine runs, when it is dropped.
            let upto = if st.retired_to > st.completed {
                st.completed
            } else if st.running {
                st.current - 1
            } else {
                st.submitted
            };
            st.reach(upto);
            self.reached_now(&st);
            st.queued = 0;
            self.retired.notify_all();
        }
        // A blocked stream leaves the blocked list (its queue is empty now).
        self.engine.kick();
    }

    /// Whether it has an operation to run now (not blocked).
    fn has_ready_work(&self) -> bool {
        !self.state.lock().queue.is_empty()
    }

    /// Whether a blocked stream may go on (see [`op::Op::may_go_on`]).
    fn may_go_on(&self, engine: &Engine) -> bool {
        let mut st = self.state.lock();
        if st.cancelled || st.error.is_some() {
            return true;
        }
        let mut cursor = st.queue.cursor_front();
        match cursor.peek_next() {
            None => true,
            Some(op) => op.may_go_on(engine),
        }
    }

    /// One step of the engine on this stream: the next piece of its first operation. Before
    /// it, under the lock, operations that do no work (records) are retired in order, and in
    /// error every operation is (at most [`RETIRE_BATCH`] a step). The operations retired are
    /// dropped (what they held given back) with the lock released and out of the signalling
    /// section, and only then counted completed: after `STREAM_SYNC` nothing of them is left.
    fn step(&self, engine: &Engine) -> After {
        let mut retired = List::<Op>::new();
        let after = self.step_in(engine, &mut retired, false);
        self.count_retired(retired);
        after
    }

    /// What a submission does instead of the engine's step when the stream is on no list and
    /// not being run: retires its first operations if they are marks (records, waits its
    /// order satisfies, FREEs), as the engine would, with no runner woken. `Idle` if that emptied
    /// the queue; `Ready` if an operation with work (or more than [`RETIRE_BATCH`]) is left
    /// for the engine. Never runs a piece of work.
    pub(super) fn retire_marks(&self, engine: &Engine) -> After {
        let mut retired = List::<Op>::new();
        let after = self.step_in(engine, &mut retired, true);
        self.count_retired(retired);
        after
    }

    /// Drops the operations a step retired, with the lock released, then counts them
    /// completed and signals the points they reached.
    fn count_retired(&self, mut retired: List<Op>) {
        let mut last = None;
        let mut units = 0u64;
        while let Some(op) = retired.pop_front() {
            last = Some(op.covers());
            units += op.units();
            drop(op);
        }
        if let Some(seqno) = last {
            let mut st = self.state.lock();
            st.queued = st.queued.saturating_sub(units);
            self.reached_locked(&mut st, seqno);
        }
    }

    /// Its work up to `seqno` is retired: its points signalled, its status page told, its
    /// synchronizers woken.
    fn reached_locked(&self, st: &mut StreamState, seqno: u64) {
        // Cancelled meanwhile: every point left signals now (`ECANCELED` past what was
        // retired before the cancel), the operation the engine ran being dropped.
        let to = if st.cancelled { st.submitted } else { seqno };
        // The points' fences first: whoever sees them completed sees them signalled.
        st.reach(to);
        self.reached_now(st);
        self.retired.notify_all();
    }

    /// A step (see [`Self::step`]); with `marks_only`, one that stops at the first
    /// operation that is not a mark ([`Self::retire_marks`]).
    fn step_in(&self, engine: &Engine, retired: &mut List<Op>, marks_only: bool) -> After {
        let op = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let mut n = 0;
            loop {
                if n == RETIRE_BATCH {
                    return After::Ready;
                }
                n += 1;
                if marks_only {
                    let mut head = st.queue.cursor_front();
                    match head.peek_next() {
                        None => return After::Idle,
                        Some(op) if !op.is_mark() => return After::Ready,
                        Some(_) => {}
                    }
                }
                let Some(op) = st.queue.pop_front() else {
                    return After::Idle;
                };
                if st.error.is_some() {
                    self.retire_locked(st, op, retired);
                    continue;
                }
                if op.is_instant() {
                    // The GPU's removal fails these too, in order with the rest.
                    match engine.gpu().access() {
                        Ok(_) => self.retire_locked(st, op, retired),
                        Err(e) => {
                            st.error = Some((e, op.seqno));
                            self.retire_locked(st, op, retired);
                        }
                    }
                    continue;
                }
                st.current = op.seqno;
                st.running = true;
                st.progress = (op.done.load(Relaxed), op.len());
                break op;
            }
        };
        // The piece runs in the fence-signalling path (lockdep checks it on the debug kernel):
        // it allocates nothing and takes no lock that is held across an allocation or a wait.
        let step = {
            let _signalling = fence::Signalling::begin();
            op.step(engine)
        };
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.running = false;
        if st.cancelled {
            self.retire_locked(st, op, retired);
            return After::Idle;
        }
        match step {
            Ok(Step::More) => {
                st.progress = (op.done.load(Relaxed), op.len());
                st.queue.push_front(op);
                After::Ready
            }
            Ok(Step::Blocked) => {
                st.queue.push_front(op);
                After::Blocked
            }
            Ok(Step::Done) => {
                self.retire_locked(st, op, retired);
                After::Ready
            }
            Err(e) => {
                let e = if e == ERESTARTSYS { EINTR } else { e };
                st.error = Some((e, op.seqno));
                self.retire_locked(st, op, retired);
                After::Ready
            }
        }
    }

    /// Retires `op`, under the stream's lock: the caller counts it completed, and signals the
    /// points it reached (with the stream's error if it failed: set by the caller), once it is
    /// dropped.
    fn retire_locked(&self, st: &mut StreamState, op: ListArc<Op>, retired: &mut List<Op>) {
        st.retired_to = st.retired_to.max(op.covers());
        st.current = 0;
        st.progress = (0, 0);
        retired.push_back(op);
    }
}
