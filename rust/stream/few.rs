// SPDX-License-Identifier: GPL-2.0

//! A vector that holds a few elements in place and allocates only past them: a submission's
//! transient tables ([`super::named::Events`]), whose one-operation submissions, the most
//! common, then allocate nothing.

use core::ops::{Deref, DerefMut};

use kernel::{alloc::Flags, prelude::*};

/// Up to `N` elements in place, more in a [`KVec`].
pub(super) enum Few<T, const N: usize> {
    /// The first `len` of the array are the elements; the rest are defaults, unused.
    Inline([T; N], usize),
    Heap(KVec<T>),
}

impl<T: Default, const N: usize> Few<T, N> {
    /// Empty, with room for `n` elements (allocated with `flags` past `N`).
    pub(super) fn with_capacity(n: usize, flags: Flags) -> Result<Self> {
        if n <= N {
            return Ok(Self::Inline(core::array::from_fn(|_| T::default()), 0));
        }
        Ok(Self::Heap(KVec::with_capacity(n, flags)?))
    }

    /// `n` copies of `value`.
    pub(super) fn from_elem(value: T, n: usize, flags: Flags) -> Result<Self>
    where
        T: Clone,
    {
        if n <= N {
            return Ok(Self::Inline(core::array::from_fn(|_| value.clone()), n));
        }
        Ok(Self::Heap(KVec::from_elem(value, n, flags)?))
    }

    /// Appends `value`: `ENOMEM` past the room made for in place (the callers reserve it).
    pub(super) fn push(&mut self, value: T, flags: Flags) -> Result {
        match self {
            Self::Inline(a, len) => {
                *a.get_mut(*len).ok_or(ENOMEM)? = value;
                *len += 1;
                Ok(())
            }
            Self::Heap(v) => Ok(v.push(value, flags)?),
        }
    }
}

impl<T, const N: usize> Deref for Few<T, N> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Self::Inline(a, len) => a.get(..*len).unwrap_or(&[]),
            Self::Heap(v) => v,
        }
    }
}

impl<T, const N: usize> DerefMut for Few<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Self::Inline(a, len) => a.get_mut(..*len).unwrap_or(&mut []),
            Self::Heap(v) => v,
        }
    }
}
