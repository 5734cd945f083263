// SPDX-License-Identifier: GPL-2.0

//! `ruvmctl bench`: ruvm's speed and memory measured against the kernel and user space in the
//! same guest. Every case runs ruvm's way and its baseline interleaved (alternating which goes
//! first, a warm-up pair discarded), so the ratios compare like with like on a machine whose
//! absolute speed means nothing (TCG). It reports, never asserts: the exit status says only
//! whether every case could run.
//!
//! The cases are in [`cases`] (the stream cases in [`streams`], stream-ordered allocation in
//! [`stream_alloc`], IPC pools in [`ipc`], libruvm's allocator on traces in [`ualloc`]); the goals and the table in
//! [`report`]; the size-scaling SVG in [`svg`] (drawn on the host from the JSON the guest
//! prints).

use std::time::Instant;

use anyhow::Result;
use serde::{Deserialize, Serialize};

pub mod cases;
pub mod heap;
mod held;
pub mod ipc;
mod register;
pub mod report;
pub mod stream_alloc;
pub mod streams;
pub mod svg;
pub mod ualloc;

/// How much to run.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Measured pairs per case (after the warm-up pair).
    pub reps: usize,
    /// The largest sysmem size a case uses (1 GiB in a full run).
    pub max_size: u64,
}

/// The groups of cases, in the order they run.
pub const GROUPS: [&str; 14] = [
    "g1",
    "g2",
    "g3",
    "g4",
    "g5",
    "copy",
    "mem",
    "va",
    "pool",
    "streams",
    "stream_alloc",
    "ipc",
    "ualloc",
    "heap",
];

/// One case: ruvm's way and the baseline's, sample by sample (nanoseconds, or bytes for the
/// memory cases), pairs in the order measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Case {
    /// A stable id, e.g. `g1.path.4K`.
    pub id: String,
    /// What ruvm does.
    pub what: String,
    /// What it is compared with (empty: an absolute figure).
    pub baseline: String,
    /// `ns` (time per operation) or `B` (bytes per chunk).
    pub unit: String,
    pub ruvm: Vec<f64>,
    pub base: Vec<f64>,
    /// For the scaling curves: the size in bytes, else 0.
    #[serde(default)]
    pub size: u64,
}

impl Case {
    /// The median of ruvm's samples.
    pub fn ruvm_median(&self) -> f64 {
        median(&self.ruvm)
    }

    /// The median of the baseline's samples.
    pub fn base_median(&self) -> f64 {
        median(&self.base)
    }

    /// ruvm / baseline: the median of the per-pair ratios ("paired median"); NaN without a
    /// baseline.
    pub fn ratio(&self) -> f64 {
        let r: Vec<f64> = self
            .ruvm
            .iter()
            .zip(&self.base)
            .filter(|(_, &b)| b > 0.0)
            .map(|(&a, &b)| a / b)
            .collect();
        median(&r)
    }
}

/// Everything a run measured, as printed for the host.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    /// The guest: kernel release, CPUs, memory.
    pub guest: String,
    pub reps: usize,
    pub max_size: u64,
    pub cases: Vec<Case>,
}

/// The median (NaN for none).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// The smallest (NaN for none).
pub fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::min)
}

/// Times `f` once, in nanoseconds.
pub fn time(f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_nanos() as f64)
}

/// Measures ruvm's way (`a`) against the baseline (`b`): one warm-up pair, then `reps` pairs,
/// alternating which runs first. Each closure returns its own sample (it may time only a part
/// of what it does).
pub fn pairs(
    reps: usize,
    a: &mut dyn FnMut() -> Result<f64>,
    b: &mut dyn FnMut() -> Result<f64>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    a()?;
    b()?;
    let (mut ra, mut rb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for i in 0..reps {
        if i % 2 == 0 {
            ra.push(a()?);
            rb.push(b()?);
        } else {
            rb.push(b()?);
            ra.push(a()?);
        }
    }
    Ok((ra, rb))
}

/// Runs every case and prints the table; with `json`, also the results as `BENCH-JSON` lines
/// (for the host, which reassembles them).
pub fn command(spec: &Spec, groups: &[String], json: bool) -> Result<()> {
    let d = libruvm::Ruvm::open()?;
    let mut res = Results {
        guest: cases::guest_description(),
        reps: spec.reps,
        max_size: spec.max_size,
        cases: Vec::new(),
    };
    let more: [cases::CaseGroup; 5] = [
        streams::streams,
        stream_alloc::stream_alloc,
        ipc::ipc,
        ualloc::ualloc,
        heap::heap,
    ];
    cases::run_all(&d, spec, groups, &more, &mut |c: Case| {
        eprintln!(
            "bench: {:<28} ruvm {:>12.0} {}  base {:>12.0}  ratio {:.3}",
            c.id,
            c.ruvm_median(),
            c.unit,
            c.base_median(),
            c.ratio()
        );
        res.cases.push(c);
    })?;
    let table = report::evaluate(&res);
    println!("{}", report::render(&res, &table));
    if json {
        emit_lines("BENCH-JSON ", &serde_json::to_string(&res)?);
        emit_lines("BENCH-TABLE ", &serde_json::to_string(&table)?);
    }
    Ok(())
}

/// Reassembles the results and the table a guest printed (`BENCH-JSON` / `BENCH-TABLE` lines
/// in its console log `log`), writes `results.json`, `table.json` and `scaling.svg` into `out`,
/// and prints the table.
pub fn report_files(log: &std::path::Path, out: &std::path::Path) -> Result<()> {
    use anyhow::Context as _;
    let text = std::fs::read_to_string(log).with_context(|| log.display().to_string())?;
    let joined = |prefix: &str| -> String {
        text.lines()
            .filter_map(|l| l.trim_end_matches('\r').strip_prefix(prefix))
            .collect()
    };
    let raw = joined("BENCH-JSON ");
    if raw.is_empty() {
        anyhow::bail!(
            "{}: no BENCH-JSON lines (did the bench run?)",
            log.display()
        );
    }
    let res: Results = serde_json::from_str(&raw).context("the guest's BENCH-JSON")?;
    let table = report::evaluate(&res);
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&res)?,
    )?;
    std::fs::write(
        out.join("table.json"),
        serde_json::to_string_pretty(&table)?,
    )?;
    std::fs::write(out.join("scaling.svg"), svg::render(&res))?;
    println!("{}", report::render(&res, &table));
    println!(
        "wrote {0}/results.json (samples), {0}/table.json, {0}/scaling.svg",
        out.display()
    );
    Ok(())
}

/// Prints `text` in lines of at most 160 characters, each after `prefix` (a console line that
/// a kernel message might interrupt stays short).
fn emit_lines(prefix: &str, text: &str) {
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = rest.len().min(160);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        println!("{prefix}{}", &rest[..cut]);
        rest = &rest[cut..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_paired_ratio() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        let c = Case {
            id: "x".into(),
            what: String::new(),
            baseline: String::new(),
            unit: "ns".into(),
            ruvm: vec![10.0, 30.0, 20.0],
            base: vec![20.0, 30.0, 10.0],
            size: 0,
        };
        // Pair ratios 0.5, 1, 2.
        assert_eq!(c.ratio(), 1.0);
    }

    #[test]
    fn pairs_alternate_and_discard_the_warm_up() {
        let order = std::cell::RefCell::new(Vec::new());
        let (a, b) = pairs(
            3,
            &mut || {
                order.borrow_mut().push('a');
                Ok(1.0)
            },
            &mut || {
                order.borrow_mut().push('b');
                Ok(2.0)
            },
        )
        .unwrap();
        assert_eq!(a, vec![1.0; 3]);
        assert_eq!(b, vec![2.0; 3]);
        assert_eq!(
            order.into_inner(),
            vec!['a', 'b', 'a', 'b', 'b', 'a', 'a', 'b']
        );
    }
}
