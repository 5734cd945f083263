// SPDX-License-Identifier: GPL-2.0

//! IPC pools (CUDA's IPC memory pools): an exportable pool as a descriptor, a mem of it as
//! export data, and imports of both into other files, other processes' included.
//!
//! Bytes cross between the files through independent paths: written through one file's user
//! mapping, read through the other's, and copied by a GPU's copy engine into a mem the reader
//! allocated itself. Between processes the pool's descriptor travels by `SCM_RIGHTS` where the
//! kernel has `AF_UNIX` (the project's kernels and Debian's do); on a kernel without it
//! (`socketpair` is `ENOSYS`) the child imports the descriptor it inherited across `fork`
//! (said in a `#` line). The
//! export data travels by a pipe. Every case skips without `RUVM_FEATURE_IPC_POOLS`; the copy
//! engine parts use a simulated GPU and are left out (said) without one.

use std::{
    io::{IoSlice, IoSliceMut, Read, Write},
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd},
};

use nix::{
    errno::Errno,
    sys::{
        socket::{
            recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned,
            MsgFlags, SockFlag, SockType,
        },
        wait::WaitStatus,
    },
    unistd::pipe,
};

mod data;

use super::harness::{check, expect_errno, Case, Context, Stop, TestResult};
use super::shared::live;
use crate::{kmsg, pattern};
use libruvm::{uapi, ExportData, Ruvm, UserMap};

const K: u64 = 1024;
const SIZE: u64 = 64 * K;
const EXPORTABLE: u32 = uapi::ruvm_pool_create_flags_RUVM_POOL_EXPORTABLE;
const FLAG_EXPORTABLE: u32 = uapi::ruvm_pool_flags_RUVM_POOL_FLAG_EXPORTABLE;
const FLAG_IMPORTED: u32 = uapi::ruvm_pool_flags_RUVM_POOL_FLAG_IMPORTED;
const MEMS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_MEMS as usize;
const POOLS: usize = uapi::ruvm_audit_class_RUVM_AUDIT_POOLS as usize;
const SYSMEM_BYTES: usize = uapi::ruvm_audit_class_RUVM_AUDIT_SYSMEM_BYTES as usize;
/// The kernel log's words for an exporter that freed first.
const ORDER_BROKEN: &str = "freed by its exporter while";

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "ipc_export_data_layout",
            run: data::ipc_export_data_layout,
        },
        Case {
            name: "ipc_two_processes_share_a_pool_mem",
            run: ipc_two_processes_share_a_pool_mem,
        },
        Case {
            name: "ipc_imported_pool_cannot_allocate",
            run: ipc_imported_pool_cannot_allocate,
        },
        Case {
            name: "ipc_forged_stale_and_foreign_data_refused",
            run: ipc_forged_stale_and_foreign_data_refused,
        },
        Case {
            name: "ipc_exporter_frees_first_chunks_live_on",
            run: ipc_exporter_frees_first_chunks_live_on,
        },
        Case {
            name: "ipc_exporter_closes_first_chunks_live_on",
            run: ipc_exporter_closes_first_chunks_live_on,
        },
        Case {
            name: "ipc_stream_free_never_hands_imported_chunks",
            run: ipc_stream_free_never_hands_imported_chunks,
        },
        Case {
            name: "ipc_ptr_attrs_of_an_imported_mem",
            run: ipc_ptr_attrs_of_an_imported_mem,
        },
        Case {
            name: "ipc_pinned_chunks_never_reused",
            run: ipc_pinned_chunks_never_reused,
        },
        Case {
            name: "ipc_pinned_chunks_never_lent_on_a_stream",
            run: ipc_pinned_chunks_never_lent_on_a_stream,
        },
    ]
}

// --- what the cases share ------------------------------------------------------------------

/// The device, or a skip without IPC pools.
fn setup() -> Result<Ruvm, Stop> {
    let d = Ruvm::open().ctx("open")?;
    let features = d.info().ctx("INFO")?.features;
    if features & u64::from(uapi::RUVM_FEATURE_IPC_POOLS) == 0 {
        return Err(Stop::Skip(
            "the module has no IPC pools (RUVM_FEATURE_IPC_POOLS)".into(),
        ));
    }
    Ok(d)
}

/// An exportable pool of `d` and a mem of it of [`SIZE`] bytes holding pattern `seed`
/// (written through a user mapping, returned with it).
fn exported_mem(d: &Ruvm, seed: u64) -> Result<(u64, uapi::ruvm_mem_query, UserMap), Stop> {
    let (p, _) = d
        .pool_create_flags(0, 0, EXPORTABLE)
        .ctx("POOL_CREATE exportable")?;
    let info = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        info.pool_flags == FLAG_EXPORTABLE,
        "an exportable pool's flags are {:#x}",
        info.pool_flags
    );
    let h = d.pool_alloc(p, SIZE, 0).ctx("MEM_ALLOC from it")?.handle;
    let q = d.mem_query(h).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    write_pattern(&map, 0, SIZE, seed);
    Ok((p, q, map))
}

fn write_pattern(map: &UserMap, from: u64, len: u64, seed: u64) {
    for o in from..from + len {
        map.write(o as usize, pattern::byte_at(seed, o));
    }
}

/// How many bytes of `[from, from + len)` of `map` are not pattern `seed`.
fn bad_bytes(map: &UserMap, from: u64, len: u64, seed: u64) -> u64 {
    (from..from + len)
        .filter(|&o| map.read(o as usize) != pattern::byte_at(seed, o))
        .count() as u64
}

/// The audit's live mems, pools and sysmem bytes.
fn counts(d: &Ruvm) -> Result<[u64; 3], Stop> {
    let l = live(d)?;
    Ok([l[MEMS], l[POOLS], l[SYSMEM_BYTES]])
}

/// Checks that the audit's live mems, pools and sysmem bytes are back at `before`.
fn unchanged(d: &Ruvm, before: &[u64; 3]) -> TestResult {
    let after = counts(d)?;
    check!(
        after == *before,
        "mems, pools, sysmem bytes: {after:?} after, {before:?} before"
    );
    Ok(())
}

/// Pool `p` of `d` exported and imported into a new open file, and mem `h` of it exported
/// and imported there: the pool's descriptor, the export data, the other file, the pool's
/// handle there and the imported mem.
fn imported(
    d: &Ruvm,
    p: u64,
    h: u64,
) -> Result<(OwnedFd, ExportData, Ruvm, u64, uapi::ruvm_mem_import), Stop> {
    let fd = d.pool_export(p).ctx("POOL_EXPORT")?;
    let (_, data) = d.mem_export(h).ctx("MEM_EXPORT")?;
    let other = Ruvm::open().ctx("open a second file")?;
    let ip = other.pool_import(fd.as_fd()).ctx("POOL_IMPORT")?;
    let m = other.mem_import(ip, &data).ctx("MEM_IMPORT")?;
    Ok((fd, data, other, ip, m))
}

/// A simulated GPU with a copy engine, if there is one.
fn copy_gpu(d: &Ruvm) -> Result<Option<u32>, Stop> {
    match super::shared::sim_gpu(d) {
        Ok(g) => Ok(Some(g)),
        Err(Stop::Skip(why)) => {
            println!("# {why}: the copy engine part is left out");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Copies mem `src` (of `d`) into a new mem of `d` with GPU `g`'s copy engine and reads the
/// copy through its own mapping: how many bytes are not pattern `seed`.
fn engine_copy_bad_bytes(d: &Ruvm, g: u32, src: u64, seed: u64) -> Result<u64, String> {
    let dst = d
        .mem_alloc(SIZE, 0, 0)
        .map_err(|e| format!("MEM_ALLOC: {e}"))?
        .handle;
    for h in [src, dst] {
        d.mem_gpu(true, h, g)
            .map_err(|e| format!("MEM_MAP_GPU: {e}"))?;
    }
    d.ce_copy(g, dst, 0, src, 0, SIZE)
        .map_err(|e| format!("CE_COPY: {e}"))?;
    let q = d.mem_query(dst).map_err(|e| format!("MEM_QUERY: {e}"))?;
    let map = UserMap::of_mem(d, &q).map_err(|e| format!("mmap: {e}"))?;
    let bad = bad_bytes(&map, 0, SIZE, seed);
    drop(map);
    d.mem_free(dst).map_err(|e| format!("MEM_FREE: {e}"))?;
    Ok(bad)
}

/// How a descriptor reaches a forked child.
enum Passage {
    /// By `SCM_RIGHTS` on this socket (the child's end).
    Socket(OwnedFd, OwnedFd),
    /// Inherited across `fork` (no `AF_UNIX` in this kernel).
    Inherited,
}

impl Passage {
    fn new() -> Result<Self, Stop> {
        match socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        ) {
            Ok((a, b)) => Ok(Self::Socket(a, b)),
            Err(Errno::ENOSYS | Errno::EAFNOSUPPORT) => {
                println!(
                    "# no AF_UNIX in this kernel: the child imports the descriptor it inherited"
                );
                Ok(Self::Inherited)
            }
            Err(e) => Err(Stop::Fail(format!("socketpair: {e}"))),
        }
    }

    /// Parent: sends `fd` to the child.
    fn send(&self, fd: RawFd) -> TestResult {
        if let Self::Socket(parent, _) = self {
            let fds = [fd];
            let cmsg = [ControlMessage::ScmRights(&fds)];
            sendmsg::<()>(
                parent.as_raw_fd(),
                &[IoSlice::new(b"p")],
                &cmsg,
                MsgFlags::empty(),
                None,
            )
            .ctx("sendmsg SCM_RIGHTS")?;
        }
        Ok(())
    }

    /// Child: the descriptor the parent sent (or inherited, `inherited`).
    fn receive(&self, inherited: RawFd) -> Option<OwnedFd> {
        match self {
            Self::Inherited => {
                // SAFETY: the inherited descriptor is open in this process; it is borrowed for
                // the duplicate only.
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(inherited) };
                nix::unistd::dup(fd).ok()
            }
            Self::Socket(_, child) => {
                let mut byte = [0u8; 1];
                let mut iov = [IoSliceMut::new(&mut byte)];
                let mut space = nix::cmsg_space!(RawFd);
                let msg = recvmsg::<()>(
                    child.as_raw_fd(),
                    &mut iov,
                    Some(&mut space),
                    MsgFlags::empty(),
                )
                .ok()?;
                let fd = msg.cmsgs().ok()?.find_map(|c| match c {
                    ControlMessageOwned::ScmRights(v) => v.first().copied(),
                    _ => None,
                })?;
                // SAFETY: SCM_RIGHTS installed a new descriptor in this process.
                Some(unsafe { OwnedFd::from_raw_fd(fd) })
            }
        }
    }
}

/// Runs `f` in a forked child (its exit code), returning at once.
fn spawn(f: impl FnOnce() -> i32) -> Result<nix::unistd::Pid, Stop> {
    use nix::unistd::{fork, ForkResult};
    // SAFETY: the selftest runner is single-threaded when cases run; the child only makes
    // syscalls and touches memory, then exits without returning.
    match unsafe { fork() }.ctx("fork")? {
        ForkResult::Child => std::process::exit(f()),
        ForkResult::Parent { child } => Ok(child),
    }
}

/// A child's exit code from 10 names the step that failed: its text.
fn why(status: WaitStatus, steps: &[&str]) -> TestResult {
    match status {
        WaitStatus::Exited(_, 0) => Ok(()),
        WaitStatus::Exited(_, n) if (10..10 + steps.len() as i32).contains(&n) => Err(Stop::Fail(
            format!("the child: {} ({status:?})", steps[(n - 10) as usize]),
        )),
        _ => Err(Stop::Fail(format!(
            "the child ended otherwise ({status:?})"
        ))),
    }
}

// --- the cases ------------------------------------------------------------------------------

/// The canonical flow: process A exports a pool and a mem; process B (a forked child with its
/// own open file) imports both, reads A's bytes through its mapping and its GPU's copy engine,
/// is refused an allocation from the imported pool, writes its own bytes, frees first; A reads
/// B's bytes, then frees. Nothing is said in the log, and the audit is back where it was.
fn ipc_two_processes_share_a_pool_mem() -> TestResult {
    let d = setup()?;
    let before = counts(&d)?;
    let g = copy_gpu(&d)?;
    let marker = kmsg::write_marker().ok();
    let (seed_a, seed_b) = (0x1bca, 0x1bcb);
    let (p, q, map) = exported_mem(&d, seed_a)?;
    let pool_fd = d.pool_export(p).ctx("POOL_EXPORT")?;
    let (_, data) = d.mem_export(q.handle).ctx("MEM_EXPORT")?;
    let (_, again) = d.mem_export(q.handle).ctx("MEM_EXPORT again")?;
    check!(data == again, "two exports of one mem gave different data");
    let passage = Passage::new()?;
    let (data_rx, data_tx) = pipe().ctx("pipe")?;
    let (done_rx, done_tx) = pipe().ctx("pipe")?;
    let inherited = pool_fd.as_raw_fd();
    let steps = [
        "no pool descriptor arrived",
        "could not open the device",
        "POOL_IMPORT failed",
        "the imported pool is not flagged IMPORTED, or its attributes are not the exporter's",
        "MEM_ALLOC from the imported pool was not EINVAL",
        "the export data did not arrive",
        "MEM_IMPORT failed or answered another size",
        "mmap of the imported mem failed",
        "the imported mem's bytes are not the exporter's",
        "the copy engine read other bytes out of the imported mem",
        "MEM_FREE of the imported mem failed",
        "could not tell the parent",
    ];
    let passage = &passage;
    // The child's ends move into it (and close in the parent as it returns).
    let child = spawn(move || {
        let Some(fd) = passage.receive(inherited) else {
            return 10;
        };
        let Ok(own) = Ruvm::open() else { return 11 };
        let Ok(ip) = own.pool_import(fd.as_fd()) else {
            return 12;
        };
        drop(fd);
        let ok = own.pool_get(ip).is_ok_and(|i| {
            ip == p && i.pool_flags == FLAG_EXPORTABLE | FLAG_IMPORTED && i.used_current == SIZE
        });
        if !ok {
            return 13;
        }
        if own.pool_alloc(ip, SIZE, 0).err() != Some(Errno::EINVAL) {
            return 14;
        }
        let mut data: ExportData = [0; 64];
        if std::fs::File::from(data_rx).read_exact(&mut data).is_err() {
            return 15;
        }
        let Ok(m) = own.mem_import(ip, &data) else {
            return 16;
        };
        if m.size != SIZE {
            return 16;
        }
        let Ok(mq) = own.mem_query(m.handle) else {
            return 17;
        };
        let Ok(view) = UserMap::of_mem(&own, &mq) else {
            return 17;
        };
        if bad_bytes(&view, 0, SIZE, seed_a) != 0 {
            return 18;
        }
        if let Some(g) = g {
            if engine_copy_bad_bytes(&own, g, m.handle, seed_a) != Ok(0) {
                return 19;
            }
        }
        write_pattern(&view, 0, SIZE, seed_b);
        drop(view);
        if own.mem_free(m.handle).is_err() {
            return 20;
        }
        if std::fs::File::from(done_tx).write_all(b"d").is_err() {
            return 21;
        }
        0
    })?;
    // The parent's side, while the child waits for it.
    let sent = passage.send(inherited).and_then(|()| {
        std::fs::File::from(data_tx)
            .write_all(&data)
            .ctx("write the data")
    });
    let status = nix::sys::wait::waitpid(child, None).ctx("waitpid")?;
    why(status, &steps)?;
    sent?;
    let mut done = [0u8; 1];
    std::fs::File::from(done_rx)
        .read_exact(&mut done)
        .ctx("the child's word")?;
    let bad = bad_bytes(&map, 0, SIZE, seed_b);
    check!(
        bad == 0,
        "{bad} bytes the importer wrote are not in the exporter's mapping"
    );
    if let Some(g) = g {
        let bad = engine_copy_bad_bytes(&d, g, q.handle, seed_b).map_err(Stop::Fail)?;
        check!(
            bad == 0,
            "the exporter's copy engine read {bad} bytes that are not the importer's"
        );
    }
    drop(map);
    d.mem_free(q.handle).ctx("MEM_FREE")?;
    drop(pool_fd);
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    let said = order_broken_since(marker.as_deref())?;
    check!(
        said == 0,
        "the log says an exporter freed first ({said} times), but the importer did"
    );
    unchanged(&d, &before)?;
    Ok(())
}

/// How many times the log said an exporter freed first since `marker` (0 if the log cannot be
/// read).
fn order_broken_since(marker: Option<&str>) -> Result<usize, Stop> {
    let Ok(all) = kmsg::read_kmsg() else {
        return Ok(0);
    };
    let Some(after) = kmsg::since(&all, marker) else {
        return Ok(0);
    };
    Ok(after.iter().filter(|m| m.contains(ORDER_BROKEN)).count())
}

/// An imported pool (in another file of this process) serves POOL_GET, MEM_IMPORT and
/// POOL_DESTROY only: allocations, GPU_POOL, POOL_SET, POOL_TRIM and POOL_SET_ACCESS are
/// EINVAL; importing it again (or into its own file) answers the same handle; destroying it
/// in the importer leaves the exporter's pool as it was.
fn ipc_imported_pool_cannot_allocate() -> TestResult {
    let d = setup()?;
    let (p, q, map) = exported_mem(&d, 7)?;
    let fd = d.pool_export(p).ctx("POOL_EXPORT")?;
    let other = Ruvm::open().ctx("open a second file")?;
    let ip = other.pool_import(fd.as_fd()).ctx("POOL_IMPORT")?;
    check!(ip == p, "the import's handle {ip} is not the pool's {p}");
    let again = other.pool_import(fd.as_fd()).ctx("POOL_IMPORT again")?;
    check!(again == p, "a second import answered {again}");
    let own = d
        .pool_import(fd.as_fd())
        .ctx("POOL_IMPORT into its own file")?;
    check!(
        own == p,
        "an import into the pool's own file answered {own}"
    );
    let mine = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        mine.pool_flags == FLAG_EXPORTABLE,
        "the exporter's pool flags are {:#x}",
        mine.pool_flags
    );
    let theirs = other.pool_get(ip).ctx("POOL_GET of the import")?;
    check!(
        theirs.pool_flags == FLAG_EXPORTABLE | FLAG_IMPORTED
            && theirs.used_current == mine.used_current
            && theirs.reserved_current == mine.reserved_current
            && theirs.chunk_size == mine.chunk_size,
        "the import's attributes {theirs:?} are not the pool's {mine:?} with IMPORTED"
    );
    let e = Errno::EINVAL;
    expect_errno(
        other.pool_alloc(ip, SIZE, 0),
        e,
        "MEM_ALLOC from an imported pool",
    )?;
    expect_errno(
        other.pool_set(ip, uapi::ruvm_pool_attr_RUVM_POOL_ATTR_RELEASE_THRESHOLD, 0),
        e,
        "POOL_SET",
    )?;
    expect_errno(other.pool_trim(ip, 0), e, "POOL_TRIM")?;
    expect_errno(other.pool_access(ip, 0, true), e, "POOL_SET_ACCESS")?;
    expect_errno(
        other.pool_export(ip).map(drop),
        e,
        "POOL_EXPORT of an imported pool",
    )?;
    if let Ok(g) = super::shared::sim_gpu(&other) {
        expect_errno(
            other.gpu_pool_set(g, ip),
            e,
            "GPU_POOL SET of an imported pool",
        )?;
        if let Ok(s) = other.stream_create(g) {
            let mut ops = vec![libruvm::op::alloc(ip, SIZE, false)];
            expect_errno(
                other.stream_submit_mut(s.handle, &mut ops),
                e,
                "RUVM_OP_ALLOC from an imported pool",
            )?;
            other.stream_destroy(s.handle).ctx("STREAM_DESTROY")?;
        }
    }
    other.pool_destroy(ip).ctx("POOL_DESTROY of the import")?;
    expect_errno(
        other.pool_get(ip),
        Errno::ENOENT,
        "POOL_GET after the import's destroy",
    )?;
    let still = d.pool_get(p).ctx("POOL_GET of the exporter's pool")?;
    check!(
        still.used_current == SIZE,
        "the exporter's pool after the import's destroy: {still:?}"
    );
    // A non-exportable pool is not exported; another kind of descriptor is not a pool's.
    let (plain, _) = d.pool_create(0, 0).ctx("POOL_CREATE")?;
    expect_errno(
        d.pool_export(plain).map(drop),
        e,
        "POOL_EXPORT of a pool made without EXPORTABLE",
    )?;
    expect_errno(
        d.pool_export(0xdead_beef).map(drop),
        Errno::ENOENT,
        "POOL_EXPORT of no pool of the file",
    )?;
    expect_errno(
        other.pool_export(p).map(drop),
        Errno::ENOENT,
        "POOL_EXPORT of the handle of an import destroyed",
    )?;
    let null = std::fs::File::open("/dev/null").ctx("/dev/null")?;
    expect_errno(
        other.pool_import(null.as_fd()),
        e,
        "POOL_IMPORT of /dev/null",
    )?;
    expect_errno(
        other.pool_import(d.as_fd()),
        e,
        "POOL_IMPORT of a /dev/ruvm file",
    )?;
    expect_errno(
        other.pool_import_raw(-1),
        Errno::EBADF,
        "POOL_IMPORT of fd -1",
    )?;
    expect_errno(
        other.pool_import_raw(100_000),
        Errno::EBADF,
        "POOL_IMPORT of a closed fd",
    )?;
    drop(map);
    d.mem_free(q.handle).ctx("MEM_FREE")?;
    d.pool_destroy(plain).ctx("POOL_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    // The pool is gone: its descriptor imports nothing.
    expect_errno(
        other.pool_import(fd.as_fd()),
        Errno::ENOENT,
        "POOL_IMPORT of a destroyed pool",
    )?;
    Ok(())
}

/// Export data is refused unless it names a live exported mem of the pool it is imported
/// through, with the right key: forged keys, another pool's data, a freed mem's, a corrupted
/// version, and mems that cannot be exported.
fn ipc_forged_stale_and_foreign_data_refused() -> TestResult {
    let d = setup()?;
    let before = counts(&d)?;
    let (p, q, map) = exported_mem(&d, 9)?;
    let (p2, q2, map2) = exported_mem(&d, 10)?;
    let fd = d.pool_export(p).ctx("POOL_EXPORT")?;
    let other = Ruvm::open().ctx("open a second file")?;
    let ip = other.pool_import(fd.as_fd()).ctx("POOL_IMPORT")?;
    let (pool_of, data) = d.mem_export(q.handle).ctx("MEM_EXPORT")?;
    check!(pool_of == p, "MEM_EXPORT names pool {pool_of}, not {p}");
    let (_, data2) = d
        .mem_export(q2.handle)
        .ctx("MEM_EXPORT of the other pool's mem")?;
    let n = Errno::ENOENT;
    for byte in 24..40 {
        let mut forged = data;
        forged[byte] ^= 0x5a;
        expect_errno(
            other.mem_import(ip, &forged),
            n,
            &format!("MEM_IMPORT with key byte {byte} changed"),
        )?;
    }
    let mut forged = data;
    forged[16] ^= 1;
    expect_errno(
        other.mem_import(ip, &forged),
        n,
        "MEM_IMPORT naming another mem",
    )?;
    expect_errno(
        other.mem_import(ip, &data2),
        n,
        "MEM_IMPORT of another pool's data",
    )?;
    let mut forged = data;
    forged[0] ^= 1;
    expect_errno(
        other.mem_import(ip, &forged),
        Errno::EINVAL,
        "MEM_IMPORT with a wrong version",
    )?;
    let mut forged = data;
    forged[63] = 1;
    expect_errno(
        other.mem_import(ip, &forged),
        Errno::EINVAL,
        "MEM_IMPORT with a non-zero tail",
    )?;
    expect_errno(
        other.mem_import(ip + 1_000_000, &data),
        n,
        "MEM_IMPORT through no pool",
    )?;
    // The right data imports; the imported mem cannot be exported again.
    let m = other.mem_import(ip, &data).ctx("MEM_IMPORT")?;
    expect_errno(
        other.mem_export(m.handle),
        Errno::EINVAL,
        "MEM_EXPORT of an imported mem",
    )?;
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    // A mem of no pool, or of a pool that is not exportable, has no export data.
    let plain = d.mem_alloc(SIZE, 0, 0).ctx("MEM_ALLOC")?.handle;
    expect_errno(
        d.mem_export(plain),
        Errno::EINVAL,
        "MEM_EXPORT of a mem of no pool",
    )?;
    let (np, _) = d.pool_create(0, 0).ctx("POOL_CREATE")?;
    let pm = d.pool_alloc(np, SIZE, 0).ctx("MEM_ALLOC from it")?.handle;
    expect_errno(
        d.mem_export(pm),
        Errno::EINVAL,
        "MEM_EXPORT of a non-exportable pool's mem",
    )?;
    expect_errno(
        d.mem_import(np, &data),
        Errno::EINVAL,
        "MEM_IMPORT through a non-exportable pool",
    )?;
    expect_errno(d.mem_export(u64::MAX), n, "MEM_EXPORT of no mem")?;
    // Freed: its data is stale, and its handle exports nothing.
    drop(map);
    d.mem_free(q.handle).ctx("MEM_FREE")?;
    expect_errno(
        other.mem_import(ip, &data),
        n,
        "MEM_IMPORT of a freed mem's data",
    )?;
    drop(map2);
    for h in [q2.handle, plain, pm] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    for pool in [p, p2, np] {
        d.pool_destroy(pool).ctx("POOL_DESTROY")?;
    }
    drop((other, fd));
    unchanged(&d, &before)?;
    Ok(())
}

/// The exporter frees first (CUDA's rule broken): the import keeps reading the bytes, the
/// pool keeps the chunks used (no new mem of the pool gets them), the log says so once; the
/// import's free then gives them back.
fn ipc_exporter_frees_first_chunks_live_on() -> TestResult {
    let d = setup()?;
    let before = counts(&d)?;
    let marker = kmsg::write_marker().ok();
    let (p, q, map) = exported_mem(&d, 21)?;
    let (fd, _data, other, _ip, m) = imported(&d, p, q.handle)?;
    let mq = other.mem_query(m.handle).ctx("MEM_QUERY")?;
    let view = UserMap::of_mem(&other, &mq).ctx("mmap of the import")?;
    drop(map);
    d.mem_free(q.handle).ctx("MEM_FREE by the exporter")?;
    let info = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        info.used_current == SIZE,
        "after the exporter's free the pool's used is {}",
        info.used_current
    );
    // Every new mem of the pool gets other chunks: writing them leaves the import's bytes.
    let mut fresh = Vec::new();
    for i in 0..4 {
        let h = d
            .pool_alloc(p, SIZE, 0)
            .ctx("MEM_ALLOC from the pool")?
            .handle;
        let fq = d.mem_query(h).ctx("MEM_QUERY")?;
        let fm = UserMap::of_mem(&d, &fq).ctx("mmap")?;
        write_pattern(&fm, 0, SIZE, 100 + i);
        fresh.push((h, fm));
    }
    let bad = bad_bytes(&view, 0, SIZE, 21);
    check!(
        bad == 0,
        "{bad} bytes of the import changed after the exporter freed and reallocated"
    );
    for (h, fm) in fresh {
        drop(fm);
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    let said = order_broken_since(marker.as_deref())?;
    if kmsg::read_kmsg().is_ok() {
        check!(
            said == 1,
            "the log said the order was broken {said} times, wanted once"
        );
    }
    // A trim gives back what is cached, never the chunks the import holds.
    d.pool_trim(p, 0).ctx("POOL_TRIM")?;
    let info = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        info.reserved_current == SIZE && info.used_current == SIZE,
        "after a trim with the import alive: reserved {} used {}, wanted {SIZE} and {SIZE}",
        info.reserved_current,
        info.used_current
    );
    check!(
        bad_bytes(&view, 0, SIZE, 21) == 0,
        "the import's bytes changed with the trim"
    );
    drop(view);
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    // The release threshold (0) holds for an exported pool too (CUDA's never gives back).
    let info = d.pool_get(p).ctx("POOL_GET")?;
    check!(
        info.used_current == 0 && info.reserved_current == 0,
        "after the import's free the pool's used is {} and reserved {} (threshold 0)",
        info.used_current,
        info.reserved_current
    );
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drop((other, fd));
    unchanged(&d, &before)?;
    Ok(())
}

/// The exporter's file closes (its pool and mem with it) while an import lives: the import
/// reads the bytes (mapping and copy engine), and its free ends everything.
fn ipc_exporter_closes_first_chunks_live_on() -> TestResult {
    let d = setup()?;
    let before = counts(&d)?;
    let g = copy_gpu(&d)?;
    let exporter = Ruvm::open().ctx("open the exporter's file")?;
    let (p, _q, map) = exported_mem(&exporter, 31)?;
    let fd = exporter.pool_export(p).ctx("POOL_EXPORT")?;
    let (_, data) = exporter.mem_export(_q.handle).ctx("MEM_EXPORT")?;
    let ip = d.pool_import(fd.as_fd()).ctx("POOL_IMPORT")?;
    let m = d.mem_import(ip, &data).ctx("MEM_IMPORT")?;
    drop(map);
    drop(exporter);
    // The pool was closed with its file: its descriptor imports nothing more
    // into a file that has it not; one that has it already keeps it, and the pool's mems are
    // not imported through it any more.
    let third = Ruvm::open().ctx("open a third file")?;
    expect_errno(
        third.pool_import(fd.as_fd()),
        Errno::ENOENT,
        "POOL_IMPORT into a new file after the exporter closed",
    )?;
    let again = d
        .pool_import(fd.as_fd())
        .ctx("POOL_IMPORT again into the importing file")?;
    check!(again == ip, "the import again answered {again}, not {ip}");
    expect_errno(
        d.mem_import(ip, &data),
        Errno::ENOENT,
        "MEM_IMPORT through the pool after its file closed",
    )?;
    drop(third);
    let mq = d.mem_query(m.handle).ctx("MEM_QUERY of the import")?;
    let view = UserMap::of_mem(&d, &mq).ctx("mmap of the import")?;
    let bad = bad_bytes(&view, 0, SIZE, 31);
    check!(
        bad == 0,
        "{bad} bytes of the import changed when the exporter closed"
    );
    if let Some(g) = g {
        let bad = engine_copy_bad_bytes(&d, g, m.handle, 31).map_err(Stop::Fail)?;
        check!(
            bad == 0,
            "the copy engine read {bad} wrong bytes from the import"
        );
    }
    drop(view);
    d.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    d.pool_destroy(ip).ctx("POOL_DESTROY of the import")?;
    drop(fd);
    unchanged(&d, &before)?;
    Ok(())
}

/// A FREE in a failed submission withdraws a mem's export data. A free on a stream of an
/// exported mem while an import lives, followed in the same submission by an allocation from
/// the pool (which would borrow the freed chunks): the new mem
/// gets other chunks, and writing it leaves the import's bytes.
fn ipc_stream_free_never_hands_imported_chunks() -> TestResult {
    let d = setup()?;
    let Ok(g) = super::shared::sim_gpu(&d) else {
        return Err(Stop::Skip(
            "no simulated GPU (sim_gpus=N) for a stream".into(),
        ));
    };
    if d.info().ctx("INFO")?.features & u64::from(uapi::RUVM_FEATURE_STREAM_ALLOC) == 0 {
        return Err(Stop::Skip("no stream-ordered allocation".into()));
    }
    let before = counts(&d)?;
    let (p, q, map) = exported_mem(&d, 41)?;
    d.pool_access(p, g, true).ctx("POOL_SET_ACCESS")?;
    let (fd, _data, other, _ip, m) = imported(&d, p, q.handle)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    // A FREE in a submission that fails still withdraws the mem: it has no export data
    // after, never exported or exported (an export racing the planning of a FREE and an ALLOC
    // that borrows its chunks would otherwise share them with an import).
    for exported_before in [false, true] {
        let x = d.pool_alloc(p, SIZE, 0).ctx("MEM_ALLOC")?.handle;
        if exported_before {
            d.mem_export(x).ctx("MEM_EXPORT")?;
        }
        let mut failing = vec![
            libruvm::op::free(x),
            libruvm::op::alloc(p, SIZE, false),
            libruvm::op::copy(u64::MAX, 0, x, 0, SIZE),
        ];
        check!(
            d.stream_submit_mut(s, &mut failing).is_err(),
            "a submission copying into no mem was queued"
        );
        expect_errno(
            d.mem_export(x).map(drop),
            Errno::ENOENT,
            &format!("MEM_EXPORT after a failed FREE (exported before: {exported_before})"),
        )?;
        d.mem_free(x).ctx("MEM_FREE")?;
    }
    let mut ops = vec![
        libruvm::op::free(q.handle),
        libruvm::op::alloc(p, SIZE, false),
    ];
    drop(map);
    d.stream_submit_mut(s, &mut ops)
        .ctx("STREAM_SUBMIT of FREE, ALLOC")?;
    let (h, _) = libruvm::op::allocated(&ops[1]);
    d.stream_sync(s, 20_000).ctx("STREAM_SYNC")?;
    let hq = d.mem_query(h).ctx("MEM_QUERY of the new mem")?;
    let fresh = UserMap::of_mem(&d, &hq).ctx("mmap of the new mem")?;
    write_pattern(&fresh, 0, SIZE, 42);
    drop(fresh);
    let mq = other.mem_query(m.handle).ctx("MEM_QUERY of the import")?;
    let view = UserMap::of_mem(&other, &mq).ctx("mmap of the import")?;
    let bad = bad_bytes(&view, 0, SIZE, 41);
    check!(
        bad == 0,
        "{bad} bytes of the import were overwritten through the allocation after the free"
    );
    let a = d
        .dma_addrs(h, g, 0, 64)
        .ctx("MEM_DMA_ADDRS of the new mem")?;
    other
        .mem_gpu(true, m.handle, g)
        .ctx("MEM_MAP_GPU of the import")?;
    let b = other
        .dma_addrs(m.handle, g, 0, 64)
        .ctx("MEM_DMA_ADDRS of the import")?;
    check!(
        a.iter().all(|x| !b.contains(x)),
        "the new mem shares chunks with the import: {a:x?} / {b:x?}"
    );
    drop(view);
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    d.mem_free(h).ctx("MEM_FREE of the new mem")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    drop((other, fd));
    unchanged(&d, &before)?;
    Ok(())
}

/// Pointer attributes of an imported mem's mapping: the importer's handle, the exporting pool,
/// RUVM_PTR_IMPORTED; the exporter's own mapping is not flagged.
fn ipc_ptr_attrs_of_an_imported_mem() -> TestResult {
    let d = setup()?;
    let (p, q, map) = exported_mem(&d, 51)?;
    let (_fd, _data, other, _ip, m) = imported(&d, p, q.handle)?;
    let mq = other.mem_query(m.handle).ctx("MEM_QUERY")?;
    check!(
        mq.mmap_offset == m.mmap_offset && mq.size == SIZE,
        "MEM_QUERY of the import: {mq:?}"
    );
    let view = UserMap::of_mem(&other, &mq).ctx("mmap")?;
    let at = view.as_ptr() as u64 + 100;
    let a = other.ptr_attrs(at).ctx("PTR_ATTRS in the importer")?;
    check!(
        a.type_ == uapi::ruvm_ptr_type_RUVM_PTR_MEM
            && a.handle == m.handle
            && a.offset == 100
            && a.pool == p
            && a.ptr_flags == uapi::ruvm_ptr_flags_RUVM_PTR_IMPORTED
            && a.size == SIZE,
        "the import's byte 100: {a:?}"
    );
    let mine = d
        .ptr_attrs(map.as_ptr() as u64 + 100)
        .ctx("PTR_ATTRS in the exporter")?;
    check!(
        mine.handle == q.handle && mine.pool == p && mine.ptr_flags == 0,
        "the exporter's byte 100: {mine:?}"
    );
    drop(view);
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    drop(map);
    d.mem_free(q.handle).ctx("MEM_FREE")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    Ok(())
}

/// A mem of [`SIZE`] bytes of exportable pool `p` of `d` holding pattern `seed`, imported into
/// a new file, whose mapping of its import had the first page spliced into a pipe (which holds
/// the page) and was then unmapped.
struct Pinned {
    h: u64,
    other: Ruvm,
    m: uapi::ruvm_mem_import,
    rx: OwnedFd,
    tx: OwnedFd,
    _fd: OwnedFd,
}

fn pinned_import(d: &Ruvm, p: u64, seed: u64) -> Result<Pinned, Stop> {
    let h = d.pool_alloc(p, SIZE, 0).ctx("MEM_ALLOC")?.handle;
    let q = d.mem_query(h).ctx("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).ctx("mmap")?;
    write_pattern(&map, 0, SIZE, seed);
    drop(map);
    let (fd, _, other, _, m) = imported(d, p, h)?;
    let mq = other.mem_query(m.handle).ctx("MEM_QUERY of the import")?;
    let imap = UserMap::of_mem(&other, &mq).ctx("mmap of the import")?;
    let (rx, tx) = pipe().ctx("pipe")?;
    let n = super::shared::vmsplice_page(imap.as_ptr(), &tx).ctx("vmsplice")?;
    check!(n == 4096, "vmsplice of the import's first page gave {n}");
    drop(imap);
    Ok(Pinned {
        h,
        other,
        m,
        rx,
        tx,
        _fd: fd,
    })
}

/// The page a pipe holds (read out of it).
fn pipe_page(rx: OwnedFd) -> Result<[u8; 4096], Stop> {
    let mut got = [0u8; 4096];
    std::fs::File::from(rx)
        .read_exact(&mut got)
        .ctx("read the pipe")?;
    Ok(got)
}

/// How many bytes of a first page are pattern `seed`.
fn same_bytes(page: &[u8; 4096], seed: u64) -> usize {
    (0..4096u64)
        .filter(|&o| page[o as usize] == pattern::byte_at(seed, o))
        .count()
}

/// An importer that pinned a page of its import through its own mapping (`vmsplice` into a
/// pipe, which holds the page) cannot read the exporter's later mems: once both let go, the
/// chunks are not cached (a pool keeping everything, exact fit) but given back, so the
/// exporter's next allocation of the same size gets other chunks, and what the pipe holds is
/// the bytes of the time of the pin.
fn ipc_pinned_chunks_never_reused() -> TestResult {
    let d = setup()?;
    let (seed_a, seed_b) = (0x1bd0, 0x1bd1);
    let (p, _) = d
        .pool_create_flags(0, u64::MAX, EXPORTABLE)
        .ctx("POOL_CREATE exportable, keeping everything")?;
    let Pinned {
        h,
        other,
        m,
        rx,
        tx,
        _fd,
    } = pinned_import(&d, p, seed_a)?;
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    d.mem_free(h).ctx("MEM_FREE")?;
    let again = d.pool_alloc(p, SIZE, 0).ctx("MEM_ALLOC again")?.handle;
    let q2 = d.mem_query(again).ctx("MEM_QUERY")?;
    let map2 = UserMap::of_mem(&d, &q2).ctx("mmap")?;
    write_pattern(&map2, 0, SIZE, seed_b);
    let got = pipe_page(rx)?;
    let (new, old) = (same_bytes(&got, seed_b), same_bytes(&got, seed_a));
    check!(
        old == 4096,
        "the pinned page holds {new} bytes of the exporter's later mem and {old} of its own"
    );
    drop((map2, tx));
    d.mem_free(again).ctx("MEM_FREE")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    Ok(())
}

/// A page of the import's mapping pinned in a pipe, then a `FREE` of the exported mem on a
/// stream (its chunks kept for the import), then the import's free (the chunks come back to
/// the pool's pending list, the free not observed), then an `ALLOC` of the same size on the same
/// stream, which may reuse what that stream freed: the new mem gets other chunks, and the pipe
/// still reads the bytes of the time of the pin.
fn ipc_pinned_chunks_never_lent_on_a_stream() -> TestResult {
    let d = setup()?;
    let g = super::shared::sim_gpu(&d)?;
    let (seed_a, seed_b) = (0x1bd2, 0x1bd3);
    let (p, _) = d
        .pool_create_flags(0, u64::MAX, EXPORTABLE)
        .ctx("POOL_CREATE exportable, keeping everything")?;
    d.pool_access(p, g, true).ctx("POOL_SET_ACCESS")?;
    let Pinned {
        h,
        other,
        m,
        rx,
        tx,
        _fd,
    } = pinned_import(&d, p, seed_a)?;
    let s = d.stream_create(g).ctx("STREAM_CREATE")?.handle;
    let seqno = d
        .stream_submit(s, &[libruvm::op::free(h)])
        .ctx("STREAM_SUBMIT FREE")?;
    // The stream reaches the FREE (not observed: no synchronize), so that the import's free
    // brings the chunks back to the pending list rather than with the FREE's own drop.
    let t = std::time::Instant::now();
    while d.stream_query(s).ctx("STREAM_QUERY")?.completed < seqno {
        check!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "the stream did not reach its FREE"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let before = d.pool_get(p).ctx("POOL_GET")?;
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    let mut ops = [libruvm::op::alloc(p, SIZE, false)];
    d.stream_submit_mut(s, &mut ops)
        .ctx("STREAM_SUBMIT ALLOC")?;
    let after = d.pool_get(p).ctx("POOL_GET")?;
    d.stream_sync(s, 10_000).ctx("STREAM_SYNC")?;
    let (again, _) = libruvm::op::allocated(&ops[0]);
    println!(
        "# pool before the import's free: used {} pending {}; after the ALLOC: used {} pending {}",
        before.used_current, before.pending_bytes, after.used_current, after.pending_bytes
    );
    let q2 = d.mem_query(again).ctx("MEM_QUERY")?;
    let map2 = UserMap::of_mem(&d, &q2).ctx("mmap")?;
    write_pattern(&map2, 0, SIZE, seed_b);
    let old = same_bytes(&pipe_page(rx)?, seed_a);
    check!(
        old == 4096,
        "the pinned page holds {old} bytes of its own, the rest of the stream's next mem"
    );
    drop((map2, tx));
    d.mem_free(again).ctx("MEM_FREE")?;
    d.stream_destroy(s).ctx("STREAM_DESTROY")?;
    d.pool_destroy(p).ctx("POOL_DESTROY")?;
    Ok(())
}
