// SPDX-License-Identifier: GPL-2.0

//! ruvm: a Rust re-creation of NVIDIA UVM's `uvm_mem` memory manager, driven through `/dev/ruvm`.
//!
//! The crate root lists the modules, reads the parameters, and holds the module type, whose
//! init and exit order everything. `unsafe` code lives in [`bind`] (APIs the kernel crate lacks)
//! and [`uapi`] (the byte-level view of the ABI); every other module is safe policy code.
//!
//! # Layers
//!
//! Each module imports only the ones below it: `ruvm.rs` (this file) → [`file`] (the ioctl
//! surface and `mmap`) → [`stream`] (streams and events) → [`mem`] (the mem object and its parts) → [`gpu`] (registry, engines,
//! PMM) → [`audit`] (counters, statistics, reports) → [`bind`] (the binding layer) → [`uapi`].
//! Calls that must go up are callbacks installed at init (a GPU's removal drops the mems'
//! tables through [`gpu::set_removal_hook`]).
//!
//! # Lock order
//!
//! The one list for the whole crate; a lock may be taken while holding only locks above it:
//!
//! 1. the mmap lock of a process (a user fault, an `mmap` and a VMA's close hold it when they
//!    take a file's or a mem's lock; a free takes it, holding no ruvm lock, to wait for an
//!    `mmap` that filled a VMA);
//! 2. a stream's submission mutex (`stream.rs`), held across one submission's checks and
//!    planning, under which the file's table mutex, mems' and GPUs' locks are taken (and the
//!    caller's mmap lock, for reading, to find a COPY's side named by its address: released
//!    before any ruvm lock is taken; no holder of an mmap lock takes a submission mutex), and,
//!    after the commit, the lock of exchanges with several dma-bufs' objects, then each
//!    reservation object an operation's fence goes into, one at a time (`stream/implicit.rs`;
//!    nothing of ruvm's under it);
//! 3. a file's link (`file/register_ioctls.rs`), held by a registration's revocation while it
//!    takes the handle out of the file's tables (the file's table mutex under it), and by the
//!    file's close to cut it;
//! 4. a file's table mutex (`file.rs`), released before anything below is taken, but a
//!    stream's state mutex (to ask whether a destroyed stream still has work);
//! 5. a stream's state mutex (`stream.rs`): under it only a GPU's users mutex and leaves; the
//!    engine runs no piece with it held;
//! 6. the host GPU list (`gpu/host.rs`), held across an attach or a detach, or the list of
//!    simulated GPUs (`gpu/sim.rs`), held across a removal or a return (never both);
//! 7. a GPU's users mutex (`gpu.rs`), held only to count access guards; a guard itself holds
//!    nothing, and a GPU's removal waits for the guards with no other lock held but 6 (no
//!    guard holder takes it);
//! 8. the mem registry (`mem/registry.rs`), or the pool registry (`mem/pool.rs`; never both),
//!    then a pool's mutex (its bookkeeping only; the shrinker only tries these two);
//! 9. a mem's state mutex (`mem.rs`);
//! 10. a simulated GPU's MMU mutex (`gpu/mmu.rs`): its page tables, written under it;
//! 11. the GPU registry (`gpu.rs`): PMMs and MMUs are visited after it is released, but by the
//!     vidmem shrinker, which only tries it and, under it, each PMM's mutex;
//! 12. a PMM's mutex (`gpu/pmm.rs`; its chunk tree, `gpu/chunks.rs`, is under it);
//! 13. leaves, under which nothing of ruvm is taken: the streams' engines' registry, an
//!     engine's ready and blocked lists, an operation's start time, a point's fence, an event's point
//!     (`stream/`), a GPU's table tracker (`gpu/dma.rs`), a
//!     simulated GPU's translation (`gpu/sim.rs`), an edu engine's busy mutex (`gpu/edu.rs`), a
//!     chunk list's bytes mutex (`bind/pages.rs`), the planted leaks (`mem/plant.rs`), the mmap
//!     offset space (`mem/offsets.rs`), the GPU kernel VA window (`mem/gpu_va.rs`), the pools'
//!     shrinker handle and the kernel's `list_lru` lock of that shrinker, taken under a pool's
//!     mutex (`mem/pool/registry.rs`, `bind/lru.rs`), and the audit's unload state
//!     (`audit.rs`), under which registering pins a user page (taking the mmap lock of the
//!     caller, which holds no ruvm lock then), and a dma-buf's mutexes of its importers'
//!     mappings and of its kernel mapping (`bind/dmabuf.rs`; the dma-buf core calls in with
//!     the buffer's reservation lock held).
//!
//! User memory is never touched with a ruvm lock held, but for the fault path (1 then 9).

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
mod stream;
mod uapi;

/// The module version, from the top-level `VERSION` file (exported by `Kbuild`).
pub(crate) const VERSION: &str = env!("RUVM_VERSION");

module! {
    type: RuvmModule,
    name: "ruvm",
    authors: ["The ruvm developers"],
    description: "Rust re-creation of NVIDIA UVM's uvm_mem memory manager",
    license: "GPL",
    // dma_buf_export and the other dma-buf functions are exported in this namespace.
    imports_ns: ["DMA_BUF"],
    params: {
        enable_test_ioctls: u32 {
            default: 0,
            description: "Allow test-only ioctls (planted failures) for CAP_SYS_ADMIN; 0 = off",
        },
        max_alloc_mib: u64 {
            default: 0,
            description: "Largest physical size of one mem, in MiB (ENOSPC beyond); 0: half the machine's memory, at most 1024",
        },
        vidmem_mib: u64 {
            default: 64,
            description: "Vidmem of each GPU, in MiB: even (2 MiB root chunks), at most 65534; 0 none",
        },
        vidmem_keep_mib: u64 {
            default: 8,
            description: "Vidmem root storage each GPU keeps for reuse once its root chunk empties, in MiB: even, at most 65534; 0 gives it back at once",
        },
        vidmem_user_mib: u64 {
            default: 0,
            description: "Vidmem of each GPU one user may hold, in MiB (ENOMEM beyond; RUVM_IOCTL_VIDMEM_LIMIT changes it); 0: no limit",
        },
        sim_gpus: u32 {
            default: 0,
            description: "Simulated GPUs (faux devices, CPU copy engine) to create, 0 to 8",
        },
        leak_checker: u32 {
            default: 1,
            description: "Leak audit reports: 0 none, 1 class counts at unload and reclaims at close, 2 also every object's origin",
        },
        zeroing: u32 {
            default: 0,
            description: "How zeroed chunks are zeroed: 0 the faster way, measured at load; 1 by the page allocator (__GFP_ZERO); 2 by memset after allocating",
        },
        max_file_mib: u64 {
            default: 0,
            description: "Most physical bytes of mems one open file may hold, in MiB (ENOSPC beyond); 0: half the machine's memory, at most 4096",
        },
    },
}

/// A size parameter in MiB, as bytes (saturating: a huge value means "no limit").
fn mib(value: u64) -> u64 {
    value.saturating_mul(1 << 20)
}

/// A limit parameter in MiB, as bytes; 0 derives it from the machine: half its memory (whole
/// MiB), at most `cap_mib`. The memory cgroup is what bounds a process; these keep one mem, or
/// one file, from taking most of a machine that has no cgroup limit.
fn limit_bytes(value: u64, cap_mib: u64) -> u64 {
    if value != 0 {
        return mib(value);
    }
    let half = bind::meminfo::total_ram_bytes() / 2;
    (half & !((1 << 20) - 1)).min(mib(cap_mib))
}

// A string parameter (the `module!` macro above makes integers only).
bind::param::str_param!(
    static HOST_GPUS,
    "host_gpus",
    "Host GPUs to DMA-map for, not bound: PCI addresses as lspci -D writes them, separated by commas (0000:65:00.0,0000:b3:00.0), at most 8"
);

/// The most vidmem one GPU may have, in MiB.
const MAX_VIDMEM_MIB: u64 = 65534;

/// A vidmem size parameter `name` of `value` MiB, as bytes: whole 2 MiB root chunks, at most
/// [`MAX_VIDMEM_MIB`]; `EINVAL` (with an error line) otherwise.
fn vidmem_bytes(name: &str, value: u64) -> Result<u64> {
    if value % 2 != 0 || value > MAX_VIDMEM_MIB {
        pr_err!("{name} {value}: must be even and at most {MAX_VIDMEM_MIB}\n");
        return Err(EINVAL);
    }
    Ok(mib(value))
}

/// The GPU settings of the parameters: vidmem size and host GPU addresses. `EINVAL` (with an
/// error line) for a value the module cannot honour, so that it fails the load.
fn gpu_config() -> Result<gpu::Config> {
    Ok(gpu::Config {
        vidmem: vidmem_bytes("vidmem_mib", *module_parameters::vidmem_mib.value())?,
        vidmem_keep: vidmem_bytes(
            "vidmem_keep_mib",
            *module_parameters::vidmem_keep_mib.value(),
        )?,
        vidmem_user: mib(*module_parameters::vidmem_user_mib.value()),
        host: gpu::host::parse_list(HOST_GPUS.value())?,
    })
}

/// The audit's level (`leak_checker`): 0, 1 or 2, the values uvm's `uvm_leak_checker` takes;
/// `EINVAL` (with an error line) otherwise.
fn leak_level() -> Result<u32> {
    match *module_parameters::leak_checker.value() {
        level @ 0..=2 => Ok(level),
        v => {
            pr_err!("leak_checker {v}: must be 0, 1 or 2\n");
            Err(EINVAL)
        }
    }
}

/// The chunk order [`choose_zeroing`] times (64 KiB), and how many times each way.
const ZEROING_TEST_ORDER: u32 = 4;
const ZEROING_TEST_ROUNDS: u32 = 5;

/// Sets how zeroed chunks get their zeros (`zeroing`): by default the faster of the page
/// allocator and `memset`, timed now (the page allocator's if the timing itself fails). `EINVAL`
/// (with an error line) for a value the parameter does not have, so that it fails the load.
fn choose_zeroing() -> Result {
    use bind::pages::{self, Zeroing};
    let how = match *module_parameters::zeroing.value() {
        0 => match pages::time_zeroing(ZEROING_TEST_ORDER, ZEROING_TEST_ROUNDS) {
            Ok((by_allocator, by_memset)) => {
                let how = if by_memset < by_allocator {
                    Zeroing::Memset
                } else {
                    Zeroing::PageAllocator
                };
                let kib = (kernel::page::PAGE_SIZE << ZEROING_TEST_ORDER) / 1024;
                pr_info!(
                    "zeroing by {how:?}: {kib} KiB took {by_allocator} ns by the page allocator, {by_memset} ns by memset\n"
                );
                how
            }
            Err(e) => {
                pr_info!("zeroing by PageAllocator: timing the two ways failed ({e:?})\n");
                Zeroing::PageAllocator
            }
        },
        1 => Zeroing::PageAllocator,
        2 => Zeroing::Memset,
        v => {
            pr_err!("zeroing {v}: must be 0, 1 or 2\n");
            return Err(EINVAL);
        }
    };
    pages::set_zeroing(how);
    Ok(())
}

/// The module-wide state of the layers below the module: made usable first, emptied on drop,
/// so that a load failing part-way (a later field's error drops it) leaves nothing behind.
struct Layers;

impl Layers {
    /// Initialises the layers' state, bottom up. On failure what was set up is emptied again
    /// (by the drop of the value made first).
    fn new(config: gpu::Config) -> Result<Self> {
        let level = leak_level()?;
        choose_zeroing()?;
        let layers = Layers;
        audit::init(level);
        gpu::init(config);
        gpu::dma::init()?;
        mem::init()?;
        stream::init()?;
        Ok(layers)
    }
}

impl Drop for Layers {
    fn drop(&mut self) {
        // The planted leaks held for the unload report, and the registries' references. The
        // GPU sources (later fields) unregister their GPUs after this; that finds nothing left
        // to drop.
        // The streams' runners first (idempotent: the unload did it already).
        stream::engine::exit();
        let freed = mem::exit();
        // Every mem gone: the last releases of other exporters' buffers end here.
        gpu::dma::exit();
        gpu::drain();
        if freed > 0 && audit::level() > 0 {
            pr_info!("audit: freed objects={freed}\n");
        }
    }
}

/// The loaded module: owns the layers' state, the `/dev/ruvm` registration, the GPU sources and
/// `/sys/kernel/debug/ruvm/`.
///
/// Field order is teardown order: the layers' state goes first (everything was reported by
/// then, and no file is open), then the device, so no file can be opened while the rest is torn
/// down; then the GPU sources let their GPUs go. A load failing part-way drops the fields made
/// so far in the reverse order, the layers' state last.
#[pin_data(PinnedDrop)]
struct RuvmModule {
    /// The layers' state (the pools' memcg-aware shrinker with it: `mem/pool/registry.rs`).
    _layers: Layers,
    /// The vidmem storage the PMMs keep, given back under memory pressure.
    _vidmem_shrinker: bind::shrinker::Shrinker,
    #[pin]
    _miscdev: MiscDeviceRegistration<file::RuvmFile>,
    /// Before the edu driver, so that it leaves the host GPUs alone.
    _host: gpu::host::HostGpus,
    _sim: gpu::sim::SimGpus,
    #[pin]
    _edu: driver::Registration<pci::Adapter<gpu::edu::EduDriver>>,
    #[pin]
    _stats: debugfs::File<audit::stats::StatsView>,
    #[pin]
    _audit: debugfs::File<audit::LiveView>,
    #[pin]
    _page_tables: debugfs::File<gpu::mmu::TablesView>,
    #[pin]
    _pools: debugfs::File<mem::pool::registry::PoolsView>,
    #[pin]
    _vidmem_users: debugfs::File<gpu::limit::UsersView>,
    _debugfs: debugfs::Dir,
}

impl kernel::InPlaceModule for RuvmModule {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        let config = gpu_config();
        let test_ioctls = *module_parameters::enable_test_ioctls.value() != 0;
        file::configure(file::Settings {
            test_ioctls,
            max_alloc_bytes: limit_bytes(*module_parameters::max_alloc_mib.value(), 1024),
            max_file_bytes: limit_bytes(*module_parameters::max_file_mib.value(), 4096),
        });
        if test_ioctls {
            pr_warn!("test ioctls are enabled; this is a security risk\n");
        }
        pr_info!(
            "version {} loaded (ABI {})\n",
            VERSION,
            uapi::RUVM_ABI_VERSION
        );
        let dir = debugfs::Dir::new(c"ruvm");
        try_pin_init!(Self {
            // First, before anything that can reach it is registered; a bad parameter fails the
            // load here (`config` is `Err` then).
            _layers: Layers::new(config?)?,
            _vidmem_shrinker: bind::shrinker::Shrinker::register::<gpu::VidmemShrink>(
                c"ruvm-vidmem"
            )?,
            _miscdev <- MiscDeviceRegistration::register(MiscDeviceOptions { name: c"ruvm" }),
            _host: gpu::host::HostGpus::new(&config?.host)?,
            _sim: gpu::sim::SimGpus::new(*module_parameters::sim_gpus.value())?,
            _edu <- driver::Registration::new(c"ruvm-edu", module),
            _stats <- dir.read_only_file(c"stats", audit::stats::StatsView),
            _audit <- dir.read_only_file(c"audit", audit::LiveView),
            _page_tables <- dir.read_only_file(c"page_tables", gpu::mmu::TablesView),
            _pools <- dir.read_only_file(c"pools", mem::pool::registry::PoolsView),
            _vidmem_users <- dir.read_only_file(c"vidmem_users", gpu::limit::UsersView),
            _debugfs: dir,
        })
    }
}

#[pinned_drop]
impl PinnedDrop for RuvmModule {
    fn drop(self: Pin<&mut Self>) {
        // No file can be open here: each open file holds a module reference (`bind::fops`),
        // and each user mapping holds its file. The vidmem storage the PMMs keep for reuse goes
        // first; what is still counted then has leaked. Before it, the streams' runners end:
        // every operation is retired and every fence signalled then.
        stream::engine::exit();
        bind::fence::quiesce();
        // A registration's revocation may still be dropping what it took out of a file that
        // has closed since.
        mem::register::settle();
        gpu::release_kept();
        let live = audit::live();
        let leaked = audit::report_unload(&live);
        if leaked && audit::level() >= 2 {
            mem::registry::report_objects();
        }
        audit::write_unload_state(live, leaked);
        // The fields go next, the layers' state first.
        pr_info!("unloaded\n");
    }
}
