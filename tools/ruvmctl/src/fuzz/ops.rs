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

mod heap;
mod ipc;
mod sparse;
mod streams;

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
    match rng.below(42) {
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

/// GPU virtual mappings: kernel and user maps and unmaps, a mem's GPU VA, and engine copies
/// through VAs, racing frees and DMA unmaps of the same mems by the other workers.
fn gpu_va(w: &World, d: &Ruvm, rng: &mut Rng) {
    let (h, g) = (w.handle(rng), w.gpu(rng));
    let user = rng.one_in(2);
    // User VAs: aligned and not, at and past the 49-bit width.
    let va = rng.pick(&[
        0,
        1 << 32,
        (1 << 32) + 4096,
        1 << 40,
        (1 << 49) - (64 << 10),
        1 << 49,
    ]);
    match rng.below(4) {
        0 => {
            let r = d.mem_gpu_kernel(rng.below(3) != 0, h, g);
            w.check(
                "MEM_(UN)MAP_GPU_KERNEL",
                r,
                &[ENOENT, ENODEV, EINVAL, EOPNOTSUPP, ENOSPC, EINTR],
            );
        }
        1 => {
            let r = if rng.below(3) != 0 {
                d.map_gpu_user(h, g, va, rng.one_in(3))
            } else {
                d.unmap_gpu_user(h, g)
            };
            w.check(
                "MEM_(UN)MAP_GPU_USER",
                r,
                &[ENOENT, ENODEV, EINVAL, EOPNOTSUPP, ERANGE, EEXIST, EINTR],
            );
        }
        2 => {
            let r = d.gpu_va(h, g, user);
            w.check("MEM_GPU_VA", r, &[ENOENT, ENODEV, ENXIO]);
        }
        _ => {
            // The kernel VA space holds every file's mems, so a privileged copy there through
            // a VA whose mem another thread freed may reach another file's mem: rightly, but
            // past what the isolation oracle can tell from a defect. A privileged worker copies
            // through its file's user VAs only; an unprivileged one tries both (the kernel
            // space answers EPERM).
            let user = user || w.privileged;
            // From the start of the kernel window or a user VA, to another place there.
            let base = if user {
                va
            } else {
                uapi::RUVM_GPU_KERNEL_VA_BASE
            };
            let (offset, length) = range(rng);
            let src = base.wrapping_add(offset);
            let dst = base.wrapping_add(rng.pick(&[0, 4096, 1 << 20, 2 << 20]));
            let r = d.ce_copy_va(g, dst, src, length.min(1 << 20), user);
            w.check(
                "CE_COPY_VA",
                r,
                &[EFAULT, EINVAL, ENODEV, EOPNOTSUPP, EPERM, EINTR],
            );
        }
    }
}

/// Memory pools: made, allocated from, read (its attributes must add up), set, trimmed,
/// granted GPUs and destroyed, with handles of this file, of other files and of none.
fn pools(w: &World, d: &Ruvm, rng: &mut Rng) {
    let pool = w.pool(rng);
    match rng.below(8) {
        7 => vid_pool_beyond(w, d, rng),
        0 => {
            let page = rng.pick(&[0, 4096, 65536, 2 << 20, 3 << 10, 4 << 20]);
            let threshold = rng.pick(&[0, 65536, 1 << 20, u64::MAX]);
            let made = if rng.one_in(3) {
                // Vidmem of some GPU (with or without vidmem, or none).
                let mut c = uapi::ruvm_pool_create {
                    backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
                    gpu: w.gpu(rng),
                    page_size: page,
                    release_threshold: threshold,
                    ..Default::default()
                };
                w.check(
                    "POOL_CREATE (vidmem)",
                    d.call(cmd::POOL_CREATE, &mut c),
                    &[EINVAL, ENODEV, ENXIO, ENOSPC],
                )
                .map(|()| c.handle)
            } else {
                w.check(
                    "POOL_CREATE",
                    d.pool_create(page, threshold),
                    &[EINVAL, ENOSPC],
                )
                .map(|(h, _)| h)
            };
            if let Some(h) = made {
                if let Ok(mut p) = w.pools.lock() {
                    p.push(h);
                }
            }
        }
        1 => {
            if w.over_budget(d) {
                w.give_back(d, rng);
                return;
            }
            let size = rng.pick(&SIZES).min(w.max_size);
            let flags = rng.pick(&[0, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO, 2]);
            let (r, allowed): (_, &[Errno]) = if rng.one_in(3) {
                // Now and then more than any GPU's vidmem (three quarters of what one mem and one
                // file may hold, so that the quota lets it through to the pool), which must be
                // refused leaving nothing behind.
                let size = if rng.one_in(8) {
                    d.info()
                        .map_or(size, |i| i.max_alloc_bytes.min(i.max_file_bytes) / 4 * 3)
                } else {
                    size
                };
                let mut a = uapi::ruvm_mem_alloc {
                    size,
                    flags,
                    backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
                    gpu: w.gpu(rng),
                    pool,
                    ..Default::default()
                };
                (
                    d.call(cmd::MEM_ALLOC, &mut a).map(|()| a),
                    &[ENOENT, EINVAL, EOVERFLOW, ENOSPC, EINTR, ENODEV, ENOMEM],
                )
            } else {
                // A sysmem pool skips a GPU of its access set that is going: never ENODEV.
                (
                    d.pool_alloc(pool, size, flags),
                    &[ENOENT, EINVAL, EOVERFLOW, ENOSPC, EINTR, ENOMEM],
                )
            };
            if let Some(a) = w.check("MEM_ALLOC (pool)", r, allowed) {
                w.tag_mem(d, &a);
                if let Ok(mut hs) = w.handles.lock() {
                    hs.push(a.handle);
                }
            }
        }
        2 => {
            if let Some(a) = w.check("POOL_GET", d.pool_get(pool), &[ENOENT]) {
                if a.reserved_current
                    != a.used_current + a.pending_bytes + a.cached_chunks * a.chunk_size
                    || a.reserved_high < a.reserved_current
                    || a.used_high < a.used_current
                {
                    w.problem(format!("POOL_GET: attributes that do not add up: {a:?}"));
                }
            }
        }
        3 => {
            // 1 to 6 are attributes (4 to 6 the reuse policies, which take 0 or 1 only).
            let attr = rng.pick(&[0, 1, 2, 3, 4, 5, 6, 7]);
            let value = rng.pick(&[0, 1, 4096, 1 << 20, u64::MAX]);
            w.check("POOL_SET", d.pool_set(pool, attr, value), &[ENOENT, EINVAL]);
        }
        4 => {
            let keep = rng.pick(&[0, 65536, 1 << 20, u64::MAX]);
            // EINVAL: a pool this file imported ([`ipc`]).
            w.check("POOL_TRIM", d.pool_trim(pool, keep), &[ENOENT, EINVAL]);
        }
        5 => {
            let r = d.pool_access(pool, w.gpu(rng), rng.below(3) != 0);
            w.check("POOL_SET_ACCESS", r, &[ENOENT, ENODEV, EINVAL]);
        }
        _ => {
            if w.check("POOL_DESTROY", d.pool_destroy(pool), &[ENOENT, EBUSY])
                .is_some()
            {
                if let Ok(mut p) = w.pools.lock() {
                    p.retain(|x| *x != pool);
                }
            }
        }
    }
}

/// A vidmem pool of 4 KiB chunks on a GPU with vidmem, kept, asked for more than the GPU has
/// (three quarters of what one mem and one file may hold, so that the quota lets it through):
/// refused (`ENOMEM`), and nothing may stay behind for it, charged or not (the resources
/// oracle; a refused request once left megabytes of uncharged vmalloc in the pool).
fn vid_pool_beyond(w: &World, d: &Ruvm, rng: &mut Rng) {
    if w.sims.is_empty() {
        return;
    }
    let g = rng.pick(&w.sims);
    let mut c = uapi::ruvm_pool_create {
        backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
        gpu: g,
        page_size: 4096,
        ..Default::default()
    };
    let made = w.check(
        "POOL_CREATE (vidmem, 4 KiB)",
        d.call(cmd::POOL_CREATE, &mut c),
        &[ENODEV, ENXIO, ENOSPC],
    );
    if made.is_none() {
        return;
    }
    if let Ok(mut p) = w.pools.lock() {
        p.push(c.handle);
    }
    let Ok(info) = d.info() else { return };
    let mut a = uapi::ruvm_mem_alloc {
        size: info.max_alloc_bytes.min(info.max_file_bytes) / 4 * 3,
        backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
        gpu: g,
        pool: c.handle,
        ..Default::default()
    };
    let r = d.call(cmd::MEM_ALLOC, &mut a).map(|()| a);
    if let Some(a) = w.check(
        "MEM_ALLOC (vidmem pool, beyond the GPU)",
        r,
        &[ENODEV, ENOSPC, EINTR, ENOENT],
    ) {
        // A GPU with that much vidmem: a mem like any other.
        if let Ok(mut hs) = w.handles.lock() {
            hs.push(a.handle);
        }
    }
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

/// mmap of a mem (or of junk), then reads and writes through `/proc/self/mem`, munmap, mremap.
fn user_mapping(w: &World, file: &Arc<Ruvm>, rng: &mut Rng) {
    let d = &**file;
    match rng.below(4) {
        0 | 1 => {
            let h = w.handle(rng);
            let Ok(q) = d.mem_query(h) else { return };
            let len = if rng.one_in(8) {
                4096
            } else {
                q.physical_size as usize
            };
            let offset = if rng.one_in(8) {
                q.mmap_offset + 4096
            } else {
                q.mmap_offset
            };
            let prot = if rng.one_in(10) {
                ProtFlags::PROT_READ | ProtFlags::PROT_EXEC
            } else {
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE
            };
            let flags = if rng.one_in(10) {
                MapFlags::MAP_PRIVATE
            } else {
                MapFlags::MAP_SHARED
            };
            let r = libruvm::UserMap::new(d, offset, len, prot, flags);
            if let Some(m) = w.check("mmap", r, &[ENXIO, EINVAL, EPERM, EACCES, EOPNOTSUPP]) {
                let (addr, len) = (m.as_ptr() as usize, m.len());
                std::mem::forget(m);
                // At another offset it may be another mem (ranges are packed): unknown, 0.
                let of = if offset == q.mmap_offset { h } else { 0 };
                // If the mem was freed meanwhile (the mmap raced the free), it must fault.
                w.touch("new mapping", addr, len, of, offset, Some(d), rng);
                if let Ok(mut maps) = w.maps.lock() {
                    maps.push((addr, len, of, offset, file.clone()));
                }
            }
        }
        2 => {
            // Touch a mapping: a freed mem's is zapped (the read fails), a live one reads.
            let Some((addr, len, h, off, f)) = w.maps.lock().ok().and_then(|m| {
                (!m.is_empty()).then(|| m[rng.below(m.len() as u64) as usize].clone())
            }) else {
                return;
            };
            w.touch("touch", addr, len, h, off, Some(&f), rng);
        }
        _ => {
            let Some((addr, len, h, off, f)) = w.maps.lock().ok().and_then(|mut m| {
                (!m.is_empty()).then(|| {
                    let i = rng.below(m.len() as u64) as usize;
                    m.swap_remove(i)
                })
            }) else {
                return;
            };
            if rng.one_in(2) {
                unmap(addr, len);
                return;
            }
            // Move it (growing is refused: VM_DONTEXPAND); it stays ours at the new address.
            let Some(p) = std::ptr::NonNull::new(addr as *mut std::ffi::c_void) else {
                return;
            };
            // SAFETY: a mapping this worker made and took out of its list; no reference into it.
            let r = unsafe { mremap(p, len, len, MRemapFlags::MREMAP_MAYMOVE, None) };
            let at = match r {
                Ok(n) => n.as_ptr() as usize,
                Err(_) => addr,
            };
            if let Ok(mut maps) = w.maps.lock() {
                maps.push((at, len, h, off, f));
            }
        }
    }
}

/// A child process that frees or queries a handle on the inherited file and exits at once
/// (raw syscalls only: other threads may hold locks the child cannot take).
fn forked_child(w: &World, d: &Ruvm, rng: &mut Rng) {
    let mut a = uapi::ruvm_mem_handle {
        handle: w.handle(rng),
        ..Default::default()
    };
    let nr = if rng.one_in(2) {
        cmd::MEM_FREE.nr
    } else {
        cmd::MEM_MAP_CPU_KERNEL.nr
    };
    let fd = d.as_fd().as_raw_fd();
    // SAFETY: the child makes one ioctl with a structure on this stack and calls _exit; it
    // touches nothing else of this process.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => unsafe {
            nix::libc::ioctl(fd, nix::libc::c_ulong::from(nr), std::ptr::from_mut(&mut a));
            nix::libc::_exit(0);
        },
        Ok(ForkResult::Parent { child }) => {
            let _ = nix::sys::wait::waitpid(child, None);
        }
        Err(e) => w.check("fork", Err::<(), _>(e), &[EAGAIN]).unwrap_or(()),
    }
}

/// Open, close, dup, or take a file again from this process with `pidfd_getfd` (no sockets:
/// it needs no `CONFIG_UNIX` for `SCM_RIGHTS`).
fn files(w: &World, rng: &mut Rng) {
    let Ok(mut files) = w.files.lock() else {
        return;
    };
    match rng.below(4) {
        0 if files.len() < 4 => {
            if let Ok(f) = Ruvm::open() {
                files.push(Arc::new(f));
            }
        }
        1 if files.len() > 1 => {
            let i = rng.below(files.len() as u64) as usize;
            let f = files[i].clone();
            drop(files);
            // Now and then with its streams busy: the close cancels their work.
            if rng.one_in(2) {
                streams::load_file(w, &f, rng, None);
            }
            if let Ok(mut files) = w.files.lock() {
                files.retain(|x| !Arc::ptr_eq(x, &f));
            }
        }
        2 if !files.is_empty() => {
            let f = files[rng.below(files.len() as u64) as usize].clone();
            drop(files);
            if let Some(passed) = pass_fd(&f) {
                if let Ok(mut files) = w.files.lock() {
                    files.push(Arc::new(passed));
                }
            }
        }
        _ => {}
    }
}

/// The same open file, as a new descriptor taken from this very process with `pidfd_open` and
/// `pidfd_getfd` (what `SCM_RIGHTS` to itself gave, without a socket).
fn pass_fd(f: &Ruvm) -> Option<Ruvm> {
    let me = fences::pidfd_open(nix::unistd::getpid()).ok()?;
    let fd = fences::pidfd_getfd(&me, f.as_fd().as_raw_fd()).ok()?;
    Ruvm::from_owned_fd(fd).ok()
}

/// Two calls released at once from two threads, where ordering bugs live: `mmap` of a mem
/// against its `MEM_FREE` (no mapping may read after the free returned), and a simulated GPU's
/// table remapped against a read of its addresses (the engine must still reach the mem).
fn race(w: &World, d: &Ruvm, rng: &mut Rng) {
    let barrier = std::sync::Barrier::new(2);
    // The mems made here are listed as this process's while they live (see `offset_in_use`).
    let listed = |h: u64, add: bool| {
        if let Ok(mut hs) = w.handles.lock() {
            if add {
                hs.push(h);
            } else {
                hs.retain(|x| *x != h);
            }
        }
    };
    if rng.one_in(2) || w.sims.is_empty() {
        let Ok(a) = d.mem_alloc(64 << 10, 0, 0) else {
            return;
        };
        listed(a.handle, true);
        let mapped = std::thread::scope(|s| {
            let t = s.spawn(|| {
                barrier.wait();
                libruvm::UserMap::new(
                    d,
                    a.mmap_offset,
                    64 << 10,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED,
                )
                .map(|m| {
                    let r = (m.as_ptr() as usize, m.len());
                    std::mem::forget(m);
                    r
                })
            });
            barrier.wait();
            let freed = d.mem_free(a.handle);
            (t.join(), freed)
        });
        listed(a.handle, false);
        if let (Ok(Ok((addr, len))), Ok(())) = mapped {
            if let Ok(mut f) = w.freed.lock() {
                f.insert(a.handle);
            }
            w.touch("race", addr, len, a.handle, a.mmap_offset, Some(d), rng);
            unmap(addr, len);
        }
        return;
    }
    let g = rng.pick(&w.sims);
    let (Ok(src), Ok(dst)) = (d.mem_alloc(64 << 10, 0, 0), d.mem_alloc(64 << 10, 0, 0)) else {
        return;
    };
    listed(src.handle, true);
    listed(dst.handle, true);
    if d.mem_gpu(true, src.handle, g).is_ok() && d.mem_gpu(true, dst.handle, g).is_ok() {
        std::thread::scope(|s| {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..4 {
                    let _ = d.dma_addrs(src.handle, g, 0, 16);
                }
            });
            barrier.wait();
            for _ in 0..4 {
                let _ = d.mem_gpu(false, src.handle, g);
                let _ = d.mem_gpu(true, src.handle, g);
            }
        });
        let r = d.ce_copy(g, dst.handle, 0, src.handle, 0, 64 << 10);
        // Other threads may free or unmap these mems meanwhile; a DMA fault (EFAULT) would be a
        // table the engine lost.
        w.check(
            "CE_COPY after remaps racing address reads",
            r,
            &[ENODEV, ENOENT, ENXIO],
        );
    }
    let _ = d.mem_free(src.handle);
    let _ = d.mem_free(dst.handle);
    listed(src.handle, false);
    listed(dst.handle, false);
}

/// What [`unbind_rebind`] did.
pub enum Unbound {
    /// No edu GPU to unbind.
    Nothing,
    /// Unbound and bound again.
    Rebound,
    /// Unbound, attached as a host GPU for a moment, detached, bound again.
    Attached,
}

/// One of the edu devices bound to ruvm-edu (its PCI address), if any.
pub fn edu_device(rng: &mut Rng) -> Option<String> {
    const DRIVER: &str = "/sys/bus/pci/drivers/ruvm-edu";
    let devices: Vec<String> = std::fs::read_dir(DRIVER)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("0000:"))
        .collect();
    (!devices.is_empty()).then(|| devices[rng.below(devices.len() as u64) as usize].clone())
}

/// The GPU id of the present GPU at PCI address `dev`.
pub fn gpu_of_pci(d: &Ruvm, dev: &str) -> Option<u32> {
    let (dom, bus, devfn) = crate::cmd::gpu::parse_pci(dev).ok()?;
    d.gpus().ok()?.iter().find_map(|g| {
        (g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
            && (g.pci_domain, g.pci_bus, g.pci_devfn) == (dom, bus, devfn))
            .then_some(g.id)
    })
}

/// Unbinds the edu GPU `dev` ([`edu_device`]) and binds it again (from the parent); half the
/// time it is attached as a host GPU in between, while the workers run, and ruvm-edu must
/// refuse to bind it then.
pub fn unbind_rebind(dev: Option<&str>, rng: &mut Rng, shared: &'static Shared) -> Unbound {
    const DRIVER: &str = "/sys/bus/pci/drivers/ruvm-edu";
    let Some(dev) = dev else {
        return Unbound::Nothing;
    };
    let problem = |what: String| {
        println!("fuzz: PROBLEM: {what}");
        shared.problems.fetch_add(1, Ordering::Relaxed);
    };
    let unbound = std::fs::write(format!("{DRIVER}/unbind"), dev);
    let mut did = Unbound::Rebound;
    if unbound.is_ok() && rng.one_in(2) {
        did = Unbound::Attached;
        attach_for_a_moment(rng, dev, &problem);
    }
    let bound = std::fs::write(format!("{DRIVER}/bind"), dev);
    if let Err(e) = unbound.and(bound) {
        problem(format!("unbind/bind of {dev}: {e}"));
    }
    did
}

/// Attaches the unbound edu device `dev` as a host GPU, checks that ruvm-edu cannot bind it
/// meanwhile, and detaches it.
fn attach_for_a_moment(rng: &mut Rng, dev: &str, problem: &dyn Fn(String)) {
    const DRIVER: &str = "/sys/bus/pci/drivers/ruvm-edu";
    let (Ok(d), Ok((dom, bus, devfn))) = (Ruvm::open(), crate::cmd::gpu::parse_pci(dev)) else {
        problem(format!("cannot open /dev/ruvm or parse {dev}"));
        return;
    };
    match d.gpu_attach(true, dom, bus, devfn) {
        Ok(_) => {}
        Err(ENOMEM) => return,
        Err(e) => return problem(format!("GPU_ATTACH of the unbound edu device {dev}: {e}")),
    }
    std::thread::sleep(std::time::Duration::from_millis(rng.below(50)));
    match std::fs::write(format!("{DRIVER}/bind"), dev) {
        Err(e) if e.raw_os_error() == Some(EEXIST as i32) => {}
        r => problem(format!(
            "binding ruvm-edu to {dev}, attached as a host GPU: {r:?}"
        )),
    }
    if let Err(e) = d.gpu_attach(false, dom, bus, devfn) {
        problem(format!("GPU_DETACH of {dev}: {e}"));
    }
}

/// The simulated GPUs present.
pub fn sims(d: &Ruvm) -> Vec<u32> {
    d.gpus()
        .unwrap_or_default()
        .iter()
        .filter(|g| {
            g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM
                && g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
        })
        .map(|g| g.id)
        .collect()
}

/// Removes simulated GPU `g` ([`sims`]; `RUVM_IOCTL_TEST_SIM_GPU`, from the parent) while the
/// workers use it, and brings it back: the removal must finish within `bound` (the liveness
/// oracle). Its time, or `None` if it could not be removed.
pub fn sim_remove_add(
    d: &Ruvm,
    g: u32,
    rng: &mut Rng,
    shared: &'static Shared,
    bound: std::time::Duration,
) -> Option<std::time::Duration> {
    let problem = |what: String| {
        println!("fuzz: PROBLEM: {what}");
        shared.problems.fetch_add(1, Ordering::Relaxed);
    };
    let (removed, took) = oracle::timed(|| d.test_sim_gpu(g, false));
    if let Err(e) = removed {
        problem(format!("TEST_SIM_GPU remove of GPU {g}: {e}"));
        return None;
    }
    if took > bound {
        problem(format!(
            "the removal of simulated GPU {g} took {:.1} s with the workers running",
            took.as_secs_f64()
        ));
    }
    std::thread::sleep(std::time::Duration::from_millis(rng.below(100)));
    if let Err(e) = d.test_sim_gpu(g, true) {
        problem(format!("TEST_SIM_GPU add of GPU {g}: {e}"));
    }
    Some(took)
}

/// Tries to unload the module while files are open: it must refuse.
pub fn unload_attempt(shared: &'static Shared) {
    match nix::kmod::delete_module(c"ruvm", nix::kmod::DeleteModuleFlags::O_NONBLOCK) {
        Err(EBUSY | EAGAIN) => {}
        r => {
            println!("fuzz: PROBLEM: unloading ruvm with files open: {r:?}");
            shared.problems.fetch_add(1, Ordering::Relaxed);
        }
    }
}
