// SPDX-License-Identifier: GPL-2.0

//! Group 3 and the GPU cases: vidmem against sysmem and the page allocator, GPU virtual
//! mappings against the DMA map alone, a pool hit and a trim.

use super::*;

/// G3: vidmem 64 KiB alloc + free with its root chunk in use (warm) or not (cold), against
/// sysmem 64 KiB chunks (zeroed: vidmem always is), and against the page allocator itself.
pub(super) fn g3(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let n = 64;
    let vid = &mut || {
        let a = c.d.vidmem_alloc(c.sim, 64 * K, 64 * K, 0)?;
        c.d.mem_free(a.handle)?;
        Ok(())
    };
    let sys = &mut || c.alloc_free(64 * K, 64 * K, true);
    let mut cold = c.case(
        "g3.vidmem_cold".into(),
        "vidmem 64K alloc + free, needing a root chunk",
        "sysmem 64K zeroed, one 64K chunk",
        "ns",
    );
    (cold.ruvm, cold.base) = pairs(c.spec.reps, &mut || per_op(n, vid), &mut || per_op(n, sys))?;
    out(cold);
    let hold = c.d.vidmem_alloc(c.sim, 64 * K, 64 * K, 0)?;
    let mut warm = c.case(
        "g3.vidmem_warm".into(),
        "vidmem 64K alloc + free, root chunk in use",
        "sysmem 64K zeroed, one 64K chunk",
        "ns",
    );
    (warm.ruvm, warm.base) = pairs(c.spec.reps, &mut || per_op(n, vid), &mut || per_op(n, sys))?;
    out(warm);
    let mut kernel = c.case(
        "g3.vidmem_vs_pages".into(),
        "vidmem 64K alloc + free, root chunk in use (ioctls)",
        "alloc_pages(order 4) + free, zeroed, in the kernel",
        "ns",
    );
    let pages = uapi::ruvm_bench {
        op: uapi::ruvm_bench_op_RUVM_BENCH_PAGES,
        order: 4,
        zero: 1,
        count: 1,
        iterations: n,
        ..Default::default()
    };
    (kernel.ruvm, kernel.base) = pairs(c.spec.reps, &mut || per_op(n, vid), &mut || {
        Ok(c.d.bench(pages).context("RUVM_IOCTL_BENCH")? as f64 / n as f64)
    })?;
    out(kernel);
    // Chunks that were written come back to be zeroed again: each mem gets 64 bytes from the
    // copy engine before it is freed, and so does a sysmem mem beside each sysmem allocation,
    // so that both sides pay the copy.
    let src = c.d.mem_alloc(64 * K, 64 * K, ZERO)?;
    let dst = c.d.mem_alloc(64 * K, 64 * K, ZERO)?;
    for h in [src.handle, dst.handle] {
        c.d.mem_gpu(true, h, c.sim)?;
    }
    let mut written = c.case(
        "g3.vidmem_written".into(),
        "vidmem 64K alloc + 64-byte engine write + free, root chunk in use",
        "sysmem 64K zeroed alloc + free, and a 64-byte engine write",
        "ns",
    );
    (written.ruvm, written.base) = pairs(
        c.spec.reps,
        &mut || {
            per_op(n, &mut || {
                let a = c.d.vidmem_alloc(c.sim, 64 * K, 64 * K, 0)?;
                c.d.ce_copy(c.sim, a.handle, 0, src.handle, 0, 64)?;
                c.d.mem_free(a.handle)?;
                Ok(())
            })
        },
        &mut || {
            per_op(n, &mut || {
                c.alloc_free(64 * K, 64 * K, true)?;
                c.d.ce_copy(c.sim, dst.handle, 0, src.handle, 0, 64)?;
                Ok(())
            })
        },
    )?;
    out(written);
    for h in [src.handle, dst.handle, hold.handle] {
        c.d.mem_free(h)?;
    }
    Ok(())
}

/// GPU virtual mappings: `MEM_MAP_GPU_KERNEL` + `_UNMAP_GPU_KERNEL` of a big mem on a simulated
/// GPU (its page tables written and freed), against `MEM_MAP_GPU` + `_UNMAP_GPU` (its DMA map
/// alone) of the same mem, for 2 MiB and 4 KiB chunks.
pub(super) fn va(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let size = c.spec.max_size;
    for chunk in [2 * M, 4 * K] {
        let a = c.d.mem_alloc(size, chunk, 0)?;
        let h = a.handle;
        let mut case = c.case(
            format!("va.map_kernel.{}", size_name(chunk)),
            &format!(
                "map + unmap at the GPU kernel VA, {} in {} chunks (DMA map included)",
                size_name(size),
                size_name(chunk)
            ),
            "DMA map + unmap alone",
            "ns",
        );
        (case.ruvm, case.base) = pairs(
            c.spec.reps,
            &mut || {
                time(&mut || {
                    c.d.mem_gpu_kernel(true, h, c.sim)?;
                    c.d.mem_gpu(false, h, c.sim)?;
                    Ok(())
                })
            },
            &mut || {
                time(&mut || {
                    c.d.mem_gpu(true, h, c.sim)?;
                    c.d.mem_gpu(false, h, c.sim)?;
                    Ok(())
                })
            },
        )?;
        case.size = size;
        out(case);
        c.d.mem_free(h)?;
    }
    Ok(())
}

/// Memory pools: a pool hit against a fresh allocation DMA-mapped for the same GPU, and a trim
/// against freeing the same mems without a pool.
pub(super) fn pool(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    // Pool hit: alloc + free of a 64 KiB mem mapped for a GPU, one 64 KiB chunk.
    let (p, _) = c.d.pool_create(64 * K, u64::MAX)?;
    c.d.pool_access(p, c.big, true)?;
    let warm = c.d.pool_alloc(p, 64 * K, 0)?;
    c.d.mem_free(warm.handle)?;
    let mut case = c.case(
        "pool.hit.64K".into(),
        &format!(
            "64K sysmem alloc + free from a pool mapped for {} (a cache hit)",
            c.big_name
        ),
        "alloc + MEM_MAP_GPU + free of the same, no pool",
        "ns",
    );
    case.size = 64 * K;
    let n = 256;
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || {
            per_op(n, &mut || {
                let a = c.d.pool_alloc(p, 64 * K, 0)?;
                c.d.mem_free(a.handle)?;
                Ok(())
            })
        },
        &mut || {
            per_op(n, &mut || {
                let a = c.d.mem_alloc(64 * K, 64 * K, 0)?;
                c.d.mem_gpu(true, a.handle, c.big)?;
                c.d.mem_free(a.handle)?;
                Ok(())
            })
        },
    )?;
    out(case);
    c.d.pool_destroy(p)?;
    // What a hit cannot skip: the ioctl itself (one that fails at once: MEM_FREE of a handle
    // that is no mem's), against the cheapest system call; and the mem object, made and freed
    // in the kernel (RUVM_BENCH_MEM of one 64 KiB chunk) against its chunk alone.
    let mut case = c.case(
        "pool.ioctl_floor".into(),
        "an ioctl that fails at once (MEM_FREE of no mem's handle)",
        "getppid()",
        "ns",
    );
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || {
            per_op(n, &mut || {
                // ENOENT is the point.
                let _ = c.d.mem_free(u64::MAX);
                Ok(())
            })
        },
        &mut || {
            per_op(n, &mut || {
                std::hint::black_box(nix::unistd::getppid());
                Ok(())
            })
        },
    )?;
    out(case);
    let bench = |op| uapi::ruvm_bench {
        op,
        order: 4,
        count: 1,
        iterations: n,
        ..Default::default()
    };
    let mut case = c.case(
        "pool.mem_object".into(),
        "a 64K mem of one chunk made and freed in the kernel, no ioctl (RUVM_BENCH_MEM)",
        "its chunk alone: alloc_pages(order 4) + free, in the kernel",
        "ns",
    );
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || {
            let b = bench(uapi::ruvm_bench_op_RUVM_BENCH_MEM);
            Ok(c.d.bench(b).context("RUVM_IOCTL_BENCH")? as f64 / n as f64)
        },
        &mut || {
            let b = bench(uapi::ruvm_bench_op_RUVM_BENCH_PAGES);
            Ok(c.d.bench(b).context("RUVM_IOCTL_BENCH")? as f64 / n as f64)
        },
    )?;
    out(case);
    // Trim: 1 GiB of cached 2 MiB chunks given back at once, against freeing the mems that
    // held them (no pool).
    let size = c.spec.max_size;
    let per_mem = (16 * M).min(size);
    let count = (size / per_mem).max(1);
    let (p, _) = c.d.pool_create(2 * M, u64::MAX)?;
    let mut case = c.case(
        format!("pool.trim.{}", size_name(size)),
        &format!(
            "POOL_TRIM of {} cached in 2M chunks ({count} mems freed into the pool)",
            size_name(size)
        ),
        "MEM_FREE of the same mems, no pool",
        "ns",
    );
    case.size = size;
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || {
            let mut mems = Vec::new();
            for _ in 0..count {
                mems.push(c.d.pool_alloc(p, per_mem, 0)?.handle);
            }
            for h in mems {
                c.d.mem_free(h)?;
            }
            time(&mut || {
                c.d.pool_trim(p, 0)?;
                Ok(())
            })
        },
        &mut || {
            let mut mems = Vec::new();
            for _ in 0..count {
                mems.push(c.d.mem_alloc(per_mem, 2 * M, 0)?.handle);
            }
            time(&mut || {
                for h in &mems {
                    c.d.mem_free(*h)?;
                }
                Ok(())
            })
        },
    )?;
    out(case);
    c.d.pool_destroy(p)?;
    Ok(())
}
