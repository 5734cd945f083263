// SPDX-License-Identifier: GPL-2.0

//! A submission built at random (copies, fills, allocations, frees, records and waits,
//! some malformed) and submitted, its oracle checked.

use super::*;

/// An offset and a length inside a mem of `size` bytes, the length at most `cap`; now and then
/// a range the submission must refuse: past the end (`EINVAL`) or overflowing (`EOVERFLOW`).
///
/// Inside, both are whole words (8 bytes), so that a copy or a fill never leaves a word made
/// of two: one whose top bytes are a tag's and whose low six or seven bytes came from a random
/// fill can read as another worker's tag. Only a mem under 8 bytes gets less: at most 3 bytes,
/// which change a tag's position bits only.
pub(super) fn span(rng: &mut Rng, size: u64, cap: u64) -> (u64, u64) {
    if size == 0 || rng.one_in(10) {
        return match rng.below(4) {
            0 => (size, 1 + rng.below(4096)),
            1 => (0, size + 1 + rng.below(4096)),
            2 => (u64::MAX - rng.below(4096), 1 + rng.below(8192)),
            _ => (1 << 63, 1 << 63),
        };
    }
    let mut off = rng.below(size) & !7;
    if size - off < 8 {
        off = 0;
    }
    let room = ((size - off) & !7).min(cap & !7);
    if room == 0 {
        return (0, size.min(3));
    }
    (off, 8 * (1 + rng.below(room / 8)))
}

/// A random batch of 1 to 32 operations for stream `s` of file `d`.
pub(super) fn build(w: &World, d: &Arc<Ruvm>, s: &StreamRec, rng: &mut Rng) -> Batch {
    let mut b = Batch::default();
    let mems = w.mems_of(d, rng);
    w.prepare(d, &mems, s.gpu, rng);
    let sim = w.sims.contains(&s.gpu);
    // An edu engine moves under 4 KiB in 0.2 s: two small copies a batch at most.
    let (cap, mut copies) = if sim { (1 << 20, 32) } else { (4096, 2) };
    let mem = |rng: &mut Rng| -> (u64, u64) {
        if mems.is_empty() || rng.one_in(16) {
            (w.handle(rng), 1 << 20)
        } else {
            let (h, q) = mems[rng.below(mems.len() as u64) as usize];
            (h, q.size)
        }
    };
    // Over budget: no new memory.
    let room = !w.over_budget(d);
    for _ in 0..1 + rng.below(32) {
        match rng.below(15) {
            12 if room => {
                // From one of the worker's pools (of any of its files: ENOENT if not this
                // one's, EOPNOTSUPP if vidmem), the GPU's current pool, or no pool at all.
                let pool = match rng.below(4) {
                    0 | 1 => w.pools.lock().ok().and_then(|p| {
                        (!p.is_empty()).then(|| p[rng.below(p.len() as u64) as usize])
                    }),
                    2 => {
                        let any = rng.next();
                        Some(rng.pick(&[1, u64::MAX, any]))
                    }
                    _ => None,
                }
                .unwrap_or(0);
                let size = rng.pick(&ALLOC_SIZES);
                let mut a = op::alloc(pool, size, !rng.one_in(4));
                if rng.one_in(24) {
                    // Only RUVM_ALLOC_ZERO: EINVAL.
                    a.flags |= rng.pick(&[
                        uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK,
                        uapi::ruvm_op_flags_RUVM_OP_DST_INDEX,
                        1 << 31,
                    ]);
                }
                b.allocs.push((b.ops.len(), size));
                b.ops.push(a);
            }
            13 => {
                // A mem of the batch's (by its ALLOC's index; now and then an index that is no
                // earlier ALLOC's: EINVAL) or of the file (by handle).
                if !b.allocs.is_empty() && rng.below(3) != 0 {
                    let (i, size) = b.allocs[rng.below(b.allocs.len() as u64) as usize];
                    if !b.freed_allocs.contains(&i) {
                        b.freed_allocs.push(i);
                    }
                    b.ops.push(op::free_index(i));
                    if room && rng.one_in(3) {
                        // An ALLOC of the same right after: it takes the freed mem whole.
                        let a = b.ops[i];
                        b.allocs.push((b.ops.len(), size));
                        b.ops.push(a);
                    }
                } else if rng.one_in(8) {
                    b.ops
                        .push(op::free_index(b.ops.len() + rng.below(3) as usize));
                } else {
                    let (h, _) = mem(rng);
                    b.frees.push(h);
                    b.ops.push(op::free(h));
                }
            }
            14 if !b.allocs.is_empty() && copies > 0 => {
                // Into, or out of, a mem an earlier ALLOC of the batch makes.
                copies -= 1;
                let (i, size) = b.allocs[rng.below(b.allocs.len() as u64) as usize];
                let (other, osize) = mem(rng);
                let (off, len) = span(rng, size.min(osize), cap);
                b.used.push(other);
                let c = op::copy(other, off, other, off, len);
                b.ops.push(if rng.one_in(2) {
                    op::with_dst_index(c, i)
                } else {
                    op::with_src_index(c, i)
                });
            }
            0..=3 if copies > 0 => {
                copies -= 1;
                let ((dst, dsize), (src, ssize)) = (mem(rng), mem(rng));
                let (doff, len) = span(rng, dsize, cap);
                // The source's range is the destination's length from its own offset: moved
                // inside the source (aligned), but now and then left outside it.
                let (soff, _) = span(rng, ssize, cap);
                let soff = if soff.saturating_add(len) <= ssize || rng.one_in(4) {
                    soff
                } else {
                    ssize.saturating_sub(len) & !7
                };
                if doff.saturating_add(len) <= dsize {
                    b.dsts.push(dst);
                }
                b.used.extend([dst, src]);
                let len = if rng.one_in(32) { 0 } else { len };
                b.ops.push(op::copy(dst, doff, src, soff, len));
            }
            4 => {
                // Through the file's user VAs (a root worker never through the kernel's: see
                // `gpu_va`); an unprivileged one sometimes tries, and the submission is EPERM.
                let user = w.privileged || !rng.one_in(4);
                let src = rng.pick(&VAS) + (rng.below(16) << 12);
                let dst = rng.pick(&VAS) + (rng.below(16) << 12);
                // Whole words, as `span`'s.
                let len = if sim {
                    8 * (1 + rng.below(8 << 10))
                } else {
                    4096
                };
                b.ops.push(op::copy_va(dst, src, len, user));
            }
            5 | 6 => {
                let (dst, size) = mem(rng);
                let (off, len) = span(rng, size, 2 << 20);
                b.used.push(dst);
                let mut f = match rng.below(3) {
                    0 => op::fill_pattern(dst, off, len, w.tag),
                    1 => op::fill_pattern(dst, off, len, oracle::untagged_seed(rng.next())),
                    _ => op::fill_byte(dst, off, len, rng.next() as u8),
                };
                if rng.one_in(24) {
                    // No such kind: EINVAL.
                    f.fill_kind = 2 + rng.below(3) as u32;
                }
                b.ops.push(f);
            }
            7 | 8 => {
                let e = w.event_of(d, rng);
                b.records.push(e);
                b.ops.push(op::record(e));
            }
            9 => b.ops.push(op::wait_event(w.event_of(d, rng), wait_ms(rng))),
            _ => {
                let fd = match rng.below(8) {
                    0..=2 => w.sw_fence(rng).inspect(|_| b.sw = true),
                    3 => {
                        // Not a sync_file: the submission is EINVAL.
                        b.ops
                            .push(op::wait_raw_fd(d.as_fd().as_raw_fd(), wait_ms(rng)));
                        continue;
                    }
                    // An event of any of the worker's files.
                    4 | 5 => w.event(rng).and_then(|(f, e)| w.export(&f, e)),
                    _ => {
                        let e = w.event_of(d, rng);
                        w.export(d, e)
                    }
                };
                if let Some(fd) = fd {
                    b.ops
                        .push(op::wait_fd(std::os::fd::AsFd::as_fd(&fd), wait_ms(rng)));
                    b.fds.push(fd);
                }
            }
        }
    }
    if b.ops.is_empty() {
        b.ops.push(op::record(w.event_of(d, rng)));
    }
    b
}

/// A random batch submitted to one of the worker's streams; then now and then a mem it uses
/// freed, its points exported (to the parent too), the sw_sync timeline advanced, and a sync
/// after which the copies' destinations are read back (isolation).
pub(super) fn submit(w: &World, rng: &mut Rng) {
    let Some((d, s)) = w.stream(rng) else {
        if let Some(f) = w.file(rng) {
            w.stream_on(&f, None, rng);
        }
        return;
    };
    let mut b = build(w, &d, &s, rng);
    // The module writes each ALLOC's results into the array.
    let r = d.stream_submit_mut(s.handle, &mut b.ops);
    let Some(first) = w.check("STREAM_SUBMIT", r, SUBMIT) else {
        return;
    };
    drop(std::mem::take(&mut b.fds));
    w.submitted_mems(&d, &b);
    let last = first + b.ops.len() as u64 - 1;
    if first == 0 {
        w.problem(format!(
            "STREAM_SUBMIT to stream {} gave first_seqno 0",
            s.handle
        ));
    }
    if let Ok(q) = d.stream_query(s.handle) {
        w.check_query(&s, &q);
        if q.submitted < last {
            w.problem(format!(
                "STREAM_QUERY of stream {} after a submission up to seqno {last}: submitted {}",
                s.handle, q.submitted
            ));
        }
    }
    if let Some(&e) = b.records.last() {
        if rng.one_in(2) {
            if let Some(fd) = w.export(&d, e) {
                w.hand_over(&fd);
            }
        }
    }
    if rng.one_in(4) && !b.used.is_empty() {
        // Work queued on it holds it: its chunks stay until that work is retired.
        w.free_mem(&d, rng.pick(&b.used));
    }
    if b.sw && rng.one_in(2) {
        w.sw_advance(rng);
    }
    if rng.one_in(3) {
        let r = d.stream_sync(s.handle, sync_ms(rng));
        let synced = w.check("STREAM_SYNC", r, SYNC);
        if synced.is_some() {
            if let Ok(q) = d.stream_query(s.handle) {
                if q.completed < last {
                    w.problem(format!(
                        "STREAM_SYNC of stream {} returned 0 with seqno {last} submitted before it, but completed is {}",
                        s.handle, q.completed
                    ));
                }
            }
        }
        if synced.is_some() || rng.one_in(2) {
            for h in &b.dsts {
                w.read_check_mem(&d, *h, " (after a stream's copy into it)");
            }
        }
    }
}
