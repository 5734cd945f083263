// SPDX-License-Identifier: GPL-2.0

//! The stream and event commands (`ruvmctl stream ...`, `ruvmctl event ...`), stream-ordered
//! allocation (`stream alloc`, `stream free`) and the queued engine copy (`ce-copy --async
//! --stream S`), waited for with a progress bar.
//!
//! Streams and events belong to the open file and die with it: across commands, keep the
//! device open in the shell and pass it with `--fd`.

use std::{
    io::{IsTerminal as _, Write as _},
    os::fd::{AsRawFd as _, OwnedFd},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use libruvm::{cmd, op, sync_file, uapi, Errno, Ruvm};
use serde::Serialize;

use super::{arg, call};
use crate::{
    cli::CopyArgs,
    output::{fields, Done, Report},
};

/// An errno's name (`ETIMEDOUT`) from its number, either sign.
fn errno_name(e: i64) -> String {
    let n = i32::try_from(e.unsigned_abs()).unwrap_or(i32::MAX);
    format!("{:?}", Errno::from_raw(n))
}

/// A fence status for people: pending, signalled, or the error it signalled with.
pub(crate) fn status_text(status: i32) -> String {
    match status {
        0 => "pending".into(),
        1 => "signalled".into(),
        s => format!("signalled with {}", errno_name(s.into())),
    }
}

/// What `stream create` made.
#[derive(Serialize)]
pub struct Created {
    stream: u64,
    gpu: u32,
    /// The dma_fence context of its timeline.
    context: u64,
    #[serde(skip)]
    note: Option<&'static str>,
}

impl Report for Created {
    fn render(&self) -> String {
        let mut s = fields([
            ("stream", format!("{} (GPU {})", self.stream, self.gpu)),
            ("fence context", self.context.to_string()),
        ]);
        if let Some(n) = self.note {
            s.push('\n');
            s.push_str(n);
        }
        s
    }
}

/// `stream create` (`RUVM_IOCTL_STREAM_CREATE`).
pub fn create(d: &Ruvm, gpu: u32, own_fd: bool) -> Result<Created> {
    let mut a = arg(|a: &mut uapi::ruvm_stream_create| a.gpu = gpu);
    call(d, cmd::STREAM_CREATE, &mut a)?;
    Ok(Created {
        stream: a.handle,
        gpu,
        context: a.context,
        note: own_fd
            .then_some("(destroyed when ruvmctl exits: pass --fd to keep streams across commands)"),
    })
}

/// `stream destroy` (`RUVM_IOCTL_STREAM_DESTROY`).
pub fn destroy(d: &Ruvm, stream: u64) -> Result<Done> {
    let mut a = arg(|a: &mut uapi::ruvm_stream_handle| a.handle = stream);
    call(d, cmd::STREAM_DESTROY, &mut a)?;
    Ok(Done {})
}

fn query_raw(d: &Ruvm, stream: u64) -> Result<uapi::ruvm_stream_query> {
    let mut a = arg(|a: &mut uapi::ruvm_stream_query| a.handle = stream);
    call(d, cmd::STREAM_QUERY, &mut a)?;
    Ok(a)
}

/// What `stream alloc` made.
#[derive(Serialize)]
pub struct Allocated {
    stream: u64,
    /// The new mem's handle.
    handle: u64,
    mmap_offset: u64,
    size: u64,
    /// The pool its chunks came from.
    pool: u64,
    /// Whether that is the current pool of the stream's GPU (no --pool).
    gpu_current_pool: bool,
    zero: bool,
    /// The ALLOC's seqno on the stream's timeline.
    seqno: u64,
    #[serde(skip)]
    note: Option<&'static str>,
}

impl Report for Allocated {
    fn render(&self) -> String {
        let pool = if self.gpu_current_pool {
            format!("{} (the GPU's current pool)", self.pool)
        } else {
            self.pool.to_string()
        };
        let mut s = fields([
            ("mem", self.handle.to_string()),
            ("mmap offset", format!("{:#x}", self.mmap_offset)),
            (
                "size",
                format!(
                    "{} bytes{}",
                    self.size,
                    if self.zero {
                        ", zeroed when the stream reaches it"
                    } else {
                        ""
                    }
                ),
            ),
            ("pool", pool),
            (
                "stream",
                format!("{} (the ALLOC at seqno {})", self.stream, self.seqno),
            ),
        ]);
        if let Some(n) = self.note {
            s.push('\n');
            s.push_str(n);
        }
        s
    }
}

/// `stream alloc` (one `RUVM_OP_ALLOC` by `RUVM_IOCTL_STREAM_SUBMIT`): from `pool`, or from the
/// current pool of the stream's GPU.
pub fn alloc(
    d: &Ruvm,
    stream: u64,
    size: u64,
    pool: Option<u64>,
    zero: bool,
    own_fd: bool,
) -> Result<Allocated> {
    let mut ops = [op::alloc(pool.unwrap_or(0), size, zero)];
    let seqno = d
        .stream_submit_mut(stream, &mut ops)
        .context(cmd::STREAM_SUBMIT.name)?;
    let (handle, mmap_offset) = op::allocated(&ops[0]);
    let pool = match pool {
        Some(p) => p,
        None => {
            let gpu = query_raw(d, stream)?.gpu;
            d.gpu_pool_get(gpu).context(cmd::GPU_POOL.name)?
        }
    };
    Ok(Allocated {
        stream,
        handle,
        mmap_offset,
        size,
        pool,
        gpu_current_pool: ops[0].src == 0,
        zero,
        seqno,
        note: own_fd
            .then_some("(freed when ruvmctl exits: pass --fd to keep mems across commands)"),
    })
}

/// What `stream free` queued.
#[derive(Serialize)]
pub struct Freed {
    stream: u64,
    handle: u64,
    /// The FREE's seqno on the stream's timeline.
    seqno: u64,
}

impl Report for Freed {
    fn render(&self) -> String {
        format!(
            "mem {} freed on stream {} at seqno {} (its handle is gone; its chunks go when the stream gets there)",
            self.handle, self.stream, self.seqno
        )
    }
}

/// `stream free` (one `RUVM_OP_FREE` by `RUVM_IOCTL_STREAM_SUBMIT`).
pub fn free(d: &Ruvm, stream: u64, handle: u64) -> Result<Freed> {
    let seqno = d
        .stream_submit(stream, &[op::free(handle)])
        .context(cmd::STREAM_SUBMIT.name)?;
    Ok(Freed {
        stream,
        handle,
        seqno,
    })
}

/// A stream's state, as `STREAM_QUERY` reports it.
#[derive(Serialize)]
pub struct StreamState {
    stream: u64,
    gpu: u32,
    /// The seqno of the last operation submitted (0: none).
    submitted: u64,
    /// The seqno of the last operation retired, run or not.
    completed: u64,
    /// 0, or the errno of the first operation that failed.
    error: u32,
    error_name: Option<String>,
    /// With an error: the seqno of the operation that failed.
    failed_seqno: Option<u64>,
    /// The seqno of the operation the engine is on (running, or waiting for a fence); 0 if
    /// none.
    current_seqno: u64,
    /// Bytes it has moved, of `current_len` (0 for operations that move none).
    current_done: u64,
    current_len: u64,
}

impl From<uapi::ruvm_stream_query> for StreamState {
    fn from(q: uapi::ruvm_stream_query) -> Self {
        let failed = q.error != 0;
        Self {
            stream: q.handle,
            gpu: q.gpu,
            submitted: q.submitted,
            completed: q.completed,
            error: q.error,
            error_name: failed.then(|| errno_name(q.error.into())),
            failed_seqno: failed.then_some(q.failed_seqno),
            current_seqno: q.current_seqno,
            current_done: q.current_done,
            current_len: q.current_len,
        }
    }
}

impl Report for StreamState {
    fn render(&self) -> String {
        let running = match (self.current_seqno, self.current_len) {
            (0, _) => "nothing".to_owned(),
            // The engine stays only on a wait that moves no bytes (a record is instant).
            (n, 0) => format!("seqno {n}: waiting for a fence"),
            (n, len) => format!("seqno {n}: {} of {len} bytes", self.current_done),
        };
        let error = match (&self.error_name, self.failed_seqno) {
            (Some(e), Some(at)) => format!("{e} at seqno {at} (later operations do not run)"),
            _ => "none".to_owned(),
        };
        fields([
            ("stream", format!("{} (GPU {})", self.stream, self.gpu)),
            ("submitted", self.submitted.to_string()),
            (
                "completed",
                format!(
                    "{} ({} queued)",
                    self.completed,
                    self.submitted.saturating_sub(self.completed)
                ),
            ),
            ("running", running),
            ("error", error),
        ])
    }
}

/// `stream query` (`RUVM_IOCTL_STREAM_QUERY`).
pub fn query(d: &Ruvm, stream: u64) -> Result<StreamState> {
    Ok(query_raw(d, stream)?.into())
}

/// What `stream sync` waited for.
#[derive(Serialize)]
pub struct Synced {
    /// The stream, or `None` for every stream of the file.
    stream: Option<u64>,
}

impl Report for Synced {
    fn render(&self) -> String {
        match self.stream {
            Some(s) => format!("stream {s}: done"),
            None => "every stream: done".into(),
        }
    }
}

/// `stream sync` (`RUVM_IOCTL_STREAM_SYNC`) of one stream, or of all with `None`.
pub fn sync(d: &Ruvm, stream: Option<u64>, timeout_ms: u32) -> Result<Synced> {
    let mut a = arg(|a: &mut uapi::ruvm_stream_sync| {
        a.timeout_ms = timeout_ms;
        match stream {
            Some(s) => a.handle = s,
            None => a.flags = uapi::ruvm_sync_flags_RUVM_SYNC_EVERY_STREAM,
        }
    });
    match (d.call(cmd::STREAM_SYNC, &mut a), stream) {
        (Ok(()), _) => Ok(Synced { stream }),
        (Err(Errno::EIO), Some(s)) => {
            let q = query_raw(d, s)?;
            bail!(
                "stream {s} is in error: {} at seqno {}",
                errno_name(q.error.into()),
                q.failed_seqno
            )
        }
        (Err(Errno::EIO), None) => {
            bail!("a stream of the file is in error (stream query says which)")
        }
        (Err(Errno::ETIMEDOUT), _) => bail!("not done after {timeout_ms} ms"),
        (Err(e), _) => Err(e).context(cmd::STREAM_SYNC.name),
    }
}

/// `event create` (`RUVM_IOCTL_EVENT_CREATE`).
#[derive(Serialize)]
pub struct EventCreated {
    event: u64,
    #[serde(skip)]
    note: Option<&'static str>,
}

impl Report for EventCreated {
    fn render(&self) -> String {
        let mut s = format!("event {}", self.event);
        if let Some(n) = self.note {
            s.push('\n');
            s.push_str(n);
        }
        s
    }
}

pub fn event_create(d: &Ruvm, own_fd: bool) -> Result<EventCreated> {
    let mut a = uapi::ruvm_event::default();
    call(d, cmd::EVENT_CREATE, &mut a)?;
    Ok(EventCreated {
        event: a.handle,
        note: own_fd
            .then_some("(destroyed when ruvmctl exits: pass --fd to keep events across commands)"),
    })
}

/// `event destroy` (`RUVM_IOCTL_EVENT_DESTROY`).
pub fn event_destroy(d: &Ruvm, event: u64) -> Result<Done> {
    let mut a = arg(|a: &mut uapi::ruvm_event| a.handle = event);
    call(d, cmd::EVENT_DESTROY, &mut a)?;
    Ok(Done {})
}

/// Where `event record` put the event.
#[derive(Serialize)]
pub struct Recorded {
    event: u64,
    stream: u64,
    seqno: u64,
}

impl Report for Recorded {
    fn render(&self) -> String {
        format!(
            "event {} recorded on stream {} at seqno {}",
            self.event, self.stream, self.seqno
        )
    }
}

/// `event record` (one `RUVM_OP_RECORD` by `RUVM_IOCTL_STREAM_SUBMIT`).
pub fn event_record(d: &Ruvm, event: u64, stream: u64) -> Result<Recorded> {
    let seqno = d
        .stream_submit(stream, &[op::record(event)])
        .context(cmd::STREAM_SUBMIT.name)?;
    Ok(Recorded {
        event,
        stream,
        seqno,
    })
}

/// An event's point, as `EVENT_QUERY` reports it.
#[derive(Serialize)]
pub struct EventState {
    event: u64,
    /// 0 pending, 1 signalled, -errno: signalled with that error.
    status: i32,
    /// The stream it was last recorded on (0: never: complete).
    stream: u64,
    seqno: u64,
}

impl Report for EventState {
    fn render(&self) -> String {
        let at = if self.stream == 0 {
            "never recorded (complete)".to_owned()
        } else {
            format!("stream {} seqno {}", self.stream, self.seqno)
        };
        fields([
            ("event", self.event.to_string()),
            ("point", at),
            ("status", status_text(self.status)),
        ])
    }
}

/// `event query` (`RUVM_IOCTL_EVENT_QUERY`).
pub fn event_query(d: &Ruvm, event: u64) -> Result<EventState> {
    let mut a = arg(|a: &mut uapi::ruvm_event| a.handle = event);
    call(d, cmd::EVENT_QUERY, &mut a)?;
    Ok(EventState {
        event,
        status: a.status,
        stream: a.stream,
        seqno: a.seqno,
    })
}

/// What `event sync` waited for.
#[derive(Serialize)]
pub struct EventSynced {
    event: u64,
}

impl Report for EventSynced {
    fn render(&self) -> String {
        format!("event {}: signalled", self.event)
    }
}

/// `event sync` (`RUVM_IOCTL_EVENT_SYNC`): `EIO` says the point signalled with an error (the
/// query after says which), `ETIMEDOUT` that the wait's own timeout passed.
pub fn event_sync(d: &Ruvm, event: u64, timeout_ms: u32) -> Result<EventSynced> {
    let mut a = arg(|a: &mut uapi::ruvm_event| {
        a.handle = event;
        a.timeout_ms = timeout_ms;
    });
    match d.call(cmd::EVENT_SYNC, &mut a) {
        Ok(()) => Ok(EventSynced { event }),
        Err(Errno::EIO) => {
            let q = event_query(d, event)?;
            bail!(
                "event {event} (stream {} seqno {}): {}",
                q.stream,
                q.seqno,
                status_text(q.status)
            )
        }
        Err(Errno::ETIMEDOUT) => bail!("event {event}: still pending after {timeout_ms} ms"),
        Err(e) => Err(e).context(cmd::EVENT_SYNC.name),
    }
}

/// What `event export` made: a sync_file, and what it holds.
#[derive(Serialize)]
pub struct Exported {
    event: u64,
    /// The descriptor (ruvmctl's: closed when it exits).
    fd: i32,
    /// The sync_file's name: `driver-timeline<context>-<seqno>` while pending.
    name: String,
    /// 0 pending, 1 signalled, -errno.
    status: i32,
    driver: String,
    timeline: String,
    /// When it signalled (CLOCK_MONOTONIC, ns); 0 while pending.
    timestamp_ns: u64,
    #[serde(skip)]
    _file: OwnedFd,
}

impl Report for Exported {
    fn render(&self) -> String {
        let when = if self.timestamp_ns == 0 {
            "-".to_owned()
        } else {
            format!(
                "{}.{:09} s (CLOCK_MONOTONIC)",
                self.timestamp_ns / 1_000_000_000,
                self.timestamp_ns % 1_000_000_000
            )
        };
        fields([
            ("event", self.event.to_string()),
            ("fd", self.fd.to_string()),
            ("name", self.name.clone()),
            ("status", status_text(self.status)),
            ("driver", self.driver.clone()),
            ("timeline", self.timeline.clone()),
            ("signalled at", when),
        ])
    }
}

/// `event export` (`RUVM_IOCTL_EVENT_EXPORT`, then `SYNC_IOC_FILE_INFO`).
pub fn event_export(d: &Ruvm, event: u64) -> Result<Exported> {
    let file = d.event_export(event).context(cmd::EVENT_EXPORT.name)?;
    let info = sync_file::info(&file).context("SYNC_IOC_FILE_INFO")?;
    let Some(f) = info.fence().cloned() else {
        bail!(
            "the exported sync_file holds {} fences, not one",
            info.fences.len()
        );
    };
    Ok(Exported {
        event,
        fd: file.as_raw_fd(),
        name: info.name,
        status: f.status,
        driver: f.driver,
        timeline: f.timeline,
        timestamp_ns: f.timestamp_ns,
        _file: file,
    })
}

/// What `ce-copy --async` queued.
#[derive(Serialize)]
pub struct Queued {
    stream: u64,
    gpu: u32,
    /// The copy's seqno on the stream's timeline.
    seqno: u64,
    /// Whether it was waited for (and ran: a failure is an error).
    done: bool,
}

impl Report for Queued {
    fn render(&self) -> String {
        let state = if self.done { "done" } else { "queued" };
        format!(
            "copy {state} on stream {} (GPU {}) at seqno {}",
            self.stream, self.gpu, self.seqno
        )
    }
}

/// The progress bar on stderr: the operation running now, from `STREAM_QUERY`.
struct Bar {
    on: bool,
}

impl Bar {
    const WIDTH: u128 = 32;

    /// The bar's line for state `q` of the stream, waiting for `seqno`.
    fn line(q: &uapi::ruvm_stream_query, seqno: u64) -> String {
        let ahead = seqno.saturating_sub(q.completed + 1);
        if q.current_seqno != seqno && ahead > 0 {
            return format!("waiting: {ahead} operations before the copy");
        }
        // The engine is on the copy, or about to be.
        let (done, len) = if q.current_seqno == seqno {
            (u128::from(q.current_done), u128::from(q.current_len))
        } else {
            (0, 0)
        };
        let filled = (done * Self::WIDTH)
            .checked_div(len)
            .unwrap_or(0)
            .min(Self::WIDTH);
        let pct = (done * 100).checked_div(len).unwrap_or(0);
        let mib = |n: u128| n as f64 / f64::from(1 << 20);
        format!(
            "[{}{}] {pct:3}% {:.1} of {:.1} MiB",
            "#".repeat(filled as usize),
            "-".repeat((Self::WIDTH - filled) as usize),
            mib(done),
            mib(len)
        )
    }

    fn draw(&self, q: &uapi::ruvm_stream_query, seqno: u64) {
        if self.on {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r{}\x1b[K", Self::line(q, seqno));
            let _ = e.flush();
        }
    }

    fn clear(&self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }
}

/// Waits until operation `seqno` of `stream` retired, drawing `bar`; fails if it did not run.
fn wait_for(d: &Ruvm, stream: u64, seqno: u64, bar: &Bar) -> Result<()> {
    let mut pause = Duration::from_millis(1);
    let q = loop {
        let q = query_raw(d, stream)?;
        if q.completed >= seqno {
            break q;
        }
        bar.draw(&q, seqno);
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    };
    bar.clear();
    if q.error != 0 && q.failed_seqno <= seqno {
        let e = errno_name(q.error.into());
        if q.failed_seqno == seqno {
            bail!("the copy (stream {stream} seqno {seqno}) failed: {e}");
        }
        bail!(
            "the copy (stream {stream} seqno {seqno}) did not run: the stream is in error since seqno {} ({e})",
            q.failed_seqno
        );
    }
    Ok(())
}

/// `ce-copy --async --stream S` (`RUVM_OP_COPY`): queued on `stream`, which must be GPU `gpu`'s,
/// then waited for unless `no_wait`, with a progress bar on stderr if `bar` and it is a
/// terminal.
pub fn ce_copy_async(
    d: &Ruvm,
    gpu: u32,
    c: &CopyArgs,
    stream: u64,
    no_wait: bool,
    bar: bool,
) -> Result<Queued> {
    let q = query_raw(d, stream)?;
    if q.gpu != gpu {
        bail!("stream {stream} is GPU {}'s, not GPU {gpu}'s", q.gpu);
    }
    let copy = op::copy(c.dst, c.dst_offset, c.src, c.src_offset, c.length);
    let seqno = d
        .stream_submit(stream, &[copy])
        .context(cmd::STREAM_SUBMIT.name)?;
    if !no_wait {
        let bar = Bar {
            on: bar && std::io::stderr().is_terminal(),
        };
        wait_for(d, stream, seqno, &bar)?;
    }
    Ok(Queued {
        stream,
        gpu,
        seqno,
        done: !no_wait,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(completed: u64, done: u64, len: u64) -> uapi::ruvm_stream_query {
        uapi::ruvm_stream_query {
            completed,
            current_seqno: if len == 0 { 0 } else { completed + 1 },
            current_done: done,
            current_len: len,
            ..Default::default()
        }
    }

    #[test]
    fn the_bar_fills_with_the_running_copy() {
        let l = Bar::line(&running(4, 0, 1 << 20), 5);
        assert!(l.starts_with(&format!("[{}]   0%", "-".repeat(32))), "{l}");
        let l = Bar::line(&running(4, 1 << 19, 1 << 20), 5);
        assert!(
            l.starts_with(&format!(
                "[{}{}]  50% 0.5 of 1.0 MiB",
                "#".repeat(16),
                "-".repeat(16)
            )),
            "{l}"
        );
        let l = Bar::line(&running(4, 1 << 20, 1 << 20), 5);
        assert!(l.starts_with(&format!("[{}] 100%", "#".repeat(32))), "{l}");
        // The copy is next but the engine is not on it yet: an empty bar, not a division by
        // zero.
        let l = Bar::line(&running(4, 0, 0), 5);
        assert!(l.contains("  0%"), "{l}");
        let l = Bar::line(&running(1, 7, 9), 5);
        assert_eq!(l, "waiting: 3 operations before the copy");
    }

    #[test]
    fn the_state_names_the_operation_the_engine_is_on() {
        let q = |current_seqno, current_len| uapi::ruvm_stream_query {
            handle: 3,
            submitted: 9,
            completed: 4,
            current_seqno,
            current_done: 1 << 10,
            current_len,
            ..Default::default()
        };
        let text = |q| StreamState::from(q).render();
        assert!(text(q(0, 0)).contains("nothing"));
        assert!(text(q(5, 0)).contains("seqno 5: waiting for a fence"));
        assert!(text(q(7, 4096)).contains("seqno 7: 1024 of 4096 bytes"));
    }

    #[test]
    fn an_allocation_shows_its_handle_offset_and_pool() {
        let a = Allocated {
            stream: 2,
            handle: 9,
            mmap_offset: 0x40_0000,
            size: 65536,
            pool: 5,
            gpu_current_pool: true,
            zero: true,
            seqno: 3,
            note: None,
        };
        let text = a.render();
        for want in [
            "mem:",
            "9",
            "0x400000",
            "65536 bytes, zeroed",
            "5 (the GPU's current pool)",
            "2 (the ALLOC at seqno 3)",
        ] {
            assert!(text.contains(want), "{want:?} in {text}");
        }
        let json = serde_json::to_value(&a).expect("serializes");
        assert_eq!(json["handle"], 9);
        assert_eq!(json["mmap_offset"], 0x40_0000);
        assert_eq!(json["pool"], 5);
        let f = Freed {
            stream: 2,
            handle: 9,
            seqno: 4,
        };
        assert!(f.render().starts_with("mem 9 freed on stream 2 at seqno 4"));
    }

    #[test]
    fn errnos_and_statuses_are_named() {
        assert_eq!(errno_name(110), "ETIMEDOUT");
        assert_eq!(errno_name(-125), "ECANCELED");
        assert_eq!(status_text(0), "pending");
        assert_eq!(status_text(1), "signalled");
        assert_eq!(status_text(-19), "signalled with ENODEV");
    }
}
