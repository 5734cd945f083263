// SPDX-License-Identifier: GPL-2.0

//! Sparse mems in the fuzzer: a worker makes sparse mems (of any chunk size the module takes)
//! and populates and releases their ranges, well formed and not, while its other steps copy,
//! fill, map, free and unmap the same mems. A populated range is filled with the worker's tag
//! (through the chunks: a sparse mem has no kernel mapping) and read back through a user
//! mapping of its own: the isolation oracle must find no other worker's tag, in chunks made
//! again after a release as in any. Each call names the errnos ruvm.rst allows.

use libruvm::{cmd, uapi, Errno, Ruvm};

use super::{oracle, Rng, World};
use crate::cmd::arg;

use Errno::*;

const SPARSE: u32 = uapi::ruvm_alloc_flags_RUVM_ALLOC_SPARSE;

/// One sparse-mem step on file `d` of worker `w`.
pub(super) fn one(w: &World, d: &Ruvm, rng: &mut Rng) {
    if rng.one_in(4) {
        make(w, d, rng);
        return;
    }
    // Any handle of the worker's: a mem that is not sparse must say so.
    let h = w.handle(rng);
    let (chunk, size) = match d.mem_query(h) {
        Ok(q) => (q.chunk_size.max(1), q.physical_size),
        Err(_) => (4096, 1 << 20),
    };
    let chunks = size / chunk;
    let (offset, length) = if rng.one_in(8) {
        // Anything: unaligned, empty, past the end, overflowing.
        let (o, l) = super::range(rng);
        (o, l)
    } else {
        let first = rng.below(chunks + 1);
        let n = 1 + rng.below((chunks - first.min(chunks)).max(1));
        (first * chunk, n * chunk)
    };
    let op = match rng.below(16) {
        0 => rng.pick(&[0, 3, u32::MAX]),
        1..=8 => uapi::ruvm_range_op_RUVM_RANGE_POPULATE,
        _ => uapi::ruvm_range_op_RUVM_RANGE_RELEASE,
    };
    let mut a = arg(|a: &mut uapi::ruvm_mem_range| {
        (a.handle, a.offset, a.length, a.op) = (h, offset, length, op);
        if rng.one_in(32) {
            a.flags = 1 << rng.below(32);
        }
    });
    let r = d.call(cmd::MEM_RANGE, &mut a);
    let allowed = [
        ENOENT, EOPNOTSUPP, EINVAL, EOVERFLOW, EBUSY, ENOSPC, ENOMEM, EINTR, ENODEV, EAGAIN,
    ];
    if w.check("MEM_RANGE", r, &allowed).is_none() {
        return;
    }
    if a.resident > size {
        w.problem(format!(
            "MEM_RANGE of mem {h}: {} bytes resident of {size}",
            a.resident
        ));
    }
    if op == uapi::ruvm_range_op_RUVM_RANGE_POPULATE {
        if rng.one_in(2) {
            // What a populate gives is zero: read before the tag goes in.
            read_range(w, d, h, offset, length.min(1 << 20));
        }
        tag(w, d, h, offset, length.min(4 << 20));
        if rng.one_in(2) {
            read_range(w, d, h, offset, length.min(1 << 20));
        }
    }
}

/// A new sparse mem of the worker's, within its budget.
fn make(w: &World, d: &Ruvm, rng: &mut Rng) {
    if w.over_budget(d) {
        w.give_back(d, rng);
        return;
    }
    let chunk = rng.pick(&[4096, 65536, 2 << 20, 12345]);
    let count = 1 + rng.below(if chunk == 2 << 20 { 8 } else { 64 });
    let mut flags = SPARSE;
    if rng.one_in(8) {
        flags |= uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK;
    }
    let r = d.mem_alloc(count.saturating_mul(chunk), chunk, flags);
    if let Some(a) = w.check("MEM_ALLOC (sparse)", r, &[EINVAL, ENOSPC, ENOMEM]) {
        if let Ok(mut hs) = w.handles.lock() {
            hs.push(a.handle);
        }
    }
}

/// Fills `[offset, offset + length)` of mem `h` with the worker's tag (through its chunks);
/// another step may have released or freed it meanwhile.
fn tag(w: &World, d: &Ruvm, h: u64, offset: u64, length: u64) {
    let f = arg(|f: &mut uapi::ruvm_mem_fill| {
        (f.handle, f.offset, f.length) = (h, offset, length);
        f.seed = w.tag;
        f.kind = uapi::ruvm_fill_kind_RUVM_FILL_PATTERN;
    });
    let _ = d.mem_fill(false, f);
}

/// The isolation oracle over `[offset, offset + length)` of mem `h` (of file `d`), read through
/// a user mapping of its own: no word may carry another worker's tag. A range released or
/// freed meanwhile faults, and says nothing.
fn read_range(w: &World, d: &Ruvm, h: u64, offset: u64, length: u64) {
    use nix::sys::mman::{MapFlags, ProtFlags};
    use std::os::unix::fs::FileExt;
    let Some(f) = &w.proc_mem else { return };
    let Ok(q) = d.mem_query(h) else { return };
    let Ok(size) = usize::try_from(q.physical_size) else {
        return;
    };
    let end = offset.saturating_add(length).min(q.physical_size);
    if offset >= end {
        return;
    }
    let Ok(m) = libruvm::UserMap::new(
        d,
        q.mmap_offset,
        size,
        ProtFlags::PROT_READ,
        MapFlags::MAP_SHARED,
    ) else {
        return;
    };
    let mut bytes = vec![0u8; (end - offset) as usize];
    if f.read_at(&mut bytes, m.as_ptr() as u64 + offset).is_err() {
        return;
    }
    let foreign = bytes.chunks_exact(8).enumerate().find_map(|(i, c)| {
        let o = offset + (i * 8) as u64;
        let word = u64::from_le_bytes(c.try_into().ok()?);
        oracle::tag_id(word, o)
            .filter(|&id| id != w.id)
            .map(|id| (o, id))
    });
    if let Some((o, id)) = foreign {
        w.problem(format!(
            "sparse mem {h} (of worker {}) holds worker {id:#x}'s tag at offset {o:#x} after MEM_RANGE populated it: another file's bytes",
            w.id
        ));
    }
}
