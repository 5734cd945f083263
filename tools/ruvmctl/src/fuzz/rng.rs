// SPDX-License-Identifier: GPL-2.0

//! The fuzzer's random numbers: xorshift64*, seeded, the same stream for the same seed.

/// A small seeded generator.
pub struct Rng(u64);

/// Mixes three numbers into a seed (splitmix64 of each step).
pub fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut x = a;
    for v in [b, c] {
        x = splitmix(x ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    }
    x
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        // Never zero: xorshift would stay there.
        Self(splitmix(seed) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        for _ in 0..100 {
            assert_eq!(a.next(), b.next());
        }
        assert_ne!(Rng::new(1).next(), Rng::new(2).next());
        assert_ne!(mix(1, 2, 3), mix(1, 2, 4));
    }
}
