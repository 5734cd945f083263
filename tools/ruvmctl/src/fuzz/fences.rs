// SPDX-License-Identifier: GPL-2.0

//! The parent's side of the workers' streams: it asks a worker to make its streams busy before
//! it kills the worker or removes a GPU, and holds sync_files the workers exported beyond their
//! death, for the liveness oracle: every fence of a killed worker, and every fence pending on a
//! GPU when it was removed, must signal within [`SIGNAL_BOUND`] (Documentation/ruvm.rst,
//! "Streams and events", teardown).
//!
//! The request is one word per worker slot in [`Shared`]: the parent writes [`REQUEST`] (with
//! the GPU wanted in the low bits), one thread of the worker takes it ([`TAKEN`]), submits work
//! and answers [`BUSY`] if a stream still had work queued once it was done, [`IDLE`] if not.
//!
//! The hand-off of a sync_file goes through [`Shared::handoffs`] and `pidfd_getfd(2)`, not a
//! socket: it works on kernels without `CONFIG_NET`/`CONFIG_UNIX` (where `socketpair` is
//! `ENOSYS`), as `pidfd_getfd` needs no config option (Linux 5.6). Each worker slot has
//! [`HANDOFFS`] cells, each in one of three states:
//! - `0`: free;
//! - `fd + 1`: announced: the worker keeps a duplicate of the sync_file open as its descriptor
//!   `fd` ([`hand_over`]), for the parent to take a copy of with `pidfd_getfd`;
//! - `-(fd + 1)`: taken: the parent has its copy (or could not get one); the worker closes its
//!   descriptor and frees the cell at its next hand-off.
//!
//! The worker moves a cell from free to announced and from taken to free, the parent from
//! announced to taken, so each side's store is the only one in its transition. The worker never
//! closes an announced descriptor: its number then names the sync_file until the parent took
//! it (or the worker died with it). With every cell announced, further hand-offs are dropped.
//! The parent takes what was announced every time round its loop (at most [`HELD_PER_SLOT`]
//! held per worker), everything just before it kills a worker, and at the run's end, while each
//! worker waits for that before it exits ([`wait_taken`]). A take that fails because the worker
//! is already gone (`ESRCH`, `EBADF`) is no fault of ruvm: it is counted ([`Fences::lost`]),
//! and the oracle has that fence less.
//!
//! `pidfd_getfd` needs ptrace access (`PTRACE_MODE_ATTACH_REALCREDS`) to the worker: the parent
//! is root with `CAP_SYS_PTRACE` and the workers' parent (Yama's scope 1 and 2 allow that), and
//! an unprivileged worker makes itself dumpable again after dropping root (the uid change made
//! it non-dumpable), so the access holds without the capability too.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        atomic::{AtomicI32, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use libruvm::Errno;
use nix::unistd::Pid;

use super::Shared;

/// How long a sync_file of a killed worker, or of a removed GPU's stream, may stay pending.
pub const SIGNAL_BOUND: Duration = Duration::from_secs(10);

/// Worker slots that can be asked to be busy and can hand sync_files over (the words of
/// [`Shared::busy`], the rows of [`Shared::handoffs`]).
pub const BUSY_SLOTS: usize = 64;

/// Hand-off cells per worker slot: the most sync_files a worker keeps announced and not yet
/// taken by the parent.
pub const HANDOFFS: usize = 64;

/// A request: bit 63, and the GPU in the low 32 bits ([`ANY_GPU`]: any).
const REQUEST: u64 = 1 << 63;
const ANY_GPU: u64 = 0xffff_ffff;
/// A worker thread took the request.
const TAKEN: u64 = 1;
/// The answers: a stream had work queued after the submission, or none did.
const BUSY: u64 = 2;
const IDLE: u64 = 3;

/// How long the parent waits for the answers (a worker thread may be in a one-second sync).
const ANSWER_WAIT: Duration = Duration::from_millis(1500);

/// The most pending sync_files the parent holds for one worker in its periodic takes (beyond,
/// the worker's announcements wait in their cells, and its hand-offs are dropped once every
/// cell is announced).
const HELD_PER_SLOT: usize = 32;

/// Worker side: takes the parent's request for `slot`, if there is one: `Some(gpu)` (`None`
/// inside: any GPU). Only one thread gets it.
pub fn take_request(shared: &Shared, slot: usize) -> Option<Option<u32>> {
    let word = shared.busy.get(slot)?;
    let v = word.load(Ordering::Acquire);
    if v & REQUEST == 0 {
        return None;
    }
    word.compare_exchange(v, TAKEN, Ordering::AcqRel, Ordering::Relaxed)
        .ok()?;
    let gpu = v & ANY_GPU;
    // CAST: below ANY_GPU, a GPU id.
    Some((gpu != ANY_GPU).then_some(gpu as u32))
}

/// Worker side: answers the request taken (unless the parent gave up on it).
pub fn answer(shared: &Shared, slot: usize, busy: bool) {
    if let Some(word) = shared.busy.get(slot) {
        let a = if busy { BUSY } else { IDLE };
        let _ = word.compare_exchange(TAKEN, a, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// Parent side: asks the workers in `slots` to make streams busy (on `gpu` if given) and waits
/// for their answers: how many said a stream was busy.
pub fn make_busy(shared: &Shared, slots: &[usize], gpu: Option<u32>) -> usize {
    let req = REQUEST | gpu.map_or(ANY_GPU, u64::from);
    let words: Vec<_> = slots.iter().filter_map(|&s| shared.busy.get(s)).collect();
    for w in &words {
        w.store(req, Ordering::Release);
    }
    let start = Instant::now();
    while start.elapsed() < ANSWER_WAIT
        && words.iter().any(|w| {
            let v = w.load(Ordering::Acquire);
            v == TAKEN || v & REQUEST != 0
        })
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    // A request no thread took is withdrawn; a late answer then finds 0 and leaves it.
    words
        .iter()
        .filter(|w| w.swap(0, Ordering::AcqRel) == BUSY)
        .count()
}

/// `pidfd_open(2)`: a descriptor of process `pid` (Linux 5.3; no config option).
pub fn pidfd_open(pid: Pid) -> Result<OwnedFd, Errno> {
    // SAFETY: a system call without pointers; it returns a new descriptor or -1 and errno.
    let r = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid.as_raw(), 0) };
    let fd = i32::try_from(Errno::result(r)?).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel installed `fd` for this call; this is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `pidfd_getfd(2)`: a duplicate in this process (close-on-exec) of descriptor `fd` of the
/// process `pidfd` refers to (Linux 5.6; no config option; needs ptrace access to it).
/// `ESRCH` or `EBADF` once that process has exited.
pub fn pidfd_getfd(pidfd: &OwnedFd, fd: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: a system call without pointers; it returns a new descriptor or -1 and errno.
    let r = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    let fd = i32::try_from(Errno::result(r)?).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel installed `fd` for this call; this is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The cell value announcing descriptor `fd`.
fn announced(fd: i32) -> i32 {
    fd.saturating_add(1)
}

/// Worker side: the descriptors this worker announced to the parent, by cell of its slot, kept
/// open until the parent marks them taken.
#[derive(Default)]
pub struct Kept(Mutex<Vec<Option<OwnedFd>>>);

/// Worker side: hands the sync_file `fd` to the parent: a duplicate of it, kept open here, is
/// announced in a free cell of `slot` (the caller still closes `fd` itself). Closes the
/// duplicates the parent has taken first. Never blocks on the parent; with no free cell (or no
/// descriptor left for the duplicate) the hand-off is dropped: whether it was made.
pub fn hand_over(shared: &Shared, slot: usize, kept: &Kept, fd: &OwnedFd) -> bool {
    let Some(cells) = shared.handoffs.get(slot) else {
        return false;
    };
    let Ok(mut kept) = kept.0.lock() else {
        return false;
    };
    kept.resize_with(HANDOFFS, || None);
    let mut free = None;
    for (i, (cell, k)) in cells.iter().zip(kept.iter_mut()).enumerate() {
        let v = cell.load(Ordering::Acquire);
        if v < 0 {
            // The parent has its copy: this one is closed, the cell free.
            *k = None;
            cell.store(0, Ordering::Release);
        }
        if v <= 0 && free.is_none() {
            free = Some(i);
        }
    }
    let Some(i) = free else { return false };
    let Ok(copy) = fd.try_clone() else {
        return false;
    };
    let n = copy.as_raw_fd();
    kept[i] = Some(copy);
    cells[i].store(announced(n), Ordering::Release);
    true
}

/// Worker side, at its end: waits (at most `most`) until the parent has taken everything `slot`
/// announced (the descriptors go with the process).
pub fn wait_taken(shared: &Shared, slot: usize, most: Duration) {
    let Some(cells) = shared.handoffs.get(slot) else {
        return;
    };
    let start = Instant::now();
    while start.elapsed() < most && cells.iter().any(|c| c.load(Ordering::Acquire) > 0) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Parent side: the sync_files announced in `cells`, taken out of the process `pidfd` refers
/// to with `pidfd_getfd`, at most `max`; each cell taken is marked so (even when the take
/// failed). The failures come with their errno.
fn take(
    cells: &[AtomicI32],
    pidfd: Option<&OwnedFd>,
    max: usize,
) -> Vec<(i32, Result<OwnedFd, Errno>)> {
    let mut out = Vec::new();
    for cell in cells {
        if out.len() >= max {
            break;
        }
        let v = cell.load(Ordering::Acquire);
        if v <= 0 {
            continue;
        }
        let fd = v - 1;
        let got = pidfd.map_or(Err(Errno::ESRCH), |p| pidfd_getfd(p, fd));
        cell.store(-v, Ordering::Release);
        out.push((fd, got));
    }
    out
}

/// The GPU of a pending ruvm fence, from its timeline's name (`gpu<G>-stream<H>`).
pub fn timeline_gpu(timeline: &str) -> Option<u32> {
    let (gpu, stream) = timeline.strip_prefix("gpu")?.split_once("-stream")?;
    stream.parse::<u64>().ok()?;
    gpu.parse().ok()
}

/// A sync_file held by the parent, pending when taken.
struct Held {
    fd: OwnedFd,
    /// The GPU of its stream.
    gpu: Option<u32>,
}

/// Whether `fd` has signalled (a sync_file that cannot be read counts as signalled: the
/// oracle is about pending fences).
fn signalled(fd: &OwnedFd) -> bool {
    libruvm::sync_file::info(fd).map_or(true, |i| i.status != 0)
}

/// One worker slot's process and what was taken from it.
#[derive(Default)]
struct Slot {
    /// The worker's pidfd (it names that process, whatever its pid becomes).
    pidfd: Option<OwnedFd>,
    held: Vec<Held>,
}

/// The sync_files the parent holds, per worker slot, and what the checks found.
pub struct Fences {
    shared: &'static Shared,
    slots: Vec<Slot>,
    /// Sync_files checked after a kill, a removal or the run's end, and the longest any took
    /// to signal once the check began.
    pub checked: u64,
    pub slowest: Duration,
    /// Sync_files taken from the workers.
    pub taken: u64,
    /// Hand-offs whose take failed with the worker already gone (`ESRCH`, `EBADF`), or with no
    /// descriptor left in the parent (`EMFILE`, `ENFILE`): not ruvm's doing.
    pub lost: u64,
    /// Takes that failed otherwise (the fuzzer's own trouble, such as no ptrace access), and
    /// the first of them.
    pub failed: u64,
    pub first_failure: Option<String>,
}

impl Fences {
    /// No sync_file held yet; the workers' hand-offs are in `shared`.
    pub fn new(shared: &'static Shared) -> Self {
        Self {
            shared,
            slots: Vec::new(),
            checked: 0,
            slowest: Duration::ZERO,
            taken: 0,
            lost: 0,
            failed: 0,
            first_failure: None,
        }
    }

    /// Before a new worker is forked in `slot`: its cells freed (its predecessor, if any, is
    /// dead and reaped) and what the parent held of the old one dropped.
    pub fn reset(&mut self, slot: usize) {
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, Slot::default);
        }
        self.slots[slot] = Slot::default();
        if let Some(cells) = self.shared.handoffs.get(slot) {
            for c in cells {
                c.store(0, Ordering::Release);
            }
        }
    }

    /// The worker in `slot` is the process `pidfd` refers to.
    pub fn set_worker(&mut self, slot: usize, pidfd: OwnedFd) {
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, Slot::default);
        }
        self.slots[slot].pidfd = Some(pidfd);
    }

    /// Lets go of what `slot` held that has signalled, and takes what its worker announced
    /// until it holds `max`; sync_files signalled already are closed at once.
    fn take_in(&mut self, slot: usize, max: usize) {
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        s.held.retain(|h| !signalled(&h.fd));
        let Some(cells) = self.shared.handoffs.get(slot) else {
            return;
        };
        let room = max.saturating_sub(s.held.len());
        for (n, got) in take(cells, s.pidfd.as_ref(), room) {
            let fd = match got {
                Ok(fd) => fd,
                Err(Errno::ESRCH | Errno::EBADF | Errno::EMFILE | Errno::ENFILE) => {
                    self.lost += 1;
                    continue;
                }
                Err(e) => {
                    self.failed += 1;
                    self.first_failure.get_or_insert_with(|| {
                        format!("pidfd_getfd of descriptor {n} of worker {slot}: {e}")
                    });
                    continue;
                }
            };
            self.taken += 1;
            let Ok(info) = libruvm::sync_file::info(&fd) else {
                continue;
            };
            if info.status != 0 {
                continue;
            }
            let gpu = info.fence().and_then(|f| timeline_gpu(&f.timeline));
            s.held.push(Held { fd, gpu });
        }
    }

    /// Takes what the workers announced (as much as the slots hold) and lets go of what has
    /// signalled.
    pub fn drain(&mut self) {
        for slot in 0..self.slots.len() {
            self.take_in(slot, HELD_PER_SLOT);
        }
    }

    /// Takes everything the workers announced (at the run's end, while they wait for it).
    pub fn drain_all(&mut self) {
        for slot in 0..self.slots.len() {
            self.take_in(slot, usize::MAX);
        }
    }

    /// Takes everything the worker of `slot` announced: it is about to be killed.
    pub fn take_slot(&mut self, slot: usize) {
        self.take_in(slot, usize::MAX);
    }

    /// Waits for `held` to signal, at most [`SIGNAL_BOUND`]: how many did not, with the GPUs
    /// of their streams.
    fn wait(&mut self, held: Vec<Held>) -> Vec<Option<u32>> {
        let start = Instant::now();
        let mut late = Vec::new();
        for h in held {
            let left = SIGNAL_BOUND.saturating_sub(start.elapsed());
            self.checked += 1;
            match libruvm::sync_file::wait(&h.fd, left) {
                Ok(false) => late.push(h.gpu),
                Ok(true) | Err(_) => self.slowest = self.slowest.max(start.elapsed()),
            }
        }
        late
    }

    /// The worker of `slot` was killed (after [`Self::take_slot`]): every sync_file it handed
    /// over must signal within [`SIGNAL_BOUND`]; a description of those that did not. What it
    /// announced after the last take went with it (counted in [`Self::lost`]).
    pub fn check_slot(&mut self, slot: usize) -> Option<String> {
        self.take_in(slot, usize::MAX);
        let s = self.slots.get_mut(slot)?;
        s.pidfd = None;
        let held = std::mem::take(&mut s.held);
        let late = self.wait(held);
        (!late.is_empty()).then(|| {
            format!(
                "{} sync_files exported by killed worker {slot} (streams of GPUs {late:?}) still pending {} s after its death",
                late.len(),
                SIGNAL_BOUND.as_secs()
            )
        })
    }

    /// Takes the pending sync_files of streams on `gpu` (taken from the workers so far), to
    /// check after the GPU's removal with [`Self::check`].
    pub fn take_on_gpu(&mut self, gpu: u32) -> Vec<OwnedFd> {
        self.drain();
        let mut out = Vec::new();
        for slot in &mut self.slots {
            let (on, off): (Vec<Held>, Vec<Held>) = std::mem::take(&mut slot.held)
                .into_iter()
                .partition(|h| h.gpu == Some(gpu));
            slot.held = off;
            out.extend(on.into_iter().map(|h| h.fd));
        }
        out
    }

    /// `fds` must all signal within [`SIGNAL_BOUND`] (from now): how many did not.
    pub fn check(&mut self, fds: Vec<OwnedFd>) -> usize {
        let held = fds.into_iter().map(|fd| Held { fd, gpu: None }).collect();
        self.wait(held).len()
    }

    /// The run is over, every worker gone (after [`Self::drain_all`] while they waited for
    /// it): everything still held must signal; how many did not. Every descriptor is closed
    /// after.
    pub fn finish(&mut self) -> usize {
        let mut all = Vec::new();
        for slot in 0..self.slots.len() {
            // Nothing is left to take from exited workers but what counts as lost.
            self.take_in(slot, usize::MAX);
            let s = &mut self.slots[slot];
            all.append(&mut s.held);
            s.pidfd = None;
        }
        self.wait(all).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zeroed [`Shared`] that lives as long as the test process.
    fn shared() -> &'static Shared {
        // SAFETY: zero bytes are valid atomics.
        Box::leak(Box::new(unsafe { std::mem::zeroed::<Shared>() }))
    }

    #[test]
    fn timelines_name_their_gpu() {
        assert_eq!(timeline_gpu("gpu3-stream12"), Some(3));
        assert_eq!(timeline_gpu("gpu0-stream1"), Some(0));
        assert_eq!(timeline_gpu("signaled-timeline"), None);
        assert_eq!(timeline_gpu("gpu-stream1"), None);
        assert_eq!(timeline_gpu("gpu1-streamx"), None);
    }

    #[test]
    fn one_thread_takes_a_request_and_the_parent_reads_its_answer() {
        let shared = shared();
        assert_eq!(take_request(shared, 1), None);
        shared.busy[1].store(REQUEST | 7, Ordering::Relaxed);
        assert_eq!(take_request(shared, 1), Some(Some(7)));
        assert_eq!(take_request(shared, 1), None);
        answer(shared, 1, true);
        assert_eq!(shared.busy[1].load(Ordering::Relaxed), BUSY);
        shared.busy[2].store(REQUEST | ANY_GPU, Ordering::Relaxed);
        assert_eq!(take_request(shared, 2), Some(None));
        assert_eq!(take_request(shared, BUSY_SLOTS), None);
    }

    /// Whether `a` and `b` are the same open file (same device and inode: a pipe's end).
    fn same_file(a: &OwnedFd, b: &OwnedFd) -> bool {
        let (Ok(x), Ok(y)) = (nix::sys::stat::fstat(a), nix::sys::stat::fstat(b)) else {
            return false;
        };
        (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino)
    }

    /// The whole hand-off within this process (a worker may be its own parent here): announced,
    /// taken by `pidfd_getfd` as the same file, marked taken, the worker's copy closed at its
    /// next hand-off, and a full set of cells dropping hand-offs.
    #[test]
    fn a_descriptor_handed_over_is_taken_and_let_go_of() {
        let shared = shared();
        let kept = Kept::default();
        let (r, _w) = nix::unistd::pipe().expect("pipe");
        assert!(hand_over(shared, 3, &kept, &r));
        assert_eq!(announced_in(shared, 3), 1);
        let me = pidfd_open(nix::unistd::getpid()).expect("pidfd_open of this process");
        let got = take(&shared.handoffs[3], Some(&me), 4);
        assert_eq!(got.len(), 1);
        let (n, fd) = &got[0];
        let fd = fd
            .as_ref()
            .expect("pidfd_getfd of this process's own descriptor");
        assert!(same_file(fd, &r));
        assert_eq!(shared.handoffs[3][0].load(Ordering::Relaxed), -(n + 1));
        assert!(take(&shared.handoffs[3], Some(&me), 4).is_empty());
        // The next hand-off closes the worker's copy and reuses the cell.
        assert!(hand_over(shared, 3, &kept, &r));
        assert!(shared.handoffs[3][0].load(Ordering::Relaxed) > 0);
        assert_eq!(shared.handoffs[3][1].load(Ordering::Relaxed), 0);
        for _ in 1..HANDOFFS {
            assert!(hand_over(shared, 3, &kept, &r));
        }
        assert!(!hand_over(shared, 3, &kept, &r), "every cell announced");
        assert_eq!(take(&shared.handoffs[3], Some(&me), 10).len(), 10);
        assert_eq!(announced_in(shared, 3), HANDOFFS - 10);
        assert!(!hand_over(shared, BUSY_SLOTS, &kept, &r), "no such slot");
    }

    /// How many cells of `slot` are announced.
    fn announced_in(shared: &Shared, slot: usize) -> usize {
        shared.handoffs[slot]
            .iter()
            .filter(|c| c.load(Ordering::Relaxed) > 0)
            .count()
    }

    /// A take from a process that has exited fails with `ESRCH` or `EBADF`, and the cell is
    /// marked taken all the same.
    #[test]
    fn a_take_from_a_gone_process_fails_as_gone() {
        let shared = shared();
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        let pidfd = pidfd_open(pid).expect("pidfd_open of a child");
        child.wait().expect("wait");
        shared.handoffs[0][5].store(announced(0), Ordering::Relaxed);
        let got = take(&shared.handoffs[0], Some(&pidfd), 4);
        assert_eq!(got.len(), 1);
        assert!(matches!(got[0].1, Err(Errno::ESRCH | Errno::EBADF)));
        assert_eq!(shared.handoffs[0][5].load(Ordering::Relaxed), -1);
        let mut f = Fences::new(shared);
        f.reset(0);
        assert_eq!(shared.handoffs[0][5].load(Ordering::Relaxed), 0);
        f.set_worker(0, pidfd);
        shared.handoffs[0][7].store(announced(0), Ordering::Relaxed);
        assert_eq!(f.finish(), 0);
        assert_eq!((f.taken, f.lost, f.failed), (0, 1, 0));
    }
}
