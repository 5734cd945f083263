// SPDX-License-Identifier: GPL-2.0

//! Sparse mems (`RUVM_ALLOC_SPARSE`, `RUVM_IOCTL_MEM_RANGE`): chunks made resident and given
//! back range by range. Bytes are written through one path (the user mapping, a kernel fill,
//! the copy engine) and read through another; a released range faults and reads zero once
//! populated again; a release is refused under queued work; the audit's counts follow every
//! step. Every case skips without `RUVM_FEATURE_SPARSE`.

use std::os::fd::AsFd;

use libruvm::{cmd, op, uapi, Errno, Ruvm, UserMap};

use super::harness::{cases, check, expect_errno, Case, Context, Stop, TestResult};
use super::shared::{live, readable, sim_gpu};

const K: u64 = 1024;
const CHUNK: u64 = 64 * K;
const SPARSE: u32 = uapi::ruvm_alloc_flags_RUVM_ALLOC_SPARSE;
const CHUNKS_ORDER4: usize = uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_CHUNKS_ORDER0 as usize + 4;
const BYTES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_BYTES as usize;
const DMA: usize = uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS as usize;

pub fn cases() -> Vec<Case> {
    cases![
        sparse_chunks_come_and_go,
        sparse_engine_and_fill_reach_resident_chunks,
        sparse_release_refused_under_queued_work,
        sparse_two_gpus_keep_chunks_apart,
        sparse_populate_bounded_by_the_memory_cgroup,
        sparse_refusals,
    ]
}

/// The device, or a skip without sparse mems.
fn setup() -> Result<Ruvm, Stop> {
    let d = Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    if info.features & u64::from(uapi::RUVM_FEATURE_SPARSE) == 0 {
        return Err(Stop::Skip("no RUVM_FEATURE_SPARSE".into()));
    }
    Ok(d)
}

/// A sparse mem of `chunks` chunks of [`CHUNK`] bytes, and its user mapping.
fn sparse(d: &Ruvm, chunks: u64) -> Result<(u64, UserMap), Stop> {
    let a = d
        .mem_alloc(chunks * CHUNK, CHUNK, SPARSE)
        .ctx("MEM_ALLOC sparse")?;
    let q = d.mem_query(a.handle).ctx("MEM_QUERY")?;
    check!(
        q.alloc_flags & SPARSE != 0 && q.chunk_size == CHUNK && q.chunk_count == chunks,
        "MEM_QUERY of a sparse mem: {q:?}"
    );
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    Ok((a.handle, map))
}

fn byte(map: &UserMap, at: u64) -> u8 {
    map.read(at as usize)
}

/// Whether every byte of chunk `c` reads `v` through the user mapping.
fn chunk_is(map: &UserMap, c: u64, v: u8) -> bool {
    (c * CHUNK..(c + 1) * CHUNK).all(|o| byte(map, o) == v)
}

/// A sparse mem of 4 chunks: absent chunks fault (read by `/proc/self/mem`, which sees the
/// `SIGBUS` as an error), populated ones read zero and keep what the process writes, a released
/// one faults again and reads zero once populated again; the audit counts exactly the
/// resident chunks and bytes, and nothing once the mem is freed.
fn sparse_chunks_come_and_go() -> TestResult {
    let d = setup()?;
    let before = live(&d)?;
    let (h, map) = sparse(&d, 4)?;
    let base = map.as_ptr();
    let at = |c: u64| base.wrapping_add((c * CHUNK) as usize);
    check!(
        (0..4).all(|c| !readable(at(c))),
        "an absent chunk of a new sparse mem is readable"
    );
    let resident = d
        .mem_range(h, CHUNK, 2 * CHUNK, true)
        .ctx("POPULATE 1..3")?;
    check!(
        resident == 2 * CHUNK,
        "resident after populating 2 chunks: {resident}"
    );
    check!(
        readable(at(1)) && readable(at(2)) && !readable(at(0)) && !readable(at(3)),
        "after populating chunks 1 and 2, the wrong chunks are readable"
    );
    check!(
        chunk_is(&map, 1, 0) && chunk_is(&map, 2, 0),
        "a populated chunk is not zero"
    );
    for o in CHUNK..3 * CHUNK {
        map.write(o as usize, (o % 251) as u8 + 1);
    }
    let l = live(&d)?;
    check!(
        l[CHUNKS_ORDER4] == before[CHUNKS_ORDER4] + 2 && l[BYTES] == before[BYTES] + 2 * CHUNK,
        "audit with 2 resident chunks: order-4 chunks {} bytes {}, wanted {} and {}",
        l[CHUNKS_ORDER4],
        l[BYTES],
        before[CHUNKS_ORDER4] + 2,
        before[BYTES] + 2 * CHUNK
    );
    // Populating again keeps the bytes.
    let resident = d.mem_range(h, 0, 4 * CHUNK, true).ctx("POPULATE all")?;
    check!(
        resident == 4 * CHUNK,
        "resident after populating all: {resident}"
    );
    check!(
        (CHUNK..3 * CHUNK).all(|o| byte(&map, o) == (o % 251) as u8 + 1),
        "populating the whole mem changed the bytes of chunks already resident"
    );
    check!(
        chunk_is(&map, 0, 0) && chunk_is(&map, 3, 0),
        "a new chunk is not zero"
    );
    let resident = d.mem_range(h, CHUNK, CHUNK, false).ctx("RELEASE 1")?;
    check!(
        resident == 3 * CHUNK,
        "resident after releasing one: {resident}"
    );
    check!(
        !readable(at(1)),
        "a released chunk is still readable through the mapping"
    );
    check!(
        (2 * CHUNK..3 * CHUNK).all(|o| byte(&map, o) == (o % 251) as u8 + 1),
        "releasing chunk 1 changed chunk 2"
    );
    let resident = d.mem_range(h, CHUNK, CHUNK, true).ctx("POPULATE 1 again")?;
    check!(
        resident == 4 * CHUNK,
        "resident after populating again: {resident}"
    );
    check!(
        chunk_is(&map, 1, 0),
        "a chunk released and populated again does not read zero"
    );
    // Releasing absent chunks is not an error.
    d.mem_range(h, 0, 4 * CHUNK, false).ctx("RELEASE all")?;
    let resident = d
        .mem_range(h, 0, 4 * CHUNK, false)
        .ctx("RELEASE all again")?;
    check!(
        resident == 0,
        "resident after releasing everything twice: {resident}"
    );
    check!(
        (0..4).all(|c| !readable(at(c))),
        "a chunk is readable after releasing all"
    );
    let l = live(&d)?;
    check!(
        l[CHUNKS_ORDER4] == before[CHUNKS_ORDER4] && l[BYTES] == before[BYTES],
        "audit after releasing everything: order-4 chunks {} bytes {}, wanted {} and {}",
        l[CHUNKS_ORDER4],
        l[BYTES],
        before[CHUNKS_ORDER4],
        before[BYTES]
    );
    d.mem_range(h, 2 * CHUNK, CHUNK, true).ctx("POPULATE 2")?;
    drop(map);
    d.mem_free(h).ctx("MEM_FREE")?;
    let after = live(&d)?;
    check!(
        after == before,
        "audit after the free: {after:?}, wanted {before:?}"
    );
    Ok(())
}

/// The copy engine and kernel fills reach a sparse mem's resident chunks: a chunk mapped for a
/// GPU before or after it was populated gets a DMA table (reported by `DMA_ADDRS`, absent
/// chunks as `RUVM_DMA_ADDR_ABSENT`); `MEM_FILL` writes through the chunks (read back by the
/// user mapping); the engine copies between chunks (read back by the user mapping), and a copy
/// or fill touching an absent chunk is `ENXIO`.
fn sparse_engine_and_fill_reach_resident_chunks() -> TestResult {
    let d = setup()?;
    let g = sim_gpu(&d)?;
    let before = live(&d)?;
    let (h, map) = sparse(&d, 4)?;
    d.mem_range(h, 0, CHUNK, true).ctx("POPULATE 0")?;
    d.mem_gpu(true, h, g).ctx("MAP_GPU")?;
    d.mem_range(h, 2 * CHUNK, CHUNK, true).ctx("POPULATE 2")?;
    let addrs = d.dma_addrs(h, g, 0, 4).ctx("DMA_ADDRS")?;
    let absent = uapi::RUVM_DMA_ADDR_ABSENT as u64;
    check!(
        addrs.len() == 4
            && addrs[0] != absent
            && addrs[1] == absent
            && addrs[2] != absent
            && addrs[3] == absent,
        "DMA addresses of chunks 0 and 2 resident: {addrs:x?}"
    );
    let q = d.mem_query(h).ctx("MEM_QUERY")?;
    check!(
        q.mapped_gpus == 1 << g,
        "mapped_gpus {:x}, wanted GPU {g}",
        q.mapped_gpus
    );
    let l = live(&d)?;
    check!(
        l[DMA] == before[DMA] + 2,
        "DMA mappings with 2 resident chunks on one GPU: {}, wanted {}",
        l[DMA],
        before[DMA] + 2
    );
    // A kernel fill of part of chunk 0, read by the user mapping.
    let fill = uapi::ruvm_mem_fill {
        handle: h,
        offset: 100,
        length: CHUNK - 200,
        seed: 7,
        ..Default::default()
    };
    d.mem_fill(false, fill).ctx("MEM_FILL")?;
    let want = |o: u64| crate::pattern::byte_at(7, o);
    check!(
        (100..CHUNK - 100).all(|o| byte(&map, o) == want(o))
            && (0..100).all(|o| byte(&map, o) == 0),
        "a kernel fill of a sparse chunk does not read back through the user mapping"
    );
    // The engine copies chunk 0 into chunk 2.
    d.ce_copy(g, h, 2 * CHUNK, h, 0, CHUNK)
        .ctx("CE_COPY 0 -> 2")?;
    check!(
        (0..CHUNK).all(|o| byte(&map, 2 * CHUNK + o) == byte(&map, o)),
        "the engine's copy into chunk 2 does not read back through the user mapping"
    );
    expect_errno(
        d.ce_copy(g, h, CHUNK, h, 0, CHUNK),
        Errno::ENXIO,
        "CE_COPY into an absent chunk",
    )?;
    expect_errno(
        d.ce_copy(g, h, 0, h, 2 * CHUNK + 1, CHUNK),
        Errno::ENXIO,
        "CE_COPY reading into an absent chunk",
    )?;
    let mut over = fill;
    over.offset = CHUNK - 1;
    over.length = 2;
    expect_errno(
        d.mem_fill(false, over),
        Errno::ENXIO,
        "MEM_FILL over an absent chunk",
    )?;
    // A chunk populated now is mapped for the GPU at once.
    d.mem_range(h, CHUNK, CHUNK, true).ctx("POPULATE 1")?;
    d.ce_copy(g, h, CHUNK, h, 0, CHUNK).ctx("CE_COPY 0 -> 1")?;
    check!(
        (0..CHUNK).all(|o| byte(&map, CHUNK + o) == byte(&map, o)),
        "the engine's copy into a chunk populated after MAP_GPU does not read back"
    );
    d.mem_gpu(false, h, g).ctx("UNMAP_GPU")?;
    check!(
        live(&d)?[DMA] == before[DMA],
        "DMA mappings left after UNMAP_GPU of a sparse mem"
    );
    drop(map);
    d.mem_free(h).ctx("MEM_FREE")?;
    let after = live(&d)?;
    check!(
        after == before,
        "audit after the free: {after:?}, wanted {before:?}"
    );
    Ok(())
}

/// A copy queued on a stream (held behind a sw_sync fence) holds the chunks it reads and
/// writes: a release of a range with one of them is `EBUSY` and changes nothing, a release of
/// another range goes on; once the fence signals and the stream is synchronized, the release
/// goes through and the copy's bytes were there before it.
fn sparse_release_refused_under_queued_work() -> TestResult {
    let d = setup()?;
    let g = sim_gpu(&d)?;
    let tl = super::streams::sw_sync()?;
    let (h, map) = sparse(&d, 4)?;
    d.mem_range(h, 0, 4 * CHUNK, true).ctx("POPULATE all")?;
    d.mem_gpu(true, h, g).ctx("MAP_GPU")?;
    for o in 0..CHUNK {
        map.write(o as usize, (o % 13) as u8 + 1);
    }
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let fence = tl.create_fence(1, "gate").ctx("CREATE_FENCE")?;
    d.stream_submit(
        s,
        &[
            op::wait_fd(fence.as_fd(), uapi::RUVM_WAIT_MAX_MS),
            op::copy(h, CHUNK, h, 0, CHUNK),
        ],
    )
    .ctx("STREAM_SUBMIT")?;
    for (what, off) in [("the copy's source", 0), ("the copy's destination", CHUNK)] {
        expect_errno(
            d.mem_range(h, off, CHUNK, false),
            Errno::EBUSY,
            &format!("RELEASE of {what} under the queued copy"),
        )?;
    }
    expect_errno(
        d.mem_range(h, 0, 4 * CHUNK, false),
        Errno::EBUSY,
        "RELEASE of the whole mem under the queued copy",
    )?;
    let resident = d.mem_range(h, 3 * CHUNK, CHUNK, false).ctx("RELEASE 3")?;
    check!(
        resident == 3 * CHUNK,
        "resident after a refused release and a release of chunk 3: {resident}"
    );
    tl.inc(1).ctx("SW_SYNC_IOC_INC")?;
    d.stream_sync(s, uapi::RUVM_WAIT_MAX_MS)
        .ctx("STREAM_SYNC")?;
    check!(
        (0..CHUNK).all(|o| byte(&map, CHUNK + o) == (o % 13) as u8 + 1),
        "the queued copy's bytes are not in chunk 1"
    );
    let resident = d
        .mem_range(h, 0, 2 * CHUNK, false)
        .ctx("RELEASE 0..2 after the sync")?;
    check!(resident == CHUNK, "resident after the release: {resident}");
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drop(map);
    d.mem_free(h).ctx("MEM_FREE")?;
    Ok(())
}

/// 2 MiB chunks on two GPUs: a copy between two chunks held on one GPU's stream while the
/// other GPU's stream fills a chunk populated meanwhile; the copy reads only its source.
fn sparse_two_gpus_keep_chunks_apart() -> TestResult {
    const M2: u64 = 2 << 20;
    let d = setup()?;
    let gpus = super::streams::sim_gpus(&d)?;
    let (Some(ga), Some(gb)) = (gpus.first().map(|g| g.id), gpus.get(1).map(|g| g.id)) else {
        return Err(Stop::Skip("needs two simulated GPUs (sim_gpus=2)".into()));
    };
    let tl = super::streams::sw_sync()?;
    let a = d.mem_alloc(3 * M2, M2, SPARSE).ctx("MEM_ALLOC sparse")?;
    let h = a.handle;
    let q = d.mem_query(h).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
    for g in [ga, gb] {
        d.mem_gpu(true, h, g).ctx("MAP_GPU")?;
    }
    d.mem_range(h, 0, 2 * M2, true).ctx("POPULATE 0..2")?;
    let fill = uapi::ruvm_mem_fill {
        handle: h,
        length: M2,
        seed: 41,
        ..Default::default()
    };
    d.mem_fill(false, fill).ctx("MEM_FILL chunk 0")?;
    let sa = d.stream_create(ga).ctx("STREAM_CREATE")?.handle;
    let sb = d.stream_create(gb).ctx("STREAM_CREATE")?.handle;
    let fence = tl.create_fence(1, "hold").ctx("CREATE_FENCE")?;
    d.stream_submit(
        sa,
        &[
            op::wait_fd(fence.as_fd(), uapi::RUVM_WAIT_MAX_MS),
            op::copy(h, M2, h, 0, M2),
        ],
    )
    .ctx("A: wait, copy 0 -> 1")?;
    d.mem_range(h, 2 * M2, M2, true).ctx("POPULATE 2")?;
    d.stream_submit(sb, &[op::fill_byte(h, 2 * M2, M2, 0xee)])
        .ctx("B: fill chunk 2")?;
    d.stream_sync(sb, uapi::RUVM_WAIT_MAX_MS).ctx("sync B")?;
    tl.inc(1).ctx("release A")?;
    d.stream_sync(sa, uapi::RUVM_WAIT_MAX_MS).ctx("sync A")?;
    let want = |o: u64| crate::pattern::byte_at(41, o);
    let bad = (0..M2).filter(|&o| byte(&map, M2 + o) != want(o)).count();
    let first = (0..M2).find(|&o| byte(&map, M2 + o) != want(o));
    check!(
        bad == 0,
        "chunk 1: {bad} bytes are not chunk 0's, the first at {first:?}"
    );
    let bad2 = (0..M2).filter(|&o| byte(&map, 2 * M2 + o) != 0xee).count();
    check!(bad2 == 0, "chunk 2: {bad2} bytes are not B's fill");
    for s in [sa, sb] {
        d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    }
    drop(map);
    d.mem_free(h).ctx("MEM_FREE")?;
    Ok(())
}

/// An unprivileged process in a 32 MiB memory cgroup reserves a 256 MiB sparse mem (which
/// costs it a slot a chunk, not the chunks) and cannot populate it beyond its group: the whole
/// populate is refused (`ENOMEM`) and leaves nothing resident, a smaller one goes through and
/// is charged to the group; everything goes back when the process exits.
fn sparse_populate_bounded_by_the_memory_cgroup() -> TestResult {
    use crate::cgroup::MemGroup;
    const M: u64 = 1 << 20;
    let d = setup()?;
    if !MemGroup::available() {
        return Err(Stop::Skip("no cgroup2 memory controller".into()));
    }
    let group = MemGroup::new("ruvm-sparse").ctx("make the cgroup")?;
    group
        .write("memory.max", &(32 * M).to_string())
        .ctx("memory.max")?;
    let before = live(&d)?;
    let procs = group.dir.join("cgroup.procs");
    let status = super::harness::in_child(|| {
        if std::fs::write(&procs, std::process::id().to_string()).is_err() {
            return 10;
        }
        let Ok(c) = Ruvm::open() else { return 11 };
        let nobody = nix::unistd::Uid::from_raw(65534);
        if nix::unistd::setgid(nix::unistd::Gid::from_raw(65534)).is_err()
            || nix::unistd::setuid(nobody).is_err()
        {
            return 12;
        }
        let Ok(a) = c.mem_alloc(256 * M, 2 * M, SPARSE) else {
            return 13;
        };
        if c.mem_range(a.handle, 0, 256 * M, true) != Err(Errno::ENOMEM) {
            return 14;
        }
        // Nothing stayed: a release of everything finds nothing resident.
        if c.mem_range(a.handle, 0, 256 * M, false) != Ok(0) {
            return 15;
        }
        if c.mem_range(a.handle, 0, 8 * M, true) != Ok(8 * M) {
            return 16;
        }
        let charged = std::fs::read_to_string(procs.with_file_name("memory.current"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if charged < 8 * M {
            return 17;
        }
        0
    })?;
    check!(
        matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)),
        "the unprivileged child in a 32 MiB group: {status:?} (13 the reservation refused, 14 a populate past the group not ENOMEM, 15 something left resident, 16 a populate within it refused, 17 not charged to the group)"
    );
    let after = live(&d)?;
    check!(
        after == before,
        "audit after the child exited: {after:?}, wanted {before:?}"
    );
    Ok(())
}

/// Every refusal `ruvm.rst` gives for sparse mems and `MEM_RANGE`.
fn sparse_refusals() -> TestResult {
    let d = setup()?;
    let fallback = uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK;
    expect_errno(
        d.mem_alloc(4 * CHUNK, CHUNK, SPARSE | fallback),
        Errno::EINVAL,
        "MEM_ALLOC sparse with FALLBACK",
    )?;
    let (pool, _) = d.pool_create(CHUNK, 0).ctx("POOL_CREATE")?;
    let mut a = uapi::ruvm_mem_alloc {
        size: CHUNK,
        flags: SPARSE,
        pool,
        ..Default::default()
    };
    expect_errno(
        d.call(cmd::MEM_ALLOC, &mut a),
        Errno::EINVAL,
        "MEM_ALLOC sparse from a pool",
    )?;
    d.pool_destroy(pool).ctx("POOL_DESTROY")?;
    // Refused before the GPU is looked up.
    let mut a = uapi::ruvm_mem_alloc {
        size: CHUNK,
        flags: SPARSE,
        backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
        gpu: 999,
        ..Default::default()
    };
    expect_errno(
        d.call(cmd::MEM_ALLOC, &mut a),
        Errno::EINVAL,
        "MEM_ALLOC sparse vidmem of no GPU",
    )?;
    if let Ok(g) = super::shared::vidmem_gpu(&d) {
        let mut a = uapi::ruvm_mem_alloc {
            size: CHUNK,
            flags: SPARSE,
            backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
            gpu: g.id,
            ..Default::default()
        };
        expect_errno(
            d.call(cmd::MEM_ALLOC, &mut a),
            Errno::EINVAL,
            "MEM_ALLOC sparse vidmem",
        )?;
    }
    let (h, map) = sparse(&d, 4)?;
    let range = |offset: u64, length: u64, op: u32| uapi::ruvm_mem_range {
        handle: h,
        offset,
        length,
        op,
        ..Default::default()
    };
    let populate = uapi::ruvm_range_op_RUVM_RANGE_POPULATE;
    let mut bad = vec![
        ("op 0", range(0, CHUNK, 0), Errno::EINVAL),
        ("op 3", range(0, CHUNK, 3), Errno::EINVAL),
        ("length 0", range(0, 0, populate), Errno::EINVAL),
        (
            "an offset inside a chunk",
            range(1, CHUNK, populate),
            Errno::EINVAL,
        ),
        (
            "a length inside a chunk",
            range(0, CHUNK + 1, populate),
            Errno::EINVAL,
        ),
        (
            "a range past the end",
            range(3 * CHUNK, 2 * CHUNK, populate),
            Errno::EINVAL,
        ),
        (
            "an offset past the end",
            range(4 * CHUNK, CHUNK, populate),
            Errno::EINVAL,
        ),
        (
            "offset + length overflowing",
            range(u64::MAX - CHUNK + 1, 2 * CHUNK, populate),
            Errno::EOVERFLOW,
        ),
        (
            "a handle of no mem",
            range(0, CHUNK, populate),
            Errno::ENOENT,
        ),
    ];
    if let Some(last) = bad.last_mut() {
        last.1.handle = u64::MAX;
    }
    for (what, mut r, want) in bad {
        expect_errno(
            d.call(cmd::MEM_RANGE, &mut r),
            want,
            &format!("MEM_RANGE with {what}"),
        )?;
    }
    let plain = d.mem_alloc(CHUNK, CHUNK, 0).ctx("MEM_ALLOC plain")?;
    // Not sparse comes before the range's checks.
    for (offset, length) in [(0, CHUNK), (1, 0), (u64::MAX, 2)] {
        let mut r = range(offset, length, populate);
        r.handle = plain.handle;
        expect_errno(
            d.call(cmd::MEM_RANGE, &mut r),
            Errno::EOPNOTSUPP,
            &format!("MEM_RANGE of a mem that is not sparse, range {offset}+{length}"),
        )?;
    }
    d.mem_free(plain.handle).ctx("MEM_FREE plain")?;
    // An empty fill holds no chunk: done, even over an absent one.
    let empty = uapi::ruvm_mem_fill {
        handle: h,
        offset: 2 * CHUNK,
        ..Default::default()
    };
    d.mem_fill(false, empty)
        .ctx("MEM_FILL of 0 bytes at an absent chunk")?;
    d.mem_range(h, 0, CHUNK, true).ctx("POPULATE 0")?;
    expect_errno(
        d.map_kernel(h),
        Errno::EOPNOTSUPP,
        "MAP_CPU_KERNEL of a sparse mem",
    )?;
    expect_errno(
        d.mem_export_dmabuf(h).map(drop),
        Errno::EOPNOTSUPP,
        "MEM_EXPORT_DMABUF of a sparse mem",
    )?;
    if let Ok(g) = sim_gpu(&d) {
        expect_errno(
            d.mem_gpu_kernel(true, h, g),
            Errno::EOPNOTSUPP,
            "MAP_GPU_KERNEL of a sparse mem",
        )?;
    }
    drop(map);
    d.mem_free(h).ctx("MEM_FREE")?;
    let mut r = range(0, CHUNK, populate);
    expect_errno(
        d.call(cmd::MEM_RANGE, &mut r),
        Errno::ENOENT,
        "MEM_RANGE of a freed mem",
    )?;
    Ok(())
}
