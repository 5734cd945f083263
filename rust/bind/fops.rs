// SPDX-License-Identifier: GPL-2.0

//! File operations that keep the module loaded while a file of a misc device is open.
//!
//! C header: [`include/linux/fs.h`](srctree/include/linux/fs.h) (`fops_get`, `replace_fops`)
//!
//! The 7.2 `miscdevice` abstraction builds its `file_operations` without `.owner`, so an open
//! file holds no reference on the module: `rmmod` succeeds while files are open, and their later
//! `release` runs code that is gone (seen in the guest as an oops in `filp_close`). C drivers
//! avoid this with `.owner = THIS_MODULE`.
//!
//! [`OwnedFops::FOPS`] is the abstraction's own table for a device type with the owner filled
//! in, built at compile time. [`pin_module`] takes a module reference and swaps that table into a
//! file being opened, as `misc_open` does with `replace_fops`. The VFS drops the reference through
//! `fops_put` after `release`, or when `open` fails after the swap.

use core::marker::PhantomData;

use kernel::{
    bindings,
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceOptions},
    prelude::*,
};

/// A `file_operations` table that may live in a `static`.
struct Fops(bindings::file_operations);

// SAFETY: the table is never written after compile time; it holds pointers to functions and to
// this module, which are valid from any thread.
unsafe impl Sync for Fops {}

/// The miscdevice abstraction's table for `T`, with `owner` set to this module.
struct OwnedFops<T>(PhantomData<T>);

impl<T: MiscDevice> OwnedFops<T> {
    const FOPS: Fops = Fops({
        let vtable = MiscDeviceOptions { name: c"ruvm" }.into_raw::<T>().fops;
        // SAFETY: `into_raw` points `fops` at the abstraction's `'static` table for `T`.
        let mut fops = unsafe { *vtable };
        fops.owner = crate::THIS_MODULE.as_ptr();
        fops
    });
}

/// Makes `file`, which is being opened as a `T`, hold a reference on this module until it is
/// released. Call it last in `T::open`.
///
/// Fails with `ENODEV` if the module is already being unloaded.
pub(crate) fn pin_module<T: MiscDevice>(file: &File) -> Result {
    let fops: &'static Fops = &OwnedFops::<T>::FOPS;
    let fops = &fops.0;
    // SAFETY: `fops.owner` is this module (or NULL when built in, which always succeeds); it
    // is valid because this code is running.
    if !unsafe { bindings::try_module_get(fops.owner) } {
        return Err(ENODEV);
    }
    // SAFETY: `file` is inside its `open` callback, called by `misc_open` after its own
    // `replace_fops`, so no other thread uses `f_op` yet. The table being replaced has no owner,
    // so there is no reference to drop (`replace_fops` would `fops_put` it). The new table is
    // `'static`, and it has the same callbacks as the table it replaces (both are `T`'s).
    unsafe { (*file.as_ptr()).f_op = fops };
    Ok(())
}
