// SPDX-License-Identifier: GPL-2.0

//! Every bad input to the mem ioctls and to mmap, with its errno; mappings that cannot be
//! split or made executable; mmap offsets that never overlap.

use super::*;

pub(super) fn mem_alloc_bad_inputs() -> TestResult {
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

pub(super) fn mem_handle_bad_inputs() -> TestResult {
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

pub(super) fn mem_fill_bad_inputs() -> TestResult {
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

pub(super) fn mem_other_files_handles_are_enoent() -> TestResult {
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

pub(super) fn mem_mmap_bad_inputs() -> TestResult {
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

pub(super) fn mem_mapping_cannot_be_split_or_made_executable() -> TestResult {
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
pub(super) fn mem_mmap_offsets_never_overlap() -> TestResult {
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
        super::super::shared::fill(&d, q.handle, q.physical_size, *seed)?;
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
