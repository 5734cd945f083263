// SPDX-License-Identifier: GPL-2.0

//! Host tests of the PMM's chunk tree (`rust/gpu/chunks.rs`, compiled from the module's own
//! source): every chunk handed out is checked against a model of what is held, for its
//! alignment, its overlap, and its place (lazy split, lowest address first); frees merge back
//! eagerly; wrong frees change nothing.

mod common;

#[path = "../../../rust/gpu/chunks.rs"]
mod chunks;

use std::collections::BTreeMap;

use chunks::{ChunkTree, Root, RootSet, ZeroSlots, MID, ROOT, SMALL};
use common::Rng;

const K: u64 = 1024;

/// The module uses the kernel's bitmaps; here, a vector of flags.
struct Flags(Vec<bool>);

impl RootSet for Flags {
    fn put(&mut self, r: usize, on: bool) {
        self.0[r] = on;
    }

    fn first(&self) -> Option<usize> {
        self.0.iter().position(|&b| b)
    }
}

type Tree = ChunkTree<Vec<Root>, Flags>;

fn tree(roots: usize) -> Tree {
    let sets = [0; 3].map(|_| Flags(vec![false; roots]));
    ChunkTree::new(vec![Root::default(); roots], sets).expect("a tree")
}

/// What is held: chunk address to size.
#[derive(Default)]
struct Model {
    held: BTreeMap<u64, u64>,
}

impl Model {
    /// Whether `[at, at + len)` holds any chunk.
    fn busy(&self, at: u64, len: u64) -> bool {
        // Chunks are at most a root long, so one starting before `at - ROOT` cannot reach it.
        self.held
            .range(at.saturating_sub(ROOT)..at + len)
            .any(|(&p, &s)| p < at + len && p + s > at)
    }

    fn root_used(&self, r: u64) -> bool {
        self.busy(r * ROOT, ROOT)
    }

    /// A 64 KiB slot split into 4 KiB chunks (it holds one).
    fn slot_split(&self, at: u64) -> bool {
        self.held.range(at..at + MID).any(|(_, &s)| s == SMALL)
    }

    /// Where the tree must put a chunk of `size` among `roots` roots: the lowest address in
    /// the first of its preferred places that has room.
    fn expect(&self, roots: u64, size: u64) -> Option<u64> {
        let free_root = (0..roots).find(|&r| !self.root_used(r)).map(|r| r * ROOT);
        // The lowest free 64 KiB slot of a used root.
        let used_slot = (0..roots)
            .filter(|&r| self.root_used(r))
            .flat_map(|r| (0..ROOT / MID).map(move |s| r * ROOT + s * MID))
            .find(|&at| !self.busy(at, MID));
        match size {
            ROOT => free_root,
            MID => used_slot.or(free_root),
            _ => {
                let in_split = (0..roots * ROOT / MID)
                    .map(|s| s * MID)
                    .filter(|&at| self.slot_split(at))
                    .flat_map(|at| (0..MID / SMALL).map(move |c| at + c * SMALL))
                    .find(|&at| !self.busy(at, SMALL));
                in_split.or(used_slot).or(free_root)
            }
        }
    }

    fn bytes(&self) -> u64 {
        self.held.values().sum()
    }
}

fn check_roots(t: &Tree, m: &Model, what: &str) {
    for r in 0..t.roots() {
        let used = m.root_used(r as u64);
        let whole = m.held.get(&(r as u64 * ROOT)) == Some(&ROOT);
        assert_eq!(t.root_state(r), (used, used && !whole), "{what}: root {r}");
    }
}

#[test]
fn zero_slots_follow_what_came_back_unwritten() {
    // New storage: nothing known zero.
    let mut z = ZeroSlots::default();
    assert!(!z.take(MID, MID));
    // A 64 KiB chunk back unwritten: its slot (and only it) is known zero, once.
    z.put_back(MID, MID);
    assert!(!z.take(0, MID));
    assert!(!z.take(2 * MID, MID));
    assert!(z.take(MID, MID));
    assert!(!z.take(MID, MID));
    // A 4 KiB chunk in a known-zero slot is zero, and takes the slot's mark with it; back, it
    // marks nothing (its slot's other chunks may have been written).
    z.put_back(3 * MID, MID);
    assert!(z.take(3 * MID + 5 * SMALL, SMALL));
    assert!(!z.take(3 * MID, SMALL));
    z.put_back(3 * MID + 5 * SMALL, SMALL);
    assert!(!z.take(3 * MID, MID));
    // A 2 MiB chunk is zero only if every slot is; back unwritten, every slot is.
    let mut z = ZeroSlots::default();
    for slot in 0..31 {
        z.put_back(slot * MID, MID);
    }
    assert!(!z.take(ROOT, ROOT));
    let mut z = ZeroSlots::default();
    z.put_back(ROOT, ROOT);
    assert!(z.take(ROOT + 31 * MID, MID));
    assert!(!z.take(0, ROOT));
    z.put_back(0, ROOT);
    assert!(z.take(0, ROOT));
    // A size the tree does not have is never zero and marks nothing.
    z.put_back(0, 2 * SMALL);
    assert!(!z.take(0, 2 * SMALL));
    assert!(!z.take(0, MID));
}

#[test]
fn a_root_splits_once_into_each_size_and_merges_back() {
    let mut t = tree(2);
    assert_eq!(t.avail(), 2 * ROOT);
    // The first 4 KiB chunk splits root 0 and its first slot.
    assert_eq!(t.alloc(SMALL), Some(0));
    assert_eq!(t.root_state(0), (true, true));
    // A 64 KiB chunk takes the next slot of the split root, not a free root.
    assert_eq!(t.alloc(MID), Some(MID));
    // 4 KiB chunks fill the split slot before another is split.
    assert_eq!(t.alloc(SMALL), Some(SMALL));
    // A 2 MiB chunk needs a free root.
    assert_eq!(t.alloc(ROOT), Some(ROOT));
    assert_eq!(t.alloc(ROOT), None);
    assert_eq!(t.avail(), 2 * ROOT - ROOT - MID - 2 * SMALL);
    // Freed, everything merges: root 0 is free and whole again.
    for (at, size) in [(0, SMALL), (MID, MID), (SMALL, SMALL), (ROOT, ROOT)] {
        assert!(t.free(at, size), "free {at:#x}");
    }
    assert_eq!(t.avail(), 2 * ROOT);
    assert_eq!(t.root_state(0), (false, false));
    assert_eq!(t.alloc(ROOT), Some(0));
    assert_eq!(t.alloc(ROOT), Some(ROOT));
}

#[test]
fn every_size_fills_the_tree_exactly() {
    for size in [SMALL, MID, ROOT] {
        let roots = 3;
        let mut t = tree(roots);
        let n = roots as u64 * ROOT / size;
        let mut got: Vec<u64> = (0..n).map_while(|_| t.alloc(size)).collect();
        assert_eq!(got.len() as u64, n, "{size}");
        assert_eq!(t.alloc(size), None);
        assert_eq!(t.avail(), 0);
        got.sort_unstable();
        assert!(got.iter().enumerate().all(|(i, &p)| p == i as u64 * size));
        for p in got {
            assert!(t.free(p, size));
        }
        assert_eq!(t.avail(), roots as u64 * ROOT);
        assert_eq!(t.alloc(ROOT), Some(0), "merged back after {size}");
    }
}

#[test]
fn wrong_frees_change_nothing() {
    let mut t = tree(2);
    let a = t.alloc(MID).expect("64K");
    let b = t.alloc(SMALL).expect("4K");
    let avail = t.avail();
    for (at, size) in [
        (a, SMALL),         // a 64 KiB chunk freed as 4 KiB
        (a + SMALL, MID),   // not aligned
        (b, MID),           // a split slot freed as 64 KiB
        (b + SMALL, SMALL), // a free 4 KiB chunk of a split slot
        (0, ROOT),          // a split root freed whole
        (ROOT, ROOT),       // a free root
        (2 * ROOT, SMALL),  // past the end
        (u64::MAX, SMALL),
        (a, 8 * K), // not a chunk size
    ] {
        assert!(!t.free(at, size), "{at:#x} {size}");
        assert_eq!(t.avail(), avail);
    }
    assert!(t.free(a, MID));
    assert!(!t.free(a, MID), "a double free");
    assert!(t.free(b, SMALL));
    assert_eq!(t.avail(), 2 * ROOT);
    assert_eq!(t.alloc(8 * K), None, "not a chunk size");
}

#[test]
fn random_runs_match_a_model() {
    for seed in 1..=8u64 {
        let mut rng = Rng(seed * 0x9e37_79b9_7f4a_7c15);
        let roots = 1 + rng.below(4) as usize;
        let mut t = tree(roots);
        let mut m = Model::default();
        for step in 0..4000 {
            let what = format!("seed {seed} step {step}");
            // Allocate more than free at first, then the other way round, so the tree fills
            // and empties.
            let alloc_odds = if step < 2000 { 3 } else { 1 };
            if m.held.is_empty() || rng.below(alloc_odds + 1) != 0 {
                // Mostly small chunks, so roots are shared.
                let size = [SMALL, SMALL, SMALL, MID, MID, ROOT][rng.below(6) as usize];
                let want = m.expect(roots as u64, size);
                let got = t.alloc(size);
                assert_eq!(got, want, "{what}: alloc {size}");
                if let Some(p) = got {
                    assert_eq!(p % size, 0, "{what}");
                    assert!(!m.busy(p, size), "{what}: {p:#x} overlaps");
                    m.held.insert(p, size);
                }
            } else {
                let i = rng.below(m.held.len() as u64) as usize;
                let (&p, &size) = m.held.iter().nth(i).expect("held");
                assert!(t.free(p, size), "{what}: free {p:#x}");
                assert!(!t.free(p, size), "{what}: freed twice");
                m.held.remove(&p);
            }
            assert_eq!(t.avail(), roots as u64 * ROOT - m.bytes(), "{what}");
            check_roots(&t, &m, &what);
        }
        let held: Vec<(u64, u64)> = m.held.iter().map(|(&p, &s)| (p, s)).collect();
        for (p, s) in held {
            assert!(t.free(p, s));
        }
        assert_eq!(t.avail(), roots as u64 * ROOT, "seed {seed}: all back");
        for r in 0..roots {
            assert_eq!(t.alloc(ROOT), Some(r as u64 * ROOT), "seed {seed}: merged");
        }
    }
}
