// SPDX-License-Identifier: GPL-2.0

//! ruvm: a Rust re-creation of NVIDIA UVM's `uvm_mem` memory manager, driven through `/dev/ruvm`.
//!
//! The crate root only lists the modules and holds the module type. `unsafe` code lives in
//! [`bind`] (APIs the kernel crate lacks) and [`uapi`] (the byte-level view of the ABI); every
//! other module is safe policy code.

use kernel::{
    debugfs, driver,
    miscdevice::{MiscDeviceOptions, MiscDeviceRegistration},
    pci,
    prelude::*,
};

mod audit;
mod bind;
mod file;
mod gpu;
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
        host_gpus: u64 {
            default: 0,
            description: "Host GPUs to DMA-map for, not bound: up to four PCI addresses (bus << 8 | devfn, domain 0) in 16-bit fields; 0 none",
        },
        vidmem_mib: u64 {
            default: 64,
            description: "Vidmem of each GPU, in MiB: even (2 MiB root chunks), at most 65534; 0 none",
        },
        vidmem_mib_gpu: u64 {
            default: 0,
            description: "Per-GPU vidmem overrides: MiB for GPU ids 0 to 3 in 16-bit fields (even); a 0 field uses vidmem_mib",
        },
        sim_gpus: u32 {
            default: 0,
            description: "Simulated GPUs (faux devices, CPU copy engine) to create, 0 to 8",
        },
        leak_checker: u32 {
            default: 1,
            description: "Leak audit reports: 0 none, 1 class counts at unload and reclaims at close, 2 also every object's origin",
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

/// The `host_gpus` parameter.
pub(crate) fn host_gpus_param() -> u64 {
    *module_parameters::host_gpus.value()
}

/// The most vidmem one GPU may have, in MiB (a 16-bit field of `vidmem_mib_gpu`).
const MAX_VIDMEM_MIB: u64 = 65534;

/// Field `i` (0 to 3) of a parameter made of four 16-bit fields (7.2's `module!` parameters
/// are integers only); 0 past the fourth.
pub(crate) fn param_field(value: u64, i: u32) -> u64 {
    i.checked_mul(16)
        .and_then(|s| value.checked_shr(s))
        .map_or(0, |v| v & 0xffff)
}

/// The vidmem size of GPU `id`, in bytes, from `vidmem_mib` and `vidmem_mib_gpu`.
pub(crate) fn vidmem_bytes(id: u32) -> u64 {
    let field = param_field(*module_parameters::vidmem_mib_gpu.value(), id);
    let mib_value = if field != 0 {
        field
    } else {
        *module_parameters::vidmem_mib.value()
    };
    mib(mib_value)
}

/// Checks the vidmem parameters (so that a bad value fails the load, not a later probe).
fn check_vidmem_params() -> Result {
    let all = *module_parameters::vidmem_mib.value();
    let per_gpu = *module_parameters::vidmem_mib_gpu.value();
    let fields = (0..4).map(|i| param_field(per_gpu, i));
    for v in Iterator::chain(core::iter::once(all), fields) {
        if v % 2 != 0 || v > MAX_VIDMEM_MIB {
            pr_err!("vidmem size {v} MiB: must be even and at most {MAX_VIDMEM_MIB}\n");
            return Err(EINVAL);
        }
    }
    Ok(())
}

/// The `leak_checker` level.
pub(crate) fn leak_checker_level() -> u32 {
    *module_parameters::leak_checker.value()
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

/// The loaded module: owns the `/dev/ruvm` registration, the test-GPU driver and
/// `/sys/kernel/debug/ruvm/`.
///
/// Field order is teardown order: the device goes first, so no file can be opened while the
/// rest is torn down; then the driver lets its GPUs go.
#[pin_data(PinnedDrop)]
struct RuvmModule {
    #[pin]
    _miscdev: MiscDeviceRegistration<file::RuvmFile>,
    /// Before the edu driver, so that it leaves the host GPUs alone.
    _host: gpu::HostGpus,
    _sim: gpu::sim::SimGpus,
    #[pin]
    _edu: driver::Registration<pci::Adapter<gpu::edu::EduDriver>>,
    #[pin]
    _stats: debugfs::File<audit::StatsView>,
    #[pin]
    _audit: debugfs::File<audit::LiveView>,
    _debugfs: debugfs::Dir,
}

impl kernel::InPlaceModule for RuvmModule {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        bind::globals::init();
        if test_ioctls_enabled() {
            pr_warn!("test ioctls are enabled; this is a security risk\n");
        }
        pr_info!(
            "version {} loaded (ABI {})\n",
            VERSION,
            uapi::RUVM_ABI_VERSION
        );
        let dir = debugfs::Dir::new(c"ruvm");
        try_pin_init!(Self {
            // First: a bad parameter fails the load before anything is registered.
            _: { check_vidmem_params()? },
            _miscdev <- MiscDeviceRegistration::register(MiscDeviceOptions { name: c"ruvm" }),
            _host: gpu::HostGpus::new(host_gpus_param())?,
            _sim: gpu::sim::SimGpus::new(*module_parameters::sim_gpus.value())?,
            _edu <- driver::Registration::new(c"ruvm-edu", module),
            _stats <- dir.read_only_file(c"stats", audit::StatsView),
            _audit <- dir.read_only_file(c"audit", audit::LiveView),
            _debugfs: dir,
        })
    }
}

#[pinned_drop]
impl PinnedDrop for RuvmModule {
    fn drop(self: Pin<&mut Self>) {
        // No file can be open here: each open file holds a module reference (`bind::fops`),
        // and each user mapping holds its file. What is still counted has leaked.
        let live = audit::live();
        let leaked = audit::report_unload(&live);
        if leaked && audit::level() >= 2 {
            mem::report_objects();
        }
        let (state, planted) = {
            let mut unload = bind::globals::UNLOAD.lock();
            (
                unload.state.take(),
                core::mem::replace(&mut unload.planted, KVec::new()),
            )
        };
        if let Some(state) = state {
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
        // Then free what can be freed: the planted leaks held for this report, and the
        // registry's references.
        let freed = planted.len();
        drop(planted);
        mem::drain_registry();
        // The driver (a later field) unbinds its GPUs after this; unregistering then is a no-op.
        gpu::drain();
        if freed > 0 && audit::level() > 0 {
            pr_info!("audit: freed objects={freed}\n");
        }
        pr_info!("unloaded\n");
    }
}
