// SPDX-License-Identifier: GPL-2.0

//! What every selftest case is built with: its result type, the `check!` macro, errno and
//! child-process helpers.

use nix::errno::Errno;

/// Why a case stopped early.
#[derive(Debug)]
pub enum Stop {
    Fail(String),
    Skip(String),
}

/// What a case returns.
pub type TestResult = Result<(), Stop>;

/// One named test case.
pub struct Case {
    pub name: &'static str,
    pub run: fn() -> TestResult,
}

/// Fails the case with a formatted message unless the condition holds.
macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::selftest::harness::Stop::Fail(format!($($fmt)+)));
        }
    };
}
pub(crate) use check;

/// Turns any error into a failure of the case, naming what was being done.
pub trait Context<T> {
    fn ctx(self, what: &str) -> Result<T, Stop>;
}

impl<T, E: std::fmt::Display> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, Stop> {
        self.map_err(|e| Stop::Fail(format!("{what}: {e}")))
    }
}

/// Checks that `result` failed with exactly `want`.
pub fn expect_errno<T: std::fmt::Debug>(
    result: Result<T, Errno>,
    want: Errno,
    what: &str,
) -> TestResult {
    match result {
        Err(got) if got == want => Ok(()),
        Err(got) => Err(Stop::Fail(format!("{what}: got {got}, wanted {want}"))),
        Ok(v) => Err(Stop::Fail(format!(
            "{what}: succeeded ({v:?}), wanted {want}"
        ))),
    }
}

/// Runs `f` in a child process (its return value is the exit code) and returns how the child
/// ended.
pub fn in_child(f: impl FnOnce() -> i32) -> Result<nix::sys::wait::WaitStatus, Stop> {
    use nix::unistd::{fork, ForkResult};
    // SAFETY: the selftest runner is single-threaded when cases run; the child only makes
    // syscalls and touches memory, then exits without returning.
    match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => std::process::exit(f()),
        ForkResult::Parent { child } => nix::sys::wait::waitpid(child, None).ctx("waitpid"),
    }
}

/// Runs `f` in a child and fails the case, saying `what`, unless it returns true.
pub fn child_checks(what: &str, f: impl FnOnce() -> bool) -> TestResult {
    match in_child(|| if f() { 0 } else { 1 })? {
        nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
        st => Err(Stop::Fail(format!("{what} ({st:?})"))),
    }
}
