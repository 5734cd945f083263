// SPDX-License-Identifier: GPL-2.0

//! Allocation traces: what a program asks of an allocator, one call at a time, across
//! streams. Read from a text file (one event a line, `#` starts a comment) or made by one of
//! the generators of the shapes real programs have ([`Class`]).
//!
//! ```text
//! alloc ID SIZE STREAM    block ID of SIZE bytes for work on stream STREAM (0, 1, ...)
//! use ID STREAM           work on the block on STREAM (the engine copies min(4 KiB, its size) into it)
//! free ID STREAM          block ID given back, ordered on STREAM
//! record EVENT STREAM     event EVENT (0, 1, ...) recorded on STREAM
//! wait EVENT STREAM       STREAM waits for EVENT
//! sync STREAM             the program waits for STREAM's work
//! trim BYTES              memory pressure: the allocator keeps at most BYTES idle
//! mark                    the timed part begins (what comes before is a warm-up)
//! ```

use std::collections::HashMap;

use anyhow::{anyhow, bail, Result};
use serde::Serialize;

/// Streams and events a trace may name.
pub const MAX_STREAMS: u32 = 16;
pub const MAX_EVENTS: u32 = 64;
/// The largest block a trace may ask for.
pub const MAX_SIZE: u64 = 1 << 32;

/// One call of a trace (in JSON, an object whose `kind` is the text form's word).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Event {
    Alloc { id: u32, size: u64, stream: u32 },
    Use { id: u32, stream: u32 },
    Free { id: u32, stream: u32 },
    Record { event: u32, stream: u32 },
    Wait { event: u32, stream: u32 },
    Sync { stream: u32 },
    Trim { keep: u64 },
    Mark,
}

/// A checked trace: every block allocated before it is used or freed, freed once, every
/// stream and event in range.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Trace {
    pub events: Vec<Event>,
    /// Streams named (the highest index + 1).
    pub streams: u32,
    /// Allocations in its timed part (after the last `mark`; all without one).
    pub allocs: u64,
    /// The most bytes live at once (the sizes asked for).
    pub peak_live: u64,
}

impl Trace {
    /// Checks `events` and counts what a replay needs.
    pub fn new(events: Vec<Event>) -> Result<Self> {
        let mut live: HashMap<u32, u64> = HashMap::new();
        let (mut bytes, mut peak, mut allocs, mut streams) = (0u64, 0u64, 0u64, 1u32);
        for (n, e) in events.iter().enumerate() {
            let at = || format!("event {}", n + 1);
            let stream = match *e {
                Event::Alloc { id, size, stream } => {
                    if size == 0 || size > MAX_SIZE {
                        bail!("{}: size {size} is not in 1..={MAX_SIZE}", at());
                    }
                    if live.insert(id, size).is_some() {
                        bail!("{}: block {id} allocated while it is live", at());
                    }
                    bytes += size;
                    peak = peak.max(bytes);
                    allocs += 1;
                    Some(stream)
                }
                Event::Use { id, stream } => {
                    if !live.contains_key(&id) {
                        bail!("{}: block {id} used but not live", at());
                    }
                    Some(stream)
                }
                Event::Free { id, stream } => {
                    bytes -= live
                        .remove(&id)
                        .ok_or_else(|| anyhow!("{}: block {id} freed but not live", at()))?;
                    Some(stream)
                }
                Event::Record { event, stream } | Event::Wait { event, stream } => {
                    if event >= MAX_EVENTS {
                        bail!("{}: event {event} is not below {MAX_EVENTS}", at());
                    }
                    Some(stream)
                }
                Event::Sync { stream } => Some(stream),
                Event::Trim { .. } => None,
                Event::Mark => {
                    allocs = 0;
                    None
                }
            };
            if let Some(s) = stream {
                if s >= MAX_STREAMS {
                    bail!("{}: stream {s} is not below {MAX_STREAMS}", at());
                }
                streams = streams.max(s + 1);
            }
        }
        Ok(Self {
            events,
            streams,
            allocs,
            peak_live: peak,
        })
    }

    /// Reads the text form.
    pub fn parse(text: &str) -> Result<Self> {
        let mut events = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| -> Result<u64> {
                let s = w
                    .get(i)
                    .ok_or_else(|| anyhow!("line {}: '{line}' is missing a number", n + 1))?;
                crate::units::parse_size(s).map_err(|e| anyhow!("line {}: '{s}': {e}", n + 1))
            };
            let small = |i: usize| -> Result<u32> {
                u32::try_from(num(i)?).map_err(|_| anyhow!("line {}: number too large", n + 1))
            };
            let want = |k: usize| -> Result<()> {
                if w.len() != k {
                    bail!("line {}: '{line}' wants {} words", n + 1, k);
                }
                Ok(())
            };
            let e = match w[0] {
                "alloc" => {
                    want(4)?;
                    Event::Alloc {
                        id: small(1)?,
                        size: num(2)?,
                        stream: small(3)?,
                    }
                }
                "use" | "free" | "record" | "wait" => {
                    want(3)?;
                    let (a, stream) = (small(1)?, small(2)?);
                    match w[0] {
                        "use" => Event::Use { id: a, stream },
                        "free" => Event::Free { id: a, stream },
                        "record" => Event::Record { event: a, stream },
                        _ => Event::Wait { event: a, stream },
                    }
                }
                "sync" => {
                    want(2)?;
                    Event::Sync { stream: small(1)? }
                }
                "trim" => {
                    want(2)?;
                    Event::Trim { keep: num(1)? }
                }
                "mark" => {
                    want(1)?;
                    Event::Mark
                }
                other => bail!("line {}: unknown event '{other}'", n + 1),
            };
            events.push(e);
        }
        Self::new(events)
    }

    /// The text form ([`Trace::parse`] reads it back).
    pub fn dump(&self) -> String {
        let mut s = String::new();
        for e in &self.events {
            let line = match *e {
                Event::Alloc { id, size, stream } => format!("alloc {id} {size} {stream}"),
                Event::Use { id, stream } => format!("use {id} {stream}"),
                Event::Free { id, stream } => format!("free {id} {stream}"),
                Event::Record { event, stream } => format!("record {event} {stream}"),
                Event::Wait { event, stream } => format!("wait {event} {stream}"),
                Event::Sync { stream } => format!("sync {stream}"),
                Event::Trim { keep } => format!("trim {keep}"),
                Event::Mark => "mark".into(),
            };
            s.push_str(&line);
            s.push('\n');
        }
        s
    }
}

/// The shapes of the generated traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Class {
    /// 32 blocks of 64 KiB an iteration, used, freed, one sync.
    Same,
    /// 8 blocks of 1 to 16 MiB (log-uniform) an iteration, freed shuffled, one sync.
    Large,
    /// A training step: 32 blocks of 4 KiB to 4 MiB (log-uniform, new sizes each iteration),
    /// each used, freed shuffled, one sync.
    Training,
    /// Frees among the allocations: about 16 blocks live, each allocation followed by the
    /// free of a random live one; a sync every 32 allocations.
    Interleaved,
    /// Blocks freed on stream 0 and allocated on stream 1 after it waits on an event recorded
    /// after the frees, and back.
    CrossStream,
    /// The training step under memory pressure: the idle memory trimmed to nothing after
    /// every sync.
    Pressure,
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// `lo * 2^u` for u uniform in [0, `octaves`), rounded up to 4 KiB.
    fn log_uniform(&mut self, lo: u64, octaves: u32) -> u64 {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64 * f64::from(octaves);
        ((lo as f64 * u.exp2()) as u64).next_multiple_of(4096)
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// Iterations of a generated trace before its `mark`: a warm-up, as in the figures of
/// shared/ALLOCATORS.md (20 before 200).
pub const WARMUP: u32 = 5;

/// [`WARMUP`] iterations of `class`, a `mark`, then `iterations` more, from `seed`.
pub fn generate(class: Class, iterations: u32, seed: u64) -> Trace {
    let mut t = generate_plain(class, WARMUP, seed);
    let mut rest = generate_plain(class, iterations, seed.wrapping_add(1));
    // The ids of the second part follow the first's.
    let top = t
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Alloc { id, .. } => Some(*id),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    for e in &mut rest.events {
        if let Event::Alloc { id, .. } | Event::Use { id, .. } | Event::Free { id, .. } = e {
            *id += top;
        }
    }
    t.events.push(Event::Mark);
    t.events.append(&mut rest.events);
    Trace::new(t.events).unwrap_or_default()
}

fn generate_plain(class: Class, iterations: u32, seed: u64) -> Trace {
    let mut r = Rng(seed | 1);
    let mut ev = Vec::new();
    let mut next_id = 0u32;
    let mut id = || {
        next_id = next_id.wrapping_add(1);
        next_id
    };
    let step = |ev: &mut Vec<Event>, r: &mut Rng, id: &mut dyn FnMut() -> u32, sizes: &[u64]| {
        let mut ids: Vec<u32> = Vec::new();
        for &size in sizes {
            let b = id();
            ev.push(Event::Alloc {
                id: b,
                size,
                stream: 0,
            });
            ev.push(Event::Use { id: b, stream: 0 });
            ids.push(b);
        }
        r.shuffle(&mut ids);
        for b in ids {
            ev.push(Event::Free { id: b, stream: 0 });
        }
        ev.push(Event::Sync { stream: 0 });
    };
    match class {
        Class::Same => {
            for _ in 0..iterations {
                step(&mut ev, &mut r, &mut id, &[64 << 10; 32]);
            }
        }
        Class::Large => {
            for _ in 0..iterations {
                let sizes: Vec<u64> = (0..8).map(|_| r.log_uniform(1 << 20, 4)).collect();
                step(&mut ev, &mut r, &mut id, &sizes);
            }
        }
        Class::Training | Class::Pressure => {
            for _ in 0..iterations {
                let sizes: Vec<u64> = (0..32).map(|_| r.log_uniform(4 << 10, 10)).collect();
                step(&mut ev, &mut r, &mut id, &sizes);
                if class == Class::Pressure {
                    ev.push(Event::Trim { keep: 0 });
                }
            }
        }
        Class::Interleaved => {
            let mut live: Vec<u32> = Vec::new();
            for i in 0..iterations * 32 {
                let b = id();
                ev.push(Event::Alloc {
                    id: b,
                    size: r.log_uniform(4 << 10, 10),
                    stream: 0,
                });
                ev.push(Event::Use { id: b, stream: 0 });
                live.push(b);
                if live.len() > 16 {
                    let k = r.below(live.len() as u64) as usize;
                    ev.push(Event::Free {
                        id: live.swap_remove(k),
                        stream: 0,
                    });
                }
                if i % 32 == 31 {
                    ev.push(Event::Sync { stream: 0 });
                }
            }
            for b in live {
                ev.push(Event::Free { id: b, stream: 0 });
            }
            ev.push(Event::Sync { stream: 0 });
        }
        Class::CrossStream => {
            for it in 0..iterations {
                // The producer alternates: blocks freed on one stream are what the other asks
                // for next, after waiting on the event recorded behind the frees.
                let (from, to) = if it % 2 == 0 { (0, 1) } else { (1, 0) };
                let sizes: Vec<u64> = (0..16).map(|_| r.log_uniform(4 << 10, 10)).collect();
                let mut ids = Vec::new();
                for &size in &sizes {
                    let b = id();
                    ev.push(Event::Alloc {
                        id: b,
                        size,
                        stream: from,
                    });
                    ev.push(Event::Use {
                        id: b,
                        stream: from,
                    });
                    ids.push(b);
                }
                for b in ids {
                    ev.push(Event::Free {
                        id: b,
                        stream: from,
                    });
                }
                ev.push(Event::Record {
                    event: 0,
                    stream: from,
                });
                ev.push(Event::Wait {
                    event: 0,
                    stream: to,
                });
                if it % 8 == 7 {
                    ev.push(Event::Sync { stream: 0 });
                    ev.push(Event::Sync { stream: 1 });
                }
            }
            ev.push(Event::Sync { stream: 0 });
            ev.push(Event::Sync { stream: 1 });
        }
    }
    // Generated traces are well formed by construction.
    Trace::new(ev).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_is_well_formed_and_reads_back() {
        use clap::ValueEnum;
        for &c in Class::value_variants() {
            let t = generate(c, 5, 42);
            assert!(t.allocs > 0, "{c:?}");
            assert!(t.peak_live > 0, "{c:?}");
            let back = Trace::parse(&t.dump()).unwrap();
            assert_eq!(back.events, t.events, "{c:?}");
            assert_eq!(back.peak_live, t.peak_live);
        }
        assert_eq!(generate(Class::CrossStream, 2, 1).streams, 2);
    }

    #[test]
    fn training_sizes_span_4k_to_4m() {
        let t = generate(Class::Training, 50, 7);
        let sizes: Vec<u64> = t
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Alloc { size, .. } => Some(*size),
                _ => None,
            })
            .collect();
        assert!(sizes.iter().all(|&s| (4096..=4 << 20).contains(&s)));
        assert!(sizes.iter().any(|&s| s <= 16 << 10) && sizes.iter().any(|&s| s >= 1 << 20));
    }

    #[test]
    fn bad_traces_are_refused() {
        for (text, why) in [
            ("free 1 0", "freed but not live"),
            ("alloc 1 4096 0\nalloc 1 4096 0", "while it is live"),
            ("alloc 1 0 0", "size 0"),
            ("alloc 1 4096 16", "stream 16"),
            ("use 3 0", "used but not live"),
            ("record 64 0", "event 64"),
            ("sync", "wants 2 words"),
            ("mark 1", "wants 1 words"),
            ("jump 1", "unknown event"),
        ] {
            let e = Trace::parse(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
        let t = Trace::parse("# a comment\nalloc 1 4K 0 # four KiB\nfree 1 0\n").unwrap();
        assert_eq!(t.peak_live, 4096);
    }
}
