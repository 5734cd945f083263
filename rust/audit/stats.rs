// SPDX-License-Identifier: GPL-2.0

//! The usage statistics: per backing (sysmem, vidmem of all GPUs), reserved bytes (what mems
//! hold), used bytes (what was asked for) and mems, each with a high watermark that can be
//! restarted; allocations, frees and failures since load.

use kernel::sync::atomic::{ordering::Relaxed, Atomic};

/// A current value with its high watermark.
struct Watermark {
    now: Atomic<u64>,
    peak: Atomic<u64>,
}

impl Watermark {
    const fn new() -> Self {
        Self {
            now: Atomic::new(0),
            peak: Atomic::new(0),
        }
    }

    fn add(&self, n: u64) {
        let now = self.now.fetch_add(n, Relaxed).wrapping_add(n);
        let mut peak = self.peak.load(Relaxed);
        while peak < now {
            match self.peak.cmpxchg(peak, now, Relaxed) {
                Ok(_) => break,
                Err(p) => peak = p,
            }
        }
    }

    fn sub(&self, n: u64) {
        self.now.fetch_sub(n, Relaxed);
    }

    fn get(&self) -> (u64, u64) {
        (self.now.load(Relaxed), self.peak.load(Relaxed))
    }

    fn reset_peak(&self) {
        self.peak.store(self.now.load(Relaxed), Relaxed);
    }
}

/// What the statistics are kept for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatsBacking {
    /// Sysmem mems.
    Sysmem,
    /// Vidmem mems, of every GPU.
    Vidmem,
}

/// The statistics of one backing.
struct BackingStats {
    reserved: Watermark,
    used: Watermark,
    mems: Watermark,
    allocs: Atomic<u64>,
    frees: Atomic<u64>,
    failures: Atomic<u64>,
}

impl BackingStats {
    const fn new() -> Self {
        Self {
            reserved: Watermark::new(),
            used: Watermark::new(),
            mems: Watermark::new(),
            allocs: Atomic::new(0),
            frees: Atomic::new(0),
            failures: Atomic::new(0),
        }
    }
}

static SYSMEM_STATS: BackingStats = BackingStats::new();
static VIDMEM_STATS: BackingStats = BackingStats::new();

impl StatsBacking {
    fn stats(self) -> &'static BackingStats {
        match self {
            StatsBacking::Sysmem => &SYSMEM_STATS,
            StatsBacking::Vidmem => &VIDMEM_STATS,
        }
    }

    fn name(self) -> &'static str {
        match self {
            StatsBacking::Sysmem => "sysmem",
            StatsBacking::Vidmem => "vidmem",
        }
    }
}

/// A mem's share of the statistics, for as long as it lives.
pub(crate) struct Usage {
    backing: StatsBacking,
    reserved: u64,
    used: u64,
}

impl Usage {
    /// A successful allocation of `reserved` physical bytes for `used` requested ones.
    pub(crate) fn new(backing: StatsBacking, reserved: u64, used: u64) -> Self {
        let s = backing.stats();
        s.reserved.add(reserved);
        s.used.add(used);
        s.mems.add(1);
        s.allocs.fetch_add(1, Relaxed);
        Self {
            backing,
            reserved,
            used,
        }
    }
}

impl Usage {
    /// The allocation is taken whole by another (a stream allocation that takes the mem its
    /// submission just freed): counted as a free and an allocation, nothing else changing.
    pub(crate) fn again(&self) {
        let s = self.backing.stats();
        s.frees.fetch_add(1, Relaxed);
        s.allocs.fetch_add(1, Relaxed);
    }
}

impl Drop for Usage {
    fn drop(&mut self) {
        let s = self.backing.stats();
        s.reserved.sub(self.reserved);
        s.used.sub(self.used);
        s.mems.sub(1);
        s.frees.fetch_add(1, Relaxed);
    }
}

/// Bytes that became resident in a mem already counted (a sparse mem's chunk): they add to
/// its backing's reserved and used bytes until this drops, with no allocation counted.
pub(crate) struct Resident {
    backing: StatsBacking,
    bytes: u64,
}

impl Resident {
    pub(crate) fn new(backing: StatsBacking, bytes: u64) -> Self {
        let s = backing.stats();
        s.reserved.add(bytes);
        s.used.add(bytes);
        Self { backing, bytes }
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        let s = self.backing.stats();
        s.reserved.sub(self.bytes);
        s.used.sub(self.bytes);
    }
}

/// Counts an allocation that was refused or failed.
pub(crate) fn alloc_failed(backing: StatsBacking) {
    backing.stats().failures.fetch_add(1, Relaxed);
}

/// A snapshot of one backing's statistics.
pub(crate) struct Stats {
    pub(crate) backing: StatsBacking,
    pub(crate) reserved: (u64, u64),
    pub(crate) used: (u64, u64),
    pub(crate) mems: (u64, u64),
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
    pub(crate) failures: u64,
}

/// One backing's statistics; with `reset_peaks`, its watermarks restart from now afterwards.
pub(crate) fn stats(backing: StatsBacking, reset_peaks: bool) -> Stats {
    let b = backing.stats();
    let s = Stats {
        backing,
        reserved: b.reserved.get(),
        used: b.used.get(),
        mems: b.mems.get(),
        allocs: b.allocs.load(Relaxed),
        frees: b.frees.load(Relaxed),
        failures: b.failures.load(Relaxed),
    };
    if reset_peaks {
        b.reserved.reset_peak();
        b.used.reset_peak();
        b.mems.reset_peak();
    }
    s
}

impl core::fmt::Display for Stats {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        writeln!(f, "backing {}", self.backing.name())?;
        writeln!(
            f,
            "reserved_bytes {} peak {}",
            self.reserved.0, self.reserved.1
        )?;
        writeln!(f, "used_bytes {} peak {}", self.used.0, self.used.1)?;
        writeln!(f, "mems {} peak {}", self.mems.0, self.mems.1)?;
        writeln!(f, "allocs {}", self.allocs)?;
        writeln!(f, "frees {}", self.frees)?;
        writeln!(f, "alloc_failures {}", self.failures)
    }
}

/// `/sys/kernel/debug/ruvm/stats`: the statistics (read-only; reset is an ioctl).
pub(crate) struct StatsView;

impl kernel::debugfs::Writer for StatsView {
    fn write(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", stats(StatsBacking::Sysmem, false))?;
        write!(f, "{}", stats(StatsBacking::Vidmem, false))
    }
}
