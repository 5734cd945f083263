// SPDX-License-Identifier: GPL-2.0

//! The MMU's tables: each a 4 KiB page table or directory in the GPU's memory (a vidmem
//! chunk, or a DMA-mapped sysmem page), read and written in place for the tree, and the tables
//! made ahead of a mapping with the MMU's lock released.

use super::*;

/// Where a table's memory comes from.
pub(super) enum TableStore {
    /// A sysmem page, DMA-mapped for the GPU.
    Sys(GpuTable),
    /// A 4 KiB vidmem chunk of the GPU.
    Vid { _chunk: VidChunk },
}

/// One page table or directory, counted while it lives.
pub(super) struct PageTable {
    pub(super) store: TableStore,
    /// Its bytes, for the tree's own reads and writes (the engine goes through its DMA
    /// translation instead): the pages, and the table's offset in them.
    pub(super) bytes: (Arc<Pages>, usize),
    pub(super) _tables: Counted,
    pub(super) _bytes: Counted,
}

impl PageTable {
    /// The word at byte `offset` of the table.
    pub(super) fn read(&self, offset: usize) -> Option<u64> {
        let (pages, at) = &self.bytes;
        let word = pages.bytes().read_u64(at + offset).ok();
        word
    }

    /// Writes the word at byte `offset` of the table.
    pub(super) fn write(&self, offset: usize, value: u64) -> Result {
        let (pages, at) = &self.bytes;
        let written = pages.bytes().write_u64(at + offset, value);
        written
    }

    /// Reads the words from byte `offset` of the table on into `out`.
    pub(super) fn read_words(&self, offset: usize, out: &mut [u64]) -> Result {
        let (pages, at) = &self.bytes;
        let bytes = pages.bytes();
        let mut buf = [0u8; WORDS_AT_ONCE * 8];
        let mut pos = at.checked_add(offset).ok_or(EINVAL)?;
        for piece in out.chunks_mut(WORDS_AT_ONCE) {
            let b = buf.get_mut(..piece.len() * 8).ok_or(EINVAL)?;
            bytes.read(pos, b)?;
            for (w, le) in piece.iter_mut().zip(b.chunks_exact(8)) {
                let mut word = [0u8; 8];
                word.copy_from_slice(le);
                *w = u64::from_le_bytes(word);
            }
            pos += b.len();
        }
        Ok(())
    }

    /// Writes `words` from byte `offset` of the table on.
    pub(super) fn write_words(&self, offset: usize, words: &[u64]) -> Result {
        let (pages, at) = &self.bytes;
        let bytes = pages.bytes();
        let mut buf = [0u8; WORDS_AT_ONCE * 8];
        let mut pos = at.checked_add(offset).ok_or(EINVAL)?;
        for piece in words.chunks(WORDS_AT_ONCE) {
            let b = buf.get_mut(..piece.len() * 8).ok_or(EINVAL)?;
            for (le, w) in b.chunks_exact_mut(8).zip(piece) {
                le.copy_from_slice(&w.to_le_bytes());
            }
            bytes.write(pos, b)?;
            pos += b.len();
        }
        Ok(())
    }
}

/// The words a bulk table access copies through its stack buffer at once.
pub(super) const WORDS_AT_ONCE: usize = 64;

/// The table holding byte address `addr`, and `addr`'s offset in it: tables are 4 KiB,
/// aligned to 4 KiB.
pub(super) fn table_at(map: &RBTree<u64, PageTable>, addr: u64) -> Option<(&PageTable, usize)> {
    let base = addr & !(TABLE_BYTES - 1);
    // CAST: below 4 KiB.
    map.get(&base).map(|t| (t, (addr - base) as usize))
}

/// The tables of one MMU as the tree sees them: words read and written where the engine
/// reads them, new tables taken from `spare` (made beforehand with the MMU's lock released:
/// nothing is allocated under it). `starved` says an allocation found `spare` empty.
pub(super) struct PageTables<'a> {
    pub(super) mmu: &'a Mmu,
    pub(super) map: &'a mut RBTree<u64, PageTable>,
    pub(super) spare: &'a mut Spare,
    pub(super) starved: bool,
}

/// A table made ahead of its use, with the node that enters it in the MMU's table map.
pub(super) struct SpareTable {
    pub(super) table: PageTable,
    pub(super) pde: Pde,
    pub(super) node: RBTreeNodeReservation<u64, PageTable>,
}

/// Tables made ahead of a mapping, with the MMU's lock released.
pub(super) struct Spare(pub(super) KVec<SpareTable>);

/// The most new tables one run of a mapping needs: a root (a new space), then a PDE2, a PDE1,
/// a PDE0 and a leaf table.
pub(super) const SPARE_PER_RUN: usize = 5;

impl Spare {
    pub(super) fn new() -> Self {
        Self(KVec::new())
    }

    /// Makes tables until `n` are ready (with the MMU's lock released): `ENOMEM` if it cannot.
    pub(super) fn fill(&mut self, mmu: &Mmu, n: usize) -> Result {
        self.0.reserve(n.saturating_sub(self.0.len()), GFP_KERNEL)?;
        while self.0.len() < n {
            let (table, pde) = mmu.new_table()?;
            let node = RBTreeNodeReservation::new(GFP_KERNEL)?;
            // Room was reserved: this does not allocate.
            self.0.push(SpareTable { table, pde, node }, GFP_KERNEL)?;
        }
        Ok(())
    }
}

impl<'a> PageTables<'a> {
    pub(super) fn new(
        mmu: &'a Mmu,
        map: &'a mut RBTree<u64, PageTable>,
        spare: &'a mut Spare,
    ) -> Self {
        Self {
            mmu,
            map,
            spare,
            starved: false,
        }
    }
}

impl PageTables<'_> {
    /// The table holding the `n` words from `addr` on in `aperture`, and `addr`'s offset in
    /// it; `None` unless they are all in one table of this MMU's aperture.
    pub(super) fn words(
        &self,
        aperture: Aperture,
        addr: u64,
        n: usize,
    ) -> Option<(&PageTable, usize)> {
        if aperture != self.mmu.table_aperture() {
            return None;
        }
        let (t, offset) = table_at(self.map, addr)?;
        let end = n.checked_mul(8)?.checked_add(offset)?;
        (end <= TABLE_BYTES as usize).then_some((t, offset))
    }
}

impl TableReader for PageTables<'_> {
    fn read(&mut self, aperture: Aperture, addr: u64) -> Option<u64> {
        let (t, offset) = self.words(aperture, addr, 1)?;
        t.read(offset)
    }
}

impl TableMem for PageTables<'_> {
    fn write(&mut self, aperture: Aperture, addr: u64, value: u64) -> Result<(), TreeError> {
        let (t, offset) = self.words(aperture, addr, 1).ok_or(TreeError::Unreadable)?;
        t.write(offset, value).map_err(|_| TreeError::Unreadable)
    }

    fn read_words(
        &mut self,
        aperture: Aperture,
        addr: u64,
        out: &mut [u64],
    ) -> Result<(), TreeError> {
        let (t, offset) = self
            .words(aperture, addr, out.len())
            .ok_or(TreeError::Unreadable)?;
        t.read_words(offset, out).map_err(|_| TreeError::Unreadable)
    }

    fn write_words(
        &mut self,
        aperture: Aperture,
        addr: u64,
        words: &[u64],
    ) -> Result<(), TreeError> {
        let (t, offset) = self
            .words(aperture, addr, words.len())
            .ok_or(TreeError::Unreadable)?;
        t.write_words(offset, words)
            .map_err(|_| TreeError::Unreadable)
    }

    fn alloc(&mut self, size: u64) -> Result<Pde, TreeError> {
        if size > TABLE_BYTES {
            return Err(TreeError::Invalid);
        }
        let Some(s) = self.spare.0.pop() else {
            self.starved = true;
            return Err(TreeError::NoMemory);
        };
        self.map.insert(s.node.into_node(s.pde.addr, s.table));
        Ok(s.pde)
    }

    fn free(&mut self, table: Pde, _size: u64) {
        drop(self.map.remove(&table.addr));
    }
}
