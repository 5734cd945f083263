// SPDX-License-Identifier: GPL-2.0

//! The fuzzer's operations and their oracle: each operation names the errnos the documentation
//! allows for it; any other is a problem.

use std::{
    os::fd::AsRawFd,
    sync::{atomic::Ordering, Arc, Mutex},
    time::Duration,
};

use libruvm::{cmd, uapi, Errno, Ruvm};
use nix::{
    sys::mman::{mremap, munmap, MRemapFlags, MapFlags, ProtFlags},
    unistd::{fork, ForkResult},
};

use super::{fences, oracle, Rng, Shared, GPU_IDS, PAGE_SIZES, SIZES};
use crate::cmd::arg;

mod devices;
mod gpu;
mod heap;
mod ipc;
mod process;
mod register;
mod sparse;
mod streams;
pub use devices::{
    edu_device, gpu_of_pci, sim_remove_add, sims, unbind_rebind, unload_attempt, Unbound,
};
use gpu::*;
use process::*;

use Errno::*;

/// A user mapping: address, length, the mem's handle (0: unknown), the file offset mapped, and
/// the file it was made of.
type MapRec = (usize, usize, u64, u64, Arc<Ruvm>);

/// One worker process's state, shared by its threads.
struct World {
    shared: &'static Shared,
    files: Mutex<Vec<Arc<Ruvm>>>,
    handles: Mutex<Vec<u64>>,
    /// Handles this process freed (handles are never reused while the module is loaded).
    freed: Mutex<std::collections::BTreeSet<u64>>,
    /// User mappings.
    maps: Mutex<Vec<MapRec>>,
    /// Pool handles made (of any of the worker's files).
    pools: Mutex<Vec<u64>>,
    /// GPU ids present at start, and which of them are simulated (fast engines).
    gpus: Vec<u32>,
    sims: Vec<u32>,
    /// `/proc/self/mem`, to read and write mappings without a signal for a zapped one.
    proc_mem: Option<std::fs::File>,
    test_ioctls: bool,
    /// Whether this worker has `CAP_SYS_ADMIN` (else privileged commands answer `EPERM`).
    privileged: bool,
    /// This worker's id and tag (see [`oracle`]): every sysmem mem it makes is filled with the
    /// tag, and no word it reads may carry another worker's.
    id: u16,
    tag: u64,
    /// Memory ruvm holds (module-wide: mems, pools' caches, vidmem storage) above which
    /// allocations give way to frees and trims: this fuzzer does not test the machine's (or
    /// its memory cgroup's) OOM killer.
    budget: u64,
    /// The largest size a "valid" allocation asks for.
    max_size: u64,
    /// Streams and events (see [`streams`]), the worker's sw_sync timeline, and where it hands
    /// exported sync_files to the parent.
    streams: streams::State,
    /// This worker's slot (for the parent's requests, [`fences`]).
    slot: usize,
    /// dma-bufs of its mems kept open for a while ([`ipc`]).
    bufs: Mutex<Vec<std::os::fd::OwnedFd>>,
    /// Regions of its own it maps to register, (address, length) ([`register`]).
    regions: Mutex<Vec<(u64, u64)>>,
}

impl World {
    fn problem(&self, what: String) {
        println!("fuzz: PROBLEM: {what}");
        self.shared.problems.fetch_add(1, Ordering::Relaxed);
    }

    /// Checks `r` against the allowed errnos.
    fn check<T>(&self, what: &str, r: Result<T, Errno>, allowed: &[Errno]) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) if allowed.contains(&e) || e == ENOMEM => None,
            Err(e) => {
                self.problem(format!("{what}: unexpected {e}"));
                None
            }
        }
    }

    fn file(&self, rng: &mut Rng) -> Option<Arc<Ruvm>> {
        let files = self.files.lock().ok()?;
        if files.is_empty() {
            return None;
        }
        Some(files[rng.below(files.len() as u64) as usize].clone())
    }

    /// A handle this process made (often one of the last few, so threads collide), or any
    /// number.
    fn handle(&self, rng: &mut Rng) -> u64 {
        if rng.one_in(8) {
            let any = rng.next();
            return rng.pick(&[0, 1, u64::MAX, any]);
        }
        let hot = rng.one_in(2);
        self.handles
            .lock()
            .ok()
            .and_then(|h| {
                let n = h.len() as u64;
                (n > 0).then(|| {
                    let i = if hot {
                        n - 1 - rng.below(n.min(4))
                    } else {
                        rng.below(n)
                    };
                    h[i as usize]
                })
            })
            .unwrap_or(0)
    }

    /// One of the pools this worker made, or a number that names none.
    fn pool(&self, rng: &mut Rng) -> u64 {
        self.pools
            .lock()
            .ok()
            .and_then(|p| (!p.is_empty()).then(|| p[rng.below(p.len() as u64) as usize]))
            .unwrap_or(rng.pick(&[0, 1, u64::MAX]))
    }

    fn is_freed(&self, h: u64) -> bool {
        self.freed.lock().map(|f| f.contains(&h)).unwrap_or(false)
    }

    /// Reads (and writes back) one byte of a mapping through `/proc/self/mem`; the mapping of a
    /// mem this process freed must fault.
    /// Whether a live mem of this process sits at file offset `offset` now (a freed mem's
    /// range is reused once the mem is gone, so a mapping made at that offset may be of it).
    fn offset_in_use(&self, offset: u64, freed: u64, also: Option<&Ruvm>) -> bool {
        let files: Vec<Arc<Ruvm>> = self.files.lock().map(|f| f.clone()).unwrap_or_default();
        let handles: Vec<u64> = self.handles.lock().map(|h| h.clone()).unwrap_or_default();
        let at = |f: &Ruvm| {
            handles
                .iter()
                .any(|&h| f.mem_query(h).is_ok_and(|q| q.mmap_offset == offset))
        };
        // `also`: the file the mapping was made of, which another thread may have taken out of
        // the list (closing it for this process once the mapping goes).
        if files.iter().any(|f| at(f)) || also.is_some_and(at) {
            return true;
        }
        // A mem made by another thread may not be listed yet; the one at the freed mem's offset
        // was made after it, so its handle is larger (handles only grow).
        let later = |f: &Ruvm| {
            (freed + 1..freed.saturating_add(4096))
                .any(|h| f.mem_query(h).is_ok_and(|q| q.mmap_offset == offset))
        };
        files.iter().any(|f| later(f)) || also.is_some_and(later)
    }

    #[expect(clippy::too_many_arguments, reason = "one mapping's whole description")]
    fn touch(
        &self,
        why: &str,
        addr: usize,
        len: usize,
        handle: u64,
        offset: u64,
        file: Option<&Ruvm>,
        rng: &mut Rng,
    ) {
        use std::os::unix::fs::FileExt;
        let Some(f) = &self.proc_mem else { return };
        let at = (addr + rng.below(len as u64) as usize) as u64;
        // Freed before the read began: the read must fail.
        let freed = self.is_freed(handle);
        let mut b = [0u8; 1];
        if f.read_at(&mut b, at).is_ok() {
            // A mapping made at the freed mem's offset may be of a later mem given the same
            // offset (by any process sharing the file), live at the read and freed (its
            // mappings zapped) before the check: read again once any free in flight has had
            // time to finish its zap. The mapping stays of one mem for good, so a mapping that
            // still reads, with no live mem at its offset, is of the freed mem.
            if freed
                && !self.offset_in_use(offset, handle, file)
                && {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    f.read_at(&mut b, at).is_ok()
                }
                && !self.offset_in_use(offset, handle, file)
            {
                self.problem(format!(
                    "a mapping of mem {handle} read after the mem was freed (MEM_FREE had returned; {why})"
                ));
            }
            let _ = f.write_at(&[b[0].wrapping_add(1)], at);
        }
    }

    /// Fills a new sysmem mem with this worker's tag (through its kernel mapping). Another
    /// thread may free it meanwhile; a vidmem mem has no kernel mapping and is left as the
    /// PMM zeroed it.
    fn tag_mem(&self, d: &Ruvm, a: &uapi::ruvm_mem_alloc) {
        if a.backing != uapi::ruvm_backing_RUVM_BACKING_SYSMEM || d.map_kernel(a.handle).is_err() {
            return;
        }
        let len = (a.chunk_size * a.chunk_count).min(8 << 20);
        let f = arg(|f: &mut uapi::ruvm_mem_fill| {
            f.handle = a.handle;
            f.length = len;
            f.seed = self.tag;
            f.kind = uapi::ruvm_fill_kind_RUVM_FILL_PATTERN;
        });
        let _ = d.mem_fill(false, f);
    }

    /// The isolation oracle: reads one of this worker's mems through a user mapping of its own,
    /// and reports any word that carries another worker's tag.
    fn read_check(&self, d: &Ruvm, rng: &mut Rng) {
        let h = self.handle(rng);
        self.read_check_mem(d, h, "");
    }

    /// [`Self::read_check`] of mem `h` (of file `d`); `after` says what wrote it last.
    fn read_check_mem(&self, d: &Ruvm, h: u64, after: &str) {
        use std::os::unix::fs::FileExt;
        let Some(f) = &self.proc_mem else { return };
        let Ok(q) = d.mem_query(h) else { return };
        if q.backing != uapi::ruvm_backing_RUVM_BACKING_SYSMEM {
            return;
        }
        let len = (q.physical_size as usize).min(1 << 20);
        let Ok(m) = libruvm::UserMap::new(
            d,
            q.mmap_offset,
            q.physical_size as usize,
            ProtFlags::PROT_READ,
            MapFlags::MAP_SHARED,
        ) else {
            return;
        };
        let mut bytes = vec![0u8; len];
        // Freed meanwhile (zapped): the read fails, and says nothing.
        if f.read_at(&mut bytes, m.as_ptr() as u64).is_ok() {
            if let Some((o, id)) = oracle::foreign(&bytes, self.id) {
                self.problem(format!(
                    "mem {h} (of this worker, {}) holds worker {id:#x}'s tag at offset {o:#x}{after}: another file's bytes",
                    self.id
                ));
            }
        }
    }

    /// Whether ruvm holds more than the budget: mems, pools' caches and vidmem root storage
    /// (used or kept), from the audit's live counts.
    fn over_budget(&self, d: &Ruvm) -> bool {
        let Ok(a) = d.audit(false) else {
            return false;
        };
        let class = |c: u32| a.live.get(c as usize).copied().unwrap_or(0);
        let roots = class(uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_ROOTS)
            + class(uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_KEPT);
        let held = class(uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_BYTES)
            + class(uapi::ruvm_audit_class_RUVM_AUDIT_POOL_BYTES)
            + roots * (2 << 20);
        held > self.budget
    }

    /// Over budget: frees one of this worker's mems, and trims one of its pools.
    fn give_back(&self, d: &Ruvm, rng: &mut Rng) {
        let h = self.handle(rng);
        if d.mem_free(h).is_ok() {
            if let Ok(mut f) = self.freed.lock() {
                f.insert(h);
            }
            if let Ok(mut hs) = self.handles.lock() {
                hs.retain(|x| *x != h);
            }
        }
        let pool = self
            .pools
            .lock()
            .ok()
            .and_then(|p| (!p.is_empty()).then(|| p[rng.below(p.len() as u64) as usize]));
        if let Some(p) = pool {
            let _ = d.pool_trim(p, 0);
        }
    }

    fn gpu(&self, rng: &mut Rng) -> u32 {
        if self.gpus.is_empty() || rng.one_in(8) {
            return rng.below(GPU_IDS + 2) as u32;
        }
        rng.pick(&self.gpus)
    }
}

/// Offsets and lengths around a mem's size: inside, at the edge, past it, overflowing.
fn range(rng: &mut Rng) -> (u64, u64) {
    let offset = rng.pick(&[0, 1, 4095, 4096, 65536, (2 << 20) - 1, u64::MAX, 1 << 63]);
    let length = rng.pick(&[0, 1, 17, 4096, 65536, 1 << 20, u64::MAX, (1 << 63) + 1]);
    (offset, length)
}

/// The worker process in `slot`: its files and threads, until the parent says stop. It hands
/// sync_files it exports to the parent through `shared` ([`fences::hand_over`]), and at its end
/// waits a little for the parent to take them.
pub fn worker(
    seed: u64,
    slot: usize,
    threads: usize,
    max_size: u64,
    memcg: Option<u64>,
    shared: &'static Shared,
) {
    let mut rng = Rng::new(seed);
    let mut files = Vec::new();
    for _ in 0..1 + rng.below(3) {
        if let Ok(f) = Ruvm::open() {
            files.push(Arc::new(f));
        }
    }
    let (gpus, sims, test_ioctls) = match files.first() {
        Some(f) => {
            let list = f.gpus().unwrap_or_default();
            let present =
                |g: &&uapi::ruvm_gpu_info| g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0;
            let gpus = list.iter().filter(present).map(|g| g.id).collect();
            let sims = list
                .iter()
                .filter(present)
                .filter(|g| g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM)
                .map(|g| g.id)
                .collect();
            let t = f.info().map(|i| i.test_ioctls != 0).unwrap_or(false);
            (gpus, sims, t)
        }
        None => (Vec::new(), Vec::new(), false),
    };
    let world = World {
        shared,
        files: Mutex::new(files),
        handles: Mutex::new(Vec::new()),
        freed: Mutex::new(std::collections::BTreeSet::new()),
        maps: Mutex::new(Vec::new()),
        pools: Mutex::new(Vec::new()),
        gpus,
        sims,
        proc_mem: std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .ok(),
        test_ioctls,
        privileged: nix::unistd::geteuid().is_root(),
        id: (std::process::id() & 0xffff) as u16,
        tag: oracle::tag((std::process::id() & 0xffff) as u16),
        budget: match memcg {
            Some(max) => (mem_total() / 4).min(max / 3),
            None => mem_total() / 4,
        },
        max_size,
        streams: streams::State::new(&mut rng),
        slot,
        bufs: Mutex::new(Vec::new()),
        regions: Mutex::new(Vec::new()),
    };
    std::thread::scope(|s| {
        for t in 0..threads {
            let w = &world;
            let seed = rng.next() ^ t as u64;
            s.spawn(move || {
                let mut rng = Rng::new(seed);
                while w.shared.stop.load(Ordering::Relaxed) == 0 {
                    // The parent is about to kill this worker or remove a GPU: streams busy.
                    if let Some(gpu) = fences::take_request(w.shared, w.slot) {
                        let busy = streams::load(w, &mut rng, gpu);
                        fences::answer(w.shared, w.slot, busy);
                    }
                    one(w, &mut rng);
                    w.shared.ops.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    // Leave nothing mapped behind (the files close with the process).
    let maps = world.maps.lock().map(|m| m.clone()).unwrap_or_default();
    for (addr, len, _, _, _) in maps {
        unmap(addr, len);
    }
    // The parent takes what was handed over while this process lives (then its descriptors go).
    fences::wait_taken(shared, slot, Duration::from_secs(5));
}

fn unmap(addr: usize, len: usize) {
    if let Some(p) = std::ptr::NonNull::new(addr as *mut std::ffi::c_void) {
        // SAFETY: a mapping this worker made of the device and took out of its list.
        let _ = unsafe { munmap(p, len) };
    }
}

/// One random operation.
fn one(w: &World, rng: &mut Rng) {
    let Some(file) = w.file(rng) else {
        if let Ok(f) = Ruvm::open() {
            if let Ok(mut files) = w.files.lock() {
                files.push(Arc::new(f));
            }
        }
        return;
    };
    let d = &*file;
    match rng.below(44) {
        0..=2 => alloc(w, d, rng),
        3 => {
            let h = w.handle(rng);
            if w.check("MEM_FREE", d.mem_free(h), &[ENOENT]).is_some() {
                if let Ok(mut f) = w.freed.lock() {
                    f.insert(h);
                }
                if let Ok(mut hs) = w.handles.lock() {
                    hs.retain(|x| *x != h);
                }
                // Every mapping of it must fault now.
                let maps: Vec<_> = w.maps.lock().map(|m| m.clone()).unwrap_or_default();
                for (addr, len, mh, off, _) in maps {
                    if mh == h {
                        w.touch("after the free", addr, len, h, off, Some(d), rng);
                    }
                }
            }
        }
        4 => {
            let _ = w.check("MEM_QUERY", d.mem_query(w.handle(rng)), &[ENOENT]);
        }
        5 => {
            let h = w.handle(rng);
            let r = if rng.one_in(2) {
                d.map_kernel(h)
            } else {
                d.unmap_kernel(h)
            };
            w.check("MEM_(UN)MAP_CPU_KERNEL", r, &[ENOENT, EOPNOTSUPP]);
        }
        6 | 7 => {
            let (offset, length) = range(rng);
            let f = arg(|f: &mut uapi::ruvm_mem_fill| {
                f.handle = w.handle(rng);
                f.offset = offset;
                f.length = length.min(1 << 20);
                f.seed = oracle::untagged_seed(rng.next());
                f.kind = rng.pick(&[0, 0, 1, 2]);
            });
            let r = d.mem_fill(rng.one_in(2), f);
            w.check("MEM_FILL/VERIFY", r, &[ENOENT, ENXIO, EINVAL, EOVERFLOW]);
        }
        8 => {
            let (offset, length) = range(rng);
            let r = d.mem_copy(
                w.handle(rng),
                offset,
                w.handle(rng),
                rng.pick(&[0, 4096]),
                length.min(1 << 20),
            );
            w.check("MEM_COPY", r, &[ENOENT, ENXIO, EINVAL, EOVERFLOW]);
        }
        9 | 10 => {
            let r = d.mem_gpu(rng.below(3) != 0, w.handle(rng), w.gpu(rng));
            w.check("MEM_(UN)MAP_GPU", r, &[ENOENT, ENODEV, EINVAL, EFAULT]);
        }
        11 => {
            let (first, _) = range(rng);
            let r = d.dma_addrs(
                w.handle(rng),
                w.gpu(rng),
                first.min(64),
                1 + rng.below(64) as usize,
            );
            w.check("MEM_DMA_ADDRS", r, &[ENOENT, ENXIO, EINVAL, EPERM]);
        }
        12 => ce_copy(w, d, rng),
        13 => {
            let (offset, length) = range(rng);
            let r = d.gpu_phys(w.handle(rng), w.gpu(rng), offset, length);
            w.check(
                "MEM_GPU_PHYS",
                r,
                &[ENOENT, ENXIO, ENODEV, EINVAL, EOVERFLOW, EPERM],
            );
        }
        14 => {
            let g = w.gpu(rng);
            if rng.one_in(3) {
                let size = rng.pick(&[4096, 65536, 2 << 20, 12345]);
                let r = d.pmm_check_leak(g, size, rng.below(8));
                w.check("PMM_CHECK_LEAK", r, &[ENODEV, ENXIO, EINVAL, EINTR, EPERM]);
            } else {
                w.check("PMM_STATS", d.pmm_stats(g), &[ENODEV, ENXIO]);
            }
        }
        15 => {
            let _ = w.check("GPU_LIST", d.gpus(), &[]);
            let _ = w.check("INFO", d.info(), &[]);
            let _ = w.check("STATS", d.stats(false), &[]);
            let walk = rng.one_in(4);
            let allowed: &[Errno] = match (w.test_ioctls, w.privileged) {
                (false, _) => &[ENOSYS],
                (true, false) => &[EPERM],
                (true, true) => &[],
            };
            let _ = w.check("AUDIT", d.audit(walk), allowed);
        }
        16 => malformed(w, d, rng),
        17..=19 => user_mapping(w, &file, rng),
        20 => forked_child(w, d, rng),
        22 => race(w, d, rng),
        21 => files(w, rng),
        23..=25 => gpu_va(w, d, rng),
        26 => w.read_check(d, rng),
        28..=29 => pools(w, d, rng),
        30..=35 => streams::one(w, &file, rng),
        36 | 37 => ipc::one(w, d, rng),
        38 | 39 => sparse::one(w, d, rng),
        40 | 41 => heap::one(w, d, rng),
        42 | 43 => register::one(w, d, rng),
        _ => {
            // Vidmem, which has its own rules and allocator (its storage is the system's memory).
            if w.over_budget(d) {
                w.give_back(d, rng);
                return;
            }
            let size = rng.pick(&SIZES).min(w.max_size);
            let r = d.vidmem_alloc(w.gpu(rng), size, rng.pick(&PAGE_SIZES), 0);
            if let Some(a) = w.check(
                "MEM_ALLOC (vidmem)",
                r,
                &[EINVAL, ENODEV, EOVERFLOW, ENOSPC],
            ) {
                if let Ok(mut hs) = w.handles.lock() {
                    hs.push(a.handle);
                }
            }
        }
    }
}

/// The machine's memory, from `/proc/meminfo` (1 GiB if unreadable).
fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(1 << 30, |kib| kib * 1024)
}

fn alloc(w: &World, d: &Ruvm, rng: &mut Rng) {
    if w.over_budget(d) {
        // Over budget: give back instead.
        w.give_back(d, rng);
        return;
    }
    // Mostly sizes the guest can hold; sometimes absurd ones, which must be refused.
    let size = if rng.one_in(6) {
        rng.pick(&SIZES)
    } else {
        rng.pick(&SIZES).min(w.max_size)
    };
    let mut flags = rng.below(4) as u32;
    if rng.one_in(8) {
        // Mapped into this worker by the call; its MEM_FREE here unmaps it.
        flags |= uapi::ruvm_alloc_flags_RUVM_ALLOC_MAP_USER;
    }
    if rng.one_in(16) {
        flags |= 1 << rng.below(32);
    }
    let r = d.mem_alloc(size, rng.pick(&PAGE_SIZES), flags);
    if let Some(a) = w.check("MEM_ALLOC", r, &[EINVAL, EOVERFLOW, ENOSPC]) {
        w.tag_mem(d, &a);
        if let Ok(mut hs) = w.handles.lock() {
            hs.push(a.handle);
        }
    }
}

fn ce_copy(w: &World, d: &Ruvm, rng: &mut Rng) {
    // Simulated engines are fast; edu's takes 0.2 s a transfer, so it gets one small piece, rarely.
    let (g, max) = match (rng.one_in(20), w.sims.is_empty()) {
        (true, _) | (false, true) => (w.gpu(rng), 512),
        (false, false) => (rng.pick(&w.sims), 1 << 20),
    };
    let (offset, length) = range(rng);
    let r = d.ce_copy(g, w.handle(rng), offset, w.handle(rng), 0, length.min(max));
    w.check(
        "CE_COPY",
        r,
        &[ENOENT, ENXIO, ENODEV, EINVAL, EOVERFLOW, ETIMEDOUT, EINTR],
    );
}

/// A command with a non-zero reserved word or an unknown flag: `EINVAL` (`ENOSYS` first for a
/// test-only command while they are off).
fn malformed(w: &World, d: &Ruvm, rng: &mut Rng) {
    let mut q = uapi::ruvm_mem_query {
        handle: w.handle(rng),
        ..Default::default()
    };
    match rng.below(3) {
        0 => q.flags = 1 << rng.below(32),
        _ => q.reserved[0] = rng.next() | 1,
    }
    match d.call(cmd::MEM_QUERY, &mut q) {
        Err(EINVAL) => {}
        r => w.problem(format!("MEM_QUERY with a bad flag or reserved word: {r:?}")),
    }
    let mut l = uapi::ruvm_test_leak {
        what: uapi::ruvm_leak_RUVM_LEAK_CHUNK,
        count: 1,
        pad: 1,
        ..Default::default()
    };
    let want = match (w.test_ioctls, w.privileged) {
        (false, _) => ENOSYS,
        (true, false) => EPERM,
        (true, true) => EINVAL,
    };
    match d.call(cmd::TEST_LEAK, &mut l) {
        Err(e) if e == want => {}
        r => w.problem(format!("TEST_LEAK with a bad pad: {r:?}, wanted {want}")),
    }
}
