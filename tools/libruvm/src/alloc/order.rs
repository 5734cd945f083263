// SPDX-License-Identifier: GPL-2.0

//! The allocator's view of stream order: each stream's submitted and completed points (from
//! the status page, or `STREAM_QUERY`), the points of other streams it is known to follow
//! (events waited for through the allocator, waits it inserted), and the calls that keep that
//! view: [`Allocator::submit`], [`Allocator::record_event`], [`Allocator::wait_event`],
//! [`Allocator::synchronize`], and those that forget a stream or an event the program is done
//! with ([`Allocator::release_stream`], [`Allocator::forget_event`]).

use nix::errno::Errno;

use super::{Allocator, FastMap, Inner, WAIT_MS};
use crate::{op, uapi, StatusPage};

/// What the allocator knows of one stream.
#[derive(Default)]
pub(super) struct StreamPoints {
    /// The seqno of its last operation submitted through the allocator.
    pub(super) submitted: u64,
    /// The seqno its work is known complete up to.
    pub(super) completed: u64,
    /// For each other stream, the point of it this stream is known to be ordered after.
    pub(super) after: FastMap<u64, u64>,
    /// Its slot of the status page (`None`: not asked for yet; `Some(None)`: the module
    /// gave none, so `STREAM_QUERY` it is).
    pub(super) slot: Option<Option<u32>>,
    /// It was seen in error (the status page, `STREAM_QUERY` or `STREAM_SYNC` said so): errors
    /// are sticky, so every later synchronize of it is `EIO`, whichever way its point is
    /// learnt.
    pub(super) failed: bool,
}

impl Allocator<'_> {
    /// How far stream `s` is known complete, asked now: from the status page (no system call
    /// once the stream has a slot), else `STREAM_QUERY`. `None` if neither answers (a destroyed
    /// stream).
    pub(super) fn completed(&self, inner: &mut Inner, s: u64) -> Option<u64> {
        if inner.status.is_none() {
            inner.status = Some(StatusPage::map(self.dev).ok());
        }
        let has_page = matches!(inner.status, Some(Some(_)));
        let slot = match inner.points(s).slot {
            Some(slot) => slot,
            None => {
                let slot = if has_page {
                    self.dev.stream_status(s).ok().map(|st| st.slot)
                } else {
                    None
                };
                inner.points(s).slot = Some(slot);
                slot
            }
        };
        let read = match (slot, &inner.status) {
            (Some(slot), Some(Some(page))) => page.read(slot, s).map(|r| (r.completed, r.error)),
            _ => None,
        };
        let (now, error) = match read {
            Some(r) => r,
            None => {
                let q = self.dev.stream_query(s).ok()?;
                (q.completed, i32::try_from(q.error).unwrap_or(i32::MAX))
            }
        };
        let p = inner.points(s);
        p.completed = p.completed.max(now);
        p.failed |= error != 0;
        Some(p.completed)
    }

    /// Makes `stream` wait for everything submitted to `other` so far: a `RECORD` of the
    /// allocator's event on `other`, a `WAIT_EVENT` on `stream`.
    pub(super) fn order_after(
        &self,
        inner: &mut Inner,
        stream: u64,
        other: u64,
    ) -> Result<(), Errno> {
        let e = match inner.event {
            Some(e) => e,
            None => {
                let e = self.dev.event_create()?;
                inner.event = Some(e);
                e
            }
        };
        let at = self.dev.stream_submit(other, &[op::record(e)])?;
        let p = inner.points(other);
        p.submitted = p.submitted.max(at);
        let w = self
            .dev
            .stream_submit(stream, &[op::wait_event(e, WAIT_MS)])?;
        let p = inner.points(stream);
        p.submitted = p.submitted.max(w);
        let known = p.after.entry(other).or_insert(0);
        *known = (*known).max(at);
        Ok(())
    }

    /// Submits `ops` to `stream` (`RUVM_IOCTL_STREAM_SUBMIT`), noting the stream's last point
    /// and the point of every `RECORD` among them: work on the allocator's blocks, and the
    /// records of events [`Allocator::wait_event`] waits for, must be submitted here. Returns
    /// the first op's seqno. (The allocator's lock is held through the call, so its view of
    /// each stream and event follows the order the kernel saw.)
    pub fn submit(&self, stream: u64, ops: &[uapi::ruvm_op]) -> Result<u64, Errno> {
        let mut g = self.lock();
        let first = self.dev.stream_submit(stream, ops)?;
        let last = first + ops.len().saturating_sub(1) as u64;
        let p = g.points(stream);
        p.submitted = p.submitted.max(last);
        for (i, o) in ops.iter().enumerate() {
            if o.kind == uapi::ruvm_op_kind_RUVM_OP_RECORD {
                g.events.insert(o.value, (stream, first + i as u64));
            }
        }
        Ok(first)
    }

    /// Records `event` on `stream` (a `RECORD` through [`Allocator::submit`]).
    pub fn record_event(&self, stream: u64, event: u64) -> Result<(), Errno> {
        self.submit(stream, &[op::record(event)]).map(|_| ())
    }

    /// Makes `stream` wait for `event` (a `WAIT_EVENT`); when the event's last record went
    /// through [`Allocator::submit`], `stream` may then take the blocks the recording stream
    /// freed before that record (`follow_event_dependencies`). An event recorded with the
    /// device directly must not be waited for here.
    pub fn wait_event(&self, stream: u64, event: u64) -> Result<(), Errno> {
        let mut g = self.lock();
        // Where the event is now: what the kernel's WAIT_EVENT below waits for.
        let at = g.events.get(&event).copied();
        let w = self
            .dev
            .stream_submit(stream, &[op::wait_event(event, WAIT_MS)])?;
        let p = g.points(stream);
        p.submitted = p.submitted.max(w);
        if let Some((other, seqno)) = at {
            if other != stream {
                let known = p.after.entry(other).or_insert(0);
                *known = (*known).max(seqno);
            }
        }
        Ok(())
    }

    /// Waits for the work submitted to `stream` through the allocator (no system call when
    /// the status page says it is done, else `RUVM_IOCTL_STREAM_SYNC`); its frees become
    /// everyone's, and idle segments go back to the kernel while more than the release
    /// threshold is held. `EIO` (the stream in error: everything waited for retired) settles
    /// the same and is returned.
    pub fn synchronize(&self, stream: u64) -> Result<(), Errno> {
        let upto = {
            let mut g = self.lock();
            let inner = &mut *g;
            let upto = inner.points(stream).submitted;
            let (done, failed) = self.completed_without_call(inner, stream);
            if done >= upto {
                self.settle_stream(inner, stream, upto)?;
                // In error, as STREAM_SYNC would say.
                return if failed { Err(Errno::EIO) } else { Ok(()) };
            }
            upto
        };
        let r = self.dev.stream_sync(stream, WAIT_MS);
        if r.is_ok() || r == Err(Errno::EIO) {
            let mut g = self.lock();
            g.points(stream).failed |= r.is_err();
            self.settle_stream(&mut g, stream, upto)?;
        }
        r
    }

    /// Synchronizes `stream` ([`Allocator::synchronize`]) and forgets it: its frees become
    /// everyone's, and the allocator drops what it knew of it (its points and status slot, the
    /// points of it that other streams and events were known to follow). Call it before
    /// `RUVM_IOCTL_STREAM_DESTROY`: what the allocator knows of a stream destroyed without it
    /// stays until the allocator goes, and its frees not synchronized are never reused. `EIO`
    /// (the stream in error) forgets it all the same; another error (`ETIMEDOUT`, `EINTR`)
    /// forgets nothing.
    pub fn release_stream(&self, stream: u64) -> Result<(), Errno> {
        let r = self.synchronize(stream);
        if r.is_ok() || r == Err(Errno::EIO) {
            let mut g = self.lock();
            g.streams.remove(&stream);
            for p in g.streams.values_mut() {
                p.after.remove(&stream);
            }
            g.events.retain(|_, &mut (s, _)| s != stream);
        }
        r
    }

    /// Forgets where `event` was last recorded through the allocator. Call it before
    /// `RUVM_IOCTL_EVENT_DESTROY` (a handle is never used again, but the allocator's map of
    /// events would keep it until the allocator goes).
    pub fn forget_event(&self, event: u64) {
        self.lock().events.remove(&event);
    }

    /// What the status page says of `stream`: how far it is known complete (what was known
    /// before if it has no slot yet or there is no page), and whether it is in error (now, or
    /// as seen before: a stream whose point is known without its page, from `STREAM_QUERY` or
    /// a `STREAM_SYNC` that said `EIO`, is in error all the same).
    pub(super) fn completed_without_call(&self, inner: &mut Inner, stream: u64) -> (u64, bool) {
        let slot = inner.points(stream).slot.flatten();
        let read = match (slot, &inner.status) {
            (Some(slot), Some(Some(page))) => page.read(slot, stream),
            _ => None,
        };
        let p = inner.points(stream);
        if let Some(r) = read {
            p.completed = p.completed.max(r.completed);
            p.failed |= r.error != 0;
        }
        (p.completed, p.failed)
    }

    /// What the allocator knows of `stream`: the last point submitted through it and the
    /// point known complete (`None`: a stream it never saw, or forgot). For diagnostics.
    pub fn known_points(&self, stream: u64) -> Option<(u64, u64)> {
        let g = self.lock();
        g.streams.get(&stream).map(|p| (p.submitted, p.completed))
    }

    /// `stream` is complete up to `upto`: its frees become ready, then the give-back.
    pub(super) fn settle_stream(
        &self,
        inner: &mut Inner,
        stream: u64,
        upto: u64,
    ) -> Result<u64, Errno> {
        let p = inner.points(stream);
        p.completed = p.completed.max(upto);
        if p.slot.is_none() {
            // Learn the stream's slot now, for the synchronizes to come.
            let _ = self.completed(inner, stream);
        }
        inner.ready_bins(stream, upto);
        inner.small.promote(stream, upto);
        inner.large.promote(stream, upto);
        if inner.stats.reserved > self.cfg.release_threshold {
            // Idle segments can be seen only with every free given back.
            self.settle_bins(inner, None);
        }
        self.give_back(inner, self.cfg.release_threshold)
    }
}
