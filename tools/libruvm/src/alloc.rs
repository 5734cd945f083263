// SPDX-License-Identifier: GPL-2.0

//! A stream-ordered caching allocator in user space, the way CUDA's user-mode driver and the
//! caching allocators programs use (PyTorch's, CuPy's) work: the kernel is asked for large
//! *segments* (mems of this file, zeroed, mapped into the process and the kernel once and
//! DMA-mapped once for the allocator's GPUs), and blocks of any size are carved out of them
//! here. A hit on a block of the same stream or one ready for anyone makes no system call.
//!
//! - **Sizes.** A request is rounded up to [`ROUND`] bytes. Where the module has sparse mems
//!   (`RUVM_FEATURE_SPARSE`), every block comes from one large *arena*: a sparse mem whose
//!   2 MiB chunks become resident (`RUVM_RANGE_POPULATE`) as blocks are carved over them
//!   ([`arena`]). Otherwise requests up to [`SMALL_MAX`] come from 2 MiB segments of their own
//!   class, larger ones from segments of their rounded size (whole 2 MiB units), so small
//!   blocks never fragment large segments.
//! - **Fit.** A good fit (`alloc/fit.rs`: the shortest that fits among a few of the request's
//!   own size class, else the first of the first class all of whose blocks fit), split when
//!   the rest is worth
//!   keeping ([`ROUND`] bytes for small blocks, 1 MiB for large ones); a freed block merges
//!   with free neighbours of the same owner. A free first goes to a bin of its stream and
//!   exact length (a synchronize moves the stream's completed bins to the ready ones): a
//!   request of that length on that stream, or any request of it once ready, takes one
//!   without touching the free-block index (programs ask again and again for the sizes they
//!   just gave back). The bins are given back, merged, before the free blocks are searched.
//! - **Stream order.** A block freed on a stream ([`Allocator::free`]) is the stream's own
//!   until the free's point (the stream's last submission through [`Allocator::submit`]) is
//!   known complete: that stream reuses it at once (its later work is ordered after the free).
//!   Another stream takes it only under CUDA's three reuse rules ([`Reuse`]), in this order:
//!   when the taker waited, through [`Allocator::wait_event`], on an event whose last record
//!   went through [`Allocator::submit`] on the freeing stream after the free
//!   (`follow_event_dependencies`); when the free is known complete (`allow_opportunistic`:
//!   the freeing stream's completed point read from the file's stream status page, with no
//!   system call once the stream has a slot, or `RUVM_IOCTL_STREAM_QUERY` on a module
//!   without one); and, only when no memory can be had otherwise (the kernel or
//!   [`Config::reserve_limit`] refused a segment, after the idle ones were given back), by
//!   making the taker wait for the free's point (`allow_internal_dependencies`: a `RECORD` on
//!   the freeing stream, a `WAIT_EVENT` on the taker). A stream's frees become everyone's
//!   once it is synchronized through the allocator.
//! - **Giving back.** [`Allocator::synchronize`] gives memory back to the kernel while more
//!   than the release threshold is reserved (CUDA's default threshold, 0, keeps nothing idle):
//!   an arena's resident chunks that lie wholly in free ready blocks (`RUVM_RANGE_RELEASE`; the
//!   arena itself stays, holding nothing), and whole idle segments; [`Allocator::trim`] gives
//!   back down to a figure. `reserved` counts what the kernel holds: whole segments, and
//!   arenas' resident chunks.
//!
//! The kernel stays the authority for every byte: each segment is a mem of the file, counted,
//! charged and audited as any other, and everything goes back when the allocator is dropped or
//! the file closed. Work that uses a block, and the records of events waited for through the
//! allocator, must be submitted through [`Allocator::submit`] (that is how the allocator knows
//! each stream's points); [`Allocator::synchronize`] waits for what was submitted so. A block's
//! CPU bytes may be touched only once the work on it is known complete, as with CUDA's
//! stream-ordered memory. A reused block holds what its last user of this allocator left
//! there (a new segment reads zero). A stream is released through the allocator
//! ([`Allocator::release_stream`]: synchronized, then forgotten) before it is destroyed, and an
//! event forgotten ([`Allocator::forget_event`]): a destroyed stream's frees that were not
//! synchronized are never reused, and what the allocator knows of streams and events it was
//! not told are gone stays until it is dropped.

mod arena;
mod bins;
mod block;
mod fit;
mod order;
mod segment;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard};

use nix::errno::Errno;

use crate::{uapi, Ruvm, StatusPage};
use arena::Arenas;
use bins::Recent;
pub use block::{Block, RawBlock, Stats};
use fit::{Blocks, Found, Owner, Use};
use order::StreamPoints;
use segment::Segment;

/// Every request is rounded up to a multiple of this (bytes); blocks start at such multiples.
pub const ROUND: u64 = 512;
/// The largest request served from the small blocks' 2 MiB segments.
pub const SMALL_MAX: u64 = 1 << 20;
/// A small blocks' segment, and the unit large segments are made in.
pub const SEGMENT_UNIT: u64 = 2 << 20;
/// The largest request (1 TiB): beyond it, `ENOMEM` without asking the kernel.
pub const MAX_REQUEST: u64 = 1 << 40;
/// The rest of a large block worth splitting off.
const LARGE_SPLIT: u64 = 1 << 20;
/// The bound of the waits the allocator submits, and of its synchronizations.
const WAIT_MS: u32 = uapi::RUVM_WAIT_MAX_MS;

/// Which of CUDA's reuse rules let a stream take a block another stream freed
/// (`cudaMemPoolReuse*`); all on by default, as in CUDA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reuse {
    /// The taker waited on an event recorded on the freeing stream after the free.
    pub follow_event_dependencies: bool,
    /// The free is known complete.
    pub allow_opportunistic: bool,
    /// The taker is made to wait for the free's point.
    pub allow_internal_dependencies: bool,
}

impl Default for Reuse {
    fn default() -> Self {
        Self {
            follow_event_dependencies: true,
            allow_opportunistic: true,
            allow_internal_dependencies: true,
        }
    }
}

/// How an allocator is made.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// The GPUs every segment is DMA-mapped for (`RUVM_IOCTL_MEM_MAP_GPU`), once.
    pub gpus: Vec<u32>,
    /// Bytes of idle segments kept at a synchronize (CUDA's release threshold; 0 keeps none,
    /// `u64::MAX` never gives back there).
    pub release_threshold: u64,
    /// The cross-stream reuse rules.
    pub reuse: Reuse,
    /// The most bytes of segments held at once (PyTorch's per-process memory fraction): a
    /// segment beyond it is `ENOMEM` without asking the kernel. `None`: the kernel's bounds
    /// only (the file's quota, the memory cgroup).
    pub reserve_limit: Option<u64>,
}

struct Inner {
    small: Blocks,
    large: Blocks,
    /// The segments, by id (a slot freed when its segment goes is used again).
    segs: Vec<Option<Segment>>,
    streams: FastMap<u64, StreamPoints>,
    /// Freed blocks not yet given back to `small`/`large` (still used there, marked cached),
    /// binned by owner and exact length: a request of that length by the owner (or anyone,
    /// for a ready bin) takes one in a few instructions. A synchronize moves its stream's
    /// completed bins to the ready ones; everything is given back, merged, before the free
    /// blocks are searched, before a new segment is made, and at a trim.
    bins: FastMap<(Owner, bool, u64), Vec<Recent>>,
    /// How many blocks the bins hold.
    binned: usize,
    /// The event the allocator records and waits on for internal dependencies, made at the
    /// first; and, per event of the caller's recorded through the allocator, its point.
    event: Option<u64>,
    events: FastMap<u64, (u64, u64)>,
    stats: Stats,
    /// The file's stream status page, once mapped (`Some(None)`: it could not be).
    status: Option<Option<StatusPage>>,
    /// The next allocation's generation.
    generation: u32,
    /// Whether segments are arenas ([`arena`]).
    arenas: Arenas,
}

/// A map keyed by handles: a multiply-xor hash (the keys are not chosen by an adversary of
/// this process, and SipHash would be most of a hit's time).
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHash>>;

#[derive(Default)]
struct FastHash(u64);

impl Hasher for FastHash {
    fn finish(&self) -> u64 {
        // The product's high bits folded down: the table indexes by the low ones, which for
        // keys with zero low bits (offsets, packed places) would all be the same.
        self.0.rotate_left(26)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// The allocator: see the module's documentation. One per open file of the device; usable
/// from any thread.
pub struct Allocator<'d> {
    dev: &'d Ruvm,
    cfg: Config,
    inner: Mutex<Inner>,
}

impl<'d> Allocator<'d> {
    /// An allocator over `dev` that holds nothing yet.
    pub fn new(dev: &'d Ruvm, cfg: Config) -> Self {
        Self {
            dev,
            cfg,
            inner: Mutex::new(Inner {
                small: Blocks::default(),
                large: Blocks::default(),
                segs: Vec::new(),
                streams: FastMap::default(),
                bins: FastMap::default(),
                binned: 0,
                event: None,
                events: FastMap::default(),
                stats: Stats::default(),
                status: None,
                generation: 0,
                arenas: Arenas::Unknown,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while the lock was held left the bookkeeping as it was: carry on.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A block of at least `len` bytes for work on `stream` (a stream handle of the device).
    /// `EINVAL` for 0 bytes, `ENOMEM` beyond [`MAX_REQUEST`]; a new segment's errors
    /// (`ENOMEM` at the file's quota or the memory cgroup's limit) otherwise, once idle
    /// segments were given back and no other stream's free could be taken.
    pub fn alloc(&self, len: u64, stream: u64) -> Result<Block, Errno> {
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        if len > MAX_REQUEST {
            return Err(Errno::ENOMEM);
        }
        let want = len.next_multiple_of(ROUND);
        let large = want > SMALL_MAX;
        let mut g = self.lock();
        let inner = &mut *g;
        let generation = inner.next_generation();
        let used = Use {
            asked: len,
            cached: false,
            generation,
        };
        // A binned free of exactly this length: this stream's, or one ready for anyone.
        for owner in [Owner::Stream(stream), Owner::Ready] {
            if let Some(r) = inner.unbin(owner, large, want) {
                let b = Block {
                    generation,
                    ..r.block
                };
                if inner.blocks(large).set_use(b.seg, b.offset, used) {
                    inner.stats.hits += 1;
                    inner.count_alloc(b.len, len);
                    return Ok(b);
                }
            }
        }
        // The bins given back first: the free blocks, merged, are what is searched.
        self.settle_bins(inner, None);
        // A hit is a request met from free blocks with no chunk made resident (counted once
        // the block is placed: a placement that populates is the kernel's, a miss).
        let found = self.find(inner, large, want, stream);
        let from_free = found.is_some();
        let found = match found {
            Some(f) => f,
            None => match self.new_segment(inner, large, want) {
                Ok(f) => f,
                Err(e) if e == Errno::ENOMEM || e == Errno::ENOSPC => {
                    // The kernel says no: the idle segments go back and it is asked again;
                    // then another stream's free is taken behind a wait for it (as a pool's
                    // internal dependencies: only when the memory cannot be had otherwise).
                    let _ = self.give_back(inner, 0);
                    match self.new_segment(inner, large, want) {
                        Ok(f) => f,
                        Err(again) => match self.take_behind_wait(inner, large, want, stream) {
                            Some(f) => f,
                            None => return Err(again),
                        },
                    }
                }
                Err(e) => return Err(e),
            },
        };
        // An arena's chunks the kernel will not give (its quota, the memory cgroup, the
        // reserve limit): another stream's free taken behind a wait, as for a segment.
        let misses = inner.stats.misses;
        let (found, got, from_free) = match self.place(inner, large, found, want, used) {
            Ok(got) => (found, got, from_free),
            Err(e) if e == Errno::ENOMEM || e == Errno::ENOSPC => {
                let Some(f) = self.take_behind_wait(inner, large, want, stream) else {
                    return Err(e);
                };
                (f, self.place(inner, large, f, want, used)?, true)
            }
            Err(e) => return Err(e),
        };
        if from_free && inner.stats.misses == misses {
            inner.stats.hits += 1;
        }
        let seg = inner.segment(found.seg)?;
        let block = Block {
            mem: seg.handle,
            offset: found.offset,
            len: got,
            addr: seg.addr(found.offset),
            seg: found.seg,
            large,
            generation,
        };
        inner.count_alloc(got, len);
        Ok(block)
    }

    /// A new segment for a request of `want` bytes (an arena where the module has sparse
    /// mems): its one free block.
    fn new_segment(&self, inner: &mut Inner, large: bool, want: u64) -> Result<Found, Errno> {
        if let Some(f) = self.new_arena(inner, large, want)? {
            return Ok(f);
        }
        let seg_len = if large {
            want.next_multiple_of(SEGMENT_UNIT)
        } else {
            SEGMENT_UNIT
        };
        let limit = self.cfg.reserve_limit.unwrap_or(u64::MAX);
        if inner.stats.reserved.saturating_add(seg_len) > limit {
            return Err(Errno::ENOMEM);
        }
        let seg = Segment::new(self.dev, seg_len, &self.cfg.gpus)?;
        let id32 = inner.add_segment(seg)?;
        inner.blocks(large).add_segment(id32, seg_len);
        let s = &mut inner.stats;
        s.reserved += seg_len;
        s.reserved_peak = s.reserved_peak.max(s.reserved);
        s.segments += 1;
        s.misses += 1;
        inner
            .blocks(large)
            .best_fit(Owner::Ready, want)
            .ok_or(Errno::ENOMEM)
    }

    /// A free block `stream` may take with no wait, in this order: its own, another stream's
    /// under the event rule, one ready for anyone, another stream's under the opportunistic
    /// rule (the freeing streams' completed points read from the status page, or with
    /// `STREAM_QUERY` where there is none). A rule whose system call fails does not apply.
    fn find(&self, inner: &mut Inner, large: bool, want: u64, stream: u64) -> Option<Found> {
        let me = Owner::Stream(stream);
        if let Some(f) = inner.blocks(large).best_fit(me, want) {
            return Some(f);
        }
        let others = inner.blocks(large).stream_owners(me);
        let reuse = self.cfg.reuse;
        // Another stream's free this one is ordered after, before a ready block: it is
        // resident, where a ready block may be an arena's untouched rest.
        if reuse.follow_event_dependencies {
            for &s in &others {
                let after = inner.points(stream).after.get(&s).copied().unwrap_or(0);
                if let Some(f) = inner.blocks(large).best_fit(Owner::Stream(s), want) {
                    if f.point <= after {
                        inner.stats.cross_stream += 1;
                        return Some(f);
                    }
                }
            }
        }
        if let Some(f) = inner.blocks(large).best_fit(Owner::Ready, want) {
            return Some(f);
        }
        if others.is_empty() {
            return None;
        }
        if reuse.allow_opportunistic {
            for &s in &others {
                if let Some(done) = self.completed(inner, s) {
                    inner.small.promote(s, done);
                    inner.large.promote(s, done);
                }
            }
            if let Some(f) = inner.blocks(large).best_fit(Owner::Ready, want) {
                inner.stats.cross_stream += 1;
                return Some(f);
            }
        }
        None
    }

    /// Another stream's free taken behind a wait for its point (`allow_internal_dependencies`):
    /// a `RECORD` of the allocator's event on the freeing stream, a `WAIT_EVENT` on `stream`.
    /// `None` if the rule is off, no such free fits, or a call fails.
    fn take_behind_wait(
        &self,
        inner: &mut Inner,
        large: bool,
        want: u64,
        stream: u64,
    ) -> Option<Found> {
        if !self.cfg.reuse.allow_internal_dependencies {
            return None;
        }
        let others = inner.blocks(large).stream_owners(Owner::Stream(stream));
        let f = others
            .iter()
            .filter_map(|&s| inner.blocks(large).best_fit(Owner::Stream(s), want))
            .min_by_key(|f| f.len)?;
        let Owner::Stream(s) = f.owner else {
            return Some(f);
        };
        self.order_after(inner, stream, s).ok()?;
        inner.stats.cross_stream += 1;
        inner.stats.waits_inserted += 1;
        Some(f)
    }

    /// Gives `block` back, ordered on `stream`: reusable by that stream at once, by others as
    /// [`Reuse`] allows once everything submitted to `stream` so far is complete. `EINVAL` for
    /// a block this allocator does not have in use (freed twice, an earlier allocation of the
    /// same place, or another allocator's).
    pub fn free(&self, block: Block, stream: u64) -> Result<(), Errno> {
        let mut g = self.lock();
        let inner = &mut *g;
        let seg = inner
            .segs
            .get(block.seg as usize)
            .and_then(Option::as_ref)
            .map(|s| s.handle);
        let used = inner.blocks(block.large).used(block.seg, block.offset);
        let asked = match used {
            Some((len, u))
                if seg == Some(block.mem)
                    && len == block.len
                    && !u.cached
                    && u.generation == block.generation =>
            {
                u.asked
            }
            _ => return Err(Errno::EINVAL),
        };
        let cached = Use {
            asked: 0,
            cached: true,
            generation: block.generation,
        };
        inner
            .blocks(block.large)
            .set_use(block.seg, block.offset, cached);
        let p = inner.points(stream);
        let (owner, point) = if p.submitted <= p.completed {
            (Owner::Ready, 0)
        } else {
            (Owner::Stream(stream), p.submitted)
        };
        inner.bin(
            owner,
            Recent {
                stream,
                point,
                block,
            },
        );
        let s = &mut inner.stats;
        s.allocated -= block.len;
        s.requested -= asked;
        Ok(())
    }

    /// Gives idle segments back until at most `keep` bytes are reserved (`cudaMemPoolTrimTo`);
    /// returns the bytes given back. Only frees known complete count as idle.
    pub fn trim(&self, keep: u64) -> Result<u64, Errno> {
        let mut g = self.lock();
        let inner = &mut *g;
        self.settle_bins(inner, None);
        self.give_back(inner, keep)
    }

    /// Gives idle segments back, the largest first, while more than `keep` is reserved. A
    /// segment whose release fails (its mem freed by hand) is gone from the allocator all the
    /// same; the first such error is returned after the rest are given back.
    fn give_back(&self, inner: &mut Inner, keep: u64) -> Result<u64, Errno> {
        if inner.stats.reserved <= keep {
            return Ok(0);
        }
        let mut given = self.release_free_chunks(inner, keep);
        let mut idle: Vec<(bool, u32, u64)> = Vec::new();
        for large in [false, true] {
            idle.extend(
                inner
                    .blocks(large)
                    .idle_segments()
                    .into_iter()
                    .map(|(s, l)| (large, s, l)),
            );
        }
        idle.sort_by_key(|&(_, s, l)| (std::cmp::Reverse(l), s));
        let mut failed = None;
        for (large, id, len) in idle {
            if inner.stats.reserved <= keep {
                break;
            }
            // An arena stays (its chunks went above): its reservation costs nothing.
            if inner.segment(id).is_ok_and(Segment::is_arena) {
                continue;
            }
            if !inner.blocks(large).remove_segment(id) {
                continue;
            }
            if let Some(seg) = inner.segs.get_mut(id as usize).and_then(Option::take) {
                if let Err(e) = seg.release_all(self.dev) {
                    failed.get_or_insert(e);
                }
            }
            inner.stats.reserved -= len;
            inner.stats.segments -= 1;
            inner.stats.released += 1;
            given += len;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(given),
        }
    }

    /// The statistics now.
    pub fn stats(&self) -> Stats {
        let g = self.lock();
        let (fs, fl) = g.small.free_bytes();
        let (ls, ll) = g.large.free_bytes();
        let binned = g.bins.values().flatten().map(|r| r.block.len);
        let (cached, longest) = binned.fold((0, 0), |(sum, max), l| (sum + l, max.max(l)));
        Stats {
            free: fs + ls + cached,
            largest_free: fl.max(ll).max(longest),
            streams_known: g.streams.len() as u64,
            events_known: g.events.len() as u64,
            ..g.stats
        }
    }

    /// Forgets the peaks: they restart from what is held now.
    pub fn reset_peaks(&self) {
        let mut g = self.lock();
        let s = &mut g.stats;
        s.reserved_peak = s.reserved;
        s.allocated_peak = s.allocated;
        s.requested_peak = s.requested;
    }
}

impl Inner {
    /// Holds `seg` under a new id (a slot freed when its segment went is used again).
    fn add_segment(&mut self, seg: Segment) -> Result<u32, Errno> {
        let id = match self.segs.iter().position(Option::is_none) {
            Some(i) => i,
            None => self.segs.len(),
        };
        let id32 = u32::try_from(id).map_err(|_| Errno::ENOMEM)?;
        if id == self.segs.len() {
            self.segs.push(Some(seg));
        } else {
            self.segs[id] = Some(seg);
        }
        Ok(id32)
    }

    fn segment(&self, id: u32) -> Result<&Segment, Errno> {
        self.segs
            .get(id as usize)
            .and_then(Option::as_ref)
            .ok_or(Errno::EINVAL)
    }

    fn segment_mut(&mut self, id: u32) -> Result<&mut Segment, Errno> {
        self.segs
            .get_mut(id as usize)
            .and_then(Option::as_mut)
            .ok_or(Errno::EINVAL)
    }

    /// The blocks of a class: with arenas, both classes are in one ([`arena`]).
    fn blocks(&mut self, large: bool) -> &mut Blocks {
        if large && self.arenas == Arenas::No {
            &mut self.large
        } else {
            &mut self.small
        }
    }

    fn points(&mut self, stream: u64) -> &mut StreamPoints {
        self.streams.entry(stream).or_default()
    }

    fn next_generation(&mut self) -> u32 {
        self.generation = self.generation.wrapping_add(1);
        self.generation
    }

    fn count_alloc(&mut self, got: u64, asked: u64) {
        let s = &mut self.stats;
        s.allocated += got;
        s.allocated_peak = s.allocated_peak.max(s.allocated);
        s.requested += asked;
        s.requested_peak = s.requested_peak.max(s.requested);
    }
}

impl Drop for Allocator<'_> {
    /// Every segment goes back to the kernel (blocks still in use included), and the
    /// allocator's event.
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        for seg in inner.segs.drain(..).flatten() {
            let _ = seg.release_all(self.dev);
        }
        if let Some(e) = inner.event.take() {
            let _ = self.dev.event_destroy(e);
        }
    }
}
