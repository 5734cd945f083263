// SPDX-License-Identifier: GPL-2.0

//! `ruvmctl selftest`: ruvm's in-guest test suite, reported as KTAP with kselftest exit codes.
//!
//! Each case is a plain function returning [`TestResult`]; the runner reports it and goes on,
//! so one failure never hides the rest. Without `/dev/ruvm` the whole plan is skipped (exit 4).

use std::panic::{self, AssertUnwindSafe};

use crate::ktap::{self, Ktap, Outcome};
use harness::{check, Case, Context, Stop, TestResult};

mod abi;
mod adversary;
mod audit;
mod basic;
mod bench;
mod charge;
mod cli;
mod copy_ptr;
mod dmabuf;
mod faults;
mod gpu;
mod gpu_va;
mod hardening;
pub(crate) mod harness;
mod heap;
mod ipc;
mod mem;
mod one_call;
mod pools;
mod ptr;
mod register;
mod shared;
mod sparse;
mod stream_alloc;
mod streams;
mod ualloc;
mod vgem;
mod vidmem;

/// Every case, in the order they run.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    v.extend(basic::cases());
    v.extend(abi::cases());
    v.extend(mem::cases());
    v.extend(sparse::cases());
    v.extend(one_call::cases());
    v.extend(audit::cases());
    v.extend(gpu::cases());
    v.extend(gpu_va::cases());
    v.extend(vidmem::cases());
    v.extend(pools::cases());
    v.extend(streams::cases());
    v.extend(stream_alloc::cases());
    v.extend(ualloc::cases());
    v.extend(heap::cases());
    v.extend(ptr::cases());
    v.extend(copy_ptr::cases());
    v.extend(register::cases());
    v.extend(charge::cases());
    v.extend(cli::cases());
    v.extend(ipc::cases());
    v.extend(dmabuf::cases());
    v.extend(bench::cases());
    v.extend(hardening::cases());
    v.extend(faults::cases());
    v.extend(adversary::cases());
    v
}

/// A case that must fail: it asserts something the module rightly refuses. Used only to prove
/// that a failing selftest fails the whole run (`--plant-failure`).
fn planted_failure() -> TestResult {
    let dev = libruvm::Ruvm::open().ctx("open")?;
    let mut info = libruvm::uapi::ruvm_info {
        flags: 1,
        ..Default::default()
    };
    let r = dev.call(libruvm::cmd::INFO, &mut info);
    check!(
        r.is_ok(),
        "planted failure: INFO with flags=1 returned {r:?}; a failure is what this case is for"
    );
    Ok(())
}

/// Runs the cases whose names contain any of `filters` (all without one). Returns the exit
/// code.
pub fn run(filters: &[String], plant_failure: bool) -> std::io::Result<i32> {
    let out = std::io::stdout().lock();
    let path = libruvm::path();
    if !path.exists() {
        ktap::skip_all(
            out,
            &format!("{} not present (is ruvm loaded?)", path.display()),
        )?;
        return Ok(ktap::KSFT_SKIP);
    }
    let mut list: Vec<Case> = cases()
        .into_iter()
        .filter(|c| filters.is_empty() || filters.iter().any(|f| c.name.contains(f.as_str())))
        .collect();
    if plant_failure {
        list.push(Case {
            name: "planted_failure",
            run: planted_failure,
        });
    }
    let mut k = Ktap::new(out, list.len())?;
    // Assertion messages go to KTAP diagnostics, not to a panic backtrace.
    panic::set_hook(Box::new(|_| {}));
    for case in &list {
        // Said before it runs: a guest run stopped for its time names the case it was in.
        k.diag(&format!("running {}", case.name))?;
        let started = std::time::Instant::now();
        let outcome = match panic::catch_unwind(AssertUnwindSafe(case.run)) {
            Ok(Ok(())) => Outcome::Pass,
            Ok(Err(Stop::Fail(why))) => Outcome::Fail(why),
            Ok(Err(Stop::Skip(why))) => Outcome::Skip(why),
            Err(p) => Outcome::Fail(format!("panicked: {}", panic_text(&p))),
        };
        // Where a run's time goes, for keeping make check inside its budget.
        let took = started.elapsed();
        if took >= std::time::Duration::from_secs(1) {
            k.diag(&format!("{} took {:.1} s", case.name, took.as_secs_f64()))?;
        }
        k.result(case.name, &outcome)?;
    }
    let _ = panic::take_hook();
    Ok(k.finish()?.exit_code())
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// Lists the case names, one a line.
pub fn list() -> Vec<&'static str> {
    cases().iter().map(|c| c.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness::expect_errno;
    use nix::errno::Errno;

    #[test]
    fn a_case_is_named_after_its_function() {
        assert_eq!(harness::case_name("large :: heap_x"), "heap_x");
        assert_eq!(harness::case_name("large::heap_x"), "heap_x");
        assert_eq!(harness::case_name("mem_y"), "mem_y");
        fn a_case() -> harness::TestResult {
            Ok(())
        }
        let c: Vec<Case> = harness::cases![a_case];
        assert_eq!((c.len(), c[0].name), (1, "a_case"));
        assert!((c[0].run)().is_ok());
    }

    #[test]
    fn case_names_are_unique_ktap_words() {
        let names = list();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "duplicate case names");
        for n in names {
            assert!(
                !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
                "{n}"
            );
        }
    }

    #[test]
    fn expect_errno_is_exact() {
        assert!(expect_errno::<()>(Err(Errno::EINVAL), Errno::EINVAL, "x").is_ok());
        assert!(expect_errno::<()>(Err(Errno::EFAULT), Errno::EINVAL, "x").is_err());
        assert!(expect_errno(Ok(1), Errno::EINVAL, "x").is_err());
    }
}
