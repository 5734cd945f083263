// SPDX-License-Identifier: GPL-2.0

//! The mem commands: alloc, free, query, the kernel mapping, fill/verify/copy through it, and
//! fill/verify through a user mapping.

use anyhow::{anyhow, bail, Result};
use libruvm::{cmd, names, uapi, Ruvm, UserMap};
use serde::Serialize;

use super::{arg, call};
use crate::{
    cli::{CopyArgs, MemRange, Range},
    output::{Done, Report},
    pattern,
    units::show_size,
};

/// A mem, as `query` (and `alloc`) show it.
#[derive(Serialize)]
pub struct Mem {
    handle: u64,
    backing: String,
    size: u64,
    physical_size: u64,
    chunk_size: u64,
    chunk_count: u64,
    mmap_offset: u64,
    cpu_kernel_mapped: bool,
    cpu_user_mapped: bool,
    gpu_kernel_mapped: bool,
    gpu_kernel_va: u64,
    gpu_user_mapped: bool,
    user_mappings: u32,
    mapped_gpus: Vec<u32>,
    zeroed: bool,
    fallback: bool,
    /// Memory a process registered (`mem register`), not allocated.
    registered: bool,
    #[serde(skip)]
    note: Option<&'static str>,
}

impl Mem {
    fn of(q: &uapi::ruvm_mem_query) -> Self {
        let mapped = names::bit_names(names::MAPPED, q.mapped);
        let alloc = names::bit_names(names::ALLOC_FLAGS, q.alloc_flags.into());
        Mem {
            handle: q.handle,
            backing: if q.backing == uapi::ruvm_backing_RUVM_BACKING_VIDMEM {
                format!("vidmem of GPU {}", q.gpu)
            } else {
                "sysmem".to_owned()
            },
            size: q.size,
            physical_size: q.physical_size,
            chunk_size: q.chunk_size,
            chunk_count: q.chunk_count,
            mmap_offset: q.mmap_offset,
            cpu_kernel_mapped: mapped.iter().any(|m| m == "cpu-kernel"),
            cpu_user_mapped: mapped.iter().any(|m| m == "cpu-user"),
            gpu_kernel_mapped: mapped.iter().any(|m| m == "gpu-kernel"),
            gpu_kernel_va: q.gpu_kernel_va,
            gpu_user_mapped: mapped.iter().any(|m| m == "gpu-user"),
            user_mappings: q.user_mappings,
            mapped_gpus: (0..64)
                .filter(|b| q.mapped_gpus & (1u64 << b) != 0)
                .collect(),
            zeroed: alloc.iter().any(|f| f == "zero"),
            fallback: alloc.iter().any(|f| f == "fallback"),
            registered: alloc.iter().any(|f| f == "registered"),
            note: None,
        }
    }
}

impl Report for Mem {
    fn render(&self) -> String {
        let mut maps = Vec::new();
        if self.cpu_kernel_mapped {
            maps.push("cpu-kernel".to_owned());
        }
        for g in &self.mapped_gpus {
            maps.push(format!("gpu {g} (DMA)"));
        }
        if self.gpu_kernel_mapped {
            maps.push(format!("gpu-kernel VA {:#x}", self.gpu_kernel_va));
        }
        if self.gpu_user_mapped {
            maps.push("gpu-user VA".to_owned());
        }
        if self.cpu_user_mapped {
            maps.push(format!(
                "cpu-user ({} mapping{})",
                self.user_mappings,
                if self.user_mappings == 1 { "" } else { "s" }
            ));
        }
        let mut out = format!(
            "mem {}: {} {} bytes = {} chunks of {} (physical {}), mmap offset {:#x}\n  mapped: {}",
            self.handle,
            self.backing,
            self.size,
            self.chunk_count,
            show_size(self.chunk_size),
            self.physical_size,
            self.mmap_offset,
            if maps.is_empty() {
                "nowhere".to_owned()
            } else {
                maps.join(", ")
            }
        );
        if let Some(n) = self.note {
            out += "\n  ";
            out += n;
        }
        out
    }
}

/// `RUVM_IOCTL_MEM_QUERY`.
pub fn query_raw(d: &Ruvm, handle: u64) -> Result<uapi::ruvm_mem_query> {
    let mut q = arg(|q: &mut uapi::ruvm_mem_query| q.handle = handle);
    call(d, cmd::MEM_QUERY, &mut q)?;
    Ok(q)
}

pub fn query(d: &Ruvm, handle: u64) -> Result<Mem> {
    Ok(Mem::of(&query_raw(d, handle)?))
}

/// What `alloc` asks for.
pub struct AllocSpec {
    pub size: u64,
    pub page_size: u64,
    pub vidmem: Option<u32>,
    pub zero: bool,
    pub fallback: bool,
    /// A sparse mem.
    pub sparse: bool,
    /// The pool to take the chunks from.
    pub pool: Option<u64>,
    /// The descriptor is this command's own: the mem goes when ruvmctl exits.
    pub own_fd: bool,
}

pub fn alloc(d: &Ruvm, s: &AllocSpec) -> Result<Mem> {
    let mut a = arg(|a: &mut uapi::ruvm_mem_alloc| {
        a.size = s.size;
        a.page_size = s.page_size;
        if s.zero {
            a.flags |= uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO;
        }
        if s.fallback {
            a.flags |= uapi::ruvm_alloc_flags_RUVM_ALLOC_FALLBACK;
        }
        if s.sparse {
            a.flags |= uapi::ruvm_alloc_flags_RUVM_ALLOC_SPARSE;
        }
        if let Some(gpu) = s.vidmem {
            a.backing = uapi::ruvm_backing_RUVM_BACKING_VIDMEM;
            a.gpu = gpu;
        }
        if let Some(pool) = s.pool {
            a.pool = pool;
        }
    });
    call(d, cmd::MEM_ALLOC, &mut a)?;
    let mut m = query(d, a.handle)?;
    if s.own_fd {
        m.note = Some("(freed when ruvmctl exits: pass --fd to keep mems across commands)");
    }
    Ok(m)
}

/// What `mem populate` and `mem release` did.
#[derive(Serialize)]
pub struct Resident {
    pub handle: u64,
    pub offset: u64,
    pub length: u64,
    /// The mem's resident bytes after the call.
    pub resident: u64,
    pub physical_size: u64,
}

impl Report for Resident {
    fn render(&self) -> String {
        format!(
            "mem {}: {} of {} bytes resident",
            self.handle, self.resident, self.physical_size
        )
    }
}

/// `mem populate` (`populate`) or `mem release` of a range of a sparse mem
/// (`RUVM_IOCTL_MEM_RANGE`).
pub fn range(d: &Ruvm, r: &MemRange, populate: bool) -> Result<Resident> {
    let q = query_raw(d, r.handle)?;
    let length = match r.length {
        Some(l) => l,
        None => q.physical_size.saturating_sub(r.offset),
    };
    let op = if populate {
        uapi::ruvm_range_op_RUVM_RANGE_POPULATE
    } else {
        uapi::ruvm_range_op_RUVM_RANGE_RELEASE
    };
    let mut a = arg(|a: &mut uapi::ruvm_mem_range| {
        (a.handle, a.offset, a.length, a.op) = (r.handle, r.offset, length, op);
    });
    call(d, cmd::MEM_RANGE, &mut a)?;
    let resident = a.resident;
    Ok(Resident {
        handle: r.handle,
        offset: r.offset,
        length,
        resident,
        physical_size: q.physical_size,
    })
}

/// A command that names one mem: free, map-kernel, unmap-kernel.
pub fn handle_cmd(d: &Ruvm, c: libruvm::Cmd<uapi::ruvm_mem_handle>, handle: u64) -> Result<Done> {
    call(
        d,
        c,
        &mut arg(|a: &mut uapi::ruvm_mem_handle| a.handle = handle),
    )?;
    Ok(Done {})
}

/// The range and fill of a fill/verify command, resolved against the mem.
fn fill_args(d: &Ruvm, handle: u64, r: &Range) -> Result<uapi::ruvm_mem_fill> {
    let q = query_raw(d, handle)?;
    let length = match r.length {
        Some(l) => l,
        None => q
            .size
            .checked_sub(r.offset)
            .ok_or_else(|| anyhow!("--offset is beyond the mem's size"))?,
    };
    let (kind, seed) = match r.byte {
        Some(b) => (uapi::ruvm_fill_kind_RUVM_FILL_BYTE, b),
        None => (
            uapi::ruvm_fill_kind_RUVM_FILL_PATTERN,
            r.seed.unwrap_or(q.size),
        ),
    };
    Ok(arg(|a: &mut uapi::ruvm_mem_fill| {
        a.handle = handle;
        a.offset = r.offset;
        a.length = length;
        a.seed = seed;
        a.kind = kind;
    }))
}

/// What `verify` and `mmap-verify` found.
#[derive(Serialize)]
pub struct Verified {
    handle: u64,
    offset: u64,
    length: u64,
    mismatches: u64,
    first_mismatch: Option<u64>,
}

impl Report for Verified {
    fn render(&self) -> String {
        if self.mismatches == 0 {
            format!(
                "mem {}: {} bytes from offset {} match",
                self.handle, self.length, self.offset
            )
        } else {
            format!(
                "mem {}: {} of {} bytes differ, the first at offset {}",
                self.handle,
                self.mismatches,
                self.length,
                self.first_mismatch.unwrap_or(0)
            )
        }
    }

    fn failure(&self) -> Option<String> {
        (self.mismatches > 0).then(|| format!("{} bytes differ", self.mismatches))
    }
}

/// `fill` (`RUVM_IOCTL_MEM_FILL`) and `verify` (`RUVM_IOCTL_MEM_VERIFY`) through the kernel
/// mapping.
pub fn kernel_fill(d: &Ruvm, handle: u64, r: &Range, verify: bool) -> Result<Verified> {
    let mut a = fill_args(d, handle, r)?;
    call(
        d,
        if verify {
            cmd::MEM_VERIFY
        } else {
            cmd::MEM_FILL
        },
        &mut a,
    )?;
    Ok(Verified {
        handle,
        offset: a.offset,
        length: a.length,
        mismatches: if verify { a.mismatches } else { 0 },
        first_mismatch: (verify && a.mismatches > 0).then_some(a.first_mismatch),
    })
}

/// `mmap-fill` and `mmap-verify`: the same through a user mapping of the whole mem.
pub fn user_fill(d: &Ruvm, handle: u64, r: &Range, verify: bool) -> Result<Verified> {
    let a = fill_args(d, handle, r)?;
    let q = query_raw(d, handle)?;
    let map = UserMap::of_mem(d, &q).map_err(|e| anyhow!("mmap: {e}"))?;
    let Some(end) = a
        .offset
        .checked_add(a.length)
        .filter(|&e| e <= q.physical_size)
    else {
        bail!("range is beyond the mem");
    };
    let want = |o: u64| {
        if a.kind == uapi::ruvm_fill_kind_RUVM_FILL_BYTE {
            // CAST: the byte fill uses the seed's low 8 bits.
            a.seed as u8
        } else {
            pattern::byte_at(a.seed, o)
        }
    };
    let (mut mismatches, mut first) = (0u64, None);
    for o in a.offset..end {
        let i = usize::try_from(o)?;
        if !verify {
            map.write(i, want(o));
        } else if map.read(i) != want(o) {
            mismatches += 1;
            first.get_or_insert(o);
        }
    }
    Ok(Verified {
        handle,
        offset: a.offset,
        length: a.length,
        mismatches,
        first_mismatch: first,
    })
}

/// `copy` (`RUVM_IOCTL_MEM_COPY`).
pub fn copy(d: &Ruvm, c: &CopyArgs) -> Result<Done> {
    let mut a = arg(|a: &mut uapi::ruvm_mem_copy| {
        a.dst_handle = c.dst;
        a.dst_offset = c.dst_offset;
        a.src_handle = c.src;
        a.src_offset = c.src_offset;
        a.length = c.length;
    });
    call(d, cmd::MEM_COPY, &mut a)?;
    Ok(Done {})
}
