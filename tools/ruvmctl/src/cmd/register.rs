// SPDX-License-Identifier: GPL-2.0

//! `mem register` and `mem unregister`: memory a process already has made a mem
//! (`RUVM_IOCTL_MEM_REGISTER`, cudaHostRegister), and ended again.
//!
//! An address means something in ruvmctl's own process only, and a registration ends with the
//! process at the latest, so `mem register` runs a whole registration in one command: it maps
//! memory of its own (anonymous, or a file's pages with --file), registers it, shows what the
//! kernel pinned (`VmPin`), with --gpu has the GPU's copy engine read the bytes it wrote there,
//! and ends it (`MEM_FREE`, or with --unmap by unmapping the range, which revokes it).

use std::{
    num::NonZeroUsize,
    os::fd::AsFd,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use libruvm::{uapi, Errno, Ruvm, UserMap};
use nix::sys::mman::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};
use serde::Serialize;

use crate::{output::Report, pattern, units::show_size};

/// What `mem register` did.
#[derive(Serialize)]
pub struct Registration {
    handle: u64,
    addr: u64,
    size: u64,
    file: Option<String>,
    /// This process's `VmPin` (KiB) before, while registered and after the end.
    vm_pin_kib_before: u64,
    vm_pin_kib_registered: u64,
    vm_pin_kib_after: u64,
    /// With --gpu: bytes the copy engine read that differ from what ruvmctl wrote.
    engine_mismatches: Option<u64>,
    /// "unregister" (MEM_FREE) or "munmap" (revoked by the kernel).
    ended_by: &'static str,
}

impl Report for Registration {
    fn render(&self) -> String {
        let mut s = format!(
            "registered {} at {:#x}{} as mem {}: VmPin {} -> {} KiB",
            show_size(self.size),
            self.addr,
            self.file
                .as_ref()
                .map_or(String::new(), |f| format!(" (pages of {f})")),
            self.handle,
            self.vm_pin_kib_before,
            self.vm_pin_kib_registered
        );
        if let Some(m) = self.engine_mismatches {
            s.push_str(&format!(
                "\ncopy engine read the program's bytes: {m} wrong"
            ));
        }
        s.push_str(&format!(
            "\nended by {}: VmPin {} KiB",
            self.ended_by, self.vm_pin_kib_after
        ));
        s
    }
}

/// This process's `VmPin`, in KiB.
fn vm_pin_kib() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status").context("/proc/self/status")?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no VmPin in /proc/self/status"))
}

/// What `mem register` is asked.
pub struct RegisterArgs {
    pub size: u64,
    pub file: Option<PathBuf>,
    pub gpu: Option<u32>,
    pub unmap: bool,
}

/// `mem register`.
pub fn register(d: &Ruvm, a: &RegisterArgs) -> Result<Registration> {
    let len = usize::try_from(a.size).context("size")?;
    let nz = NonZeroUsize::new(len).ok_or_else(|| anyhow!("a registration of 0 bytes"))?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096);
    if a.size % page != 0 {
        bail!(
            "a registration is of whole pages: {} is not a multiple of {page}",
            a.size
        );
    }
    // Registered pages are writable: devices write them.
    let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    let file = match &a.file {
        None => None,
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .with_context(|| format!("open {}", p.display()))?,
        ),
    };
    if let Some(f) = &file {
        let flen = f.metadata().context("the file's size")?.len();
        if flen < a.size {
            bail!(
                "the file has {flen} bytes, fewer than the {} to register",
                a.size
            );
        }
    }
    // SAFETY: a new mapping where the kernel chooses: it aliases nothing of this process.
    let ptr = unsafe {
        match &file {
            None => mmap_anonymous(None, nz, prot, MapFlags::MAP_PRIVATE),
            Some(f) => mmap(None, nz, prot, MapFlags::MAP_SHARED, f.as_fd(), 0),
        }
    }
    .context("mmap")?;
    let base = ptr.as_ptr().cast::<u8>();
    let unmap = || {
        // SAFETY: the mapping made above, not used after.
        unsafe { munmap(ptr, len) }.context("munmap")
    };
    // The program's bytes: a pattern (a file's pages keep what they hold).
    if file.is_none() {
        for i in 0..len {
            // SAFETY: inside the writable mapping made above.
            unsafe { base.add(i).write_volatile(pattern::byte_at(1, i as u64)) };
        }
    }
    let before = vm_pin_kib()?;
    let addr = base as u64;
    let handle = match d.mem_register(addr, a.size) {
        Ok(h) => h,
        Err(e) => {
            unmap()?;
            bail!("MEM_REGISTER of {} at {addr:#x}: {e}", show_size(a.size));
        }
    };
    let registered = vm_pin_kib()?;
    let engine_mismatches = match a.gpu {
        None => None,
        Some(g) => {
            let r = engine_reads(d, g, handle, a.size, base);
            if r.is_err() {
                let _ = d.mem_free(handle);
                unmap()?;
            }
            Some(r?)
        }
    };
    let ended_by = if a.unmap {
        unmap()?;
        // The handle goes first, the pins once the revocation has dropped the mem.
        let start = Instant::now();
        while d.mem_query(handle).err() != Some(Errno::ENOENT) || vm_pin_kib()? != before {
            if start.elapsed() > Duration::from_secs(5) {
                bail!("mem {handle} still registered (or pinned) 5 s after its range was unmapped");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        "munmap"
    } else {
        d.mem_free(handle).context("MEM_FREE (unregister)")?;
        unmap()?;
        "unregister"
    };
    let r = Registration {
        handle,
        addr,
        size: a.size,
        file: a.file.as_ref().map(|p| p.display().to_string()),
        vm_pin_kib_before: before,
        vm_pin_kib_registered: registered,
        vm_pin_kib_after: vm_pin_kib()?,
        engine_mismatches,
        ended_by,
    };
    if r.engine_mismatches.is_some_and(|m| m != 0) || r.vm_pin_kib_after != before {
        return Err(anyhow!("{}", r.render()));
    }
    Ok(r)
}

/// GPU `g`'s copy engine copies the registration into a mem of its own; the bytes that differ
/// from the program's at `base`.
fn engine_reads(d: &Ruvm, g: u32, handle: u64, size: u64, base: *const u8) -> Result<u64> {
    d.mem_gpu(true, handle, g)
        .context("MEM_MAP_GPU of the registration")?;
    let m = d.mem_alloc(size, 0, 0).context("MEM_ALLOC")?;
    let r = (|| -> Result<u64> {
        d.mem_gpu(true, m.handle, g).context("MEM_MAP_GPU")?;
        d.ce_copy(g, m.handle, 0, handle, 0, size)
            .context("CE_COPY")?;
        let q = d.mem_query(m.handle).context("MEM_QUERY")?;
        let map = UserMap::of_mem(d, &q).context("mmap of the copy")?;
        Ok((0..size as usize)
            // SAFETY: `base` maps `size` readable bytes while registered.
            .filter(|&i| map.read(i) != unsafe { base.add(i).read_volatile() })
            .count() as u64)
    })();
    let _ = d.mem_free(m.handle);
    r
}

/// `mem unregister`: `MEM_FREE` of a registered mem of the file (refused for any other mem,
/// which `free` frees).
pub fn unregister(d: &Ruvm, handle: u64) -> Result<crate::output::Done> {
    let q = d.mem_query(handle).context("MEM_QUERY")?;
    if q.alloc_flags & uapi::ruvm_alloc_flags_RUVM_ALLOC_REGISTERED == 0 {
        bail!("mem {handle} is not a registration (free it with `free`)");
    }
    d.mem_free(handle).context("MEM_FREE")?;
    Ok(crate::output::Done {})
}
