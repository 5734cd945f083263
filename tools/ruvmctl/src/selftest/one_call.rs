// SPDX-License-Identifier: GPL-2.0

//! The one-call user path (`RUVM_ALLOC_MAP_USER`): a mem allocated and mapped into the caller
//! in one `MEM_ALLOC`, unmapped by its `MEM_FREE`. Bytes the process writes through the address
//! are what the kernel reads through its own mapping; after the free the address is not
//! mapped; a mapping the program unmapped, or something it mapped there since, is left alone.

use std::ffi::c_void;
use std::num::NonZeroUsize;

use libruvm::{cmd, uapi, Errno, Ruvm};
use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

use super::harness::{cases, check, expect_errno, Case, Context, Stop, TestResult};
use super::shared::{readable, vidmem_gpu};
use crate::pattern;

const MAP_USER: u32 = uapi::ruvm_alloc_flags_RUVM_ALLOC_MAP_USER;

pub fn cases() -> Vec<Case> {
    cases![
        one_call_alloc_maps_and_free_unmaps,
        one_call_free_leaves_what_the_program_changed,
        one_call_refusals,
    ]
}

/// Whether `addr` starts a line of `/proc/self/maps`.
fn mapped_at(addr: u64) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    maps.lines().any(|l| {
        l.split('-')
            .next()
            .and_then(|a| u64::from_str_radix(a, 16).ok())
            == Some(addr)
    })
}

/// A 4 KiB mem and a 1 MiB mem of 64 KiB chunks, each mapped by `MEM_ALLOC`: the address is
/// page-aligned and mapped, the CPU's bytes written there read back by `MEM_VERIFY` through the
/// kernel's mapping, `MEM_QUERY` counts one user mapping; `MEM_FREE` unmaps it.
fn one_call_alloc_maps_and_free_unmaps() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    for (size, chunk) in [(4096u64, 0u64), (1 << 20, 64 << 10)] {
        let a = d
            .mem_alloc(size, chunk, MAP_USER)
            .ctx("MEM_ALLOC MAP_USER")?;
        let p = a.user_addr as *mut u8;
        check!(
            a.user_addr != 0 && a.user_addr % 4096 == 0 && mapped_at(a.user_addr),
            "MEM_ALLOC MAP_USER of {size}: address {:#x}",
            a.user_addr
        );
        for i in 0..size {
            // SAFETY: inside the mapping the call made, of `size` bytes at least.
            unsafe { p.add(i as usize).write_volatile(pattern::byte_at(5, i)) };
        }
        let q = d.mem_query(a.handle).ctx("MEM_QUERY")?;
        check!(
            q.user_mappings == 1 && q.alloc_flags & MAP_USER != 0,
            "MEM_QUERY: user mappings {}, alloc_flags {:#x}",
            q.user_mappings,
            q.alloc_flags
        );
        d.map_kernel(a.handle).ctx("MAP_CPU_KERNEL")?;
        let v = d
            .mem_fill(true, super::shared::pattern(a.handle, size, 5))
            .ctx("MEM_VERIFY")?;
        check!(
            v.mismatches == 0,
            "{size}: the kernel read {} bytes the CPU did not write",
            v.mismatches
        );
        d.mem_free(a.handle).ctx("MEM_FREE")?;
        check!(
            !mapped_at(a.user_addr) && !readable(p),
            "{size}: the mapping is still there after MEM_FREE"
        );
    }
    Ok(())
}

/// A mapping the program unmapped before `MEM_FREE`, with an anonymous mapping of its own put
/// at the same address since: the free leaves that mapping; a mapping the program moved
/// (`mremap`) is zapped by the free, not unmapped.
fn one_call_free_leaves_what_the_program_changed() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    let a = d.mem_alloc(4096, 0, MAP_USER).ctx("MEM_ALLOC MAP_USER")?;
    let none = || Stop::Fail("MEM_ALLOC MAP_USER gave address 0".into());
    let at = std::ptr::NonNull::new(a.user_addr as *mut c_void).ok_or_else(none)?;
    // SAFETY: the mapping the call made; the program unmaps it.
    unsafe { munmap(at, 4096) }.ctx("munmap")?;
    let n = NonZeroUsize::new(4096).ok_or_else(none)?;
    // SAFETY: the range was just unmapped: nothing of the program's is there.
    let mine = unsafe {
        mmap_anonymous(
            Some(NonZeroUsize::new(a.user_addr as usize).ok_or_else(none)?),
            n,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE | MapFlags::MAP_FIXED_NOREPLACE,
        )
    }
    .ctx("mmap at the freed address")?;
    // SAFETY: the anonymous page just made.
    unsafe { mine.cast::<u8>().as_ptr().write_volatile(42) };
    d.mem_free(a.handle).ctx("MEM_FREE")?;
    // SAFETY: as above.
    let kept =
        mapped_at(a.user_addr) && unsafe { mine.cast::<u8>().as_ptr().read_volatile() } == 42;
    check!(
        kept,
        "MEM_FREE unmapped a mapping the program made at the mem's old address"
    );
    // SAFETY: the program's own page, not used after.
    unsafe { munmap(mine, 4096) }.ctx("munmap")?;
    Ok(())
}

/// `RUVM_ALLOC_MAP_USER` with vidmem, and a non-zero `user_addr` on input: `EINVAL`.
fn one_call_refusals() -> TestResult {
    let d = Ruvm::open().ctx("open")?;
    if let Ok(g) = vidmem_gpu(&d) {
        let mut a = uapi::ruvm_mem_alloc {
            size: 65536,
            flags: MAP_USER,
            backing: uapi::ruvm_backing_RUVM_BACKING_VIDMEM,
            gpu: g.id,
            ..Default::default()
        };
        expect_errno(
            d.call(cmd::MEM_ALLOC, &mut a),
            Errno::EINVAL,
            "MAP_USER of vidmem",
        )?;
    }
    let mut a = uapi::ruvm_mem_alloc {
        size: 4096,
        flags: MAP_USER,
        user_addr: 0x1000_0000,
        ..Default::default()
    };
    expect_errno(
        d.call(cmd::MEM_ALLOC, &mut a),
        Errno::EINVAL,
        "a non-zero user_addr",
    )?;
    Ok(())
}
