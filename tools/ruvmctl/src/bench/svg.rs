// SPDX-License-Identifier: GPL-2.0

//! The size-scaling curves of a bench run (the `g4` cases) as an SVG: time per operation
//! against size, log-log, ruvm's four ways and the `mmap(MAP_POPULATE)` baseline.

use std::fmt::Write as _;

use super::{cases::size_name, report::human, Results};

const W: f64 = 930.0;
const H: f64 = 560.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 260.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

/// One curve: a name, a colour, its points (size, ns).
struct Curve {
    name: String,
    colour: &'static str,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

fn curves(res: &Results) -> Vec<Curve> {
    let mut out = Vec::new();
    let colours = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd"];
    let configs = [
        ("4K", "raw"),
        ("4K", "zeroed"),
        ("2M", "raw"),
        ("2M", "zeroed"),
    ];
    for ((chunk, zero), colour) in configs.iter().zip(colours) {
        let prefix = format!("g4.{chunk}.{zero}.");
        let cases: Vec<_> = res
            .cases
            .iter()
            .filter(|c| c.id.starts_with(&prefix))
            .collect();
        out.push(Curve {
            name: format!("ruvm, {chunk} chunks, {zero}"),
            colour,
            dashed: false,
            points: cases
                .iter()
                .map(|c| (c.size as f64, c.ruvm_median()))
                .collect(),
        });
        if *chunk == "4K" && *zero == "raw" {
            out.push(Curve {
                name: "mmap(MAP_POPULATE) + munmap".into(),
                colour: "#ff7f0e",
                dashed: true,
                points: cases
                    .iter()
                    .map(|c| (c.size as f64, c.base_median()))
                    .collect(),
            });
        }
    }
    out.retain(|c| c.points.iter().any(|p| p.1 > 0.0));
    out
}

/// The SVG document.
pub fn render(res: &Results) -> String {
    let cs = curves(res);
    let all: Vec<(f64, f64)> = cs
        .iter()
        .flat_map(|c| c.points.iter().copied())
        .filter(|p| p.0 > 0.0 && p.1 > 0.0)
        .collect();
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" font-size="15" text-anchor="middle">ruvm: time per allocation + free against size (log-log) — {}</text>
"#,
        W / 2.0,
        escape(&res.guest)
    );
    if all.is_empty() {
        s.push_str("<text x=\"100\" y=\"100\">no scaling cases in this run</text>\n</svg>\n");
        return s;
    }
    let lx = |v: f64| v.log2();
    let (x0, x1) = (
        all.iter().map(|p| lx(p.0)).fold(f64::MAX, f64::min).floor(),
        all.iter().map(|p| lx(p.0)).fold(f64::MIN, f64::max).ceil(),
    );
    let (y0, y1) = (
        all.iter()
            .map(|p| p.1.log10())
            .fold(f64::MAX, f64::min)
            .floor(),
        all.iter()
            .map(|p| p.1.log10())
            .fold(f64::MIN, f64::max)
            .ceil(),
    );
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let px = |v: f64| LEFT + (lx(v) - x0) / (x1 - x0).max(1.0) * pw;
    let py = |v: f64| TOP + ph - (v.log10() - y0) / (y1 - y0).max(1.0) * ph;
    // Axes and grid.
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    let mut e = x0;
    while e <= x1 {
        let x = px(2f64.powf(e));
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 18.0,
            size_name(2f64.powf(e) as u64)
        );
        e += 2.0;
    }
    for e in (y0 as i32)..=(y1 as i32) {
        let y = py(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            human(10f64.powi(e), "ns")
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">size</text><text x="20" y="{}" transform="rotate(-90 20 {})" text-anchor="middle">time per operation (median)</text>"#,
        LEFT + pw / 2.0,
        H - 15.0,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    // Curves and legend.
    for (i, c) in cs.iter().enumerate() {
        let pts: Vec<String> = c
            .points
            .iter()
            .filter(|p| p.0 > 0.0 && p.1 > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let dash = if c.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            pts.join(" "),
            c.colour
        );
        for p in &pts {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                s,
                r#"<circle cx="{x}" cy="{y}" r="3" fill="{}"/>"#,
                c.colour
            );
        }
        let ly = TOP + 20.0 + i as f64 * 22.0;
        let lx0 = LEFT + pw + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx0}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx0 + 24.0,
            c.colour,
            lx0 + 30.0,
            ly + 4.0,
            escape(&c.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::super::Case;
    use super::*;

    #[test]
    fn draws_every_curve() {
        let mut res = Results::default();
        for (i, size) in [4096u64, 16384, 65536].into_iter().enumerate() {
            for cfg in ["4K.raw", "2M.zeroed"] {
                res.cases.push(Case {
                    id: format!("g4.{cfg}.{i}"),
                    what: String::new(),
                    baseline: String::new(),
                    unit: "ns".into(),
                    ruvm: vec![size as f64],
                    base: vec![size as f64 * 2.0],
                    size,
                });
            }
        }
        let svg = render(&res);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3);
    }
}
