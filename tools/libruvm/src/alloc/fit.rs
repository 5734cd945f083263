// SPDX-License-Identifier: GPL-2.0

//! The blocks of one size class's segments: best fit, split and coalesce, free blocks kept by
//! who may take them. Pure bookkeeping (no device), so it is tested on the host.
//!
//! Every byte of every segment is in exactly one block. A block is used, or free and owned:
//! [`Owner::Ready`] (anyone may take it: its last use is known complete) or
//! [`Owner::Stream`] (freed on that stream at a point not yet known complete: that stream may
//! take it at once, another only as the allocator's reuse rules allow). Two neighbouring free
//! blocks of the same owner are always one block: a free merges, a promotion merges.

use std::collections::{BTreeMap, BTreeSet};

/// Who may take a free block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Owner {
    /// Anyone: the work that used it last is complete.
    Ready,
    /// The stream (its handle) it was freed on, until the free's point is complete.
    Stream(u64),
}

/// One block: its length, and if free, its owner and the stream point it was freed at (0 for
/// [`Owner::Ready`]). A used block carries its user's figures ([`Use`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Blk {
    len: u64,
    free: Option<(Owner, u64)>,
    used: Use,
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

/// The blocks of a set of segments.
#[derive(Default)]
pub(crate) struct Blocks {
    /// Every block, by (segment, offset).
    all: BTreeMap<(u32, u64), Blk>,
    /// The free blocks, by (owner, length, segment, offset): best fit is the first at or after
    /// (owner, wanted length).
    free: BTreeSet<(Owner, u64, u32, u64)>,
    /// Segment lengths.
    segs: BTreeMap<u32, u64>,
}

impl Blocks {
    /// A new segment, one free ready block.
    pub fn add_segment(&mut self, seg: u32, len: u64) {
        debug_assert!(!self.segs.contains_key(&seg) && len > 0);
        self.segs.insert(seg, len);
        self.put(seg, 0, len, Some((Owner::Ready, 0)));
    }

    /// Removes a segment that is one free ready block; false (and nothing changes) otherwise.
    pub fn remove_segment(&mut self, seg: u32) -> bool {
        let Some(&len) = self.segs.get(&seg) else {
            return false;
        };
        match self.all.get(&(seg, 0)) {
            Some(b) if b.len == len && b.free == Some((Owner::Ready, 0)) => {
                self.unput(seg, 0);
                self.segs.remove(&seg);
                true
            }
            _ => false,
        }
    }

    /// The segments that are one free ready block, with their lengths.
    pub fn idle_segments(&self) -> Vec<(u32, u64)> {
        self.segs
            .iter()
            .filter(|&(&seg, &len)| {
                self.all
                    .get(&(seg, 0))
                    .is_some_and(|b| b.len == len && b.free == Some((Owner::Ready, 0)))
            })
            .map(|(&s, &l)| (s, l))
            .collect()
    }

    /// The best fit for `len` bytes among `owner`'s free blocks: the shortest at least that
    /// long (the lowest segment and offset among equals).
    pub fn best_fit(&self, owner: Owner, len: u64) -> Option<Found> {
        let &(o, l, seg, offset) = self.free.range((owner, len, 0, 0)..).next()?;
        if o != owner {
            return None;
        }
        let point = self.all.get(&(seg, offset))?.free?.1;
        Some(Found {
            seg,
            offset,
            len: l,
            owner,
            point,
        })
    }

    /// The owners other than `Ready` and `but` that hold free blocks, each once.
    pub fn stream_owners(&self, but: Owner) -> Vec<u64> {
        let mut v = Vec::new();
        let mut from = Owner::Stream(0);
        while let Some(&(o, ..)) = self.free.range((from, 0, 0, 0)..).next() {
            let Owner::Stream(s) = o else { break };
            if o != but {
                v.push(s);
            }
            match s.checked_add(1) {
                Some(n) => from = Owner::Stream(n),
                None => break,
            }
        }
        v
    }

    /// Takes `want` bytes of the free block `f` (as [`Blocks::best_fit`] found it): the block
    /// becomes used (with `used`), split when what is left is at least `min_split` (the rest
    /// stays free, its owner and point kept). Returns the used length (`want`, or the whole
    /// block).
    pub fn take(&mut self, f: Found, want: u64, min_split: u64, used: Use) -> u64 {
        debug_assert!(f.len >= want);
        self.unput(f.seg, f.offset);
        let rest = f.len - want;
        if rest >= min_split.max(1) {
            self.put_used(f.seg, f.offset, want, used);
            self.put(f.seg, f.offset + want, rest, Some((f.owner, f.point)));
            want
        } else {
            self.put_used(f.seg, f.offset, f.len, used);
            f.len
        }
    }

    /// The length and [`Use`] of the used block at (`seg`, `offset`), if there is one.
    pub fn used(&self, seg: u32, offset: u64) -> Option<(u64, Use)> {
        match self.all.get(&(seg, offset)) {
            Some(b) if b.free.is_none() => Some((b.len, b.used)),
            _ => None,
        }
    }

    /// Sets the [`Use`] of the used block at (`seg`, `offset`); false if there is none.
    pub fn set_use(&mut self, seg: u32, offset: u64, used: Use) -> bool {
        match self.all.get_mut(&(seg, offset)) {
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
        let Some((len, _)) = self.used(seg, offset) else {
            return false;
        };
        self.unput(seg, offset);
        self.put_merged(seg, offset, len, owner, point);
        true
    }

    /// Every free block of stream `s` freed at or before `upto` becomes ready (merged with
    /// ready neighbours). Returns the bytes made ready.
    pub fn promote(&mut self, s: u64, upto: u64) -> u64 {
        let owner = Owner::Stream(s);
        let theirs: Vec<(u32, u64, u64)> = self
            .free
            .range((owner, 0, 0, 0)..)
            .take_while(|e| e.0 == owner)
            .map(|&(_, l, seg, off)| (seg, off, l))
            .collect();
        let mut bytes = 0;
        for (seg, off, len) in theirs {
            let Some(&Blk {
                free: Some((_, point)),
                ..
            }) = self.all.get(&(seg, off))
            else {
                continue;
            };
            if point <= upto {
                self.unput(seg, off);
                self.put_merged(seg, off, len, Owner::Ready, 0);
                bytes += len;
            }
        }
        bytes
    }

    /// Every free ready block, as (segment, offset, length).
    pub fn free_ready(&self) -> Vec<(u32, u64, u64)> {
        self.free
            .range((Owner::Ready, 0, 0, 0)..)
            .take_while(|e| e.0 == Owner::Ready)
            .map(|&(_, l, seg, off)| (seg, off, l))
            .collect()
    }

    /// Free bytes in all, and the longest free block (of any owner).
    pub fn free_bytes(&self) -> (u64, u64) {
        self.free
            .iter()
            .fold((0, 0), |(sum, max), &(_, l, ..)| (sum + l, max.max(l)))
    }

    /// Puts a free block, merging it with free neighbours of the same owner.
    fn put_merged(&mut self, seg: u32, mut offset: u64, mut len: u64, owner: Owner, point: u64) {
        // A ready block's point means nothing: always 0.
        let mut point = if owner == Owner::Ready { 0 } else { point };
        if let Some((&(s, o), &b)) = self.all.range(..(seg, offset)).next_back() {
            if let (true, Some((bo, bp))) = (s == seg && o + b.len == offset, b.free) {
                if bo == owner {
                    self.unput(s, o);
                    offset = o;
                    len += b.len;
                    point = point.max(bp);
                }
            }
        }
        if let Some(&b) = self.all.get(&(seg, offset + len)) {
            if let Some((bo, bp)) = b.free {
                if bo == owner {
                    self.unput(seg, offset + len);
                    len += b.len;
                    point = point.max(bp);
                }
            }
        }
        self.put(seg, offset, len, Some((owner, point)));
    }

    fn put(&mut self, seg: u32, offset: u64, len: u64, free: Option<(Owner, u64)>) {
        if let Some((owner, _)) = free {
            self.free.insert((owner, len, seg, offset));
        }
        let used = Use::default();
        self.all.insert((seg, offset), Blk { len, free, used });
    }

    fn put_used(&mut self, seg: u32, offset: u64, len: u64, used: Use) {
        self.all.insert(
            (seg, offset),
            Blk {
                len,
                free: None,
                used,
            },
        );
    }

    fn unput(&mut self, seg: u32, offset: u64) {
        if let Some(b) = self.all.remove(&(seg, offset)) {
            if let Some((owner, _)) = b.free {
                self.free.remove(&(owner, b.len, seg, offset));
            }
        }
    }

    /// Checks the invariants: the blocks tile every segment; the free index is exactly the
    /// free blocks; no two neighbouring free blocks have the same owner.
    #[cfg(test)]
    pub fn check(&self) {
        let mut free = BTreeSet::new();
        for (&seg, &len) in &self.segs {
            let mut at = 0;
            let mut prev: Option<Owner> = None;
            for (&(s, off), b) in self.all.range((seg, 0)..(seg + 1, 0)) {
                assert_eq!((s, off), (seg, at), "a gap or an overlap");
                let owner = b.free.map(|f| f.0);
                if let (Some(a), Some(o)) = (prev, owner) {
                    assert_ne!(a, o, "two neighbours of one owner at {seg}:{off:#x}");
                }
                if let Some((o, _)) = b.free {
                    free.insert((o, b.len, s, off));
                }
                prev = owner;
                at += b.len;
            }
            assert_eq!(at, len, "segment {seg} not tiled");
        }
        assert_eq!(free, self.free);
        assert_eq!(
            self.all.len(),
            self.all
                .keys()
                .filter(|k| self.segs.contains_key(&k.0))
                .count()
        );
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
