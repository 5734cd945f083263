// SPDX-License-Identifier: GPL-2.0

//! A stream's submission turn: submissions to one stream are checked and planned one at a
//! time (they take their seqnos in order), and one may take long (its `ALLOC`s allocate and
//! zero memory). A caller waiting for its turn behind another's (another process's, even)
//! waits interruptibly: a signal ends the wait (`ERESTARTSYS`: the call restarts, or fails with
//! `EINTR`) with nothing submitted, so `SIGKILL` ends it at once, never in D state.

use kernel::{
    new_condvar, new_mutex,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        CondVar, CondVarTimeoutResult, Mutex,
    },
    time::msecs_to_jiffies,
};

use crate::uapi;

/// Planted by a test ([`plant_slow_turn`]): the next submission holds its turn long.
static SLOW: Atomic<bool> = Atomic::new(false);

/// Test-only (`RUVM_PLANT_SLOW_SUBMIT`): the next submission to any stream holds its stream's
/// turn for `RUVM_PLANT_SLOW_SUBMIT_MS` once it is planned, before it is queued (or until its
/// caller gets a signal: it then fails with nothing submitted), so that a test can wait
/// behind it, or change the world (remove the GPU) between its checks and its queueing.
pub(crate) fn plant_slow_turn() {
    SLOW.store(true, Relaxed);
}

/// Whose turn it is: a flag, and the waiters for it.
#[pin_data]
pub(super) struct Turns {
    /// A submission holds the turn.
    #[pin]
    busy: Mutex<bool>,
    /// Notified when the turn is given back.
    #[pin]
    free: CondVar,
}

/// The turn, held until dropped.
pub(super) struct Turn<'a>(&'a Turns);

impl Turns {
    pub(super) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            busy <- new_mutex!(false),
            free <- new_condvar!(),
        })
    }

    /// Waits for the turn. `ERESTARTSYS` if a signal comes first (nothing is taken).
    pub(super) fn take(&self) -> Result<Turn<'_>> {
        let mut busy = self.busy.lock();
        while *busy {
            if self.free.wait_interruptible(&mut busy) {
                // A wake-up meant for this waiter is passed on, not lost.
                if !*busy {
                    self.free.notify_one();
                }
                return Err(ERESTARTSYS);
            }
        }
        *busy = true;
        Ok(Turn(self))
    }

    /// Holds the turn (taken) for `ms` milliseconds, or until a signal (`ERESTARTSYS`). Nothing
    /// notifies `free` while the turn is held: only the time or a signal ends the wait.
    fn linger(&self, ms: u32) -> Result {
        let mut left = msecs_to_jiffies(ms);
        let mut busy = self.busy.lock();
        loop {
            match self.free.wait_interruptible_timeout(&mut busy, left) {
                CondVarTimeoutResult::Timeout => return Ok(()),
                CondVarTimeoutResult::Signal { .. } => return Err(ERESTARTSYS),
                CondVarTimeoutResult::Woken { jiffies } => left = jiffies,
            }
        }
    }
}

impl Turn<'_> {
    /// Test-only: if a test planted it ([`plant_slow_turn`]), holds the turn (the submission
    /// planned, nothing queued yet) for `RUVM_PLANT_SLOW_SUBMIT_MS`, or until a signal
    /// (`ERESTARTSYS`: the submission then fails, nothing queued).
    pub(super) fn planted_wait(&self) -> Result {
        // Read first: no locked write to a shared line on every submission.
        if SLOW.load(Relaxed) && SLOW.xchg(false, Relaxed) {
            self.0.linger(uapi::RUVM_PLANT_SLOW_SUBMIT_MS)?;
        }
        Ok(())
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self.0.busy.lock() = false;
        self.0.free.notify_one();
    }
}
