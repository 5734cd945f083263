// SPDX-License-Identifier: GPL-2.0

//! Registered memory in the fuzzer (`RUVM_IOCTL_MEM_REGISTER`): a worker maps regions of its
//! own (anonymous, some read-only, some with a hole), writes its tag into them, registers them
//! (well formed and not, twice, overlapping) and unmaps them while its other threads copy,
//! fill, map for GPUs and free the same mems (a registration's handle joins the worker's
//! handles). An unmapping revokes a registration with work possibly queued on it. The
//! isolation oracle reads each region through `/proc/self/mem` (a region unmapped meanwhile
//! reads nothing): no word may carry another worker's tag, as the engine and the kernel write
//! only the worker's own tag or untagged patterns into its mems. Each call names the errnos
//! ruvm.rst allows.

use std::num::NonZeroUsize;

use libruvm::{cmd, uapi, Errno, Ruvm};
use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

use super::{oracle, Rng, World};
use crate::cmd::arg;

use Errno::*;

const PAGE: u64 = 4096;
/// Regions a worker keeps mapped at most (each up to 32 pages).
const MAX_REGIONS: usize = 16;

/// One registration step on file `d` of worker `w`.
pub(super) fn one(w: &World, d: &Ruvm, rng: &mut Rng) {
    match rng.below(10) {
        0..=3 => make(w, d, rng),
        4 | 5 => register_again(w, d, rng),
        6 => unmap(w, rng),
        7 => malformed(w, d, rng),
        _ => read_back(w, rng),
    }
}

/// A new region of the worker's, tagged, then registered (read-only at times, with a hole at
/// times); its handle joins the worker's.
fn make(w: &World, d: &Ruvm, rng: &mut Rng) {
    let full = w
        .regions
        .lock()
        .map(|r| r.len() >= MAX_REGIONS)
        .unwrap_or(true);
    if full {
        unmap(w, rng);
        return;
    }
    let pages = 1 + rng.below(32);
    let len = pages * PAGE;
    let Some(nz) = NonZeroUsize::new(len as usize) else {
        return;
    };
    let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    // SAFETY: a new private mapping where the kernel chooses: it aliases nothing.
    let Ok(p) = (unsafe { mmap_anonymous(None, nz, rw, MapFlags::MAP_PRIVATE) }) else {
        return;
    };
    let addr = p.as_ptr() as u64;
    let base = oracle::tag(w.id);
    for i in 0..len / 8 {
        // SAFETY: inside the writable mapping just made.
        unsafe {
            p.as_ptr()
                .cast::<u64>()
                .add(i as usize)
                .write_volatile(base + i)
        };
    }
    // A read-only mapping cannot be registered (EACCES).
    let read_only = rng.one_in(8);
    if read_only {
        // SAFETY: the mapping just made, still this step's alone.
        let _ = unsafe { nix::sys::mman::mprotect(p, len as usize, ProtFlags::PROT_READ) };
    }
    let hole = pages > 2 && rng.one_in(8);
    if hole {
        let at = addr + PAGE * (1 + rng.below(pages - 2));
        if let Some(q) = std::ptr::NonNull::new(at as usize as *mut std::ffi::c_void) {
            // SAFETY: one page of the mapping just made.
            let _ = unsafe { munmap(q, PAGE as usize) };
        }
    }
    if let Ok(mut r) = w.regions.lock() {
        r.push((addr, len));
    }
    let r = d.mem_register(addr, len);
    // EEXIST too: another thread may unmap this region (it is listed before it is
    // registered) while a third maps a new one at the same place and registers it, and a
    // registration of the old range that pins after that holds the new one's pages (what
    // the range maps when it is pinned, as documented), so this one overlaps it.
    let allowed: &[Errno] = match (hole, read_only) {
        (true, _) => &[EFAULT, EACCES, EEXIST],
        (false, true) => &[EACCES, EEXIST],
        (false, false) => &[EFAULT, EINTR, ENOSPC, EEXIST],
    };
    if let Some(h) = w.check("MEM_REGISTER", r, allowed) {
        if hole || read_only {
            w.problem(format!(
                "MEM_REGISTER of a range with a hole ({hole}) or read-only ({read_only}) made mem {h}"
            ));
        }
        if let Ok(mut hs) = w.handles.lock() {
            hs.push(h);
        }
    }
}

/// A region of the worker's registered again, whole or in part: `EEXIST` while its first
/// registration lives, else a new one (or `EFAULT`, unmapped meanwhile).
fn register_again(w: &World, d: &Ruvm, rng: &mut Rng) {
    let Some((addr, len)) = region(w, rng) else {
        make(w, d, rng);
        return;
    };
    let pages = len / PAGE;
    let first = rng.below(pages);
    let n = 1 + rng.below(pages - first);
    let r = d.mem_register(addr + first * PAGE, n * PAGE);
    if let Some(h) = w.check(
        "MEM_REGISTER (again)",
        r,
        &[EEXIST, EFAULT, EACCES, ENOSPC, EINTR],
    ) {
        if let Ok(mut hs) = w.handles.lock() {
            hs.push(h);
        }
    }
}

/// Unmaps one of the worker's regions (whose registrations the kernel then revokes, maybe
/// under a copy another thread queued).
fn unmap(w: &World, rng: &mut Rng) {
    let taken = w.regions.lock().ok().and_then(|mut r| {
        (!r.is_empty()).then(|| {
            let i = rng.below(r.len() as u64) as usize;
            r.swap_remove(i)
        })
    });
    if let Some((addr, len)) = taken {
        if let Some(p) = std::ptr::NonNull::new(addr as usize as *mut std::ffi::c_void) {
            // SAFETY: a region this worker mapped and no longer lists: nothing of the
            // worker's reads it after this but through `/proc/self/mem`.
            let _ = unsafe { munmap(p, len as usize) };
        }
    }
}

/// Bad arguments: unaligned, empty, wrapping, unknown flags, non-zero pad or reserved.
fn malformed(w: &World, d: &Ruvm, rng: &mut Rng) {
    let (addr, len) = region(w, rng).unwrap_or((PAGE, PAGE));
    let mut a = arg(|a: &mut uapi::ruvm_mem_register| {
        (a.addr, a.size) = (addr, len);
        match rng.below(6) {
            0 => a.addr += 1 + rng.below(PAGE - 1),
            1 => a.size = 0,
            2 => a.size += 1 + rng.below(PAGE - 1),
            3 => a.addr = u64::MAX - PAGE + 1,
            4 => a.flags = 1 << rng.below(32),
            _ => {
                if rng.one_in(2) {
                    a.pad = 1
                } else {
                    a.reserved[rng.below(2) as usize] = 1
                }
            }
        }
    });
    let r = d.call(cmd::MEM_REGISTER, &mut a);
    if r.is_ok() {
        w.problem(format!(
            "MEM_REGISTER took a malformed request (addr {:#x} size {} flags {:#x} pad {} reserved {:?})",
            a.addr, a.size, a.flags, a.pad, a.reserved
        ));
    } else {
        w.check("MEM_REGISTER (malformed)", r, &[EINVAL, EOVERFLOW]);
    }
}

/// The isolation oracle over one region of the worker's.
fn read_back(w: &World, rng: &mut Rng) {
    use std::os::unix::fs::FileExt;
    let Some((addr, len)) = region(w, rng) else {
        return;
    };
    let Some(f) = &w.proc_mem else { return };
    let mut bytes = vec![0u8; len as usize];
    if f.read_at(&mut bytes, addr).is_err() {
        return;
    }
    // A copy may have moved the worker's words (its id survives a move), never another's.
    let foreign = oracle::foreign(&bytes, w.id);
    if let Some((o, id)) = foreign {
        w.problem(format!(
            "registered region {addr:#x} of worker {} holds worker {id:#x}'s tag at offset {o:#x}: another file's bytes",
            w.id
        ));
    }
}

/// One of the worker's regions.
fn region(w: &World, rng: &mut Rng) -> Option<(u64, u64)> {
    let r = w.regions.lock().ok()?;
    (!r.is_empty()).then(|| r[rng.below(r.len() as u64) as usize])
}
