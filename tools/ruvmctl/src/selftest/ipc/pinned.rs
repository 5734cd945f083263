// SPDX-License-Identifier: GPL-2.0

//! Chunks a pipe holds a page of (vmsplice) are never reused nor lent on a stream.

use super::*;

/// A mem of [`SIZE`] bytes of exportable pool `p` of `d` holding pattern `seed`, imported into
/// a new file, whose mapping of its import had the first page spliced into a pipe (which holds
/// the page) and was then unmapped.
pub(super) struct Pinned {
    h: u64,
    other: Ruvm,
    m: uapi::ruvm_mem_import,
    rx: OwnedFd,
    tx: OwnedFd,
    _fd: OwnedFd,
}

pub(super) fn pinned_import(d: &Ruvm, p: u64, seed: u64) -> Result<Pinned, Stop> {
    let h = d.pool_alloc(p, SIZE, 0).ctx("MEM_ALLOC")?.handle;
    let q = d.mem_query(h).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    write_pattern(&map, 0, SIZE, seed);
    drop(map);
    let (fd, _, other, _, m) = imported(d, p, h)?;
    let mq = other.mem_query(m.handle).ctx("MEM_QUERY of the import")?;
    let imap = UserMap::of_mem(&other, &mq).ctx("mmap of the import")?;
    let (rx, tx) = pipe().ctx("pipe")?;
    let n = super::super::shared::vmsplice_page(imap.as_ptr(), &tx).ctx("vmsplice")?;
    check!(n == 4096, "vmsplice of the import's first page gave {n}");
    drop(imap);
    Ok(Pinned {
        h,
        other,
        m,
        rx,
        tx,
        _fd: fd,
    })
}

/// The page a pipe holds (read out of it).
pub(super) fn pipe_page(rx: OwnedFd) -> Result<[u8; 4096], Stop> {
    let mut got = [0u8; 4096];
    std::fs::File::from(rx)
        .read_exact(&mut got)
        .ctx("read the pipe")?;
    Ok(got)
}

/// How many bytes of a first page are pattern `seed`.
pub(super) fn same_bytes(page: &[u8; 4096], seed: u64) -> usize {
    (0..4096u64)
        .filter(|&o| page[o as usize] == pattern::byte_at(seed, o))
        .count()
}

/// An importer that pinned a page of its import through its own mapping (`vmsplice` into a
/// pipe, which holds the page) cannot read the exporter's later mems: once both let go, the
/// chunks are not cached (a pool keeping everything, exact fit) but given back, so the
/// exporter's next allocation of the same size gets other chunks, and what the pipe holds is
/// the bytes of the time of the pin.
pub(super) fn ipc_pinned_chunks_never_reused() -> TestResult {
    let d = setup()?;
    let (seed_a, seed_b) = (0x1bd0, 0x1bd1);
    let (p, _) = d
        .pool_create_flags(0, u64::MAX, EXPORTABLE)
        .ctx("POOL_CREATE exportable, keeping everything")?;
    let Pinned {
        h,
        other,
        m,
        rx,
        tx,
        _fd,
    } = pinned_import(&d, p, seed_a)?;
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    d.mem_free(h).ctx("MEM_FREE")?;
    let again = d.pool_alloc(p, SIZE, 0).ctx("MEM_ALLOC again")?.handle;
    let q2 = d.mem_query(again).ctx("MEM_QUERY")?;
    let map2 = UserMap::of_mem(&d, &q2).ctx("mmap")?;
    write_pattern(&map2, 0, SIZE, seed_b);
    let got = pipe_page(rx)?;
    let (new, old) = (same_bytes(&got, seed_b), same_bytes(&got, seed_a));
    check!(
        old == 4096,
        "the pinned page holds {new} bytes of the exporter's later mem and {old} of its own"
    );
    drop((map2, tx));
    d.mem_free(again).ctx("MEM_FREE")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    Ok(())
}

/// A page of the import's mapping pinned in a pipe, then a `FREE` of the exported mem on a
/// stream (its chunks kept for the import), then the import's free (the chunks come back to
/// the pool's pending list, the free not observed), then an `ALLOC` of the same size on the same
/// stream, which may reuse what that stream freed: the new mem gets other chunks, and the pipe
/// still reads the bytes of the time of the pin.
pub(super) fn ipc_pinned_chunks_never_lent_on_a_stream() -> TestResult {
    let d = setup()?;
    let g = super::super::shared::sim_gpu(&d)?;
    let (seed_a, seed_b) = (0x1bd2, 0x1bd3);
    let (p, _) = d
        .pool_create_flags(0, u64::MAX, EXPORTABLE)
        .ctx("POOL_CREATE exportable, keeping everything")?;
    d.pool_access(p, g, true).ctx("POOL_SET_ACCESS")?;
    let Pinned {
        h,
        other,
        m,
        rx,
        tx,
        _fd,
    } = pinned_import(&d, p, seed_a)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let seqno = d
        .stream_submit(s, &[libruvm::op::free(h)])
        .ctx("STREAM_SUBMIT FREE")?;
    // The stream reaches the FREE (not observed: no synchronize), so that the import's free
    // brings the chunks back to the pending list rather than with the FREE's own drop.
    let t = std::time::Instant::now();
    while d.stream_query(s).ctx("STREAM_QUERY")?.completed < seqno {
        check!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "the stream did not reach its FREE"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let before = d.pool_get(p).ctx("POOL_GET")?;
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    let mut ops = [libruvm::op::alloc(p, SIZE, false)];
    d.stream_submit_mut(s, &mut ops)
        .ctx("STREAM_SUBMIT ALLOC")?;
    let after = d.pool_get(p).ctx("POOL_GET")?;
    d.stream_sync(s, 10_000).ctx("STREAM_SYNC")?;
    let (again, _) = libruvm::op::allocated(&ops[0]);
    println!(
        "# pool before the import's free: used {} pending {}; after the ALLOC: used {} pending {}",
        before.used_current, before.pending_bytes, after.used_current, after.pending_bytes
    );
    let q2 = d.mem_query(again).ctx("MEM_QUERY")?;
    let map2 = UserMap::of_mem(&d, &q2).ctx("mmap")?;
    write_pattern(&map2, 0, SIZE, seed_b);
    let old = same_bytes(&pipe_page(rx)?, seed_a);
    check!(
        old == 4096,
        "the pinned page holds {old} bytes of its own, the rest of the stream's next mem"
    );
    drop((map2, tx));
    d.mem_free(again).ctx("MEM_FREE")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    Ok(())
}
