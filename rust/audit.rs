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
//! Per backing (sysmem, vidmem of all GPUs): reserved bytes (what mems hold), used bytes (what
//! was asked for), mems, each with a high watermark that can be restarted; allocations, frees
//! and failures since load.
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
    /// Physical bytes of vidmem mems.
    VidmemBytes,
    /// Vidmem chunks held by mems.
    VidmemChunks,
    /// Vidmem root chunks with storage (2 MiB of kernel pages each).
    VidmemRoots,
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
    "vidmem_bytes",
    "vidmem_chunks",
    "vidmem_roots",
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
            Class::VidmemBytes => uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_BYTES,
            Class::VidmemChunks => uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_CHUNKS,
            Class::VidmemRoots => uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_ROOTS,
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

impl Drop for Usage {
    fn drop(&mut self) {
        let s = self.backing.stats();
        s.reserved.sub(self.reserved);
        s.used.sub(self.used);
        s.mems.sub(1);
        s.frees.fetch_add(1, Relaxed);
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
