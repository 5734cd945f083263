// SPDX-License-Identifier: GPL-2.0

//! User mappings after a free, moved mappings, a small mem's mapping filled at once, a forked
//! child without the mapping.

use super::*;

/// Runs `child` in a child process (which maps a mem, frees it, then reads the mapping): it
/// must die of `SIGBUS`, and the mem must not outlive it. `child` gets the live mem count before
/// and returns an exit code from 10 to name a failed step; `what` names the read.
pub(super) fn dies_of_sigbus_after_free(what: &str, child: impl FnOnce(u64) -> i32) -> TestResult {
    let probe = Ruvm::open().ctx("open")?;
    let before = live(&probe)?;
    let status = in_child(|| child(before.0))?;
    check!(
        status == WaitStatus::Signaled(status_pid(&status), Signal::SIGBUS, false),
        "{what}: child ended {status:?}, wanted SIGBUS (an exit code from 10 names a failed step)"
    );
    check!(
        live(&probe)? == before,
        "the mem outlived the process that mapped it: {:?}",
        live(&probe)?
    );
    Ok(())
}

/// In a child: a new file, a zeroed mem of `size` bytes in `chunk`-byte chunks (0: the
/// default), and its mapping; an exit code from 10 to 13 if a step fails.
pub(super) fn mapped_mem(size: u64, chunk: u64) -> Result<(Ruvm, u64, UserMap), i32> {
    let d = Ruvm::open().map_err(|_| 10)?;
    let a = d.mem_alloc(size, chunk, zero()).map_err(|_| 11)?;
    let q = d.mem_query(a.handle).map_err(|_| 12)?;
    let map = UserMap::of_mem(&d, &q).map_err(|_| 13)?;
    Ok((d, a.handle, map))
}

pub(super) fn mem_access_after_free_faults() -> TestResult {
    dies_of_sigbus_after_free("reading a freed mem's mapping", |before| {
        let (d, handle, map) = match mapped_mem(64 * K, 0) {
            Ok(m) => m,
            Err(code) => return code,
        };
        map.write(100, 7);
        if d.mem_free(handle).is_err() {
            return 14;
        }
        // The VMA still exists (zapped) and still accounts for the mem until it is unmapped.
        match d.info() {
            Ok(i) if i.live_mems == before + 1 => {}
            _ => return 15,
        }
        i32::from(map.read(100))
    })
}

/// A small mem's mapping, filled by its `mmap`, moved by `mremap` to another address: it keeps
/// its pages there (no fault), and a free still zaps it there (the read dies of `SIGBUS`).
pub(super) fn mem_moved_mapping_faults_after_free() -> TestResult {
    use nix::sys::mman::{mmap_anonymous, mremap, MRemapFlags};
    dies_of_sigbus_after_free("reading a freed mem's moved mapping", |_| {
        let (d, handle, map) = match mapped_mem(16 * K, 4 * K) {
            Ok(m) => m,
            Err(code) => return code,
        };
        map.write(5000, 42);
        let len = map.len();
        let Some(size) = std::num::NonZeroUsize::new(len) else {
            return 14;
        };
        // SAFETY: a new anonymous mapping at an address the kernel chooses: the place the
        // mem's mapping moves to.
        let Ok(hole) = (unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_NONE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_ANONYMOUS,
            )
        }) else {
            return 14;
        };
        let Some(old) = std::ptr::NonNull::new(map.as_ptr().cast::<std::ffi::c_void>()) else {
            return 14;
        };
        // The mapping moves: the old address must not be unmapped on drop.
        std::mem::forget(map);
        // SAFETY: the mem's mapping, `len` bytes, moved over the placeholder; nothing refers
        // to either address but the reads below.
        let Ok(moved) = (unsafe {
            mremap(
                old,
                len,
                len,
                MRemapFlags::MREMAP_MAYMOVE | MRemapFlags::MREMAP_FIXED,
                Some(hole),
            )
        }) else {
            return 15;
        };
        let p = moved.as_ptr().cast::<u8>();
        // SAFETY: `p` starts the moved mapping of `len` (16 KiB) bytes.
        if unsafe { p.add(5000).read_volatile() } != 42 {
            return 16;
        }
        if d.mem_free(handle).is_err() {
            return 17;
        }
        // SAFETY: still mapped (the VMA stays until unmapped), zapped: the read must fault.
        i32::from(unsafe { p.add(5000).read_volatile() })
    })
}

pub(super) fn status_pid(s: &WaitStatus) -> nix::unistd::Pid {
    s.pid().unwrap_or(nix::unistd::Pid::from_raw(0))
}

/// How many pages of `map` have a page-table entry (`mincore`: a mem's file has no page cache,
/// so only a mapped page counts).
pub(super) fn resident_pages(map: &UserMap) -> Result<usize, Stop> {
    let mut vec = vec![0u8; map.len().div_ceil(PAGE as usize)];
    // SAFETY: `map` is a live mapping of this process, and `vec` has one byte per page of it.
    let r = unsafe { nix::libc::mincore(map.as_ptr().cast(), map.len(), vec.as_mut_ptr()) };
    if r != 0 {
        return Err(Stop::Fail(format!("mincore: {}", Errno::last())));
    }
    Ok(vec.iter().filter(|b| **b & 1 != 0).count())
}

/// `mmap` of a mem of up to 16 pages inserts them all (the kernel's fault-around size), and
/// they are the mem's (bytes the kernel wrote read back through them); larger mems fill on
/// touch, a chunk at a time. A second address space mapping a mem that a first one's `mmap`
/// filled, while that mapping lasts, fills on touch; once it is gone, it is filled at `mmap`.
pub(super) fn mem_small_mmap_is_filled_at_once() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = live(&d)?;
    // (size, chunk size, pages filled at mmap, pages after touching the first byte)
    let cases = [
        (4 * K, 4 * K, 1, 1),
        (16 * K, 4 * K, 4, 4),
        (64 * K, 4 * K, 16, 16),
        (64 * K, 64 * K, 16, 16),
        (68 * K, 4 * K, 0, 1),
        (256 * K, 64 * K, 0, 16),
        (2 * M, 2 * M, 0, 512),
    ];
    for (size, chunk, at_mmap, after_touch) in cases {
        let what = format!("{size} bytes in {chunk}-byte chunks");
        let a = d.mem_alloc(size, chunk, zero()).ctx("alloc")?;
        let q = d.mem_query(a.handle).ctx("query")?;
        d.map_kernel(a.handle).ctx("map kernel")?;
        let seed = size ^ chunk;
        d.mem_fill(false, pattern_args(a.handle, 0, size, seed))
            .ctx("fill")?;
        let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
        let n = resident_pages(&map)?;
        check!(
            n == at_mmap,
            "{what}: {n} pages mapped right after mmap, wanted {at_mmap}"
        );
        map.write(0, map.read(0));
        let n = resident_pages(&map)?;
        check!(
            n == after_touch,
            "{what}: {n} pages mapped after the first touch, wanted {after_touch}"
        );
        let bad = (0..size)
            .filter(|&o| map.read(o as usize) != pattern::byte_at(seed, o))
            .count();
        check!(
            bad == 0,
            "{what}: {bad} bytes read through mmap differ from the fill"
        );
        drop(map);
        d.mem_free(a.handle).ctx("free")?;
    }
    // Another address space: a child maps the mem while the parent's filled mapping lasts,
    // then again once it is gone (the child's fd is the same open file).
    let a = d.mem_alloc(16 * K, 4 * K, zero()).ctx("alloc")?;
    let q = d.mem_query(a.handle).ctx("query")?;
    let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
    check!(
        resident_pages(&map)? == 4,
        "the parent's mapping was not filled at mmap"
    );
    // How many pages a child's own mapping of the mem has right after its mmap.
    let in_child_mapping = || -> Result<Option<usize>, Stop> {
        let status = in_child(|| {
            UserMap::of_mem(&d, &q)
                .ok()
                .and_then(|m| resident_pages(&m).ok())
                .map_or(100, |n| n.min(99) as i32)
        })?;
        Ok(match status {
            WaitStatus::Exited(_, n) if n < 100 => Some(n as usize),
            _ => None,
        })
    };
    let n = in_child_mapping()?;
    check!(
        n == Some(0),
        "a second address space's mmap while the first's filled mapping lasts: {n:?} pages mapped, wanted 0"
    );
    drop(map);
    let n = in_child_mapping()?;
    check!(
        n == Some(4),
        "a second address space's mmap once the first's mapping is gone: {n:?} pages mapped, wanted 4"
    );
    d.mem_free(a.handle).ctx("free")?;
    check!(live(&d)? == before, "mems left behind: {:?}", live(&d)?);
    Ok(())
}

pub(super) fn mem_forked_child_has_no_mapping() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let a = d.mem_alloc(2 * M, 2 * M, zero()).ctx("alloc")?;
    let q = d.mem_query(a.handle).ctx("query")?;
    let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
    map.write(5, 9);
    let p = map.as_ptr() as usize;
    let status = in_child(|| {
        // SAFETY: the mapping is VM_DONTCOPY, so this address is unmapped in the child: the
        // read must fault.
        let v = unsafe { (p as *const u8).add(5).read_volatile() };
        i32::from(v)
    })?;
    check!(
        status == WaitStatus::Signaled(status_pid(&status), Signal::SIGSEGV, false),
        "child reading the parent's mapping ended {status:?}, wanted SIGSEGV"
    );
    check!(map.read(5) == 9, "parent lost its mapping");
    check!(
        d.mem_query(a.handle).ctx("query")?.user_mappings == 1,
        "the fork changed the mapping count"
    );
    drop(map);
    d.mem_free(a.handle).ctx("free")
}
