// SPDX-License-Identifier: GPL-2.0

//! Pinned heaps (`libruvm::heap`): mimalloc arenas over sparse mems. Bytes written through a
//! heap pointer are read by a simulated GPU's copy engine through the mem and offset the heap
//! reports, and the reverse; blocks go between threads; a collect gives the chunks back to the
//! kernel (the audit and the heap's figures agree) and a calloc after it reads zero. Every case
//! skips without `RUVM_FEATURE_SPARSE`.

use libruvm::heap::{arenas, locate, HeapConfig, PinnedHeap};
use libruvm::{uapi, Errno, Ruvm, UserMap};

use super::harness::{cases, check, Case, Context, Stop, TestResult};
use super::shared::{live, sim_gpu};
use crate::pattern;

mod large;

const K: usize = 1024;
const M: usize = 1 << 20;
const BYTES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_BYTES as usize;

pub fn cases() -> Vec<Case> {
    cases![
        heap_every_size_holds_engine_bytes,
        heap_blocks_cross_threads,
        heap_collect_gives_chunks_back,
        heap_realloc_keeps_bytes_across_classes,
        heap_survives_a_forked_child,
        heap_refusals,
        heap_made_again_takes_its_arena_back,
        heap_pointers_know_their_dma_addresses,
        heap_arena_with_queued_work_is_not_taken_again,
        large::heap_large_blocks_pack_and_give_back,
    ]
}

/// The device and a heap of `gpus`, or a skip without sparse mems.
fn setup(gpus: Vec<u32>, arena_size: u64) -> Result<(Ruvm, PinnedHeap), Stop> {
    let d = Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    if info.features & u64::from(uapi::RUVM_FEATURE_SPARSE) == 0 {
        return Err(Stop::Skip("no RUVM_FEATURE_SPARSE".into()));
    }
    let h = PinnedHeap::new(&d, &HeapConfig { gpus, arena_size }).ctx("PinnedHeap::new")?;
    Ok((d, h))
}

/// The audit's sysmem bytes grew (from `base`) as much as the heap's resident bytes (from
/// `first`), read back to back: mimalloc may purge a slice between two reads (its delayed
/// purge), so they are read again, up to five times, before they are said to disagree. (The
/// audit counts every arena of the process: a case collects first, so that earlier heaps'
/// arenas are purged before `base` is read.)
fn audit_agrees(d: &Ruvm, heap: &PinnedHeap, base: u64, first: u64) -> TestResult {
    let mut seen = (0, 0);
    for _ in 0..5 {
        seen = (live(d)?[BYTES] - base, heap.stats().reserved - first);
        if seen.0 == seen.1 {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Err(Stop::Fail(format!(
        "the audit's sysmem bytes grew {}, the heap's resident bytes {}",
        seen.0, seen.1
    )))
}

fn write(p: *mut u8, len: usize, seed: u64) {
    for i in 0..len {
        // SAFETY: `p` is a live block of at least `len` bytes.
        unsafe { p.add(i).write_volatile(pattern::byte_at(seed, i as u64)) };
    }
}

fn mismatches(p: *const u8, len: usize, seed: u64) -> usize {
    (0..len)
        // SAFETY: as in `write`.
        .filter(|&i| unsafe { p.add(i).read_volatile() } != pattern::byte_at(seed, i as u64))
        .count()
}

/// Blocks of 1 byte to 48 MiB (beyond mimalloc's largest small, medium and large objects):
/// the pattern written through the pointer is what a simulated GPU's engine copies out of the
/// mem and offset the heap reports (read through another mem's user mapping), and what the
/// engine copies in is what the pointer reads.
fn heap_every_size_holds_engine_bytes() -> TestResult {
    let d0 = Ruvm::open().ctx("open")?;
    let g = sim_gpu(&d0)?;
    let (d, heap) = setup(vec![g], 128 << 20)?;
    let sizes = [
        1,
        7,
        8,
        100,
        1000,
        4 * K,
        9 * K,
        64 * K,
        300 * K,
        M,
        5 * M,
        48 * M,
    ];
    let other = d.mem_alloc(48 << 20, 2 << 20, 0).ctx("MEM_ALLOC")?;
    d.mem_gpu(true, other.handle, g).ctx("MAP_GPU")?;
    let q = d.mem_query(other.handle).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
    for (k, &n) in sizes.iter().enumerate() {
        let seed = 100 + k as u64;
        let p = heap.malloc(n);
        check!(!p.is_null(), "malloc({n}) of a 128 MiB heap returned null");
        let Some((mem, off)) = heap.locate(p) else {
            return Err(Stop::Fail(format!(
                "a block of {n} bytes is not in its heap"
            )));
        };
        check!(
            locate(p) == Some((mem, off)),
            "the global lookup disagrees with the heap's"
        );
        // The whole block up to 4 MiB; of a larger one its first 2 MiB and its last (the
        // engine is slow under KASAN).
        let windows = if n <= 4 * M {
            vec![(0, n)]
        } else {
            vec![(0, 2 * M), (n - 2 * M, 2 * M)]
        };
        for (at, len) in windows {
            let (at64, len64) = (at as u64, len as u64);
            write(p.wrapping_add(at), len, seed);
            d.ce_copy(g, other.handle, at64, mem, off + at64, len64)
                .ctx("CE_COPY out of the heap")?;
            let theirs = map.as_ptr().wrapping_add(at);
            let ours = p.wrapping_add(at);
            // SAFETY: both inside their mappings (the block, the other mem) for `len` bytes.
            let differ =
                |i: usize| unsafe { theirs.add(i).read_volatile() != ours.add(i).read_volatile() };
            let bad = (0..len).filter(|&i| differ(i)).count();
            check!(
                bad == 0,
                "{n} bytes: the engine read {bad} bytes of [{at}, +{len}) not the pointer's"
            );
            // The reverse: other bytes, copied in.
            write(theirs, len, seed + 1000);
            d.ce_copy(g, mem, off + at64, other.handle, at64, len64)
                .ctx("CE_COPY into the heap")?;
            let bad = mismatches(ours, len, seed + 1000);
            check!(
                bad == 0,
                "{n} bytes: the pointer reads {bad} bytes of [{at}, +{len}) the engine did not write"
            );
        }
        // SAFETY: the block is live and not used after.
        unsafe { heap.free(p) };
    }
    let s = heap.stats();
    check!(
        s.allocs == sizes.len() as u64 && s.frees == s.allocs && s.in_use == 0,
        "heap figures after every block went: {s:?}"
    );
    drop(map);
    d.mem_free(other.handle).ctx("MEM_FREE")?;
    Ok(())
}

/// Four threads allocate blocks of 8 bytes to 64 KiB, write them and hand half to the next
/// thread, which checks and frees them.
fn heap_blocks_cross_threads() -> TestResult {
    use std::sync::mpsc;
    let (_d, heap) = setup(Vec::new(), 64 << 20)?;
    let heap = &heap;
    const THREADS: usize = 4;
    const BLOCKS: usize = 1500;
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| mpsc::channel::<(usize, usize, u64)>())
        .unzip();
    let bad = std::thread::scope(|sc| {
        let mut joins = Vec::new();
        for (t, rx) in rxs.into_iter().enumerate() {
            let next = txs[(t + 1) % THREADS].clone();
            joins.push(sc.spawn(move || {
                let mut bad = 0usize;
                let mut mine = Vec::new();
                for i in 0..BLOCKS {
                    let n = 8 << ((i * 7 + t) % 14);
                    let seed = (t * BLOCKS + i) as u64;
                    let p = heap.malloc(n);
                    if p.is_null() {
                        bad += 1;
                        continue;
                    }
                    write(p, n.min(256), seed);
                    if i % 2 == 0 {
                        let _ = next.send((p as usize, n, seed));
                    } else {
                        mine.push((p as usize, n, seed));
                    }
                }
                drop(next);
                for (p, n, seed) in mine.into_iter().chain(rx.iter()) {
                    bad += mismatches(p as *const u8, n.min(256), seed);
                    // SAFETY: a live block of the heap, handed to this thread alone.
                    unsafe { heap.free(p as *mut u8) };
                }
                bad
            }));
        }
        drop(txs);
        joins
            .into_iter()
            .map(|j| j.join().unwrap_or(1))
            .sum::<usize>()
    });
    check!(bad == 0, "{bad} bytes (or nulls) wrong across threads");
    let s = heap.stats();
    check!(
        s.in_use == 0 && s.allocs == s.frees && s.allocs == (THREADS * BLOCKS) as u64,
        "heap figures after every thread freed everything: {s:?}"
    );
    Ok(())
}

/// 64 MiB in blocks of 4 KiB to 64 KiB, freed, collected: the kernel holds at most the
/// arena's metadata and one slice more (the audit's sysmem bytes agree with the heap's
/// `reserved`); blocks asked for again with `calloc` read zero.
fn heap_collect_gives_chunks_back() -> TestResult {
    let (d, heap) = setup(Vec::new(), 128 << 20)?;
    // Earlier heaps' arenas purged now, not during the case (the audit is the module's).
    heap.collect();
    let base = live(&d)?[BYTES];
    let first = heap.stats().reserved;
    let mut blocks = Vec::new();
    let mut total = 0;
    let mut i = 0usize;
    while total < 64 * M {
        let n = (4 * K) << (i % 5);
        let p = heap.malloc(n);
        check!(
            !p.is_null(),
            "malloc({n}) with {total} bytes held returned null"
        );
        write(p, n, 7);
        blocks.push(p);
        total += n;
        i += 1;
    }
    let held = heap.stats();
    let audit = live(&d)?[BYTES];
    check!(
        held.reserved >= 64 * M as u64 && audit - base == held.reserved - first,
        "64 MiB held: heap reserved {} (was {first}), the audit's sysmem bytes grew {}",
        held.reserved,
        audit - base
    );
    for p in blocks.drain(..) {
        // SAFETY: each a live block, not used after.
        unsafe { heap.free(p) };
    }
    heap.collect();
    let after = heap.stats();
    let bound = first + 64 * K as u64;
    check!(
        after.reserved <= bound && after.decommits > 0,
        "after freeing everything and collecting: {} bytes resident (bound {bound}), {} decommits",
        after.reserved,
        after.decommits
    );
    println!(
        "# 64 MiB held: {} bytes resident; after the collect {} ({} at the start), {} commits, {} decommits",
        held.reserved, after.reserved, first, after.commits, after.decommits
    );
    audit_agrees(&d, &heap, base, first)?;
    // What comes back is zero where calloc promises it.
    let mut nonzero = 0;
    for k in 0..256 {
        let n = (4 * K) << (k % 5);
        let p = heap.calloc(1, n);
        check!(!p.is_null(), "calloc({n}) after the collect returned null");
        // SAFETY: a live block of `n` bytes.
        nonzero += (0..n).filter(|&j| unsafe { p.add(j).read() } != 0).count();
        blocks.push(p);
    }
    check!(
        nonzero == 0,
        "{nonzero} bytes of calloc'ed blocks are not zero"
    );
    for p in blocks {
        // SAFETY: as above.
        unsafe { heap.free(p) };
    }
    Ok(())
}

/// A block grown through every size class and shrunk again keeps its first bytes.
fn heap_realloc_keeps_bytes_across_classes() -> TestResult {
    let (_d, heap) = setup(Vec::new(), 64 << 20)?;
    let mut p = heap.malloc(8);
    check!(!p.is_null(), "malloc(8) returned null");
    write(p, 8, 3);
    let mut kept = 8;
    for n in [100, 4 * K, 64 * K, 700 * K, 3 * M, 20 * M, 1000, 5] {
        // SAFETY: `p` is a live block of the heap, replaced by the result.
        let q = unsafe { heap.realloc(p, n) };
        check!(!q.is_null(), "realloc to {n} returned null");
        let keep = kept.min(n);
        let bad = mismatches(q, keep, 3);
        check!(
            bad == 0,
            "realloc to {n}: {bad} of the first {keep} bytes changed"
        );
        write(q, n, 3);
        kept = n;
        p = q;
    }
    // SAFETY: the last block, not used after.
    unsafe { heap.free(p) };
    check!(heap.stats().in_use == 0, "bytes in use after the last free");
    Ok(())
}

/// A child forked while a heap holds blocks (the kernel gives it no mapping of the arena's mem)
/// runs, allocates with its own allocator and exits normally (mimalloc walks every arena's
/// metadata as the child exits: it finds a copy); the parent's blocks and resident bytes are
/// as they were.
fn heap_survives_a_forked_child() -> TestResult {
    let (_d, heap) = setup(Vec::new(), 64 << 20)?;
    let p = heap.malloc(300 * K);
    check!(!p.is_null(), "malloc returned null");
    write(p, 300 * K, 11);
    let before = heap.stats();
    let status = super::harness::in_child(|| {
        let v: Vec<u8> = (0..100_000).map(|i| i as u8).collect();
        i32::from(v.len() != 100_000)
    })?;
    check!(
        matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)),
        "a child forked while the heap lived: {status:?}"
    );
    let bad = mismatches(p, 300 * K, 11);
    let after = heap.stats();
    check!(
        bad == 0 && after.reserved == before.reserved,
        "after the child: {bad} bytes changed, resident {} -> {}",
        before.reserved,
        after.reserved
    );
    // SAFETY: the block, not used after.
    unsafe { heap.free(p) };
    Ok(())
}

/// A size beyond the arena, a calloc that overflows and an alignment that is not a power of
/// two are null, not a crash or another heap's memory; freeing null does nothing; a heap of a
/// GPU that is not there is `ENODEV`.
fn heap_refusals() -> TestResult {
    let (d, heap) = setup(Vec::new(), 32 << 20)?;
    check!(heap.malloc(64 * M).is_null(), "64 MiB from a 32 MiB arena");
    check!(
        heap.calloc(usize::MAX / 2, 3).is_null(),
        "a calloc that overflows"
    );
    check!(heap.malloc_aligned(64, 48).is_null(), "an alignment of 48");
    let p = heap.malloc_aligned(100, 4096);
    check!(
        !p.is_null() && p as usize % 4096 == 0,
        "an aligned block: {p:?}"
    );
    // SAFETY: a live block; null is accepted.
    unsafe {
        heap.free(p);
        heap.free(std::ptr::null_mut());
    }
    let r = PinnedHeap::new(
        &d,
        &HeapConfig {
            gpus: vec![uapi::RUVM_MAX_GPUS - 1],
            arena_size: 32 << 20,
        },
    );
    check!(
        matches!(r, Err(Errno::ENODEV) | Err(Errno::EINVAL)),
        "a heap of a GPU that is not there: {:?}",
        r.err()
    );
    Ok(())
}

/// 300 heaps made and dropped one after another on one file (more than mimalloc has room for
/// arenas) each hold a block with its bytes, from one arena taken again each time, whose
/// commits the new heap's figures do not count; a heap of another open file, or one made
/// while the first lives, gets an arena of its own, whose memory that file answers for.
fn heap_made_again_takes_its_arena_back() -> TestResult {
    let (d, first) = setup(Vec::new(), 32 << 20)?;
    drop(first);
    let start = arenas();
    let cfg = HeapConfig {
        gpus: Vec::new(),
        arena_size: 32 << 20,
    };
    for i in 0..300u64 {
        let h = PinnedHeap::new(&d, &cfg).ctx(&format!("heap {i}"))?;
        let p = h.malloc(100 * K);
        check!(!p.is_null(), "heap {i}: malloc returned null");
        write(p, 100 * K, i);
        let bad = mismatches(p, 100 * K, i);
        let s = h.stats();
        check!(
            bad == 0 && s.allocs == 1 && s.decommits == 0,
            "heap {i}: {bad} bytes wrong, {s:?}"
        );
        // SAFETY: the block, not used after.
        unsafe { h.free(p) };
    }
    check!(
        arenas() == start,
        "300 heaps made and dropped: {} arenas, {start} before",
        arenas()
    );
    let h1 = PinnedHeap::new(&d, &cfg).ctx("a heap")?;
    let h2 = PinnedHeap::new(&d, &cfg).ctx("a second heap while the first lives")?;
    let d2 = Ruvm::open().ctx("open another file")?;
    let h3 = PinnedHeap::new(&d2, &cfg).ctx("a heap of another file")?;
    check!(
        arenas() == start + 2,
        "a second heap and another file's: {} arenas, {start} before",
        arenas()
    );
    let p = h3.malloc(4 * K);
    check!(!p.is_null(), "malloc from the other file's heap");
    let Some((handle, offset)) = locate(p) else {
        return Err(Stop::Fail("locate: not a heap block".into()));
    };
    let a = d2.ptr_attrs(p as u64).ctx("PTR_ATTRS")?;
    check!(
        a.handle == handle
            && a.offset == offset
            && a.ptr_flags & uapi::ruvm_ptr_flags_RUVM_PTR_OTHER_FILE == 0,
        "the other file's heap block: located {handle}+{offset}, PTR_ATTRS {a:?}"
    );
    // SAFETY: the block, not used after.
    unsafe { h3.free(p) };
    drop((h1, h2, h3));
    Ok(())
}

/// The DMA address a heap pointer gives without a system call is what `MEM_DMA_ADDRS` says of
/// its chunk, plus its offset in the chunk, at the first, a middle and the last byte of blocks
/// of 1 byte to 4 MiB; after they are freed and collected, a pointer whose chunk went back
/// gives none, as the kernel says none; a GPU the heap is not mapped for gives none; an
/// unprivileged process (which may not read bus addresses) gets none, its blocks still good.
fn heap_pointers_know_their_dma_addresses() -> TestResult {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Stop::Skip("bus addresses need CAP_SYS_ADMIN".into()));
    }
    let d0 = Ruvm::open().ctx("open")?;
    let g = sim_gpu(&d0)?;
    let (d, heap) = setup(vec![g], 64 << 20)?;
    const CHUNK: u64 = 64 << 10;
    // What the kernel says of byte `p`: its chunk's address plus the offset, or None if absent.
    let kernel = |p: *const u8| -> Result<Option<u64>, Stop> {
        let Some((h, o)) = locate(p) else {
            return Err(Stop::Fail(format!("{p:p} is in no arena")));
        };
        let a = d.dma_addrs(h, g, o / CHUNK, 1).ctx("MEM_DMA_ADDRS")?;
        Ok(a.first()
            .copied()
            .filter(|&a| a != u64::MAX)
            .map(|a| a + o % CHUNK))
    };
    let mut blocks = Vec::new();
    let mut probes = 0;
    for shift in 0..23 {
        let n = 1usize << shift;
        let p = heap.malloc(n);
        check!(!p.is_null(), "malloc({n}) returned null");
        write(p, n, shift);
        for at in [0, n / 2, n - 1] {
            let q = p.wrapping_add(at);
            let (mine, theirs) = (heap.dma_addr(q, g), kernel(q)?);
            check!(
                mine.is_some() && mine == theirs,
                "byte {at} of a block of {n}: the heap says {mine:x?}, the kernel {theirs:x?}"
            );
            check!(
                heap.dma_addr(q, g + 1).is_none(),
                "a DMA address for a GPU the heap is not mapped for"
            );
            probes += 1;
        }
        blocks.push((p, n));
    }
    for &(p, _) in &blocks {
        // SAFETY: the blocks, not used after but as addresses.
        unsafe { heap.free(p) };
    }
    heap.collect();
    let mut gone = 0;
    for &(p, n) in &blocks {
        for at in [0, n / 2, n - 1] {
            let q = p.wrapping_add(at);
            let (mine, theirs) = (heap.dma_addr(q, g), kernel(q)?);
            check!(
                mine == theirs,
                "after the collect, byte {at} of a freed block of {n}: the heap says {mine:x?}, \
                 the kernel {theirs:x?}"
            );
            gone += usize::from(mine.is_none());
        }
    }
    check!(
        gone > 0,
        "after the collect every chunk probed is still resident"
    );
    println!("# {probes} bytes probed; after the collect {gone} of them in chunks given back");
    drop(heap);
    // Unprivileged: no address, the heap itself as good.
    let st = super::harness::in_child(|| {
        // The device opened first (its node is root's), then the privileges dropped.
        let Ok(d) = Ruvm::open() else { return 11 };
        if nix::unistd::setuid(nix::unistd::Uid::from_raw(65534)).is_err() {
            return 10;
        }
        let Ok(h) = PinnedHeap::new(
            &d,
            &HeapConfig {
                gpus: vec![g],
                arena_size: 32 << 20,
            },
        ) else {
            return 12;
        };
        let p = h.malloc(1000);
        if p.is_null() {
            return 13;
        }
        write(p, 1000, 5);
        let ok = h.dma_addr(p, g).is_none() && mismatches(p, 1000, 5) == 0;
        i32::from(!ok) * 14
    })?;
    check!(
        matches!(st, nix::sys::wait::WaitStatus::Exited(_, 0)),
        "an unprivileged process's heap: {st:?}"
    );
    Ok(())
}

/// A heap dropped while a stream's copy into one of its blocks is queued (behind a sw_sync
/// fence): the kernel keeps that block's chunks (`EBUSY`), so the next heap does not get the
/// arena (a new one is made, and what it writes is not overwritten when the copy runs); once
/// the copy ran, the arena is taken again, its kept chunks given back first.
fn heap_arena_with_queued_work_is_not_taken_again() -> TestResult {
    let d0 = Ruvm::open().ctx("open")?;
    let g = sim_gpu(&d0)?;
    let tl = super::streams::sw_sync()?;
    let cfg = HeapConfig {
        gpus: vec![g],
        arena_size: 32 << 20,
    };
    let (d, first) = setup(cfg.gpus.clone(), cfg.arena_size)?;
    // A heap of this shape made and dropped: its arena is the one to watch.
    drop(first);
    let a = PinnedHeap::new(&d, &cfg).ctx("heap A")?;
    let n = 256 * K;
    let p = a.malloc(n);
    check!(!p.is_null(), "malloc from A");
    let (src, _src_map) = {
        let m = d.mem_alloc(n as u64, 4096, 0).ctx("MEM_ALLOC")?;
        d.mem_gpu(true, m.handle, g).ctx("MEM_MAP_GPU")?;
        let q = d.mem_query(m.handle).ctx("MEM_QUERY")?;
        let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
        for i in 0..n {
            map.write(i, 0xc3);
        }
        (m.handle, map)
    };
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let fence = tl.create_fence(1, "held").ctx("sw_sync fence")?;
    let ops = [
        libruvm::op::wait_fd(std::os::fd::AsFd::as_fd(&fence), 20_000),
        libruvm::op::with_dst_ptr(libruvm::op::copy(0, 0, src, 0, n as u64), p),
    ];
    d.stream_submit(s, &ops).ctx("STREAM_SUBMIT")?;
    let before = arenas();
    drop(a);
    let b = PinnedHeap::new(&d, &cfg).ctx("heap B, with the copy queued")?;
    check!(
        arenas() == before + 1,
        "heap B took the arena whose chunk the queued copy writes: {} arenas, {before} before",
        arenas()
    );
    let q = b.malloc(n);
    check!(!q.is_null(), "malloc from B");
    write(q, n, 9);
    tl.inc(1).ctx("signal the fence")?;
    d.stream_sync(s, 20_000).ctx("STREAM_SYNC")?;
    let bad = mismatches(q, n, 9);
    check!(
        bad == 0,
        "B's block lost {bad} bytes when A's queued copy ran"
    );
    // SAFETY: B's block, not used after.
    unsafe { b.free(q) };
    drop(b);
    let c = PinnedHeap::new(&d, &cfg).ctx("heap C, the copy done")?;
    check!(
        arenas() == before + 1,
        "heap C made a new arena though both were free again: {} arenas, {before} before",
        arenas()
    );
    let r = c.calloc(1, n);
    check!(!r.is_null(), "calloc from C");
    // SAFETY: C's block of `n` bytes.
    let nonzero = (0..n).filter(|&i| unsafe { r.add(i).read() } != 0).count();
    check!(nonzero == 0, "calloc from C: {nonzero} bytes not zero");
    // SAFETY: C's block, not used after.
    unsafe { c.free(r) };
    drop(c);
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.mem_free(src).ctx("free")?;
    Ok(())
}
