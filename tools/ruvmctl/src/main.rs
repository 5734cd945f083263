// SPDX-License-Identifier: GPL-2.0

//! ruvmctl: the userspace tool for ruvm. Every ioctl of `/dev/ruvm` is a subcommand; `selftest`
//! runs the in-guest test suite.
//!
//! The grammar is in [`cli`], the commands in [`cmd`] (one file per group, each producing one
//! value that [`output`] shows as text or JSON), the device layer in the `libruvm` crate.
//!
//! A mem belongs to the open file that allocated it and is freed when that file is closed. To
//! work on mems across several ruvmctl commands, keep the device open in the shell and pass the
//! descriptor: `exec 3<>/dev/ruvm; ruvmctl --fd 3 alloc 1M; ruvmctl --fd 3 query 1`.

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Parser;
use libruvm::{cmd as ioctl, uapi};

mod bench;
mod cgroup;
mod cli;
mod cmd;
mod fuzz;
mod kmsg;
mod ktap;
mod output;
mod pattern;
mod selftest;
mod trace;
mod units;

use cli::{
    AllocatorAction, Cli, Cmd, DmabufAction, EventAction, GpuAction, HeapAction, MemAction,
    PoolAction, StreamAction, VidmemAction,
};
use output::{emit, Done};

/// Runs one command.
fn run(cli: Cli) -> Result<()> {
    let fd = cli.fd;
    let d = || cmd::open(fd);
    match cli.cmd {
        Cmd::Info(j) => emit(&cmd::info::info(&d()?)?, j.json),
        Cmd::Allocator { action } => match action {
            AllocatorAction::Replay {
                file,
                class,
                iterations,
                seed,
                gpu,
                threshold,
                no_opportunistic,
                no_event_dependencies,
                no_internal_dependencies,
                baseline,
                json,
            } => {
                let (name, trace) = match (class, file) {
                    (Some(c), _) => (
                        format!("{c:?} x {iterations} (seed {seed})"),
                        trace::generate(c, iterations, seed),
                    ),
                    (None, Some(f)) => {
                        let text = std::fs::read_to_string(&f)
                            .map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
                        (f.display().to_string(), trace::Trace::parse(&text)?)
                    }
                    (None, None) => bail!("a trace file or --class"),
                };
                let rules = cmd::allocator::Rules {
                    threshold,
                    reuse: libruvm::alloc::Reuse {
                        follow_event_dependencies: !no_event_dependencies,
                        allow_opportunistic: !no_opportunistic,
                        allow_internal_dependencies: !no_internal_dependencies,
                    },
                };
                emit(
                    &cmd::allocator::replay(&d()?, name, &trace, gpu, rules, baseline)?,
                    json.json,
                )
            }
            AllocatorAction::Trace {
                class,
                iterations,
                seed,
                json,
            } => {
                let t = trace::generate(class, iterations, seed);
                if json.json {
                    println!("{}", serde_json::to_string(&t)?);
                } else {
                    print!("{}", t.dump());
                }
                Ok(())
            }
        },
        Cmd::Alloc {
            size,
            page_size,
            vidmem,
            zero,
            fallback,
            sparse,
            pool,
            json,
        } => {
            let spec = cmd::mem::AllocSpec {
                size,
                page_size,
                vidmem,
                zero,
                fallback,
                sparse,
                pool,
                own_fd: fd.is_none() && !json.json,
            };
            emit(&cmd::mem::alloc(&d()?, &spec)?, json.json)
        }
        Cmd::Heap { action } => match action {
            HeapAction::Run {
                class,
                iterations,
                gpus,
                arena,
                json,
            } => emit(
                &cmd::heap::run(&d()?, class, iterations, &gpus, arena)?,
                json.json,
            ),
            HeapAction::Copy {
                gpu,
                size,
                stream,
                json,
            } => emit(&cmd::heap::copy(&d()?, gpu, size, stream)?, json.json),
        },
        Cmd::Vidmem { action } => match action {
            VidmemAction::Limit { gpu, set, json } => {
                emit(&cmd::vidmem::limit(&d()?, gpu, set)?, json.json)
            }
            VidmemAction::Usage(json) => emit(&cmd::vidmem::usage()?, json.json),
        },
        Cmd::Mem { action } => match action {
            MemAction::Populate(r) => emit(&cmd::mem::range(&d()?, &r, true)?, r.json.json),
            MemAction::Release(r) => emit(&cmd::mem::range(&d()?, &r, false)?, r.json.json),
            MemAction::Register {
                size,
                file,
                gpu,
                unmap,
                json,
            } => {
                let a = cmd::register::RegisterArgs {
                    size,
                    file,
                    gpu,
                    unmap,
                };
                emit(&cmd::register::register(&d()?, &a)?, json.json)
            }
            MemAction::Unregister { handle, json } => {
                emit(&cmd::register::unregister(&d()?, handle)?, json.json)
            }
        },
        Cmd::Pool { action } => match action {
            PoolAction::Create {
                vidmem,
                page_size,
                threshold,
                exportable,
                json,
            } => emit(
                &cmd::pool::create(
                    &d()?,
                    cmd::pool::Made {
                        vidmem,
                        page_size,
                        release_threshold: threshold,
                        exportable,
                    },
                    fd.is_none() && !json.json,
                )?,
                json.json,
            ),
            PoolAction::Export { pool, run, json } => {
                emit(&cmd::share::export_run(&d()?, pool, &run)?, json.json)
            }
            PoolAction::Import { descriptor, json } => {
                emit(&cmd::share::import_pool(&d()?, descriptor)?, json.json)
            }
            PoolAction::Share { size, gpu, json } => {
                emit(&cmd::share::share(&d()?, size, gpu)?, json.json)
            }
            PoolAction::Destroy { pool, json } => {
                emit(&cmd::pool::destroy(&d()?, pool)?, json.json)
            }
            PoolAction::Get { pool, json } => emit(&cmd::pool::get(&d()?, pool)?, json.json),
            PoolAction::Set {
                pool,
                threshold,
                reset_reserved_high,
                reset_used_high,
                follow_event_dependencies,
                allow_opportunistic,
                allow_internal_dependencies,
                json,
            } => {
                use cmd::pool::Setting;
                let reuse = [
                    (
                        follow_event_dependencies,
                        uapi::ruvm_pool_attr_RUVM_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
                    ),
                    (
                        allow_opportunistic,
                        uapi::ruvm_pool_attr_RUVM_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                    ),
                    (
                        allow_internal_dependencies,
                        uapi::ruvm_pool_attr_RUVM_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                    ),
                ]
                .into_iter()
                .find_map(|(on, attr)| on.map(|on| Setting::Reuse(attr, on)));
                let what = match (threshold, reset_reserved_high, reset_used_high, reuse) {
                    (Some(t), _, _, _) => Setting::Threshold(t),
                    (None, true, _, _) => Setting::ResetReservedHigh,
                    (None, false, true, _) => Setting::ResetUsedHigh,
                    (None, false, false, Some(r)) => r,
                    (None, false, false, None) => bail!(
                        "pool set: name what to change (--threshold, --reset-reserved-high, --reset-used-high, --follow-event-dependencies, --allow-opportunistic or --allow-internal-dependencies)"
                    ),
                };
                emit(&cmd::pool::set(&d()?, pool, what)?, json.json)
            }
            PoolAction::Trim { pool, keep, json } => {
                emit(&cmd::pool::trim(&d()?, pool, keep)?, json.json)
            }
            PoolAction::Access {
                pool,
                gpu,
                revoke,
                json,
            } => emit(&cmd::pool::access(&d()?, pool, gpu, revoke)?, json.json),
        },
        Cmd::Free { handle, json } => emit(
            &cmd::mem::handle_cmd(&d()?, ioctl::MEM_FREE, handle)?,
            json.json,
        ),
        Cmd::Query { handle, json } => emit(&cmd::mem::query(&d()?, handle)?, json.json),
        Cmd::Dmabuf { action } => match action {
            DmabufAction::Export { handle, run, json } => {
                emit(&cmd::dmabuf::export_run(&d()?, handle, &run)?, json.json)
            }
            DmabufAction::Import { descriptor, json } => {
                emit(&cmd::dmabuf::import(&d()?, descriptor)?, json.json)
            }
            DmabufAction::Fences {
                descriptor,
                write,
                json,
            } => emit(&cmd::dmabuf::fences(descriptor, write)?, json.json),
        },
        Cmd::Export { handle, json } => emit(&cmd::share::export_mem(&d()?, handle)?, json.json),
        Cmd::Import { pool, data, json } => {
            emit(&cmd::share::import_mem(&d()?, pool, &data)?, json.json)
        }
        Cmd::Ptr {
            addr,
            alloc,
            pool,
            gpu,
            at,
            json,
        } => {
            let dev = d()?;
            let report = match (addr, alloc) {
                (Some(addr), _) => cmd::ptr::lookup(&dev, addr)?,
                (None, Some(size)) => {
                    let spec = cmd::ptr::AllocSpec {
                        size,
                        pool,
                        gpu,
                        at: at.unwrap_or(0),
                    };
                    cmd::ptr::alloc_and_look(&dev, &spec)?
                }
                (None, None) => bail!("ptr: give an ADDR or --alloc SIZE"),
            };
            emit(&report, json.json)
        }
        Cmd::MapKernel { handle, json } => emit(
            &cmd::mem::handle_cmd(&d()?, ioctl::MEM_MAP_CPU_KERNEL, handle)?,
            json.json,
        ),
        Cmd::UnmapKernel { handle, json } => emit(
            &cmd::mem::handle_cmd(&d()?, ioctl::MEM_UNMAP_CPU_KERNEL, handle)?,
            json.json,
        ),
        Cmd::Fill {
            handle,
            range,
            json,
        } => {
            cmd::mem::kernel_fill(&d()?, handle, &range, false)?;
            emit(&output::Done {}, json.json)
        }
        Cmd::Verify {
            handle,
            range,
            json,
        } => emit(
            &cmd::mem::kernel_fill(&d()?, handle, &range, true)?,
            json.json,
        ),
        Cmd::Copy { copy, json } => emit(&cmd::mem::copy(&d()?, &copy)?, json.json),
        Cmd::MmapFill {
            handle,
            range,
            json,
        } => {
            cmd::mem::user_fill(&d()?, handle, &range, false)?;
            emit(&output::Done {}, json.json)
        }
        Cmd::MmapVerify {
            handle,
            range,
            json,
        } => emit(
            &cmd::mem::user_fill(&d()?, handle, &range, true)?,
            json.json,
        ),
        Cmd::Gpus(j) => emit(&cmd::gpu::gpus(&d()?)?, j.json),
        Cmd::Gpu { action } => match action {
            GpuAction::Attach { address, json } => {
                emit(&cmd::gpu::attach(&d()?, &address, true)?, json.json)
            }
            GpuAction::Detach { address, json } => {
                emit(&cmd::gpu::attach(&d()?, &address, false)?, json.json)
            }
            GpuAction::Pool { gpu, set, json } => emit(
                &cmd::pool::gpu_pool(&d()?, gpu, set, fd.is_none() && !json.json)?,
                json.json,
            ),
        },
        Cmd::MapGpu {
            handle,
            gpu,
            kernel,
            user,
            read_only,
            json,
        } => emit(
            &cmd::gpu_va::map(&d()?, handle, gpu, kernel, user, read_only)?,
            json.json,
        ),
        Cmd::UnmapGpu {
            handle,
            gpu,
            kernel,
            user,
            json,
        } => emit(
            &cmd::gpu_va::unmap(&d()?, handle, gpu, kernel, user)?,
            json.json,
        ),
        Cmd::GpuVa {
            handle,
            gpu,
            user,
            json,
        } => emit(&cmd::gpu_va::gpu_va(&d()?, handle, gpu, user)?, json.json),
        Cmd::CeCopyVa {
            user,
            gpu,
            dst,
            src,
            length,
            json,
        } => emit(
            &cmd::gpu_va::ce_copy_va(&d()?, gpu, dst, src, length, user)?,
            json.json,
        ),
        Cmd::PtDump {
            user,
            gpu,
            va,
            json,
        } => emit(&cmd::gpu_va::pt_dump(&d()?, gpu, va, user)?, json.json),
        Cmd::CeCopy {
            gpu,
            copy,
            stream: Some(stream),
            no_wait,
            json,
            ..
        } => emit(
            &cmd::stream::ce_copy_async(&d()?, gpu, &copy, stream, no_wait, !json.json)?,
            json.json,
        ),
        Cmd::CeCopy {
            gpu, copy, json, ..
        } => emit(&cmd::gpu::ce_copy(&d()?, gpu, &copy)?, json.json),
        Cmd::Stream { action } => match action {
            StreamAction::Create { gpu, json } => emit(
                &cmd::stream::create(&d()?, gpu, fd.is_none() && !json.json)?,
                json.json,
            ),
            StreamAction::Destroy { stream, json } => {
                emit(&cmd::stream::destroy(&d()?, stream)?, json.json)
            }
            StreamAction::Query { stream, json } => {
                emit(&cmd::stream::query(&d()?, stream)?, json.json)
            }
            StreamAction::Alloc {
                stream,
                size,
                pool,
                zero,
                json,
            } => emit(
                &cmd::stream::alloc(&d()?, stream, size, pool, zero, fd.is_none() && !json.json)?,
                json.json,
            ),
            StreamAction::Free {
                stream,
                handle,
                json,
            } => emit(&cmd::stream::free(&d()?, stream, handle)?, json.json),
            StreamAction::Sync {
                stream,
                all,
                timeout_ms,
                json,
            } => {
                let which = if all { None } else { stream };
                emit(&cmd::stream::sync(&d()?, which, timeout_ms)?, json.json)
            }
        },
        Cmd::Event { action } => match action {
            EventAction::Create { json } => emit(
                &cmd::stream::event_create(&d()?, fd.is_none() && !json.json)?,
                json.json,
            ),
            EventAction::Destroy { event, json } => {
                emit(&cmd::stream::event_destroy(&d()?, event)?, json.json)
            }
            EventAction::Record {
                event,
                stream,
                json,
            } => emit(&cmd::stream::event_record(&d()?, event, stream)?, json.json),
            EventAction::Query { event, json } => {
                emit(&cmd::stream::event_query(&d()?, event)?, json.json)
            }
            EventAction::Sync {
                event,
                timeout_ms,
                json,
            } => emit(
                &cmd::stream::event_sync(&d()?, event, timeout_ms)?,
                json.json,
            ),
            EventAction::Export { event, json } => {
                emit(&cmd::stream::event_export(&d()?, event)?, json.json)
            }
        },
        Cmd::DmaAddrs { handle, gpu, json } => {
            emit(&cmd::gpu::dma_addrs(&d()?, handle, gpu)?, json.json)
        }
        Cmd::GpuPhys {
            handle,
            gpu,
            offset,
            length,
            json,
        } => emit(
            &cmd::gpu::gpu_phys(&d()?, handle, gpu, offset, length)?,
            json.json,
        ),
        Cmd::Pmm(j) => emit(&cmd::gpu::pmms(&d()?)?, j.json),
        Cmd::PmmCheckLeak {
            gpu,
            chunk_size,
            limit,
            json,
        } => emit(
            &cmd::gpu::check_leak(&d()?, gpu, chunk_size, limit)?,
            json.json,
        ),
        Cmd::Stats {
            json,
            reset_peaks,
            watch,
        } => {
            let dev = d()?;
            let Some(secs) = watch else {
                return emit(&cmd::audit::stats(&dev, reset_peaks)?, json.json);
            };
            if !(secs > 0.0 && secs.is_finite()) {
                bail!("--watch takes a positive number of seconds");
            }
            loop {
                emit(&cmd::audit::stats(&dev, reset_peaks)?, json.json)?;
                println!();
                std::thread::sleep(std::time::Duration::from_secs_f64(secs));
            }
        }
        Cmd::Audit {
            json, mark: true, ..
        } => emit(&cmd::audit::mark()?, json.json),
        Cmd::Audit {
            json,
            since,
            require_unload,
            no_kmemleak,
            ..
        } => emit(
            &cmd::audit::audit(cmd::audit::AuditSpec {
                since,
                require_unload,
                no_kmemleak,
            })?,
            json.json,
        ),
        Cmd::Unload(j) => emit(&cmd::audit::unload()?, j.json),
        Cmd::TestLeak {
            what,
            count,
            size,
            order,
            mapped,
            lost,
        } => {
            let spec = cmd::test::LeakSpec {
                what,
                count,
                size,
                order,
                mapped,
                lost,
            };
            emit(&cmd::test::leak(&d()?, &spec)?, false)
        }
        Cmd::TestPlant { what } => emit(&cmd::test::plant(&d()?, what)?, false),
        Cmd::Fuzz {
            seed,
            ops,
            duration,
            procs,
            threads,
            unbind,
            kill,
            removal_bound,
            max_size,
            memcg,
            kmem_bound,
            unprivileged,
        } => {
            if !(duration > 0.0 && duration.is_finite()) || procs == 0 || threads == 0 {
                bail!("fuzz: --duration, --procs and --threads must be positive");
            }
            if removal_bound == 0 {
                bail!("fuzz: --removal-bound must be positive");
            }
            if unprivileged && memcg.is_none() {
                bail!("fuzz: --unprivileged needs --memcg (the workers join their cgroup as root)");
            }
            fuzz::command(&fuzz::Spec {
                seed: seed.unwrap_or_else(fuzz::clock_seed),
                ops,
                duration: std::time::Duration::from_secs_f64(duration),
                procs,
                threads,
                unbind,
                kill,
                removal_bound: std::time::Duration::from_secs(removal_bound),
                max_size,
                memcg,
                kmem_bound,
                unprivileged,
            })
        }
        Cmd::Bench {
            reps,
            max_size,
            json,
            only,
        } => {
            if reps == 0 || max_size < 4096 {
                bail!("bench: --reps must be positive and --max-size at least 4K");
            }
            if let Some(g) = only.iter().find(|g| !bench::GROUPS.contains(&g.as_str())) {
                bail!("bench: no group {g} (groups: {})", bench::GROUPS.join(", "));
            }
            bench::command(&bench::Spec { reps, max_size }, &only, json)
        }
        Cmd::BenchReport { log, out } => bench::report_files(&log, &out),
        Cmd::Selftest { list: true, .. } => {
            selftest::list().iter().for_each(|n| println!("{n}"));
            emit(&Done {}, false)
        }
        Cmd::Selftest { .. } => bail!("selftest runs from main"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::Selftest {
        filter,
        plant_failure,
        list: false,
    } = &cli.cmd
    {
        return match selftest::run(filter, *plant_failure) {
            Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(e) => {
                eprintln!("ruvmctl: selftest output: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ruvmctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
