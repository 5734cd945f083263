// SPDX-License-Identifier: GPL-2.0

//! The cases of `ruvmctl bench`, each with its baseline measured in the same run. Ids name the
//! goal they serve (`g1`..`g5`, `copy`, `mem`, `va`, `pool`, `stream`); `report` holds the goals
//! themselves. The stream cases are a file of their own, handed in by the bench's entry point.

use std::num::NonZeroUsize;

use anyhow::{anyhow, bail, Context as _, Result};
use libruvm::{uapi, Ruvm, UserMap};
use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

use super::{pairs, time, Case, Spec};
use crate::cgroup::MemGroup;

mod gpu;
mod sysmem;
use gpu::*;
use sysmem::*;

const K: u64 = 1 << 10;
const M: u64 = 1 << 20;
const ZERO: u32 = uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO;

/// One side of a case: takes one sample.
type Sampler<'a> = &'a mut dyn FnMut() -> Result<f64>;

/// A size as people write it (4K, 2M, 1G).
pub fn size_name(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n >= M && n % M == 0 => format!("{}M", n >> 20),
        n if n >= K && n % K == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

/// The guest: kernel release, CPUs and memory.
pub fn guest_description() -> String {
    let uname = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, NonZeroUsize::get);
    let mem = meminfo("MemTotal").unwrap_or(0) >> 20;
    format!("Linux {uname}, {cpus} CPUs, {mem} MiB")
}

/// A field of /proc/meminfo, in bytes.
fn meminfo(field: &str) -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(field).and_then(|r| r.strip_prefix(':')) {
            let kb: u64 = rest
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .with_context(|| format!("/proc/meminfo {field}"))?;
            return Ok(kb * 1024);
        }
    }
    bail!("/proc/meminfo has no {field}")
}

/// Anonymous private memory, unmapped on drop.
struct Anon {
    ptr: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
}

impl Anon {
    /// `mmap` of `len` bytes, populated (faulted in) if `populate`.
    fn new(len: u64, populate: bool) -> Result<Self> {
        let len = usize::try_from(len)?;
        let nz = NonZeroUsize::new(len).ok_or_else(|| anyhow!("empty mapping"))?;
        let mut flags = MapFlags::MAP_PRIVATE;
        if populate {
            flags |= MapFlags::MAP_POPULATE;
        }
        // SAFETY: a new anonymous mapping at an address the kernel picks aliases nothing.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                flags,
            )
        }?;
        Ok(Self { ptr, len })
    }

    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr().cast()
    }

    /// Writes `v` over every byte.
    fn memset(&self, v: u8) {
        // SAFETY: the mapping is `len` writable bytes, ours alone.
        unsafe { std::ptr::write_bytes(self.as_ptr(), v, self.len) }
    }

    /// Copies every byte of `src` (as long as `self`) into `self`.
    fn memcpy_from(&self, src: &Anon) {
        let n = self.len.min(src.len);
        // SAFETY: two separate mappings, each at least `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr(), n) }
    }

    /// Touches one byte.
    fn touch(&self) {
        // SAFETY: the mapping has at least one writable byte.
        unsafe { self.as_ptr().write_volatile(1) }
    }
}

impl Drop for Anon {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and nothing borrows it any more.
        let _ = unsafe { munmap(self.ptr, self.len) };
    }
}

/// The first present GPU of `kind` (with a copy engine if `engine`).
fn gpu_of(d: &Ruvm, kind: u32, engine: bool) -> Result<Option<u32>> {
    Ok(d.gpus()?
        .iter()
        .find(|g| {
            g.kind == kind
                && g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
                && (!engine || g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE != 0)
        })
        .map(|g| g.id))
}

/// What the cases share.
pub(super) struct Ctx<'a> {
    pub(super) d: &'a Ruvm,
    pub(super) spec: Spec,
    /// A simulated GPU, for vidmem and its copy engine.
    pub(super) sim: u32,
    /// The GPU big mems are DMA-mapped for: a host GPU (behind the IOMMU, a 32-bit window) if
    /// the module has one, else the simulated GPU.
    big: u32,
    /// What `big` is, for the case names.
    big_name: &'static str,
    /// An edu GPU (behind the IOMMU), for the per-chunk DMA mapping cost.
    pub(super) edu: Option<u32>,
}

impl Ctx<'_> {
    pub(super) fn case(&self, id: String, what: &str, baseline: &str, unit: &str) -> Case {
        Case {
            id,
            what: what.to_owned(),
            baseline: baseline.to_owned(),
            unit: unit.to_owned(),
            ruvm: Vec::new(),
            base: Vec::new(),
            size: 0,
        }
    }

    /// Allocates and frees a sysmem mem.
    fn alloc_free(&self, size: u64, chunk: u64, zero: bool) -> Result<()> {
        let a = self
            .d
            .mem_alloc(size, chunk, if zero { ZERO } else { 0 })
            .with_context(|| format!("alloc {} in {} chunks", size_name(size), size_name(chunk)))?;
        self.d.mem_free(a.handle)?;
        Ok(())
    }
}

/// `mmap(MAP_POPULATE)` + `munmap` of `size` bytes.
fn populate(size: u64) -> Result<()> {
    drop(Anon::new(size, true)?);
    Ok(())
}

/// How many times to repeat an operation on `size` bytes so that one sample is long enough
/// to time (about 16 MiB of work, at most 256 times).
fn batch(size: u64) -> u64 {
    (16 * M / size.max(1)).clamp(1, 256)
}

/// Times `n` runs of `f`, per run.
pub(super) fn per_op(n: u64, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let t = time(&mut || {
        for _ in 0..n {
            f()?;
        }
        Ok(())
    })?;
    Ok(t / n as f64)
}

/// One group of cases.
pub(super) type CaseGroup = fn(&Ctx, &mut dyn FnMut(Case)) -> Result<()>;

/// Runs every case, these groups' and then `more` (the groups after them in `GROUPS`), handing
/// each to `out` as it finishes.
pub(super) fn run_all(
    d: &Ruvm,
    spec: &Spec,
    groups: &[String],
    more: &[CaseGroup],
    out: &mut dyn FnMut(Case),
) -> Result<()> {
    let sim = gpu_of(d, uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM, true)?.ok_or_else(|| {
        anyhow!("bench needs a simulated GPU (load ruvm with sim_gpus=1 or more)")
    })?;
    let edu = gpu_of(d, uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU, false)?;
    let big = gpu_of(d, uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST, false)?.unwrap_or(sim);
    let c = Ctx {
        d,
        spec: *spec,
        sim,
        big,
        big_name: if big == sim {
            "a simulated GPU"
        } else {
            "a host GPU (IOMMU)"
        },
        edu,
    };
    let all: [CaseGroup; 9] = [g1, g2, g3, g4, g5, copies, memory, va, pool];
    for (name, run) in super::GROUPS.iter().zip(all.iter().chain(more)) {
        if groups.is_empty() || groups.iter().any(|g| g == name) {
            run(&c, out)?;
        }
    }
    Ok(())
}

/// Chunk sizes from 4 KiB to 2 MiB.
fn chunk_sizes() -> impl Iterator<Item = u64> {
    (12..=21).map(|s| 1u64 << s)
}

/// The sizes of the scaling curves: 4 KiB times powers of 4 up to the largest size.
pub fn scale_sizes(max: u64) -> Vec<u64> {
    std::iter::successors(Some(4 * K), |s| Some(s * 4))
        .take_while(|&s| s <= max)
        .collect()
}

/// G4: cost against size, 4 KiB and 2 MiB chunks, zeroed or not, with `mmap(MAP_POPULATE)` at
/// every size.
fn g4(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    for chunk in [4 * K, 2 * M] {
        for zero in [false, true] {
            for size in scale_sizes(c.spec.max_size) {
                let n = batch(size);
                let mut case = c.case(
                    format!(
                        "g4.{}.{}.{}",
                        size_name(chunk),
                        if zero { "zeroed" } else { "raw" },
                        size_name(size)
                    ),
                    &format!(
                        "{} sysmem alloc{} + free, {} chunks",
                        size_name(size),
                        if zero { " zeroed" } else { "" },
                        size_name(chunk)
                    ),
                    "mmap(MAP_POPULATE) + munmap",
                    "ns",
                );
                case.size = size;
                (case.ruvm, case.base) = pairs(
                    c.spec.reps,
                    &mut || per_op(n, &mut || c.alloc_free(size, chunk, zero)),
                    &mut || per_op(n, &mut || populate(size)),
                )?;
                out(case);
            }
        }
    }
    Ok(())
}

/// G5: ruvm's in-kernel overhead over the page allocator, the DMA mapping cost per chunk
/// through the IOMMU, and the kernel mapping against a bare `vm_map_ram`.
fn g5(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let total = c.spec.max_size.min(64 * M);
    for order in [0u32, 4, 9] {
        for zero in [0u32, 1] {
            let chunk = (4 * K) << order;
            let mut a = uapi::ruvm_bench {
                op: uapi::ruvm_bench_op_RUVM_BENCH_MEM,
                order,
                zero,
                count: total / chunk,
                iterations: 1,
                ..Default::default()
            };
            let mut case = c.case(
                format!(
                    "g5.kernel.{}.{}",
                    size_name(chunk),
                    if zero == 1 { "zeroed" } else { "raw" }
                ),
                &format!(
                    "ruvm's sysmem path in the kernel, {} in {} chunks{}",
                    size_name(total),
                    size_name(chunk),
                    if zero == 1 { ", zeroed" } else { "" }
                ),
                "alloc_pages + __free_pages of the same, in the kernel",
                "ns",
            );
            let mem = a;
            a.op = uapi::ruvm_bench_op_RUVM_BENCH_PAGES;
            (case.ruvm, case.base) = pairs(
                c.spec.reps,
                &mut || Ok(c.d.bench(mem).context("RUVM_IOCTL_BENCH")? as f64),
                &mut || Ok(c.d.bench(a).context("RUVM_IOCTL_BENCH")? as f64),
            )?;
            out(case);
        }
    }
    if let Some(edu) = c.edu {
        let size = c.spec.max_size.min(16 * M);
        for chunk in [4 * K, 64 * K, 2 * M] {
            let a = c.d.mem_alloc(size, chunk, 0)?;
            let chunks = (size / chunk) as f64;
            let mut case = c.case(
                format!("g5.dma.{}", size_name(chunk)),
                &format!(
                    "MEM_MAP_GPU on an edu GPU (IOMMU), {} chunks, per chunk",
                    size_name(chunk)
                ),
                "",
                "ns",
            );
            let map = || -> Result<f64> {
                let t = time(&mut || Ok(c.d.mem_gpu(true, a.handle, edu)?))?;
                c.d.mem_gpu(false, a.handle, edu)?;
                Ok(t / chunks)
            };
            map()?;
            for _ in 0..c.spec.reps {
                case.ruvm.push(map()?);
            }
            c.d.mem_free(a.handle)?;
            out(case);
        }
    }
    let a = c.d.mem_alloc(total, 4 * K, 0)?;
    let b = |op| uapi::ruvm_bench {
        op,
        handle: a.handle,
        iterations: 4,
        ..Default::default()
    };
    let mut case = c.case(
        "g5.kmap".into(),
        &format!("ruvm's kernel mapping of {} in 4K chunks", size_name(total)),
        "vm_map_ram + vm_unmap_ram of the same pages",
        "ns",
    );
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || Ok(c.d.bench(b(uapi::ruvm_bench_op_RUVM_BENCH_KMAP))? as f64 / 4.0),
        &mut || Ok(c.d.bench(b(uapi::ruvm_bench_op_RUVM_BENCH_VMAP))? as f64 / 4.0),
    )?;
    out(case);
    c.d.mem_free(a.handle)?;
    Ok(())
}

/// Copies: `MEM_COPY` and the simulated copy engine against a user `memcpy`.
fn copies(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let size = c.spec.max_size.min(64 * M);
    let (src, dst) = (Anon::new(size, true)?, Anon::new(size, true)?);
    src.memset(7);
    let mems = [
        c.d.mem_alloc(size, 2 * M, 0)?,
        c.d.mem_alloc(size, 2 * M, 0)?,
    ];
    for m in &mems {
        c.d.map_kernel(m.handle)?;
        c.d.mem_gpu(true, m.handle, c.sim)?;
    }
    let (h0, h1) = (mems[0].handle, mems[1].handle);
    let memcpy = &mut || {
        time(&mut || {
            dst.memcpy_from(&src);
            Ok(())
        })
    };
    let mem_copy = &mut || time(&mut || Ok(c.d.mem_copy(h1, 0, h0, 0, size)?));
    let ce_copy = &mut || time(&mut || Ok(c.d.ce_copy(c.sim, h1, 0, h0, 0, size)?));
    let n = size_name(size);
    let ways: [(&str, String, Sampler); 2] = [
        (
            "copy.mem",
            format!("MEM_COPY of {n} between two mems"),
            mem_copy,
        ),
        (
            "copy.ce_sim",
            format!("CE_COPY of {n} on a simulated GPU"),
            ce_copy,
        ),
    ];
    for (id, what, way) in ways {
        let mut case = c.case(id.into(), &what, "memcpy in user space", "ns");
        case.size = size;
        (case.ruvm, case.base) = pairs(c.spec.reps, way, memcpy)?;
        out(case);
    }
    for m in &mems {
        c.d.mem_free(m.handle)?;
    }
    Ok(())
}

/// A cgroup2 group this process runs in while it lives (for the memory cases): what ruvm
/// charges to its caller is read from the group's `memory.stat`.
struct Group(MemGroup);

impl Group {
    fn enter(name: &str) -> Result<Self> {
        let g = MemGroup::new(name).context("making a cgroup2 group with the memory controller")?;
        g.write("cgroup.procs", &std::process::id().to_string())
            .context("joining the cgroup")?;
        Ok(Self(g))
    }

    /// Kernel memory charged to the group (`memory.stat` `kernel`): ruvm's pages and the
    /// metadata it allocates for them. The kernel folds its per-CPU counters into
    /// `memory.stat` only once enough has changed; 8 MiB of anonymous memory faulted in and
    /// given back first makes sure it has. Exact to a page (slab objects are charged a page at
    /// a time).
    fn kernel(&self) -> Result<i64> {
        drop(Anon::new(8 * M, true)?);
        let stat = self.0.read("memory.stat")?;
        stat.lines()
            .find_map(|l| l.strip_prefix("kernel ")?.trim().parse().ok())
            .ok_or_else(|| anyhow!("memory.stat has no kernel line"))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Back to the root, so that the group (removed next) is empty.
        let root = format!("{}/cgroup.procs", MemGroup::ROOT);
        let _ = std::fs::write(root, std::process::id().to_string());
    }
}

/// Memory: the kernel heap a mem holds beyond its pages, per chunk, and per chunk for each GPU
/// it is mapped for (an edu GPU: a real IOMMU, whose page tables are the IOMMU's, not the
/// mem's). ruvm charges its per-chunk arrays, like the pages, to the caller's memory cgroup, so
/// the bench runs in a group of its own and reads what was charged: heap = charged - pages. The
/// marginal cost: the difference between mems of the full and half the size, over the
/// difference in chunks (what one mem holds whatever its size cancels out).
fn memory(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let group = Group::enter("ruvm-bench")?;
    for chunk in [4 * K, 64 * K, 2 * M] {
        // Sysmem at the largest size; the GPU's share on mems that fit an edu GPU's 28-bit
        // DMA window.
        let sys_sizes = [c.spec.max_size / 2, c.spec.max_size];
        let big = c.spec.max_size.min(64 * M);
        let gpu_sizes = [big / 2, big];
        if sys_sizes[0] < 2 * chunk {
            continue;
        }
        let mut sys = c.case(
            format!("mem.chunk.{}", size_name(chunk)),
            &format!(
                "heap per chunk of a sysmem mem, {} chunks",
                size_name(chunk)
            ),
            "",
            "B",
        );
        let mut gpu = c.case(
            format!("mem.gpu.{}", size_name(chunk)),
            &format!(
                "heap per chunk for one mapped GPU (edu), {} chunks",
                size_name(chunk)
            ),
            "",
            "B",
        );
        let marginal = |sizes: [u64; 2], f: &dyn Fn(u64) -> Result<i64>| -> Result<(f64, f64)> {
            let (a, b) = (f(sizes[0])?, f(sizes[1])?);
            let chunks = ((sizes[1] - sizes[0]) / chunk) as f64;
            // A reading is exact to a page: the resolution per chunk.
            Ok(((b - a) as f64 / chunks, 4096.0 / chunks))
        };
        let heap = |size: u64| -> Result<i64> {
            let k0 = group.kernel()?;
            let a = c.d.mem_alloc(size, chunk, 0)?;
            let k1 = group.kernel()?;
            c.d.mem_free(a.handle)?;
            Ok(k1 - k0 - size as i64)
        };
        let mapped = |size: u64| -> Result<i64> {
            let a = c.d.mem_alloc(size, chunk, 0)?;
            let k0 = group.kernel()?;
            if let Some(g) = c.edu {
                c.d.mem_gpu(true, a.handle, g)?;
            }
            let k1 = group.kernel()?;
            c.d.mem_free(a.handle)?;
            Ok(k1 - k0)
        };
        for _ in 0..c.spec.reps.max(3) {
            let (v, r) = marginal(sys_sizes, &heap)?;
            sys.ruvm.push(v);
            sys.base.push(r);
            if c.edu.is_some() && gpu_sizes[0] >= 2 * chunk {
                let (v, r) = marginal(gpu_sizes, &mapped)?;
                gpu.ruvm.push(v);
                gpu.base.push(r);
            }
        }
        out(sys);
        if !gpu.ruvm.is_empty() {
            out(gpu);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sizes() {
        assert_eq!(size_name(4096), "4K");
        assert_eq!(size_name(2 << 20), "2M");
        assert_eq!(size_name(1 << 30), "1G");
        assert_eq!(size_name(5000), "5000");
        assert_eq!(
            scale_sizes(1 << 20),
            vec![4096, 16384, 65536, 262144, 1 << 20]
        );
        assert_eq!(batch(4096), 256);
        assert_eq!(batch(1 << 30), 1);
    }
}
