// SPDX-License-Identifier: GPL-2.0

//! The IPC pool commands (CUDA's `cudaMemPoolExportToShareableHandle`, `ImportFromShareableHandle`,
//! `ExportPointer`, `ImportPointer`): `pool export --run`, `pool import`, `export`, `import`, one
//! ioctl each, and `pool share`, two processes sharing a pool end to end.
//!
//! A pool's descriptor lives only as long as a process holds it, so `pool export` runs the
//! importing command itself, the descriptor inherited; export data is plain bytes (hex) that
//! travel by any means.
//!
//! A pool and its descriptor live only as long as the open file that made them, so the whole
//! exchange runs in one command: this process (the exporter) makes an exportable pool and a mem
//! of it, writes a pattern through its mapping and exports both; a forked child (the importer,
//! with an open file of its own) receives the pool's descriptor by `SCM_RIGHTS` (or, on a
//! kernel without `AF_UNIX`, the one it inherited) and the export data by a pipe, imports them,
//! checks the exporter's bytes through its own mapping (and a GPU's copy engine with `--gpu`),
//! is refused an allocation from the imported pool, writes its own pattern and frees its import
//! first (CUDA's order); the exporter then checks the importer's bytes.

use std::{
    io::{IoSlice, IoSliceMut, Read, Write},
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    time::Instant,
};

use anyhow::{anyhow, bail, Context as _, Result};
use libruvm::{uapi, Errno, ExportData, Ruvm, UserMap};
use nix::{
    sys::{
        socket::{
            recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned,
            MsgFlags, SockFlag, SockType,
        },
        wait::{waitpid, WaitStatus},
    },
    unistd::{fork, pipe, ForkResult},
};
use serde::Serialize;

use crate::output::{fields, Report};
use crate::pattern;
use crate::units::show_size;

/// What the importer did, as it reports it to the exporter (one word each, in this order).
#[derive(Clone, Copy, Default, Serialize)]
pub struct Importer {
    pub pid: u64,
    /// Its handle of the pool (the pool's own).
    pub pool: u64,
    /// Its handle of the imported mem.
    pub mem: u64,
    /// Bytes of the exporter's pattern it read wrong through its mapping.
    pub bad_mapped: u64,
    /// Bytes the copy engine read wrong out of the import (`u64::MAX`: not tried).
    pub bad_engine: u64,
    /// The errno of its allocation from the imported pool (0: it was not refused).
    pub alloc_errno: u64,
    pub import_pool_ns: u64,
    pub import_mem_ns: u64,
}

const WORDS: usize = 8;

impl Importer {
    fn words(&self) -> [u64; WORDS] {
        [
            self.pid,
            self.pool,
            self.mem,
            self.bad_mapped,
            self.bad_engine,
            self.alloc_errno,
            self.import_pool_ns,
            self.import_mem_ns,
        ]
    }

    fn from_words(w: [u64; WORDS]) -> Self {
        Self {
            pid: w[0],
            pool: w[1],
            mem: w[2],
            bad_mapped: w[3],
            bad_engine: w[4],
            alloc_errno: w[5],
            import_pool_ns: w[6],
            import_mem_ns: w[7],
        }
    }
}

/// What `pool share` saw.
#[derive(Serialize)]
pub struct Shared {
    pub size: u64,
    pub exporter_pid: u32,
    pub pool: u64,
    pub mem: u64,
    /// How the pool's descriptor reached the importer: `SCM_RIGHTS` or `inherited`.
    pub passage: &'static str,
    pub importer: Importer,
    /// Bytes of the importer's pattern the exporter read wrong through its mapping.
    pub bad_back: u64,
    pub export_pool_ns: u64,
    pub export_mem_ns: u64,
}

impl Report for Shared {
    fn render(&self) -> String {
        let us = |ns: u64| format!("{:.1} us", ns as f64 / 1000.0);
        let ok = |bad: u64| {
            if bad == 0 {
                "every byte right".to_string()
            } else {
                format!("{bad} bytes WRONG")
            }
        };
        fields([
            (
                "exporter",
                format!(
                    "pid {}: pool {} (exportable), mem {} of {}",
                    self.exporter_pid,
                    self.pool,
                    self.mem,
                    show_size(self.size)
                ),
            ),
            (
                "importer",
                format!(
                    "pid {}: pool {} imported, mem {} imported (descriptor by {})",
                    self.importer.pid, self.importer.pool, self.importer.mem, self.passage
                ),
            ),
            (
                "export",
                format!(
                    "pool {}, mem {}",
                    us(self.export_pool_ns),
                    us(self.export_mem_ns)
                ),
            ),
            (
                "import",
                format!(
                    "pool {}, mem {}",
                    us(self.importer.import_pool_ns),
                    us(self.importer.import_mem_ns)
                ),
            ),
            ("importer read (mapping)", ok(self.importer.bad_mapped)),
            (
                "importer read (copy engine)",
                if self.importer.bad_engine == u64::MAX {
                    "not tried (no --gpu)".into()
                } else {
                    ok(self.importer.bad_engine)
                },
            ),
            (
                "importer's allocation",
                match self.importer.alloc_errno {
                    0 => "NOT refused".into(),
                    e => format!("refused ({})", Errno::from_raw(e as i32)),
                },
            ),
            ("exporter read back", ok(self.bad_back)),
        ])
    }

    fn failure(&self) -> Option<String> {
        let i = &self.importer;
        let engine_bad = i.bad_engine != 0 && i.bad_engine != u64::MAX;
        if i.bad_mapped != 0 || engine_bad || self.bad_back != 0 {
            Some("the bytes did not cross between the processes".into())
        } else if i.alloc_errno != Errno::EINVAL as u64 {
            Some("the importer's allocation from the imported pool was not EINVAL".into())
        } else {
            None
        }
    }
}

const SEED_EXPORTER: u64 = 0x5e_0001;
const SEED_IMPORTER: u64 = 0x5e_0002;

fn write_pattern(map: &UserMap, len: u64, seed: u64) {
    for o in 0..len {
        map.write(o as usize, pattern::byte_at(seed, o));
    }
}

fn bad_bytes(map: &UserMap, len: u64, seed: u64) -> u64 {
    (0..len)
        .filter(|&o| map.read(o as usize) != pattern::byte_at(seed, o))
        .count() as u64
}

fn elapsed_ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// `pool share`: see the module's comment. The exporter's file is `d`.
pub fn share(d: &Ruvm, size: u64, gpu: Option<u32>) -> Result<Shared> {
    let (pool, _) = d
        .pool_create_flags(0, 0, uapi::ruvm_pool_create_flags_RUVM_POOL_EXPORTABLE)
        .context("POOL_CREATE (exportable)")?;
    let mem = d.pool_alloc(pool, size, 0).context("MEM_ALLOC")?.handle;
    let q = d.mem_query(mem).context("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).map_err(|e| anyhow!("mmap: {e}"))?;
    write_pattern(&map, size, SEED_EXPORTER);
    let t = Instant::now();
    let pool_fd = d.pool_export(pool).context("POOL_EXPORT")?;
    let export_pool_ns = elapsed_ns(t);
    let t = Instant::now();
    let (_, data) = d.mem_export(mem).context("MEM_EXPORT")?;
    let export_mem_ns = elapsed_ns(t);
    let socket = match socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    ) {
        Ok(pair) => Some(pair),
        Err(Errno::ENOSYS | Errno::EAFNOSUPPORT) => None,
        Err(e) => bail!("socketpair: {e}"),
    };
    let (data_rx, data_tx) = pipe().context("pipe")?;
    let (back_rx, back_tx) = pipe().context("pipe")?;
    let inherited = pool_fd.as_raw_fd();
    // SAFETY: ruvmctl is single-threaded here; the child only makes syscalls and touches
    // memory, then exits without returning.
    let child = match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            let passed = socket.as_ref().map(|(_, c)| c.as_raw_fd());
            let code = match importer(passed, inherited, data_rx, size, gpu) {
                Ok(r) => {
                    let bytes: Vec<u8> = r.words().iter().flat_map(|w| w.to_le_bytes()).collect();
                    match std::fs::File::from(back_tx).write_all(&bytes) {
                        Ok(()) => 0,
                        Err(_) => 2,
                    }
                }
                Err(e) => {
                    eprintln!("ruvmctl: the importer: {e:#}");
                    1
                }
            };
            std::process::exit(code);
        }
        ForkResult::Parent { child } => child,
    };
    drop((data_rx, back_tx));
    let sent = (|| -> Result<()> {
        if let Some((parent, _)) = &socket {
            let fds = [inherited];
            sendmsg::<()>(
                parent.as_raw_fd(),
                &[IoSlice::new(b"p")],
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::empty(),
                None,
            )
            .context("sendmsg SCM_RIGHTS")?;
        }
        std::fs::File::from(data_tx)
            .write_all(&data)
            .context("writing the export data")
    })();
    let mut back = Vec::new();
    let read = std::fs::File::from(back_rx).read_to_end(&mut back);
    let status = waitpid(child, None).context("waitpid")?;
    sent?;
    read.context("reading the importer's report")?;
    if !matches!(status, WaitStatus::Exited(_, 0)) || back.len() != WORDS * 8 {
        bail!("the importer failed ({status:?})");
    }
    let mut w = [0u64; WORDS];
    for (i, c) in back.chunks_exact(8).enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        w[i] = u64::from_le_bytes(b);
    }
    let bad_back = bad_bytes(&map, size, SEED_IMPORTER);
    drop(map);
    d.mem_free(mem).context("MEM_FREE")?;
    drop(pool_fd);
    d.pool_destroy(pool).context("POOL_DESTROY")?;
    Ok(Shared {
        size,
        exporter_pid: std::process::id(),
        pool,
        mem,
        passage: if socket.is_some() {
            "SCM_RIGHTS"
        } else {
            "inherited (no AF_UNIX in this kernel)"
        },
        importer: Importer::from_words(w),
        bad_back,
        export_pool_ns,
        export_mem_ns,
    })
}

/// The importer's side, in the child: its own open file.
fn importer(
    socket: Option<RawFd>,
    inherited: RawFd,
    data_rx: OwnedFd,
    size: u64,
    gpu: Option<u32>,
) -> Result<Importer> {
    let fd = match socket {
        Some(s) => receive_fd(s)?,
        None => {
            // SAFETY: the descriptor was inherited across fork and is open; borrowed to dup.
            let b = unsafe { BorrowedFd::borrow_raw(inherited) };
            nix::unistd::dup(b).context("dup")?
        }
    };
    let own = Ruvm::open().context("open /dev/ruvm")?;
    let t = Instant::now();
    let pool = own.pool_import(fd.as_fd()).context("POOL_IMPORT")?;
    let import_pool_ns = elapsed_ns(t);
    drop(fd);
    let alloc_errno = match own.pool_alloc(pool, size, 0) {
        Ok(m) => {
            let _ = own.mem_free(m.handle);
            0
        }
        Err(e) => e as u64,
    };
    let mut data: ExportData = [0; uapi::RUVM_EXPORT_DATA_LEN as usize];
    std::fs::File::from(data_rx)
        .read_exact(&mut data)
        .context("reading the export data")?;
    let t = Instant::now();
    let m = own.mem_import(pool, &data).context("MEM_IMPORT")?;
    let import_mem_ns = elapsed_ns(t);
    let q = own.mem_query(m.handle).context("MEM_QUERY")?;
    let map = UserMap::of_mem(&own, &q).map_err(|e| anyhow!("mmap: {e}"))?;
    let bad_mapped = bad_bytes(&map, size, SEED_EXPORTER);
    let bad_engine = match gpu {
        None => u64::MAX,
        Some(g) => engine_bad(&own, g, m.handle, size)?,
    };
    write_pattern(&map, size, SEED_IMPORTER);
    drop(map);
    own.mem_free(m.handle).context("MEM_FREE of the import")?;
    Ok(Importer {
        pid: u64::from(std::process::id()),
        pool,
        mem: m.handle,
        bad_mapped,
        bad_engine,
        alloc_errno,
        import_pool_ns,
        import_mem_ns,
    })
}

/// Copies mem `src` into a new mem with GPU `g`'s copy engine: the bytes of the exporter's
/// pattern it got wrong.
fn engine_bad(d: &Ruvm, g: u32, src: u64, size: u64) -> Result<u64> {
    let dst = d.mem_alloc(size, 0, 0).context("MEM_ALLOC")?.handle;
    for h in [src, dst] {
        d.mem_gpu(true, h, g).context("MEM_MAP_GPU")?;
    }
    d.ce_copy(g, dst, 0, src, 0, size).context("CE_COPY")?;
    let q = d.mem_query(dst).context("MEM_QUERY")?;
    let map = UserMap::of_mem(d, &q).map_err(|e| anyhow!("mmap: {e}"))?;
    let bad = bad_bytes(&map, size, SEED_EXPORTER);
    drop(map);
    d.mem_free(dst).context("MEM_FREE")?;
    Ok(bad)
}

/// The one descriptor an `SCM_RIGHTS` message on socket `s` carries.
fn receive_fd(s: RawFd) -> Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(RawFd);
    let msg = recvmsg::<()>(s, &mut iov, Some(&mut space), MsgFlags::empty()).context("recvmsg")?;
    let fd = msg
        .cmsgs()
        .context("the message's control data")?
        .find_map(|c| match c {
            ControlMessageOwned::ScmRights(v) => v.first().copied(),
            _ => None,
        })
        .ok_or_else(|| anyhow!("no descriptor in the message"))?;
    // SAFETY: SCM_RIGHTS installed a new descriptor in this process, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `pool export --run CMD` and `dmabuf export --run CMD`: what was exported (the pool, the
/// mem), the descriptor and how CMD ended.
#[derive(Serialize)]
pub struct ExportRun {
    pub exported: u64,
    pub fd: i32,
    pub status: i32,
}

impl Report for ExportRun {
    fn render(&self) -> String {
        String::new()
    }

    fn failure(&self) -> Option<String> {
        (self.status != 0).then(|| format!("the command exited {}", self.status))
    }
}

/// `pool export P --run CMD` (`RUVM_IOCTL_POOL_EXPORT`): CMD runs with the descriptor
/// inherited (close-on-exec cleared for it), its number in `RUVM_POOL_FD`.
pub fn export_run(d: &Ruvm, pool: u64, run: &str) -> Result<ExportRun> {
    let fd = d.pool_export(pool).context("POOL_EXPORT")?;
    let (fd, status) = run_with(fd, "RUVM_POOL_FD", run)?;
    Ok(ExportRun {
        exported: pool,
        fd,
        status,
    })
}

/// Runs `run` with `sh -c`, descriptor `fd` inherited (close-on-exec cleared for it) and its
/// number in environment variable `var`; closes it after. Returns the number and how the
/// command exited (-1: by a signal).
pub fn run_with(fd: OwnedFd, var: &str, run: &str) -> Result<(i32, i32)> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    fcntl(&fd, FcntlArg::F_SETFD(FdFlag::empty())).context("clearing close-on-exec")?;
    let n = fd.as_raw_fd();
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(run)
        .env(var, n.to_string())
        .status()
        .context("running the command")?;
    drop(fd);
    Ok((n, st.code().unwrap_or(-1)))
}

/// `pool import FD`: the pool's handle in this file.
#[derive(Serialize)]
pub struct Imported {
    pub pool: u64,
}

impl Report for Imported {
    fn render(&self) -> String {
        fields([("pool", format!("{} (imported)", self.pool))])
    }
}

/// `pool import FD` (`RUVM_IOCTL_POOL_IMPORT`) of an inherited descriptor.
pub fn import_pool(d: &Ruvm, fd: i32) -> Result<Imported> {
    let pool = d.pool_import_raw(fd).context("POOL_IMPORT")?;
    Ok(Imported { pool })
}

/// `export H`: the mem's pool and export data (hex).
#[derive(Serialize)]
pub struct MemExport {
    pub handle: u64,
    pub pool: u64,
    pub data: String,
}

impl Report for MemExport {
    fn render(&self) -> String {
        format!(
            "mem {} of pool {}, export data:\n{}",
            self.handle, self.pool, self.data
        )
    }
}

/// `export H` (`RUVM_IOCTL_MEM_EXPORT`).
pub fn export_mem(d: &Ruvm, handle: u64) -> Result<MemExport> {
    let (pool, data) = d.mem_export(handle).context("MEM_EXPORT")?;
    Ok(MemExport {
        handle,
        pool,
        data: to_hex(&data),
    })
}

/// Bytes as hex digits, two a byte.
fn to_hex(data: &[u8]) -> String {
    use std::fmt::Write as _;
    data.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Export data from its hex form (128 digits).
fn parse_data(hex: &str) -> Result<ExportData> {
    let hex = hex.trim();
    let mut data: ExportData = [0; uapi::RUVM_EXPORT_DATA_LEN as usize];
    if hex.len() != 2 * data.len() || !hex.is_ascii() {
        bail!(
            "export data is {} hex digits, not {}",
            2 * data.len(),
            hex.len()
        );
    }
    for (i, b) in data.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| anyhow!("'{}' is not a hex byte", &hex[2 * i..2 * i + 2]))?;
    }
    Ok(data)
}

/// `import POOL DATA`: the new mem.
#[derive(Serialize)]
pub struct MemImport {
    pub handle: u64,
    pub mmap_offset: u64,
    pub size: u64,
}

impl Report for MemImport {
    fn render(&self) -> String {
        fields([
            ("mem", format!("{} (imported)", self.handle)),
            ("size", show_size(self.size)),
            ("mmap offset", format!("{:#x}", self.mmap_offset)),
        ])
    }
}

/// `import POOL DATA` (`RUVM_IOCTL_MEM_IMPORT`).
pub fn import_mem(d: &Ruvm, pool: u64, hex: &str) -> Result<MemImport> {
    let data = parse_data(hex)?;
    let m = d.mem_import(pool, &data).context("MEM_IMPORT")?;
    Ok(MemImport {
        handle: m.handle,
        mmap_offset: m.mmap_offset,
        size: m.size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_data_goes_through_hex_unchanged() {
        let mut data: ExportData = [0; uapi::RUVM_EXPORT_DATA_LEN as usize];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i * 37) as u8;
        }
        let hex = to_hex(&data);
        assert_eq!(parse_data(&hex).expect("parses"), data);
        assert!(parse_data(&hex[2..]).is_err());
        assert!(parse_data(&format!("zz{}", &hex[2..])).is_err());
    }
}
