// SPDX-License-Identifier: GPL-2.0

//! libruvm's user-space stream-ordered allocator (`libruvm::alloc`) against the real device:
//! bytes the engine writes into its blocks are read through their CPU addresses and the other
//! way; blocks never overlap; a block freed on one stream and still read there is never handed
//! to another stream unordered with that read (each of CUDA's reuse rules); idle segments go
//! back to the kernel at a synchronize, and the kernel's audit sees every segment go.

use nix::errno::Errno;

use super::harness::{cases, check, expect_errno, Case, Context, Stop, TestResult};
use super::shared::live;
use std::os::fd::AsFd;

use super::streams::{setup, sim_gpus, sw_sync, M};
use crate::pattern;
use libruvm::alloc::{Allocator, Block, Config, Reuse};
use libruvm::{op, uapi, Ruvm};

pub fn cases() -> Vec<Case> {
    cases![
        ualloc_blocks_hold_engine_and_cpu_bytes,
        ualloc_cross_stream_reuse_follows_the_rules,
        ualloc_gives_back_at_synchronize_and_trim,
        ualloc_release_stream_forgets_it,
        ualloc_bad_inputs,
        ualloc_counts_each_allocation_a_hit_or_a_miss,
        ualloc_stream_in_error_stays_eio_without_a_status_page,
    ]
}

/// An allocator over `d` whose segments are DMA-mapped for GPU `g`, the rest as by default.
fn on_gpu(d: &Ruvm, g: u32) -> Allocator<'_> {
    Allocator::new(
        d,
        Config {
            gpus: vec![g],
            ..Default::default()
        },
    )
}

/// The bound of the cases' waits.
const WAIT_MS: u32 = 20_000;

/// Sizes from 1 byte to 2 MiB, about log-uniform, in a fixed order.
fn sizes(n: usize, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let shift = x % 21;
            (1u64 << shift) + x % (1 << shift)
        })
        .collect()
}

/// No two blocks share a byte.
fn disjoint(blocks: &[Block]) -> TestResult {
    let mut v: Vec<(u64, u64, u64)> = blocks
        .iter()
        .map(|b| (b.mem(), b.offset(), b.len()))
        .collect();
    v.sort_unstable();
    for w in v.windows(2) {
        let (a, b) = (w[0], w[1]);
        check!(
            a.0 != b.0 || a.1 + a.2 <= b.1,
            "blocks overlap: mem {} [{:#x}, +{:#x}) and [{:#x}, +{:#x})",
            a.0,
            a.1,
            a.2,
            b.1,
            b.2
        );
    }
    Ok(())
}

/// The bytes at a block's CPU address that differ from the pattern of `seed` (the pattern of
/// the block's offsets in its mem, as the engine's FILL writes it).
fn cpu_mismatches(b: &Block, len: u64, seed: u64) -> u64 {
    cpu_mismatches_from(b, len, seed, b.offset())
}

/// [`cpu_mismatches`] of a copy: the pattern as it was written at mem offset `from`.
fn cpu_mismatches_from(b: &Block, len: u64, seed: u64, from: u64) -> u64 {
    (0..len)
        .filter(|&i| {
            // SAFETY: `i` is inside the block, whose mapping lives as long as its allocator;
            // the engine's work on it is complete (the stream was synchronized).
            let got = unsafe { b.as_ptr().add(i as usize).read_volatile() };
            got != pattern::byte_at(seed, from + i)
        })
        .count() as u64
}

/// 32 blocks of 1 byte to 2 MiB on one stream: disjoint; the engine fills each (FILL through
/// the segment's mem), the CPU reads the pattern at the block's address; then the CPU writes
/// blocks reused after frees, the engine copies each into another block, the CPU reads the
/// copies. Every block is in a segment the kernel counts, and every segment goes at the end.
fn ualloc_blocks_hold_engine_and_cpu_bytes() -> TestResult {
    let (d, g) = setup()?;
    let before = live(&d)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    {
        let a = on_gpu(&d, g);
        let lens = sizes(32, 0x5eed);
        let mut blocks = Vec::new();
        for &l in &lens {
            blocks.push(a.alloc(l, s).ctx(&format!("alloc {l}"))?);
        }
        disjoint(&blocks)?;
        for (i, (b, &l)) in blocks.iter().zip(&lens).enumerate() {
            check!(b.len() >= l, "block {i}: {} bytes for {l}", b.len());
            a.submit(
                s,
                &[op::fill_pattern(b.mem(), b.offset(), l, 100 + i as u64)],
            )
            .ctx("submit FILL")?;
        }
        a.synchronize(s).ctx("synchronize")?;
        for (i, (b, &l)) in blocks.iter().zip(&lens).enumerate() {
            let bad = cpu_mismatches(b, l, 100 + i as u64);
            check!(
                bad == 0,
                "block {i} ({l} bytes): {bad} bytes are not the engine's"
            );
        }
        // Every other block freed and asked for again at the same size: a hit on this stream.
        let misses = a.stats().misses;
        for i in (0..blocks.len()).step_by(2) {
            a.free(blocks[i], s).ctx("free")?;
            blocks[i] = a.alloc(lens[i], s).ctx("alloc again")?;
        }
        check!(
            a.stats().misses == misses,
            "reallocations after frees needed new segments"
        );
        disjoint(&blocks)?;
        // The CPU writes the even blocks, the engine copies each into the odd one after it.
        for i in (0..blocks.len() - 1).step_by(2) {
            let (src, dst) = (blocks[i], blocks[i + 1]);
            let l = lens[i].min(lens[i + 1]);
            for o in 0..l {
                // SAFETY: inside the block; no work of the stream touches it now.
                unsafe {
                    src.as_ptr()
                        .add(o as usize)
                        .write_volatile(pattern::byte_at(7 + i as u64, dst.offset() + o))
                };
            }
            a.submit(
                s,
                &[op::copy(
                    dst.mem(),
                    dst.offset(),
                    src.mem(),
                    src.offset(),
                    l,
                )],
            )
            .ctx("submit COPY")?;
        }
        a.synchronize(s).ctx("synchronize")?;
        for i in (0..blocks.len() - 1).step_by(2) {
            let l = lens[i].min(lens[i + 1]);
            let bad = cpu_mismatches(&blocks[i + 1], l, 7 + i as u64);
            check!(
                bad == 0,
                "copy {i}: {bad} bytes differ from what the CPU wrote"
            );
        }
        let st = a.stats();
        check!(
            st.allocated_peak <= st.reserved_peak && st.requested <= st.allocated,
            "statistics disagree: {st:?}"
        );
    }
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.sync_every_stream(WAIT_MS).ctx("sync")?;
    check!(live(&d)? == before, "the allocator's segments outlived it");
    Ok(())
}

/// How stream B comes to ask for X's size in [`ualloc_cross_stream_reuse_follows_the_rules`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rule {
    /// Opportunistic reuse only: A is held, so B must get other memory.
    Opportunistic,
    /// An event recorded on A after the free, waited on by B: X, no wait inserted.
    Event,
    /// The same event recorded before the free: not X.
    EventBefore,
    /// Internal dependencies, no memory left to reserve: X behind an inserted wait.
    Internal,
}

/// Block X, filled with a pattern, is copied on stream A (GPU 0) behind a held fence, then
/// freed on A; stream B (GPU 1) asks for the same size. Per [`Rule`]: whether B gets X, with
/// how many inserted waits, and, when it does, B's write into X is held until A's copy read
/// X (B's stream is checked held while A is, and the copy holds X's bytes, not B's); once
/// both are synchronized, X is ready for a third stream with no rule.
fn ualloc_cross_stream_reuse_follows_the_rules() -> TestResult {
    let (d, _) = setup()?;
    // The streams on two GPUs: one GPU's engine runs its streams' work one at a time, which
    // would order B's write after A's copy whatever the allocator did.
    let gpus = sim_gpus(&d)?;
    let [ga, gb] = [gpus.first(), gpus.get(1)].map(|g| g.map(|g| g.id));
    let (Some(ga), Some(gb)) = (ga, gb) else {
        return Err(Stop::Skip("needs two simulated GPUs (sim_gpus=2)".into()));
    };
    let tl = sw_sync()?;
    let before = live(&d)?;
    let rules = [
        Rule::Opportunistic,
        Rule::Event,
        Rule::EventBefore,
        Rule::Internal,
    ];
    for (k, rule) in (1u32..).zip(rules) {
        let reuse = Reuse {
            follow_event_dependencies: matches!(rule, Rule::Event | Rule::EventBefore),
            allow_opportunistic: true,
            allow_internal_dependencies: rule == Rule::Internal,
        };
        let sa = d.stream_create(ga).ctx("STREAM_CREATE")?.handle;
        let sb = d.stream_create(gb).ctx("STREAM_CREATE")?.handle;
        let sc = d.stream_create(gb).ctx("STREAM_CREATE")?.handle;
        // Large blocks, each a segment of its own: no free rest of a segment to take.
        let len = 2 * M;
        {
            let a = Allocator::new(
                &d,
                Config {
                    gpus: vec![ga, gb],
                    reuse,
                    // Nothing given back at a synchronize: the reuse after one is checked.
                    release_threshold: u64::MAX,
                    // With internal dependencies, X and the copy's destination are all there is.
                    reserve_limit: (rule == Rule::Internal).then_some(2 * len),
                },
            );
            let x = a.alloc(len, sa).ctx("alloc X")?;
            let x_offset = x.offset();
            let dst = a.alloc(len, sa).ctx("alloc dst")?;
            a.submit(sa, &[op::fill_pattern(x.mem(), x.offset(), len, 41)])
                .ctx("FILL X")?;
            a.synchronize(sa).ctx("sync A")?;
            let ev = d.event_create().ctx("EVENT_CREATE")?;
            if rule == Rule::EventBefore {
                a.record_event(sa, ev).ctx("record on A, before the free")?;
            }
            // The timeline reaches k when this round releases A.
            let fence = tl.create_fence(k, "hold").ctx("CREATE_FENCE")?;
            a.submit(
                sa,
                &[
                    op::wait_fd(fence.as_fd(), WAIT_MS),
                    op::copy(dst.mem(), dst.offset(), x.mem(), x.offset(), len),
                ],
            )
            .ctx("A: wait, copy X")?;
            a.free(x, sa).ctx("free X on A")?;
            if rule == Rule::Event {
                a.record_event(sa, ev).ctx("record on A")?;
            }
            if matches!(rule, Rule::Event | Rule::EventBefore) {
                a.wait_event(sb, ev).ctx("B waits")?;
            }
            let y = a.alloc(len, sb).ctx("B allocates")?;
            let same = (y.mem(), y.offset()) == (x.mem(), x.offset());
            let waits = a.stats().waits_inserted;
            let (want_same, want_waits) = match rule {
                Rule::Opportunistic | Rule::EventBefore => (false, 0),
                Rule::Event => (true, 0),
                Rule::Internal => (true, 1),
            };
            check!(
                same == want_same && waits == want_waits,
                "{rule:?}: X {}handed to B while A's copy of it was queued, {waits} waits inserted",
                if same { "" } else { "not " }
            );
            // B overwrites what it got; A's copy must still read the pattern.
            a.submit(sb, &[op::fill_byte(y.mem(), y.offset(), len, 0xee)])
                .ctx("B writes")?;
            if same {
                // B is ordered after A's copy: held while A is.
                expect_errno(
                    d.stream_sync(sb, 200),
                    Errno::ETIMEDOUT,
                    "B's write waiting for A's copy",
                )?;
            }
            tl.inc(1).ctx("release A")?;
            a.synchronize(sa).ctx("sync A")?;
            a.synchronize(sb).ctx("sync B")?;
            let bad = cpu_mismatches_from(&dst, len, 41, x_offset);
            check!(
                bad == 0,
                "{rule:?}: A's copy read {bad} bytes that are not X's (B's writes reached it)"
            );
            // Both synchronized: B's block is ready for anyone; a third stream takes it with
            // no rule (neither a new segment nor a cross-stream take).
            a.free(y, sb).ctx("free on B")?;
            a.synchronize(sb).ctx("sync B")?;
            let st = a.stats();
            let z = a.alloc(len, sc).ctx("alloc after the syncs")?;
            let now = a.stats();
            check!(
                now.misses == st.misses && now.cross_stream == st.cross_stream,
                "{rule:?}: a synchronized free was not ready for another stream"
            );
            a.free(z, sc).ctx("free")?;
            a.free(dst, sa).ctx("free")?;
            d.event_destroy(ev).ctx("EVENT_DESTROY")?;
        }
        for s in [sa, sb, sc] {
            d.stream_destroy(s).ctx("STREAM_DESTROY")?;
        }
    }
    d.sync_every_stream(WAIT_MS).ctx("sync")?;
    check!(
        live(&d)? == before,
        "segments or streams outlived the cases"
    );
    Ok(())
}

/// With the release threshold 0, a synchronize after every block is freed leaves no segment
/// (the kernel's audit agrees); with it at the maximum, the segments stay until a trim.
fn ualloc_gives_back_at_synchronize_and_trim() -> TestResult {
    let (d, g) = setup()?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let before = live(&d)?;
    for threshold in [0, u64::MAX] {
        let a = Allocator::new(
            &d,
            Config {
                gpus: vec![g],
                release_threshold: threshold,
                ..Default::default()
            },
        );
        let blocks = sizes(40, threshold ^ 3)
            .into_iter()
            .map(|l| a.alloc(l, s))
            .collect::<Result<Vec<_>, _>>()
            .ctx("alloc")?;
        let held = live(&d)?;
        check!(held != before, "40 blocks and no new mem in the kernel");
        // Work on each, then each freed behind it: every free is the stream's until the
        // synchronize.
        for b in &blocks {
            a.submit(
                s,
                &[op::fill_byte(b.mem(), b.offset(), b.len().min(4096), 7)],
            )
            .ctx("submit FILL")?;
        }
        for b in blocks {
            a.free(b, s).ctx("free")?;
        }
        a.synchronize(s).ctx("synchronize")?;
        let st = a.stats();
        // Arenas (sparse mems) stay, holding nothing; whole segments go.
        if threshold == 0 {
            check!(
                st.reserved == 0 && holds_nothing(&live(&d)?, &before),
                "threshold 0: {} bytes in {} segments kept after a synchronize",
                st.reserved,
                st.segments
            );
        } else {
            check!(
                st.reserved > 0 && live(&d)? == held,
                "threshold max: the segments went at a synchronize"
            );
            let given = a.trim(0).ctx("trim")?;
            check!(
                given == st.reserved
                    && a.stats().reserved == 0
                    && holds_nothing(&live(&d)?, &before),
                "trim(0) gave back {given} of {} bytes",
                st.reserved
            );
        }
        drop(a);
        check!(live(&d)? == before, "the allocator's segments outlived it");
    }
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    Ok(())
}

/// Whether the audit's counts `now` hold no more memory than `before`: the same in every class
/// but the mems, their handles and user mappings (an allocator's arenas, which hold no chunk
/// while nothing is resident).
fn holds_nothing(now: &[u64], before: &[u64]) -> bool {
    let skip = [
        uapi::ruvm_audit_class_RUVM_AUDIT_MEMS,
        uapi::ruvm_audit_class_RUVM_AUDIT_HANDLES,
        uapi::ruvm_audit_class_RUVM_AUDIT_USER_MAPPINGS,
    ];
    now.len() == before.len()
        && (0..now.len()).all(|i| skip.contains(&(i as u32)) || now[i] == before[i])
}

/// A stream released through the allocator (synchronized, then forgotten) before it is
/// destroyed: its frees are anyone's at once (no new segment, no cross-stream take), and the
/// allocator keeps nothing of it or of the events last recorded on it; an event forgotten is
/// dropped too. So a program that makes and destroys streams and events keeps the allocator's
/// maps as small as what it has now.
fn ualloc_release_stream_forgets_it() -> TestResult {
    let (d, g) = setup()?;
    let a_s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let b_s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let c_s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let (ev, ev2) = (
        d.event_create().ctx("EVENT_CREATE")?,
        d.event_create().ctx("EVENT_CREATE")?,
    );
    let a = Allocator::new(
        &d,
        Config {
            gpus: vec![g],
            release_threshold: u64::MAX,
            reuse: Reuse {
                follow_event_dependencies: true,
                allow_opportunistic: false,
                allow_internal_dependencies: false,
            },
            ..Default::default()
        },
    );
    let x = a.alloc(64 << 10, a_s).ctx("alloc on A")?;
    a.submit(a_s, &[op::fill_byte(x.mem(), x.offset(), x.len(), 9)])
        .ctx("FILL on A")?;
    a.free(x, a_s).ctx("free on A")?;
    a.record_event(a_s, ev).ctx("record on A")?;
    a.wait_event(b_s, ev).ctx("B waits")?;
    // What the allocator keeps: (streams, events).
    let known = |want: (u64, u64), when: &str| -> TestResult {
        let st = a.stats();
        let got = (st.streams_known, st.events_known);
        check!(
            got == want,
            "{when}: (streams, events) known {got:?}, wanted {want:?}"
        );
        Ok(())
    };
    known((2, 1), "before the release")?;
    a.release_stream(a_s).ctx("release A")?;
    d.stream_destroy(a_s).ctx("STREAM_DESTROY")?;
    known((1, 0), "after A's release (B left)")?;
    let st = a.stats();
    // A's free, synchronized by the release, is anyone's: C takes it with no rule.
    let y = a.alloc(64 << 10, c_s).ctx("alloc on C")?;
    let now = a.stats();
    check!(
        (y.mem(), y.offset()) == (x.mem(), x.offset())
            && now.misses == st.misses
            && now.cross_stream == st.cross_stream,
        "a released stream's free was not ready for another stream: {now:?}"
    );
    a.record_event(b_s, ev2).ctx("record on B")?;
    check!(a.stats().events_known == 1, "the record on B was not noted");
    a.forget_event(ev2);
    check!(
        a.stats().events_known == 0,
        "a forgotten event is still known"
    );
    a.free(y, c_s).ctx("free on C")?;
    for s in [b_s, c_s] {
        a.release_stream(s).ctx("release")?;
        d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    }
    check!(
        a.stats().streams_known == 0,
        "every stream released, {} still known",
        a.stats().streams_known
    );
    for e in [ev, ev2] {
        d.event_destroy(e).ctx("EVENT_DESTROY")?;
    }
    Ok(())
}

/// 0 bytes, more than the largest request, a block freed twice, a block of another allocator.
fn ualloc_bad_inputs() -> TestResult {
    let (d, g) = setup()?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let a = Allocator::new(&d, Config::default());
    let b = Allocator::new(&d, Config::default());
    expect_errno(a.alloc(0, s), Errno::EINVAL, "alloc of 0 bytes")?;
    expect_errno(
        a.alloc(libruvm::alloc::MAX_REQUEST + 1, s),
        Errno::ENOMEM,
        "alloc beyond the largest request",
    )?;
    let x = a.alloc(M, s).ctx("alloc")?;
    let y = b.alloc(M, s).ctx("alloc")?;
    expect_errno(
        b.free(x, s),
        Errno::EINVAL,
        "free of another allocator's block",
    )?;
    a.free(x, s).ctx("free")?;
    expect_errno(a.free(x, s), Errno::EINVAL, "a block freed twice")?;
    b.free(y, s).ctx("free")?;
    drop((a, b));
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    Ok(())
}

/// Every allocation is one hit or one miss: the first block is a miss (the kernel made
/// memory), the same length again after its free a hit, a block whose placement makes more of
/// an arena resident a miss though a free block held its place (counted as a hit too before),
/// and the figures add up to the allocations.
fn ualloc_counts_each_allocation_a_hit_or_a_miss() -> TestResult {
    let (d, g) = setup()?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let a = on_gpu(&d, g);
    let count = |what: &str, hits: u64, misses: u64| -> TestResult {
        let st = a.stats();
        check!(
            st.hits == hits && st.misses == misses,
            "{what}: {} hits and {} misses, wanted {hits} and {misses}",
            st.hits,
            st.misses
        );
        Ok(())
    };
    let b = a.alloc(64 << 10, s).ctx("alloc")?;
    count("a first block", 0, 1)?;
    a.free(b, s).ctx("free")?;
    let b = a.alloc(64 << 10, s).ctx("alloc")?;
    count("the same length after its free", 1, 1)?;
    let big = a.alloc(8 * M, s).ctx("alloc 8 MiB")?;
    count("a block beyond what is resident", 1, 2)?;
    a.free(big, s).ctx("free")?;
    a.free(b, s).ctx("free")?;
    drop(a);
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    Ok(())
}

/// A stream in error (an MMU fault of a COPY_VA submitted through the allocator) is `EIO` at
/// every synchronize, not only the first, where the allocator learns points without the status
/// page: with `vm.max_map_count` at what the process holds once its arena is mapped, the page
/// cannot be mapped (`ENOMEM`, as under memory pressure), so the points come from
/// `STREAM_SYNC` and `STREAM_QUERY`. (Before, the second synchronize said Ok: the point was
/// known reached, the error forgotten, and a program would read blocks the failed work never
/// wrote.)
fn ualloc_stream_in_error_stays_eio_without_a_status_page() -> TestResult {
    let (d, g) = setup()?;
    super::streams::need_mmu(&d, g)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    {
        let a = on_gpu(&d, g);
        let b = a.alloc(64 << 10, s).ctx("alloc")?;
        let r = (|| -> TestResult {
            let _cap = MapCountCap::now()?;
            check!(
                libruvm::StatusPage::map(&d).is_err(),
                "the status page was mapped beyond vm.max_map_count"
            );
            let unmapped = 0x10_0000_0000 + 64 * M;
            a.submit(
                s,
                &[
                    op::copy_va(unmapped + M, unmapped, 4096, true),
                    op::fill_byte(b.mem(), b.offset(), 64 << 10, 0x5a),
                ],
            )
            .ctx("submit a faulting COPY_VA and a FILL")?;
            for what in ["the first synchronize", "a second synchronize", "a third"] {
                expect_errno(a.synchronize(s), Errno::EIO, what)?;
            }
            Ok(())
        })();
        a.free(b, s).ctx("free")?;
        r?;
    }
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    check!(
        q.error == Errno::EFAULT as u32,
        "the stream's error {}, wanted EFAULT",
        q.error
    );
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    Ok(())
}

/// `vm.max_map_count` lowered so that this process can map nothing more, put back when
/// dropped.
struct MapCountCap(String);

impl MapCountCap {
    const KNOB: &'static str = "/proc/sys/vm/max_map_count";

    fn now() -> Result<Self, Stop> {
        let fail = |e: std::io::Error| Stop::Fail(format!("vm.max_map_count: {e}"));
        let old = std::fs::read_to_string(Self::KNOB).map_err(fail)?;
        let held = std::fs::read_to_string("/proc/self/maps")
            .map_err(fail)?
            .lines()
            .count();
        // A new mapping is refused once the count is above the knob.
        std::fs::write(Self::KNOB, format!("{}", held.saturating_sub(1))).map_err(fail)?;
        Ok(Self(old))
    }
}

impl Drop for MapCountCap {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::KNOB, self.0.trim());
    }
}
