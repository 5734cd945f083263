// SPDX-License-Identifier: GPL-2.0

//! Copy engines: bytes both ways, two GPUs' address spaces, bad inputs, and the IOMMU (or a
//! simulated GPU) faulting after an unmap.

use super::*;

/// The pieces a sampled copy moves: the start and the end of every chunk (`len` bytes each, or
/// the whole chunk when it is small).
pub(super) fn samples(chunk: u64, chunks: u64, len: u64) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    for c in 0..chunks {
        let base = c * chunk;
        if chunk <= 2 * len {
            v.push((base, chunk));
        } else {
            v.push((base, len));
            v.push((base + chunk - len, len));
        }
    }
    v
}

pub(super) fn gpu_ce_copy_moves_bytes_both_ways() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = engine_gpus(&d)?;
    const SIZES: [(u64, u64); 3] = [(12 << 10, 0), (192 << 10, 64 << 10), (4 << 20, 2 << 20)];
    for (i, &g) in gpus.iter().enumerate() {
        // Every size on the first GPU; one (several chunks, the engine's limit crossed) on the
        // others, whose engines and tables are the same code: an edu transfer costs 100 ms.
        let sizes = if i == 0 { &SIZES[..] } else { &SIZES[1..2] };
        for &(size, ps) in sizes {
            let seed = size + u64::from(g);
            let src = d.mem_alloc(size, ps, 0).ctx("alloc src")?;
            let dst = d
                .mem_alloc(size, 0, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
                .ctx("alloc dst")?;
            for h in [src.handle, dst.handle] {
                d.map_kernel(h).ctx("map kernel")?;
                d.mem_gpu(true, h, g).ctx("map gpu")?;
            }
            let fill = |h, seed| uapi::ruvm_mem_fill {
                handle: h,
                length: size,
                seed,
                ..Default::default()
            };
            d.mem_fill(false, fill(src.handle, seed))
                .ctx("CPU writes the pattern")?;
            // Pieces of 5000 bytes cross the engine's 4095-byte limit and, for 4K chunks, the
            // chunk boundaries of both mems.
            let pieces = samples(src.chunk_size, src.chunk_count, 5000);
            for &(off, len) in &pieces {
                d.ce_copy(g, dst.handle, off, src.handle, off, len)
                    .ctx(&format!("GPU {g} copies [{off:#x}, +{len:#x})"))?;
            }
            // The kernel mapping and the user mapping both see exactly the copied bytes.
            let q = d.mem_query(dst.handle).ctx("query")?;
            let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
            let mut copied = vec![false; size as usize];
            for &(off, len) in &pieces {
                let r = d
                    .mem_fill(
                        true,
                        uapi::ruvm_mem_fill {
                            offset: off,
                            length: len,
                            ..fill(dst.handle, seed)
                        },
                    )
                    .ctx("verify")?;
                check!(r.mismatches == 0, "GPU {g}, chunk size {}: {} bytes differ in [{off:#x}, +{len:#x}), first at {:#x}", src.chunk_size, r.mismatches, r.first_mismatch);
                copied[off as usize..(off + len) as usize]
                    .iter_mut()
                    .for_each(|c| *c = true);
            }
            for (o, &c) in copied.iter().enumerate() {
                let want = if c {
                    pattern::byte_at(seed, o as u64)
                } else {
                    0
                };
                let got = map.read(o);
                check!(
                    got == want,
                    "GPU {g}: user sees {got:#x} at {o:#x}, wanted {want:#x}"
                );
            }
            // The other way: user space writes through mmap, the engine copies back, the kernel
            // checks.
            let back = seed ^ 0xffff;
            for &(off, len) in &pieces {
                for o in off..off + len {
                    map.write(o as usize, pattern::byte_at(back, o));
                }
                d.ce_copy(g, src.handle, off, dst.handle, off, len)
                    .ctx("copy back")?;
                let r = d
                    .mem_fill(
                        true,
                        uapi::ruvm_mem_fill {
                            offset: off,
                            length: len,
                            ..fill(src.handle, back)
                        },
                    )
                    .ctx("verify back")?;
                check!(
                    r.mismatches == 0,
                    "GPU {g}: copy back: {} bytes differ at {:#x}",
                    r.mismatches,
                    r.first_mismatch
                );
            }
            drop(map);
            d.mem_free(src.handle).ctx("free")?;
            d.mem_free(dst.handle).ctx("free")?;
        }
    }
    Ok(())
}

/// Two edu GPUs, each in its own IOMMU domain with its own IOVA allocator: once GPU 0 alone
/// holds a mapping, one mem mapped on both gets a table on each (GPU 0 never hands out the
/// filler's addresses again), and each engine copies correctly through its own table. The
/// two tables' addresses may coincide: each domain has a space of its own, and what earlier
/// mappings left in each allocator decides (`make demo` maps on both GPUs before its
/// selftest, and there they came out equal).
pub(super) fn gpu_two_gpus_two_address_spaces() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let edu: Vec<u32> = gpus.iter().filter(|g| bound_edu(g)).map(|g| g.id).collect();
    if edu.len() < 2 {
        return Err(Stop::Skip("needs two GPUs bound by ruvm-edu".into()));
    }
    let (g0, g1) = (edu[0], edu[1]);
    // Held on GPU 0 while the shared mem is mapped there.
    let filler = d.mem_alloc(4 << 20, 2 << 20, 0).ctx("alloc filler")?.handle;
    d.mem_gpu(true, filler, g0).ctx("map filler on GPU 0")?;
    let shared = d.mem_alloc(4 << 20, 2 << 20, 0).ctx("alloc")?.handle;
    d.mem_gpu(true, shared, g0).ctx("map on GPU 0")?;
    d.mem_gpu(true, shared, g1).ctx("map on GPU 1")?;
    let a0 = d.dma_addrs(shared, g0, 0, 2).ctx("addrs on GPU 0")?;
    let a1 = d.dma_addrs(shared, g1, 0, 2).ctx("addrs on GPU 1")?;
    let f0 = d.dma_addrs(filler, g0, 0, 2).ctx("filler addrs")?;
    check!(
        a0.len() == 2 && a1.len() == 2,
        "one mem of two chunks, tables of {} and {} addresses",
        a0.len(),
        a1.len()
    );
    check!(
        a0.iter().all(|a| !f0.contains(a)),
        "GPU {g0} gave the filler's addresses {f0:x?} to another mem: {a0:x?}"
    );
    // Each engine moves the same bytes through its own addresses.
    let seed = 77;
    d.map_kernel(shared).ctx("map kernel")?;
    d.mem_fill(
        false,
        uapi::ruvm_mem_fill {
            handle: shared,
            length: 4 << 20,
            seed,
            ..Default::default()
        },
    )
    .ctx("fill")?;
    for (g, off) in [(g0, 0u64), (g1, (2 << 20) + 4096)] {
        let dst = d
            .mem_alloc(8192, 0, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
            .ctx("alloc dst")?
            .handle;
        d.mem_gpu(true, dst, g).ctx("map dst")?;
        d.map_kernel(dst).ctx("map kernel")?;
        d.ce_copy(g, dst, off % 8192, shared, off, 3000)
            .ctx(&format!("GPU {g} copies"))?;
        let q = d.mem_query(dst).ctx("query")?;
        let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
        for i in 0..3000u64 {
            let (got, want) = (
                map.read(((off % 8192) + i) as usize),
                pattern::byte_at(seed, off + i),
            );
            check!(
                got == want,
                "GPU {g}: byte {i} is {got:#x}, wanted {want:#x}"
            );
        }
        drop(map);
        d.mem_free(dst).ctx("free")?;
    }
    d.mem_free(shared).ctx("free")?;
    d.mem_free(filler).ctx("free")
}

pub(super) fn gpu_ce_copy_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let g = engine_gpus(&d)?[0];
    let a = d.mem_alloc(8192, 0, 0).ctx("alloc")?.handle;
    let b = d.mem_alloc(8192, 0, 0).ctx("alloc")?.handle;
    d.mem_gpu(true, a, g).ctx("map a")?;
    expect_errno(
        d.ce_copy(g, b, 0, a, 0, 16),
        Errno::ENXIO,
        "destination not mapped on the GPU",
    )?;
    expect_errno(
        d.ce_copy(g, a, 0, b, 0, 16),
        Errno::ENXIO,
        "source not mapped on the GPU",
    )?;
    d.mem_gpu(true, b, g).ctx("map b")?;
    expect_errno(d.ce_copy(99, b, 0, a, 0, 16), Errno::ENODEV, "unknown GPU")?;
    expect_errno(
        d.ce_copy(g, b, 0, u64::MAX, 0, 16),
        Errno::ENOENT,
        "unknown source",
    )?;
    expect_errno(
        d.ce_copy(g, b, 8190, a, 0, 16),
        Errno::EINVAL,
        "destination past the end",
    )?;
    expect_errno(
        d.ce_copy(g, b, 0, a, 8190, 16),
        Errno::EINVAL,
        "source past the end",
    )?;
    expect_errno(
        d.ce_copy(g, b, u64::MAX, a, 0, 16),
        Errno::EOVERFLOW,
        "offset overflows",
    )?;
    d.ce_copy(g, b, 0, a, 0, 0).ctx("an empty copy")?;
    if d.info().ctx("INFO")?.test_ioctls == 0 {
        expect_errno(
            d.test_ce_raw(g, 0, 16),
            Errno::ENOSYS,
            "raw transfer with test ioctls off",
        )?;
    }
    d.mem_free(a).ctx("free")?;
    d.mem_free(b).ctx("free")
}

/// Whether the kernel log after `mark` has an IOMMU fault report for device `bdf` (`bb:dd.f`)
/// at `addr`, waiting up to a second (faults are reported by interrupt).
pub(super) fn iommu_fault_after(mark: &str, bdf: &str, addr: u64) -> Result<bool, Stop> {
    for _ in 0..20 {
        let log = crate::kmsg::read_kmsg().ctx("kmsg")?;
        let part = crate::kmsg::since(&log, Some(mark)).ok_or(Stop::Fail("marker lost".into()))?;
        let needle = format!("fault addr {addr:#x}");
        if part
            .iter()
            .any(|m| m.contains("DMAR") && m.contains(bdf) && m.contains(&needle))
        {
            return Ok(true);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(false)
}

pub(super) fn gpu_iommu_faults_after_unmap() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    if d.info().ctx("INFO")?.test_ioctls == 0 {
        return Err(Stop::Skip(
            "raw engine transfers need enable_test_ioctls=1".into(),
        ));
    }
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let Some(g) = gpus.iter().find(|g| bound_edu(g)) else {
        return Err(Stop::Skip("no edu GPU (behind the IOMMU)".into()));
    };
    if !std::path::Path::new("/sys/class/iommu")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some())
    {
        return Err(Stop::Skip("no IOMMU".into()));
    }
    let bdf = format!(
        "{:02x}:{:02x}.{}",
        g.pci_bus,
        g.pci_devfn >> 3,
        g.pci_devfn & 7
    );
    let h = d.mem_alloc(64 << 10, 64 << 10, 0).ctx("alloc")?.handle;
    d.mem_gpu(true, h, g.id).ctx("map")?;
    let addr = d.dma_addrs(h, g.id, 0, 1).ctx("addrs")?[0];
    // Mapped: the engine reads it without a fault.
    let mark = crate::kmsg::write_marker().ctx("mark")?;
    d.test_ce_raw(g.id, addr, 4000).ctx("read while mapped")?;
    check!(
        !iommu_fault_after(&mark, &bdf, addr)?,
        "an IOMMU fault at {addr:#x} while the address was mapped"
    );
    // Unmapped: the same read faults in the IOMMU, naming this device and address.
    d.mem_gpu(false, h, g.id).ctx("unmap")?;
    let mark = crate::kmsg::write_marker().ctx("mark")?;
    d.test_ce_raw(g.id, addr, 4000).ctx("read after unmap")?;
    check!(
        iommu_fault_after(&mark, &bdf, addr)?,
        "no IOMMU fault for {bdf} at {addr:#x} after unmap: the unmap was not real"
    );
    d.mem_free(h).ctx("free")?;
    let mut r = uapi::ruvm_test_ce_raw {
        gpu: g.id,
        src: 0,
        len: 4096,
        ..Default::default()
    };
    expect_errno(
        d.call(libruvm::cmd::TEST_CE_RAW, &mut r),
        Errno::EINVAL,
        "a 4096-byte transfer",
    )?;
    r.len = 0;
    expect_errno(
        d.call(libruvm::cmd::TEST_CE_RAW, &mut r),
        Errno::EINVAL,
        "an empty transfer",
    )
}

/// Whether the kernel log after `mark` has the simulated engine's fault report for `addr`.
pub(super) fn sim_fault_after(mark: &str, addr: u64) -> Result<bool, Stop> {
    let log = crate::kmsg::read_kmsg().ctx("kmsg")?;
    let part = crate::kmsg::since(&log, Some(mark)).ok_or(Stop::Fail("marker lost".into()))?;
    let needle = format!("sim GPU: DMA fault at {addr:#x}+");
    Ok(part.iter().any(|m| m.contains(&needle)))
}

pub(super) fn gpu_sim_faults_after_unmap() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    if d.info().ctx("INFO")?.test_ioctls == 0 {
        return Err(Stop::Skip(
            "raw engine transfers need enable_test_ioctls=1".into(),
        ));
    }
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let Some(g) = gpus.iter().find(|g| sim(g)) else {
        return Err(Stop::Skip("no simulated GPU (load with sim_gpus=N)".into()));
    };
    let h = d.mem_alloc(3 << 20, 2 << 20, 0).ctx("alloc")?.handle;
    d.mem_gpu(true, h, g.id).ctx("map")?;
    let addrs = d.dma_addrs(h, g.id, 0, 2).ctx("addrs")?;
    // Mapped: the whole of each chunk reads, and nothing faults.
    let mark = crate::kmsg::write_marker().ctx("mark")?;
    for &a in &addrs {
        d.test_ce_raw(g.id, a, 2 << 20).ctx("read a mapped chunk")?;
    }
    check!(
        !sim_fault_after(&mark, addrs[0])?,
        "a fault at {:#x} while it was mapped",
        addrs[0]
    );
    // A read running past the end of a mapping faults (even if another mapping follows:
    // the simulated engine moves nothing across mappings).
    expect_errno(
        d.test_ce_raw(g.id, addrs[0] + (2 << 20) - 1, 2),
        Errno::EFAULT,
        "a read running past a chunk",
    )?;
    // Unmapped: the same read faults, and the fault is reported.
    d.mem_gpu(false, h, g.id).ctx("unmap")?;
    let mark = crate::kmsg::write_marker().ctx("mark")?;
    expect_errno(
        d.test_ce_raw(g.id, addrs[0], 4096),
        Errno::EFAULT,
        "a read after unmap",
    )?;
    check!(
        sim_fault_after(&mark, addrs[0])?,
        "no fault report for {:#x} after unmap",
        addrs[0]
    );
    d.mem_free(h).ctx("free")?;
    for len in [0u64, (2 << 20) + 1] {
        expect_errno(
            d.test_ce_raw(g.id, addrs[0], len),
            Errno::EINVAL,
            &format!("a {len}-byte transfer"),
        )?;
    }
    Ok(())
}
