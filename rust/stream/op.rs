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
    bind::fence::{Fence, Watch},
    gpu::{self, mmu, GpuAccess},
    mem::{
        cpu::{CpuFill, Fill},
        gpu::EngineCopy,
        Mem,
    },
    uapi,
};

use super::{engine::Engine, event::Event, Budget, Units};

/// What an operation needs from the file that submits it.
pub(crate) trait Lookup {
    /// The file's mem `handle` (`ENOENT`).
    fn mem(&self, handle: u64) -> Result<Arc<Mem>>;
    /// Finds the file's event of each of `named` (one lookup for a submission, under one
    /// lock).
    fn events(&self, named: &mut [Option<Named>]);
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
    fn new(seqno: u64, work: Work, mems: u64, taken: &mut Units) -> Result<ListArc<Op>> {
        let budget = taken.budget().clone();
        // The op holds the unit from here; a failure to make it leaves it with `taken`.
        taken.hand(1)?;
        let op = ListArc::pin_init(
            try_pin_init!(Op {
                covers: Atomic::new(seqno),
                seqno,
                work,
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
    let given = |field: u32, value: u64| if value != 0 { field } else { 0 };
    let fields = given(FLAGS, op.flags.into())
        | given(DST, op.dst)
        | given(DST_OFFSET, op.dst_offset)
        | given(SRC, op.src)
        | given(SRC_OFFSET, op.src_offset)
        | given(LENGTH, op.length)
        | given(VALUE, op.value)
        | given(FILL_KIND, op.fill_kind.into())
        | given(TIMEOUT, op.timeout_ms.into());
    if op.reserved != 0 || fields & !named != 0 {
        return Err(EINVAL);
    }
    Ok(())
}

/// An event a submission names: its handle, the file's event of that handle (`None`: the
/// file has none), and the seqno the submission last recorded it at (0: none). Events are moved
/// only once the whole submission is queued.
pub(crate) struct Named {
    handle: u64,
    event: Option<Arc<Event>>,
    recorded: u64,
}

impl Named {
    /// The handle to look up.
    pub(crate) fn handle(&self) -> u64 {
        self.handle
    }

    /// The file's event of the handle.
    pub(crate) fn found(&mut self, event: Arc<Event>) {
        self.event = Some(event);
    }
}

/// The events a submission names (RECORD, WAIT_EVENT), each once: a hash table by handle
/// (open addressing, at most half full), so that an operation finds its event in a step or two
/// whatever their number.
pub(super) struct Events {
    slots: KVec<Option<Named>>,
    mask: usize,
}

impl Events {
    /// Looks up the events `ops` name in `files`, at once.
    pub(super) fn of(ops: &[uapi::ruvm_op], files: &dyn Lookup) -> Result<Self> {
        let names = |op: &&uapi::ruvm_op| {
            matches!(
                op.kind,
                uapi::ruvm_op_kind_RUVM_OP_RECORD | uapi::ruvm_op_kind_RUVM_OP_WAIT_EVENT
            )
        };
        let n = ops.iter().filter(names).count();
        if n == 0 {
            // Nothing to look up: no table, and the file's lock is not taken.
            return Ok(Self {
                slots: KVec::new(),
                mask: 0,
            });
        }
        let size = n
            .checked_mul(2)
            .and_then(usize::checked_next_power_of_two)
            .ok_or(EINVAL)?;
        // Transient (freed before the call returns), bounded by the call: not charged.
        let mut slots = KVec::with_capacity(size, GFP_KERNEL)?;
        for _ in 0..size {
            // Room for every slot was reserved: this does not allocate.
            slots.push(None, GFP_KERNEL)?;
        }
        let mut table = Self {
            slots,
            mask: size - 1,
        };
        for op in ops.iter().filter(names) {
            let slot = table.slot(op.value)?;
            if slot.is_none() {
                *slot = Some(Named {
                    handle: op.value,
                    event: None,
                    recorded: 0,
                });
            }
        }
        files.events(&mut table.slots);
        Ok(table)
    }

    /// The slot of `handle`: its entry, or the empty slot where it goes.
    fn slot(&mut self, handle: u64) -> Result<&mut Option<Named>> {
        // Fibonacci hashing: the handles of a file are consecutive numbers.
        // CAST: the top bits of the product, fewer than a usize holds.
        let mut i = (handle.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & self.mask;
        for _ in 0..self.slots.len() {
            match self.slots.get(i).ok_or(EINVAL)? {
                Some(n) if n.handle != handle => i = (i + 1) & self.mask,
                _ => break,
            }
        }
        self.slots.get_mut(i).ok_or(EINVAL)
    }

    /// The event `handle` names (`ENOENT` if the file has none).
    fn get(&mut self, handle: u64) -> Result<(&Arc<Event>, &mut u64)> {
        match self.slot(handle)? {
            Some(Named {
                event: Some(e),
                recorded,
                ..
            }) => Ok((e, recorded)),
            _ => Err(ENOENT),
        }
    }

    /// The events the submission recorded, with the seqno of each one's last record.
    pub(super) fn recorded(&self) -> impl Iterator<Item = (&Arc<Event>, u64)> {
        self.slots.iter().flatten().filter_map(|n| match &n.event {
            Some(e) if n.recorded != 0 => Some((e, n.recorded)),
            _ => None,
        })
    }
}

/// Reads, checks and plans one operation of a submission, at `seqno` of the stream's timeline
/// `context` on `engine`'s GPU, with one of the submission's `units`. A RECORD notes its seqno
/// in `events`; a WAIT_EVENT sees the last of those for its event (a submission is the same as
/// its operations one by one).
/// Returns the new operation, or `None` if it is to be folded into the submission's previous
/// one (`prev`: there is one; see [`Op::fold`]): a record, and a wait that the stream's order
/// already satisfies (a point of its own timeline, or none), cost nothing then.
pub(super) fn plan(
    op: &uapi::ruvm_op,
    files: &dyn Lookup,
    engine: &Arc<Engine>,
    (context, seqno): (u64, u64),
    (events, units, prev): (&mut Events, &mut Units, bool),
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
            Op::new(seqno, Work::Copy(copy), 2, units).map(Some)
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
            Op::new(seqno, work, 0, units).map(Some)
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
            Op::new(seqno, Work::Fill(plan), 1, units).map(Some)
        }
        uapi::ruvm_op_kind_RUVM_OP_RECORD => {
            only(op, VALUE)?;
            *events.get(op.value)?.1 = seqno;
            if prev {
                return Ok(None);
            }
            Op::new(seqno, Work::Record, 0, units).map(Some)
        }
        uapi::ruvm_op_kind_RUVM_OP_WAIT_EVENT | uapi::ruvm_op_kind_RUVM_OP_WAIT_FD => {
            only(op, VALUE | TIMEOUT)?;
            let timeout = wait_timeout(op.timeout_ms)?;
            // A point of the stream's own timeline (recorded by this submission, or before it)
            // is satisfied by the stream's order: nothing to wait for, and no fence made.
            let fence = if op.kind == uapi::ruvm_op_kind_RUVM_OP_WAIT_FD {
                Some(Fence::from_sync_file(op.value)?).filter(|f| f.context() != context)
            } else {
                let (event, recorded) = events.get(op.value)?;
                if *recorded != 0 || event.context() == Some(context) {
                    None
                } else {
                    event.fence()?
                }
            };
            let Some(fence) = fence else {
                if prev {
                    return Ok(None);
                }
                return Op::new(seqno, Work::Nop, 0, units).map(Some);
            };
            let watch = KBox::pin_init(Watch::new(fence, engine.clone()), GFP_KERNEL_ACCOUNT)?;
            Op::new(seqno, Work::Wait { watch, timeout }, 0, units).map(Some)
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
