// SPDX-License-Identifier: GPL-2.0

//! The documented errno of every refusal of the stream and event commands, each from a call
//! that would succeed but for the one bad input; a refused submit queues and records nothing.

use std::os::fd::{AsFd, AsRawFd};

use nix::{
    errno::Errno,
    unistd::{setuid, Uid},
};

use super::{
    drained, engine_on, exported, fence_of, mem_on, need_streams, signalled, sw_sync_or_none, K, M,
    USER_VA, WAIT_MS,
};
use crate::selftest::harness::{check, child_checks, expect_errno, Context, Stop, TestResult};
use crate::selftest::shared::mismatches;

mod objects;
use libruvm::{cmd, op, uapi, Ruvm};
use objects::{create_refusals, event_refusals, sync_query_destroy_refusals};

/// Submits `ops` to `s` raw (any count, any pointer).
fn submit_raw(d: &Ruvm, s: u64, count: u32, ops: u64) -> Result<u64, Errno> {
    let mut a = uapi::ruvm_stream_submit {
        handle: s,
        count,
        ops,
        ..Default::default()
    };
    d.call(cmd::STREAM_SUBMIT, &mut a).map(|()| a.first_seqno)
}

/// A submit of 2 operations to `s`, the first `o`, the second on the page after it, which is
/// not mapped.
fn partly_unreadable(d: &Ruvm, s: u64, o: uapi::ruvm_op) -> Result<Result<u64, Errno>, Stop> {
    use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .unwrap_or(4096);
    let two = std::num::NonZeroUsize::new(2 * page).ok_or(Stop::Fail("page size 0".into()))?;
    // SAFETY: a fresh private anonymous mapping, used through its own pointer only.
    let base = unsafe {
        mmap_anonymous(
            None,
            two,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
        )
    }
    .ctx("mmap")?;
    // SAFETY: the second page of the mapping just made; nothing points into it.
    let second = unsafe { base.byte_add(page) };
    // SAFETY: as above.
    unsafe { munmap(second, page) }.ctx("munmap")?;
    let at = second.as_ptr().cast::<uapi::ruvm_op>().wrapping_sub(1);
    // SAFETY: `at` is the last 72 bytes of the first page, mapped and writable, aligned (a
    // page is a multiple of 8).
    unsafe { at.write(o) };
    let r = submit_raw(d, s, 2, at as u64);
    // SAFETY: the first page, not used after this.
    unsafe { munmap(base, page) }.ctx("munmap")?;
    Ok(r)
}

/// A submit of `o` to `s` whose `struct ruvm_stream_submit` lies in a read-only page: its
/// `first_seqno` cannot be written.
fn read_only_submit(d: &Ruvm, s: u64, o: uapi::ruvm_op) -> Result<Result<(), Errno>, Stop> {
    use nix::sys::mman::{mmap_anonymous, mprotect, munmap, MapFlags, ProtFlags};
    let page = std::num::NonZeroUsize::new(4096).ok_or(Stop::Fail("page size 0".into()))?;
    // SAFETY: a fresh private anonymous mapping, used through its own pointer only.
    let base = unsafe {
        mmap_anonymous(
            None,
            page,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
        )
    }
    .ctx("mmap")?;
    let ops = [o];
    let arg = base.as_ptr().cast::<uapi::ruvm_stream_submit>();
    // SAFETY: the start of the page just made, aligned, writable until the mprotect.
    unsafe {
        arg.write(uapi::ruvm_stream_submit {
            handle: s,
            count: 1,
            ops: ops.as_ptr() as u64,
            ..Default::default()
        })
    };
    // SAFETY: the mapping just made.
    unsafe { mprotect(base, 4096, ProtFlags::PROT_READ) }.ctx("mprotect")?;
    // SAFETY: a pointer to a readable structure of the right type and size.
    let r = unsafe { d.ioctl_ptr(cmd::STREAM_SUBMIT.nr, arg.cast()) };
    // SAFETY: the mapping, not used after this.
    unsafe { munmap(base, 4096) }.ctx("munmap")?;
    Ok(r)
}

/// Which fields of a `ruvm_op` a kind uses, as the header says: an index into [`poke`].
fn uses(kind: u32, field: usize) -> bool {
    // flags, dst, dst_offset, src, src_offset, length, value, fill_kind, timeout_ms, reserved
    let used: &[usize] = match kind {
        uapi::ruvm_op_kind_RUVM_OP_COPY => &[1, 2, 3, 4, 5],
        uapi::ruvm_op_kind_RUVM_OP_COPY_VA => &[0, 1, 3, 5],
        uapi::ruvm_op_kind_RUVM_OP_FILL => &[1, 2, 5, 6, 7],
        uapi::ruvm_op_kind_RUVM_OP_RECORD => &[6],
        _ => &[6, 8],
    };
    used.contains(&field)
}

/// `o` with field `field` (see [`uses`]) made non-zero; its name.
fn poke(mut o: uapi::ruvm_op, field: usize) -> (uapi::ruvm_op, &'static str) {
    let name = match field {
        0 => {
            o.flags = 1 << 31;
            "flags"
        }
        1 => {
            o.dst = 1;
            "dst"
        }
        2 => {
            o.dst_offset = 8;
            "dst_offset"
        }
        3 => {
            o.src = 1;
            "src"
        }
        4 => {
            o.src_offset = 8;
            "src_offset"
        }
        5 => {
            o.length = 8;
            "length"
        }
        6 => {
            o.value = 1;
            "value"
        }
        7 => {
            o.fill_kind = 1;
            "fill_kind"
        }
        8 => {
            o.timeout_ms = 1;
            "timeout_ms"
        }
        _ => {
            o.reserved = 1;
            "reserved"
        }
    };
    (o, name)
}

/// Every documented errno of the stream and event commands, each from a call that would
/// otherwise succeed; a refused submit queues nothing and records nothing.
pub(super) fn stream_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    need_streams(&d)?;
    let gpus = d.gpus().ctx("GPU_LIST")?;
    let present = |x: &uapi::ruvm_gpu_info| x.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0;
    let engine = |x: &uapi::ruvm_gpu_info| {
        present(x) && x.flags & uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE != 0
    };
    // A simulated GPU if there is one (it has an MMU), else any with a copy engine.
    let Some(gi) = gpus
        .iter()
        .find(|x| crate::selftest::gpu::sim(x))
        .or_else(|| gpus.iter().find(|x| engine(x)))
    else {
        return Err(Stop::Skip("no GPU with a copy engine".into()));
    };
    let g = gi.id;
    let mmu = gi.flags & uapi::ruvm_gpu_flags_RUVM_GPU_MMU != 0;

    create_refusals(&d, &gpus, g)?;

    // What the valid operations use.
    let size = 64 * K;
    let src = mem_on(&d, g, size, Some(171))?;
    let dst = mem_on(&d, g, size, Some(72))?;
    // Not mapped on the GPU, nor for the CPU kernel.
    let bare = d.mem_alloc(size, 0, 0).ctx("MEM_ALLOC")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let done = d.event_create().ctx("EVENT_CREATE")?;
    // A sync_file that is signalled: an event never recorded, exported.
    let sig = d.event_export(done).ctx("EVENT_EXPORT")?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let q0 = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q0.submitted == 0
            && q0.completed == 0
            && q0.error == 0
            && q0.gpu == g
            && q0.current_seqno == 0
            && q0.current_len == 0,
        "a new stream: {q0:?}"
    );
    let mut good = vec![
        op::copy(dst, 8, src, 16, 4 * K),
        op::fill_pattern(dst, 4, 100, 9),
        op::record(e),
        op::wait_event(done, 1),
        op::wait_fd(sig.as_fd(), uapi::RUVM_WAIT_MAX_MS),
    ];
    if mmu {
        // Last: run by the valid submit at the end, it faults (nothing is mapped there).
        good.push(op::copy_va(USER_VA + M, USER_VA, 8, true));
    }
    let mut refused = 0;
    let mut expect = |r: Result<u64, Errno>, want: Errno, what: &str| -> TestResult {
        refused += 1;
        expect_errno(r, want, what)
    };

    // The stream and the array.
    expect(
        d.stream_submit(0xdead_beef, &[op::record(e)]),
        Errno::ENOENT,
        "STREAM_SUBMIT to no stream",
    )?;
    expect(d.stream_submit(s, &[]), Errno::EINVAL, "count 0")?;
    let many = vec![op::record(e); uapi::RUVM_MAX_SUBMIT_OPS as usize + 1];
    expect(
        d.stream_submit(s, &many),
        Errno::EINVAL,
        "count RUVM_MAX_SUBMIT_OPS + 1",
    )?;
    expect(submit_raw(&d, s, 1, 0), Errno::EFAULT, "ops NULL")?;
    expect(submit_raw(&d, s, 1, 8), Errno::EFAULT, "ops at address 8")?;
    expect(
        partly_unreadable(&d, s, op::record(e))?,
        Errno::EFAULT,
        "ops whose second is past a readable page",
    )?;
    // The structure itself read-only: first_seqno is written first, so nothing is queued.
    let before = d.stream_query(s).ctx("STREAM_QUERY")?.submitted;
    expect(
        read_only_submit(&d, s, op::record(e))?.map(|()| 0),
        Errno::EFAULT,
        "a read-only struct ruvm_stream_submit",
    )?;
    let after = d.stream_query(s).ctx("STREAM_QUERY")?.submitted;
    check!(
        after == before,
        "a submit refused for its unwritable first_seqno queued work: submitted {before} -> {after}"
    );
    for (what, f) in [
        (
            "flags",
            (|c| c.flags = 1) as fn(&mut uapi::ruvm_stream_submit),
        ),
        ("reserved[0]", |c| c.reserved[0] = 1),
        ("reserved[1]", |c| c.reserved[1] = 1),
    ] {
        let one = [op::record(e)];
        let mut c = uapi::ruvm_stream_submit {
            handle: s,
            count: 1,
            ops: one.as_ptr() as u64,
            ..Default::default()
        };
        f(&mut c);
        expect(
            d.call(cmd::STREAM_SUBMIT, &mut c).map(|()| 0),
            Errno::EINVAL,
            &format!("STREAM_SUBMIT with {what}"),
        )?;
    }

    // Bad kinds, and every field a kind does not use, alone and after a valid operation (the
    // valid one must not be queued either).
    // 7 and 8 are ALLOC and FREE (`selftest/stream_alloc.rs`).
    for kind in [0, 9, 0x100, u32::MAX] {
        let o = uapi::ruvm_op {
            kind,
            ..op::record(e)
        };
        expect(
            d.stream_submit(s, &[o]),
            Errno::EINVAL,
            &format!("kind {kind}"),
        )?;
    }
    for t in &good {
        for field in 0..10 {
            if uses(t.kind, field) {
                continue;
            }
            let (o, name) = poke(*t, field);
            let what = format!("{} with {name} set", op::kind_name(t));
            expect(d.stream_submit(s, &[o]), Errno::EINVAL, &what)?;
            expect(
                d.stream_submit(s, &[op::record(e), o]),
                Errno::EINVAL,
                &format!("a record, then {what}"),
            )?;
        }
    }
    // A wait for an event the submission recorded before it is satisfied by the stream's
    // order (it folds without being planned): its fields are checked all the same.
    let own_wait = op::wait_event(e, 1);
    let mut own = vec![
        (op::wait_event(e, 0), "timeout 0".to_string()),
        (
            op::wait_event(e, uapi::RUVM_WAIT_MAX_MS + 1),
            "timeout RUVM_WAIT_MAX_MS + 1".to_string(),
        ),
    ];
    for field in (0..10).filter(|&f| !uses(own_wait.kind, f)) {
        let (o, name) = poke(own_wait, field);
        own.push((o, format!("{name} set")));
    }
    for (o, what) in own {
        expect(
            d.stream_submit(s, &[op::record(e), o]),
            Errno::EINVAL,
            &format!("a record of e, then a wait-event on e with {what}"),
        )?;
        expect(
            d.stream_submit(s, &[op::record(done), op::record(e), o]),
            Errno::EINVAL,
            &format!("two records, then a wait-event on the second's event with {what}"),
        )?;
    }
    if mmu {
        let o = uapi::ruvm_op {
            flags: uapi::ruvm_va_space_flags_RUVM_VA_USER << 1,
            ..op::copy_va(USER_VA + M, USER_VA, 8, true)
        };
        expect(
            d.stream_submit(s, &[o]),
            Errno::EINVAL,
            "copy-va with an unknown flag",
        )?;
    }

    // Lengths and ranges.
    let mut cases: Vec<(uapi::ruvm_op, Errno, &str)> = vec![
        (
            op::copy(dst, 0, src, 0, 0),
            Errno::EINVAL,
            "copy of 0 bytes",
        ),
        (
            op::fill_byte(dst, 0, 0, 1),
            Errno::EINVAL,
            "fill of 0 bytes",
        ),
        (
            op::copy(dst, 0, src, 1, size),
            Errno::EINVAL,
            "copy from past the source's end",
        ),
        (
            op::copy(dst, 1, src, 0, size),
            Errno::EINVAL,
            "copy to past the destination's end",
        ),
        (
            op::copy(dst, u64::MAX, src, 0, 2),
            Errno::EOVERFLOW,
            "copy to offset ~0 (offset + length past 2^64)",
        ),
        (
            op::copy(dst, 0, src, u64::MAX - 1, 2),
            Errno::EOVERFLOW,
            "copy from offset ~0 - 1 (offset + length past 2^64)",
        ),
        (
            op::copy(dst, 0, src, 0, u64::MAX),
            Errno::EINVAL,
            "copy of ~0 bytes at offsets 0 (past both ends, no overflow)",
        ),
        (
            op::copy(dst, 8, src, 8, u64::MAX),
            Errno::EOVERFLOW,
            "copy of ~0 bytes at offsets 8 (offset + length past 2^64)",
        ),
        (
            op::fill_byte(dst, size, 1, 1),
            Errno::EINVAL,
            "fill past the end",
        ),
        (
            op::fill_byte(dst, u64::MAX, 2, 1),
            Errno::EOVERFLOW,
            "fill at offset ~0 (offset + length past 2^64)",
        ),
        (
            op::fill_byte(dst, 0, u64::MAX, 1),
            Errno::EINVAL,
            "fill of ~0 bytes at offset 0 (past the end, no overflow)",
        ),
        (
            op::fill_pattern(dst, 1, u64::MAX, 1),
            Errno::EOVERFLOW,
            "fill of ~0 bytes at offset 1 (offset + length past 2^64)",
        ),
        (
            uapi::ruvm_op {
                fill_kind: 2,
                ..op::fill_byte(dst, 0, 8, 1)
            },
            Errno::EINVAL,
            "fill kind 2",
        ),
        // Handles.
        (
            op::copy(0xdead_beef, 0, src, 0, 8),
            Errno::ENOENT,
            "copy to no mem",
        ),
        (
            op::copy(dst, 0, 0xdead_beef, 0, 8),
            Errno::ENOENT,
            "copy from no mem",
        ),
        (
            op::fill_byte(0xdead_beef, 0, 8, 1),
            Errno::ENOENT,
            "fill of no mem",
        ),
        (op::record(0xdead_beef), Errno::ENOENT, "record of no event"),
        (op::record(0), Errno::ENOENT, "record of event 0"),
        (
            op::wait_event(0xdead_beef, 1),
            Errno::ENOENT,
            "wait for no event",
        ),
        // Mappings.
        (
            op::copy(dst, 0, bare, 0, 8),
            Errno::ENXIO,
            "copy from a mem not mapped on the GPU",
        ),
        (
            op::copy(bare, 0, src, 0, 8),
            Errno::ENXIO,
            "copy to a mem not mapped on the GPU",
        ),
        (
            op::fill_byte(bare, 0, 8, 1),
            Errno::ENXIO,
            "fill of a mem not mapped for the CPU kernel",
        ),
        // Waits.
        (
            op::wait_event(done, 0),
            Errno::EINVAL,
            "wait-event with timeout 0",
        ),
        (
            op::wait_event(done, uapi::RUVM_WAIT_MAX_MS + 1),
            Errno::EINVAL,
            "wait-event with timeout RUVM_WAIT_MAX_MS + 1",
        ),
        (
            op::wait_fd(sig.as_fd(), 0),
            Errno::EINVAL,
            "wait-fd with timeout 0",
        ),
        (
            op::wait_fd(sig.as_fd(), uapi::RUVM_WAIT_MAX_MS + 1),
            Errno::EINVAL,
            "wait-fd with timeout RUVM_WAIT_MAX_MS + 1",
        ),
        (
            op::wait_fd(d.as_fd(), 1),
            Errno::EINVAL,
            "wait-fd on /dev/ruvm",
        ),
        (op::wait_raw_fd(-1, 1), Errno::EINVAL, "wait-fd on fd -1"),
        (
            op::wait_raw_fd(1 << 20, 1),
            Errno::EINVAL,
            "wait-fd on a closed fd",
        ),
    ];
    let (pipe_r, pipe_w) = nix::unistd::pipe().ctx("pipe")?;
    cases.push((
        op::wait_fd(pipe_r.as_fd(), 1),
        Errno::EINVAL,
        "wait-fd on a pipe",
    ));
    let closed = pipe_w.as_raw_fd();
    drop(pipe_w);
    cases.push((
        op::wait_raw_fd(closed, 1),
        Errno::EINVAL,
        "wait-fd on a just-closed fd",
    ));
    // A vidmem mem of the GPU is refused by FILL (it has no CPU kernel mapping).
    if mmu {
        // COPY_VA's ranges are addresses, not offsets in a mem: one that wraps is EINVAL.
        cases.extend([
            (
                op::copy_va(USER_VA + M, USER_VA, 0, true),
                Errno::EINVAL,
                "copy-va of 0 bytes",
            ),
            (
                op::copy_va(u64::MAX - 3, USER_VA, 8, true),
                Errno::EINVAL,
                "copy-va whose destination wraps past 2^64",
            ),
            (
                op::copy_va(USER_VA + M, u64::MAX - 3, 8, true),
                Errno::EINVAL,
                "copy-va whose source wraps past 2^64",
            ),
            (
                op::copy_va(USER_VA + M, USER_VA, u64::MAX, true),
                Errno::EINVAL,
                "copy-va of ~0 bytes (both ranges wrap)",
            ),
        ]);
    }
    let mut extra = vec![bare];
    if gi.vidmem_size > 0 {
        let v = d
            .vidmem_alloc(g, size, 0, 0)
            .ctx("vidmem MEM_ALLOC")?
            .handle;
        cases.push((op::fill_byte(v, 0, 8, 1), Errno::ENXIO, "fill of vidmem"));
        extra.push(v);
    }
    for (o, want, what) in cases {
        expect(d.stream_submit(s, &[o]), want, what)?;
        expect(
            d.stream_submit(s, &[op::record(e), o]),
            want,
            &format!("a record, then {what}"),
        )?;
    }
    // COPY_VA needs an MMU: a GPU with an engine but none (edu) refuses it.
    for x in gpus
        .iter()
        .filter(|x| engine(x) && x.flags & uapi::ruvm_gpu_flags_RUVM_GPU_MMU == 0)
    {
        let t = d.stream_create(x.id).ctx("STREAM_CREATE")?.handle;
        expect_errno(
            d.stream_submit(t, &[op::copy_va(USER_VA + M, USER_VA, 8, true)]),
            Errno::EOPNOTSUPP,
            &format!("copy-va on GPU {} (no MMU)", x.id),
        )?;
        d.stream_destroy(t).ctx("STREAM_DESTROY")?;
    }
    // The kernel VA space needs CAP_SYS_ADMIN: a child without it (as root: setuid).
    if mmu {
        let kernel_copy = op::copy_va(
            uapi::RUVM_GPU_KERNEL_VA_BASE + M,
            uapi::RUVM_GPU_KERNEL_VA_BASE,
            8,
            false,
        );
        let root = nix::unistd::getuid().is_root();
        child_checks(
            "COPY_VA in the kernel VA space without CAP_SYS_ADMIN was not EPERM",
            || {
                (!root || setuid(Uid::from_raw(65534)).is_ok())
                    && d.stream_submit(s, &[kernel_copy]) == Err(Errno::EPERM)
            },
        )?;
    }
    // Nothing was queued by any of it, nor recorded.
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.submitted == 0 && q.completed == 0 && q.error == 0,
        "after {refused} refused submits: {q:?}"
    );
    let qe = d.event_query(e).ctx("EVENT_QUERY")?;
    check!(
        qe.stream == 0 && qe.status == 1,
        "a refused submit recorded the event: {qe:?}"
    );
    check!(
        mismatches(&d, dst, size, 72)? == 0,
        "a refused submit wrote the destination"
    );
    // The boundaries are inclusive: RUVM_MAX_SUBMIT_OPS operations and the longest timeouts.
    let mut at_max = vec![op::record(e); uapi::RUVM_MAX_SUBMIT_OPS as usize - 2];
    at_max.extend([
        op::wait_event(done, uapi::RUVM_WAIT_MAX_MS),
        op::wait_fd(sig.as_fd(), uapi::RUVM_WAIT_MAX_MS),
    ]);
    let first = d
        .stream_submit(s, &at_max)
        .ctx("a submit of RUVM_MAX_SUBMIT_OPS operations")?;
    check!(first == 1, "the first seqno of a new stream is {first}");
    d.stream_submit(s, &good).ctx("the valid operations")?;
    // The copy-va (if any) is last and faults: nothing was mapped at the user VAs.
    let synced = d.stream_sync(s, WAIT_MS);
    if mmu {
        expect_errno(synced, Errno::EIO, "STREAM_SYNC after the copy-va's fault")?;
    } else {
        synced.ctx("STREAM_SYNC")?;
    }
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    let want = uapi::RUVM_MAX_SUBMIT_OPS as u64 + good.len() as u64;
    let fault = if mmu { Errno::EFAULT as u32 } else { 0 };
    check!(
        q.submitted == want && q.completed == want && q.error == fault && q.current_seqno == 0,
        "after the valid submits: {q:?}, wanted {want} operations retired, error {fault}, the engine on nothing"
    );
    // dst: its own pattern, src's [16, 16 + 4K) at [8, 8 + 4K) (the pattern of 171 read 16
    // bytes on is that of 172 at the offset 8 bytes on), and the fill over [4, 104).
    for (offset, end, seed, what) in [
        (0, 4, 72, "before the copy"),
        (4, 104, 9, "the fill"),
        (104, 8 + 4 * K, 172, "the copy"),
        (8 + 4 * K, size, 72, "after the copy"),
    ] {
        let v = uapi::ruvm_mem_fill {
            handle: dst,
            offset,
            length: end - offset,
            seed,
            ..Default::default()
        };
        let bad = d.mem_fill(true, v).ctx("MEM_VERIFY")?.mismatches;
        check!(bad == 0, "dst [{offset}, {end}), {what}: {bad} bytes wrong");
    }

    let s2 = sync_query_destroy_refusals(&d, g)?;

    event_refusals(&d, e, done, &sig, s2)?;
    for x in [s, s2] {
        d.stream_destroy(x).ctx("STREAM_DESTROY")?;
    }
    for x in [src, dst].into_iter().chain(extra) {
        d.mem_free(x).ctx("MEM_FREE")?;
    }
    drained(&d, "after the refusals")?;
    stream_queue_limit(&d, g)
}

/// RUVM_MAX_STREAM_OPS operations may wait on a stream; one more is EAGAIN (needs sw_sync to
/// hold them; skipped without).
fn stream_queue_limit(d: &Ruvm, g: u32) -> TestResult {
    let Some(tl) = sw_sync_or_none()? else {
        println!("# no sw_sync: the RUVM_MAX_STREAM_OPS bound is not checked");
        return Ok(());
    };
    let gate = tl.create_fence(1, "gate").ctx("CREATE_FENCE")?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let max = uapi::RUVM_MAX_STREAM_OPS as usize;
    let batch = uapi::RUVM_MAX_SUBMIT_OPS as usize;
    let mut ops = vec![op::wait_fd(gate.as_fd(), WAIT_MS)];
    ops.resize(max, op::record(e));
    for b in ops.chunks(batch) {
        d.stream_submit(s, b)
            .ctx("STREAM_SUBMIT up to RUVM_MAX_STREAM_OPS")?;
    }
    expect_errno(
        d.stream_submit(s, &[op::record(e)]),
        Errno::EAGAIN,
        "a submit beyond RUVM_MAX_STREAM_OPS",
    )?;
    // The engine is still on the first operation, the wait for the gate.
    let q = engine_on(d, s, 1, "the wait for the gate")?;
    check!(
        q.submitted == max as u64 && q.completed == 0,
        "{q:?}: wanted {max} submitted, none retired"
    );
    tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    d.stream_submit(s, &[op::record(e)])
        .ctx("a submit once the queue drained")?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drained(d, "after the full queue")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields set by each constructor of libruvm's `op` are the ones [`uses`] lists, so
    /// that [`poke`] makes only unused fields non-zero.
    #[test]
    fn the_field_table_matches_the_constructors() {
        let all = [
            op::copy(1, 2, 3, 4, 5),
            op::copy_va(1, 2, 3, true),
            op::fill_byte(1, 2, 3, 4),
            op::record(1),
            op::wait_event(1, 2),
            op::wait_raw_fd(1, 2),
        ];
        for o in all {
            let values = [
                u64::from(o.flags),
                o.dst,
                o.dst_offset,
                o.src,
                o.src_offset,
                o.length,
                o.value,
                u64::from(o.fill_kind),
                u64::from(o.timeout_ms),
                o.reserved,
            ];
            for (field, v) in values.into_iter().enumerate() {
                let (poked, name) = poke(o, field);
                assert_eq!(
                    v != 0,
                    uses(o.kind, field),
                    "{} field {name}",
                    op::kind_name(&o)
                );
                if v == 0 {
                    assert_ne!(format!("{poked:?}"), format!("{o:?}"), "poke of {name}");
                }
            }
        }
    }
}
