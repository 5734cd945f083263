// SPDX-License-Identifier: GPL-2.0

//! The blocks of one size class's segments: a good fit, split and coalesce, free blocks kept by
//! who may take them. Pure bookkeeping (no device), so it is tested on the host.
//!
//! Every byte of every segment is in exactly one block. A block is used, or free and owned:
//! [`Owner::Ready`] (anyone may take it: its last use is known complete) or
//! [`Owner::Stream`] (freed on that stream at a point not yet known complete: that stream may
//! take it at once, another only as the allocator's reuse rules allow). Two neighbouring free
//! blocks of the same owner are always one block: a free merges, a promotion merges.
//!
//! Each owner's free blocks are in two-level segregated lists (TLSF, as the pinned heaps' large
//! blocks, `heap/tlsf.rs`; the classes in `crate::sizeclass`): a request takes the shortest
//! that fits among the first few blocks of its own size class (whose blocks are within an
//! eighth of it), else the first block of the first class all of whose blocks fit it, else
//! walks its own class. Blocks are found
//! by (segment, offset) in a hash map, each knowing the block before it: every operation is a
//! few map probes and two bitmap scans. (The ordered trees this replaced cost about 7 us an
//! allocation and free under the guests' emulated CPU.)

use std::collections::BTreeMap;

use super::FastMap;
use crate::sizeclass::{class, class_at_least, shortest_fit, Map, FL, SL};

/// Who may take a free block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Owner {
    /// Anyone: the work that used it last is complete.
    Ready,
    /// The stream (its handle) it was freed on, until the free's point is complete.
    Stream(u64),
}

/// What the allocator keeps with a used block: the bytes asked for, and whether it is held
/// in the allocator's cache of recent frees (freed by its user, not yet given back here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Use {
    pub asked: u64,
    pub cached: bool,
    /// Which allocation of the block this is: a block handed out again gets a new one, so a
    /// stale copy of an earlier one is told apart.
    pub generation: u32,
}

/// A free block found for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    pub seg: u32,
    pub offset: u64,
    pub len: u64,
    pub owner: Owner,
    pub point: u64,
}

/// A block's place, (segment, offset) packed: the offset in the low 42 bits, the segment in
/// the 21 above (the allocator's offsets stay below 2^40, its segment ids are slots of a
/// vector of live segments).
type Key = u64;
const NONE: Key = u64::MAX;
const OFFSET_BITS: u32 = 42;
const SEG_BITS: u32 = 64 - OFFSET_BITS - 1;

fn key(seg: u32, offset: u64) -> Key {
    (u64::from(seg) << OFFSET_BITS) | offset
}

/// The key of (`seg`, `offset`), `None` for a place no block can have (a forged one).
fn checked_key(seg: u32, offset: u64) -> Option<Key> {
    (offset < 1 << OFFSET_BITS && seg < 1 << SEG_BITS).then(|| key(seg, offset))
}

fn unkey(k: Key) -> (u32, u64) {
    ((k >> OFFSET_BITS) as u32, k & ((1 << OFFSET_BITS) - 1))
}

/// One block: its length, the block before it (`NONE`: the segment's first), and if free its
/// owner, the stream point it was freed at (0 for [`Owner::Ready`]) and its list links; a used
/// block carries its user's figures ([`Use`]).
#[derive(Clone, Copy, Debug)]
struct Blk {
    len: u64,
    prev: Key,
    free: Option<(Owner, u64)>,
    next_free: Key,
    prev_free: Key,
    used: Use,
}

/// How many blocks of a request's own class [`Blocks::best_fit`] looks at first.
const OWN_CLASS_LOOK: usize = 8;

/// One owner's free blocks: a list per size class.
struct Lists {
    heads: [[Key; SL]; FL],
    map: Map,
    bytes: u64,
}

impl Lists {
    fn new() -> Self {
        Self {
            heads: [[NONE; SL]; FL],
            map: Map::default(),
            bytes: 0,
        }
    }
}

/// The blocks of a set of segments.
#[derive(Default)]
pub(crate) struct Blocks {
    all: FastMap<Key, Blk>,
    ready: Option<Box<Lists>>,
    streams: BTreeMap<u64, Box<Lists>>,
    /// Segment lengths.
    segs: BTreeMap<u32, u64>,
}

impl Blocks {
    fn lists(&self, owner: Owner) -> Option<&Lists> {
        match owner {
            Owner::Ready => self.ready.as_deref(),
            Owner::Stream(s) => self.streams.get(&s).map(|l| &**l),
        }
    }

    fn lists_mut(&mut self, owner: Owner) -> &mut Lists {
        match owner {
            Owner::Ready => self.ready.get_or_insert_with(|| Box::new(Lists::new())),
            Owner::Stream(s) => self
                .streams
                .entry(s)
                .or_insert_with(|| Box::new(Lists::new())),
        }
    }

    fn blk(&self, k: Key) -> Option<Blk> {
        self.all.get(&k).copied()
    }

    /// Lists the free block at `k` (its `free` set).
    fn list(&mut self, k: Key) {
        let Some(b) = self.blk(k) else { return };
        let Some((owner, _)) = b.free else { return };
        let (f, s) = class(b.len);
        let l = self.lists_mut(owner);
        let head = l.heads[f][s];
        l.heads[f][s] = k;
        l.map.set(f, s);
        l.bytes += b.len;
        if let Some(x) = self.all.get_mut(&k) {
            x.next_free = head;
            x.prev_free = NONE;
        }
        if let Some(h) = self.all.get_mut(&head) {
            h.prev_free = k;
        }
    }

    /// Takes the free block at `k` off its owner's lists (it stays in `all`, still free).
    fn unlist(&mut self, k: Key) {
        let Some(b) = self.blk(k) else { return };
        let Some((owner, _)) = b.free else { return };
        if let Some(n) = self.all.get_mut(&b.next_free) {
            n.prev_free = b.prev_free;
        }
        if let Some(p) = self.all.get_mut(&b.prev_free) {
            p.next_free = b.next_free;
        }
        let (f, s) = class(b.len);
        let l = self.lists_mut(owner);
        l.bytes -= b.len;
        if b.prev_free == NONE {
            l.heads[f][s] = b.next_free;
            if b.next_free == NONE {
                l.map.clear(f, s);
            }
        }
        if l.map.is_empty() {
            if let Owner::Stream(s) = owner {
                self.streams.remove(&s);
            }
        }
    }

    /// The block after the one at `k` in its segment, if any.
    fn after(&self, k: Key, len: u64) -> Option<Key> {
        let (seg, off) = unkey(k);
        let end = off + len;
        (end < *self.segs.get(&seg)?).then(|| key(seg, end))
    }

    /// Puts a block at `k` (`prev` the block before it), fixing the next block's back link.
    fn put(&mut self, k: Key, len: u64, prev: Key, free: Option<(Owner, u64)>, used: Use) {
        self.all.insert(
            k,
            Blk {
                len,
                prev,
                free,
                next_free: NONE,
                prev_free: NONE,
                used,
            },
        );
        if let Some(a) = self.after(k, len) {
            if let Some(b) = self.all.get_mut(&a) {
                b.prev = k;
            }
        }
        if free.is_some() {
            self.list(k);
        }
    }

    /// A new segment, one free ready block. (A segment id or length beyond what a key holds
    /// is the allocator's bug: refused, the segment is never used.)
    pub fn add_segment(&mut self, seg: u32, len: u64) {
        debug_assert!(!self.segs.contains_key(&seg) && len > 0);
        if checked_key(seg, len).is_none() || len == 0 {
            return;
        }
        self.segs.insert(seg, len);
        self.put(
            key(seg, 0),
            len,
            NONE,
            Some((Owner::Ready, 0)),
            Use::default(),
        );
    }

    /// Whether segment `seg` is one free ready block.
    fn idle(&self, seg: u32) -> bool {
        let Some(&len) = self.segs.get(&seg) else {
            return false;
        };
        self.blk(key(seg, 0))
            .is_some_and(|b| b.len == len && b.free == Some((Owner::Ready, 0)))
    }

    /// Removes a segment that is one free ready block; false (and nothing changes) otherwise.
    pub fn remove_segment(&mut self, seg: u32) -> bool {
        if !self.idle(seg) {
            return false;
        }
        let k = key(seg, 0);
        self.unlist(k);
        self.all.remove(&k);
        self.segs.remove(&seg);
        true
    }

    /// The segments that are one free ready block, with their lengths.
    pub fn idle_segments(&self) -> Vec<(u32, u64)> {
        self.segs
            .iter()
            .filter(|&(&seg, _)| self.idle(seg))
            .map(|(&s, &l)| (s, l))
            .collect()
    }

    fn found(&self, k: Key, owner: Owner) -> Option<Found> {
        let b = self.blk(k)?;
        let (seg, offset) = unkey(k);
        Some(Found {
            seg,
            offset,
            len: b.len,
            owner,
            point: b.free?.1,
        })
    }

    /// A good fit for `len` bytes among `owner`'s free blocks: the shortest that fits among
    /// the first [`OWN_CLASS_LOOK`] of `len`'s own class (whose blocks differ from it by at
    /// most an eighth), else the first block of the first class all of whose blocks fit, else
    /// any of its own class that fits.
    pub fn best_fit(&self, owner: Owner, len: u64) -> Option<Found> {
        let l = self.lists(owner)?;
        let len = len.max(1);
        let (f, s) = class(len);
        if let Some(k) = self.shortest_fit(l.heads[f][s], len, OWN_CLASS_LOOK) {
            return self.found(k, owner);
        }
        if let Some((f, s)) = class_at_least(len).and_then(|(f, s)| l.map.find(f, s)) {
            return self.found(l.heads[f][s], owner);
        }
        self.found(self.shortest_fit(l.heads[f][s], len, usize::MAX)?, owner)
    }

    /// The shortest block at least `len` long among the first `look` of the list from `head`.
    fn shortest_fit(&self, head: Key, len: u64, look: usize) -> Option<Key> {
        shortest_fit(head, len, look, |k| {
            self.blk(k).map(|b| (b.len, b.next_free))
        })
    }

    /// The owners other than `Ready` and `but` that hold free blocks, each once.
    pub fn stream_owners(&self, but: Owner) -> Vec<u64> {
        self.streams
            .keys()
            .copied()
            .filter(|&s| Owner::Stream(s) != but)
            .collect()
    }

    /// Takes `want` bytes of the free block `f` (as [`Blocks::best_fit`] found it): the block
    /// becomes used (with `used`), split when what is left is at least `min_split` (the rest
    /// stays free, its owner and point kept). Returns the used length (`want`, or the whole
    /// block).
    pub fn take(&mut self, f: Found, want: u64, min_split: u64, used: Use) -> u64 {
        debug_assert!(f.len >= want);
        let k = key(f.seg, f.offset);
        let Some(b) = self.blk(k) else { return 0 };
        self.unlist(k);
        let rest = b.len - want;
        if rest >= min_split.max(1) {
            self.put(k, want, b.prev, None, used);
            self.put(key(f.seg, f.offset + want), rest, k, b.free, Use::default());
            want
        } else {
            self.put(k, b.len, b.prev, None, used);
            b.len
        }
    }

    /// The length and [`Use`] of the used block at (`seg`, `offset`), if there is one.
    pub fn used(&self, seg: u32, offset: u64) -> Option<(u64, Use)> {
        match self.blk(checked_key(seg, offset)?) {
            Some(b) if b.free.is_none() => Some((b.len, b.used)),
            _ => None,
        }
    }

    /// Sets the [`Use`] of the used block at (`seg`, `offset`); false if there is none.
    pub fn set_use(&mut self, seg: u32, offset: u64, used: Use) -> bool {
        let Some(k) = checked_key(seg, offset) else {
            return false;
        };
        match self.all.get_mut(&k) {
            Some(b) if b.free.is_none() => {
                b.used = used;
                true
            }
            _ => false,
        }
    }

    /// Frees the used block at (`seg`, `offset`) to `owner` at `point`, merged with its free
    /// neighbours of the same owner (the later point kept). False if there is no such used
    /// block (nothing changes).
    pub fn give(&mut self, seg: u32, offset: u64, owner: Owner, point: u64) -> bool {
        if self.used(seg, offset).is_none() {
            return false;
        }
        self.put_merged(key(seg, offset), owner, point);
        true
    }

    /// Every free block of stream `s` freed at or before `upto` becomes ready (merged with
    /// ready neighbours). Returns the bytes made ready.
    pub fn promote(&mut self, s: u64, upto: u64) -> u64 {
        let Some(l) = self.streams.get(&s) else {
            return 0;
        };
        let mut theirs = Vec::new();
        for row in &l.heads {
            for &head in row {
                let mut k = head;
                while let Some(b) = self.blk(k) {
                    if b.free.is_some_and(|(_, p)| p <= upto) {
                        theirs.push(k);
                    }
                    k = b.next_free;
                }
            }
        }
        let mut bytes = 0;
        for k in theirs {
            // Only ready neighbours merge, so a collected block is still its stream's here; the
            // checks keep it so.
            let Some(b) = self.blk(k) else { continue };
            if b.free.map(|f| f.0) != Some(Owner::Stream(s)) {
                continue;
            }
            bytes += b.len;
            self.unlist(k);
            if let Some(x) = self.all.get_mut(&k) {
                x.free = None;
            }
            self.put_merged(k, Owner::Ready, 0);
        }
        bytes
    }

    /// Every free ready block, as (segment, offset, length).
    pub fn free_ready(&self) -> Vec<(u32, u64, u64)> {
        let mut v = Vec::new();
        if let Some(l) = self.ready.as_deref() {
            self.walk(l, |k, b| {
                let (seg, off) = unkey(k);
                v.push((seg, off, b.len));
            });
        }
        v
    }

    /// Free bytes in all, and the longest free block (of any owner).
    pub fn free_bytes(&self) -> (u64, u64) {
        let mut sum = 0;
        let mut longest = 0;
        for l in self.ready.iter().chain(self.streams.values()) {
            sum += l.bytes;
            // The longest is in the highest non-empty class.
            if let Some((f, s)) = l.map.highest() {
                let mut k = l.heads[f][s];
                while let Some(b) = self.blk(k) {
                    longest = longest.max(b.len);
                    k = b.next_free;
                }
            }
        }
        (sum, longest)
    }

    /// Calls `each` on every block of `l`'s lists.
    fn walk(&self, l: &Lists, mut each: impl FnMut(Key, &Blk)) {
        for row in &l.heads {
            for &head in row {
                let mut k = head;
                while let Some(b) = self.all.get(&k) {
                    each(k, b);
                    k = b.next_free;
                }
            }
        }
    }

    /// Makes the used (or just unlisted) block at `k` free for `owner` at `point`, merged with
    /// its free neighbours of the same owner.
    fn put_merged(&mut self, k: Key, owner: Owner, point: u64) {
        let Some(b) = self.blk(k) else { return };
        // A ready block's point means nothing: always 0.
        let mut point = if owner == Owner::Ready { 0 } else { point };
        let (mut start, mut len, mut prev) = (k, b.len, b.prev);
        if let Some(a) = self.after(k, b.len) {
            if let Some(n) = self.blk(a) {
                if let Some((o, p)) = n.free {
                    if o == owner {
                        self.unlist(a);
                        self.all.remove(&a);
                        len += n.len;
                        point = point.max(p);
                    }
                }
            }
        }
        if let Some(pb) = self.blk(b.prev) {
            if let Some((o, p)) = pb.free {
                if o == owner {
                    self.unlist(b.prev);
                    self.all.remove(&k);
                    start = b.prev;
                    len += pb.len;
                    prev = pb.prev;
                    point = point.max(p);
                }
            }
        }
        self.put(start, len, prev, Some((owner, point)), Use::default());
    }

    /// Checks the invariants: the blocks tile every segment, each knows the one before it; the
    /// lists hold exactly the free blocks, each under its owner; no two neighbouring free
    /// blocks have the same owner.
    #[cfg(test)]
    pub fn check(&self) {
        let mut free = std::collections::BTreeSet::new();
        let mut count = 0;
        for (&seg, &len) in &self.segs {
            let mut at = 0;
            let mut prev = NONE;
            let mut prev_owner: Option<Owner> = None;
            while at < len {
                let k = key(seg, at);
                let b = self
                    .blk(k)
                    .unwrap_or_else(|| panic!("no block at {seg}:{at:#x}"));
                assert_eq!(b.prev, prev, "the block before {seg}:{at:#x}");
                let owner = b.free.map(|f| f.0);
                if let (Some(a), Some(o)) = (prev_owner, owner) {
                    assert_ne!(a, o, "two neighbours of one owner at {seg}:{at:#x}");
                }
                if let Some((o, _)) = b.free {
                    free.insert((o, k));
                }
                prev_owner = owner;
                prev = k;
                at += b.len;
                count += 1;
            }
            assert_eq!(at, len, "segment {seg} not tiled");
        }
        assert_eq!(count, self.all.len(), "blocks outside every segment");
        let mut listed = std::collections::BTreeSet::new();
        let mut owners: Vec<(Owner, &Lists)> =
            self.ready.iter().map(|l| (Owner::Ready, &**l)).collect();
        owners.extend(self.streams.iter().map(|(&s, l)| (Owner::Stream(s), &**l)));
        for (o, l) in owners {
            let mut bytes = 0;
            self.walk(l, |k, b| {
                assert_eq!(b.free.map(|f| f.0), Some(o), "{k:#x} listed under {o:?}");
                bytes += b.len;
                listed.insert((o, k));
            });
            assert_eq!(bytes, l.bytes, "{o:?}'s bytes");
        }
        assert_eq!(free, listed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_splits_and_coalesces() {
        let mut b = Blocks::default();
        b.add_segment(1, 1000);
        let f = b.best_fit(Owner::Ready, 100).unwrap();
        assert_eq!((f.seg, f.offset, f.len), (1, 0, 1000));
        assert_eq!(b.take(f, 100, 10, Use::default()), 100);
        let f = b.best_fit(Owner::Ready, 300).unwrap();
        assert_eq!((f.offset, f.len), (100, 900));
        assert_eq!(b.take(f, 300, 10, Use::default()), 300);
        b.check();
        // Freed on stream 7: only stream 7 finds it.
        assert!(b.give(1, 0, Owner::Stream(7), 5));
        assert!(
            !b.give(1, 0, Owner::Stream(7), 5),
            "a double free is refused"
        );
        assert_eq!(b.best_fit(Owner::Ready, 100).map(|f| f.offset), Some(400));
        assert_eq!(b.best_fit(Owner::Stream(7), 100).map(|f| f.point), Some(5));
        assert_eq!(b.stream_owners(Owner::Ready), vec![7]);
        assert!(b.stream_owners(Owner::Stream(7)).is_empty());
        // Promoted at point 4: not yet; at 5: ready, merged with nothing (the neighbour is used).
        assert_eq!(b.promote(7, 4), 0);
        assert_eq!(b.promote(7, 5), 100);
        b.check();
        // The middle block freed ready: all three merge into the whole segment.
        assert!(b.give(1, 100, Owner::Ready, 0));
        b.check();
        assert_eq!(b.idle_segments(), vec![(1, 1000)]);
        assert!(b.remove_segment(1));
        assert_eq!(b.free_bytes(), (0, 0));
    }

    #[test]
    fn a_hole_of_the_requests_own_class_is_taken_before_a_longer_class() {
        let mut b = Blocks::default();
        b.add_segment(0, 1 << 40);
        b.add_segment(1, 8704);
        // 8704 is in the class of 8192..9216: a search of the classes above it alone would
        // take the 1 TiB block.
        assert_eq!(b.best_fit(Owner::Ready, 8704).map(|f| f.seg), Some(1));
        assert_eq!(b.best_fit(Owner::Ready, 8705).map(|f| f.seg), Some(0));
    }

    #[test]
    fn a_forged_place_is_no_block() {
        let mut b = Blocks::default();
        b.add_segment(0, 4096);
        assert_eq!(b.used(1 << 21, 0), None);
        assert_eq!(b.used(0, 1 << 50), None);
        assert!(!b.set_use(u32::MAX, 0, Use::default()));
        assert!(!b.give(u32::MAX, u64::MAX, Owner::Ready, 0));
        b.check();
    }

    #[test]
    fn a_small_rest_is_not_split_off() {
        let mut b = Blocks::default();
        b.add_segment(0, 512);
        let f = b.best_fit(Owner::Ready, 500).unwrap();
        assert_eq!(b.take(f, 500, 64, Use::default()), 512);
        assert_eq!(b.used(0, 0).map(|u| u.0), Some(512));
        assert!(!b.remove_segment(0), "a segment in use stays");
    }

    #[test]
    fn best_fit_takes_the_shortest_that_fits() {
        let mut b = Blocks::default();
        for (seg, len) in [(0, 4096), (1, 1024), (2, 2048)] {
            b.add_segment(seg, len);
        }
        assert_eq!(b.best_fit(Owner::Ready, 1500).map(|f| f.seg), Some(2));
        assert_eq!(b.best_fit(Owner::Ready, 1024).map(|f| f.seg), Some(1));
        assert_eq!(b.best_fit(Owner::Ready, 5000), None);
        assert_eq!(b.best_fit(Owner::Stream(1), 1), None);
    }

    /// A random walk of takes, gives and promotions keeps every invariant, and frees
    /// everything back to whole segments.
    #[test]
    fn random_walk_keeps_the_invariants() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut b = Blocks::default();
        for seg in 0..4 {
            b.add_segment(seg, 1 << 16);
        }
        let mut used: Vec<(u32, u64)> = Vec::new();
        for step in 0..20_000u64 {
            match rnd(3) {
                0 => {
                    let want = 16 * (1 + rnd(256));
                    let owner = if rnd(2) == 0 {
                        Owner::Ready
                    } else {
                        Owner::Stream(rnd(3))
                    };
                    if let Some(f) = b.best_fit(owner, want) {
                        b.take(f, want, 16, Use::default());
                        used.push((f.seg, f.offset));
                    }
                }
                1 if !used.is_empty() => {
                    let i = rnd(used.len() as u64) as usize;
                    let (seg, off) = used.swap_remove(i);
                    let owner = if rnd(2) == 0 {
                        Owner::Ready
                    } else {
                        Owner::Stream(rnd(3))
                    };
                    assert!(b.give(seg, off, owner, step));
                }
                _ => {
                    b.promote(rnd(3), step.saturating_sub(rnd(50)));
                }
            }
            if step % 1000 == 0 {
                b.check();
            }
        }
        for (seg, off) in used {
            assert!(b.give(seg, off, Owner::Ready, 0));
        }
        for s in 0..3 {
            b.promote(s, u64::MAX);
        }
        b.check();
        assert_eq!(b.idle_segments().len(), 4);
    }
}
