// SPDX-License-Identifier: GPL-2.0

//! Bytes: zeroed mems read zero both ways, what one path writes another reads, a corrupted
//! byte found, copies.

use super::*;

pub(super) fn mem_zeroed_reads_zero_both_ways() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for ps in [0, 64 * K, 2 * M] {
        let a = d.mem_alloc(3 * M + 5, ps, zero()).ctx("alloc zeroed")?;
        let phys = a.chunk_count * a.chunk_size;
        reads_zero_both_ways(&d, a.handle, phys, &format!("page size {ps}"))?;
        d.mem_free(a.handle).ctx("free")?;
    }
    Ok(())
}

/// Mem `handle`'s `len` bytes read zero through its kernel mapping (made here) and through
/// `mmap`.
pub(super) fn reads_zero_both_ways(d: &Ruvm, handle: u64, len: u64, what: &str) -> TestResult {
    d.map_kernel(handle).ctx("map")?;
    kernel_verify(
        d,
        byte_args(handle, 0, len, 0),
        &format!("{what}: kernel sees zeros"),
    )?;
    let q = d.mem_query(handle).ctx("query")?;
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    let nonzero = (0..map.len()).filter(|&i| map.read(i) != 0).count();
    check!(
        nonzero == 0,
        "{what}: user sees {nonzero} non-zero bytes in a zeroed mem"
    );
    Ok(())
}

/// Zeroed mems made right after mems of the same size were filled and freed (the page
/// allocator hands the freed pages out again first): every byte reads zero, through the kernel
/// and through `mmap`, whichever way the module zeroes (`zeroing`).
pub(super) fn mem_zeroed_over_dirty_pages() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for ps in [4 * K, 64 * K, 2 * M] {
        for round in 0..3 {
            let dirty = d.mem_alloc(8 * M, ps, 0).ctx("alloc")?;
            d.map_kernel(dirty.handle).ctx("map dirty")?;
            d.mem_fill(false, byte_args(dirty.handle, 0, 8 * M, 0xa5))
                .ctx("fill")?;
            d.mem_free(dirty.handle).ctx("free dirty")?;
            let a = d.mem_alloc(8 * M, ps, zero()).ctx("alloc zeroed")?;
            let what = format!("chunks of {ps}, round {round}");
            reads_zero_both_ways(&d, a.handle, 8 * M, &what)?;
            d.mem_free(a.handle).ctx("free")?;
        }
    }
    Ok(())
}

pub(super) fn mem_kernel_writes_user_reads() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for size in SIZES {
        for ps in [0, 128 * K, 2 * M] {
            let a = d.mem_alloc(size, ps, zero()).ctx("alloc")?;
            let phys = a.chunk_count * a.chunk_size;
            d.map_kernel(a.handle).ctx("map")?;
            // The size-seeded pattern over [0, size); the tail up to the physical size stays zero.
            d.mem_fill(false, pattern_args(a.handle, 0, size, size))
                .ctx("kernel fill")?;
            let q = d.mem_query(a.handle).ctx("query")?;
            let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
            check!(
                map.len() as u64 == phys,
                "mapping length {} != physical {phys}",
                map.len()
            );
            for o in 0..phys {
                let want = if o < size {
                    pattern::byte_at(size, o)
                } else {
                    0
                };
                let got = map.read(o as usize);
                check!(
                    got == want,
                    "size {size} page size {ps}: user read {got:#x} at {o}, kernel wrote {want:#x}"
                );
            }
            drop(map);
            d.mem_free(a.handle).ctx("free")?;
        }
    }
    Ok(())
}

pub(super) fn mem_user_writes_kernel_reads() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for size in SIZES {
        for ps in [0, 64 * K, 2 * M] {
            let a = d.mem_alloc(size, ps, 0).ctx("alloc")?;
            let q = d.mem_query(a.handle).ctx("query")?;
            let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
            let seed = size ^ 0x5a5a_0000;
            for o in 0..q.physical_size {
                map.write(o as usize, pattern::byte_at(seed, o));
            }
            d.map_kernel(a.handle).ctx("map")?;
            kernel_verify(
                &d,
                pattern_args(a.handle, 0, q.physical_size, seed),
                "kernel reads what user wrote",
            )?;
            // Unaligned pieces check the pattern's offsets, not just whole pages.
            if size > 100 {
                kernel_verify(
                    &d,
                    pattern_args(a.handle, 13, size - 50, seed),
                    "unaligned piece",
                )?;
            }
            drop(map);
            d.mem_free(a.handle).ctx("free")?;
        }
    }
    Ok(())
}

pub(super) fn mem_verify_finds_a_corrupted_byte() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let a = d.mem_alloc(M, 64 * K, 0).ctx("alloc")?;
    d.map_kernel(a.handle).ctx("map")?;
    d.mem_fill(false, pattern_args(a.handle, 0, M, 99))
        .ctx("fill")?;
    let q = d.mem_query(a.handle).ctx("query")?;
    let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
    for at in [0usize, 65_537, (M - 1) as usize] {
        let old = map.read(at);
        map.write(at, !old);
        let r = d
            .mem_fill(true, pattern_args(a.handle, 0, M, 99))
            .ctx("verify")?;
        check!(
            r.mismatches == 1 && r.first_mismatch == at as u64,
            "corrupted {at}: verify says {} at {:#x}",
            r.mismatches,
            r.first_mismatch
        );
        map.write(at, old);
    }
    kernel_verify(&d, pattern_args(a.handle, 0, M, 99), "restored")?;
    drop(map);
    d.mem_free(a.handle).ctx("free")
}

/// Copies A to B and B to A from two threads while a third fills both: copies take both mems'
/// locks (in turn), so this proves no deadlock (and, on the debug kernel, that lockdep sees
/// nothing wrong), and that every byte copied is one that was written.
pub(super) fn mem_copies_both_ways_at_once() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let size = 256 * K;
    let a = d.mem_alloc(size, 0, 0).ctx("alloc a")?.handle;
    let b = d.mem_alloc(size, 64 * K, 0).ctx("alloc b")?.handle;
    for h in [a, b] {
        d.map_kernel(h).ctx("map kernel")?;
        d.mem_fill(false, byte_args(h, 0, size, 7)).ctx("fill")?;
    }
    let rounds = 300;
    let r: Result<(), String> = std::thread::scope(|s| {
        let t1 = s.spawn(|| (0..rounds).try_for_each(|_| d.mem_copy(b, 0, a, 0, size)));
        let t2 = s.spawn(|| (0..rounds).try_for_each(|_| d.mem_copy(a, 0, b, 0, size)));
        let t3 = s.spawn(|| {
            (0..rounds).try_for_each(|i| {
                d.mem_fill(false, byte_args([a, b][i % 2], 0, size, 7))
                    .map(drop)
            })
        });
        for (name, t) in [("a to b", t1), ("b to a", t2), ("fill", t3)] {
            t.join()
                .map_err(|_| format!("{name}: panicked"))?
                .map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(())
    });
    r.map_err(Stop::Fail)?;
    for h in [a, b] {
        let v = d.mem_fill(true, byte_args(h, 0, size, 7)).ctx("verify")?;
        check!(
            v.mismatches == 0,
            "mem {h}: {} bytes are not 7",
            v.mismatches
        );
        d.mem_free(h).ctx("free")?;
    }
    Ok(())
}

pub(super) fn mem_kernel_copy() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let src = d.mem_alloc(3 * M, 2 * M, 0).ctx("alloc src")?.handle;
    let dst = d.mem_alloc(3 * M, 0, zero()).ctx("alloc dst")?.handle;
    d.map_kernel(src).ctx("map src")?;
    d.map_kernel(dst).ctx("map dst")?;
    d.mem_fill(false, pattern_args(src, 0, 3 * M, 7))
        .ctx("fill src")?;
    d.mem_copy(dst, 100, src, 100, 2 * M + 3).ctx("copy")?;
    kernel_verify(&d, pattern_args(dst, 100, 2 * M + 3, 7), "copied range")?;
    kernel_verify(&d, byte_args(dst, 0, 100, 0), "before the copied range")?;
    kernel_verify(
        &d,
        byte_args(dst, 2 * M + 103, M - 103, 0),
        "after the copied range",
    )?;
    // Overlapping copy within one mem moves the bytes like memmove.
    d.mem_copy(src, 8, src, 0, M).ctx("overlapping copy")?;
    kernel_verify(&d, pattern_args(src, 8, M, 6), "overlapping copy result")?;
    // The user mapping sees what the kernel copied.
    let q = d.mem_query(dst).ctx("query")?;
    let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
    for o in [100u64, 101, M, 2 * M + 102] {
        check!(
            map.read(o as usize) == pattern::byte_at(7, o),
            "user sees wrong byte at {o}"
        );
    }
    drop(map);
    d.mem_free(src).ctx("free")?;
    d.mem_free(dst).ctx("free")
}
