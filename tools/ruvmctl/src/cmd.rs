// SPDX-License-Identifier: GPL-2.0

//! The commands: each turns its parsed arguments into ioctls on `/dev/ruvm` (through
//! `libruvm`'s one typed call) and returns a [`crate::output::Report`]. One file per group.

use anyhow::{Context as _, Result};
use libruvm::{Cmd, IoctlArg, Ruvm};

pub mod allocator;
pub mod audit;
pub mod dmabuf;
pub mod gpu;
pub mod gpu_va;
pub mod heap;
pub mod info;
pub mod mem;
pub mod pool;
pub mod ptr;
pub mod register;
pub mod share;
pub mod stream;
pub mod test;
pub mod vidmem;

/// Opens the device, or takes the descriptor `--fd` names.
pub fn open(fd: Option<i32>) -> Result<Ruvm> {
    Ok(match fd {
        Some(fd) => Ruvm::from_inherited_fd(fd)?,
        None => Ruvm::open()?,
    })
}

/// Issues `cmd` with `arg`, naming the command in the error.
pub fn call<T: IoctlArg>(d: &Ruvm, cmd: Cmd<T>, arg: &mut T) -> Result<()> {
    d.call(cmd, arg).with_context(|| cmd.name)
}

/// `T` with all its fields zero but those set by `f`.
pub fn arg<T: IoctlArg>(f: impl FnOnce(&mut T)) -> T {
    let mut a = T::default();
    f(&mut a);
    a
}
