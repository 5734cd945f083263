// SPDX-License-Identifier: GPL-2.0

//! Vidmem bounded per caller (`RUVM_FEATURE_VIDMEM_LIMITS`): the dmem cgroup controller's
//! `dmem.max` of each GPU's region, to the chunk, with `dmem.current` what the cgroup's
//! processes hold and zero once they are gone (a close, a kill with work queued, a pool's
//! cache given back); ruvm's per-user limit, on every kernel; the bad inputs of
//! `RUVM_IOCTL_VIDMEM_LIMIT`. Children hold vidmem in their own processes (in a group of their
//! own, or as another user) and report what they got over a pipe.

use std::os::fd::{AsFd, OwnedFd};

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, pipe, read, write, ForkResult, Pid};

use super::*;
use crate::cgroup::MemGroup;

const VIDMEM_LIMITS: u64 = uapi::RUVM_FEATURE_VIDMEM_LIMITS as u64;

/// The device and a GPU with vidmem, or a skip without the feature.
fn setup() -> Result<(Ruvm, u32), Stop> {
    let d = Ruvm::open().ctx("open")?;
    if d.info().ctx("INFO")?.features & VIDMEM_LIMITS == 0 {
        return Err(Stop::Skip("no RUVM_FEATURE_VIDMEM_LIMITS".into()));
    }
    let g = super::super::shared::vidmem_gpu(&d)?.id;
    Ok((d, g))
}

/// The GPU's dmem region's name, or a skip without the controller (or cgroup2).
fn region(d: &Ruvm, g: u32) -> Result<String, Stop> {
    let l = d.vidmem_limit(g, None).ctx("VIDMEM_LIMIT")?;
    if l.dmem == 0 || !MemGroup::has("dmem") {
        return Err(Stop::Skip("no dmem cgroup controller".into()));
    }
    let name: Vec<u8> = l.region.iter().take_while(|&&c| c != 0).copied().collect();
    String::from_utf8(name).map_err(|_| Stop::Fail("a region name that is not UTF-8".into()))
}

/// A child holding the vidmem it could get.
struct Holder {
    pid: Pid,
    /// Bytes it got, and the errno that stopped it (0: it stopped at its cap).
    got: u64,
    errno: i32,
    /// A byte written lets the child exit (a close would not, while a later child holds a
    /// copy of it from its fork).
    go: Option<OwnedFd>,
}

impl Holder {
    /// Lets the child exit and waits for it.
    fn end(mut self) -> TestResult {
        if let Some(go) = self.go.take() {
            write(&go, &[1]).ctx("tell the holding child to exit")?;
        }
        match waitpid(self.pid, None).ctx("waitpid")? {
            WaitStatus::Exited(_, 0) => Ok(()),
            st => Err(Stop::Fail(format!("the holding child ended {st:?}"))),
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(go) = self.go.take() {
            let _ = write(&go, &[1]);
            let _ = waitpid(self.pid, None);
        }
    }
}

/// Forks a child that enters `group` (if any), becomes `uid` (if any), then takes vidmem of
/// GPU `g` in mems of `size` bytes, then of 4 KiB, each until refused (at most `cap` bytes),
/// reports, and holds it until [`Holder::end`].
fn hold(
    group: Option<&MemGroup>,
    uid: Option<u32>,
    g: u32,
    size: u64,
    cap: u64,
) -> Result<Holder, Stop> {
    let (rx, tx) = pipe().ctx("pipe")?;
    let (go_rx, go_tx) = pipe().ctx("pipe")?;
    // SAFETY: the selftest runner is single-threaded; the child only makes system calls and
    // exits without returning.
    match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            drop((rx, go_tx));
            let (mut got, mut errno) = (0u64, 0i32);
            // Opened first: /dev/ruvm may be root's alone.
            let dev = Ruvm::open();
            let ready = group.is_none_or(|gr| gr.enter(std::process::id()).is_ok())
                && uid.is_none_or(|u| {
                    nix::unistd::setgid(nix::unistd::Gid::from_raw(u)).is_ok()
                        && nix::unistd::setuid(nix::unistd::Uid::from_raw(u)).is_ok()
                });
            let mut held = Vec::new();
            match (&dev, ready) {
                (Ok(c), true) => {
                    for s in [size, 4 * K] {
                        while got + s <= cap {
                            match c.vidmem_alloc(g, s, s.min(64 * K), 0) {
                                Ok(a) => {
                                    got += s;
                                    held.push(a.handle);
                                }
                                Err(e) => {
                                    errno = e as i32;
                                    break;
                                }
                            }
                        }
                    }
                }
                _ => errno = -1,
            }
            let mut msg = [0u8; 12];
            msg[..8].copy_from_slice(&got.to_le_bytes());
            msg[8..].copy_from_slice(&errno.to_le_bytes());
            let _ = write(&tx, &msg);
            let mut b = [0u8; 1];
            let _ = read(go_rx.as_fd(), &mut b);
            std::process::exit(0);
        }
        ForkResult::Parent { child } => {
            drop((tx, go_rx));
            let mut msg = [0u8; 12];
            let n = read(rx.as_fd(), &mut msg).ctx("read the child's report")?;
            let h = Holder {
                pid: child,
                got: u64::from_le_bytes(msg[..8].try_into().unwrap_or_default()),
                errno: i32::from_le_bytes(msg[8..].try_into().unwrap_or_default()),
                go: Some(go_tx),
            };
            check!(n == 12, "the holding child reported {n} bytes");
            check!(
                h.errno != -1,
                "the holding child could not enter its group or user"
            );
            Ok(h)
        }
    }
}

/// The group's `dmem.current` of `region`, in bytes.
fn current(gr: &MemGroup, region: &str) -> Result<u64, Stop> {
    gr.keyed("dmem.current", region)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Stop::Fail(format!("no {region} in dmem.current")))
}

/// Two cgroups with different `dmem.max` of one GPU's region, each filled by a child at once:
/// each gets exactly its max (64 KiB mems, then 4 KiB ones: to the chunk) and `ENOMEM`,
/// `dmem.current` says so, the caller outside both still allocates, and both read zero once
/// their children are gone.
pub(super) fn vidmem_limit_dmem_bounds_each_cgroup() -> TestResult {
    let (d, g) = setup()?;
    let region = region(&d, g)?;
    let a = MemGroup::with("ruvm-dmem-a", "dmem").ctx("cgroup a")?;
    let b = MemGroup::with("ruvm-dmem-b", "dmem").ctx("cgroup b")?;
    let (max_a, max_b) = (M + 4 * K, 2 * M + 68 * K);
    a.write("dmem.max", &format!("{region} {max_a}"))
        .ctx("dmem.max a")?;
    b.write("dmem.max", &format!("{region} {max_b}"))
        .ctx("dmem.max b")?;
    let ha = hold(Some(&a), None, g, 64 * K, 64 * M)?;
    let hb = hold(Some(&b), None, g, 64 * K, 64 * M)?;
    for (name, h, max, gr) in [("a", &ha, max_a, &a), ("b", &hb, max_b, &b)] {
        check!(
            h.got == max && h.errno == Errno::ENOMEM as i32,
            "group {name}: got {} bytes (stopped by errno {}), wanted exactly dmem.max {max} and ENOMEM",
            h.got,
            h.errno
        );
        let cur = current(gr, &region)?;
        check!(
            cur == max,
            "group {name}: dmem.current {cur}, its child holds {max}"
        );
    }
    // The caller, in neither group, is bounded by neither.
    let m = d
        .vidmem_alloc(g, M, 64 * K, 0)
        .ctx("vidmem outside both groups")?;
    d.mem_free(m.handle).ctx("free")?;
    ha.end()?;
    hb.end()?;
    for (name, gr) in [("a", &a), ("b", &b)] {
        let cur = current(gr, &region)?;
        check!(
            cur == 0,
            "group {name}: dmem.current {cur} after its child's exit"
        );
    }
    Ok(())
}

/// Each path a cgroup's vidmem goes back by leaves `dmem.current` at zero: a pool's cache
/// (kept after its mems' frees, charged through reclaim, then given back by a trim), and a
/// process killed while its stream holds work on its vidmem.
pub(super) fn vidmem_limit_dmem_every_path_gives_back() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    if d.info().ctx("INFO")?.features & VIDMEM_LIMITS == 0 {
        return Err(Stop::Skip("no RUVM_FEATURE_VIDMEM_LIMITS".into()));
    }
    // Streams need a copy engine (a host GPU has none).
    let engine = uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT | uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE;
    let g = d
        .gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .find(|g| g.flags & engine == engine && g.vidmem_size > 0)
        .map(|g| g.id)
        .ok_or_else(|| Stop::Skip("no GPU with vidmem and a copy engine".into()))?;
    let region = region(&d, g)?;
    // The kill's work is held behind a gate (sw_sync, which every kernel with the dmem
    // controller here has).
    let mut gate = super::super::streams::Gate::new()?;
    let gr = MemGroup::with("ruvm-dmem-paths", "dmem").ctx("cgroup")?;
    gr.write("dmem.max", &format!("{region} {}", 8 * M))
        .ctx("dmem.max")?;
    let procs = gr.dir.join("cgroup.procs");
    // A pool's cache, in a child of the group: its mems freed, the cache still charged.
    child_checks("a vidmem pool's cache is charged until given back", || {
        if std::fs::write(&procs, std::process::id().to_string()).is_err() {
            return false;
        }
        let Ok(c) = Ruvm::open() else { return false };
        let Ok(p) = super::super::shared::vid_pool(&c, g, 64 * K, u64::MAX) else {
            return false;
        };
        let mut hs = Vec::new();
        for _ in 0..4 {
            match super::super::shared::vid_alloc(&c, p, g, 64 * K) {
                Ok(a) => hs.push(a.handle),
                Err(_) => return false,
            }
        }
        for h in hs {
            if c.mem_free(h).is_err() {
                return false;
            }
        }
        let cur = |_: ()| current(&gr, &region).unwrap_or(u64::MAX);
        if cur(()) != 256 * K {
            return false;
        }
        // Reclaim asks every shrinker, which give back sysmem only: the cache stays charged.
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "2");
        if cur(()) != 256 * K {
            return false;
        }
        // The pool's own trim gives it back.
        c.pool_trim(p, 0).is_ok() && cur(()) == 0
    })?;
    check!(
        current(&gr, &region)? == 0,
        "dmem.current after the pool's child"
    );
    // A process killed with vidmem and a copy queued on a stream behind the gate.
    let (rx, tx) = pipe().ctx("pipe")?;
    // SAFETY: single-threaded runner; the child makes system calls, then waits to die.
    match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            drop(rx);
            let ok = (|| -> Option<()> {
                std::fs::write(&procs, std::process::id().to_string()).ok()?;
                let c = Ruvm::open().ok()?;
                let x = c.vidmem_alloc(g, 512 * K, 64 * K, 0).ok()?;
                let y = c.vidmem_alloc(g, 512 * K, 64 * K, 0).ok()?;
                let s = c.stream_create(g).ok()?.handle;
                let copy = libruvm::op::copy(x.handle, 0, y.handle, 0, 512 * K);
                c.stream_submit(s, &[gate.wait(), copy]).ok()?;
                // Held until the kill.
                std::mem::forget(c);
                Some(())
            })()
            .is_some();
            let _ = write(&tx, &[u8::from(ok)]);
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
        ForkResult::Parent { child } => {
            drop(tx);
            let mut b = [0u8; 1];
            let n = read(rx.as_fd(), &mut b).ctx("read")?;
            let held = current(&gr, &region)?;
            nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL).ctx("kill")?;
            waitpid(child, None).ctx("waitpid")?;
            gate.release()?;
            check!(
                n == 1 && b[0] == 1,
                "the child could not allocate vidmem and queue a copy on it (in a group of 8 MiB)"
            );
            check!(held == M, "dmem.current {held} while the child held 1 MiB");
            let start = std::time::Instant::now();
            while current(&gr, &region)? != 0 {
                check!(
                    start.elapsed() < std::time::Duration::from_secs(10),
                    "dmem.current {} 10 s after the kill",
                    current(&gr, &region)?
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
    Ok(())
}

/// A GPU removed while a cgroup's process holds its vidmem, then added back: the old region
/// goes with the GPU (the charges still held go with their chunks, at the process's exit), and
/// the new region of the same name is the one `dmem.max` reaches, bounding the group to the
/// chunk again.
pub(super) fn vidmem_limit_dmem_gpu_removed_and_back() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    if d.info().ctx("INFO")?.features & VIDMEM_LIMITS == 0 {
        return Err(Stop::Skip("no RUVM_FEATURE_VIDMEM_LIMITS".into()));
    }
    let g = super::super::shared::sim_gpu(&d)?;
    let region = region(&d, g)?;
    let gr = MemGroup::with("ruvm-dmem-gone", "dmem").ctx("cgroup")?;
    gr.write("dmem.max", &format!("{region} {}", 2 * M))
        .ctx("dmem.max")?;
    let old = hold(Some(&gr), None, g, 64 * K, M)?;
    check!(old.got == M, "the first child got {} of 1 MiB", old.got);
    check!(
        current(&gr, &region)? == M,
        "dmem.current before the removal"
    );
    super::super::streams::remove_gpu(g)?;
    let _back = super::super::streams::BringBack(&d, g);
    d.test_sim_gpu(g, true).ctx("TEST_SIM_GPU add")?;
    let now = current(&gr, &region)?;
    check!(
        now == 0,
        "the returned GPU's region reads {now} for the group, wanted a new region at 0"
    );
    let max = M + 4 * K;
    gr.write("dmem.max", &format!("{region} {max}"))
        .ctx("dmem.max of the new region")?;
    let new = hold(Some(&gr), None, g, 64 * K, 64 * M)?;
    check!(
        new.got == max && new.errno == Errno::ENOMEM as i32,
        "on the returned GPU the group's child got {} bytes (errno {}), wanted exactly {max} and ENOMEM",
        new.got,
        new.errno
    );
    old.end()?;
    new.end()?;
    check!(current(&gr, &region)? == 0, "dmem.current after both exits");
    Ok(())
}

/// ruvm's per-user limit (every kernel): another user's child gets exactly the limit of
/// GPU `g`'s vidmem, sees its use, and the limit is the same for root, which holds none yet;
/// setting it needs CAP_SYS_ADMIN; bad inputs are refused.
pub(super) fn vidmem_limit_per_user() -> TestResult {
    let (d, g) = setup()?;
    let before = d.vidmem_limit(g, None).ctx("VIDMEM_LIMIT")?;
    let limit = M + 64 * K;
    d.vidmem_limit(g, Some(limit)).ctx("VIDMEM_LIMIT set")?;
    let r = (|| -> TestResult {
        let h = hold(None, Some(65534), g, 64 * K, 64 * M)?;
        check!(
            h.got == limit && h.errno == Errno::ENOMEM as i32,
            "uid 65534 got {} bytes (errno {}), wanted exactly the limit {limit} and ENOMEM",
            h.got,
            h.errno
        );
        let users =
            std::fs::read_to_string("/sys/kernel/debug/ruvm/vidmem_users").unwrap_or_default();
        check!(
            users
                .lines()
                .any(|l| l == format!("uid=65534 gpu={g} bytes={limit}")),
            "vidmem_users does not show uid 65534's {limit} bytes:\n{users}"
        );
        // Root's own use is apart: it still gets the limit's worth.
        let m = d
            .vidmem_alloc(g, limit, 64 * K, 0)
            .ctx("root's vidmem up to the limit")?;
        let me = d.vidmem_limit(g, None).ctx("VIDMEM_LIMIT")?;
        check!(
            me.uid == 0 && me.user_used == limit && me.user_limit == limit,
            "root's view: uid {} used {} limit {}",
            me.uid,
            me.user_used,
            me.user_limit
        );
        expect_errno(
            d.vidmem_alloc(g, 4 * K, 4 * K, 0),
            Errno::ENOMEM,
            "root beyond the limit",
        )?;
        d.mem_free(m.handle).ctx("free")?;
        h.end()?;
        // An unprivileged caller reads its own view, and cannot set the limit.
        child_checks(
            "an unprivileged caller reads its view and cannot set",
            || {
                let Ok(c) = Ruvm::open() else { return false };
                if nix::unistd::setuid(nix::unistd::Uid::from_raw(65534)).is_err() {
                    return false;
                }
                let view = c.vidmem_limit(g, None);
                view.is_ok_and(|v| v.uid == 65534 && v.user_used == 0 && v.user_limit == limit)
                    && c.vidmem_limit(g, Some(0)).err() == Some(Errno::EPERM)
            },
        )?;
        Ok(())
    })();
    d.vidmem_limit(g, Some(before.user_limit))
        .ctx("VIDMEM_LIMIT restore")?;
    r?;
    // Bad inputs.
    let mut a = uapi::ruvm_vidmem_limit {
        gpu: g,
        flags: 1 << 1,
        ..Default::default()
    };
    expect_errno(
        d.call(libruvm::cmd::VIDMEM_LIMIT, &mut a),
        Errno::EINVAL,
        "an unknown flag",
    )?;
    a.flags = 0;
    a.reserved[1] = 1;
    expect_errno(
        d.call(libruvm::cmd::VIDMEM_LIMIT, &mut a),
        Errno::EINVAL,
        "reserved",
    )?;
    expect_errno(
        d.vidmem_limit(uapi::RUVM_MAX_GPUS + 1, None),
        Errno::ENODEV,
        "no such GPU",
    )?;
    Ok(())
}
