// SPDX-License-Identifier: GPL-2.0

//! `ptr`: what an address is (`RUVM_IOCTL_PTR_ATTRS`, cudaPointerGetAttributes). An address
//! means something in the calling process only, so besides looking one up, `ptr --alloc`
//! makes a mem, maps it into ruvmctl, looks up a byte of the mapping, and frees it.

use anyhow::{anyhow, bail, Context as _, Result};
use libruvm::{cmd, names, uapi, Ruvm, UserMap};
use serde::Serialize;

use super::{arg, call};
use crate::{
    output::{fields, Report},
    units::show_size,
};

/// The attributes of one address, as `ptr` shows them.
#[derive(Serialize)]
pub struct Ptr {
    pub addr: u64,
    /// `none` (not ruvm memory) or `mem` (`enum ruvm_ptr_type`).
    #[serde(rename = "type")]
    pub kind: String,
    /// The mem's handle in this file (0: another file's, or freed: see `flags`).
    pub handle: u64,
    /// The byte of the mem the address is.
    pub offset: u64,
    /// The address of the mem's first byte in this mapping.
    pub base: u64,
    pub size: u64,
    pub physical_size: u64,
    pub chunk_size: u64,
    /// The pool its chunks came from (0: none).
    pub pool: u64,
    /// The GPUs it is DMA-mapped for.
    pub mapped_gpus: Vec<u32>,
    /// `sysmem` (what a user mapping is of); absent for an address that is not ruvm memory.
    pub backing: Option<String>,
    /// `other-file`, `freed` (`enum ruvm_ptr_flags`).
    pub flags: Vec<String>,
    #[serde(skip)]
    note: Option<String>,
}

impl Ptr {
    fn of(a: &uapi::ruvm_ptr_attrs) -> Self {
        let mem = a.type_ == uapi::ruvm_ptr_type_RUVM_PTR_MEM;
        Ptr {
            addr: a.addr,
            kind: names::value_name(names::PTR_TYPES, a.type_.into()),
            handle: a.handle,
            offset: a.offset,
            base: a.base,
            size: a.size,
            physical_size: a.physical_size,
            chunk_size: a.chunk_size,
            pool: a.pool,
            mapped_gpus: (0..64)
                .filter(|b| a.mapped_gpus & (1u64 << b) != 0)
                .collect(),
            backing: mem.then(|| {
                if a.backing == uapi::ruvm_backing_RUVM_BACKING_VIDMEM {
                    "vidmem".to_owned()
                } else {
                    "sysmem".to_owned()
                }
            }),
            flags: names::bit_names(names::PTR_FLAGS, a.ptr_flags.into()),
            note: None,
        }
    }
}

impl Report for Ptr {
    fn render(&self) -> String {
        let mut s = if self.kind != "mem" {
            let kind = if self.kind == "none" {
                "not ruvm memory".to_owned()
            } else {
                // A type this ruvmctl does not know: say what the module said.
                format!("type {}", self.kind)
            };
            format!("{:#x}: {kind}", self.addr)
        } else {
            let handle = match self.handle {
                0 if self.flags.iter().any(|f| f == "freed") => "none (freed)".to_owned(),
                0 if self.flags.iter().any(|f| f == "other-file") => {
                    "none (a mem of another open file)".to_owned()
                }
                0 => "none".to_owned(),
                h => h.to_string(),
            };
            let gpus = if self.mapped_gpus.is_empty() {
                "none".to_owned()
            } else {
                self.mapped_gpus
                    .iter()
                    .map(|g| format!("GPU {g}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            fields([
                ("address", format!("{:#x}", self.addr)),
                ("mem", handle),
                (
                    "offset",
                    format!(
                        "{} of {} bytes (physical {})",
                        self.offset, self.size, self.physical_size
                    ),
                ),
                ("base", format!("{:#x}", self.base)),
                ("chunk size", show_size(self.chunk_size)),
                (
                    "pool",
                    if self.pool == 0 {
                        "none".to_owned()
                    } else {
                        self.pool.to_string()
                    },
                ),
                ("DMA-mapped for", gpus),
                ("backing", self.backing.clone().unwrap_or_default()),
                (
                    "flags",
                    if self.flags.is_empty() {
                        "none".to_owned()
                    } else {
                        self.flags.join(", ")
                    },
                ),
            ])
        };
        if let Some(n) = &self.note {
            s.push('\n');
            s.push_str(n);
        }
        s
    }
}

/// `RUVM_IOCTL_PTR_ATTRS` of `addr`.
pub fn lookup_raw(d: &Ruvm, addr: u64) -> Result<uapi::ruvm_ptr_attrs> {
    let mut a = arg(|a: &mut uapi::ruvm_ptr_attrs| a.addr = addr);
    call(d, cmd::PTR_ATTRS, &mut a)?;
    Ok(a)
}

/// `ptr ADDR`: what `addr` of ruvmctl's own process is.
pub fn lookup(d: &Ruvm, addr: u64) -> Result<Ptr> {
    Ok(Ptr::of(&lookup_raw(d, addr)?))
}

/// What `ptr --alloc` makes and looks up.
pub struct AllocSpec {
    pub size: u64,
    /// The pool to take the chunks from.
    pub pool: Option<u64>,
    /// The GPU to DMA-map the mem for.
    pub gpu: Option<u32>,
    /// The byte of the mapping to look up.
    pub at: u64,
}

/// Frees a mem when dropped (after its mapping, which is declared after it).
struct Freed<'a>(&'a Ruvm, u64);

impl Drop for Freed<'_> {
    fn drop(&mut self) {
        let _ = self.0.mem_free(self.1);
    }
}

/// `ptr --alloc SIZE`: a mem allocated (from the pool, mapped for the GPU), mapped into this
/// process, the byte at `at` of the mapping looked up, then the mapping and the mem gone.
pub fn alloc_and_look(d: &Ruvm, s: &AllocSpec) -> Result<Ptr> {
    let a = match s.pool {
        Some(p) => d.pool_alloc(p, s.size, 0),
        None => d.mem_alloc(s.size, 0, 0),
    }
    .context(cmd::MEM_ALLOC.name)?;
    let _freed = Freed(d, a.handle);
    if let Some(g) = s.gpu {
        d.mem_gpu(true, a.handle, g)
            .context(cmd::MEM_MAP_GPU.name)?;
    }
    let q = d.mem_query(a.handle).context(cmd::MEM_QUERY.name)?;
    if s.at >= q.physical_size {
        bail!(
            "--at {} is past the mapping of the mem ({} bytes)",
            s.at,
            q.physical_size
        );
    }
    let map = UserMap::of_mem(d, &q).map_err(|e| anyhow!("mmap: {e}"))?;
    let addr = (map.as_ptr() as u64)
        .checked_add(s.at)
        .ok_or_else(|| anyhow!("--at {} overflows the address", s.at))?;
    let mut p = lookup(d, addr)?;
    p.note = Some(format!(
        "(mem {} of {} bytes was allocated, mapped at {:#x}, and freed again)",
        a.handle,
        s.size,
        map.as_ptr() as u64
    ));
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_that_is_not_ruvm_memory_says_so() {
        let a = uapi::ruvm_ptr_attrs {
            addr: 0x1000,
            ..Default::default()
        };
        let p = Ptr::of(&a);
        assert_eq!(p.kind, "none");
        assert_eq!(p.backing, None);
        assert_eq!(p.render(), "0x1000: not ruvm memory");
        let json = serde_json::to_value(&p).expect("serializes");
        assert_eq!(json["type"], "none");
        assert!(json["backing"].is_null());
    }

    #[test]
    fn a_freed_mem_of_a_pool_shows_its_flags_and_gpus() {
        let a = uapi::ruvm_ptr_attrs {
            addr: 0x7f00_0000_1000,
            type_: uapi::ruvm_ptr_type_RUVM_PTR_MEM,
            offset: 0x1000,
            base: 0x7f00_0000_0000,
            size: 65536,
            physical_size: 65536,
            chunk_size: 65536,
            pool: 3,
            mapped_gpus: 0b101,
            ptr_flags: uapi::ruvm_ptr_flags_RUVM_PTR_FREED,
            ..Default::default()
        };
        let p = Ptr::of(&a);
        assert_eq!(p.kind, "mem");
        assert_eq!(p.mapped_gpus, vec![0, 2]);
        assert_eq!(p.flags, vec!["freed"]);
        assert_eq!(p.backing.as_deref(), Some("sysmem"));
        let text = p.render();
        assert!(text.contains("none (freed)"), "{text}");
        assert!(text.contains("GPU 0, GPU 2"), "{text}");
        assert!(text.contains("4096 of 65536 bytes"), "{text}");
    }
}
