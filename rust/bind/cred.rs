// SPDX-License-Identifier: GPL-2.0

//! Capability checks of the calling task.
//!
//! C header: [`include/linux/capability.h`](srctree/include/linux/capability.h)

use kernel::{bindings, prelude::*};

/// Fails with `EPERM` unless the current task has `CAP_SYS_ADMIN` in its user namespace.
///
/// Like C's `capable()`, a successful check marks the task as having used the privilege.
pub(crate) fn require_sys_admin() -> Result {
    // CAST: CAP_SYS_ADMIN is 21, which fits every integer type.
    let cap = bindings::CAP_SYS_ADMIN as i32;
    // SAFETY: `capable` only reads the credentials of the current task, which are always valid
    // in process context; any capability number is accepted.
    if unsafe { bindings::capable(cap) } {
        Ok(())
    } else {
        Err(EPERM)
    }
}
