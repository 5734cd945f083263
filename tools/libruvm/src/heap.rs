// SPDX-License-Identifier: GPL-2.0

//! Pinned heaps: `malloc`-speed pinned, DMA-mapped memory on mimalloc's own arenas, given back
//! to the kernel when mimalloc decommits it.
//!
//! A heap's arena ([`arena`]) is a sparse mem of the calling file (`RUVM_ALLOC_SPARSE`, 64 KiB
//! chunks: mimalloc's slice), DMA-mapped once for the heap's GPUs and mapped into the process
//! at an address aligned as mimalloc wants. Its first half holds the blocks of up to 10 KiB,
//! through mimalloc; its second half the larger ones, by the heap's own segregated fit
//! ([`large`]: mimalloc's pages for those, committed whole and purged late, held 2.5x the live
//! bytes on a program's mixed sizes). mimalloc manages the first half as an exclusive arena with a
//! commit callback (`mi_manage_memory`): committing a range makes its chunks resident
//! (`RUVM_RANGE_POPULATE`: zeroed, charged, DMA-mapped for the heap's GPUs, never per
//! allocation), decommitting it (mimalloc's purge, [`PinnedHeap::collect`], the heap's
//! destruction) gives them back (`RUVM_RANGE_RELEASE`). Allocations go through a mimalloc heap
//! of that arena (`mi_heap_new_in_arena`) from any thread; a pointer into a heap answers for
//! itself without a system call ([`locate`]: its mem and offset, which the copy engine and
//! streams take).
//!
//! mimalloc cannot forget an arena (its metadata lives at the arena's start, and its purges
//! visit every arena), so a heap's arena stays reserved, its metadata resident, until the
//! process ends; a dropped heap's blocks are freed and its chunks given back, and the next heap
//! of the same open file, GPUs and size takes the arena again (mimalloc has room for a fixed
//! number of arenas: a program that makes and drops heaps must not use one up per heap).

mod arena;
mod large;
mod tlsf;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use libmimalloc_sys as mi;
use nix::errno::Errno;

use crate::Ruvm;
use arena::Arena;
pub use arena::{arenas, locate};
use large::LARGE_MIN;

/// How a heap is made.
#[derive(Clone, Debug)]
pub struct HeapConfig {
    /// The GPUs the heap's memory is DMA-mapped for (`RUVM_IOCTL_MEM_MAP_GPU`), once.
    pub gpus: Vec<u32>,
    /// The size of each of the arena's two parts (rounded up to mimalloc's 32 MiB minimum,
    /// down to what the module takes as one mem): the most the heap holds at once in blocks up
    /// to 10 KiB (mimalloc's), and in larger blocks (the heap's own segregated fit). The arena's mem
    /// is twice this (virtual: only what blocks use is resident).
    pub arena_size: u64,
}

impl Default for HeapConfig {
    fn default() -> Self {
        Self {
            gpus: Vec::new(),
            arena_size: 256 << 20,
        }
    }
}

/// What a heap holds and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct HeapStats {
    /// Bytes of the arena resident in the kernel now (mimalloc's metadata included).
    pub reserved: u64,
    /// The most `reserved` has been.
    pub reserved_peak: u64,
    /// Bytes of the blocks in use now (their usable sizes).
    pub in_use: u64,
    /// The most `in_use` has been.
    pub in_use_peak: u64,
    /// Allocations made through the heap.
    pub allocs: u64,
    /// Blocks freed through the heap.
    pub frees: u64,
    /// Allocations served with no system call (none of the heap's commits ran meanwhile).
    pub hits: u64,
    /// Commits (`RUVM_RANGE_POPULATE`: mimalloc's, and the large blocks') since the heap was
    /// made.
    pub commits: u64,
    /// Decommits (`RUVM_RANGE_RELEASE`: mimalloc's, and the large blocks') since the heap was
    /// made.
    pub decommits: u64,
    /// The arena's size (both parts).
    pub arena_size: u64,
}

/// A pinned heap: see the module's documentation. Usable from any thread.
pub struct PinnedHeap {
    heap: *mut mi::mi_heap_t,
    arena: &'static Arena,
    /// The arena's commits and decommits when the heap took it (an arena outlives its heap).
    base_commits: u64,
    base_decommits: u64,
    in_use: AtomicU64,
    in_use_peak: AtomicU64,
    allocs: AtomicU64,
    frees: AtomicU64,
    hits: AtomicU64,
}

// SAFETY: a mimalloc heap (not a theap) may be used from any thread in mimalloc v3; the
// counters are atomics and the arena is shared, immutable but for its own locked state.
unsafe impl Send for PinnedHeap {}
// SAFETY: as above.
unsafe impl Sync for PinnedHeap {}

impl PinnedHeap {
    /// A heap over an arena of file `dev`, DMA-mapped for `cfg.gpus`. `ENOMEM` if mimalloc
    /// refuses the arena; the module's errors for the sparse mem (`EINVAL` a module without
    /// sparse mems, `ENODEV` a GPU not there).
    ///
    /// The arena of a heap dropped earlier is taken again where it is of the same open file,
    /// GPUs and size: a program that makes and drops heaps holds one arena per heap alive at
    /// once, not one per heap ever made (mimalloc has room for a fixed number of arenas).
    pub fn new(dev: &Ruvm, cfg: &HeapConfig) -> Result<Self, Errno> {
        let arena = match Arena::take(dev, cfg) {
            Some(a) => a,
            None => Arena::new(dev, cfg)?,
        };
        // SAFETY: the arena's id is mimalloc's, alive for the process.
        let heap = unsafe { mi::mi_heap_new_in_arena(arena.id()) };
        if heap.is_null() {
            arena.give_up();
            return Err(Errno::ENOMEM);
        }
        let (_, _, commits, decommits) = arena.counts();
        Ok(Self {
            heap,
            arena,
            base_commits: commits,
            base_decommits: decommits,
            in_use: AtomicU64::new(0),
            in_use_peak: AtomicU64::new(0),
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        })
    }

    /// Counts a block made (`p`, which may be null), if the arena's commits did not move
    /// meanwhile (`commits` was read before) a hit.
    fn made(&self, p: *mut c_void, commits: u64) -> *mut c_void {
        if !p.is_null() {
            // SAFETY: `p` is a live block of the heap's.
            let n = unsafe { self.usable(p.cast()) };
            self.count_made(n, commits);
        }
        p
    }

    /// Counts a block of `n` bytes made (see [`Self::made`]).
    fn count_made(&self, n: u64, commits: u64) {
        let now = self.in_use.fetch_add(n, Relaxed) + n;
        self.in_use_peak.fetch_max(now, Relaxed);
        self.allocs.fetch_add(1, Relaxed);
        if self.arena.commits() == commits {
            self.hits.fetch_add(1, Relaxed);
        }
    }

    /// The usable bytes of block `p`.
    ///
    /// # Safety
    ///
    /// `p` is a live block of this heap.
    unsafe fn usable(&self, p: *const u8) -> u64 {
        if self.arena.is_large(p) {
            return self.arena.large_len(p).unwrap_or(0);
        }
        // SAFETY: the caller's promise: a block of mimalloc's.
        unsafe { mi::mi_usable_size(p.cast()) as u64 }
    }

    /// A large block ([`large`]) of `size` bytes, zeroed if `zero`, counted; null if none.
    fn large(&self, size: usize, zero: bool) -> *mut u8 {
        let c = self.arena.commits();
        let Some((p, n)) = self.arena.large_alloc(size) else {
            return std::ptr::null_mut();
        };
        if zero {
            // SAFETY: the block's `n` bytes are the caller's from now on, resident and mapped.
            unsafe { std::ptr::write_bytes(p, 0, n as usize) };
        }
        self.count_made(n, c);
        p
    }

    /// `size` bytes (at least 1), or null when the arena is full or the kernel refuses memory.
    /// Blocks beyond 10 KiB are 4 KiB-aligned.
    pub fn malloc(&self, size: usize) -> *mut u8 {
        if size > LARGE_MIN {
            return self.large(size, false);
        }
        let c = self.arena.commits();
        // SAFETY: the heap is alive; mimalloc returns a block or null.
        self.made(unsafe { mi::mi_heap_malloc(self.heap, size) }, c)
            .cast()
    }

    /// `count * size` zeroed bytes, or null (also on overflow).
    pub fn calloc(&self, count: usize, size: usize) -> *mut u8 {
        match count.checked_mul(size) {
            None => return std::ptr::null_mut(),
            Some(n) if n > LARGE_MIN => return self.large(n, true),
            Some(_) => {}
        }
        let c = self.arena.commits();
        // SAFETY: as in `malloc`; mimalloc checks the product.
        self.made(unsafe { mi::mi_heap_calloc(self.heap, count, size) }, c)
            .cast()
    }

    /// `size` bytes aligned to `align` (a power of two), or null.
    pub fn malloc_aligned(&self, size: usize, align: usize) -> *mut u8 {
        if !align.is_power_of_two() {
            return std::ptr::null_mut();
        }
        if size > LARGE_MIN && align <= 4096 {
            return self.large(size, false);
        }
        let c = self.arena.commits();
        // SAFETY: as in `malloc`; the alignment is a power of two.
        self.made(
            unsafe { mi::mi_heap_malloc_aligned(self.heap, size, align) },
            c,
        )
        .cast()
    }

    /// `p` (a block of this heap, or null) grown or shrunk to `size` bytes, its bytes kept up
    /// to the smaller size; null (and `p` untouched) if it cannot be.
    ///
    /// # Safety
    ///
    /// `p` is null or a live block of this heap, not used after a non-null return.
    pub unsafe fn realloc(&self, p: *mut u8, size: usize) -> *mut u8 {
        if p.is_null() {
            return self.malloc(size);
        }
        // SAFETY: the caller's promise.
        let old = unsafe { self.usable(p) };
        let large = self.arena.is_large(p);
        if large && size > LARGE_MIN && size as u64 <= old && size as u64 >= old / 2 {
            // A large block shrunk by at most half stays in place.
            return p;
        }
        if large || size > LARGE_MIN {
            // Across the two parts (or a large block grown): a new block, the bytes copied.
            let q = self.malloc(size);
            if !q.is_null() {
                // SAFETY: both blocks are live and distinct; the copy fits both.
                unsafe { std::ptr::copy_nonoverlapping(p, q, (old as usize).min(size)) };
                // SAFETY: the caller's promise: `p` is not used after a non-null return.
                unsafe { self.free(p) };
            }
            return q;
        }
        let c = self.arena.commits();
        // SAFETY: the caller's promise: a block of mimalloc's.
        let q = unsafe { mi::mi_heap_realloc(self.heap, p.cast(), size) };
        if q.is_null() {
            return std::ptr::null_mut();
        }
        self.in_use.fetch_sub(old, Relaxed);
        self.frees.fetch_add(1, Relaxed);
        self.made(q, c).cast()
    }

    /// Frees `p` (a block of this heap, or null), from any thread.
    ///
    /// # Safety
    ///
    /// `p` is null or a live block of this heap, not used afterwards.
    pub unsafe fn free(&self, p: *mut u8) {
        if p.is_null() {
            return;
        }
        if self.arena.is_large(p) {
            if let Some(n) = self.arena.large_free(p) {
                self.in_use.fetch_sub(n, Relaxed);
                self.frees.fetch_add(1, Relaxed);
            }
            return;
        }
        // SAFETY: the caller's promise.
        let n = unsafe { mi::mi_usable_size(p.cast()) } as u64;
        self.in_use.fetch_sub(n, Relaxed);
        self.frees.fetch_add(1, Relaxed);
        // SAFETY: the caller's promise.
        unsafe { mi::mi_free(p.cast()) };
    }

    /// Gives back everything mimalloc holds free (`mi_heap_collect` and its arenas' purge,
    /// forced): the chunks of the freed pages go back to the kernel.
    pub fn collect(&self) {
        // SAFETY: the heap is alive.
        unsafe { mi::mi_heap_collect(self.heap, true) };
        // SAFETY: mimalloc's global collection, forced: purges its arenas now.
        unsafe { mi::mi_collect(true) };
        self.arena.large_give_back(0);
    }

    /// Where `p` is, if it is in this heap's arena: its mem and offset.
    pub fn locate(&self, p: *const u8) -> Option<(u64, u64)> {
        self.arena.locate(p)
    }

    /// GPU `gpu`'s DMA address of the byte at `p`, if `p` is in this heap's arena, its chunk
    /// is resident, the heap is mapped for `gpu` and the caller may read bus addresses
    /// (`CAP_SYS_ADMIN`, as `MEM_DMA_ADDRS` asks): kept by the arena as chunks are committed,
    /// so no system call. Good up to the end of `p`'s 64 KiB chunk, while `p`'s block lives and
    /// the GPU is present.
    pub fn dma_addr(&self, p: *const u8, gpu: u32) -> Option<u64> {
        self.arena.dma_addr(p, gpu)
    }

    /// Forgets the peaks: they restart from what is held now.
    pub fn reset_peaks(&self) {
        self.in_use_peak.store(self.in_use.load(Relaxed), Relaxed);
        self.arena.reset_peak();
    }

    /// The statistics now.
    pub fn stats(&self) -> HeapStats {
        let (reserved, reserved_peak, commits, decommits) = self.arena.counts();
        HeapStats {
            reserved,
            reserved_peak,
            in_use: self.in_use.load(Relaxed),
            in_use_peak: self.in_use_peak.load(Relaxed),
            allocs: self.allocs.load(Relaxed),
            frees: self.frees.load(Relaxed),
            hits: self.hits.load(Relaxed),
            commits: commits - self.base_commits,
            decommits: decommits - self.base_decommits,
            arena_size: self.arena.len(),
        }
    }
}

impl Drop for PinnedHeap {
    /// Frees every block of the heap and gives the arena's chunks back (its metadata stays).
    fn drop(&mut self) {
        // SAFETY: the heap is alive and goes now; its blocks may not be used after the drop.
        unsafe { mi::mi_heap_destroy(self.heap) };
        // SAFETY: mimalloc's global collection, forced.
        unsafe { mi::mi_collect(true) };
        self.arena.large_reset();
        self.arena.give_up();
    }
}
