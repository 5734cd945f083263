// SPDX-License-Identifier: GPL-2.0

//! A heap's large blocks (beyond 10 KiB: the heap's own good fit over the arena's second
//! half): packed as a program's mixed sizes come and go, kept within a quarter of the part when
//! free, given back by a collect.

use super::*;

/// Three iterations of 32 blocks of 16 KiB to 4 MiB (new sizes each), each block's ends
/// written and read back, freed in another order: blocks are 4 KiB-aligned and disjoint, the
/// resident peak stays within 1.1x the largest iteration's bytes (mimalloc's own pages held
/// 2.5x on such a trace), a reused block from calloc reads zero, the free bytes kept resident
/// are at most a quarter of the part, and a collect gives the rest back (but for one slice
/// mimalloc may keep).
pub(super) fn heap_large_blocks_pack_and_give_back() -> TestResult {
    let (d, heap) = setup(Vec::new(), 64 << 20)?;
    // Earlier heaps' arenas purged now, not during the case (the audit is the module's).
    heap.collect();
    let base = live(&d)?[BYTES];
    let first = heap.stats().reserved;
    let mut x = 0x5eed_1a26_e000_0001u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut widest = 0usize;
    for it in 0..3u64 {
        let sizes: Vec<usize> = (0..32)
            .map(|_| {
                let n = (16 * K) << (next() % 9);
                (n + (next() as usize % n) / 2).min(4 * M)
            })
            .collect();
        widest = widest.max(sizes.iter().map(|n| n.next_multiple_of(4 * K)).sum());
        let mut blocks: Vec<(*mut u8, usize)> = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let p = heap.malloc(n);
            check!(!p.is_null(), "iteration {it}: malloc({n}) returned null");
            check!(p as usize % (4 * K) == 0, "a large block at {p:?}");
            let seed = it * 100 + i as u64;
            write(p, 4 * K, seed);
            // SAFETY: the block's last 4 KiB.
            write(unsafe { p.add(n - 4 * K) }, 4 * K, seed + 50);
            blocks.push((p, n));
        }
        let mut spans: Vec<(usize, usize)> = blocks.iter().map(|&(p, n)| (p as usize, n)).collect();
        spans.sort_unstable();
        check!(
            spans.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0),
            "iteration {it}: blocks overlap"
        );
        for (i, &(p, n)) in blocks.iter().enumerate() {
            let seed = it * 100 + i as u64;
            // SAFETY: as above.
            let bad = mismatches(p, 4 * K, seed)
                + mismatches(unsafe { p.add(n - 4 * K) }, 4 * K, seed + 50);
            check!(
                bad == 0,
                "iteration {it}: block {i} of {n} bytes: {bad} bytes changed"
            );
        }
        while !blocks.is_empty() {
            let (p, _) = blocks.swap_remove(next() as usize % blocks.len());
            // SAFETY: a live block, not used after.
            unsafe { heap.free(p) };
        }
    }
    let s = heap.stats();
    let room = (s.reserved_peak - first) as f64 / widest as f64;
    println!(
        "# large blocks: resident peak {} over {first} at the start, the widest iteration {widest} bytes: {room:.3}x",
        s.reserved_peak
    );
    check!(
        (s.reserved_peak - first) * 10 <= widest as u64 * 11,
        "the resident peak is {room:.3}x the widest iteration's bytes"
    );
    let kept = s.reserved - first;
    check!(
        kept <= (64 << 20) / 4,
        "{kept} free bytes kept resident, beyond a quarter of the 64 MiB part"
    );
    let p = heap.calloc(1, 3 * M);
    check!(!p.is_null(), "calloc of 3 MiB returned null");
    // SAFETY: a live block of 3 MiB.
    let nonzero = (0..3 * M)
        .step_by(512)
        .filter(|&j| unsafe { p.add(j).read() } != 0)
        .count();
    check!(
        nonzero == 0,
        "{nonzero} sampled bytes of a reused calloc'ed block are not zero"
    );
    // SAFETY: as above.
    unsafe { heap.free(p) };
    heap.collect();
    let after = heap.stats();
    // mimalloc may keep one slice of its own (the bound: one slice a heap).
    check!(
        after.reserved <= first + 64 * K as u64,
        "after freeing everything and collecting: {} bytes resident, {first} at the start",
        after.reserved
    );
    audit_agrees(&d, &heap, base, first)
}
