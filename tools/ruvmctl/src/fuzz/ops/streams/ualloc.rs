// SPDX-License-Identifier: GPL-2.0

//! The fuzzer's traffic through libruvm's user-space allocator (`libruvm::alloc`): an
//! allocator over a file of its own (one or two streams on a random GPU) with random rules,
//! threshold and reserve limit; up to 48
//! random calls (blocks of 1 byte to 3 MiB on one or two streams, each filled with its own
//! byte by the engine, freed on the stream that filled it, as a program must; synchronizes;
//! trims); then, once both streams
//! are synchronized, each block's first and last bytes read through its CPU address must be
//! its own fill's (blocks never share bytes, and no free let another block's fill land in a
//! live one); dropped at the end, its segments given back.

use libruvm::{
    alloc::{Allocator, Block, Config, Reuse},
    op, Errno, Ruvm,
};

use super::{Rng, World, CREATE, SUBMIT, SYNC};

/// The lengths asked for.
const LENS: [u64; 8] = [1, 511, 4096, 5000, 65536, 1 << 20, (1 << 20) + 1, 3 << 20];
/// Bytes read back at each end of a block.
const CHECKED: u64 = 4096;

pub(super) fn ualloc(w: &World, rng: &mut Rng) {
    // A file of its own, which no other thread of the worker names: the others' operations
    // take handles of any of the worker's files, and would rightly write into, or free, the
    // segments of a file they share (a program's own threads can).
    let Some(own) = w.check(
        "open",
        Ruvm::open().map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0))),
        &[Errno::EMFILE, Errno::ENFILE],
    ) else {
        return;
    };
    let gpu = w.stream_gpu(rng);
    let mut streams = Vec::new();
    for _ in 0..1 + rng.below(2) {
        match w.check("STREAM_CREATE", own.stream_create(gpu), CREATE) {
            Some(s) => streams.push(s.handle),
            None => return,
        }
    }
    let file = &own;
    let a = Allocator::new(
        file,
        Config {
            gpus: vec![gpu],
            release_threshold: rng.pick(&[0, 1 << 20, u64::MAX]),
            reuse: Reuse {
                follow_event_dependencies: rng.one_in(2),
                allow_opportunistic: rng.one_in(2),
                allow_internal_dependencies: rng.one_in(2),
            },
            reserve_limit: rng.one_in(4).then_some(8 << 20),
        },
    );
    // Live blocks: the block, its length asked for, its fill's byte (None: not known filled),
    // the stream it was filled on.
    let mut live: Vec<(Block, u64, Option<u8>, u64)> = Vec::new();
    for _ in 0..=rng.below(48) {
        let s = streams[rng.below(streams.len() as u64) as usize];
        match rng.below(6) {
            0..=2 => {
                // At most the run's largest mem (--max-size: small on the debug kernel).
                let len = rng.pick(&LENS).min(w.max_size);
                // ENODEV: a segment's GPU mapping, the GPU being removed.
                let Some(b) = w.check("allocator alloc", a.alloc(len, s), &[Errno::ENODEV]) else {
                    continue;
                };
                let byte = rng.next() as u8;
                let fill = [op::fill_byte(b.mem(), b.offset(), len, byte)];
                let filled = w.check("allocator submit (FILL)", a.submit(s, &fill), SUBMIT);
                live.push((b, len, filled.map(|_| byte), s));
            }
            3 if !live.is_empty() => {
                let (b, _, _, on) = live.swap_remove(rng.below(live.len() as u64) as usize);
                w.check("allocator free", a.free(b, on), &[]);
                // Freed once: a second free of it is refused.
                if rng.one_in(8) && a.free(b, on) != Err(Errno::EINVAL) {
                    w.problem("allocator: a block freed twice was not refused".into());
                }
            }
            4 => {
                w.check("allocator synchronize", a.synchronize(s), SYNC);
            }
            _ => {
                w.check("allocator trim", a.trim(rng.pick(&[0, 1 << 20])), &[]);
            }
        }
    }
    let synced = streams.iter().all(|&s| a.synchronize(s).is_ok());
    let mut spans: Vec<(u64, u64, u64)> = live
        .iter()
        .map(|(b, ..)| (b.mem(), b.offset(), b.len()))
        .collect();
    spans.sort_unstable();
    if spans
        .windows(2)
        .any(|p| p[0].0 == p[1].0 && p[0].1 + p[0].2 > p[1].1)
    {
        w.problem(format!("allocator: live blocks overlap: {spans:?}"));
    }
    if synced {
        for (b, len, byte, on) in &live {
            let Some(byte) = byte else { continue };
            let ends = [0..CHECKED.min(*len), len.saturating_sub(CHECKED)..*len];
            let wrong = ends.into_iter().flatten().find(|&i| {
                // SAFETY: `i` is inside the block, whose segment stays mapped while the
                // allocator lives; both streams are synchronized, so no work writes it now.
                unsafe { b.as_ptr().add(i as usize).read_volatile() != *byte }
            });
            if let Some(i) = wrong {
                // What the kernel's own mapping holds there, and the stream's state: a fill that
                // did not run, or a user mapping that does not show the mem's pages.
                let kernel = file
                    .mem_fill(
                        true,
                        libruvm::uapi::ruvm_mem_fill {
                            handle: b.mem(),
                            offset: b.offset(),
                            length: CHECKED.min(*len),
                            seed: u64::from(*byte),
                            kind: libruvm::uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
                            ..Default::default()
                        },
                    )
                    .map(|v| v.mismatches);
                let q = file.stream_query(*on);
                w.problem(format!(
                    "allocator: byte {i} of a block of {len} (mem {}, offset {:#x}) is not its fill {byte:#x}; the kernel's mapping: {kernel:?} mismatches; stream {on}: {q:?}, known to the allocator as (submitted, completed) {:?}; {:?}",
                    b.mem(),
                    b.offset(),
                    a.known_points(*on),
                    a.stats()
                ));
            }
        }
    }
    for (b, _, _, on) in live {
        w.check("allocator free", a.free(b, on), &[]);
    }
}
