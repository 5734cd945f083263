// SPDX-License-Identifier: GPL-2.0

//! Registering memory a program has (`RUVM_IOCTL_MEM_REGISTER`), in the `heap` group of
//! `ruvmctl bench`:
//!
//! - `heap.register_64k`, `heap.register_64m`: `MEM_REGISTER` + `MEM_FREE` of a populated
//!   anonymous range of that size, against `mmap(MAP_POPULATE)` + `munmap` of the same size
//!   (goal <= 2x; CUDA's `cudaHostRegister` + `cudaHostUnregister` on an H100: 138 us for
//!   64 KiB, 5.4x the mmap pair).

use std::num::NonZeroUsize;

use anyhow::{anyhow, Result};
use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

use super::cases::Ctx;
use super::{pairs, Case};

/// One case of `size` bytes, `rounds` register/unregister pairs a sample.
pub(super) fn register(c: &Ctx, out: &mut dyn FnMut(Case)) -> Result<()> {
    let features = c.d.info()?.features;
    if features & u64::from(libruvm::uapi::RUVM_FEATURE_REGISTER) == 0 {
        return Ok(());
    }
    for (name, size, rounds) in [("64k", 64usize << 10, 200usize), ("64m", 64 << 20, 4)] {
        let len = NonZeroUsize::new(size).ok_or_else(|| anyhow!("size"))?;
        let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        let mut case = c.case(
            format!("heap.register_{name}"),
            &format!(
                "MEM_REGISTER + MEM_FREE of a populated {} range",
                super::cases::size_name(size as u64)
            ),
            "mmap(MAP_POPULATE) + munmap of the same size",
            "ns",
        );
        // SAFETY: a new private mapping where the kernel chooses, unmapped at the end.
        let region = unsafe {
            mmap_anonymous(
                None,
                len,
                rw,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_POPULATE,
            )
        }?;
        let addr = region.as_ptr() as u64;
        let r = pairs(
            c.spec.reps,
            &mut || {
                let t = std::time::Instant::now();
                for _ in 0..rounds {
                    let h = c.d.mem_register(addr, size as u64)?;
                    c.d.mem_free(h)?;
                }
                Ok(t.elapsed().as_nanos() as f64 / rounds as f64)
            },
            &mut || {
                let t = std::time::Instant::now();
                for _ in 0..rounds {
                    let flags = MapFlags::MAP_PRIVATE | MapFlags::MAP_POPULATE;
                    // SAFETY: a new private mapping where the kernel chooses.
                    let p = unsafe { mmap_anonymous(None, len, rw, flags) }?;
                    // SAFETY: the mapping just made, not used after.
                    unsafe { munmap(p, size) }?;
                }
                Ok(t.elapsed().as_nanos() as f64 / rounds as f64)
            },
        );
        // SAFETY: the region mapped above, not used after.
        unsafe { munmap(region, size) }?;
        (case.ruvm, case.base) = r?;
        out(case);
    }
    Ok(())
}
