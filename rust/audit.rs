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
//! The usage statistics are in [`stats`].
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

use crate::{
    bind::{global::global, upin::PinnedUser},
    uapi,
};

pub(crate) mod stats;

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
    /// GPU page tables and directories.
    PtTables,
    /// Their bytes.
    PtBytes,
    /// Mems holding an offset of the GPU kernel VA window.
    GpuKernelVas,
    /// Memory pools.
    Pools,
    /// Chunks cached by pools.
    PoolChunks,
    /// Their bytes.
    PoolBytes,
    /// Vidmem root storage kept for reuse after its root emptied (2 MiB each).
    VidmemKept,
    /// Operations queued on streams, not yet retired.
    StreamOps,
    /// References to mems those operations hold.
    StreamMems,
    /// Pool chunks freed on a stream, the free's completion not yet observed.
    PoolPending,
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
    "pt_tables",
    "pt_bytes",
    "gpu_kernel_vas",
    "pools",
    "pool_chunks",
    "pool_bytes",
    "vidmem_kept",
    "stream_ops",
    "stream_mems",
    "pool_pending",
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
            Class::PtTables => uapi::ruvm_audit_class_RUVM_AUDIT_PT_TABLES,
            Class::PtBytes => uapi::ruvm_audit_class_RUVM_AUDIT_PT_BYTES,
            Class::GpuKernelVas => uapi::ruvm_audit_class_RUVM_AUDIT_GPU_KERNEL_VAS,
            Class::Pools => uapi::ruvm_audit_class_RUVM_AUDIT_POOLS,
            Class::PoolChunks => uapi::ruvm_audit_class_RUVM_AUDIT_POOL_CHUNKS,
            Class::PoolBytes => uapi::ruvm_audit_class_RUVM_AUDIT_POOL_BYTES,
            Class::VidmemKept => uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_KEPT,
            Class::StreamOps => uapi::ruvm_audit_class_RUVM_AUDIT_STREAM_OPS,
            Class::StreamMems => uapi::ruvm_audit_class_RUVM_AUDIT_STREAM_MEMS,
            Class::PoolPending => uapi::ruvm_audit_class_RUVM_AUDIT_POOL_PENDING,
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

/// The live count of one class.
pub(crate) fn live_of(class: Class) -> u64 {
    LIVE.get(class.index()).map_or(0, |c| c.load(Relaxed))
}

/// The live counts of every class.
pub(crate) fn live() -> [u64; CLASSES] {
    let mut v = [0; CLASSES];
    for (dst, c) in v.iter_mut().zip(LIVE.iter()) {
        *dst = c.load(Relaxed);
    }
    v
}

/// `n` of a class counted (`ADD`) or taken out of its count (not `ADD`) while this token
/// lives.
pub(crate) struct Token<const ADD: bool> {
    class: Class,
    n: u64,
}

/// `n` of a class, counted while this token lives.
pub(crate) type Counted = Token<true>;

/// `n` of a class taken out of its count while this token lives: for a resource whose
/// [`Counted`] token stays with it while another class counts it (kept vidmem storage).
pub(crate) type Uncounted = Token<false>;

impl<const ADD: bool> Token<ADD> {
    pub(crate) fn new(class: Class, n: u64) -> Self {
        if ADD {
            add(class, n);
        } else {
            sub(class, n);
        }
        Self { class, n }
    }
}

impl<const ADD: bool> Drop for Token<ADD> {
    fn drop(&mut self) {
        if ADD {
            sub(self.class, self.n);
        } else {
            add(self.class, self.n);
        }
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

/// The `leak_checker` level: 0 no reports, 1 class counts, 2 also every object's origin. Set
/// once at module init.
static LEVEL: Atomic<u32> = Atomic::new(1);

/// Sets the `leak_checker` level and makes the audit's lock usable (module init).
pub(crate) fn init(level: u32) {
    LEVEL.store(level, Relaxed);
    UNLOAD_STATE.init();
}

/// The `leak_checker` level.
pub(crate) fn level() -> u32 {
    LEVEL.load(Relaxed)
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

global! {
    /// The registered `struct ruvm_unload_state`, written at unload.
    static UNLOAD_STATE: Mutex<Option<PinnedUser>> = None;
}

/// `RUVM_IOCTL_REGISTER_UNLOAD_STATE`: pins the user structure at `addr` (zeroing it) to be
/// written at unload. `EBUSY` if one is registered already.
pub(crate) fn register_unload_state(addr: u64) -> Result {
    let mut state = UNLOAD_STATE.lock().ok_or(ENODEV)?;
    if state.is_some() {
        return Err(EBUSY);
    }
    let size = core::mem::size_of::<uapi::ruvm_unload_state>();
    let pinned = PinnedUser::new(addr, size, 8)?;
    pinned.write(&[0u8; core::mem::size_of::<uapi::ruvm_unload_state>()])?;
    *state = Some(pinned);
    Ok(())
}

/// Writes the unload verdict (`live`, and whether it `leaked`) into the registered structure,
/// if any, and lets it go.
pub(crate) fn write_unload_state(live: [u64; CLASSES], leaked: bool) {
    let Some(state) = UNLOAD_STATE.lock().and_then(|mut s| s.take()) else {
        return;
    };
    let mut verdict = uapi::ruvm_unload_state {
        state: uapi::ruvm_unload_state_bits_RUVM_UNLOAD_DONE.into(),
        leaked: live,
    };
    if leaked {
        verdict.state |= u64::from(uapi::ruvm_unload_state_bits_RUVM_UNLOAD_LEAKED);
    }
    if state
        .write(kernel::transmute::AsBytes::as_bytes(&verdict))
        .is_err()
    {
        pr_err!("audit: could not write the unload state\n");
    }
}
