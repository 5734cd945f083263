// SPDX-License-Identifier: GPL-2.0

//! Two-level segregated size classes (TLSF, Masmano et al.), shared by the indexes of free
//! blocks that keep one list per class: the allocator's (`alloc/fit.rs`) and the pinned heaps'
//! large blocks (`heap/tlsf.rs`). A length is in class (first level, second level): lengths
//! below [`SL`] in classes (0, length), then one first-level class a power of two, split in
//! [`SL`] second-level classes. [`Map`] says which classes hold a block, so the first
//! non-empty class at or after one is two bit scans.

/// Second-level classes per power of two.
const SL_BITS: u32 = 3;
pub(crate) const SL: usize = 1 << SL_BITS;
/// First-level classes, up to lengths of 2^64.
pub(crate) const FL: usize = 64 - SL_BITS as usize + 1;

/// The class `len` (> 0) is listed in.
pub(crate) fn class(len: u64) -> (usize, usize) {
    if len < SL as u64 {
        return (0, len as usize);
    }
    let f = 63 - len.leading_zeros();
    let sl = (len >> (f - SL_BITS)) as usize & (SL - 1);
    ((f - SL_BITS + 1) as usize, sl)
}

/// The first class whose every block is at least `len` long (its blocks exceed `len` by at
/// most an eighth of it), `None` past the last.
pub(crate) fn class_at_least(len: u64) -> Option<(usize, usize)> {
    if len < SL as u64 {
        return Some(class(len));
    }
    let f = 63 - len.leading_zeros();
    Some(class(len.checked_add((1 << (f - SL_BITS)) - 1)?))
}

/// Which classes hold a block.
#[derive(Clone)]
pub(crate) struct Map {
    fl: u64,
    sl: [u8; FL],
}

impl Default for Map {
    fn default() -> Self {
        Self { fl: 0, sl: [0; FL] }
    }
}

impl Map {
    /// Class (`f`, `s`) holds a block.
    pub(crate) fn set(&mut self, f: usize, s: usize) {
        self.fl |= 1 << f;
        self.sl[f] |= 1 << s;
    }

    /// Class (`f`, `s`) holds none.
    pub(crate) fn clear(&mut self, f: usize, s: usize) {
        self.sl[f] &= !(1 << s);
        if self.sl[f] == 0 {
            self.fl &= !(1 << f);
        }
    }

    /// Whether no class holds a block.
    pub(crate) fn is_empty(&self) -> bool {
        self.fl == 0
    }

    /// The first class at or after (`f`, `s`) that holds a block.
    pub(crate) fn find(&self, f: usize, s: usize) -> Option<(usize, usize)> {
        let sl = u32::from(self.sl[f]) & (!0u32 << s);
        if sl != 0 {
            return Some((f, sl.trailing_zeros() as usize));
        }
        let fl = self.fl & (!0u64).checked_shl(f as u32 + 1).unwrap_or(0);
        if fl == 0 {
            return None;
        }
        let f = fl.trailing_zeros() as usize;
        Some((f, u32::from(self.sl[f]).trailing_zeros() as usize))
    }

    /// The last class that holds a block (where the longest is).
    pub(crate) fn highest(&self) -> Option<(usize, usize)> {
        if self.fl == 0 {
            return None;
        }
        let f = 63 - self.fl.leading_zeros() as usize;
        Some((f, 7 - (u32::from(self.sl[f]).leading_zeros() as usize - 24)))
    }
}

/// The shortest block at least `len` long among the first `look` of a class's list, from
/// `head`: `block(k)` says block `k`'s length and the next of the list (`None` past its end).
pub(crate) fn shortest_fit<K: Copy>(
    head: K,
    len: u64,
    look: usize,
    block: impl Fn(K) -> Option<(u64, K)>,
) -> Option<K> {
    let mut best: Option<(u64, K)> = None;
    let mut k = head;
    for _ in 0..look {
        let Some((l, next)) = block(k) else { break };
        if l >= len && best.is_none_or(|(b, _)| l < b) {
            best = Some((l, k));
            if l == len {
                break;
            }
        }
        k = next;
    }
    best.map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_searched_holds_only_blocks_that_fit() {
        let mut last = (0, 0);
        for len in 1..2000u64 {
            let c = class(len);
            assert!(c >= last, "{len}: {c:?} after {last:?}");
            last = c;
            let at_least = class_at_least(len).unwrap();
            for l in 1..4000u64 {
                if class(l) >= at_least {
                    assert!(l >= len, "{l} listed where {len} is searched");
                }
            }
            // Within an eighth of the request: the shortest block the search may take.
            let l = (len..).find(|&l| class(l) >= at_least).unwrap();
            assert!((l - len) * 8 <= len, "{len} may take {l}");
        }
        assert_eq!(class_at_least(u64::MAX), None);
        assert!(class(u64::MAX).0 < FL);
    }

    #[test]
    fn the_map_finds_the_next_and_the_highest() {
        let mut m = Map::default();
        assert!(m.is_empty() && m.find(0, 0).is_none() && m.highest().is_none());
        m.set(3, 5);
        m.set(10, 1);
        assert_eq!(m.find(0, 0), Some((3, 5)));
        assert_eq!(m.find(3, 6), Some((10, 1)));
        assert_eq!(m.find(10, 2), None);
        assert_eq!(m.highest(), Some((10, 1)));
        m.clear(10, 1);
        assert_eq!(m.highest(), Some((3, 5)));
        m.clear(3, 5);
        assert!(m.is_empty());
    }
}
