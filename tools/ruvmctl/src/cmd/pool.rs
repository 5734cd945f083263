// SPDX-License-Identifier: GPL-2.0

//! The pool commands (`ruvmctl pool ...`): make and destroy a pool, show and set its
//! attributes (CUDA's, and the reuse policies of chunks freed on a stream), trim it, and grant
//! or revoke a GPU; and a GPU's current pool for stream-ordered allocation (`gpu pool`). A pool
//! belongs to the open file: keep one open across commands with `--fd`.

use anyhow::Result;
use libruvm::{cmd, names, uapi, Ruvm};
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
    /// Chunks freed on a stream (`RUVM_OP_FREE`) whose free no synchronize has observed yet.
    pub pending: u64,
    pub hits: u64,
    pub misses: u64,
    /// The GPU ids of the access set.
    pub access: Vec<u32>,
    /// The reuse policies that are on, by name (`enum ruvm_pool_reuse`).
    pub reuse: Vec<String>,
    /// `exportable`, `imported` (`enum ruvm_pool_flags`).
    pub flags: Vec<String>,
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
            (
                "pending",
                format!(
                    "{} (freed on streams, not yet synchronized)",
                    show_size(self.pending)
                ),
            ),
            ("hits / misses", format!("{} / {}", self.hits, self.misses)),
            (
                "sharing",
                if self.flags.is_empty() {
                    "none".into()
                } else {
                    self.flags.join(", ")
                },
            ),
            ("access", access),
            (
                "reuse",
                if self.reuse.is_empty() {
                    "none (only what a synchronize observed)".into()
                } else {
                    self.reuse.join(", ")
                },
            ),
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
        pending: a.pending_bytes,
        hits: a.hits,
        misses: a.misses,
        access: (0..64).filter(|g| a.access & (1u64 << g) != 0).collect(),
        reuse: names::bit_names(names::POOL_REUSE, a.reuse.into()),
        flags: names::bit_names(names::POOL_FLAGS, a.pool_flags.into()),
        note: None,
    })
}

/// What `pool create` asks for.
pub struct Made {
    /// A GPU's memory instead of sysmem.
    pub vidmem: Option<u32>,
    pub page_size: u64,
    pub release_threshold: u64,
    /// `RUVM_POOL_EXPORTABLE`.
    pub exportable: bool,
}

/// `pool create` (`RUVM_IOCTL_POOL_CREATE`): the new pool's attributes.
pub fn create(d: &Ruvm, m: Made, own_fd: bool) -> Result<PoolInfo> {
    let mut a = arg(|a: &mut uapi::ruvm_pool_create| {
        a.page_size = m.page_size;
        a.release_threshold = m.release_threshold;
        a.backing = uapi::ruvm_backing_RUVM_BACKING_SYSMEM;
        if m.exportable {
            a.flags = uapi::ruvm_pool_create_flags_RUVM_POOL_EXPORTABLE;
        }
        if let Some(g) = m.vidmem {
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
    /// A reuse policy (`enum ruvm_pool_attr`: one of the `RUVM_POOL_ATTR_REUSE_*`), on or off.
    Reuse(u32, bool),
}

/// `pool set` (`RUVM_IOCTL_POOL_SET`): the attributes after.
pub fn set(d: &Ruvm, handle: u64, what: Setting) -> Result<PoolInfo> {
    let (attr, value) = match what {
        Setting::Threshold(v) => (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RELEASE_THRESHOLD, v),
        Setting::ResetReservedHigh => (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RESERVED_HIGH, 0),
        Setting::ResetUsedHigh => (uapi::ruvm_pool_attr_RUVM_POOL_ATTR_USED_HIGH, 0),
        Setting::Reuse(attr, on) => (attr, u64::from(on)),
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

/// A GPU's current pool, as `gpu pool` shows it.
#[derive(Serialize)]
pub struct GpuPool {
    pub gpu: u32,
    /// Whether `gpu pool --set` changed it.
    pub set: bool,
    /// The current pool's attributes.
    pub pool: PoolInfo,
    #[serde(skip)]
    note: Option<&'static str>,
}

impl Report for GpuPool {
    fn render(&self) -> String {
        let mut s = format!(
            "GPU {}: current pool {}{}\n{}",
            self.gpu,
            self.pool.handle,
            if self.set { " (set)" } else { "" },
            self.pool.render()
        );
        if let Some(n) = self.note {
            s.push('\n');
            s.push_str(n);
        }
        s
    }
}

/// `gpu pool` (`RUVM_IOCTL_GPU_POOL`): reads the GPU's current pool, or with `set` makes that
/// pool current first (0: the GPU's default pool); the current pool's attributes.
pub fn gpu_pool(d: &Ruvm, gpu: u32, set: Option<u64>, own_fd: bool) -> Result<GpuPool> {
    if let Some(pool) = set {
        let mut a = arg(|a: &mut uapi::ruvm_gpu_pool| {
            a.gpu = gpu;
            a.flags = uapi::ruvm_gpu_pool_flags_RUVM_GPU_POOL_SET;
            a.pool = pool;
        });
        call(d, cmd::GPU_POOL, &mut a)?;
    }
    let mut a = arg(|a: &mut uapi::ruvm_gpu_pool| a.gpu = gpu);
    call(d, cmd::GPU_POOL, &mut a)?;
    Ok(GpuPool {
        gpu,
        set: set.is_some(),
        pool: get(d, a.pool)?,
        note: own_fd.then_some(
            "(the setting and a default pool go when ruvmctl exits: pass --fd to keep them across commands)",
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(reuse: u32, pending: u64) -> PoolInfo {
        PoolInfo {
            handle: 3,
            backing: "sysmem".into(),
            chunk_size: 64 << 10,
            release_threshold: u64::MAX,
            reserved: 192 << 10,
            reserved_high: 192 << 10,
            used: 64 << 10,
            used_high: 128 << 10,
            cached_chunks: 1,
            pending,
            hits: 2,
            misses: 3,
            access: vec![1],
            reuse: names::bit_names(names::POOL_REUSE, reuse.into()),
            flags: names::bit_names(names::POOL_FLAGS, 3),
            note: None,
        }
    }

    #[test]
    fn get_shows_pending_bytes_and_the_reuse_policies() {
        let all = info(7, 64 << 10).render();
        assert!(all.contains("64K (freed on streams"), "{all}");
        assert!(
            all.contains(
                "follow-event-dependencies, allow-opportunistic, allow-internal-dependencies"
            ),
            "{all}"
        );
        let none = info(0, 0).render();
        assert!(
            none.contains("none (only what a synchronize observed)"),
            "{none}"
        );
        assert!(
            all.contains("sharing:") && all.contains("exportable, imported"),
            "{all}"
        );
        let json = serde_json::to_value(info(2, 4096)).expect("serializes");
        assert_eq!(json["pending"], 4096);
        assert_eq!(json["flags"][1], "imported");
        assert_eq!(json["reuse"], serde_json::json!(["allow-opportunistic"]));
    }

    #[test]
    fn gpu_pool_names_the_gpu_and_its_pool() {
        let g = GpuPool {
            gpu: 1,
            set: true,
            pool: info(7, 0),
            note: None,
        };
        let text = g.render();
        assert!(text.starts_with("GPU 1: current pool 3 (set)\n"), "{text}");
        let json = serde_json::to_value(&g).expect("serializes");
        assert_eq!(json["gpu"], 1);
        assert_eq!(json["pool"]["handle"], 3);
    }
}
