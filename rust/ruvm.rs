// SPDX-License-Identifier: GPL-2.0

//! ruvm: a Rust re-creation of NVIDIA UVM's `uvm_mem` memory manager, driven through `/dev/ruvm`.
//!
//! The crate root only lists the modules and holds the module type. `unsafe` code lives in
//! [`bind`] (APIs the kernel crate lacks) and [`uapi`] (the byte-level view of the ABI); every
//! other module is safe policy code.

use kernel::{
    miscdevice::{MiscDeviceOptions, MiscDeviceRegistration},
    prelude::*,
};

mod bind;
mod file;
mod mem;
mod uapi;

/// The module version, from the top-level `VERSION` file (exported by `Kbuild`).
pub(crate) const VERSION: &str = env!("RUVM_VERSION");

module! {
    type: RuvmModule,
    name: "ruvm",
    authors: ["The ruvm developers"],
    description: "Rust re-creation of NVIDIA UVM's uvm_mem memory manager",
    license: "GPL",
    params: {
        enable_test_ioctls: u32 {
            default: 0,
            description: "Allow test-only ioctls (planted failures) for CAP_SYS_ADMIN; 0 = off",
        },
        max_alloc_mib: u64 {
            default: 1024,
            description: "Largest physical size of one mem, in MiB (ENOSPC beyond)",
        },
        max_file_mib: u64 {
            default: 4096,
            description: "Most physical bytes of mems one open file may hold, in MiB (ENOSPC beyond)",
        },
    },
}

/// A size parameter in MiB, as bytes (saturating: a huge value means "no limit").
fn mib(value: u64) -> u64 {
    value.saturating_mul(1 << 20)
}

/// The largest physical size of one mem (`max_alloc_mib`).
pub(crate) fn max_alloc_bytes() -> u64 {
    mib(*module_parameters::max_alloc_mib.value())
}

/// The most physical bytes of mems one open file may hold (`max_file_mib`).
pub(crate) fn max_file_bytes() -> u64 {
    mib(*module_parameters::max_file_mib.value())
}

/// Whether the module was loaded with `enable_test_ioctls` set.
pub(crate) fn test_ioctls_enabled() -> bool {
    *module_parameters::enable_test_ioctls.value() != 0
}

/// The loaded module: owns the `/dev/ruvm` registration.
#[pin_data(PinnedDrop)]
struct RuvmModule {
    #[pin]
    _miscdev: MiscDeviceRegistration<file::RuvmFile>,
}

impl kernel::InPlaceModule for RuvmModule {
    fn init(_module: &'static ThisModule) -> impl PinInit<Self, Error> {
        if test_ioctls_enabled() {
            pr_warn!("test ioctls are enabled; this is a security risk\n");
        }
        pr_info!(
            "version {} loaded (ABI {})\n",
            VERSION,
            uapi::RUVM_ABI_VERSION
        );
        try_pin_init!(Self {
            _miscdev <- MiscDeviceRegistration::register(MiscDeviceOptions { name: c"ruvm" }),
        })
    }
}

#[pinned_drop]
impl PinnedDrop for RuvmModule {
    fn drop(self: Pin<&mut Self>) {
        // No file can be open here: each open file holds a module reference (`bind::fops`), and
        // each user mapping holds its file. So every mem must be gone.
        let (mems, bytes) = mem::live();
        if kernel::warn_on!(mems != 0 || bytes != 0) {
            pr_err!("unloading with {mems} mems ({bytes} bytes) still alive\n");
        }
        pr_info!("unloaded\n");
    }
}
