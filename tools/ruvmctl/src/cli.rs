// SPDX-License-Identifier: GPL-2.0

//! The command-line grammar of ruvmctl (clap): every subcommand and its arguments. Nothing here
//! runs anything; `cmd/` does.

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::units::parse_size;

mod actions;
pub use actions::*;

#[derive(Parser)]
#[command(name = "ruvmctl", version = libruvm::VERSION, about = "Drive the ruvm kernel module through /dev/ruvm")]
pub struct Cli {
    /// Use this inherited descriptor of /dev/ruvm instead of opening it (mems live as long as
    /// the descriptor does).
    #[arg(long, global = true, value_name = "N")]
    pub fd: Option<i32>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Args)]
pub struct Json {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct Range {
    /// First byte (e.g. 0, 4K).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub offset: u64,
    /// Bytes (default: the mem's size from the offset on).
    #[arg(long, value_parser = parse_size)]
    pub length: Option<u64>,
    /// The pattern's seed (default: the mem's size, uvm_mem_test's pattern).
    #[arg(long, value_parser = parse_size)]
    pub seed: Option<u64>,
    /// Fill with this byte instead of the pattern.
    #[arg(long, value_parser = parse_size, conflicts_with = "seed")]
    pub byte: Option<u64>,
}

/// What to copy, from which mem to which.
#[derive(Args)]
pub struct CopyArgs {
    pub dst: u64,
    pub src: u64,
    /// Bytes to copy.
    #[arg(long, value_parser = parse_size)]
    pub length: u64,
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub dst_offset: u64,
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub src_offset: u64,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// libruvm's user-space stream-ordered allocator: blocks carved from segments the kernel
    /// maps once; replay allocation traces through it.
    Allocator {
        #[command(subcommand)]
        action: AllocatorAction,
    },
    /// Mems as dma-bufs: export one for another process or device, import one of ruvm's.
    Dmabuf {
        #[command(subcommand)]
        action: DmabufAction,
    },
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
        /// A sparse mem: every chunk absent until `mem populate` (RUVM_ALLOC_SPARSE).
        #[arg(long, conflicts_with_all = ["fallback", "vidmem", "pool"])]
        sparse: bool,
        /// Take the chunks from this pool of the file (`pool create`); the chunk size is the
        /// pool's.
        #[arg(long, value_name = "POOL")]
        pool: Option<u64>,
        #[command(flatten)]
        json: Json,
    },
    /// Memory pools (RUVM_IOCTL_POOL_*): cached chunks, still zeroed and DMA-mapped, with
    /// CUDA's pool attributes. A pool belongs to the file: use --fd across commands.
    Pool {
        #[command(subcommand)]
        action: PoolAction,
    },
    /// Free a mem (RUVM_IOCTL_MEM_FREE).
    Free {
        handle: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Pinned heaps (libruvm::heap): mimalloc arenas over sparse mems, malloc-speed pinned
    /// memory given back when free.
    Heap {
        #[command(subcommand)]
        action: HeapAction,
    },
    /// Vidmem limits and holdings: each GPU's dmem cgroup region and ruvm's per-user limit
    /// (RUVM_IOCTL_VIDMEM_LIMIT).
    Vidmem {
        #[command(subcommand)]
        action: VidmemAction,
    },
    /// Ranges of a sparse mem (`alloc --sparse`): made resident and given back
    /// (RUVM_IOCTL_MEM_RANGE); memory of ruvmctl's own registered (RUVM_IOCTL_MEM_REGISTER).
    Mem {
        #[command(subcommand)]
        action: MemAction,
    },
    /// A mem's export data (RUVM_IOCTL_MEM_EXPORT, cudaMemPoolExportPointer): its pool and 64
    /// bytes in hex, which `import` takes in another file that imported the pool.
    Export {
        handle: u64,
        #[command(flatten)]
        json: Json,
    },
    /// A mem of this file sharing an exported mem's chunks (RUVM_IOCTL_MEM_IMPORT,
    /// cudaMemPoolImportPointer), through POOL (imported with `pool import`).
    Import {
        pool: u64,
        /// The export data, 128 hex digits (from `export`).
        data: String,
        #[command(flatten)]
        json: Json,
    },
    /// What an address is: which mem, where in it, its pool and GPU mappings
    /// (RUVM_IOCTL_PTR_ATTRS, cudaPointerGetAttributes); "not ruvm memory" for any other
    /// address. An address means something in ruvmctl's own process only: ADDR is looked up
    /// there, and --alloc SIZE makes a mem (from --pool, DMA-mapped for --gpu), maps it, shows
    /// the attributes of the byte at --at, and frees it.
    Ptr {
        /// The address (hex with 0x, or decimal).
        #[arg(value_parser = parse_addr, required_unless_present = "alloc", conflicts_with = "alloc")]
        addr: Option<u64>,
        /// Allocate a mem of this size and map it (e.g. 4096, 64K, 7M+17).
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        alloc: Option<u64>,
        /// With --alloc: take its chunks from this pool of the file (`pool create`; use --fd).
        #[arg(long, value_name = "POOL", requires = "alloc", conflicts_with = "addr")]
        pool: Option<u64>,
        /// With --alloc: DMA-map it for this GPU (RUVM_IOCTL_MEM_MAP_GPU).
        #[arg(long, value_name = "GPU", requires = "alloc", conflicts_with = "addr")]
        gpu: Option<u32>,
        /// With --alloc: the byte of the mapping to look up (default 0, its first).
        #[arg(long, value_name = "OFFSET", value_parser = parse_size, requires = "alloc", conflicts_with = "addr")]
        at: Option<u64>,
        #[command(flatten)]
        json: Json,
    },
    /// Everything a mem knows about itself (RUVM_IOCTL_MEM_QUERY).
    Query {
        handle: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Map a mem for the CPU kernel (RUVM_IOCTL_MEM_MAP_CPU_KERNEL); idempotent.
    MapKernel {
        handle: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Remove its CPU kernel mapping (RUVM_IOCTL_MEM_UNMAP_CPU_KERNEL); idempotent.
    UnmapKernel {
        handle: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Write the pattern (or a byte) through the kernel mapping (RUVM_IOCTL_MEM_FILL).
    Fill {
        handle: u64,
        #[command(flatten)]
        range: Range,
        #[command(flatten)]
        json: Json,
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
        #[command(flatten)]
        copy: CopyArgs,
        #[command(flatten)]
        json: Json,
    },
    /// Write the pattern (or a byte) through a user mapping (mmap of /dev/ruvm).
    MmapFill {
        handle: u64,
        #[command(flatten)]
        range: Range,
        #[command(flatten)]
        json: Json,
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
    /// Attach or detach a host GPU by PCI address (root).
    Gpu {
        #[command(subcommand)]
        action: GpuAction,
    },
    /// DMA-map every chunk of a mem for a GPU (RUVM_IOCTL_MEM_MAP_GPU); with --kernel map it
    /// at its GPU kernel VA (RUVM_IOCTL_MEM_MAP_GPU_KERNEL), with --user VA at a GPU VA of this
    /// file's (RUVM_IOCTL_MEM_MAP_GPU_USER); idempotent.
    MapGpu {
        handle: u64,
        gpu: u32,
        /// Map it at its GPU kernel VA (DMA-mapping it first if it is sysmem).
        #[arg(long)]
        kernel: bool,
        /// Map it at this VA of the file's user VA space on the GPU.
        #[arg(long, value_parser = parse_size, conflicts_with = "kernel")]
        user: Option<u64>,
        /// With --user: read-only for the GPU.
        #[arg(long, requires = "user")]
        read_only: bool,
        #[command(flatten)]
        json: Json,
    },
    /// Drop a mem's DMA table for a GPU and its GPU virtual mappings (RUVM_IOCTL_MEM_UNMAP_GPU);
    /// with --kernel only its GPU kernel VA mapping (RUVM_IOCTL_MEM_UNMAP_GPU_KERNEL), with
    /// --user only its GPU user mapping (RUVM_IOCTL_MEM_UNMAP_GPU_USER); idempotent.
    UnmapGpu {
        handle: u64,
        gpu: u32,
        /// Drop only the GPU kernel VA mapping.
        #[arg(long)]
        kernel: bool,
        /// Drop only the GPU user VA mapping.
        #[arg(long, conflicts_with = "kernel")]
        user: bool,
        #[command(flatten)]
        json: Json,
    },
    /// Where a GPU sees a mem: its kernel VA, or with --user its user VA
    /// (RUVM_IOCTL_MEM_GPU_VA).
    GpuVa {
        handle: u64,
        gpu: u32,
        /// The user VA space of this file.
        #[arg(long)]
        user: bool,
        #[command(flatten)]
        json: Json,
    },
    /// Copy bytes with a GPU's copy engine between GPU virtual addresses of its kernel VA
    /// space (RUVM_IOCTL_CE_COPY_VA; root only), or with --user of this file's user VA space.
    /// An MMU fault fails with EFAULT.
    CeCopyVa {
        /// The user VA space of this file.
        #[arg(long)]
        user: bool,
        gpu: u32,
        /// Destination GPU VA (e.g. 0x180000000000).
        #[arg(value_parser = parse_size)]
        dst: u64,
        /// Source GPU VA.
        #[arg(value_parser = parse_size)]
        src: u64,
        /// Bytes.
        #[arg(value_parser = parse_size)]
        length: u64,
        #[command(flatten)]
        json: Json,
    },
    /// The GPU MMU's walk of one VA of its kernel VA space (or with --user of this file's),
    /// level by level (RUVM_IOCTL_GPU_PT_WALK; root only).
    PtDump {
        /// The user VA space of this file.
        #[arg(long)]
        user: bool,
        gpu: u32,
        #[arg(value_parser = parse_size)]
        va: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Copy bytes between mems with a GPU's copy engine, through their DMA tables for it
    /// (RUVM_IOCTL_CE_COPY). Slow on the test GPUs: ~0.2 s per 4 KiB. With --async --stream S
    /// the copy is queued on stream S of that GPU (RUVM_OP_COPY), then waited for with a
    /// progress bar on a terminal, unless --no-wait.
    CeCopy {
        gpu: u32,
        #[command(flatten)]
        copy: CopyArgs,
        /// Queue the copy on a stream instead of copying now.
        #[arg(long = "async", requires = "stream")]
        asynchronous: bool,
        /// With --async: the stream (of GPU GPU) to queue it on.
        #[arg(long, requires = "asynchronous")]
        stream: Option<u64>,
        /// With --async: return once it is queued.
        #[arg(long, requires = "asynchronous")]
        no_wait: bool,
        #[command(flatten)]
        json: Json,
    },
    /// Streams of work on a GPU's copy engine (RUVM_IOCTL_STREAM_*), run in order and
    /// asynchronously. A stream belongs to the file: use --fd across commands.
    Stream {
        #[command(subcommand)]
        action: StreamAction,
    },
    /// Events: points recorded on streams, exported as sync_files (RUVM_IOCTL_EVENT_*). An
    /// event belongs to the file: use --fd across commands.
    Event {
        #[command(subcommand)]
        action: EventAction,
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
    /// Leak resources on purpose (needs enable_test_ioctls=1 and CAP_SYS_ADMIN). Test-only:
    /// hidden from the main help.
    #[command(hide = true)]
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
    /// Random operations from several processes and threads, every errno checked against the
    /// documentation, and nothing left at the end. Exits 1 on any problem.
    Fuzz {
        /// The seed (printed; the same seed gives each worker the same operations).
        #[arg(long)]
        seed: Option<u64>,
        /// Stop after this many operations.
        #[arg(long, default_value_t = 100_000)]
        ops: u64,
        /// Stop after this many seconds.
        #[arg(long, default_value_t = 60.0)]
        duration: f64,
        /// Worker processes.
        #[arg(long, default_value_t = 3)]
        procs: usize,
        /// Threads in each worker.
        #[arg(long, default_value_t = 3)]
        threads: usize,
        /// Also unbind and rebind the edu GPUs now and then, half the time attaching the
        /// unbound device as a host GPU in between (root).
        #[arg(long)]
        unbind: bool,
        /// Also SIGKILL workers now and then (and start new ones).
        #[arg(long)]
        kill: bool,
        /// The longest a GPU removal (with --unbind) may take, in seconds, before it counts as
        /// a problem: the liveness bound.
        #[arg(long, default_value_t = 10)]
        removal_bound: u64,
        /// The largest mem a valid allocation asks for (absurd sizes are tried too).
        #[arg(long, default_value = "8M", value_parser = parse_size)]
        max_size: u64,
        /// Run the workers in a memory cgroup of this size (root; cgroup2's memory controller),
        /// and fail if the kernel's slab and vmalloc memory grows more than --kmem-bound beyond
        /// what that cgroup is charged.
        #[arg(long, value_parser = parse_size)]
        memcg: Option<u64>,
        /// How far kernel memory may grow beyond the workers' charge (with --memcg).
        #[arg(long, default_value = "48M", value_parser = parse_size)]
        kmem_bound: u64,
        /// The workers drop root (to uid and gid 65534) once in their cgroup; /dev/ruvm is made
        /// world-accessible for them.
        #[arg(long)]
        unprivileged: bool,
    },
    /// Measure ruvm against the kernel and user space (root): every case with its baseline
    /// interleaved, a table of ratios and goals. Reports, never fails on a missed goal.
    Bench {
        /// Measured pairs per case (after a warm-up pair).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// The largest sysmem mem (and baseline mapping) a case uses.
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        max_size: u64,
        /// Also print the samples and the table as BENCH-JSON / BENCH-TABLE lines (for the
        /// host: see bench-report).
        #[arg(long)]
        json: bool,
        /// Run only this group of cases (g1, g2, g3, g4, g5, copy, mem, va, pool, streams,
        /// stream_alloc, ipc, ualloc; repeat for several).
        #[arg(long)]
        only: Vec<String>,
    },
    /// From a guest console log with BENCH-JSON lines: write results.json, table.json and
    /// scaling.svg into a directory and print the table.
    BenchReport {
        /// The console log of the bench run.
        log: std::path::PathBuf,
        /// Where to write the files.
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Make the module misbehave on purpose (needs enable_test_ioctls=1 and CAP_SYS_ADMIN).
    /// Test-only: hidden from the main help.
    #[command(hide = true)]
    TestPlant {
        /// What to plant.
        what: Plant,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Leak {
    /// A sysmem mem.
    Mem,
    /// One sysmem chunk.
    Chunk,
    /// A CPU kernel mapping (with its one-page chunk).
    KernelMap,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Plant {
    /// Hit a WARN_ON in the module.
    Warn,
    /// The next stream submission holds its stream's turn for 10 s (or until a signal).
    SlowSubmit,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn pool_import_takes_its_descriptor_beside_the_global_fd() {
        let c =
            Cli::try_parse_from(["ruvmctl", "--fd", "4", "pool", "import", "5"]).expect("parses");
        assert_eq!(c.fd, Some(4));
        match c.cmd {
            Cmd::Pool {
                action: PoolAction::Import { descriptor: 5, .. },
            } => {}
            _ => panic!("pool import 5"),
        }
    }

    #[test]
    fn addresses_are_hex_or_decimal() {
        assert_eq!(parse_addr("0x7fff0000"), Ok(0x7fff_0000));
        assert_eq!(parse_addr("0X10"), Ok(16));
        assert_eq!(parse_addr("4096"), Ok(4096));
        assert_eq!(parse_addr("0xffffffffffffffff"), Ok(u64::MAX));
        assert!(parse_addr("0x").is_err());
        assert!(parse_addr("12g").is_err());
        assert!(parse_addr("0x1_0000_0000_0000_0000").is_err());
    }

    #[test]
    fn ptr_takes_an_address_or_an_allocation() {
        let ptr = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("ruvmctl").chain(args.iter().copied()))
                .map(|c| c.cmd)
        };
        match ptr(&["ptr", "0x1000", "--json"]) {
            Ok(Cmd::Ptr {
                addr: Some(0x1000),
                alloc: None,
                json,
                ..
            }) => assert!(json.json),
            _ => panic!("ptr 0x1000 --json"),
        }
        match ptr(&[
            "ptr", "--alloc", "64K", "--pool", "2", "--gpu", "1", "--at", "4K",
        ]) {
            Ok(Cmd::Ptr {
                addr: None,
                alloc: Some(65536),
                pool: Some(2),
                gpu: Some(1),
                at: Some(4096),
                ..
            }) => {}
            _ => panic!("ptr --alloc 64K --pool 2 --gpu 1 --at 4K"),
        }
        assert!(ptr(&["ptr"]).is_err(), "neither an address nor --alloc");
        assert!(ptr(&["ptr", "0x1000", "--alloc", "4K"]).is_err(), "both");
        assert!(
            ptr(&["ptr", "0x1000", "--pool", "2"]).is_err(),
            "--pool without --alloc"
        );
        assert!(
            ptr(&["ptr", "0x1000", "--at", "2"]).is_err(),
            "--at without --alloc"
        );
    }
}
