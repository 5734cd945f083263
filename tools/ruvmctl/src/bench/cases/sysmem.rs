// SPDX-License-Identifier: GPL-2.0

//! Groups 1 and 2: a big zeroed, CPU- and DMA-mapped mem against `mmap(MAP_POPULATE)` and every
//! chunk size against 2 MiB; the smallest mems and the whole user path against anonymous
//! memory, step by step.

use super::*;

/// G1: the whole life of a big zeroed, CPU-mapped, DMA-mapped mem with 2 MiB chunks against
/// `mmap(MAP_POPULATE)`, and with every other chunk size against the 2 MiB path; then each step
/// alone against the `memset` floor.
pub(super) fn g1(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let size = c.spec.max_size;
    let path = |chunk: u64| {
        time(&mut || {
            let a = c.d.mem_alloc(size, chunk, ZERO)?;
            c.d.map_kernel(a.handle)?;
            c.d.mem_gpu(true, a.handle, c.big)?;
            c.d.mem_free(a.handle)?;
            Ok(())
        })
    };
    let what = |chunk: u64| {
        format!(
            "{} sysmem, {} chunks: alloc zeroed + map kernel + map for {} + free",
            size_name(size),
            size_name(chunk),
            c.big_name
        )
    };
    let mut case = c.case(
        "g1.path.2M".into(),
        &what(2 * M),
        "mmap(MAP_POPULATE) + munmap",
        "ns",
    );
    case.size = size;
    (case.ruvm, case.base) = pairs(c.spec.reps, &mut || path(2 * M), &mut || {
        time(&mut || populate(size))
    })?;
    out(case);
    // Every other chunk size against the 2 MiB path itself, the two alternating seconds apart:
    // the host's speed drifts too much between cases minutes apart for each to be compared
    // through its own baseline.
    for chunk in chunk_sizes().filter(|&s| s != 2 * M) {
        let mut case = c.case(
            format!("g1.path.{}", size_name(chunk)),
            &what(chunk),
            "the same with 2M chunks, alternating",
            "ns",
        );
        case.size = size;
        (case.ruvm, case.base) = pairs(c.spec.reps, &mut || path(chunk), &mut || path(2 * M))?;
        out(case);
    }
    // Each step alone, 2 MiB chunks, against writing the same bytes from user space.
    let floor = Anon::new(size, true)?;
    let steps = ["alloc", "zero", "map kernel", "map GPU", "free"];
    let gpu_name = c.big_name;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); steps.len()];
    let mut base = Vec::new();
    let chunk = 2 * M;
    let step_run = || -> Result<[f64; 5]> {
        let mut t = [0f64; 5];
        let mut h = 0;
        t[0] = time(&mut || {
            h = c.d.mem_alloc(size, chunk, 0)?.handle;
            Ok(())
        })?;
        c.d.mem_free(h)?;
        let zeroed = time(&mut || {
            h = c.d.mem_alloc(size, chunk, ZERO)?.handle;
            Ok(())
        })?;
        t[1] = (zeroed - t[0]).max(0.0);
        t[2] = time(&mut || Ok(c.d.map_kernel(h)?))?;
        t[3] = time(&mut || Ok(c.d.mem_gpu(true, h, c.big)?))?;
        t[4] = time(&mut || Ok(c.d.mem_free(h)?))?;
        Ok(t)
    };
    let floor_run = || {
        time(&mut || {
            floor.memset(0);
            Ok(())
        })
    };
    step_run()?;
    floor_run()?;
    for i in 0..c.spec.reps {
        let (t, f) = if i % 2 == 0 {
            let t = step_run()?;
            (t, floor_run()?)
        } else {
            let f = floor_run()?;
            (step_run()?, f)
        };
        for (s, v) in samples.iter_mut().zip(t) {
            s.push(v);
        }
        base.push(f);
    }
    for (name, s) in steps.iter().zip(samples) {
        let mut case = c.case(
            format!("g1.step.{}", name.replace(' ', "_")),
            &format!(
                "{} of {} sysmem, 2M chunks{}",
                name,
                size_name(size),
                if *name == "map GPU" {
                    format!(" ({gpu_name})")
                } else {
                    String::new()
                }
            ),
            "memset of the same bytes, already faulted in",
            "ns",
        );
        case.size = size;
        (case.ruvm, case.base) = (s, base.clone());
        out(case);
    }
    Ok(())
}

/// G2: the smallest mems: alloc + free, and the whole user path, against anonymous memory.
pub(super) fn g2(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let n = 256;
    let mut case = c.case(
        "g2.alloc_free".into(),
        "4K sysmem alloc + free",
        "mmap 4K + touch + munmap",
        "ns",
    );
    let anon = &mut || {
        let a = Anon::new(4 * K, false)?;
        a.touch();
        Ok(())
    };
    (case.ruvm, case.base) = pairs(
        c.spec.reps,
        &mut || per_op(n, &mut || c.alloc_free(4 * K, 0, false)),
        &mut || per_op(n, anon),
    )?;
    out(case);
    let mut case = c.case(
        "g2.user_path".into(),
        "4K sysmem alloc zeroed + mmap + touch + munmap + free",
        "mmap 4K + touch + munmap",
        "ns",
    );
    let user = &mut || {
        let a = c.d.mem_alloc(4 * K, 0, ZERO)?;
        let q = uapi::ruvm_mem_query {
            physical_size: 4 * K,
            mmap_offset: a.mmap_offset,
            ..Default::default()
        };
        let m = UserMap::of_mem(c.d, &q)?;
        m.write(0, 1);
        drop(m);
        c.d.mem_free(a.handle)?;
        Ok(())
    };
    (case.ruvm, case.base) = pairs(c.spec.reps, &mut || per_op(n, user), &mut || {
        per_op(n, anon)
    })?;
    out(case);
    g2_steps(c, n, out)
}

/// G2's user path step by step (ruvm's five, then the baseline's three), each against the
/// whole baseline path: where the time goes.
pub(super) fn g2_steps(c: &Ctx, n: u64, out: &mut dyn FnMut(Case)) -> Result<()> {
    const STEPS: [&str; 8] = [
        "alloc zeroed",
        "mmap",
        "touch (fault)",
        "munmap",
        "free",
        "anon mmap",
        "anon touch (fault)",
        "anon munmap",
    ];
    let run = || -> Result<[f64; 8]> {
        let mut t = [0f64; 8];
        let mut lap = |i: usize, start: &mut std::time::Instant| {
            let now = std::time::Instant::now();
            t[i] += now.duration_since(*start).as_nanos() as f64;
            *start = now;
        };
        for _ in 0..n {
            let mut at = std::time::Instant::now();
            let a = c.d.mem_alloc(4 * K, 0, ZERO)?;
            lap(0, &mut at);
            let q = uapi::ruvm_mem_query {
                physical_size: 4 * K,
                mmap_offset: a.mmap_offset,
                ..Default::default()
            };
            let m = UserMap::of_mem(c.d, &q)?;
            lap(1, &mut at);
            m.write(0, 1);
            lap(2, &mut at);
            drop(m);
            lap(3, &mut at);
            c.d.mem_free(a.handle)?;
            lap(4, &mut at);
            let b = Anon::new(4 * K, false)?;
            lap(5, &mut at);
            b.touch();
            lap(6, &mut at);
            drop(b);
            lap(7, &mut at);
        }
        Ok(t.map(|v| v / n as f64))
    };
    run()?;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); STEPS.len()];
    let mut base = Vec::new();
    for _ in 0..c.spec.reps {
        let t = run()?;
        for (s, v) in samples.iter_mut().zip(t) {
            s.push(v);
        }
        base.push(t[5] + t[6] + t[7]);
    }
    for (name, s) in STEPS.iter().zip(samples) {
        let mut case = c.case(
            format!("g2.step.{}", name.replace([' ', '(', ')'], "_")),
            &format!("{name} of the 4K user path"),
            "the whole baseline path (anon mmap + touch + munmap)",
            "ns",
        );
        (case.ruvm, case.base) = (s, base.clone());
        out(case);
    }
    Ok(())
}
