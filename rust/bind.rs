// SPDX-License-Identifier: GPL-2.0

//! The thin binding layer: safe wrappers for the few kernel APIs the 7.2 `kernel` crate lacks.
//!
//! Every `unsafe` block of ruvm outside [`crate::uapi`] is in a submodule of this one; policy code
//! calls only the safe functions exported here.

pub(crate) mod cred;
pub(crate) mod dma;
pub(crate) mod fops;
pub(crate) mod globals;
pub(crate) mod pages;
pub(crate) mod ratelimit;
pub(crate) mod task;
pub(crate) mod upin;
pub(crate) mod vma;
pub(crate) mod vmap;
