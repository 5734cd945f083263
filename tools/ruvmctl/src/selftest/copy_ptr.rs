// SPDX-License-Identifier: GPL-2.0

//! Copies that name a side by an address of the caller's (`RUVM_OP_DST_PTR`,
//! `RUVM_OP_SRC_PTR`, `RUVM_FEATURE_COPY_PTR`): in `RUVM_IOCTL_CE_COPY` and in a stream's
//! `RUVM_OP_COPY`. Bytes written through one mem's user mapping are copied by a simulated GPU's
//! engine to an address (or from one) and read back through the other mem's mapping; a pinned
//! heap's pointer is a side as it is; every refusal has its errno, flags and offsets before
//! any lookup. Every case skips without the feature or a simulated GPU.

use libruvm::heap::{HeapConfig, PinnedHeap};
use libruvm::{op, uapi, Errno, Ruvm, UserMap};

use super::harness::{cases, check, expect_errno, Case, Context, Stop, TestResult};
use super::shared::sim_gpu;
use crate::pattern;

const DST_PTR: u32 = uapi::ruvm_op_flags_RUVM_OP_DST_PTR;
const SRC_PTR: u32 = uapi::ruvm_op_flags_RUVM_OP_SRC_PTR;
const LEN: u64 = 64 << 10;

pub fn cases() -> Vec<Case> {
    cases![
        copy_ptr_bytes_through_both_sides,
        copy_ptr_heap_pointer_on_a_stream,
        copy_ptr_refusals,
    ]
}

/// The device and a simulated GPU, or a skip without the feature or such a GPU.
fn setup() -> Result<(Ruvm, u32), Stop> {
    let d = Ruvm::open().ctx("open")?;
    let features = d.info().ctx("INFO")?.features;
    if features & u64::from(uapi::RUVM_FEATURE_COPY_PTR) == 0 {
        return Err(Stop::Skip("no RUVM_FEATURE_COPY_PTR".into()));
    }
    let g = sim_gpu(&d)?;
    Ok((d, g))
}

/// A mem of [`LEN`] bytes of `d`, DMA-mapped for `g` and mapped into this process.
fn mapped(d: &Ruvm, g: u32) -> Result<(u64, UserMap), Stop> {
    let a = d.mem_alloc(LEN, 4096, 0).ctx("MEM_ALLOC")?;
    d.mem_gpu(true, a.handle, g).ctx("MEM_MAP_GPU")?;
    let q = d.mem_query(a.handle).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    Ok((a.handle, map))
}

fn write(map: &UserMap, from: u64, len: u64, seed: u64) {
    for i in 0..len {
        map.write((from + i) as usize, pattern::byte_at(seed, i));
    }
}

/// Bytes of `[from, from + len)` of `map` that are not `seed`'s pattern.
fn wrong(map: &UserMap, from: u64, len: u64, seed: u64) -> u64 {
    (0..len)
        .filter(|&i| map.read((from + i) as usize) != pattern::byte_at(seed, i))
        .count() as u64
}

/// Source by address, destination by handle; the reverse; both by address: the bytes land
/// where the addresses' offsets say, through CE_COPY.
fn copy_ptr_bytes_through_both_sides() -> TestResult {
    let (d, g) = setup()?;
    let (a, ma) = mapped(&d, g)?;
    let (b, mb) = mapped(&d, g)?;
    let at = |m: &UserMap, off: u64| m.as_ptr().wrapping_add(off as usize) as u64;

    write(&ma, 4096 + 7, 8000, 1);
    d.ce_copy_flags(g, SRC_PTR, (b, 100), (at(&ma, 4096 + 7), 0), 8000)
        .ctx("CE_COPY from an address")?;
    let bad = wrong(&mb, 100, 8000, 1);
    check!(bad == 0, "from an address: {bad} bytes wrong");

    write(&mb, 30000, 5000, 2);
    d.ce_copy_flags(g, DST_PTR, (at(&ma, 20001), 0), (b, 30000), 5000)
        .ctx("CE_COPY to an address")?;
    let bad = wrong(&ma, 20001, 5000, 2);
    check!(bad == 0, "to an address: {bad} bytes wrong");

    write(&ma, 40000, 3000, 3);
    d.ce_copy_flags(
        g,
        DST_PTR | SRC_PTR,
        (at(&mb, 50000), 0),
        (at(&ma, 40000), 0),
        3000,
    )
    .ctx("CE_COPY between two addresses")?;
    let bad = wrong(&mb, 50000, 3000, 3);
    check!(bad == 0, "between two addresses: {bad} bytes wrong");
    drop((ma, mb));
    d.mem_free(a).ctx("free")?;
    d.mem_free(b).ctx("free")?;
    Ok(())
}

/// A pinned heap's block is a side as it is: written through the pointer, copied by a
/// stream's COPY to a mem (source by address), and back from the mem to another block
/// (destination by address); each read where it landed.
fn copy_ptr_heap_pointer_on_a_stream() -> TestResult {
    let (d, g) = setup()?;
    let features = d.info().ctx("INFO")?.features;
    if features & u64::from(uapi::RUVM_FEATURE_SPARSE) == 0 {
        return Err(Stop::Skip("no RUVM_FEATURE_SPARSE (pinned heaps)".into()));
    }
    let heap = PinnedHeap::new(
        &d,
        &HeapConfig {
            gpus: vec![g],
            arena_size: 32 << 20,
        },
    )
    .ctx("PinnedHeap::new")?;
    let n = 20000usize;
    let p = heap.malloc(n);
    let q = heap.malloc(n);
    check!(!p.is_null() && !q.is_null(), "malloc returned null");
    for i in 0..n {
        // SAFETY: a live block of `n` bytes.
        unsafe { p.add(i).write_volatile(pattern::byte_at(4, i as u64)) };
    }
    let (b, mb) = mapped(&d, g)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let ops = [
        op::with_src_ptr(op::copy(b, 1000, 0, 0, n as u64), p),
        op::with_dst_ptr(op::copy(0, 0, b, 1000, n as u64), q),
    ];
    d.stream_submit(s, &ops).ctx("STREAM_SUBMIT")?;
    d.stream_sync(s, 10_000).ctx("STREAM_SYNC")?;
    let bad = wrong(&mb, 1000, n as u64, 4);
    // SAFETY: a live block of `n` bytes.
    let back = (0..n)
        .filter(|&i| unsafe { q.add(i).read_volatile() } != pattern::byte_at(4, i as u64))
        .count();
    check!(
        bad == 0 && back == 0,
        "the heap block to the mem: {bad} bytes wrong; back to another block: {back}"
    );
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    // SAFETY: the blocks, not used after.
    unsafe {
        heap.free(p);
        heap.free(q);
    }
    drop(mb);
    d.mem_free(b).ctx("free")?;
    Ok(())
}

/// Each refusal, through CE_COPY and a stream's COPY: an address with an offset of its own,
/// a side with both INDEX and PTR (its index naming a real ALLOC) and an unknown flag are
/// `EINVAL` before any lookup (the other side an address of nothing); an address of the
/// stack, of another file's mem, of a freed mem's mapping are `ENOENT`; a range past the mem's
/// end from an address inside it is `EINVAL`.
fn copy_ptr_refusals() -> TestResult {
    let (d, g) = setup()?;
    let (a, ma) = mapped(&d, g)?;
    let (b, _mb) = mapped(&d, g)?;
    let stack = 0u64;
    let nothing = std::ptr::addr_of!(stack) as u64;
    let inside = ma.as_ptr() as u64 + 100;
    let ce =
        |flags, dst: (u64, u64), src: (u64, u64), len| d.ce_copy_flags(g, flags, dst, src, len);

    expect_errno(
        ce(SRC_PTR, (b, 0), (inside, 1), 16),
        Errno::EINVAL,
        "CE_COPY: an address with an offset",
    )?;
    expect_errno(
        ce(DST_PTR | SRC_PTR, (nothing, 0), (inside, 8), 16),
        Errno::EINVAL,
        "CE_COPY: an offset beside an address, the other side an address of nothing",
    )?;
    expect_errno(
        ce(SRC_PTR | (1 << 12), (b, 0), (nothing, 0), 16),
        Errno::EINVAL,
        "CE_COPY: an unknown flag, the source an address of nothing",
    )?;
    expect_errno(
        ce(SRC_PTR, (b, 0), (nothing, 0), 16),
        Errno::ENOENT,
        "CE_COPY: an address of the stack",
    )?;
    expect_errno(
        ce(SRC_PTR, (b, 0), (inside, 0), LEN),
        Errno::EINVAL,
        "CE_COPY: from an address to past the mem's end",
    )?;

    // Another file's mem, mapped here: this file has no handle for it.
    let other = Ruvm::open().ctx("open another file")?;
    let (_o, mo) = mapped(&other, g)?;
    expect_errno(
        ce(SRC_PTR, (b, 0), (mo.as_ptr() as u64, 0), 16),
        Errno::ENOENT,
        "CE_COPY: an address of another file's mem",
    )?;

    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let submit = |o: uapi::ruvm_op| d.stream_submit(s, &[o]);
    let nowhere: *const u8 = std::ptr::addr_of!(stack).cast();
    expect_errno(
        submit(uapi::ruvm_op {
            src_offset: 4,
            ..op::with_dst_ptr(
                op::with_src_ptr(op::copy(0, 0, 0, 0, 16), ma.as_ptr()),
                nowhere,
            )
        }),
        Errno::EINVAL,
        "COPY: an address with an offset, the other side an address of nothing",
    )?;
    expect_errno(
        submit(uapi::ruvm_op {
            flags: uapi::ruvm_op_flags_RUVM_OP_DST_PTR | (1 << 12),
            ..op::with_dst_ptr(op::copy(0, 0, a, 0, 16), nowhere)
        }),
        Errno::EINVAL,
        "COPY: an unknown flag, the destination an address of nothing",
    )?;
    expect_errno(
        submit(op::with_src_ptr(
            op::copy(b, 0, 0, 0, LEN),
            ma.as_ptr().wrapping_add(100),
        )),
        Errno::EINVAL,
        "COPY: from an address to past the mem's end",
    )?;
    // The destination an ALLOC of the submission by its index (a copy that runs without the
    // PTR flag) and by an address too.
    let both = [
        op::alloc(0, 64 << 10, false),
        uapi::ruvm_op {
            flags: uapi::ruvm_op_flags_RUVM_OP_DST_INDEX | uapi::ruvm_op_flags_RUVM_OP_DST_PTR,
            ..op::with_dst_index(op::copy(0, 0, a, 0, 16), 0)
        },
    ];
    let mut ops = both;
    expect_errno(
        d.stream_submit_mut(s, &mut ops),
        Errno::EINVAL,
        "COPY: a destination by index and by address",
    )?;
    let mut ops = [both[0], op::with_dst_index(op::copy(0, 0, a, 0, 16), 0)];
    d.stream_submit_mut(s, &mut ops)
        .ctx("the same COPY by index only")?;
    let (made, _) = op::allocated(&ops[0]);
    d.stream_sync(s, 10_000).ctx("STREAM_SYNC")?;
    d.mem_free(made).ctx("free the ALLOC's mem")?;
    expect_errno(
        submit(op::with_src_ptr(op::copy(b, 0, 0, 0, 16), nowhere)),
        Errno::ENOENT,
        "COPY: an address of the stack",
    )?;
    expect_errno(
        submit(op::with_src_ptr(op::copy(b, 0, 0, 0, 16), mo.as_ptr())),
        Errno::ENOENT,
        "COPY: an address of another file's mem",
    )?;

    // A freed mem whose mapping is still there (zapped): its address names nothing.
    let stale = ma.as_ptr();
    d.mem_free(a).ctx("free")?;
    expect_errno(
        ce(SRC_PTR, (b, 0), (stale as u64, 0), 16),
        Errno::ENOENT,
        "CE_COPY: an address of a freed mem",
    )?;
    expect_errno(
        submit(op::with_src_ptr(op::copy(b, 0, 0, 0, 16), stale)),
        Errno::ENOENT,
        "COPY: an address of a freed mem",
    )?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drop(ma);
    d.mem_free(b).ctx("free")?;
    Ok(())
}
