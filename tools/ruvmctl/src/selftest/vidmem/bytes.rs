// SPDX-License-Identifier: GPL-2.0

//! Vidmem's bytes: chunks known to be zero, every write, round trips through the copy engine.

use super::*;

/// Copies `[off, off + len)` from `src` to `dst` with GPU `g`'s engine.
pub(super) fn ce(d: &Ruvm, g: u32, dst: u64, src: u64, off: u64, len: u64) -> TestResult {
    d.ce_copy(g, dst, off, src, off, len)
        .ctx(&format!("GPU {g} copies [{off:#x}, +{len:#x})"))
}

/// How a test writes a vidmem mem before freeing it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Write {
    /// Not at all: its chunks come back known to be zero.
    None,
    /// A copy engine copy into it (`CE_COPY`).
    Engine,
    /// Through its GPU kernel VA mapping (`MEM_MAP_GPU_KERNEL`, then `CE_COPY_VA`).
    KernelVa,
}

/// The pieces of a chunk of `ps` bytes a test writes and reads back: its first and last 1000
/// bytes (few, as each edu transfer takes about 100 ms).
pub(super) fn ends(ps: u64) -> [(u64, u64); 2] {
    [(0, 1000), (ps - 1000, 1000)]
}

/// Writes the ends of vidmem mem `v` (one chunk of `ps`) from `s` (sysmem, mapped on the GPU
/// and filled with a pattern) the way `how` says.
pub(super) fn write_vid(d: &Ruvm, g: u32, v: u64, s: u64, ps: u64, how: Write) -> TestResult {
    match how {
        Write::None => {}
        Write::Engine => {
            for (off, len) in ends(ps) {
                ce(d, g, v, s, off, len)?;
            }
        }
        Write::KernelVa => {
            for h in [v, s] {
                d.mem_gpu_kernel(true, h, g).ctx("MAP_GPU_KERNEL")?;
            }
            let (vva, _) = d.gpu_va(v, g, false).ctx("GPU_VA")?;
            let (sva, _) = d.gpu_va(s, g, false).ctx("GPU_VA")?;
            for (off, len) in ends(ps) {
                d.ce_copy_va(g, vva + off, sva + off, len, false)
                    .ctx("CE_COPY_VA")?;
            }
            for h in [v, s] {
                d.mem_gpu_kernel(false, h, g).ctx("UNMAP_GPU_KERNEL")?;
            }
        }
    }
    Ok(())
}

/// Bytes of the ends of vidmem mem `v` (one chunk of `ps`) that are not zero, read through
/// `s` (sysmem, mapped on the GPU and kernel; not the mem the writes come from), which is
/// scribbled over first.
pub(super) fn nonzero_ends(d: &Ruvm, g: u32, v: u64, s: u64, ps: u64) -> Result<u64, Stop> {
    let byte = |verify: bool, off: u64, len: u64, seed: u64| {
        d.mem_fill(
            verify,
            uapi::ruvm_mem_fill {
                handle: s,
                offset: off,
                length: len,
                kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
                seed,
                ..Default::default()
            },
        )
        .ctx("MEM_FILL")
    };
    let mut bad = 0;
    for (off, len) in ends(ps) {
        byte(false, off, len, 0xee)?;
        ce(d, g, s, v, off, len)?;
        bad += byte(true, off, len, 0)?.mismatches;
    }
    Ok(bad)
}

/// A vidmem chunk that comes back unwritten is handed out again as it is (known zero), and
/// every way to write one (a copy engine copy into it, a GPU kernel VA mapping) makes the next
/// mem on the same memory zeroed again: for each chunk size, a mem is written (or not) and
/// freed, and the next mem, on the same vidmem address, reads zeros. Then two 4 KiB chunks of
/// one 64 KiB slot, one written and one not: the 64 KiB chunk after them reads zeros.
pub(super) fn vidmem_known_zero_chunks_and_every_write() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = engine_gpus(&d)?;
    for g in &gpus {
        let mmu = g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_MMU != 0;
        check_idle(&d, g.id, "before")?;
        // Written from (a pattern) and read back through: as big as the largest chunk.
        let s = d.mem_alloc(2 * M, 0, 0).ctx("alloc sysmem")?.handle;
        let r = d.mem_alloc(2 * M, 0, 0).ctx("alloc sysmem")?.handle;
        fill(&d, s, 2 * M, u64::from(g.id) + 7)?;
        for h in [s, r] {
            d.map_kernel(h).ctx("MAP_CPU_KERNEL")?;
            d.mem_gpu(true, h, g.id).ctx("MAP_GPU")?;
        }
        let mut ways = vec![Write::None, Write::Engine, Write::None];
        if mmu {
            ways.extend([Write::KernelVa, Write::None]);
        }
        for ps in SIZES {
            for &how in &ways {
                let a = d.vidmem_alloc(g.id, ps, ps, 0).ctx("alloc")?.handle;
                let at = d.gpu_phys(a, g.id, 0, 1).ctx("GPU_PHYS")?.0;
                write_vid(&d, g.id, a, s, ps, how)?;
                d.mem_free(a).ctx("free")?;
                let b = d.vidmem_alloc(g.id, ps, ps, 0).ctx("alloc again")?.handle;
                let again = d.gpu_phys(b, g.id, 0, 1).ctx("GPU_PHYS")?.0;
                check!(
                    again == at,
                    "GPU {}: a {ps}-byte chunk freed at {at:#x} came back at {again:#x}",
                    g.id
                );
                let bad = nonzero_ends(&d, g.id, b, r, ps)?;
                check!(
                    bad == 0,
                    "GPU {}: {bad} old bytes in a new {ps}-byte chunk at {again:#x}, the one before written {how:?}",
                    g.id
                );
                d.mem_free(b).ctx("free")?;
            }
        }
        // A 64 KiB slot known zero; split into 4 KiB chunks, one written and one not.
        let a = d.vidmem_alloc(g.id, 64 * K, 64 * K, 0).ctx("alloc")?.handle;
        d.mem_free(a).ctx("free")?;
        let x = d
            .vidmem_alloc(g.id, 4 * K, 4 * K, 0)
            .ctx("alloc 4K")?
            .handle;
        let y = d
            .vidmem_alloc(g.id, 4 * K, 4 * K, 0)
            .ctx("alloc 4K")?
            .handle;
        write_vid(&d, g.id, y, s, 4 * K, Write::Engine)?;
        let at = d.gpu_phys(y, g.id, 0, 1).ctx("GPU_PHYS")?.0;
        d.mem_free(y).ctx("free")?;
        d.mem_free(x).ctx("free")?;
        let b = d
            .vidmem_alloc(g.id, 64 * K, 64 * K, 0)
            .ctx("alloc 64K")?
            .handle;
        let base = d.gpu_phys(b, g.id, 0, 1).ctx("GPU_PHYS")?.0;
        check!(
            base + 4 * K == at,
            "GPU {}: the 4 KiB chunk at {at:#x} is not the second of the 64 KiB one at {base:#x}",
            g.id
        );
        // The written 4 KiB chunk's ends, at 4 KiB in the new chunk.
        let bad = nonzero_ends(&d, g.id, b, r, 8 * K)?;
        check!(
            bad == 0,
            "GPU {}: {bad} old bytes of a written 4 KiB chunk in a new 64 KiB chunk",
            g.id
        );
        d.mem_free(b).ctx("free")?;
        for h in [s, r] {
            d.mem_free(h).ctx("free")?;
        }
        check_idle(&d, g.id, "after")?;
    }
    Ok(())
}

pub(super) fn vidmem_ce_round_trip_through_vidmem() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = engine_gpus(&d)?;
    const SIZES: [(u64, u64); 3] = [(12 * K, 4 * K), (192 * K, 64 * K), (4 * M, 2 * M)];
    for (i, g) in gpus.iter().enumerate() {
        // Every size on the first GPU; one on the others (an edu transfer costs 100 ms).
        let sizes = if i == 0 { &SIZES[..] } else { &SIZES[1..2] };
        for &(size, ps) in sizes {
            let seed = size ^ u64::from(g.id);
            let src = d.mem_alloc(size, 0, 0).ctx("alloc src")?.handle;
            let dst = d
                .mem_alloc(size, 0, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
                .ctx("alloc dst")?
                .handle;
            let vid = d.vidmem_alloc(g.id, size, ps, 0).ctx("alloc vidmem")?;
            for h in [src, dst] {
                d.map_kernel(h).ctx("map kernel")?;
                d.mem_gpu(true, h, g.id).ctx("map gpu")?;
            }
            let fill = uapi::ruvm_mem_fill {
                handle: src,
                length: size,
                seed,
                ..Default::default()
            };
            d.mem_fill(false, fill).ctx("CPU writes the pattern")?;
            // The start and end of every vidmem chunk, and a piece across the first chunk
            // boundary (split by the engine at the boundary).
            let mut pieces = Vec::new();
            for c in 0..vid.chunk_count {
                let base = c * ps;
                pieces.push((base, 2000.min(ps)));
                if ps > 4000 {
                    pieces.push((base + ps - 2000, 2000));
                }
            }
            pieces.push((ps - 1000, 2500));
            pieces.sort_unstable();
            pieces.dedup();
            for &(off, len) in &pieces {
                ce(&d, g.id, vid.handle, src, off, len)?;
            }
            for &(off, len) in &pieces {
                ce(&d, g.id, dst, vid.handle, off, len)?;
            }
            // Every byte the pieces covered came back; every other byte is still 0, and a
            // stretch of vidmem nobody wrote reads as zeros (vidmem is zeroed).
            let mut copied = vec![false; size as usize];
            for &(off, len) in &pieces {
                copied[off as usize..(off + len) as usize].fill(true);
            }
            let q = d.mem_query(dst).ctx("query")?;
            let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
            for (o, &c) in copied.iter().enumerate() {
                let want = if c {
                    pattern::byte_at(seed, o as u64)
                } else {
                    0
                };
                let got = map.read(o);
                check!(
                    got == want,
                    "GPU {}, {ps} chunks: byte {o:#x} is {got:#x} after the round trip, wanted {want:#x}",
                    g.id
                );
            }
            drop(map);
            let gap = 2000.min(ps / 2);
            if ps > 4 * gap {
                d.mem_fill(
                    false,
                    uapi::ruvm_mem_fill {
                        handle: dst,
                        offset: 2 * gap,
                        length: gap,
                        kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
                        seed: 0xee,
                        ..Default::default()
                    },
                )
                .ctx("scribble")?;
                ce(&d, g.id, dst, vid.handle, 2 * gap, gap)?;
                let r = d
                    .mem_fill(
                        true,
                        uapi::ruvm_mem_fill {
                            handle: dst,
                            offset: 2 * gap,
                            length: gap,
                            kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
                            seed: 0,
                            ..Default::default()
                        },
                    )
                    .ctx("verify zeros")?;
                check!(
                    r.mismatches == 0,
                    "unwritten vidmem is not zero: {} bytes",
                    r.mismatches
                );
            }
            for h in [src, dst, vid.handle] {
                d.mem_free(h).ctx("free")?;
            }
        }
        // A freed chunk is scrubbed: the next mem on the same memory reads zeros.
        let a = d.vidmem_alloc(g.id, 4 * K, 0, 0).ctx("alloc")?.handle;
        let s = d.mem_alloc(4 * K, 0, 0).ctx("alloc")?.handle;
        d.map_kernel(s).ctx("map")?;
        d.mem_gpu(true, s, g.id).ctx("map gpu")?;
        d.mem_fill(
            false,
            uapi::ruvm_mem_fill {
                handle: s,
                length: 4 * K,
                seed: 9,
                ..Default::default()
            },
        )
        .ctx("fill")?;
        ce(&d, g.id, a, s, 0, 2000)?;
        let phys = d.gpu_phys(a, g.id, 0, 1).ctx("phys")?.0;
        d.mem_free(a).ctx("free vidmem")?;
        let b = d.vidmem_alloc(g.id, 4 * K, 0, 0).ctx("alloc again")?.handle;
        let again = d.gpu_phys(b, g.id, 0, 1).ctx("phys")?.0;
        ce(&d, g.id, s, b, 0, 2000)?;
        let r = d
            .mem_fill(
                true,
                uapi::ruvm_mem_fill {
                    handle: s,
                    length: 2000,
                    kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
                    seed: 0,
                    ..Default::default()
                },
            )
            .ctx("verify")?;
        check!(
            r.mismatches == 0,
            "GPU {}: a new vidmem mem (at {again:#x}, the old one at {phys:#x}) holds {} old bytes",
            g.id,
            r.mismatches
        );
        d.mem_free(b).ctx("free")?;
        d.mem_free(s).ctx("free")?;
        check_idle(&d, g.id, "after the copies")?;
    }
    Ok(())
}
