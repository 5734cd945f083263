// SPDX-License-Identifier: GPL-2.0

//! Sysmem mems: the chunk-size rules, the mapping lifecycle, data written through one path and
//! read through another, and every bad input with its exact errno.

use nix::{
    errno::Errno,
    sys::{
        mman::{MapFlags, ProtFlags},
        signal::Signal,
        wait::{waitpid, WaitStatus},
    },
    unistd::{fork, ForkResult},
};

use super::harness::{check, expect_errno, in_child, Case, Context, Stop, TestResult};
use libruvm::{uapi, Ruvm, UserMap};

use crate::pattern;

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "mem_matrix_chunk_sizes",
            run: mem_matrix_chunk_sizes,
        },
        Case {
            name: "mem_mmap_offsets_never_overlap",
            run: mem_mmap_offsets_never_overlap,
        },
        Case {
            name: "mem_query_reports_the_truth",
            run: mem_query_reports_the_truth,
        },
        Case {
            name: "mem_kernel_map_is_idempotent",
            run: mem_kernel_map_is_idempotent,
        },
        Case {
            name: "mem_zeroed_reads_zero_both_ways",
            run: mem_zeroed_reads_zero_both_ways,
        },
        Case {
            name: "mem_zeroed_over_dirty_pages",
            run: mem_zeroed_over_dirty_pages,
        },
        Case {
            name: "mem_kernel_writes_user_reads",
            run: mem_kernel_writes_user_reads,
        },
        Case {
            name: "mem_user_writes_kernel_reads",
            run: mem_user_writes_kernel_reads,
        },
        Case {
            name: "mem_verify_finds_a_corrupted_byte",
            run: mem_verify_finds_a_corrupted_byte,
        },
        Case {
            name: "mem_kernel_copy",
            run: mem_kernel_copy,
        },
        Case {
            name: "mem_copies_both_ways_at_once",
            run: mem_copies_both_ways_at_once,
        },
        Case {
            name: "mem_alloc_bad_inputs",
            run: mem_alloc_bad_inputs,
        },
        Case {
            name: "mem_handle_bad_inputs",
            run: mem_handle_bad_inputs,
        },
        Case {
            name: "mem_fill_bad_inputs",
            run: mem_fill_bad_inputs,
        },
        Case {
            name: "mem_other_files_handles_are_enoent",
            run: mem_other_files_handles_are_enoent,
        },
        Case {
            name: "mem_mmap_bad_inputs",
            run: mem_mmap_bad_inputs,
        },
        Case {
            name: "mem_mapping_cannot_be_split_or_made_executable",
            run: mem_mapping_cannot_be_split_or_made_executable,
        },
        Case {
            name: "mem_mmap_racing_free_leaves_no_mapping",
            run: mem_mmap_racing_free_leaves_no_mapping,
        },
        Case {
            name: "mem_access_after_free_faults",
            run: mem_access_after_free_faults,
        },
        Case {
            name: "mem_moved_mapping_faults_after_free",
            run: mem_moved_mapping_faults_after_free,
        },
        Case {
            name: "mem_small_mmap_is_filled_at_once",
            run: mem_small_mmap_is_filled_at_once,
        },
        Case {
            name: "mem_forked_child_has_no_mapping",
            run: mem_forked_child_has_no_mapping,
        },
        Case {
            name: "mem_close_frees_everything",
            run: mem_close_frees_everything,
        },
        Case {
            name: "mem_size_limits",
            run: mem_size_limits,
        },
        Case {
            name: "mem_beyond_memory_is_enomem",
            run: mem_beyond_memory_is_enomem,
        },
        Case {
            name: "mem_fallback_under_fragmentation",
            run: mem_fallback_under_fragmentation,
        },
        Case {
            name: "mem_small_chunks_without_free_blocks",
            run: mem_small_chunks_without_free_blocks,
        },
        Case {
            name: "mem_charged_to_the_callers_memory_cgroup",
            run: mem_charged_to_the_callers_memory_cgroup,
        },
    ]
}

const K: u64 = 1024;
const M: u64 = 1024 * 1024;
const PAGE: u64 = 4096;

/// uvm_mem_test's sizes.
const SIZES: [u64; 7] = [1, 4, 16, 1024, 4096, M, 7 * M + 17];
/// Page sizes asked for: the default and every explicit size the sysmem rules allow in the test.
const PAGE_SIZES: [u64; 5] = [0, 4 * K, 64 * K, 128 * K, 2 * M];

fn zero() -> u32 {
    uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

fn live(d: &Ruvm) -> Result<(u64, u64), Stop> {
    let i = d.info().ctx("INFO")?;
    Ok((i.live_mems, i.live_bytes))
}

/// Fails unless the file's live mems and bytes are back to `before`.
fn nothing_left(d: &Ruvm, before: (u64, u64)) -> TestResult {
    let now = live(d)?;
    check!(
        now == before,
        "something left behind: {now:?}, wanted {before:?}"
    );
    Ok(())
}

/// Fill arguments for the pattern over `[offset, offset + length)`.
fn pattern_args(handle: u64, offset: u64, length: u64, seed: u64) -> uapi::ruvm_mem_fill {
    uapi::ruvm_mem_fill {
        handle,
        offset,
        length,
        seed,
        kind: uapi::ruvm_fill_kind_RUVM_FILL_PATTERN,
        ..Default::default()
    }
}

fn byte_args(handle: u64, offset: u64, length: u64, byte: u8) -> uapi::ruvm_mem_fill {
    uapi::ruvm_mem_fill {
        handle,
        offset,
        length,
        seed: byte.into(),
        kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
        ..Default::default()
    }
}

/// Kernel-side verify; fails the case on any mismatch.
fn kernel_verify(d: &Ruvm, a: uapi::ruvm_mem_fill, what: &str) -> TestResult {
    let r = d.mem_fill(true, a).ctx(what)?;
    check!(
        r.mismatches == 0,
        "{what}: {} bytes differ, first at {:#x} (offset {}, length {})",
        r.mismatches,
        r.first_mismatch,
        a.offset,
        a.length
    );
    check!(
        r.first_mismatch == u64::MAX,
        "{what}: first_mismatch {:#x} with no mismatch",
        r.first_mismatch
    );
    Ok(())
}

fn mem_matrix_chunk_sizes() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = live(&d)?;
    let mut mems = Vec::new();
    // All alive at once, as in uvm_mem_test's test_all.
    for size in SIZES {
        for ps in PAGE_SIZES {
            let a = d
                .mem_alloc(size, ps, 0)
                .ctx(&format!("alloc size {size} page size {ps}"))?;
            let chunk = if ps == 0 { PAGE } else { ps };
            check!(a.handle != 0, "handle 0");
            check!(
                a.chunk_size == chunk,
                "size {size} page size {ps}: chunk {} != {chunk}",
                a.chunk_size
            );
            check!(
                a.chunk_count == size.div_ceil(chunk),
                "size {size} page size {ps}: {} chunks != {}",
                a.chunk_count,
                size.div_ceil(chunk)
            );
            check!(
                a.mmap_offset % PAGE == 0,
                "mmap offset {:#x} not page aligned",
                a.mmap_offset
            );
            mems.push((a, size, chunk));
        }
    }
    let mut handles: Vec<u64> = mems.iter().map(|m| m.0.handle).collect();
    handles.sort_unstable();
    handles.dedup();
    check!(handles.len() == mems.len(), "handles are not unique");
    let mut offsets: Vec<(u64, u64)> = mems
        .iter()
        .map(|m| (m.0.mmap_offset, m.0.chunk_count * m.0.chunk_size))
        .collect();
    offsets.sort_unstable();
    for w in offsets.windows(2) {
        check!(
            w[0].0 + w[0].1 <= w[1].0,
            "mmap ranges overlap: {:?} and {:?}",
            w[0],
            w[1]
        );
    }
    let bytes: u64 = mems.iter().map(|m| m.0.chunk_count * m.0.chunk_size).sum();
    let during = live(&d)?;
    check!(
        during == (before.0 + mems.len() as u64, before.1 + bytes),
        "live counts {during:?}, wanted {:?}",
        (before.0 + mems.len() as u64, before.1 + bytes)
    );
    for (a, size, chunk) in &mems {
        let q = d.mem_query(a.handle).ctx("query")?;
        check!(
            q.size == *size && q.chunk_size == *chunk && q.physical_size == round_up(*size, *chunk),
            "query of size {size} chunk {chunk}: {q:?}"
        );
    }
    for (a, ..) in &mems {
        d.mem_free(a.handle).ctx("free")?;
    }
    check!(
        live(&d)? == before,
        "live counts after freeing all: {:?}, wanted {before:?}",
        live(&d)?
    );
    Ok(())
}

fn mem_query_reports_the_truth() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let a = d
        .mem_alloc(
            7 * M + 17,
            64 * K,
            zero() | uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK,
        )
        .ctx("alloc")?;
    let q = d.mem_query(a.handle).ctx("query")?;
    check!(q.handle == a.handle, "handle echoed as {}", q.handle);
    check!(
        q.backing == uapi::ruvm_backing_RUVM_BACKING_SYSMEM,
        "backing {}",
        q.backing
    );
    check!(
        q.size == 7 * M + 17 && q.physical_size == 7 * M + 64 * K,
        "sizes {} / {}",
        q.size,
        q.physical_size
    );
    check!(
        q.chunk_size == a.chunk_size && q.chunk_count == a.chunk_count,
        "chunks disagree with alloc"
    );
    check!(
        q.mmap_offset == a.mmap_offset,
        "mmap offset disagrees with alloc"
    );
    check!(
        q.mapped == 0 && q.user_mappings == 0,
        "fresh mem is mapped: {:#x}/{}",
        q.mapped,
        q.user_mappings
    );
    check!(
        q.alloc_flags == zero() | uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK,
        "alloc flags {:#x}",
        q.alloc_flags
    );
    let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
    let q = d.mem_query(a.handle).ctx("query while mapped")?;
    check!(
        q.user_mappings == 1,
        "user_mappings {} while mapped once",
        q.user_mappings
    );
    check!(
        q.mapped == u64::from(uapi::ruvm_mapped_RUVM_MAPPED_CPU_USER),
        "mapped {:#x} while user-mapped",
        q.mapped
    );
    let map2 = UserMap::of_mem(&d, &q).ctx("second mmap")?;
    check!(
        d.mem_query(a.handle).ctx("query")?.user_mappings == 2,
        "two mappings not counted"
    );
    drop(map);
    drop(map2);
    let q = d.mem_query(a.handle).ctx("query after munmap")?;
    check!(
        q.mapped == 0 && q.user_mappings == 0,
        "still mapped after munmap: {:#x}/{}",
        q.mapped,
        q.user_mappings
    );
    d.mem_free(a.handle).ctx("free")
}

fn mapped_bits(d: &Ruvm, h: u64) -> Result<u64, Stop> {
    Ok(d.mem_query(h).ctx("query")?.mapped)
}

fn mem_kernel_map_is_idempotent() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let kernel = u64::from(uapi::ruvm_mapped_RUVM_MAPPED_CPU_KERNEL);
    for ps in PAGE_SIZES {
        let h = d.mem_alloc(M + 1, ps, 0).ctx("alloc")?.handle;
        d.unmap_kernel(h).ctx("unmap of a never-mapped mem")?;
        check!(
            mapped_bits(&d, h)? == 0,
            "mapped after unmapping a never-mapped mem"
        );
        d.map_kernel(h).ctx("map")?;
        check!(mapped_bits(&d, h)? == kernel, "not kernel-mapped after map");
        d.map_kernel(h).ctx("map again")?;
        check!(
            mapped_bits(&d, h)? == kernel,
            "not kernel-mapped after map again"
        );
        d.unmap_kernel(h).ctx("unmap")?;
        check!(mapped_bits(&d, h)? == 0, "still mapped after unmap");
        d.unmap_kernel(h).ctx("unmap again")?;
        check!(mapped_bits(&d, h)? == 0, "mapped after unmap again");
        d.map_kernel(h).ctx("map after unmap")?;
        check!(mapped_bits(&d, h)? == kernel, "not mapped after remap");
        // Freed while kernel-mapped: the mapping goes with it.
        d.mem_free(h).ctx("free while kernel-mapped")?;
    }
    Ok(())
}

fn mem_zeroed_reads_zero_both_ways() -> TestResult {
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
fn reads_zero_both_ways(d: &Ruvm, handle: u64, len: u64, what: &str) -> TestResult {
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
fn mem_zeroed_over_dirty_pages() -> TestResult {
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

fn mem_kernel_writes_user_reads() -> TestResult {
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

fn mem_user_writes_kernel_reads() -> TestResult {
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

fn mem_verify_finds_a_corrupted_byte() -> TestResult {
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
fn mem_copies_both_ways_at_once() -> TestResult {
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

fn mem_kernel_copy() -> TestResult {
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

fn mem_alloc_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = live(&d)?;
    expect_errno(d.mem_alloc(0, 0, 0), Errno::EINVAL, "size 0")?;
    for ps in [1, 1024, 3 * K, 3 * M, 4 * M, 6 * K, 1 << 40, u64::MAX] {
        expect_errno(
            d.mem_alloc(4096, ps, 0),
            Errno::EINVAL,
            &format!("page size {ps}"),
        )?;
    }
    // The first bits past the defined ones, and the top one.
    let defined = uapi::ruvm_alloc_flags_RUVM_ALLOC_FLAGS_ALL;
    let next = 32 - defined.leading_zeros();
    for bit in [next, next + 1, 31] {
        expect_errno(
            d.mem_alloc(4096, 0, 1 << bit),
            Errno::EINVAL,
            &format!("unknown flag bit {bit}"),
        )?;
    }
    for i in 0..uapi::ruvm_mem_alloc::default().reserved.len() {
        let mut a = uapi::ruvm_mem_alloc {
            size: 4096,
            ..Default::default()
        };
        a.reserved[i] = 1;
        expect_errno(
            d.call(libruvm::cmd::MEM_ALLOC, &mut a),
            Errno::EINVAL,
            &format!("reserved[{i}]"),
        )?;
    }
    for (what, a) in [
        (
            "pad",
            uapi::ruvm_mem_alloc {
                size: 4096,
                pad: 1,
                ..Default::default()
            },
        ),
        (
            "unknown backing",
            uapi::ruvm_mem_alloc {
                size: 4096,
                backing: 7,
                ..Default::default()
            },
        ),
        (
            "a GPU for sysmem",
            uapi::ruvm_mem_alloc {
                size: 4096,
                gpu: 1,
                ..Default::default()
            },
        ),
    ] {
        let mut a = a;
        expect_errno(d.call(libruvm::cmd::MEM_ALLOC, &mut a), Errno::EINVAL, what)?;
    }
    // Rounding up to whole chunks overflows.
    expect_errno(
        d.mem_alloc(u64::MAX, 0, 0),
        Errno::EOVERFLOW,
        "size u64::MAX",
    )?;
    expect_errno(
        d.mem_alloc(u64::MAX - 4 * K, 2 * M, 0),
        Errno::EOVERFLOW,
        "size near u64::MAX, 2M chunks",
    )?;
    // Argument pointers that cannot be read or written back.
    // SAFETY: NULL faults.
    let r = unsafe { d.ioctl_ptr(uapi::RUVM_IOCTL_MEM_ALLOC, std::ptr::null_mut()) };
    expect_errno(r, Errno::EFAULT, "NULL argument")?;
    check!(live(&d)? == before, "a refused allocation left mems behind");
    Ok(())
}

fn mem_handle_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let h = d.mem_alloc(4096, 0, 0).ctx("alloc")?.handle;
    for cmd in [
        libruvm::cmd::MEM_FREE,
        libruvm::cmd::MEM_MAP_CPU_KERNEL,
        libruvm::cmd::MEM_UNMAP_CPU_KERNEL,
    ] {
        expect_errno(d.mem_handle_cmd(cmd, 0), Errno::ENOENT, "handle 0")?;
        expect_errno(
            d.mem_handle_cmd(cmd, u64::MAX),
            Errno::ENOENT,
            "unknown handle",
        )?;
    }
    expect_errno(
        d.mem_query(u64::MAX),
        Errno::ENOENT,
        "query of unknown handle",
    )?;
    // Unknown flags and non-zero reserved fields: the ABI table (`abi_*`).
    d.mem_free(h).ctx("free")?;
    expect_errno(d.mem_free(h), Errno::ENOENT, "double free")?;
    expect_errno(d.mem_query(h), Errno::ENOENT, "query after free")?;
    expect_errno(d.map_kernel(h), Errno::ENOENT, "map after free")
}

fn mem_fill_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let a = d.mem_alloc(5000, 0, 0).ctx("alloc")?;
    let h = a.handle;
    let phys = 8192;
    expect_errno(
        d.mem_fill(false, pattern_args(h, 0, 10, 1)),
        Errno::ENXIO,
        "fill without a kernel mapping",
    )?;
    expect_errno(
        d.mem_fill(true, pattern_args(h, 0, 10, 1)),
        Errno::ENXIO,
        "verify without a kernel mapping",
    )?;
    let other = d.mem_alloc(4096, 0, 0).ctx("alloc")?.handle;
    d.map_kernel(h).ctx("map")?;
    expect_errno(
        d.mem_copy(h, 0, other, 0, 1),
        Errno::ENXIO,
        "copy from an unmapped mem",
    )?;
    expect_errno(
        d.mem_copy(other, 0, h, 0, 1),
        Errno::ENXIO,
        "copy to an unmapped mem",
    )?;
    d.mem_fill(false, pattern_args(h, 0, phys, 1))
        .ctx("fill of the whole physical size")?;
    d.mem_fill(false, pattern_args(h, phys, 0, 1))
        .ctx("empty fill at the end")?;
    expect_errno(
        d.mem_fill(false, pattern_args(h, 0, phys + 1, 1)),
        Errno::EINVAL,
        "fill past the end",
    )?;
    expect_errno(
        d.mem_fill(false, pattern_args(h, phys + 1, 0, 1)),
        Errno::EINVAL,
        "fill starting past the end",
    )?;
    expect_errno(
        d.mem_fill(true, pattern_args(h, 1, u64::MAX, 1)),
        Errno::EOVERFLOW,
        "offset + length overflows",
    )?;
    let mut f = pattern_args(h, 0, 1, 1);
    f.kind = 9;
    expect_errno(d.mem_fill(false, f), Errno::EINVAL, "unknown fill kind")?;
    expect_errno(
        d.mem_fill(false, pattern_args(u64::MAX, 0, 1, 1)),
        Errno::ENOENT,
        "fill of unknown handle",
    )?;
    d.map_kernel(other).ctx("map other")?;
    expect_errno(
        d.mem_copy(h, 0, other, 1, 4096),
        Errno::EINVAL,
        "copy source past the end",
    )?;
    expect_errno(
        d.mem_copy(h, phys, other, 0, 1),
        Errno::EINVAL,
        "copy destination past the end",
    )?;
    expect_errno(
        d.mem_copy(h, u64::MAX, other, 0, 2),
        Errno::EOVERFLOW,
        "copy offset overflows",
    )?;
    let mut c = uapi::ruvm_mem_copy {
        dst_handle: h,
        src_handle: other,
        length: 1,
        pad: 1,
        ..Default::default()
    };
    expect_errno(
        d.call(libruvm::cmd::MEM_COPY, &mut c),
        Errno::EINVAL,
        "copy pad",
    )?;
    expect_errno(
        d.mem_copy(h, 0, u64::MAX, 0, 1),
        Errno::ENOENT,
        "copy from unknown handle",
    )?;
    d.mem_free(h).ctx("free")?;
    d.mem_free(other).ctx("free")
}

fn mem_other_files_handles_are_enoent() -> TestResult {
    let a = Ruvm::open().ctx("open a")?;
    let b = Ruvm::open().ctx("open b")?;
    let ha = a.mem_alloc(4096, 0, 0).ctx("alloc in a")?;
    let hb = b.mem_alloc(4096, 0, 0).ctx("alloc in b")?;
    expect_errno(
        b.mem_query(ha.handle),
        Errno::ENOENT,
        "query of a's handle through b",
    )?;
    expect_errno(
        b.map_kernel(ha.handle),
        Errno::ENOENT,
        "map of a's handle through b",
    )?;
    expect_errno(
        b.mem_fill(false, pattern_args(ha.handle, 0, 1, 1)),
        Errno::ENOENT,
        "fill through b",
    )?;
    expect_errno(
        b.mem_copy(hb.handle, 0, ha.handle, 0, 1),
        Errno::ENOENT,
        "copy from a's mem through b",
    )?;
    expect_errno(
        b.mem_free(ha.handle),
        Errno::ENOENT,
        "free of a's handle through b",
    )?;
    // mmap of a's offset through b: not b's mem.
    let r = UserMap::new(
        &b,
        ha.mmap_offset,
        4096,
        ProtFlags::PROT_READ,
        MapFlags::MAP_SHARED,
    );
    expect_errno(r.map(drop), Errno::ENXIO, "mmap of a's offset through b")?;
    a.mem_query(ha.handle).ctx("a still has its mem")?;
    a.mem_free(ha.handle).ctx("free a")?;
    b.mem_free(hb.handle).ctx("free b")
}

fn mem_mmap_bad_inputs() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let a = d.mem_alloc(64 * K, 0, 0).ctx("alloc")?;
    let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    let off = a.mmap_offset;
    let len = 64 * 1024;
    let map = |o: u64, l: usize, p: ProtFlags, f: MapFlags| UserMap::new(&d, o, l, p, f).map(drop);
    expect_errno(
        map(off, len - 4096, rw, MapFlags::MAP_SHARED),
        Errno::EINVAL,
        "shorter than the mem",
    )?;
    expect_errno(
        map(off, len + 4096, rw, MapFlags::MAP_SHARED),
        Errno::EINVAL,
        "longer than the mem",
    )?;
    expect_errno(
        map(off + 4096, len - 4096, rw, MapFlags::MAP_SHARED),
        Errno::ENXIO,
        "offset inside the mem",
    )?;
    expect_errno(
        map(off + (1 << 40), len, rw, MapFlags::MAP_SHARED),
        Errno::ENXIO,
        "offset of no mem",
    )?;
    expect_errno(
        map(off, len, rw | ProtFlags::PROT_EXEC, MapFlags::MAP_SHARED),
        Errno::EPERM,
        "PROT_EXEC",
    )?;
    expect_errno(
        map(off, len, rw, MapFlags::MAP_PRIVATE),
        Errno::EINVAL,
        "MAP_PRIVATE",
    )?;
    map(off, len, rw, MapFlags::MAP_SHARED).ctx("the right mapping")?;
    map(off, len, ProtFlags::PROT_READ, MapFlags::MAP_SHARED).ctx("a read-only mapping")?;
    d.mem_free(a.handle).ctx("free")?;
    expect_errno(
        map(off, len, rw, MapFlags::MAP_SHARED),
        Errno::ENXIO,
        "mmap after free",
    )
}

fn mem_mapping_cannot_be_split_or_made_executable() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let a = d.mem_alloc(64 * K, 0, 0).ctx("alloc")?;
    let q = d.mem_query(a.handle).ctx("query")?;
    let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
    let p = std::ptr::NonNull::new(map.as_ptr().cast::<std::ffi::c_void>())
        .ok_or(Stop::Fail("null map".into()))?;
    // SAFETY: mprotect and munmap on our own mapping; both are expected to be refused.
    let r = unsafe {
        nix::sys::mman::mprotect(p, map.len(), ProtFlags::PROT_READ | ProtFlags::PROT_EXEC)
    };
    expect_errno(r, Errno::EACCES, "mprotect(PROT_EXEC)")?;
    // SAFETY: unmapping the second half would split the VMA; the module refuses.
    let r = unsafe { nix::sys::mman::munmap(p.byte_add(4096), 4096) };
    expect_errno(r, Errno::EINVAL, "munmap of part of the mapping")?;
    check!(
        d.mem_query(a.handle).ctx("query")?.user_mappings == 1,
        "mapping count changed"
    );
    map.write(8192, 0x42);
    check!(
        map.read(8192) == 0x42,
        "mapping unusable after refused split"
    );
    drop(map);
    d.mem_free(a.handle).ctx("free")
}

/// Small and large mems side by side (more small ones than the offset space's first bitmap
/// holds, and sizes on both sides of a slot): every offset is page aligned, no two ranges
/// overlap, and each mapping shows its own mem's bytes.
fn mem_mmap_offsets_never_overlap() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let mut sizes = vec![4 * K; 200];
    sizes.extend([
        64 * K,
        2 * M,
        2 * M,
        2 * M + 4 * K,
        2 * M + 4 * K,
        64 * M,
        4 * K,
    ]);
    let mut mems = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let a = d.mem_alloc(size, 0, 0).ctx("alloc")?;
        let q = d.mem_query(a.handle).ctx("query")?;
        check!(
            q.mmap_offset % PAGE == 0,
            "mem {i}: offset {:#x} not page aligned",
            q.mmap_offset
        );
        let end = q.mmap_offset.checked_add(q.physical_size);
        check!(
            end.is_some_and(|e| e <= i64::MAX as u64),
            "mem {i}: range {:#x}+{:#x} beyond loff_t",
            q.mmap_offset,
            q.physical_size
        );
        mems.push((q, i as u64));
    }
    let mut ranges: Vec<(u64, u64)> = mems
        .iter()
        .map(|(q, _)| (q.mmap_offset, q.mmap_offset + q.physical_size))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        check!(
            w[0].1 <= w[1].0,
            "ranges {:#x?} and {:#x?} overlap",
            w[0],
            w[1]
        );
    }
    // Every mem filled through the kernel, then some read through their own mapping.
    for (q, seed) in &mems {
        super::shared::fill(&d, q.handle, q.physical_size, *seed)?;
    }
    for (q, seed) in mems
        .iter()
        .filter(|(q, i)| i % 7 == 0 || q.physical_size > 4 * K)
    {
        let map = UserMap::of_mem(&d, q).ctx("mmap")?;
        let len = q.physical_size;
        for o in [0, len / 2, len - 1] {
            check!(
                map.read(o as usize) == pattern::byte_at(*seed, o),
                "mem {seed}: byte {o} of its mapping is not its own"
            );
        }
    }
    for (q, _) in &mems {
        d.mem_free(q.handle).ctx("free")?;
    }
    Ok(())
}

/// Runs `child` in a child process (which maps a mem, frees it, then reads the mapping): it
/// must die of `SIGBUS`, and the mem must not outlive it. `child` gets the live mem count before
/// and returns an exit code from 10 to name a failed step; `what` names the read.
fn dies_of_sigbus_after_free(what: &str, child: impl FnOnce(u64) -> i32) -> TestResult {
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
fn mapped_mem(size: u64, chunk: u64) -> Result<(Ruvm, u64, UserMap), i32> {
    let d = Ruvm::open().map_err(|_| 10)?;
    let a = d.mem_alloc(size, chunk, zero()).map_err(|_| 11)?;
    let q = d.mem_query(a.handle).map_err(|_| 12)?;
    let map = UserMap::of_mem(&d, &q).map_err(|_| 13)?;
    Ok((d, a.handle, map))
}

fn mem_access_after_free_faults() -> TestResult {
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
fn mem_moved_mapping_faults_after_free() -> TestResult {
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

fn status_pid(s: &WaitStatus) -> nix::unistd::Pid {
    s.pid().unwrap_or(nix::unistd::Pid::from_raw(0))
}

/// How many pages of `map` have a page-table entry (`mincore`: a mem's file has no page cache,
/// so only a mapped page counts).
fn resident_pages(map: &UserMap) -> Result<usize, Stop> {
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
fn mem_small_mmap_is_filled_at_once() -> TestResult {
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

fn mem_forked_child_has_no_mapping() -> TestResult {
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

fn mem_close_frees_everything() -> TestResult {
    let probe = Ruvm::open().ctx("open")?;
    let before = live(&probe)?;
    {
        let d = Ruvm::open().ctx("open")?;
        for (size, ps) in [(M, 0), (3 * M, 2 * M), (5000, 64 * K)] {
            let h = d.mem_alloc(size, ps, zero()).ctx("alloc")?.handle;
            d.map_kernel(h).ctx("map")?;
        }
        let q = d
            .mem_query(d.mem_alloc(4096, 0, 0).ctx("alloc")?.handle)
            .ctx("query")?;
        let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
        drop(map);
        check!(live(&probe)?.0 == before.0 + 4, "four mems not counted");
    }
    check!(
        live(&probe)? == before,
        "closing the file left {:?}, wanted {before:?}",
        live(&probe)?
    );
    Ok(())
}

fn mem_size_limits() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    let (max_alloc, max_file) = (info.max_alloc_bytes, info.max_file_bytes);
    let before = live(&d)?;
    // One byte over: its physical size rounds up past the limit.
    expect_errno(
        d.mem_alloc(max_alloc + 1, 0, 0),
        Errno::ENOSPC,
        "one byte over max_alloc_mib",
    )?;
    check!(live(&d)? == before, "a refused allocation left mems behind");
    // The per-file total can only be reached in memory when the limit is small (a dedicated
    // guest run sets max_file_mib=16 max_alloc_mib=8).
    if max_file > 64 * M {
        return Err(Stop::Skip(format!(
            "max_file_mib is {}; the per-file limit is tested with 16",
            max_file / M
        )));
    }
    let piece = max_alloc.min(4 * M);
    let mut held = Vec::new();
    let mut total = 0;
    while total + piece <= max_file {
        held.push(
            d.mem_alloc(piece, 0, 0)
                .ctx("alloc up to the per-file limit")?
                .handle,
        );
        total += piece;
    }
    expect_errno(
        d.mem_alloc(max_file - total + 4096, 0, 0),
        Errno::ENOSPC,
        "past the per-file limit",
    )?;
    // Another file has its own allowance.
    let other = Ruvm::open().ctx("open")?;
    let h = other
        .mem_alloc(piece, 0, 0)
        .ctx("another file still may allocate")?
        .handle;
    other.mem_free(h).ctx("free")?;
    // Freeing gives the allowance back.
    d.mem_free(held.pop().ok_or(Stop::Fail("nothing held".into()))?)
        .ctx("free")?;
    held.push(d.mem_alloc(piece, 0, 0).ctx("alloc after a free")?.handle);
    for h in held {
        d.mem_free(h).ctx("free")?;
    }
    Ok(())
}

fn mem_beyond_memory_is_enomem() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let info = d.info().ctx("INFO")?;
    let max_alloc = info.max_alloc_bytes.min(info.max_file_bytes);
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .ok_or(Stop::Fail("cannot read MemTotal".into()))?
        * K;
    // More than the machine has, but within the per-allocation limit: refused with ENOMEM
    // before a page is taken (draining the machine first would send other tasks' allocations
    // to the OOM killer, which the harness checks the kernel log for).
    let want = total + 64 * M;
    if want > max_alloc {
        return Err(Stop::Skip(format!(
            "the guest has {} MiB, the module allows {} MiB",
            total / M,
            max_alloc / M
        )));
    }
    let before = live(&d)?;
    let taken = pages_allocated()?;
    expect_errno(
        d.mem_alloc(want, 0, 0),
        Errno::ENOMEM,
        "allocation beyond all memory",
    )?;
    let taken = pages_allocated()? - taken;
    check!(
        taken < total / 4096 / 8,
        "{taken} pages were allocated for a request that could never be met"
    );
    check!(
        live(&d)? == before,
        "the failed allocation left mems behind"
    );
    // And memory is usable again right after.
    let h = d
        .mem_alloc(64 * M, 0, 0)
        .ctx("alloc after the failure")?
        .handle;
    d.mem_free(h).ctx("free")
}

/// Pages the page allocator has handed out since boot (the `pgalloc_*` counters of
/// /proc/vmstat).
fn pages_allocated() -> Result<u64, Stop> {
    let text = std::fs::read_to_string("/proc/vmstat").ctx("/proc/vmstat")?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("pgalloc_"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum())
}

/// Makes every allocation of order >= `min_order` by this task fail (fail_page_alloc), until
/// dropped.
struct FailHighOrder;

impl FailHighOrder {
    const DIR: &'static str = "/sys/kernel/debug/fail_page_alloc";

    fn set(name: &str, value: &str) -> Result<(), Stop> {
        std::fs::write(format!("{}/{name}", Self::DIR), value)
            .ctx(&format!("fail_page_alloc/{name}"))
    }

    fn new(min_order: u32) -> Result<Self, Stop> {
        if !std::path::Path::new(Self::DIR).exists() {
            return Err(Stop::Skip(
                "no fail_page_alloc in this kernel (the debug kernel has it)".into(),
            ));
        }
        for (k, v) in [
            ("task-filter", "Y"),
            ("ignore-gfp-wait", "N"),
            ("ignore-gfp-highmem", "N"),
            ("min-order", &min_order.to_string()),
            ("verbose", "0"),
            ("interval", "1"),
            ("times", "-1"),
            ("probability", "100"),
        ] {
            Self::set(k, v)?;
        }
        std::fs::write("/proc/self/make-it-fail", "1").ctx("make-it-fail")?;
        Ok(Self)
    }
}

impl Drop for FailHighOrder {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/self/make-it-fail", "0");
        let _ = Self::set("probability", "0");
    }
}

fn mem_fallback_under_fragmentation() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = live(&d)?;
    let results = {
        // Orders >= 9 (2 MiB) fail, as under fragmentation.
        let _inject = FailHighOrder::new(9)?;
        (
            d.mem_alloc(5 * M, 2 * M, 0),
            d.mem_alloc(5 * M, 2 * M, uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK),
        )
    };
    expect_errno(results.0, Errno::ENOMEM, "2M chunks without fallback")?;
    let a = results.1.ctx("2M chunks with fallback")?;
    check!(
        a.chunk_size == M,
        "fell back to chunks of {}, wanted 1M",
        a.chunk_size
    );
    check!(a.chunk_count == 5, "{} chunks, wanted 5", a.chunk_count);
    check!(
        live(&d)? == (before.0 + 1, before.1 + 5 * M),
        "accounting after fallback: {:?}",
        live(&d)?
    );
    // The fallen-back mem works.
    d.map_kernel(a.handle).ctx("map")?;
    d.mem_fill(false, pattern_args(a.handle, 0, 5 * M, 3))
        .ctx("fill")?;
    kernel_verify(&d, pattern_args(a.handle, 0, 5 * M, 3), "verify")?;
    d.mem_free(a.handle).ctx("free")?;
    nothing_left(&d, before)
}

/// Chunks below 2 MiB are cut from larger blocks only while the page allocator has them free;
/// with every allocation of a larger order failing (as under fragmentation), 4 KiB chunks come
/// from 8 KiB blocks, 8 KiB chunks are allocated one by one (order-0 pages), and so are 64 KiB
/// and 512 KiB chunks (compound pages), and the mem is as good: zeroed, its bytes the same
/// through the kernel mapping and `mmap`, nothing left behind. (Order 2, not 1, for the small
/// ones: the debug kernel's slab debugging puts 4 KiB kmalloc objects in order-1 slabs, which
/// would fail the list's own room first.)
fn mem_small_chunks_without_free_blocks() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let before = live(&d)?;
    // Sizes that are not a power of two, so that every block size is tried; the lowest order
    // that fails.
    for (chunk, size, fail) in [
        (4 * K, M + 12 * K, 2),
        (8 * K, M + 24 * K, 2),
        (64 * K, 3 * M + 192 * K, 5),
        (512 * K, 3 * M + 512 * K, 8),
    ] {
        let a = {
            let _inject = FailHighOrder::new(fail)?;
            d.mem_alloc(size, chunk, uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO)
        }
        .ctx(&format!(
            "{size} bytes in {chunk}-byte chunks, no larger block free"
        ))?;
        check!(
            a.chunk_size == chunk && a.chunk_count == size / chunk,
            "{} chunks of {}, wanted {} of {}",
            a.chunk_count,
            a.chunk_size,
            size / chunk,
            chunk
        );
        d.map_kernel(a.handle).ctx("map")?;
        let q = uapi::ruvm_mem_query {
            physical_size: size,
            mmap_offset: a.mmap_offset,
            ..Default::default()
        };
        let m = UserMap::of_mem(&d, &q).ctx("mmap")?;
        check!(
            (0..size as usize).all(|i| m.read(i) == 0),
            "a zeroed mem of {chunk}-byte chunks made one by one reads non-zero"
        );
        d.mem_fill(false, pattern_args(a.handle, 0, size, 5))
            .ctx("fill")?;
        let bad = (0..size as usize)
            .filter(|&i| m.read(i) != pattern::byte_at(5, i as u64))
            .count();
        check!(
            bad == 0,
            "{bad} bytes differ through mmap from the kernel's fill"
        );
        drop(m);
        d.mem_free(a.handle).ctx("free")?;
    }
    nothing_left(&d, before)
}

/// A cgroup2 group of its own with a memory limit, removed on drop.
struct MemCgroup {
    group: crate::cgroup::MemGroup,
}

impl MemCgroup {
    fn new(name: &str, max: u64) -> Result<Self, Stop> {
        use crate::cgroup::MemGroup;
        if !MemGroup::available() {
            return Err(Stop::Skip("no cgroup2 memory controller".into()));
        }
        let group = MemGroup::new(name).ctx("make the cgroup")?;
        group
            .write("memory.max", &max.to_string())
            .ctx("memory.max")?;
        Ok(Self { group })
    }

    fn read(&self, file: &str) -> Result<String, Stop> {
        self.group.read(file).ctx(file)
    }

    fn current(&self) -> Result<u64, Stop> {
        self.read("memory.current")?
            .trim()
            .parse()
            .map_err(|_| Stop::Fail("memory.current".into()))
    }

    fn event(&self, name: &str) -> Result<u64, Stop> {
        let events = self.read("memory.events")?;
        Ok(events
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0))
    }
}

fn mem_charged_to_the_callers_memory_cgroup() -> TestResult {
    let cg = MemCgroup::new("ruvm-selftest", 48 * M)?;
    let (rx, tx) = nix::unistd::pipe().ctx("pipe")?;
    let (rx2, tx2) = nix::unistd::pipe().ctx("pipe")?;
    // A child joins the group and allocates; the parent watches the group's counters.
    // SAFETY: the runner is single-threaded here; the child only makes syscalls.
    let child = match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => {
            let step = |b: &[u8]| {
                let _ = nix::unistd::write(&tx, b);
                let mut x = [0u8; 1];
                let _ = nix::unistd::read(&rx2, &mut x);
            };
            let me = std::process::id().to_string();
            if std::fs::write(cg.group.dir.join("cgroup.procs"), me).is_err() {
                std::process::exit(10);
            }
            let Ok(d) = Ruvm::open() else {
                std::process::exit(11)
            };
            step(b"j"); // joined
            let Ok(a) = d.mem_alloc(16 * M, 2 * M, 0) else {
                std::process::exit(12)
            };
            // 4 KiB chunks are cut from larger blocks (split_page splits the charge).
            let Ok(b) = d.mem_alloc(8 * M, 4 * K, zero()) else {
                std::process::exit(12)
            };
            step(b"a"); // allocated 24M
                        // 24M held, 48M allowed: 40M more cannot be charged.
            let over = d.mem_alloc(40 * M, 0, 0);
            if over.err() != Some(Errno::ENOMEM) {
                std::process::exit(13);
            }
            if d.mem_free(a.handle).is_err() || d.mem_free(b.handle).is_err() {
                std::process::exit(14);
            }
            step(b"f"); // freed
            std::process::exit(0);
        }
        ForkResult::Parent { child } => child,
    };
    // Whatever happens below, the child does not outlive the case (it holds /dev/ruvm open).
    struct Reap(nix::unistd::Pid);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(self.0, Signal::SIGKILL);
            let _ = waitpid(self.0, None);
        }
    }
    let reap = Reap(child);
    let wait_step = |want: u8| -> Result<(), Stop> {
        let mut b = [0u8; 1];
        let n = nix::unistd::read(&rx, &mut b).ctx("read")?;
        check!(
            n == 1 && b[0] == want,
            "the child stopped before step '{}'",
            want as char
        );
        Ok(())
    };
    let go = || nix::unistd::write(&tx2, b"g").map(drop).ctx("write");
    wait_step(b'j')?;
    let joined = cg.current()?;
    go()?;
    wait_step(b'a')?;
    let holding = cg.current()?;
    check!(
        holding >= joined + 24 * M,
        "24M allocated, but the group's memory.current went {joined} -> {holding}"
    );
    go()?;
    wait_step(b'f')?;
    let freed = cg.current()?;
    // The group's count also moves with small kernel allocations (a few KiB).
    check!(
        freed + 23 * M <= holding,
        "freeing gave back only {} bytes to the group",
        holding - freed
    );
    go()?;
    let st = waitpid(child, None).ctx("waitpid")?;
    std::mem::forget(reap);
    check!(
        st == WaitStatus::Exited(child, 0),
        "the child failed: {st:?} (exit 10..14 name the step)"
    );
    // Over the limit it failed with ENOMEM: the group's OOM killer never ran.
    check!(
        cg.event("oom_kill")? == 0,
        "an OOM kill happened in the group"
    );
    check!(cg.event("max")? > 0, "the limit was never hit");
    Ok(())
}

/// Reads one byte of this process's memory at `addr` through `/proc/self/mem`, as the kernel
/// reaches it (faulting pages in): `None` if the access faults, instead of a signal.
fn read_via_proc(mem: &std::fs::File, addr: usize) -> Option<u8> {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 1];
    match mem.read_at(&mut b, addr as u64) {
        Ok(1) => Some(b[0]),
        _ => None,
    }
}

/// `mmap` of a mem racing `MEM_FREE` of it, many times: whichever wins, no mapping may still
/// reach the mem's pages once the free has returned (each access faults), and everything is
/// released after `munmap`. Before the fix (pages inserted by `mmap` itself, before the VMA was
/// linked, so the free's zap missed them) a few rounds in a thousand kept a live mapping.
fn mem_mmap_racing_free_leaves_no_mapping() -> TestResult {
    use std::sync::Barrier;
    use std::time::{Duration, Instant};
    const ROUNDS: u32 = 2000;
    let d = Ruvm::open().ctx("open")?;
    let before = live(&d)?;
    let proc_mem = std::fs::File::open("/proc/self/mem").ctx("open /proc/self/mem")?;
    let len = (64 * K) as usize;
    let (mut mapped, mut rounds) = (0u32, 0u32);
    let start = Instant::now();
    while rounds < ROUNDS && start.elapsed() < Duration::from_secs(20) {
        rounds += 1;
        let a = d.mem_alloc(64 * K, 0, zero()).ctx("alloc")?;
        let barrier = Barrier::new(2);
        let (map, freed) = std::thread::scope(|s| {
            let mapper = s.spawn(|| {
                barrier.wait();
                let m = UserMap::new(
                    &d,
                    a.mmap_offset,
                    len,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED,
                );
                // The address crosses back to this thread; the mapping is unmapped there.
                m.map(|m| {
                    let p = m.as_ptr() as usize;
                    std::mem::forget(m);
                    p
                })
            });
            barrier.wait();
            let freed = d.mem_free(a.handle);
            (mapper.join(), freed)
        });
        freed.ctx("free")?;
        let Ok(Ok(addr)) = map else {
            // The free came first: the mmap found no mem (ENXIO).
            continue;
        };
        mapped += 1;
        let first = read_via_proc(&proc_mem, addr);
        let last = read_via_proc(&proc_mem, addr + len - 1);
        // SAFETY: `addr` is the start of a `len`-byte mapping made above and used no more.
        let unmapped = unsafe {
            nix::sys::mman::munmap(
                std::ptr::NonNull::new(addr as *mut std::ffi::c_void)
                    .ok_or(Stop::Fail("mmap returned NULL".into()))?,
                len,
            )
        };
        unmapped.ctx("munmap")?;
        check!(
            first.is_none() && last.is_none(),
            "round {rounds}: a mapping made while the mem was being freed still reads its pages after MEM_FREE returned"
        );
    }
    check!(
        live(&d)? == before,
        "after {rounds} rounds, mems are still alive: {:?} (before: {before:?})",
        live(&d)?
    );
    println!("# {rounds} rounds, the mmap won {mapped} of them");
    Ok(())
}
