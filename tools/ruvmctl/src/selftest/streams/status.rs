// SPDX-License-Identifier: GPL-2.0

//! The stream status page (`RUVM_IOCTL_STREAM_STATUS`, `mmap` at `RUVM_STATUS_MMAP_OFFSET`):
//! a stream's slot says its completed point, read without a system call, as `STREAM_QUERY`
//! says it; the page is read-only, one a file, and a slot is the stream's until it goes.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::mman::{MapFlags, ProtFlags};

use super::{engine_on, setup, sw_sync, WAIT_MS};
use crate::selftest::harness::{check, expect_errno, Context, TestResult};
use libruvm::{cmd, op, uapi, Ruvm, StatusPage, UserMap};

/// A held stream's slot shows what it completed, not what was submitted; once the hold goes,
/// the slot follows to the last point, equal to `STREAM_QUERY`'s; the slot stays the stream's
/// on every call, a second stream gets another; a destroyed stream's slot is cleared once its
/// work is gone; a stream in error shows its errno and failed seqno.
pub(super) fn stream_status_page_follows_completion() -> TestResult {
    let (d, g) = setup()?;
    let tl = sw_sync()?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let st = d.stream_status(s).ctx("STREAM_STATUS")?;
    check!(
        st.offset == uapi::RUVM_STATUS_MMAP_OFFSET && st.completed == 0,
        "STREAM_STATUS: offset {:#x}, completed {}",
        st.offset,
        st.completed
    );
    let page = StatusPage::map(&d).ctx("mmap the status page")?;
    check!(
        page.completed(st.slot, s) == Some(0),
        "slot {} of a new stream says {:?}",
        st.slot,
        page.completed(st.slot, s)
    );
    let gate = tl.create_fence(1, "gate").ctx("CREATE_FENCE")?;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let first = d
        .stream_submit(
            s,
            &[
                op::record(e),
                op::wait_fd(gate.as_fd(), WAIT_MS),
                op::record(e),
            ],
        )
        .ctx("STREAM_SUBMIT")?;
    engine_on(&d, s, first + 1, "the gate")?;
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        page.completed(st.slot, s) == Some(q.completed) && q.completed == first,
        "held at the gate: the slot says {:?}, STREAM_QUERY {} (first op {first})",
        page.completed(st.slot, s),
        q.completed
    );
    tl.inc(1).ctx("open the gate")?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.completed == first + 2 && page.completed(st.slot, s) == Some(q.completed),
        "after the sync: the slot says {:?}, STREAM_QUERY {}",
        page.completed(st.slot, s),
        q.completed
    );
    let again = d.stream_status(s).ctx("STREAM_STATUS again")?;
    check!(
        again.slot == st.slot && again.completed == first + 2,
        "asked again: slot {} (was {}), completed {}",
        again.slot,
        st.slot,
        again.completed
    );
    let s2 = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let st2 = d.stream_status(s2).ctx("STREAM_STATUS")?;
    check!(
        st2.slot != st.slot && page.completed(st2.slot, s2) == Some(0),
        "a second stream: slot {}, says {:?}",
        st2.slot,
        page.completed(st2.slot, s2)
    );
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    let t = Instant::now();
    while page.completed(st.slot, s).is_some() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    check!(
        page.completed(st.slot, s).is_none(),
        "a destroyed idle stream still holds slot {} after 5 s",
        st.slot
    );
    // A stream in error: its slot says the errno and the seqno, as STREAM_QUERY does (an MMU
    // fault: a COPY_VA from a user VA nothing maps).
    let s3 = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let st3 = d.stream_status(s3).ctx("STREAM_STATUS")?;
    let nowhere = 0x10_0000_0000 + (64 << 20);
    let first = d
        .stream_submit(
            s3,
            &[
                op::record(e),
                op::copy_va(nowhere + 4096, nowhere, 4096, true),
                op::record(e),
            ],
        )
        .ctx("STREAM_SUBMIT")?;
    expect_errno(
        d.stream_sync(s3, WAIT_MS),
        Errno::EIO,
        "STREAM_SYNC of a faulted stream",
    )?;
    let q = d.stream_query(s3).ctx("STREAM_QUERY")?;
    let seen = page.read(st3.slot, s3);
    check!(
        q.error == Errno::EFAULT as u32
            && seen.is_some_and(|r| r.error == Errno::EFAULT as i32
                && r.failed_seqno == first + 1
                && r.completed == q.completed),
        "a faulted stream: its slot says {seen:?}, STREAM_QUERY {q:?}"
    );
    for h in [s2, s3] {
        d.stream_destroy(h).ctx("STREAM_DESTROY")?;
    }
    d.event_destroy(e).ctx("EVENT_DESTROY")?;
    Ok(())
}

/// The page is read-only (`EPERM` for a writable mapping, `EACCES` for `mprotect` to write),
/// one page exactly (`EINVAL` otherwise); `STREAM_STATUS` refuses an unknown stream (`ENOENT`),
/// flags and reserved bits (`EINVAL`); another file's page shows none of this file's streams;
/// a `STREAM_CREATE` that cannot write its answer leaves no stream.
pub(super) fn stream_status_page_refusals() -> TestResult {
    let (d, g) = setup()?;
    let page = libruvm::page_size().unwrap_or(4096);
    let map = |prot, len| {
        UserMap::new(
            &d,
            uapi::RUVM_STATUS_MMAP_OFFSET,
            len,
            prot,
            MapFlags::MAP_SHARED,
        )
    };
    // The mapping itself is not shown when one is made that should not have been.
    let tried = |prot, len| map(prot, len).map(|m| m.len());
    let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    expect_errno(tried(rw, page), Errno::EPERM, "a writable mapping")?;
    expect_errno(
        tried(ProtFlags::PROT_READ | ProtFlags::PROT_EXEC, page),
        Errno::EPERM,
        "an executable mapping",
    )?;
    expect_errno(
        tried(ProtFlags::PROT_READ, 2 * page),
        Errno::EINVAL,
        "two pages",
    )?;
    let ro = map(ProtFlags::PROT_READ, page).ctx("a read-only mapping")?;
    let ptr = std::ptr::NonNull::new(ro.as_ptr().cast::<std::ffi::c_void>())
        .ok_or_else(|| crate::selftest::harness::Stop::Fail("mmap gave NULL".into()))?;
    // SAFETY: `ptr` is the mapping `ro` holds, one page long; asking to make it writable
    // changes nothing if refused, as it must be.
    let r = unsafe { nix::sys::mman::mprotect(ptr, page, rw) };
    expect_errno(r, Errno::EACCES, "mprotect of the page to writable")?;
    expect_errno(d.stream_status(987_654), Errno::ENOENT, "an unknown stream")?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    for (what, a) in [
        (
            "flags",
            uapi::ruvm_stream_status {
                handle: s,
                flags: 1,
                ..Default::default()
            },
        ),
        (
            "reserved",
            uapi::ruvm_stream_status {
                handle: s,
                reserved: [0, 1],
                ..Default::default()
            },
        ),
    ] {
        let mut a = a;
        expect_errno(d.call(cmd::STREAM_STATUS, &mut a), Errno::EINVAL, what)?;
    }
    let st = d.stream_status(s).ctx("STREAM_STATUS")?;
    let other = Ruvm::open().ctx("open another file")?;
    let theirs = StatusPage::map(&other).ctx("the other file's page")?;
    check!(
        theirs.completed(st.slot, s).is_none(),
        "another file's page shows this file's stream in slot {}",
        st.slot
    );
    drop(ro);
    // A STREAM_CREATE whose answer cannot be written (EFAULT) leaves no stream behind under
    // the handle it would have had (the next one: handles count up).
    let args = uapi::ruvm_stream_create {
        gpu: g,
        ..Default::default()
    };
    let len = std::num::NonZeroUsize::new(page)
        .ok_or_else(|| crate::selftest::harness::Stop::Fail("page size 0".into()))?;
    // SAFETY: a new private anonymous page, used only here and unmapped below.
    let p = unsafe {
        nix::sys::mman::mmap_anonymous(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
        )
    }
    .ctx("mmap")?;
    // SAFETY: the page is ours and writable; the structure fits it.
    unsafe { p.cast::<uapi::ruvm_stream_create>().as_ptr().write(args) };
    // SAFETY: the page is ours; from now the kernel can read it and its write faults.
    unsafe { nix::sys::mman::mprotect(p, page, ProtFlags::PROT_READ) }.ctx("mprotect")?;
    // SAFETY: the argument is a readable `ruvm_stream_create` in a page no one else uses.
    let r = unsafe { d.ioctl_ptr(uapi::RUVM_IOCTL_STREAM_CREATE, p.as_ptr().cast()) };
    // SAFETY: the mapping made above, unused from here.
    let _ = unsafe { nix::sys::mman::munmap(p, page) };
    expect_errno(r, Errno::EFAULT, "STREAM_CREATE with a read-only argument")?;
    expect_errno(
        d.stream_status(s + 1),
        Errno::ENOENT,
        "STREAM_STATUS of the stream a failed STREAM_CREATE made",
    )?;
    expect_errno(
        d.stream_destroy(s + 1),
        Errno::ENOENT,
        "STREAM_DESTROY of the stream a failed STREAM_CREATE made",
    )?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    Ok(())
}
