// SPDX-License-Identifier: GPL-2.0

//! Device steps run beside the workers: edu devices unbound and bound again, host GPUs
//! attached for a moment, simulated GPUs removed and added, unload attempts.

use super::*;

/// What [`unbind_rebind`] did.
pub enum Unbound {
    /// No edu GPU to unbind.
    Nothing,
    /// Unbound and bound again.
    Rebound,
    /// Unbound, attached as a host GPU for a moment, detached, bound again.
    Attached,
}

/// One of the edu devices bound to ruvm-edu (its PCI address), if any.
pub fn edu_device(rng: &mut Rng) -> Option<String> {
    const DRIVER: &str = "/sys/bus/pci/drivers/ruvm-edu";
    let devices: Vec<String> = std::fs::read_dir(DRIVER)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("0000:"))
        .collect();
    (!devices.is_empty()).then(|| devices[rng.below(devices.len() as u64) as usize].clone())
}

/// The GPU id of the present GPU at PCI address `dev`.
pub fn gpu_of_pci(d: &Ruvm, dev: &str) -> Option<u32> {
    let (dom, bus, devfn) = crate::cmd::gpu::parse_pci(dev).ok()?;
    d.gpus().ok()?.iter().find_map(|g| {
        (g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
            && (g.pci_domain, g.pci_bus, g.pci_devfn) == (dom, bus, devfn))
            .then_some(g.id)
    })
}

/// Unbinds the edu GPU `dev` ([`edu_device`]) and binds it again (from the parent); half the
/// time it is attached as a host GPU in between, while the workers run, and ruvm-edu must
/// refuse to bind it then.
pub fn unbind_rebind(dev: Option<&str>, rng: &mut Rng, shared: &'static Shared) -> Unbound {
    const DRIVER: &str = "/sys/bus/pci/drivers/ruvm-edu";
    let Some(dev) = dev else {
        return Unbound::Nothing;
    };
    let problem = |what: String| {
        println!("fuzz: PROBLEM: {what}");
        shared.problems.fetch_add(1, Ordering::Relaxed);
    };
    let unbound = std::fs::write(format!("{DRIVER}/unbind"), dev);
    let mut did = Unbound::Rebound;
    if unbound.is_ok() && rng.one_in(2) {
        did = Unbound::Attached;
        attach_for_a_moment(rng, dev, &problem);
    }
    let bound = std::fs::write(format!("{DRIVER}/bind"), dev);
    if let Err(e) = unbound.and(bound) {
        problem(format!("unbind/bind of {dev}: {e}"));
    }
    did
}

/// Attaches the unbound edu device `dev` as a host GPU, checks that ruvm-edu cannot bind it
/// meanwhile, and detaches it.
pub(super) fn attach_for_a_moment(rng: &mut Rng, dev: &str, problem: &dyn Fn(String)) {
    const DRIVER: &str = "/sys/bus/pci/drivers/ruvm-edu";
    let (Ok(d), Ok((dom, bus, devfn))) = (Ruvm::open(), crate::cmd::gpu::parse_pci(dev)) else {
        problem(format!("cannot open /dev/ruvm or parse {dev}"));
        return;
    };
    match d.gpu_attach(true, dom, bus, devfn) {
        Ok(_) => {}
        Err(ENOMEM) => return,
        Err(e) => return problem(format!("GPU_ATTACH of the unbound edu device {dev}: {e}")),
    }
    std::thread::sleep(std::time::Duration::from_millis(rng.below(50)));
    match std::fs::write(format!("{DRIVER}/bind"), dev) {
        Err(e) if e.raw_os_error() == Some(EEXIST as i32) => {}
        r => problem(format!(
            "binding ruvm-edu to {dev}, attached as a host GPU: {r:?}"
        )),
    }
    if let Err(e) = d.gpu_attach(false, dom, bus, devfn) {
        problem(format!("GPU_DETACH of {dev}: {e}"));
    }
}

/// The simulated GPUs present.
pub fn sims(d: &Ruvm) -> Vec<u32> {
    d.gpus()
        .unwrap_or_default()
        .iter()
        .filter(|g| {
            g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM
                && g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
        })
        .map(|g| g.id)
        .collect()
}

/// Removes simulated GPU `g` ([`sims`]; `RUVM_IOCTL_TEST_SIM_GPU`, from the parent) while the
/// workers use it, and brings it back: the removal must finish within `bound` (the liveness
/// oracle). Its time, or `None` if it could not be removed.
pub fn sim_remove_add(
    d: &Ruvm,
    g: u32,
    rng: &mut Rng,
    shared: &'static Shared,
    bound: std::time::Duration,
) -> Option<std::time::Duration> {
    let problem = |what: String| {
        println!("fuzz: PROBLEM: {what}");
        shared.problems.fetch_add(1, Ordering::Relaxed);
    };
    let (removed, took) = oracle::timed(|| d.test_sim_gpu(g, false));
    if let Err(e) = removed {
        problem(format!("TEST_SIM_GPU remove of GPU {g}: {e}"));
        return None;
    }
    if took > bound {
        problem(format!(
            "the removal of simulated GPU {g} took {:.1} s with the workers running",
            took.as_secs_f64()
        ));
    }
    std::thread::sleep(std::time::Duration::from_millis(rng.below(100)));
    if let Err(e) = d.test_sim_gpu(g, true) {
        problem(format!("TEST_SIM_GPU add of GPU {g}: {e}"));
    }
    Some(took)
}

/// Tries to unload the module while files are open: it must refuse.
pub fn unload_attempt(shared: &'static Shared) {
    match nix::kmod::delete_module(c"ruvm", nix::kmod::DeleteModuleFlags::O_NONBLOCK) {
        Err(EBUSY | EAGAIN) => {}
        r => {
            println!("fuzz: PROBLEM: unloading ruvm with files open: {r:?}");
            shared.problems.fetch_add(1, Ordering::Relaxed);
        }
    }
}
