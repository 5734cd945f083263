// SPDX-License-Identifier: GPL-2.0

//! An event (CUDA's `cudaEvent_t`): the point of a stream it was last recorded at, a fence of
//! that stream's timeline. An event never recorded is complete.

use kernel::{new_spinlock, prelude::*, sync::SpinLock};

use crate::bind::fence::{Exported, Fence};

/// Where an event was last recorded.
struct Point {
    fence: Fence,
    stream: u64,
    seqno: u64,
}

/// An event of a file.
#[pin_data]
pub(crate) struct Event {
    #[pin]
    point: SpinLock<Option<Point>>,
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
            point <- new_spinlock!(None),
        })
    }

    /// Moves the event to a new point (a RECORD was queued).
    pub(crate) fn record(&self, fence: Fence, stream: u64, seqno: u64) {
        // The old point's reference is dropped after the lock is released.
        let _old = self.point.lock().replace(Point {
            fence,
            stream,
            seqno,
        });
    }

    /// The fence of its point; `None` if never recorded.
    pub(crate) fn point(&self) -> Option<Fence> {
        self.point.lock().as_ref().map(|p| p.fence.clone())
    }

    pub(crate) fn state(&self) -> EventState {
        let p = self.point.lock();
        match p.as_ref() {
            None => EventState {
                status: 1,
                stream: 0,
                seqno: 0,
            },
            Some(p) => EventState {
                status: p.fence.status(),
                stream: p.stream,
                seqno: p.seqno,
            },
        }
    }

    /// Waits for its point (at most `timeout_ms`): `Ok`, `EIO` if it signalled with an error
    /// (its status says which), `ETIMEDOUT` or `EINTR`.
    pub(crate) fn sync(&self, timeout_ms: u32) -> Result {
        let Some(f) = self.point() else {
            return Ok(());
        };
        match f.wait(timeout_ms)? {
            s if s < 0 => Err(EIO),
            _ => Ok(()),
        }
    }

    /// A sync_file of its point (a signalled fence if never recorded).
    pub(crate) fn export(&self) -> Result<Exported> {
        match self.point() {
            Some(f) => f.export(),
            None => Fence::signalled()?.export(),
        }
    }
}
