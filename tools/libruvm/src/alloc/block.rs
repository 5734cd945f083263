// SPDX-License-Identifier: GPL-2.0

//! What the allocator hands out and reports: a [`Block`], its plain form for C
//! ([`RawBlock`]), and the statistics ([`Stats`]).

/// A block: `len` bytes at `offset` in mem `mem` (a segment), at `as_ptr()` in the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub(super) mem: u64,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) addr: usize,
    pub(super) seg: u32,
    pub(super) large: bool,
    pub(super) generation: u32,
}

impl Block {
    /// The segment's mem handle: what stream operations name.
    pub fn mem(&self) -> u64 {
        self.mem
    }
    /// The block's offset in its mem.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Its usable length: the request rounded up (or the whole free block when the rest was
    /// too short to split off).
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Never true: a block has at least [`super::ROUND`] bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Its first byte in the process (a shared mapping of the segment).
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// The block as plain data, for a C caller to hold and give back ([`Block::from_raw`]).
    pub fn to_raw(&self) -> RawBlock {
        RawBlock {
            mem: self.mem,
            offset: self.offset,
            len: self.len,
            ptr: self.addr as u64,
            segment: self.seg,
            generation: self.generation,
            large: u32::from(self.large),
            pad: 0,
        }
    }

    /// A block from its plain data. Nothing is trusted: [`super::Allocator::free`] refuses (`EINVAL`)
    /// one that is not a block the allocator has in use, field for field.
    pub fn from_raw(r: &RawBlock) -> Self {
        Self {
            mem: r.mem,
            offset: r.offset,
            len: r.len,
            addr: r.ptr as usize,
            seg: r.segment,
            large: r.large != 0,
            generation: r.generation,
        }
    }
}

/// A [`Block`] as C sees it (`struct ruvm_block` of libruvm's C header).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawBlock {
    /// The segment's mem handle.
    pub mem: u64,
    /// The block's offset in it.
    pub offset: u64,
    /// Its usable length.
    pub len: u64,
    /// Its first byte in the process.
    pub ptr: u64,
    /// The allocator's own: which segment, which allocation, which size class.
    pub segment: u32,
    /// See `segment`.
    pub generation: u32,
    /// See `segment`.
    pub large: u32,
    /// 0.
    pub pad: u32,
}

/// What the allocator holds and did, as caching allocators report it (`struct
/// ruvm_allocator_stats` of the C API, field for field).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes the kernel holds for the allocator now: whole segments, and arenas' resident
    /// chunks.
    pub reserved: u64,
    /// The most `reserved` has been (the footprint's high watermark).
    pub reserved_peak: u64,
    /// Bytes of the blocks in use now (rounded up).
    pub allocated: u64,
    /// The most `allocated` has been.
    pub allocated_peak: u64,
    /// Bytes asked for by the blocks in use now.
    pub requested: u64,
    /// The most `requested` has been (the peak of live bytes).
    pub requested_peak: u64,
    /// Segments (and arenas) held now.
    pub segments: u64,
    /// Allocations served from held memory: free blocks, with no chunk made resident.
    pub hits: u64,
    /// Allocations that asked the kernel for memory (a new segment, or an arena's chunks).
    pub misses: u64,
    /// Blocks taken from another stream's frees.
    pub cross_stream: u64,
    /// Waits inserted to take them (`allow_internal_dependencies`).
    pub waits_inserted: u64,
    /// Give-backs to the kernel (a whole segment, or a range of an arena's chunks).
    pub released: u64,
    /// Free bytes in the held segments.
    pub free: u64,
    /// The longest free block.
    pub largest_free: u64,
    /// Streams the allocator keeps points of (released ones forgotten).
    pub streams_known: u64,
    /// Events whose last record through the allocator it keeps (forgotten ones dropped).
    pub events_known: u64,
}

impl Stats {
    /// The share of the free bytes outside the longest free block (0: none; near 1: the free
    /// memory is in many small pieces).
    pub fn fragmentation(&self) -> f64 {
        if self.free == 0 {
            0.0
        } else {
            1.0 - self.largest_free as f64 / self.free as f64
        }
    }
}
