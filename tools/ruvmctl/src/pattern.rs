// SPDX-License-Identifier: GPL-2.0

//! The seeded test pattern, as `RUVM_FILL_PATTERN` defines it (include/uapi/linux/ruvm.h): the
//! byte at mem offset `o` is byte `o % 8` of the little-endian `u64` `seed + o / 8`.
//!
//! Written from the header's definition, independently of the module's implementation, so
//! that a test writing with one and reading with the other checks both.

/// The pattern byte at `offset`.
pub fn byte_at(seed: u64, offset: u64) -> u8 {
    seed.wrapping_add(offset / 8).to_le_bytes()[(offset % 8) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_uvm_mem_test_words() {
        // With seed = size, the u64 words are size + i (uvm_mem_test's pattern).
        let size = 7 * 1024 * 1024 + 17;
        for i in [0u64, 1, 2, 1000] {
            let word: Vec<u8> = (0..8).map(|b| byte_at(size, i * 8 + b)).collect();
            assert_eq!(u64::from_le_bytes(word.try_into().unwrap()), size + i);
        }
    }

    #[test]
    fn seed_wraps() {
        assert_eq!(byte_at(u64::MAX, 8), 0);
        assert_eq!(byte_at(u64::MAX, 0), 0xff);
    }
}
