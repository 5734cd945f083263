// SPDX-License-Identifier: GPL-2.0

//! Reading, checking and planning a submission's operations: every field checked, every handle
//! looked up (a submission's events once, in a table), every mem and mapping an operation
//! needs held, before anything is queued ([`super::StreamCore::submit`]).

use kernel::{
    list::ListArc,
    prelude::*,
    sync::{atomic::Atomic, Arc},
    time::Delta,
};

use crate::{
    bind::fence::{Fence, Watch},
    gpu::{self, mmu},
    mem::{
        copy::EngineCopy,
        cpu::{CpuFill, Fill},
        pool::pending::{Asker, Clock},
        Made, Mem, MemCore, StreamAlloc,
    },
    uapi,
};

use super::{
    alloc::{Batch, Known},
    engine::Engine,
    implicit::Implicit,
    lookup::Lookup,
    named::Events,
    op::{Op, Work},
    Units,
};

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

/// Checks a RECORD (operation `index` of the submission) and notes its seqno for its event.
fn record(op: &uapi::ruvm_op, events: &mut Events, index: usize, seqno: u64) -> Result {
    only(op, VALUE)?;
    *events.get(index)?.1 = seqno;
    Ok(())
}

/// Checks a wait's fields: its timeout.
fn wait_checked(op: &uapi::ruvm_op) -> Result<Delta> {
    only(op, VALUE | TIMEOUT)?;
    let ms = op.timeout_ms;
    if ms == 0 || ms > uapi::RUVM_WAIT_MAX_MS {
        return Err(EINVAL);
    }
    Ok(Delta::from_millis(i64::from(ms)))
}

/// Whether operation `index` of a submission (`op`, at `seqno`), after another, is a mark
/// that folds into the operation before it at no cost, checked as [`plan`] checks it: a
/// RECORD (its seqno noted), or a WAIT_EVENT of an event the submission recorded before it
/// (satisfied by the stream's order). `false`: [`plan`] it.
pub(super) fn fold_mark(
    op: &uapi::ruvm_op,
    events: &mut Events,
    index: usize,
    seqno: u64,
) -> Result<bool> {
    match op.kind {
        uapi::ruvm_op_kind_RUVM_OP_RECORD => {
            record(op, events, index, seqno)?;
            Ok(true)
        }
        uapi::ruvm_op_kind_RUVM_OP_WAIT_EVENT => {
            wait_checked(op)?;
            Ok(*events.get(index)?.1 != 0)
        }
        _ => Ok(false),
    }
}

/// What planning a submission's operations shares: where they are read from and looked up,
/// the stream's engine and timeline, and the submission's own tables, each borrowed for the
/// planning (see [`super::StreamCore::submit`]).
pub(super) struct Submission<'a> {
    /// The submission's operations, as read once.
    pub(super) ops: &'a [uapi::ruvm_op],
    /// The files that handles name.
    pub(super) files: &'a dyn Lookup,
    /// The stream's engine (its GPU).
    pub(super) engine: &'a Arc<Engine>,
    /// The stream's fence context (its timeline).
    pub(super) context: u64,
    /// The stream's timeline as a pool sees it.
    pub(super) clock: &'a dyn Fn() -> Arc<dyn Clock>,
    /// The points the stream's earlier submissions waited for.
    pub(super) known: &'a Known,
    /// The events the submission names, and where it records them.
    pub(super) events: &'a mut Events,
    /// The operations the stream's budget lets it queue.
    pub(super) units: &'a mut Units,
    /// The submission's ALLOCs and FREEs (see [`super::alloc`]).
    pub(super) batch: &'a mut Batch,
}

/// Reads, checks and plans operation `index` of the submission `sub`, at `seqno` of the
/// stream's timeline, with one of the submission's units. A RECORD notes its seqno in the
/// submission's events; a WAIT_EVENT sees the last of those for its event (a submission is the
/// same as its operations one by one).
/// Returns the new operation, or `None` for a mark, which costs nothing of its own: folded into
/// the submission's previous operation (see [`Op::fold`]), or leading it (see
/// [`super::StreamCore::submit`]): a record, a wait that the stream's order already satisfies
/// (a point of its own timeline, a point reached, or none), an ALLOC the pool met at once with
/// nothing to zero, a FREE whose mem the next ALLOC takes whole.
///
/// ALLOC and FREE, and the index flags, are planned with the submission's batch (see
/// [`super::alloc`]), the operation after this one in view.
pub(super) fn plan(
    sub: &mut Submission<'_>,
    index: usize,
    seqno: u64,
) -> Result<Option<ListArc<Op>>> {
    let ops = sub.ops;
    let op = ops.get(index).ok_or(EINVAL)?;
    let next = ops.get(index + 1);
    let (files, engine, context, clock, known) =
        (sub.files, sub.engine, sub.context, sub.clock, sub.known);
    let (events, units, batch) = (&mut *sub.events, &mut *sub.units, &mut *sub.batch);
    let gpu = engine.gpu();
    match op.kind {
        uapi::ruvm_op_kind_RUVM_OP_COPY => {
            only(op, FLAGS | DST | DST_OFFSET | SRC | SRC_OFFSET | LENGTH)?;
            let known = DST_INDEX | SRC_INDEX | DST_PTR | SRC_PTR;
            let dst_side = Side::of(op.flags, DST_INDEX, DST_PTR, op.dst_offset)?;
            let src_side = Side::of(op.flags, SRC_INDEX, SRC_PTR, op.src_offset)?;
            if op.length == 0 || op.flags & !known != 0 {
                return Err(EINVAL);
            }
            let (dst, dst_offset) = dst_side.mem(batch, files, op.dst, op.dst_offset)?;
            let (src, src_offset) = src_side.mem(batch, files, op.src, op.src_offset)?;
            let (d, s): (&MemCore, &MemCore) = (&dst, &src);
            let implicit = Implicit::of(&[(d, true), (s, false)])?;
            let copy = EngineCopy::plan(gpu, dst, dst_offset, src, src_offset, op.length)?;
            Op::synced(seqno, Work::Copy(copy), implicit, 2, units).map(Some)
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
            let mem = batch.mem(files, op.dst, false)?;
            let plan = CpuFill::plan(&mem, op.dst_offset, op.length, fill)?;
            let m: &MemCore = &mem;
            let implicit = Implicit::of(&[(m, true)])?;
            Op::synced(seqno, Work::Fill(plan), implicit, 1, units).map(Some)
        }
        uapi::ruvm_op_kind_RUVM_OP_RECORD => {
            record(op, events, index, seqno)?;
            Ok(None)
        }
        uapi::ruvm_op_kind_RUVM_OP_WAIT_EVENT | uapi::ruvm_op_kind_RUVM_OP_WAIT_FD => {
            let timeout = wait_checked(op)?;
            // A point of the stream's own timeline (recorded by this submission, or before it)
            // is satisfied by the stream's order: nothing to wait for, and no fence made.
            let fence = if op.kind == uapi::ruvm_op_kind_RUVM_OP_WAIT_FD {
                Some(Fence::from_sync_file(op.value)?).filter(|f| f.context() != context)
            } else {
                let (event, recorded) = events.get(index)?;
                // Recorded by this submission: satisfied by the stream's order (its lock is
                // not taken). After another operation, `fold_mark` folds such a wait before
                // `plan` is called: the two decide alike.
                // Else the event's point and, unless it was reached, its fence, read at once
                // (the event may move meanwhile).
                let target = if *recorded != 0 {
                    None
                } else {
                    event.wait_target(context)?
                };
                match target {
                    Some((c, s, fence)) => {
                        // The stream's later ALLOCs follow this dependency (CUDA's
                        // FOLLOW_EVENT_DEPENDENCIES), reached or not.
                        batch.note_wait(c, s)?;
                        fence
                    }
                    None => None,
                }
            };
            let Some(fence) = fence else {
                return Ok(None);
            };
            let watch = KBox::pin_init(Watch::new(fence, engine.clone()), GFP_KERNEL_ACCOUNT)?;
            Op::new(seqno, Work::Wait { watch, timeout }, 0, units).map(Some)
        }
        uapi::ruvm_op_kind_RUVM_OP_ALLOC => {
            only(op, FLAGS | DST | DST_OFFSET | SRC | LENGTH)?;
            let zero = uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO;
            if op.length == 0 || op.flags & !zero != 0 {
                return Err(EINVAL);
            }
            // The FREE right before may have kept its mem for this ALLOC, whole (it checked
            // the pool, size and flags, and made this ALLOC's point the mem's); else a FREE
            // earlier in the submission may give its chunks (the same stream: ordered),
            // before the pool is asked.
            let mut inherits = None;
            let made = if let Some((mem, reused)) = batch.take_whole() {
                Ok(Made {
                    mem,
                    wait: None,
                    reused,
                })
            } else {
                let pool = batch.pool(files, op.src, gpu.id)?;
                let own = batch.tag(clock, seqno);
                let mut reusable = core::mem::replace(&mut batch.reusable, KVec::new());
                let knows = |c: u64, s: u64| batch.knows(known, c, s);
                let ask = Asker {
                    context,
                    knows: &knows,
                };
                let mut borrow = |p: &Arc<crate::mem::pool::Pool>, count: usize| {
                    let found = super::alloc::take_reusable(&mut reusable, p, count);
                    found.map(|(i, b)| {
                        inherits = Some(i);
                        b
                    })
                };
                let stream = StreamAlloc {
                    ask: &ask,
                    own,
                    borrow: &mut borrow,
                };
                let made = files.alloc(pool, op.length, op.flags & zero != 0, stream);
                batch.reusable = reusable;
                made
            };
            let Made { mem, wait, reused } = made?;
            if let Some(i) = inherits {
                batch.inherit(i, mem.clone());
            }
            let zero_len = if op.flags & zero != 0 {
                (reused as u64)
                    .checked_mul(mem.layout().chunk_size)
                    .ok_or(EOVERFLOW)?
            } else {
                0
            };
            let wait = match wait {
                Some(t) => {
                    let fence = t.clock.fence(t.seqno)?;
                    let watch =
                        KBox::pin_init(Watch::new(fence, engine.clone()), GFP_KERNEL_ACCOUNT)?;
                    Some((watch, Delta::from_millis(i64::from(uapi::RUVM_WAIT_MAX_MS))))
                }
                None => None,
            };
            let zero = match zero_len {
                0 => None,
                _ => Some(mem.sys_pages().ok_or(EINVAL)?),
            };
            let handle = crate::mem::Handle::new().0;
            batch.made(index, handle, mem)?;
            if wait.is_none() && zero.is_none() {
                return Ok(None);
            }
            let work = Work::Alloc {
                wait,
                waited: Atomic::new(false),
                zero,
                zero_len,
            };
            Op::new(seqno, work, 0, units).map(Some)
        }
        uapi::ruvm_op_kind_RUVM_OP_FREE => {
            only(op, FLAGS | DST)?;
            if op.flags & !DST_INDEX != 0 {
                return Err(EINVAL);
            }
            // The ALLOC right after (at the next seqno) takes the submission's own mem whole:
            // nothing to do in the stream.
            let whole = op.flags & DST_INDEX != 0
                && seqno
                    .checked_add(1)
                    .is_some_and(|s| batch.free_whole(op.dst, next, (context, s, clock)));
            if whole {
                return Ok(None);
            }
            let tag = batch.tag(clock, seqno);
            let freed = batch.free_of(files, op.dst, op.flags & DST_INDEX != 0)?;
            let work = Work::Free {
                mem: freed.1.clone(),
                parked: Atomic::new(false),
            };
            let new = Op::new(seqno, work, 1, units)?;
            batch.freed(freed, new.clone_arc(), tag)?;
            Ok(Some(new))
        }
        _ => Err(EINVAL),
    }
}

/// `struct ruvm_op` flags naming a mem of the submission's by its ALLOC's index.
const DST_INDEX: u32 = uapi::ruvm_op_flags_RUVM_OP_DST_INDEX;
const SRC_INDEX: u32 = uapi::ruvm_op_flags_RUVM_OP_SRC_INDEX;
/// `struct ruvm_op` flags naming a COPY's side by an address of the submitting process.
const DST_PTR: u32 = uapi::ruvm_op_flags_RUVM_OP_DST_PTR;
const SRC_PTR: u32 = uapi::ruvm_op_flags_RUVM_OP_SRC_PTR;

/// How a COPY names one of its mems.
#[derive(Clone, Copy)]
enum Side {
    Handle,
    /// By the index of an ALLOC of the submission.
    Index,
    /// By an address of the submitting process (its offset field 0).
    Ptr,
}

impl Side {
    /// The way `flags` name a side whose flags are `index` and `ptr`: `EINVAL` for both, or
    /// for an address with an offset of its own.
    fn of(flags: u32, index: u32, ptr: u32, offset: u64) -> Result<Self> {
        match (flags & index != 0, flags & ptr != 0) {
            (true, true) => Err(EINVAL),
            (true, false) => Ok(Self::Index),
            (false, true) if offset != 0 => Err(EINVAL),
            (false, true) => Ok(Self::Ptr),
            (false, false) => Ok(Self::Handle),
        }
    }

    /// The mem and offset the side names (`value` and `offset` are the op's fields).
    fn mem(
        self,
        batch: &Batch,
        files: &dyn Lookup,
        value: u64,
        offset: u64,
    ) -> Result<(Arc<Mem>, u64)> {
        match self {
            Self::Handle => Ok((batch.mem(files, value, false)?, offset)),
            Self::Index => Ok((batch.mem(files, value, true)?, offset)),
            Self::Ptr => {
                let (h, at) = files.handle_at(value)?;
                Ok((batch.mem(files, h, false)?, at))
            }
        }
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
