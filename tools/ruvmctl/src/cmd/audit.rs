// SPDX-License-Identifier: GPL-2.0

//! The audit commands: usage statistics and live counts (`stats`), the leak verdict from the
//! kernel log (`audit`), and unloading with the module's own verdict (`unload`).

use std::collections::BTreeMap;

use anyhow::{anyhow, Context as _, Result};
use libruvm::{cmd, names, uapi, unload_with_verdict, Ruvm};
use serde::Serialize;

use super::{arg, call};
use crate::{
    kmsg,
    output::{fields, table, Report},
};

/// One backing's statistics.
#[derive(Serialize)]
pub struct Backing {
    backing: &'static str,
    reserved_bytes: u64,
    reserved_peak: u64,
    used_bytes: u64,
    used_peak: u64,
    mems: u64,
    mems_peak: u64,
    allocs: u64,
    frees: u64,
    alloc_failures: u64,
}

/// What `stats` shows.
#[derive(Serialize)]
pub struct Stats {
    /// Sysmem, at the top level.
    #[serde(flatten)]
    sysmem: Backing,
    vidmem: Backing,
    live: BTreeMap<String, u64>,
    leak_checker: u32,
    /// Every pool of every process (`/sys/kernel/debug/ruvm/pools`, root), each line's
    /// fields by name; `None` if it could not be read.
    pools: Option<Vec<BTreeMap<String, u64>>>,
    /// Who holds vidmem: each cgroup (dmem controller) and each user (`vidmem usage`).
    vidmem_holders: super::vidmem::Usage,
}

/// Where the module lists every pool.
const POOLS_DEBUGFS: &str = "/sys/kernel/debug/ruvm/pools";

/// The lines of [`POOLS_DEBUGFS`], each `name=value ...`, by name.
fn read_pools() -> Option<Vec<BTreeMap<String, u64>>> {
    let text = std::fs::read_to_string(POOLS_DEBUGFS).ok()?;
    Some(
        text.lines()
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .filter_map(|(k, v)| {
                        let n = match v.strip_prefix("0x") {
                            Some(h) => u64::from_str_radix(h, 16).ok()?,
                            None => v.parse().ok()?,
                        };
                        Some((k.to_owned(), n))
                    })
                    .collect()
            })
            .collect(),
    )
}

fn backing(d: &Ruvm, which: u32, name: &'static str, reset: bool) -> Result<Backing> {
    let mut s = arg(|s: &mut uapi::ruvm_stats| {
        s.backing = which;
        if reset {
            s.flags = uapi::ruvm_stats_flags_RUVM_STATS_RESET_PEAKS;
        }
    });
    call(d, cmd::STATS, &mut s)?;
    Ok(Backing {
        backing: name,
        reserved_bytes: s.reserved_bytes,
        reserved_peak: s.reserved_peak,
        used_bytes: s.used_bytes,
        used_peak: s.used_peak,
        mems: s.mems,
        mems_peak: s.mems_peak,
        allocs: s.allocs,
        frees: s.frees,
        alloc_failures: s.alloc_failures,
    })
}

pub fn stats(d: &Ruvm, reset: bool) -> Result<Stats> {
    let sysmem = backing(d, uapi::ruvm_backing_RUVM_BACKING_SYSMEM, "sysmem", reset)?;
    let vidmem = backing(d, uapi::ruvm_backing_RUVM_BACKING_VIDMEM, "vidmem", reset)?;
    let mut a = uapi::ruvm_audit::default();
    call(d, cmd::AUDIT, &mut a)?;
    let classes = names::audit_classes();
    Ok(Stats {
        sysmem,
        vidmem,
        live: a
            .live
            .iter()
            .enumerate()
            .map(|(i, n)| (names::audit_class(classes.as_deref(), i), *n))
            .collect(),
        leak_checker: a.level,
        pools: read_pools(),
        vidmem_holders: super::vidmem::usage()?,
    })
}

impl Report for Stats {
    fn render(&self) -> String {
        let mut rows = Vec::new();
        for b in [&self.sysmem, &self.vidmem] {
            rows.push([
                b.backing.to_owned(),
                b.reserved_bytes.to_string(),
                b.reserved_peak.to_string(),
                b.used_bytes.to_string(),
                b.used_peak.to_string(),
                b.mems.to_string(),
                b.mems_peak.to_string(),
                b.allocs.to_string(),
                b.frees.to_string(),
                b.alloc_failures.to_string(),
            ]);
        }
        let usage = table(
            &[
                "backing", "reserved", "peak", "used", "peak", "mems", "peak", "allocs", "frees",
                "failed",
            ],
            rows,
        );
        let live: Vec<String> = self
            .live
            .iter()
            .filter(|(_, n)| **n != 0)
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        let pools = match &self.pools {
            None => "pools: (read as root: /sys/kernel/debug/ruvm/pools)".to_owned(),
            Some(p) if p.is_empty() => "pools: none".to_owned(),
            Some(p) => {
                let f = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
                let rows = p.iter().map(|m| {
                    let cached = f(m, "cached_chunks") * f(m, "chunk");
                    [
                        f(m, "pool").to_string(),
                        f(m, "pid").to_string(),
                        f(m, "reserved").to_string(),
                        f(m, "used").to_string(),
                        // A module without stream-ordered allocation lists none.
                        m.get("pending").map_or("-".into(), u64::to_string),
                        cached.to_string(),
                        f(m, "hits").to_string(),
                        f(m, "misses").to_string(),
                    ]
                });
                format!(
                    "pools (reserved = used + pending + cached: memory a pool holds for reuse; pending: freed on streams, not yet synchronized):\n{}",
                    table(
                        &[
                            "pool", "pid", "reserved", "used", "pending", "cached", "hits",
                            "misses"
                        ],
                        rows
                    )
                )
            }
        };
        let holders = format!("vidmem by holder:\n{}", self.vidmem_holders.render());
        format!(
            "{usage}\n{pools}\n{holders}\naudit (leak_checker={}): {}",
            self.leak_checker,
            if live.is_empty() {
                "nothing live".to_owned()
            } else {
                live.join(" ")
            }
        )
    }
}

/// The kernel log's verdict.
#[derive(Serialize)]
pub struct Audit {
    verdict: &'static str,
    since: Option<String>,
    findings: kmsg::Findings,
    kmemleak_objects: Option<usize>,
    dma_api_errors: Option<u64>,
    problems: Vec<String>,
    /// Who holds vidmem now, by cgroup and by user (`vidmem usage`; nothing once unloaded).
    vidmem_holders: super::vidmem::Usage,
}

/// What `audit` looks at.
pub struct AuditSpec {
    pub since: Option<String>,
    pub require_unload: bool,
    pub no_kmemleak: bool,
}

pub fn audit(s: AuditSpec) -> Result<Audit> {
    let log = kmsg::read_kmsg().context("reading /dev/kmsg")?;
    let part = kmsg::since(&log, s.since.as_deref()).ok_or_else(|| {
        anyhow!(
            "marker {} is not in the kernel log (rotated out?)",
            s.since.as_deref().unwrap_or("")
        )
    })?;
    let findings = kmsg::Findings::parse(part.iter().map(String::as_str));
    let kml = if s.no_kmemleak {
        None
    } else {
        kmsg::kmemleak_scan()
    };
    let dma = kmsg::dma_api_errors();
    let mut problems = Vec::new();
    for u in findings
        .unloads
        .iter()
        .filter(|u| findings.leaked() && u.verdict != "clean")
    {
        let classes: Vec<String> = u.classes.iter().map(|(k, n)| format!("{k}={n}")).collect();
        problems.push(format!("ruvm unloaded with leaks: {}", classes.join(" ")));
    }
    if s.require_unload && findings.unloads.is_empty() {
        problems.push("no unload verdict in the log".to_owned());
    }
    if let Some((n, _)) = &kml {
        if *n > 0 {
            problems.push(format!("kmemleak: {n} unreferenced objects"));
        }
    }
    if let Some(n) = dma.filter(|&n| n > 0) {
        problems.push(format!("DMA-API debug: {n} errors"));
    }
    Ok(Audit {
        verdict: if problems.is_empty() {
            "clean"
        } else {
            "leaked"
        },
        since: s.since,
        kmemleak_objects: kml.as_ref().map(|k| k.0),
        dma_api_errors: dma,
        findings,
        problems,
        vidmem_holders: super::vidmem::usage()?,
    })
}

impl Report for Audit {
    fn render(&self) -> String {
        let f = &self.findings;
        let mut out = fields([
            (
                "unload verdicts",
                f.unloads
                    .iter()
                    .map(|u| u.verdict.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            ("files reclaimed", f.reclaims.len().to_string()),
            ("planted leaks", f.planted.len().to_string()),
            (
                "kmemleak",
                self.kmemleak_objects
                    .map_or("not in this kernel".to_owned(), |n| format!("{n} objects")),
            ),
            (
                "DMA-API debug errors",
                self.dma_api_errors
                    .map_or("not in this kernel".to_owned(), |n| n.to_string()),
            ),
        ]);
        for u in &f.unloads {
            for (k, n) in &u.classes {
                out += &format!("\n  leaked {k:<18} {n}");
            }
            for o in &u.objects {
                out += &format!("\n  leaked object {o}");
            }
        }
        out += &format!("\nvidmem by holder:\n{}", self.vidmem_holders.render());
        out += &format!("\nverdict: {}", self.verdict);
        for p in &self.problems {
            out += &format!("\n  {p}");
        }
        out
    }

    fn failure(&self) -> Option<String> {
        (!self.problems.is_empty()).then(|| format!("audit: {}", self.problems.join("; ")))
    }
}

/// The marker `audit --mark` wrote.
#[derive(Serialize)]
pub struct Mark {
    mark: String,
}

pub fn mark() -> Result<Mark> {
    Ok(Mark {
        mark: kmsg::write_marker().context("writing to /dev/kmsg")?,
    })
}

impl Report for Mark {
    fn render(&self) -> String {
        self.mark.clone()
    }
}

/// The module's verdict at unload.
#[derive(Serialize)]
pub struct Unload {
    unloaded: bool,
    verdict: &'static str,
    leaked: BTreeMap<String, u64>,
}

pub fn unload() -> Result<Unload> {
    // The class names, while the module is there to tell them.
    let classes = names::audit_classes();
    let st = unload_with_verdict().map_err(|e| anyhow!(e))?;
    let done = st.state & u64::from(uapi::ruvm_unload_state_bits_RUVM_UNLOAD_DONE) != 0;
    let leaked = st.state & u64::from(uapi::ruvm_unload_state_bits_RUVM_UNLOAD_LEAKED) != 0;
    Ok(Unload {
        unloaded: true,
        verdict: match (done, leaked) {
            (false, _) => "unknown",
            (true, false) => "clean",
            (true, true) => "leaked",
        },
        leaked: st
            .leaked
            .iter()
            .enumerate()
            .filter(|(_, n)| **n != 0)
            .map(|(i, n)| (names::audit_class(classes.as_deref(), i), *n))
            .collect(),
    })
}

impl Report for Unload {
    fn render(&self) -> String {
        let mut out = format!("ruvm unloaded: verdict {}", self.verdict);
        for (k, n) in &self.leaked {
            out += &format!("\n  leaked {k:<18} {n}");
        }
        out
    }

    fn failure(&self) -> Option<String> {
        match self.verdict {
            "clean" => None,
            "leaked" => Some("ruvm unloaded with leaks".to_owned()),
            _ => Some("the module did not write its unload verdict".to_owned()),
        }
    }
}
