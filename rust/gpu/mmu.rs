// SPDX-License-Identifier: GPL-2.0

//! A simulated GPU's MMU: the page tables of its VA spaces, in the GPU's own memory, and the
//! walk its copy engine does through them, with a TLB.
//!
//! # VA spaces
//!
//! A GPU has one kernel VA space ([`KERNEL_SPACE`], where the GPU kernel VA window is) and one
//! user VA space per open file of `/dev/ruvm` that mapped a mem there (its id is the file's,
//! [`new_space_id`]); each is a tree of its own. A space's tables go when nothing is mapped in
//! it; the file's close destroys what is left of its spaces ([`Mmu::destroy_space`]).
//!
//! # PageTables
//!
//! Every table and directory takes 4 KiB of the GPU's memory: a vidmem chunk when the GPU has
//! vidmem (aperture video), else a zeroed sysmem page DMA-mapped for the GPU (aperture system
//! coherent, at its DMA address). A table is allocated when a mapping first needs it and freed
//! when it empties (the tree's rules, [`tree`]); the root goes when nothing is mapped, so
//! an idle GPU holds no page-table memory. PageTables are counted by the audit (`pt_tables`,
//! `pt_bytes`).
//!
//! # The walk
//!
//! The engine translates an address by reading the tables' words from memory, through the
//! same DMA translation it reaches any memory by ([`SimIommu`]): it keeps nothing beside them
//! but each space's root address, so what it sees is exactly what was written. (The tree itself
//! reads and writes a table straight in its pages, found by address among the MMU's tables:
//! the same bytes, without the translation's and the PMM's locks.) A TLB of
//! [`TLB_ENTRIES`] translations (direct-mapped by 4 KiB page) caches successful walks; every
//! unmap and every test write of an entry invalidates it whole, so no stale entry is used.
//! A failed translation is a GPU MMU fault: `EFAULT`, and a line
//! `sim GPU N: MMU fault at VA 0x..., <reason>`.
//!
//! # Locking
//!
//! One mutex per MMU (`state`), taken under a mem's lock (mapping, unmapping) or a GPU access
//! guard (copies), never the other way round; under it are taken the PMM's lock (the engine
//! addresses of vidmem tables) and the simulated translation's lock, both below it in the
//! crate's lock order. Nothing is allocated under it (a stream's engine takes it in its
//! fence-signalling path): a mapping's new tables are made beforehand with it released
//! ([`Spare`]), and the mapping is done a run (one leaf table's pages) at a time under it, a run
//! that needs more tables than were made being undone (the tree prunes what it linked) and
//! tried again once one more is made, with the lock released. The VA range being mapped is its
//! caller's (a GPU VA nobody else maps), so a run mapped before a later one fails is seen only
//! by the caller's own copies through it, which reach the mem's own pages, held meanwhile; the
//! undo waits for them on this lock.
//!
//! A copy holds it from the translation of a piece until the piece's bytes have moved: an
//! unmap (which takes it to clear the entries) therefore waits for the copies in flight, and
//! no piece ever moves bytes through an address whose mapping is gone (the pages behind it
//! may already belong to another mem, another file's). This is uvm's rule: a GPU address is
//! never used after the mapping that produced it is gone.

use kernel::{
    new_mutex,
    prelude::*,
    rbtree::{RBTree, RBTreeNodeReservation},
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc, Mutex,
    },
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
    dma::{GpuTable, Pages, Tracker},
    pmm::{Pmm, VidChunk},
    sim::{SimIommu, MAX_PIECE},
};

// The page-table format and tree: `core`-only files the host tests compile too, each with a
// few helpers only those tests use.
#[allow(dead_code, reason = "helpers for the host tests")]
pub(crate) mod fmt;
#[allow(dead_code, reason = "helpers for the host tests")]
pub(crate) mod tree;

mod dump;
mod engine;
mod tables;

use tables::*;

use fmt::{Access, Aperture, Fault, Level, Pde, Pte, TableReader, Translation};
use tree::{TableMem, Tree, TreeError};

pub(crate) use dump::TablesView;

/// The memory one table or directory takes.
pub(crate) const TABLE_BYTES: u64 = 4096;

/// Translations the TLB holds.
pub(crate) const TLB_ENTRIES: usize = 64;

/// The most words one walk reads (PDE3, PDE2, PDE1, two PDE0 halves, two PTEs).
pub(crate) const WALK_MAX: usize = 8;

/// The kernel VA space's id.
pub(crate) const KERNEL_SPACE: u64 = 0;

/// A new user VA space id, never 0 and never reused while the module is loaded.
pub(crate) fn new_space_id() -> u64 {
    static NEXT: Atomic<u64> = Atomic::new(1);
    NEXT.fetch_add(1, Relaxed)
}

/// The most pages one leaf table holds, mapped in one run (between two looks at a pending
/// signal).
const RUN_MAX: usize = 512;

/// A cached translation: the 4 KiB page `tag` (a VA shifted right by 12) of VA space `space`
/// is in the page `pte` maps, of `page_size` bytes.
#[derive(Clone, Copy)]
struct TlbEntry {
    space: u64,
    tag: u64,
    pte: Pte,
    page_size: u64,
}

/// The MMU's state, under its lock.
struct MmuState {
    /// Every VA space with something mapped, by id: its tree.
    spaces: KVec<(u64, Tree)>,
    /// Every table, by address: who owns its memory (not read by the walk).
    tables: RBTree<u64, PageTable>,
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

/// How one run of a mapping ended.
enum Run {
    /// This many pages were mapped.
    Mapped(u64),
    /// It needed a table and none was made: more are to be made, the lock released.
    Starved,
    /// The space is new and the list of spaces (this long) is full: a longer one is to be
    /// made, the lock released.
    NoRoom(usize),
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
                    spaces: KVec::new(),
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
    fn new_table(&self) -> Result<(PageTable, Pde)> {
        let (store, bytes, addr) = match &self.pmm {
            Some(pmm) => {
                // Stored chunks are zeroed as they are handed out.
                let chunk = pmm.alloc_table(TABLE_BYTES)?;
                let phys = chunk.phys();
                let bytes = pmm.storage_of(phys)?;
                (TableStore::Vid { _chunk: chunk }, bytes, phys)
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
                    pages.clone(),
                    self.limit,
                    self.tracker.clone(),
                    Some(self.sim.clone()),
                )?;
                let addr = table.addrs().next().ok_or(EINVAL)?;
                (TableStore::Sys(table), (pages, 0), addr)
            }
        };
        if addr % TABLE_BYTES != 0 {
            return Err(EINVAL);
        }
        let table = PageTable {
            store,
            bytes,
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

    /// Where space `space` is in `st.spaces`.
    fn space_index(st: &MmuState, space: u64) -> Option<usize> {
        st.spaces.iter().position(|(id, _)| *id == space)
    }

    /// The root table of space `space`, if anything is mapped in it.
    fn root_of(st: &MmuState, space: u64) -> Option<Pde> {
        Self::space_index(st, space)
            .and_then(|i| st.spaces.get(i))
            .map(|(_, t)| t.root())
    }

    /// Frees space `space`'s tables, the root last, whatever they map.
    fn destroy_in(&self, st: &mut MmuState, space: u64) {
        let tree = Self::space_index(st, space).and_then(|i| st.spaces.remove(i).ok());
        if let Some((_, tree)) = tree {
            let mut none = Spare::new();
            let mut m = PageTables::new(self, &mut st.tables, &mut none);
            tree.destroy(&mut m);
        }
    }

    /// Frees space `space`'s root when nothing is mapped in it any more.
    fn release_if_empty(&self, st: &mut MmuState, space: u64) {
        if Self::root_of(st, space).is_some_and(|r| self.root_empty(&r)) {
            self.destroy_in(st, space);
        }
    }

    /// Destroys what is left of VA space `space` (its file is closing) and invalidates the TLB.
    pub(crate) fn destroy_space(&self, space: u64) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        self.destroy_in(st, space);
        st.tlb = [None; TLB_ENTRIES];
    }

    /// Maps `count` pages of `page_size` bytes from `va` on in VA space `space`, page `i` as
    /// `pte_of(i)` says; all or nothing (a failure unmaps what was mapped). `EEXIST` if any
    /// page is mapped already, `ENODEV` once the GPU is gone; a pending signal stops it
    /// (`ERESTARTSYS`).
    pub(crate) fn map(
        &self,
        space: u64,
        va: u64,
        page_size: u64,
        count: u64,
        mut pte_of: impl FnMut(u64) -> Result<Pte>,
    ) -> Result {
        // One leaf table's worth of entries at a time: the path to it is walked once. Each run
        // is mapped under the MMU's lock with the tables made beforehand. A run that finds
        // none left is undone by the tree (what it linked is pruned, its tables freed), one
        // table more than it had is made with the lock released, and it is tried again: a run
        // needs at most [`SPARE_PER_RUN`], and one that needs one table (the usual case) makes
        // just that one, so a GPU with little memory left is asked for no more than the
        // mapping needs.
        let mut ptes = KVec::with_capacity(RUN_MAX, GFP_KERNEL)?;
        let mut spare = Spare::new();
        let mut room = None;
        // Tables the run being tried needs at least (it starved with one fewer).
        let mut want = 0;
        let mut done = 0;
        let r = loop {
            if done == count {
                break Ok(());
            }
            if kernel::current!().signal_pending() {
                break Err(ERESTARTSYS);
            }
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let step = self.map_step(
                st,
                (space, va, page_size),
                (done, count),
                &mut ptes,
                &mut pte_of,
                (&mut spare, &mut room),
            );
            drop(guard);
            let more = match step {
                Ok(Run::Mapped(n)) => {
                    done += n;
                    want = 0;
                    continue;
                }
                Ok(Run::Starved) if want < SPARE_PER_RUN => {
                    want += 1;
                    spare.fill(self, want)
                }
                // A run never needs more: the tree is corrupt (a test wrote it).
                Ok(Run::Starved) => Err(EIO),
                Ok(Run::NoRoom(spaces)) => KVec::with_capacity(spaces * 2 + 1, GFP_KERNEL)
                    .map(|v| room = Some(v))
                    .map_err(Error::from),
                Err(e) => Err(e),
            };
            if let Err(e) = more {
                break Err(e);
            }
        };
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if !st.dead {
            if r.is_err() && done > 0 {
                if let Some(tree) = Self::space_index(st, space)
                    .and_then(|i| st.spaces.get(i))
                    .map(|(_, t)| t)
                {
                    let mut m = PageTables::new(self, &mut st.tables, &mut spare);
                    if let Err(e) = tree.unmap_range(&mut m, va, done * page_size) {
                        pr_warn!("sim GPU {}: undoing a mapping at {va:#x}: {e:?}\n", self.id);
                    }
                }
            }
            // The TLB caches no faults, so new entries need no flush; done anyway, it is cheap.
            st.tlb = [None; TLB_ENTRIES];
            self.release_if_empty(st, space);
        }
        drop(guard);
        // Tables made and not used are freed with the lock released.
        drop(spare);
        r
    }

    /// One run of [`Self::map`], under the MMU's lock (`st`): the space's tree made if it has
    /// none (its root from `spare`, its place in `st.spaces` from `room` if they are full),
    /// then [`Self::map_some`].
    #[allow(
        clippy::too_many_arguments,
        reason = "one step of a loop whose state (the MMU's guard, the spares made with it released) is its caller's"
    )]
    fn map_step(
        &self,
        st: &mut MmuState,
        (space, va, page_size): (u64, u64, u64),
        (done, count): (u64, u64),
        ptes: &mut KVec<Pte>,
        pte_of: &mut impl FnMut(u64) -> Result<Pte>,
        (spare, room): (&mut Spare, &mut Option<KVec<(u64, Tree)>>),
    ) -> Result<Run> {
        if st.dead {
            return Err(ENODEV);
        }
        if Self::space_index(st, space).is_none() {
            if st.spaces.len() == st.spaces.capacity() {
                match room.take() {
                    Some(mut bigger) if bigger.capacity() > st.spaces.len() => {
                        for s in st.spaces.drain_all() {
                            // Room for every space: this does not allocate.
                            let _ = bigger.push_within_capacity(s);
                        }
                        st.spaces = bigger;
                    }
                    _ => return Ok(Run::NoRoom(st.spaces.len())),
                }
            }
            let mut m = PageTables::new(self, &mut st.tables, spare);
            let tree = match Tree::new(&mut m) {
                Ok(t) => t,
                Err(_) if m.starved => return Ok(Run::Starved),
                Err(e) => return Err(tree_error(e)),
            };
            // Room was made above: this does not allocate.
            if let Err(e) = st.spaces.push_within_capacity((space, tree)) {
                let mut m = PageTables::new(self, &mut st.tables, spare);
                m.free(e.0 .1.root(), tree::ROOT_SIZE);
                return Err(ENOMEM);
            }
        }
        let i = Self::space_index(st, space).ok_or(EINVAL)?;
        let tree = &st.spaces.get(i).ok_or(EINVAL)?.1;
        let mut m = PageTables::new(self, &mut st.tables, spare);
        match Self::map_some(tree, &mut m, va, page_size, done, count, ptes, pte_of) {
            Ok(n) => Ok(Run::Mapped(n)),
            Err(_) if m.starved => Ok(Run::Starved),
            Err(e) => Err(e),
        }
    }

    /// Maps the pages from `done` on (of `count`) that the leaf table of the first one holds,
    /// their entries gathered in `ptes`: how many.
    #[allow(
        clippy::too_many_arguments,
        reason = "the tree, the range and the scratch space of one leaf table's run, all borrowed from the caller"
    )]
    fn map_some(
        tree: &Tree,
        m: &mut PageTables<'_>,
        va: u64,
        page_size: u64,
        done: u64,
        count: u64,
        ptes: &mut KVec<Pte>,
        pte_of: &mut impl FnMut(u64) -> Result<Pte>,
    ) -> Result<u64> {
        let at = done
            .checked_mul(page_size)
            .and_then(|o| va.checked_add(o))
            .ok_or(EINVAL)?;
        ptes.clear();
        // CAST: RUN_MAX fits in a u64.
        let room = Tree::run_pages(at, page_size).map_err(tree_error)?;
        let want = (count - done).min(room).min(RUN_MAX as u64);
        for i in done..done + want {
            // Room for a run was reserved: this does not allocate.
            ptes.push_within_capacity(pte_of(i)?).map_err(|_| ENOMEM)?;
        }
        let n = tree.map_run(m, at, page_size, ptes).map_err(tree_error)?;
        // CAST: at most RUN_MAX.
        Ok(n as u64)
    }

    /// Unmaps every page in `[va, va + len)`, invalidates the TLB, and frees the tables left
    /// empty. A failure (tables unreadable: corrupted by a test) is logged; what it could not
    /// free goes when the GPU does.
    pub(crate) fn unmap(&self, space: u64, va: u64, len: u64) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if st.dead {
            return;
        }
        let tree = Self::space_index(st, space)
            .and_then(|i| st.spaces.get(i))
            .map(|(_, t)| t);
        if let Some(tree) = tree {
            let mut none = Spare::new();
            let mut m = PageTables::new(self, &mut st.tables, &mut none);
            if let Err(e) = tree.unmap_range(&mut m, va, len) {
                pr_warn!(
                    "sim GPU {}: unmapping {va:#x}+{len:#x}: page tables {e:?}\n",
                    self.id
                );
            }
        }
        st.tlb = [None; TLB_ENTRIES];
        self.release_if_empty(st, space);
    }

    /// The GPU is going: every table is freed (the root last) and nothing more is mapped.
    pub(crate) fn kill(&self) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.dead = true;
        st.tlb = [None; TLB_ENTRIES];
        while let Some(id) = st.spaces.first().map(|(id, _)| *id) {
            self.destroy_in(st, id);
        }
        // Whatever a corrupted entry hid from the tree's walk.
        st.tables = RBTree::new();
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
const _: () = assert!(tree::ROOT_SIZE <= TABLE_BYTES);

/// `EINVAL` unless a VA copy of `len` bytes from `src` to `dst` is one the engine can try: at
/// least a byte, and neither range wrapping around.
pub(crate) fn check_copy(dst: u64, src: u64, len: u64) -> Result {
    if len == 0 || dst.checked_add(len).is_none() || src.checked_add(len).is_none() {
        return Err(EINVAL);
    }
    Ok(())
}
