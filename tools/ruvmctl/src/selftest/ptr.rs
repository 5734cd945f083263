// SPDX-License-Identifier: GPL-2.0

//! Pointer attributes (`RUVM_IOCTL_PTR_ATTRS`, CUDA's cudaPointerGetAttributes): what an
//! address of the calling process is.
//!
//! Every answer is compared field by field with the one the case works out from what it made
//! (`MEM_QUERY`, the address it mapped the mem at, the pool, the GPUs): an address in a user
//! mapping of a mem is `RUVM_PTR_MEM` with the mem's handle in the calling file (0 with
//! `RUVM_PTR_OTHER_FILE` for another file's mem, 0 with `RUVM_PTR_FREED` for a freed one); any
//! other address is `RUVM_PTR_NONE` with every output 0, never an error. Mems are mapped into
//! a larger `PROT_NONE` reservation, so that the bytes just before and after a mapping are
//! another mapping's, not whatever the kernel would place there. Every case skips without
//! `RUVM_FEATURE_PTR_ATTRS`; the GPU parts use a simulated GPU if there is one, else any
//! present GPU, and are left out (said in a `#` line) without one.

use std::{ffi::c_void, num::NonZeroUsize, ptr::NonNull};

use nix::{
    errno::Errno,
    sys::mman::{mmap, mmap_anonymous, mprotect, munmap, MapFlags, ProtFlags},
    sys::wait::WaitStatus,
};

use super::harness::{cases, check, expect_errno, in_child, Case, Context, Stop, TestResult};
use super::shared::{readable, UserMapAnon};
use libruvm::{cmd, uapi, Ruvm, UserMap};

mod freed;
mod refusals;
use freed::*;
use refusals::*;

const K: u64 = 1024;
const PAGE: usize = 4096;
const MEM: u32 = uapi::ruvm_ptr_type_RUVM_PTR_MEM;
const OTHER_FILE: u32 = uapi::ruvm_ptr_flags_RUVM_PTR_OTHER_FILE;
const FREED: u32 = uapi::ruvm_ptr_flags_RUVM_PTR_FREED;
const SYSMEM: u32 = uapi::ruvm_backing_RUVM_BACKING_SYSMEM;

pub fn cases() -> Vec<Case> {
    cases![
        ptr_first_last_and_past_the_end,
        ptr_after_munmap_is_none,
        ptr_stack_heap_and_other_mappings_are_none,
        ptr_pool_and_gpu_mappings,
        ptr_freed_mem_is_flagged,
        ptr_other_file_has_no_handle,
        ptr_forked_child_maps_through_the_inherited_file,
        ptr_bad_flags_and_reserved_are_einval,
        ptr_unwritable_argument_is_efault,
    ]
}

// --- what the cases share ------------------------------------------------------------------

/// The device, or a skip without pointer attributes.
fn setup() -> Result<Ruvm, Stop> {
    let d = Ruvm::open().ctx("open")?;
    let features = d.info().ctx("INFO")?.features;
    if features & u64::from(uapi::RUVM_FEATURE_PTR_ATTRS) == 0 {
        return Err(Stop::Skip(
            "the module has no pointer attributes (RUVM_FEATURE_PTR_ATTRS)".into(),
        ));
    }
    Ok(d)
}

/// Every field of an answer (inputs too), named, in the structure's order.
fn named(a: &uapi::ruvm_ptr_attrs) -> [(&'static str, u64); 15] {
    [
        ("addr", a.addr),
        ("flags", a.flags.into()),
        ("type", a.type_.into()),
        ("handle", a.handle),
        ("offset", a.offset),
        ("base", a.base),
        ("size", a.size),
        ("physical_size", a.physical_size),
        ("chunk_size", a.chunk_size),
        ("pool", a.pool),
        ("mapped_gpus", a.mapped_gpus),
        ("backing", a.backing.into()),
        ("ptr_flags", a.ptr_flags.into()),
        ("reserved[0]", a.reserved[0]),
        ("reserved[1]", a.reserved[1]),
    ]
}

/// Checks that `got` is `want`, every field.
fn same(got: &uapi::ruvm_ptr_attrs, want: &uapi::ruvm_ptr_attrs, what: &str) -> TestResult {
    let off: Vec<String> = named(got)
        .iter()
        .zip(named(want).iter())
        .filter(|(g, w)| g.1 != w.1)
        .map(|(g, w)| format!("{} {:#x} (wanted {:#x})", g.0, g.1, w.1))
        .collect();
    check!(off.is_empty(), "{what}: {}", off.join(", "));
    Ok(())
}

/// `RUVM_IOCTL_PTR_ATTRS` of `addr` through `d`, compared with `want`.
fn expect(d: &Ruvm, addr: u64, want: &uapi::ruvm_ptr_attrs, what: &str) -> TestResult {
    let got = d.ptr_attrs(addr).ctx(&format!("PTR_ATTRS of {what}"))?;
    same(&got, want, what)
}

/// What an address that is not ruvm memory answers: every output 0.
fn none(addr: u64) -> uapi::ruvm_ptr_attrs {
    uapi::ruvm_ptr_attrs {
        addr,
        ..Default::default()
    }
}

/// What byte `offset` of mem `q`, mapped at `base` through the file that has it, answers: its
/// handle, no flags, no pool, the GPUs `MEM_QUERY` says it is DMA-mapped for.
fn mem_byte(q: &uapi::ruvm_mem_query, base: u64, offset: u64) -> uapi::ruvm_ptr_attrs {
    uapi::ruvm_ptr_attrs {
        addr: base + offset,
        type_: MEM,
        handle: q.handle,
        offset,
        base,
        size: q.size,
        physical_size: q.physical_size,
        chunk_size: q.chunk_size,
        mapped_gpus: q.mapped_gpus,
        backing: SYSMEM,
        ..Default::default()
    }
}

/// A `PROT_NONE` reservation one page longer than a mem's mapping on each side, with the mem
/// mapped (shared, read-write) over its middle: the bytes just before and just after the
/// mapping are the reservation's (anonymous, not ruvm memory). Unmapped whole on drop.
struct Guarded {
    region: NonNull<c_void>,
    total: usize,
    len: usize,
}

impl Guarded {
    fn new(d: &Ruvm, q: &uapi::ruvm_mem_query) -> Result<Self, Stop> {
        let len = usize::try_from(q.physical_size).ctx("physical size")?;
        let total = len + 2 * PAGE;
        let nz = |n: usize| NonZeroUsize::new(n).ok_or_else(|| Stop::Fail("length 0".into()));
        // SAFETY: a new anonymous mapping at an address the kernel chooses aliases nothing.
        let region = unsafe {
            mmap_anonymous(
                None,
                nz(total)?,
                ProtFlags::PROT_NONE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }
        .ctx("mmap of the reservation")?;
        let me = Self { region, total, len };
        let at = region.as_ptr() as usize + PAGE;
        let offset = i64::try_from(q.mmap_offset).ctx("mmap offset")?;
        // SAFETY: the range is inside the reservation just made, which nothing else uses; the
        // mem's mapping replaces that part of it.
        let mapped = unsafe {
            mmap(
                NonZeroUsize::new(at),
                nz(len)?,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
                d.as_fd(),
                offset,
            )
        }
        .ctx("mmap of the mem into the reservation")?;
        check!(
            mapped.as_ptr() as usize == at,
            "MAP_FIXED at {at:#x} mapped at {:p}",
            mapped.as_ptr()
        );
        Ok(me)
    }

    /// The address of the mem's first byte.
    fn base(&self) -> u64 {
        self.region.as_ptr() as u64 + PAGE as u64
    }

    /// The mem's byte `i` (a pointer into the mapping).
    fn at(&self, i: usize) -> *mut u8 {
        assert!(i < self.len);
        // SAFETY: inside the mapping.
        unsafe { self.region.as_ptr().cast::<u8>().add(PAGE + i) }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: the reservation (and the mem's mapping in it) made by `new`, not used after.
        let _ = unsafe { munmap(self.region, self.total) };
    }
}

/// A sysmem mem of `size` bytes in `chunk`-byte chunks (0: the default), mapped into a
/// reservation: its query and its mapping.
fn mapped_mem(d: &Ruvm, size: u64, chunk: u64) -> Result<(uapi::ruvm_mem_query, Guarded), Stop> {
    let a = d.mem_alloc(size, chunk, 0).ctx("MEM_ALLOC")?;
    let q = d.mem_query(a.handle).ctx("MEM_QUERY")?;
    let g = Guarded::new(d, &q)?;
    Ok((q, g))
}

/// Up to two present GPUs, the simulated ones first (any GPU DMA-maps sysmem).
fn gpus(d: &Ruvm) -> Result<Vec<u32>, Stop> {
    let mut v: Vec<uapi::ruvm_gpu_info> = d
        .gpus()
        .ctx("GPU_LIST")?
        .into_iter()
        .filter(|g| g.flags & uapi::ruvm_gpu_flags_RUVM_GPU_PRESENT != 0)
        .collect();
    v.sort_by_key(|g| (!super::gpu::sim(g), g.id));
    Ok(v.iter().take(2).map(|g| g.id).collect())
}

/// The bits of GPUs `ids`.
fn mask(ids: &[u32]) -> u64 {
    ids.iter().fold(0, |m, g| m | (1u64 << g))
}

// --- where a mapping starts and ends -------------------------------------------------------

/// The first byte of a mapping, one in the middle, the last byte of the size asked for and the
/// last of the physical size are the mem's, each at its offset; the bytes just before and just
/// after the mapping (another mapping's) are not ruvm memory. For 4 KiB chunks (3 pages + 17
/// bytes: a tail past the size) and 64 KiB chunks (64 KiB + 1: a whole chunk of tail).
fn ptr_first_last_and_past_the_end() -> TestResult {
    let d = setup()?;
    for (size, chunk) in [(3 * 4 * K + 17, 4 * K), (64 * K + 1, 64 * K)] {
        let (q, g) = mapped_mem(&d, size, chunk)?;
        check!(
            q.size == size && q.chunk_size == chunk && q.physical_size > size,
            "MEM_QUERY of {size} bytes in {chunk}-byte chunks: {q:?}"
        );
        let base = g.base();
        let phys = q.physical_size;
        for (offset, what) in [
            (0, "the first byte"),
            (1, "the second byte"),
            (phys / 2, "a byte in the middle"),
            (size - 1, "the last byte asked for"),
            (size, "the first byte of the tail"),
            (phys - 1, "the last byte of the mapping"),
        ] {
            let what = format!("{what} of a {size}-byte mem ({chunk}-byte chunks)");
            expect(&d, base + offset, &mem_byte(&q, base, offset), &what)?;
        }
        expect(
            &d,
            base + phys,
            &none(base + phys),
            &format!("the byte after a {size}-byte mem's mapping (the reservation's)"),
        )?;
        expect(
            &d,
            base - 1,
            &none(base - 1),
            &format!("the byte before a {size}-byte mem's mapping (the reservation's)"),
        )?;
        drop(g);
        d.mem_free(q.handle).ctx("MEM_FREE")?;
    }
    Ok(())
}

/// A mapping unmapped: its addresses are not ruvm memory any more, though the mem lives; a new
/// mapping of the mem answers at its own address.
fn ptr_after_munmap_is_none() -> TestResult {
    let d = setup()?;
    let a = d.mem_alloc(64 * K, 0, 0).ctx("MEM_ALLOC")?;
    let q = d.mem_query(a.handle).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(&d, &q).ctx("mmap")?;
    let base = map.as_ptr() as u64;
    expect(&d, base + 5, &mem_byte(&q, base, 5), "a mapped byte")?;
    drop(map);
    for offset in [0, 5, q.physical_size - 1] {
        expect(
            &d,
            base + offset,
            &none(base + offset),
            &format!("byte {offset} of the mapping after munmap"),
        )?;
    }
    let q = d.mem_query(a.handle).ctx("MEM_QUERY after munmap")?;
    check!(
        q.user_mappings == 0,
        "the mem after munmap: {} user mappings",
        q.user_mappings
    );
    let again = UserMap::of_mem(&d, &q).ctx("mmap again")?;
    let base = again.as_ptr() as u64;
    expect(
        &d,
        base + 7,
        &mem_byte(&q, base, 7),
        "a byte of a new mapping",
    )?;
    drop(again);
    d.mem_free(a.handle).ctx("MEM_FREE")
}

static A_STATIC: [u8; 64] = [7; 64];

/// Addresses that are not in a mem's user mapping: the stack, the heap (small and large
/// allocations), a static, the program's code, an anonymous shared mapping, a mapping of
/// /dev/zero, a page never mapped, 0, kernel and non-canonical addresses. Each answers NONE
/// with every output 0, whatever the outputs held going in (junk is put there), and with a
/// mem mapped meanwhile.
fn ptr_stack_heap_and_other_mappings_are_none() -> TestResult {
    let d = setup()?;
    // A mem mapped meanwhile: a lookup that found "some" mapping of the file would show.
    let (q, g) = mapped_mem(&d, 64 * K, 0)?;
    let on_stack = std::hint::black_box([0u8; 32]);
    let small = Box::new([1u8; 64]);
    let large = vec![2u8; 4 << 20];
    let code = ptr_stack_heap_and_other_mappings_are_none as fn() -> TestResult as usize;
    let anon = UserMapAnon::new(PAGE, MapFlags::MAP_SHARED)?;
    let zero = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/zero")
        .ctx("open /dev/zero")?;
    // SAFETY: a new shared mapping of /dev/zero at an address the kernel chooses.
    let dz = unsafe {
        mmap(
            None,
            NonZeroUsize::new(PAGE).ok_or(Stop::Fail("page".into()))?,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            &zero,
            0,
        )
    }
    .ctx("mmap of /dev/zero")?;
    // A page mapped, then unmapped: never ruvm memory, and nothing there now.
    let gone = {
        let m = UserMapAnon::new(PAGE, MapFlags::MAP_PRIVATE)?;
        m.ptr.as_ptr() as u64
    };
    let addrs: Vec<(u64, &str)> = vec![
        (on_stack.as_ptr() as u64, "a stack address"),
        (small.as_ptr() as u64, "a small heap allocation"),
        (large.as_ptr() as u64 + (2 << 20), "a large heap allocation"),
        (A_STATIC.as_ptr() as u64, "a static"),
        (code as u64, "the program's code"),
        (anon.ptr.as_ptr() as u64, "an anonymous shared mapping"),
        (dz.as_ptr() as u64, "a mapping of /dev/zero"),
        (gone, "a page unmapped"),
        (0, "address 0"),
        (1, "address 1"),
        (0xffff_8880_0000_0000, "a kernel address"),
        (0x8000_0000_0000_0000, "a non-canonical address"),
        (u64::MAX, "the last address"),
    ];
    for (addr, what) in addrs {
        expect(&d, addr, &none(addr), what)?;
        // Junk in every output going in: the answer is all zeroes still.
        let mut a = uapi::ruvm_ptr_attrs {
            addr,
            type_: MEM,
            handle: q.handle,
            offset: 1,
            base: 2,
            size: 3,
            physical_size: 4,
            chunk_size: 5,
            pool: 6,
            mapped_gpus: 7,
            backing: 8,
            ptr_flags: 9,
            ..Default::default()
        };
        d.call(cmd::PTR_ATTRS, &mut a)
            .ctx(&format!("PTR_ATTRS of {what}, junk in the outputs"))?;
        same(&a, &none(addr), &format!("{what}, junk in the outputs"))?;
    }
    // SAFETY: the mapping made above, not used after.
    unsafe { munmap(dz, PAGE) }.ctx("munmap of /dev/zero")?;
    drop((small, large, anon));
    let base = g.base();
    expect(&d, base, &mem_byte(&q, base, 0), "the mem mapped meanwhile")?;
    drop(g);
    d.mem_free(q.handle).ctx("MEM_FREE")
}

// --- pools and GPUs --------------------------------------------------------------------------

/// A pool's mem answers its pool; DMA-mapped for GPUs (granted on the pool, or with
/// MEM_MAP_GPU) it answers their bits, as MEM_QUERY does, and an unmap takes them away. A pool
/// mem made before the grant is not mapped for the GPU.
fn ptr_pool_and_gpu_mappings() -> TestResult {
    let d = setup()?;
    let (p, chunk) = d.pool_create(64 * K, u64::MAX).ctx("POOL_CREATE")?;
    let a = d
        .pool_alloc(p, 64 * K + 5, 0)
        .ctx("MEM_ALLOC from the pool")?;
    let qa = d.mem_query(a.handle).ctx("MEM_QUERY")?;
    check!(
        qa.chunk_size == chunk && qa.mapped_gpus == 0,
        "a mem of a pool of {chunk}-byte chunks, granted no GPU: {qa:?}"
    );
    let ga = Guarded::new(&d, &qa)?;
    let base = ga.base();
    let want = |q: &uapi::ruvm_mem_query, base: u64, offset: u64, pool: u64, gpus: u64| {
        uapi::ruvm_ptr_attrs {
            pool,
            mapped_gpus: gpus,
            ..mem_byte(q, base, offset)
        }
    };
    expect(
        &d,
        base + 64 * K,
        &want(&qa, base, 64 * K, p, 0),
        "the first byte of a pool mem's second chunk",
    )?;
    let ids = gpus(&d)?;
    if ids.is_empty() {
        println!("# the GPU parts skipped: no present GPU");
    } else {
        let g = ids[0];
        d.pool_access(p, g, true).ctx("POOL_SET_ACCESS")?;
        let b = d.pool_alloc(p, 64 * K, 0).ctx("MEM_ALLOC from the pool")?;
        let qb = d.mem_query(b.handle).ctx("MEM_QUERY")?;
        check!(
            qb.mapped_gpus == 1 << g,
            "a mem of a pool granted GPU {g}: mapped_gpus {:#x}",
            qb.mapped_gpus
        );
        let gb = Guarded::new(&d, &qb)?;
        let bb = gb.base();
        expect(
            &d,
            bb + 100,
            &want(&qb, bb, 100, p, 1 << g),
            &format!("a mem of a pool granted GPU {g}"),
        )?;
        expect(
            &d,
            base,
            &want(&qa, base, 0, p, 0),
            &format!("a mem made before the pool was granted GPU {g}"),
        )?;
        // A plain mem, DMA-mapped with MEM_MAP_GPU for each GPU in turn, then unmapped.
        let c = d.mem_alloc(8 * K, 0, 0).ctx("MEM_ALLOC")?;
        let qc = d.mem_query(c.handle).ctx("MEM_QUERY")?;
        let gc = Guarded::new(&d, &qc)?;
        let bc = gc.base();
        for (i, &id) in ids.iter().enumerate() {
            d.mem_gpu(true, c.handle, id).ctx("MEM_MAP_GPU")?;
            let q = d.mem_query(c.handle).ctx("MEM_QUERY")?;
            let m = mask(&ids[..=i]);
            check!(
                q.mapped_gpus == m,
                "MEM_QUERY after MEM_MAP_GPU on {:?}: mapped_gpus {:#x}",
                &ids[..=i],
                q.mapped_gpus
            );
            expect(
                &d,
                bc + 4 * K,
                &want(&qc, bc, 4 * K, 0, m),
                &format!("a plain mem mapped for GPUs {:?}", &ids[..=i]),
            )?;
        }
        d.mem_gpu(false, c.handle, g).ctx("MEM_UNMAP_GPU")?;
        let m = mask(&ids[1..]);
        expect(
            &d,
            bc,
            &want(&qc, bc, 0, 0, m),
            &format!("the plain mem unmapped from GPU {g}"),
        )?;
        drop((gb, gc));
        d.mem_free(b.handle).ctx("MEM_FREE")?;
        d.mem_free(c.handle).ctx("MEM_FREE")?;
    }
    drop(ga);
    d.mem_free(a.handle).ctx("MEM_FREE")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")
}
