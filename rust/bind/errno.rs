// SPDX-License-Identifier: GPL-2.0

//! The errnos ruvm returns that the 7.2 `kernel` crate has no constant for.

use kernel::prelude::*;

/// `EOPNOTSUPP`: what the mem or GPU cannot do (a CPU mapping of vidmem, a virtual mapping on
/// a GPU without an MMU).
pub(crate) fn eopnotsupp() -> Error {
    // CAST: EOPNOTSUPP is 95, which fits a `c_int`.
    Error::from_errno(-(kernel::bindings::EOPNOTSUPP as i32))
}

/// `ECANCELED`: what an operation of a stream that was cancelled ends with (its fence says so).
pub(crate) fn ecanceled() -> Error {
    // CAST: ECANCELED is 125, which fits a `c_int`.
    Error::from_errno(-(kernel::bindings::ECANCELED as i32))
}
