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

use super::harness::{cases, check, expect_errno, in_child, Case, Context, Stop, TestResult};
use libruvm::{uapi, Ruvm, UserMap};

use crate::pattern;

mod data;
mod limits;
mod refusals;
mod user_maps;
use data::*;
use limits::*;
use refusals::*;
use user_maps::*;

pub fn cases() -> Vec<Case> {
    cases![
        mem_matrix_chunk_sizes,
        mem_mmap_offsets_never_overlap,
        mem_query_reports_the_truth,
        mem_kernel_map_is_idempotent,
        mem_zeroed_reads_zero_both_ways,
        mem_zeroed_over_dirty_pages,
        mem_kernel_writes_user_reads,
        mem_user_writes_kernel_reads,
        mem_verify_finds_a_corrupted_byte,
        mem_kernel_copy,
        mem_copies_both_ways_at_once,
        mem_alloc_bad_inputs,
        mem_handle_bad_inputs,
        mem_fill_bad_inputs,
        mem_other_files_handles_are_enoent,
        mem_mmap_bad_inputs,
        mem_mapping_cannot_be_split_or_made_executable,
        mem_mmap_racing_free_leaves_no_mapping,
        mem_access_after_free_faults,
        mem_moved_mapping_faults_after_free,
        mem_small_mmap_is_filled_at_once,
        mem_forked_child_has_no_mapping,
        mem_close_frees_everything,
        mem_size_limits,
        mem_beyond_memory_is_enomem,
        mem_fallback_under_fragmentation,
        mem_small_chunks_without_free_blocks,
        mem_charged_to_the_callers_memory_cgroup,
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
