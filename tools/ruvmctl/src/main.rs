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

mod audit;
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

/// What to copy, from which mem to which.
#[derive(Args)]
struct CopyArgs {
    dst: u64,
    src: u64,
    /// Bytes to copy.
    #[arg(long, value_parser = parse_size)]
    length: u64,
    #[arg(long, default_value = "0", value_parser = parse_size)]
    dst_offset: u64,
    #[arg(long, default_value = "0", value_parser = parse_size)]
    src_offset: u64,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show the loaded module's version, ABI, features and live mems (RUVM_IOCTL_INFO).
    Info(Json),
    /// Allocate a mem (RUVM_IOCTL_MEM_ALLOC): sysmem, or with --vidmem a GPU's memory.
    Alloc {
        /// Size, e.g. 4096, 64K, 7M+17.
        #[arg(value_parser = parse_size)]
        size: u64,
        /// Chunk size (default: uvm_mem's rules). Sysmem: a power of two from the page size to
        /// 2M; vidmem: one of the GPU's page sizes up to 2M.
        #[arg(long, default_value = "0", value_parser = parse_size)]
        page_size: u64,
        /// Allocate from this GPU's memory (vidmem) instead of sysmem.
        #[arg(long, value_name = "GPU")]
        vidmem: Option<u32>,
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
    Copy(CopyArgs),
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
    /// The GPUs ruvm knows (RUVM_IOCTL_GPU_LIST).
    Gpus(Json),
    /// DMA-map every chunk of a mem for a GPU (RUVM_IOCTL_MEM_MAP_GPU); idempotent.
    MapGpu { handle: u64, gpu: u32 },
    /// Drop a mem's DMA table for a GPU (RUVM_IOCTL_MEM_UNMAP_GPU); idempotent.
    UnmapGpu { handle: u64, gpu: u32 },
    /// Copy bytes between mems with a GPU's copy engine, through their DMA tables for it
    /// (RUVM_IOCTL_CE_COPY). Slow on the test GPUs: ~0.2 s per 4 KiB.
    CeCopy {
        gpu: u32,
        #[command(flatten)]
        copy: CopyArgs,
    },
    /// A mem's DMA addresses for a GPU, one per chunk (RUVM_IOCTL_MEM_DMA_ADDRS; root only).
    DmaAddrs {
        handle: u64,
        gpu: u32,
        #[command(flatten)]
        json: Json,
    },
    /// Where a GPU reaches a range of a mem, which must lie in one chunk (RUVM_IOCTL_MEM_GPU_PHYS;
    /// root only): a sysmem DMA address or a vidmem address.
    GpuPhys {
        handle: u64,
        gpu: u32,
        /// First byte.
        #[arg(long, default_value = "0", value_parser = parse_size)]
        offset: u64,
        /// Bytes.
        #[arg(long, default_value = "1", value_parser = parse_size)]
        length: u64,
        #[command(flatten)]
        json: Json,
    },
    /// The vidmem managers (PMMs) of every present GPU with vidmem (RUVM_IOCTL_PMM_STATS).
    Pmm(Json),
    /// uvm's PMM_CHECK_LEAK: take a GPU's chunks of one size until none is left (or --limit),
    /// give them all back, and report (RUVM_IOCTL_PMM_CHECK_LEAK; root only). Exits 1 if the
    /// PMM did not get back all it had free.
    PmmCheckLeak {
        gpu: u32,
        /// Chunk size: 4K, 64K or 2M.
        #[arg(long, default_value = "2M", value_parser = parse_size)]
        chunk_size: u64,
        /// Most chunks to take.
        #[arg(long)]
        limit: Option<u64>,
        #[command(flatten)]
        json: Json,
    },
    /// Usage statistics (RUVM_IOCTL_STATS) and the audit's live counts (RUVM_IOCTL_AUDIT).
    Stats {
        #[command(flatten)]
        json: Json,
        /// Restart the high watermarks from the current values after reading (CAP_SYS_ADMIN).
        #[arg(long)]
        reset_peaks: bool,
        /// Print again every this many seconds, until interrupted.
        #[arg(long, value_name = "SECONDS")]
        watch: Option<f64>,
    },
    /// The leak verdict: ruvm's audit reports in the kernel log, kmemleak, DMA-API debug
    /// errors. Exits 1 on any leak.
    Audit {
        #[command(flatten)]
        json: Json,
        /// Write a marker into the kernel log, print its id, and exit.
        #[arg(long, conflicts_with = "since")]
        mark: bool,
        /// Only look at the log after this marker.
        #[arg(long, value_name = "MARK")]
        since: Option<String>,
        /// Fail unless an unload verdict is in the log (after the marker).
        #[arg(long)]
        require_unload: bool,
        /// Do not ask kmemleak to scan.
        #[arg(long)]
        no_kmemleak: bool,
    },
    /// Unload ruvm (like rmmod) and report the audit's verdict, read from memory the module
    /// writes at unload (RUVM_IOCTL_REGISTER_UNLOAD_STATE). Exits 1 on any leak.
    Unload(Json),
    /// Leak resources on purpose (needs enable_test_ioctls=1 and CAP_SYS_ADMIN).
    TestLeak {
        /// What to leak.
        what: Leak,
        /// How many (1 to 64).
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Size of each leaked mem.
        #[arg(long, default_value = "4096", value_parser = parse_size)]
        size: u64,
        /// Order of each leaked chunk.
        #[arg(long, default_value_t = 0)]
        order: u32,
        /// Map each leaked mem for the CPU kernel.
        #[arg(long)]
        mapped: bool,
        /// Forget the objects for good (for kmemleak) instead of holding them for the unload report.
        #[arg(long)]
        lost: bool,
    },
    /// Run the in-guest test suite; prints KTAP, exits 0 (pass), 1 (fail) or 4 (skip).
    Selftest {
        /// Run only the cases whose name contains this text (repeat for any of several).
        #[arg(long)]
        filter: Vec<String>,
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
enum Leak {
    /// A sysmem mem.
    Mem,
    /// One sysmem chunk.
    Chunk,
    /// A CPU kernel mapping (with its one-page chunk).
    KernelMap,
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
    if bits & u64::from(uapi::RUVM_FEATURE_AUDIT) != 0 {
        v.push("audit");
    }
    if bits & u64::from(uapi::RUVM_FEATURE_GPU_LIST) != 0 {
        v.push("gpu-list");
    }
    if bits & u64::from(uapi::RUVM_FEATURE_GPU_DMA) != 0 {
        v.push("gpu-dma");
    }
    if bits & u64::from(uapi::RUVM_FEATURE_CE_COPY) != 0 {
        v.push("ce-copy");
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
    backing: String,
    size: u64,
    physical_size: u64,
    chunk_size: u64,
    chunk_count: u64,
    mmap_offset: u64,
    cpu_kernel_mapped: bool,
    cpu_user_mapped: bool,
    user_mappings: u32,
    mapped_gpus: Vec<u32>,
    zeroed: bool,
    fallback: bool,
}

fn mem_out(q: &uapi::ruvm_mem_query) -> MemOut {
    MemOut {
        handle: q.handle,
        backing: if q.backing == uapi::ruvm_backing_RUVM_BACKING_VIDMEM {
            format!("vidmem of GPU {}", q.gpu)
        } else {
            "sysmem".to_owned()
        },
        size: q.size,
        physical_size: q.physical_size,
        chunk_size: q.chunk_size,
        chunk_count: q.chunk_count,
        mmap_offset: q.mmap_offset,
        cpu_kernel_mapped: q.mapped & u64::from(uapi::ruvm_mapped_RUVM_MAPPED_CPU_KERNEL) != 0,
        cpu_user_mapped: q.mapped & u64::from(uapi::ruvm_mapped_RUVM_MAPPED_CPU_USER) != 0,
        user_mappings: q.user_mappings,
        mapped_gpus: (0..64)
            .filter(|b| q.mapped_gpus & (1u64 << b) != 0)
            .collect(),
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
    for g in &m.mapped_gpus {
        maps.push(format!("gpu {g} (DMA)"));
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

/// The audit class names, by index (as the module names them in its reports).
fn class_name(i: usize) -> String {
    const BASE: [&str; 5] = [
        "mems",
        "sysmem_bytes",
        "handles",
        "kernel_maps",
        "user_mappings",
    ];
    let o = uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_CHUNKS_ORDER0 as usize;
    let max = uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_CHUNKS_MAX_ORDER as usize;
    match i {
        _ if i < BASE.len() => BASE[i].to_owned(),
        _ if (o..=o + max).contains(&i) => format!("sysmem_chunks_o{}", i - o),
        _ if i == uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS as usize => {
            "dma_mappings".to_owned()
        }
        _ if i == uapi::ruvm_audit_class_RUVM_AUDIT_DMA_BYTES as usize => "dma_bytes".to_owned(),
        _ if i == uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_BYTES as usize => {
            "vidmem_bytes".to_owned()
        }
        _ if i == uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_CHUNKS as usize => {
            "vidmem_chunks".to_owned()
        }
        _ if i == uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_ROOTS as usize => {
            "vidmem_roots".to_owned()
        }
        _ => format!("reserved_{i}"),
    }
}

#[derive(Serialize)]
struct GpuOut {
    id: u32,
    kind: &'static str,
    present: bool,
    name: String,
    vendor: String,
    device: String,
    dma_mask_bits: u32,
    page_sizes: Vec<String>,
    copy_engine: bool,
    dma_mapped_bytes: u64,
    vidmem_size: u64,
}

fn gpus(d: &dev::Ruvm, json: bool) -> CliResult {
    let list = d.gpus().map_err(ioctl_err("RUVM_IOCTL_GPU_LIST"))?;
    let out: Vec<GpuOut> = list
        .iter()
        .map(|g| GpuOut {
            id: g.id,
            kind: match g.kind {
                uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU => "edu (test GPU)",
                uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST => "host GPU (DMA mapping only)",
                uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM => "simulated GPU",
                _ => "unknown",
            },
            present: g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0,
            // The device's name in the kernel (sysfs): its PCI address, or a simulated GPU's
            // faux device.
            name: if g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM {
                format!("ruvm-sim{}", g.pci_devfn)
            } else {
                dev::pci_name(g)
            },
            vendor: format!("{:04x}", g.vendor),
            device: format!("{:04x}", g.device),
            dma_mask_bits: g.dma_mask_bits,
            page_sizes: (0..64)
                .filter(|b| g.page_sizes & (1u64 << b) != 0)
                .map(|b| show_size(1u64 << b))
                .collect(),
            copy_engine: g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE != 0,
            dma_mapped_bytes: g.dma_mapped_bytes,
            vidmem_size: g.vidmem_size,
        })
        .collect();
    if json {
        return print_json(&out);
    }
    if out.is_empty() {
        println!("no GPUs");
    }
    for g in &out {
        println!(
            "GPU {}: {} at {} [{}:{}], {}, DMA {} bits, pages {}, copy engine {}, {} bytes DMA-mapped, vidmem {}",
            g.id,
            g.kind,
            g.name,
            g.vendor,
            g.device,
            if g.present {
                "present"
            } else {
                "gone (unbound)"
            },
            g.dma_mask_bits,
            g.page_sizes.join(" "),
            if g.copy_engine { "yes" } else { "no" },
            g.dma_mapped_bytes,
            show_size(g.vidmem_size)
        );
    }
    Ok(())
}

#[derive(Serialize)]
struct PmmOut {
    gpu: u32,
    capacity: u64,
    free: u64,
    allocated_4k: u64,
    allocated_64k: u64,
    allocated_2m: u64,
    roots: u64,
    roots_used: u64,
    roots_split: u64,
    roots_stored: u64,
}

fn pmm(d: &dev::Ruvm, json: bool) -> CliResult {
    let mut out = Vec::new();
    for g in d.gpus().map_err(ioctl_err("RUVM_IOCTL_GPU_LIST"))? {
        if g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT == 0 || g.vidmem_size == 0 {
            continue;
        }
        let s = d
            .pmm_stats(g.id)
            .map_err(ioctl_err("RUVM_IOCTL_PMM_STATS"))?;
        out.push(PmmOut {
            gpu: g.id,
            capacity: s.capacity,
            free: s.free,
            allocated_4k: s.allocated[0],
            allocated_64k: s.allocated[1],
            allocated_2m: s.allocated[2],
            roots: s.roots,
            roots_used: s.roots_used,
            roots_split: s.roots_split,
            roots_stored: s.roots_stored,
        });
    }
    if json {
        return print_json(&out);
    }
    if out.is_empty() {
        println!("no GPU with vidmem");
    }
    for p in &out {
        println!(
            "GPU {}: vidmem {}, free {}; chunks 4K {} 64K {} 2M {}; root chunks {} ({} used, {} split, {} with storage)",
            p.gpu,
            show_size(p.capacity),
            show_size(p.free),
            p.allocated_4k,
            p.allocated_64k,
            p.allocated_2m,
            p.roots,
            p.roots_used,
            p.roots_split,
            p.roots_stored
        );
    }
    Ok(())
}

#[derive(Serialize)]
struct BackingOut {
    backing: &'static str,
    reserved_bytes: u64,
    reserved_peak: u64,
    used_bytes: u64,
    used_peak: u64,
    mems: u64,
    mems_peak: u64,
    allocs: u64,
    frees: u64,
    alloc_failures: u64,
}

#[derive(Serialize)]
struct StatsOut {
    /// Sysmem, at the top level.
    #[serde(flatten)]
    sysmem: BackingOut,
    vidmem: BackingOut,
    live: std::collections::BTreeMap<String, u64>,
    leak_checker: u32,
}

fn backing_out(backing: &'static str, s: &uapi::ruvm_stats) -> BackingOut {
    BackingOut {
        backing,
        reserved_bytes: s.reserved_bytes,
        reserved_peak: s.reserved_peak,
        used_bytes: s.used_bytes,
        used_peak: s.used_peak,
        mems: s.mems,
        mems_peak: s.mems_peak,
        allocs: s.allocs,
        frees: s.frees,
        alloc_failures: s.alloc_failures,
    }
}

fn stats(d: &dev::Ruvm, json: bool, reset: bool) -> CliResult {
    let sys = d
        .stats_of(uapi::ruvm_backing_RUVM_BACKING_SYSMEM, reset)
        .map_err(ioctl_err("RUVM_IOCTL_STATS"))?;
    let vid = d
        .stats_of(uapi::ruvm_backing_RUVM_BACKING_VIDMEM, reset)
        .map_err(ioctl_err("RUVM_IOCTL_STATS"))?;
    let a = d.audit(false).map_err(ioctl_err("RUVM_IOCTL_AUDIT"))?;
    let out = StatsOut {
        sysmem: backing_out("sysmem", &sys),
        vidmem: backing_out("vidmem", &vid),
        live: a
            .live
            .iter()
            .enumerate()
            .map(|(i, n)| (class_name(i), *n))
            .collect(),
        leak_checker: a.level,
    };
    if json {
        return print_json(&out);
    }
    for b in [&out.sysmem, &out.vidmem] {
        println!("{:<10} {:>14} {:>14}", b.backing, "now", "peak");
        println!(
            "{:<10} {:>14} {:>14}",
            "reserved", b.reserved_bytes, b.reserved_peak
        );
        println!("{:<10} {:>14} {:>14}", "used", b.used_bytes, b.used_peak);
        println!("{:<10} {:>14} {:>14}", "mems", b.mems, b.mems_peak);
        println!(
            "allocs {}, frees {}, failed allocations {}",
            b.allocs, b.frees, b.alloc_failures
        );
    }
    let live: Vec<String> = out
        .live
        .iter()
        .filter(|(_, n)| **n != 0)
        .map(|(k, n)| format!("{k}={n}"))
        .collect();
    println!(
        "audit (leak_checker={}): {}",
        out.leak_checker,
        if live.is_empty() {
            "nothing live".to_owned()
        } else {
            live.join(" ")
        }
    );
    Ok(())
}

#[derive(Serialize)]
struct AuditOut {
    verdict: &'static str,
    since: Option<String>,
    findings: audit::Findings,
    kmemleak_objects: Option<usize>,
    dma_api_errors: Option<u64>,
    problems: Vec<String>,
}

fn audit_cmd(
    json: bool,
    since: Option<String>,
    require_unload: bool,
    no_kmemleak: bool,
) -> CliResult {
    let log = audit::read_kmsg().map_err(|e| format!("reading /dev/kmsg: {e}"))?;
    let part = audit::since(&log, since.as_deref()).ok_or_else(|| {
        format!(
            "marker {} is not in the kernel log (rotated out?)",
            since.as_deref().unwrap_or("")
        )
    })?;
    let findings = audit::Findings::parse(part.iter().map(String::as_str));
    let kml = if no_kmemleak {
        None
    } else {
        audit::kmemleak_scan()
    };
    let dma = audit::dma_api_errors();
    let mut problems = Vec::new();
    for u in findings
        .unloads
        .iter()
        .filter(|u| findings.leaked() && u.verdict != "clean")
    {
        let classes: Vec<String> = u.classes.iter().map(|(k, n)| format!("{k}={n}")).collect();
        problems.push(format!("ruvm unloaded with leaks: {}", classes.join(" ")));
    }
    if require_unload && findings.unloads.is_empty() {
        problems.push("no unload verdict in the log".to_owned());
    }
    if let Some((n, _)) = &kml {
        if *n > 0 {
            problems.push(format!("kmemleak: {n} unreferenced objects"));
        }
    }
    if let Some(n) = dma.filter(|&n| n > 0) {
        problems.push(format!("DMA-API debug: {n} errors"));
    }
    let out = AuditOut {
        verdict: if problems.is_empty() {
            "clean"
        } else {
            "leaked"
        },
        since,
        kmemleak_objects: kml.as_ref().map(|k| k.0),
        dma_api_errors: dma,
        findings,
        problems,
    };
    if json {
        print_json(&out)?;
    } else {
        println!(
            "{:<22} {}",
            "unload verdicts",
            out.findings
                .unloads
                .iter()
                .map(|u| u.verdict.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        for u in &out.findings.unloads {
            for (k, n) in &u.classes {
                println!("  leaked {k:<18} {n}");
            }
            for o in &u.objects {
                println!("  leaked object {o}");
            }
        }
        println!("{:<22} {}", "files reclaimed", out.findings.reclaims.len());
        println!("{:<22} {}", "planted leaks", out.findings.planted.len());
        println!(
            "{:<22} {}",
            "kmemleak",
            out.kmemleak_objects
                .map_or("not in this kernel".to_owned(), |n| format!("{n} objects"))
        );
        println!(
            "{:<22} {}",
            "DMA-API debug errors",
            out.dma_api_errors
                .map_or("not in this kernel".to_owned(), |n| n.to_string())
        );
        println!("verdict: {}", out.verdict);
        for p in &out.problems {
            println!("  {p}");
        }
    }
    if out.problems.is_empty() {
        Ok(())
    } else {
        Err(format!("audit: {}", out.problems.join("; ")))
    }
}

#[derive(Serialize)]
struct UnloadOut {
    unloaded: bool,
    verdict: &'static str,
    leaked: std::collections::BTreeMap<String, u64>,
}

fn unload(json: bool) -> CliResult {
    let st = dev::unload_with_verdict()?;
    let done = st.state & u64::from(uapi::ruvm_unload_state_bits_RUVM_UNLOAD_DONE) != 0;
    let leaked_bit = st.state & u64::from(uapi::ruvm_unload_state_bits_RUVM_UNLOAD_LEAKED) != 0;
    let out = UnloadOut {
        unloaded: true,
        verdict: match (done, leaked_bit) {
            (false, _) => "unknown",
            (true, false) => "clean",
            (true, true) => "leaked",
        },
        leaked: st
            .leaked
            .iter()
            .enumerate()
            .filter(|(_, n)| **n != 0)
            .map(|(i, n)| (class_name(i), *n))
            .collect(),
    };
    if json {
        print_json(&out)?;
    } else {
        println!("ruvm unloaded: verdict {}", out.verdict);
        for (k, n) in &out.leaked {
            println!("  leaked {k:<18} {n}");
        }
    }
    match out.verdict {
        "clean" => Ok(()),
        "leaked" => Err("ruvm unloaded with leaks".to_owned()),
        _ => Err("the module did not write its unload verdict".to_owned()),
    }
}

fn run(cli: Cli) -> CliResult {
    let d = || open(cli.fd);
    match cli.cmd {
        Cmd::Info(j) => info(&d()?, j.json),
        Cmd::Alloc {
            size,
            page_size,
            vidmem,
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
            let a = match vidmem {
                None => dev.mem_alloc(size, page_size, flags),
                Some(gpu) => dev.vidmem_alloc(gpu, size, page_size, flags),
            }
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
        Cmd::Copy(c) => d()?
            .mem_copy(c.dst, c.dst_offset, c.src, c.src_offset, c.length)
            .map_err(ioctl_err("RUVM_IOCTL_MEM_COPY")),
        Cmd::MmapFill { handle, range } => mmap_fill(&d()?, handle, &range, false, false),
        Cmd::MmapVerify {
            handle,
            range,
            json,
        } => mmap_fill(&d()?, handle, &range, true, json.json),
        Cmd::Gpus(j) => gpus(&d()?, j.json),
        Cmd::CeCopy { gpu, copy: c } => d()?
            .ce_copy(gpu, c.dst, c.dst_offset, c.src, c.src_offset, c.length)
            .map_err(ioctl_err("RUVM_IOCTL_CE_COPY")),
        Cmd::MapGpu { handle, gpu } => d()?
            .mem_gpu(true, handle, gpu)
            .map_err(ioctl_err("RUVM_IOCTL_MEM_MAP_GPU")),
        Cmd::UnmapGpu { handle, gpu } => d()?
            .mem_gpu(false, handle, gpu)
            .map_err(ioctl_err("RUVM_IOCTL_MEM_UNMAP_GPU")),
        Cmd::DmaAddrs { handle, gpu, json } => {
            let dev = d()?;
            let q = dev
                .mem_query(handle)
                .map_err(ioctl_err("RUVM_IOCTL_MEM_QUERY"))?;
            let addrs = dev
                .dma_addrs(handle, gpu, 0, q.chunk_count as usize)
                .map_err(ioctl_err("RUVM_IOCTL_MEM_DMA_ADDRS"))?;
            if json.json {
                return print_json(
                    &serde_json::json!({ "handle": handle, "gpu": gpu, "chunk_size": q.chunk_size, "addrs": addrs }),
                );
            }
            println!(
                "mem {handle} on GPU {gpu}: {} chunks of {}",
                addrs.len(),
                show_size(q.chunk_size)
            );
            for (i, a) in addrs.iter().enumerate() {
                println!("  chunk {i:>5}  {a:#014x}");
            }
            Ok(())
        }
        Cmd::GpuPhys {
            handle,
            gpu,
            offset,
            length,
            json,
        } => {
            let (addr, aperture) = d()?
                .gpu_phys(handle, gpu, offset, length)
                .map_err(ioctl_err("RUVM_IOCTL_MEM_GPU_PHYS"))?;
            let aperture = if aperture == uapi::ruvm_aperture_RUVM_APERTURE_VID {
                "vidmem"
            } else {
                "sysmem"
            };
            if json.json {
                return print_json(&serde_json::json!({
                    "handle": handle, "gpu": gpu, "offset": offset, "length": length,
                    "address": addr, "aperture": aperture,
                }));
            }
            println!(
                "mem {handle} [{offset:#x}, +{length:#x}) on GPU {gpu}: {aperture} {addr:#014x}"
            );
            Ok(())
        }
        Cmd::Pmm(j) => pmm(&d()?, j.json),
        Cmd::PmmCheckLeak {
            gpu,
            chunk_size,
            limit,
            json,
        } => {
            let r = d()?
                .pmm_check_leak(gpu, chunk_size, limit.unwrap_or(u64::MAX))
                .map_err(ioctl_err("RUVM_IOCTL_PMM_CHECK_LEAK"))?;
            let clean = r.free_after == r.free_before;
            if json.json {
                print_json(&serde_json::json!({
                    "gpu": gpu, "chunk_size": chunk_size, "allocated": r.allocated,
                    "free_before": r.free_before, "free_after": r.free_after, "clean": clean,
                }))?;
            } else {
                println!(
                    "GPU {gpu}: took {} chunks of {}, gave them back; free {} -> {} bytes: {}",
                    r.allocated,
                    show_size(chunk_size),
                    r.free_before,
                    r.free_after,
                    if clean { "no leak" } else { "LEAK" }
                );
            }
            if clean {
                Ok(())
            } else {
                Err("the PMM did not get back all it had free".to_owned())
            }
        }
        Cmd::Stats {
            json,
            reset_peaks,
            watch,
        } => {
            let dev = d()?;
            let Some(secs) = watch else {
                return stats(&dev, json.json, reset_peaks);
            };
            if !(secs > 0.0 && secs.is_finite()) {
                return Err("--watch takes a positive number of seconds".to_owned());
            }
            loop {
                stats(&dev, json.json, reset_peaks)?;
                println!();
                std::thread::sleep(std::time::Duration::from_secs_f64(secs));
            }
        }
        Cmd::Audit {
            json, mark: true, ..
        } => {
            let id = audit::write_marker().map_err(|e| format!("writing to /dev/kmsg: {e}"))?;
            if json.json {
                print_json(&serde_json::json!({ "mark": id }))
            } else {
                println!("{id}");
                Ok(())
            }
        }
        Cmd::Audit {
            json,
            since,
            require_unload,
            no_kmemleak,
            ..
        } => audit_cmd(json.json, since, require_unload, no_kmemleak),
        Cmd::Unload(j) => unload(j.json),
        Cmd::TestLeak {
            what,
            count,
            size,
            order,
            mapped,
            lost,
        } => {
            let mut flags = 0;
            if lost {
                flags |= uapi::ruvm_leak_flags_RUVM_LEAK_LOST;
            }
            if mapped {
                flags |= uapi::ruvm_leak_flags_RUVM_LEAK_MAPPED;
            }
            let what = match what {
                Leak::Mem => uapi::ruvm_leak_RUVM_LEAK_MEM,
                Leak::Chunk => uapi::ruvm_leak_RUVM_LEAK_CHUNK,
                Leak::KernelMap => uapi::ruvm_leak_RUVM_LEAK_KERNEL_MAP,
            };
            d()?.test_leak(what, flags, count, size, order)
                .map_err(ioctl_err("RUVM_IOCTL_TEST_LEAK"))
        }
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
            eprintln!("ruvmctl: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::class_name;

    #[test]
    fn class_names_match_the_module() {
        assert_eq!(class_name(0), "mems");
        assert_eq!(class_name(4), "user_mappings");
        assert_eq!(class_name(5), "sysmem_chunks_o0");
        assert_eq!(class_name(15), "sysmem_chunks_o10");
        assert_eq!(class_name(16), "dma_mappings");
        assert_eq!(class_name(17), "dma_bytes");
        assert_eq!(class_name(18), "vidmem_bytes");
        assert_eq!(class_name(19), "vidmem_chunks");
        assert_eq!(class_name(20), "vidmem_roots");
        assert_eq!(class_name(23), "reserved_23");
    }
}
