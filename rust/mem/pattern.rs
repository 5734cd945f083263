// SPDX-License-Identifier: GPL-2.0

//! The seeded test pattern (`RUVM_FILL_PATTERN`), a pure function of (seed, offset).
//!
//! The byte at mem offset `o` is byte `o % 8` of the little-endian `u64` `seed + o / 8`: with
//! `seed = size` it is uvm_mem_test's `word[i] = size + i`. Defined on absolute offsets, so a
//! range can be filled or checked piece by piece. ruvmctl implements the same definition
//! independently; tests that write with one and read with the other check both.

/// The pattern byte at `offset`.
pub(crate) fn byte_at(seed: u64, offset: u64) -> u8 {
    let word = seed.wrapping_add(offset / 8).to_le_bytes();
    // `offset % 8` is below 8, so the index is in bounds; `get` keeps the panic path out.
    word.get((offset % 8) as usize).copied().unwrap_or(0)
}

/// Fills `buf` with the pattern bytes for offsets `offset..offset + buf.len()`.
pub(crate) fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut o = offset;
    for b in buf.iter_mut() {
        *b = byte_at(seed, o);
        o = o.wrapping_add(1);
    }
}
