// SPDX-License-Identifier: GPL-2.0

//! The fault-injection sweep (kernels with `CONFIG_FAULT_INJECTION`: the debug flavour): for
//! each scenario, every failable allocation the kernel makes while ruvm serves it fails once in
//! turn (`/proc/thread-self/fail-nth`, with failslab and fail_page_alloc set to fail
//! `GFP_KERNEL` and order-0 allocations too). After each, the call must have failed with
//! `ENOMEM` (or succeeded, when the failure was absorbed), and ruvm's state must be exactly as
//! before: the audit's counters, every PMM's statistics, every GPU's DMA-mapped bytes. The
//! kernel log must stay clean (the runner checks KASAN, lockdep, WARN). A scenario ends at the
//! first `n` its call does not reach; the case prints how many sites each scenario failed.

use std::fs;

use libruvm::{self as dev, op, uapi, Ruvm};
use nix::errno::Errno;

use super::{
    gpu::sim,
    harness::{cases, check, Case, Context, Stop, TestResult},
};

mod injector;
mod load;
use injector::Injector;
use load::fault_sweep_module_load;

pub fn cases() -> Vec<Case> {
    cases![fault_sweep_ioctls, fault_sweep_module_load,]
}

/// What must not change when a call fails: the audit's counters, the PMMs, the GPUs' mapped
/// bytes, every pool's attributes (but its hit and miss counts).
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    live: Vec<u64>,
    pmms: Vec<(u32, u64, [u64; 3], u64)>,
    mapped: Vec<(u32, u64)>,
    pools: Vec<String>,
}

/// Every pool's line of `/sys/kernel/debug/ruvm/pools`, without its hit and miss counts.
fn pool_lines() -> Vec<String> {
    fs::read_to_string("/sys/kernel/debug/ruvm/pools")
        .unwrap_or_default()
        .lines()
        .map(|l| {
            l.split_whitespace()
                .filter(|f| !f.starts_with("hits=") && !f.starts_with("misses="))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn snapshot(d: &Ruvm) -> Result<Snapshot, Stop> {
    let live = d.audit(false).ctx("AUDIT")?.live.to_vec();
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let mut pmms = Vec::new();
    let mut mapped = Vec::new();
    for g in gpus
        .iter()
        .filter(|g| g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0)
    {
        mapped.push((g.id, g.dma_mapped_bytes));
        if g.vidmem_size > 0 {
            let s = d.pmm_stats(g.id).ctx("PMM_STATS")?;
            pmms.push((g.id, s.free, s.allocated, s.roots_stored));
        }
    }
    Ok(Snapshot {
        live,
        pmms,
        mapped,
        pools: pool_lines(),
    })
}

/// What undoes a call that succeeded.
type Undo<'a> = Box<dyn FnOnce() -> TestResult + 'a>;

/// One scenario: `op` is the call under test; on success it returns what undoes it.
struct Scenario<'a> {
    name: String,
    op: Box<dyn FnMut() -> Result<Undo<'a>, Errno> + 'a>,
}

/// Fails each allocation of `s` in turn; returns how many sites it failed.
fn sweep(d: &Ruvm, inj: &Injector, s: &mut Scenario<'_>) -> Result<u32, Stop> {
    const MAX_SITES: u32 = 5000;
    // Once without a failure first, so that what a successful call leaves cached for reuse
    // (kept vidmem storage) is there before as after.
    if let Ok(undo) = (s.op)() {
        undo()?;
    }
    for n in 1..=MAX_SITES {
        let before = snapshot(d)?;
        let (r, reached) = inj.with_nth(n, &mut s.op)?;
        match r {
            Ok(undo) => undo()?,
            Err(Errno::ENOMEM) => {}
            Err(e) => {
                return Err(Stop::Fail(format!(
                    "{}: with allocation {n} failing the call failed with {e}, wanted ENOMEM",
                    s.name
                )))
            }
        }
        let after = snapshot(d)?;
        check!(
            after == before,
            "{}: allocation {n} failing changed ruvm's state:\n# before {before:?}\n# after  {after:?}",
            s.name
        );
        if !reached {
            return Ok(n - 1);
        }
    }
    Err(Stop::Fail(format!(
        "{}: still failing allocations after {MAX_SITES}",
        s.name
    )))
}

/// Boxes an undo step.
fn undo<'a>(f: impl FnOnce() -> TestResult + 'a) -> Undo<'a> {
    Box::new(f)
}

fn fault_sweep_ioctls() -> TestResult {
    let inj = Injector::new()?;
    let dev = Ruvm::open().ctx("open")?;
    let d = &dev;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let present: Vec<&uapi::ruvm_gpu_info> = gpus
        .iter()
        .filter(|g| g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0)
        .collect();
    let free = move |h: u64| d.mem_free(h).ctx("free");
    // IPC pools: an exportable pool with a mem, exported, and a second file importing both.
    let ipc = d
        .pool_create_flags(0, 0, uapi::ruvm_pool_create_flags_RUVM_POOL_EXPORTABLE)
        .ctx("POOL_CREATE exportable")?
        .0;
    let shared = d.pool_alloc(ipc, 64 << 10, 0).ctx("alloc")?.handle;
    let (_, data) = d.mem_export(shared).ctx("MEM_EXPORT")?;
    let ipc_fd = d.pool_export(ipc).ctx("POOL_EXPORT")?;
    let importer = Ruvm::open().ctx("open a second file")?;
    let imp = &importer;
    // A third file for the pool's import itself (the second keeps its import throughout).
    let importer2 = Ruvm::open().ctx("open a third file")?;
    let imp2 = &importer2;
    let ipc_fd_ref = &ipc_fd;
    let ip = importer
        .pool_import(std::os::fd::AsFd::as_fd(&ipc_fd))
        .ctx("POOL_IMPORT")?;
    let mut scenarios: Vec<Scenario<'_>> = Vec::new();
    for order in 0..=9u32 {
        let chunk = 4096u64 << order;
        scenarios.push(Scenario {
            name: format!("sysmem alloc, {}K chunks", chunk >> 10),
            op: Box::new(move || {
                let a = d.mem_alloc(1 << 20, chunk, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)?;
                Ok(undo(move || free(a.handle)))
            }),
        });
    }
    // A mem mapped into the caller by its allocation (the mapping's own allocations too).
    scenarios.push(Scenario {
        name: "sysmem alloc mapped into the caller".into(),
        op: Box::new(move || {
            let map = uapi::ruvm_alloc_flags_RUVM_ALLOC_MAP_USER;
            let a = d.mem_alloc(64 << 10, 0, map)?;
            Ok(undo(move || free(a.handle)))
        }),
    });
    // Registered memory: a region of this process's, its pages faulted in first (what the
    // kernel allocates for a page fault is not ruvm's), registered and unregistered.
    let mut region = Vec::new();
    let region_ptr = if d.info().ctx("INFO")?.features & u64::from(uapi::RUVM_FEATURE_REGISTER) != 0
    {
        // Page-aligned room for 16 pages inside a 17-page vector, all written once.
        region = vec![1u8; 17 << 12];
        let at = region.as_mut_ptr() as u64;
        Some((at + 4095) & !4095)
    } else {
        None
    };
    if let Some(at) = region_ptr {
        scenarios.push(Scenario {
            name: "register 16 pages".into(),
            op: Box::new(move || {
                let h = d.mem_register(at, 16 << 12)?;
                Ok(undo(move || free(h)))
            }),
        });
    }
    // Sparse mems: made, populated on every present GPU, given back.
    let sparse = uapi::ruvm_alloc_flags_RUVM_ALLOC_SPARSE;
    scenarios.push(Scenario {
        name: "sparse alloc".into(),
        op: Box::new(move || {
            let a = d.mem_alloc(1 << 20, 64 << 10, sparse)?;
            Ok(undo(move || free(a.handle)))
        }),
    });
    let sp = d
        .mem_alloc(1 << 20, 64 << 10, sparse)
        .ctx("alloc sparse")?
        .handle;
    for g in &present {
        d.mem_gpu(true, sp, g.id)
            .ctx("map the sparse mem on a GPU")?;
    }
    scenarios.push(Scenario {
        name: format!("sparse populate on {} GPUs", present.len()),
        op: Box::new(move || {
            d.mem_range(sp, 0, 256 << 10, true)?;
            Ok(undo(move || {
                d.mem_range(sp, 0, 256 << 10, false)
                    .map(drop)
                    .ctx("release")
            }))
        }),
    });
    scenarios.push(Scenario {
        name: "sparse release".into(),
        // The release's own failure (ENOMEM, nothing released) is what is swept; the chunks
        // its populate made go with a second release (the injected failure is spent).
        op: Box::new(move || {
            d.mem_range(sp, 0, 256 << 10, true)?;
            if let Err(e) = d.mem_range(sp, 0, 256 << 10, false) {
                let _ = d.mem_range(sp, 0, 256 << 10, false);
                return Err(e);
            }
            Ok(undo(|| Ok(())))
        }),
    });
    if let Some(g) = present.first().map(|g| g.id) {
        let sq = d
            .mem_alloc(1 << 20, 64 << 10, sparse)
            .ctx("alloc sparse")?
            .handle;
        d.mem_range(sq, 0, 192 << 10, true).ctx("populate")?;
        scenarios.push(Scenario {
            name: format!("sparse map GPU {g}"),
            op: Box::new(move || {
                d.mem_gpu(true, sq, g)?;
                Ok(undo(move || d.mem_gpu(false, sq, g).ctx("unmap GPU")))
            }),
        });
    }
    // Mappings of a mem made outside the sweep.
    let m = d.mem_alloc(1 << 20, 64 << 10, 0).ctx("alloc")?.handle;
    scenarios.push(Scenario {
        name: "map CPU kernel".into(),
        op: Box::new(move || {
            d.map_kernel(m)?;
            Ok(undo(move || d.unmap_kernel(m).ctx("unmap kernel")))
        }),
    });
    for g in &present {
        let id = g.id;
        scenarios.push(Scenario {
            name: format!("map GPU {id}"),
            op: Box::new(move || {
                d.mem_gpu(true, m, id)?;
                Ok(undo(move || d.mem_gpu(false, m, id).ctx("unmap GPU")))
            }),
        });
        if g.vidmem_size == 0 {
            continue;
        }
        for chunk in [4u64 << 10, 64 << 10, 2 << 20] {
            scenarios.push(Scenario {
                name: format!("vidmem alloc on GPU {id}, {}K chunks", chunk >> 10),
                op: Box::new(move || {
                    let a = d.vidmem_alloc(id, chunk, chunk, 0)?;
                    Ok(undo(move || free(a.handle)))
                }),
            });
        }
        scenarios.push(Scenario {
            name: format!("PMM check-leak on GPU {id}"),
            op: Box::new(move || {
                d.pmm_check_leak(id, 64 << 10, 4)?;
                Ok(undo(|| Ok(())))
            }),
        });
    }
    // dma-bufs made for the sweep, and their mems (freed at the end).
    let mut shared_bufs: Vec<std::os::fd::OwnedFd> = Vec::new();
    let mut shared_mems: Vec<u64> = Vec::new();
    let mut foreign_files: Vec<std::fs::File> = Vec::new();
    // A copy by a simulated engine (edu's takes 0.2 s a transfer: too slow to sweep).
    let sim_gpu = present.iter().find(|g| sim(g)).map(|g| g.id);
    let pair = match sim_gpu {
        Some(id) => {
            let a = d.mem_alloc(64 << 10, 0, 0).ctx("alloc")?.handle;
            let b = d.mem_alloc(64 << 10, 0, 0).ctx("alloc")?.handle;
            d.mem_gpu(true, a, id).ctx("map")?;
            d.mem_gpu(true, b, id).ctx("map")?;
            scenarios.push(Scenario {
                name: format!("copy engine of GPU {id}"),
                op: Box::new(move || {
                    d.ce_copy(id, b, 0, a, 0, 64 << 10)?;
                    Ok(undo(|| Ok(())))
                }),
            });
            // Streams: making one, a submission of every kind that allocates (a copy, a
            // fill, a record and a wait on its event), and an event's export.
            scenarios.push(Scenario {
                name: format!("stream create on GPU {id}"),
                op: Box::new(move || {
                    let s = d.stream_create(id)?;
                    Ok(undo(move || {
                        d.stream_destroy(s.handle).ctx("stream destroy")
                    }))
                }),
            });
            d.map_kernel(b).ctx("map kernel")?;
            let stream = d.stream_create(id).ctx("stream create")?.handle;
            let event = d.event_create().ctx("event create")?;
            scenarios.push(Scenario {
                name: format!("stream submit on GPU {id}"),
                op: Box::new(move || {
                    let ops = [
                        op::copy(b, 0, a, 0, 64 << 10),
                        op::fill_byte(b, 0, 4096, 0x5a),
                        op::record(event),
                        op::wait_event(event, 10_000),
                    ];
                    d.stream_submit(stream, &ops)?;
                    Ok(undo(move || {
                        d.stream_sync(stream, 10_000).ctx("stream sync")
                    }))
                }),
            });
            // Stream-ordered allocation: an ALLOC from a pool mapped for the GPU, a copy into
            // it and its FREE, one submission; the pool keeps the freed chunks (pending, then
            // cached by the synchronize that undoes it), so each call after the first reuses
            // them.
            if d.info().ctx("INFO")?.features & u64::from(uapi::RUVM_FEATURE_STREAM_ALLOC) != 0 {
                let (pool, _) = d.pool_create(0, u64::MAX).ctx("pool create")?;
                d.pool_access(pool, id, true).ctx("pool access")?;
                scenarios.push(Scenario {
                    name: format!("stream alloc and free on GPU {id}"),
                    op: Box::new(move || {
                        let mut ops = [
                            op::alloc(pool, 64 << 10, true),
                            op::with_dst_index(op::copy(0, 0, a, 0, 4096), 0),
                            op::free_index(0),
                        ];
                        d.stream_submit_mut(stream, &mut ops)?;
                        Ok(undo(move || {
                            d.stream_sync(stream, 10_000).ctx("stream sync")
                        }))
                    }),
                });
            }
            // A copy into a mem shared as a dma-buf: its exchange with the buffer's
            // reservation object, after the submission is queued, may fail on its own; the
            // operation then fails with ENOMEM (the stream in error), which the undo accepts.
            // A new stream each time (one in error takes no more work).
            let ex = d.mem_alloc(64 << 10, 0, 0).ctx("alloc")?.handle;
            d.mem_gpu(true, ex, id).ctx("map")?;
            shared_bufs.push(d.mem_export_dmabuf(ex).ctx("MEM_EXPORT_DMABUF")?);
            shared_mems.push(ex);
            scenarios.push(Scenario {
                name: format!("stream copy into a dma-buf's mem on GPU {id}"),
                op: Box::new(move || {
                    let s = d.stream_create(id)?.handle;
                    if let Err(e) = d.stream_submit(s, &[op::copy(ex, 0, a, 0, 4096)]) {
                        let _ = d.stream_destroy(s);
                        return Err(e);
                    }
                    Ok(undo(move || {
                        match d.stream_sync(s, 10_000) {
                            Ok(()) => {}
                            Err(Errno::EIO) => {
                                let q = d.stream_query(s).ctx("stream query")?;
                                check!(
                                    q.error == Errno::ENOMEM as u32,
                                    "the stream failed with errno {}, wanted ENOMEM",
                                    q.error
                                );
                            }
                            Err(e) => return Err(Stop::Fail(format!("stream sync: {e}"))),
                        }
                        d.stream_destroy(s).ctx("stream destroy")
                    }))
                }),
            });
            // The status page: a new file's first STREAM_STATUS makes its page, every
            // STREAM_STATUS a stream's slot (the file, its stream and page go with the undo).
            if d.info().ctx("INFO")?.features & u64::from(uapi::RUVM_FEATURE_STATUS_PAGE) != 0 {
                scenarios.push(Scenario {
                    name: format!("stream status page of a new file, a stream on GPU {id}"),
                    op: Box::new(move || {
                        let fd = nix::fcntl::open(
                            libruvm::path().as_path(),
                            nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
                            nix::sys::stat::Mode::empty(),
                        )?;
                        let f = Ruvm::from_owned_fd(fd).map_err(|_| Errno::EBADF)?;
                        let s = f.stream_create(id)?.handle;
                        f.stream_status(s)?;
                        Ok(undo(move || {
                            drop(f);
                            Ok(())
                        }))
                    }),
                });
            }
            scenarios.push(Scenario {
                name: "event export".into(),
                op: Box::new(move || {
                    let fd = d.event_export(event)?;
                    Ok(undo(move || {
                        drop(fd);
                        Ok(())
                    }))
                }),
            });
            Some((a, b))
        }
        None => None,
    };
    // GPU virtual mappings, of a mem DMA-mapped beforehand (a failed virtual mapping keeps
    // the implicit DMA mapping, as in uvm_mem: the sweep checks the virtual part alone).
    let mmu_gpu = present
        .iter()
        .find(|g| g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_MMU != 0);
    let va_mems = match mmu_gpu {
        Some(g) => {
            let id = g.id;
            let k = d.mem_alloc(256 << 10, 4 << 10, 0).ctx("alloc")?.handle;
            d.mem_gpu(true, k, id).ctx("map")?;
            scenarios.push(Scenario {
                name: format!("map GPU kernel VA on GPU {id}"),
                op: Box::new(move || {
                    d.mem_gpu_kernel(true, k, id)?;
                    Ok(undo(move || {
                        d.mem_gpu_kernel(false, k, id).ctx("unmap GPU kernel")
                    }))
                }),
            });
            scenarios.push(Scenario {
                name: format!("map GPU user VA on GPU {id}"),
                op: Box::new(move || {
                    d.map_gpu_user(k, id, 1 << 40, false)?;
                    Ok(undo(move || d.unmap_gpu_user(k, id).ctx("unmap GPU user")))
                }),
            });
            let vid = if g.vidmem_size > 0 {
                let v = d
                    .vidmem_alloc(id, 2 << 20, 64 << 10, 0)
                    .ctx("alloc")?
                    .handle;
                scenarios.push(Scenario {
                    name: format!("map vidmem at the GPU kernel VA on GPU {id}"),
                    op: Box::new(move || {
                        d.mem_gpu_kernel(true, v, id)?;
                        Ok(undo(move || {
                            d.mem_gpu_kernel(false, v, id).ctx("unmap GPU kernel")
                        }))
                    }),
                });
                Some(v)
            } else {
                None
            };
            Some((k, vid))
        }
        None => None,
    };
    // Pools: made, allocated from with an empty cache (mapped for a GPU), with an exact hit,
    // and with a cached list taken apart; access granted.
    let (cold, warm, apart) = (
        d.pool_create(64 << 10, 0).ctx("POOL_CREATE")?.0,
        d.pool_create(64 << 10, u64::MAX).ctx("POOL_CREATE")?.0,
        d.pool_create(16 << 10, u64::MAX).ctx("POOL_CREATE")?.0,
    );
    if let Some(g) = mmu_gpu.or(present.first()) {
        d.pool_access(cold, g.id, true).ctx("POOL_SET_ACCESS")?;
        d.pool_access(warm, g.id, true).ctx("POOL_SET_ACCESS")?;
    }
    for (pool, size) in [(warm, 256u64 << 10), (apart, 64 << 10)] {
        let a = d.pool_alloc(pool, size, 0).ctx("alloc")?;
        free(a.handle)?;
    }
    scenarios.push(Scenario {
        name: "pool create".into(),
        op: Box::new(move || {
            let (p, _) = d.pool_create(0, 0)?;
            Ok(undo(move || d.pool_destroy(p).ctx("destroy")))
        }),
    });
    for (name, pool, size, flags) in [
        ("pool alloc, nothing cached", cold, 128u64 << 10, 0),
        (
            "pool alloc, a cached list whole, zeroed",
            warm,
            256 << 10,
            uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO,
        ),
        ("pool alloc, a cached list taken apart", apart, 16 << 10, 0),
    ] {
        scenarios.push(Scenario {
            name: name.into(),
            op: Box::new(move || {
                let a = d.pool_alloc(pool, size, flags)?;
                Ok(undo(move || free(a.handle)))
            }),
        });
    }
    // A vidmem pool: one chunk cached (its threshold), then allocations that hit it and go
    // past it; the free that undoes one gives the pool back its one chunk.
    let vid_pool = match present.iter().find(|g| g.vidmem_size > 0) {
        Some(g) => {
            let id = g.id;
            let mut c = uapi::ruvm_pool_create {
                backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
                gpu: id,
                page_size: 64 << 10,
                release_threshold: 64 << 10,
                ..Default::default()
            };
            d.call(libruvm::cmd::POOL_CREATE, &mut c)
                .ctx("POOL_CREATE vidmem")?;
            let vp = c.handle;
            let valloc = move |size: u64| {
                let mut a = uapi::ruvm_mem_alloc {
                    size,
                    backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
                    gpu: id,
                    pool: vp,
                    ..Default::default()
                };
                d.call(libruvm::cmd::MEM_ALLOC, &mut a).map(|()| a.handle)
            };
            free(valloc(64 << 10).ctx("alloc vidmem")?)?;
            scenarios.push(Scenario {
                name: format!("vidmem pool alloc on GPU {id}, one chunk cached"),
                op: Box::new(move || {
                    let h = valloc(192 << 10)?;
                    Ok(undo(move || free(h)))
                }),
            });
            Some(vp)
        }
        None => None,
    };
    if let Some(g) = present.first().map(|g| g.id) {
        scenarios.push(Scenario {
            name: format!("pool access for GPU {g}"),
            op: Box::new(move || {
                d.pool_access(apart, g, true)?;
                Ok(undo(move || d.pool_access(apart, g, false).ctx("revoke")))
            }),
        });
    }
    scenarios.push(Scenario {
        name: "pool export".into(),
        op: Box::new(move || {
            let fd = d.pool_export(ipc)?;
            Ok(undo(move || {
                drop(fd);
                Ok(())
            }))
        }),
    });
    scenarios.push(Scenario {
        name: "pool import".into(),
        op: Box::new(move || {
            let ip = imp2.pool_import(std::os::fd::AsFd::as_fd(ipc_fd_ref))?;
            Ok(undo(move || {
                imp2.pool_destroy(ip).ctx("destroy the import")
            }))
        }),
    });
    scenarios.push(Scenario {
        name: "mem import".into(),
        op: Box::new(move || {
            let m = imp.mem_import(ip, &data)?;
            Ok(undo(move || imp.mem_free(m.handle).ctx("free the import")))
        }),
    });
    // dma-bufs: an export, an import of ruvm's buffer into the second file, and another
    // exporter's (a udmabuf) imported and mapped for a test GPU.
    if d.info().ctx("INFO")?.features & u64::from(uapi::RUVM_FEATURE_DMABUF) != 0 {
        let dm = d.mem_alloc(64 << 10, 0, 0).ctx("alloc")?.handle;
        shared_mems.push(dm);
        scenarios.push(Scenario {
            name: "dma-buf export".into(),
            op: Box::new(move || {
                let fd = d.mem_export_dmabuf(dm)?;
                Ok(undo(move || {
                    drop(fd);
                    Ok(())
                }))
            }),
        });
        let dbuf = d.mem_export_dmabuf(dm).ctx("MEM_EXPORT_DMABUF")?;
        let draw = std::os::fd::AsRawFd::as_raw_fd(&dbuf);
        shared_bufs.push(dbuf);
        scenarios.push(Scenario {
            name: "dma-buf import".into(),
            op: Box::new(move || {
                let m = imp.mem_import_dmabuf(draw)?;
                Ok(undo(move || imp.mem_free(m.handle).ctx("free the import")))
            }),
        });
        let edu = present
            .iter()
            .find(|g| g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU)
            .map(|g| g.id);
        if let (Some(g), Some((memfd, ubuf))) =
            (edu, super::vgem::udmabuf(16 << 10).ctx("udmabuf")?)
        {
            let uraw = std::os::fd::AsRawFd::as_raw_fd(&ubuf);
            scenarios.push(Scenario {
                name: "another exporter's dma-buf import".into(),
                op: Box::new(move || {
                    let m = d.mem_import_dmabuf(uraw)?;
                    Ok(undo(move || free(m.handle)))
                }),
            });
            let fm = d.mem_import_dmabuf(uraw).ctx("MEM_IMPORT_DMABUF")?.handle;
            shared_mems.push(fm);
            scenarios.push(Scenario {
                name: format!("another exporter's dma-buf mapped on GPU {g}"),
                op: Box::new(move || {
                    d.mem_gpu(true, fm, g)?;
                    Ok(undo(move || d.mem_gpu(false, fm, g).ctx("unmap GPU")))
                }),
            });
            shared_bufs.push(ubuf);
            foreign_files.push(memfd);
        }
    }
    let mut report = Vec::new();
    for s in &mut scenarios {
        let n = sweep(d, &inj, s)?;
        report.push(format!("{}: {n}", s.name));
    }
    drop(scenarios);
    drop(region);
    for h in shared_mems {
        free(h)?;
    }
    drop((shared_bufs, foreign_files));
    drop((importer, importer2, ipc_fd));
    free(shared)?;
    for p in [Some(cold), Some(warm), Some(apart), Some(ipc), vid_pool]
        .into_iter()
        .flatten()
    {
        d.pool_destroy(p).ctx("POOL_DESTROY")?;
    }
    for h in [
        Some(m),
        pair.map(|p| p.0),
        pair.map(|p| p.1),
        va_mems.map(|v| v.0),
        va_mems.and_then(|v| v.1),
    ]
    .into_iter()
    .flatten()
    {
        free(h)?;
    }
    for line in report {
        println!("# fault sweep, sites failed one at a time: {line}");
    }
    Ok(())
}
