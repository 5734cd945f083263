// SPDX-License-Identifier: GPL-2.0

//! A set of GPUs by id: what the ABI reports as a 64-bit mask (`mapped_gpus`, a pool's
//! `access`), kept as a type so that no caller shifts a bit by an id itself (an id of 32 to 63
//! is a valid member; one of 64 or more can never be).

/// GPUs by id, 0 to 63.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GpuSet(u64);

impl GpuSet {
    /// No GPU.
    pub(crate) const EMPTY: Self = Self(0);

    /// The largest id a set can hold, plus one.
    pub(crate) const IDS: u32 = u64::BITS;

    /// The set's bit of GPU `id`; `None` for an id no set can hold.
    fn bit(id: u32) -> Option<u64> {
        1u64.checked_shl(id)
    }

    /// The set of GPU `id` alone (empty for an id no set can hold).
    pub(crate) fn of(id: u32) -> Self {
        Self(Self::bit(id).unwrap_or(0))
    }

    /// Whether GPU `id` is in the set.
    pub(crate) fn contains(self, id: u32) -> bool {
        Self::bit(id).is_some_and(|b| self.0 & b != 0)
    }

    /// The set with GPU `id` in it; `None` for an id no set can hold.
    pub(crate) fn with(self, id: u32) -> Option<Self> {
        Some(Self(self.0 | Self::bit(id)?))
    }

    /// The set without GPU `id`.
    pub(crate) fn without(self, id: u32) -> Self {
        Self(self.0 & !Self::bit(id).unwrap_or(0))
    }

    /// The GPUs of `self` that are not in `other`.
    pub(crate) fn minus(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }

    /// The set as the ABI's mask (bit n: GPU n).
    pub(crate) fn bits(self) -> u64 {
        self.0
    }

    /// The set as a mask read back from [`Self::bits`].
    pub(crate) fn from_bits(bits: u64) -> Self {
        Self(bits)
    }

    /// Every id in the set, lowest first.
    pub(crate) fn ids(self) -> impl Iterator<Item = u32> {
        (0..Self::IDS).filter(move |&id| self.contains(id))
    }
}

impl FromIterator<u32> for GpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        iter.into_iter()
            .fold(Self::EMPTY, |s, id| s.with(id).unwrap_or(s))
    }
}
