// SPDX-License-Identifier: GPL-2.0

//! The bound on a file's queued work: every operation of its streams, folded or not, holds a
//! unit of its file's budget from its planning to its drop.

use kernel::{
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc,
    },
};

use crate::{
    audit::{self, Class},
    uapi,
};

/// The most operations queued on one file's streams.
const MAX_QUEUED: u64 = uapi::RUVM_MAX_STREAM_OPS as u64;

/// How many operations a file's streams hold, not yet retired: each operation holds its units
/// from its planning to its drop (one, and one more for each operation folded into it), so a
/// file's queued work is bounded ([`MAX_QUEUED`]) whatever its number of streams.
pub(crate) struct Budget {
    queued: Atomic<u64>,
}

impl Budget {
    pub(crate) fn new() -> Self {
        Self {
            queued: Atomic::new(0),
        }
    }

    /// The units of a submission of `n` operations, taken at once (each of them, folded or
    /// not, holds one): `EAGAIN` if they would pass the file's limit.
    pub(crate) fn take(self: &Arc<Self>, n: u64) -> Result<Units> {
        // Added only if they fit: a submission refused never makes another look refused.
        let mut now = self.queued.load(Relaxed);
        loop {
            let after = now
                .checked_add(n)
                .filter(|&q| q <= MAX_QUEUED)
                .ok_or(EAGAIN)?;
            match self.queued.cmpxchg(now, after, Relaxed) {
                Ok(_) => break,
                Err(seen) => now = seen,
            }
        }
        audit::add(Class::StreamOps, n);
        Ok(Units {
            budget: self.clone(),
            left: n,
        })
    }

    /// Gives `n` units back.
    pub(crate) fn give(&self, n: u64) {
        // Adding 2^64 - n takes n away (the addition wraps).
        self.queued.add(n.wrapping_neg(), Relaxed);
        audit::sub(Class::StreamOps, n);
    }
}

/// Units of a file's [`Budget`] taken for one submission, handed to its operations as they are
/// planned (each then holds its own until it is dropped); those left when it is dropped (a
/// submission that failed part way) go back. Counted by the audit (`stream_ops`) as the
/// budget's are.
pub(crate) struct Units {
    budget: Arc<Budget>,
    left: u64,
}

impl Units {
    /// `n` units, for an operation or for those folded into one (`EINVAL` if fewer are left:
    /// a submission takes one for each of its operations).
    pub(crate) fn hand(&mut self, n: u64) -> Result {
        self.left = self.left.checked_sub(n).ok_or(EINVAL)?;
        Ok(())
    }

    /// Puts back a unit [`Self::hand`] handed out (the operation could not be made).
    pub(crate) fn put_back(&mut self) {
        self.left += 1;
    }

    /// The budget the units are of.
    pub(crate) fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }
}

impl Drop for Units {
    fn drop(&mut self) {
        if self.left > 0 {
            self.budget.give(self.left);
        }
    }
}
