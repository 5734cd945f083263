// SPDX-License-Identifier: GPL-2.0

//! The subcommands of the nouns: `heap`, `mem`, `gpu`, `allocator`, `dmabuf`, `pool`, `stream`,
//! `event` (each a `...Action` enum under [`super::Cmd`]).

use super::*;

/// `ruvmctl heap ...`.
#[derive(Subcommand)]
pub enum HeapAction {
    /// Replay a generated trace's mallocs and frees through a new pinned heap, then collect;
    /// print its figures (time per pair, resident peak against the live peak, commits and
    /// decommits, what is left after the collect).
    Run {
        /// The trace's class (`allocator trace` classes).
        #[arg(long, value_enum, default_value = "training")]
        class: crate::trace::Class,
        /// Iterations after the warm-up.
        #[arg(long, default_value = "20")]
        iterations: u32,
        /// DMA-map the heap for this GPU (repeat for more).
        #[arg(long = "gpu", value_name = "GPU")]
        gpus: Vec<u32>,
        /// The arena's size.
        #[arg(long, default_value = "256M", value_parser = parse_size)]
        arena: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Copy a pattern from one block of a new pinned heap (DMA-mapped for GPU) to another with
    /// the GPU's copy engine, naming both blocks by their pointers (RUVM_OP_SRC_PTR,
    /// RUVM_OP_DST_PTR), and check the bytes: at once (RUVM_IOCTL_CE_COPY), or queued on a
    /// new stream of the GPU and waited for (--stream).
    Copy {
        gpu: u32,
        /// Bytes to copy (each block's size).
        #[arg(long, default_value = "64K", value_parser = parse_size)]
        size: u64,
        /// Queue the copy on a new stream (RUVM_OP_COPY) instead of copying now.
        #[arg(long)]
        stream: bool,
        #[command(flatten)]
        json: Json,
    },
}

/// `ruvmctl mem ...`.
#[derive(Subcommand)]
pub enum MemAction {
    /// Make every absent chunk of a range resident: zeroed, charged, DMA-mapped for the mem's
    /// GPUs (RUVM_RANGE_POPULATE).
    Populate(MemRange),
    /// Give every resident chunk of a range back (RUVM_RANGE_RELEASE); refused while queued
    /// work holds one.
    Release(MemRange),
    /// Register memory of ruvmctl's own as a mem (RUVM_IOCTL_MEM_REGISTER, cudaHostRegister):
    /// SIZE bytes mapped anonymously and written with the pattern (or a file's pages with
    /// --file, mapped shared and writable), registered, read by a GPU's copy engine with --gpu, then
    /// ended: unregistered (MEM_FREE), or with --unmap by unmapping the range (the kernel
    /// revokes it). Shows VmPin before, during and after.
    Register {
        /// Bytes, a multiple of the page size (e.g. 64K, 2M).
        #[arg(value_parser = parse_size)]
        size: u64,
        /// Register the first SIZE bytes of this file's pages (mapped shared).
        #[arg(long, value_name = "PATH")]
        file: Option<std::path::PathBuf>,
        /// Have this GPU's copy engine read the registered bytes and compare them.
        #[arg(long, value_name = "GPU")]
        gpu: Option<u32>,
        /// End the registration by unmapping its range rather than by MEM_FREE.
        #[arg(long)]
        unmap: bool,
        #[command(flatten)]
        json: Json,
    },
    /// Unregister a registered mem of the file (MEM_FREE of it; refused for any other mem).
    Unregister {
        handle: u64,
        #[command(flatten)]
        json: Json,
    },
}

/// A range of a sparse mem.
#[derive(Args)]
pub struct MemRange {
    pub handle: u64,
    /// First byte, a multiple of the chunk size.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub offset: u64,
    /// Bytes, a multiple of the chunk size (default: the mem's physical size from the offset
    /// on).
    #[arg(long, value_parser = parse_size)]
    pub length: Option<u64>,
    #[command(flatten)]
    pub json: Json,
}

/// `ruvmctl gpu ...`.
#[derive(Subcommand)]
pub enum GpuAction {
    /// Register the PCI device at ADDRESS (as `lspci -D` writes it: 0000:65:00.0) as a host GPU,
    /// DMA mapping only, never bound (RUVM_IOCTL_GPU_ATTACH).
    Attach {
        address: String,
        #[command(flatten)]
        json: Json,
    },
    /// Remove the host GPU at ADDRESS as an unbind would: its DMA tables are dropped, its mems
    /// stay (RUVM_IOCTL_GPU_DETACH).
    Detach {
        address: String,
        #[command(flatten)]
        json: Json,
    },
    /// The GPU's current pool for this file, which `stream alloc` without --pool takes from
    /// (RUVM_IOCTL_GPU_POOL, cudaDeviceGetMemPool); with --set make another pool of the file
    /// current (cudaDeviceSetMemPool), 0 for the GPU's default pool again. Prints the pool's
    /// attributes. The setting belongs to the file: use --fd across commands.
    Pool {
        gpu: u32,
        /// Make this pool of the file the GPU's current pool (0: its default pool).
        #[arg(long, value_name = "POOL")]
        set: Option<u64>,
        #[command(flatten)]
        json: Json,
    },
}

/// `ruvmctl allocator ...`.
#[derive(Subcommand)]
pub enum AllocatorAction {
    /// Replay an allocation trace (a file in the text form `allocator trace` prints, or a
    /// generated --class) one call at a time through the allocator, and print its time per
    /// alloc + free pair, hits, footprint and give-back.
    Replay {
        /// The trace file (events: alloc ID SIZE STREAM, use ID STREAM, free ID STREAM,
        /// record EVENT STREAM, wait EVENT STREAM, sync STREAM, trim BYTES).
        #[arg(required_unless_present = "class", conflicts_with = "class")]
        file: Option<std::path::PathBuf>,
        /// A generated trace of this shape instead of a file.
        #[arg(long, value_enum)]
        class: Option<crate::trace::Class>,
        /// Iterations of the generated trace.
        #[arg(long, default_value_t = 50)]
        iterations: u32,
        /// The generator's seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The GPU whose streams run the trace's work (default: a GPU with a copy engine,
        /// simulated first).
        #[arg(long)]
        gpu: Option<u32>,
        /// Idle bytes kept at a synchronize (`max`: none given back there).
        #[arg(long, default_value = "max", value_parser = parse_threshold)]
        threshold: u64,
        /// Do not take another stream's frees once known complete.
        #[arg(long)]
        no_opportunistic: bool,
        /// Do not follow event dependencies to another stream's frees.
        #[arg(long)]
        no_event_dependencies: bool,
        /// Do not insert waits to take another stream's frees.
        #[arg(long)]
        no_internal_dependencies: bool,
        /// Also replay the trace through fresh mems (MEM_ALLOC + MEM_MAP_GPU ... MEM_FREE)
        /// and print the ratio.
        #[arg(long)]
        baseline: bool,
        #[command(flatten)]
        json: Json,
    },
    /// Print a generated trace in the text form `allocator replay` reads.
    Trace {
        #[arg(long, value_enum)]
        class: crate::trace::Class,
        #[arg(long, default_value_t = 50)]
        iterations: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        json: Json,
    },
}

/// A size, or `max` for ~0 (a threshold that never gives memory back).
pub(super) fn parse_threshold(s: &str) -> Result<u64, String> {
    if s == "max" {
        Ok(u64::MAX)
    } else {
        parse_size(s)
    }
}

/// An address: hex with `0x` (or `0X`), or decimal.
pub fn parse_addr(s: &str) -> Result<u64, String> {
    let t = s.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => t.parse(),
    }
    .map_err(|_| format!("'{s}' is not an address (hex with 0x, or decimal)"))
}

/// A reuse policy's setting: `on` (or 1) or `off` (or 0).
pub(super) fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "1" => Ok(true),
        "off" | "0" => Ok(false),
        _ => Err(format!("'{s}' is not on or off")),
    }
}

/// `ruvmctl dmabuf ...`.
#[derive(Subcommand)]
pub enum DmabufAction {
    /// Export mem H as a dma-buf (RUVM_IOCTL_MEM_EXPORT_DMABUF) and run CMD (with `sh -c`)
    /// with it inherited, its number in $RUVM_DMABUF_FD: e.g. `ruvmctl --fd 3 dmabuf export H
    /// --run 'ruvmctl dmabuf import $RUVM_DMABUF_FD'`. Fails if CMD does.
    Export {
        handle: u64,
        /// The command to run with the descriptor.
        #[arg(long, value_name = "CMD")]
        run: String,
        #[command(flatten)]
        json: Json,
    },
    /// Import an inherited dma-buf descriptor that ruvm exported (RUVM_IOCTL_MEM_IMPORT_DMABUF):
    /// prints the new mem's handle (use --fd to keep it).
    Import {
        /// The descriptor number (`$RUVM_DMABUF_FD` under `dmabuf export --run`).
        #[arg(value_name = "FD")]
        descriptor: i32,
        #[command(flatten)]
        json: Json,
    },
    /// The fences of an inherited dma-buf descriptor's reservation object that a reader (or,
    /// with --write, a writer) waits for, as a sync_file (DMA_BUF_IOCTL_EXPORT_SYNC_FILE): its
    /// status and fences.
    Fences {
        #[arg(value_name = "FD")]
        descriptor: i32,
        /// A writer's view: every fence, readers' too.
        #[arg(long)]
        write: bool,
        #[command(flatten)]
        json: Json,
    },
}

/// `ruvmctl pool ...`.
#[derive(Subcommand)]
pub enum PoolAction {
    /// Make a pool of sysmem, or with --vidmem of a GPU's memory (RUVM_IOCTL_POOL_CREATE);
    /// prints its handle and attributes. Allocate from a vidmem pool with
    /// `alloc --pool P --vidmem GPU`.
    Create {
        /// Cache this GPU's memory (vidmem) instead of sysmem.
        #[arg(long, value_name = "GPU")]
        vidmem: Option<u32>,
        /// Chunk size of its mems (default: the page size); a power of two up to 2M.
        #[arg(long, default_value = "0", value_parser = parse_size)]
        page_size: u64,
        /// Bytes the pool may keep reserved before a free gives memory back (`max`: never).
        #[arg(long, default_value = "0", value_parser = parse_threshold)]
        threshold: u64,
        /// Make it shareable with other processes (RUVM_POOL_EXPORTABLE; sysmem only).
        #[arg(long)]
        exportable: bool,
        #[command(flatten)]
        json: Json,
    },
    /// Export an exportable pool as a descriptor (RUVM_IOCTL_POOL_EXPORT) and run CMD (with
    /// `sh -c`) with it inherited, its number in $RUVM_POOL_FD: e.g. `ruvmctl --fd 3 pool export
    /// P --run 'ruvmctl --fd 4 pool import $RUVM_POOL_FD'`. Fails if CMD does.
    Export {
        pool: u64,
        /// The command to run with the descriptor.
        #[arg(long, value_name = "CMD")]
        run: String,
        #[command(flatten)]
        json: Json,
    },
    /// Import the pool of an inherited descriptor (RUVM_IOCTL_POOL_IMPORT); prints its handle
    /// in this file (the pool's own). An imported pool cannot allocate.
    Import {
        /// The descriptor number (`$RUVM_POOL_FD` under `pool export --run`).
        #[arg(value_name = "FD")]
        descriptor: i32,
        #[command(flatten)]
        json: Json,
    },
    /// Two processes sharing a pool (CUDA's IPC pools): this one exports an exportable pool
    /// and a mem of it (RUVM_IOCTL_POOL_EXPORT, RUVM_IOCTL_MEM_EXPORT); a forked child with its
    /// own open file imports both (SCM_RIGHTS where the kernel has AF_UNIX), reads the bytes,
    /// is refused an allocation, writes its own and frees first; this one reads them back.
    Share {
        /// Bytes of the shared mem.
        #[arg(long, default_value = "64K", value_parser = parse_size)]
        size: u64,
        /// Also read the import with this GPU's copy engine, in the importer.
        #[arg(long)]
        gpu: Option<u32>,
        #[command(flatten)]
        json: Json,
    },
    /// Destroy a pool (RUVM_IOCTL_POOL_DESTROY); EBUSY while a mem of it is alive.
    Destroy {
        pool: u64,
        #[command(flatten)]
        json: Json,
    },
    /// A pool's attributes (RUVM_IOCTL_POOL_GET).
    Get {
        pool: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Change the release threshold, reset a high watermark, or turn a reuse policy of chunks
    /// freed on a stream on or off (RUVM_IOCTL_POOL_SET).
    Set {
        pool: u64,
        /// The new release threshold (`max`: never give back).
        #[arg(long, value_parser = parse_threshold, group = "what")]
        threshold: Option<u64>,
        /// Reset the reserved high watermark to the current value.
        #[arg(long, group = "what")]
        reset_reserved_high: bool,
        /// Reset the used high watermark to the current value.
        #[arg(long, group = "what")]
        reset_used_high: bool,
        /// Reuse a stream's freed chunks on a stream that waited for an event recorded after
        /// the free (cudaMemPoolReuseFollowEventDependencies): on or off.
        #[arg(long, value_name = "ON|OFF", value_parser = parse_on_off, group = "what")]
        follow_event_dependencies: Option<bool>,
        /// Reuse freed chunks once their stream has reached the free, without a dependency
        /// (cudaMemPoolReuseAllowOpportunistic): on or off.
        #[arg(long, value_name = "ON|OFF", value_parser = parse_on_off, group = "what")]
        allow_opportunistic: Option<bool>,
        /// When no other memory can be had, reuse freed chunks and make the allocating stream
        /// wait for the free (cudaMemPoolReuseAllowInternalDependencies): on or off.
        #[arg(long, value_name = "ON|OFF", value_parser = parse_on_off, group = "what")]
        allow_internal_dependencies: Option<bool>,
        #[command(flatten)]
        json: Json,
    },
    /// Give back cached memory until at most KEEP bytes stay reserved (RUVM_IOCTL_POOL_TRIM).
    Trim {
        pool: u64,
        #[arg(value_parser = parse_size, default_value = "0")]
        keep: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Keep the pool's chunks DMA-mapped for a GPU, or with --revoke stop
    /// (RUVM_IOCTL_POOL_SET_ACCESS).
    Access {
        pool: u64,
        gpu: u32,
        #[arg(long)]
        revoke: bool,
        #[command(flatten)]
        json: Json,
    },
}

/// A wait's bound in milliseconds: 1 to RUVM_WAIT_MAX_MS.
pub(super) fn parse_timeout_ms(s: &str) -> Result<u32, String> {
    let max = libruvm::uapi::RUVM_WAIT_MAX_MS;
    match s.parse::<u32>() {
        Ok(ms) if (1..=max).contains(&ms) => Ok(ms),
        _ => Err(format!(
            "'{s}' is not a number of milliseconds from 1 to {max}"
        )),
    }
}

/// `ruvmctl stream ...`.
#[derive(Subcommand)]
pub enum StreamAction {
    /// Make a stream on a GPU with a copy engine (RUVM_IOCTL_STREAM_CREATE); prints its handle
    /// and fence context. A stream belongs to the file: use --fd across commands.
    Create {
        /// The GPU whose copy engine runs the stream's work.
        #[arg(long)]
        gpu: u32,
        #[command(flatten)]
        json: Json,
    },
    /// Destroy a stream (RUVM_IOCTL_STREAM_DESTROY): returns at once, and the work already
    /// queued runs to its end.
    Destroy {
        stream: u64,
        #[command(flatten)]
        json: Json,
    },
    /// A stream's progress, and its error if one of its operations failed
    /// (RUVM_IOCTL_STREAM_QUERY).
    Query {
        stream: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Allocate a mem in stream order (RUVM_OP_ALLOC, cudaMallocAsync) from a sysmem pool of
    /// the file, or without --pool from the current pool of the stream's GPU (`gpu pool`);
    /// prints its handle and mmap offset. Its chunks may be in use by work queued before the
    /// free that gave them back: use the mem on this stream (or after an event recorded on
    /// it). A mem belongs to the file: use --fd across commands.
    Alloc {
        stream: u64,
        /// Size, e.g. 4096, 64K, 7M+17.
        #[arg(value_parser = parse_size)]
        size: u64,
        /// Take the chunks from this pool of the file (`pool create`).
        #[arg(long, value_name = "POOL")]
        pool: Option<u64>,
        /// Zero the memory (when the stream reaches the allocation).
        #[arg(long)]
        zero: bool,
        #[command(flatten)]
        json: Json,
    },
    /// Free a mem in stream order (RUVM_OP_FREE, cudaFreeAsync): its handle and user mappings
    /// go at once, its chunks when the stream reaches the free (a pool's then wait in the pool,
    /// pending, until a synchronize observes the free).
    Free {
        stream: u64,
        /// The mem (any mem of the file).
        handle: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Wait until the work submitted to a stream, or with --all to every stream of the file,
    /// is done (RUVM_IOCTL_STREAM_SYNC). Exits 1 if a stream is in error or on the timeout.
    Sync {
        /// The stream (none with --all).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        stream: Option<u64>,
        /// Every stream of the file.
        #[arg(long)]
        all: bool,
        /// The longest wait, in milliseconds.
        #[arg(long, default_value = "60000", value_parser = parse_timeout_ms)]
        timeout_ms: u32,
        #[command(flatten)]
        json: Json,
    },
}

/// `ruvmctl event ...`.
#[derive(Subcommand)]
pub enum EventAction {
    /// Make an event (RUVM_IOCTL_EVENT_CREATE); one never recorded is complete. An event
    /// belongs to the file: use --fd across commands.
    Create {
        #[command(flatten)]
        json: Json,
    },
    /// Destroy an event (RUVM_IOCTL_EVENT_DESTROY); its point lives on in the fences exported.
    Destroy {
        event: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Record the event at the end of a stream's work so far (RUVM_OP_RECORD); prints the
    /// point's seqno.
    Record {
        event: u64,
        /// The stream.
        #[arg(long)]
        stream: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Where the event was last recorded and whether that point has signalled
    /// (RUVM_IOCTL_EVENT_QUERY).
    Query {
        event: u64,
        #[command(flatten)]
        json: Json,
    },
    /// Wait for the event's point (RUVM_IOCTL_EVENT_SYNC). Exits 1 if it signalled with an
    /// error or on the timeout.
    Sync {
        event: u64,
        /// The longest wait, in milliseconds.
        #[arg(long, default_value = "60000", value_parser = parse_timeout_ms)]
        timeout_ms: u32,
        #[command(flatten)]
        json: Json,
    },
    /// Export the event's point as a sync_file (RUVM_IOCTL_EVENT_EXPORT) and show what it
    /// holds (SYNC_IOC_FILE_INFO): its status, driver, timeline and signal time. The
    /// descriptor is ruvmctl's, closed when it exits.
    Export {
        event: u64,
        #[command(flatten)]
        json: Json,
    },
}

/// `ruvmctl vidmem ...`.
#[derive(Subcommand)]
pub enum VidmemAction {
    /// What bounds this user's vidmem of a GPU (RUVM_IOCTL_VIDMEM_LIMIT): the per-user limit,
    /// the user's holdings, the GPU's dmem cgroup region; --set changes the per-user limit
    /// (root).
    Limit {
        /// The GPU (default 0).
        #[arg(long, default_value = "0")]
        gpu: u32,
        /// Set the per-user limit of each GPU's vidmem first (e.g. 16M; 0: none).
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        set: Option<u64>,
        #[command(flatten)]
        json: Json,
    },
    /// Who holds vidmem: each cgroup's charge of ruvm's dmem regions (dmem.current, with its
    /// dmem.max) and each user's holdings of each GPU (debugfs, root).
    Usage(Json),
}
