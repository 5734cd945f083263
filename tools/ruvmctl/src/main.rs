// SPDX-License-Identifier: GPL-2.0

//! ruvmctl: the userspace tool for ruvm. Every ioctl of `/dev/ruvm` is a subcommand; `selftest`
//! runs the in-guest test suite.
//!
//! A mem belongs to the open file that allocated it and is freed when that file is closed. To
//! work on mems across several ruvmctl commands, keep the device open in the shell and pass the
//! descriptor: `exec 3<>/dev/ruvm; ruvmctl --fd 3 alloc 1M; ruvmctl --fd 3 query 1`.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;

mod dev;
mod ktap;
mod pattern;
mod selftest;
mod uapi;
mod units;

use units::{parse_size, show_size};

#[derive(Parser)]
#[command(name = "ruvmctl", version = env!("RUVM_VERSION"), about = "Drive the ruvm kernel module through /dev/ruvm")]
struct Cli {
    /// Use this inherited descriptor of /dev/ruvm instead of opening it (mems live as long as
    /// the descriptor does).
    #[arg(long, global = true, value_name = "N")]
    fd: Option<i32>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args)]
struct Json {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct Range {
    /// First byte (e.g. 0, 4K).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    offset: u64,
    /// Bytes (default: the mem's size from the offset on).
    #[arg(long, value_parser = parse_size)]
    length: Option<u64>,
    /// The pattern's seed (default: the mem's size, uvm_mem_test's pattern).
    #[arg(long, value_parser = parse_size)]
    seed: Option<u64>,
    /// Fill with this byte instead of the pattern.
    #[arg(long, value_parser = parse_size, conflicts_with = "seed")]
    byte: Option<u64>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show the loaded module's version, ABI, features and live mems (RUVM_IOCTL_INFO).
    Info(Json),
    /// Allocate a sysmem mem (RUVM_IOCTL_MEM_ALLOC).
    Alloc {
        /// Size, e.g. 4096, 64K, 7M+17.
        #[arg(value_parser = parse_size)]
        size: u64,
        /// Chunk size: a power of two from the page size to 2M (default: the page size).
        #[arg(long, default_value = "0", value_parser = parse_size)]
        page_size: u64,
        /// Zero the memory.
        #[arg(long)]
        zero: bool,
        /// Fall back to smaller chunks if large ones cannot be had.
        #[arg(long)]
        fallback: bool,
        #[command(flatten)]
        json: Json,
    },
    /// Free a mem (RUVM_IOCTL_MEM_FREE).
    Free { handle: u64 },
    /// Everything a mem knows about itself (RUVM_IOCTL_MEM_QUERY).
    Query {
        handle: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Map a mem for the CPU kernel (RUVM_IOCTL_MEM_MAP_CPU_KERNEL); idempotent.
    MapKernel { handle: u64 },
    /// Remove its CPU kernel mapping (RUVM_IOCTL_MEM_UNMAP_CPU_KERNEL); idempotent.
    UnmapKernel { handle: u64 },
    /// Write the pattern (or a byte) through the kernel mapping (RUVM_IOCTL_MEM_FILL).
    Fill {
        handle: u64,
        #[command(flatten)]
        range: Range,
    },
    /// Check the pattern (or a byte) through the kernel mapping (RUVM_IOCTL_MEM_VERIFY); exits 1
    /// on any mismatch.
    Verify {
        handle: u64,
        #[command(flatten)]
        range: Range,
        #[command(flatten)]
        json: Json,
    },
    /// Copy bytes between mems through their kernel mappings (RUVM_IOCTL_MEM_COPY).
    Copy {
        dst: u64,
        src: u64,
        /// Bytes to copy.
        #[arg(long, value_parser = parse_size)]
        length: u64,
        #[arg(long, default_value = "0", value_parser = parse_size)]
        dst_offset: u64,
        #[arg(long, default_value = "0", value_parser = parse_size)]
        src_offset: u64,
    },
    /// Write the pattern (or a byte) through a user mapping (mmap of /dev/ruvm).
    MmapFill {
        handle: u64,
        #[command(flatten)]
        range: Range,
    },
    /// Check the pattern (or a byte) through a user mapping; exits 1 on any mismatch.
    MmapVerify {
        handle: u64,
        #[command(flatten)]
        range: Range,
        #[command(flatten)]
        json: Json,
    },
    /// Run the in-guest test suite; prints KTAP, exits 0 (pass), 1 (fail) or 4 (skip).
    Selftest {
        /// Run only the cases whose name contains this text.
        #[arg(long)]
        filter: Option<String>,
        /// List the cases and exit.
        #[arg(long)]
        list: bool,
        /// Add a case that fails, to prove the harness notices (for the runner's own tests).
        #[arg(long)]
        plant_failure: bool,
    },
    /// Make the module misbehave on purpose (needs enable_test_ioctls=1 and CAP_SYS_ADMIN).
    TestPlant {
        /// What to plant.
        what: Plant,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Plant {
    /// Hit a WARN_ON in the module.
    Warn,
}

/// An error for the user: what failed, in words.
type CliResult = Result<(), String>;

fn ioctl_err(what: &'static str) -> impl Fn(nix::errno::Errno) -> String {
    move |e| format!("{what}: {e}")
}

fn open(fd: Option<i32>) -> Result<dev::Ruvm, String> {
    match fd {
        Some(fd) => dev::Ruvm::from_inherited_fd(fd),
        None => dev::Ruvm::open(),
    }
    .map_err(|e| e.to_string())
}

fn print_json(v: &impl Serialize) -> CliResult {
    println!(
        "{}",
        serde_json::to_string_pretty(v).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// Names of the feature bits a module reports.
fn feature_names(bits: u64) -> Vec<&'static str> {
    let mut v = Vec::new();
    if bits & u64::from(uapi::RUVM_FEATURE_SYSMEM) != 0 {
        v.push("sysmem");
    }
    v
}

#[derive(Serialize)]
struct InfoOut {
    version: String,
    abi_version: u32,
    features: u64,
    feature_names: Vec<&'static str>,
    test_ioctls: bool,
    live_mems: u64,
    live_bytes: u64,
    max_alloc_bytes: u64,
    max_file_bytes: u64,
}

fn info(d: &dev::Ruvm, json: bool) -> CliResult {
    let i = d.info().map_err(ioctl_err("RUVM_IOCTL_INFO"))?;
    let out = InfoOut {
        version: dev::c_string(&i.version),
        abi_version: i.abi_version,
        features: i.features,
        feature_names: feature_names(i.features),
        test_ioctls: i.test_ioctls != 0,
        live_mems: i.live_mems,
        live_bytes: i.live_bytes,
        max_alloc_bytes: i.max_alloc_bytes,
        max_file_bytes: i.max_file_bytes,
    };
    if json {
        return print_json(&out);
    }
    println!("ruvm {} (ABI {})", out.version, out.abi_version);
    let names = if out.feature_names.is_empty() {
        "none".to_owned()
    } else {
        out.feature_names.join(" ")
    };
    println!("features:    {names} ({:#x})", out.features);
    println!(
        "test ioctls: {}",
        if out.test_ioctls {
            "enabled"
        } else {
            "disabled"
        }
    );
    println!("live mems:   {} ({} bytes)", out.live_mems, out.live_bytes);
    println!(
        "limits:      {} per mem, {} per open file",
        show_size(out.max_alloc_bytes),
        show_size(out.max_file_bytes)
    );
    if out.abi_version != uapi::RUVM_ABI_VERSION {
        println!(
            "warning: ruvmctl speaks ABI {}, the module ABI {}",
            uapi::RUVM_ABI_VERSION,
            out.abi_version
        );
    }
    Ok(())
}

#[derive(Serialize)]
struct MemOut {
    handle: u64,
    backing: &'static str,
    size: u64,
    physical_size: u64,
    chunk_size: u64,
    chunk_count: u64,
    mmap_offset: u64,
    cpu_kernel_mapped: bool,
    cpu_user_mapped: bool,
    user_mappings: u32,
    zeroed: bool,
    fallback: bool,
}

fn mem_out(q: &uapi::ruvm_mem_query) -> MemOut {
    MemOut {
        handle: q.handle,
        backing: "sysmem",
        size: q.size,
        physical_size: q.physical_size,
        chunk_size: q.chunk_size,
        chunk_count: q.chunk_count,
        mmap_offset: q.mmap_offset,
        cpu_kernel_mapped: q.mapped & u64::from(uapi::ruvm_mapped_RUVM_MAPPED_CPU_KERNEL) != 0,
        cpu_user_mapped: q.mapped & u64::from(uapi::ruvm_mapped_RUVM_MAPPED_CPU_USER) != 0,
        user_mappings: q.user_mappings,
        zeroed: q.alloc_flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO != 0,
        fallback: q.alloc_flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK != 0,
    }
}

fn show_mem(q: &uapi::ruvm_mem_query, json: bool) -> CliResult {
    let m = mem_out(q);
    if json {
        return print_json(&m);
    }
    println!(
        "mem {}: {} {} bytes = {} chunks of {} (physical {}), mmap offset {:#x}",
        m.handle,
        m.backing,
        m.size,
        m.chunk_count,
        show_size(m.chunk_size),
        m.physical_size,
        m.mmap_offset
    );
    let mut maps = Vec::new();
    if m.cpu_kernel_mapped {
        maps.push("cpu-kernel".to_owned());
    }
    if m.cpu_user_mapped {
        maps.push(format!(
            "cpu-user ({} mapping{})",
            m.user_mappings,
            if m.user_mappings == 1 { "" } else { "s" }
        ));
    }
    println!(
        "  mapped: {}",
        if maps.is_empty() {
            "nowhere".to_owned()
        } else {
            maps.join(", ")
        }
    );
    Ok(())
}

/// The range and fill of a fill/verify command, resolved against the mem.
fn fill_args(d: &dev::Ruvm, handle: u64, r: &Range) -> Result<uapi::ruvm_mem_fill, String> {
    let q = d
        .mem_query(handle)
        .map_err(ioctl_err("RUVM_IOCTL_MEM_QUERY"))?;
    let length = match r.length {
        Some(l) => l,
        None => q
            .size
            .checked_sub(r.offset)
            .ok_or("--offset is beyond the mem's size")?,
    };
    let (kind, seed) = match r.byte {
        Some(b) => (uapi::ruvm_fill_kind_RUVM_FILL_BYTE, b),
        None => (
            uapi::ruvm_fill_kind_RUVM_FILL_PATTERN,
            r.seed.unwrap_or(q.size),
        ),
    };
    Ok(uapi::ruvm_mem_fill {
        handle,
        offset: r.offset,
        length,
        seed,
        kind,
        ..Default::default()
    })
}

#[derive(Serialize)]
struct VerifyOut {
    handle: u64,
    offset: u64,
    length: u64,
    mismatches: u64,
    first_mismatch: Option<u64>,
}

fn report_verify(out: VerifyOut, json: bool) -> CliResult {
    let bad = out.mismatches;
    if json {
        print_json(&out)?;
    } else if bad == 0 {
        println!(
            "mem {}: {} bytes from offset {} match",
            out.handle, out.length, out.offset
        );
    } else {
        println!(
            "mem {}: {bad} of {} bytes differ, the first at offset {}",
            out.handle,
            out.length,
            out.first_mismatch.unwrap_or(0)
        );
    }
    if bad == 0 {
        Ok(())
    } else {
        Err(format!("{bad} bytes differ"))
    }
}

/// Fills or checks a range through a user mapping of the whole mem.
fn mmap_fill(d: &dev::Ruvm, handle: u64, r: &Range, verify: bool, json: bool) -> CliResult {
    let a = fill_args(d, handle, r)?;
    let q = d
        .mem_query(handle)
        .map_err(ioctl_err("RUVM_IOCTL_MEM_QUERY"))?;
    let map = dev::UserMap::of_mem(d, &q).map_err(ioctl_err("mmap"))?;
    let end = a
        .offset
        .checked_add(a.length)
        .filter(|&e| e <= q.physical_size)
        .ok_or("range is beyond the mem")?;
    let want = |o: u64| {
        if a.kind == uapi::ruvm_fill_kind_RUVM_FILL_BYTE {
            a.seed as u8
        } else {
            pattern::byte_at(a.seed, o)
        }
    };
    let (mut mismatches, mut first) = (0u64, None);
    for o in a.offset..end {
        let i = o as usize;
        if verify {
            if map.read(i) != want(o) {
                mismatches += 1;
                first.get_or_insert(o);
            }
        } else {
            map.write(i, want(o));
        }
    }
    if verify {
        report_verify(
            VerifyOut {
                handle,
                offset: a.offset,
                length: a.length,
                mismatches,
                first_mismatch: first,
            },
            json,
        )
    } else {
        Ok(())
    }
}

fn run(cli: Cli) -> CliResult {
    let d = || open(cli.fd);
    match cli.cmd {
        Cmd::Info(j) => info(&d()?, j.json),
        Cmd::Alloc {
            size,
            page_size,
            zero,
            fallback,
            json,
        } => {
            let dev = d()?;
            let mut flags = 0;
            if zero {
                flags |= uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO;
            }
            if fallback {
                flags |= uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK;
            }
            let a = dev
                .mem_alloc(size, page_size, flags)
                .map_err(ioctl_err("RUVM_IOCTL_MEM_ALLOC"))?;
            let q = dev
                .mem_query(a.handle)
                .map_err(ioctl_err("RUVM_IOCTL_MEM_QUERY"))?;
            show_mem(&q, json.json)?;
            if cli.fd.is_none() && !json.json {
                println!("  (freed when ruvmctl exits: pass --fd to keep mems across commands)");
            }
            Ok(())
        }
        Cmd::Free { handle } => d()?
            .mem_free(handle)
            .map_err(ioctl_err("RUVM_IOCTL_MEM_FREE")),
        Cmd::Query { handle, json } => {
            let q = d()?
                .mem_query(handle)
                .map_err(ioctl_err("RUVM_IOCTL_MEM_QUERY"))?;
            show_mem(&q, json.json)
        }
        Cmd::MapKernel { handle } => d()?
            .map_kernel(handle)
            .map_err(ioctl_err("RUVM_IOCTL_MEM_MAP_CPU_KERNEL")),
        Cmd::UnmapKernel { handle } => d()?
            .unmap_kernel(handle)
            .map_err(ioctl_err("RUVM_IOCTL_MEM_UNMAP_CPU_KERNEL")),
        Cmd::Fill { handle, range } => {
            let dev = d()?;
            let a = fill_args(&dev, handle, &range)?;
            dev.mem_fill(false, a)
                .map(drop)
                .map_err(ioctl_err("RUVM_IOCTL_MEM_FILL"))
        }
        Cmd::Verify {
            handle,
            range,
            json,
        } => {
            let dev = d()?;
            let a = fill_args(&dev, handle, &range)?;
            let r = dev
                .mem_fill(true, a)
                .map_err(ioctl_err("RUVM_IOCTL_MEM_VERIFY"))?;
            let first = (r.mismatches > 0).then_some(r.first_mismatch);
            report_verify(
                VerifyOut {
                    handle,
                    offset: r.offset,
                    length: r.length,
                    mismatches: r.mismatches,
                    first_mismatch: first,
                },
                json.json,
            )
        }
        Cmd::Copy {
            dst,
            src,
            length,
            dst_offset,
            src_offset,
        } => d()?
            .mem_copy(dst, dst_offset, src, src_offset, length)
            .map_err(ioctl_err("RUVM_IOCTL_MEM_COPY")),
        Cmd::MmapFill { handle, range } => mmap_fill(&d()?, handle, &range, false, false),
        Cmd::MmapVerify {
            handle,
            range,
            json,
        } => mmap_fill(&d()?, handle, &range, true, json.json),
        Cmd::Selftest { list: true, .. } => {
            selftest::list().iter().for_each(|n| println!("{n}"));
            Ok(())
        }
        Cmd::Selftest { .. } => unreachable!("handled in main"),
        Cmd::TestPlant { what: Plant::Warn } => d()?
            .test_plant(uapi::ruvm_plant_RUVM_PLANT_WARN)
            .map_err(ioctl_err("RUVM_IOCTL_TEST_PLANT")),
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
        return match selftest::run(filter.as_deref(), *plant_failure) {
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
            eprintln!("ruvmctl: {e}");
            ExitCode::FAILURE
        }
    }
}
