// SPDX-License-Identifier: GPL-2.0

//! Two-level segregated fit (TLSF, Masmano et al.; the classes in `crate::sizeclass`) over a
//! range of units: the large blocks' index. Every operation is a few array reads and writes
//! and two bitmap scans (the per-unit array grows as blocks reach further): under the guests'
//! emulated CPU a best-fit tree cost about 7 us an allocation and free, this under 1. A
//! request takes the shortest that fits among the first few of its own class (whose blocks are
//! within an eighth of it), else the first free block of the first class whose every block
//! fits it; a freed block merges with free neighbours at once, so the
//! free space of a range freed whole is one block again. Pure bookkeeping (no device), tested
//! on the host.

use crate::sizeclass::{class, class_at_least, shortest_fit, Map, FL, SL};

/// No block (an empty list, the first block's predecessor).
const NONE: u32 = u32::MAX;

/// How many blocks of a request's own class an allocation looks at first.
const OWN_CLASS_LOOK: usize = 8;

/// What is kept of one unit: the block starting there, if one does.
#[derive(Clone, Copy)]
struct Unit {
    /// The length of the block starting here (0: not a block's start).
    len: u32,
    /// The start of the block before it (`NONE`: the first).
    prev: u32,
    /// The free lists' links, while the block is free.
    next_free: u32,
    prev_free: u32,
    free: bool,
}

const EMPTY: Unit = Unit {
    len: 0,
    prev: NONE,
    next_free: NONE,
    prev_free: NONE,
    free: false,
};

/// The blocks of a range of `units` units. What is kept per unit grows with the highest block
/// start made (a range of many units costs nothing until blocks reach there).
pub(super) struct Tlsf {
    at: Vec<Unit>,
    units: u32,
    heads: [[u32; SL]; FL],
    map: Map,
}

impl Tlsf {
    /// `units` units, one free block (none if 0).
    pub(super) fn new(units: u32) -> Self {
        let mut t = Self {
            at: Vec::new(),
            units,
            heads: [[NONE; SL]; FL],
            map: Map::default(),
        };
        if units > 0 {
            t.unit(0).len = units;
            t.insert(0);
        }
        t
    }

    /// Unit `i` as kept (an empty one past what is kept).
    fn get(&self, i: u32) -> Unit {
        self.at.get(i as usize).copied().unwrap_or(EMPTY)
    }

    /// Unit `i` (below `units`), for a change.
    fn unit(&mut self, i: u32) -> &mut Unit {
        let i = i as usize;
        if i >= self.at.len() {
            self.at.resize(i + 1, EMPTY);
        }
        &mut self.at[i]
    }

    /// Lists the free block at `at`.
    fn insert(&mut self, at: u32) {
        let (f, s) = class(u64::from(self.get(at).len));
        let head = self.heads[f][s];
        let u = self.unit(at);
        u.free = true;
        u.next_free = head;
        u.prev_free = NONE;
        if head != NONE {
            self.unit(head).prev_free = at;
        }
        self.heads[f][s] = at;
        self.map.set(f, s);
    }

    /// Takes the free block at `at` off its list.
    fn unlist(&mut self, at: u32) {
        let u = self.get(at);
        let (f, s) = class(u64::from(u.len));
        if u.next_free != NONE {
            self.unit(u.next_free).prev_free = u.prev_free;
        }
        if u.prev_free != NONE {
            self.unit(u.prev_free).next_free = u.next_free;
        } else {
            self.heads[f][s] = u.next_free;
            if u.next_free == NONE {
                self.map.clear(f, s);
            }
        }
        self.unit(at).free = false;
    }

    /// A block of `want` (> 0) units: its first unit, `None` if no free block fits.
    pub(super) fn alloc(&mut self, want: u32) -> Option<u32> {
        if want == 0 {
            return None;
        }
        // The shortest fit among the first few of its own class (within an eighth of it), else
        // the first block of the first class all of whose blocks fit, else any of its own
        // class that fits.
        let at = self
            .fit_in_class(want, OWN_CLASS_LOOK)
            .or_else(|| {
                class_at_least(u64::from(want))
                    .and_then(|(f, s)| self.map.find(f, s))
                    .map(|(f, s)| self.heads[f][s])
            })
            .or_else(|| self.fit_in_class(want, usize::MAX))?;
        let len = self.get(at).len;
        self.unlist(at);
        if len > want {
            let rest = at + want;
            self.unit(at).len = want;
            let r = self.unit(rest);
            r.len = len - want;
            r.prev = at;
            if let Some(after) = self.after(rest) {
                self.unit(after).prev = rest;
            }
            self.insert(rest);
        }
        Some(at)
    }

    /// The shortest free block of `want`'s own class at least `want` long, among the first
    /// `look` of its list.
    fn fit_in_class(&self, want: u32, look: usize) -> Option<u32> {
        let (f, s) = class(u64::from(want));
        let head = self.heads[f][s];
        let block = |at: u32| {
            let u = self.get(at);
            (at != NONE).then_some((u64::from(u.len), u.next_free))
        };
        shortest_fit(head, u64::from(want), look, block)
    }

    /// The block after the one at `at`, if any.
    fn after(&self, at: u32) -> Option<u32> {
        let next = at + self.get(at).len;
        (next < self.units).then_some(next)
    }

    /// The length of the block in use at `at`.
    pub(super) fn used(&self, at: u32) -> Option<u32> {
        let u = self.get(at);
        (u.len > 0 && !u.free).then_some(u.len)
    }

    /// Frees the block in use at `at`, merged with its free neighbours: the free block it is
    /// now part of (start, length); `None` (nothing changes) if no block is in use there.
    pub(super) fn free(&mut self, at: u32) -> Option<(u32, u32)> {
        let (mut start, mut len) = (at, self.used(at)?);
        if let Some(next) = self.after(at) {
            if self.get(next).free {
                self.unlist(next);
                len += self.get(next).len;
                self.unit(next).len = 0;
            }
        }
        let p = self.get(at).prev;
        if p != NONE && self.get(p).free {
            self.unlist(p);
            self.unit(at).len = 0;
            start = p;
            len += self.get(p).len;
        }
        self.unit(start).len = len;
        if let Some(after) = self.after(start) {
            self.unit(after).prev = start;
        }
        self.insert(start);
        Some((start, len))
    }

    /// Every free block, as (start, length).
    pub(super) fn free_blocks(&self) -> Vec<(u32, u32)> {
        let mut v = Vec::new();
        for row in &self.heads {
            for &head in row {
                let mut at = head;
                while at != NONE {
                    let u = self.get(at);
                    v.push((at, u.len));
                    at = u.next_free;
                }
            }
        }
        v
    }

    /// Checks the invariants: the blocks tile the range, each knows its predecessor, no two
    /// free blocks are neighbours, and the lists hold exactly the free blocks.
    #[cfg(test)]
    fn check(&self) {
        let mut at = 0;
        let mut prev = NONE;
        let mut free = Vec::new();
        while at < self.units {
            let u = self.get(at);
            assert!(u.len > 0, "no block at {at}");
            assert!(at == 0 || u.prev == prev, "block {at}'s predecessor");
            if u.free {
                assert!(
                    prev == NONE || !self.get(prev).free,
                    "free neighbours at {at}"
                );
                free.push((at, u.len));
            }
            prev = at;
            at += u.len;
        }
        assert_eq!(at, self.units);
        let mut listed = self.free_blocks();
        listed.sort_unstable();
        assert_eq!(listed, free);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_whole_is_one_block_again() {
        let mut t = Tlsf::new(1000);
        let a: Vec<u32> = (1..20).map(|n| t.alloc(n).unwrap()).collect();
        t.check();
        for (i, &x) in a.iter().enumerate().rev() {
            if i % 2 == 0 {
                t.free(x).unwrap();
            }
        }
        for (i, &x) in a.iter().enumerate() {
            if i % 2 == 1 {
                t.free(x).unwrap();
            }
            t.check();
        }
        assert_eq!(t.free_blocks(), vec![(0, 1000)]);
        assert_eq!(t.free(a[0]), None, "a block freed twice");
    }

    #[test]
    fn a_range_of_many_units_keeps_only_what_blocks_reach() {
        let mut t = Tlsf::new(u32::MAX);
        let a = t.alloc(1000).unwrap();
        let b = t.alloc(5).unwrap();
        assert!(t.at.len() <= 1006, "{} units kept", t.at.len());
        t.free(a).unwrap();
        t.free(b).unwrap();
        assert_eq!(t.free_blocks(), vec![(0, u32::MAX)]);
    }

    #[test]
    fn a_fit_within_its_class_is_found() {
        let mut t = Tlsf::new(100);
        assert_eq!(t.alloc(17), Some(0));
        assert_eq!(t.alloc(83), Some(17), "83 units free, 83 asked");
        t.check();
    }

    #[test]
    fn full_and_too_long_are_refused() {
        let mut t = Tlsf::new(64);
        assert_eq!(t.alloc(65), None);
        assert_eq!(t.alloc(64), Some(0));
        assert_eq!(t.alloc(1), None);
        assert_eq!(t.used(0), Some(64));
        assert_eq!(t.free(0), Some((0, 64)));
        assert_eq!(t.alloc(0), None);
    }

    #[test]
    fn random_walk_keeps_the_invariants() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut t = Tlsf::new(4096);
        let mut live: Vec<(u32, u32)> = Vec::new();
        for step in 0..20_000 {
            if next() % 2 == 0 || live.is_empty() {
                let want = 1 + (next() % 300) as u32;
                if let Some(at) = t.alloc(want) {
                    assert!(live.iter().all(|&(s, l)| at + want <= s || s + l <= at));
                    live.push((at, want));
                }
            } else {
                let (at, _) = live.swap_remove((next() % live.len() as u64) as usize);
                t.free(at).unwrap();
            }
            if step % 97 == 0 {
                t.check();
            }
        }
        for (at, _) in live {
            t.free(at).unwrap();
        }
        t.check();
        assert_eq!(t.free_blocks(), vec![(0, 4096)]);
    }
}
