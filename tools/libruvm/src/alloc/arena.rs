// SPDX-License-Identifier: GPL-2.0

//! Arenas: the allocator's segments where the module has sparse mems. One arena holds the blocks
//! of both size classes (another is made only when no free block of the first fits), so free
//! space is never split between segments and a small block may use the rest of a chunk a large
//! one left; its 2 MiB chunks are made resident when a block is carved over them and given back
//! when they lie wholly in free ready blocks and more than the release threshold is held.
//! `reserved` counts resident chunks, not arenas. (Measured on the six trace classes, one arena
//! for both classes held 1.05x the live peak on the training trace where one arena per class
//! held 1.27x, and 64 KiB chunks for the small blocks 1.22x.)

use nix::errno::Errno;

use super::fit::{Found, Owner, Use};
use super::segment::{Segment, CHUNK};
use super::{Allocator, Inner};

/// The first arena asked for (the module caps a mem at its `max_alloc_mib`: halved until it
/// fits).
const ARENA_MAX: u64 = 1 << 40;

/// Whether the module has sparse mems, as learnt from the first arena asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Arenas {
    #[default]
    Unknown,
    /// Arenas of this many bytes (or what a request needs, if more).
    Of(u64),
    /// The module has none: whole segments only.
    No,
}

impl Allocator<'_> {
    /// A new arena for a request of `want` bytes: its one free block. `Ok(None)` if the module
    /// has no sparse mems.
    pub(super) fn new_arena(
        &self,
        inner: &mut Inner,
        large: bool,
        want: u64,
    ) -> Result<Option<Found>, Errno> {
        let need = want.next_multiple_of(CHUNK);
        let mut len = match inner.arenas {
            Arenas::No => return Ok(None),
            Arenas::Of(n) => n.max(need),
            Arenas::Unknown => {
                let limit = self.cfg.reserve_limit.unwrap_or(ARENA_MAX);
                limit
                    .next_multiple_of(CHUNK)
                    .clamp(need, ARENA_MAX.max(need))
            }
        };
        let seg = loop {
            match Segment::arena(self.dev, len, CHUNK, &self.cfg.gpus) {
                Ok(s) => break s,
                // Beyond the module's largest mem (or the machine): a smaller arena.
                Err(Errno::ENOSPC | Errno::ENOMEM) if len / 2 >= need.max(CHUNK) => {
                    len = (len / 2).next_multiple_of(CHUNK);
                }
                Err(Errno::EINVAL) if inner.arenas == Arenas::Unknown => {
                    inner.arenas = Arenas::No;
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        };
        if inner.arenas == Arenas::Unknown {
            inner.arenas = Arenas::Of(len);
        }
        let id = inner.add_segment(seg)?;
        inner.blocks(large).add_segment(id, len);
        inner.stats.segments += 1;
        inner
            .blocks(large)
            .best_fit(Owner::Ready, want)
            .map(Some)
            .ok_or(Errno::ENOMEM)
    }

    /// Takes `want` bytes of the free block `f` for a use `used` and makes an arena's chunks
    /// under it resident; returns the bytes taken. On an error the block is free again, as it
    /// was; the kernel's refusal (`ENOMEM`, `ENOSPC`) is met by giving back every other
    /// chunk not in use first, and asking again.
    pub(super) fn place(
        &self,
        inner: &mut Inner,
        large: bool,
        f: Found,
        want: u64,
        used: Use,
    ) -> Result<u64, Errno> {
        let min_split = if large {
            super::LARGE_SPLIT
        } else {
            super::ROUND
        };
        let got = inner.blocks(large).take(f, want, min_split, used);
        let mut r = self.make_resident(inner, f.seg, f.offset, got);
        if matches!(r, Err(Errno::ENOMEM | Errno::ENOSPC)) {
            self.settle_bins(inner, None);
            let _ = self.give_back(inner, 0);
            r = self.make_resident(inner, f.seg, f.offset, got);
        }
        if let Err(e) = r {
            inner.blocks(large).give(f.seg, f.offset, f.owner, f.point);
            return Err(e);
        }
        Ok(got)
    }

    /// Makes the chunks of segment `seg` under `[offset, offset + len)` resident (nothing for
    /// a whole segment): `ENOMEM` beyond [`super::Config::reserve_limit`], the kernel's errors.
    fn make_resident(
        &self,
        inner: &mut Inner,
        seg: u32,
        offset: u64,
        len: u64,
    ) -> Result<(), Errno> {
        let s = inner.segment(seg)?;
        let runs = s.absent_runs(offset, len);
        if runs.is_empty() {
            return Ok(());
        }
        let need: u64 = runs.iter().map(|&(_, n)| n * s.chunk()).sum();
        let limit = self.cfg.reserve_limit.unwrap_or(u64::MAX);
        if inner.stats.reserved.saturating_add(need) > limit {
            return Err(Errno::ENOMEM);
        }
        let (made, r) = inner.segment_mut(seg)?.populate(self.dev, &runs);
        let s = &mut inner.stats;
        s.reserved += made;
        s.reserved_peak = s.reserved_peak.max(s.reserved);
        s.misses += 1;
        r
    }

    /// Gives back arenas' resident chunks that lie wholly in free ready blocks, the longest
    /// blocks first, while more than `keep` is reserved; returns the bytes given back.
    pub(super) fn release_free_chunks(&self, inner: &mut Inner, keep: u64) -> u64 {
        // Arenas hold both classes' blocks, in the small class's index (`Inner::blocks`).
        let mut free: Vec<(u64, u32, u64)> = inner
            .small
            .free_ready()
            .into_iter()
            .filter(|&(seg, _, len)| {
                inner
                    .segment(seg)
                    .is_ok_and(|s| s.is_arena() && len >= s.chunk())
            })
            .map(|(seg, offset, len)| (len, seg, offset))
            .collect();
        free.sort_unstable_by(|a, b| b.cmp(a));
        let mut given = 0;
        for (len, seg, offset) in free {
            if inner.stats.reserved <= keep {
                break;
            }
            let Ok(s) = inner.segment_mut(seg) else {
                continue;
            };
            let n = s.release(self.dev, offset, len);
            if n > 0 {
                inner.stats.reserved -= n;
                inner.stats.released += 1;
                given += n;
            }
        }
        given
    }
}
