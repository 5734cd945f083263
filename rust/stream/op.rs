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
    audit::{self, Class, Counted},
    bind::fence::{Fence, Watch},
    gpu::{self, mmu, GpuAccess},
    mem::{
        cpu::{CpuFill, Fill},
        gpu::EngineCopy,
        Mem,
    },
    uapi,
};

use super::{engine::Engine, event::Event, Budget};

/// What an operation needs from the file that submits it.
pub(crate) trait Lookup {
    /// The file's mem `handle` (`ENOENT`).
    fn mem(&self, handle: u64) -> Result<Arc<Mem>>;
    /// The file's event `handle` (`ENOENT`).
    fn event(&self, handle: u64) -> Result<Arc<Event>>;
    /// The VA space `flags` names (`EPERM` for the kernel's without `CAP_SYS_ADMIN`).
    fn va_space(&self, flags: u32) -> Result<u64>;
}

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
    /// Records an event (the first operation of a submission: later records fold).
    Record,
    /// Waits for a fence, at most `timeout` from when the stream reaches it.
    Wait {
        watch: Pin<KBox<Watch<Engine>>>,
        timeout: Delta,
    },
    /// Nothing (a wait for an event never recorded).
    Nop,
}

/// One queued operation.
#[pin_data(PinnedDrop)]
pub(crate) struct Op {
    pub(super) seqno: u64,
    /// The last seqno it accounts for: operations after it in its submission that need
    /// nothing of their own (a record, a wait for nothing or for a point of its own stream)
    /// are folded into it and retire with it.
    covers: Atomic<u64>,
    pub(super) work: Work,
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
        let units = self.units.load(Relaxed);
        audit::sub(Class::StreamOps, units);
        self.budget.give(units);
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
    fn new(seqno: u64, work: Work, mems: u64, budget: &Arc<Budget>) -> Result<ListArc<Op>> {
        budget.take()?;
        let op = ListArc::pin_init(
            try_pin_init!(Op {
                covers: Atomic::new(seqno),
                seqno,
                work,
                done: Atomic::new(0),
                started <- new_spinlock!(None),
                _mems: Counted::new(Class::StreamMems, mems),
                units: Atomic::new(1),
                budget: budget.clone(),
                links <- ListLinks::new(),
            }),
            GFP_KERNEL_ACCOUNT,
        );
        match op {
            Ok(op) => {
                audit::add(Class::StreamOps, 1);
                Ok(op)
            }
            Err(e) => {
                budget.give(1);
                Err(e)
            }
        }
    }

    /// Bytes the operation moves (0 for those that move none).
    pub(super) fn len(&self) -> u64 {
        match &self.work {
            Work::Copy(c) => c.len() as u64,
            Work::CopyVa { len, .. } => *len,
            Work::Fill(f) => f.len() as u64,
            _ => 0,
        }
    }

    /// Runs the operation's next piece on `engine`'s GPU (at most one piece: the engine goes
    /// round the streams between pieces).
    pub(super) fn step(&self, engine: &Engine) -> Result<Step> {
        let done = self.done.load(Relaxed);
        let moved = match &self.work {
            Work::Nop | Work::Record => return Ok(Step::Done),
            Work::Wait { .. } => return self.wait_step(engine),
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
    fn wait_step(&self, engine: &Engine) -> Result<Step> {
        let Work::Wait { watch, timeout } = &self.work else {
            return Ok(Step::Done);
        };
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
        let Work::Wait { watch, timeout } = &self.work else {
            return true;
        };
        let started = *self.started.lock();
        watch.fence().is_signalled()
            || started.is_none_or(|t| t.elapsed() >= *timeout)
            || engine.gpu().access().is_err()
    }

    /// The operations it stands for: itself and those folded into it.
    pub(super) fn units(&self) -> u64 {
        self.units.load(Relaxed)
    }

    /// The last seqno it accounts for.
    pub(super) fn covers(&self) -> u64 {
        self.covers.load(Relaxed)
    }

    /// Folds the operation at `seqno` into this one (see `covers`). `EAGAIN` at the file's
    /// budget (a folded operation counts as one).
    fn fold(&self, seqno: u64) -> Result {
        self.budget.take()?;
        self.units.fetch_add(1, Relaxed);
        audit::add(Class::StreamOps, 1);
        self.covers.store(seqno, Relaxed);
        Ok(())
    }

    /// Whether it does no work on the engine (a record, a wait for nothing): retired as soon as
    /// the stream reaches it.
    pub(super) fn is_instant(&self) -> bool {
        matches!(self.work, Work::Record | Work::Nop)
    }
}

/// The fields of `struct ruvm_op` an operation's kind may name ([`only`]).
const FLAGS: u32 = 1 << 0;
const DST: u32 = 1 << 1;
const DST_OFFSET: u32 = 1 << 2;
const SRC: u32 = 1 << 3;
const SRC_OFFSET: u32 = 1 << 4;
const LENGTH: u32 = 1 << 5;
const VALUE: u32 = 1 << 6;
const FILL_KIND: u32 = 1 << 7;
const TIMEOUT: u32 = 1 << 8;

/// `EINVAL` unless every field of `op` that `named` does not name is 0, `reserved` too.
fn only(op: &uapi::ruvm_op, named: u32) -> Result {
    let fields = [
        (FLAGS, u64::from(op.flags)),
        (DST, op.dst),
        (DST_OFFSET, op.dst_offset),
        (SRC, op.src),
        (SRC_OFFSET, op.src_offset),
        (LENGTH, op.length),
        (VALUE, op.value),
        (FILL_KIND, u64::from(op.fill_kind)),
        (TIMEOUT, u64::from(op.timeout_ms)),
    ];
    if op.reserved != 0 || fields.iter().any(|(f, v)| named & f == 0 && *v != 0) {
        return Err(EINVAL);
    }
    Ok(())
}

/// An event recorded by a submission, moved only once the whole submission is queued.
pub(super) struct Recorded {
    pub(super) event: Arc<Event>,
    pub(super) seqno: u64,
}

/// Reads, checks and plans one operation of a submission, at `seqno` of the stream's timeline
/// `context` on `engine`'s GPU. A RECORD adds to `records`; a WAIT_EVENT sees the
/// last of those for its event (a submission is the same as its operations one by one).
/// Returns the new operation, or `None` if it was folded into `prev`, the submission's
/// previous one (see [`Op::fold`]): a record, and a wait that the stream's order already
/// satisfies (a point of its own timeline, or none), cost nothing then.
pub(super) fn plan(
    op: &uapi::ruvm_op,
    files: &dyn Lookup,
    engine: &Arc<Engine>,
    (context, seqno): (u64, u64),
    (records, budget, prev): (&mut KVec<Recorded>, &Arc<Budget>, Option<&Op>),
) -> Result<Option<ListArc<Op>>> {
    let gpu = engine.gpu();
    let wait_timeout = |ms: u32| -> Result<Delta> {
        if ms == 0 || ms > uapi::RUVM_WAIT_MAX_MS {
            return Err(EINVAL);
        }
        Ok(Delta::from_millis(i64::from(ms)))
    };
    match op.kind {
        uapi::ruvm_op_kind_RUVM_OP_COPY => {
            only(op, DST | DST_OFFSET | SRC | SRC_OFFSET | LENGTH)?;
            if op.length == 0 {
                return Err(EINVAL);
            }
            let (dst, src) = (files.mem(op.dst)?, files.mem(op.src)?);
            let copy = EngineCopy::plan(gpu, dst, op.dst_offset, src, op.src_offset, op.length)?;
            Op::new(seqno, Work::Copy(copy), 2, budget).map(Some)
        }
        uapi::ruvm_op_kind_RUVM_OP_COPY_VA => {
            only(op, FLAGS | DST | SRC | LENGTH)?;
            if op.flags & !uapi::ruvm_va_space_flags_RUVM_VA_USER != 0 {
                return Err(EINVAL);
            }
            mmu::check_copy(op.dst, op.src, op.length)?;
            let space = files.va_space(op.flags)?;
            gpu.access()?.mmu()?;
            let work = Work::CopyVa {
                space,
                dst: op.dst,
                src: op.src,
                len: op.length,
            };
            Op::new(seqno, work, 0, budget).map(Some)
        }
        uapi::ruvm_op_kind_RUVM_OP_FILL => {
            only(op, DST | DST_OFFSET | LENGTH | VALUE | FILL_KIND)?;
            if op.length == 0 {
                return Err(EINVAL);
            }
            let fill = match op.fill_kind {
                uapi::ruvm_fill_kind_RUVM_FILL_PATTERN => Fill::Pattern(op.value),
                // CAST: the low 8 bits are the byte, as RUVM_IOCTL_MEM_FILL's.
                uapi::ruvm_fill_kind_RUVM_FILL_BYTE => Fill::Byte(op.value as u8),
                _ => return Err(EINVAL),
            };
            gpu.access()?;
            let mem = files.mem(op.dst)?;
            let plan = CpuFill::plan(&mem, op.dst_offset, op.length, fill)?;
            Op::new(seqno, Work::Fill(plan), 1, budget).map(Some)
        }
        uapi::ruvm_op_kind_RUVM_OP_RECORD => {
            only(op, VALUE)?;
            let event = files.event(op.value)?;
            records.push(Recorded { event, seqno }, GFP_KERNEL_ACCOUNT)?;
            if let Some(p) = prev {
                p.fold(seqno)?;
                return Ok(None);
            }
            Op::new(seqno, Work::Record, 0, budget).map(Some)
        }
        uapi::ruvm_op_kind_RUVM_OP_WAIT_EVENT | uapi::ruvm_op_kind_RUVM_OP_WAIT_FD => {
            only(op, VALUE | TIMEOUT)?;
            let timeout = wait_timeout(op.timeout_ms)?;
            // A point of the stream's own timeline (recorded by this submission, or before it)
            // is satisfied by the stream's order: nothing to wait for, and no fence made.
            let fence = if op.kind == uapi::ruvm_op_kind_RUVM_OP_WAIT_FD {
                Some(Fence::from_sync_file(op.value)?).filter(|f| f.context() != context)
            } else {
                let event = files.event(op.value)?;
                if records.iter().any(|r| Arc::ptr_eq(&r.event, &event))
                    || event.context() == Some(context)
                {
                    None
                } else {
                    event.fence()?
                }
            };
            let Some(fence) = fence else {
                if let Some(p) = prev {
                    p.fold(seqno)?;
                    return Ok(None);
                }
                return Op::new(seqno, Work::Nop, 0, budget).map(Some);
            };
            let watch = KBox::pin_init(Watch::new(fence, engine.clone()), GFP_KERNEL_ACCOUNT)?;
            Op::new(seqno, Work::Wait { watch, timeout }, 0, budget).map(Some)
        }
        _ => Err(EINVAL),
    }
}

/// Whether the GPU `id` names can run streams: present (`ENODEV`) and with a copy engine
/// (`EOPNOTSUPP`).
pub(super) fn engine_gpu(id: u32) -> Result<Arc<gpu::GpuDev>> {
    let gpu = gpu::get(id)?;
    if !gpu.has_engine() {
        return Err(crate::bind::errno::eopnotsupp());
    }
    Ok(gpu)
}
