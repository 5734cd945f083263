// SPDX-License-Identifier: GPL-2.0

//! Pools of vidmem, and a pool's line in debugfs naming its process by its host PID.

use super::*;

/// A vidmem pool on a simulated GPU with vidmem: chunks from the PMM, reused (the same GPU
/// addresses), zeroed again on reuse (read back by the engine), a PMM as at start after a trim,
/// and a pool that survives its GPU's removal but hands out nothing more.
pub(super) fn pool_of_vidmem() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let g = d
        .gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .find(|g| {
            g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
                && g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM
                && g.vidmem_size > 0
        })
        .map(|g| g.id)
        .ok_or_else(|| Stop::Skip("no simulated GPU with vidmem".into()))?;
    let free_at_start = d.pmm_stats(g).ctx("PMM_STATS")?.free;
    let p = vid_pool(&d, g, 64 * K, u64::MAX).ctx("POOL_CREATE vidmem")?;
    let info = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        info.backing == uapi::ruvm_backing_RUVM_BACKING_VIDMEM
            && info.gpu == g
            && info.chunk_size == 64 * K
            && info.access == 1u64 << g,
        "POOL_GET of a vidmem pool (its access set is its GPU): {info:?}"
    );
    // EINVAL before any GPU id is looked at: a vidmem pool has no access to set.
    for (id, on) in [(g, true), (g, false), (40, true), (64, false)] {
        expect_errno(
            d.pool_access(p, id, on),
            Errno::EINVAL,
            &format!("access of GPU {id} on a vidmem pool"),
        )?;
    }
    expect_errno(
        d.pool_alloc(p, 64 * K, 0),
        Errno::EINVAL,
        "sysmem from a vidmem pool",
    )?;
    let len = 256 * K;
    // The engine writes a pattern into the first mem through a mapped sysmem source.
    let src = d.mem_alloc(len, 0, 0).ctx("alloc")?.handle;
    fill(&d, src, len, 41)?;
    d.mem_gpu(true, src, g).ctx("MAP_GPU")?;
    let a = vid_alloc(&d, p, g, len).ctx("alloc from the pool")?;
    let mut phys_a = Vec::new();
    for c in 0..4 {
        phys_a.push(
            d.gpu_phys(a.handle, g, c * 64 * K, 64 * K)
                .ctx("GPU_PHYS")?
                .0,
        );
    }
    d.ce_copy(g, a.handle, 0, src, 0, len)
        .ctx("CE_COPY into vidmem")?;
    d.mem_free(a.handle).ctx("free")?;
    let w = attrs(&d, p)?;
    check!(
        w.reserved == len && w.used == 0 && w.cached_chunks == 4 && w.misses == 4,
        "after a free: {w:?}"
    );
    // Reused: the same chunks come back (in the opposite order: the newest first), zeroed.
    let b = vid_alloc(&d, p, g, len).ctx("alloc from the pool again")?;
    let w = attrs(&d, p)?;
    check!(
        w.hits == 4 && w.misses == 4 && w.cached_chunks == 0,
        "not reused: {w:?}"
    );
    let mut phys_b = Vec::new();
    for c in 0..4 {
        phys_b.push(
            d.gpu_phys(b.handle, g, c * 64 * K, 64 * K)
                .ctx("GPU_PHYS")?
                .0,
        );
    }
    let (mut sa, mut sb) = (phys_a.clone(), phys_b.clone());
    sa.sort_unstable();
    sb.sort_unstable();
    check!(
        sa == sb,
        "the freed chunks did not come back: {phys_a:x?} then {phys_b:x?}"
    );
    let dst = d.mem_alloc(len, 0, ZERO).ctx("alloc")?.handle;
    fill(&d, dst, len, 42)?;
    d.mem_gpu(true, dst, g).ctx("MAP_GPU")?;
    d.ce_copy(g, dst, 0, b.handle, 0, len)
        .ctx("CE_COPY out of vidmem")?;
    let nonzero = nonzero_bytes(&d, dst)?;
    check!(
        nonzero == 0,
        "{nonzero} bytes not zero in vidmem reused from a pool"
    );
    d.mem_free(b.handle).ctx("free")?;
    // Trimmed: the PMM is as at start.
    check!(
        d.pool_trim(p, 0).ctx("POOL_TRIM")? == len,
        "trim of the vidmem pool"
    );
    let free = d.pmm_stats(g).ctx("PMM_STATS")?.free;
    check!(
        free == free_at_start,
        "PMM free {free} after the trim, {free_at_start} at start"
    );
    // The GPU removed (when the test ioctls are on): the cache goes with it, the pool stays
    // and hands out nothing more, even once the GPU is back.
    let m = vid_alloc(&d, p, g, len).ctx("alloc")?;
    d.mem_free(m.handle).ctx("free")?;
    match d.test_sim_gpu(g, false) {
        Err(Errno::ENOSYS) => {}
        r => {
            r.ctx("TEST_SIM_GPU remove")?;
            let gone = attrs(&d, p);
            let back = d.test_sim_gpu(g, true);
            let gone = gone?;
            back.ctx("TEST_SIM_GPU add")?;
            check!(
                gone.reserved == 0 && gone.cached_chunks == 0,
                "the removed GPU's chunks are still cached: {gone:?}"
            );
            expect_errno(
                vid_alloc(&d, p, g, len),
                Errno::ENODEV,
                "alloc from a pool of a GPU bound again",
            )?;
        }
    }
    for h in [src, dst] {
        d.mem_free(h).ctx("free")?;
    }
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    let l = live(&d)?;
    check!(
        l[POOL_CHUNKS] == 0 && l[POOL_BYTES] == 0,
        "pool_chunks {} pool_bytes {} after destroy",
        l[POOL_CHUNKS],
        l[POOL_BYTES]
    );
    Ok(())
}

/// `/sys/kernel/debug/ruvm/pools` names a pool's process by its PID on the host (the initial
/// PID namespace), also for a pool made inside a PID namespace, where that process is PID 1.
pub(super) fn pool_lists_its_process_by_its_host_pid() -> TestResult {
    use nix::sched::{unshare, CloneFlags};
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, getpid, pipe, read, write, ForkResult};
    const LIST: &str = "/sys/kernel/debug/ruvm/pools";
    if !std::path::Path::new(LIST).exists() {
        return Err(Stop::Skip(format!("no {LIST} (debugfs)")));
    }
    // The children tell what they know on `said`; the grandchild holds its pool until `done`
    // closes.
    let (said_rx, said_tx) = pipe().ctx("pipe")?;
    let (done_rx, done_tx) = pipe().ctx("pipe")?;
    // SAFETY: the runner is single-threaded when cases run; the children only make syscalls
    // and exit.
    let child = match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            drop((said_rx, done_tx));
            let run = || -> Option<i32> {
                match unshare(CloneFlags::CLONE_NEWPID) {
                    Ok(()) => {}
                    Err(Errno::EINVAL) => {
                        // A kernel without PID namespaces (the project's test kernels).
                        write(&said_tx, b"no namespaces\n").ok()?;
                        return Some(0);
                    }
                    Err(_) => return None,
                }
                // SAFETY: as above; this child is single-threaded too.
                match unsafe { fork() }.ok()? {
                    ForkResult::Child => {
                        // PID 1 of the new namespace.
                        let d = Ruvm::open().ok()?;
                        let (pool, _) = d.pool_create(64 * K, 0).ok()?;
                        let line = format!("pool {pool} {}\n", getpid());
                        write(&said_tx, line.as_bytes()).ok()?;
                        drop(said_tx);
                        // Until the parent has read the list (its end closes).
                        let _ = read(&done_rx, &mut [0u8; 1]);
                        Some(0)
                    }
                    ForkResult::Parent { child } => {
                        // Its PID as this process, outside the new namespace, sees it.
                        write(&said_tx, format!("host {child}\n").as_bytes()).ok()?;
                        drop((said_tx, done_rx));
                        match waitpid(child, None).ok()? {
                            WaitStatus::Exited(_, code) => Some(code),
                            _ => None,
                        }
                    }
                }
            };
            std::process::exit(run().unwrap_or(1));
        }
        ForkResult::Parent { child } => child,
    };
    drop((said_tx, done_rx));
    // Both lines, until both writers are gone.
    let mut text = Vec::new();
    let mut buf = [0u8; 128];
    loop {
        match read(&said_rx, &mut buf) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(Stop::Fail(format!("read: {e}"))),
        }
    }
    let listed = std::fs::read_to_string(LIST).ctx("read the pool list");
    drop(done_tx);
    let status = waitpid(child, None).ctx("waitpid")?;
    let text = String::from_utf8_lossy(&text);
    if text.starts_with("no namespaces") {
        return Err(Stop::Skip(
            "this kernel has no PID namespaces (Debian's stock kernel has them)".into(),
        ));
    }
    let word = |tag: &str, i: usize| -> Option<String> {
        text.lines()
            .find(|l| l.starts_with(tag))
            .and_then(|l| l.split_whitespace().nth(i))
            .map(str::to_owned)
    };
    let (Some(pool), Some(inside), Some(host)) =
        (word("pool ", 1), word("pool ", 2), word("host ", 1))
    else {
        return Err(Stop::Fail(format!(
            "the children did not say their pool and PIDs ({status:?}): {text:?}"
        )));
    };
    check!(
        status == WaitStatus::Exited(child, 0),
        "the children failed: {status:?}"
    );
    check!(
        inside == "1",
        "the pool's maker is PID {inside} in its namespace, not 1: no namespace was made"
    );
    let listed = listed?;
    let line = listed
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&format!("pool={pool}")))
        .ok_or_else(|| Stop::Fail(format!("pool {pool} is not in {LIST}")))?;
    check!(
        line.split_whitespace().any(|w| w == format!("pid={host}")),
        "pool {pool} is listed as {line:?}, not under its host PID {host}"
    );
    Ok(())
}
