// SPDX-License-Identifier: GPL-2.0

//! The GPU virtual-mapping commands: kernel VA mappings, a mem's GPU VA, copies through GPU
//! VAs, and the MMU's walk of one address, decoded level by level with the module's own
//! page-table format (`rust/gpu/mmu/fmt.rs`, compiled here from the module's source).

use anyhow::Result;
use libruvm::{cmd, uapi, Ruvm};
use serde::Serialize;

use super::{arg, call};
use crate::output::{Done, Report};

#[path = "../../../../rust/gpu/mmu/fmt.rs"]
#[allow(
    dead_code,
    reason = "the module's file: pt-dump uses the decoders only"
)]
mod mmu_fmt;

use mmu_fmt::{Pde, Pde0, Pte};

/// The flags of a VA space: this file's user VA space, or the GPU's kernel VA space.
fn space(user: bool) -> u32 {
    if user {
        uapi::ruvm_va_space_flags_RUVM_VA_USER
    } else {
        0
    }
}

/// `map-gpu`: the DMA table (`RUVM_IOCTL_MEM_MAP_GPU`), the kernel VA mapping (`--kernel`) or
/// a user VA mapping (`--user VA`, `RUVM_IOCTL_MEM_MAP_GPU_USER`).
pub fn map(
    d: &Ruvm,
    handle: u64,
    gpu: u32,
    kernel: bool,
    user: Option<u64>,
    read_only: bool,
) -> Result<Done> {
    if let Some(va) = user {
        let mut a = arg(|a: &mut uapi::ruvm_mem_gpu_user| {
            a.handle = handle;
            a.gpu = gpu;
            a.va = va;
            if read_only {
                a.flags = uapi::ruvm_gpu_user_flags_RUVM_GPU_USER_READ_ONLY;
            }
        });
        call(d, cmd::MEM_MAP_GPU_USER, &mut a)?;
        return Ok(Done {});
    }
    let mut a = arg(|a: &mut uapi::ruvm_mem_gpu| {
        a.handle = handle;
        a.gpu = gpu;
    });
    let c = if kernel {
        cmd::MEM_MAP_GPU_KERNEL
    } else {
        cmd::MEM_MAP_GPU
    };
    call(d, c, &mut a)?;
    Ok(Done {})
}

/// `unmap-gpu`: everything of the GPU (`RUVM_IOCTL_MEM_UNMAP_GPU`), or only the kernel VA
/// mapping (`--kernel`) or the user VA mapping (`--user`).
pub fn unmap(d: &Ruvm, handle: u64, gpu: u32, kernel: bool, user: bool) -> Result<Done> {
    let mut a = arg(|a: &mut uapi::ruvm_mem_gpu| {
        a.handle = handle;
        a.gpu = gpu;
    });
    let c = match (kernel, user) {
        (true, _) => cmd::MEM_UNMAP_GPU_KERNEL,
        (_, true) => cmd::MEM_UNMAP_GPU_USER,
        _ => cmd::MEM_UNMAP_GPU,
    };
    call(d, c, &mut a)?;
    Ok(Done {})
}

/// Where a GPU sees a mem.
#[derive(Serialize)]
pub struct GpuVa {
    handle: u64,
    gpu: u32,
    space: &'static str,
    va: u64,
    page_size: u64,
}

/// `gpu-va` (`RUVM_IOCTL_MEM_GPU_VA`).
pub fn gpu_va(d: &Ruvm, handle: u64, gpu: u32, user: bool) -> Result<GpuVa> {
    let mut a = arg(|a: &mut uapi::ruvm_mem_gpu_va| {
        a.handle = handle;
        a.gpu = gpu;
        a.flags = space(user);
    });
    call(d, cmd::MEM_GPU_VA, &mut a)?;
    Ok(GpuVa {
        handle,
        gpu,
        space: if user { "user" } else { "kernel" },
        va: a.va,
        page_size: a.page_size,
    })
}

impl Report for GpuVa {
    fn render(&self) -> String {
        format!(
            "mem {} on GPU {}: {} VA {:#x}, {} KiB pages",
            self.handle,
            self.gpu,
            self.space,
            self.va,
            self.page_size >> 10
        )
    }
}

/// `ce-copy-va` (`RUVM_IOCTL_CE_COPY_VA`).
pub fn ce_copy_va(d: &Ruvm, gpu: u32, dst: u64, src: u64, length: u64, user: bool) -> Result<Done> {
    let mut a = arg(|a: &mut uapi::ruvm_ce_copy_va| {
        a.gpu = gpu;
        a.flags = space(user);
        a.dst_va = dst;
        a.src_va = src;
        a.length = length;
    });
    call(d, cmd::CE_COPY_VA, &mut a)?;
    Ok(Done {})
}

/// One word the walk read.
#[derive(Serialize)]
pub struct WalkStep {
    level: &'static str,
    table: u64,
    aperture: &'static str,
    entry: u64,
    meaning: String,
}

/// The walk of one address.
#[derive(Serialize)]
pub struct PtDump {
    gpu: u32,
    va: u64,
    steps: Vec<WalkStep>,
    fault: String,
    page_size: u64,
    address: u64,
    aperture: &'static str,
}

fn aperture_name(a: u32) -> &'static str {
    if a == uapi::ruvm_aperture_RUVM_APERTURE_VID {
        "vidmem"
    } else {
        "sysmem"
    }
}

/// What a directory entry says.
fn pde_meaning(e: u64) -> String {
    match Pde::decode(e) {
        Some(p) => format!("table at {:#x} ({:?})", p.addr, p.aperture),
        None if e == 0 => "invalid".to_owned(),
        None => "not a PDE".to_owned(),
    }
}

/// What a PTE says.
fn pte_meaning(e: u64) -> String {
    match Pte::decode(e) {
        Some(p) => format!(
            "page at {:#x} ({:?}){}{}{}",
            p.addr,
            p.aperture,
            if p.read_only { " read-only" } else { "" },
            if p.volatile { " volatile" } else { "" },
            if p.atomic_disable { " no-atomics" } else { "" }
        ),
        None => "invalid".to_owned(),
    }
}

/// `pt-dump` (`RUVM_IOCTL_GPU_PT_WALK`): every word the MMU read for `va`, decoded.
pub fn pt_dump(d: &Ruvm, gpu: u32, va: u64, user: bool) -> Result<PtDump> {
    let mut a = arg(|a: &mut uapi::ruvm_gpu_pt_walk| {
        a.gpu = gpu;
        a.flags = space(user);
        a.va = va;
    });
    call(d, cmd::GPU_PT_WALK, &mut a)?;
    let n = (a.count as usize).min(a.entry.len());
    let mut steps = Vec::new();
    // The PDE0 entry, once both halves are read: which tables the last words come from.
    let mut pde0 = Pde0::Invalid;
    for i in 0..n {
        let e = a.entry[i];
        let (level, meaning) = match i {
            0 => ("PDE3", pde_meaning(e)),
            1 => ("PDE2", pde_meaning(e)),
            2 => ("PDE1", pde_meaning(e)),
            3 => ("PDE0 big", String::new()),
            4 => {
                pde0 = Pde0::decode([a.entry[3], e]);
                ("PDE0 small", String::new())
            }
            _ => {
                let big_first = matches!(pde0, Pde0::Dual { big: Some(_), .. }) && i == 5;
                let level = if big_first { "PTE 64K" } else { "PTE 4K" };
                (level, pte_meaning(e))
            }
        };
        steps.push(WalkStep {
            level,
            table: a.entry_addr[i],
            aperture: aperture_name(a.entry_aperture[i].into()),
            entry: e,
            meaning,
        });
    }
    // The PDE0 halves mean something only together.
    let halves = match pde0 {
        Pde0::Invalid => ["invalid".to_owned(), "invalid".to_owned()],
        Pde0::Page(p) => [
            format!("2M {}", pte_meaning(p.encode(2 << 20).unwrap_or(0))),
            "(part of the 2M page)".to_owned(),
        ],
        Pde0::Dual { big, small } => [big, small].map(|t| match t {
            Some(t) => format!("table at {:#x} ({:?})", t.addr, t.aperture),
            None => "none".to_owned(),
        }),
    };
    for (step, text) in steps.iter_mut().skip(3).take(2).zip(halves) {
        step.meaning = text;
    }
    let fault = match a.fault {
        uapi::ruvm_mmu_fault_RUVM_MMU_OK => "none",
        uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_VA_RANGE => "address outside the VA space",
        uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_PDE => "invalid PDE",
        uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_PTE => "invalid PTE",
        uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_READ_ONLY => "write to a read-only page",
        uapi::ruvm_mmu_fault_RUVM_MMU_FAULT_TABLE => "page table unreadable",
        _ => "unknown",
    };
    Ok(PtDump {
        gpu,
        va,
        steps,
        fault: fault.to_owned(),
        page_size: a.page_size,
        address: a.address,
        aperture: aperture_name(a.aperture),
    })
}

impl Report for PtDump {
    fn render(&self) -> String {
        let mut out = format!("GPU {} VA {:#x}:\n", self.gpu, self.va);
        for s in &self.steps {
            out += &format!(
                "  {:<10} @ {} {:#014x}: {:#018x}  {}\n",
                s.level, s.aperture, s.table, s.entry, s.meaning
            );
        }
        if self.page_size > 0 {
            out += &format!(
                "  -> {} {:#x} ({} KiB page)",
                self.aperture,
                self.address,
                self.page_size >> 10
            );
        } else {
            out += &format!("  -> fault: {}", self.fault);
        }
        out
    }
}
