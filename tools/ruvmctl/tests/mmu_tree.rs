// SPDX-License-Identifier: GPL-2.0

//! Host tests of the module's GPU page-table tree (`rust/gpu/mmu/tree.rs`, compiled from the
//! module's own source, with the format it writes): every tree it builds is checked by the
//! MMU's own walk, tables are counted as they come and go, and a random run is compared with a
//! model of what should be mapped.

mod common;

#[allow(
    dead_code,
    reason = "the tree uses part of the format; tests/mmu_fmt.rs tests all of it"
)]
#[path = "../../../rust/gpu/mmu/fmt.rs"]
mod fmt;
#[path = "../../../rust/gpu/mmu/tree.rs"]
mod tree;

use std::collections::{BTreeMap, HashMap};

use common::Rng;
use fmt::{walk, Access, Aperture, Fault, Level, Pde, Pte, TableReader, VA_END};
use tree::{TableMem, Tree, TreeError, ROOT_SIZE};

const K: u64 = 1024;
const M: u64 = 1024 * K;
const G: u64 = 1024 * M;

/// Table memory: words by (aperture, address), tables handed out from a bump pointer, every
/// live table recorded, allocation failures on demand.
struct Mem {
    aperture: Aperture,
    words: HashMap<u64, u64>,
    next: u64,
    live: HashMap<u64, u64>,
    /// Fail the allocation after this many more succeed.
    fail_after: Option<u32>,
    /// Fail one write, after this many more succeed.
    fail_writes_after: Option<u32>,
    allocs: u32,
}

impl Mem {
    fn new(aperture: Aperture) -> Mem {
        Mem {
            aperture,
            words: HashMap::new(),
            next: 0x10_0000,
            live: HashMap::new(),
            fail_after: None,
            fail_writes_after: None,
            allocs: 0,
        }
    }

    fn tables(&self) -> usize {
        self.live.len()
    }

    fn bytes(&self) -> u64 {
        self.live.values().sum()
    }

    /// Asserts that the `words` from `addr` on lie in one live table.
    fn one_table(&self, addr: u64, words: usize) {
        let end = addr + 8 * words as u64;
        assert!(
            self.live.iter().any(|(&a, &s)| addr >= a && end <= a + s),
            "a bulk access {addr:#x}..{end:#x} outside one live table"
        );
    }
}

impl TableReader for Mem {
    fn read(&mut self, aperture: Aperture, addr: u64) -> Option<u64> {
        assert_eq!(aperture, self.aperture, "a table read in another aperture");
        assert_eq!(addr % 8, 0);
        // Only live tables are memory.
        let inside = self.live.iter().any(|(&a, &s)| addr >= a && addr < a + s);
        inside.then(|| self.words.get(&addr).copied().unwrap_or(0))
    }
}

impl TableMem for Mem {
    fn write(&mut self, aperture: Aperture, addr: u64, value: u64) -> Result<(), TreeError> {
        assert_eq!(aperture, self.aperture);
        assert_eq!(addr % 8, 0);
        let inside = self.live.iter().any(|(&a, &s)| addr >= a && addr < a + s);
        assert!(inside, "a write at {addr:#x}, in no live table");
        if let Some(n) = self.fail_writes_after.as_mut() {
            if *n == 0 {
                self.fail_writes_after = None;
                return Err(TreeError::Unreadable);
            }
            *n -= 1;
        }
        self.words.insert(addr, value);
        Ok(())
    }

    fn alloc(&mut self, size: u64) -> Result<Pde, TreeError> {
        assert!(
            size.is_power_of_two() && (32..=4096).contains(&size),
            "{size}"
        );
        if let Some(n) = self.fail_after.as_mut() {
            if *n == 0 {
                return Err(TreeError::NoMemory);
            }
            *n -= 1;
        }
        self.allocs += 1;
        let addr = self.next.next_multiple_of(size);
        self.next = addr + size;
        // Handed out dirty underneath: the tree must not rely on old contents.
        for w in (addr..addr + size).step_by(8) {
            self.words.insert(w, 0);
        }
        self.live.insert(addr, size);
        Ok(Pde::new(addr, self.aperture))
    }

    fn read_words(
        &mut self,
        aperture: Aperture,
        addr: u64,
        out: &mut [u64],
    ) -> Result<(), TreeError> {
        self.one_table(addr, out.len());
        for (i, w) in out.iter_mut().enumerate() {
            *w = self
                .read(aperture, addr + 8 * i as u64)
                .ok_or(TreeError::Unreadable)?;
        }
        Ok(())
    }

    fn write_words(
        &mut self,
        aperture: Aperture,
        addr: u64,
        words: &[u64],
    ) -> Result<(), TreeError> {
        self.one_table(addr, words.len());
        for (i, &w) in words.iter().enumerate() {
            self.write(aperture, addr + 8 * i as u64, w)?;
        }
        Ok(())
    }

    fn free(&mut self, table: Pde, size: u64) {
        assert_eq!(
            self.live.remove(&table.addr),
            Some(size),
            "a free of {:#x}/{size} that is not a live table",
            table.addr
        );
        // Freed memory is garbage: a walk through a stale entry must not find zeros.
        for w in (table.addr..table.addr + size).step_by(8) {
            self.words.insert(w, 0xdead_beef_dead_beef);
        }
    }
}

fn new_tree(aperture: Aperture) -> (Mem, Tree) {
    let mut m = Mem::new(aperture);
    let t = Tree::new(&mut m).unwrap();
    (m, t)
}

/// Walks `va` (a read) in `t`.
fn translate(m: &mut Mem, t: &Tree, va: u64) -> Result<(u64, u64), Fault> {
    walk(m, &t.root(), va, Access::Read).map(|x| (x.addr, x.page_size))
}

fn sys(addr: u64) -> Pte {
    Pte::new(addr, Aperture::SysCoherent)
}

#[test]
fn a_new_tree_is_its_root_alone_and_destroy_frees_it() {
    let (mut m, t) = new_tree(Aperture::Video);
    assert_eq!(m.tables(), 1);
    assert_eq!(m.bytes(), ROOT_SIZE);
    assert_eq!(ROOT_SIZE, 32);
    assert!(matches!(
        translate(&mut m, &t, 0),
        Err(Fault::NoPde(Level::Pde3))
    ));
    t.destroy(&mut m);
    assert_eq!(m.tables(), 0);
}

#[test]
fn every_page_size_maps_walks_and_unmaps_back_to_the_root() {
    // (page size, tables one page needs: root, PDE2, PDE1, PDE0 and the leaf table if any)
    for (size, tables, leaf_bytes) in [(4 * K, 5, 4096), (64 * K, 5, 256), (2 * M, 4, 0)] {
        for aperture in [Aperture::Video, Aperture::SysCoherent] {
            let (mut m, t) = new_tree(aperture);
            let va = 0x1_2340_0000_0000 + 3 * 2 * M + if size < 2 * M { 5 * size } else { 0 };
            let pa = 7 * 2 * M;
            t.map(&mut m, va, size, &sys(pa)).unwrap();
            assert_eq!(m.tables(), tables, "{size:#x}");
            assert_eq!(m.bytes(), 32 + 3 * 4096 + leaf_bytes);
            for off in [0, 8, size / 2, size - 8] {
                assert_eq!(translate(&mut m, &t, va + off), Ok((pa + off, size)));
            }
            assert!(translate(&mut m, &t, va + size).is_err());
            if va >= size {
                assert!(translate(&mut m, &t, va - size).is_err());
            }
            let pte = t.unmap(&mut m, va, size).unwrap();
            assert_eq!(pte, sys(pa));
            assert_eq!(m.tables(), 1, "{size:#x}: tables left after unmap");
            assert!(translate(&mut m, &t, va).is_err());
            assert_eq!(t.unmap(&mut m, va, size), Err(TreeError::NotMapped));
            t.destroy(&mut m);
            assert_eq!(m.tables(), 0);
        }
    }
}

#[test]
fn big_and_small_pages_share_a_2m_range_and_never_overlap() {
    let (mut m, t) = new_tree(Aperture::Video);
    let base = 4 * G;
    // 64K pages in the first 1 MiB, 4K pages in the second.
    for i in 0..16 {
        t.map(
            &mut m,
            base + i * 64 * K,
            64 * K,
            &sys(0x4000_0000 + i * 64 * K),
        )
        .unwrap();
    }
    for i in 0..256 {
        t.map(
            &mut m,
            base + M + i * 4 * K,
            4 * K,
            &sys(0x8000_0000 + i * 4 * K),
        )
        .unwrap();
    }
    // One PDE0 entry holds both tables.
    assert_eq!(m.tables(), 6);
    assert_eq!(
        translate(&mut m, &t, base + 64 * K + 12),
        Ok((0x4000_0000 + 64 * K + 12, 64 * K))
    );
    assert_eq!(
        translate(&mut m, &t, base + M + 4 * K + 12),
        Ok((0x8000_0000 + 4 * K + 12, 4 * K))
    );
    // Overlaps of every kind are refused and change nothing.
    let before = m.words.clone();
    assert_eq!(
        t.map(&mut m, base + 4 * K, 4 * K, &sys(0)),
        Err(TreeError::Busy)
    );
    assert_eq!(
        t.map(&mut m, base + M, 64 * K, &sys(0)),
        Err(TreeError::Busy)
    );
    assert_eq!(t.map(&mut m, base, 2 * M, &sys(0)), Err(TreeError::Busy));
    assert_eq!(t.map(&mut m, base, 64 * K, &sys(0)), Err(TreeError::Busy));
    assert_eq!(m.words, before);
    assert_eq!(m.tables(), 6);
    // A 2 MiB page refuses smaller ones inside it.
    t.map(&mut m, base + 2 * M, 2 * M, &sys(2 * M)).unwrap();
    assert_eq!(m.tables(), 6);
    assert_eq!(
        t.map(&mut m, base + 3 * M, 4 * K, &sys(0)),
        Err(TreeError::Busy)
    );
    assert_eq!(
        t.map(&mut m, base + 3 * M, 64 * K, &sys(0)),
        Err(TreeError::Busy)
    );
    assert_eq!(
        t.map(&mut m, base + 2 * M, 2 * M, &sys(0)),
        Err(TreeError::Busy)
    );
    // Emptying the big table frees it alone; then the small one and the directories go.
    for i in 0..16 {
        t.unmap(&mut m, base + i * 64 * K, 64 * K).unwrap();
    }
    assert_eq!(m.tables(), 5);
    assert_eq!(
        translate(&mut m, &t, base + M + 12),
        Ok((0x8000_0000 + 12, 4 * K))
    );
    assert!(matches!(
        translate(&mut m, &t, base),
        Err(Fault::NoPte(Level::Pte4K))
    ));
    assert_eq!(t.unmap_range(&mut m, base, 4 * M), Ok(257));
    assert_eq!(m.tables(), 1);
    t.destroy(&mut m);
    assert_eq!(m.tables(), 0);
}

#[test]
fn bad_pages_are_refused_and_change_nothing() {
    let (mut m, t) = new_tree(Aperture::Video);
    let cases: [(u64, u64, u64); 7] = [
        (4 * K + 8, 4 * K, 0),       // VA not aligned
        (64 * K + 4 * K, 64 * K, 0), // VA not aligned to the page
        (0, 64 * K, 4 * K),          // address not aligned to the page
        (0, 2 * M, 64 * K),          // address not aligned to the page
        (0, 8 * K, 0),               // not a page size
        (VA_END, 4 * K, 0),          // past the VA space
        (VA_END - 4 * K, 64 * K, 0), // not aligned, and would cross the end
    ];
    for (va, size, pa) in cases {
        assert_eq!(
            t.map(&mut m, va, size, &sys(pa)),
            Err(TreeError::Invalid),
            "{va:#x} {size:#x} {pa:#x}"
        );
    }
    assert_eq!(
        t.map(&mut m, !0xfff, 4 * K, &sys(0)),
        Err(TreeError::Invalid)
    );
    assert_eq!(t.unmap(&mut m, 12, 4 * K), Err(TreeError::Invalid));
    assert_eq!(t.unmap(&mut m, 0, 4 * K), Err(TreeError::NotMapped));
    assert_eq!(t.unmap_range(&mut m, 0, 4 * K + 1), Err(TreeError::Invalid));
    assert_eq!(
        t.unmap_range(&mut m, VA_END - 4 * K, 8 * K),
        Err(TreeError::Invalid)
    );
    // An address too wide for vidmem's PTE field.
    assert!(matches!(
        t.map(&mut m, 0, 4 * K, &Pte::new(1 << 40, Aperture::Video)),
        Err(TreeError::Encode(_))
    ));
    assert_eq!(m.tables(), 1);
    // The last page of the VA space is fine.
    t.map(&mut m, VA_END - 4 * K, 4 * K, &sys(0)).unwrap();
    assert_eq!(translate(&mut m, &t, VA_END - 1), Ok((4 * K - 1, 4 * K)));
    t.destroy(&mut m);
    assert_eq!(m.tables(), 0);
}

#[test]
fn a_failed_allocation_leaves_the_tree_as_it_was() {
    // A page at 3 GiB + 2 MiB shares PDE2 and PDE1 with one at 0 and needs a new PDE0 table,
    // and a leaf table unless it is 2 MiB.
    for (size, needed) in [(4 * K, 2), (64 * K, 2), (2 * M, 1)] {
        for fail in 0..4 {
            let (mut m, t) = new_tree(Aperture::SysCoherent);
            // Something already mapped nearby shares the top of the path.
            t.map(&mut m, 0, 4 * K, &sys(0)).unwrap();
            let before = m.tables();
            m.fail_after = Some(fail);
            let va = 3 * G + 2 * M;
            match t.map(&mut m, va, size, &sys(0)) {
                Err(TreeError::NoMemory) => assert!(fail < needed),
                // Fewer tables were needed than the failure point.
                Ok(()) => {
                    assert!(fail >= needed, "{size:#x} {fail}");
                    t.unmap(&mut m, va, size).unwrap();
                }
                Err(e) => panic!("{e:?}"),
            }
            assert_eq!(m.tables(), before, "{size:#x}, failing allocation {fail}");
            assert!(translate(&mut m, &t, va).is_err());
            assert_eq!(translate(&mut m, &t, 8), Ok((8, 4 * K)));
            m.fail_after = None;
            t.destroy(&mut m);
            assert_eq!(m.tables(), 0);
        }
    }
}

#[test]
fn read_only_pages_refuse_writes_and_keep_their_bits() {
    let (mut m, t) = new_tree(Aperture::Video);
    let mut pte = Pte::new(0x20_0000, Aperture::Video);
    pte.read_only = true;
    pte.volatile = true;
    t.map(&mut m, 2 * M, 2 * M, &pte).unwrap();
    assert!(walk(&mut m, &t.root(), 2 * M + 5, Access::Read).is_ok());
    assert_eq!(
        walk(&mut m, &t.root(), 2 * M + 5, Access::Write),
        Err(Fault::ReadOnly)
    );
    assert_eq!(t.unmap(&mut m, 2 * M, 2 * M), Ok(pte));
    t.destroy(&mut m);
}

#[test]
fn destroy_frees_every_table_of_a_full_tree() {
    let (mut m, t) = new_tree(Aperture::Video);
    for (i, va) in [0, 600 * M, 513 * G, 1 << 47, VA_END - 2 * M]
        .into_iter()
        .enumerate()
    {
        let i = i as u64;
        t.map(&mut m, va, 4 * K, &sys(i * 4 * K)).unwrap();
        t.map(&mut m, va + 64 * K, 64 * K, &sys(i * 64 * K))
            .unwrap();
    }
    assert!(m.tables() > 10);
    t.destroy(&mut m);
    assert_eq!(m.tables(), 0);
}

#[test]
fn random_maps_and_unmaps_match_a_model() {
    for seed in 1..=8u64 {
        let mut rng = Rng(seed * 0x9e37_79b9_7f4a_7c15);
        let (mut m, t) = new_tree(Aperture::Video);
        // The model: page VA -> (size, address).
        let mut model: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        // An 8 MiB window straddling a PDE1 boundary (512 MiB), so directories come and go.
        let window = 512 * M - 4 * M;
        for _ in 0..600 {
            let size = [4 * K, 64 * K, 2 * M][rng.below(3) as usize];
            let va = window + rng.below(8 * M / size) * size;
            let pa = rng.below(1 << 20) * size % (1 << 36);
            let overlaps = model
                .range(..va + size)
                .next_back()
                .is_some_and(|(&v, &(s, _))| v + s > va);
            if rng.below(3) == 0 {
                // Unmap whatever is at va (if a page of that size starts there).
                let want = match model.get(&va) {
                    Some(&(s, a)) if s == size => {
                        model.remove(&va);
                        Ok(sys(a))
                    }
                    _ => Err(TreeError::NotMapped),
                };
                assert_eq!(t.unmap(&mut m, va, size), want, "seed {seed}");
            } else if overlaps {
                assert_eq!(t.map(&mut m, va, size, &sys(pa)), Err(TreeError::Busy));
            } else {
                t.map(&mut m, va, size, &sys(pa)).unwrap();
                model.insert(va, (size, pa));
            }
            // Sample the window against the model.
            for _ in 0..8 {
                let at = window + rng.below(8 * M / 8) * 8;
                let want = model
                    .range(..=at)
                    .next_back()
                    .filter(|(&v, &(s, _))| at < v + s)
                    .map(|(&v, &(s, a))| (a + at - v, s));
                assert_eq!(
                    translate(&mut m, &t, at).ok(),
                    want,
                    "seed {seed} at {at:#x}"
                );
            }
        }
        let n = model.len() as u64;
        assert_eq!(t.unmap_range(&mut m, window, 8 * M), Ok(n));
        assert_eq!(m.tables(), 1, "seed {seed}: only the root is left");
        t.destroy(&mut m);
        assert_eq!(m.tables(), 0);
    }
}

/// Maps `n` pages of `size` from `va` (page `i` at `pa + i * size`) in runs, as the module
/// does: how many calls it took.
fn map_runs(m: &mut Mem, t: &Tree, va: u64, size: u64, n: u64, pa: u64) -> Result<u64, TreeError> {
    let mut done = 0;
    let mut calls = 0;
    while done < n {
        let at = va + done * size;
        let room = Tree::run_pages(at, size)?.min(n - done);
        let ptes: Vec<Pte> = (done..done + room).map(|i| sys(pa + i * size)).collect();
        let got = t.map_run(m, at, size, &ptes)? as u64;
        assert_eq!(got, room, "a run maps what its leaf table holds");
        done += got;
        calls += 1;
    }
    Ok(calls)
}

#[test]
fn runs_map_a_leaf_table_at_a_time_and_range_unmaps_free_everything() {
    for size in [4 * K, 64 * K, 2 * M] {
        let (mut m, t) = new_tree(Aperture::SysCoherent);
        // 1 GiB + a bit, from an address that is not 2 MiB aligned (for the small pages) and
        // crosses a PDE1 boundary (512 MiB).
        let va = 3 * G - 2 * M * 3 + if size == 2 * M { 0 } else { 16 * 64 * K };
        let n = (G + 4 * M) / size;
        let calls = map_runs(&mut m, &t, va, size, n, 0x4000_0000).unwrap();
        let per_table = if size == 2 * M { 256 } else { 2 * M / size };
        assert!(calls <= n / per_table + 2, "{size:#x}: {calls} calls");
        for i in [0, 1, n / 2, n - 2, n - 1] {
            let at = va + i * size + 8;
            assert_eq!(
                translate(&mut m, &t, at),
                Ok((0x4000_0000 + i * size + 8, size)),
                "{size:#x} page {i}"
            );
        }
        assert!(translate(&mut m, &t, va - 8).is_err());
        assert!(translate(&mut m, &t, va + n * size).is_err());
        // A run over a mapped page maps nothing of it.
        let before = m.tables();
        let last = va + (n - 1) * size;
        let ptes = [sys(0), sys(size)];
        assert_eq!(
            t.map_run(&mut m, last - size, size, &ptes),
            Err(TreeError::Busy)
        );
        assert_eq!(m.tables(), before);
        assert_eq!(t.unmap_range(&mut m, va, n * size), Ok(n), "{size:#x}");
        assert_eq!(m.tables(), 1, "{size:#x}: only the root is left");
        t.destroy(&mut m);
    }
}

#[test]
fn a_run_that_cannot_be_written_leaves_nothing_behind() {
    for size in [4 * K, 64 * K, 2 * M] {
        for fail in [0, 1, 3, 9] {
            let (mut m, t) = new_tree(Aperture::Video);
            t.map(&mut m, 0, 4 * K, &sys(0)).unwrap();
            let before = m.tables();
            let ptes: Vec<Pte> = (0..20).map(|i| sys(i * size)).collect();
            m.fail_writes_after = Some(fail);
            let r = t.map_run(&mut m, 4 * M, size, &ptes);
            m.fail_writes_after = None;
            match r {
                Err(TreeError::Unreadable) => {
                    for i in 0..20 {
                        assert!(translate(&mut m, &t, 4 * M + i * size).is_err());
                    }
                    assert_eq!(m.tables(), before, "{size:#x} failing write {fail}");
                }
                Ok(n) => {
                    // Fewer writes than the failure point were needed.
                    assert_eq!(t.unmap_range(&mut m, 4 * M, n as u64 * size), Ok(n as u64));
                }
                Err(e) => panic!("{e:?}"),
            }
            assert_eq!(m.tables(), before);
            assert_eq!(translate(&mut m, &t, 8), Ok((8, 4 * K)));
        }
    }
}

#[test]
fn random_runs_and_range_unmaps_match_a_model() {
    for seed in 1..=8u64 {
        let mut rng = Rng(seed * 0x2545_f491_4f6c_dd1d);
        let (mut m, t) = new_tree(Aperture::Video);
        let mut model: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        // 16 MiB straddling a PDE1 boundary.
        let window = 512 * M - 8 * M;
        for _ in 0..300 {
            let size = [4 * K, 64 * K, 2 * M][rng.below(3) as usize];
            let va = window + rng.below(16 * M / size) * size;
            if rng.below(3) == 0 {
                // Unmap a range: every page overlapping it goes, whole.
                let len = (rng.below(4 * M / (4 * K)) + 1) * 4 * K;
                let len = len.min(window + 16 * M - va);
                let gone: Vec<u64> = model
                    .iter()
                    .filter(|(&v, &(s, _))| v < va + len && v + s > va)
                    .map(|(&v, _)| v)
                    .collect();
                for v in &gone {
                    model.remove(v);
                }
                assert_eq!(
                    t.unmap_range(&mut m, va, len),
                    Ok(gone.len() as u64),
                    "seed {seed}"
                );
            } else {
                let want = rng.below(40) + 1;
                let room = Tree::run_pages(va, size).unwrap();
                let n = want.min(room).min((window + 16 * M - va) / size);
                let pa = rng.below(1 << 16) * size;
                let ptes: Vec<Pte> = (0..want).map(|i| sys(pa + i * size)).collect();
                let overlaps = model
                    .range(..va + n * size)
                    .next_back()
                    .is_some_and(|(&v, &(s, _))| v + s > va);
                let r = t.map_run(&mut m, va, size, &ptes[..n as usize]);
                if overlaps {
                    assert_eq!(r, Err(TreeError::Busy), "seed {seed}");
                } else {
                    assert_eq!(r, Ok(n as usize), "seed {seed}");
                    for i in 0..n {
                        model.insert(va + i * size, (size, pa + i * size));
                    }
                }
            }
            for _ in 0..8 {
                let at = window + rng.below(16 * M / 8) * 8;
                let want = model
                    .range(..=at)
                    .next_back()
                    .filter(|(&v, &(s, _))| at < v + s)
                    .map(|(&v, &(s, a))| (a + at - v, s));
                assert_eq!(
                    translate(&mut m, &t, at).ok(),
                    want,
                    "seed {seed} at {at:#x}"
                );
            }
        }
        let n = model.len() as u64;
        assert_eq!(t.unmap_range(&mut m, window, 16 * M), Ok(n));
        assert_eq!(m.tables(), 1, "seed {seed}: only the root is left");
        t.destroy(&mut m);
    }
}
