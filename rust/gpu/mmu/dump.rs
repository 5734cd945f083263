// SPDX-License-Identifier: GPL-2.0

//! `/sys/kernel/debug/ruvm/page_tables`: a simulated GPU's page tables as its engine reads
//! them, table by table.

use super::{
    fmt::{self as mmu_fmt, Level, Pde, Pte},
    Mmu, KERNEL_SPACE, TABLE_BYTES,
};

/// The word `i` of `table`, as the engine reads it (0 where it cannot).
fn word(mmu: &Mmu, table: &Pde, i: u64) -> u64 {
    table
        .addr
        .checked_add(i * 8)
        .and_then(|a| mmu.read_word(table.aperture, a))
        .unwrap_or(0)
}

impl Mmu {
    /// Writes every VA space's tree, table by table (`/sys/kernel/debug/ruvm/page_tables`):
    /// each directory entry, each 2 MiB page, and per leaf table its valid PTEs and the VAs
    /// they span.
    pub(crate) fn dump(&self, id: u32, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let st = self.state.lock();
        let n = st.tables.iter().count() as u64;
        writeln!(f, "GPU {id}: {n} tables, {} bytes", n * TABLE_BYTES)?;
        for (space, tree) in st.spaces.iter() {
            let root = tree.root();
            match *space {
                KERNEL_SPACE => writeln!(f, "  kernel VA space")?,
                s => writeln!(f, "  user VA space {s}")?,
            }
            writeln!(f, "    PDE3 table {:?} {:#x}", root.aperture, root.addr)?;
            self.dump_dir(f, &root, Level::Pde3, 0, 4)?;
        }
        Ok(())
    }

    /// Writes the entries of directory `table` of `level`, whose first entry maps `base`.
    fn dump_dir(
        &self,
        f: &mut core::fmt::Formatter<'_>,
        table: &Pde,
        level: Level,
        base: u64,
        indent: usize,
    ) -> core::fmt::Result {
        let pad = "";
        for i in 0..level.entries() {
            let va = base + i * level.span();
            if level == Level::Pde0 {
                let (lo, hi) = (word(self, table, 2 * i), word(self, table, 2 * i + 1));
                if lo == 0 && hi == 0 {
                    continue;
                }
                match mmu_fmt::Pde0::decode([lo, hi]) {
                    mmu_fmt::Pde0::Page(p) => writeln!(
                        f,
                        "{pad:indent$}PDE0[{i}] VA {va:#x}: 2M page {:?} {:#x}{}",
                        p.aperture,
                        p.addr,
                        if p.read_only { " read-only" } else { "" }
                    )?,
                    mmu_fmt::Pde0::Dual { big, small } => {
                        writeln!(f, "{pad:indent$}PDE0[{i}] VA {va:#x}: dual")?;
                        for (t, l) in [(big, Level::Pte64K), (small, Level::Pte4K)] {
                            if let Some(t) = t {
                                self.dump_leaf(f, &t, l, va, indent + 2)?;
                            }
                        }
                    }
                    mmu_fmt::Pde0::Invalid => {
                        writeln!(f, "{pad:indent$}PDE0[{i}]: invalid {lo:#x} {hi:#x}")?
                    }
                }
                continue;
            }
            let e = word(self, table, i);
            if e == 0 {
                continue;
            }
            match (Pde::decode(e), level.next()) {
                (Some(t), Some(next)) => {
                    writeln!(
                        f,
                        "{pad:indent$}{level:?}[{i}] VA {va:#x}: {next:?} table {:?} {:#x}",
                        t.aperture, t.addr
                    )?;
                    self.dump_dir(f, &t, next, va, indent + 2)?;
                }
                _ => writeln!(f, "{pad:indent$}{level:?}[{i}]: not a PDE {e:#x}")?,
            }
        }
        Ok(())
    }

    /// Writes leaf table `table` of `level`: its valid PTEs and the VAs they span.
    fn dump_leaf(
        &self,
        f: &mut core::fmt::Formatter<'_>,
        table: &Pde,
        level: Level,
        base: u64,
        indent: usize,
    ) -> core::fmt::Result {
        let pad = "";
        let mut valid = 0u64;
        let mut span: Option<(u64, u64)> = None;
        for i in 0..level.entries() {
            if Pte::decode(word(self, table, i)).is_some() {
                valid += 1;
                let va = base + i * level.span();
                let (lo, _) = span.unwrap_or((va, va));
                span = Some((lo, va + level.span()));
            }
        }
        let (lo, hi) = span.unwrap_or((base, base));
        writeln!(
            f,
            "{pad:indent$}{level:?} table {:?} {:#x}: {valid} valid PTEs, VA {lo:#x}..{hi:#x}",
            table.aperture, table.addr
        )
    }
}

/// `/sys/kernel/debug/ruvm/page_tables`: the page tables of every present GPU with an MMU.
pub(crate) struct TablesView;

impl kernel::debugfs::Writer for TablesView {
    fn write(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mmus = crate::gpu::mmus().map_err(|_| core::fmt::Error)?;
        if mmus.is_empty() {
            writeln!(f, "no GPU with an MMU")?;
        }
        for (id, mmu) in mmus.iter() {
            mmu.dump(*id, f)?;
        }
        Ok(())
    }
}
