// SPDX-License-Identifier: GPL-2.0

//! A submission ([`StreamCore::submit`]): its operations read once, their events looked up
//! once, each operation checked and planned in its stream's turn, the marks folded (or, leading
//! it, made one operation, or on an idle stream reached at once), then all queued or none.

use kernel::{list::List, list::ListArc, prelude::*, sync::Arc, uaccess::UserPtr};

use crate::uapi;

use super::{
    alloc::Batch, implicit, lookup::Lookup, named::Events, op, plan, Op, StreamCore, StreamState,
    Units, MAX_SUBMIT,
};

/// The operation of the marks that lead a submission: the first at `seqno`, `folded` the count
/// of them and the seqno of the last.
fn marks_op(seqno: u64, folded: (u64, u64), units: &mut Units) -> Result<ListArc<Op>> {
    let op = Op::new(seqno, op::Work::Nop, 0, units)?;
    op.fold((folded.0.saturating_sub(1), folded.1), units)?;
    Ok(op)
}

impl StreamCore {
    /// Checks and queues `count` operations read from `ops`: all or none. Returns the seqno of
    /// the first.
    pub(crate) fn submit(
        self: &Arc<Self>,
        ops: UserPtr,
        count: u32,
        files: &dyn Lookup,
    ) -> Result<u64> {
        if count == 0 || count > MAX_SUBMIT {
            return Err(EINVAL);
        }
        let n = usize::try_from(count)?;
        // Read whole, once, before any lock is taken (a fault on it takes the mmap lock).
        let raw = crate::bind::uread::read_array::<uapi::ruvm_op>(ops, n)?;
        let mut events = Events::of(&raw, files)?;
        let turn = self.turns.take()?;
        let mut known = self.submitting.lock();
        let mut batch = Batch::new(&raw)?;
        let clock = || -> Arc<dyn crate::mem::pool::pending::Clock> { self.clone() };
        // Idle (nothing queued, running or being retired: an operation the engine retired is
        // counted completed only once it is dropped, and its points must not be reached
        // before that) stays idle while the turn is held: only submissions queue.
        let (first, idle) = {
            let st = self.state.lock();
            st.may_submit(&self.engine, true)?;
            let idle = st.queue.is_empty() && !st.running && st.completed == st.submitted;
            (st.submitted + 1, idle)
        };
        let mut units = self.budget.take(u64::from(count))?;
        let mut planned = List::<Op>::new();
        // The operations whose fences go into dma-bufs' reservation objects once queued.
        let mut published: KVec<Arc<Op>> = KVec::new();
        let mut sub = plan::Submission {
            ops: &raw,
            files,
            engine: &self.engine,
            context: self.context,
            clock: &clock,
            known: &known,
            events: &mut events,
            units: &mut units,
            batch: &mut batch,
        };
        // The operation before, and the marks folded into it since (counted into it at once,
        // when the next is planned or the submission ends).
        let mut prev: Option<Arc<Op>> = None;
        let mut folded = (0u64, 0u64);
        // The seqno of the submission's first mark while no operation came before it: the
        // marks that lead it get an operation of their own only when one that is not a mark
        // follows (they are reached before it), or when the stream is busy.
        let mut lead: Option<u64> = None;
        for ((op, seqno), index) in raw.iter().zip(first..).zip(0usize..) {
            let new = if plan::fold_mark(op, sub.events, index, seqno)? {
                None
            } else {
                plan::plan(&mut sub, index, seqno)?
            };
            let Some(new) = new else {
                if prev.is_none() && lead.is_none() {
                    lead = Some(seqno);
                }
                folded = (folded.0 + 1, seqno);
                continue;
            };
            match (prev.as_deref(), lead.take()) {
                (Some(p), _) => p.fold(folded, sub.units)?,
                (None, Some(l)) => planned.push_back(marks_op(l, folded, sub.units)?),
                (None, None) => {}
            }
            folded = (0, 0);
            prev = Some(new.clone_arc());
            if new.implicit.is_some() {
                published.push(new.clone_arc(), GFP_KERNEL)?;
            }
            planned.push_back(new);
        }
        if let Some(p) = prev.take() {
            p.fold(folded, sub.units)?;
        }
        // Marks only: reached at once on an idle stream (nothing to queue, no runner), else
        // queued as one operation behind the work before them.
        let at_once = match lead {
            Some(l) if !idle => {
                planned.push_back(marks_op(l, folded, sub.units)?);
                false
            }
            Some(_) => true,
            None => false,
        };
        // The ALLOCs' handles reach the caller before anything is queued.
        turn.planted_wait()?;
        batch.write_back(ops)?;
        let mut queue = || -> Result {
            let mut st = self.state.lock();
            // Destroyed, cancelled or in error meanwhile (a GPU whose removal began since fails
            // the operations at their first step, as it fails those queued before).
            st.may_submit(&self.engine, false)?;
            st.submitted += u64::from(count);
            if at_once {
                self.marks_reached(&mut st, first);
                return Ok(());
            }
            st.queue.push_all_back(&mut planned);
            st.queued += u64::from(count);
            Ok(())
        };
        if batch.touches_nothing() {
            queue()?;
        } else {
            let (mut gone, mut new) = batch.table_changes();
            files.commit(&mut gone, &mut new, &mut queue)?;
        }
        known.merge(&batch);
        let ops = published
            .iter()
            .filter_map(|op| Some((op.implicit.as_ref()?, op.seqno)));
        implicit::publish(self, ops, &self.engine);
        batch.finish(files);
        // Moved before the next submission to this stream can queue: of two submissions
        // recording one event, the later's point stays (an event's point is a leaf lock).
        for (event, seqno) in events.recorded() {
            event.record(self, seqno);
        }
        drop(known);
        drop(turn);
        if !at_once {
            self.engine.submitted(self.clone());
        }
        Ok(first)
    }

    /// A submission of marks only (from seqno `first` to `st.submitted`) to an idle stream,
    /// reached as it is queued: as the submitter would retire them ([`Self::retire_marks`]),
    /// failed with the GPU's error if it is being removed.
    fn marks_reached(&self, st: &mut StreamState, first: u64) {
        if let Err(e) = self.engine.gpu().access() {
            st.error = Some((e, first));
        }
        st.retired_to = st.submitted;
        self.reached_locked(st, st.submitted);
    }
}
