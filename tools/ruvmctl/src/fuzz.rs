// SPDX-License-Identifier: GPL-2.0

//! `ruvmctl fuzz`: several processes, each with several threads, issue random operations on
//! `/dev/ruvm` with valid, boundary and malformed arguments (every ioctl; mmap, munmap, mremap,
//! reads and writes of mappings; fork; close, dup and `pidfd_getfd` of files; streams and events:
//! batches of operations submitted, waited for, exported as sync_files; SIGKILL of whole
//! processes; GPU unbind and rebind; module unload attempts; the kernel's shrinkers). The
//! oracle checks every errno against the set `Documentation/ruvm.rst` gives for that call, and
//! at the end that nothing is left: no mem alive, no stream operation queued, every audit
//! counter zero once the shrinkers gave back what is kept for reuse. Three more oracles
//! ([`oracle`]): no worker ever reads another's bytes (isolation), kernel memory grows only as
//! far as the workers' memory cgroup is charged (resources, `--memcg`), and every GPU removal
//! finishes in bounded time while the workers keep working, with their streams busy, and every
//! fence of a killed worker, a closed file or a removed GPU signals in bounded time (liveness,
//! with [`fences`]).
//!
//! Seeded and reproducible: the seed is printed, and each worker's stream of operations is a
//! function of the seed and its slot; the interleaving of threads is the kernel's.

use std::{
    sync::atomic::{AtomicI32, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use libruvm::{uapi, Ruvm};
use nix::{
    sys::{
        mman::{mmap_anonymous, MapFlags, ProtFlags},
        signal::{kill, Signal},
        wait::{waitpid, WaitPidFlag, WaitStatus},
    },
    unistd::{fork, ForkResult, Pid},
};

mod fences;
mod ops;
mod oracle;
mod rng;

pub use rng::Rng;

/// What `fuzz` runs.
pub struct Spec {
    pub seed: u64,
    pub ops: u64,
    pub duration: Duration,
    pub procs: usize,
    pub threads: usize,
    pub unbind: bool,
    pub kill: bool,
    /// The longest a GPU removal may take (the liveness oracle).
    pub removal_bound: Duration,
    /// The largest size a valid allocation asks for.
    pub max_size: u64,
    /// The workers' memory cgroup limit (bytes), for the resources oracle.
    pub memcg: Option<u64>,
    /// How far kernel memory may grow beyond the workers' cgroup charge (bytes).
    pub kmem_bound: u64,
    /// The workers drop root (uid and gid 65534) once in their cgroup.
    pub unprivileged: bool,
}

/// Counters shared by the workers (in a shared anonymous mapping of one page).
#[repr(C)]
pub struct Shared {
    pub ops: AtomicU64,
    pub problems: AtomicU64,
    /// Set when the run is over (budget spent or time up).
    pub stop: AtomicU64,
    /// The parent's requests for busy streams, one per worker slot ([`fences`]).
    pub busy: [AtomicU64; fences::BUSY_SLOTS],
    /// The sync_files each worker slot hands to the parent: descriptor numbers the parent
    /// takes with `pidfd_getfd` ([`fences`]).
    pub handoffs: [[AtomicI32; fences::HANDOFFS]; fences::BUSY_SLOTS],
}

/// The length of the shared mapping: [`Shared`] in whole pages.
const SHARED_LEN: usize = std::mem::size_of::<Shared>().next_multiple_of(4096);

/// A fresh shared mapping holding a zeroed [`Shared`].
fn shared() -> Result<&'static Shared> {
    let len = std::num::NonZeroUsize::new(SHARED_LEN).context("page")?;
    // SAFETY: a new anonymous shared mapping aliases nothing; zero bytes are valid atomics. It
    // is never unmapped (the process exits first), so the `'static` borrow holds.
    let p = unsafe {
        mmap_anonymous(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
        )
    }
    .context("mmap of the shared counters")?;
    // SAFETY: see above; the mapping is page-aligned, larger than `Shared`.
    Ok(unsafe { &*p.as_ptr().cast::<Shared>() })
}

/// Starts one worker process in `slot`, in the workers' memory cgroup `group` if any; `fences`
/// takes the sync_files it hands over (by its pidfd).
fn spawn(
    spec: &Spec,
    shared: &'static Shared,
    slot: usize,
    generation: u64,
    group: Option<&std::path::Path>,
    fences: &mut fences::Fences,
) -> Result<Pid> {
    // The cells of a new worker start free (the one before it in the slot is dead and reaped).
    fences.reset(slot);
    // SAFETY: the parent is single-threaded; the child runs the worker and exits.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            if let Some(dir) = group {
                if let Err(e) = std::fs::write(dir.join("cgroup.procs"), "0") {
                    println!("fuzz: PROBLEM: joining {}: {e}", dir.display());
                    shared.problems.fetch_add(1, Ordering::Relaxed);
                }
            }
            if spec.unprivileged {
                let nobody = nix::unistd::Gid::from_raw(65534);
                let ok = nix::unistd::setgroups(&[nobody]).is_ok()
                    && nix::unistd::setgid(nobody).is_ok()
                    && nix::unistd::setuid(nix::unistd::Uid::from_raw(65534)).is_ok();
                if !ok {
                    println!("fuzz: PROBLEM: a worker could not drop root");
                    shared.problems.fetch_add(1, Ordering::Relaxed);
                    std::process::exit(1);
                }
                // The uid change made it non-dumpable (`suid_dumpable` 0): dumpable again, the
                // parent's `pidfd_getfd` of its sync_files needs no CAP_SYS_PTRACE, and its own
                // /proc/self/mem (the isolation oracle's reads) is its own to open.
                if nix::sys::prctl::set_dumpable(true).is_err() {
                    println!("fuzz: PROBLEM: PR_SET_DUMPABLE in a worker that dropped root");
                    shared.problems.fetch_add(1, Ordering::Relaxed);
                }
            }
            let seed = rng::mix(spec.seed, slot as u64, generation);
            ops::worker(seed, slot, spec.threads, spec.max_size, spec.memcg, shared);
            std::process::exit(0)
        }
        ForkResult::Parent { child } => match fences::pidfd_open(child) {
            Ok(pidfd) => {
                fences.set_worker(slot, pidfd);
                Ok(child)
            }
            Err(e) => {
                let _ = kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                Err(e).context("pidfd_open of a worker")
            }
        },
    }
}

/// Runs the fuzzer; returns the number of problems found.
pub fn run(spec: &Spec) -> Result<u64> {
    println!(
        "fuzz: seed {} ({} processes x {} threads, up to {} operations or {:?})",
        spec.seed, spec.procs, spec.threads, spec.ops, spec.duration
    );
    // Held through the run: the module cannot unload under the workers, and the unload
    // attempts must fail.
    let anchor = Ruvm::open().context("open /dev/ruvm")?;
    let shared = shared()?;
    let mut rng = Rng::new(spec.seed ^ 0x5eed);
    if spec.unprivileged {
        // Unprivileged workers open the device like any user the operator lets in.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(libruvm::path(), std::fs::Permissions::from_mode(0o666))
            .context("chmod 0666 /dev/ruvm")?;
    }
    let mut resources = match spec.memcg {
        Some(max) => Some(oracle::Resources::new(max, spec.kmem_bound)?),
        None => None,
    };
    let group = resources.as_ref().map(|r| r.group.dir.clone());
    let test_ioctls = anchor.info().is_ok_and(|i| i.test_ioctls != 0);
    let start = Instant::now();
    let mut fences = fences::Fences::new(shared);
    let mut workers = Vec::new();
    for slot in 0..spec.procs {
        let pid = spawn(spec, shared, slot, 0, group.as_deref(), &mut fences)?;
        workers.push((pid, 0u64));
    }
    let slots: Vec<usize> = (0..spec.procs).collect();
    let mut busy_kills = 0u64;
    let mut busy_removals = 0u64;
    let mut removals = 0u64;
    let mut slowest = Duration::ZERO;
    let mut kills = 0u64;
    let mut unbinds = 0u64;
    let mut attaches = 0u64;
    let mut unloads = 0u64;
    let mut shrinks = 0u64;
    while shared.ops.load(Ordering::Relaxed) < spec.ops && start.elapsed() < spec.duration {
        std::thread::sleep(Duration::from_millis(100 + rng.below(400)));
        fences.drain();
        if spec.kill && rng.one_in(4) {
            let slot = rng.below(workers.len() as u64) as usize;
            let (pid, generation) = workers[slot];
            // Mostly with its streams busy: the kill cancels their work.
            if rng.below(4) != 0 && fences::make_busy(shared, &[slot], None) > 0 {
                busy_kills += 1;
            }
            // What it handed over is taken while it lives: its descriptors go with it.
            fences.take_slot(slot);
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
            if let Some(what) = fences.check_slot(slot) {
                println!("fuzz: PROBLEM: {what}");
                shared.problems.fetch_add(1, Ordering::Relaxed);
            }
            let pid = spawn(
                spec,
                shared,
                slot,
                generation + 1,
                group.as_deref(),
                &mut fences,
            )?;
            workers[slot] = (pid, generation + 1);
            kills += 1;
        }
        if spec.unbind && test_ioctls && rng.one_in(6) {
            let sims = ops::sims(&anchor);
            if !sims.is_empty() {
                // The GPU's streams busy first, and the points pending on it taken to check.
                let g = rng.pick(&sims);
                let busy = fences::make_busy(shared, &slots, Some(g)) > 0;
                let pending = fences.take_on_gpu(g);
                if let Some(took) =
                    ops::sim_remove_add(&anchor, g, &mut rng, shared, spec.removal_bound)
                {
                    removals += 1;
                    busy_removals += u64::from(busy);
                    slowest = slowest.max(took);
                    removal_fences(&mut fences, pending, g, shared);
                }
            }
        }
        if let Some(r) = resources.as_mut() {
            if let Some(what) = r.sample_vidmem() {
                println!("fuzz: PROBLEM: {what}");
                shared.problems.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(unseen) = r.sample() {
                println!(
                    "fuzz: PROBLEM: kernel memory (slab and vmalloc) grew {} KiB beyond what the workers' memory cgroup was charged (bound {} KiB)",
                    unseen / 1024,
                    spec.kmem_bound / 1024
                );
                shared.problems.fetch_add(1, Ordering::Relaxed);
                // Once is enough: the bound is raised to what was seen.
                r.raise(unseen);
            }
        }
        if spec.unbind && rng.one_in(6) {
            // The GPU's streams busy first, and the points pending on it taken to check.
            let dev = ops::edu_device(&mut rng);
            let gpu = dev.as_deref().and_then(|d| ops::gpu_of_pci(&anchor, d));
            let mut pending = Vec::new();
            let mut busy = false;
            if let Some(g) = gpu {
                busy = fences::make_busy(shared, &slots, Some(g)) > 0;
                pending = fences.take_on_gpu(g);
            }
            let (did, took) =
                oracle::timed(|| ops::unbind_rebind(dev.as_deref(), &mut rng, shared));
            if !matches!(did, ops::Unbound::Nothing) {
                if let Some(g) = gpu {
                    removal_fences(&mut fences, pending, g, shared);
                }
                removals += 1;
                busy_removals += u64::from(busy);
                slowest = slowest.max(took);
                if took > spec.removal_bound {
                    println!(
                        "fuzz: PROBLEM: an edu GPU's unbind took {:.1} s with the workers running",
                        took.as_secs_f64()
                    );
                    shared.problems.fetch_add(1, Ordering::Relaxed);
                }
            }
            match did {
                ops::Unbound::Nothing => {}
                ops::Unbound::Rebound => unbinds += 1,
                ops::Unbound::Attached => {
                    unbinds += 1;
                    attaches += 1;
                }
            }
        }
        if rng.one_in(5) {
            ops::unload_attempt(shared);
            unloads += 1;
        }
        // The kernel's shrinkers, racing the workers: pools' caches and kept vidmem storage
        // given back under their feet (root only).
        if rng.one_in(5) && std::fs::write("/proc/sys/vm/drop_caches", "2").is_ok() {
            shrinks += 1;
        }
    }
    shared.stop.store(1, Ordering::Relaxed);
    // Each worker waits for the parent to take what it announced before it exits (its
    // descriptors go with it): taken here until every worker is reaped.
    let mut left: Vec<Pid> = workers.iter().map(|(pid, _)| *pid).collect();
    while !left.is_empty() {
        fences.drain_all();
        let mut still = Vec::new();
        for pid in left {
            if waitpid(pid, Some(WaitPidFlag::WNOHANG)).context("waitpid")?
                == WaitStatus::StillAlive
            {
                still.push(pid);
            }
        }
        left = still;
        if !left.is_empty() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // Every worker gone: every sync_file the parent holds must signal.
    let late = fences.finish();
    if late > 0 {
        println!(
            "fuzz: PROBLEM: {late} sync_files exported by the workers still pending {} s after every worker exited",
            fences::SIGNAL_BOUND.as_secs()
        );
        shared.problems.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(first) = &fences.first_failure {
        // Not ruvm's doing, but the liveness oracle had none of those fences.
        println!(
            "fuzz: PROBLEM: {} sync_files handed over by the workers could not be taken; the first: {first}",
            fences.failed
        );
        shared.problems.fetch_add(1, Ordering::Relaxed);
    }
    let secs = start.elapsed().as_secs_f64();
    drop(anchor);
    let total = shared.ops.load(Ordering::Relaxed);
    let mut problems = shared.problems.load(Ordering::Relaxed);
    // Everything must be gone with the workers. The last holders of a file may let go just
    // after them: a child a worker forked, orphaned by its SIGKILL, finishing its one ioctl (it
    // is not the parent's to wait for).
    // What is still alive after 10 s has leaked. So are operations still queued on streams
    // then (`stream_ops`, `stream_mems`): a file's release cancels its streams' work, the piece
    // running ends, and they hold their mems until then.
    let d = Ruvm::open().context("open /dev/ruvm")?;
    let mut info = d.info().context("RUVM_IOCTL_INFO")?;
    let settle = std::time::Instant::now();
    while (info.live_mems != 0 || streams_busy(&d))
        && settle.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
        info = d.info().context("RUVM_IOCTL_INFO")?;
    }
    if info.live_mems == 0 && settle.elapsed() >= std::time::Duration::from_millis(100) {
        println!(
            "fuzz: the last files closed {:.1} s after the workers",
            settle.elapsed().as_secs_f64()
        );
    }
    if info.live_mems != 0 {
        println!(
            "fuzz: PROBLEM: {} mems alive after every file closed",
            info.live_mems
        );
        problems += 1;
    }
    // Vidmem storage the PMMs keep for reuse is not a leak: the kernel's shrinkers
    // (`drop_caches` 2, root only) give it back, which must leave none. Without root it is
    // left out of the check.
    let kept = uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_KEPT as usize;
    let shrunk = std::fs::write("/proc/sys/vm/drop_caches", "2").is_ok();
    let audit = d.audit(false).context("RUVM_IOCTL_AUDIT")?;
    let names = libruvm::names::audit_classes();
    for (i, n) in audit.live.iter().enumerate() {
        // This file's own handle table is empty; anything counted is left over.
        if *n != 0 && (shrunk || i != kept) {
            let name = libruvm::names::audit_class(names.as_deref(), i);
            println!("fuzz: PROBLEM: audit class {name} is {n} after the run");
            problems += 1;
        }
    }
    if let Some(r) = &resources {
        println!(
            "fuzz: kernel memory grew at most {} KiB beyond the workers' memory cgroup charge (bound {} KiB)",
            r.worst / 1024,
            spec.kmem_bound / 1024
        );
        if let Some(max) = r.vidmem_max {
            let left = r.vidmem_left();
            println!(
                "fuzz: vidmem of the workers' group at most {} KiB in a region (dmem.max {} KiB){}",
                r.vidmem_peak / 1024,
                max / 1024,
                if left.is_none() {
                    ", none left after"
                } else {
                    ""
                }
            );
            if let Some(what) = left {
                println!("fuzz: PROBLEM: {what}");
                problems += 1;
            }
        }
    }
    if removals > 0 {
        println!(
            "fuzz: {removals} GPU removals, the slowest {:.2} s (bound {} s)",
            slowest.as_secs_f64(),
            spec.removal_bound.as_secs()
        );
    }
    println!(
        "fuzz: {busy_kills} kills and {busy_removals} GPU removals with streams busy; {} sync_files taken from the workers ({} hand-offs lost with their worker); {} exported sync_files of killed workers, removed GPUs and the run's end checked, the slowest signalled {:.2} s into its check (bound {} s)",
        fences.taken,
        fences.lost,
        fences.checked,
        fences.slowest.as_secs_f64(),
        fences::SIGNAL_BOUND.as_secs()
    );
    println!(
        "fuzz: seed {}: {total} operations in {secs:.1} s ({:.0}/s), {kills} processes killed, {unbinds} unbinds ({attaches} attached as host GPUs meanwhile), {unloads} unload attempts, {shrinks} shrinker runs, {problems} problems",
        spec.seed,
        total as f64 / secs.max(1e-9)
    );
    Ok(problems)
}

/// The sync_files `pending` on GPU `g` before its removal must all signal within
/// [`fences::SIGNAL_BOUND`] of it.
fn removal_fences(
    fences: &mut fences::Fences,
    pending: Vec<std::os::fd::OwnedFd>,
    g: u32,
    shared: &Shared,
) {
    let n = pending.len();
    let late = fences.check(pending);
    if late > 0 {
        println!(
            "fuzz: PROBLEM: {late} of {n} sync_files of streams on GPU {g}, pending at its removal, still pending {} s after it",
            fences::SIGNAL_BOUND.as_secs()
        );
        shared.problems.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether any operation is still queued on a stream, holds a mem, or left a pool chunk pending
/// (the audit's `stream_ops`, `stream_mems` and `pool_pending`).
fn streams_busy(d: &Ruvm) -> bool {
    d.audit(false).is_ok_and(|a| {
        [
            uapi::ruvm_audit_class_RUVM_AUDIT_STREAM_OPS,
            uapi::ruvm_audit_class_RUVM_AUDIT_STREAM_MEMS,
            uapi::ruvm_audit_class_RUVM_AUDIT_POOL_PENDING,
        ]
        .iter()
        .any(|&c| a.live.get(c as usize).is_some_and(|&n| n != 0))
    })
}

/// `ruvmctl fuzz`: runs, and fails on any problem.
pub fn command(spec: &Spec) -> Result<()> {
    let problems = run(spec)?;
    if problems > 0 {
        bail!(
            "fuzz: {problems} problems (replay with --seed {})",
            spec.seed
        );
    }
    Ok(())
}

/// A seed from the clock, for runs that name none.
pub fn clock_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rng::mix(
        t.as_secs(),
        u64::from(t.subsec_nanos()),
        u64::from(std::process::id()),
    )
}

/// The sizes the fuzzer tries: boundaries around pages and chunks, and absurd ones.
pub const SIZES: [u64; 14] = [
    0,
    1,
    4095,
    4096,
    4097,
    65536,
    (2 << 20) - 1,
    2 << 20,
    (7 << 20) + 17,
    8 << 20,
    1 << 40,
    u64::MAX,
    u64::MAX - 4095,
    1 << 63,
];

/// Page sizes: valid ones and not.
pub const PAGE_SIZES: [u64; 10] = [
    0,
    4096,
    8192,
    65536,
    2 << 20,
    3,
    4097,
    4 << 20,
    u64::MAX,
    1 << 32,
];

/// The uapi's RUVM_MAX_GPUS, for random GPU ids.
pub const GPU_IDS: u64 = uapi::RUVM_MAX_GPUS as u64;
