// SPDX-License-Identifier: GPL-2.0

//! A stream's timeline: the points its operations reach, in seqno order, and the dma_fences
//! made for them on demand (see [`super::event`]); signalled as the stream reaches them, with
//! the time each was reached.

use kernel::{prelude::*, rbtree::RBTreeNodeReservation, sync::atomic::ordering::Acquire};

use crate::{
    bind::{
        errno,
        fence::{self, Fence, OwnFence, NAME_LEN},
    },
    mem::pool::pending::Clock,
};

use super::{event, StreamCore, StreamState};

/// How many reach times a stream keeps.
pub(super) const TIMES: usize = 16;

impl StreamState {
    /// The fence already made for point `seqno`, not reached yet, if there is one.
    fn pending_fence(&self, seqno: u64) -> Option<Fence> {
        self.points.get(&seqno).map(OwnFence::share)
    }

    /// The result point `seqno`, reached, signals with: cancelled, failed (at or before it), or
    /// `Ok`.
    pub(super) fn reached(&self, seqno: u64) -> Result {
        if self.cancelled_from != 0 && seqno >= self.cancelled_from {
            return Err(errno::ecanceled());
        }
        match self.error {
            Some((e, failed)) if failed <= seqno => Err(e),
            _ => Ok(()),
        }
    }

    /// When point `seqno` (reached) was: the first kept time at or after it (the oldest kept
    /// if it is older than all: a little late).
    fn time_of(&self, seqno: u64) -> i64 {
        let mut oldest = None;
        for i in 0..TIMES {
            let (done, t) = self.times[(self.times_at + i) % TIMES];
            if t == 0 {
                continue;
            }
            oldest.get_or_insert(t);
            if done >= seqno {
                return t;
            }
        }
        oldest.unwrap_or_else(fence::now)
    }

    /// Notes that the stream reached `completed` now, and signals the fences of the points it
    /// passed (allocates nothing).
    pub(super) fn reach(&mut self, completed: u64) {
        let now = fence::now();
        self.completed = self.completed.max(completed);
        self.times[self.times_at] = (completed, now);
        self.times_at = (self.times_at + 1) % TIMES;
        let _signalling = fence::Signalling::begin();
        while let Some(cursor) = self.points.cursor_front_mut() {
            if *cursor.current().0 > completed {
                break;
            }
            // The node goes with its fence: nothing is allocated or freed under the lock but
            // the node (a `kfree`, which signalling allows).
            let (seqno, f) = cursor.remove_current().1.to_key_value();
            f.signal_at(self.reached(seqno), now);
        }
    }
}

impl event::Timeline for StreamCore {
    fn context(&self) -> u64 {
        self.context
    }

    fn handle(&self) -> u64 {
        self.handle
    }

    /// A fence for point `seqno`: kept with the stream's points until it is reached, or
    /// signalled at once (with when it was reached) if it was. A point not reached has one
    /// fence at most: asked again (an event's export, a wait, an ALLOC that waits for a
    /// pending free, however many submissions ask and fail), it is shared.
    fn point_fence(&self, seqno: u64) -> Result<Fence> {
        if let Some(f) = self.state.lock().pending_fence(seqno) {
            return Ok(f);
        }
        let own = OwnFence::new(self.context, seqno, &self.name, fence::Flags::USER)?;
        let shared = own.share();
        let room = RBTreeNodeReservation::new(GFP_KERNEL_ACCOUNT)?;
        let mut st = self.state.lock();
        if seqno <= st.completed || st.cancelled {
            let (r, t) = (st.reached(seqno), st.time_of(seqno));
            drop(st);
            own.signal_at(r, t);
            return Ok(shared);
        }
        // Made meanwhile by another caller: that one (this one, never shared, goes).
        if let Some(f) = st.pending_fence(seqno) {
            drop(st);
            drop((own, shared, room));
            return Ok(f);
        }
        // By seqno (a tree: found and placed in logarithmic time, however many there are), so
        // that the stream signals them in order.
        st.points.insert(room.into_node(seqno, own));
        Ok(shared)
    }

    fn observe(&self, seqno: u64) {
        let st = self.state.lock();
        if seqno <= st.completed {
            self.observe_locked(&st, seqno);
        }
    }

    fn point_status(&self, seqno: u64) -> i32 {
        let st = self.state.lock();
        if seqno > st.completed && !st.cancelled {
            return 0;
        }
        match st.reached(seqno) {
            Ok(()) => 1,
            Err(e) => e.to_errno(),
        }
    }
}

/// Writes `gpu<G>-stream<H>` into a timeline name.
pub(super) fn timeline_name(gpu: u32, handle: u64) -> [u8; NAME_LEN] {
    let mut name = [0u8; NAME_LEN];
    let mut w = NameWriter {
        buf: &mut name,
        at: 0,
    };
    let _ = core::fmt::Write::write_fmt(&mut w, format_args!("gpu{gpu}-stream{handle}"));
    name
}

struct NameWriter<'a> {
    buf: &'a mut [u8; NAME_LEN],
    at: usize,
}

impl core::fmt::Write for NameWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for b in s.bytes() {
            // One byte stays NUL.
            if self.at + 1 < NAME_LEN {
                self.buf[self.at] = b;
                self.at += 1;
            }
        }
        Ok(())
    }
}

impl Clock for StreamCore {
    fn context(&self) -> u64 {
        self.context
    }

    fn reached(&self, seqno: u64) -> bool {
        self.reached.load(Acquire) >= seqno
    }

    fn observed(&self, seqno: u64) -> bool {
        self.observed.load(Acquire) >= seqno
            || (self.gone.load(Acquire) && self.reached.load(Acquire) >= seqno)
    }

    fn fence(&self, seqno: u64) -> Result<Fence> {
        event::Timeline::point_fence(self, seqno)
    }
}
