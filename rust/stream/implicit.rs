// SPDX-License-Identifier: GPL-2.0

//! Implicit sync of a stream operation on mems shared as dma-bufs (see `mem::dmabuf`): the
//! fences it waits for before its first piece (those in the buffers' reservation objects when
//! it is submitted: a write waits for all, a read for writers'), and the objects its own fence
//! goes into once it is queued (as a write or a read).
//!
//! A fence of the stream's own timeline is not waited for: the stream's order satisfies it.
//! The wait lasts at most `RUVM_WAIT_MAX_MS` from when the stream reaches the operation, then
//! fails it with `ETIMEDOUT` (the stream's error rule applies); a fence that signals an error
//! fails it with that error.

use kernel::{
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc,
    },
    time::Delta,
};

use crate::{
    bind::{fence::Fence, fence::Watch, resv::Resv},
    mem::MemCore,
    uapi,
};

use super::{engine::Engine, event::Timeline, op::Op, StreamCore};

/// How long an implicit wait may last.
pub(super) fn timeout() -> Delta {
    Delta::from_millis(i64::from(uapi::RUVM_WAIT_MAX_MS))
}

/// An operation's implicit sync.
pub(super) struct Implicit {
    /// The fences to wait for, in order; `next` is the first not yet seen signalled.
    waits: KVec<Pin<KBox<Watch<Engine>>>>,
    next: Atomic<usize>,
    /// Where its fence goes once it is queued, as a write or not.
    publish: KVec<(Arc<Resv>, bool)>,
    /// Its fence could not be added to one of them (the errno): it fails before its next
    /// piece rather than run unseen by the buffer's other users.
    doomed: Atomic<i32>,
}

impl Implicit {
    /// The implicit sync of an operation of the stream whose fence context is `context`,
    /// running on `engine`, that accesses each of `mems` (writing it, or not); `None` if
    /// none of them is shared as a dma-buf.
    pub(super) fn of(
        mems: &[(&MemCore, bool)],
        context: u64,
        engine: &Arc<Engine>,
    ) -> Result<Option<Self>> {
        let mut publish: KVec<(Arc<Resv>, bool)> = KVec::new();
        for (mem, write) in mems {
            let Some(resv) = mem.resv() else {
                continue;
            };
            match publish.iter_mut().find(|(r, _)| Arc::ptr_eq(r, &resv)) {
                Some(entry) => entry.1 |= *write,
                None => publish.push((resv, *write), GFP_KERNEL_ACCOUNT)?,
            }
        }
        if publish.is_empty() {
            return Ok(None);
        }
        let mut waits = KVec::new();
        for (resv, write) in publish.iter() {
            for fence in resv.fences(*write)? {
                if fence.context() == context || fence.is_signalled() {
                    continue;
                }
                let watch = KBox::pin_init(Watch::new(fence, engine.clone()), GFP_KERNEL_ACCOUNT)?;
                waits.push(watch, GFP_KERNEL_ACCOUNT)?;
            }
        }
        Ok(Some(Self {
            waits,
            next: Atomic::new(0),
            publish,
            doomed: Atomic::new(0),
        }))
    }

    /// The next fence to wait for, if any is left.
    pub(super) fn pending(&self) -> Option<&Pin<KBox<Watch<Engine>>>> {
        self.waits.get(self.next.load(Relaxed))
    }

    /// The fence [`Implicit::pending`] gave signalled.
    pub(super) fn passed(&self) {
        self.next.fetch_add(1, Relaxed);
    }

    /// The error it must fail with, if its fence could not be published.
    pub(super) fn doomed(&self) -> Option<Error> {
        match self.doomed.load(Relaxed) {
            0 => None,
            e => Some(Error::from_errno(e)),
        }
    }

    /// Adds `fence` (the operation's, once queued) to every object it goes into; on failure
    /// the operation is doomed (see `doomed`).
    pub(super) fn publish(&self, fence: Result<Fence>) {
        let r = fence.and_then(|f| {
            self.publish
                .iter()
                .try_for_each(|(resv, write)| resv.add(&f, *write))
        });
        if let Err(e) = r {
            self.doomed.store(e.to_errno(), Relaxed);
        }
    }
}

/// Adds the fence of each of `ops`, queued on `stream`, to the objects it goes into: in
/// submission order, under the stream's submission lock, so each buffer sees the stream's
/// fences in the stream's order.
pub(super) fn publish(stream: &StreamCore, ops: &[Arc<Op>]) {
    for op in ops {
        if let Some(i) = &op.implicit {
            i.publish(stream.point_fence(op.seqno));
        }
    }
}
