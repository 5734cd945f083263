// SPDX-License-Identifier: GPL-2.0

//! The GPU commands: the registry, DMA tables and addresses, copy-engine copies, and the
//! vidmem managers (PMMs).

use anyhow::Result;
use libruvm::{cmd, names, pci_name, uapi, Ruvm};
use serde::Serialize;

use super::{arg, call, mem::query_raw};
use crate::{
    cli::CopyArgs,
    output::{table, Done, Report},
    units::show_size,
};

/// One GPU, as `gpus` shows it.
#[derive(Serialize)]
pub struct Gpu {
    id: u32,
    kind: &'static str,
    present: bool,
    name: String,
    vendor: String,
    device: String,
    dma_mask_bits: u32,
    page_sizes: Vec<String>,
    copy_engine: bool,
    mmu: bool,
    dma_mapped_bytes: u64,
    vidmem_size: u64,
    flags: Vec<String>,
}

/// Every GPU of the registry.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Gpus(Vec<Gpu>);

/// The registry (`RUVM_IOCTL_GPU_LIST`).
pub fn list_raw(d: &Ruvm) -> Result<Vec<uapi::ruvm_gpu_info>> {
    let mut v = vec![uapi::ruvm_gpu_info::default(); uapi::RUVM_MAX_GPUS as usize];
    let mut a = arg(|a: &mut uapi::ruvm_gpu_list| {
        a.count = uapi::RUVM_MAX_GPUS;
        a.gpus = v.as_mut_ptr() as u64;
    });
    call(d, cmd::GPU_LIST, &mut a)?;
    v.truncate(usize::try_from(a.count)?);
    Ok(v)
}

pub fn gpus(d: &Ruvm) -> Result<Gpus> {
    let flag = |g: &uapi::ruvm_gpu_info, f: u32| g.flags & f != 0;
    Ok(Gpus(
        list_raw(d)?
            .iter()
            .map(|g| Gpu {
                id: g.id,
                kind: match g.kind {
                    uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU => "edu (test GPU)",
                    uapi::ruvm_gpu_kind_RUVM_GPU_KIND_HOST => "host GPU (DMA mapping only)",
                    uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM => "simulated GPU",
                    _ => "unknown",
                },
                present: flag(g, uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT),
                // The device's name in the kernel (sysfs): its PCI address, or a simulated
                // GPU's faux device.
                name: if g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_SIM {
                    format!("ruvm-sim{}", g.pci_devfn)
                } else {
                    pci_name(g)
                },
                vendor: format!("{:04x}", g.vendor),
                device: format!("{:04x}", g.device),
                dma_mask_bits: g.dma_mask_bits,
                page_sizes: (0..64)
                    .filter(|b| g.page_sizes & (1u64 << b) != 0)
                    .map(|b| show_size(1u64 << b))
                    .collect(),
                copy_engine: flag(g, uapi::ruvm_gpu_flags_RUVM_GPU_COPY_ENGINE),
                mmu: flag(g, uapi::ruvm_gpu_flags_RUVM_GPU_MMU),
                dma_mapped_bytes: g.dma_mapped_bytes,
                vidmem_size: g.vidmem_size,
                flags: names::bit_names(names::GPU_FLAGS, g.flags.into()),
            })
            .collect(),
    ))
}

impl Report for Gpus {
    fn render(&self) -> String {
        if self.0.is_empty() {
            return "no GPUs".to_owned();
        }
        table(
            &[
                "GPU",
                "kind",
                "device",
                "ids",
                "state",
                "DMA bits",
                "pages",
                "copy engine",
                "MMU",
                "DMA-mapped",
                "vidmem",
            ],
            self.0.iter().map(|g| {
                [
                    g.id.to_string(),
                    g.kind.to_owned(),
                    g.name.clone(),
                    format!("{}:{}", g.vendor, g.device),
                    if g.present {
                        "present"
                    } else {
                        "gone (unbound)"
                    }
                    .to_owned(),
                    g.dma_mask_bits.to_string(),
                    g.page_sizes.join(" "),
                    if g.copy_engine { "yes" } else { "no" }.to_owned(),
                    if g.mmu { "yes" } else { "no" }.to_owned(),
                    g.dma_mapped_bytes.to_string(),
                    show_size(g.vidmem_size),
                ]
            }),
        )
    }
}

/// A PCI address as `lspci -D` writes it, `DDDD:BB:SS.F` (or `BB:SS.F`, domain 0): (domain,
/// bus, devfn).
pub fn parse_pci(s: &str) -> Result<(u32, u8, u8)> {
    let bad =
        || anyhow::anyhow!("'{s}' is not a PCI address (DDDD:BB:SS.F, as lspci -D writes it)");
    let hex = |f: &str, max: u32| -> Result<u32> {
        if f.is_empty() || f.len() > 4 {
            return Err(bad());
        }
        let v = u32::from_str_radix(f, 16).map_err(|_| bad())?;
        if v > max {
            return Err(bad());
        }
        Ok(v)
    };
    let parts: Vec<&str> = s.trim().split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [d, b, r] => (hex(d, 0xffff)?, hex(b, 0xff)?, *r),
        [b, r] => (0, hex(b, 0xff)?, *r),
        _ => return Err(bad()),
    };
    let (slot, func) = rest.split_once('.').ok_or_else(bad)?;
    if func.len() != 1 {
        return Err(bad());
    }
    let (slot, func) = (hex(slot, 0x1f)?, hex(func, 7)?);
    Ok((
        domain,
        u8::try_from(bus)?,
        u8::try_from((slot << 3) | func)?,
    ))
}

/// What `gpu attach` and `gpu detach` did.
#[derive(Serialize)]
pub struct Attached {
    id: u32,
    address: String,
    attached: bool,
}

impl Report for Attached {
    fn render(&self) -> String {
        let what = if self.attached {
            "attached"
        } else {
            "detached"
        };
        format!("host GPU {} at {} {what}", self.id, self.address)
    }
}

/// `gpu attach` / `gpu detach` (`RUVM_IOCTL_GPU_ATTACH` / `RUVM_IOCTL_GPU_DETACH`).
pub fn attach(d: &Ruvm, address: &str, attach: bool) -> Result<Attached> {
    let (domain, bus, devfn) = parse_pci(address)?;
    let mut a = arg(|a: &mut uapi::ruvm_gpu_attach| {
        a.pci_domain = domain;
        a.pci_bus = bus;
        a.pci_devfn = devfn;
    });
    let c = if attach {
        cmd::GPU_ATTACH
    } else {
        cmd::GPU_DETACH
    };
    call(d, c, &mut a)?;
    Ok(Attached {
        id: a.id,
        address: format!("{domain:04x}:{bus:02x}:{:02x}.{}", devfn >> 3, devfn & 7),
        attached: attach,
    })
}

/// `ce-copy` (`RUVM_IOCTL_CE_COPY`).
pub fn ce_copy(d: &Ruvm, gpu: u32, c: &CopyArgs) -> Result<Done> {
    let mut a = arg(|a: &mut uapi::ruvm_ce_copy| {
        a.gpu = gpu;
        a.dst_handle = c.dst;
        a.dst_offset = c.dst_offset;
        a.src_handle = c.src;
        a.src_offset = c.src_offset;
        a.length = c.length;
    });
    call(d, cmd::CE_COPY, &mut a)?;
    Ok(Done {})
}

/// A mem's DMA addresses on a GPU.
#[derive(Serialize)]
pub struct DmaAddrs {
    handle: u64,
    gpu: u32,
    chunk_size: u64,
    addrs: Vec<u64>,
}

pub fn dma_addrs(d: &Ruvm, handle: u64, gpu: u32) -> Result<DmaAddrs> {
    let q = query_raw(d, handle)?;
    let mut addrs = vec![0u64; usize::try_from(q.chunk_count)?];
    let mut a = arg(|a: &mut uapi::ruvm_mem_dma_addrs| {
        a.handle = handle;
        a.gpu = gpu;
        a.count = q.chunk_count;
        a.addrs = addrs.as_mut_ptr() as u64;
    });
    call(d, cmd::MEM_DMA_ADDRS, &mut a)?;
    addrs.truncate(usize::try_from(a.count)?);
    Ok(DmaAddrs {
        handle,
        gpu,
        chunk_size: q.chunk_size,
        addrs,
    })
}

impl Report for DmaAddrs {
    fn render(&self) -> String {
        format!(
            "mem {} on GPU {}: {} chunks of {}\n{}",
            self.handle,
            self.gpu,
            self.addrs.len(),
            show_size(self.chunk_size),
            table(
                &["chunk", "DMA address"],
                self.addrs
                    .iter()
                    .enumerate()
                    .map(|(i, a)| [i.to_string(), format!("{a:#014x}")]),
            )
        )
    }
}

/// Where a GPU reaches a range of a mem.
#[derive(Serialize)]
pub struct GpuPhys {
    handle: u64,
    gpu: u32,
    offset: u64,
    length: u64,
    address: u64,
    aperture: &'static str,
}

pub fn gpu_phys(d: &Ruvm, handle: u64, gpu: u32, offset: u64, length: u64) -> Result<GpuPhys> {
    let mut a = arg(|a: &mut uapi::ruvm_mem_gpu_phys| {
        a.handle = handle;
        a.gpu = gpu;
        a.offset = offset;
        a.length = length;
    });
    call(d, cmd::MEM_GPU_PHYS, &mut a)?;
    Ok(GpuPhys {
        handle,
        gpu,
        offset,
        length,
        address: a.address,
        aperture: if a.aperture == uapi::ruvm_aperture_RUVM_APERTURE_VID {
            "vidmem"
        } else {
            "sysmem"
        },
    })
}

impl Report for GpuPhys {
    fn render(&self) -> String {
        format!(
            "mem {} [{:#x}, +{:#x}) on GPU {}: {} {:#014x}",
            self.handle, self.offset, self.length, self.gpu, self.aperture, self.address
        )
    }
}

/// One GPU's PMM.
#[derive(Serialize)]
pub struct Pmm {
    gpu: u32,
    capacity: u64,
    free: u64,
    allocated_4k: u64,
    allocated_64k: u64,
    allocated_2m: u64,
    roots: u64,
    roots_used: u64,
    roots_split: u64,
    roots_stored: u64,
    pt_tables: u64,
    pt_bytes: u64,
}

/// The PMMs of every present GPU with vidmem.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Pmms(Vec<Pmm>);

pub fn pmms(d: &Ruvm) -> Result<Pmms> {
    let mut out = Vec::new();
    for g in list_raw(d)? {
        if g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT == 0 || g.vidmem_size == 0 {
            continue;
        }
        let mut s = arg(|s: &mut uapi::ruvm_pmm_stats| s.gpu = g.id);
        call(d, cmd::PMM_STATS, &mut s)?;
        let [a4k, a64k, a2m] = s.allocated;
        out.push(Pmm {
            gpu: g.id,
            capacity: s.capacity,
            free: s.free,
            allocated_4k: a4k,
            allocated_64k: a64k,
            allocated_2m: a2m,
            roots: s.roots,
            roots_used: s.roots_used,
            roots_split: s.roots_split,
            roots_stored: s.roots_stored,
            pt_tables: s.pt_tables,
            pt_bytes: s.pt_bytes,
        });
    }
    Ok(Pmms(out))
}

impl Report for Pmms {
    fn render(&self) -> String {
        if self.0.is_empty() {
            return "no GPU with vidmem".to_owned();
        }
        table(
            &[
                "GPU",
                "vidmem",
                "free",
                "4K chunks",
                "64K chunks",
                "2M chunks",
                "roots",
                "used",
                "split",
                "with storage",
                "page tables",
            ],
            self.0.iter().map(|p| {
                [
                    p.gpu.to_string(),
                    show_size(p.capacity),
                    show_size(p.free),
                    p.allocated_4k.to_string(),
                    p.allocated_64k.to_string(),
                    p.allocated_2m.to_string(),
                    p.roots.to_string(),
                    p.roots_used.to_string(),
                    p.roots_split.to_string(),
                    p.roots_stored.to_string(),
                    format!("{} ({})", p.pt_tables, show_size(p.pt_bytes)),
                ]
            }),
        )
    }
}

/// What `pmm-check-leak` found.
#[derive(Serialize)]
pub struct CheckLeak {
    gpu: u32,
    chunk_size: u64,
    allocated: u64,
    free_before: u64,
    free_after: u64,
    clean: bool,
}

pub fn check_leak(d: &Ruvm, gpu: u32, chunk_size: u64, limit: Option<u64>) -> Result<CheckLeak> {
    let mut a = arg(|a: &mut uapi::ruvm_pmm_check_leak| {
        a.gpu = gpu;
        a.chunk_size = chunk_size;
        a.alloc_limit = limit.unwrap_or(u64::MAX);
    });
    call(d, cmd::PMM_CHECK_LEAK, &mut a)?;
    Ok(CheckLeak {
        gpu,
        chunk_size,
        allocated: a.allocated,
        free_before: a.free_before,
        free_after: a.free_after,
        clean: a.free_after == a.free_before,
    })
}

impl Report for CheckLeak {
    fn render(&self) -> String {
        format!(
            "GPU {}: took {} chunks of {}, gave them back; free {} -> {} bytes: {}",
            self.gpu,
            self.allocated,
            show_size(self.chunk_size),
            self.free_before,
            self.free_after,
            if self.clean { "no leak" } else { "LEAK" }
        )
    }

    fn failure(&self) -> Option<String> {
        (!self.clean).then(|| "the PMM did not get back all it had free".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_pci;

    #[test]
    fn pci_addresses_parse_as_lspci_writes_them() {
        assert_eq!(parse_pci("0000:65:00.0").unwrap(), (0, 0x65, 0));
        assert_eq!(parse_pci("0001:b3:1f.7").unwrap(), (1, 0xb3, 0xff));
        assert_eq!(parse_pci("00:03.0").unwrap(), (0, 0, 0x18));
        for bad in [
            "",
            "65:00",
            "0000:65:20.0",
            "0000:65:00.8",
            "10000:65:00.0",
            "0000:100:00.0",
            "0000:65:00.0.1",
            "x:65:00.0",
            "0000:65:00.",
            "a:b:c:d.0",
        ] {
            assert!(parse_pci(bad).is_err(), "{bad} parsed");
        }
    }
}
