// SPDX-License-Identifier: GPL-2.0

//! Which vidmem chunks are free: uvm's chunk tree, with its three sizes and its fixed shape.
//!
//! Vidmem is an array of 2 MiB root chunks. A root is handed out whole, or split once into 32
//! chunks of 64 KiB, each of which is handed out whole or split once into 16 chunks of 4 KiB.
//! A split costs no allocation and no list: each root holds its 64 KiB slots and each split
//! slot its 4 KiB ones as bits, and three bitmaps over the roots (free, with a free 64 KiB
//! slot, with a free 4 KiB one) find a place in one search each.
//!
//! Split lazily: a chunk comes from an already split root or slot when one has room, and a
//! free root (or a free slot of a used root, for 4 KiB) is split only when none has. Merged
//! eagerly: a slot whose last 4 KiB chunk goes is whole again, and so is a root whose last
//! chunk goes. The lowest address that fits is taken at each step.
//!
//! It knows nothing of storage, GPUs or locks: its owner (the PMM) holds it under its mutex.
//! This file depends on `core` only, like `mmu/tree.rs`: its memory (the roots, the bitmaps)
//! is its owner's, and the host tests (`tools/ruvmctl/tests/chunks.rs`) compile it and compare
//! random runs with a model.

use core::ops::DerefMut;

/// A root chunk's size.
pub(crate) const ROOT: u64 = 2 << 20;
/// The middle chunk size: a split root holds 32 of them.
pub(crate) const MID: u64 = 64 << 10;
/// The smallest chunk size: a split 64 KiB slot holds 16 of them.
pub(crate) const SMALL: u64 = 4 << 10;

/// All 32 slots of a root.
const ALL_MID: u32 = u32::MAX;
/// All 16 small chunks of a slot.
const ALL_SMALL: u16 = u16::MAX;

/// One root chunk's state; a new tree's are all `Root::default()` (free).
#[derive(Clone, Copy, Default)]
pub(crate) struct Root {
    /// Handed out as one 2 MiB chunk.
    whole: bool,
    /// Its 64 KiB slots handed out as 64 KiB chunks.
    mid: u32,
    /// Its 64 KiB slots split into 4 KiB chunks.
    split: u32,
    /// For each split slot, its 4 KiB chunks handed out.
    small: [u16; 32],
}

impl Root {
    fn used(&self) -> bool {
        self.whole || self.mid != 0 || self.split != 0
    }

    /// The lowest slot neither handed out nor split.
    fn free_mid(&self) -> Option<u32> {
        let taken = self.mid | self.split;
        (!self.whole && taken != ALL_MID).then(|| (!taken).trailing_zeros())
    }

    /// The lowest split slot with a free 4 KiB chunk.
    fn free_small(&self) -> Option<u32> {
        let mut split = self.split;
        while split != 0 {
            let s = split.trailing_zeros();
            if self.small.get(s as usize) != Some(&ALL_SMALL) {
                return Some(s);
            }
            // The next split slot.
            split &= split - 1;
        }
        None
    }
}

/// A set of root indexes (a bitmap as long as the roots).
pub(crate) trait RootSet {
    /// Puts `r` in the set or takes it out.
    fn put(&mut self, r: usize, on: bool);
    /// The lowest index in the set.
    fn first(&self) -> Option<usize>;
}

/// The roots a place is searched in.
enum Kind {
    Free,
    Mid,
    Small,
}

/// A GPU's vidmem, chunk by chunk.
pub(crate) struct ChunkTree<R, S> {
    roots: R,
    /// Roots holding no chunk.
    free: S,
    /// Used roots, split, with a free 64 KiB slot.
    mid: S,
    /// Roots with a split slot that has a free 4 KiB chunk.
    small: S,
    avail: u64,
}

impl<R: DerefMut<Target = [Root]>, S: RootSet> ChunkTree<R, S> {
    /// A tree over `roots` (all free) with three empty sets as long; `None` if its bytes
    /// overflow.
    pub(crate) fn new(roots: R, sets: [S; 3]) -> Option<Self> {
        let [mut free, mid, small] = sets;
        for r in 0..roots.len() {
            free.put(r, true);
        }
        let avail = u64::try_from(roots.len()).ok()?.checked_mul(ROOT)?;
        Some(Self {
            roots,
            free,
            mid,
            small,
            avail,
        })
    }

    /// How many root chunks there are.
    pub(crate) fn roots(&self) -> usize {
        self.roots.len()
    }

    /// Free bytes.
    pub(crate) fn avail(&self) -> u64 {
        self.avail
    }

    /// Whether root `r` holds a chunk, and whether it is split (holds smaller ones).
    pub(crate) fn root_state(&self, r: usize) -> (bool, bool) {
        self.roots.get(r).map_or((false, false), |root| {
            (root.used(), root.used() && !root.whole)
        })
    }

    fn first(&self, kind: Kind) -> Option<usize> {
        match kind {
            Kind::Free => self.free.first(),
            Kind::Mid => self.mid.first(),
            Kind::Small => self.small.first(),
        }
    }

    /// Hands out a chunk of `size` (one of the three): its address, or `None` when none is
    /// free (or `size` is another).
    pub(crate) fn alloc(&mut self, size: u64) -> Option<u64> {
        let (r, offset) = match size {
            ROOT => {
                let r = self.first(Kind::Free)?;
                self.roots.get_mut(r)?.whole = true;
                (r, 0)
            }
            MID => {
                let r = self.first(Kind::Mid).or_else(|| self.first(Kind::Free))?;
                let root = self.roots.get_mut(r)?;
                let s = root.free_mid()?;
                root.mid |= 1 << s;
                (r, u64::from(s) * MID)
            }
            SMALL => {
                let r = self
                    .first(Kind::Small)
                    .or_else(|| self.first(Kind::Mid))
                    .or_else(|| self.first(Kind::Free))?;
                let root = self.roots.get_mut(r)?;
                let s = match root.free_small() {
                    Some(s) => s,
                    None => {
                        // Split a free slot.
                        let s = root.free_mid()?;
                        root.split |= 1 << s;
                        s
                    }
                };
                let bits = root.small.get_mut(s as usize)?;
                let c = (!*bits).trailing_zeros();
                *bits |= 1 << c;
                (r, u64::from(s) * MID + u64::from(c) * SMALL)
            }
            _ => return None,
        };
        self.index(r);
        self.avail = self.avail.saturating_sub(size);
        // CAST: `r` indexes the roots, whose count fit the capacity's `u64` at creation.
        Some(r as u64 * ROOT + offset)
    }

    /// Takes back the chunk of `size` at `phys`; merges what it can. `false` (and nothing
    /// changed) if no such chunk is handed out.
    pub(crate) fn free(&mut self, phys: u64, size: u64) -> bool {
        let Ok(r) = usize::try_from(phys / ROOT) else {
            return false;
        };
        let Some(root) = self.roots.get_mut(r) else {
            return false;
        };
        let offset = phys % ROOT;
        // CAST: below 32 and 16.
        let (s, c) = ((offset / MID) as u32, (offset % MID / SMALL) as u32);
        let held = match size {
            ROOT => offset == 0 && root.whole,
            MID => offset % MID == 0 && root.mid & (1 << s) != 0,
            SMALL => {
                offset % SMALL == 0
                    && root.split & (1 << s) != 0
                    && root
                        .small
                        .get(s as usize)
                        .is_some_and(|b| b & (1 << c) != 0)
            }
            _ => false,
        };
        if !held {
            return false;
        }
        match size {
            ROOT => root.whole = false,
            MID => root.mid &= !(1 << s),
            _ => {
                if let Some(bits) = root.small.get_mut(s as usize) {
                    *bits &= !(1 << c);
                    if *bits == 0 {
                        // The slot's last small chunk: it is whole again.
                        root.split &= !(1 << s);
                    }
                }
            }
        }
        self.index(r);
        self.avail = self.avail.saturating_add(size);
        true
    }

    /// Puts root `r` in the bitmaps its state says.
    fn index(&mut self, r: usize) {
        let Some(root) = self.roots.get(r) else {
            return;
        };
        let used = root.used();
        let mid = used && root.free_mid().is_some();
        let small = !root.whole && root.free_small().is_some();
        self.free.put(r, !used);
        self.mid.put(r, mid);
        self.small.put(r, small);
    }
}

/// Which 64 KiB slots of one root's storage are known to hold only zeros, as uvm's PMM keeps
/// zeroed chunks apart from the others. A slot is known zero only after a chunk that was zeroed
/// when handed out comes back unwritten; it stops being so when any chunk in it is handed out.
/// A 4 KiB chunk is known zero if its slot is, and coming back it marks nothing (the rest of
/// its slot may have been written since).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ZeroSlots(u32);

impl ZeroSlots {
    /// The slots the chunk of `size` at `phys` covers (none for a size the tree does not have).
    fn bits(phys: u64, size: u64) -> u32 {
        // CAST: below 32 (the offset in the root is below 2 MiB).
        let slot = ((phys % ROOT) / MID) as u32;
        match size {
            ROOT => ALL_MID,
            MID | SMALL => 1u32.checked_shl(slot).unwrap_or(0),
            _ => 0,
        }
    }

    /// The chunk of `size` at `phys` is handed out: whether all its bytes are known zero.
    /// Its slots are not known zero any more.
    pub(crate) fn take(&mut self, phys: u64, size: u64) -> bool {
        let bits = Self::bits(phys, size);
        let zero = bits != 0 && self.0 & bits == bits;
        self.0 &= !bits;
        zero
    }

    /// The chunk of `size` at `phys` came back unwritten since it was handed out zeroed.
    pub(crate) fn put_back(&mut self, phys: u64, size: u64) {
        if size != SMALL {
            self.0 |= Self::bits(phys, size);
        }
    }
}
