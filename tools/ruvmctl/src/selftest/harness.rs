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

/// The cases of functions `f, ...` (or paths to them), each named after its function:
/// `cases![mem_matrix_chunk_sizes, large::heap_large_blocks_pack_and_give_back]`.
macro_rules! cases {
    ($($f:path),* $(,)?) => {
        vec![$($crate::selftest::harness::Case {
            name: $crate::selftest::harness::case_name(stringify!($f)),
            run: $f,
        }),*]
    };
}
pub(crate) use cases;

/// A case's name: the last segment of its function's path as `stringify!` spells it
/// (`large :: heap_x` or `large::heap_x` is `heap_x`).
pub const fn case_name(path: &'static str) -> &'static str {
    let b = path.as_bytes();
    let mut i = b.len();
    while i > 0 && b[i - 1] != b':' && b[i - 1] != b' ' {
        i -= 1;
    }
    let (_, last) = b.split_at(i);
    match core::str::from_utf8(last) {
        Ok(name) => name,
        Err(_) => path,
    }
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
