// SPDX-License-Identifier: GPL-2.0

//! An event (CUDA's `cudaEvent_t`): the point of a stream it was last recorded at, a point of
//! that stream's timeline. An event never recorded is complete.
//!
//! A point's dma_fence is made when someone first needs one (an export, a wait from another
//! stream, a synchronize) and kept with the event: recording costs no allocation (as a
//! `drm_syncobj` timeline's points). Its status is read from its stream until then.

use kernel::{new_mutex, prelude::*, sync::Arc, sync::Mutex};

use crate::bind::{anon::Exported, fence::Fence};

/// A stream's timeline, as an event sees it.
pub(crate) trait Timeline: Send + Sync {
    /// Its dma_fence context.
    fn context(&self) -> u64;
    /// Its stream's handle.
    fn handle(&self) -> u64;
    /// The fence of point `seqno` (made now; signalled at once if the point was reached).
    fn point_fence(&self, seqno: u64) -> Result<Fence>;
    /// The status of point `seqno`: 0 pending, 1 reached, or the negative errno it failed with.
    fn point_status(&self, seqno: u64) -> i32;
    /// A synchronize saw point `seqno` reached: the frees up to it are observed.
    fn observe(&self, seqno: u64);
}

/// Where an event was last recorded, and that point's fence once one was made.
#[derive(Clone)]
struct Point {
    timeline: Arc<dyn Timeline>,
    seqno: u64,
    fence: Option<Fence>,
}

/// An event of a file.
#[pin_data]
pub(crate) struct Event {
    #[pin]
    point: Mutex<Option<Point>>,
}

/// What `RUVM_IOCTL_EVENT_QUERY` reports.
pub(crate) struct EventState {
    /// 0 pending, 1 signalled, or the negative errno it signalled with.
    pub(crate) status: i32,
    pub(crate) stream: u64,
    pub(crate) seqno: u64,
}

impl Event {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            point <- new_mutex!(None),
        })
    }

    /// Moves the event to point `seqno` of `timeline` (a RECORD was queued).
    pub(crate) fn record<T: Timeline + 'static>(&self, timeline: &Arc<T>, seqno: u64) {
        let mut point = self.point.lock();
        // What it replaces (the old point, or its fence) is dropped after the lock is released.
        let old = match (*point).as_mut() {
            // Recorded on the same stream again (as a loop of submissions does): the point
            // moves on, and no reference changes hands.
            Some(p) if core::ptr::addr_eq(Arc::as_ptr(&p.timeline), Arc::as_ptr(timeline)) => {
                p.seqno = seqno;
                (None, p.fence.take())
            }
            _ => {
                let timeline: Arc<dyn Timeline> = timeline.clone();
                let new = Point {
                    timeline,
                    seqno,
                    fence: None,
                };
                (point.replace(new), None)
            }
        };
        drop(point);
        drop(old);
    }

    /// Its point's fence, made if none was yet (`None` if never recorded).
    pub(crate) fn fence(&self) -> Result<Option<Fence>> {
        Ok(self.point_fence()?.map(|(_, _, f)| f))
    }

    /// Its point (its timeline's context and seqno) and that point's fence, read at once: the
    /// fence is the point's even if the event is recorded again meanwhile (`None` if never
    /// recorded).
    pub(crate) fn point_fence(&self) -> Result<Option<(u64, u64, Fence)>> {
        let Some(p) = self.point.lock().clone() else {
            return Ok(None);
        };
        let (context, seqno) = (p.timeline.context(), p.seqno);
        if let Some(f) = p.fence {
            return Ok(Some((context, seqno, f)));
        }
        // Made with the lock released (it allocates), then kept if the event did not move.
        let fence = p.timeline.point_fence(p.seqno)?;
        let mut now = self.point.lock();
        if let Some(q) = (*now).as_mut() {
            if Arc::ptr_eq(&q.timeline, &p.timeline) && q.seqno == p.seqno && q.fence.is_none() {
                q.fence = Some(fence.clone());
            }
        }
        Ok(Some((context, seqno, fence)))
    }

    /// What a wait of a stream on timeline `context` must wait for: nothing (`None`) if the
    /// event was never recorded or was recorded on that timeline (the stream's order satisfies
    /// it); else its point (context and seqno) and, unless that point was reached without
    /// error, the point's fence (made if none was yet). A point reached needs no fence (its
    /// fence, if one was made, signalled): a cross-stream wait on work already done makes
    /// nothing.
    pub(crate) fn wait_target(&self, context: u64) -> Result<Option<(u64, u64, Option<Fence>)>> {
        let Some(p) = self.point.lock().clone() else {
            return Ok(None);
        };
        let (c, seqno) = (p.timeline.context(), p.seqno);
        if c == context {
            return Ok(None);
        }
        // Read with the event's lock released: the stream's state lock is not taken under it.
        let reached = match &p.fence {
            Some(f) => f.status() == 1,
            None => p.timeline.point_status(seqno) == 1,
        };
        if reached {
            return Ok(Some((c, seqno, None)));
        }
        // Moved meanwhile: onto that timeline too, perhaps.
        Ok(self
            .point_fence()?
            .filter(|&(c, _, _)| c != context)
            .map(|(c, s, f)| (c, s, Some(f))))
    }

    pub(crate) fn state(&self) -> EventState {
        let p = self.point.lock().clone();
        match p {
            None => EventState {
                status: 1,
                stream: 0,
                seqno: 0,
            },
            Some(p) => EventState {
                status: match &p.fence {
                    Some(f) => f.status(),
                    None => p.timeline.point_status(p.seqno),
                },
                stream: p.timeline.handle(),
                seqno: p.seqno,
            },
        }
    }

    /// Waits for its point (at most `timeout_ms`): `Ok`, `EIO` if it signalled with an error
    /// (its status says which), `ETIMEDOUT` or `EINTR`.
    /// Either way the frees of its stream up to the point are then observed.
    pub(crate) fn sync(&self, timeout_ms: u32) -> Result {
        let point = self
            .point
            .lock()
            .as_ref()
            .map(|p| (p.timeline.clone(), p.seqno));
        let Some(f) = self.fence()? else {
            return Ok(());
        };
        let status = f.wait(timeout_ms)?;
        // The fence is the point's as it was read above, or a later one of the same event (a
        // record meanwhile): either way the point read was reached.
        if let Some((timeline, seqno)) = point {
            timeline.observe(seqno);
        }
        match status {
            s if s < 0 => Err(EIO),
            _ => Ok(()),
        }
    }

    /// A sync_file of its point (a signalled fence if never recorded).
    pub(crate) fn export(&self) -> Result<Exported> {
        match self.fence()? {
            Some(f) => f.export(),
            None => Fence::signalled()?.export(),
        }
    }
}
