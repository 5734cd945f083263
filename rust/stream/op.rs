// SPDX-License-Identifier: GPL-2.0

//! One operation of a stream: checked and planned when it is submitted (every handle looked up,
//! every range checked, every mem and mapping it needs held), run piece by piece by its GPU's
//! engine ([`super::engine`]), and retired once, with its result (the fences of the points it
//! reached then signal with it).
//!
//! What an operation holds keeps its memory alive: a copy holds both mems and their DMA tables,
//! a fill the CPU kernel mapping, so a mem freed with work queued on it keeps its chunks until
//! that work is retired (uvm_mem waits on its trackers the same way).

use kernel::{
    list::{impl_list_arc_safe, impl_list_item, ListArc, ListLinks},
    new_spinlock,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc, SpinLock,
    },
    time::{Delta, Instant, Monotonic},
};

use crate::{
    audit::{Class, Counted},
    bind::fence::Watch,
    gpu::{dma::Pages, GpuAccess},
    mem::{copy::EngineCopy, cpu::CpuFill, Mem},
};

use super::{engine::Engine, implicit::Implicit, Budget, Units};

/// What an operation does.
pub(super) enum Work {
    Copy(EngineCopy),
    CopyVa {
        space: u64,
        dst: u64,
        src: u64,
        len: u64,
    },
    Fill(CpuFill),
    /// Waits for a fence, at most `timeout` from when the stream reaches it.
    Wait {
        watch: Pin<KBox<Watch<Engine>>>,
        timeout: Delta,
    },
    /// Nothing of its own: the marks that lead a submission (records, waits already met,
    /// ALLOCs with nothing to do in order) on a busy stream.
    Nop,
    /// An ALLOC's work in its stream: the wait for a pending free's point it took
    /// (`ALLOW_INTERNAL_DEPENDENCIES`), then zeroing the reused chunks (`RUVM_ALLOC_ZERO`).
    Alloc {
        wait: Option<(Pin<KBox<Watch<Engine>>>, Delta)>,
        waited: Atomic<bool>,
        zero: Option<Arc<Pages>>,
        zero_len: u64,
    },
    /// A FREE: holds the mem (and, once the submission is queued, what it gave up, parked in
    /// it: `parked` says so, and the FREE's drop lets it go) until the stream reaches it.
    Free {
        mem: Arc<Mem>,
        parked: Atomic<bool>,
    },
}

/// Bytes an ALLOC zeroes per piece.
const ZERO_PIECE: u64 = 256 * 1024;

/// One queued operation.
#[pin_data(PinnedDrop)]
pub(crate) struct Op {
    pub(super) seqno: u64,
    /// The last seqno it accounts for: operations after it in its submission that need
    /// nothing of their own (a record, a wait for nothing or for a point of its own stream)
    /// are folded into it and retire with it.
    covers: Atomic<u64>,
    pub(super) work: Work,
    /// Its implicit sync on mems shared as dma-bufs (copies and fills).
    pub(super) implicit: Option<Implicit>,
    /// Bytes moved so far (copies, fills).
    pub(super) done: Atomic<u64>,
    /// When the stream first reached it (a wait's deadline counts from then).
    #[pin]
    started: SpinLock<Option<Instant<Monotonic>>>,
    _mems: Counted,
    /// The operations it stands for (itself and those folded into it): counted by the audit
    /// (`stream_ops`) and in its file's budget of queued operations, until it is dropped.
    units: Atomic<u64>,
    budget: Arc<Budget>,
    #[pin]
    links: ListLinks,
}

impl_list_arc_safe! {
    impl ListArcSafe<0> for Op { untracked; }
}
impl_list_item! {
    impl ListItem<0> for Op { using ListLinks { self.links }; }
}

#[pinned_drop]
impl PinnedDrop for Op {
    fn drop(self: Pin<&mut Self>) {
        // A FREE reached: the mappings its mem gave up go (the mem's chunks are its pool's
        // already, or go with its last holder).
        // Only the FREE that parked them: one of a failed submission never did.
        if let Work::Free { mem, parked } = &self.work {
            if parked.load(Relaxed) {
                drop(mem.unpark());
            }
        }
        self.budget.give(self.units.load(Relaxed));
    }
}

/// How a step of an operation ended.
pub(super) enum Step {
    /// It is done.
    Done,
    /// More pieces are left.
    More,
    /// It waits for a fence not yet signalled.
    Blocked,
}

impl Op {
    /// A new operation holding one of the submission's units, `taken` (left there if it
    /// cannot be made).
    pub(super) fn new(seqno: u64, work: Work, mems: u64, taken: &mut Units) -> Result<ListArc<Op>> {
        Self::synced(seqno, work, None, mems, taken)
    }

    /// [`Op::new`], with its implicit sync.
    pub(super) fn synced(
        seqno: u64,
        work: Work,
        implicit: Option<Implicit>,
        mems: u64,
        taken: &mut Units,
    ) -> Result<ListArc<Op>> {
        let budget = taken.budget().clone();
        // The op holds the unit from here; a failure to make it leaves it with `taken`.
        taken.hand(1)?;
        let op = ListArc::pin_init(
            try_pin_init!(Op {
                covers: Atomic::new(seqno),
                seqno,
                work,
                implicit,
                done: Atomic::new(0),
                started <- new_spinlock!(None),
                _mems: Counted::new(Class::StreamMems, mems),
                units: Atomic::new(1),
                budget,
                links <- ListLinks::new(),
            }),
            GFP_KERNEL_ACCOUNT,
        );
        if op.is_err() {
            taken.put_back();
        }
        op
    }

    /// Bytes the operation moves (0 for those that move none).
    pub(super) fn len(&self) -> u64 {
        match &self.work {
            Work::Copy(c) => c.len() as u64,
            Work::CopyVa { len, .. } => *len,
            Work::Fill(f) => f.len() as u64,
            Work::Alloc { zero_len, .. } => *zero_len,
            _ => 0,
        }
    }

    /// Runs the operation's next piece on `engine`'s GPU (at most one piece: the engine goes
    /// round the streams between pieces).
    pub(super) fn step(&self, engine: &Engine) -> Result<Step> {
        if let Some(i) = &self.implicit {
            // Not before its fence is in the buffers' objects (its submission publishes it
            // right after queueing it, then kicks the engine).
            if i.waits().is_none() {
                return Ok(Step::Blocked);
            }
            if let Some(e) = i.doomed() {
                return Err(e);
            }
            while let Some(watch) = i.pending() {
                match self.wait_step(watch, &super::implicit::timeout(), engine)? {
                    Step::Done => i.passed(),
                    s => return Ok(s),
                }
            }
        }
        let done = self.done.load(Relaxed);
        let moved = match &self.work {
            Work::Nop | Work::Free { .. } => return Ok(Step::Done),
            Work::Wait { watch, timeout } => return self.wait_step(watch, timeout, engine),
            Work::Alloc {
                wait,
                waited,
                zero,
                zero_len,
            } => {
                if let Some((watch, timeout)) = wait {
                    if !waited.load(Relaxed) {
                        match self.wait_step(watch, timeout, engine)? {
                            Step::Done => waited.store(true, Relaxed),
                            s => return Ok(s),
                        }
                    }
                }
                let Some(pages) = zero else {
                    return Ok(Step::Done);
                };
                let _access: GpuAccess<'_> = engine.gpu().access()?;
                let n = (*zero_len - done).min(ZERO_PIECE);
                pages
                    .bytes()
                    .zero(usize::try_from(done)?, usize::try_from(n)?)?;
                n
            }
            Work::Copy(c) => {
                let access = engine.gpu().access()?;
                c.piece(&access, usize::try_from(done)?)? as u64
            }
            Work::CopyVa {
                space,
                dst,
                src,
                len,
            } => {
                let access = engine.gpu().access()?;
                access.mmu()?.copy_piece(*space, *dst, *src, *len, done)?
            }
            Work::Fill(f) => {
                // The GPU's removal fails the stream's work, fills included.
                let _access: GpuAccess<'_> = engine.gpu().access()?;
                f.piece(usize::try_from(done)?)? as u64
            }
        };
        let done = done + moved;
        self.done.store(done, Relaxed);
        Ok(if done >= self.len() {
            Step::Done
        } else {
            Step::More
        })
    }

    /// A wait's step: done if its fence signalled (failed with the fence's error if it
    /// signalled one), `ETIMEDOUT` past its deadline, `ENODEV` if the GPU is going, otherwise
    /// blocked with its callback armed (which wakes the engine).
    fn wait_step(
        &self,
        watch: &Pin<KBox<Watch<Engine>>>,
        timeout: &Delta,
        engine: &Engine,
    ) -> Result<Step> {
        let started = *self
            .started
            .lock()
            .get_or_insert_with(Instant::<Monotonic>::now);
        loop {
            match watch.fence().status() {
                0 => {}
                s if s < 0 => return Err(Error::from_errno(s)),
                _ => return Ok(Step::Done),
            }
            if started.elapsed() >= *timeout {
                return Err(ETIMEDOUT);
            }
            if engine.gpu().access().is_err() {
                return Err(ENODEV);
            }
            if watch.as_ref().arm() {
                return Ok(Step::Blocked);
            }
            // Signalled between the check and the arming: look again.
        }
    }

    /// Whether a blocked wait may go on: its fence signalled, its deadline passed, or the GPU
    /// is going (the next step then ends it).
    pub(super) fn may_go_on(&self, engine: &Engine) -> bool {
        if self.implicit.as_ref().is_some_and(|i| i.waits().is_none()) {
            return false;
        }
        let implicit = self.implicit.as_ref().and_then(|i| i.pending());
        let implicit_timeout = super::implicit::timeout();
        let (watch, timeout) = match &self.work {
            _ if implicit.is_some() => match implicit {
                Some(w) => (w, &implicit_timeout),
                None => return true,
            },
            Work::Wait { watch, timeout } => (watch, timeout),
            Work::Alloc {
                wait: Some((watch, timeout)),
                waited,
                ..
            } if !waited.load(Relaxed) => (watch, timeout),
            _ => return true,
        };
        let started = *self.started.lock();
        watch.fence().is_signalled()
            || started.is_none_or(|t| t.elapsed() >= *timeout)
            || engine.gpu().access().is_err()
    }

    /// A FREE parked what its mem gave up (its submission is queued).
    pub(super) fn parked(&self) {
        if let Work::Free { parked, .. } = &self.work {
            parked.store(true, Relaxed);
        }
    }

    /// The operations it stands for: itself and those folded into it.
    pub(super) fn units(&self) -> u64 {
        self.units.load(Relaxed)
    }

    /// The last seqno it accounts for.
    pub(super) fn covers(&self) -> u64 {
        self.covers.load(Relaxed)
    }

    /// Folds `n` operations after it, the last at seqno `last`, into this one (see `covers`):
    /// it takes their units of the submission's `units`.
    pub(super) fn fold(&self, (n, last): (u64, u64), units: &mut Units) -> Result {
        if n == 0 {
            return Ok(());
        }
        units.hand(n)?;
        self.units.fetch_add(n, Relaxed);
        self.covers.store(last, Relaxed);
        Ok(())
    }

    /// Whether it does no work on the engine (a record, a wait for nothing, a FREE): retired
    /// as soon as the stream reaches it.
    pub(super) fn is_instant(&self) -> bool {
        matches!(self.work, Work::Nop | Work::Free { .. })
    }

    /// Whether it is a mark: an instant operation (a record, a wait the stream's order
    /// satisfied, a FREE), which a submitter may retire itself. (A FREE's retirement drops
    /// what its mem parked: with no lock held, as the runner does it.)
    pub(super) fn is_mark(&self) -> bool {
        self.is_instant()
    }
}
