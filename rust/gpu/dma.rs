// SPDX-License-Identifier: GPL-2.0

//! A GPU's DMA tables as ruvm counts them: the binding layer's [`DmaTable`], counted by the
//! audit (`dma_mappings`, `dma_bytes`) and in the GPU's mapped bytes, and recorded for a
//! simulated GPU's engine.
//!
//! A table is made under a [`super::GpuAccess`] guard; the GPU's [`Tracker`] counts it until it
//! is dropped, so the GPU's removal can wait for the drops in flight (see [`super`]).

use kernel::{
    new_condvar, new_mutex,
    page::PAGE_SIZE,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc, CondVar, Mutex,
    },
};

use crate::{
    audit::{Class, Counted, Uncounted},
    bind::{
        attach::{Attachment, DmaBuf},
        dma::{DmaDevice, DmaTable},
        pages::ChunkList,
        workqueue::ModuleQueue,
    },
};

use super::sim::{SimIommu, SimRecords};

/// The pages a GPU maps: a chunk list whose tag is the audit's count of its chunks.
pub(crate) type Pages = ChunkList<Counted>;

/// One GPU's DMA tables alive now, and their bytes. Its mutex is a leaf.
#[pin_data]
pub(crate) struct Tracker {
    bytes: Atomic<u64>,
    /// The GPU's removal has begun: its tables may no longer be kept anywhere (see
    /// [`GpuTable::keepable`]).
    gone: Atomic<bool>,
    #[pin]
    tables: Mutex<u64>,
    /// Signalled when the last table goes.
    #[pin]
    empty: CondVar,
}

impl Tracker {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            bytes: Atomic::new(0),
            gone: Atomic::new(false),
            tables <- new_mutex!(0),
            empty <- new_condvar!(),
        })
    }

    /// Bytes DMA-mapped for the GPU now.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    fn add(&self, bytes: u64) {
        *self.tables.lock() += 1;
        self.bytes.fetch_add(bytes, Relaxed);
    }

    fn remove(&self, bytes: u64) {
        self.bytes.fetch_sub(bytes, Relaxed);
        let mut n = self.tables.lock();
        *n -= 1;
        if *n == 0 {
            self.empty.notify_all();
        }
    }

    /// Takes `bytes` out of the mapped bytes until the returned token drops (see
    /// [`GpuTable::unseen`]).
    fn unsee(self: &Arc<Self>, count: u64, bytes: u64) -> Unseen {
        self.bytes.fetch_sub(bytes, Relaxed);
        Unseen {
            _maps: Uncounted::new(Class::DmaMappings, count),
            _bytes: Uncounted::new(Class::DmaBytes, bytes),
            tracker: self.clone(),
            bytes,
        }
    }

    /// The GPU's removal has begun: from now on no holder keeps a table of it (set before the
    /// removal visits the holders, which check it under their own locks), and copies stop at
    /// their next piece.
    pub(crate) fn close(&self) {
        self.gone.store(true, Relaxed);
    }

    /// Whether the GPU's removal has begun.
    pub(crate) fn is_closed(&self) -> bool {
        self.gone.load(Relaxed)
    }

    /// Waits until the GPU has no table left (its removal, once no new one can be made).
    pub(crate) fn wait_empty(&self) {
        let mut n = self.tables.lock();
        while *n > 0 {
            self.empty.wait(&mut n);
        }
    }
}

/// Every chunk of a chunk list DMA-mapped for one GPU, counted while it lives.
///
/// Field order is teardown order: the simulated engine forgets the mappings before they go,
/// and the tracker hears of it only after they are gone.
pub(crate) struct GpuTable {
    _sim: Option<SimRecords>,
    table: Table,
    /// Taken by `Drop` for another exporter's buffer, whose release is deferred.
    counts: Option<Counts>,
}

/// What counts a table while it maps: the audit's classes and its GPU's tracker.
struct Counts {
    _maps: Counted,
    _bytes: Counted,
    tracked: Tracked,
}

/// The queue that releases attachments of other exporters' buffers (see `GpuTable`'s drop).
static RELEASES: ModuleQueue = ModuleQueue::new();

/// Makes the release queue (module init).
pub(crate) fn init() -> Result {
    RELEASES.init(c"ruvm-releases")
}

/// Waits for the releases queued so far: what reports counts of tables (the audit, the GPU
/// list) sees every table dropped before it as gone.
pub(crate) fn settle_releases() {
    RELEASES.flush();
}

/// Waits for every release queued, then frees the queue (unload, once no mem is left).
pub(crate) fn exit() {
    RELEASES.destroy();
}

impl Drop for GpuTable {
    /// Another exporter's buffer is unmapped and detached on the release queue, never where
    /// the table happens to go: its exporter's calls take the buffer's reservation lock, whose
    /// holder may be waiting for one of ruvm's fences, which the stream engine (which drops
    /// retired operations, and the tables they held) has yet to signal. The table stays
    /// counted (its GPU's removal waits for it) until the release is done; without memory to
    /// queue it, it is done here.
    fn drop(&mut self) {
        if let Table::Buffer(a) = &mut self.table {
            if let (Some(a), Some(c)) = (a.take(), self.counts.take()) {
                match RELEASES.get() {
                    Some(q) => {
                        // On failure the closure, and the attachment with it, drops here.
                        let _ = q.try_spawn(GFP_KERNEL, move || drop((a, c)));
                    }
                    None => drop((a, c)),
                }
            }
        }
    }
}

/// What a [`GpuTable`] maps: a mem's chunks, or another exporter's dma-buf, page by page.
enum Table {
    Chunks(DmaTable<Counted>),
    /// `None` once its release is queued.
    Buffer(Option<Attachment>),
}

impl Table {
    fn count(&self) -> usize {
        match self {
            Table::Chunks(t) => t.count(),
            Table::Buffer(a) => a.as_ref().map_or(0, |a| a.count()),
        }
    }

    fn chunk_len(&self) -> usize {
        match self {
            Table::Chunks(t) => t.chunk_len(),
            Table::Buffer(_) => PAGE_SIZE,
        }
    }

    fn addr(&self, i: usize) -> Option<u64> {
        match self {
            Table::Chunks(t) => t.addr(i),
            Table::Buffer(a) => a.as_ref()?.addr(i),
        }
    }
}

/// A table's place in its GPU's [`Tracker`], given back on drop.
struct Tracked {
    tracker: Arc<Tracker>,
    bytes: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.tracker.remove(self.bytes);
    }
}

/// A table left out of the counts that show mappings while this lives: the audit's
/// `dma_mappings` and `dma_bytes`, and its GPU's mapped bytes.
pub(crate) struct Unseen {
    _maps: Uncounted,
    _bytes: Uncounted,
    tracker: Arc<Tracker>,
    bytes: u64,
}

impl Drop for Unseen {
    fn drop(&mut self) {
        self.tracker.bytes.fetch_add(self.bytes, Relaxed);
    }
}

impl GpuTable {
    /// Maps `pages` on `dev`, whose window ends at `limit`; see [`DmaTable::new`].
    pub(super) fn new(
        dev: Arc<DmaDevice>,
        pages: Arc<Pages>,
        limit: u64,
        tracker: Arc<Tracker>,
        sim: Option<Arc<SimIommu>>,
    ) -> Result<Self> {
        let table = DmaTable::new(dev, pages, limit)?;
        let sim = match sim {
            None => None,
            Some(iommu) => Some(SimRecords::new(iommu, &table)?),
        };
        Ok(Self::tracked(Table::Chunks(table), sim, tracker))
    }

    /// Attaches another exporter's dma-buf `buf` to `dev` and maps it, page by page (see
    /// [`Attachment::new`]). A simulated GPU cannot reach it (`EOPNOTSUPP`): its engine reads
    /// pages through records of ruvm's own mappings, and an importer never sees a foreign
    /// buffer's pages.
    pub(super) fn attach(
        dev: &DmaDevice,
        buf: &DmaBuf,
        limit: u64,
        tracker: Arc<Tracker>,
        sim: bool,
    ) -> Result<Self> {
        if sim {
            return Err(crate::bind::errno::eopnotsupp());
        }
        let a = Attachment::new(buf, dev, limit)?;
        Ok(Self::tracked(Table::Buffer(Some(a)), None, tracker))
    }

    /// `table`, counted by the audit and in its GPU's tracker from now on.
    fn tracked(table: Table, sim: Option<SimRecords>, tracker: Arc<Tracker>) -> Self {
        let n = table.count() as u64;
        let bytes = n * table.chunk_len() as u64;
        tracker.add(bytes);
        Self {
            _sim: sim,
            table,
            counts: Some(Counts {
                _maps: Counted::new(Class::DmaMappings, n),
                _bytes: Counted::new(Class::DmaBytes, bytes),
                tracked: Tracked { tracker, bytes },
            }),
        }
    }

    /// Leaves the table out of the audit's DMA classes and its GPU's mapped bytes until the
    /// token drops: vidmem storage kept for reuse is no mem's and no root's, and is counted
    /// apart (it stays mapped, and its GPU's removal still waits for it).
    pub(crate) fn unseen(&self) -> Option<Unseen> {
        let t = &self.counts.as_ref()?.tracked;
        Some(t.tracker.unsee(self.table.count() as u64, t.bytes))
    }

    /// Whether the table may be kept: false once its GPU's removal has begun.
    ///
    /// The one rule for every holder of tables (a mem's state, a pool's cache): a table is
    /// stored only under the holder's lock and only if this is true, and the removal marks the
    /// GPU before it visits each holder under the same lock. So a table stored before the
    /// visit is found by it, and one stored after is refused; none outlives the removal's
    /// wait, wherever it was in transit meanwhile.
    pub(crate) fn keepable(&self) -> bool {
        self.counts
            .as_ref()
            .is_some_and(|c| !c.tracked.tracker.gone.load(Relaxed))
    }

    /// How many chunks it maps (one DMA address each).
    pub(crate) fn count(&self) -> usize {
        self.table.count()
    }

    /// The DMA address of every chunk, in order.
    pub(crate) fn addrs(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.table.count()).filter_map(|i| self.table.addr(i))
    }

    /// The DMA address of byte `offset` of the mapped pages.
    pub(crate) fn addr(&self, offset: usize) -> Result<u64> {
        let len = self.table.chunk_len();
        let base = self.table.addr(offset / len).ok_or(EINVAL)?;
        Ok(base + (offset % len) as u64)
    }
}
