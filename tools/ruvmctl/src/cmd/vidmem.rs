// SPDX-License-Identifier: GPL-2.0

//! `vidmem limit` and `vidmem usage`: what bounds a caller's vidmem (each GPU's dmem cgroup
//! region and ruvm's per-user limit, `RUVM_IOCTL_VIDMEM_LIMIT`) and who holds it (by cgroup,
//! from the dmem controller's files; by user, from `/sys/kernel/debug/ruvm/vidmem_users`).

use std::path::Path;

use anyhow::{Context, Result};
use libruvm::Ruvm;
use serde::Serialize;

use crate::{
    output::{table, Report},
    units::show_size,
};

/// What bounds the caller's vidmem of one GPU.
#[derive(Serialize)]
pub struct Limit {
    gpu: u32,
    capacity: u64,
    /// ruvm's per-user limit of each GPU (0: none).
    user_limit: u64,
    uid: u32,
    user_used: u64,
    /// The GPU's dmem region, when the kernel has the controller.
    dmem_region: Option<String>,
}

impl Report for Limit {
    fn render(&self) -> String {
        let limit = match self.user_limit {
            0 => "no per-user limit".to_owned(),
            n => format!("per-user limit {}", show_size(n)),
        };
        let dmem = match &self.dmem_region {
            Some(r) => format!("dmem region {r} (dmem.max of the caller's cgroups applies)"),
            None => "no dmem controller in this kernel".to_owned(),
        };
        format!(
            "GPU {}: {} of vidmem; {limit}; uid {} holds {}; {dmem}",
            self.gpu,
            show_size(self.capacity),
            self.uid,
            show_size(self.user_used)
        )
    }
}

/// `vidmem limit`: the caller's bounds of GPU `gpu`; with `set`, the per-user limit first.
pub fn limit(d: &Ruvm, gpu: u32, set: Option<u64>) -> Result<Limit> {
    let a = d
        .vidmem_limit(gpu, set)
        .with_context(|| format!("RUVM_IOCTL_VIDMEM_LIMIT of GPU {gpu}"))?;
    let region: Vec<u8> = a.region.iter().take_while(|&&c| c != 0).copied().collect();
    Ok(Limit {
        gpu,
        capacity: a.capacity,
        user_limit: a.user_limit,
        uid: a.uid,
        user_used: a.user_used,
        dmem_region: (a.dmem != 0).then(|| String::from_utf8_lossy(&region).into_owned()),
    })
}

/// One holder of vidmem: a cgroup's charge in a region, or a user's use of a GPU.
#[derive(Serialize)]
pub struct Holder {
    /// "cgroup" or "user".
    kind: &'static str,
    /// The cgroup's path under /sys/fs/cgroup, or the uid.
    who: String,
    /// The dmem region ("ruvm/gpu<id>"), or the GPU's id.
    gpu: String,
    bytes: u64,
    /// The cgroup's dmem.max of the region ("max": none); empty for a user.
    max: String,
}

/// Who holds vidmem.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Usage(Vec<Holder>);

impl Report for Usage {
    fn render(&self) -> String {
        if self.0.is_empty() {
            return "no vidmem held".to_owned();
        }
        table(
            &["by", "who", "GPU", "bytes", "max"],
            self.0
                .iter()
                .map(|h| {
                    vec![
                        h.kind.to_owned(),
                        h.who.clone(),
                        h.gpu.clone(),
                        show_size(h.bytes),
                        h.max.clone(),
                    ]
                })
                .collect::<Vec<_>>(),
        )
    }
}

/// The value of `region` in a dmem file's lines (`<region> <value>`).
fn region_value(text: &str, region: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (r, v) = l.split_once(' ')?;
        (r == region).then(|| v.trim().to_owned())
    })
}

/// Every cgroup under `dir` (and `dir` itself) holding vidmem of ruvm's regions.
fn cgroups(root: &Path, dir: &Path, regions: &[String], out: &mut Vec<Holder>) {
    if let Ok(current) = std::fs::read_to_string(dir.join("dmem.current")) {
        let max = std::fs::read_to_string(dir.join("dmem.max")).unwrap_or_default();
        for r in regions {
            let bytes = region_value(&current, r)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if bytes != 0 {
                let who = dir.strip_prefix(root).map_or_else(
                    |_| dir.display().to_string(),
                    |p| format!("/{}", p.display()),
                );
                out.push(Holder {
                    kind: "cgroup",
                    who,
                    gpu: r.clone(),
                    bytes,
                    max: region_value(&max, r).unwrap_or_default(),
                });
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                cgroups(root, &e.path(), regions, out);
            }
        }
    }
}

/// `vidmem usage`: vidmem by cgroup (where the kernel has the dmem controller and cgroup2 is
/// mounted at /sys/fs/cgroup) and by user (debugfs, root).
pub fn usage() -> Result<Usage> {
    let mut out = Vec::new();
    let root = Path::new("/sys/fs/cgroup");
    if let Ok(cap) = std::fs::read_to_string(root.join("dmem.capacity")) {
        let regions: Vec<String> = cap
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|r| r.starts_with("ruvm/"))
            .map(str::to_owned)
            .collect();
        // The root's own charges are the sum of its children's: only the groups below it.
        if let Ok(entries) = std::fs::read_dir(root) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    cgroups(root, &e.path(), &regions, &mut out);
                }
            }
        }
    }
    let users = Path::new(libruvm::names::AUDIT_DEBUGFS).with_file_name("vidmem_users");
    if let Ok(text) = std::fs::read_to_string(&users) {
        for l in text.lines().filter(|l| l.starts_with("uid=")) {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .unwrap_or("")
                    .to_owned()
            };
            out.push(Holder {
                kind: "user",
                who: field("uid="),
                gpu: field("gpu="),
                bytes: field("bytes=").parse().unwrap_or(0),
                max: String::new(),
            });
        }
    }
    Ok(Usage(out))
}
