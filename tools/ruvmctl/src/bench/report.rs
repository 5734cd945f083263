// SPDX-License-Identifier: GPL-2.0

//! The goals of `make bench` (Documentation/performance.rst), each evaluated from the cases of
//! one run, and the table that shows them.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde::{Deserialize, Serialize};

use super::{cases::size_name, median, min, Case, Results};

/// One row of the table: a figure, the goal beside it and whether it was met.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// The goal it serves (G1..G5, Copy, Memory; "info" for a figure without a goal).
    pub goal: String,
    pub what: String,
    /// The figure (a ratio, ns per chunk, bytes per chunk, a slope).
    pub value: f64,
    /// How the figure is read, e.g. "ruvm/base time".
    pub measure: String,
    /// The goal as text ("<= 0.6"); empty for information only.
    pub target: String,
    /// PASS, MISS, or INFO.
    pub verdict: String,
    /// Medians behind the figure, for the reader.
    pub detail: String,
}

/// How a figure is held to its goal.
#[derive(Clone, Copy)]
enum Target {
    AtMost(f64),
    Within(f64, f64),
    Info,
}

fn row(goal: &str, what: String, value: f64, measure: &str, t: Target, detail: String) -> Row {
    let (target, verdict) = match t {
        Target::AtMost(x) => (format!("<= {x}"), value <= x),
        Target::Within(lo, hi) => (format!("{lo} to {hi}"), (lo..=hi).contains(&value)),
        Target::Info => (String::new(), true),
    };
    let verdict = match (t, verdict) {
        (Target::Info, _) => "INFO",
        (_, true) => "PASS",
        (_, false) => "MISS",
    };
    Row {
        goal: goal.to_owned(),
        what,
        value,
        measure: measure.to_owned(),
        target,
        verdict: verdict.to_owned(),
        detail,
    }
}

/// "ruvm X / base Y" with both medians.
fn medians(c: &Case) -> String {
    format!(
        "median ruvm {} / base {} (min {} / {})",
        human(c.ruvm_median(), &c.unit),
        human(c.base_median(), &c.unit),
        human(min(&c.ruvm), &c.unit),
        human(min(&c.base), &c.unit)
    )
}

/// A nanosecond or byte figure as people read it.
pub fn human(v: f64, unit: &str) -> String {
    if unit != "ns" {
        return format!("{v:.1} {unit}");
    }
    match v {
        v if v >= 1e9 => format!("{:.2} s", v / 1e9),
        v if v >= 1e6 => format!("{:.2} ms", v / 1e6),
        v if v >= 1e3 => format!("{:.2} us", v / 1e3),
        v => format!("{v:.0} ns"),
    }
}

/// Least-squares slope of log2(time) against log2(size), as a factor per doubling.
pub fn per_doubling(points: &[(u64, f64)]) -> f64 {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .filter(|(_, t)| *t > 0.0)
        .map(|&(s, t)| ((s as f64).log2(), t.log2()))
        .collect();
    if pts.len() < 2 {
        return f64::NAN;
    }
    let n = pts.len() as f64;
    let (mx, my) = (
        pts.iter().map(|p| p.0).sum::<f64>() / n,
        pts.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    2f64.powf(sxy / sxx)
}

/// A row for a case's paired ratio (ruvm / baseline time) against `t`.
fn ratio_row(goal: &str, c: &Case, t: Target) -> Row {
    row(
        goal,
        c.what.clone(),
        c.ratio(),
        "ruvm/base time",
        t,
        medians(c),
    )
}

/// Every goal, evaluated from `res`.
pub fn evaluate(res: &Results) -> Vec<Row> {
    let get = |id: &str| res.cases.iter().find(|c| c.id == id);
    let with_prefix = |p: &'static str| res.cases.iter().filter(move |c| c.id.starts_with(p));
    let mut rows = Vec::new();
    // G1.
    if let Some(c) = get("g1.path.2M") {
        rows.push(ratio_row("G1", c, Target::AtMost(0.6)));
    }
    // Each other chunk size's path against the 2 MiB path, the two run alternately.
    for other in with_prefix("g1.path.").filter(|o| o.id != "g1.path.2M") {
        let mut r = ratio_row("G1", other, Target::AtMost(1.1));
        r.what = format!("{} vs 2M chunks", other.id.trim_start_matches("g1.path."));
        r.measure = "time / 2M's".into();
        rows.push(r);
    }
    for c in with_prefix("g1.step.") {
        let mut r = ratio_row("G1", c, Target::Info);
        r.measure = "step/memset".into();
        rows.push(r);
    }
    // G2 (with the user path step by step) and G3.
    for (goal, id, t) in [
        ("G2", "g2.alloc_free", Target::AtMost(1.0)),
        ("G2", "g2.user_path", Target::AtMost(1.0)),
    ] {
        if let Some(c) = get(id) {
            rows.push(ratio_row(goal, c, t));
        }
    }
    for c in with_prefix("g2.step.") {
        let mut r = ratio_row("G2", c, Target::Info);
        r.measure = "step/anon path".into();
        rows.push(r);
    }
    for (goal, id, t) in [
        ("G3", "g3.vidmem_cold", Target::AtMost(1.0)),
        ("G3", "g3.vidmem_warm", Target::AtMost(1.0)),
        ("G3", "g3.vidmem_vs_pages", Target::Info),
        ("G3", "g3.vidmem_written", Target::Info),
    ] {
        if let Some(c) = get(id) {
            rows.push(ratio_row(goal, c, t));
        }
    }
    // G4: the slope above 2 MiB of each curve, fitted to each size's fastest sample (the page
    // allocator's state makes the slower samples of one size differ by up to 3x, depending on
    // what ran just before; the fastest is the cost itself).
    for (chunk, zero) in [
        ("4K", "raw"),
        ("4K", "zeroed"),
        ("2M", "raw"),
        ("2M", "zeroed"),
    ] {
        let prefix = format!("g4.{chunk}.{zero}.");
        let pts: Vec<(u64, f64)> = res
            .cases
            .iter()
            .filter(|c| c.id.starts_with(prefix.as_str()) && c.size > 2 << 20)
            .map(|c| (c.size, min(&c.ruvm)))
            .collect();
        if pts.len() >= 2 {
            let (lo, hi) = (pts[0].0, pts[pts.len() - 1].0);
            rows.push(row(
                "G4",
                format!("alloc+free cost vs size, {chunk} chunks, {zero}"),
                per_doubling(&pts),
                "factor per doubling",
                Target::Within(1.82, 2.2),
                format!(
                    "{} points, {} to {}, fastest sample of each",
                    pts.len(),
                    size_name(lo),
                    size_name(hi)
                ),
            ));
        }
    }
    // G5.
    for c in with_prefix("g5.kernel.") {
        rows.push(ratio_row("G5", c, Target::AtMost(1.1)));
    }
    for c in with_prefix("g5.dma.") {
        let t = if c.id == "g5.dma.4K" {
            Target::AtMost(500.0)
        } else {
            Target::Info
        };
        rows.push(row(
            "G5",
            c.what.clone(),
            median(&c.ruvm),
            "ns per chunk",
            t,
            format!("min {}", human(min(&c.ruvm), "ns")),
        ));
    }
    if let Some(c) = get("g5.kmap") {
        rows.push(ratio_row("G5", c, Target::AtMost(1.1)));
    }
    // GPU virtual mappings: the page tables on top of the DMA map.
    for (id, t) in [
        ("va.map_kernel.2M", Target::AtMost(2.0)),
        ("va.map_kernel.4K", Target::AtMost(4.0)),
    ] {
        if let Some(c) = get(id) {
            rows.push(ratio_row("GPU VA", c, t));
        }
    }
    // Memory pools: a hit at least 10x the rate of a fresh mapped allocation; a trim no
    // dearer than the frees it replaces.
    if let Some(c) = get("pool.hit.64K") {
        let mut r = ratio_row("Pools", c, Target::AtMost(0.1));
        r.target = "<= 0.1 (rate >= 10x)".into();
        rows.push(r);
    }
    for c in with_prefix("pool.trim.") {
        rows.push(ratio_row("Pools", c, Target::AtMost(1.0)));
    }
    for id in ["pool.ioctl_floor", "pool.mem_object"] {
        if let Some(c) = get(id) {
            rows.push(ratio_row("Pools", c, Target::Info));
        }
    }
    // Copies: throughput, the inverse of the time ratio.
    for (id, t) in [
        ("copy.mem", Target::AtMost(1.0 / 0.9)),
        ("copy.ce_sim", Target::Info),
    ] {
        if let Some(c) = get(id) {
            let mut r = ratio_row("Copy", c, t);
            if let Target::AtMost(_) = t {
                r.target = "<= 1.111 (throughput >= 0.9x)".into();
            }
            rows.push(r);
        }
    }
    // Streams: a queued (RECORD + WAIT_EVENT) pair at most half a bare ioctl, in batches on
    // one stream or across two; a one-operation submit at most 2x a bare ioctl, a cross-stream
    // pair of them at most 2x; an async copy at least 0.9x a synchronous one's throughput (the
    // inverse of the time ratio, as for the copies); two GPUs' streams together in at most 3/4
    // of the time of one after the other.
    for (id, limit, measure, target) in [
        ("stream.submit", 0.5, "per pair / per ioctl", None),
        ("stream.submit_one", 2.0, "per call / per ioctl", None),
        ("stream.cross_one", 2.0, "per pair / per ioctl", None),
        ("stream.cross_batch", 0.5, "per pair / per ioctl", None),
        (
            "stream.copy_async",
            1.0 / 0.9,
            "ruvm/base time",
            Some("<= 1.111 (throughput >= 0.9x)"),
        ),
        ("stream.two_gpus", 0.75, "together / in turn", None),
    ] {
        if let Some(c) = get(id) {
            let mut r = ratio_row("Streams", c, Target::AtMost(limit));
            r.measure = measure.into();
            if let Some(t) = target {
                r.target = t.into();
            }
            rows.push(r);
        }
    }
    // Stream-ordered allocation: an ALLOC + FREE pair from a pool at least 10x the rate of a
    // fresh synchronous mapped allocation (the synchronous pool hit beside it, for reference);
    // 1000 x 1 MiB on one stream reserve exactly 1 MiB, the worst sample read.
    if let Some(c) = get("stream_alloc.pool_hit") {
        let mut r = ratio_row("Streams", c, Target::AtMost(0.1));
        r.measure = "per pair / fresh".into();
        r.target = "<= 0.1 (rate >= 10x)".into();
        rows.push(r);
    }
    if let Some(c) = get("stream_alloc.sync_pool_hit") {
        let mut r = ratio_row("Streams", c, Target::Info);
        r.measure = "per hit / fresh".into();
        rows.push(r);
    }
    // libruvm's allocator on traces: a pair at most 0.05 of fresh mems', and at most 1.1x the
    // peak of live bytes reserved, on every class.
    for c in with_prefix("ualloc.") {
        let mut r = ratio_row(
            "Allocator",
            c,
            Target::AtMost(if c.unit == "B" { 1.1 } else { 0.05 }),
        );
        r.measure = if c.unit == "B" {
            "reserved high / live peak".into()
        } else {
            "per pair / fresh".into()
        };
        rows.push(r);
    }
    // Pinned heaps: small blocks within 1.5x glibc's malloc (mimalloc's own heap beside it,
    // for information); the training trace at most 0.005 of fresh mems, its resident peak at
    // most 1.1x the live peak.
    for c in with_prefix("heap.") {
        let (target, measure) = match c.id.as_str() {
            "heap.small" => (Target::AtMost(1.5), "per pair / glibc"),
            "heap.small.mimalloc" => (Target::Info, "per pair / glibc"),
            "heap.training.footprint" => (Target::AtMost(1.1), "resident high / live peak"),
            "heap.one_call_4k" => (Target::AtMost(0.8), "per round / mmap path"),
            "heap.register_64k" | "heap.register_64m" => {
                (Target::AtMost(2.0), "per pair / mmap populate pair")
            }
            _ => (Target::AtMost(0.005), "per pair / fresh"),
        };
        let mut r = ratio_row("Pinned heap", c, target);
        r.measure = measure.into();
        rows.push(r);
    }
    // IPC pools, against a bare ioctl: for information (CUDA on an H100 in the note).
    for c in with_prefix("ipc.") {
        let mut r = ratio_row("Sharing", c, Target::Info);
        r.measure = "per op / bare ioctl".into();
        rows.push(r);
    }
    if let Some(c) = get("stream_alloc.footprint") {
        let worst = c.ruvm.iter().copied().fold(f64::NAN, f64::max);
        let mib = (1u64 << 20) as f64;
        let mut r = row(
            "Streams",
            c.what.clone(),
            worst,
            "reserved_high bytes",
            Target::Within(mib, mib),
            format!(
                "samples {:?}, used_high {:?}",
                c.ruvm.iter().map(|v| v.round()).collect::<Vec<_>>(),
                c.base.iter().map(|v| v.round()).collect::<Vec<_>>()
            ),
        );
        r.target = "exactly 1048576 (1 MiB)".into();
        rows.push(r);
    }
    // Memory: the baseline samples hold the resolution of a reading, per chunk; a figure
    // whose resolution is coarser than a quarter of its goal is shown for information only.
    for c in with_prefix("mem.") {
        let limit = if c.id.starts_with("mem.gpu.") {
            8.0
        } else {
            16.0
        };
        let resolution = c.base_median();
        let t = if resolution.is_nan() || resolution <= limit / 4.0 {
            Target::AtMost(limit)
        } else {
            Target::Info
        };
        rows.push(row(
            "Memory",
            c.what.clone(),
            median(&c.ruvm),
            "bytes per chunk",
            t,
            format!(
                "samples {:?}, each +/- {resolution:.2} B",
                c.ruvm.iter().map(|v| v.round()).collect::<Vec<_>>()
            ),
        ));
    }
    rows
}

/// The table people read, and a summary line.
pub fn render(res: &Results, rows: &[Row]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "goal", "case", "value", "measure", "target", "", "medians",
    ]);
    for r in rows {
        t.add_row(vec![
            r.goal.clone(),
            r.what.clone(),
            format!("{:.3}", r.value),
            r.measure.clone(),
            r.target.clone(),
            r.verdict.clone(),
            r.detail.clone(),
        ]);
    }
    let count = |v: &str| rows.iter().filter(|r| r.verdict == v).count();
    format!(
        "ruvm bench: {} ({} pairs per case, sizes up to {})\n{t}\n{} goals met, {} missed, {} for information",
        res.guest,
        res.reps,
        size_name(res.max_size),
        count("PASS"),
        count("MISS"),
        count("INFO")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_linear_cost_is_two() {
        let pts: Vec<(u64, f64)> = (22..30)
            .map(|s| (1u64 << s, (1u64 << s) as f64 * 3.0))
            .collect();
        assert!((per_doubling(&pts) - 2.0).abs() < 1e-9);
        let flat: Vec<(u64, f64)> = (22..30).map(|s| (1u64 << s, 5.0)).collect();
        assert!((per_doubling(&flat) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn g1_chunk_sizes_are_read_against_the_2m_path_they_alternated_with() {
        let case = |id: &str, ruvm: &[f64], base: &[f64]| Case {
            id: id.into(),
            what: id.into(),
            baseline: String::new(),
            unit: "ns".into(),
            ruvm: ruvm.to_vec(),
            base: base.to_vec(),
            size: 0,
        };
        let res = Results {
            cases: vec![
                case("g1.path.2M", &[10.0, 10.0, 10.0], &[100.0, 100.0, 100.0]),
                // The host slowed down for the second pair: both sides of it.
                case("g1.path.4K", &[12.0, 24.0, 12.0], &[10.0, 20.0, 10.0]),
            ],
            ..Default::default()
        };
        let rows = evaluate(&res);
        let two = rows
            .iter()
            .find(|r| r.what == "g1.path.2M")
            .map(|r| r.value);
        assert_eq!(two, Some(0.1));
        let four = rows.iter().find(|r| r.what == "4K vs 2M chunks");
        assert_eq!(
            four.map(|r| (r.value, r.verdict.as_str())),
            Some((1.2, "MISS"))
        );
    }

    #[test]
    fn stream_goals_read_each_case_as_its_ratio() {
        let case = |id: &str, ruvm: f64, base: f64| Case {
            id: id.into(),
            what: id.into(),
            baseline: String::new(),
            unit: "ns".into(),
            ruvm: vec![ruvm; 3],
            base: vec![base; 3],
            size: 0,
        };
        let res = Results {
            cases: vec![
                case("stream.submit", 40.0, 100.0),
                // 0.95x the synchronous copy's throughput: PASS; 0.8x would be a MISS.
                case("stream.copy_async", 100.0 / 0.95, 100.0),
                case("stream.two_gpus", 80.0, 100.0),
            ],
            ..Default::default()
        };
        let rows = evaluate(&res);
        let got: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|r| (r.what.as_str(), r.target.as_str(), r.verdict.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("stream.submit", "<= 0.5", "PASS"),
                ("stream.copy_async", "<= 1.111 (throughput >= 0.9x)", "PASS"),
                ("stream.two_gpus", "<= 0.75", "MISS"),
            ]
        );
        assert!(rows.iter().all(|r| r.goal == "Streams"));
    }

    #[test]
    fn stream_alloc_goals() {
        let case = |id: &str, ruvm: &[f64], base: &[f64]| Case {
            id: id.into(),
            what: id.into(),
            baseline: String::new(),
            unit: if id.ends_with("footprint") { "B" } else { "ns" }.into(),
            ruvm: ruvm.to_vec(),
            base: base.to_vec(),
            size: 0,
        };
        let mib = f64::from(1u32 << 20);
        let res = Results {
            cases: vec![
                // 12x the fresh rate: PASS.
                case("stream_alloc.pool_hit", &[1.0; 3], &[12.0; 3]),
                case("stream_alloc.sync_pool_hit", &[5.0; 3], &[12.0; 3]),
                // One sample reserved a second MiB: the worst is read, a MISS.
                case("stream_alloc.footprint", &[mib, 2.0 * mib, mib], &[mib; 3]),
            ],
            ..Default::default()
        };
        let rows = evaluate(&res);
        let got: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|r| (r.what.as_str(), r.target.as_str(), r.verdict.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("stream_alloc.pool_hit", "<= 0.1 (rate >= 10x)", "PASS"),
                ("stream_alloc.sync_pool_hit", "", "INFO"),
                ("stream_alloc.footprint", "exactly 1048576 (1 MiB)", "MISS"),
            ]
        );
        assert_eq!(rows[2].value, 2.0 * mib);
        let exact = Results {
            cases: vec![case("stream_alloc.footprint", &[mib; 3], &[mib; 3])],
            ..Default::default()
        };
        assert_eq!(evaluate(&exact)[0].verdict, "PASS");
    }

    #[test]
    fn verdicts() {
        assert_eq!(
            row("G", "x".into(), 0.5, "", Target::AtMost(0.6), String::new()).verdict,
            "PASS"
        );
        assert_eq!(
            row("G", "x".into(), 0.7, "", Target::AtMost(0.6), String::new()).verdict,
            "MISS"
        );
        assert_eq!(
            row(
                "G",
                "x".into(),
                2.5,
                "",
                Target::Within(1.82, 2.2),
                String::new()
            )
            .verdict,
            "MISS"
        );
        assert_eq!(
            row("G", "x".into(), 9.0, "", Target::Info, String::new()).verdict,
            "INFO"
        );
    }
}
