// SPDX-License-Identifier: GPL-2.0

//! The thin binding layer: safe wrappers for the few kernel APIs the 7.2 `kernel` crate lacks.
//!
//! Every `unsafe` block of ruvm outside [`crate::uapi`] is in a submodule of this one; policy code
//! calls only the safe functions exported here. This layer is a leaf: it imports only `kernel`
//! and `uapi`, and holds no module state (module-wide locks are declared by their owners with
//! [`global::global!`]).

pub(crate) mod anon;
pub(crate) mod attach;
pub(crate) mod completion;
pub(crate) mod cred;
pub(crate) mod dma;
pub(crate) mod dmabuf;
pub(crate) mod dmem;
pub(crate) mod errno;
pub(crate) mod fence;
pub(crate) mod fops;
pub(crate) mod global;
pub(crate) mod lru;
pub(crate) mod maple;
pub(crate) mod meminfo;
pub(crate) mod notifier;
pub(crate) mod pages;
pub(crate) mod param;
pub(crate) mod random;
pub(crate) mod ratelimit;
pub(crate) mod resv;
pub(crate) mod shrinker;
pub(crate) mod upin;
pub(crate) mod uread;
pub(crate) mod vma;
pub(crate) mod vmap;
pub(crate) mod words;
pub(crate) mod workqueue;
