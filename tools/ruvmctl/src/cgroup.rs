// SPDX-License-Identifier: GPL-2.0

//! A cgroup2 group under the memory controller, removed on drop: where the selftests and the
//! bench read what ruvm charges to its caller.

use std::{io, path::PathBuf};

/// A group of its own under `/sys/fs/cgroup`.
pub struct MemGroup {
    pub dir: PathBuf,
}

impl MemGroup {
    pub const ROOT: &'static str = "/sys/fs/cgroup";

    /// Whether the root has the memory controller.
    pub fn available() -> bool {
        std::fs::read_to_string(format!("{}/cgroup.controllers", Self::ROOT))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
    }

    /// Enables the memory controller for the root's children and makes group `name` (a stale
    /// empty one of that name is removed first).
    pub fn new(name: &str) -> io::Result<Self> {
        Self::with(name, "memory")
    }

    /// Whether the root has `controller` (e.g. "dmem").
    pub fn has(controller: &str) -> bool {
        std::fs::read_to_string(format!("{}/cgroup.controllers", Self::ROOT))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == controller))
    }

    /// As [`MemGroup::new`], under `controller` instead of the memory controller.
    pub fn with(name: &str, controller: &str) -> io::Result<Self> {
        std::fs::write(
            format!("{}/cgroup.subtree_control", Self::ROOT),
            format!("+{controller}"),
        )?;
        let dir = PathBuf::from(Self::ROOT).join(name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir)?;
        Ok(Self { dir })
    }

    /// A file of the group.
    pub fn read(&self, file: &str) -> io::Result<String> {
        std::fs::read_to_string(self.dir.join(file))
    }

    /// Moves process `pid` into the group.
    pub fn enter(&self, pid: u32) -> io::Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// The value of `key` in a file of `key value` lines (`dmem.current`, `dmem.max`).
    pub fn keyed(&self, file: &str, key: &str) -> Option<String> {
        self.read(file).ok()?.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().to_owned())
        })
    }

    /// Writes a file of the group.
    pub fn write(&self, file: &str, value: &str) -> io::Result<()> {
        std::fs::write(self.dir.join(file), value)
    }
}

impl Drop for MemGroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}
