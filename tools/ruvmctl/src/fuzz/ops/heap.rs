// SPDX-License-Identifier: GPL-2.0

//! Pinned heaps in the fuzzer: each worker process makes one heap (a mimalloc arena over a
//! sparse mem of one of its files, DMA-mapped for the simulated GPUs) and its threads
//! allocate, reallocate and free blocks of 8 bytes to 1 MiB in it, from any thread, and collect
//! now and then, while the worker's other steps race (its files closed, its children forked and
//! killed, GPUs removed). Oracles: a block holds what its writer wrote until it is freed (no
//! chunk goes back under a live block), a `calloc`'d block reads zero, `locate` finds every
//! block in an arena, and a block copied to another by a simulated GPU's engine, both named by
//! their pointers (`RUVM_OP_SRC_PTR | RUVM_OP_DST_PTR`), holds the source's bytes.

use std::sync::{Mutex, OnceLock};

use libruvm::heap::{locate, HeapConfig, PinnedHeap};
use libruvm::{uapi, Errno, Ruvm};

use super::{Rng, World};

/// The worker's heap and a descriptor of the file it was made on (whose mem its pointers
/// name; `None` once making it failed: the module has no sparse mems, or no memory), and its
/// live blocks: (address, length, seed).
static HEAP: OnceLock<Option<(PinnedHeap, Ruvm)>> = OnceLock::new();
static BLOCKS: Mutex<Vec<(usize, usize, u8)>> = Mutex::new(Vec::new());

/// The bytes of a block written with `seed`.
fn byte(seed: u8, i: usize) -> u8 {
    seed.wrapping_add((i % 251) as u8)
}

/// One heap step on file `d` of worker `w`.
pub(super) fn one(w: &World, d: &Ruvm, rng: &mut Rng) {
    let heap = HEAP.get_or_init(|| {
        let own = d.as_fd().try_clone_to_owned().ok()?;
        let file = Ruvm::from_owned_fd(own).ok()?;
        let heap = PinnedHeap::new(
            &file,
            &HeapConfig {
                gpus: w.sims.clone(),
                arena_size: 64 << 20,
            },
        )
        .ok()?;
        Some((heap, file))
    });
    let Some((heap, file)) = heap else { return };
    let mut blocks = BLOCKS.lock().unwrap_or_else(|e| e.into_inner());
    match rng.below(8) {
        0..=3 if blocks.len() < 256 && !w.over_budget(d) => {
            let n = 8 << rng.below(18);
            let zeroed = rng.one_in(3);
            let p = if zeroed {
                heap.calloc(1, n)
            } else {
                heap.malloc(n)
            };
            if p.is_null() {
                return;
            }
            if zeroed {
                // SAFETY: a live block of `n` bytes.
                let nonzero = (0..n).filter(|&i| unsafe { p.add(i).read() } != 0).count();
                if nonzero > 0 {
                    w.problem(format!(
                        "a calloc'd block of {n} bytes has {nonzero} bytes not zero"
                    ));
                }
            }
            let seed = rng.below(256) as u8;
            for i in 0..n {
                // SAFETY: as above.
                unsafe { p.add(i).write(byte(seed, i)) };
            }
            if locate(p).is_none() {
                w.problem(format!("a heap block at {p:p} is in no arena"));
            }
            blocks.push((p as usize, n, seed));
        }
        4 | 5 if !blocks.is_empty() => {
            let k = rng.below(blocks.len() as u64) as usize;
            let (p, n, seed) = blocks.swap_remove(k);
            let p = p as *mut u8;
            // SAFETY: a live block of `n` bytes, freed below.
            let bad = (0..n)
                .filter(|&i| unsafe { p.add(i).read() } != byte(seed, i))
                .count();
            if bad > 0 {
                w.problem(format!(
                    "a live heap block of {n} bytes lost {bad} of its bytes"
                ));
            }
            // SAFETY: a live block of the heap, not used after.
            unsafe { heap.free(p) };
        }
        6 if !blocks.is_empty() => {
            let k = rng.below(blocks.len() as u64) as usize;
            let (p, n, seed) = blocks[k];
            let m = 8 << rng.below(18);
            // SAFETY: a live block, replaced by the result when not null.
            let q = unsafe { heap.realloc(p as *mut u8, m) };
            if q.is_null() {
                return;
            }
            let keep = n.min(m);
            // SAFETY: a live block of at least `keep` bytes.
            let bad = (0..keep)
                .filter(|&i| unsafe { q.add(i).read() } != byte(seed, i))
                .count();
            if bad > 0 {
                w.problem(format!(
                    "realloc {n} -> {m} lost {bad} of the first {keep} bytes"
                ));
            }
            for i in 0..m {
                // SAFETY: as above, `m` bytes.
                unsafe { q.add(i).write(byte(seed, i)) };
            }
            blocks[k] = (q as usize, m, seed);
        }
        7 if blocks.len() >= 2 && !w.sims.is_empty() => {
            let (a, b) = (
                rng.below(blocks.len() as u64) as usize,
                rng.below(blocks.len() as u64) as usize,
            );
            let ((pa, na, sa), (pb, nb, _)) = (blocks[a], blocks[b]);
            if a == b || na < nb {
                return;
            }
            let g = rng.pick(&w.sims);
            let flags = uapi::ruvm_op_flags_RUVM_OP_SRC_PTR | uapi::ruvm_op_flags_RUVM_OP_DST_PTR;
            match file.ce_copy_flags(g, flags, (pb as u64, 0), (pa as u64, 0), nb as u64) {
                Ok(()) => {
                    let q = pb as *const u8;
                    // SAFETY: a live block of `nb` bytes.
                    let bad = (0..nb)
                        .filter(|&i| unsafe { q.add(i).read() } != byte(sa, i))
                        .count();
                    if bad > 0 {
                        w.problem(format!(
                            "a copy of {nb} bytes between heap blocks by their pointers: {bad} wrong"
                        ));
                    }
                    blocks[b].2 = sa;
                }
                // The GPU removed (and its DMA mappings with it), a signal, or no memory for
                // the copy's plan (the worker's memory cgroup): the block may hold part of the
                // copy, so it leaves the oracle.
                Err(
                    Errno::ENODEV | Errno::ENXIO | Errno::EINTR | Errno::ETIMEDOUT | Errno::ENOMEM,
                ) => {
                    blocks.swap_remove(b);
                    // SAFETY: a live block of the heap, not used after.
                    unsafe { heap.free(pb as *mut u8) };
                }
                Err(e) => w.problem(format!(
                    "a copy between heap blocks by their pointers failed: {e}"
                )),
            }
        }
        _ => heap.collect(),
    }
}
