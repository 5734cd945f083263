// SPDX-License-Identifier: GPL-2.0

//! Implicit sync of a stream operation on mems shared as dma-bufs (see `mem::dmabuf`): the
//! reservation objects it follows (noted when it is planned), and, once it is queued, for each
//! of them at once under the object's lock, the fences it must wait for (a write waits for
//! all, a read for writers') and its own fence added (as a write or a read). The operation
//! does not run before that exchange is done: until then the engine finds it blocked. So no
//! user of the buffer, ruvm's or another driver's, can see the buffer idle while the
//! operation runs, and of two accesses the later always waits for the earlier.
//!
//! A fence of the stream's own timeline is not waited for: the stream's order satisfies it.
//! The wait lasts at most `RUVM_WAIT_MAX_MS` from when the stream reaches the operation, then
//! fails it with `ETIMEDOUT` (the stream's error rule applies); a fence that signals an error
//! fails it with that error. If the exchange itself fails (no memory), the operation fails
//! with that error before its first piece (a fence it already added to another object then
//! signals that error).

use kernel::{
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc, SetOnce,
    },
    time::Delta,
};

use crate::{
    bind::{fence::Fence, fence::Watch, global::global, resv::Resv},
    mem::MemCore,
    uapi,
};

use super::{engine::Engine, event::Timeline, StreamCore};

global! {
    /// Held across the exchanges of an operation that follows several objects: two such
    /// operations of ruvm's are never interleaved, so neither waits for the other through one
    /// object while the other waits for it through another (a cycle). Under the submission
    /// mutex, above every reservation lock.
    static SEVERAL: Mutex<()> = ();
}

/// Makes the lock of exchanges with several objects (module init).
pub(crate) fn init() {
    SEVERAL.init();
}

/// How long an implicit wait may last.
pub(super) fn timeout() -> Delta {
    Delta::from_millis(i64::from(uapi::RUVM_WAIT_MAX_MS))
}

/// The fences an operation waits for, made once it is queued.
type Waits = KVec<Pin<KBox<Watch<Engine>>>>;

/// An operation's implicit sync.
pub(super) struct Implicit {
    /// The objects it follows, each as a write or not.
    follows: KVec<(Arc<Resv>, bool)>,
    /// The fences to wait for, in order, set once the exchange is done (until then the
    /// operation is blocked); `next` is the first not yet seen signalled.
    waits: SetOnce<Waits>,
    next: Atomic<usize>,
    /// The exchange failed (the errno): the operation fails before its first piece.
    doomed: Atomic<i32>,
}

impl Implicit {
    /// The implicit sync of an operation that accesses each of `mems` (writing it, or not);
    /// `None` if none of them is shared as a dma-buf.
    pub(super) fn of(mems: &[(&MemCore, bool)]) -> Result<Option<Self>> {
        let mut follows: KVec<(Arc<Resv>, bool)> = KVec::new();
        for (mem, write) in mems {
            let Some(resv) = mem.resv() else {
                continue;
            };
            match follows.iter_mut().find(|(r, _)| Arc::ptr_eq(r, &resv)) {
                Some(entry) => entry.1 |= *write,
                None => follows.push((resv, *write), GFP_KERNEL_ACCOUNT)?,
            }
        }
        if follows.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self {
            follows,
            waits: SetOnce::new(),
            next: Atomic::new(0),
            doomed: Atomic::new(0),
        }))
    }

    /// The fences to wait for, once the exchange is done (`None` before: the operation must
    /// not run yet).
    pub(super) fn waits(&self) -> Option<&Waits> {
        self.waits.as_ref()
    }

    /// The next fence to wait for, if the exchange is done and one is left.
    pub(super) fn pending(&self) -> Option<&Pin<KBox<Watch<Engine>>>> {
        self.waits()?.get(self.next.load(Relaxed))
    }

    /// The fence [`Implicit::pending`] gave signalled.
    pub(super) fn passed(&self) {
        self.next.fetch_add(1, Relaxed);
    }

    /// The error it must fail with, if the exchange failed.
    pub(super) fn doomed(&self) -> Option<Error> {
        match self.doomed.load(Relaxed) {
            0 => None,
            e => Some(Error::from_errno(e)),
        }
    }

    /// The exchange, once the operation is queued with fence `fence` on the stream whose
    /// context is `context` (run by `engine`).
    fn exchange(&self, fence: Result<Fence>, context: u64, engine: &Arc<Engine>) {
        let _several = if self.follows.len() > 1 {
            SEVERAL.lock()
        } else {
            None
        };
        let made = fence.and_then(|f| {
            let mut waits = KVec::new();
            for (resv, write) in self.follows.iter() {
                for before in resv.exchange(&f, *write)? {
                    if before.context() == context || before.is_signalled() {
                        continue;
                    }
                    let w = KBox::pin_init(Watch::new(before, engine.clone()), GFP_KERNEL_ACCOUNT)?;
                    waits.push(w, GFP_KERNEL_ACCOUNT)?;
                }
            }
            Ok(waits)
        });
        let waits = match made {
            Ok(w) => w,
            Err(e) => {
                self.doomed.store(e.to_errno(), Relaxed);
                KVec::new()
            }
        };
        // Set once: this is the only caller, once per operation.
        let _ = self.waits.populate(waits);
    }
}

/// The exchange of each of `ops` (an operation's implicit sync and its seqno), just queued on
/// `stream`: in submission order, under the stream's submission lock, so each buffer sees the
/// stream's fences in the stream's order. Then the engine looks at the stream again.
pub(super) fn publish<'a>(
    stream: &StreamCore,
    ops: impl Iterator<Item = (&'a Implicit, u64)>,
    engine: &Arc<Engine>,
) {
    let mut any = false;
    for (i, seqno) in ops {
        i.exchange(stream.point_fence(seqno), stream.context, engine);
        any = true;
    }
    if any {
        engine.kick();
    }
}
