// SPDX-License-Identifier: GPL-2.0

//! DMA tables: idempotent maps inside the GPU's window, bad inputs, frees and unbinds while
//! mapped.

use super::*;

pub(super) fn gpu_dma_map_is_idempotent_and_in_the_window() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = bound_gpus(&d)?;
    let before = dma_live(&d)?;
    for ps in [0u64, 64 << 10, 2 << 20] {
        let a = d.mem_alloc((5 << 20) + 3, ps, 0).ctx("alloc")?;
        let never = d.mem_alloc(4096, 0, 0).ctx("alloc")?.handle;
        for &g in &gpus {
            d.mem_gpu(false, never, g)
                .ctx("unmap of a never-mapped mem")?;
        }
        let mut all = 0u64;
        for &g in &gpus {
            d.mem_gpu(true, a.handle, g).ctx("map")?;
            d.mem_gpu(true, a.handle, g).ctx("map again")?;
            all |= 1 << g;
            let q = d.mem_query(a.handle).ctx("query")?;
            check!(
                q.mapped_gpus == all,
                "mapped_gpus {:#x}, wanted {all:#x}",
                q.mapped_gpus
            );
            let addrs = d.dma_addrs(a.handle, g, 0, 10_000).ctx("dma addrs")?;
            check!(
                addrs.len() as u64 == a.chunk_count,
                "{} addresses for {} chunks",
                addrs.len(),
                a.chunk_count
            );
            let bits = d
                .gpus()
                .ctx("GPU_LIST")?
                .iter()
                .find(|x| x.id == g)
                .map_or(28, |x| x.dma_mask_bits);
            let limit = if bits >= 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            for (i, &x) in addrs.iter().enumerate() {
                check!(
                    x.checked_add(a.chunk_size - 1).is_some_and(|e| e <= limit),
                    "chunk {i} at {x:#x} is outside the {bits}-bit window"
                );
            }
            let mut sorted = addrs.clone();
            sorted.sort_unstable();
            sorted.dedup();
            check!(
                sorted.len() == addrs.len(),
                "two chunks share a DMA address on GPU {g}"
            );
            // A window of the table, from a later chunk.
            let tail = d
                .dma_addrs(a.handle, g, 1, 2)
                .ctx("dma addrs from chunk 1")?;
            check!(
                tail.as_slice() == &addrs[1..3.min(addrs.len())],
                "chunks 1.. read {tail:x?}, table {addrs:x?}"
            );
        }
        for &g in &gpus {
            let e = d.gpus().ctx("GPU_LIST")?.into_iter().find(|x| x.id == g);
            let bytes = e.map_or(0, |x| x.dma_mapped_bytes);
            check!(
                bytes == a.chunk_count * a.chunk_size,
                "GPU {g} reports {bytes} bytes DMA-mapped, the mem has {}",
                a.chunk_count * a.chunk_size
            );
        }
        let during = dma_live(&d)?;
        let n = gpus.len() as u64 * a.chunk_count;
        check!(
            during == (before.0 + n, before.1 + n * a.chunk_size),
            "audit dma counts {during:?}, wanted +{n} mappings"
        );
        for &g in &gpus {
            d.mem_gpu(false, a.handle, g).ctx("unmap")?;
            d.mem_gpu(false, a.handle, g).ctx("unmap again")?;
            all &= !(1 << g);
            check!(
                d.mem_query(a.handle).ctx("query")?.mapped_gpus == all,
                "still mapped on GPU {g} after unmap"
            );
        }
        check!(
            dma_live(&d)? == before,
            "DMA mappings left after unmapping: {:?}",
            dma_live(&d)?
        );
        let left: u64 = d
            .gpus()
            .ctx("GPU_LIST")?
            .iter()
            .map(|x| x.dma_mapped_bytes)
            .sum();
        check!(
            left == 0,
            "GPUs report {left} bytes DMA-mapped after unmapping"
        );
        d.mem_free(a.handle).ctx("free")?;
        d.mem_free(never).ctx("free")?;
    }
    Ok(())
}

pub(super) fn gpu_dma_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = bound_gpus(&d)?;
    let g = gpus[0];
    let h = d.mem_alloc(3 << 20, 0, 0).ctx("alloc")?.handle;
    expect_errno(
        d.mem_gpu(true, h, 99),
        Errno::ENODEV,
        "map on an unknown GPU",
    )?;
    expect_errno(
        d.mem_gpu(true, h, u32::MAX),
        Errno::ENODEV,
        "map on GPU u32::MAX",
    )?;
    expect_errno(
        d.mem_gpu(true, u64::MAX, g),
        Errno::ENOENT,
        "map of an unknown handle",
    )?;
    expect_errno(
        d.dma_addrs(h, g, 0, 4),
        Errno::ENXIO,
        "addresses of a mem not mapped on the GPU",
    )?;
    // Unknown flags and non-zero reserved fields: the ABI table (`abi_*`).
    d.mem_gpu(true, h, g).ctx("map")?;
    let chunks = d.mem_query(h).ctx("query")?.chunk_count;
    expect_errno(
        d.dma_addrs(h, g, chunks + 1, 4),
        Errno::EINVAL,
        "first chunk past the end",
    )?;
    check!(
        d.dma_addrs(h, g, chunks, 4)
            .ctx("first chunk at the end")?
            .is_empty(),
        "addresses past the last chunk"
    );
    let mut a = uapi::ruvm_mem_dma_addrs {
        handle: h,
        gpu: g,
        count: 4,
        addrs: 8,
        ..Default::default()
    };
    expect_errno(
        d.call(libruvm::cmd::MEM_DMA_ADDRS, &mut a),
        Errno::EFAULT,
        "array at an unmapped address",
    )?;
    // Bus addresses are not for everyone.
    child_checks(
        "an unprivileged read of DMA addresses was not refused with EPERM",
        || {
            setuid(Uid::from_raw(65534)).is_ok()
                && d.dma_addrs(h, g, 0, 4).err() == Some(Errno::EPERM)
        },
    )?;
    // Another file's mem is not this file's.
    let other = Ruvm::open().ctx("open")?;
    expect_errno(
        other.mem_gpu(true, h, g),
        Errno::ENOENT,
        "map of another file's mem",
    )?;
    d.mem_free(h).ctx("free")?;
    expect_errno(d.mem_gpu(true, h, g), Errno::ENOENT, "map after free")
}

pub(super) fn gpu_dma_free_while_mapped_everywhere() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = bound_gpus(&d)?;
    let before = dma_live(&d)?;
    let h = d.mem_alloc(7 << 20, 2 << 20, 0).ctx("alloc")?.handle;
    d.map_kernel(h).ctx("map kernel")?;
    for &g in &gpus {
        d.mem_gpu(true, h, g).ctx("map")?;
    }
    check!(
        dma_live(&d)?.0 == before.0 + 4 * gpus.len() as u64,
        "mappings not counted"
    );
    d.mem_free(h).ctx("free while mapped on every GPU")?;
    check!(
        dma_live(&d)? == before,
        "DMA mappings left after free: {:?}",
        dma_live(&d)?
    );
    Ok(())
}

pub(super) fn gpu_dma_unbind_while_mapped() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let bound: Vec<&uapi::ruvm_gpu_info> = gpus.iter().filter(|g| bound_edu(g)).collect();
    if bound.len() < 2 {
        return Err(Stop::Skip("needs two GPUs bound by ruvm-edu".into()));
    }
    let (g0, g1) = (bound[0].id, bound[1].id);
    let name = pci_name(bound[0]);
    let before = dma_live(&d)?;
    let a = d.mem_alloc(3 << 20, 64 << 10, 0).ctx("alloc")?;
    d.mem_gpu(true, a.handle, g0).ctx("map on GPU 0")?;
    d.mem_gpu(true, a.handle, g1).ctx("map on GPU 1")?;
    let table1 = d.dma_addrs(a.handle, g1, 0, 1000).ctx("addrs on GPU 1")?;
    std::fs::write(format!("{DRIVER}/unbind"), &name).ctx("unbind")?;
    let after = (|| -> TestResult {
        let q = d.mem_query(a.handle).ctx("query")?;
        check!(
            q.mapped_gpus == 1 << g1,
            "after unbind, mapped_gpus {:#x}",
            q.mapped_gpus
        );
        check!(
            dma_live(&d)?.0 == before.0 + a.chunk_count,
            "the removed GPU's mappings are still counted"
        );
        expect_errno(
            d.mem_gpu(true, a.handle, g0),
            Errno::ENODEV,
            "map on the removed GPU",
        )?;
        d.mem_gpu(false, a.handle, g0)
            .ctx("unmap on the removed GPU")?;
        // The mem is still good, for the CPU and the other GPU.
        check!(
            d.dma_addrs(a.handle, g1, 0, 1000).ctx("addrs on GPU 1")? == table1,
            "GPU 1's table changed"
        );
        d.map_kernel(a.handle).ctx("map kernel")?;
        let f = uapi::ruvm_mem_fill {
            handle: a.handle,
            length: 3 << 20,
            seed: 5,
            ..Default::default()
        };
        d.mem_fill(false, f).ctx("fill")?;
        let r = d.mem_fill(true, f).ctx("verify")?;
        check!(r.mismatches == 0, "data changed");
        Ok(())
    })();
    let rebind = std::fs::write(format!("{DRIVER}/bind"), &name).ctx("bind");
    after?;
    rebind?;
    d.mem_gpu(true, a.handle, g0)
        .ctx("map on the rebound GPU")?;
    d.mem_free(a.handle).ctx("free")?;
    check!(
        dma_live(&d)? == before,
        "DMA mappings left: {:?}",
        dma_live(&d)?
    );
    Ok(())
}
