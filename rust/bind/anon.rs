// SPDX-License-Identifier: GPL-2.0

//! Files without a path that hold one object of the module (an exported pool), and descriptors
//! reserved for new files (the 7.2 `kernel` crate can reserve and install a descriptor, but not
//! make a file).
//!
//! C header: [`include/linux/anon_inodes.h`](srctree/include/linux/anon_inodes.h)
//!
//! [`AnonFile<T>`] makes a file on the anonymous inode whose private data is an `Arc<T>`, and
//! finds that `Arc` again from a descriptor, checking that the file is one of its own (by its
//! `file_operations` table, a `static` of its user). The table's owner is this module: each such file
//! holds a reference on it until its release, so the module cannot be unloaded while one is
//! open, and the release (which drops the `Arc`) always runs module code that is present.

use core::{marker::PhantomData, ptr::NonNull};

use kernel::{
    bindings,
    fs::{file::FileDescriptorReservation, File, LocalFile},
    prelude::*,
    sync::{aref::ARef, Arc, ArcBorrow},
};

/// A new file made for user space, and the close-on-exec descriptor reserved for it.
pub(crate) struct Exported {
    fd: FileDescriptorReservation,
    file: ARef<File>,
}

impl Exported {
    /// `file` (which holds one reference), with descriptor `fd` reserved for it.
    pub(crate) fn new(fd: FileDescriptorReservation, file: ARef<File>) -> Self {
        Self { fd, file }
    }

    /// The descriptor's number (not yet usable by user space).
    pub(crate) fn fd(&self) -> u32 {
        self.fd.reserved_fd()
    }

    /// Makes the descriptor usable (once its number has reached user space). Dropping an
    /// `Exported` instead gives both back (the file is released).
    pub(crate) fn install(self) {
        self.fd.fd_install(self.file);
    }
}

// Exported by fs/anon_inodes.c, not in the crate's bindings (linux/anon_inodes.h is not in its
// bindings_helper.h). The table and the file are passed as untyped pointers: their bindgen
// types hold arrays rustc does not call FFI-safe, though only their addresses cross.
extern "C" {
    fn anon_inode_getfile(
        name: *const kernel::ffi::c_char,
        fops: *const core::ffi::c_void,
        priv_: *mut core::ffi::c_void,
        flags: core::ffi::c_int,
    ) -> *mut core::ffi::c_void;
}

/// The `file_operations` of anonymous files holding an `Arc<T>`: `release` only (no read,
/// write, mmap or ioctl), owned by this module. Each user declares one `static`, whose address
/// tells its files apart from any other.
pub(crate) struct AnonFile<T>(bindings::file_operations, PhantomData<T>);

// SAFETY: the table holds function pointers and this module's pointer only, never written
// after it is made.
unsafe impl<T> Sync for AnonFile<T> {}

impl<T: Send + Sync + 'static> AnonFile<T> {
    /// The table for objects of type `T`.
    pub(crate) const fn new() -> Self {
        // SAFETY: all-zero is a valid `file_operations` (every callback absent).
        let mut fops: bindings::file_operations = unsafe { core::mem::zeroed() };
        fops.owner = crate::THIS_MODULE.as_ptr();
        fops.release = Some(Self::release);
        Self(fops, PhantomData)
    }

    /// A new file named `name` holding `obj`, with a close-on-exec descriptor reserved for it.
    pub(crate) fn create(&'static self, name: &'static CStr, obj: Arc<T>) -> Result<Exported> {
        let fd = FileDescriptorReservation::get_unused_fd_flags(bindings::O_CLOEXEC)?;
        let raw = Arc::into_raw(obj);
        // SAFETY: `name` is a NUL-terminated static string, the table is `'static`, and the
        // file takes over the reference `raw` carries (its release gives it back). On success
        // the file holds one reference, and one on this module (the table's owner).
        let file = unsafe {
            anon_inode_getfile(
                name.as_char_ptr(),
                core::ptr::from_ref(&self.0).cast(),
                raw.cast_mut().cast(),
                bindings::O_RDWR as core::ffi::c_int,
            )
        }
        .cast::<bindings::file>();
        if let Err(e) = kernel::error::from_err_ptr(file) {
            // SAFETY: the file was not made: the reference `raw` carries is still ours.
            drop(unsafe { Arc::from_raw(raw) });
            return Err(e);
        }
        let Some(file) = NonNull::new(file.cast::<File>()) else {
            // SAFETY: as above.
            drop(unsafe { Arc::from_raw(raw) });
            return Err(ENOMEM);
        };
        // SAFETY: `anon_inode_getfile` returned a live file with one reference, handed over.
        let file = unsafe { ARef::from_raw(file) };
        Ok(Exported { fd, file })
    }

    /// The object of the file of this table open at descriptor `fd` of the calling process:
    /// `EBADF` if `fd` is not open, `EINVAL` if it is not a file of this table.
    pub(crate) fn get(&'static self, fd: i32) -> Result<Arc<T>> {
        let fd = u32::try_from(fd).map_err(|_| EBADF)?;
        let file: ARef<LocalFile> = LocalFile::fget(fd)?;
        let raw = file.as_ptr();
        // SAFETY: the file is live while `file` holds its reference; `f_op` is set when a file
        // is made and never changed for a file of this table.
        let ops = unsafe { (*raw).f_op };
        if !core::ptr::eq(ops, &self.0) {
            return Err(EINVAL);
        }
        // SAFETY: a file of this table holds, in its private data, a reference on an `Arc<T>`
        // that lasts until its release, which cannot run while `file` holds a reference.
        let obj: Arc<T> = unsafe { ArcBorrow::from_raw((*raw).private_data.cast::<T>()) }.into();
        Ok(obj)
    }

    /// `release`: gives back the file's reference on its object.
    ///
    /// # Safety
    ///
    /// Called by the VFS once, as the last reference on a file of this table goes.
    unsafe extern "C" fn release(
        _inode: *mut bindings::inode,
        file: *mut bindings::file,
    ) -> core::ffi::c_int {
        // SAFETY: the file's private data is the reference `create` handed over, given back
        // once, here.
        drop(unsafe { Arc::<T>::from_raw((*file).private_data.cast::<T>()) });
        0
    }
}
