// SPDX-License-Identifier: GPL-2.0

//! Unmapping from a page-table tree: a page, or a range of pages, and the pruning of the tables
//! they leave empty. Like its parent, this file depends on `core` only (the host tests compile
//! it with the parent).

use super::*;

impl Tree {
    /// Unmaps the page of `page_size` bytes at `va` and frees the tables it leaves empty:
    /// the PTE it held.
    pub(crate) fn unmap<M: TableMem>(
        &self,
        m: &mut M,
        va: u64,
        page_size: u64,
    ) -> Result<Pte, TreeError> {
        let level = Self::check(va, page_size, None)?;
        let pde0 = self.pde0(m, va, false)?.map_err(|_| TreeError::NotMapped)?;
        let cur = read_pde0(m, &pde0, va)?;
        let pte = match (level, cur) {
            (Level::Pde0, Pde0::Page(pte)) => {
                write_pde0(m, &pde0, va, &Pde0::Invalid)?;
                pte
            }
            (Level::Pte64K, Pde0::Dual { big: Some(t), .. })
            | (Level::Pte4K, Pde0::Dual { small: Some(t), .. }) => {
                let i = level.index(va);
                let pte = Pte::decode(read(m, &t, level, i, 0)?).ok_or(TreeError::NotMapped)?;
                write(m, &t, level, i, 0, 0)?;
                pte
            }
            _ => return Err(TreeError::NotMapped),
        };
        self.prune(m, va);
        Ok(pte)
    }

    /// Frees the leaf tables of `va`'s entry in `pde0` that hold nothing, and clears the
    /// entry's halves pointing at them (the whole entry when both go). Best effort.
    fn prune_leaves<M: TableMem>(m: &mut M, pde0: &Pde, va: u64) {
        if let Ok(Pde0::Dual { mut big, mut small }) = read_pde0(m, pde0, va) {
            let mut gone = [None, None];
            for (slot, lvl, g) in [
                (&mut big, Level::Pte64K, 0usize),
                (&mut small, Level::Pte4K, 1usize),
            ] {
                if let Some(t) = *slot {
                    if matches!(empty(m, &t, lvl), Ok(true)) {
                        *slot = None;
                        if let Some(x) = gone.get_mut(g) {
                            *x = Some((t, lvl));
                        }
                    }
                }
            }
            let e = if big.is_none() && small.is_none() {
                Pde0::Invalid
            } else {
                Pde0::Dual { big, small }
            };
            if gone.iter().any(Option::is_some) && write_pde0(m, pde0, va, &e).is_ok() {
                for (t, lvl) in gone.into_iter().flatten() {
                    m.free(t, lvl.table_size());
                }
            }
        }
    }

    /// Frees the tables on `va`'s path that hold nothing, leaf first, clearing the entries
    /// pointing at them first. Best effort: a table that cannot be read is left in place.
    pub(super) fn prune<M: TableMem>(&self, m: &mut M, va: u64) {
        // The path: the directory tables root to PDE0.
        let mut path = [self.root; 4];
        let mut level = Level::Pde3;
        let mut depth = 1;
        let mut table = self.root;
        while let Some(next) = level.next() {
            match read(m, &table, level, level.index(va), 0).map(Pde::decode) {
                Ok(Some(t)) => table = t,
                _ => break,
            }
            if let Some(p) = path.get_mut(depth) {
                *p = table;
            }
            depth += 1;
            level = next;
        }
        if depth == 4 {
            Self::prune_leaves(m, &table, va);
        }
        // The directories, PDE0 up to PDE2: each freed when empty, its parent's entry cleared.
        let levels = [Level::Pde3, Level::Pde2, Level::Pde1, Level::Pde0];
        let mut d = depth.min(4);
        while d > 1 {
            let (Some(&child), Some(&parent), Some(&clvl), Some(&plvl)) = (
                path.get(d - 1),
                path.get(d - 2),
                levels.get(d - 1),
                levels.get(d - 2),
            ) else {
                break;
            };
            if !matches!(empty(m, &child, clvl), Ok(true)) {
                break;
            }
            if write(m, &parent, plvl, plvl.index(va), 0, 0).is_err() {
                break;
            }
            m.free(child, clvl.table_size());
            d -= 1;
        }
    }

    /// Unmaps every page in `[va, va + len)` (mapped with any page size; a page only partly
    /// inside goes whole) and frees the tables left empty. How many pages were unmapped.
    ///
    /// The path to a PDE0 table is walked once for all the entries of it in the range, and
    /// each entry's leaf tables are cleared a run at a time. The entries go from the last
    /// down: what is left of a table is then at its low end, where the check for an empty
    /// table (from its first entry up) stops at once, so unmapping n pages costs O(n), not
    /// O(n x table size).
    pub(crate) fn unmap_range<M: TableMem>(
        &self,
        m: &mut M,
        va: u64,
        len: u64,
    ) -> Result<u64, TreeError> {
        let end = va.checked_add(len).ok_or(TreeError::Invalid)?;
        if va & 0xfff != 0 || len & 0xfff != 0 || end > VA_END {
            return Err(TreeError::Invalid);
        }
        let mut n = 0;
        let mut at = end;
        while at > va {
            // The last 4 KiB page below `at`, the PDE0 table covering it, and where to look
            // next.
            let p = at - 0x1000;
            let down = |span: u64| p & !(span - 1);
            let pde0 = match self.pde0(m, p, false)? {
                Err(level) => {
                    at = down(level.span()).max(va);
                    continue;
                }
                Ok(t) => t,
            };
            let table_start = down(Level::Pde1.span()).max(va);
            n += Self::clear_entries(m, &pde0, table_start, at)?;
            at = table_start;
            self.prune(m, p);
        }
        Ok(n)
    }

    /// Unmaps the pages of `pde0`'s entries for `[lo, hi)` (in the one PDE0 table) and frees
    /// the leaf tables left empty: how many pages. The entries are read a batch at a time,
    /// the last batch first; 2 MiB pages are cleared in the batch, the others entry by entry.
    fn clear_entries<M: TableMem>(
        m: &mut M,
        pde0: &Pde,
        lo: u64,
        hi: u64,
    ) -> Result<u64, TreeError> {
        let span = Level::Pde0.span();
        let first = Level::Pde0.index(lo);
        let mut end = Level::Pde0.index(hi - 1) + 1;
        // CAST: BATCH is small.
        let per_batch = BATCH as u64 / 2;
        let mut buf = [0u64; BATCH];
        let mut n = 0;
        while end > first {
            let start = end.saturating_sub(per_batch).max(first);
            // CAST: at most BATCH.
            let words = buf
                .get_mut(..((end - start) * 2) as usize)
                .ok_or(TreeError::Unreadable)?;
            let addr = slot(pde0, Level::Pde0, start, 0)?;
            m.read_words(pde0.aperture, addr, words)?;
            let mut pages = 0;
            for e in words.chunks_mut(2) {
                if let [a, b] = e {
                    if matches!(Pde0::decode([*a, *b]), Pde0::Page(_)) {
                        (*a, *b) = (0, 0);
                        pages += 1;
                    }
                }
            }
            if pages > 0 {
                // The other entries are written back as they were read.
                m.write_words(pde0.aperture, addr, words)?;
                n += pages;
            }
            for i in (start..end).rev() {
                // The entry's 2 MiB, cut to the range.
                let base = (lo & !(Level::Pde1.span() - 1)) + i * span;
                let (a, b) = (base.max(lo), (base + span).min(hi));
                // CAST: below BATCH.
                let k = ((i - start) * 2) as usize;
                if let (Some(&x), Some(&y)) = (words.get(k), words.get(k + 1)) {
                    if matches!(Pde0::decode([x, y]), Pde0::Dual { .. }) {
                        n += Self::clear_entry(m, pde0, a, b)?;
                    }
                }
            }
            end = start;
        }
        Ok(n)
    }

    /// Unmaps the pages of `pde0`'s entry for `[lo, hi)` (both in one 2 MiB entry) and frees
    /// the leaf tables left empty: how many pages.
    fn clear_entry<M: TableMem>(m: &mut M, pde0: &Pde, lo: u64, hi: u64) -> Result<u64, TreeError> {
        let n = match read_pde0(m, pde0, lo)? {
            Pde0::Invalid => return Ok(0),
            Pde0::Page(_) => {
                write_pde0(m, pde0, lo, &Pde0::Invalid)?;
                return Ok(1);
            }
            Pde0::Dual { big, small } => {
                let mut n = 0;
                if let Some(t) = big {
                    let first = Level::Pte64K.index(lo);
                    n += clear(
                        m,
                        &t,
                        Level::Pte64K,
                        first,
                        Level::Pte64K.index(hi - 1) - first + 1,
                    )?;
                }
                if let Some(t) = small {
                    let first = Level::Pte4K.index(lo);
                    n += clear(
                        m,
                        &t,
                        Level::Pte4K,
                        first,
                        Level::Pte4K.index(hi - 1) - first + 1,
                    )?;
                }
                n
            }
        };
        Self::prune_leaves(m, pde0, lo);
        Ok(n)
    }
}
