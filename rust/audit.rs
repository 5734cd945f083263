// SPDX-License-Identifier: GPL-2.0

//! The leak audit and the usage statistics.
//!
//! # Counters
//!
//! Every live resource is counted by class ([`Class`]): the object that owns a resource also
//! owns a [`Counted`] token for it, so creating the object counts it and dropping it uncounts it,
//! on every path, error paths included. (User mappings are counted by the VMA callbacks, which
//! come in pairs.) A test-only walk of the real objects ([`crate::mem::walk`]) checks the
//! counters; an object that is counted but that no walk can reach has leaked.
//!
//! # Statistics
//!
//! Per backing: reserved bytes (what mems hold), used bytes (what was asked for), mems, each
//! with a high watermark that can be restarted; allocations, frees and failures since load.
//!
//! # Reports
//!
//! At unload (`leak_checker` >= 1), one block in the kernel log, in the format documented in
//! `Documentation/ruvm.rst` ("The audit report"): a single `verdict=clean` line when nothing is
//! alive, otherwise the leaked classes (and at level 2 every leaked mem with its origin).

use kernel::{
    prelude::*,
    sync::atomic::{ordering::Relaxed, Atomic},
};

use crate::{bind::upin::PinnedUser, mem::Planted, uapi};

/// The number of audit classes.
pub(crate) const CLASSES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_CLASSES as usize;

/// The highest sysmem chunk order with a class of its own.
pub(crate) const MAX_ORDER: u32 = uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_CHUNKS_MAX_ORDER;

// Every order up to the maximum has its class, below the DMA classes.
const _: () = assert!(
    uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_CHUNKS_ORDER0 + MAX_ORDER
        < uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS
);

/// What the audit counts.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Class {
    /// Mems alive.
    Mems,
    /// Their physical bytes.
    SysmemBytes,
    /// Handles in files' tables.
    Handles,
    /// CPU kernel mappings.
    KernelMaps,
    /// User VMAs mapping a mem.
    UserMappings,
    /// Sysmem chunks of the given order.
    SysmemChunks(u32),
    /// Chunks DMA-mapped for a GPU.
    DmaMappings,
    /// Their bytes.
    DmaBytes,
}

/// The names used in reports and by ruvmctl, by class index.
const NAMES: [&str; CLASSES] = [
    "mems",
    "sysmem_bytes",
    "handles",
    "kernel_maps",
    "user_mappings",
    "sysmem_chunks_o0",
    "sysmem_chunks_o1",
    "sysmem_chunks_o2",
    "sysmem_chunks_o3",
    "sysmem_chunks_o4",
    "sysmem_chunks_o5",
    "sysmem_chunks_o6",
    "sysmem_chunks_o7",
    "sysmem_chunks_o8",
    "sysmem_chunks_o9",
    "sysmem_chunks_o10",
    "dma_mappings",
    "dma_bytes",
    "reserved_18",
    "reserved_19",
    "reserved_20",
    "reserved_21",
    "reserved_22",
    "reserved_23",
];

impl Class {
    /// The class's index (its `enum ruvm_audit_class` value).
    pub(crate) fn index(self) -> usize {
        let i = match self {
            Class::Mems => uapi::ruvm_audit_class_RUVM_AUDIT_MEMS,
            Class::SysmemBytes => uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_BYTES,
            Class::Handles => uapi::ruvm_audit_class_RUVM_AUDIT_HANDLES,
            Class::KernelMaps => uapi::ruvm_audit_class_RUVM_AUDIT_KERNEL_MAPS,
            Class::UserMappings => uapi::ruvm_audit_class_RUVM_AUDIT_USER_MAPPINGS,
            Class::SysmemChunks(order) => {
                uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_CHUNKS_ORDER0 + order.min(MAX_ORDER)
            }
            Class::DmaMappings => uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS,
            Class::DmaBytes => uapi::ruvm_audit_class_RUVM_AUDIT_DMA_BYTES,
        };
        i as usize
    }
}

/// The name of class `index`.
pub(crate) fn name(index: usize) -> &'static str {
    NAMES.get(index).copied().unwrap_or("unknown")
}

static LIVE: [Atomic<u64>; CLASSES] = [const { Atomic::new(0) }; CLASSES];

/// Counts `n` more of `class` (for paired callbacks; objects use [`Counted`]).
pub(crate) fn add(class: Class, n: u64) {
    if let Some(c) = LIVE.get(class.index()) {
        c.fetch_add(n, Relaxed);
    }
}

/// Counts `n` fewer of `class`.
pub(crate) fn sub(class: Class, n: u64) {
    if let Some(c) = LIVE.get(class.index()) {
        c.fetch_sub(n, Relaxed);
    }
}

/// The live counts of every class.
pub(crate) fn live() -> [u64; CLASSES] {
    let mut v = [0; CLASSES];
    for (dst, c) in v.iter_mut().zip(LIVE.iter()) {
        *dst = c.load(Relaxed);
    }
    v
}

/// `n` of a class, counted while this token lives.
pub(crate) struct Counted {
    class: Class,
    n: u64,
}

impl Counted {
    pub(crate) fn new(class: Class, n: u64) -> Self {
        add(class, n);
        Self { class, n }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        sub(self.class, self.n);
    }
}

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

/// Sysmem statistics.
static RESERVED: Watermark = Watermark::new();
static USED: Watermark = Watermark::new();
static MEMS: Watermark = Watermark::new();
static ALLOCS: Atomic<u64> = Atomic::new(0);
static FREES: Atomic<u64> = Atomic::new(0);
static FAILURES: Atomic<u64> = Atomic::new(0);

/// A mem's share of the statistics, for as long as it lives.
pub(crate) struct Usage {
    reserved: u64,
    used: u64,
}

impl Usage {
    /// A successful allocation of `reserved` physical bytes for `used` requested ones.
    pub(crate) fn new(reserved: u64, used: u64) -> Self {
        RESERVED.add(reserved);
        USED.add(used);
        MEMS.add(1);
        ALLOCS.fetch_add(1, Relaxed);
        Self { reserved, used }
    }
}

impl Drop for Usage {
    fn drop(&mut self) {
        RESERVED.sub(self.reserved);
        USED.sub(self.used);
        MEMS.sub(1);
        FREES.fetch_add(1, Relaxed);
    }
}

/// Counts an allocation that was refused or failed.
pub(crate) fn alloc_failed() {
    FAILURES.fetch_add(1, Relaxed);
}

/// A snapshot of the sysmem statistics.
pub(crate) struct Stats {
    pub(crate) reserved: (u64, u64),
    pub(crate) used: (u64, u64),
    pub(crate) mems: (u64, u64),
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
    pub(crate) failures: u64,
}

/// The sysmem statistics; with `reset_peaks`, the watermarks restart from now afterwards.
pub(crate) fn stats(reset_peaks: bool) -> Stats {
    let s = Stats {
        reserved: RESERVED.get(),
        used: USED.get(),
        mems: MEMS.get(),
        allocs: ALLOCS.load(Relaxed),
        frees: FREES.load(Relaxed),
        failures: FAILURES.load(Relaxed),
    };
    if reset_peaks {
        RESERVED.reset_peak();
        USED.reset_peak();
        MEMS.reset_peak();
    }
    s
}

impl core::fmt::Display for Stats {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        writeln!(f, "backing sysmem")?;
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
        write!(f, "{}", stats(false))
    }
}

/// `/sys/kernel/debug/ruvm/audit`: the live count of every class, one `name count` line each.
pub(crate) struct LiveView;

impl kernel::debugfs::Writer for LiveView {
    fn write(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        writeln!(f, "level {}", level())?;
        for (i, n) in live().iter().enumerate() {
            writeln!(f, "{} {}", name(i), n)?;
        }
        Ok(())
    }
}

/// The `leak_checker` level: 0 no reports, 1 class counts, 2 also every object's origin.
pub(crate) fn level() -> u32 {
    crate::leak_checker_level()
}

/// Logs the unload verdict from `live` (the counts at unload). Returns whether anything leaked.
pub(crate) fn report_unload(live: &[u64; CLASSES]) -> bool {
    let classes = live.iter().filter(|&&n| n != 0).count();
    if level() == 0 {
        return classes != 0;
    }
    if classes == 0 {
        pr_info!("audit: unload verdict=clean\n");
        return false;
    }
    pr_err!("audit: unload verdict=leaked classes={classes}\n");
    for (i, n) in live.iter().enumerate() {
        if *n != 0 {
            pr_err!("audit: leaked class={} count={}\n", name(i), n);
        }
    }
    true
}

/// What the audit keeps until unload: where to write the verdict, and the planted leaks.
pub(crate) struct Unload {
    /// The registered `struct ruvm_unload_state`.
    pub(crate) state: Option<PinnedUser>,
    /// Resources leaked on purpose and held for the report (`RUVM_IOCTL_TEST_LEAK`).
    pub(crate) planted: KVec<Planted>,
}

impl Unload {
    pub(crate) const fn new() -> Self {
        Self {
            state: None,
            planted: KVec::new(),
        }
    }
}
