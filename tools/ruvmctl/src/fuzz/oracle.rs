// SPDX-License-Identifier: GPL-2.0

//! The fuzzer's oracles beyond each call's errno (Documentation/testing.rst, "The fuzzer"):
//!
//! - *isolation*: every worker fills each mem it makes with its own tag, and reads mems back
//!   through their user mappings; a word carrying another worker's tag is another file's byte
//!   reaching this one, whatever path put it there (a pool's reuse, an engine copy by handle or
//!   by VA, a stream's copy of a mem freed under it, a user or kernel mapping);
//! - *resources*: with `--memcg`, the workers run in a memory cgroup of their own (unprivileged
//!   with `--unprivileged`), and the kernel's slab and vmalloc memory may grow beyond what that
//!   group is charged by a bound only (`--kmem-bound`), sampled all along the run;
//! - *liveness*: every GPU removal the fuzzer makes (an edu unbind, a simulated GPU's removal)
//!   finishes within its bound (`--removal-bound`, 10 s by default) while the workers keep
//!   working, their streams busy; and
//!   every fence of a stream whose GPU was removed, whose file was closed or whose worker was
//!   killed signals within [`super::fences::SIGNAL_BOUND`] (the parent holds the workers'
//!   sync_files beyond their death: [`super::fences`]).

use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::cgroup::MemGroup;

/// How long a removal may take before the fuzzer shows what the blocked tasks wait for.
const SLOW: Duration = Duration::from_secs(5);

/// Runs `remove` (a GPU's removal) and returns how long it took; if it takes longer than
/// [`SLOW`], prints the kernel stack of every task blocked in the kernel meanwhile (from
/// `/proc/PID/task/TID/stack`, root only), once: what a slow removal waits for.
pub fn timed<R: Send>(remove: impl FnOnce() -> R + Send) -> (R, Duration) {
    let start = std::time::Instant::now();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if start.elapsed() > SLOW {
                    println!("fuzz: a GPU removal is taking over {SLOW:?}; tasks blocked now:");
                    print!("{}", blocked_stacks());
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let r = remove();
        let took = start.elapsed();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = watcher.join();
        (r, took)
    })
}

/// The kernel stacks of the tasks in uninterruptible sleep (state D), one block each.
fn blocked_stacks() -> String {
    let mut out = String::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // The state follows the command name's closing parenthesis.
            let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start());
            if !state.is_some_and(|s| s.starts_with('D')) {
                continue;
            }
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let stack = std::fs::read_to_string(t.path().join("stack")).unwrap_or_default();
            out.push_str(&format!(
                "fuzz:   task {} ({}):\n",
                t.file_name().to_string_lossy(),
                comm.trim()
            ));
            for l in stack.lines() {
                out.push_str(&format!("fuzz:     {l}\n"));
            }
        }
    }
    out
}

/// The top byte of every tag word.
const MARK: u64 = 0xf1;
/// Where a tag's low 24 bits start: words at offsets up to 64 MiB either way of where they were
/// written (a copy within one file moves them) keep the rest of the tag intact.
const MIDDLE: u64 = 0x80_0000;

/// The tag of worker `id`: the fill pattern's seed (`RUVM_FILL_PATTERN`: the word at byte
/// offset `o` is `tag + o / 8`). Bits 63..56 the mark, 55..40 the id, 39..24 the id inverted
/// (so that a run of one byte, or a word with one byte changed, is never a tag), 23..0 the
/// position.
pub fn tag(id: u16) -> u64 {
    let id = u64::from(id);
    (MARK << 56) | (id << 40) | ((id ^ 0xffff) << 24) | MIDDLE
}

/// The worker whose tag the word `w`, read at byte offset `o` of a mem, carries, if any.
pub fn tag_id(w: u64, o: u64) -> Option<u16> {
    let s = w.wrapping_sub(o / 8);
    let id = (s >> 40) & 0xffff;
    let check = (s >> 24) & 0xffff;
    (s >> 56 == MARK && id ^ check == 0xffff).then_some(id as u16)
}

/// The first word of `bytes` (read from byte offset 0 of a mem) that carries another worker's
/// tag than `mine`: its offset and that worker's id.
pub fn foreign(bytes: &[u8], mine: u16) -> Option<(u64, u16)> {
    bytes.chunks_exact(8).enumerate().find_map(|(i, c)| {
        let o = (i * 8) as u64;
        let w = u64::from_le_bytes(c.try_into().ok()?);
        tag_id(w, o).filter(|&id| id != mine).map(|id| (o, id))
    })
}

/// Random fill seeds are kept clear of the tags' mark.
pub fn untagged_seed(seed: u64) -> u64 {
    seed & 0x00ff_ffff_ffff_ffff
}

/// A field of `/proc/meminfo`, in bytes.
fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.split(':').next() == Some(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A field of a cgroup's `memory.stat`, in bytes.
fn stat(group: &MemGroup, field: &str) -> Option<u64> {
    let text = group.read("memory.stat").ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(field)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The resources oracle: the workers' memory cgroup, and the kernel's slab and vmalloc bytes
/// when the run began.
/// The workers' `dmem.max` in each of ruvm's regions (the vidmem oracle).
const VIDMEM_MAX: u64 = 24 << 20;
/// What a sample of `dmem.current` may read above `dmem.max`: the controller adds a charge
/// before it checks the limit (and takes it back when over), so charges in flight (one
/// chunk, at most 2 MiB, per worker thread) may show for a moment.
const VIDMEM_SLACK: u64 = 32 << 20;

/// The resources oracle: the workers' memory cgroup, and what is measured of it.
pub struct Resources {
    pub group: MemGroup,
    base: u64,
    bound: u64,
    /// The most kernel memory seen grown beyond the group's charge.
    pub worst: u64,
    /// Where the kernel has the dmem controller: the `dmem.max` the workers' group has in each
    /// of ruvm's regions (the vidmem oracle), and the most `dmem.current` seen in any.
    pub vidmem_max: Option<u64>,
    pub vidmem_peak: u64,
}

impl Resources {
    /// A group for the workers, limited to `max` bytes, checked against `bound`.
    pub fn new(max: u64, bound: u64) -> Result<Self> {
        let group = MemGroup::new("ruvm-fuzz").context("a memory cgroup for the workers")?;
        group
            .write("memory.max", &max.to_string())
            .context("memory.max")?;
        let base = Self::kernel_bytes().context("/proc/meminfo")?;
        // The vidmem oracle, where the kernel has the dmem controller: the workers' group may
        // hold at most VIDMEM_MAX of each GPU's vidmem.
        let vidmem_max = (MemGroup::has("dmem")
            && std::fs::write(
                format!("{}/cgroup.subtree_control", MemGroup::ROOT),
                "+dmem",
            )
            .is_ok())
        .then_some(VIDMEM_MAX);
        let r = Self {
            group,
            base,
            bound,
            worst: 0,
            vidmem_max,
            vidmem_peak: 0,
        };
        r.limit_vidmem();
        Ok(r)
    }

    /// ruvm's regions in the group's `dmem.current`, with their bytes.
    fn vidmem(&self) -> Vec<(String, u64)> {
        self.group
            .read("dmem.current")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (r, v) = l.split_once(' ')?;
                r.starts_with("ruvm/")
                    .then(|| (r.to_owned(), v.trim().parse().unwrap_or(0)))
            })
            .collect()
    }

    /// (Again) sets the workers' `dmem.max` of every ruvm region: a GPU removed and added
    /// back is a new region, with no limit.
    fn limit_vidmem(&self) {
        if let Some(max) = self.vidmem_max {
            for (r, _) in self.vidmem() {
                let _ = self.group.write("dmem.max", &format!("{r} {max}"));
            }
        }
    }

    /// The vidmem oracle's sample: a region whose `dmem.current` is over the group's
    /// `dmem.max` (its description), if any.
    pub fn sample_vidmem(&mut self) -> Option<String> {
        let max = self.vidmem_max?;
        self.limit_vidmem();
        let limits = self.group.read("dmem.max").unwrap_or_default();
        for (r, cur) in self.vidmem() {
            self.vidmem_peak = self.vidmem_peak.max(cur);
            let limited = limits.lines().any(|l| {
                l.split_once(' ')
                    .is_some_and(|(k, v)| k == r && v.trim() == max.to_string())
            });
            if limited && cur > max + VIDMEM_SLACK {
                return Some(format!(
                    "dmem.current of {r} is {cur}, over the workers' dmem.max {max} by more than the charges in flight"
                ));
            }
        }
        None
    }

    /// Once every worker is gone: a region still charged to their group, or a user other
    /// than root still holding vidmem (ruvm's per-user count, debugfs), described; waited for
    /// up to 10 s (a revocation or a stream's retirement may still be under way).
    pub fn vidmem_left(&self) -> Option<String> {
        self.vidmem_max?;
        let start = std::time::Instant::now();
        loop {
            let users =
                std::fs::read_to_string("/sys/kernel/debug/ruvm/vidmem_users").unwrap_or_default();
            let left: Vec<String> = self
                .vidmem()
                .into_iter()
                .filter(|(_, v)| *v != 0)
                .map(|(r, v)| format!("{r} {v}"))
                .chain(
                    users
                        .lines()
                        .filter(|l| l.starts_with("uid=") && !l.starts_with("uid=0 "))
                        .map(str::to_owned),
                )
                .collect();
            if left.is_empty() {
                return None;
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Some(format!(
                    "the workers' group is still charged vidmem 10 s after the last exited: {}",
                    left.join(", ")
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kernel_bytes() -> Option<u64> {
        Some(meminfo("Slab")? + meminfo("VmallocUsed")?)
    }

    /// Reports nothing more below `seen` (a problem is reported once).
    pub fn raise(&mut self, seen: u64) {
        self.bound = self.bound.max(seen.saturating_mul(2));
    }

    /// Samples: how far kernel memory grew beyond the workers' charge, if more than the bound.
    pub fn sample(&mut self) -> Option<u64> {
        let now = Self::kernel_bytes()?;
        let charged = stat(&self.group, "slab")? + stat(&self.group, "vmalloc").unwrap_or(0);
        let unseen = now.saturating_sub(self.base).saturating_sub(charged);
        self.worst = self.worst.max(unseen);
        (unseen > self.bound).then_some(unseen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_decode_where_written_and_after_a_move() {
        for id in [0u16, 1, 0x1234, 0xffff] {
            let t = tag(id);
            for o in [0u64, 8, 4096, 8 << 20] {
                assert_eq!(tag_id(t + o / 8, o), Some(id));
                // Copied 64 MiB away either way, it is still the same worker's.
                assert_eq!(tag_id(t + o / 8, o + (64 << 20) - 8), Some(id));
                assert_eq!(tag_id(t + (o + (64 << 20) - 8) / 8, o), Some(id));
            }
        }
    }

    #[test]
    fn no_byte_run_or_one_byte_change_is_a_tag() {
        for b in 0..=255u8 {
            let w = u64::from_le_bytes([b; 8]);
            for o in [0u64, 8, 4096, 1 << 20] {
                assert_eq!(tag_id(w, o), None, "byte {b:#x} at {o}");
            }
        }
        let t = tag(0x4242);
        for byte in 0..8 {
            for add in 1..=255u8 {
                let mut bytes = t.to_le_bytes();
                bytes[byte] = bytes[byte].wrapping_add(add);
                let w = u64::from_le_bytes(bytes);
                assert!(
                    tag_id(w, 0).is_none_or(|id| id == 0x4242),
                    "byte {byte} + {add}"
                );
            }
        }
    }

    #[test]
    fn untagged_seeds_make_no_tag() {
        for seed in [0u64, u64::MAX, 0xf1ff_ffff_ffff_ffff, 0xf100_0000_0000_0000] {
            let s = untagged_seed(seed);
            for o in [0u64, 8, 1 << 20] {
                assert_eq!(tag_id(s + o / 8, o), None);
            }
        }
    }

    #[test]
    fn foreign_finds_the_first_other_worker() {
        let mut bytes = Vec::new();
        for i in 0..4u64 {
            bytes.extend_from_slice(&(tag(7) + i).to_le_bytes());
        }
        assert_eq!(foreign(&bytes, 7), None);
        bytes[16..24].copy_from_slice(&(tag(9) + 2).to_le_bytes());
        assert_eq!(foreign(&bytes, 7), Some((16, 9)));
    }
}
