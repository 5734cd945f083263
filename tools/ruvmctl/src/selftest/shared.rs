// SPDX-License-Identifier: GPL-2.0

//! Steps several groups of cases share: the audit's live counts, and the seeded pattern
//! written and checked through a mem's kernel mapping, an anonymous mapping.

use libruvm::{cmd, uapi, Errno, Ruvm};
use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

use super::harness::{Context, Stop, TestResult};

/// The audit's live counts, by `enum ruvm_audit_class`.
pub(super) fn live(d: &Ruvm) -> Result<Vec<u64>, Stop> {
    Ok(d.audit(false).ctx("AUDIT")?.live.to_vec())
}

/// The audit's class of vidmem storage kept for reuse.
pub(super) const VIDMEM_KEPT: usize = uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_KEPT as usize;

/// Gives back every vidmem storage the PMMs keep, through the kernel's shrinkers
/// (`drop_caches` 2 runs every slab shrinker, ruvm's included), and checks none is left.
/// Needs root.
pub(super) fn drop_kept(d: &Ruvm) -> TestResult {
    std::fs::write("/proc/sys/vm/drop_caches", "2")
        .map_err(|e| Stop::Fail(format!("writing /proc/sys/vm/drop_caches: {e}")))?;
    let left = live(d)?[VIDMEM_KEPT];
    if left != 0 {
        return Err(Stop::Fail(format!(
            "the shrinker left {left} kept vidmem storages"
        )));
    }
    Ok(())
}

/// Whether `a` and `b` agree on every class but `except`.
pub(super) fn same_but(a: &[u64], b: &[u64], except: usize) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .enumerate()
            .all(|(i, (x, y))| i == except || x == y)
}

/// A field of /proc/meminfo, in bytes.
pub(super) fn meminfo(field: &str) -> Result<u64, Stop> {
    let text = std::fs::read_to_string("/proc/meminfo").ctx("/proc/meminfo")?;
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(field)?.strip_prefix(':')?;
            rest.trim().trim_end_matches(" kB").parse::<u64>().ok()
        })
        .map(|kib| kib * 1024)
        .ok_or_else(|| Stop::Fail(format!("/proc/meminfo has no {field}")))
}

/// The free memory a user allocation cannot have without reclaiming directly, in bytes: each
/// zone's `min` watermark plus its largest `protection` (the lowmem reserve it keeps from
/// allocations that could use a higher zone), summed over the zones (`/proc/zoneinfo`).
pub(super) fn min_watermark() -> Result<u64, Stop> {
    let text = std::fs::read_to_string("/proc/zoneinfo").ctx("/proc/zoneinfo")?;
    let mut pages = 0u64;
    for l in text.lines().map(str::trim) {
        if let Some(v) = l.strip_prefix("min ") {
            pages += v.trim().parse::<u64>().unwrap_or(0);
        } else if let Some(v) = l.strip_prefix("protection:") {
            pages += v
                .trim()
                .trim_matches(|c| c == '(' || c == ')')
                .split(',')
                .filter_map(|x| x.trim().parse::<u64>().ok())
                .max()
                .unwrap_or(0);
        }
    }
    Ok(pages * 4096)
}

/// Reclaim as memory pressure makes it, with no process pushed towards the OOM killer: the
/// root memory cgroup is asked to reclaim `bytes` (cgroup v2's `memory.reclaim`, which runs
/// the reclaim kswapd and direct reclaim run, every shrinker included, and never kills),
/// again every 100 ms until `enough` says so, for up to 20 s (the caller checks what came of
/// it). False where the kernel has no `memory.reclaim`: the caller makes pressure itself. (Pressure
/// made by a child writing memory met the OOM killer in make checks on a busy host: kswapd
/// under TCG may not reclaim before the child's own allocations fail.)
pub(super) fn reclaim_root(bytes: u64, enough: impl Fn() -> bool) -> bool {
    const KNOB: &str = "/sys/fs/cgroup/memory.reclaim";
    if !std::path::Path::new(KNOB).exists() {
        return false;
    }
    let start = std::time::Instant::now();
    while !enough() && start.elapsed() < std::time::Duration::from_secs(20) {
        // EAGAIN: less than asked could be reclaimed (what was, stays reclaimed).
        let _ = std::fs::write(KNOB, bytes.to_string());
        if !enough() {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    true
}

/// Memory pressure without the OOM killer's risk: a child writes fresh anonymous memory while
/// more than the min watermark and `margin` are free, so that kswapd wakes
/// (below the low watermark) and reclaims, shrinkers included, but no allocation of the child
/// reclaims directly (between the low and the min watermarks it is served at once); then it
/// waits for `enough` up to 20 s. Exits 0 once `enough` says so, 1 if it never did. How it
/// ended. (A child pushing past what is available met the OOM killer while a shrinker was
/// giving its pages back: reclaim's OOM decision counts no shrinker's pages.)
pub(super) fn reclaim_in_child(
    margin: u64,
    enough: impl Fn() -> bool,
) -> Result<nix::sys::wait::WaitStatus, Stop> {
    let floor = min_watermark()? + margin;
    let len = meminfo("MemFree")?;
    super::harness::in_child(|| {
        use nix::sys::mman::{mmap_anonymous, MapFlags, ProtFlags};
        let Some(n) = usize::try_from(len)
            .ok()
            .and_then(std::num::NonZeroUsize::new)
        else {
            return 2;
        };
        // SAFETY: a fresh private anonymous mapping, written through its own pointer only.
        let Ok(ptr) = (unsafe {
            mmap_anonymous(
                None,
                n,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }) else {
            return 3;
        };
        let base = ptr.as_ptr().cast::<u8>();
        let free = || meminfo("MemFree").unwrap_or(0);
        let mut at = 0usize;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_secs(20) {
            if enough() {
                return 0;
            }
            // 4 MiB at a time, then 256 KiB near the floor: free memory comes down into the
            // window between the min and low watermarks (about a MiB here), where kswapd wakes.
            let left = free().saturating_sub(floor);
            let step: usize = if left > 32 << 20 { 4 << 20 } else { 256 << 10 };
            if left > step as u64 && at + step <= n.get() {
                for off in (at..at + step).step_by(4096) {
                    // SAFETY: inside the mapping just made.
                    unsafe { base.add(off).write_volatile(1) };
                }
                at += step;
            } else {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        i32::from(!enough())
    })
}

/// Memory pressure: a child process writes every page of `bytes` of fresh anonymous memory,
/// then exits 0 (if the OOM killer does not take it first), or exits 0 as soon as `enough`
/// says the reclaim the case waits for happened (checked every 4 MiB: pushing on to the end
/// would only risk the OOM killer, which the kernel log's check fails on). How it ended.
///
/// It writes 4 MiB at a time with 5 ms between, as a program fills what it allocated:
/// kswapd then reclaims beside it. Written at once, under TCG on a debug kernel and beside
/// other guests, the direct reclaim of the writer could run out of retries while kswapd was
/// still giving back a list of a pool's (a list is 32 MiB; its pages are not on an LRU, so the
/// retry logic does not count them as reclaimable) and the OOM killer took it, once in some
/// ten make checks (and with a millisecond between, once on the stock kernel beside the DKMS
/// package test's build).
pub(super) fn touch_in_child(
    bytes: u64,
    enough: impl Fn() -> bool,
) -> Result<nix::sys::wait::WaitStatus, Stop> {
    super::harness::in_child(|| {
        use nix::sys::mman::{mmap_anonymous, MapFlags, ProtFlags};
        let Some(len) = usize::try_from(bytes)
            .ok()
            .and_then(std::num::NonZeroUsize::new)
        else {
            return 2;
        };
        // SAFETY: a fresh private anonymous mapping, written through its own pointer only.
        let Ok(ptr) = (unsafe {
            mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }) else {
            return 3;
        };
        let base = ptr.as_ptr().cast::<u8>();
        for off in (0..len.get()).step_by(4096) {
            // SAFETY: inside the mapping just made.
            unsafe { base.add(off).write_volatile(1) };
            if off % (4 << 20) == 0 {
                if enough() {
                    return 0;
                }
                // Paced, so that kswapd's reclaim (the shrinkers) keeps up under TCG on a busy
                // host rather than the OOM killer meeting a burst first.
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        0
    })
}

/// Whether the byte at `p` (in a mapping of ours) can be read: through /proc/self/mem, which
/// faults the page in as an access would and reports an error where the access would get
/// SIGBUS.
pub(super) fn readable(p: *mut u8) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(f) = std::fs::File::open("/proc/self/mem") else {
        return false;
    };
    let mut b = [0u8; 1];
    f.read_at(&mut b, p as u64).is_ok()
}

/// The fill of `[0, len)` of mem `h` with the pattern of `seed`.
pub(super) fn pattern(h: u64, len: u64, seed: u64) -> uapi::ruvm_mem_fill {
    uapi::ruvm_mem_fill {
        handle: h,
        length: len,
        seed,
        ..Default::default()
    }
}

/// Writes the pattern of `seed` into `[0, len)` of `h` through its kernel mapping.
pub(super) fn fill(d: &Ruvm, h: u64, len: u64, seed: u64) -> TestResult {
    d.map_kernel(h).ctx("MAP_CPU_KERNEL")?;
    d.mem_fill(false, pattern(h, len, seed)).ctx("MEM_FILL")?;
    Ok(())
}

/// Bytes of `[0, len)` of `h` that differ from the pattern of `seed`.
pub(super) fn mismatches(d: &Ruvm, h: u64, len: u64, seed: u64) -> Result<u64, Stop> {
    d.map_kernel(h).ctx("MAP_CPU_KERNEL")?;
    let v = d.mem_fill(true, pattern(h, len, seed)).ctx("MEM_VERIFY")?;
    Ok(v.mismatches)
}

/// A present simulated GPU (the ones with an MMU, and a removal test ioctl), or a skip.
pub(super) fn sim_gpu(d: &Ruvm) -> Result<u32, Stop> {
    d.gpus()
        .ctx("GPU_LIST")?
        .iter()
        .find(|g| {
            g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
                && g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM
        })
        .map(|g| g.id)
        .ok_or_else(|| Stop::Skip("no simulated GPU (sim_gpus=N)".into()))
}

/// A present GPU with vidmem, or a skip.
pub(super) fn vidmem_gpu(d: &Ruvm) -> Result<uapi::ruvm_gpu_info, Stop> {
    d.gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .find(|g| g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0 && g.vidmem_size > 0)
        .ok_or_else(|| Stop::Skip("no GPU with vidmem".into()))
}

/// A pool of `gpu`'s vidmem with chunks of `page_size` bytes and release threshold `threshold`.
pub(super) fn vid_pool(d: &Ruvm, gpu: u32, page_size: u64, threshold: u64) -> Result<u64, Errno> {
    let mut c = uapi::ruvm_pool_create {
        backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
        gpu,
        page_size,
        release_threshold: threshold,
        ..Default::default()
    };
    d.call(cmd::POOL_CREATE, &mut c)?;
    Ok(c.handle)
}

/// Allocates `size` of vidmem of `gpu` from `pool`.
pub(super) fn vid_alloc(
    d: &Ruvm,
    pool: u64,
    gpu: u32,
    size: u64,
) -> Result<uapi::ruvm_mem_alloc, Errno> {
    let mut a = uapi::ruvm_mem_alloc {
        size,
        backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
        gpu,
        pool,
        ..Default::default()
    };
    d.call(cmd::MEM_ALLOC, &mut a)?;
    Ok(a)
}

/// A shared read-write mapping of `len` bytes of file `fd` (a dma-buf, a DRM node) from byte
/// `offset`, unmapped on drop.
pub(super) struct BufMap {
    pub(super) addr: std::ptr::NonNull<u8>,
    len: usize,
}

impl BufMap {
    pub(super) fn new(fd: &impl std::os::fd::AsFd, offset: u64, len: u64) -> Result<Self, Errno> {
        use nix::sys::mman::{mmap, MapFlags, ProtFlags};
        let len = usize::try_from(len).map_err(|_| Errno::EINVAL)?;
        let n = std::num::NonZeroUsize::new(len).ok_or(Errno::EINVAL)?;
        let off = i64::try_from(offset).map_err(|_| Errno::EINVAL)?;
        // SAFETY: a new shared mapping of the buffer; nothing else is placed there.
        let addr = unsafe {
            mmap(
                None,
                n,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                off,
            )
        }?;
        Ok(Self {
            addr: addr.cast(),
            len,
        })
    }

    pub(super) fn read(&self, i: usize) -> u8 {
        assert!(i < self.len);
        // SAFETY: inside the mapping, which lives as long as `self`.
        unsafe { self.addr.as_ptr().add(i).read_volatile() }
    }

    pub(super) fn write(&self, i: usize, v: u8) {
        assert!(i < self.len);
        // SAFETY: as above.
        unsafe { self.addr.as_ptr().add(i).write_volatile(v) }
    }
}

impl Drop for BufMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unused from here.
        let _ = unsafe { nix::sys::mman::munmap(self.addr.cast(), self.len) };
    }
}

/// `vmsplice` of the 4096 bytes at `addr` (a live mapping of the caller's) into pipe end `tx`:
/// the pipe then holds the page itself (its reference taken by `get_user_pages`). The bytes
/// spliced, or the errno.
pub(super) fn vmsplice_page(addr: *mut u8, tx: &std::os::fd::OwnedFd) -> Result<usize, Errno> {
    use std::os::fd::AsRawFd;
    let iov = nix::libc::iovec {
        iov_base: addr.cast(),
        iov_len: 4096,
    };
    // SAFETY: one iovec over the caller's live mapping, borrowed for the call; the pipe is the
    // caller's.
    let n = unsafe { nix::libc::vmsplice(tx.as_raw_fd(), &iov, 1, 0) };
    usize::try_from(n).map_err(|_| Errno::last())
}

/// An anonymous read-write mapping, unmapped on drop.
pub(super) struct UserMapAnon {
    pub(super) ptr: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
}

impl UserMapAnon {
    pub(super) fn new(len: usize, flags: MapFlags) -> Result<Self, Stop> {
        let nz = std::num::NonZeroUsize::new(len).ok_or_else(|| Stop::Fail("length 0".into()))?;
        // SAFETY: a new anonymous mapping at an address the kernel chooses aliases nothing.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                flags,
            )
        }
        .ctx("mmap")?;
        Ok(Self { ptr, len })
    }
}

impl Drop for UserMapAnon {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `new`, not used after.
        let _ = unsafe { munmap(self.ptr, self.len) };
    }
}
