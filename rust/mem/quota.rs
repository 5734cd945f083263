// SPDX-License-Identifier: GPL-2.0

//! What one open file may hold: a byte quota shared by the file, its mems and its pools' caches
//! (a mem gives its bytes back when it is dropped, even after the file's table let it go; a
//! pool mem's charge goes with its chunks into the pool's cache, and back to a mem that reuses
//! them, and is given back with the chunks).

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
    /// Its file's, unique while the module is loaded: which file a mem is of.
    id: u64,
}

impl Quota {
    pub(crate) fn new(limit: u64) -> Self {
        static NEXT: Atomic<u64> = Atomic::new(1);
        Self {
            used: Atomic::new(0),
            limit,
            id: NEXT.fetch_add(1, Relaxed),
        }
    }

    /// Its file's id.
    pub(crate) fn id(&self) -> u64 {
        self.id
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

    /// A charge of no bytes, to merge others into.
    pub(super) fn nothing(self: &Arc<Self>) -> Charge {
        Charge {
            quota: self.clone(),
            bytes: 0,
        }
    }
}

/// Bytes taken from a [`Quota`], given back on drop.
pub(crate) struct Charge {
    quota: Arc<Quota>,
    bytes: u64,
}

impl Charge {
    /// Bytes charged.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Moves `bytes` (at most what it holds) into a charge of their own.
    pub(crate) fn split(&mut self, bytes: u64) -> Charge {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Charge {
            quota: self.quota.clone(),
            bytes,
        }
    }

    /// Adds `other`'s bytes to this charge. Charges of two quotas are kept apart: `other`'s
    /// bytes move to this charge's quota (past its limit if need be: they were charged once).
    pub(crate) fn merge(&mut self, mut other: Charge) {
        let bytes = core::mem::take(&mut other.bytes);
        if !Arc::ptr_eq(&self.quota, &other.quota) {
            other.quota.used.fetch_sub(bytes, Relaxed);
            self.quota.used.fetch_add(bytes, Relaxed);
        }
        self.bytes += bytes;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.quota.used.fetch_sub(self.bytes, Relaxed);
    }
}
