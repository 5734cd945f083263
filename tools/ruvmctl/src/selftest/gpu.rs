// SPDX-License-Identifier: GPL-2.0

//! The GPU registry: ruvm's test GPUs (QEMU edu devices) as sysfs sees them, and across unbind
//! and rebind.

use nix::errno::Errno;

use nix::unistd::{setuid, Uid};

use super::harness::{check, child_checks, expect_errno, Case, Context, Stop, TestResult};
use libruvm::{pci_name, uapi, Ruvm, UserMap};

use crate::pattern;

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "gpu_list_matches_sysfs",
            run: gpu_list_matches_sysfs,
        },
        Case {
            name: "gpu_unbind_and_rebind_keep_the_id",
            run: gpu_unbind_and_rebind_keep_the_id,
        },
        Case {
            name: "gpu_list_bad_inputs",
            run: gpu_list_bad_inputs,
        },
        Case {
            name: "gpu_dma_map_is_idempotent_and_in_the_window",
            run: gpu_dma_map_is_idempotent_and_in_the_window,
        },
        Case {
            name: "gpu_dma_bad_inputs",
            run: gpu_dma_bad_inputs,
        },
        Case {
            name: "gpu_dma_free_while_mapped_everywhere",
            run: gpu_dma_free_while_mapped_everywhere,
        },
        Case {
            name: "gpu_dma_unbind_while_mapped",
            run: gpu_dma_unbind_while_mapped,
        },
        Case {
            name: "gpu_ce_copy_moves_bytes_both_ways",
            run: gpu_ce_copy_moves_bytes_both_ways,
        },
        Case {
            name: "gpu_two_gpus_two_address_spaces",
            run: gpu_two_gpus_two_address_spaces,
        },
        Case {
            name: "gpu_ce_copy_bad_inputs",
            run: gpu_ce_copy_bad_inputs,
        },
        Case {
            name: "gpu_iommu_faults_after_unmap",
            run: gpu_iommu_faults_after_unmap,
        },
        Case {
            name: "gpu_sim_faults_after_unmap",
            run: gpu_sim_faults_after_unmap,
        },
        Case {
            name: "gpu_host_gpu_maps_without_binding",
            run: gpu_host_gpu_maps_without_binding,
        },
        Case {
            name: "gpu_host_detach_drops_tables_and_attach_keeps_the_id",
            run: gpu_host_detach_drops_tables_and_attach_keeps_the_id,
        },
        Case {
            name: "gpu_attach_bad_inputs",
            run: gpu_attach_bad_inputs,
        },
        Case {
            name: "gpu_attach_into_a_full_registry",
            run: gpu_attach_into_a_full_registry,
        },
        Case {
            name: "gpu_attach_unbound_edu_keeps_ruvm_edu_off_it",
            run: gpu_attach_unbound_edu_keeps_ruvm_edu_off_it,
        },
    ]
}

pub(super) const DRIVER: &str = "/sys/bus/pci/drivers/ruvm-edu";

/// The edu devices of the machine, by PCI address, from sysfs.
fn edu_devices() -> Result<Vec<String>, Stop> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/sys/bus/pci/devices").ctx("/sys/bus/pci/devices")? {
        let p = e.ctx("readdir")?.path();
        let read = |f: &str| {
            std::fs::read_to_string(p.join(f))
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        if read("vendor") == "0x1234" && read("device") == "0x11e8" {
            v.push(
                p.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
        }
    }
    v.sort();
    Ok(v)
}

fn present(g: &uapi::ruvm_gpu_info) -> bool {
    g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
}

/// Bound by ruvm's edu driver (so it can be unbound through it, and has an engine).
pub(super) fn bound_edu(g: &uapi::ruvm_gpu_info) -> bool {
    present(g) && g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU
}

/// Present, with a copy engine (an edu GPU or a simulated one).
fn has_engine(g: &uapi::ruvm_gpu_info) -> bool {
    present(g) && g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE != 0
}

/// A present simulated GPU.
pub(super) fn sim(g: &uapi::ruvm_gpu_info) -> bool {
    present(g) && g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM
}

fn gpu_list_matches_sysfs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let want = edu_devices()?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    if want.is_empty() && gpus.is_empty() {
        return Err(Stop::Skip("no GPUs in this machine".into()));
    }
    // Every edu device is a GPU: bound by ruvm-edu, or named as a host GPU.
    let mut got: Vec<String> = gpus
        .iter()
        .filter(|g| present(g) && g.kind != uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM)
        .map(pci_name)
        .collect();
    got.sort();
    check!(
        got == want,
        "registry lists {got:?}, sysfs has edu devices {want:?}"
    );
    let mut ids: Vec<u32> = gpus.iter().map(|g| g.id).collect();
    ids.sort_unstable();
    ids.dedup();
    check!(
        ids.len() == gpus.len(),
        "ids are not unique: {:?}",
        gpus.iter().map(|g| g.id).collect::<Vec<_>>()
    );
    let mut groups = Vec::new();
    for g in &gpus {
        check!(
            g.page_sizes == (4 << 10) | (64 << 10) | (2 << 20),
            "GPU {} page sizes {:#x}",
            g.id,
            g.page_sizes
        );
        let name = pci_name(g);
        let bound = std::path::Path::new(&format!("{DRIVER}/{name}")).exists();
        let engine = g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE != 0;
        if g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM {
            // A faux device with the CPU as its engine, 47-bit DMA, no PCI address, no IOMMU.
            let faux = format!("/sys/bus/faux/devices/ruvm-sim{}", g.pci_devfn);
            check!(
                std::path::Path::new(&faux).exists()
                    && engine
                    && g.dma_mask_bits == 47
                    && (g.vendor, g.device, g.pci_bus) == (0, 0, 0),
                "simulated GPU {}: {faux} exists {}, engine {engine}, DMA {} bits",
                g.id,
                std::path::Path::new(&faux).exists(),
                g.dma_mask_bits
            );
            continue;
        }
        check!(
            g.kind != uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU
                || (g.vendor, g.device) == (0x1234, 0x11e8),
            "edu GPU {} is {:04x}:{:04x}",
            g.id,
            g.vendor,
            g.device
        );
        match g.kind {
            // Bound by ruvm's driver, with edu's engine and 28-bit DMA.
            uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU => {
                check!(
                    bound && engine && g.dma_mask_bits == 28,
                    "edu GPU {}: bound {bound}, engine {engine}, DMA {} bits",
                    g.id,
                    g.dma_mask_bits
                );
            }
            // Named by host_gpus: not bound, no engine, the device's own DMA mask.
            uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST => {
                check!(
                    !bound && !engine && g.dma_mask_bits >= 28,
                    "host GPU {}: bound {bound}, engine {engine}, DMA {} bits",
                    g.id,
                    g.dma_mask_bits
                );
            }
            k => return Err(Stop::Fail(format!("GPU {} has kind {k}", g.id))),
        }

        // Each in its own IOMMU group.
        let group = std::fs::read_link(format!("/sys/bus/pci/devices/{name}/iommu_group"))
            .ctx("iommu_group")?;
        groups.push(group);
    }
    let n = groups.len();
    groups.sort();
    groups.dedup();
    check!(groups.len() == n, "GPUs share an IOMMU group");
    Ok(())
}

fn gpu_unbind_and_rebind_keep_the_id() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = d.gpus().ctx("GPU_LIST")?;
    let Some(g) = before.iter().find(|g| bound_edu(g)) else {
        return Err(Stop::Skip("no GPU bound by ruvm-edu".into()));
    };
    let name = pci_name(g);
    std::fs::write(format!("{DRIVER}/unbind"), &name).ctx("unbind")?;
    let gone = d.gpus().ctx("GPU_LIST after unbind");
    let rebind = std::fs::write(format!("{DRIVER}/bind"), &name).ctx("bind");
    let gone = gone?;
    rebind?;
    let e = gone
        .iter()
        .find(|x| x.id == g.id)
        .ok_or(Stop::Fail("GPU left the registry on unbind".into()))?;
    check!(!present(e), "GPU {} still present after unbind", g.id);
    check!(
        gone.len() == before.len(),
        "the registry changed size on unbind"
    );
    let back = d.gpus().ctx("GPU_LIST after bind")?;
    let e = back
        .iter()
        .find(|x| pci_name(x) == name)
        .ok_or(Stop::Fail("GPU missing after bind".into()))?;
    check!(
        present(e) && e.id == g.id,
        "after rebind: id {} present {} (was id {})",
        e.id,
        present(e),
        g.id
    );
    check!(back.len() == before.len(), "rebind added an entry");
    Ok(())
}

fn gpu_list_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let total = d.gpus().ctx("GPU_LIST")?.len() as u32;
    // Unknown flags and non-zero reserved fields: the ABI table (`abi_*`).
    // No room: only the count comes back.
    let mut a = uapi::ruvm_gpu_list::default();
    d.call(libruvm::cmd::GPU_LIST, &mut a).ctx("count only")?;
    check!(
        a.count == total,
        "count {} with no room, {total} GPUs",
        a.count
    );
    if total == 0 {
        return Ok(());
    }
    // Room for one: one entry written, nothing past it, the full count reported.
    let mut v = vec![
        uapi::ruvm_gpu_info {
            id: 0xdead,
            ..Default::default()
        };
        2
    ];
    let mut a = uapi::ruvm_gpu_list {
        count: 1,
        gpus: v.as_mut_ptr() as u64,
        ..Default::default()
    };
    d.call(libruvm::cmd::GPU_LIST, &mut a).ctx("room for one")?;
    check!(
        a.count == total && v[0].id != 0xdead && v[1].id == 0xdead,
        "room for one: count {}, ids {} {}",
        a.count,
        v[0].id,
        v[1].id
    );
    // An array that is not memory.
    let mut a = uapi::ruvm_gpu_list {
        count: 4,
        gpus: 8,
        ..Default::default()
    };
    expect_errno(
        d.call(libruvm::cmd::GPU_LIST, &mut a),
        Errno::EFAULT,
        "array at an unmapped address",
    )
}

const DMA_MAPPINGS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS as usize;
const DMA_BYTES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_DMA_BYTES as usize;

/// The ids of the GPUs that `keep` accepts; skips the case (saying `none`) without any.
fn gpu_ids(d: &Ruvm, keep: fn(&uapi::ruvm_gpu_info) -> bool, none: &str) -> Result<Vec<u32>, Stop> {
    let ids: Vec<u32> = d
        .gpus()
        .ctx("GPU_LIST")?
        .iter()
        .filter(|g| keep(g))
        .map(|g| g.id)
        .collect();
    if ids.is_empty() {
        return Err(Stop::Skip(none.into()));
    }
    Ok(ids)
}

/// The ids of the bound GPUs with a copy engine.
fn engine_gpus(d: &Ruvm) -> Result<Vec<u32>, Stop> {
    gpu_ids(d, has_engine, "no GPU with a copy engine")
}

/// The ids of the bound GPUs.
fn bound_gpus(d: &Ruvm) -> Result<Vec<u32>, Stop> {
    gpu_ids(d, present, "no GPU bound")
}

pub(super) fn dma_live(d: &Ruvm) -> Result<(u64, u64), Stop> {
    let a = d.audit(false).ctx("AUDIT")?;
    Ok((a.live[DMA_MAPPINGS], a.live[DMA_BYTES]))
}

fn gpu_dma_map_is_idempotent_and_in_the_window() -> TestResult {
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

fn gpu_dma_bad_inputs() -> TestResult {
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

fn gpu_dma_free_while_mapped_everywhere() -> TestResult {
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

fn gpu_dma_unbind_while_mapped() -> TestResult {
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

/// The pieces a sampled copy moves: the start and the end of every chunk (`len` bytes each, or
/// the whole chunk when it is small).
fn samples(chunk: u64, chunks: u64, len: u64) -> Vec<(u64, u64)> {
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

fn gpu_ce_copy_moves_bytes_both_ways() -> TestResult {
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
fn gpu_two_gpus_two_address_spaces() -> TestResult {
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

fn gpu_ce_copy_bad_inputs() -> TestResult {
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
fn iommu_fault_after(mark: &str, bdf: &str, addr: u64) -> Result<bool, Stop> {
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

fn gpu_iommu_faults_after_unmap() -> TestResult {
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
fn sim_fault_after(mark: &str, addr: u64) -> Result<bool, Stop> {
    let log = crate::kmsg::read_kmsg().ctx("kmsg")?;
    let part = crate::kmsg::since(&log, Some(mark)).ok_or(Stop::Fail("marker lost".into()))?;
    let needle = format!("sim GPU: DMA fault at {addr:#x}+");
    Ok(part.iter().any(|m| m.contains(&needle)))
}

fn gpu_sim_faults_after_unmap() -> TestResult {
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

/// A GPU's PCI address for `RUVM_IOCTL_GPU_ATTACH`: (domain, bus, devfn).
fn pci_of(g: &uapi::ruvm_gpu_info) -> (u32, u8, u8) {
    (g.pci_domain, g.pci_bus, g.pci_devfn)
}

fn gpu_host_detach_drops_tables_and_attach_keeps_the_id() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let Some(g) = gpus
        .iter()
        .find(|g| g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST && present(g))
    else {
        return Err(Stop::Skip("no host GPU (load with host_gpus=...)".into()));
    };
    let (dom, bus, devfn) = pci_of(g);
    let before = dma_live(&d)?;
    let a = d.mem_alloc(3 << 20, 64 << 10, 0).ctx("alloc")?;
    d.mem_gpu(true, a.handle, g.id).ctx("map on the host GPU")?;
    expect_errno(
        d.gpu_attach(true, dom, bus, devfn),
        Errno::EEXIST,
        "attach of an attached host GPU",
    )?;
    // Detached while mapped: its table goes, the mem stays good.
    let id = d.gpu_attach(false, dom, bus, devfn).ctx("detach")?;
    check!(id == g.id, "detach returned id {id}, the GPU is {}", g.id);
    let gone = d.gpus().ctx("GPU_LIST after detach")?;
    let e = gone.iter().find(|x| x.id == g.id);
    check!(
        e.is_some_and(|e| !present(e) && e.dma_mapped_bytes == 0),
        "after detach the registry shows {e:?}"
    );
    check!(
        d.mem_query(a.handle).ctx("query")?.mapped_gpus & (1 << g.id) == 0,
        "the mem is still mapped for the detached GPU"
    );
    check!(
        dma_live(&d)?.0 == before.0,
        "the detached GPU's mappings are still counted"
    );
    expect_errno(
        d.mem_gpu(true, a.handle, g.id),
        Errno::ENODEV,
        "map on the detached GPU",
    )?;
    expect_errno(
        d.gpu_attach(false, dom, bus, devfn),
        Errno::ENOENT,
        "detach of a detached GPU",
    )?;
    // Attached again: the same id, usable.
    let id = d.gpu_attach(true, dom, bus, devfn).ctx("attach again")?;
    check!(id == g.id, "attach gave id {id}, the GPU was {}", g.id);
    d.mem_gpu(true, a.handle, g.id).ctx("map after attach")?;
    check!(
        d.dma_addrs(a.handle, g.id, 0, 100).ctx("addrs")?.len() == 3 << 4,
        "the table after attach has another size"
    );
    d.mem_free(a.handle).ctx("free")?;
    check!(dma_live(&d)?.0 == before.0, "mappings left after the free");
    Ok(())
}

/// A PCI device in no IOMMU group, if the machine has one.
fn pci_without_iommu_group() -> Option<(u32, u8, u8)> {
    for e in std::fs::read_dir("/sys/bus/pci/devices").ok()?.flatten() {
        let name = e.file_name().into_string().ok()?;
        if e.path().join("iommu_group").exists() {
            continue;
        }
        if let Ok(a) = crate::cmd::gpu::parse_pci(&name) {
            return Some(a);
        }
    }
    None
}

fn gpu_attach_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    check!(
        info.features & u64::from(uapi::RUVM_FEATURE_GPU_ATTACH) != 0,
        "RUVM_FEATURE_GPU_ATTACH not reported"
    );
    let before = d.gpus().ctx("GPU_LIST")?;
    expect_errno(
        d.gpu_attach(true, 0x1_0000, 0, 0),
        Errno::EINVAL,
        "domain 0x10000",
    )?;
    expect_errno(
        d.gpu_attach(false, 0x1_0000, 0, 0),
        Errno::EINVAL,
        "detach, domain 0x10000",
    )?;
    expect_errno(
        d.gpu_attach(true, 0, 0xff, 0xff),
        Errno::ENODEV,
        "no device at 0000:ff:1f.7",
    )?;
    expect_errno(
        d.gpu_attach(false, 0, 0xff, 0xff),
        Errno::ENOENT,
        "detach of 0000:ff:1f.7",
    )?;
    // A GPU ruvm's own driver bound: already there, and not a host GPU to detach.
    for g in before.iter().filter(|g| bound_edu(g)) {
        let (dom, bus, devfn) = pci_of(g);
        expect_errno(
            d.gpu_attach(true, dom, bus, devfn),
            Errno::EEXIST,
            "attach of an edu GPU",
        )?;
        expect_errno(
            d.gpu_attach(false, dom, bus, devfn),
            Errno::ENOENT,
            "detach of an edu GPU",
        )?;
    }
    match pci_without_iommu_group() {
        Some((dom, bus, devfn)) => expect_errno(
            d.gpu_attach(true, dom, bus, devfn),
            Errno::ENXIO,
            "attach of a device in no IOMMU group",
        )?,
        None => println!("# every PCI device here is in an IOMMU group: ENXIO not reachable"),
    }
    check!(
        d.gpus().ctx("GPU_LIST")?.len() == before.len(),
        "a refused attach changed the registry"
    );
    // Without CAP_SYS_ADMIN, EPERM before the arguments are looked at.
    child_checks("an unprivileged attach was not refused with EPERM", || {
        setuid(Uid::from_raw(65534)).is_ok()
            && d.gpu_attach(true, 0x1_0000, 0, 0) == Err(Errno::EPERM)
            && d.gpu_attach(false, 0, 0, 0) == Err(Errno::EPERM)
    })
}

/// A registry holding `RUVM_MAX_GPUS` GPUs (the run with 24 edu and 8 simulated GPUs) refuses
/// an attach with `ENOSPC`, says so in its error line, and lists the same GPUs after. Skips
/// while there is room.
fn gpu_attach_into_a_full_registry() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = d.gpus().ctx("GPU_LIST")?;
    let max = uapi::RUVM_MAX_GPUS as usize;
    if before.len() < max {
        return Err(Stop::Skip(format!(
            "the registry holds {} of {max} GPUs",
            before.len()
        )));
    }
    // A PCI device that is no GPU of ruvm's and could otherwise be attached (it has an IOMMU
    // group).
    let ours: Vec<_> = before
        .iter()
        .filter(|g| g.kind != uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM)
        .map(pci_of)
        .collect();
    let other = std::fs::read_dir("/sys/bus/pci/devices")
        .ctx("/sys/bus/pci/devices")?
        .flatten()
        .filter(|e| e.path().join("iommu_group").exists())
        .filter_map(|e| e.file_name().into_string().ok())
        .find_map(|name| {
            let a = crate::cmd::gpu::parse_pci(&name).ok()?;
            (!ours.contains(&a)).then_some((name, a))
        });
    let Some((name, (dom, bus, devfn))) = other else {
        return Err(Stop::Skip("no PCI device here but ruvm's GPUs".into()));
    };
    let mark = crate::kmsg::write_marker().ctx("mark")?;
    expect_errno(
        d.gpu_attach(true, dom, bus, devfn),
        Errno::ENOSPC,
        &format!("attach of {name} with {max} GPUs registered"),
    )?;
    let log = crate::kmsg::read_kmsg().ctx("kmsg")?;
    let part = crate::kmsg::since(&log, Some(&mark)).ok_or(Stop::Fail("marker lost".into()))?;
    let line = format!("host GPU {name}: the GPU registry is full");
    check!(
        part.iter().any(|m| m.contains(&line)),
        "no '{line}' line after the refused attach"
    );
    let after = d.gpus().ctx("GPU_LIST")?;
    check!(
        after.len() == before.len()
            && after
                .iter()
                .zip(&before)
                .all(|(a, b)| a.id == b.id && a.kind == b.kind),
        "a refused attach changed the registry"
    );
    Ok(())
}

/// An edu device unbound from ruvm-edu and attached as a host GPU: ruvm-edu cannot bind it
/// while it is attached (`EEXIST`, one GPU per device), and binds it again, with its old id,
/// once it is detached.
fn gpu_attach_unbound_edu_keeps_ruvm_edu_off_it() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = d.gpus().ctx("GPU_LIST")?;
    let Some(g) = before.iter().find(|g| bound_edu(g)) else {
        return Err(Stop::Skip("no GPU bound by ruvm-edu".into()));
    };
    if before.len() >= uapi::RUVM_MAX_GPUS as usize {
        // Attached as a host GPU, the device needs an entry of its own.
        return Err(Stop::Skip("the GPU registry is full".into()));
    }
    let name = pci_name(g);
    let (dom, bus, devfn) = pci_of(g);
    std::fs::write(format!("{DRIVER}/unbind"), &name).ctx("unbind")?;
    let attached = (|| -> TestResult {
        let h = d
            .gpu_attach(true, dom, bus, devfn)
            .ctx("attach of the unbound edu device")?;
        check!(h != g.id, "the host GPU took the edu GPU's id {h}");
        let list = d.gpus().ctx("GPU_LIST while attached")?;
        let host = list.iter().find(|x| x.id == h);
        check!(
            host.is_some_and(|x| present(x) && x.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST),
            "the attached device is listed as {host:?}"
        );
        let edu = list.iter().find(|x| x.id == g.id);
        check!(
            edu.is_some_and(|x| !present(x)),
            "the unbound edu GPU is listed as {edu:?}"
        );
        // ruvm-edu may not take the device while it is a host GPU.
        let bind = std::fs::write(format!("{DRIVER}/bind"), &name);
        check!(
            bind.as_ref().err().and_then(std::io::Error::raw_os_error)
                == Some(Errno::EEXIST as i32),
            "binding ruvm-edu to an attached host GPU: {bind:?}"
        );
        let key = |v: &[uapi::ruvm_gpu_info]| -> Vec<(u32, u32, u32)> {
            v.iter().map(|x| (x.id, x.kind, x.flags)).collect()
        };
        let after = d.gpus().ctx("GPU_LIST after the refused bind")?;
        check!(
            key(&after) == key(&list),
            "a refused bind changed the registry: {after:?}"
        );
        // The host GPU works meanwhile.
        let a = d.mem_alloc(192 << 10, 64 << 10, 0).ctx("alloc")?;
        d.mem_gpu(true, a.handle, h).ctx("map on the host GPU")?;
        check!(
            d.dma_addrs(a.handle, h, 0, 8).ctx("addrs")?.len() == 3,
            "the host GPU's table does not have 3 chunks"
        );
        d.mem_free(a.handle).ctx("free")?;
        let id = d.gpu_attach(false, dom, bus, devfn).ctx("detach")?;
        check!(id == h, "detach returned id {id}, the host GPU is {h}");
        Ok(())
    })();
    // Whatever happened: detached (if it still is attached) and bound again.
    let _ = d.gpu_attach(false, dom, bus, devfn);
    let rebind = std::fs::write(format!("{DRIVER}/bind"), &name).ctx("bind after detach");
    attached?;
    rebind?;
    let back = d.gpus().ctx("GPU_LIST after bind")?;
    let e = back.iter().find(|x| x.id == g.id);
    check!(
        e.is_some_and(bound_edu),
        "after detach and bind the edu GPU is {e:?}"
    );
    Ok(())
}

fn gpu_host_gpu_maps_without_binding() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let hosts: Vec<&uapi::ruvm_gpu_info> = gpus
        .iter()
        .filter(|g| g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST)
        .collect();
    if hosts.is_empty() {
        return Err(Stop::Skip("no host GPU (load with host_gpus=...)".into()));
    }
    for g in hosts {
        check!(present(g), "host GPU {} not present", g.id);
        let name = pci_name(g);
        let driver = std::fs::read_link(format!("/sys/bus/pci/devices/{name}/driver")).ok();
        check!(
            driver.is_none(),
            "host GPU {name} is bound to {driver:?}: ruvm must not bind it"
        );
        let a = d.mem_alloc(3 << 20, 2 << 20, 0).ctx("alloc")?;
        d.mem_gpu(true, a.handle, g.id).ctx("map on the host GPU")?;
        let addrs = d.dma_addrs(a.handle, g.id, 0, 16).ctx("addrs")?;
        let limit = if g.dma_mask_bits >= 64 {
            u64::MAX
        } else {
            (1u64 << g.dma_mask_bits) - 1
        };
        check!(
            addrs.len() == 2 && addrs.iter().all(|&x| x + (2 << 20) - 1 <= limit),
            "addresses {addrs:x?} for a {}-bit device",
            g.dma_mask_bits
        );
        let b = d.mem_alloc(4096, 0, 0).ctx("alloc")?.handle;
        d.mem_gpu(true, b, g.id).ctx("map b")?;
        expect_errno(
            d.ce_copy(g.id, b, 0, a.handle, 0, 16),
            Errno::ENODEV,
            "copy with a host GPU (no engine)",
        )?;
        d.mem_free(a.handle).ctx("free")?;
        d.mem_free(b).ctx("free")?;
        let after = d
            .gpus()
            .ctx("GPU_LIST")?
            .into_iter()
            .find(|x| x.id == g.id)
            .map_or(1, |x| x.dma_mapped_bytes);
        check!(
            after == 0,
            "host GPU {} still reports {after} bytes mapped",
            g.id
        );
    }
    Ok(())
}
