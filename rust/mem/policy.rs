// SPDX-License-Identifier: GPL-2.0

//! uvm_mem's chunk-size rules, as one pure function.
//!
//! This file depends on `core` only: the module uses it, and the host tests compile the very
//! same file (`tools/ruvmctl/tests/policy.rs`) and check it over the whole rule table.
//!
//! The rules (`Documentation/ruvm.rst`, "Chunk sizes"):
//!
//! - sysmem: `page_size == 0` gives `PAGE_SIZE`; otherwise it must be a power of two from
//!   `PAGE_SIZE` to 2 MiB and is used as is;
//! - vidmem: `page_size == 0` gives 4 KiB below 64 KiB, 64 KiB below the biggest GPU page size
//!   `B` <= 2 MiB, else `B`; on a NUMA (CPU-coherent) GPU at least `PAGE_SIZE`. An explicit page
//!   size must be one of the GPU's page sizes <= 2 MiB;
//! - `physical_size = round_up(size, chunk_size)`, `chunk_count = physical_size / chunk_size`.

/// 64 KiB: below this a default vidmem mem uses 4 KiB chunks.
pub(crate) const SIZE_64K: u64 = 64 << 10;
/// 4 KiB, the smallest GPU page.
pub(crate) const SIZE_4K: u64 = 4 << 10;
/// 2 MiB: the largest chunk, and the PMM's root chunk.
pub(crate) const CHUNK_MAX: u64 = 2 << 20;

/// What backs a mem, as far as the rules care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backing {
    /// Kernel pages.
    Sysmem,
    /// A GPU's memory.
    Vidmem {
        /// Bitmask of the GPU's page sizes (bit `n` set = `1 << n` bytes is a page size).
        gpu_page_sizes: u64,
        /// The GPU's memory is CPU-coherent (NUMA), so chunks must be CPU-mappable.
        numa: bool,
    },
}

/// Why a request breaks the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PolicyError {
    /// `size` is zero.
    ZeroSize,
    /// The page size is not one this backing can use (or the GPU has no usable page size).
    BadPageSize,
    /// Rounding `size` up to whole chunks overflows.
    Overflow,
}

/// The shape of a mem: what the rules chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Bytes per chunk (a power of two).
    pub(crate) chunk_size: u64,
    /// Number of chunks.
    pub(crate) chunk_count: u64,
    /// `chunk_size * chunk_count`, `>= size`.
    pub(crate) physical_size: u64,
}

/// The largest page size in `sizes` that is `<= max`, or 0 (uvm's `biggest_page_size_up_to`).
pub(crate) fn biggest_page_size_up_to(sizes: u64, max: u64) -> u64 {
    if max == 0 {
        return 0;
    }
    // All bits up to and including max's highest bit.
    let top = 63 - max.leading_zeros();
    let mask = if top == 63 {
        u64::MAX
    } else {
        (1u64 << (top + 1)) - 1
    };
    let usable = sizes & mask;
    if usable == 0 {
        0
    } else {
        1u64 << (63 - usable.leading_zeros())
    }
}

/// The chunk size for `backing`, `size` and the requested `page_size` (0 = default).
///
/// `cpu_page_size` is the kernel's `PAGE_SIZE`, a parameter so the rules can be checked for
/// 64 KiB-page kernels too.
pub(crate) fn chunk_size(
    backing: Backing,
    size: u64,
    page_size: u64,
    cpu_page_size: u64,
) -> Result<u64, PolicyError> {
    if size == 0 {
        return Err(PolicyError::ZeroSize);
    }
    match backing {
        Backing::Sysmem => {
            if page_size == 0 {
                Ok(cpu_page_size)
            } else if page_size.is_power_of_two()
                && page_size >= cpu_page_size
                && page_size <= CHUNK_MAX
            {
                Ok(page_size)
            } else {
                Err(PolicyError::BadPageSize)
            }
        }
        Backing::Vidmem {
            gpu_page_sizes,
            numa,
        } => {
            let usable = gpu_page_sizes & (CHUNK_MAX | (CHUNK_MAX - 1));
            let biggest = biggest_page_size_up_to(usable, CHUNK_MAX);
            if biggest == 0 {
                return Err(PolicyError::BadPageSize);
            }
            let chunk = if page_size != 0 {
                if !page_size.is_power_of_two() || usable & page_size == 0 {
                    return Err(PolicyError::BadPageSize);
                }
                page_size
            } else if size < SIZE_64K {
                SIZE_4K
            } else if size < biggest {
                SIZE_64K
            } else {
                biggest
            };
            Ok(if numa {
                chunk.max(cpu_page_size)
            } else {
                chunk
            })
        }
    }
}

/// The whole layout: chunk size, count and physical size.
pub(crate) fn layout(
    backing: Backing,
    size: u64,
    page_size: u64,
    cpu_page_size: u64,
) -> Result<Layout, PolicyError> {
    let chunk_size = chunk_size(backing, size, page_size, cpu_page_size)?;
    layout_with_chunk(size, chunk_size)
}

/// The layout of `size` bytes in chunks of `chunk_size` (a power of two).
pub(crate) fn layout_with_chunk(size: u64, chunk_size: u64) -> Result<Layout, PolicyError> {
    if size == 0 {
        return Err(PolicyError::ZeroSize);
    }
    if !chunk_size.is_power_of_two() {
        return Err(PolicyError::BadPageSize);
    }
    let physical_size = size
        .checked_add(chunk_size - 1)
        .ok_or(PolicyError::Overflow)?
        & !(chunk_size - 1);
    Ok(Layout {
        chunk_size,
        chunk_count: physical_size / chunk_size,
        physical_size,
    })
}

/// The buddy order of a chunk of `chunk_size` bytes made of `cpu_page_size` pages.
pub(crate) fn chunk_order(chunk_size: u64, cpu_page_size: u64) -> u32 {
    (chunk_size / cpu_page_size).trailing_zeros()
}
