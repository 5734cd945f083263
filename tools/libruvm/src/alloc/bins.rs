// SPDX-License-Identifier: GPL-2.0

//! Frees binned by owner and exact length: a request of that length by the owner (or anyone,
//! for a ready bin) takes one without touching the free-block index; a synchronize moves a
//! stream's completed bins to the ready ones; everything is given back, merged, before the
//! free blocks are searched, before a new segment is made, and at a trim.

use super::{fit::Owner, Allocator, Block, Inner};

/// A block freed lately: by which stream, at which point of it.
#[derive(Clone, Copy)]
pub(super) struct Recent {
    pub(super) stream: u64,
    pub(super) point: u64,
    pub(super) block: Block,
}

impl Allocator<'_> {
    /// Gives the binned frees (of `stream`'s bins, or all) back to the blocks, merged.
    pub(super) fn settle_bins(&self, inner: &mut Inner, stream: Option<u64>) {
        if inner.binned == 0 {
            return;
        }
        let keys: Vec<(Owner, bool, u64)> = inner
            .bins
            .keys()
            .filter(|k| stream.is_none_or(|s| k.0 == Owner::Stream(s)))
            .copied()
            .collect();
        for k in keys {
            for r in inner.bins.remove(&k).unwrap_or_default() {
                inner.binned -= 1;
                inner.settle(r);
            }
        }
    }
}

impl Inner {
    /// Bins a free under `owner`.
    pub(super) fn bin(&mut self, owner: Owner, r: Recent) {
        let key = (owner, r.block.large, r.block.len);
        self.bins.entry(key).or_default().push(r);
        self.binned += 1;
    }

    /// A binned free of `owner` of exactly `len` bytes, taken out.
    pub(super) fn unbin(&mut self, owner: Owner, large: bool, len: u64) -> Option<Recent> {
        let r = self.bins.get_mut(&(owner, large, len))?.pop()?;
        self.binned -= 1;
        Some(r)
    }

    /// Moves `stream`'s binned frees made at or before `upto` to the ready bins.
    pub(super) fn ready_bins(&mut self, stream: u64, upto: u64) {
        let keys: Vec<(Owner, bool, u64)> = self
            .bins
            .keys()
            .filter(|k| k.0 == Owner::Stream(stream))
            .copied()
            .collect();
        for k in keys {
            let Some(v) = self.bins.get_mut(&k) else {
                continue;
            };
            let (done, pending): (Vec<Recent>, Vec<Recent>) =
                v.drain(..).partition(|r| r.point <= upto);
            *v = pending;
            let ready = self.bins.entry((Owner::Ready, k.1, k.2)).or_default();
            ready.extend(done.into_iter().map(|r| Recent { point: 0, ..r }));
        }
    }

    /// Gives a binned free back to the blocks: ready if its stream is known complete up to
    /// its point, else its stream's.
    pub(super) fn settle(&mut self, r: Recent) {
        let done = self.points(r.stream).completed;
        let (owner, point) = if r.point <= done {
            (Owner::Ready, 0)
        } else {
            (Owner::Stream(r.stream), r.point)
        };
        let b = r.block;
        self.blocks(b.large).give(b.seg, b.offset, owner, point);
    }
}
