// SPDX-License-Identifier: GPL-2.0

//! Defects found by testing ruvm as an adversary would, each reproduced here many times: a
//! simulated GPU's table remapped while its addresses are read, GPU unbind racing the drop of
//! a table, copies that must stay killable and must not keep others off the GPU.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use libruvm::{pci_name, uapi, Ruvm};
use nix::{
    errno::Errno,
    sys::{
        signal::{kill, Signal},
        wait::{waitpid, WaitStatus},
    },
    unistd::{fork, setuid, ForkResult, Uid},
};

use super::{
    gpu::{bound_edu, dma_live, sim, DRIVER},
    harness::{cases, check, Case, Context, Stop, TestResult},
};

pub fn cases() -> Vec<Case> {
    cases![
        hard_sim_remap_racing_addr_reads_keeps_the_table,
        hard_unbind_racing_table_drops_leaves_no_mapping,
        hard_copy_is_killable_and_leaves_the_gpu_to_others,
    ]
}

const K: u64 = 1024;
const M: u64 = 1024 * K;

/// Unmap and map a mem's table on a simulated GPU, again and again, while another thread reads
/// its addresses; after each remap the engine must still reach the mem. Before the fix the
/// simulated engine's records of a remapped table were erased by the old table's late drop (its
/// last reference held by the address read): 7 to 13 remaps, then EFAULT on every copy.
fn hard_sim_remap_racing_addr_reads_keeps_the_table() -> TestResult {
    const ROUNDS: usize = 150;
    let d = Ruvm::open().ctx("open")?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let Some(g) = gpus.iter().find(|g| sim(g)).map(|g| g.id) else {
        return Err(Stop::Skip("no simulated GPU (load with sim_gpus=N)".into()));
    };
    let src = d.mem_alloc(64 * K, 0, 0).ctx("alloc")?.handle;
    let dst = d.mem_alloc(64 * K, 0, 0).ctx("alloc")?.handle;
    for h in [src, dst] {
        d.mem_gpu(true, h, g).ctx("map")?;
        d.map_kernel(h).ctx("map kernel")?;
    }
    let fill = |h: u64, seed: u64| uapi::ruvm_mem_fill {
        handle: h,
        length: 64 * K,
        seed,
        ..Default::default()
    };
    let stop = AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // ENXIO while the table is away; anything else is wrong.
                match d.dma_addrs(src, g, 0, 16) {
                    Ok(_) | Err(Errno::ENXIO) => reads += 1,
                    Err(e) => return Err(format!("DMA_ADDRS: {e}")),
                }
            }
            Ok(reads)
        });
        let r = (|| -> TestResult {
            for round in 0..ROUNDS {
                d.mem_gpu(false, src, g).ctx("unmap")?;
                d.mem_gpu(true, src, g).ctx("map")?;
                let seed = round as u64 + 1;
                d.mem_fill(false, fill(src, seed)).ctx("fill")?;
                d.ce_copy(g, dst, 0, src, 0, 64 * K)
                    .map_err(|e| Stop::Fail(format!("copy after remap {round}: {e}")))?;
                let v = d.mem_fill(true, fill(dst, seed)).ctx("verify")?;
                check!(
                    v.mismatches == 0,
                    "round {round}: the copy moved wrong bytes"
                );
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        let reads = reader.join();
        (r, reads)
    });
    let (r, reads) = result;
    r?;
    let reads = reads
        .map_err(|_| Stop::Fail("the reader panicked".into()))?
        .map_err(Stop::Fail)?;
    println!("# {ROUNDS} remaps with {reads} address reads racing them");
    d.mem_free(src).ctx("free")?;
    d.mem_free(dst).ctx("free")
}

/// The DMA-API debugger's error count, if this kernel has it.
fn dma_api_errors() -> Option<u64> {
    std::fs::read_to_string("/sys/kernel/debug/dma-api/error_count")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// How one round drops the table that unbind races.
#[derive(Clone, Copy, Debug)]
enum Drop {
    Unmap,
    Free,
    Close,
}

/// Unbind an edu GPU while a mem's table for it (8 MiB in 4 KiB chunks: 2,048 mappings) is
/// being dropped by UNMAP_GPU, MEM_FREE or closing the file. Unbind must wait for the drop (or
/// do it): no mapping may outlive the device (DMA-API debug reported "device driver has pending
/// DMA allocations while released" in 30 of 30 rounds before the fix), and every mapping must be
/// uncounted afterwards.
fn hard_unbind_racing_table_drops_leaves_no_mapping() -> TestResult {
    let probe = Ruvm::open().ctx("open")?;
    let gpus = probe.gpus().ctx("GPU_LIST")?;
    let Some(gpu) = gpus.iter().find(|g| bound_edu(g)) else {
        return Err(Stop::Skip("no GPU bound by ruvm-edu (to unbind)".into()));
    };
    let (g, name) = (gpu.id, pci_name(gpu));
    let errors_before = dma_api_errors();
    let before = dma_live(&probe)?;
    for round in 0..6 {
        let how = [Drop::Unmap, Drop::Free, Drop::Close][round % 3];
        let d = Ruvm::open().ctx("open")?;
        let a = d.mem_alloc(8 * M, 4 * K, 0).ctx("alloc")?;
        d.mem_gpu(true, a.handle, g).ctx("map")?;
        let unbound = std::thread::scope(|s| {
            let dropper = s.spawn(move || match how {
                Drop::Unmap => d.mem_gpu(false, a.handle, g).map(|_| Some(d)),
                Drop::Free => d.mem_free(a.handle).map(|_| Some(d)),
                Drop::Close => {
                    drop(d);
                    Ok(None)
                }
            });
            let r = std::fs::write(format!("{DRIVER}/unbind"), &name);
            (r, dropper.join())
        });
        let (r, dropped) = unbound;
        r.ctx("unbind")?;
        let bind = std::fs::write(format!("{DRIVER}/bind"), &name).ctx("bind");
        let dropped = dropped.map_err(|_| Stop::Fail("the dropper panicked".into()))?;
        dropped.map_err(|e| Stop::Fail(format!("round {round} ({how:?}): {e}")))?;
        bind?;
        check!(
            dma_live(&probe)? == before,
            "round {round} ({how:?}): DMA mappings still counted: {:?} (before: {before:?})",
            dma_live(&probe)?
        );
    }
    if let (Some(b), Some(a)) = (errors_before, dma_api_errors()) {
        check!(a == b, "DMA-API debug errors went from {b} to {a}");
    }
    Ok(())
}

/// A long copy on an edu GPU (512 KiB: 128 transfers of ~0.2 s) by an unprivileged process must
/// not keep root's mapping on the same GPU waiting, and must die soon after SIGKILL. Before the
/// fix the copy held the GPU's lock from start to end: root waited 52 s, SIGKILL took 49 s.
fn hard_copy_is_killable_and_leaves_the_gpu_to_others() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let Some(g) = gpus.iter().find(|g| bound_edu(g)).map(|g| g.id) else {
        return Err(Stop::Skip("no edu GPU (with its slow engine)".into()));
    };
    let len = 512 * K;
    let a = d.mem_alloc(len, 0, 0).ctx("alloc")?.handle;
    let b = d.mem_alloc(len, 0, 0).ctx("alloc")?.handle;
    for h in [a, b] {
        d.mem_gpu(true, h, g).ctx("map")?;
    }
    // SAFETY: the runner is single-threaded here; the child only makes syscalls and exits.
    let child = match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            let code = if setuid(Uid::from_raw(65534)).is_err() {
                2
            } else {
                // Runs ~25 s unless killed.
                d.ce_copy(g, b, 0, a, 0, len).map_or(3, |_| 0)
            };
            std::process::exit(code)
        }
        ForkResult::Parent { child } => child,
    };
    std::thread::sleep(Duration::from_secs(1));
    // Root's work on the same GPU goes on meanwhile.
    let other = d.mem_alloc(64 * K, 0, 0).ctx("alloc")?.handle;
    let t = Instant::now();
    let mapped = d.mem_gpu(true, other, g);
    let map_time = t.elapsed();
    let t = Instant::now();
    kill(child, Signal::SIGKILL).ctx("kill")?;
    let status = waitpid(child, None).ctx("waitpid")?;
    let kill_time = t.elapsed();
    mapped.ctx("map during the copy")?;
    check!(
        status == WaitStatus::Signaled(child, Signal::SIGKILL, false),
        "the copying child ended {status:?} before it was killed"
    );
    // Bounds far above one transfer (~0.2 s) and far below a whole copy (~25 s).
    check!(
        map_time < Duration::from_secs(5),
        "root's MAP_GPU waited {map_time:?} for another process's copy"
    );
    check!(
        kill_time < Duration::from_secs(5),
        "SIGKILL took {kill_time:?} to end a copy"
    );
    println!("# MAP_GPU during the copy: {map_time:?}; SIGKILL to exit: {kill_time:?}");
    for h in [a, b, other] {
        d.mem_free(h).ctx("free")?;
    }
    Ok(())
}
