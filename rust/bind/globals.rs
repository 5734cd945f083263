// SPDX-License-Identifier: GPL-2.0

//! Module-wide locked state, and its one-time initialisation.
//!
//! C header: [`include/linux/mutex.h`](srctree/include/linux/mutex.h)
//!
//! `global_lock!` statics must be initialised once before first use; [`init`] does it from the
//! module's init, before `/dev/ruvm` is registered, so no file operation can come first.

use kernel::{prelude::*, rbtree::RBTree, sync::Arc};

use crate::{audit::Unload, gpu::GpuEntry, mem::MemCore};

kernel::sync::global_lock! {
    // SAFETY: initialised by `init` in module init, before any use.
    pub(crate) unsafe(uninit) static MEM_REGISTRY: Mutex<Option<RBTree<u64, Arc<MemCore>>>> = None;
}

kernel::sync::global_lock! {
    // SAFETY: initialised by `init` in module init, before any use.
    pub(crate) unsafe(uninit) static UNLOAD: Mutex<Unload> = Unload::new();
}

kernel::sync::global_lock! {
    // SAFETY: initialised by `init` in module init, before any use.
    pub(crate) unsafe(uninit) static GPUS: Mutex<KVec<GpuEntry>> = KVec::new();
}

/// Initialises the module-wide locks. Called once, from module init, before anything else of
/// ruvm runs.
pub(crate) fn init() {
    // SAFETY: called exactly once, from module init (see `RuvmModule::init`), before any file
    // can be opened, so before any other use of these statics.
    unsafe {
        MEM_REGISTRY.init();
        UNLOAD.init();
        GPUS.init();
    }
}
