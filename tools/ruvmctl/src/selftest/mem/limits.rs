// SPDX-License-Identifier: GPL-2.0

//! What bounds mems: a close frees everything, the size limits, memory that is not there,
//! fallback under fragmentation, the caller's memory cgroup, mmap racing a free.

use super::*;

pub(super) fn mem_close_frees_everything() -> TestResult {
    let probe = Ruvm::open().ctx("open")?;
    let before = live(&probe)?;
    {
        let d = Ruvm::open().ctx("open")?;
        for (size, ps) in [(M, 0), (3 * M, 2 * M), (5000, 64 * K)] {
            let h = d.mem_alloc(size, ps, zero()).ctx("alloc")?.handle;
            d.map_kernel(h).ctx("map")?;
        }
        let q = d
            .mem_query(d.mem_alloc(4096, 0, 0).ctx("alloc")?.handle)
            .ctx("query")?;
        let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
        drop(map);
        check!(live(&probe)?.0 == before.0 + 4, "four mems not counted");
    }
    check!(
        live(&probe)? == before,
        "closing the file left {:?}, wanted {before:?}",
        live(&probe)?
    );
    Ok(())
}

pub(super) fn mem_size_limits() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    let (max_alloc, max_file) = (info.max_alloc_bytes, info.max_file_bytes);
    let before = live(&d)?;
    // One byte over: its physical size rounds up past the limit.
    expect_errno(
        d.mem_alloc(max_alloc + 1, 0, 0),
        Errno::ENOSPC,
        "one byte over max_alloc_mib",
    )?;
    check!(live(&d)? == before, "a refused allocation left mems behind");
    // The per-file total can only be reached in memory when the limit is small (a dedicated
    // guest run sets max_file_mib=16 max_alloc_mib=8).
    if max_file > 64 * M {
        return Err(Stop::Skip(format!(
            "max_file_mib is {}; the per-file limit is tested with 16",
            max_file / M
        )));
    }
    let piece = max_alloc.min(4 * M);
    let mut held = Vec::new();
    let mut total = 0;
    while total + piece <= max_file {
        held.push(
            d.mem_alloc(piece, 0, 0)
                .ctx("alloc up to the per-file limit")?
                .handle,
        );
        total += piece;
    }
    expect_errno(
        d.mem_alloc(max_file - total + 4096, 0, 0),
        Errno::ENOSPC,
        "past the per-file limit",
    )?;
    // Another file has its own allowance.
    let other = Ruvm::open().ctx("open")?;
    let h = other
        .mem_alloc(piece, 0, 0)
        .ctx("another file still may allocate")?
        .handle;
    other.mem_free(h).ctx("free")?;
    // Freeing gives the allowance back.
    d.mem_free(held.pop().ok_or(Stop::Fail("nothing held".into()))?)
        .ctx("free")?;
    held.push(d.mem_alloc(piece, 0, 0).ctx("alloc after a free")?.handle);
    for h in held {
        d.mem_free(h).ctx("free")?;
    }
    Ok(())
}

pub(super) fn mem_beyond_memory_is_enomem() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    let max_alloc = info.max_alloc_bytes.min(info.max_file_bytes);
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .ok_or(Stop::Fail("cannot read MemTotal".into()))?
        * K;
    // More than the machine has, but within the per-allocation limit: refused with ENOMEM
    // before a page is taken (draining the machine first would send other tasks' allocations
    // to the OOM killer, which the harness checks the kernel log for).
    let want = total + 64 * M;
    if want > max_alloc {
        return Err(Stop::Skip(format!(
            "the guest has {} MiB, the module allows {} MiB",
            total / M,
            max_alloc / M
        )));
    }
    let before = live(&d)?;
    let taken = pages_allocated()?;
    expect_errno(
        d.mem_alloc(want, 0, 0),
        Errno::ENOMEM,
        "allocation beyond all memory",
    )?;
    let taken = pages_allocated()? - taken;
    check!(
        taken < total / 4096 / 8,
        "{taken} pages were allocated for a request that could never be met"
    );
    check!(
        live(&d)? == before,
        "the failed allocation left mems behind"
    );
    // And memory is usable again right after.
    let h = d
        .mem_alloc(64 * M, 0, 0)
        .ctx("alloc after the failure")?
        .handle;
    d.mem_free(h).ctx("free")
}

/// Pages the page allocator has handed out since boot (the `pgalloc_*` counters of
/// /proc/vmstat).
pub(super) fn pages_allocated() -> Result<u64, Stop> {
    let text = std::fs::read_to_string("/proc/vmstat").ctx("/proc/vmstat")?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("pgalloc_"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum())
}

/// Makes every allocation of order >= `min_order` by this task fail (fail_page_alloc), until
/// dropped.
pub(super) struct FailHighOrder;

impl FailHighOrder {
    const DIR: &'static str = "/sys/kernel/debug/fail_page_alloc";

    fn set(name: &str, value: &str) -> Result<(), Stop> {
        std::fs::write(format!("{}/{name}", Self::DIR), value)
            .ctx(&format!("fail_page_alloc/{name}"))
    }

    fn new(min_order: u32) -> Result<Self, Stop> {
        if !std::path::Path::new(Self::DIR).exists() {
            return Err(Stop::Skip(
                "no fail_page_alloc in this kernel (the debug kernel has it)".into(),
            ));
        }
        for (k, v) in [
            ("task-filter", "Y"),
            ("ignore-gfp-wait", "N"),
            ("ignore-gfp-highmem", "N"),
            ("min-order", &min_order.to_string()),
            ("verbose", "0"),
            ("interval", "1"),
            ("times", "-1"),
            ("probability", "100"),
        ] {
            Self::set(k, v)?;
        }
        std::fs::write("/proc/self/make-it-fail", "1").ctx("make-it-fail")?;
        Ok(Self)
    }
}

impl Drop for FailHighOrder {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/self/make-it-fail", "0");
        let _ = Self::set("probability", "0");
    }
}

pub(super) fn mem_fallback_under_fragmentation() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = live(&d)?;
    let results = {
        // Orders >= 9 (2 MiB) fail, as under fragmentation.
        let _inject = FailHighOrder::new(9)?;
        (
            d.mem_alloc(5 * M, 2 * M, 0),
            d.mem_alloc(5 * M, 2 * M, uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK),
        )
    };
    expect_errno(results.0, Errno::ENOMEM, "2M chunks without fallback")?;
    let a = results.1.ctx("2M chunks with fallback")?;
    check!(
        a.chunk_size == M,
        "fell back to chunks of {}, wanted 1M",
        a.chunk_size
    );
    check!(a.chunk_count == 5, "{} chunks, wanted 5", a.chunk_count);
    check!(
        live(&d)? == (before.0 + 1, before.1 + 5 * M),
        "accounting after fallback: {:?}",
        live(&d)?
    );
    // The fallen-back mem works.
    d.map_kernel(a.handle).ctx("map")?;
    d.mem_fill(false, pattern_args(a.handle, 0, 5 * M, 3))
        .ctx("fill")?;
    kernel_verify(&d, pattern_args(a.handle, 0, 5 * M, 3), "verify")?;
    d.mem_free(a.handle).ctx("free")?;
    nothing_left(&d, before)
}

/// Chunks below 2 MiB are cut from larger blocks only while the page allocator has them free;
/// with every allocation of a larger order failing (as under fragmentation), 4 KiB chunks come
/// from 8 KiB blocks, 8 KiB chunks are allocated one by one (order-0 pages), and so are 64 KiB
/// and 512 KiB chunks (compound pages), and the mem is as good: zeroed, its bytes the same
/// through the kernel mapping and `mmap`, nothing left behind. (Order 2, not 1, for the small
/// ones: the debug kernel's slab debugging puts 4 KiB kmalloc objects in order-1 slabs, which
/// would fail the list's own room first.)
pub(super) fn mem_small_chunks_without_free_blocks() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = live(&d)?;
    // Sizes that are not a power of two, so that every block size is tried; the lowest order
    // that fails.
    for (chunk, size, fail) in [
        (4 * K, M + 12 * K, 2),
        (8 * K, M + 24 * K, 2),
        (64 * K, 3 * M + 192 * K, 5),
        (512 * K, 3 * M + 512 * K, 8),
    ] {
        let a = {
            let _inject = FailHighOrder::new(fail)?;
            d.mem_alloc(size, chunk, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
        }
        .ctx(&format!(
            "{size} bytes in {chunk}-byte chunks, no larger block free"
        ))?;
        check!(
            a.chunk_size == chunk && a.chunk_count == size / chunk,
            "{} chunks of {}, wanted {} of {}",
            a.chunk_count,
            a.chunk_size,
            size / chunk,
            chunk
        );
        d.map_kernel(a.handle).ctx("map")?;
        let q = uapi::ruvm_mem_query {
            physical_size: size,
            mmap_offset: a.mmap_offset,
            ..Default::default()
        };
        let m = UserMap::of_mem(&d, &q).ctx("mmap")?;
        check!(
            (0..size as usize).all(|i| m.read(i) == 0),
            "a zeroed mem of {chunk}-byte chunks made one by one reads non-zero"
        );
        d.mem_fill(false, pattern_args(a.handle, 0, size, 5))
            .ctx("fill")?;
        let bad = (0..size as usize)
            .filter(|&i| m.read(i) != pattern::byte_at(5, i as u64))
            .count();
        check!(
            bad == 0,
            "{bad} bytes differ through mmap from the kernel's fill"
        );
        drop(m);
        d.mem_free(a.handle).ctx("free")?;
    }
    nothing_left(&d, before)
}

/// A cgroup2 group of its own with a memory limit, removed on drop.
pub(super) struct MemCgroup {
    group: crate::cgroup::MemGroup,
}

impl MemCgroup {
    fn new(name: &str, max: u64) -> Result<Self, Stop> {
        use crate::cgroup::MemGroup;
        if !MemGroup::available() {
            return Err(Stop::Skip("no cgroup2 memory controller".into()));
        }
        let group = MemGroup::new(name).ctx("make the cgroup")?;
        group
            .write("memory.max", &max.to_string())
            .ctx("memory.max")?;
        Ok(Self { group })
    }

    fn read(&self, file: &str) -> Result<String, Stop> {
        self.group.read(file).ctx(file)
    }

    fn current(&self) -> Result<u64, Stop> {
        self.read("memory.current")?
            .trim()
            .parse()
            .map_err(|_| Stop::Fail("memory.current".into()))
    }

    fn event(&self, name: &str) -> Result<u64, Stop> {
        let events = self.read("memory.events")?;
        Ok(events
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0))
    }
}

pub(super) fn mem_charged_to_the_callers_memory_cgroup() -> TestResult {
    let cg = MemCgroup::new("ruvm-selftest", 48 * M)?;
    let (rx, tx) = nix::unistd::pipe().ctx("pipe")?;
    let (rx2, tx2) = nix::unistd::pipe().ctx("pipe")?;
    // A child joins the group and allocates; the parent watches the group's counters.
    // SAFETY: the runner is single-threaded here; the child only makes syscalls.
    let child = match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            let step = |b: &[u8]| {
                let _ = nix::unistd::write(&tx, b);
                let mut x = [0u8; 1];
                let _ = nix::unistd::read(&rx2, &mut x);
            };
            let me = std::process::id().to_string();
            if std::fs::write(cg.group.dir.join("cgroup.procs"), me).is_err() {
                std::process::exit(10);
            }
            let Ok(d) = Ruvm::open() else {
                std::process::exit(11)
            };
            step(b"j"); // joined
            let Ok(a) = d.mem_alloc(16 * M, 2 * M, 0) else {
                std::process::exit(12)
            };
            // 4 KiB chunks are cut from larger blocks (split_page splits the charge).
            let Ok(b) = d.mem_alloc(8 * M, 4 * K, zero()) else {
                std::process::exit(12)
            };
            step(b"a"); // allocated 24M
                        // 24M held, 48M allowed: 40M more cannot be charged.
            let over = d.mem_alloc(40 * M, 0, 0);
            if over.err() != Some(Errno::ENOMEM) {
                std::process::exit(13);
            }
            if d.mem_free(a.handle).is_err() || d.mem_free(b.handle).is_err() {
                std::process::exit(14);
            }
            step(b"f"); // freed
            std::process::exit(0);
        }
        ForkResult::Parent { child } => child,
    };
    // Whatever happens below, the child does not outlive the case (it holds /dev/ruvm open).
    struct Reap(nix::unistd::Pid);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(self.0, Signal::SIGKILL);
            let _ = waitpid(self.0, None);
        }
    }
    let reap = Reap(child);
    let wait_step = |want: u8| -> Result<(), Stop> {
        let mut b = [0u8; 1];
        let n = nix::unistd::read(&rx, &mut b).ctx("read")?;
        check!(
            n == 1 && b[0] == want,
            "the child stopped before step '{}'",
            want as char
        );
        Ok(())
    };
    let go = || nix::unistd::write(&tx2, b"g").map(drop).ctx("write");
    wait_step(b'j')?;
    let joined = cg.current()?;
    go()?;
    wait_step(b'a')?;
    let holding = cg.current()?;
    check!(
        holding >= joined + 24 * M,
        "24M allocated, but the group's memory.current went {joined} -> {holding}"
    );
    go()?;
    wait_step(b'f')?;
    let freed = cg.current()?;
    // The group's count also moves with small kernel allocations (a few KiB).
    check!(
        freed + 23 * M <= holding,
        "freeing gave back only {} bytes to the group",
        holding - freed
    );
    go()?;
    let st = waitpid(child, None).ctx("waitpid")?;
    std::mem::forget(reap);
    check!(
        st == WaitStatus::Exited(child, 0),
        "the child failed: {st:?} (exit 10..14 name the step)"
    );
    // Over the limit it failed with ENOMEM: the group's OOM killer never ran.
    check!(
        cg.event("oom_kill")? == 0,
        "an OOM kill happened in the group"
    );
    check!(cg.event("max")? > 0, "the limit was never hit");
    Ok(())
}

/// Reads one byte of this process's memory at `addr` through `/proc/self/mem`, as the kernel
/// reaches it (faulting pages in): `None` if the access faults, instead of a signal.
pub(super) fn read_via_proc(mem: &std::fs::File, addr: usize) -> Option<u8> {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 1];
    match mem.read_at(&mut b, addr as u64) {
        Ok(1) => Some(b[0]),
        _ => None,
    }
}

/// `mmap` of a mem racing `MEM_FREE` of it, many times: whichever wins, no mapping may still
/// reach the mem's pages once the free has returned (each access faults), and everything is
/// released after `munmap`. Before the fix (pages inserted by `mmap` itself, before the VMA was
/// linked, so the free's zap missed them) a few rounds in a thousand kept a live mapping.
pub(super) fn mem_mmap_racing_free_leaves_no_mapping() -> TestResult {
    use std::sync::Barrier;
    use std::time::{Duration, Instant};
    const ROUNDS: u32 = 2000;
    let d = Ruvm::open().ctx("open")?;
    let before = live(&d)?;
    let proc_mem = std::fs::File::open("/proc/self/mem").ctx("open /proc/self/mem")?;
    let len = (64 * K) as usize;
    let (mut mapped, mut rounds) = (0u32, 0u32);
    let start = Instant::now();
    while rounds < ROUNDS && start.elapsed() < Duration::from_secs(20) {
        rounds += 1;
        let a = d.mem_alloc(64 * K, 0, zero()).ctx("alloc")?;
        let barrier = Barrier::new(2);
        let (map, freed) = std::thread::scope(|s| {
            let mapper = s.spawn(|| {
                barrier.wait();
                let m = UserMap::new(
                    &d,
                    a.mmap_offset,
                    len,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED,
                );
                // The address crosses back to this thread; the mapping is unmapped there.
                m.map(|m| {
                    let p = m.as_ptr() as usize;
                    std::mem::forget(m);
                    p
                })
            });
            barrier.wait();
            let freed = d.mem_free(a.handle);
            (mapper.join(), freed)
        });
        freed.ctx("free")?;
        let Ok(Ok(addr)) = map else {
            // The free came first: the mmap found no mem (ENXIO).
            continue;
        };
        mapped += 1;
        let first = read_via_proc(&proc_mem, addr);
        let last = read_via_proc(&proc_mem, addr + len - 1);
        // SAFETY: `addr` is the start of a `len`-byte mapping made above and used no more.
        let unmapped = unsafe {
            nix::sys::mman::munmap(
                std::ptr::NonNull::new(addr as *mut std::ffi::c_void)
                    .ok_or(Stop::Fail("mmap returned NULL".into()))?,
                len,
            )
        };
        unmapped.ctx("munmap")?;
        check!(
            first.is_none() && last.is_none(),
            "round {rounds}: a mapping made while the mem was being freed still reads its pages after MEM_FREE returned"
        );
    }
    check!(
        live(&d)? == before,
        "after {rounds} rounds, mems are still alive: {:?} (before: {before:?})",
        live(&d)?
    );
    println!("# {rounds} rounds, the mmap won {mapped} of them");
    Ok(())
}
