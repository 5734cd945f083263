// SPDX-License-Identifier: GPL-2.0

//! Sysmem chunks (naturally aligned blocks of `2^order` pages) and the lists of them that back
//! a mem or a vidmem root chunk.
//!
//! C header: [`include/linux/gfp.h`](srctree/include/linux/gfp.h)
//!
//! The 7.2 `kernel::page::Page` covers order-0 pages only. A [`Chunk`] of order
//! [`SPLIT_BELOW`] or more is one high-order allocation made with `__GFP_COMP` (so that each of
//! its pages can be mapped on its own, as `vm_insert_page` requires), freed with `__free_pages`
//! of the same order. A smaller chunk on its own is `2^order` order-0 pages, each with its own
//! reference (`split_page`), freed one by one. A [`ChunkList`] of chunks below
//! [`BLOCK_ORDER`] is cut instead from the largest blocks the page allocator has at hand (up
//! to [`BLOCK_ORDER`], taken only when it has them without reclaim), each block one compound
//! allocation that the list frees whole: 1 GiB of 4 KiB chunks is 512 allocations and 512
//! frees rather than 262,144 of each (freeing order-0 pages one by one cost as long as zeroing
//! them with `memset`), 1 GiB of 64 KiB chunks 512 rather than 16,384, and chunks that are
//! neighbours in memory are neighbours in the list (a DMA table links them as one range). Such
//! a list is never taken apart ([`ChunkList::take_chunks`] refuses it). The memory cgroup is
//! charged as for any allocation, which the kernel's bulk allocator does not do.
//!
//! Zeroed chunks get their zeros one of two ways ([`Zeroing`], chosen once at load): from the
//! page allocator (`__GFP_ZERO`, i.e. `clear_page`) or from the kernel's `memset` over a block
//! allocated without it, one call over the block's range of the direct map. Each picks its
//! instructions by CPU feature (`clear_page` `rep stosb` with ERMS; `memset` `rep stosb` with
//! FSRS, else 8-byte moves), and which is faster depends on the CPU: under QEMU TCG `rep stosb`
//! stores one byte a step, about ten times slower than 8-byte moves. [`time_zeroing`] measures
//! both. Bytes zeroed later ([`Bytes::zero`]: a vidmem chunk in its root's storage, a pool's
//! reused chunk) are zeroed a chunk at a time the same way.
//!
//! A [`ChunkList`] holds one pointer per chunk (its first page), so a list of one-page chunks is
//! itself the page array `vm_map_ram` takes. It never changes once made, so whatever maps its
//! pages (a DMA table, a kernel mapping) keeps them alive by holding the list. Its bytes are
//! shared with user space (`mmap`) and devices (DMA), which access them as they please, as with
//! any buffer handed to user space or hardware; the kernel side reaches them only through a
//! [`Bytes`] guard of the list's own mutex, so two kernel accesses never race, and no Rust
//! reference into the bytes ever exists. (One chunk: [`chunk`]; lists of user pages: [`user`].)

use core::ptr::NonNull;

mod chunk;
mod user;

use chunk::{alloc_block, block_gfp, free_chunk, gfp_bit, zero_pages};
pub(crate) use chunk::{
    set_zeroing, time_zeroing, zeroing, Chunk, ChunkFlags, Patience, Zeroing, BLOCK_ORDER,
    SPLIT_BELOW,
};
pub(crate) use user::PinError;

use kernel::{
    bindings, new_mutex,
    page::{BorrowedPage, PAGE_SIZE},
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        lock::mutex::MutexGuard,
        Arc, Mutex, UniqueArc,
    },
};

/// The first pages of the chunks of a list, owned: freed on drop.
///
/// # Invariants
///
/// Every pointer heads a chunk of `2^order` pages. The chunks from index `start` on that a
/// `(start, block)` entry of `blocks` covers (`2^(block - order)` of them; the entries in
/// increasing `start` order, never overlapping) are the pages, in order, of one compound
/// block of `2^block` pages owned by this object, which frees it whole. Every other chunk is
/// owned by this object as [`Chunk`]'s invariant describes.
struct Heads {
    v: HeadVec,
    order: u32,
    blocks: KVec<(usize, u32)>,
    /// The pages are pins of a process's own pages ([`user`]), not owned: unpinned on drop.
    user: Option<user::UserPins>,
}

/// The first pages of a list's chunks: in place for a list of one chunk (a small mem: no
/// allocation), else in a vector of the list's length.
enum HeadVec {
    One(Option<NonNull<bindings::page>>),
    Many(KVVec<NonNull<bindings::page>>),
}

impl HeadVec {
    /// Room for `n` pointers, charged to the caller's memory cgroup.
    fn with_capacity(n: usize) -> Result<Self> {
        Ok(match n {
            1 => Self::One(None),
            n => Self::Many(KVVec::with_capacity(n, GFP_KERNEL_ACCOUNT)?),
        })
    }

    /// An empty one.
    fn empty() -> Self {
        Self::One(None)
    }

    fn as_slice(&self) -> &[NonNull<bindings::page>] {
        match self {
            Self::One(p) => p.as_slice(),
            Self::Many(v) => v,
        }
    }

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn capacity(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Many(v) => v.capacity(),
        }
    }

    /// Adds `p` if there is room (never allocates); `false` if there is none.
    fn push_within_capacity(&mut self, p: NonNull<bindings::page>) -> bool {
        match self {
            Self::One(slot @ None) => {
                *slot = Some(p);
                true
            }
            Self::One(Some(_)) => false,
            Self::Many(v) => v.push_within_capacity(p).is_ok(),
        }
    }
}

impl Heads {
    /// Adds the chunks of a compound block of `2^block` pages headed by `first`, which it
    /// takes (and frees on failure); the list's order is below `block`.
    fn push_block(&mut self, first: NonNull<bindings::page>, block: u32) -> Result {
        let order = self.order;
        let n = 1usize << block.saturating_sub(order);
        let start = self.v.len();
        if self.v.capacity() - start < n
            || self
                .blocks
                .push((start, block), GFP_KERNEL_ACCOUNT)
                .is_err()
        {
            // SAFETY: the compound block we were given, of this order, ours to free.
            unsafe { bindings::__free_pages(first.as_ptr(), block) };
            return Err(ENOMEM);
        }
        for j in 0..n {
            // SAFETY: `j << order` is inside the block, whose `struct page`s are contiguous.
            let head = unsafe { first.add(j << order) };
            // INVARIANT: the block's pages, in order, from `start`; room was checked above, so
            // none is refused.
            let _ = self.v.push_within_capacity(head);
        }
        Ok(())
    }
}

impl Drop for Heads {
    fn drop(&mut self) {
        if let Some(pins) = self.user.take() {
            pins.unpin(self.v.as_slice());
            return;
        }
        let order = self.order;
        let mut blocks = self.blocks.iter().peekable();
        let mut i = 0;
        while let Some(p) = self.v.as_slice().get(i) {
            if let Some(&&(start, block)) = blocks.peek() {
                if start == i {
                    blocks.next();
                    // SAFETY: by the type invariant the chunks from `i` are a compound block
                    // of this order headed by `p`, which we own.
                    unsafe { bindings::__free_pages(p.as_ptr(), block) };
                    i += 1 << block.saturating_sub(order);
                    continue;
                }
            }
            // SAFETY: by the type invariant we own the chunk, of this order.
            unsafe { free_chunk(*p, order) };
            i += 1;
        }
    }
}

/// Chunks of one order, in order, that never change; `tag` is the owner's (its audit token).
///
/// A chunk costs one pointer (its first page): the list of an order-0 mem is the very page
/// array `vm_map_ram` takes.
#[pin_data]
pub(crate) struct ChunkList<T> {
    heads: Heads,
    _tag: T,
    /// Holders that pin the chunks without accounting for them (a mem freed on a stream, whose
    /// chunks went on with their charge, while work queued before the free still holds it):
    /// whoever holds the charge must not let it go (give the chunks back) meanwhile.
    pins: Atomic<u32>,
    /// Held by every kernel-side access to the bytes ([`Bytes`]). A leaf lock.
    #[pin]
    bytes: Mutex<()>,
}

// SAFETY: the blocks may be freed from any thread; `&ChunkList` reaches the bytes only through
// its mutex.
unsafe impl<T: Send> Send for ChunkList<T> {}
// SAFETY: as above; shared borrows give out only `struct page`s, never the bytes.
unsafe impl<T: Sync> Sync for ChunkList<T> {}

impl<T: Send + Sync> ChunkList<T> {
    /// Allocates `count` chunks of `2^order` pages with `flags`, charging the list itself to
    /// the caller's memory cgroup as the pages are. `stop` is asked before each chunk (a pending
    /// signal, say) and ends the allocation with its error. On failure every chunk allocated so
    /// far is freed.
    pub(crate) fn alloc(
        order: u32,
        count: usize,
        flags: ChunkFlags,
        tag: T,
        mut stop: impl FnMut() -> Result,
    ) -> Result<Arc<Self>> {
        if count == 0 {
            return Err(EINVAL);
        }
        let mut heads = Heads {
            v: HeadVec::with_capacity(count)?,
            order,
            blocks: KVec::new(),
            user: None,
        };
        // Chunks below a block are cut from the largest block that fits what is left, while
        // the page allocator has such blocks at hand; `cap` drops below an order it had none of.
        let mut cap = order.max(BLOCK_ORDER);
        let mut patience = Patience::new();
        while heads.v.len() < count {
            stop()?;
            let left = count - heads.v.len();
            // The largest power of two at most `left` (which is not 0), as a shift.
            let fit = (usize::BITS - 1).saturating_sub(left.leading_zeros());
            let block = cap.min(order.saturating_add(fit));
            if block > order {
                let zero = flags.zero.then(zeroing);
                let gfp = block_gfp() | gfp_bit(bindings::___GFP_COMP_BIT);
                let Some(first) = alloc_block(gfp, block, zero) else {
                    cap = block - 1;
                    continue;
                };
                heads.push_block(first, block)?;
                continue;
            }
            let chunk = patience.chunk(order, flags)?;
            // Room was reserved for `count` chunks, and there are fewer.
            if !heads.v.push_within_capacity(chunk.page) {
                return Err(EINVAL);
            }
            // INVARIANT: the block is now owned by `heads`.
            core::mem::forget(chunk);
        }
        Arc::pin_init(
            try_pin_init!(Self {
                heads,
                _tag: tag,
                bytes <- new_mutex!(()),
            pins: Atomic::new(0),
            }),
            GFP_KERNEL,
        )
    }

    /// Room for a list of up to `n` chunks, allocated now, so that making the list
    /// ([`ListSlot::finish`]) allocates nothing.
    pub(crate) fn slot(n: usize) -> Result<ListSlot<T>> {
        Ok(ListSlot {
            heads: HeadVec::with_capacity(n)?,
            arc: Some(UniqueArc::new_uninit(GFP_KERNEL)?),
            order: None,
        })
    }

    /// Takes the chunks out of the last reference to a list (which is left empty) and adds
    /// them to `out`, which must have room for them: `false` (and the reference dropped, with
    /// the chunks if it was the last) while anything else still holds the list, when `out`
    /// has no room, or when the list's chunks were cut from blocks it frees whole (a list of
    /// [`ChunkList::alloc`]'s; the pools' lists are made of chunks allocated one by one).
    pub(crate) fn take_chunks(list: Arc<Self>, out: &mut KVVec<Chunk>) -> bool {
        let Some(mut unique) = Arc::into_unique_or_drop(list) else {
            return false;
        };
        let heads = unique.as_mut().project().heads;
        if out.capacity() - out.len() < heads.v.len()
            || !heads.blocks.is_empty()
            || heads.user.is_some()
        {
            return false;
        }
        let order = heads.order;
        let pages = core::mem::replace(&mut heads.v, HeadVec::empty());
        for &page in pages.as_slice() {
            // INVARIANT: the block was owned by the list, which no longer has it.
            let chunk = Chunk { page, order };
            // Room was checked: this does not allocate.
            let _ = out.push(chunk, GFP_KERNEL);
        }
        true
    }
}

impl<T> ChunkList<T> {
    /// Pages per chunk, as a shift.
    pub(crate) fn order(&self) -> u32 {
        self.heads.order
    }

    /// How many chunks.
    pub(crate) fn chunk_count(&self) -> usize {
        self.heads.v.len()
    }

    /// Bytes per chunk.
    pub(crate) fn chunk_len(&self) -> usize {
        PAGE_SIZE << self.heads.order
    }

    /// How many `PAGE_SIZE` pages.
    pub(crate) fn page_count(&self) -> usize {
        self.heads.v.len() << self.heads.order
    }

    /// Bytes in all.
    pub(crate) fn len(&self) -> usize {
        self.page_count() * PAGE_SIZE
    }

    /// The first page of chunk `i`, as a raw pointer (for the mapping functions of this
    /// layer), valid while the list lives.
    pub(crate) fn chunk_page(&self, i: usize) -> Option<NonNull<bindings::page>> {
        self.heads.v.as_slice().get(i).copied()
    }

    /// Every page of the list in order, as the page array `vm_map_ram` takes, when each chunk
    /// is one page (order 0); `None` otherwise.
    pub(crate) fn order0_pages(&self) -> Option<&[NonNull<bindings::page>]> {
        (self.heads.order == 0).then_some(self.heads.v.as_slice())
    }

    /// The `i`-th `PAGE_SIZE` page of the list, as a raw pointer.
    pub(crate) fn page_ptr(&self, i: usize) -> Option<NonNull<bindings::page>> {
        let head = self.heads.v.as_slice().get(i >> self.heads.order)?;
        // SAFETY: the block's `struct page`s are contiguous (a buddy block never crosses a
        // memory section), and the index is inside the block of `2^order` pages.
        Some(unsafe { head.add(i & ((1 << self.heads.order) - 1)) })
    }

    /// The `i`-th `PAGE_SIZE` page of the list, borrowed for as long as the list lives.
    pub(crate) fn page(&self, i: usize) -> Option<BorrowedPage<'_>> {
        let p = self.page_ptr(i)?;
        // SAFETY: `p` is a page of this list, valid until the list is dropped, which the
        // borrow of `self` outlives.
        Some(unsafe { BorrowedPage::from_raw(p) })
    }

    /// Whether something outside this list holds a reference on one of its pages: a
    /// `get_user_pages` of a user mapping of them (a pipe that `vmsplice` filled, an
    /// `O_DIRECT` read in flight, a long-term pin), or a transient look of the kernel's. Such
    /// chunks must not be handed to another mem: the holder could read or write them there.
    /// Called with no mapping of the list left (this list's own reference is then the only
    /// one on each page, or on each block).
    pub(crate) fn held_elsewhere(&self) -> bool {
        let refs = |p: NonNull<bindings::page>| -> i32 {
            // SAFETY: `p` is a page of this list, live while it is; `_refcount` is read
            // atomically (a racy read is fine: a reference taken after it is not ours to see).
            unsafe { core::ptr::addr_of!((*p.as_ptr())._refcount.counter).read_volatile() }
        };
        let order = self.heads.order;
        let heads = self.heads.v.as_slice();
        let mut blocks = self.heads.blocks.iter().peekable();
        let mut i = 0;
        while let Some(&p) = heads.get(i) {
            if let Some(&&(start, block)) = blocks.peek() {
                if start == i {
                    blocks.next();
                    // One compound block: every page's references are the block's.
                    if refs(p) != 1 {
                        return true;
                    }
                    i += 1 << block.saturating_sub(order);
                    continue;
                }
            }
            if order >= SPLIT_BELOW {
                if refs(p) != 1 {
                    return true;
                }
            } else {
                for k in 0..1usize << order {
                    // SAFETY: `k` is inside the chunk, whose `struct page`s are contiguous.
                    if refs(unsafe { p.add(k) }) != 1 {
                        return true;
                    }
                }
            }
            i += 1;
        }
        false
    }

    /// One more holder pins the chunks (see `pins`).
    pub(crate) fn pin(&self) {
        self.pins.fetch_add(1, Relaxed);
    }

    /// A holder that pinned them lets go.
    pub(crate) fn unpin(&self) {
        self.pins.fetch_sub(1, Relaxed);
    }

    /// Whether a holder still pins them.
    pub(crate) fn pinned(&self) -> bool {
        self.pins.load(Relaxed) != 0
    }

    /// Exclusive kernel-side access to the bytes, until the guard goes.
    pub(crate) fn bytes(&self) -> Bytes<'_, T> {
        Bytes {
            list: self,
            _guard: self.bytes.lock(),
        }
    }

    /// The lock [`Bytes`] holds, for the kernel mapping of the same pages.
    pub(crate) fn bytes_lock(&self) -> MutexGuard<'_, ()> {
        self.bytes.lock()
    }
}

/// Room for a [`ChunkList`], allocated beforehand: chunks are pushed into it and the list is
/// made without allocating (a pool's failure paths must not lose chunks to a failed
/// allocation).
pub(crate) struct ListSlot<T> {
    /// The first pages of the chunks pushed so far, owned by the slot until the list is made
    /// (freed if it never is).
    heads: HeadVec,
    arc: Option<UniqueArc<core::mem::MaybeUninit<ChunkList<T>>>>,
    order: Option<u32>,
}

impl<T: Send + Sync> ListSlot<T> {
    /// Adds `chunk`; gives it back if the slot is full or the chunk is of another order than
    /// the first.
    pub(crate) fn push(&mut self, chunk: Chunk) -> core::result::Result<(), Chunk> {
        if self.heads.len() == self.heads.capacity() || self.order.is_some_and(|o| o != chunk.order)
        {
            return Err(chunk);
        }
        self.order = Some(chunk.order);
        if !self.heads.push_within_capacity(chunk.page) {
            return Err(chunk);
        }
        // INVARIANT: the block is now owned by `heads` (the list's, once made).
        core::mem::forget(chunk);
        Ok(())
    }

    /// How many chunks it holds.
    pub(crate) fn len(&self) -> usize {
        self.heads.len()
    }

    /// The list of the chunks pushed, tagged `tag`; `None` (nothing lost: the slot is
    /// dropped, freeing its chunks, only if it is empty) when no chunk was pushed.
    pub(crate) fn finish(mut self, tag: T) -> Option<Arc<ChunkList<T>>> {
        let order = self.order?;
        let arc = self.arc.take()?;
        let heads = Heads {
            v: core::mem::replace(&mut self.heads, HeadVec::empty()),
            order,
            blocks: KVec::new(),
            user: None,
        };
        let init = try_pin_init!(ChunkList {
            heads,
            _tag: tag,
            bytes <- new_mutex!(()),
            pins: Atomic::new(0),
        });
        // The initialiser cannot fail (a mutex's initialisation cannot); were it to, the
        // chunks would be freed with it.
        arc.pin_init_with(init).ok().map(Into::into)
    }
}

impl<T> Drop for ListSlot<T> {
    fn drop(&mut self) {
        // Chunks pushed into a slot that was never finished are freed.
        if let Some(order) = self.order {
            let heads = core::mem::replace(&mut self.heads, HeadVec::empty());
            for &page in heads.as_slice() {
                // INVARIANT: owned by the slot, freed once here.
                drop(Chunk { page, order });
            }
        }
    }
}

/// Exclusive kernel-side access to a [`ChunkList`]'s bytes (its mutex is held).
pub(crate) struct Bytes<'a, T> {
    list: &'a ChunkList<T>,
    _guard: MutexGuard<'a, ()>,
}

/// What one page-sized step of an access does.
enum Step<'b> {
    Read(&'b mut [u8]),
    Write(&'b [u8]),
}

impl<T> Bytes<'_, T> {
    /// Reads `buf.len()` bytes at `offset`.
    pub(crate) fn read(&self, offset: usize, buf: &mut [u8]) -> Result {
        self.walk(offset, buf.len(), |page, at, done, n| {
            let piece = buf.get_mut(done..done + n).ok_or(EINVAL)?;
            Self::step(page, at, Step::Read(piece))
        })
    }

    /// Writes `buf` at `offset`.
    pub(crate) fn write(&self, offset: usize, buf: &[u8]) -> Result {
        self.walk(offset, buf.len(), |page, at, done, n| {
            let piece = buf.get(done..done + n).ok_or(EINVAL)?;
            Self::step(page, at, Step::Write(piece))
        })
    }

    /// The little-endian 64-bit word at `offset` (a GPU page-table entry).
    pub(crate) fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes `value` as the little-endian 64-bit word at `offset`.
    pub(crate) fn write_u64(&self, offset: usize, value: u64) -> Result {
        self.write(offset, &value.to_le_bytes())
    }

    /// Zeroes `len` bytes at `offset`, a chunk at a time.
    pub(crate) fn zero(&self, offset: usize, len: usize) -> Result {
        let end = offset.checked_add(len).ok_or(EOVERFLOW)?;
        if end > self.list.len() {
            return Err(EINVAL);
        }
        let chunk = self.list.chunk_len();
        let mut pos = offset;
        while pos < end {
            let (index, at) = (pos / chunk, pos % chunk);
            let n = (end - pos).min(chunk - at);
            let first = self.list.chunk_page(index).ok_or(EINVAL)?;
            // SAFETY: a chunk's pages are contiguous (one block, or a piece cut from one) and
            // live as long as the list; the range is inside the chunk; the list's mutex, held
            // by `self`, keeps every other kernel-side access out.
            unsafe { zero_pages(first, at, n) }?;
            pos += n;
        }
        Ok(())
    }

    /// Calls `f(page, offset in page, bytes done, bytes now)` for each page of the range.
    fn walk<F>(&self, offset: usize, len: usize, mut f: F) -> Result
    where
        F: FnMut(&BorrowedPage<'_>, usize, usize, usize) -> Result,
    {
        let end = offset.checked_add(len).ok_or(EOVERFLOW)?;
        if end > self.list.len() {
            return Err(EINVAL);
        }
        let mut done = 0;
        while done < len {
            let pos = offset + done;
            let (index, in_page) = (pos / PAGE_SIZE, pos % PAGE_SIZE);
            let n = (len - done).min(PAGE_SIZE - in_page);
            let page = self.list.page(index).ok_or(EINVAL)?;
            f(&page, in_page, done, n)?;
            done += n;
        }
        Ok(())
    }

    fn step(page: &BorrowedPage<'_>, at: usize, step: Step<'_>) -> Result {
        // SAFETY: the range is inside the page (`walk` splits at page boundaries); the buffers
        // are separate kernel memory valid for their lengths; the list's mutex, held by `self`,
        // keeps every other kernel-side access out (user space and devices may touch the bytes,
        // as with any shared buffer: no Rust reference to them exists).
        unsafe {
            match step {
                Step::Read(buf) => page.read_raw(buf.as_mut_ptr(), at, buf.len()),
                Step::Write(buf) => page.write_raw(buf.as_ptr(), at, buf.len()),
            }
        }
    }
}
