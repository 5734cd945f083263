// SPDX-License-Identifier: GPL-2.0

//! `libruvm`: the `/dev/ruvm` device of the ruvm kernel module, for Rust programs.
//!
//! [`Ruvm`] is one open file of the device. Every ioctl is a typed call, [`Ruvm::call`] with a
//! [`Cmd`] from [`cmd`]: the command fixes the argument structure, so a mismatch does not
//! compile. Structures, command numbers and constants come from the uapi header
//! (`include/uapi/linux/ruvm.h`, the one source of truth) through bindgen ([`uapi`]); the names
//! of its feature and flag bits are generated from it too ([`names`]). [`UserMap`] maps a mem
//! into the process. Streams and events have their own calls ([`Ruvm::stream_submit`] of
//! [`op`]s, [`Ruvm::event_export`]) and [`sync_file`] reads the fences they export.
//!
//! ```no_run
//! use libruvm::{cmd, uapi, Ruvm};
//!
//! let dev = Ruvm::open()?;
//! let mut alloc = uapi::ruvm_mem_alloc { size: 1 << 20, ..Default::default() };
//! dev.call(cmd::MEM_ALLOC, &mut alloc)?;
//! println!("mem {} has {} chunks", alloc.handle, alloc.chunk_count);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`alloc`] is a stream-ordered caching allocator over segments the kernel maps once.
//!
//! A mem belongs to the open file that allocated it and is freed when the file is closed.

#![deny(missing_docs)]

pub mod alloc;
pub mod cmd;
mod dev;
pub mod dmabuf;
pub mod heap;
pub mod names;
pub mod op;
mod sizeclass;
mod status;
mod stream;
pub mod sync_file;
pub mod uapi;

pub use cmd::Cmd;
pub use dev::{
    load_module, path, pci_name, reuse_attr, unload_with_verdict, ExportData, IoctlArg, Ruvm,
    UnloadState, UserMap,
};
pub use nix::errno::Errno;
pub use status::{page_size, SlotState, StatusPage};

/// The version of the ABI and of the project this library was built from (the top-level
/// `VERSION` file).
pub const VERSION: &str = env!("RUVM_VERSION");

/// The NUL-terminated string in a fixed-size byte array, lossily decoded.
pub fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}
