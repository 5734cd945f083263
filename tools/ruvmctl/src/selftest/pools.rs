// SPDX-License-Identifier: GPL-2.0

//! Memory pools: CUDA's attribute arithmetic step by step, reuse that is real (the same DMA
//! addresses come back) and never stale (zeroed when asked), chunks kept DMA-mapped for the
//! pool's GPUs, trims, destroy and close, and the errnos.

use nix::errno::Errno;

use super::harness::{cases, check, expect_errno, Case, Context, Stop, TestResult};
use super::shared::{
    fill, live, meminfo, mismatches, reclaim_root, sim_gpu, touch_in_child, vid_alloc, vid_pool,
};
use libruvm::{cmd, uapi, Ruvm, UserMap};

mod refusals;
mod vidmem;
use refusals::*;
use vidmem::*;

const K: u64 = 1024;
const POOLS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_POOLS as usize;
const POOL_CHUNKS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_POOL_CHUNKS as usize;
const POOL_BYTES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_POOL_BYTES as usize;
const DMA_MAPPINGS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_DMA_MAPPINGS as usize;
const ZERO: u32 = uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO;

pub fn cases() -> Vec<Case> {
    cases![
        pool_attributes_follow_cuda,
        pool_reuse_is_real_and_never_stale,
        pool_reused_list_brings_its_mmap_offset,
        pool_gives_back_oldest_lists_first,
        pool_chunks_stay_mapped_for_its_gpus,
        pool_bad_inputs,
        pool_close_gives_everything_back,
        pool_shrinks_under_memory_pressure,
        pool_of_vidmem,
        pool_lists_its_process_by_its_host_pid,
    ]
}

/// The attributes a step should leave, compared field by field.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Want {
    reserved: u64,
    reserved_high: u64,
    used: u64,
    used_high: u64,
    hits: u64,
    misses: u64,
    cached_chunks: u64,
}

fn attrs(d: &Ruvm, pool: u64) -> Result<Want, Stop> {
    let a = d.pool_get(pool).ctx("POOL_GET")?;
    check!(
        a.reserved_current == a.used_current + a.pending_bytes + a.cached_chunks * a.chunk_size,
        "reserved {} is not used {} + pending {} + {} cached chunks",
        a.reserved_current,
        a.used_current,
        a.pending_bytes,
        a.cached_chunks
    );
    Ok(Want {
        reserved: a.reserved_current,
        reserved_high: a.reserved_high,
        used: a.used_current,
        used_high: a.used_high,
        hits: a.hits,
        misses: a.misses,
        cached_chunks: a.cached_chunks,
    })
}

fn expect(d: &Ruvm, pool: u64, step: &str, want: Want) -> TestResult {
    let got = attrs(d, pool)?;
    check!(
        got == want,
        "after {step}:\n# got  {got:?}\n# want {want:?}"
    );
    Ok(())
}

/// The pool's hit and miss counts are `want`; else the case fails, saying `what`.
fn expect_hits(d: &Ruvm, pool: u64, want: (u64, u64), what: &str) -> TestResult {
    let at = attrs(d, pool)?;
    check!(
        (at.hits, at.misses) == want,
        "{what}: hits {} misses {}, want {want:?}",
        at.hits,
        at.misses
    );
    Ok(())
}

fn pool_attributes_follow_cuda() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let (p, chunk) = d.pool_create(64 * K, 0).ctx("POOL_CREATE")?;
    check!(chunk == 64 * K, "chunk size {chunk}");
    let mut w = Want {
        reserved: 0,
        reserved_high: 0,
        used: 0,
        used_high: 0,
        hits: 0,
        misses: 0,
        cached_chunks: 0,
    };
    expect(&d, p, "create", w)?;
    // Threshold 0 (CUDA's default): a free gives everything back.
    let a = d.pool_alloc(p, 3 * 64 * K - 5, 0).ctx("alloc")?;
    check!(a.chunk_size == 64 * K && a.chunk_count == 3, "layout {a:?}");
    w = Want {
        reserved: 192 * K,
        reserved_high: 192 * K,
        used: 192 * K,
        used_high: 192 * K,
        misses: 3,
        ..w
    };
    expect(&d, p, "alloc of 3 chunks", w)?;
    d.mem_free(a.handle).ctx("free")?;
    w = Want {
        reserved: 0,
        used: 0,
        ..w
    };
    expect(&d, p, "free with threshold 0", w)?;
    // Threshold ~0: everything stays.
    d.pool_set(
        p,
        uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RELEASE_THRESHOLD,
        u64::MAX,
    )
    .ctx("POOL_SET threshold")?;
    let a = d.pool_alloc(p, 192 * K, 0).ctx("alloc")?;
    d.mem_free(a.handle).ctx("free")?;
    w = Want {
        reserved: 192 * K,
        misses: 6,
        cached_chunks: 3,
        ..w
    };
    expect(&d, p, "alloc + free, threshold ~0", w)?;
    // One chunk from the cached three; then four: two cached and two new.
    let b = d.pool_alloc(p, 64 * K, 0).ctx("alloc")?;
    w = Want {
        used: 64 * K,
        hits: 1,
        cached_chunks: 2,
        ..w
    };
    expect(&d, p, "alloc of 1 chunk from the cache", w)?;
    let c = d.pool_alloc(p, 256 * K, 0).ctx("alloc")?;
    w = Want {
        reserved: 320 * K,
        reserved_high: 320 * K,
        used: 320 * K,
        used_high: 320 * K,
        hits: 3,
        misses: 8,
        cached_chunks: 0,
    };
    expect(&d, p, "alloc of 4 chunks, 2 cached", w)?;
    // Highs: only 0 is accepted, which resets them to the current values.
    d.mem_free(b.handle).ctx("free")?;
    w = Want {
        used: 256 * K,
        cached_chunks: 1,
        ..w
    };
    expect(&d, p, "free of 1 chunk", w)?;
    for attr in [
        uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RESERVED_HIGH,
        uapi::ruvm_pool_attr_RUVM_POOL_ATTR_USED_HIGH,
    ] {
        expect_errno(d.pool_set(p, attr, 5), Errno::EINVAL, "a high set to 5")?;
    }
    d.pool_set(p, uapi::ruvm_pool_attr_RUVM_POOL_ATTR_USED_HIGH, 0)
        .ctx("reset used high")?;
    w = Want {
        used_high: 256 * K,
        ..w
    };
    expect(&d, p, "reset of the used high", w)?;
    d.mem_free(c.handle).ctx("free")?;
    d.pool_set(p, uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RESERVED_HIGH, 0)
        .ctx("reset reserved high")?;
    w = Want {
        used: 0,
        cached_chunks: 5,
        ..w
    };
    expect(&d, p, "free of 4 chunks, reserved high reset", w)?;
    // Trim: never below what is in use, at most the bytes asked to keep.
    let keep = d.mem_alloc(4 * K, 0, 0).ctx("alloc")?;
    let released = d.pool_trim(p, 100 * K).ctx("POOL_TRIM")?;
    let got = attrs(&d, p)?;
    check!(
        got.reserved <= 100 * K && released == 320 * K - got.reserved && got.used == 0,
        "trim to 100K released {released}: {got:?}"
    );
    check!(
        got.reserved_high == 320 * K,
        "the reserved high moved on a trim: {got:?}"
    );
    d.mem_free(keep.handle).ctx("free")?;
    // A lower threshold gives back what is above it at once.
    d.pool_set(p, uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RELEASE_THRESHOLD, 0)
        .ctx("threshold 0")?;
    let got = attrs(&d, p)?;
    check!(
        got.reserved == 0 && got.cached_chunks == 0,
        "threshold 0 left {got:?}"
    );
    let info = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        info.release_threshold == 0
            && info.backing == uapi::ruvm_backing_RUVM_BACKING_SYSMEM
            && info.chunk_size == 64 * K,
        "POOL_GET: {info:?}"
    );
    // Trim to 0 with a mem alive and chunks cached: reserved = used.
    d.pool_set(
        p,
        uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RELEASE_THRESHOLD,
        u64::MAX,
    )
    .ctx("threshold ~0")?;
    let cached = d.pool_alloc(p, 128 * K, 0).ctx("alloc")?;
    let m = d.pool_alloc(p, 4 * K, 0).ctx("alloc")?;
    d.mem_free(cached.handle).ctx("free")?;
    let released = d.pool_trim(p, 0).ctx("POOL_TRIM 0")?;
    let got = attrs(&d, p)?;
    check!(
        got.reserved == got.used
            && got.used == 64 * K
            && got.cached_chunks == 0
            && released == 128 * K,
        "trim to 0 with a mem alive released {released}: {got:?}"
    );
    // Destroy: EBUSY while a mem holds its chunks.
    expect_errno(d.pool_destroy(p), Errno::EBUSY, "destroy with a live mem")?;
    d.mem_free(m.handle).ctx("free")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    expect_errno(d.pool_get(p), Errno::ENOENT, "POOL_GET after destroy")?;
    expect_errno(
        d.pool_alloc(p, 4 * K, 0),
        Errno::ENOENT,
        "alloc from a destroyed pool",
    )?;
    let l = live(&d)?;
    check!(
        l[POOLS] == 0 && l[POOL_CHUNKS] == 0 && l[POOL_BYTES] == 0,
        "audit after destroy: pools={} pool_chunks={} pool_bytes={}",
        l[POOLS],
        l[POOL_CHUNKS],
        l[POOL_BYTES]
    );
    Ok(())
}

/// Bytes of `h` that are not zero, read through a user mapping (the other path from the
/// kernel's fill).
fn nonzero_bytes(d: &Ruvm, h: u64) -> Result<usize, Stop> {
    let q = d.mem_query(h).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    Ok((0..map.len()).filter(|&i| map.read(i) != 0).count())
}

fn pool_reuse_is_real_and_never_stale() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let g = sim_gpu(&d)?;
    let len = 4 * 16 * K;
    let (p, _) = d.pool_create(16 * K, u64::MAX).ctx("POOL_CREATE")?;
    let a = d.pool_alloc(p, len, 0).ctx("alloc")?;
    fill(&d, a.handle, len, 21)?;
    d.mem_gpu(true, a.handle, g).ctx("MAP_GPU")?;
    let addrs_a = d.dma_addrs(a.handle, g, 0, 4).ctx("DMA_ADDRS")?;
    d.mem_free(a.handle).ctx("free")?;
    // Not zeroed: the same chunks, with the bytes the file's own mem left.
    let b = d.pool_alloc(p, len, 0).ctx("alloc")?;
    d.mem_gpu(true, b.handle, g).ctx("MAP_GPU")?;
    let addrs_b = d.dma_addrs(b.handle, g, 0, 4).ctx("DMA_ADDRS")?;
    let mut sa = addrs_a.clone();
    let mut sb = addrs_b.clone();
    sa.sort_unstable();
    sb.sort_unstable();
    check!(
        sa == sb,
        "the reused mem's chunks are not the freed ones: {addrs_a:x?} then {addrs_b:x?}"
    );
    let kept = mismatches(&d, b.handle, len, 21)?;
    check!(
        kept == 0,
        "a reused chunk lost {kept} bytes of what the file left"
    );
    d.mem_free(b.handle).ctx("free")?;
    // Zeroed: the same chunks again, all zero.
    let c = d.pool_alloc(p, len, ZERO).ctx("alloc zeroed")?;
    expect_hits(&d, p, (8, 4), "not reused")?;
    let nonzero = nonzero_bytes(&d, c.handle)?;
    check!(
        nonzero == 0,
        "{nonzero} bytes not zero in a zeroed mem of reused chunks"
    );
    fill(&d, c.handle, len, 22)?;
    d.mem_free(c.handle).ctx("free")?;
    // Another file never sees them: its pool handle is unknown here, and its mems come from
    // elsewhere (zeroed when asked).
    let other = Ruvm::open().ctx("open")?;
    expect_errno(
        other.pool_alloc(p, len, 0),
        Errno::ENOENT,
        "another file's pool",
    )?;
    let o = other.mem_alloc(len, 16 * K, ZERO).ctx("alloc")?;
    let nonzero = nonzero_bytes(&other, o.handle)?;
    check!(
        nonzero == 0,
        "another file's zeroed mem: {nonzero} bytes not zero"
    );
    other.mem_free(o.handle).ctx("free")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")
}

/// A list the pool keeps whole keeps the mmap offset of the mem that freed it, and the next
/// mem of that size gets both; an offset still mapped by a freed mem's VMA goes to nobody.
fn pool_reused_list_brings_its_mmap_offset() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = live(&d)?;
    let len = 64 * K;
    let (p, _) = d.pool_create(len, u64::MAX).ctx("POOL_CREATE")?;
    let map_of = |h: u64| -> Result<UserMap, Stop> {
        let q = d.mem_query(h).ctx("MEM_QUERY")?;
        UserMap::of_mem(&d, &q).ctx("mmap")
    };
    let a = d.pool_alloc(p, len, 0).ctx("alloc A")?;
    let map = map_of(a.handle)?;
    for i in 0..map.len() {
        map.write(i, 0x5a);
    }
    drop(map);
    d.mem_free(a.handle).ctx("free A")?;
    // `new` took `old`'s list: its offset, and every byte of its mapping is `want`.
    let took = |what: &str, new: &uapi::ruvm_mem_alloc, old: &uapi::ruvm_mem_alloc, want: u8| {
        check!(
            new.mmap_offset == old.mmap_offset,
            "{what} got offset {:#x}, not the freed mem's {:#x}",
            new.mmap_offset,
            old.mmap_offset
        );
        let map = map_of(new.handle)?;
        let other = (0..map.len()).filter(|&i| map.read(i) != want).count();
        check!(other == 0, "{other} bytes of {what} are not {want:#x}");
        Ok(map)
    };
    // A's list comes back whole: B gets its chunks and its offset, zeroed as asked.
    let b = d.pool_alloc(p, len, ZERO).ctx("alloc B")?;
    let map_b = took("B", &b, &a, 0)?;
    for i in 0..map_b.len() {
        map_b.write(i, 0x77);
    }
    // Freed while mapped: its list (and offset) stay with the VMA, so C gets new ones.
    d.mem_free(b.handle).ctx("free B")?;
    let c = d.pool_alloc(p, len, 0).ctx("alloc C")?;
    check!(
        c.mmap_offset != b.mmap_offset,
        "C got the offset B's VMA still maps ({:#x})",
        c.mmap_offset
    );
    expect_hits(&d, p, (1, 2), "C was not a miss")?;
    let map_c = map_of(c.handle)?;
    map_c.write(0, 0x11);
    check!(map_c.read(0) == 0x11, "C's mapping does not keep a write");
    // B's VMA goes: its list comes back with its offset, and D sees B's bytes there.
    drop(map_b);
    let e = d.pool_alloc(p, len, 0).ctx("alloc D")?;
    let map_e = took("D", &e, &b, 0x77)?;
    check!(map_c.read(0) == 0x11, "C's bytes changed when D was mapped");
    drop(map_c);
    drop(map_e);
    d.mem_free(c.handle).ctx("free C")?;
    d.mem_free(e.handle).ctx("free D")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    let after = live(&d)?;
    check!(after == before, "left behind: {before:?} then {after:?}");
    Ok(())
}

/// Trims give back whole lists, oldest first, however many came and went: the cache is
/// followed list by list against a model, through trims that each take one list, with lists
/// coming back between them.
fn pool_gives_back_oldest_lists_first() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let (p, chunk) = d.pool_create(4 * K, u64::MAX).ctx("POOL_CREATE")?;
    let mut mems = Vec::new();
    for i in 0..50u64 {
        let n = 1 + i % 3;
        mems.push((d.pool_alloc(p, n * chunk, 0).ctx("alloc")?.handle, n));
    }
    let mut model = std::collections::VecDeque::new();
    let free = |model: &mut std::collections::VecDeque<u64>, (h, n): (u64, u64)| {
        model.push_back(n);
        d.mem_free(h).ctx("free")
    };
    let mut later = mems.split_off(40);
    for m in mems {
        free(&mut model, m)?;
    }
    let check_cache = |model: &std::collections::VecDeque<u64>, step: &str| -> TestResult {
        let at = attrs(&d, p)?;
        let want: u64 = model.iter().sum();
        check!(
            at.cached_chunks == want,
            "{step}: {} chunks cached, want {want} (lists {model:?})",
            at.cached_chunks
        );
        Ok(())
    };
    check_cache(&model, "all freed")?;
    for round in 0..60 {
        if round == 20 {
            // More lists come back behind those given back so far.
            for m in later.drain(..) {
                free(&mut model, m)?;
            }
            check_cache(&model, "more freed")?;
        }
        let Some(oldest) = model.pop_front() else {
            break;
        };
        let reserved = attrs(&d, p)?.reserved;
        let gone = d.pool_trim(p, reserved - 1).ctx("POOL_TRIM")?;
        check!(
            gone == oldest * chunk,
            "trim {round}: {gone} bytes given back, want the oldest list's {}",
            oldest * chunk
        );
        check_cache(&model, &format!("trim {round}"))?;
    }
    check!(model.is_empty(), "lists left in the model: {model:?}");
    d.pool_destroy(p).ctx("POOL_DESTROY")
}

fn pool_chunks_stay_mapped_for_its_gpus() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let g = sim_gpu(&d)?;
    let len = 2 * 64 * K;
    let (p, _) = d.pool_create(64 * K, u64::MAX).ctx("POOL_CREATE")?;
    d.pool_access(p, g, true).ctx("POOL_SET_ACCESS")?;
    check!(
        d.pool_get(p).ctx("POOL_GET")?.access == 1 << g,
        "access set"
    );
    // Mapped for the GPU as it is made: the engine copies with no MEM_MAP_GPU.
    let src = d.pool_alloc(p, len, 0).ctx("alloc")?;
    fill(&d, src.handle, len, 31)?;
    let dst = d.pool_alloc(p, len, ZERO).ctx("alloc")?;
    let q = d.mem_query(dst.handle).ctx("MEM_QUERY")?;
    check!(
        q.mapped_gpus == 1 << g,
        "a pool mem is not DMA-mapped for the pool's GPU (mapped_gpus {:#x})",
        q.mapped_gpus
    );
    d.ce_copy(g, dst.handle, 0, src.handle, 0, len)
        .ctx("CE_COPY with no MEM_MAP_GPU")?;
    let bad = mismatches(&d, dst.handle, len, 31)?;
    check!(bad == 0, "{bad} bytes wrong after the copy");
    let dst_addrs = d.dma_addrs(dst.handle, g, 0, 2).ctx("DMA_ADDRS")?;
    d.mem_free(src.handle).ctx("free")?;
    d.mem_free(dst.handle).ctx("free")?;
    // Cached with their mappings: the audit still counts them; a mem of the same size gets
    // the same addresses without a new mapping.
    let before = live(&d)?;
    check!(
        before[DMA_MAPPINGS] >= 4 && before[POOL_CHUNKS] == 4,
        "cached: dma_mappings {} pool_chunks {}",
        before[DMA_MAPPINGS],
        before[POOL_CHUNKS]
    );
    let again = d.pool_alloc(p, len, 0).ctx("alloc")?;
    let addrs_again = d.dma_addrs(again.handle, g, 0, 2).ctx("DMA_ADDRS")?;
    let after = live(&d)?;
    check!(
        after[DMA_MAPPINGS] == before[DMA_MAPPINGS],
        "a mem from the cache made new mappings ({} -> {})",
        before[DMA_MAPPINGS],
        after[DMA_MAPPINGS]
    );
    // The newest list of the right size is reused: the last freed mem's, in order.
    check!(
        addrs_again == dst_addrs,
        "not the last freed mem's mappings: {dst_addrs:x?} then {addrs_again:x?}"
    );
    d.mem_free(again.handle).ctx("free")?;
    // Revoked: the cached chunks lose the GPU's mappings at once.
    d.pool_access(p, g, false).ctx("revoke")?;
    let revoked = live(&d)?;
    check!(
        revoked[DMA_MAPPINGS] + 4 == before[DMA_MAPPINGS],
        "revoking left dma_mappings {} (was {})",
        revoked[DMA_MAPPINGS],
        before[DMA_MAPPINGS]
    );
    let q = {
        let m = d.pool_alloc(p, len, 0).ctx("alloc")?;
        let q = d.mem_query(m.handle).ctx("MEM_QUERY")?;
        d.mem_free(m.handle).ctx("free")?;
        q
    };
    check!(
        q.mapped_gpus == 0,
        "a mem of a pool with no GPU is mapped ({:#x})",
        q.mapped_gpus
    );
    // The GPU going (a simulated GPU removed, when the test ioctls are on) takes it out of
    // the set and drops the cached mappings.
    d.pool_access(p, g, true).ctx("grant")?;
    let m = d.pool_alloc(p, len, 0).ctx("alloc")?;
    d.mem_free(m.handle).ctx("free")?;
    match d.test_sim_gpu(g, false) {
        Err(Errno::ENOSYS) => {}
        r => {
            r.ctx("TEST_SIM_GPU remove")?;
            let info = d.pool_get(p).ctx("POOL_GET");
            let back = d.test_sim_gpu(g, true);
            let info = info?;
            back.ctx("TEST_SIM_GPU add")?;
            check!(info.access == 0, "a removed GPU is still in the access set");
            let l = live(&d)?;
            check!(
                l[DMA_MAPPINGS] + 4 == before[DMA_MAPPINGS],
                "the removed GPU's cached mappings stayed (dma_mappings {})",
                l[DMA_MAPPINGS]
            );
        }
    }
    d.pool_destroy(p).ctx("POOL_DESTROY")
}
