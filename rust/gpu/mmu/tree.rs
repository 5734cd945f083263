// SPDX-License-Identifier: GPL-2.0

//! A GPU's page-table tree, held in memory: pages mapped and unmapped by writing MMU version 2
//! entries (`fmt.rs`), tables allocated when first needed and freed when they empty.
//!
//! This file depends on `core` only, like `fmt.rs`: the host tests compile it
//! (`tools/ruvmctl/tests/mmu_tree.rs`) over a memory of words and check every tree it builds
//! with [`fmt::walk`](super::fmt::walk), the walk the simulated MMU does.
//!
//! # No side table
//!
//! The tree keeps nothing but its root: which tables exist, and what they map, is read back
//! from the tables themselves through [`TableMem`], the memory they live in. What the MMU walks
//! is therefore exactly what was written, and a corrupted entry is seen by both.
//!
//! # Rules
//!
//! - A page is 4 KiB, 64 KiB or 2 MiB, at a VA and an address aligned to its size, below
//!   [`VA_END`].
//! - Pages never overlap: a page whose range holds any mapped page (of any size) is refused
//!   with [`TreeError::Busy`], so the MMU's "a big page wins over the small table" never has
//!   to decide anything.
//! - Unmapping a page frees every table it leaves empty, up to (not including) the root; a
//!   tree with nothing mapped holds the root alone.
//! - A failed map leaves the tree as it was (tables it allocated are freed again).

use super::fmt::{Aperture, EncodeError, Level, Pde, Pde0, Pte, TableReader, VA_END};

/// Why a tree operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TreeError {
    /// No memory for a table.
    NoMemory,
    /// Not a page size, a VA or address not aligned to it, or past the VA space.
    Invalid,
    /// The range already holds a mapped page.
    Busy,
    /// The page is not mapped.
    NotMapped,
    /// An entry could not be encoded (see [`EncodeError`]).
    Encode(EncodeError),
    /// A table could not be read or written: the tree's memory is gone or corrupt.
    Unreadable,
}

impl From<EncodeError> for TreeError {
    fn from(e: EncodeError) -> TreeError {
        TreeError::Encode(e)
    }
}

/// The memory the tables live in.
pub(crate) trait TableMem: TableReader {
    /// Writes the word at byte address `addr` (8-byte aligned) in `aperture`.
    fn write(&mut self, aperture: Aperture, addr: u64, value: u64) -> Result<(), TreeError>;
    /// A new table of `size` bytes (a power of two, 32 to 4096), aligned to `size` and zeroed:
    /// where it is.
    fn alloc(&mut self, size: u64) -> Result<Pde, TreeError>;
    /// Gives back a table [`alloc`](TableMem::alloc) returned.
    fn free(&mut self, table: Pde, size: u64);

    /// Reads `out.len()` words from byte address `addr` on, all in one table.
    fn read_words(
        &mut self,
        aperture: Aperture,
        addr: u64,
        out: &mut [u64],
    ) -> Result<(), TreeError> {
        let mut at = addr;
        for w in out.iter_mut() {
            *w = self.read(aperture, at).ok_or(TreeError::Unreadable)?;
            at = at.checked_add(8).ok_or(TreeError::Unreadable)?;
        }
        Ok(())
    }

    /// Writes `words` from byte address `addr` on, all in one table, in address order.
    fn write_words(
        &mut self,
        aperture: Aperture,
        addr: u64,
        words: &[u64],
    ) -> Result<(), TreeError> {
        let mut at = addr;
        for &w in words {
            self.write(aperture, at, w)?;
            at = at.checked_add(8).ok_or(TreeError::Unreadable)?;
        }
        Ok(())
    }
}

// A path the host tests' `#[path]` inclusion of this file resolves alike.
#[path = "tree/unmap.rs"]
mod unmap;

/// The words one bulk access of the tree moves at most (a buffer on the stack).
const BATCH: usize = 64;

/// The bytes of the root (PDE3) table.
pub(crate) const ROOT_SIZE: u64 = Level::Pde3.table_size();

/// The byte address of entry `index` (and its `half` for PDE0) in `table`.
fn slot(table: &Pde, level: Level, index: u64, half: u64) -> Result<u64, TreeError> {
    index
        .checked_mul(level.entry_size())
        .and_then(|o| o.checked_add(half * 8))
        .and_then(|o| table.addr.checked_add(o))
        .ok_or(TreeError::Unreadable)
}

fn read<M: TableMem>(
    m: &mut M,
    table: &Pde,
    level: Level,
    index: u64,
    half: u64,
) -> Result<u64, TreeError> {
    let addr = slot(table, level, index, half)?;
    m.read(table.aperture, addr).ok_or(TreeError::Unreadable)
}

fn write<M: TableMem>(
    m: &mut M,
    table: &Pde,
    level: Level,
    index: u64,
    half: u64,
    value: u64,
) -> Result<(), TreeError> {
    let addr = slot(table, level, index, half)?;
    m.write(table.aperture, addr, value)
}

/// Whether every word of `table` (of `level`) is zero.
fn empty<M: TableMem>(m: &mut M, table: &Pde, level: Level) -> Result<bool, TreeError> {
    Ok(!any_set(m, table, level, 0, level.entries())?)
}

/// How many of the `count` entries from `first` on in `table` (of `level`) are not zero
/// (stopping at the first with `!all`); with `clear`, those are zeroed as well.
fn scan<M: TableMem>(
    m: &mut M,
    table: &Pde,
    level: Level,
    first: u64,
    count: u64,
    clear: bool,
) -> Result<u64, TreeError> {
    let per = level.entry_size() / 8;
    let mut words = count.checked_mul(per).ok_or(TreeError::Unreadable)?;
    let mut addr = slot(table, level, first, 0)?;
    let mut set = 0;
    let mut buf = [0u64; BATCH];
    while words > 0 {
        // CAST: at most BATCH.
        let n = words.min(BATCH as u64) as usize;
        let piece = buf.get_mut(..n).ok_or(TreeError::Unreadable)?;
        m.read_words(table.aperture, addr, piece)?;
        let here = piece
            .chunks(per as usize)
            .filter(|e| e.iter().any(|&w| w != 0))
            .count() as u64;
        if here > 0 {
            set += here;
            if !clear {
                return Ok(set);
            }
            piece.fill(0);
            m.write_words(table.aperture, addr, piece)?;
        }
        words -= n as u64;
        addr = addr
            .checked_add(n as u64 * 8)
            .ok_or(TreeError::Unreadable)?;
    }
    Ok(set)
}

/// Whether any of the `count` entries from `first` on in `table` (of `level`) is set.
fn any_set<M: TableMem>(
    m: &mut M,
    table: &Pde,
    level: Level,
    first: u64,
    count: u64,
) -> Result<bool, TreeError> {
    Ok(scan(m, table, level, first, count, false)? != 0)
}

/// Zeroes the `count` entries from `first` on in `table` (of `level`): how many were set.
fn clear<M: TableMem>(
    m: &mut M,
    table: &Pde,
    level: Level,
    first: u64,
    count: u64,
) -> Result<u64, TreeError> {
    scan(m, table, level, first, count, true)
}

/// The PDE0 entry for `va` in `pde0`.
fn read_pde0<M: TableMem>(m: &mut M, pde0: &Pde, va: u64) -> Result<Pde0, TreeError> {
    let i = Level::Pde0.index(va);
    Ok(Pde0::decode([
        read(m, pde0, Level::Pde0, i, 0)?,
        read(m, pde0, Level::Pde0, i, 1)?,
    ]))
}

fn write_pde0<M: TableMem>(m: &mut M, pde0: &Pde, va: u64, e: &Pde0) -> Result<(), TreeError> {
    let i = Level::Pde0.index(va);
    let [lo, hi] = e.encode()?;
    // The half that stops pointing at something goes first, so a walk in between never sees
    // a half pointing at a table about to be freed next to a new one.
    write(m, pde0, Level::Pde0, i, 0, lo)?;
    write(m, pde0, Level::Pde0, i, 1, hi)
}

/// A new table of `level`, linked into entry `i` of `parent` (of `plevel`); freed again if
/// the link cannot be written.
fn new_table<M: TableMem>(
    m: &mut M,
    parent: &Pde,
    plevel: Level,
    i: u64,
    level: Level,
) -> Result<Pde, TreeError> {
    let t = m.alloc(level.table_size())?;
    match t
        .encode()
        .map_err(TreeError::from)
        .and_then(|e| write(m, parent, plevel, i, 0, e))
    {
        Ok(()) => Ok(t),
        Err(e) => {
            m.free(t, level.table_size());
            Err(e)
        }
    }
}

/// One GPU VA space's page tables.
#[derive(Debug)]
pub(crate) struct Tree {
    root: Pde,
}

impl Tree {
    /// A tree with nothing mapped: the root table alone.
    pub(crate) fn new<M: TableMem>(m: &mut M) -> Result<Tree, TreeError> {
        Ok(Tree {
            root: m.alloc(ROOT_SIZE)?,
        })
    }

    /// The root (PDE3) table, where the MMU's walks start.
    pub(crate) fn root(&self) -> Pde {
        self.root
    }

    /// Checks a page's size, VA and address.
    fn check(va: u64, page_size: u64, pte: Option<&Pte>) -> Result<Level, TreeError> {
        let level = Level::for_page(page_size).ok_or(TreeError::Invalid)?;
        let end = va.checked_add(page_size).ok_or(TreeError::Invalid)?;
        if va & (page_size - 1) != 0 || end > VA_END {
            return Err(TreeError::Invalid);
        }
        if pte.is_some_and(|p| p.addr & (page_size - 1) != 0) {
            return Err(TreeError::Invalid);
        }
        Ok(level)
    }

    /// The PDE0 table covering `va`, or the directory level whose entry for `va` is invalid.
    /// With `alloc`, missing directories are allocated on the way (each linked into its parent
    /// at once, so a failure later leaves only empty tables, which [`Tree::prune`] frees).
    fn pde0<M: TableMem>(
        &self,
        m: &mut M,
        va: u64,
        alloc: bool,
    ) -> Result<Result<Pde, Level>, TreeError> {
        let mut table = self.root;
        let mut level = Level::Pde3;
        while let Some(next) = level.next() {
            let i = level.index(va);
            let e = read(m, &table, level, i, 0)?;
            table = match Pde::decode(e) {
                Some(t) => t,
                None if e != 0 => return Err(TreeError::Unreadable),
                None if !alloc => return Ok(Err(level)),
                None => new_table(m, &table, level, i, next)?,
            };
            level = next;
        }
        Ok(Ok(table))
    }

    /// Maps one page of `page_size` bytes at `va` to what `pte` says.
    pub(crate) fn map<M: TableMem>(
        &self,
        m: &mut M,
        va: u64,
        page_size: u64,
        pte: &Pte,
    ) -> Result<(), TreeError> {
        self.map_run(m, va, page_size, core::slice::from_ref(pte))
            .map(|_| ())
    }

    /// How many pages of `page_size` bytes from `va` on [`Tree::map_run`] can map at once.
    pub(crate) fn run_pages(va: u64, page_size: u64) -> Result<u64, TreeError> {
        Ok(Self::run_room(va, Self::check(va, page_size, None)?))
    }

    /// How many pages of `level` from `va` on one leaf table holds: the rest of the PDE0
    /// table for 2 MiB pages, the rest of the PDE0 entry's 2 MiB for the others.
    fn run_room(va: u64, level: Level) -> u64 {
        if level == Level::Pde0 {
            Level::Pde0.entries() - Level::Pde0.index(va)
        } else {
            let span = Level::Pde0.span();
            (span - (va & (span - 1))) / level.span()
        }
    }

    /// Maps pages of `page_size` bytes from `va` on, page `i` to what `ptes[i]` says, as many
    /// as the one leaf table covering `va` holds: how many (at least one). All or nothing: if
    /// any of their ranges holds a mapped page, none is mapped ([`TreeError::Busy`]).
    pub(crate) fn map_run<M: TableMem>(
        &self,
        m: &mut M,
        va: u64,
        page_size: u64,
        ptes: &[Pte],
    ) -> Result<usize, TreeError> {
        let level = Self::check(va, page_size, ptes.first())?;
        if ptes.is_empty() {
            return Ok(0);
        }
        // CAST: a usize fits in a u64.
        let n = Self::run_room(va, level).min(ptes.len() as u64);
        let mut at = va;
        for pte in ptes.iter().take(n as usize) {
            Self::check(at, page_size, Some(pte))?;
            at += page_size;
        }
        let r = self.map_run_in(m, va, level, ptes.get(..n as usize).unwrap_or(&[]));
        if r.is_err() {
            // Tables allocated on the way are linked in and empty: free them.
            self.prune(m, va);
        }
        r.map(|()| n as usize)
    }

    /// Writes the entries of `ptes` (pages of `level`, all in one leaf table) from
    /// `first` on in `table`; on a failure, zeroes what it wrote.
    fn write_run<M: TableMem>(
        m: &mut M,
        table: &Pde,
        level: Level,
        first: u64,
        ptes: &[Pte],
    ) -> Result<(), TreeError> {
        let per = level.entry_size() / 8;
        // CAST: BATCH and the entry's words are small.
        let step = BATCH / per as usize;
        let mut buf = [0u64; BATCH];
        let mut done = 0u64;
        let mut r = Ok(());
        for group in ptes.chunks(step) {
            let words = buf.get_mut(..group.len() * per as usize).unwrap_or(&mut []);
            for (e, pte) in words.chunks_mut(per as usize).zip(group) {
                let enc = if level == Level::Pde0 {
                    Pde0::Page(*pte).encode()?
                } else {
                    [pte.encode(level.span())?, 0]
                };
                e.copy_from_slice(enc.get(..per as usize).unwrap_or(&[]));
            }
            r = slot(table, level, first + done, 0)
                .and_then(|addr| m.write_words(table.aperture, addr, words));
            // Counted before the check: a failed write may have written part of the group.
            done += group.len() as u64;
            if r.is_err() {
                break;
            }
        }
        if r.is_err() {
            // The entries were all zero before: best effort, the memory failed a write.
            let _ = clear(m, table, level, first, done);
        }
        r
    }

    fn map_run_in<M: TableMem>(
        &self,
        m: &mut M,
        va: u64,
        level: Level,
        ptes: &[Pte],
    ) -> Result<(), TreeError> {
        // CAST: a usize fits in a u64.
        let n = ptes.len() as u64;
        let len = n * level.span();
        let pde0 = self.pde0(m, va, true)?.map_err(|_| TreeError::Unreadable)?;
        if level == Level::Pde0 {
            let first = Level::Pde0.index(va);
            if any_set(m, &pde0, Level::Pde0, first, n)? {
                return Err(TreeError::Busy);
            }
            return Self::write_run(m, &pde0, Level::Pde0, first, ptes);
        }
        let cur = read_pde0(m, &pde0, va)?;
        let (mut big, mut small) = match cur {
            Pde0::Invalid => (None, None),
            Pde0::Dual { big, small } => (big, small),
            Pde0::Page(_) => return Err(TreeError::Busy),
        };
        // Overlap: a 64K page covers 16 small entries, a 4K page part of one big entry.
        if let Some(t) = big {
            let first = Level::Pte64K.index(va);
            let last = Level::Pte64K.index(va + len - 1);
            if any_set(m, &t, Level::Pte64K, first, last - first + 1)? {
                return Err(TreeError::Busy);
            }
        }
        if let Some(t) = small {
            if any_set(
                m,
                &t,
                Level::Pte4K,
                Level::Pte4K.index(va),
                len / Level::Pte4K.span(),
            )? {
                return Err(TreeError::Busy);
            }
        }
        let half = if level == Level::Pte64K {
            &mut big
        } else {
            &mut small
        };
        let table = match half {
            Some(t) => *t,
            None => {
                let t = m.alloc(level.table_size())?;
                *half = Some(t);
                if let Err(e) = write_pde0(m, &pde0, va, &Pde0::Dual { big, small }) {
                    // The entry may be half written: put it back, and free the table only
                    // once nothing points at it.
                    if write_pde0(m, &pde0, va, &cur).is_ok() {
                        m.free(t, level.table_size());
                    }
                    return Err(e);
                }
                t
            }
        };
        Self::write_run(m, &table, level, level.index(va), ptes)
    }

    /// Frees every table, the root last, whatever they map (a table that cannot be read is
    /// freed without looking inside).
    pub(crate) fn destroy<M: TableMem>(self, m: &mut M) {
        free_below(m, &self.root, Level::Pde3);
        m.free(self.root, ROOT_SIZE);
    }
}

/// Frees every table `table` (of `level`) points at, and theirs.
fn free_below<M: TableMem>(m: &mut M, table: &Pde, level: Level) {
    for i in 0..level.entries() {
        if level == Level::Pde0 {
            let e = match (read(m, table, level, i, 0), read(m, table, level, i, 1)) {
                (Ok(lo), Ok(hi)) => Pde0::decode([lo, hi]),
                _ => continue,
            };
            if let Pde0::Dual { big, small } = e {
                for (t, l) in [(big, Level::Pte64K), (small, Level::Pte4K)] {
                    if let Some(t) = t {
                        m.free(t, l.table_size());
                    }
                }
            }
        } else if let (Some(next), Ok(Some(t))) =
            (level.next(), read(m, table, level, i, 0).map(Pde::decode))
        {
            free_below(m, &t, next);
            m.free(t, next.table_size());
        }
    }
}
