// SPDX-License-Identifier: GPL-2.0

//! ruvmctl itself, as a script drives it: each command run with `--json` prints one JSON value
//! that parses, through one open file of the device (`--fd`) so that the handle one command
//! makes is what the next one names.

use std::os::fd::AsRawFd;
use std::process::Command;

use super::harness::{cases, check, Case, Context, Stop, TestResult};
use super::shared::sim_gpu;
use libruvm::Ruvm;

pub fn cases() -> Vec<Case> {
    cases![cli_commands_print_json]
}

/// The commands a script uses most, each with `--json` (mems, kernel and user mappings, fills,
/// GPU mappings, pools, streams and events, the allocator's trace, pinned heaps, registered
/// memory, statistics): each exits 0 and prints one JSON value, whose handle (where it makes
/// something) the next commands name.
fn cli_commands_print_json() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let g = sim_gpu(&d)?.to_string();
    let exe = std::env::current_exe().map_err(|e| Stop::Fail(format!("current_exe: {e}")))?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/ruvm")
        .map_err(|e| Stop::Fail(format!("open /dev/ruvm: {e}")))?;
    // Inherited by each command: close-on-exec off.
    nix::fcntl::fcntl(
        &file,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .ctx("F_SETFD")?;
    let fd = file.as_raw_fd().to_string();
    let run = |args: &[&str]| -> Result<serde_json::Value, Stop> {
        let line = args.join(" ");
        let out = Command::new(&exe)
            .arg("--fd")
            .arg(&fd)
            .args(args)
            .arg("--json")
            .output()
            .map_err(|e| Stop::Fail(format!("ruvmctl {line}: {e}")))?;
        let text = String::from_utf8_lossy(&out.stdout);
        check!(
            out.status.success(),
            "ruvmctl {line} --json: {} ({})",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        serde_json::from_slice(&out.stdout)
            .map_err(|e| Stop::Fail(format!("ruvmctl {line} --json: not JSON ({e}): {text}")))
    };
    // The handle of what a command made.
    let made = |v: &serde_json::Value, what: &str| -> Result<String, Stop> {
        ["handle", "stream", "event", "pool"]
            .iter()
            .find_map(|k| v.get(k).and_then(serde_json::Value::as_u64))
            .map(|h| h.to_string())
            .ok_or_else(|| Stop::Fail(format!("{what}: no handle in {v}")))
    };
    for args in [&["info"][..], &["gpus"], &["stats"], &["vidmem", "usage"]] {
        run(args)?;
    }
    let h = made(&run(&["alloc", "64K"])?, "alloc")?;
    let h2 = made(&run(&["alloc", "64K"])?, "alloc")?;
    for args in [
        &["query", &h][..],
        &["map-kernel", &h],
        &["map-kernel", &h2],
        &["fill", &h],
        &["verify", &h],
        &["copy", &h2, &h, "--length", "4096"],
        &["mmap-fill", &h],
        &["mmap-verify", &h],
        &["unmap-kernel", &h],
        &["map-gpu", &h, &g],
        &["unmap-gpu", &h, &g],
        &["ptr", "--alloc", "64K"],
    ] {
        run(args)?;
    }
    let p = made(&run(&["pool", "create"])?, "pool create")?;
    for args in [
        &["pool", "get", &p][..],
        &["pool", "trim", &p],
        &["pool", "destroy", &p],
    ] {
        run(args)?;
    }
    let s = made(&run(&["stream", "create", "--gpu", &g])?, "stream create")?;
    let e = made(&run(&["event", "create"])?, "event create")?;
    for args in [
        &["event", "record", &e, "--stream", &s][..],
        &["event", "query", &e],
        &["stream", "sync", &s],
        &["stream", "query", &s],
        &["event", "destroy", &e],
        &["stream", "destroy", &s],
        &["allocator", "trace", "--class", "same", "--iterations", "1"],
        &["heap", "run", "--class", "same", "--iterations", "2"],
        &["mem", "register", "64K"],
        &["free", &h],
        &["free", &h2],
    ] {
        run(args)?;
    }
    Ok(())
}
