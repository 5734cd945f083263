// SPDX-License-Identifier: GPL-2.0

//! A simulated GPU's MMU: the page tables of its kernel VA space, in the GPU's own memory, and
//! the walk its copy engine does through them, with a TLB.
//!
//! # Tables
//!
//! Every table and directory takes 4 KiB of the GPU's memory: a vidmem chunk when the GPU has
//! vidmem (aperture video), else a zeroed sysmem page DMA-mapped for the GPU (aperture system
//! coherent, at its DMA address). A table is allocated when a mapping first needs it and freed
//! when it empties (the tree's rules, [`mmu_tree`]); the root goes when nothing is mapped, so
//! an idle GPU holds no page-table memory. Tables are counted by the audit (`pt_tables`,
//! `pt_bytes`).
//!
//! # The walk
//!
//! The engine translates an address by reading the tables' words from memory, through the
//! same DMA translation it reaches any memory by ([`SimIommu`]): nothing but the root's address
//! is kept beside them, so what the engine sees is exactly what was written. A TLB of
//! [`TLB_ENTRIES`] translations (direct-mapped by 4 KiB page) caches successful walks; every
//! unmap and every test write of an entry invalidates it whole, so no stale entry is used.
//! A failed translation is a GPU MMU fault: `EFAULT`, and a line
//! `sim GPU N: MMU fault at VA 0x..., <reason>`.
//!
//! # Locking
//!
//! One mutex per MMU (`state`), taken under a mem's lock (mapping, unmapping) or a GPU access
//! guard (copies), never the other way round; under it are taken the PMM's lock (vidmem tables)
//! and the simulated translation's lock, both below it in the crate's lock order. Bytes are
//! copied after it is released.

use kernel::{
    new_mutex,
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
    sync::{Arc, Mutex},
};

use crate::{
    audit::{Class, Counted},
    bind::{
        dma::DmaDevice,
        pages::{ChunkFlags, ChunkList},
        ratelimit,
    },
};

use super::{
    dma::{GpuTable, Tracker},
    mmu_fmt::{self, Access, Aperture, Fault, Level, Pde, Pte, TableReader, Translation},
    mmu_tree::{self, TableMem, Tree, TreeError},
    pmm::{Pmm, VidChunk},
    sim::{SimIommu, MAX_PIECE},
};

/// The memory one table or directory takes.
pub(crate) const TABLE_BYTES: u64 = 4096;

/// Translations the TLB holds.
pub(crate) const TLB_ENTRIES: usize = 64;

/// The most words one walk reads (PDE3, PDE2, PDE1, two PDE0 halves, two PTEs).
pub(crate) const WALK_MAX: usize = 8;

/// Pages mapped between two looks at a pending signal.
const SIGNAL_EVERY: u64 = 512;

/// Where a table's memory comes from.
enum TableStore {
    /// A sysmem page, DMA-mapped for the GPU.
    Sys(GpuTable),
    /// A 4 KiB vidmem chunk of the GPU.
    Vid { _chunk: VidChunk },
}

/// One table or directory, counted while it lives.
struct Table {
    store: TableStore,
    _tables: Counted,
    _bytes: Counted,
}

/// A cached translation: the 4 KiB page `tag` (a VA shifted right by 12) is in the page
/// `pte` maps, of `page_size` bytes.
#[derive(Clone, Copy)]
struct TlbEntry {
    tag: u64,
    pte: Pte,
    page_size: u64,
}

/// The MMU's state, under its lock.
struct MmuState {
    /// The kernel VA space's tables; `None` while nothing is mapped.
    tree: Option<Tree>,
    /// Every table, by address: who owns its memory (not read by the walk).
    tables: RBTree<u64, Table>,
    tlb: [Option<TlbEntry>; TLB_ENTRIES],
    /// The GPU is gone: every table freed, nothing more is mapped.
    dead: bool,
}

/// A simulated GPU's MMU.
#[pin_data]
pub(crate) struct Mmu {
    id: u32,
    dma: Arc<DmaDevice>,
    limit: u64,
    tracker: Arc<Tracker>,
    sim: Arc<SimIommu>,
    pmm: Option<Arc<Pmm>>,
    #[pin]
    state: Mutex<MmuState>,
}

/// One walk, word by word (`RUVM_IOCTL_GPU_PT_WALK`).
pub(crate) struct WalkReport {
    /// Every word read, in order: its aperture, address and value.
    pub(crate) reads: [(Aperture, u64, u64); WALK_MAX],
    pub(crate) count: usize,
    pub(crate) result: Result<Translation, Fault>,
}

/// The errno of a failed tree operation.
fn tree_error(e: TreeError) -> Error {
    match e {
        TreeError::NoMemory => ENOMEM,
        TreeError::Invalid | TreeError::Encode(_) => EINVAL,
        TreeError::Busy => EEXIST,
        TreeError::NotMapped => ENXIO,
        TreeError::Unreadable => EIO,
    }
}

/// The tables of one MMU as the tree sees them: words read and written where the engine
/// reads them, tables allocated from the GPU's memory.
struct Tables<'a> {
    mmu: &'a Mmu,
    map: &'a mut RBTree<u64, Table>,
}

impl TableReader for Tables<'_> {
    fn read(&mut self, aperture: Aperture, addr: u64) -> Option<u64> {
        self.mmu.read_word(aperture, addr)
    }
}

impl TableMem for Tables<'_> {
    fn write(&mut self, aperture: Aperture, addr: u64, value: u64) -> Result<(), TreeError> {
        let at = self
            .mmu
            .engine_addr(aperture, addr)
            .ok_or(TreeError::Unreadable)?;
        self.mmu
            .sim
            .write_word(at, value)
            .map_err(|_| TreeError::Unreadable)
    }

    fn alloc(&mut self, size: u64) -> Result<Pde, TreeError> {
        if size > TABLE_BYTES {
            return Err(TreeError::Invalid);
        }
        let (table, pde) = self.mmu.new_table().map_err(|_| TreeError::NoMemory)?;
        let node = RBTreeNode::new(pde.addr, table, GFP_KERNEL).map_err(|_| TreeError::NoMemory)?;
        self.map.insert(node);
        Ok(pde)
    }

    fn free(&mut self, table: Pde, _size: u64) {
        drop(self.map.remove(&table.addr));
    }
}

impl Mmu {
    /// The MMU of simulated GPU `id`: its tables in `pmm`'s vidmem if it has one, else in
    /// sysmem mapped on `dma` (below `limit`, tracked by `tracker`); read through `sim`.
    pub(super) fn new(
        id: u32,
        dma: Arc<DmaDevice>,
        limit: u64,
        tracker: Arc<Tracker>,
        sim: Arc<SimIommu>,
        pmm: Option<Arc<Pmm>>,
    ) -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Mmu {
                id,
                dma,
                limit,
                tracker,
                sim,
                pmm,
                state <- new_mutex!(MmuState {
                    tree: None,
                    tables: RBTree::new(),
                    tlb: [None; TLB_ENTRIES],
                    dead: false,
                }),
            }),
            GFP_KERNEL,
        )
    }

    /// The aperture of the GPU's tables.
    fn table_aperture(&self) -> Aperture {
        match self.pmm {
            Some(_) => Aperture::Video,
            None => Aperture::SysCoherent,
        }
    }

    /// A new zeroed table, and where it is.
    fn new_table(&self) -> Result<(Table, Pde)> {
        let (store, addr) = match &self.pmm {
            Some(pmm) => {
                // Stored chunks are zeroed as they are handed out.
                let chunk = pmm.alloc(TABLE_BYTES, true)?;
                let phys = chunk.phys();
                (TableStore::Vid { _chunk: chunk }, phys)
            }
            None => {
                let flags = ChunkFlags {
                    zero: true,
                    fail_fast: false,
                };
                // The table's own tokens count it; the list's tag counts nothing.
                let pages =
                    ChunkList::alloc(0, 1, flags, Counted::new(Class::PtBytes, 0), || Ok(()))?;
                let table = GpuTable::new(
                    self.dma.clone(),
                    pages,
                    self.limit,
                    self.tracker.clone(),
                    Some(self.sim.clone()),
                )?;
                let addr = table.addrs().next().ok_or(EINVAL)?;
                (TableStore::Sys(table), addr)
            }
        };
        let table = Table {
            store,
            _tables: Counted::new(Class::PtTables, 1),
            _bytes: Counted::new(Class::PtBytes, TABLE_BYTES),
        };
        Ok((table, Pde::new(addr, self.table_aperture())))
    }

    /// The DMA address at which the engine reaches `addr` of `aperture`.
    fn engine_addr(&self, aperture: Aperture, addr: u64) -> Option<u64> {
        match aperture {
            Aperture::SysCoherent | Aperture::SysNonCoherent => Some(addr),
            Aperture::Video => self.pmm.as_ref()?.engine_addr(addr).ok(),
            Aperture::Peer => None,
        }
    }

    /// The word at `addr` of `aperture`, as the engine reads it.
    fn read_word(&self, aperture: Aperture, addr: u64) -> Option<u64> {
        self.sim.read_word(self.engine_addr(aperture, addr)?)
    }

    /// Logs an MMU fault at `va` and returns its errno.
    fn fault(&self, va: u64, why: &str) -> Error {
        if ratelimit::printk_ok() {
            pr_err!("sim GPU {}: MMU fault at VA {va:#x}, {why}\n", self.id);
        }
        EFAULT
    }

    /// Whether the root table maps nothing.
    fn root_empty(&self, root: &Pde) -> bool {
        (0..Level::Pde3.entries()).all(|i| {
            root.addr
                .checked_add(i * 8)
                .and_then(|a| self.read_word(root.aperture, a))
                == Some(0)
        })
    }

    /// Frees the root when nothing is mapped any more.
    fn release_if_empty(&self, st: &mut MmuState) {
        if st.tree.as_ref().is_some_and(|t| self.root_empty(&t.root())) {
            if let Some(tree) = st.tree.take() {
                let mut m = Tables {
                    mmu: self,
                    map: &mut st.tables,
                };
                tree.destroy(&mut m);
            }
        }
    }

    /// Maps `count` pages of `page_size` bytes from `va` on, page `i` as `pte_of(i)` says; all
    /// or nothing (a failure unmaps what was mapped). `EEXIST` if any page is mapped already,
    /// `ENODEV` once the GPU is gone; a pending signal stops it (`ERESTARTSYS`).
    pub(crate) fn map(
        &self,
        va: u64,
        page_size: u64,
        count: u64,
        mut pte_of: impl FnMut(u64) -> Result<Pte>,
    ) -> Result {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if st.dead {
            return Err(ENODEV);
        }
        let mut m = Tables {
            mmu: self,
            map: &mut st.tables,
        };
        let tree = match st.tree.take() {
            Some(t) => t,
            None => Tree::new(&mut m).map_err(tree_error)?,
        };
        let mut done = 0;
        let r = loop {
            if done == count {
                break Ok(());
            }
            if done % SIGNAL_EVERY == SIGNAL_EVERY - 1 && kernel::current!().signal_pending() {
                break Err(ERESTARTSYS);
            }
            let at = done
                .checked_mul(page_size)
                .and_then(|o| va.checked_add(o))
                .ok_or(EINVAL);
            let step = at.and_then(|at| {
                let pte = pte_of(done)?;
                tree.map(&mut m, at, page_size, &pte).map_err(tree_error)
            });
            if let Err(e) = step {
                break Err(e);
            }
            done += 1;
        };
        if r.is_err() && done > 0 {
            if let Err(e) = tree.unmap_range(&mut m, va, done * page_size) {
                pr_warn!("sim GPU {}: undoing a mapping at {va:#x}: {e:?}\n", self.id);
            }
        }
        st.tree = Some(tree);
        // A new entry replaces no valid one, but a TLB may be refilled by a walk of the old
        // invalid state only if it cached faults, which it does not; flushed anyway, cheaply.
        st.tlb = [None; TLB_ENTRIES];
        self.release_if_empty(st);
        r
    }

    /// Unmaps every page in `[va, va + len)`, invalidates the TLB, and frees the tables left
    /// empty. A failure (tables unreadable: corrupted by a test) is logged; what it could not
    /// free goes when the GPU does.
    pub(crate) fn unmap(&self, va: u64, len: u64) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if st.dead {
            return;
        }
        if let Some(tree) = st.tree.as_ref() {
            let mut m = Tables {
                mmu: self,
                map: &mut st.tables,
            };
            if let Err(e) = tree.unmap_range(&mut m, va, len) {
                pr_warn!(
                    "sim GPU {}: unmapping {va:#x}+{len:#x}: page tables {e:?}\n",
                    self.id
                );
            }
        }
        st.tlb = [None; TLB_ENTRIES];
        self.release_if_empty(st);
    }

    /// The GPU is going: every table is freed (the root last) and nothing more is mapped.
    pub(crate) fn kill(&self) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.dead = true;
        st.tlb = [None; TLB_ENTRIES];
        if let Some(tree) = st.tree.take() {
            let mut m = Tables {
                mmu: self,
                map: &mut st.tables,
            };
            tree.destroy(&mut m);
        }
        // Whatever a corrupted entry hid from the tree's walk.
        st.tables = RBTree::new();
    }

    /// Translates `va` for `access`, through the TLB: the DMA address the engine reaches it at
    /// and the bytes left in its page; a logged fault (`EFAULT`) otherwise.
    fn translate(&self, va: u64, access: Access) -> Result<(u64, u64)> {
        let tag = va >> 12;
        // CAST: the remainder is below `TLB_ENTRIES`.
        let slot = (tag % TLB_ENTRIES as u64) as usize;
        let mut st = self.state.lock();
        if st.dead {
            return Err(ENODEV);
        }
        let cached = st.tlb.get(slot).copied().flatten().filter(|e| e.tag == tag);
        let (pte, page_size) = match cached {
            Some(e) => (e.pte, e.page_size),
            None => {
                let root = st
                    .tree
                    .as_ref()
                    .map(Tree::root)
                    .ok_or_else(|| self.fault(va, Fault::NoPde(Level::Pde3).reason()))?;
                let mut r = |ap, addr| self.read_word(ap, addr);
                let t = mmu_fmt::walk(&mut r, &root, va, Access::Read)
                    .map_err(|f| self.fault(va, f.reason()))?;
                if let Some(e) = st.tlb.get_mut(slot) {
                    *e = Some(TlbEntry {
                        tag,
                        pte: t.pte,
                        page_size: t.page_size,
                    });
                }
                (t.pte, t.page_size)
            }
        };
        drop(st);
        if access == Access::Write && pte.read_only {
            return Err(self.fault(va, Fault::ReadOnly.reason()));
        }
        let inside = va & (page_size - 1);
        let addr = pte.addr.checked_add(inside).ok_or(EFAULT)?;
        let dma = self
            .engine_addr(pte.aperture, addr)
            .ok_or_else(|| self.fault(va, "page not backed"))?;
        Ok((dma, page_size - inside))
    }

    /// The engine copies `len` bytes from GPU VA `src` to `dst`, translating both as it goes;
    /// `EFAULT` (logged) at the first address that does not translate. A pending signal stops
    /// it between pieces.
    pub(crate) fn copy(&self, dst: u64, src: u64, len: u64) -> Result {
        if len == 0 || dst.checked_add(len).is_none() || src.checked_add(len).is_none() {
            return Err(EINVAL);
        }
        let mut done = 0;
        while done < len {
            if kernel::current!().signal_pending() {
                return Err(ERESTARTSYS);
            }
            let (s, s_left) = self.translate(src + done, Access::Read)?;
            let (d, d_left) = self.translate(dst + done, Access::Write)?;
            let n = (len - done).min(s_left).min(d_left).min(MAX_PIECE as u64);
            // CAST: at most `MAX_PIECE`, a `usize`.
            self.sim.copy(self.id, d, s, n as usize)?;
            done += n;
        }
        Ok(())
    }

    /// Walks `va` as the engine would (without the TLB), recording every word read.
    pub(crate) fn walk(&self, va: u64) -> WalkReport {
        let st = self.state.lock();
        let mut reads = [(Aperture::SysCoherent, 0, 0); WALK_MAX];
        let mut count = 0;
        let result = match st.tree.as_ref().map(Tree::root) {
            None if va >= mmu_fmt::VA_END => Err(Fault::VaRange),
            None => Err(Fault::NoPde(Level::Pde3)),
            Some(root) => {
                let mut r = |ap, addr| {
                    let v = self.read_word(ap, addr);
                    if let Some(slot) = reads.get_mut(count) {
                        *slot = (ap, addr, v.unwrap_or(0));
                        count += 1;
                    }
                    v
                };
                mmu_fmt::walk(&mut r, &root, va, Access::Read)
            }
        };
        drop(st);
        WalkReport {
            reads,
            count,
            result,
        }
    }

    /// Overwrites the leaf entry for `va` (its PTE, or the PDE0 half of a 2 MiB page; for an
    /// address that does not translate, the PTE or PDE0 slot its walk ended at) with `value`
    /// and invalidates the TLB; returns the old entry. `ENXIO` if the walk did not reach a
    /// leaf slot (a directory above it is missing).
    pub(crate) fn write_leaf(&self, va: u64, value: u64) -> Result<u64> {
        let w = self.walk(va);
        // PDE3, PDE2, PDE1, then the PDE0 half that holds a 2 MiB page.
        const PDE0_LOW: usize = 3;
        let leaf = match w.result {
            Ok(t) if t.page_size == Level::Pde0.span() => PDE0_LOW,
            Ok(_) | Err(Fault::NoPte(_)) => w.count.checked_sub(1).ok_or(ENXIO)?,
            Err(Fault::NoPde(Level::Pde0)) => PDE0_LOW,
            Err(_) => return Err(ENXIO),
        };
        let (ap, addr, old) = w.reads.get(leaf).copied().ok_or(ENXIO)?;
        let mut st = self.state.lock();
        if st.dead {
            return Err(ENODEV);
        }
        let at = self.engine_addr(ap, addr).ok_or(ENXIO)?;
        self.sim.write_word(at, value)?;
        st.tlb = [None; TLB_ENTRIES];
        Ok(old)
    }

    /// Its tables now: how many, and for the audit's walk, how many are DMA-mapped sysmem.
    pub(crate) fn tables(&self) -> (u64, u64) {
        let st = self.state.lock();
        let n = st.tables.iter().count() as u64;
        let sys = st
            .tables
            .values()
            .map(|t| match &t.store {
                TableStore::Sys(table) => table.count() as u64,
                TableStore::Vid { .. } => 0,
            })
            .sum();
        (n, sys)
    }
}

// The tree's root fits the table memory.
const _: () = assert!(mmu_tree::ROOT_SIZE <= TABLE_BYTES);
