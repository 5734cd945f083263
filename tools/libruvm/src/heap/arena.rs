// SPDX-License-Identifier: GPL-2.0

//! A pinned heap's arena: a sparse mem mapped at an address mimalloc can manage, and the
//! commit callback through which mimalloc makes its chunks resident and gives them back.

use std::ffi::{c_int, c_void};
use std::num::NonZeroUsize;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::Mutex;

use libmimalloc_sys as mi;
use nix::errno::Errno;
use nix::sys::mman::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};

use super::large::{LargeBlocks, Part};
use super::HeapConfig;
use crate::{uapi, Ruvm};

/// The arena's chunk size: mimalloc's slice (`mi_arena_min_alignment`), the unit it commits
/// and decommits in.
const CHUNK: u64 = 64 << 10;

/// `RUVM_DMA_ADDR_ABSENT` (all ones; bindgen types the macro as an `i32`).
const ABSENT: u64 = u64::MAX;

/// mimalloc's commit callback (`mi_commit_fun_t`).
type CommitFn = unsafe extern "C" fn(bool, *mut c_void, usize, *mut bool, *mut c_void) -> bool;

extern "C" {
    /// mimalloc v3's `mi_manage_memory` (not wrapped by libmimalloc-sys): `start..start+size`
    /// becomes an arena whose commits and decommits go through `commit_fun`.
    fn mi_manage_memory(
        start: *mut c_void,
        size: usize,
        is_committed: bool,
        is_pinned: bool,
        is_zero: bool,
        numa_node: c_int,
        exclusive: bool,
        commit_fun: Option<CommitFn>,
        commit_fun_arg: *mut c_void,
        arena_id: *mut mi::mi_arena_id_t,
    ) -> bool;

    /// The alignment mimalloc wants of an arena's start (its slice, 64 KiB).
    fn mi_arena_min_alignment() -> usize;
}

/// mimalloc v3's `mi_option_page_commit_on_demand` (its `mi_option_e`): pages committed a
/// slice at a time as they grow, partly through the OS directly rather than the arena's commit
/// callback, which would leave a sparse mem's chunks absent under them.
const MI_OPTION_PAGE_COMMIT_ON_DEMAND: mi::mi_option_t = 41;

/// Once per process, before the first arena: mimalloc's option that would bypass the commit
/// callback off, and the fork handlers ([`snapshot`], [`restore`]).
fn prepare_process() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: setting an option of mimalloc's; read when its pages are made.
        unsafe { mi::mi_option_set(MI_OPTION_PAGE_COMMIT_ON_DEMAND, 0) };
        // SAFETY: the handlers are plain functions that live for the process.
        unsafe { nix::libc::pthread_atfork(Some(snapshot), Some(forget), Some(restore)) };
    });
}

/// Bumped in every forked child ([`restore`]): an arena made in another generation is not this
/// process's memory (its DMA tables are the parent's), told without a system call.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

/// The arenas' metadata, copied before a fork for the child: (start, length, bytes).
static AT_FORK: Mutex<Vec<(usize, usize, Vec<u8>)>> = Mutex::new(Vec::new());

/// Before a fork: copies each arena's metadata. The kernel does not copy a mem's mapping into
/// a child (`VM_DONTCOPY`), and mimalloc reads every arena's metadata (at the arena's start)
/// when it collects, at the child's exit too: the child gets the copy ([`restore`]).
extern "C" fn snapshot() {
    let arenas: Vec<&'static Arena> = ARENAS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut copies = Vec::new();
    for a in arenas {
        let meta = a.meta.load(Relaxed) as usize;
        if meta == 0 || meta > a.len as usize {
            continue;
        }
        // SAFETY: the metadata is resident and mapped in this process for the arena's life.
        let bytes = unsafe { std::slice::from_raw_parts(a.base as *const u8, meta) }.to_vec();
        copies.push((a.base, a.len as usize, bytes));
    }
    *AT_FORK.lock().unwrap_or_else(|e| e.into_inner()) = copies;
}

/// After a fork, in the parent: the copies go.
extern "C" fn forget() {
    AT_FORK.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// After a fork, in the child: each arena's range (not mapped here) becomes private anonymous
/// memory holding the metadata's copy, so that mimalloc's walks of its arenas find them as
/// they were; the arena's memory itself is not the child's (its commits fail).
extern "C" fn restore() {
    FORK_GENERATION.fetch_add(1, Relaxed);
    let Ok(copies) = AT_FORK.try_lock() else {
        return;
    };
    for (base, len, bytes) in copies.iter() {
        let (Some(at), Some(n)) = (NonZeroUsize::new(*base), NonZeroUsize::new(*len)) else {
            continue;
        };
        // SAFETY: the range was the arena's mem mapping, which the child does not have: it is
        // free, and becomes this process's private memory.
        let placed = unsafe {
            mmap_anonymous(
                Some(at),
                n,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_FIXED | MapFlags::MAP_NORESERVE,
            )
        };
        if placed.is_ok() {
            // SAFETY: `bytes` fits the mapping just made (checked when copied).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), *base as *mut u8, bytes.len()) };
        }
    }
}

/// Every arena of the process, for [`locate`].
static ARENAS: Mutex<Vec<&'static Arena>> = Mutex::new(Vec::new());

/// The mem and offset of `p`, if it is in a pinned heap's arena of this process (no system
/// call).
pub fn locate(p: *const u8) -> Option<(u64, u64)> {
    let arenas = ARENAS.lock().unwrap_or_else(|e| e.into_inner());
    arenas.iter().find_map(|a| a.locate(p))
}

/// How many arenas this process has made (each lives for the process; a dropped heap's is
/// taken again by the next heap of the same file, GPUs and size).
pub fn arenas() -> usize {
    ARENAS.lock().unwrap_or_else(|e| e.into_inner()).len()
}

struct Residency {
    chunks: Vec<bool>,
    bytes: u64,
    peak: u64,
    decommits: u64,
    /// Chunks mimalloc decommitted that the kernel kept (`EBUSY`: work queued on them): they
    /// must go before the arena serves another heap ([`Arena::take`]).
    owed: Vec<bool>,
    /// Each of the heap's GPUs' DMA address of each chunk (`RUVM_DMA_ADDR_ABSENT` while
    /// absent), read as chunks are committed (`MEM_DMA_ADDRS`), and whether the GPU went
    /// (its table all absent from then on).
    dma: Vec<(u32, bool, Vec<u64>)>,
    /// The caller may not read bus addresses (`EPERM`): the tables are not kept (nor freed
    /// here: the commit callback frees nothing).
    dma_denied: bool,
}

pub(super) struct Arena {
    /// The arena's own descriptor of the device (the mem lives as long as it).
    dev: Ruvm,
    handle: u64,
    base: usize,
    len: u64,
    /// The bytes of the part mimalloc manages, `[0, mi_len)`; the large blocks' part
    /// ([`super::large`]) is the rest, as long.
    mi_len: u64,
    /// The large blocks' bookkeeping.
    large: LargeBlocks,
    /// Of the resident bytes, those of the large blocks' part ([`Arena::large_base`] on):
    /// changed under the residency's lock, read without it.
    large_bytes: AtomicU64,
    /// mimalloc's id of the arena, set once it manages it.
    id: AtomicUsize,
    /// The bytes of mimalloc's metadata at the arena's start (its first commit).
    meta: AtomicU64,
    /// The process whose arena it is (a forked child has only a copy of the metadata), and
    /// its fork generation ([`FORK_GENERATION`]).
    pid: u32,
    generation: u64,
    /// The GPUs it is DMA-mapped for (sorted, each once), and the size its heap asked for
    /// (before any halving): what a new heap must ask for to take it again.
    gpus: Vec<u32>,
    asked: u64,
    /// Whether a heap has it (a dropped heap's arena is free for the next).
    busy: AtomicBool,
    state: Mutex<Residency>,
    commits: AtomicU64,
}

impl Arena {
    /// A new arena of file `dev`, managed by mimalloc: lives for the process.
    pub(super) fn new(dev: &Ruvm, cfg: &HeapConfig) -> Result<&'static Self, Errno> {
        let own = dev
            .as_fd()
            .try_clone_to_owned()
            .map_err(|_| Errno::EMFILE)?;
        let dev = Ruvm::from_owned_fd(own).map_err(|_| Errno::EBADF)?;
        // SAFETY: plain queries of mimalloc's constants.
        let (align, min) = unsafe { (mi_arena_min_alignment(), mi::mi_arena_min_size()) };
        let (align, min) = (align as u64, min as u64);
        let asked = asked_len(cfg);
        // Each part (mimalloc's, the large blocks') this long.
        let mut part = asked;
        let sparse = uapi::ruvm_alloc_flags_RUVM_ALLOC_SPARSE;
        let a = loop {
            let len = part.checked_mul(2).ok_or(Errno::ENOMEM)?;
            match dev.mem_alloc(len, CHUNK, sparse) {
                Ok(a) => break a,
                // Beyond the module's largest mem: a smaller arena.
                Err(Errno::ENOSPC | Errno::ENOMEM) if part / 2 >= min => {
                    part = (part / 2).next_multiple_of(min);
                }
                Err(e) => return Err(e),
            }
        };
        let len = 2 * part;
        let made = (|| {
            for &g in &cfg.gpus {
                dev.mem_gpu(true, a.handle, g)?;
            }
            map_aligned(&dev, a.mmap_offset, len, align)
        })();
        let base = match made {
            Ok(b) => b,
            Err(e) => {
                let _ = dev.mem_free(a.handle);
                return Err(e);
            }
        };
        let chunks = usize::try_from(len / CHUNK).map_err(|_| Errno::ENOMEM)?;
        let arena: &'static Self = Box::leak(Box::new(Self {
            dev,
            handle: a.handle,
            base,
            len,
            mi_len: part,
            large: LargeBlocks::new(part),
            large_bytes: AtomicU64::new(0),
            id: AtomicUsize::new(0),
            meta: AtomicU64::new(0),
            pid: std::process::id(),
            generation: FORK_GENERATION.load(Relaxed),
            gpus: gpu_set(&cfg.gpus),
            asked,
            busy: AtomicBool::new(true),
            state: Mutex::new(Residency {
                chunks: vec![false; chunks],
                bytes: 0,
                peak: 0,
                decommits: 0,
                owed: vec![false; chunks],
                dma: gpu_set(&cfg.gpus)
                    .into_iter()
                    .map(|g| (g, false, vec![ABSENT; chunks]))
                    .collect(),
                dma_denied: false,
            }),
            commits: AtomicU64::new(0),
        }));
        prepare_process();
        let mut id: mi::mi_arena_id_t = std::ptr::null_mut();
        // SAFETY: the range is this arena's mapping, aligned and sized for mimalloc, used by
        // nothing else; the callback's argument is the arena, which lives for the process.
        let ok = unsafe {
            mi_manage_memory(
                base as *mut c_void,
                part as usize,
                false,
                false,
                true,
                -1,
                true,
                Some(commit),
                (arena as *const Self).cast_mut().cast(),
                &mut id,
            )
        };
        if !ok {
            // mimalloc kept nothing of it: the arena goes (its callback may have run for the
            // metadata, which goes with the mem).
            if let Some(p) = std::ptr::NonNull::new(base as *mut c_void) {
                // SAFETY: the mapping made above, unused from here.
                let _ = unsafe { munmap(p, len as usize) };
            }
            let _ = arena.dev.mem_free(arena.handle);
            // SAFETY: leaked above; mimalloc kept no pointer to it (it refused the arena).
            drop(unsafe { Box::from_raw((arena as *const Self).cast_mut()) });
            return Err(Errno::ENOMEM);
        }
        arena.id.store(id as usize, Relaxed);
        ARENAS.lock().unwrap_or_else(|e| e.into_inner()).push(arena);
        Ok(arena)
    }

    /// An arena a dropped heap left, of file `dev` (the same open file: its mem is this
    /// file's, as `PTR_ATTRS` through `dev` says), still DMA-mapped for the same GPUs (a GPU
    /// removed since took its mappings with it) and asked for the same size; taken for a new
    /// heap (its resident peak restarted). Its chunks went back when its heap went, but for
    /// mimalloc's metadata and any the kernel kept under queued work: those are released now,
    /// and an arena still holding one is not taken (the work would write into the new heap's
    /// blocks).
    pub(super) fn take(dev: &Ruvm, cfg: &HeapConfig) -> Option<&'static Self> {
        let asked = asked_len(cfg);
        let gpus = gpu_set(&cfg.gpus);
        let pid = std::process::id();
        let arenas: Vec<&'static Self> = ARENAS.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for a in arenas {
            if a.pid != pid || a.asked != asked || a.gpus != gpus || a.busy.load(Relaxed) {
                continue;
            }
            if a.busy.swap(true, Acquire) {
                continue;
            }
            let mapped = gpus
                .iter()
                .try_fold(0u64, |m, &g| Some(m | 1u64.checked_shl(g)?));
            let usable = dev.ptr_attrs(a.base as u64).is_ok_and(|at| {
                at.type_ == uapi::ruvm_ptr_type_RUVM_PTR_MEM
                    && at.handle == a.handle
                    && at.ptr_flags & uapi::ruvm_ptr_flags_RUVM_PTR_OTHER_FILE == 0
                    && mapped.is_some_and(|m| at.mapped_gpus & m == m)
            });
            if usable && a.settle_owed() {
                a.reset_peak();
                return Some(a);
            }
            a.give_up();
        }
        None
    }

    /// Gives back the chunks mimalloc decommitted that the kernel kept: whether none is left.
    fn settle_owed(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut left = false;
        let mut c = 0;
        while c < s.owed.len() {
            if !s.owed[c] {
                c += 1;
                continue;
            }
            // A run is of one part (the large part's bytes are counted apart).
            let split = (self.mi_len / CHUNK) as usize;
            let mut n = 1;
            while s.owed.get(c + n) == Some(&true) && c + n != split {
                n += 1;
            }
            let (at, len) = (c as u64 * CHUNK, n as u64 * CHUNK);
            if self.dev.mem_range(self.handle, at, len, false).is_ok() {
                s.owed[c..c + n].fill(false);
                s.chunks[c..c + n].fill(false);
                s.bytes -= len;
                if at >= self.mi_len {
                    self.large_bytes.fetch_sub(len, Relaxed);
                }
                self.note_dma(&mut s, c as u64, n as u64, false);
            } else {
                left = true;
            }
            c += n;
        }
        !left
    }

    /// Its heap went (or was never made): the next heap may take it.
    pub(super) fn give_up(&self) {
        self.busy.store(false, Release);
    }

    pub(super) fn id(&self) -> mi::mi_arena_id_t {
        self.id.load(Relaxed) as mi::mi_arena_id_t
    }

    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Whether `p` is in the large blocks' part.
    pub(super) fn is_large(&self, p: *const u8) -> bool {
        self.large.contains(self, p)
    }

    /// A large block of at least `size` bytes: its address and length (see
    /// [`LargeBlocks::alloc`]).
    pub(super) fn large_alloc(&self, size: usize) -> Option<(*mut u8, u64)> {
        self.large.alloc(self, size)
    }

    /// The length of the large block in use at `p`.
    pub(super) fn large_len(&self, p: *const u8) -> Option<u64> {
        self.large.len_of(self, p)
    }

    /// Frees the large block in use at `p`: its length.
    pub(super) fn large_free(&self, p: *const u8) -> Option<u64> {
        self.large.free(self, p)
    }

    /// Gives back the large part's free chunks while more than `keep` free bytes are resident.
    pub(super) fn large_give_back(&self, keep: u64) {
        self.large.give_back(self, keep);
    }

    /// The heap went: every large block is free again, the part's chunks given back.
    pub(super) fn large_reset(&self) {
        self.large.reset(self);
    }

    /// How many commits mimalloc asked for so far.
    pub(super) fn commits(&self) -> u64 {
        self.commits.load(Relaxed)
    }

    /// Resident bytes, their peak, commits and decommits.
    pub(super) fn counts(&self) -> (u64, u64, u64, u64) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (s.bytes, s.peak, self.commits(), s.decommits)
    }

    /// The resident peak restarts from now.
    pub(super) fn reset_peak(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.peak = s.bytes;
    }

    /// The mem and offset of `p`, if it is in the arena.
    pub(super) fn locate(&self, p: *const u8) -> Option<(u64, u64)> {
        let o = (p as usize).checked_sub(self.base)? as u64;
        (o < self.len).then_some((self.handle, o))
    }

    /// GPU `gpu`'s DMA address of the byte at `p` (no system call): `None` if `p` is not in the
    /// arena, its chunk is not resident, the arena is not mapped for `gpu`, or the caller may
    /// not read bus addresses. The address holds up to the end of `p`'s chunk (64 KiB).
    pub(super) fn dma_addr(&self, p: *const u8, gpu: u32) -> Option<u64> {
        // In a forked child the tables are the parent's (and its lock may be held forever).
        if !self.is_ours() {
            return None;
        }
        let (_, o) = self.locate(p)?;
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.dma_denied {
            return None;
        }
        let (_, _, table) = s.dma.iter().find(|(g, _, _)| *g == gpu)?;
        let chunk = *table.get(usize::try_from(o / CHUNK).ok()?)?;
        (chunk != ABSENT).then(|| chunk + o % CHUNK)
    }

    /// mimalloc commits (`on`) or decommits `[start, start + size)`: the chunks it touches
    /// made resident (`is_zero` set, where mimalloc asks, only if every one was absent), or
    /// the chunks wholly inside it given back (a chunk the kernel keeps, work queued on it,
    /// stays resident: a later commit finds it so and does not call it zero). Allocates
    /// nothing (the program's own allocator may be this mimalloc). In a forked child, which
    /// has the arena's metadata but not its memory, a commit fails and a decommit does
    /// nothing.
    fn commit_range(&self, on: bool, start: usize, size: usize, is_zero: *mut bool) -> bool {
        if std::process::id() != self.pid {
            return !on;
        }
        let Some(off) = start.checked_sub(self.base).map(|o| o as u64) else {
            return false;
        };
        let end = off.saturating_add(size as u64).min(self.len);
        let (first, last) = if on {
            (off / CHUNK, end.div_ceil(CHUNK))
        } else {
            (off.div_ceil(CHUNK), end / CHUNK)
        };
        // The first commit, made while mimalloc sets the arena up, is of its metadata.
        if on && self.id.load(Relaxed) == 0 && off == 0 {
            self.meta.store(last * CHUNK, Relaxed);
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut ok = true;
        let all_new = !on || (first..last).all(|c| s.chunks.get(c as usize) == Some(&false));
        if on {
            // mimalloc takes back chunks the kernel kept when it decommitted them.
            let (a, b) = (first as usize, (last as usize).min(s.owed.len()));
            if let Some(o) = s.owed.get_mut(a..b) {
                o.fill(false);
            }
        }
        if on {
            self.commits.fetch_add(1, Relaxed);
        } else {
            s.decommits += 1;
        }
        // Run by run of chunks to change, one system call each.
        let mut c = first;
        while c < last {
            if s.chunks.get(c as usize) != Some(&!on) {
                c += 1;
                continue;
            }
            let mut n = 1;
            while c + n < last && s.chunks.get((c + n) as usize) == Some(&!on) {
                n += 1;
            }
            let mut r = self.dev.mem_range(self.handle, c * CHUNK, n * CHUNK, on);
            for _ in 0..3 {
                if r != Err(Errno::EINTR) {
                    break;
                }
                r = self.dev.mem_range(self.handle, c * CHUNK, n * CHUNK, on);
            }
            if r.is_ok() {
                for b in s.chunks.iter_mut().skip(c as usize).take(n as usize) {
                    *b = on;
                }
                self.note_dma(&mut s, c, n, on);
                // A run is of one part: each part's commits are its own.
                let large = if c * CHUNK >= self.mi_len {
                    n * CHUNK
                } else {
                    0
                };
                if on {
                    s.bytes += n * CHUNK;
                    self.large_bytes.fetch_add(large, Relaxed);
                } else {
                    s.bytes -= n * CHUNK;
                    self.large_bytes.fetch_sub(large, Relaxed);
                }
            } else if on {
                ok = false;
            } else {
                // Kept under queued work: resident, owed back before the arena is reused.
                let (a, b) = (c as usize, ((c + n) as usize).min(s.owed.len()));
                if let Some(o) = s.owed.get_mut(a..b) {
                    o.fill(true);
                }
            }
            c += n;
        }
        s.peak = s.peak.max(s.bytes);
        if on && !is_zero.is_null() {
            // SAFETY: mimalloc passes a valid flag or null.
            unsafe { *is_zero = ok && all_new };
        }
        // A decommit is done as far as mimalloc is concerned: what the kernel kept is known
        // resident here, and a later commit neither makes it again nor calls it zero.
        ok || !on
    }
}

/// `gpus` sorted, each once: a heap's GPUs as a set.
fn gpu_set(gpus: &[u32]) -> Vec<u32> {
    let mut v = gpus.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// The arena length a heap of `cfg` asks for: its size, at least mimalloc's smallest arena
/// and a multiple of it.
fn asked_len(cfg: &HeapConfig) -> u64 {
    // SAFETY: a plain query of mimalloc's constant.
    let min = unsafe { mi::mi_arena_min_size() } as u64;
    cfg.arena_size.max(min).next_multiple_of(min)
}

impl Arena {
    /// Keeps the DMA tables of chunks `[c, c + n)` that were just made resident (`on`) or
    /// given back: their addresses read into the tables in place (one `MEM_DMA_ADDRS` a GPU),
    /// or marked absent. Allocates and frees nothing. A refusal (`EPERM`) stops the tables for
    /// good; a GPU that went (`ENXIO`: the mem's mapping for it is gone with it, `ENODEV`)
    /// has its whole table marked absent, for good.
    fn note_dma(&self, s: &mut Residency, c: u64, n: u64, on: bool) {
        if s.dma_denied {
            return;
        }
        let (Ok(from), Ok(count)) = (usize::try_from(c), usize::try_from(n)) else {
            return;
        };
        let mut denied = false;
        for (g, gone, table) in s.dma.iter_mut() {
            if *gone {
                continue;
            }
            let Some(slots) = table.get_mut(from..from.saturating_add(count)) else {
                continue;
            };
            if !on {
                slots.fill(ABSENT);
                continue;
            }
            match self.dev.dma_addrs_into(self.handle, *g, c, slots) {
                Ok(written) if written == count => {}
                Err(Errno::EPERM) => {
                    denied = true;
                    break;
                }
                Err(Errno::ENXIO | Errno::ENODEV) => {
                    *gone = true;
                    table.fill(ABSENT);
                }
                // Not all read (a signal, no memory): unknown, so absent until decommitted.
                _ => slots.fill(ABSENT),
            }
        }
        s.dma_denied |= denied;
    }
}

/// mimalloc's commit callback: `arg` is the arena.
unsafe extern "C" fn commit(
    on: bool,
    start: *mut c_void,
    size: usize,
    is_zero: *mut bool,
    arg: *mut c_void,
) -> bool {
    // SAFETY: `arg` is the `&'static Arena` given to `mi_manage_memory`.
    let arena = unsafe { &*arg.cast::<Arena>() };
    arena.commit_range(on, start as usize, size, is_zero)
}

/// Maps `len` bytes of the device at `offset` at an address aligned to `align`: a `PROT_NONE`
/// reservation of `len + align` bytes, the mapping placed over its aligned part, the rest
/// unmapped. Returns the address.
fn map_aligned(dev: &Ruvm, offset: u64, len: u64, align: u64) -> Result<usize, Errno> {
    let len = usize::try_from(len).map_err(|_| Errno::ENOMEM)?;
    let align = usize::try_from(align).map_err(|_| Errno::EINVAL)?;
    let total = len.checked_add(align).ok_or(Errno::ENOMEM)?;
    let nz = NonZeroUsize::new(total).ok_or(Errno::EINVAL)?;
    // SAFETY: a new reservation at an address the kernel chooses aliases nothing.
    let r = unsafe {
        mmap_anonymous(
            None,
            nz,
            ProtFlags::PROT_NONE,
            MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
        )
    }?;
    let start = r.as_ptr() as usize;
    let base = start.next_multiple_of(align);
    let off = i64::try_from(offset).map_err(|_| Errno::EOVERFLOW)?;
    let at = NonZeroUsize::new(base).ok_or(Errno::EINVAL)?;
    let n = NonZeroUsize::new(len).ok_or(Errno::EINVAL)?;
    // SAFETY: `[base, base + len)` is inside the reservation just made, which nothing uses.
    let placed = unsafe {
        mmap(
            Some(at),
            n,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
            dev.as_fd(),
            off,
        )
    };
    let unmap = |from: usize, to: usize| {
        if to > from {
            if let Some(p) = std::ptr::NonNull::new(from as *mut c_void) {
                // SAFETY: a part of the reservation not used by the mapping.
                let _ = unsafe { munmap(p, to - from) };
            }
        }
    };
    if let Err(e) = placed {
        unmap(start, start + total);
        return Err(e);
    }
    unmap(start, base);
    unmap(base + len, start + total);
    Ok(base)
}

impl Part for Arena {
    fn is_ours(&self) -> bool {
        FORK_GENERATION.load(Relaxed) == self.generation
    }

    fn large_base(&self) -> usize {
        self.base + self.mi_len as usize
    }

    fn large_resident(&self, offset: u64, len: u64) -> bool {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let at = self.mi_len + offset;
        let (first, last) = (at / CHUNK, (at + len).div_ceil(CHUNK));
        (first..last).all(|c| s.chunks.get(c as usize) == Some(&true))
    }

    fn large_bytes(&self) -> u64 {
        self.large_bytes.load(Relaxed)
    }

    fn commit(&self, on: bool, at: usize, len: usize) -> bool {
        self.commit_range(on, at, len, std::ptr::null_mut())
    }
}
