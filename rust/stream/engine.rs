// SPDX-License-Identifier: GPL-2.0

//! A GPU's engine as streams see it: one runner per GPU (a work item on the module's own
//! queue, so two GPUs' runners run at once and none outlives the module) that goes round the
//! GPU's ready streams a piece at a time, so streams of one GPU share the engine fairly.
//!
//! A stream is on at most one of the engine's two lists: `ready` (it has work it can run) or
//! `blocked` (its next operation waits for a fence). A blocked stream goes back to `ready` when
//! its fence signals (the fence's callback wakes the runner, [`Wake`]), when its wait's
//! deadline passes or when the GPU goes: while any stream is blocked, a tick wakes the runner
//! every [`TICK_MS`] to look.
//!
//! The runner signals fences: everything it does between taking a stream and retiring an
//! operation allocates nothing and takes only the streams' and the engine's own locks, which
//! no allocating or waiting path holds (the fence-signalling rule); operations it retires are
//! dropped (their memory given back) after that section ends.

use kernel::{
    impl_has_delayed_work, impl_has_work,
    list::{List, ListArc},
    new_delayed_work, new_spinlock, new_work,
    prelude::*,
    sync::{
        atomic::{
            ordering::{Acquire, Full, Release},
            Atomic,
        },
        Arc, SpinLock,
    },
    time::{msecs_to_jiffies, Delta, Instant, Monotonic},
    workqueue::{DelayedWork, Work, WorkItem},
};

use crate::{
    bind::{fence::Wake, global::global, workqueue::ModuleQueue},
    gpu::GpuDev,
};

use super::StreamCore;

/// How often a runner with blocked streams looks at them again, at most.
const TICK_MS: u32 = 100;
/// How long a runner goes on before it lets other work of the queue run.
const SLICE_MS: i64 = 10;

/// The queue every runner runs on.
static QUEUE: ModuleQueue = ModuleQueue::new();

/// One GPU's engine.
#[pin_data]
pub(crate) struct Engine {
    gpu: Arc<GpuDev>,
    #[pin]
    ready: SpinLock<List<StreamCore>>,
    #[pin]
    blocked: SpinLock<List<StreamCore>>,
    #[pin]
    work: Work<Engine, 0>,
    #[pin]
    tick: DelayedWork<Engine, 1>,
    /// A tick is queued.
    ticking: Atomic<bool>,
    /// The module is going: no more ticks.
    stopping: Atomic<bool>,
}

impl_has_work! {
    impl HasWork<Self, 0> for Engine { self.work }
}
impl_has_delayed_work! {
    impl HasDelayedWork<Self, 1> for Engine { self.tick }
}

impl Engine {
    fn new(gpu: Arc<GpuDev>) -> Result<Arc<Self>> {
        Arc::pin_init(
            try_pin_init!(Engine {
                gpu,
                ready <- new_spinlock!(List::new()),
                blocked <- new_spinlock!(List::new()),
                work <- new_work!("ruvm stream engine"),
                tick <- new_delayed_work!("ruvm stream tick"),
                ticking: Atomic::new(false),
                stopping: Atomic::new(false),
            }),
            GFP_KERNEL,
        )
    }

    /// Whether nothing is queued on it: both lists empty, no tick queued.
    fn idle(&self) -> bool {
        self.ready.lock().is_empty()
            && self.blocked.lock().is_empty()
            && !self.ticking.load(Acquire)
    }

    /// Its GPU.
    pub(crate) fn gpu(&self) -> &GpuDev {
        &self.gpu
    }

    /// Makes the runner run (again) soon. Any context.
    pub(crate) fn kick(self: &Arc<Self>) {
        if let Some(q) = QUEUE.get() {
            let _ = q.enqueue::<Arc<Engine>, 0>(self.clone());
        }
    }

    /// After a submission to `stream`: if the stream is on no list and not being run, the
    /// submitter retires the marks at the head of its queue itself ([`StreamCore::retire_marks`]:
    /// a submission of records, satisfied waits and FREEs to an idle stream wakes no runner);
    /// what is left goes on the ready list, and the runner is kicked.
    pub(super) fn submitted(self: &Arc<Self>, stream: Arc<StreamCore>) {
        let Ok(s) = ListArc::try_from_arc(stream) else {
            // On a list, or being run: the runner comes to it.
            return;
        };
        let left = match s.retire_marks(self) {
            super::After::Idle => went_idle(s),
            _ => Some(s),
        };
        if let Some(s) = left {
            self.ready.lock().push_back(s);
            self.kick();
        }
    }

    /// Moves the blocked streams that may go on to the ready list; says whether any stays
    /// blocked.
    fn unblock(&self) -> bool {
        let mut all = core::mem::replace(&mut *self.blocked.lock(), List::new());
        let mut still = List::new();
        while let Some(s) = all.pop_front() {
            if s.may_go_on(self) {
                self.ready.lock().push_back(s);
            } else {
                still.push_back(s);
            }
        }
        let mut blocked = self.blocked.lock();
        blocked.push_all_back(&mut still);
        !blocked.is_empty()
    }

    /// The runner: a piece of work of each ready stream in turn, until none is ready or its
    /// slice is over (then it queues itself again).
    fn run(self: &Arc<Self>) {
        let start = Instant::<Monotonic>::now();
        {
            self.unblock();
            loop {
                let Some(stream) = self.ready.lock().pop_front() else {
                    break;
                };
                let state = stream.step(self);
                match state {
                    super::After::Ready => self.ready.lock().push_back(stream),
                    super::After::Blocked => self.blocked.lock().push_back(stream),
                    super::After::Idle => {
                        if let Some(s) = went_idle(stream) {
                            self.ready.lock().push_back(s);
                        }
                    }
                }
                if start.elapsed() > Delta::from_millis(SLICE_MS) {
                    self.kick();
                    break;
                }
            }
        }
        if !self.blocked.lock().is_empty() {
            self.arm_tick();
        }
    }

    /// Queues a tick, unless one is queued or the module is going. `ticking` is set before
    /// `stopping` is read, and [`exit`] sets `stopping` before it reads `ticking` (both fully
    /// ordered): either this sees `stopping`, or `exit` sees the tick and waits for it.
    fn arm_tick(self: &Arc<Self>) {
        if self.ticking.xchg(true, Full) {
            return;
        }
        if self.stopping.load(Acquire) {
            self.ticking.store(false, Release);
            return;
        }
        let queued = QUEUE.get().map(|q| {
            q.enqueue_delayed::<Arc<Engine>, 1>(self.clone(), msecs_to_jiffies(TICK_MS))
                .is_ok()
        });
        if queued != Some(true) {
            self.ticking.store(false, Release);
        }
    }
}

/// Takes `stream`, whose queue was found empty, off every list, then looks again: work
/// submitted meanwhile found it on a list or being run, and is left to the caller (the stream,
/// to be put on the ready list).
fn went_idle(stream: ListArc<StreamCore>) -> Option<ListArc<StreamCore>> {
    let stream = stream.into_arc();
    if !stream.has_ready_work() {
        return None;
    }
    ListArc::try_from_arc(stream).ok()
}

impl WorkItem<0> for Engine {
    type Pointer = Arc<Engine>;

    fn run(this: Arc<Engine>) {
        Engine::run(&this);
    }
}

impl WorkItem<1> for Engine {
    type Pointer = Arc<Engine>;

    fn run(this: Arc<Engine>) {
        // Cleared first, so that the runner it kicks may queue the next tick. The kick is safe
        // after `exit` saw it clear: this item runs on the queue `exit` destroys, which waits
        // for it (and lets it queue the runner there).
        this.ticking.store(false, Release);
        this.kick();
    }
}

impl Wake for Engine {
    /// A fence a blocked stream waits for signalled: the runner looks at its blocked streams
    /// when it runs.
    fn wake(this: &Arc<Self>) {
        this.kick();
    }
}

global! {
    /// Every GPU's engine, made with the GPU's first stream.
    static ENGINES: Mutex<KVec<Arc<Engine>>> = KVec::new();
}

/// The engine of `gpu`, made if it has none yet.
pub(super) fn of(gpu: Arc<GpuDev>) -> Result<Arc<Engine>> {
    let mut all = ENGINES.lock().ok_or(ENODEV)?;
    if let Some(e) = all.iter().find(|e| Arc::ptr_eq(&e.gpu, &gpu)) {
        return Ok(e.clone());
    }
    // An engine of an earlier binding is forgotten once idle (nothing on its lists, no tick:
    // its GPU is gone, so no stream of it blocks again); until then it stays, for `exit`.
    all.retain(|e| e.gpu.id != gpu.id || !e.idle());
    let e = Engine::new(gpu)?;
    all.push(e.clone(), GFP_KERNEL)?;
    Ok(e)
}

/// Makes the queue the runners run on (module init).
pub(crate) fn init() -> Result {
    ENGINES.init();
    QUEUE.init(c"ruvm-streams")
}

/// At unload, with no file open: stops the ticks, waits for every runner to end (every
/// operation is then retired, every fence signalled), frees the queue and forgets the engines.
pub(crate) fn exit() {
    let engines = ENGINES
        .lock()
        .map(|mut all| core::mem::replace(&mut *all, KVec::new()))
        .unwrap_or_default();
    for e in engines.iter() {
        e.stopping.xchg(true, Full);
    }
    // A tick already queued fires within `TICK_MS` (none is queued after `stopping`): the
    // queue is not destroyed under a pending timer.
    let start = Instant::<Monotonic>::now();
    let mut said = false;
    while engines.iter().any(|e| e.ticking.load(Acquire)) {
        if !said && start.elapsed() > Delta::from_millis(i64::from(TICK_MS) * 100) {
            // Never seen: a queued timer fires. Said, and waited for still (destroying the
            // queue under it would be a use after free).
            pr_err!("a stream engine's tick has not fired in 10 s\n");
            said = true;
        }
        kernel::time::delay::fsleep(Delta::from_millis(5));
    }
    QUEUE.destroy();
    drop(engines);
}
