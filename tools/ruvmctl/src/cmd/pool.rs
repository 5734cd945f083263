// SPDX-License-Identifier: GPL-2.0

//! The pool commands (`ruvmctl pool ...`): make and destroy a pool, show and set its
//! attributes, trim it, and grant or revoke a GPU. A pool belongs to the open file: keep one
//! open across commands with `--fd`.

use anyhow::Result;
use libruvm::{cmd, uapi, Ruvm};
use serde::Serialize;

use super::{arg, call};
use crate::output::{fields, Done, Report};
use crate::units::show_size;

/// A pool's attributes, as `POOL_GET` reports them (bytes; hits and misses in chunks).
#[derive(Serialize)]
pub struct PoolInfo {
    pub handle: u64,
    /// `sysmem`, or `vidmem of GPU N`.
    pub backing: String,
    pub chunk_size: u64,
    pub release_threshold: u64,
    pub reserved: u64,
    pub reserved_high: u64,
    pub used: u64,
    pub used_high: u64,
    pub cached_chunks: u64,
    pub hits: u64,
    pub misses: u64,
    /// The GPU ids of the access set.
    pub access: Vec<u32>,
    #[serde(skip)]
    note: Option<&'static str>,
}

/// A threshold for people: `max` for ~0.
fn threshold(v: u64) -> String {
    if v == u64::MAX {
        "max (never give back)".into()
    } else {
        show_size(v)
    }
}

impl Report for PoolInfo {
    fn render(&self) -> String {
        let access = if self.access.is_empty() {
            "none".into()
        } else {
            self.access
                .iter()
                .map(|g| format!("GPU {g}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut s = fields([
            ("pool", format!("{} ({})", self.handle, self.backing)),
            ("chunk size", show_size(self.chunk_size)),
            ("release threshold", threshold(self.release_threshold)),
            (
                "reserved",
                format!(
                    "{} (high {})",
                    show_size(self.reserved),
                    show_size(self.reserved_high)
                ),
            ),
            (
                "used",
                format!(
                    "{} (high {})",
                    show_size(self.used),
                    show_size(self.used_high)
                ),
            ),
            (
                "cached",
                format!(
                    "{} chunks, {}",
                    self.cached_chunks,
                    show_size(self.cached_chunks * self.chunk_size)
                ),
            ),
            ("hits / misses", format!("{} / {}", self.hits, self.misses)),
            ("access", access),
        ]);
        if let Some(n) = self.note {
            s.push('\n');
            s.push_str(n);
        }
        s
    }
}

/// `pool get` (`RUVM_IOCTL_POOL_GET`).
pub fn get(d: &Ruvm, handle: u64) -> Result<PoolInfo> {
    let mut a = arg(|a: &mut uapi::ruvm_pool_info| a.handle = handle);
    call(d, cmd::POOL_GET, &mut a)?;
    Ok(PoolInfo {
        handle,
        backing: if a.backing == uapi::ruvm_backing_RUVM_BACKING_VIDMEM {
            format!("vidmem of GPU {}", a.gpu)
        } else {
            "sysmem".into()
        },
        chunk_size: a.chunk_size,
        release_threshold: a.release_threshold,
        reserved: a.reserved_current,
        reserved_high: a.reserved_high,
        used: a.used_current,
        used_high: a.used_high,
        cached_chunks: a.cached_chunks,
        hits: a.hits,
        misses: a.misses,
        access: (0..64).filter(|g| a.access & (1u64 << g) != 0).collect(),
        note: None,
    })
}

/// `pool create` (`RUVM_IOCTL_POOL_CREATE`): the new pool's attributes.
pub fn create(
    d: &Ruvm,
    vidmem: Option<u32>,
    page_size: u64,
    release_threshold: u64,
    own_fd: bool,
) -> Result<PoolInfo> {
    let mut a = arg(|a: &mut uapi::ruvm_pool_create| {
        a.page_size = page_size;
        a.release_threshold = release_threshold;
        a.backing = uapi::ruvm_backing_RUVM_BACKING_SYSMEM;
        if let Some(g) = vidmem {
            a.backing = uapi::ruvm_backing_RUVM_BACKING_VIDMEM;
            a.gpu = g;
        }
    });
    call(d, cmd::POOL_CREATE, &mut a)?;
    let mut info = get(d, a.handle)?;
    if own_fd {
        info.note = Some("(destroyed when ruvmctl exits: pass --fd to keep pools across commands)");
    }
    Ok(info)
}

/// `pool destroy` (`RUVM_IOCTL_POOL_DESTROY`).
pub fn destroy(d: &Ruvm, handle: u64) -> Result<Done> {
    let mut a = arg(|a: &mut uapi::ruvm_pool_handle| a.handle = handle);
    call(d, cmd::POOL_DESTROY, &mut a)?;
    Ok(Done {})
}

/// What `pool set` changes.
pub enum Setting {
    Threshold(u64),
    ResetReservedHigh,
    ResetUsedHigh,
}

/// `pool set` (`RUVM_IOCTL_POOL_SET`): the attributes after.
pub fn set(d: &Ruvm, handle: u64, what: Setting) -> Result<PoolInfo> {
    let (attr, value) = match what {
        Setting::Threshold(v) => (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RELEASE_THRESHOLD, v),
        Setting::ResetReservedHigh => (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RESERVED_HIGH, 0),
        Setting::ResetUsedHigh => (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_USED_HIGH, 0),
    };
    let mut a = arg(|a: &mut uapi::ruvm_pool_set| {
        a.handle = handle;
        a.attr = attr;
        a.value = value;
    });
    call(d, cmd::POOL_SET, &mut a)?;
    get(d, handle)
}

/// What `pool trim` gave back.
#[derive(Serialize)]
pub struct Trimmed {
    pub handle: u64,
    pub released: u64,
    pub reserved: u64,
}

impl Report for Trimmed {
    fn render(&self) -> String {
        format!(
            "pool {}: gave back {}, {} reserved now",
            self.handle,
            show_size(self.released),
            show_size(self.reserved)
        )
    }
}

/// `pool trim` (`RUVM_IOCTL_POOL_TRIM`).
pub fn trim(d: &Ruvm, handle: u64, keep: u64) -> Result<Trimmed> {
    let mut a = arg(|a: &mut uapi::ruvm_pool_trim| {
        a.handle = handle;
        a.min_bytes_to_keep = keep;
    });
    call(d, cmd::POOL_TRIM, &mut a)?;
    Ok(Trimmed {
        handle,
        released: a.released,
        reserved: get(d, handle)?.reserved,
    })
}

/// `pool access` (`RUVM_IOCTL_POOL_SET_ACCESS`).
pub fn access(d: &Ruvm, handle: u64, gpu: u32, revoke: bool) -> Result<Done> {
    let mut a = arg(|a: &mut uapi::ruvm_pool_access| {
        a.handle = handle;
        a.gpu = gpu;
        if revoke {
            a.flags = uapi::ruvm_pool_access_flags_RUVM_POOL_ACCESS_REVOKE;
        }
    });
    call(d, cmd::POOL_SET_ACCESS, &mut a)?;
    Ok(Done {})
}
