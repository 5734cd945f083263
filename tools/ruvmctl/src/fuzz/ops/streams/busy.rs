// SPDX-License-Identifier: GPL-2.0

//! Streams kept busy on purpose: work queued on fresh mems freed at once (the work holds
//! them), work queued before the parent kills the worker or removes a GPU, and a file of the
//! worker's own closed with its streams busy (the liveness oracle within the worker).

use std::{os::fd::OwnedFd, sync::Arc, time::Instant};

use libruvm::{op, sync_file, uapi, Errno, Ruvm};

use super::{fences, Rng, World, BY_HANDLE, CREATE, EVENT_CREATE, SUBMIT, SYNC};

use Errno::*;

/// Copies queued on fresh mems, then the mems freed at once: the work holds them, so the
/// copies run to their end on the worker's own bytes (read back after a sync: isolation).
pub(super) fn free_under_work(w: &World, rng: &mut Rng) {
    let Some((d, s)) = w.stream(rng) else { return };
    let fresh = fresh_mems(w, &d, s.gpu, rng);
    let [(a, size), (b, _)] = fresh[..] else {
        for (h, _) in fresh {
            w.free_mem(&d, h);
        }
        return;
    };
    // Into a third mem of the file that stays, to read the result back.
    let keep = w
        .mems_of(&d, rng)
        .into_iter()
        .find(|(_, q)| q.backing == uapi::ruvm_backing_RUVM_BACKING_SYSMEM && q.size >= size);
    // An edu engine moves 4 KiB in 0.2 s.
    let len = if w.sims.contains(&s.gpu) { size } else { 4096 };
    let mut ops = vec![op::copy(b, 0, a, 0, len), op::copy(a, 0, b, 0, len)];
    if let Some((k, _)) = keep {
        let r = d.mem_gpu(true, k, s.gpu);
        w.check("MEM_MAP_GPU", r, &[ENOENT, ENODEV, EINVAL, EFAULT]);
        ops.push(op::copy(k, 0, a, 0, len));
    }
    let r = d.stream_submit(s.handle, &ops);
    let queued = w.check("STREAM_SUBMIT", r, SUBMIT).is_some();
    w.free_mem(&d, a);
    w.free_mem(&d, b);
    if !queued {
        return;
    }
    if w.check("STREAM_SYNC", d.stream_sync(s.handle, 1000), SYNC)
        .is_some()
    {
        if let Some((k, _)) = keep {
            w.read_check_mem(&d, k, " (after a copy from a mem freed under the work)");
        }
    }
}

/// Two fresh sysmem mems of file `d` (tagged, mapped on `gpu` and for the CPU kernel), unless
/// over budget: 2 MiB on a simulated GPU, 64 KiB on another. Not listed: the caller frees them.
fn fresh_mems(w: &World, d: &Ruvm, gpu: u32, rng: &mut Rng) -> Vec<(u64, u64)> {
    let size = if w.sims.contains(&gpu) {
        rng.pick(&[64 << 10, 1 << 20, 2 << 20])
    } else {
        64 << 10
    };
    let mut out = Vec::new();
    if w.over_budget(d) {
        return out;
    }
    for _ in 0..2 {
        let r = d.mem_alloc(size, 0, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO);
        let Some(a) = w.check("MEM_ALLOC", r, &[ENOSPC]) else {
            break;
        };
        w.tag_mem(d, &a);
        let r = d.mem_gpu(true, a.handle, gpu);
        w.check("MEM_MAP_GPU", r, &[ENOENT, ENODEV, EINVAL, EFAULT]);
        out.push((a.handle, size));
    }
    out
}

/// Queues a good while of work on stream `s` (on `gpu`) of file `d`: a wait for the sw_sync
/// timeline ahead of it (if any), copies between two fresh mems (freed at once: the work holds
/// them), and points recorded and exported along it. Returns the exported sync_files.
pub(super) fn busy_work(w: &World, d: &Ruvm, s: u64, gpu: u32, rng: &mut Rng) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    let mems = fresh_mems(w, d, gpu, rng);
    let e = w.check("EVENT_CREATE", d.event_create(), EVENT_CREATE);
    let (copies, piece) = if w.sims.contains(&gpu) {
        (8, u64::MAX)
    } else {
        (2, 4096)
    };
    for round in 0..3 {
        let mut ops = Vec::new();
        if round == 0 {
            if let Some(fd) = w.sw_fence(rng) {
                ops.push(op::wait_fd(std::os::fd::AsFd::as_fd(&fd), 500));
                fds.push(fd);
            }
        }
        if let [(a, size), (b, _)] = mems[..] {
            for i in 0..copies {
                let (dst, src) = if i % 2 == 0 { (b, a) } else { (a, b) };
                ops.push(op::copy(dst, 0, src, 0, size.min(piece)));
            }
        }
        if let Some(e) = e {
            ops.push(op::record(e));
        }
        if ops.is_empty() {
            break;
        }
        let r = d.stream_submit(s, &ops);
        if w.check("STREAM_SUBMIT", r, SUBMIT).is_none() {
            break;
        }
        if let Some(fd) = e.and_then(|e| w.export(d, e)) {
            fds.push(fd);
        }
    }
    for (h, _) in mems {
        w.free_mem(d, h);
    }
    if let Some(e) = e {
        // Its points live on in the sync_files.
        w.check("EVENT_DESTROY", d.event_destroy(e), BY_HANDLE);
    }
    // Only ruvm's (the sw_sync fence is the worker's own).
    fds.retain(|fd| {
        sync_file::info(fd).is_ok_and(|i| i.fence().is_some_and(|f| f.driver == "ruvm"))
    });
    fds
}

/// The parent asked for busy streams (on `gpu` if given): work queued on a stream of one of
/// the worker's files, its sync_files handed to the parent. Whether the stream was still busy
/// after.
pub(in crate::fuzz::ops) fn load(w: &World, rng: &mut Rng, gpu: Option<u32>) -> bool {
    let Some(file) = w.file(rng) else {
        return false;
    };
    load_file(w, &file, rng, gpu)
}

/// [`load`] on a stream of file `d`.
pub(in crate::fuzz::ops) fn load_file(
    w: &World,
    d: &Arc<Ruvm>,
    rng: &mut Rng,
    gpu: Option<u32>,
) -> bool {
    let gpu = gpu.or_else(|| (!w.sims.is_empty()).then(|| rng.pick(&w.sims)));
    let Some(s) = w.stream_on(d, gpu, rng) else {
        return false;
    };
    for fd in busy_work(w, d, s.handle, s.gpu, rng) {
        w.hand_over(&fd);
    }
    d.stream_query(s.handle)
        .is_ok_and(|q| q.error == 0 && q.submitted > q.completed)
}

/// The liveness oracle within the worker: a file of its own (never listed, mapped or passed,
/// so closing it is its release) gets busy streams, exports their points, and is closed; every
/// point must signal within [`fences::SIGNAL_BOUND`] of the close.
pub(super) fn close_busy(w: &World, rng: &mut Rng) {
    let gpu = match (w.sims.is_empty(), w.gpus.is_empty()) {
        (false, _) => rng.pick(&w.sims),
        (true, false) => rng.pick(&w.gpus),
        (true, true) => return,
    };
    let Ok(f) = Ruvm::open() else { return };
    let mut fds = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let Some(s) = w.check("STREAM_CREATE", f.stream_create(gpu), CREATE) else {
            continue;
        };
        fds.extend(busy_work(w, &f, s.handle, gpu, rng));
        // A destroyed stream's work is cancelled by the close too.
        if rng.one_in(3) {
            w.check("STREAM_DESTROY", f.stream_destroy(s.handle), BY_HANDLE);
        }
    }
    let pending = fds
        .iter()
        .filter(|fd| sync_file::info(*fd).is_ok_and(|i| i.status == 0))
        .count();
    drop(f);
    let start = Instant::now();
    let late = fds
        .iter()
        .filter(|fd| {
            let left = fences::SIGNAL_BOUND.saturating_sub(start.elapsed());
            sync_file::wait(*fd, left) == Ok(false)
        })
        .count();
    if late > 0 {
        w.problem(format!(
            "{late} of {} sync_files exported from a file closed with its streams busy on GPU {gpu} ({pending} pending at the close) still pending {} s after it",
            fds.len(),
            fences::SIGNAL_BOUND.as_secs()
        ));
    }
}
