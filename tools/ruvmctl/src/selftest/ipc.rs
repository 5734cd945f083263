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
mod lifetime;
mod pinned;
mod refusals;
use lifetime::*;
use pinned::*;
use refusals::*;

use super::harness::{cases, check, expect_errno, Case, Context, Stop, TestResult};
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
    cases![
        data::ipc_export_data_layout,
        ipc_two_processes_share_a_pool_mem,
        ipc_imported_pool_cannot_allocate,
        ipc_forged_stale_and_foreign_data_refused,
        ipc_exporter_frees_first_chunks_live_on,
        ipc_exporter_closes_first_chunks_live_on,
        ipc_stream_free_never_hands_imported_chunks,
        ipc_ptr_attrs_of_an_imported_mem,
        ipc_pinned_chunks_never_reused,
        ipc_pinned_chunks_never_lent_on_a_stream,
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
