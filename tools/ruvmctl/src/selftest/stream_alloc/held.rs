// SPDX-License-Identifier: GPL-2.0

//! A chunk someone else holds a page of never gets a new owner inside a submission: a pipe
//! that `vmsplice` filled from a user mapping of a mem keeps that mem's bytes, whatever a
//! later `ALLOC` of the submission that frees it (a borrow), or the `ALLOC` after a `FREE` of
//! that one (taking a mem whole), writes into its own mem. The new mem gets other chunks.

use std::{io::Read, os::fd::OwnedFd};

use nix::unistd::pipe;

use super::super::harness::{check, Context, Stop, TestResult};
use super::super::shared::{live, vmsplice_page};
use super::super::streams::{drained, mem_on, user_mismatches, WAIT_MS};
use super::{chunks, made, pool_for, settled, setup, submit, ALL, SIZE};
use crate::pattern;
use libruvm::{op, Ruvm, UserMap};

/// What the freed mem held (written through its user mapping).
const OLD: u64 = 0x4e1d_0a77_3c92_51b8;
/// What the new mem is given (copied by the engine from another mem).
const NEW: u64 = 0x9b03_e6f1_2a5c_7d40;

/// Mem `h` (of `SIZE` bytes) written with [`OLD`] through a user mapping whose first page was
/// spliced into a pipe (which holds the page); the mapping is returned when `keep`, else
/// unmapped. The pipe's read end, its write end, and the mapping.
fn spliced(d: &Ruvm, h: u64, keep: bool) -> Result<(OwnedFd, OwnedFd, Option<UserMap>), Stop> {
    let q = d.mem_query(h).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    for o in 0..SIZE {
        map.write(o as usize, pattern::byte_at(OLD, o));
    }
    let (rx, tx) = pipe().ctx("pipe")?;
    let n = vmsplice_page(map.as_ptr(), &tx).ctx("vmsplice")?;
    check!(n == 4096, "vmsplice of the mem's first page gave {n}");
    Ok((rx, tx, keep.then_some(map)))
}

/// The page the pipe holds, and how many of its bytes are still [`OLD`]'s.
fn pipe_keeps_old(rx: OwnedFd, what: &str) -> TestResult {
    let mut got = [0u8; 4096];
    std::fs::File::from(rx)
        .read_exact(&mut got)
        .ctx("read the pipe")?;
    let old = (0..4096u64)
        .filter(|&o| got[o as usize] == pattern::byte_at(OLD, o))
        .count();
    let new = (0..4096u64)
        .filter(|&o| got[o as usize] == pattern::byte_at(NEW, o))
        .count();
    check!(
        old == 4096,
        "{what}: the page the pipe holds has {old} bytes of the freed mem's and {new} of the new mem's, wanted all 4096 the freed mem's"
    );
    Ok(())
}

/// Submits `ops` (a `FREE` of mem `h` first, the last a `COPY` of [`NEW`] from `src` into the
/// mem the last `ALLOC` makes), checks that the new mem holds [`NEW`] and none of `h`'s
/// chunks, and that the pipe `rx` still holds `h`'s bytes. The new mem is freed.
fn submit_and_check(
    (d, g, s): (&Ruvm, u32, u64),
    (h, rx): (u64, OwnedFd),
    ops: Vec<libruvm::uapi::ruvm_op>,
    what: &str,
) -> TestResult {
    let freed = chunks(d, h, g, &format!("{what}: the mem to free"))?;
    let last = ops
        .iter()
        .rposition(|o| o.kind == libruvm::uapi::ruvm_op_kind_RUVM_OP_ALLOC)
        .ok_or_else(|| Stop::Fail(format!("{what}: no ALLOC")))?;
    let (_, ops) = submit(d, s, ops, what)?;
    let m = made(d, &ops, last, &format!("{what}: the last ALLOC"))?;
    d.stream_sync(s, WAIT_MS).ctx("STREAM_SYNC")?;
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(q.error == 0, "{what}: the stream failed: {q:?}");
    let got = chunks(d, m, g, &format!("{what}: the new mem"))?;
    check!(
        got.iter().all(|a| !freed.contains(a)),
        "{what}: the new mem's chunks {got:x?} include the freed mem's {freed:x?}, a page of which a pipe holds"
    );
    let (bad, at) = user_mismatches(d, m, SIZE, |o| pattern::byte_at(NEW, o))?;
    check!(
        bad == 0,
        "{what}: {bad} bytes of the new mem are not what the copy wrote, the first at {at:?}"
    );
    pipe_keeps_old(rx, what)?;
    d.mem_free(m).ctx("MEM_FREE")?;
    Ok(())
}

/// `[FREE h, ALLOC, COPY]`: the `ALLOC` (same pool, size) would borrow `h`'s chunks, but a pipe
/// holds a page of them (spliced from a user mapping, unmapped before the submission, or still
/// mapped at it): the `ALLOC` gets other chunks, the pipe keeps `h`'s bytes.
pub(super) fn salloc_borrow_never_passes_on_a_held_page() -> TestResult {
    let (d, g) = setup()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let src = mem_on(&d, g, SIZE, Some(NEW))?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    for keep in [false, true] {
        let what = if keep {
            "[FREE, ALLOC, COPY] of a mem still mapped"
        } else {
            "[FREE, ALLOC, COPY] of a mem unmapped"
        };
        let h = d
            .pool_alloc(p, SIZE, 0)
            .ctx("MEM_ALLOC from the pool")?
            .handle;
        let (rx, tx, map) = spliced(&d, h, keep)?;
        let ops = vec![
            op::free(h),
            op::alloc(p, SIZE, false),
            op::with_dst_index(op::copy(0, 0, src, 0, SIZE), 1),
        ];
        submit_and_check((&d, g, s), (h, rx), ops, what)?;
        drop((map, tx));
    }
    d.mem_free(src).ctx("MEM_FREE")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
}

/// `[FREE h, ALLOC, FREE 1, ALLOC, COPY]`: the second `ALLOC` takes the first's mem whole, and
/// neither ends up with `h`'s chunks, a page of which a pipe holds.
pub(super) fn salloc_whole_never_passes_on_a_held_page() -> TestResult {
    let (d, g) = setup()?;
    let before = live(&d)?;
    let p = pool_for(&d, g, u64::MAX, ALL)?;
    let src = mem_on(&d, g, SIZE, Some(NEW))?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let h = d
        .pool_alloc(p, SIZE, 0)
        .ctx("MEM_ALLOC from the pool")?
        .handle;
    let (rx, tx, _) = spliced(&d, h, false)?;
    let ops = vec![
        op::free(h),
        op::alloc(p, SIZE, false),
        op::free_index(1),
        op::alloc(p, SIZE, false),
        op::with_dst_index(op::copy(0, 0, src, 0, SIZE), 3),
    ];
    submit_and_check(
        (&d, g, s),
        (h, rx),
        ops,
        "[FREE, ALLOC, FREE 1, ALLOC, COPY]",
    )?;
    drop(tx);
    d.mem_free(src).ctx("MEM_FREE")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drained(&d, "at the end")?;
    settled(&d, &before, "at the end")
}
