// SPDX-License-Identifier: GPL-2.0

//! Device memory charged to cgroups: the kernel's dmem controller.
//!
//! C header: [`include/linux/cgroup_dmem.h`](srctree/include/linux/cgroup_dmem.h)
//!
//! The 7.2 crate has no dmem abstraction, and its bindings leave the controller's functions out
//! (their header is not among the crate's), so the four this file needs are declared here, as
//! the header declares them. A [`Region`] is one device's memory as the controller sees it
//! (`dmem.capacity` lists it by name, `dmem.max`, `dmem.min`, `dmem.low` are written per
//! region); a [`Charge`] is bytes of it charged to the calling task's cgroup, uncharged when it
//! drops. On a kernel built without `CONFIG_CGROUP_DMEM` (Debian's stock 7.2) there is no
//! region: [`Region::register`] gives `None` and nothing is charged.

use kernel::prelude::*;

#[cfg(CONFIG_CGROUP_DMEM)]
mod ffi {
    use kernel::{bindings, ffi::c_char, ffi::c_int};

    /// `struct dmem_cgroup_pool_state`: opaque.
    #[repr(C)]
    pub(super) struct PoolState {
        _unused: [u8; 0],
    }

    unsafe extern "C" {
        pub(super) fn dmem_cgroup_register_region(
            size: u64,
            fmt: *const c_char,
            ...
        ) -> *mut bindings::dmem_cgroup_region;
        pub(super) fn dmem_cgroup_unregister_region(region: *mut bindings::dmem_cgroup_region);
        pub(super) fn dmem_cgroup_try_charge(
            region: *mut bindings::dmem_cgroup_region,
            size: u64,
            ret_pool: *mut *mut PoolState,
            ret_limit_pool: *mut *mut PoolState,
        ) -> c_int;
        pub(super) fn dmem_cgroup_uncharge(pool: *mut PoolState, size: u64);
    }
}

/// One device's memory, registered with the dmem controller; unregistered on drop.
///
/// # Invariants
///
/// `ptr` came from `dmem_cgroup_register_region` (not an error, not null) and is unregistered
/// once, by `drop`.
pub(crate) struct Region {
    #[cfg(CONFIG_CGROUP_DMEM)]
    ptr: core::ptr::NonNull<kernel::bindings::dmem_cgroup_region>,
}

// SAFETY: the controller's region functions may be called from any thread.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only charges, which the controller serialises.
unsafe impl Sync for Region {}

/// Bytes of a region charged to a cgroup.
///
/// # Invariants
///
/// `pool` was returned by a successful `dmem_cgroup_try_charge` of `size` bytes, uncharged
/// once, by `drop`.
pub(crate) struct Charge {
    #[cfg(CONFIG_CGROUP_DMEM)]
    pool: *mut ffi::PoolState,
    #[cfg(CONFIG_CGROUP_DMEM)]
    size: u64,
}

// SAFETY: a charge may be uncharged from any thread.
unsafe impl Send for Charge {}
// SAFETY: `&Charge` gives nothing out.
unsafe impl Sync for Charge {}

/// Why a charge was refused (never, without the controller).
#[cfg_attr(
    not(CONFIG_CGROUP_DMEM),
    allow(dead_code, reason = "without the controller no charge is ever refused")
)]
pub(crate) enum Refused {
    /// A limit (`dmem.max`) of the task's cgroup or of one above it.
    Limit,
    /// Another error (no memory for the controller's own state, the region going).
    Error(Error),
}

impl Region {
    /// Registers `size` bytes named `name` (as `dmem.capacity` shows it); `None` on a kernel
    /// without the controller.
    #[cfg(CONFIG_CGROUP_DMEM)]
    pub(crate) fn register(size: u64, name: &CStr) -> Result<Option<Self>> {
        // SAFETY: a "%s" format with one string argument, copied by the call.
        let p = unsafe {
            ffi::dmem_cgroup_register_region(size, c"%s".as_char_ptr(), name.as_char_ptr())
        };
        let p = kernel::error::from_err_ptr(p)?;
        // INVARIANT: registered, not an error; null only for size 0.
        Ok(core::ptr::NonNull::new(p).map(|ptr| Self { ptr }))
    }

    /// Without the controller: never a region.
    #[cfg(not(CONFIG_CGROUP_DMEM))]
    pub(crate) fn register(_size: u64, _name: &CStr) -> Result<Option<Self>> {
        Ok(None)
    }

    /// Charges `size` bytes to the calling task's cgroup: [`Refused::Limit`] if that passes a
    /// limit (nothing charged).
    #[cfg(CONFIG_CGROUP_DMEM)]
    pub(crate) fn try_charge(&self, size: u64) -> core::result::Result<Charge, Refused> {
        let mut pool = core::ptr::null_mut();
        // SAFETY: a registered region (the type invariant); `pool` receives the charged pool;
        // no limiting pool is asked for (so no reference to drop).
        let r = unsafe {
            ffi::dmem_cgroup_try_charge(self.ptr.as_ptr(), size, &mut pool, core::ptr::null_mut())
        };
        match r {
            // INVARIANT: charged `size` bytes to `pool`.
            0 => Ok(Charge { pool, size }),
            r if r == -(kernel::bindings::EAGAIN as i32) => Err(Refused::Limit),
            r => Err(Refused::Error(Error::from_errno(r))),
        }
    }

    /// Without the controller: never a region to charge.
    #[cfg(not(CONFIG_CGROUP_DMEM))]
    pub(crate) fn try_charge(&self, _size: u64) -> core::result::Result<Charge, Refused> {
        Ok(Charge {})
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: registered (the type invariant), unregistered once here; charges still held
        // keep their pools (the controller counts references to them).
        #[cfg(CONFIG_CGROUP_DMEM)]
        unsafe {
            ffi::dmem_cgroup_unregister_region(self.ptr.as_ptr())
        };
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        // SAFETY: charged by `try_charge` (the type invariant), uncharged once here.
        #[cfg(CONFIG_CGROUP_DMEM)]
        unsafe {
            ffi::dmem_cgroup_uncharge(self.pool, self.size)
        };
    }
}
