// SPDX-License-Identifier: GPL-2.0

//! One sysmem chunk ([`Chunk`]: `2^order` contiguous pages, compound from [`SPLIT_BELOW`] up)
//! and how chunks and blocks are allocated, zeroed and freed (the module's [`Zeroing`], the
//! patience of a list's second tries). The lists of chunks are the parent's ([`super`]).
//!
//! C header: [`include/linux/gfp.h`](srctree/include/linux/gfp.h)

use core::ptr::NonNull;

use kernel::{
    bindings,
    page::{BorrowedPage, PAGE_SIZE},
    prelude::*,
    sync::atomic::{ordering::Relaxed, Atomic},
    time::{Instant, Monotonic},
};

/// How a chunk is allocated.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkFlags {
    /// Zero the pages (the module's [`Zeroing`]).
    pub(crate) zero: bool,
    /// Fail fast rather than reclaim and compact hard (`__GFP_NORETRY` instead of
    /// `__GFP_RETRY_MAYFAIL`): for a high-order attempt that has a smaller fallback, and for
    /// the first try at each chunk of a list ([`Patience`]).
    pub(crate) fail_fast: bool,
}

/// How long an allocation of many chunks may spend reclaiming and compacting hard for them
/// (`__GFP_RETRY_MAYFAIL`) in all. Each chunk is first asked for without retries
/// (`__GFP_NORETRY`: memory that is free, or cheap to free, comes at once); only a chunk that
/// did not come so is asked for again with retries, and that time is counted. Once it passes
/// this, a chunk that does not come without retries fails the allocation (`ENOMEM`): one that
/// cannot be met (its memory cgroup full, the machine out of memory) fails in bounded time
/// instead of reclaiming and compacting for minutes, chunk after chunk, while its caller holds
/// what others may wait for (its stream's turn, its GPU's access).
const PATIENCE_MS: i64 = 2000;

/// The time an allocation of many chunks spent asking with retries ([`PATIENCE_MS`]).
pub(crate) struct Patience {
    spent_ms: i64,
}

impl Patience {
    pub(crate) fn new() -> Self {
        Self { spent_ms: 0 }
    }

    /// Allocates one chunk of `2^order` pages with `flags` (see [`Chunk::alloc`]), without
    /// retries first, then with them while patience lasts (`flags.fail_fast`: never).
    pub(crate) fn chunk(&mut self, order: u32, flags: ChunkFlags) -> Result<Chunk> {
        let quick = ChunkFlags {
            fail_fast: true,
            ..flags
        };
        let first = Chunk::alloc(order, quick);
        if first.is_ok() || flags.fail_fast || self.spent_ms >= PATIENCE_MS {
            return first;
        }
        let start = Instant::<Monotonic>::now();
        let again = Chunk::alloc(order, flags);
        self.spent_ms = self.spent_ms.saturating_add(start.elapsed().as_millis());
        again
    }
}

/// How zeroed chunks get their zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Zeroing {
    /// By the page allocator: `__GFP_ZERO` (`clear_page` on each page).
    PageAllocator,
    /// By the kernel's `memset` on each page, after an allocation without `__GFP_ZERO`.
    Memset,
}

/// Whether the module zeroes with [`Zeroing::Memset`]; set once at load, before any chunk.
static ZERO_BY_MEMSET: Atomic<bool> = Atomic::new(false);

/// Sets how zeroed chunks are zeroed from now on (module init).
pub(crate) fn set_zeroing(how: Zeroing) {
    ZERO_BY_MEMSET.store(how == Zeroing::Memset, Relaxed);
}

/// How zeroed chunks are zeroed.
pub(crate) fn zeroing() -> Zeroing {
    if ZERO_BY_MEMSET.load(Relaxed) {
        Zeroing::Memset
    } else {
        Zeroing::PageAllocator
    }
}

pub(super) const fn gfp_bit(bit: u32) -> bindings::gfp_t {
    1 << bit
}

/// A chunk of a smaller order allocated on its own is order-0 pages (`split_page`); from this
/// order up (64 KiB) it is one compound page. (A list's chunks below [`BLOCK_ORDER`] are
/// pieces of its blocks instead, where it got blocks; see the module's docs.)
pub(crate) const SPLIT_BELOW: u32 = 4;

/// The largest block a list of small chunks is cut from (2 MiB, the page allocator's pageblock).
pub(crate) const BLOCK_ORDER: u32 = 9;

/// The flags of a chunk's allocation.
pub(super) fn chunk_gfp(order: u32, flags: ChunkFlags) -> bindings::gfp_t {
    let mut gfp = bindings::GFP_KERNEL
        | gfp_bit(bindings::___GFP_ACCOUNT_BIT)
        | gfp_bit(bindings::___GFP_NOMEMALLOC_BIT)
        | bindings::__GFP_NOWARN;
    gfp |= if flags.fail_fast {
        gfp_bit(bindings::___GFP_NORETRY_BIT)
    } else {
        gfp_bit(bindings::___GFP_RETRY_MAYFAIL_BIT)
    };
    if order >= SPLIT_BELOW {
        gfp |= gfp_bit(bindings::___GFP_COMP_BIT);
    }
    gfp
}

/// The flags of a block that small chunks are cut from: taken only if free now (no reclaim,
/// no compaction, not even kswapd woken), the chunk's own order being the fallback.
pub(super) fn block_gfp() -> bindings::gfp_t {
    let reclaim =
        gfp_bit(bindings::___GFP_DIRECT_RECLAIM_BIT) | gfp_bit(bindings::___GFP_KSWAPD_RECLAIM_BIT);
    (bindings::GFP_KERNEL & !reclaim)
        | gfp_bit(bindings::___GFP_ACCOUNT_BIT)
        | gfp_bit(bindings::___GFP_NOMEMALLOC_BIT)
        | gfp_bit(bindings::___GFP_NORETRY_BIT)
        | bindings::__GFP_NOWARN
}

/// Zeroes `len` bytes at byte `offset` of the pages that start at `first`: with no highmem, one
/// `memset` over their range of the kernel's direct map (a single call, where a page at a time
/// cost a third of a 64 KiB chunk's zeroing in the fast guest), else page by page through
/// temporary mappings.
///
/// # Safety
///
/// `first` is the first of at least `offset + len` bytes of physically contiguous pages with
/// contiguous `struct page`s (one chunk: a page-allocator block or a piece cut from one), valid
/// for the call, whose bytes no other kernel-side access reaches meanwhile.
pub(super) unsafe fn zero_pages(
    first: NonNull<bindings::page>,
    offset: usize,
    len: usize,
) -> Result {
    // Both ways are compiled everywhere; the kernel's configuration picks one.
    if !cfg!(CONFIG_HIGHMEM) {
        // SAFETY: without highmem every page is in the direct map, where `kmap_local_page`
        // returns its address, and physically contiguous pages are contiguous there; the range
        // is inside the caller's pages, which no other kernel access reaches.
        unsafe {
            let base = bindings::kmap_local_page(first.as_ptr()).cast::<u8>();
            core::ptr::write_bytes(base.add(offset), 0, len);
            bindings::kunmap_local(base.cast());
        }
        return Ok(());
    }
    let end = offset.checked_add(len).ok_or(EOVERFLOW)?;
    let mut pos = offset;
    while pos < end {
        let (index, at) = (pos / PAGE_SIZE, pos % PAGE_SIZE);
        let n = (end - pos).min(PAGE_SIZE - at);
        // SAFETY: page `index` is one of the caller's contiguous pages (their `struct page`s
        // are contiguous), and the range is inside it; no other kernel access reaches it.
        unsafe { BorrowedPage::from_raw(first.add(index)).fill_zero_raw(at, n) }?;
        pos += n;
    }
    Ok(())
}

/// Allocates `2^order` pages with `gfp`, zeroed the `zero` way if it is given; below
/// [`SPLIT_BELOW`] (and `gfp` without `__GFP_COMP`) they are split into order-0 pages. `None`
/// when the page allocator has none.
pub(super) fn alloc_block(
    gfp: bindings::gfp_t,
    order: u32,
    zero: Option<Zeroing>,
) -> Option<NonNull<bindings::page>> {
    let gfp = match zero {
        Some(Zeroing::PageAllocator) => gfp | bindings::__GFP_ZERO,
        _ => gfp,
    };
    // SAFETY: `alloc_pages` accepts any flags and any order up to `MAX_PAGE_ORDER`, which the
    // callers stay within.
    let page = NonNull::new(unsafe { bindings::alloc_pages(gfp, order) })?;
    if zero == Some(Zeroing::Memset) {
        // SAFETY: the fresh block of `2^order` pages is ours; nothing else can reach its bytes
        // yet.
        let zeroed = unsafe { zero_pages(page, 0, PAGE_SIZE << order) };
        if zeroed.is_err() {
            // Never hand out a block that was not zeroed whole.
            // SAFETY: the fresh block of this order, with `gfp`'s compound-ness, ours.
            unsafe { bindings::__free_pages(page.as_ptr(), order) };
            return None;
        }
    }
    if order > 0 && gfp & gfp_bit(bindings::___GFP_COMP_BIT) == 0 {
        // SAFETY: a fresh, non-compound block of `2^order` pages that we own.
        unsafe { bindings::split_page(page.as_ptr(), order) };
    }
    Some(page)
}

/// Frees a chunk of `2^order` pages headed by `page`.
///
/// # Safety
///
/// `page` heads a chunk of that order as [`Chunk`]'s invariant describes, owned by the caller,
/// which gives it up.
pub(super) unsafe fn free_chunk(page: NonNull<bindings::page>, order: u32) {
    if order >= SPLIT_BELOW {
        // SAFETY: a compound block of this order, ours to free (the function's contract).
        unsafe { bindings::__free_pages(page.as_ptr(), order) };
        return;
    }
    for i in 0..1usize << order {
        // SAFETY: the chunk's pages are contiguous order-0 pages with a reference each, ours
        // to free (the function's contract); `i` is inside the chunk.
        unsafe { bindings::__free_pages(page.as_ptr().add(i), 0) };
    }
}

/// One chunk: `2^order` contiguous pages.
///
/// # Invariants
///
/// `page` is the first page of `2^order` contiguous pages owned by this object and freed by its
/// `Drop`: below [`SPLIT_BELOW`], order-0 pages with a reference each (`split_page`), otherwise
/// one compound block from `alloc_pages(.., order)`.
pub(crate) struct Chunk {
    pub(super) page: NonNull<bindings::page>,
    pub(super) order: u32,
}

// SAFETY: a block of pages may be freed from any thread.
unsafe impl Send for Chunk {}
// SAFETY: `&Chunk` gives out only shared borrows of its pages' `struct page`s, never their bytes.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// Allocates `2^order` pages. Charged to the calling task's memory cgroup, never from the
    /// emergency reserves, and never by invoking the OOM killer: under pressure it fails with
    /// `ENOMEM` instead.
    pub(crate) fn alloc(order: u32, flags: ChunkFlags) -> Result<Self> {
        Self::alloc_zeroed_by(order, flags, zeroing())
    }

    /// As [`Chunk::alloc`], zeroed (if `flags` ask for it) the `how` way rather than the
    /// module's: the benchmark's page-allocator baseline.
    pub(crate) fn alloc_zeroed_by(order: u32, flags: ChunkFlags, how: Zeroing) -> Result<Self> {
        if order > bindings::MAX_PAGE_ORDER {
            return Err(EINVAL);
        }
        let zero = flags.zero.then_some(how);
        let page = alloc_block(chunk_gfp(order, flags), order, zero).ok_or(ENOMEM)?;
        // INVARIANT: `page` heads a fresh block of `2^order` pages that we now own, split
        // below `SPLIT_BELOW` (`chunk_gfp` asks for a compound page from there up).
        Ok(Self { page, order })
    }

    /// The allocation order.
    pub(crate) fn order(&self) -> u32 {
        self.order
    }
}

/// Times a zeroed chunk of `2^order` pages allocated and freed each [`Zeroing`] way, `rounds`
/// times each, alternating; the fastest of each, in nanoseconds: (page allocator, memset).
pub(crate) fn time_zeroing(order: u32, rounds: u32) -> Result<(u64, u64)> {
    let flags = ChunkFlags {
        zero: true,
        fail_fast: false,
    };
    let time = |how| -> Result<u64> {
        let start = Instant::<Monotonic>::now();
        drop(Chunk::alloc_zeroed_by(order, flags, how)?);
        Ok(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    };
    let (mut by_allocator, mut by_memset) = (u64::MAX, u64::MAX);
    for _ in 0..rounds {
        by_allocator = by_allocator.min(time(Zeroing::PageAllocator)?);
        by_memset = by_memset.min(time(Zeroing::Memset)?);
    }
    Ok((by_allocator, by_memset))
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: by the type invariant we own the chunk, of this order.
        unsafe { free_chunk(self.page, self.order) };
    }
}
