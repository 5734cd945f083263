// SPDX-License-Identifier: GPL-2.0

//! The module-load sweep: the module loaded again with each failable allocation of its load
//! failing in turn.

use std::fs;

use super::*;

/// The parameters the module was loaded with, to load it again the same way: the guest's init
/// exports them (7.2's Rust modules have no parameter files in sysfs).
fn current_params() -> Result<String, Stop> {
    std::env::var("RUVM_MODARGS")
        .map_err(|_| Stop::Skip("RUVM_MODARGS unknown (the test guest's init sets it)".into()))
}

/// Loading the module with each failable allocation of the load failing in turn (the
/// kernel's module loader, ruvm's init, the edu probes, the simulated GPUs): every failed load
/// must unwind completely (kmemleak, which the runner scans at the end, and the audit of the
/// final unload see to that). Needs the module file (`/ruvm/ruvm.ko` in the guest) and no other
/// open file of `/dev/ruvm`.
/// Which of the sweep's loads this run makes (`RUVM_FAULT_SWEEP_SHARD=K/N`: the `n`th site is
/// failed for every `n` with `n - 1 = K mod N`, so that N guests share the sweep; unset: 0/1,
/// every site).
fn sweep_shard() -> Result<(u32, u32), Stop> {
    let Ok(v) = std::env::var("RUVM_FAULT_SWEEP_SHARD") else {
        return Ok((0, 1));
    };
    let parsed = v
        .split_once('/')
        .and_then(|(k, n)| Some((k.parse::<u32>().ok()?, n.parse::<u32>().ok()?)))
        .filter(|&(k, n)| n > 0 && n <= 64 && k < n);
    parsed.ok_or_else(|| {
        Stop::Fail(format!(
            "RUVM_FAULT_SWEEP_SHARD={v}: wanted K/N with K < N <= 64"
        ))
    })
}

pub(super) fn fault_sweep_module_load() -> TestResult {
    if std::env::var_os("RUVM_FAULT_SWEEP_LOAD").is_none() {
        return Err(Stop::Skip(
            "runs alone: RUVM_FAULT_SWEEP_LOAD=1 (it unloads and reloads the module)".into(),
        ));
    }
    let inj = Injector::new()?;
    let params = current_params()?;
    if fs::metadata(std::env::var("RUVM_KO").unwrap_or_else(|_| "/ruvm/ruvm.ko".into())).is_err() {
        return Err(Stop::Skip("no ruvm.ko to load".into()));
    }
    let (shard, shards) = sweep_shard()?;
    let st = dev::unload_with_verdict().map_err(Stop::Fail)?;
    check!(
        st.state & u64::from(uapi::ruvm_unload_state_bits_RUVM_UNLOAD_LEAKED) == 0,
        "the module leaked before the sweep began"
    );
    let mut failed = 0u32;
    for n in (1 + shard..=5000u32).step_by(shards as usize) {
        // Progress for the runner's watch of a silent guest: one line every 8 loads.
        if n % 8 == 0 {
            println!("# fault sweep: load {n}, {failed} failed so far");
        }
        let (r, reached) = inj.with_nth(n, || dev::load_module(&params))?;
        let loaded = fs::metadata("/sys/module/ruvm").is_ok();
        match r {
            Ok(()) => {
                check!(loaded, "load {n} succeeded but the module is not there");
                if !reached {
                    println!(
                        "# fault sweep, sites failed one at a time: module load: {failed} (shard {shard}/{shards})"
                    );
                    return Ok(());
                }
                // The failure was absorbed: unload and go on.
                let st = dev::unload_with_verdict().map_err(Stop::Fail)?;
                check!(
                    st.state & u64::from(uapi::ruvm_unload_state_bits_RUVM_UNLOAD_LEAKED) == 0,
                    "load {n} (a failure absorbed) leaked by its unload"
                );
            }
            Err(e) => {
                check!(!loaded, "load {n} failed ({e}) but the module stayed");
                failed += 1;
            }
        }
    }
    Err(Stop::Fail(
        "the module load still fails after 5000 sites".into(),
    ))
}
