// SPDX-License-Identifier: GPL-2.0

//! What one open file may hold: a byte quota shared by the file and its mems (a mem gives its
//! bytes back when it is dropped, even after the file's table let it go).

use kernel::{
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc,
    },
};

/// Bytes of mems a file may hold at once.
pub(crate) struct Quota {
    used: Atomic<u64>,
    limit: u64,
}

impl Quota {
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            used: Atomic::new(0),
            limit,
        }
    }

    /// Takes `bytes` from the quota, or fails with `ENOSPC`.
    pub(super) fn charge(self: &Arc<Self>, bytes: u64) -> Result<Charge> {
        let mut cur = self.used.load(Relaxed);
        loop {
            let next = cur
                .checked_add(bytes)
                .filter(|&v| v <= self.limit)
                .ok_or(ENOSPC)?;
            match self.used.cmpxchg(cur, next, Relaxed) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        Ok(Charge {
            quota: self.clone(),
            bytes,
        })
    }
}

/// Bytes taken from a [`Quota`], given back on drop.
pub(crate) struct Charge {
    quota: Arc<Quota>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.quota.used.fetch_sub(self.bytes, Relaxed);
    }
}
