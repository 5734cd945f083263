// SPDX-License-Identifier: GPL-2.0

//! Host tests of the module's pure policy code, compiled from the module's own source files:
//! uvm_mem's chunk-size rules over the whole rule table, and the fill pattern (the module's
//! implementation against ruvmctl's, written separately from the header's definition).

#[path = "../../../rust/mem/policy.rs"]
mod policy;

#[path = "../../../rust/mem/pattern.rs"]
mod module_pattern;

#[path = "../src/pattern.rs"]
mod tool_pattern;

use policy::{
    biggest_page_size_up_to, chunk_order, chunk_size, layout, layout_with_chunk, Backing, Layout,
    PolicyError,
};

const K: u64 = 1024;
const M: u64 = 1024 * 1024;
const G: u64 = 1024 * M;

/// Turing..Blackwell: 4K, 64K, 2M (and bigger pages uvm_mem never uses).
const AMPERE: u64 = (4 * K) | (64 * K) | (2 * M) | (512 * M);
const BLACKWELL: u64 = AMPERE | (256 * G);
/// Maxwell with a 128K big page.
const MAXWELL_128K: u64 = (4 * K) | (128 * K);

fn vid(sizes: u64) -> Backing {
    Backing::Vidmem {
        gpu_page_sizes: sizes,
        numa: false,
    }
}

fn numa(sizes: u64) -> Backing {
    Backing::Vidmem {
        gpu_page_sizes: sizes,
        numa: true,
    }
}

#[test]
fn sysmem_default_is_the_cpu_page() {
    for cpu in [4 * K, 64 * K] {
        for size in [1, 4, 16, 1024, 4096, M, 7 * M + 17, cpu - 1, cpu, 7 * cpu] {
            assert_eq!(
                chunk_size(Backing::Sysmem, size, 0, cpu),
                Ok(cpu),
                "size {size}, cpu page {cpu}"
            );
        }
    }
}

#[test]
fn sysmem_explicit_sizes() {
    for cpu in [4 * K, 64 * K] {
        let mut ps = cpu;
        while ps <= 2 * M {
            assert_eq!(chunk_size(Backing::Sysmem, 1, ps, cpu), Ok(ps));
            ps *= 2;
        }
        for bad in [
            1,
            3 * K,
            cpu / 2,
            3 * M,
            4 * M,
            6 * K,
            1 << 40,
            u64::MAX,
            3 * cpu,
        ] {
            assert_eq!(
                chunk_size(Backing::Sysmem, 1, bad, cpu),
                Err(PolicyError::BadPageSize),
                "page size {bad}"
            );
        }
    }
}

#[test]
fn zero_size_is_refused_everywhere() {
    for b in [Backing::Sysmem, vid(AMPERE), numa(AMPERE)] {
        assert_eq!(chunk_size(b, 0, 0, 4 * K), Err(PolicyError::ZeroSize));
        assert_eq!(layout(b, 0, 0, 4 * K), Err(PolicyError::ZeroSize));
    }
}

#[test]
fn vidmem_default_rules_as_uvm_mem_test_checks_them() {
    for sizes in [AMPERE, BLACKWELL] {
        let b = vid(sizes);
        // For each GPU page size ps: ps - 1 gives a smaller chunk (or ps if it is the smallest),
        // ps gives ps.
        for ps in [4 * K, 64 * K, 2 * M] {
            let below = chunk_size(b, ps - 1, 0, 4 * K).unwrap();
            assert!(below < ps || ps == 4 * K, "size {}: chunk {below}", ps - 1);
            assert_eq!(chunk_size(b, ps, 0, 4 * K), Ok(ps), "size {ps}");
        }
        // 5 * B - 1 uses B, the biggest page size up to 2M.
        assert_eq!(chunk_size(b, 5 * 2 * M - 1, 0, 4 * K), Ok(2 * M));
        // The thresholds themselves.
        assert_eq!(chunk_size(b, 64 * K - 1, 0, 4 * K), Ok(4 * K));
        assert_eq!(chunk_size(b, 2 * M - 1, 0, 4 * K), Ok(64 * K));
        assert_eq!(chunk_size(b, 1, 0, 4 * K), Ok(4 * K));
        assert_eq!(chunk_size(b, 100 * G, 0, 4 * K), Ok(2 * M));
    }
}

#[test]
fn vidmem_numa_chunks_are_cpu_mappable() {
    // With 64K CPU pages, a NUMA GPU's chunk is at least 64K.
    assert_eq!(chunk_size(numa(AMPERE), 1, 0, 64 * K), Ok(64 * K));
    assert_eq!(chunk_size(numa(AMPERE), 4 * K, 4 * K, 64 * K), Ok(64 * K));
    assert_eq!(chunk_size(numa(AMPERE), 2 * M, 0, 64 * K), Ok(2 * M));
    // With 4K CPU pages nothing changes.
    assert_eq!(chunk_size(numa(AMPERE), 1, 0, 4 * K), Ok(4 * K));
    // Not NUMA: 4K chunks even with 64K CPU pages.
    assert_eq!(chunk_size(vid(AMPERE), 1, 0, 64 * K), Ok(4 * K));
}

#[test]
fn vidmem_explicit_sizes_must_be_gpu_page_sizes_up_to_2m() {
    for ps in [4 * K, 64 * K, 2 * M] {
        assert_eq!(chunk_size(vid(AMPERE), 1, ps, 4 * K), Ok(ps));
    }
    for bad in [8 * K, 128 * K, M, 512 * M, 3 * K, 256 * G] {
        assert_eq!(
            chunk_size(vid(BLACKWELL), 1, bad, 4 * K),
            Err(PolicyError::BadPageSize),
            "page size {bad}"
        );
    }
    assert_eq!(
        chunk_size(vid(MAXWELL_128K), 1, 128 * K, 4 * K),
        Ok(128 * K)
    );
    assert_eq!(
        chunk_size(vid(MAXWELL_128K), 1, 64 * K, 4 * K),
        Err(PolicyError::BadPageSize)
    );
    // Biggest up to 2M on Maxwell is 128K.
    assert_eq!(chunk_size(vid(MAXWELL_128K), 10 * M, 0, 4 * K), Ok(128 * K));
    // A GPU with no page size up to 2M cannot hold uvm_mem vidmem.
    assert_eq!(
        chunk_size(vid(512 * M), 1, 0, 4 * K),
        Err(PolicyError::BadPageSize)
    );
}

#[test]
fn biggest_page_size() {
    assert_eq!(biggest_page_size_up_to(AMPERE, 2 * M), 2 * M);
    assert_eq!(biggest_page_size_up_to(AMPERE, 2 * M - 1), 64 * K);
    assert_eq!(biggest_page_size_up_to(AMPERE, 4 * K), 4 * K);
    assert_eq!(biggest_page_size_up_to(AMPERE, 4 * K - 1), 0);
    assert_eq!(biggest_page_size_up_to(AMPERE, u64::MAX), 512 * M);
    assert_eq!(biggest_page_size_up_to(BLACKWELL, u64::MAX), 256 * G);
    assert_eq!(biggest_page_size_up_to(0, 2 * M), 0);
    assert_eq!(biggest_page_size_up_to(AMPERE, 0), 0);
}

#[test]
fn layouts_round_up_to_whole_chunks() {
    assert_eq!(
        layout(Backing::Sysmem, 1, 0, 4 * K),
        Ok(Layout {
            chunk_size: 4 * K,
            chunk_count: 1,
            physical_size: 4 * K
        })
    );
    assert_eq!(
        layout(Backing::Sysmem, 7 * M + 17, 2 * M, 4 * K),
        Ok(Layout {
            chunk_size: 2 * M,
            chunk_count: 4,
            physical_size: 8 * M
        })
    );
    assert_eq!(
        layout(Backing::Sysmem, 7 * M + 17, 0, 4 * K),
        Ok(Layout {
            chunk_size: 4 * K,
            chunk_count: 1793,
            physical_size: 7 * M + 4 * K
        })
    );
    for size in [1, 4, 16, 1024, 4096, M, 7 * M + 17] {
        for ps in [4 * K, 64 * K, 128 * K, 2 * M] {
            let l = layout(Backing::Sysmem, size, ps, 4 * K).unwrap();
            assert_eq!(l.physical_size, l.chunk_count * l.chunk_size);
            assert!(l.physical_size >= size && l.physical_size - size < ps);
        }
    }
}

#[test]
fn rounding_overflow_is_reported() {
    assert_eq!(
        layout(Backing::Sysmem, u64::MAX, 0, 4 * K),
        Err(PolicyError::Overflow)
    );
    assert_eq!(
        layout(Backing::Sysmem, u64::MAX - 4 * K, 2 * M, 4 * K),
        Err(PolicyError::Overflow)
    );
    // The largest size that still rounds.
    let top = u64::MAX - (4 * K - 1);
    assert_eq!(
        layout_with_chunk(top, 4 * K).map(|l| l.physical_size),
        Ok(top)
    );
    assert_eq!(layout_with_chunk(1, 3), Err(PolicyError::BadPageSize));
}

#[test]
fn orders() {
    assert_eq!(chunk_order(4 * K, 4 * K), 0);
    assert_eq!(chunk_order(64 * K, 4 * K), 4);
    assert_eq!(chunk_order(2 * M, 4 * K), 9);
    assert_eq!(chunk_order(2 * M, 64 * K), 5);
}

#[test]
fn module_and_ruvmctl_patterns_agree() {
    for seed in [0, 1, 7 * M + 17, u64::MAX, 0x0123_4567_89ab_cdef] {
        for offset in (0..100).chain([4095, 4096, 7 * M, u64::MAX - 8, u64::MAX]) {
            assert_eq!(
                module_pattern::byte_at(seed, offset),
                tool_pattern::byte_at(seed, offset),
                "seed {seed} offset {offset}"
            );
        }
        let mut buf = [0u8; 37];
        module_pattern::fill(seed, 13, &mut buf);
        for (i, b) in buf.iter().enumerate() {
            assert_eq!(*b, tool_pattern::byte_at(seed, 13 + i as u64));
        }
    }
}
