// SPDX-License-Identifier: GPL-2.0

//! Freed mems, another file's, a forked child's.

use super::*;

// --- freed, another file's, a child's ----------------------------------------------------------

/// A mem freed (MEM_FREE) while mapped: its mapping still exists (zapped: a read faults) and
/// answers FREED with handle 0, the rest as before but the GPUs (its DMA tables went with the
/// free); once unmapped, not ruvm memory. A pool's mem keeps answering its pool (its chunks
/// are the pool's until the mapping lets go of them).
pub(super) fn ptr_freed_mem_is_flagged() -> TestResult {
    let d = setup()?;
    let (q, g) = mapped_mem(&d, 20 * K + 3, 4 * K)?;
    let base = g.base();
    // SAFETY: byte 10 of the mem's mapping, live.
    unsafe { g.at(10).write_volatile(42) };
    d.mem_free(q.handle).ctx("MEM_FREE")?;
    check!(
        !readable(g.at(10)),
        "a freed mem's mapping is still readable"
    );
    let freed =
        |q: &uapi::ruvm_mem_query, base: u64, offset: u64, pool: u64| uapi::ruvm_ptr_attrs {
            handle: 0,
            ptr_flags: FREED,
            pool,
            mapped_gpus: 0,
            ..mem_byte(q, base, offset)
        };
    for offset in [0, 10, q.size - 1, q.physical_size - 1] {
        expect(
            &d,
            base + offset,
            &freed(&q, base, offset, 0),
            &format!("byte {offset} of a freed mem's mapping"),
        )?;
    }
    expect(
        &d,
        base + q.physical_size,
        &none(base + q.physical_size),
        "the byte after a freed mem's mapping",
    )?;
    drop(g);
    expect(&d, base, &none(base), "a freed mem's mapping once unmapped")?;

    // A pool's mem, mapped for a GPU (when there is one) through the pool's access set.
    let (p, _) = d.pool_create(0, u64::MAX).ctx("POOL_CREATE")?;
    let ids = gpus(&d)?;
    if let Some(&gpu) = ids.first() {
        d.pool_access(p, gpu, true).ctx("POOL_SET_ACCESS")?;
    }
    let a = d.pool_alloc(p, 16 * K, 0).ctx("MEM_ALLOC from the pool")?;
    let q = d.mem_query(a.handle).ctx("MEM_QUERY")?;
    let g = Guarded::new(&d, &q)?;
    let base = g.base();
    expect(
        &d,
        base + 8,
        &uapi::ruvm_ptr_attrs {
            pool: p,
            ..mem_byte(&q, base, 8)
        },
        "a pool mem's mapping",
    )?;
    d.mem_free(a.handle).ctx("MEM_FREE of the pool mem")?;
    expect(
        &d,
        base + 8,
        &freed(&q, base, 8, p),
        "a freed pool mem's mapping",
    )?;
    // Still held: the pool cannot go.
    expect_errno(
        d.pool_destroy(p),
        Errno::EBUSY,
        "POOL_DESTROY while a freed mem's mapping holds its chunks",
    )?;
    drop(g);
    d.pool_destroy(p).ctx("POOL_DESTROY")
}

/// The same mapping looked up through another open file of the device: OTHER_FILE, handle 0,
/// every other field the same (also when that file has a mem at the same mmap offset); and a
/// freed mem's mapping answers FREED (alone) through either file.
pub(super) fn ptr_other_file_has_no_handle() -> TestResult {
    let d = setup()?;
    let other = Ruvm::open().ctx("open a second file")?;
    // The other file's own mem, of the same size: the first of each file may share an offset.
    let theirs = other
        .mem_alloc(64 * K, 0, 0)
        .ctx("MEM_ALLOC in the second file")?;
    let (q, g) = mapped_mem(&d, 64 * K, 0)?;
    let base = g.base();
    println!(
        "# this file's mem at mmap offset {:#x}, the other file's at {:#x}",
        q.mmap_offset, theirs.mmap_offset
    );
    let mine = mem_byte(&q, base, 33);
    expect(&d, base + 33, &mine, "a mapping through its own file")?;
    let seen = uapi::ruvm_ptr_attrs {
        handle: 0,
        ptr_flags: OTHER_FILE,
        ..mine
    };
    expect(
        &other,
        base + 33,
        &seen,
        "the same mapping through another file",
    )?;
    // The other way round: the other file's mem mapped through it, looked up through this one.
    let qt = other
        .mem_query(theirs.handle)
        .ctx("MEM_QUERY in the second file")?;
    let gt = Guarded::new(&other, &qt)?;
    let bt = gt.base();
    expect(
        &other,
        bt,
        &mem_byte(&qt, bt, 0),
        "the second file's mapping through it",
    )?;
    expect(
        &d,
        bt,
        &uapi::ruvm_ptr_attrs {
            handle: 0,
            ptr_flags: OTHER_FILE,
            ..mem_byte(&qt, bt, 0)
        },
        "the second file's mapping through the first",
    )?;
    // Freed: FREED through both files, never with OTHER_FILE.
    d.mem_free(q.handle).ctx("MEM_FREE")?;
    let freed = uapi::ruvm_ptr_attrs {
        handle: 0,
        ptr_flags: FREED,
        mapped_gpus: 0,
        ..mine
    };
    expect(
        &d,
        base + 33,
        &freed,
        "a freed mem's mapping through its file",
    )?;
    expect(
        &other,
        base + 33,
        &freed,
        "a freed mem's mapping through another file",
    )?;
    drop((g, gt));
    other
        .mem_free(theirs.handle)
        .ctx("MEM_FREE in the second file")
}

/// A child forked after the file was opened: the parent's mapping is not in the child (never
/// copied: its address is not ruvm memory there); a mapping the child makes through the
/// inherited file answers the mem's handle (the file is the same), and through a file the child
/// opens, OTHER_FILE.
pub(super) fn ptr_forked_child_maps_through_the_inherited_file() -> TestResult {
    let d = setup()?;
    let (q, g) = mapped_mem(&d, 32 * K, 0)?;
    let parent_base = g.base();
    let status = in_child(|| {
        // Exit codes from 10 name the step that failed.
        let answer = |dev: &Ruvm, addr: u64| dev.ptr_attrs(addr).ok();
        let as_wanted = |got: Option<uapi::ruvm_ptr_attrs>, want: &uapi::ruvm_ptr_attrs| {
            got.is_some_and(|a| named(&a) == named(want))
        };
        if !as_wanted(answer(&d, parent_base), &none(parent_base)) {
            return 10;
        }
        let Ok(map) = UserMap::of_mem(&d, &q) else {
            return 11;
        };
        let base = map.as_ptr() as u64;
        if !as_wanted(answer(&d, base + 9), &mem_byte(&q, base, 9)) {
            return 12;
        }
        let Ok(own) = Ruvm::open() else {
            return 13;
        };
        let other = uapi::ruvm_ptr_attrs {
            handle: 0,
            ptr_flags: OTHER_FILE,
            ..mem_byte(&q, base, 9)
        };
        if !as_wanted(answer(&own, base + 9), &other) {
            return 14;
        }
        0
    })?;
    let why = match status {
        WaitStatus::Exited(_, 0) => None,
        WaitStatus::Exited(_, 10) => Some("the parent's mapping is ruvm memory in the child"),
        WaitStatus::Exited(_, 11) => Some("mmap in the child through the inherited file failed"),
        WaitStatus::Exited(_, 12) => {
            Some("the child's mapping through the inherited file did not answer the mem's handle")
        }
        WaitStatus::Exited(_, 13) => Some("the child could not open the device"),
        WaitStatus::Exited(_, 14) => {
            Some("the child's mapping through a file it opened did not answer OTHER_FILE")
        }
        _ => Some("the child ended otherwise"),
    };
    if let Some(why) = why {
        return Err(Stop::Fail(format!("{why} ({status:?})")));
    }
    expect(
        &d,
        parent_base + 9,
        &mem_byte(&q, parent_base, 9),
        "the parent's mapping after the child",
    )?;
    drop(g);
    d.mem_free(q.handle).ctx("MEM_FREE")
}
