// SPDX-License-Identifier: GPL-2.0

//! Stream-ordered allocation (CUDA's `cudaMallocAsync` and `cudaFreeAsync`): the ALLOC and
//! FREE operations of a submission, and what the submission does for them.
//!
//! An ALLOC makes its mem when it is planned, from a sysmem pool under the pool's reuse rules
//! ([`crate::mem::pool::pending`]), with this stream's timeline and the points it waited for
//! ([`Known`]) as the asker; the handle and mmap offset are written back into the caller's
//! operation before anything is queued, and enter the file's table with the submission. A
//! FREE takes the mem's handle out with the submission; once the operations are queued, the
//! mem is retired (its user mappings zapped), its chunks handed to its pool's pending list
//! tagged with the free's point, and what it gave up (CPU kernel and GPU mappings, DMA tables)
//! kept by the FREE operation until the stream reaches it; but a FREE (by index) of a mem of
//! the submission whose next operation is an ALLOC of the same leaves the mem whole to that
//! ALLOC ([`Batch::free_whole`]), and neither queues anything. Either way a failed submission
//! changes nothing: the mems it made are dropped unmade (their chunks back where they came
//! from), and no handle moved.

use kernel::{
    prelude::*,
    sync::Arc,
    uaccess::{UserPtr, UserSlice},
};

use crate::{
    mem::{
        pool::{
            pending::{Clock, Promise, Tag},
            Pool,
        },
        Borrow, Lent, Mem,
    },
    uapi,
};

use super::{lookup::Lookup, op::Op};

/// The most other timelines a stream remembers waiting for (the file's streams).
const KNOWN: usize = uapi::RUVM_MAX_FILE_STREAMS as usize;

/// What a stream knows of other streams' timelines, so far as its submissions go: for each
/// context, the latest point it waited for (an event's, `RUVM_OP_WAIT_EVENT`).
/// Under the stream's submission lock. Beyond [`KNOWN`] contexts, new ones are not noted (an
/// allocation then reuses less, never wrongly).
pub(crate) struct Known {
    points: [(u64, u64); KNOWN],
    n: usize,
}

impl Known {
    pub(crate) const fn new() -> Self {
        Self {
            points: [(0, 0); KNOWN],
            n: 0,
        }
    }

    /// Whether point `seqno` of `context` is known passed before what is submitted now.
    pub(crate) fn covers(&self, context: u64, seqno: u64) -> bool {
        self.points
            .iter()
            .take(self.n)
            .any(|&(c, s)| c == context && s >= seqno)
    }

    /// Notes that the stream waits for point `seqno` of `context`.
    pub(crate) fn note(&mut self, context: u64, seqno: u64) {
        if let Some(p) = self.points.iter_mut().take(self.n).find(|p| p.0 == context) {
            p.1 = p.1.max(seqno);
            return;
        }
        if let Some(p) = self.points.get_mut(self.n) {
            *p = (context, seqno);
            self.n += 1;
        }
    }

    /// Notes the points a submission's waits named.
    pub(super) fn merge(&mut self, batch: &Batch) {
        for &(c, s) in batch.known.iter() {
            self.note(c, s);
        }
    }
}

/// A mem an ALLOC of the submission made.
struct Made {
    /// The ALLOC's index in the submission.
    index: usize,
    handle: u64,
    mem: Arc<Mem>,
    /// Freed by a later FREE of the submission: never enters the file's table.
    freed: bool,
    /// Taken whole by the ALLOC after that FREE ([`Batch::free_whole`]): made with that one.
    taken: bool,
}

/// A FREE of the submission.
struct Freed {
    /// The handle it takes out of the file's table (`None`: a mem of the submission's own).
    handle: Option<u64>,
    mem: Arc<Mem>,
    /// A later ALLOC of the submission that borrowed the mem's chunks: they become its.
    heir: Option<Arc<Mem>>,
    /// Room in the mem's pool's pending list for its chunks.
    promise: Option<Promise>,
    op: Arc<Op>,
    /// The FREE's point.
    tag: Tag,
    /// Its chunks may be borrowed: the mem takes no user mapping until the submission ends.
    _lent: Option<Lent>,
}

/// The chunks an ALLOC of `count` chunks from `pool` may borrow from a mem a FREE earlier in
/// its submission frees (of [`Batch`]'s `reusable`), and that FREE's index.
pub(super) fn take_reusable(
    reusable: &mut KVec<(usize, Option<Borrow>)>,
    pool: &Arc<Pool>,
    count: usize,
) -> Option<(usize, Borrow)> {
    let slot = reusable.iter_mut().find(|(_, b)| {
        b.as_ref()
            .is_some_and(|b| Arc::ptr_eq(&b.pool, pool) && b.pages.chunk_count() == count)
    })?;
    let i = slot.0;
    slot.1.take().map(|b| (i, b))
}

/// What a submission's ALLOCs and FREEs do to the file, and the points its waits name.
pub(super) struct Batch {
    made: KVec<Made>,
    freed: KVec<Freed>,
    /// What later ALLOCs may borrow of the mems the FREEs free (same-stream reuse within the
    /// submission): by the index of the FREE in `freed`; `None` once borrowed.
    pub(super) reusable: KVec<(usize, Option<Borrow>)>,
    /// The points the submission's waits named so far.
    known: KVec<(u64, u64)>,
    /// The stream's timeline, as a pool sees it (once an ALLOC or FREE needs it).
    clock: Option<Arc<dyn Clock>>,
    /// The pool the last ALLOC named, and how (its handle, or 0 for the GPU's current one).
    pool: Option<(u64, Arc<Pool>)>,
    /// A mem of the submission's own that the FREE just planned freed, for the ALLOC right
    /// after it to take whole ([`Self::free_whole`]), and its chunk count.
    whole: Option<(Arc<Mem>, usize)>,
    /// The ALLOCs of the submission not planned yet: a FREE with none after it lends nothing.
    allocs_left: usize,
}

impl Batch {
    /// The batch of a submission of `ops`, with room for what its ALLOCs make.
    pub(super) fn new(ops: &[uapi::ruvm_op]) -> Result<Self> {
        let allocs = ops
            .iter()
            .filter(|o| o.kind == uapi::ruvm_op_kind_RUVM_OP_ALLOC)
            .count();
        Ok(Self {
            // Transient (dropped before the call returns), bounded by the call; charged.
            made: KVec::with_capacity(allocs, GFP_KERNEL_ACCOUNT)?,
            freed: KVec::new(),
            reusable: KVec::new(),
            known: KVec::new(),
            clock: None,
            pool: None,
            whole: None,
            allocs_left: allocs,
        })
    }

    /// The pool an ALLOC names (see [`Lookup::pool`]), looked up once for a run of ALLOCs
    /// naming the same.
    pub(super) fn pool(&mut self, files: &dyn Lookup, handle: u64, gpu: u32) -> Result<Arc<Pool>> {
        if let Some((h, p)) = &self.pool {
            if *h == handle {
                return Ok(p.clone());
            }
        }
        let p = files.pool(handle, gpu)?;
        self.pool = Some((handle, p.clone()));
        Ok(p)
    }

    /// Whether the file's table is untouched by the submission.
    pub(super) fn touches_nothing(&self) -> bool {
        self.made.is_empty() && self.freed.is_empty()
    }

    /// Whether the stream (whose earlier submissions' points are `base`) waited for point
    /// `seqno` of `context` before what is planned now.
    pub(super) fn knows(&self, base: &Known, context: u64, seqno: u64) -> bool {
        base.covers(context, seqno) || self.known.iter().any(|&(c, s)| c == context && s >= seqno)
    }

    /// Notes that the submission waits for point `seqno` of `context`.
    pub(super) fn note_wait(&mut self, context: u64, seqno: u64) -> Result {
        self.known.push((context, seqno), GFP_KERNEL)?;
        Ok(())
    }

    /// The point `seqno` of the stream's timeline `clock` makes (kept for the next).
    pub(super) fn tag(&mut self, clock: impl FnOnce() -> Arc<dyn Clock>, seqno: u64) -> Tag {
        let clock = self.clock.get_or_insert_with(clock).clone();
        Tag { clock, seqno }
    }

    /// The mem an operation names: by handle in the file (`ENOENT` if a FREE of the
    /// submission took it), or with `by_index` the mem of the submission's ALLOC at that index
    /// (`EINVAL` if there is none there, `ENOENT` if a FREE of the submission freed it).
    pub(super) fn mem(&self, files: &dyn Lookup, value: u64, by_index: bool) -> Result<Arc<Mem>> {
        if by_index {
            let m = self
                .made
                .iter()
                .find(|m| m.index as u64 == value)
                .ok_or(EINVAL)?;
            if m.freed {
                return Err(ENOENT);
            }
            return Ok(m.mem.clone());
        }
        if self.freed.iter().any(|f| f.handle == Some(value)) {
            return Err(ENOENT);
        }
        files.mem(value)
    }

    /// Notes the mem ALLOC `index` made, under `handle`.
    pub(super) fn made(&mut self, index: usize, handle: u64, mem: Arc<Mem>) -> Result {
        self.allocs_left = self.allocs_left.saturating_sub(1);
        self.made.push(
            Made {
                index,
                handle,
                mem,
                freed: false,
                taken: false,
            },
            GFP_KERNEL,
        )?;
        Ok(())
    }

    /// Plans the free of the mem `value` names (see [`Self::mem`]), making the room its
    /// hand-over will need. Returns the handle it takes out of the file's table (`None`: a mem
    /// of the submission's own), the mem and that room.
    pub(super) fn free_of(
        &mut self,
        files: &dyn Lookup,
        value: u64,
        by_index: bool,
    ) -> Result<(Option<u64>, Arc<Mem>, Option<Promise>)> {
        let mem = self.mem(files, value, by_index)?;
        let promise = mem.prepare_hand_over()?;
        if by_index {
            if let Some(m) = self.made.iter_mut().find(|m| m.index as u64 == value) {
                m.freed = true;
            }
            return Ok((None, mem, promise));
        }
        Ok((Some(value), mem, promise))
    }

    /// Plans a FREE of the submission's own mem ALLOC `value` made, when the operation after it
    /// (`next`, at point `own`: context, seqno and timeline) is an ALLOC that asks for what it
    /// frees: the same pool (named as the last ALLOC named it), size and flags. If that ALLOC
    /// takes the mem whole ([`Mem::take_whole`]), the mem is freed in the submission (later
    /// operations naming it get `ENOENT`) and kept for it ([`Self::take_whole`]): the FREE
    /// then has nothing to do in the stream (the mem lives on, in the same order) and nothing
    /// to hand over. `false`, with nothing done, if not so: the FREE is planned as any.
    pub(super) fn free_whole(
        &mut self,
        value: u64,
        next: Option<&uapi::ruvm_op>,
        own: (u64, u64, impl FnOnce() -> Arc<dyn Clock>),
    ) -> bool {
        let Some(n) = next.filter(|n| n.kind == uapi::ruvm_op_kind_RUVM_OP_ALLOC) else {
            return false;
        };
        // The pool the last ALLOC named, if the next names it the same way: no lookup (which
        // could make a GPU's default pool for a submission that then fails).
        let Some((_, pool)) = self.pool.as_ref().filter(|(h, _)| *h == n.src) else {
            return false;
        };
        // The latest ALLOC first: what a run of pairs frees.
        let Some(m) = self
            .made
            .iter_mut()
            .rev()
            .find(|m| m.index as u64 == value && !m.freed)
        else {
            return false;
        };
        let Some(count) = m.mem.take_whole(pool, (n.length, n.flags), own) else {
            return false;
        };
        m.freed = true;
        m.taken = true;
        self.whole = Some((m.mem.clone(), count));
        true
    }

    /// The mem the FREE before this ALLOC kept for it ([`Self::free_whole`]), and how many
    /// chunks it has, if any.
    pub(super) fn take_whole(&mut self) -> Option<(Arc<Mem>, usize)> {
        self.whole.take()
    }

    /// Notes the FREE `op` of `mem` at point `tag` (`handle`: of the file's table).
    pub(super) fn freed(
        &mut self,
        (handle, mem, promise): (Option<u64>, Arc<Mem>, Option<Promise>),
        op: Arc<Op>,
        tag: Tag,
    ) -> Result {
        // What a later ALLOC may borrow (nothing without memory to note it: it then takes
        // memory its own way); with no ALLOC after it, nothing is lent (and no mapping refused).
        let mut lent = None;
        if let Some((b, l)) = (self.allocs_left > 0).then(|| mem.borrowable()).flatten() {
            if self
                .reusable
                .push((self.freed.len(), Some(b)), GFP_KERNEL)
                .is_ok()
            {
                lent = Some(l);
            }
        }
        self.freed.push(
            Freed {
                handle,
                mem,
                heir: None,
                promise,
                op,
                tag,
                _lent: lent,
            },
            GFP_KERNEL,
        )?;
        Ok(())
    }

    /// Notes that `heir`, made by an ALLOC, borrowed the chunks of FREE `freed`'s mem.
    pub(super) fn inherit(&mut self, freed: usize, heir: Arc<Mem>) {
        if let Some(f) = self.freed.get_mut(freed) {
            f.heir = Some(heir);
        }
    }

    /// Writes each ALLOC's handle and mmap offset into the caller's operation (`ops`):
    /// `EFAULT` if one cannot be written (then the submission fails, nothing made stays).
    pub(super) fn write_back(&self, ops: UserPtr) -> Result {
        const SIZE: usize = core::mem::size_of::<uapi::ruvm_op>();
        const DST: usize = core::mem::offset_of!(uapi::ruvm_op, dst);
        // `dst_offset` follows `dst`: both are written at once.
        const _: () = assert!(core::mem::offset_of!(uapi::ruvm_op, dst_offset) == DST + 8);
        for m in self.made.iter() {
            let at = m
                .index
                .checked_mul(SIZE)
                .and_then(|o| o.checked_add(DST))
                .ok_or(EFAULT)?;
            let mut out = [0u8; 16];
            out[..8].copy_from_slice(&m.handle.to_ne_bytes());
            out[8..].copy_from_slice(&m.mem.mmap_offset().to_ne_bytes());
            UserSlice::new(ops.wrapping_byte_add(at), out.len())
                .writer()
                .write_slice(&out)?;
        }
        Ok(())
    }

    /// The handles the submission takes out of the file's table, and the mems it enters
    /// (those its FREEs leave).
    pub(super) fn table_changes(
        &self,
    ) -> (
        impl Iterator<Item = u64> + '_,
        impl Iterator<Item = (u64, &Arc<Mem>)> + '_,
    ) {
        (
            self.freed.iter().filter_map(|f| f.handle),
            self.made
                .iter()
                .filter(|m| !m.freed)
                .map(|m| (m.handle, &m.mem)),
        )
    }

    /// The submission is queued: its mems are made (their chunks go back to the pool as a
    /// freed mem's from now on), and each FREE's mem is retired, its user mappings zapped and
    /// its chunks handed to its pool, what it gave up kept by the FREE until the stream
    /// reaches it.
    pub(super) fn finish(self, files: &dyn Lookup) {
        for m in self.made.iter().filter(|m| !m.taken) {
            m.mem.commit();
        }
        for f in self.freed {
            // What the mem gave up is parked in it until the FREE is dropped: here if the
            // stream reached it meanwhile (its work before it is done).
            files.free(&f.mem, f.tag, f.promise, f.heir.as_deref());
            f.op.parked();
            drop(f.op);
        }
    }
}
