// SPDX-License-Identifier: GPL-2.0

//! The leak audit and the statistics: counters against the real objects, watermarks through a
//! scripted sequence, bad inputs, a killed process, and planted leaks reported exactly.

use nix::{
    errno::Errno,
    sys::{
        signal::{kill, Signal},
        wait::waitpid,
    },
    unistd::{fork, pipe, read, setuid, write, ForkResult, Uid},
};

use super::harness::{
    cases, check, child_checks, expect_errno, in_child, Case, Context, Stop, TestResult,
};
use libruvm::{self as dev, uapi, Ruvm, UserMap};

use super::shared::{drop_kept, same_but, vidmem_gpu, VIDMEM_KEPT};

pub fn cases() -> Vec<Case> {
    cases![
        audit_counters_match_the_objects,
        audit_counts_vidmem_and_its_storage,
        audit_stats_watermarks_follow_a_script,
        audit_bad_inputs,
        audit_killed_process_leaves_nothing,
        audit_plant_clean_unload,
        audit_plant_mems,
        audit_plant_chunks,
        audit_plant_kernel_maps,
        audit_plant_lost_mem_kmemleak,
    ]
}

const M: u64 = 1024 * 1024;
const MEMS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_MEMS as usize;
const BYTES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_BYTES as usize;
const HANDLES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_HANDLES as usize;
const KMAPS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_KERNEL_MAPS as usize;
const UMAPS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_USER_MAPPINGS as usize;
const CHUNKS0: usize = uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_CHUNKS_ORDER0 as usize;
const CLASSES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_CLASSES as usize;

pub(super) fn test_ioctls(d: &Ruvm) -> Result<bool, Stop> {
    Ok(d.info().ctx("INFO")?.test_ioctls != 0)
}

/// Compares the counters with a walk of the real objects, and returns the counters.
fn consistent(d: &Ruvm, when: &str) -> Result<[u64; CLASSES], Stop> {
    let a = d.audit(true).ctx("AUDIT with walk")?;
    check!(a.classes as usize == CLASSES, "{} classes", a.classes);
    check!(
        a.live == a.walked,
        "{when}: counters {:?} != walked objects {:?}",
        a.live,
        a.walked
    );
    Ok(a.live)
}

fn audit_counters_match_the_objects() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    if !test_ioctls(&d)? {
        return Err(Stop::Skip("the walk needs enable_test_ioctls=1".into()));
    }
    let base = consistent(&d, "at the start")?;
    let a = d.mem_alloc(M + 1, 64 * 1024, 0).ctx("alloc")?;
    let b = d.mem_alloc(3 * M, 2 * M, 0).ctx("alloc")?;
    let c = d.mem_alloc(5000, 0, 0).ctx("alloc")?;
    let l = consistent(&d, "after three allocations")?;
    check!(
        l[MEMS] == base[MEMS] + 3 && l[HANDLES] == base[HANDLES] + 3,
        "mems/handles {:?}",
        l
    );
    check!(
        l[BYTES] == base[BYTES] + (M + 64 * 1024) + 4 * M + 8192,
        "bytes {}",
        l[BYTES] - base[BYTES]
    );
    check!(
        l[CHUNKS0 + 4] == base[CHUNKS0 + 4] + 17,
        "64K chunks: {}",
        l[CHUNKS0 + 4] - base[CHUNKS0 + 4]
    );
    check!(
        l[CHUNKS0 + 9] == base[CHUNKS0 + 9] + 2,
        "2M chunks: {}",
        l[CHUNKS0 + 9] - base[CHUNKS0 + 9]
    );
    check!(
        l[CHUNKS0] == base[CHUNKS0] + 2,
        "4K chunks: {}",
        l[CHUNKS0] - base[CHUNKS0]
    );
    d.map_kernel(a.handle).ctx("map")?;
    d.map_kernel(b.handle).ctx("map")?;
    let q = d.mem_query(c.handle).ctx("query")?;
    let m1 = UserMap::of_mem(&d, &q).ctx("mmap")?;
    let m2 = UserMap::of_mem(&d, &q).ctx("mmap")?;
    let l = consistent(&d, "with two kernel and two user mappings")?;
    check!(
        l[KMAPS] == base[KMAPS] + 2 && l[UMAPS] == base[UMAPS] + 2,
        "maps {:?}",
        l
    );
    // Freed while mapped: no handle, but alive (and walked) until unmapped.
    d.mem_free(c.handle).ctx("free while mapped")?;
    let l = consistent(&d, "with a freed but mapped mem")?;
    check!(
        l[HANDLES] == base[HANDLES] + 2 && l[MEMS] == base[MEMS] + 3,
        "after free while mapped {:?}",
        l
    );
    drop(m1);
    drop(m2);
    d.mem_free(a.handle).ctx("free")?;
    let l = consistent(&d, "after unmapping and another free")?;
    check!(
        l[MEMS] == base[MEMS] + 1 && l[UMAPS] == base[UMAPS] && l[KMAPS] == base[KMAPS] + 1,
        "{:?}",
        l
    );
    d.mem_free(b.handle).ctx("free")?;
    check!(
        consistent(&d, "at the end")? == base,
        "counters did not return to where they started"
    );
    Ok(())
}

fn audit_counts_vidmem_and_its_storage() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    if !test_ioctls(&d)? {
        return Err(Stop::Skip("the walk needs enable_test_ioctls=1".into()));
    }
    let g = vidmem_gpu(&d)?;
    let vbytes = uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_BYTES as usize;
    let vchunks = uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_CHUNKS as usize;
    let vroots = uapi::ruvm_audit_class_RUVM_AUDIT_VIDMEM_ROOTS as usize;
    let dma = uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS as usize;
    drop_kept(&d)?;
    let base = consistent(&d, "at the start")?;
    // 3M in 2M chunks (two roots), and 100K in 64K chunks (a third root, split).
    let a = d.vidmem_alloc(g.id, 3 * M, 0, 0).ctx("alloc")?.handle;
    let b = d.vidmem_alloc(g.id, 100 * 1024, 0, 0).ctx("alloc")?.handle;
    let l = consistent(&d, "with two vidmem mems")?;
    check!(
        l[MEMS] == base[MEMS] + 2
            && l[BYTES] == base[BYTES]
            && l[vbytes] == base[vbytes] + 4 * M + 128 * 1024
            && l[vchunks] == base[vchunks] + 4
            && l[vroots] == base[vroots] + 3
            && l[dma] == base[dma] + 3,
        "vidmem counts {:?} (from {:?})",
        l,
        base
    );
    d.mem_free(a).ctx("free")?;
    let l = consistent(&d, "after freeing the 2M mem")?;
    check!(
        l[vroots] == base[vroots] + 1 && l[vchunks] == base[vchunks] + 2,
        "after free {:?}",
        l
    );
    d.mem_free(b).ctx("free")?;
    // The storage of the three roots may be kept for reuse (counted apart), until the
    // shrinker gives it back.
    let l = consistent(&d, "at the end")?;
    check!(
        same_but(&l, &base, VIDMEM_KEPT) && l[VIDMEM_KEPT] <= base[VIDMEM_KEPT] + 3,
        "counters did not return to where they started: {l:?} from {base:?}"
    );
    drop_kept(&d)?;
    check!(
        consistent(&d, "after the shrinker")? == base,
        "counters did not return to where they started"
    );
    Ok(())
}

fn audit_stats_watermarks_follow_a_script() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    if !Uid::effective().is_root() {
        return Err(Stop::Skip("resetting peaks needs CAP_SYS_ADMIN".into()));
    }
    let s0 = d.stats(true).ctx("STATS with reset")?;
    let (r0, u0) = (s0.reserved_bytes, s0.used_bytes);
    let s = d.stats(false).ctx("STATS")?;
    check!(
        s.reserved_peak == r0 && s.used_peak == u0,
        "reset did not restart the peaks: {s:?}"
    );
    let a = d.mem_alloc(M + 1, 0, 0).ctx("alloc A")?; // reserves 1M + 4K, uses 1M + 1
    let b = d.mem_alloc(2 * M, 2 * M, 0).ctx("alloc B")?; // reserves 2M, uses 2M
    expect_errno(d.mem_alloc(0, 0, 0), Errno::EINVAL, "a refused allocation")?;
    d.mem_free(a.handle).ctx("free A")?;
    let s = d.stats(false).ctx("STATS")?;
    check!(
        s.reserved_bytes == r0 + 2 * M,
        "reserved now {} (wanted +2M)",
        s.reserved_bytes - r0
    );
    check!(
        s.reserved_peak == r0 + 3 * M + 4096,
        "reserved peak {} (wanted +3M+4K)",
        s.reserved_peak - r0
    );
    check!(
        s.used_bytes == u0 + 2 * M && s.used_peak == u0 + 3 * M + 1,
        "used {}/{}",
        s.used_bytes - u0,
        s.used_peak - u0
    );
    check!(
        s.allocs == s0.allocs + 2,
        "allocs +{}",
        s.allocs - s0.allocs
    );
    check!(s.frees == s0.frees + 1, "frees +{}", s.frees - s0.frees);
    check!(
        s.alloc_failures == s0.alloc_failures + 1,
        "failures +{}",
        s.alloc_failures - s0.alloc_failures
    );
    check!(
        s.mems == s0.mems + 1 && s.mems_peak == s0.mems + 2,
        "mems {}/{}",
        s.mems,
        s.mems_peak
    );
    // Reset: the peaks come down to now.
    d.stats(true).ctx("reset")?;
    let s = d.stats(false).ctx("STATS")?;
    check!(
        s.reserved_peak == r0 + 2 * M && s.used_peak == u0 + 2 * M,
        "after reset: {s:?}"
    );
    d.mem_free(b.handle).ctx("free B")?;
    let s = d.stats(false).ctx("STATS")?;
    check!(
        s.reserved_bytes == r0 && s.reserved_peak == r0 + 2 * M,
        "after freeing all: {s:?}"
    );
    // The statistics agree with what the queries and INFO say.
    let i = d.info().ctx("INFO")?;
    check!(
        i.live_mems == s.mems && i.live_bytes == s.reserved_bytes,
        "INFO {}/{} vs STATS {}/{}",
        i.live_mems,
        i.live_bytes,
        s.mems,
        s.reserved_bytes
    );
    Ok(())
}

fn audit_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    // Unknown flags, pad and reserved fields: the ABI table (`abi_*`).
    if !test_ioctls(&d)? {
        expect_errno(d.audit(true), Errno::ENOSYS, "walk without test ioctls")?;
        let leak = d.test_leak(uapi::ruvm_leak_RUVM_LEAK_CHUNK, 0, 1, 0, 0);
        expect_errno(leak, Errno::ENOSYS, "planted leak with test ioctls off")?;
    }
    let mut s = uapi::ruvm_stats {
        backing: 5,
        ..Default::default()
    };
    expect_errno(
        d.call(libruvm::cmd::STATS, &mut s),
        Errno::EINVAL,
        "stats of an unknown backing",
    )?;
    // The unload state: misaligned, across a page, not memory, with flags.
    let page = Box::new([0u64; 1024]);
    let base = page.as_ptr() as u64;
    let first_page_end = (base / 4096 + 1) * 4096;
    let reg = |addr: u64, flags: u32| {
        let mut r = uapi::ruvm_register_unload_state {
            addr,
            flags,
            ..Default::default()
        };
        d.call(libruvm::cmd::REGISTER_UNLOAD_STATE, &mut r)
    };
    expect_errno(reg(base + 4, 0), Errno::EINVAL, "unload state misaligned")?;
    expect_errno(
        reg(first_page_end - 64, 0),
        Errno::EINVAL,
        "unload state across a page",
    )?;
    expect_errno(reg(base, 1), Errno::EINVAL, "unload state flags")?;
    expect_errno(
        reg(8, 0),
        Errno::EFAULT,
        "unload state at an unmapped address",
    )?;
    // Without CAP_SYS_ADMIN: no registration, no reset of the shared watermarks.
    child_checks("unprivileged register/reset not refused with EPERM", || {
        setuid(Uid::from_raw(65534)).is_ok()
            && reg(base, 0) == Err(Errno::EPERM)
            && d.stats(true).err() == Some(Errno::EPERM)
            && d.stats(false).is_ok()
    })
}

fn audit_killed_process_leaves_nothing() -> TestResult {
    let probe = Ruvm::open().ctx("open")?;
    let before = probe.info().ctx("INFO")?;
    let (rx, tx) = pipe().ctx("pipe")?;
    // SAFETY: the runner is single-threaded here; the child only makes syscalls and touches
    // its own memory until it is killed.
    match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            let work = || -> Option<()> {
                let d = Ruvm::open().ok()?;
                let mut maps = Vec::new();
                for (size, ps) in [(3 * M, 0), (4 * M, 2 * M), (70_000, 64 * 1024)] {
                    let a = d.mem_alloc(size, ps, 0).ok()?;
                    d.map_kernel(a.handle).ok()?;
                    let q = d.mem_query(a.handle).ok()?;
                    maps.push(UserMap::of_mem(&d, &q).ok()?);
                }
                write(&tx, b"k").ok()?;
                // Busy with its mems, until killed.
                loop {
                    for m in &maps {
                        m.write(0, m.read(0).wrapping_add(1));
                    }
                }
            };
            let _ = work();
            std::process::exit(1);
        }
        ForkResult::Parent { child } => {
            let mut b = [0u8; 1];
            let n = read(&rx, &mut b).ctx("read")?;
            check!(n == 1, "the child failed before it was ready");
            let during = probe.info().ctx("INFO")?;
            check!(
                during.live_mems == before.live_mems + 3,
                "the child's mems are not counted"
            );
            kill(child, Signal::SIGKILL).ctx("kill")?;
            waitpid(child, None).ctx("waitpid")?;
        }
    }
    let after = probe.info().ctx("INFO")?;
    check!(
        (after.live_mems, after.live_bytes) == (before.live_mems, before.live_bytes),
        "a killed process left {} mems ({} bytes)",
        after.live_mems - before.live_mems,
        after.live_bytes - before.live_bytes
    );
    if test_ioctls(&probe)? {
        consistent(&probe, "after the kill")?;
    }
    Ok(())
}

/// The parameters the plant cases reload the module with.
const PLANT_PARAMS: &str = "enable_test_ioctls=1 leak_checker=2";

/// Skips unless this run is the plant run: test ioctls on and nothing else holding the device.
fn plant_run() -> Result<(), Stop> {
    let d = Ruvm::open().ctx("open")?;
    let i = d.info().ctx("INFO")?;
    let a = d.audit(false).ctx("AUDIT")?;
    if i.test_ioctls == 0 || a.level != 2 {
        return Err(Stop::Skip(format!(
            "planted leaks run in a guest loaded with {PLANT_PARAMS}"
        )));
    }
    Ok(())
}

/// Unloads (checking the verdict against `want`: class index and count) and loads again.
fn unload_expect(want: &[(usize, u64)]) -> TestResult {
    let st = dev::unload_with_verdict().map_err(Stop::Fail)?;
    let reload = dev::load_module(PLANT_PARAMS);
    check!(
        st.state & u64::from(uapi::ruvm_unload_state_bits_RUVM_UNLOAD_DONE) != 0,
        "no unload verdict written"
    );
    let leaked = st.state & u64::from(uapi::ruvm_unload_state_bits_RUVM_UNLOAD_LEAKED) != 0;
    let want_leak = !want.is_empty();
    check!(
        leaked == want_leak,
        "verdict leaked={leaked}, wanted {want_leak}"
    );
    let mut expected = [0u64; CLASSES];
    for &(c, n) in want {
        expected[c] = n;
    }
    check!(
        st.leaked == expected,
        "leaked {:?}, wanted {:?}",
        st.leaked,
        expected
    );
    reload.map_err(Stop::Fail)
}

fn leak(what: u32, flags: u32, count: u64, size: u64, order: u32) -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    d.test_leak(what, flags, count, size, order)
        .ctx("TEST_LEAK")
}

fn audit_plant_clean_unload() -> TestResult {
    plant_run()?;
    {
        let d = Ruvm::open().ctx("open")?;
        let h = d.mem_alloc(M, 0, 0).ctx("alloc")?.handle;
        d.map_kernel(h).ctx("map")?;
        // Bad leak requests first.
        expect_errno(d.test_leak(9, 0, 1, 0, 0), Errno::EINVAL, "unknown leak")?;
        expect_errno(d.test_leak(2, 0, 0, 0, 0), Errno::EINVAL, "count 0")?;
        expect_errno(d.test_leak(2, 0, 65, 0, 0), Errno::EINVAL, "count 65")?;
        expect_errno(d.test_leak(2, 0, 1, 0, 11), Errno::EINVAL, "order 11")?;
        // Only one unload state per load.
        let mut first = Box::new(dev::UnloadState::default());
        d.register_unload_state(&mut first).ctx("register")?;
        let mut second = Box::new(dev::UnloadState::default());
        expect_errno(
            d.register_unload_state(&mut second),
            Errno::EBUSY,
            "second registration",
        )?;
        // This file still holds a mem when it closes: reclaimed, not leaked.
        std::mem::forget(first);
    }
    // `first` holds the slot for this load; unload with rmmod semantics and check the log.
    let mark = crate::kmsg::write_marker().ctx("mark")?;
    nix::kmod::delete_module(c"ruvm", nix::kmod::DeleteModuleFlags::O_NONBLOCK).ctx("unload")?;
    dev::load_module(PLANT_PARAMS).map_err(Stop::Fail)?;
    let log = crate::kmsg::read_kmsg().ctx("kmsg")?;
    let part = crate::kmsg::since(&log, Some(&mark)).ok_or(Stop::Fail("marker lost".into()))?;
    let f = crate::kmsg::Findings::parse(part.iter().map(String::as_str));
    check!(
        f.unloads.len() == 1 && f.unloads[0].verdict == "clean",
        "unload findings {:?}",
        f.unloads
    );
    // A clean cycle through the unload state too.
    {
        let d = Ruvm::open().ctx("open")?;
        let h = d.mem_alloc(M, 0, 0).ctx("alloc")?.handle;
        d.mem_free(h).ctx("free")?;
    }
    unload_expect(&[])
}

fn audit_plant_mems() -> TestResult {
    plant_run()?;
    // Three held mems of 10000 bytes (3 pages each), one kernel-mapped each.
    leak(
        uapi::ruvm_leak_RUVM_LEAK_MEM,
        uapi::ruvm_leak_flags_RUVM_LEAK_MAPPED,
        3,
        10_000,
        0,
    )?;
    {
        let d = Ruvm::open().ctx("open")?;
        consistent(&d, "with planted mems")?;
    }
    let mark = crate::kmsg::write_marker().ctx("mark")?;
    unload_expect(&[(MEMS, 3), (BYTES, 3 * 12288), (KMAPS, 3), (CHUNKS0, 9)])?;
    // The log says the same, with one origin line per mem (level 2).
    let log = crate::kmsg::read_kmsg().ctx("kmsg")?;
    let part = crate::kmsg::since(&log, Some(&mark)).ok_or(Stop::Fail("marker lost".into()))?;
    let f = crate::kmsg::Findings::parse(part.iter().map(String::as_str));
    check!(
        f.leaked() && f.unloads.len() == 1,
        "unloads {:?}",
        f.unloads
    );
    let u = &f.unloads[0];
    check!(
        u.classes.get("mems") == Some(&3) && u.classes.get("kernel_maps") == Some(&3),
        "classes {:?}",
        u.classes
    );
    check!(
        u.classes.get("sysmem_chunks_o0") == Some(&9) && u.classes.len() == 4,
        "classes {:?}",
        u.classes
    );
    check!(
        u.objects.len() == 3 && u.objects.iter().all(|o| o.contains("ioctl=TEST_LEAK")),
        "objects {:?}",
        u.objects
    );
    Ok(())
}

fn audit_plant_chunks() -> TestResult {
    plant_run()?;
    leak(uapi::ruvm_leak_RUVM_LEAK_CHUNK, 0, 2, 0, 5)?;
    leak(uapi::ruvm_leak_RUVM_LEAK_CHUNK, 0, 1, 0, 9)?;
    unload_expect(&[(CHUNKS0 + 5, 2), (CHUNKS0 + 9, 1)])
}

fn audit_plant_kernel_maps() -> TestResult {
    plant_run()?;
    leak(uapi::ruvm_leak_RUVM_LEAK_KERNEL_MAP, 0, 4, 0, 0)?;
    unload_expect(&[(KMAPS, 4), (CHUNKS0, 4)])
}

fn audit_plant_lost_mem_kmemleak() -> TestResult {
    plant_run()?;
    if !std::path::Path::new("/sys/kernel/debug/kmemleak").exists() {
        return Err(Stop::Skip(
            "no kmemleak in this kernel (the debug kernel has it)".into(),
        ));
    }
    // Clear what kmemleak knows, so that what it finds next is ours.
    std::fs::write("/sys/kernel/debug/kmemleak", "clear").ctx("kmemleak clear")?;
    // From a child that exits at once: kmemleak scans live tasks' kernel stacks, and a stale
    // copy of the pointer on this process's stack would count as a reference.
    child_checks("the child could not plant the leak", || {
        let lost = uapi::ruvm_leak_flags_RUVM_LEAK_LOST;
        leak(uapi::ruvm_leak_RUVM_LEAK_MEM, lost, 1, 4096, 0).is_ok()
    })?;
    // The audit catches it at unload: nothing can free it, it is still counted.
    unload_expect(&[(MEMS, 1), (BYTES, 4096), (CHUNKS0, 1)])?;
    // And kmemleak finds the lost objects once they are old enough (5 s) and no stale copy of
    // a pointer to them is left where it scans (a few rounds: its heuristics need them).
    std::thread::sleep(std::time::Duration::from_secs(5));
    let mut found = 0;
    for _ in 0..10 {
        // Exited tasks' kernel stacks are cached for reuse without being cleared, and kmemleak
        // scans them: a few short-lived processes recycle them.
        for _ in 0..4 {
            in_child(|| 0)?;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
        found = crate::kmsg::kmemleak_scan()
            .ok_or(Stop::Fail("kmemleak scan".into()))?
            .0;
        if found > 0 {
            break;
        }
    }
    check!(found > 0, "kmemleak found nothing of a lost mem in 15 s");
    // Reported and checked: clear it so that the runner's own check does not count it again.
    std::fs::write("/sys/kernel/debug/kmemleak", "clear").ctx("kmemleak clear")?;
    Ok(())
}
