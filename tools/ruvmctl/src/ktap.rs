// SPDX-License-Identifier: GPL-2.0

//! KTAP output and kselftest exit codes (Documentation/dev-tools/ktap.rst).

use std::fmt::Write as _;

/// kselftest's exit code for "skipped".
pub const KSFT_SKIP: i32 = 4;

/// How one test case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

/// Counts of a finished plan.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub pass: usize,
    pub fail: usize,
    pub skip: usize,
}

impl Totals {
    /// kselftest's convention: 1 on any failure, 4 if nothing passed but something was
    /// skipped (or nothing ran), else 0.
    pub fn exit_code(&self) -> i32 {
        if self.fail > 0 {
            1
        } else if self.pass == 0 {
            KSFT_SKIP
        } else {
            0
        }
    }
}

/// Writes a KTAP plan to a sink line by line as results come in.
pub struct Ktap<W: std::io::Write> {
    out: W,
    next: usize,
    totals: Totals,
}

impl<W: std::io::Write> Ktap<W> {
    /// Starts a plan of `count` cases.
    pub fn new(mut out: W, count: usize) -> std::io::Result<Self> {
        writeln!(out, "TAP version 13\n1..{count}")?;
        Ok(Self {
            out,
            next: 1,
            totals: Totals::default(),
        })
    }

    /// A diagnostic line (`# ...`); multi-line text gets one `#` per line.
    pub fn diag(&mut self, text: &str) -> std::io::Result<()> {
        for line in text.lines() {
            writeln!(self.out, "# {line}")?;
        }
        self.out.flush()
    }

    /// Reports the next case.
    pub fn result(&mut self, name: &str, outcome: &Outcome) -> std::io::Result<()> {
        let n = self.next;
        self.next += 1;
        let line = match outcome {
            Outcome::Pass => {
                self.totals.pass += 1;
                format!("ok {n} {name}")
            }
            Outcome::Fail(why) => {
                self.totals.fail += 1;
                self.diag(&format!("{name}: {why}"))?;
                format!("not ok {n} {name}")
            }
            Outcome::Skip(why) => {
                self.totals.skip += 1;
                format!("ok {n} {name} # SKIP {}", one_line(why))
            }
        };
        writeln!(self.out, "{line}")?;
        self.out.flush()
    }

    /// Ends the plan with kselftest's totals line.
    pub fn finish(mut self) -> std::io::Result<Totals> {
        let t = self.totals;
        writeln!(
            self.out,
            "# Totals: pass:{} fail:{} xfail:0 xpass:0 skip:{} error:0",
            t.pass, t.fail, t.skip
        )?;
        self.out.flush()?;
        Ok(t)
    }
}

/// A plan that skips everything: `1..0 # SKIP reason`.
pub fn skip_all(mut out: impl std::io::Write, why: &str) -> std::io::Result<()> {
    writeln!(out, "TAP version 13\n1..0 # SKIP {}", one_line(why))
}

fn one_line(s: &str) -> String {
    let mut o = String::new();
    for (i, l) in s.lines().enumerate() {
        if i > 0 {
            o.push_str("; ");
        }
        let _ = write!(o, "{l}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(outcomes: &[Outcome]) -> (String, Totals) {
        let mut buf = Vec::new();
        let mut k = Ktap::new(&mut buf, outcomes.len()).unwrap();
        for (i, o) in outcomes.iter().enumerate() {
            k.result(&format!("case_{i}"), o).unwrap();
        }
        let t = k.finish().unwrap();
        (String::from_utf8(buf).unwrap(), t)
    }

    #[test]
    fn plan_results_and_totals() {
        let (text, t) = run(&[
            Outcome::Pass,
            Outcome::Fail("got EINVAL\nwanted ENOTTY".into()),
            Outcome::Skip("no GPU".into()),
        ]);
        assert_eq!(
            text,
            "TAP version 13\n1..3\nok 1 case_0\n# case_1: got EINVAL\n# wanted ENOTTY\n\
             not ok 2 case_1\nok 3 case_2 # SKIP no GPU\n\
             # Totals: pass:1 fail:1 xfail:0 xpass:0 skip:1 error:0\n"
        );
        assert_eq!(
            t,
            Totals {
                pass: 1,
                fail: 1,
                skip: 1
            }
        );
    }

    #[test]
    fn exit_codes_follow_kselftest() {
        assert_eq!(run(&[Outcome::Pass]).1.exit_code(), 0);
        assert_eq!(
            run(&[Outcome::Pass, Outcome::Fail(String::new())])
                .1
                .exit_code(),
            1
        );
        assert_eq!(run(&[Outcome::Skip("x".into())]).1.exit_code(), KSFT_SKIP);
        assert_eq!(
            run(&[Outcome::Pass, Outcome::Skip("x".into())])
                .1
                .exit_code(),
            0
        );
        assert_eq!(run(&[]).1.exit_code(), KSFT_SKIP);
    }

    #[test]
    fn skip_all_plan() {
        let mut buf = Vec::new();
        skip_all(&mut buf, "no /dev/ruvm\nload the module").unwrap();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "TAP version 13\n1..0 # SKIP no /dev/ruvm; load the module\n"
        );
    }
}
