// SPDX-License-Identifier: GPL-2.0

//! GPU steps: virtual mappings, kernel and user, and copies through VAs; pools, their
//! attributes, access and trims; a vidmem pool asked for more than its GPU has.

use super::*;

/// GPU virtual mappings: kernel and user maps and unmaps, a mem's GPU VA, and engine copies
/// through VAs, racing frees and DMA unmaps of the same mems by the other workers.
pub(super) fn gpu_va(w: &World, d: &Ruvm, rng: &mut Rng) {
    let (h, g) = (w.handle(rng), w.gpu(rng));
    let user = rng.one_in(2);
    // User VAs: aligned and not, at and past the 49-bit width.
    let va = rng.pick(&[
        0,
        1 << 32,
        (1 << 32) + 4096,
        1 << 40,
        (1 << 49) - (64 << 10),
        1 << 49,
    ]);
    match rng.below(4) {
        0 => {
            let r = d.mem_gpu_kernel(rng.below(3) != 0, h, g);
            w.check(
                "MEM_(UN)MAP_GPU_KERNEL",
                r,
                &[ENOENT, ENODEV, EINVAL, EOPNOTSUPP, ENOSPC, EINTR],
            );
        }
        1 => {
            let r = if rng.below(3) != 0 {
                d.map_gpu_user(h, g, va, rng.one_in(3))
            } else {
                d.unmap_gpu_user(h, g)
            };
            w.check(
                "MEM_(UN)MAP_GPU_USER",
                r,
                &[ENOENT, ENODEV, EINVAL, EOPNOTSUPP, ERANGE, EEXIST, EINTR],
            );
        }
        2 => {
            let r = d.gpu_va(h, g, user);
            w.check("MEM_GPU_VA", r, &[ENOENT, ENODEV, ENXIO]);
        }
        _ => {
            // The kernel VA space holds every file's mems, so a privileged copy there through
            // a VA whose mem another thread freed may reach another file's mem: rightly, but
            // past what the isolation oracle can tell from a defect. A privileged worker copies
            // through its file's user VAs only; an unprivileged one tries both (the kernel
            // space answers EPERM).
            let user = user || w.privileged;
            // From the start of the kernel window or a user VA, to another place there.
            let base = if user {
                va
            } else {
                uapi::RUVM_GPU_KERNEL_VA_BASE
            };
            let (offset, length) = range(rng);
            let src = base.wrapping_add(offset);
            let dst = base.wrapping_add(rng.pick(&[0, 4096, 1 << 20, 2 << 20]));
            let r = d.ce_copy_va(g, dst, src, length.min(1 << 20), user);
            w.check(
                "CE_COPY_VA",
                r,
                &[EFAULT, EINVAL, ENODEV, EOPNOTSUPP, EPERM, EINTR],
            );
        }
    }
}

/// Memory pools: made, allocated from, read (its attributes must add up), set, trimmed,
/// granted GPUs and destroyed, with handles of this file, of other files and of none.
pub(super) fn pools(w: &World, d: &Ruvm, rng: &mut Rng) {
    let pool = w.pool(rng);
    match rng.below(8) {
        7 => vid_pool_beyond(w, d, rng),
        0 => {
            let page = rng.pick(&[0, 4096, 65536, 2 << 20, 3 << 10, 4 << 20]);
            let threshold = rng.pick(&[0, 65536, 1 << 20, u64::MAX]);
            let made = if rng.one_in(3) {
                // Vidmem of some GPU (with or without vidmem, or none).
                let mut c = uapi::ruvm_pool_create {
                    backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
                    gpu: w.gpu(rng),
                    page_size: page,
                    release_threshold: threshold,
                    ..Default::default()
                };
                w.check(
                    "POOL_CREATE (vidmem)",
                    d.call(cmd::POOL_CREATE, &mut c),
                    &[EINVAL, ENODEV, ENXIO, ENOSPC],
                )
                .map(|()| c.handle)
            } else {
                w.check(
                    "POOL_CREATE",
                    d.pool_create(page, threshold),
                    &[EINVAL, ENOSPC],
                )
                .map(|(h, _)| h)
            };
            if let Some(h) = made {
                if let Ok(mut p) = w.pools.lock() {
                    p.push(h);
                }
            }
        }
        1 => {
            if w.over_budget(d) {
                w.give_back(d, rng);
                return;
            }
            let size = rng.pick(&SIZES).min(w.max_size);
            let flags = rng.pick(&[0, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO, 2]);
            let (r, allowed): (_, &[Errno]) = if rng.one_in(3) {
                // Now and then more than any GPU's vidmem (three quarters of what one mem and one
                // file may hold, so that the quota lets it through to the pool), which must be
                // refused leaving nothing behind.
                let size = if rng.one_in(8) {
                    d.info()
                        .map_or(size, |i| i.max_alloc_bytes.min(i.max_file_bytes) / 4 * 3)
                } else {
                    size
                };
                let mut a = uapi::ruvm_mem_alloc {
                    size,
                    flags,
                    backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
                    gpu: w.gpu(rng),
                    pool,
                    ..Default::default()
                };
                (
                    d.call(cmd::MEM_ALLOC, &mut a).map(|()| a),
                    &[ENOENT, EINVAL, EOVERFLOW, ENOSPC, EINTR, ENODEV, ENOMEM],
                )
            } else {
                // A sysmem pool skips a GPU of its access set that is going: never ENODEV.
                (
                    d.pool_alloc(pool, size, flags),
                    &[ENOENT, EINVAL, EOVERFLOW, ENOSPC, EINTR, ENOMEM],
                )
            };
            if let Some(a) = w.check("MEM_ALLOC (pool)", r, allowed) {
                w.tag_mem(d, &a);
                if let Ok(mut hs) = w.handles.lock() {
                    hs.push(a.handle);
                }
            }
        }
        2 => {
            if let Some(a) = w.check("POOL_GET", d.pool_get(pool), &[ENOENT]) {
                if a.reserved_current
                    != a.used_current + a.pending_bytes + a.cached_chunks * a.chunk_size
                    || a.reserved_high < a.reserved_current
                    || a.used_high < a.used_current
                {
                    w.problem(format!("POOL_GET: attributes that do not add up: {a:?}"));
                }
            }
        }
        3 => {
            // 1 to 6 are attributes (4 to 6 the reuse policies, which take 0 or 1 only).
            let attr = rng.pick(&[0, 1, 2, 3, 4, 5, 6, 7]);
            let value = rng.pick(&[0, 1, 4096, 1 << 20, u64::MAX]);
            w.check("POOL_SET", d.pool_set(pool, attr, value), &[ENOENT, EINVAL]);
        }
        4 => {
            let keep = rng.pick(&[0, 65536, 1 << 20, u64::MAX]);
            // EINVAL: a pool this file imported ([`ipc`]).
            w.check("POOL_TRIM", d.pool_trim(pool, keep), &[ENOENT, EINVAL]);
        }
        5 => {
            let r = d.pool_access(pool, w.gpu(rng), rng.below(3) != 0);
            w.check("POOL_SET_ACCESS", r, &[ENOENT, ENODEV, EINVAL]);
        }
        _ => {
            if w.check("POOL_DESTROY", d.pool_destroy(pool), &[ENOENT, EBUSY])
                .is_some()
            {
                if let Ok(mut p) = w.pools.lock() {
                    p.retain(|x| *x != pool);
                }
            }
        }
    }
}

/// A vidmem pool of 4 KiB chunks on a GPU with vidmem, kept, asked for more than the GPU has
/// (three quarters of what one mem and one file may hold, so that the quota lets it through):
/// refused (`ENOMEM`), and nothing may stay behind for it, charged or not (the resources
/// oracle; a refused request once left megabytes of uncharged vmalloc in the pool).
pub(super) fn vid_pool_beyond(w: &World, d: &Ruvm, rng: &mut Rng) {
    if w.sims.is_empty() {
        return;
    }
    let g = rng.pick(&w.sims);
    let mut c = uapi::ruvm_pool_create {
        backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
        gpu: g,
        page_size: 4096,
        ..Default::default()
    };
    let made = w.check(
        "POOL_CREATE (vidmem, 4 KiB)",
        d.call(cmd::POOL_CREATE, &mut c),
        &[ENODEV, ENXIO, ENOSPC],
    );
    if made.is_none() {
        return;
    }
    if let Ok(mut p) = w.pools.lock() {
        p.push(c.handle);
    }
    let Ok(info) = d.info() else { return };
    let mut a = uapi::ruvm_mem_alloc {
        size: info.max_alloc_bytes.min(info.max_file_bytes) / 4 * 3,
        backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
        gpu: g,
        pool: c.handle,
        ..Default::default()
    };
    let r = d.call(cmd::MEM_ALLOC, &mut a).map(|()| a);
    if let Some(a) = w.check(
        "MEM_ALLOC (vidmem pool, beyond the GPU)",
        r,
        &[ENODEV, ENOSPC, EINTR, ENOENT],
    ) {
        // A GPU with that much vidmem: a mem like any other.
        if let Ok(mut hs) = w.handles.lock() {
            hs.push(a.handle);
        }
    }
}
