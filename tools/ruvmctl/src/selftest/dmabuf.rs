// SPDX-License-Identifier: GPL-2.0

//! Mems as dma-bufs: export, the buffer's own mmap, imports (another process's included) in
//! either free order, implicit sync with an independent party (vgem's fences on the buffer's
//! reservation object), `DMA_BUF_IOCTL_EXPORT_SYNC_FILE` and `poll()` while ruvm's copy is
//! queued, and the refusals.
//!
//! Bytes cross through independent paths: written through a ruvm user mapping, read through the
//! dma-buf's own mapping (the dma-buf core's mmap), through an importer's mapping in another
//! process, and by a GPU's copy engine. vgem (`CONFIG_DRM_VGEM`) imports the buffer for its own
//! device (attach and map) and holds ruvm's copies with its fences; it cannot map an imported
//! buffer for the CPU (DRM refuses a dumb mapping of an import), so its reads are not tested.
//! Every case skips without `RUVM_FEATURE_DMABUF`; the vgem and copy-engine parts skip (said)
//! without vgem or a simulated GPU.

use std::{os::fd::AsRawFd, time::Duration};

use nix::errno::Errno;

use super::harness::{cases, check, expect_errno, in_child, Case, Context, Stop, TestResult};
use super::shared::{live, mismatches, sim_gpu, BufMap};
use super::vgem::{udmabuf, Vgem};
use crate::{kmsg, pattern};
use libruvm::{dmabuf, op, sync_file, uapi, Ruvm, UserMap};

mod limits;
mod mapping;

const SIZE: u64 = 64 * 1024;
/// Bytes of the foreign buffers (the edu engine moves under 4 KiB a transfer).
const FOREIGN: u64 = 16 * 1024;
const MEMS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_MEMS as usize;
const SYSMEM_BYTES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_BYTES as usize;
/// The kernel log's words for an exporter that freed first (IPC pools only).
const ORDER_BROKEN: &str = "freed by its exporter while";

pub fn cases() -> Vec<Case> {
    cases![
        dmabuf_mmap_and_engine_share_bytes,
        dmabuf_import_in_another_process_any_free_order,
        dmabuf_vgem_fence_holds_the_next_copy,
        mapping::dmabuf_mmap_pages_cannot_be_dropped,
        dmabuf_refusals,
        limits::dmabuf_kept_chunks_count_in_the_file_limit,
        limits::dmabuf_import_counts_in_the_file_limit,
        dmabuf_foreign_udmabuf_through_the_engine,
        dmabuf_foreign_vgem_buffer_fenced_and_read_by_vgem,
    ]
}

// --- what the cases share ------------------------------------------------------------------

/// The device, or a skip without dma-bufs.
pub(super) fn setup() -> Result<Ruvm, Stop> {
    let d = Ruvm::open().ctx("open")?;
    let features = d.info().ctx("INFO")?.features;
    if features & u64::from(uapi::RUVM_FEATURE_DMABUF) == 0 {
        return Err(Stop::Skip(
            "the module has no dma-bufs (RUVM_FEATURE_DMABUF)".into(),
        ));
    }
    Ok(d)
}

/// The audit's live mems and sysmem bytes.
fn counts(d: &Ruvm) -> Result<[u64; 2], Stop> {
    let l = live(d)?;
    Ok([l[MEMS], l[SYSMEM_BYTES]])
}

/// A new mem of `d` of [`SIZE`] bytes holding pattern `seed` (written through its user
/// mapping, returned with it).
fn patterned(d: &Ruvm, seed: u64) -> Result<(u64, UserMap), Stop> {
    let h = d.mem_alloc(SIZE, 0, 0).ctx("MEM_ALLOC")?.handle;
    let q = d.mem_query(h).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    for o in 0..SIZE {
        map.write(o as usize, pattern::byte_at(seed, o));
    }
    Ok((h, map))
}

/// Bytes of `[from, from + len)` of `read` (offsets from `base`) that are not pattern `seed`.
fn bad(read: impl Fn(usize) -> u8, base: u64, len: u64, seed: u64) -> u64 {
    (0..len)
        .filter(|&i| read(i as usize) != pattern::byte_at(seed, base + i))
        .count() as u64
}

/// Whether `vmsplice` (which pins the pages of what it is given) refuses the first page of
/// `map` (`EFAULT`).
fn pin_refused(map: &BufMap) -> bool {
    let Ok((_rx, tx)) = nix::unistd::pipe() else {
        return false;
    };
    super::shared::vmsplice_page(map.addr.as_ptr(), &tx) == Err(Errno::EFAULT)
}

/// A simulated GPU with a copy engine, or `None` (said).
fn copy_gpu(d: &Ruvm) -> Result<Option<u32>, Stop> {
    match sim_gpu(d) {
        Ok(g) => Ok(Some(g)),
        Err(Stop::Skip(why)) => {
            println!("# {why}: the copy engine part is left out");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// How many times the log said an exporter freed first since `marker`.
fn order_broken_since(marker: Option<&str>) -> usize {
    let Ok(all) = kmsg::read_kmsg() else {
        return 0;
    };
    kmsg::since(&all, marker).map_or(0, |after| {
        after.iter().filter(|m| m.contains(ORDER_BROKEN)).count()
    })
}

// --- the cases ------------------------------------------------------------------------------

/// The buffer's own mapping (the dma-buf core's mmap) sees what ruvm's user mapping wrote and
/// what the copy engine copied in, from any page offset; what is written through it, ruvm's
/// kernel-side verify reads. A mapping past the buffer's end is refused. The buffer is
/// close-on-exec.
fn dmabuf_mmap_and_engine_share_bytes() -> TestResult {
    let d = setup()?;
    let (seed_a, seed_b, seed_c) = (0xd1a, 0xd1b, 0xd1c);
    let (b, bmap) = patterned(&d, seed_a)?;
    let buf = d.mem_export_dmabuf(b).ctx("MEM_EXPORT_DMABUF")?;
    let flags = nix::fcntl::fcntl(&buf, nix::fcntl::FcntlArg::F_GETFD).ctx("F_GETFD")?;
    check!(
        flags & nix::libc::FD_CLOEXEC != 0,
        "the dma-buf descriptor is not close-on-exec"
    );
    let whole = BufMap::new(&buf, 0, SIZE).ctx("mmap of the dma-buf")?;
    let n = bad(|i| whole.read(i), 0, SIZE, seed_a);
    check!(
        n == 0,
        "{n} bytes of the dma-buf's mapping are not the mem's"
    );
    // From the second page on.
    let tail = BufMap::new(&buf, 4096, SIZE - 4096).ctx("mmap of the dma-buf at page 1")?;
    let n = bad(|i| tail.read(i), 4096, SIZE - 4096, seed_a);
    check!(n == 0, "{n} bytes of the mapping at page 1 are wrong");
    expect_errno(
        BufMap::new(&buf, 4096, SIZE).map(|_| ()),
        Errno::EINVAL,
        "mmap of the dma-buf past its end",
    )?;
    // A private (copy-on-write) mapping is refused.
    {
        // SAFETY: a new mapping of the buffer, unmapped at once if made.
        let r = unsafe {
            nix::sys::mman::mmap(
                None,
                std::num::NonZeroUsize::MIN.saturating_add(4095),
                nix::sys::mman::ProtFlags::PROT_READ,
                nix::sys::mman::MapFlags::MAP_PRIVATE,
                &buf,
                0,
            )
        };
        if let Ok(p) = r {
            // SAFETY: the mapping just made.
            let _ = unsafe { nix::sys::mman::munmap(p, 4096) };
        }
        expect_errno(
            r.map(|_| ()),
            Errno::EINVAL,
            "a private mmap of the dma-buf",
        )?;
    }
    // The mapping has no pages to pin: a pin could outlive the buffer and see the chunks
    // reused by a later mem.
    check!(
        pin_refused(&whole),
        "vmsplice pinned pages of the dma-buf's mapping"
    );
    // Written through the buffer's mapping, between CPU access begin and end.
    dmabuf::cpu_access(&buf, false).ctx("DMA_BUF_IOCTL_SYNC start")?;
    for o in 0..SIZE {
        whole.write(o as usize, pattern::byte_at(seed_b, o));
    }
    dmabuf::cpu_access(&buf, true).ctx("DMA_BUF_IOCTL_SYNC end")?;
    let n = mismatches(&d, b, SIZE, seed_b)?;
    check!(
        n == 0,
        "ruvm's verify read {n} wrong bytes written through the dma-buf"
    );
    let n = bad(|i| bmap.read(i), 0, SIZE, seed_b);
    check!(n == 0, "ruvm's user mapping reads {n} wrong bytes");
    if let Some(g) = copy_gpu(&d)? {
        let (a, _amap) = patterned(&d, seed_c)?;
        for h in [a, b] {
            d.mem_gpu(true, h, g).ctx("MEM_MAP_GPU")?;
        }
        d.ce_copy(g, b, 0, a, 0, SIZE)
            .ctx("CE_COPY into the exported mem")?;
        let n = bad(|i| whole.read(i), 0, SIZE, seed_c);
        check!(
            n == 0,
            "{n} bytes the engine copied are not seen through the dma-buf"
        );
        d.mem_free(a).ctx("MEM_FREE")?;
    }
    drop((whole, tail, bmap));
    d.mem_free(b).ctx("MEM_FREE")?;
    Ok(())
}

/// Another process imports the buffer (inherited across fork) into its own file: it reads the
/// exporter's bytes through its mapping, writes its own; the exporter reads them. Then the
/// other order: the exporter frees its mem and closes the buffer first, the importer still
/// reads the bytes, frees last. The log says nothing of a broken free order (that is IPC
/// pools' rule), and the audit is back where it was.
fn dmabuf_import_in_another_process_any_free_order() -> TestResult {
    let d = setup()?;
    let before = counts(&d)?;
    let marker = kmsg::write_marker().ok();
    let (seed_a, seed_b) = (0xd2a, 0xd2b);
    let (b, bmap) = patterned(&d, seed_a)?;
    let buf = d.mem_export_dmabuf(b).ctx("MEM_EXPORT_DMABUF")?;
    let raw = buf.as_raw_fd();
    // The importer frees first.
    let st = in_child(|| {
        let Ok(other) = Ruvm::open() else {
            return 10;
        };
        let Ok(m) = other.mem_import_dmabuf(raw) else {
            return 11;
        };
        if m.size != SIZE {
            return 12;
        }
        let Ok(q) = other.mem_query(m.handle) else {
            return 13;
        };
        let Ok(map) = UserMap::of_mem(&other, &q) else {
            return 14;
        };
        if bad(|i| map.read(i), 0, SIZE, seed_a) != 0 {
            return 15;
        }
        for o in 0..SIZE {
            map.write(o as usize, pattern::byte_at(seed_b, o));
        }
        drop(map);
        if other.mem_free(m.handle).is_err() {
            return 16;
        }
        0
    })?;
    check!(
        matches!(st, nix::sys::wait::WaitStatus::Exited(_, 0)),
        "the importing child failed ({st:?}: 10 open, 11 import, 12 size, 13 query, 14 mmap, 15 bytes, 16 free)"
    );
    let n = bad(|i| bmap.read(i), 0, SIZE, seed_b);
    check!(
        n == 0,
        "{n} bytes the importer wrote are not the exporter's"
    );
    // The exporter frees first: an import in a second file of this process outlives both
    // the mem and the buffer.
    let other = Ruvm::open().ctx("open a second file")?;
    let m = other.mem_import_dmabuf(raw).ctx("MEM_IMPORT_DMABUF")?;
    drop(bmap);
    d.mem_free(b).ctx("MEM_FREE of the exported mem")?;
    drop(buf);
    let q = other.mem_query(m.handle).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(&other, &q).ctx("mmap of the import")?;
    let n = bad(|i| map.read(i), 0, SIZE, seed_b);
    check!(
        n == 0,
        "{n} bytes of the import changed after the exporter let go"
    );
    drop(map);
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    drop(other);
    let said = order_broken_since(marker.as_deref());
    check!(
        said == 0,
        "the log says a free order was broken ({said} times)"
    );
    let after = counts(&d)?;
    check!(
        after == before,
        "mems, sysmem bytes: {after:?} after, {before:?} before"
    );
    Ok(())
}

/// vgem imports the buffer of mem B (attaching and mapping it for its own device) and puts a
/// write fence on it. A copy B → C queued on a stream waits for that fence: it has not run
/// while the fence is pending, though new bytes are written into B meanwhile (as the device the
/// fence stands for would); C's buffer reports the copy's fence as pending
/// (`DMA_BUF_IOCTL_EXPORT_SYNC_FILE`, driver "ruvm") and `poll()` on it is not readable. Once
/// vgem signals, the copy runs, C holds the new bytes, the fence signals, and C's buffer polls
/// readable.
fn dmabuf_vgem_fence_holds_the_next_copy() -> TestResult {
    let d = setup()?;
    let Some(vgem) = Vgem::open() else {
        return Err(Stop::Skip("no vgem device (CONFIG_DRM_VGEM)".into()));
    };
    let g = sim_gpu(&d)?;
    let (seed_a, seed_b, seed_c) = (0xd3a, 0xd3b, 0xd3c);
    let (b, bmap) = patterned(&d, seed_a)?;
    let (c, _cmap) = patterned(&d, seed_c)?;
    for h in [b, c] {
        d.mem_gpu(true, h, g).ctx("MEM_MAP_GPU")?;
    }
    let bbuf = d.mem_export_dmabuf(b).ctx("MEM_EXPORT_DMABUF of B")?;
    let cbuf = d.mem_export_dmabuf(c).ctx("MEM_EXPORT_DMABUF of C")?;
    let gem = vgem.import(bbuf.as_raw_fd()).ctx("vgem PRIME import")?;
    let fence = vgem.fence(gem, true).ctx("vgem FENCE_ATTACH")?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let seqno = d
        .stream_submit(s, &[op::copy(c, 0, b, 0, SIZE)])
        .ctx("STREAM_SUBMIT")?;
    // The copy's fence is C's, as a write.
    let pending = dmabuf::export_sync_file(&cbuf, false).ctx("EXPORT_SYNC_FILE of C")?;
    std::thread::sleep(Duration::from_millis(300));
    let q = d.stream_query(s).ctx("STREAM_QUERY")?;
    let held = q.completed < seqno;
    let info = sync_file::info(&pending).ctx("SYNC_IOC_FILE_INFO")?;
    let polled = sync_file::wait(&cbuf, Duration::ZERO).ctx("poll of C")?;
    // The device the fence stands for writes B meanwhile.
    for o in 0..SIZE {
        bmap.write(o as usize, pattern::byte_at(seed_b, o));
    }
    vgem.signal(fence).ctx("vgem FENCE_SIGNAL")?;
    d.stream_sync(s, 10_000).ctx("STREAM_SYNC")?;
    check!(held, "the copy completed while vgem's fence was pending");
    check!(
        info.status == 0
            && info
                .fences
                .iter()
                .any(|f| f.driver == "ruvm" && f.status == 0),
        "C's buffer did not report ruvm's pending fence: {info:?}"
    );
    check!(
        !polled,
        "C's buffer polled readable with the copy into it pending"
    );
    let n = mismatches(&d, c, SIZE, seed_b)?;
    check!(
        n == 0,
        "{n} bytes of C are not what B held when vgem signalled"
    );
    check!(
        sync_file::wait(&pending, Duration::from_secs(5)).ctx("poll of the sync_file")?,
        "the copy's fence did not signal"
    );
    check!(
        sync_file::wait(&cbuf, Duration::from_secs(5)).ctx("poll of C")?,
        "C's buffer did not poll readable after the copy"
    );
    // Synchronous calls: a bad range is refused at once, fence or not; a copy into B waits
    // for a new vgem fence, which another thread signals 300 ms later.
    let fence = vgem.fence(gem, true).ctx("vgem FENCE_ATTACH")?;
    let t = std::time::Instant::now();
    expect_errno(
        d.mem_fill(false, super::shared::pattern(b, SIZE + 1, seed_a)),
        Errno::EINVAL,
        "MEM_FILL past the end with a fence pending",
    )?;
    check!(
        t.elapsed() < Duration::from_secs(5),
        "a bad range waited {:?} for the fence",
        t.elapsed()
    );
    d.map_kernel(c).ctx("MAP_CPU_KERNEL")?;
    let t = std::time::Instant::now();
    let waited = std::thread::scope(|scope| {
        let v = &vgem;
        scope.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            v.signal(fence)
        });
        d.ce_copy(g, b, 0, c, 0, SIZE)
    });
    waited.ctx("CE_COPY into B with vgem's fence pending")?;
    check!(
        t.elapsed() >= Duration::from_millis(250),
        "the synchronous copy into B did not wait for vgem's fence ({:?})",
        t.elapsed()
    );
    let n = mismatches(&d, b, SIZE, seed_b)?;
    check!(
        n == 0,
        "{n} bytes of B are not C's after the synchronous copy"
    );
    vgem.close(gem).ctx("GEM_CLOSE")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drop((bbuf, cbuf, pending, bmap));
    for h in [b, c] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    Ok(())
}

/// Exact errors: an unknown handle, a vidmem mem, a descriptor that is not open or not a
/// dma-buf.
fn dmabuf_refusals() -> TestResult {
    let d = setup()?;
    expect_errno(
        d.mem_export_dmabuf(0xdead_beef).map(|_| ()),
        Errno::ENOENT,
        "MEM_EXPORT_DMABUF of no mem",
    )?;
    expect_errno(
        d.mem_import_dmabuf(-1).map(|_| ()),
        Errno::EBADF,
        "MEM_IMPORT_DMABUF of descriptor -1",
    )?;
    expect_errno(
        d.mem_import_dmabuf(d.as_fd().as_raw_fd()).map(|_| ()),
        Errno::EINVAL,
        "MEM_IMPORT_DMABUF of /dev/ruvm",
    )?;
    let e = d.event_create().ctx("EVENT_CREATE")?;
    let sync = d.event_export(e).ctx("EVENT_EXPORT")?;
    expect_errno(
        d.mem_import_dmabuf(sync.as_raw_fd()).map(|_| ()),
        Errno::EINVAL,
        "MEM_IMPORT_DMABUF of a sync_file",
    )?;
    drop(sync);
    d.event_destroy(e).ctx("EVENT_DESTROY")?;
    if let Ok(gpu) = super::shared::vidmem_gpu(&d) {
        let p = super::shared::vid_pool(&d, gpu.id, 64 * 1024, 0).ctx("POOL_CREATE vidmem")?;
        let h = super::shared::vid_alloc(&d, p, gpu.id, SIZE)
            .ctx("MEM_ALLOC vidmem")?
            .handle;
        expect_errno(
            d.mem_export_dmabuf(h).map(|_| ()),
            Errno::EOPNOTSUPP,
            "MEM_EXPORT_DMABUF of vidmem",
        )?;
        d.mem_free(h).ctx("MEM_FREE")?;
        d.pool_destroy(p).ctx("POOL_DESTROY")?;
    }
    // A freed mem's handle is gone.
    let (h, map) = patterned(&d, 0xd4a)?;
    drop(map);
    d.mem_free(h).ctx("MEM_FREE")?;
    expect_errno(
        d.mem_export_dmabuf(h).map(|_| ()),
        Errno::ENOENT,
        "MEM_EXPORT_DMABUF of a freed mem",
    )?;
    Ok(())
}

/// A test GPU (edu: a real DMA engine behind the guest's IOMMU), or a skip: a simulated GPU's
/// engine cannot reach another exporter's buffer.
fn edu_gpu(d: &Ruvm) -> Result<u32, Stop> {
    d.gpus()
        .ctx("GPU_LIST")?
        .iter()
        .find(|g| {
            g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0
                && g.kind == uapi::ruvm_gpu_kind_RUVM_GPU_KIND_EDU
        })
        .map(|g| g.id)
        .ok_or_else(|| Stop::Skip("no test (edu) GPU".into()))
}

/// A udmabuf (a memfd's pages, another exporter's dma-buf) imported into ruvm: what needs its
/// pages is refused (ruvm's mmap, the kernel mapping, an export, a simulated GPU:
/// `EOPNOTSUPP`); mapped for an edu GPU, its engine writes bytes the memfd then reads, and
/// reads bytes written through the memfd. The audit is back where it was.
fn dmabuf_foreign_udmabuf_through_the_engine() -> TestResult {
    use std::os::unix::fs::FileExt;
    let d = setup()?;
    let g = edu_gpu(&d)?;
    let Some((memfd, ubuf)) = udmabuf(FOREIGN).ctx("udmabuf")? else {
        return Err(Stop::Skip("no /dev/udmabuf (CONFIG_UDMABUF)".into()));
    };
    let before = counts(&d)?;
    let (seed_a, seed_b, seed_c) = (0xd5a, 0xd5b, 0xd5c);
    let bytes = |seed: u64| {
        (0..FOREIGN)
            .map(|o| pattern::byte_at(seed, o))
            .collect::<Vec<u8>>()
    };
    memfd
        .write_all_at(&bytes(seed_a), 0)
        .ctx("write to the memfd")?;
    let m = d
        .mem_import_dmabuf(ubuf.as_raw_fd())
        .ctx("MEM_IMPORT_DMABUF of a udmabuf")?;
    check!(m.size == FOREIGN, "the import's size is {}", m.size);
    let q = d.mem_query(m.handle).ctx("MEM_QUERY")?;
    expect_errno(
        UserMap::of_mem(&d, &q).map(|_| ()),
        Errno::EOPNOTSUPP,
        "mmap of another exporter's buffer through /dev/ruvm",
    )?;
    expect_errno(
        d.map_kernel(m.handle),
        Errno::EOPNOTSUPP,
        "MAP_CPU_KERNEL of it",
    )?;
    expect_errno(
        d.mem_export_dmabuf(m.handle).map(|_| ()),
        Errno::EOPNOTSUPP,
        "MEM_EXPORT_DMABUF of it",
    )?;
    if let Ok(sim) = sim_gpu(&d) {
        expect_errno(
            d.mem_gpu(true, m.handle, sim),
            Errno::EOPNOTSUPP,
            "MEM_MAP_GPU of it on a simulated GPU",
        )?;
    }
    d.mem_gpu(true, m.handle, g)
        .ctx("MEM_MAP_GPU of it on the edu GPU")?;
    let addrs = d.dma_addrs(m.handle, g, 0, 64).ctx("MEM_DMA_ADDRS")?;
    check!(
        addrs.len() as u64 == FOREIGN / 4096,
        "{} DMA addresses for {} pages",
        addrs.len(),
        FOREIGN / 4096
    );
    let (a, amap) = patterned(&d, seed_b)?;
    // Only its first FOREIGN bytes are copied (the edu engine moves under 4 KiB a transfer).
    d.mem_gpu(true, a, g).ctx("MEM_MAP_GPU")?;
    d.ce_copy(g, m.handle, 0, a, 0, FOREIGN)
        .ctx("CE_COPY into the udmabuf")?;
    let mut got = vec![0u8; FOREIGN as usize];
    memfd.read_exact_at(&mut got, 0).ctx("read the memfd")?;
    let n = got
        .iter()
        .zip(bytes(seed_b))
        .filter(|(x, y)| **x != *y)
        .count();
    check!(n == 0, "{n} bytes the engine wrote are not in the memfd");
    memfd
        .write_all_at(&bytes(seed_c), 0)
        .ctx("write to the memfd")?;
    d.ce_copy(g, a, 0, m.handle, 0, FOREIGN)
        .ctx("CE_COPY out of the udmabuf")?;
    let n = bad(|i| amap.read(i), 0, FOREIGN, seed_c);
    check!(
        n == 0,
        "{n} bytes the engine read out of the memfd are wrong"
    );
    drop(amap);
    d.mem_free(a).ctx("MEM_FREE")?;
    // The GPU's removal drops the attachment (the exporter's mapping undone) with its
    // tables; the mem stays, mapped on no GPU, and maps again once the GPU is back.
    let info = d
        .gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .find(|x| x.id == g)
        .ok_or_else(|| Stop::Fail("the GPU left the list".into()))?;
    let name = libruvm::pci_name(&info);
    std::fs::write(format!("{}/unbind", super::gpu::DRIVER), &name).ctx("unbind")?;
    let q = d.mem_query(m.handle).ctx("MEM_QUERY after unbind");
    std::fs::write(format!("{}/bind", super::gpu::DRIVER), &name).ctx("bind")?;
    let q = q?;
    check!(
        q.mapped_gpus & (1 << g) == 0,
        "the import is still mapped on the removed GPU ({:#x})",
        q.mapped_gpus
    );
    d.mem_gpu(true, m.handle, g)
        .ctx("MEM_MAP_GPU of the import on the rebound GPU")?;
    d.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    drop((ubuf, memfd));
    let after = counts(&d)?;
    check!(
        after == before,
        "mems, sysmem bytes: {after:?} after, {before:?} before"
    );
    Ok(())
}

/// vgem's own buffer, exported by vgem and imported into ruvm, with a vgem write fence on it: a
/// stream copy into it on an edu GPU has not run 300 ms later; once vgem signals, the copy runs
/// and vgem's own CPU mapping reads what ruvm's engine wrote.
fn dmabuf_foreign_vgem_buffer_fenced_and_read_by_vgem() -> TestResult {
    let d = setup()?;
    let Some(vgem) = Vgem::open() else {
        return Err(Stop::Skip("no vgem device (CONFIG_DRM_VGEM)".into()));
    };
    let g = edu_gpu(&d)?;
    let seed = 0xd6a;
    let handle = vgem.create(FOREIGN).ctx("vgem CREATE_DUMB")?;
    let vmap = vgem
        .map(handle, FOREIGN)
        .ctx("vgem's mapping of its buffer")?;
    for o in 0..FOREIGN as usize {
        vmap.write(o, 0);
    }
    let vbuf = vgem.export(handle).ctx("vgem PRIME export")?;
    let m = d
        .mem_import_dmabuf(vbuf.as_raw_fd())
        .ctx("MEM_IMPORT_DMABUF of vgem's buffer")?;
    check!(m.size >= FOREIGN, "the import's size is {}", m.size);
    d.mem_gpu(true, m.handle, g).ctx("MEM_MAP_GPU of it")?;
    let (a, amap) = patterned(&d, seed)?;
    // Only its first FOREIGN bytes are copied.
    d.mem_gpu(true, a, g).ctx("MEM_MAP_GPU")?;
    let fence = vgem.fence(handle, true).ctx("vgem FENCE_ATTACH")?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let seqno = d
        .stream_submit(s, &[op::copy(m.handle, 0, a, 0, FOREIGN)])
        .ctx("STREAM_SUBMIT")?;
    std::thread::sleep(Duration::from_millis(300));
    let held = d.stream_query(s).ctx("STREAM_QUERY")?.completed < seqno;
    // ruvm's copy is in vgem's buffer's reservation object too.
    let pending = dmabuf::export_sync_file(&vbuf, false).ctx("EXPORT_SYNC_FILE")?;
    let info = sync_file::info(&pending).ctx("SYNC_IOC_FILE_INFO")?;
    vgem.signal(fence).ctx("vgem FENCE_SIGNAL")?;
    d.stream_sync(s, 20_000).ctx("STREAM_SYNC")?;
    check!(held, "the copy completed while vgem's fence was pending");
    check!(
        info.fences.iter().any(|f| f.driver == "ruvm"),
        "vgem's buffer did not carry ruvm's fence: {info:?}"
    );
    let n = bad(|i| vmap.read(i), 0, FOREIGN, seed);
    check!(
        n == 0,
        "vgem's mapping reads {n} bytes other than ruvm's engine wrote"
    );
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    drop((amap, pending));
    d.mem_free(a).ctx("MEM_FREE")?;
    d.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    drop((vmap, vbuf));
    vgem.close(handle).ctx("GEM_CLOSE")?;
    Ok(())
}
