// SPDX-License-Identifier: GPL-2.0

//! The stream and event ioctls: make and destroy a file's streams and events, submit work,
//! query and wait, export an event as a sync_file.

use kernel::{
    fs::File,
    prelude::*,
    rbtree::RBTree,
    sync::Arc,
    uaccess::{UserPtr, UserSlice},
};

use crate::{
    audit::{Class, Counted},
    mem::{
        pool::{
            pending::{Promise, Tag},
            Pool,
        },
        AllocRequest, Handle, Made, Mem, Origin, StreamAlloc,
    },
    stream::{
        event::Event,
        lookup::{Lookup, Named},
        status::Status,
        Budget, StreamCore,
    },
    uapi,
};

use super::{args, max_alloc_bytes, Entry, RuvmFile};

/// The most streams and events of one file.
const MAX_STREAMS: usize = uapi::RUVM_MAX_FILE_STREAMS as usize;
const MAX_EVENTS: usize = uapi::RUVM_MAX_FILE_EVENTS as usize;

/// A file's streams and events, by handle. A destroyed stream with work still queued stays in
/// `retiring` (counted against the file's limit) until that work is retired, so that closing
/// the file cancels it too.
pub(super) struct FileStreams {
    /// The bound on the operations its streams hold.
    budget: Arc<Budget>,
    streams: RBTree<u64, Arc<StreamCore>>,
    retiring: KVec<Arc<StreamCore>>,
    events: RBTree<u64, Arc<Event>>,
    /// How many `events` holds (an RB-tree does not count its nodes).
    n_events: usize,
    next: u64,
    /// The status page, once asked for (`RUVM_IOCTL_STREAM_STATUS` or its `mmap`).
    status: Option<Arc<Status>>,
}

impl FileStreams {
    pub(super) fn new() -> Result<Self> {
        Ok(Self {
            budget: Arc::new(Budget::new(), GFP_KERNEL_ACCOUNT)?,
            streams: RBTree::new(),
            retiring: KVec::new(),
            events: RBTree::new(),
            n_events: 0,
            next: 1,
            status: None,
        })
    }

    fn handle(&mut self) -> u64 {
        let h = self.next;
        self.next += 1;
        h
    }

    /// Enters `event` under a new handle: `ENOSPC` at the file's limit.
    fn add_event(&mut self, event: Arc<Event>) -> Result<u64> {
        if self.n_events >= MAX_EVENTS {
            return Err(ENOSPC);
        }
        let h = self.handle();
        self.events
            .try_create_and_insert(h, event, GFP_KERNEL_ACCOUNT)?;
        self.n_events += 1;
        Ok(h)
    }

    /// Takes event `handle` out (to be dropped once the file's lock is released).
    fn remove_event(&mut self, handle: u64) -> Option<Arc<Event>> {
        let e = self.events.remove(&handle)?;
        self.n_events -= 1;
        Some(e)
    }
}

impl Drop for FileStreams {
    fn drop(&mut self) {
        for s in Iterator::chain(self.streams.values(), self.retiring.iter()) {
            s.cancel();
        }
    }
}

/// The mems, events, pools and VA spaces a submission names, looked up in the file (`File`:
/// for zapping the user mappings of the mems it frees).
struct FileLookup<'a>(&'a RuvmFile, &'a File);

impl Lookup for FileLookup<'_> {
    fn mem(&self, handle: u64) -> Result<Arc<Mem>> {
        self.0.mem(handle)
    }

    fn handle_at(&self, addr: u64) -> Result<(u64, u64)> {
        self.0.handle_at(addr)
    }

    fn events(&self, named: &mut [Named]) {
        let inner = self.0.inner.lock();
        for n in named.iter_mut() {
            if let Some(event) = inner.streams.events.get(&n.handle()) {
                n.found(event.clone());
            }
        }
    }

    fn va_space(&self, flags: u32) -> Result<u64> {
        self.0.va_space(flags)
    }

    fn pool(&self, handle: u64, gpu: u32) -> Result<Arc<Pool>> {
        match handle {
            0 => self.0.current_pool(gpu),
            h => self.0.own_pool(h),
        }
    }

    fn alloc(
        &self,
        pool: Arc<Pool>,
        size: u64,
        zero: bool,
        stream: StreamAlloc<'_, '_>,
    ) -> Result<Made> {
        let req = AllocRequest {
            gpu: None,
            size,
            page_size: 0,
            zero,
            fallback: false,
            sparse: false,
            map_user: false,
            max_bytes: max_alloc_bytes(),
            pool: Some(pool),
        };
        Mem::alloc_ordered(&req, &self.0.quota, Origin::here("OP_ALLOC"), stream)
    }

    fn commit(
        &self,
        gone: &mut dyn Iterator<Item = u64>,
        new: &mut dyn Iterator<Item = (u64, &Arc<Mem>)>,
        queue: &mut dyn FnMut() -> Result,
    ) -> Result {
        // Everything the new entries need is had before the lock: nothing fails once the
        // submission is queued.
        let mut entries = KVec::new();
        for (handle, mem) in new {
            let entry = Entry {
                mem: mem.clone(),
                _handle: Counted::new(Class::Handles, 1),
                registered: None,
            };
            entries.push((Handle(handle), mem.mmap_offset(), entry), GFP_KERNEL)?;
        }
        let mut guard = self.0.inner.lock();
        let inner = &mut *guard;
        let mut slots = KVec::with_capacity(entries.len(), GFP_KERNEL)?;
        let mut failed = None;
        for _ in 0..entries.len() {
            match (inner.mems.slot(), inner.offsets.slot()) {
                (Ok(a), Ok(b)) => slots.push((a, b), GFP_KERNEL)?,
                (a, b) => {
                    failed = Some(ENOMEM);
                    if let Ok(a) = a {
                        inner.mems.unused(a);
                    }
                    if let Ok(b) = b {
                        inner.offsets.unused(b);
                    }
                    break;
                }
            }
        }
        let mut gone_handles = KVec::new();
        if failed.is_none() {
            for h in gone {
                if inner.mems.get(&Handle(h)).is_none() {
                    failed = Some(ENOENT);
                    break;
                }
                if let Err(e) = gone_handles.push(h, GFP_KERNEL) {
                    failed = Some(e.into());
                    break;
                }
            }
        }
        let r = match failed {
            Some(e) => Err(e),
            None => queue(),
        };
        if r.is_ok() {
            // Queued: the new mems are made before anyone can find them (a FREE of one, in
            // another submission, hands its chunks back with its ALLOC's point).
            for (_, _, e) in entries.iter() {
                e.mem.mark_committed();
            }
        }
        if r.is_err() {
            for (a, b) in slots {
                inner.mems.unused(a);
                inner.offsets.unused(b);
            }
            return r;
        }
        // Dropped once the lock is released (never the last references: the FREEs hold them).
        let mut dropped = KVec::with_capacity(gone_handles.len(), GFP_KERNEL).unwrap_or_default();
        for h in gone_handles {
            if let Some(mem) = inner.remove(Handle(h)) {
                let _ = dropped.push(mem, GFP_KERNEL);
            }
        }
        for ((handle, offset, entry), (a, b)) in entries.into_iter().zip(slots) {
            inner.mems.insert(a, handle, entry);
            inner.offsets.insert(b, offset, handle);
        }
        drop(guard);
        drop(dropped);
        Ok(())
    }

    fn free(&self, mem: &Arc<Mem>, free: Tag, promise: Option<Promise>, heir: Option<&Mem>) {
        // The handle is gone: a zap that fails leaves the pages to the fault handler, which
        // refuses a freed mem's.
        let zap = |filled_by| {
            let _ = mem.zap_filled(self.1, filled_by);
        };
        mem.free_ordered(zap, free, promise, heir);
    }
}

impl RuvmFile {
    /// The file's stream `handle`, or `ENOENT`.
    fn stream(&self, handle: u64) -> Result<Arc<StreamCore>> {
        self.inner
            .lock()
            .streams
            .streams
            .get(&handle)
            .cloned()
            .ok_or(ENOENT)
    }

    /// The file's event `handle`, or `ENOENT`.
    fn event(&self, handle: u64) -> Result<Arc<Event>> {
        self.inner
            .lock()
            .streams
            .events
            .get(&handle)
            .cloned()
            .ok_or(ENOENT)
    }

    /// `RUVM_IOCTL_STREAM_CREATE`.
    pub(super) fn stream_create(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_stream_create>(user)?;
        let (handle, budget) = {
            let mut inner = self.inner.lock();
            let fs = &mut inner.streams;
            fs.retiring.retain(|s| s.busy());
            if fs.streams.iter().count() + fs.retiring.len() >= MAX_STREAMS {
                return Err(ENOSPC);
            }
            (fs.handle(), fs.budget.clone())
        };
        let stream = StreamCore::new(args.gpu, handle, budget)?;
        args.handle = handle;
        args.context = stream.context();
        {
            let mut inner = self.inner.lock();
            let fs = &mut inner.streams;
            if fs.streams.iter().count() + fs.retiring.len() >= MAX_STREAMS {
                return Err(ENOSPC);
            }
            fs.streams
                .try_create_and_insert(handle, stream, GFP_KERNEL_ACCOUNT)?;
        }
        if let Err(e) = writer.write(&args) {
            // The caller cannot learn the handle: the stream goes again. Another thread may
            // have named it meanwhile (handles are predictable): its work is cancelled and its
            // status slot given back, so nothing of it outlives the file's reach.
            let gone = self.inner.lock().streams.streams.remove(&handle);
            if let Some(s) = gone {
                s.destroy();
                s.cancel();
            }
            return Err(e);
        }
        Ok(())
    }

    /// `RUVM_IOCTL_STREAM_DESTROY`: the handle goes at once; queued work goes on.
    pub(super) fn stream_destroy(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_stream_handle>(user)?;
        let mut inner = self.inner.lock();
        let fs = &mut inner.streams;
        if !fs.streams.iter().any(|(h, _)| *h == args.handle) {
            return Err(ENOENT);
        }
        // Room to keep it first: once its handle is gone nothing may fail, or its work would
        // be out of the file's reach (a close must cancel it).
        fs.retiring.retain(|s| s.busy());
        fs.retiring.reserve(1, GFP_KERNEL_ACCOUNT)?;
        let stream = fs.streams.remove(&args.handle).ok_or(ENOENT)?;
        stream.destroy();
        if stream.busy() {
            // Within the room reserved: cannot fail.
            let _ = fs.retiring.push_within_capacity(stream);
        }
        Ok(())
    }

    /// `RUVM_IOCTL_STREAM_SUBMIT` (`arg`: the structure's address).
    pub(super) fn stream_submit(&self, file: &File, user: UserSlice, arg: usize) -> Result {
        let args = args::read::<uapi::ruvm_stream_submit>(user)?;
        let stream = self.stream(args.handle)?;
        // The answer, `first_seqno` (the only field written: 8 bytes, not the structure's 48,
        // each byte a step of `rep movsb` under TCG), must be writable before anything is
        // queued (`EFAULT` queues nothing); written again once the seqno is known.
        let answer = || {
            let at = arg.checked_add(core::mem::offset_of!(uapi::ruvm_stream_submit, first_seqno));
            UserSlice::new(
                UserPtr::from_addr(at.unwrap_or(usize::MAX)),
                size_of::<u64>(),
            )
            .writer()
        };
        answer().write(&args.first_seqno)?;
        let first = stream.submit(
            UserPtr::from_addr(usize::try_from(args.ops).map_err(|_| EFAULT)?),
            args.count,
            &FileLookup(self, file),
        )?;
        // The work is queued: unless the caller unmapped the structure meanwhile, this works.
        answer().write(&first)
    }

    /// The file's status page, made at the first call (charged to the caller).
    pub(super) fn status_page(&self) -> Result<Arc<Status>> {
        if let Some(s) = &self.inner.lock().streams.status {
            return Ok(s.clone());
        }
        // Made with no lock held; a racing call's page may win, and this one is dropped.
        let made = Status::new()?;
        let mut inner = self.inner.lock();
        Ok(inner.streams.status.get_or_insert(made).clone())
    }

    /// `RUVM_IOCTL_STREAM_STATUS`: the stream's slot of the status page.
    pub(super) fn stream_status(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_stream_status>(user)?;
        let stream = self.stream(args.handle)?;
        let page = self.status_page()?;
        (args.slot, args.completed) = stream.status_slot(&page)?;
        args.offset = uapi::RUVM_STATUS_MMAP_OFFSET;
        writer.write(&args)
    }

    /// `RUVM_IOCTL_STREAM_QUERY`.
    pub(super) fn stream_query(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_stream_query>(user)?;
        let info = self.stream(args.handle)?.info();
        args.gpu = info.gpu;
        args.submitted = info.submitted;
        args.completed = info.completed;
        (args.error, args.failed_seqno) = match info.error {
            // CAST: an errno, positive and small.
            Some((e, seqno)) => ((-e.to_errno()) as u32, seqno),
            None => (0, 0),
        };
        args.pad = 0;
        args.current_seqno = info.current;
        (args.current_done, args.current_len) = info.progress;
        writer.write(&args)
    }

    /// `RUVM_IOCTL_STREAM_SYNC`: one stream, or with `RUVM_SYNC_EVERY_STREAM` every stream of the file.
    pub(super) fn stream_sync(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_stream_sync>(user)?;
        check_timeout(args.timeout_ms)?;
        let r = self.sync_streams(&args);
        if r.is_ok() || r == Err(EIO) {
            let every = args.flags & uapi::ruvm_sync_flags_RUVM_SYNC_EVERY_STREAM != 0;
            self.settle_pools(every);
        }
        r
    }

    fn sync_streams(&self, args: &uapi::ruvm_stream_sync) -> Result {
        if args.flags & uapi::ruvm_sync_flags_RUVM_SYNC_EVERY_STREAM == 0 {
            return self.stream(args.handle)?.sync(args.timeout_ms);
        }
        if args.handle != 0 {
            return Err(EINVAL);
        }
        let all = {
            let inner = self.inner.lock();
            let fs = &inner.streams;
            let n = fs.streams.iter().count() + fs.retiring.len();
            let mut all = KVec::with_capacity(n, GFP_KERNEL)?;
            for s in Iterator::chain(fs.streams.values(), fs.retiring.iter()) {
                all.push(s.clone(), GFP_KERNEL)?;
            }
            all
        };
        // One deadline for all: each waits at most what is left of it.
        let start = kernel::time::Instant::<kernel::time::Monotonic>::now();
        // A stream in error is said (EIO) before a timeout or a signal met on another.
        let mut result = Ok(());
        for s in all.iter() {
            let spent = u32::try_from(start.elapsed().as_millis()).unwrap_or(u32::MAX);
            let left = args.timeout_ms.saturating_sub(spent).max(1);
            match s.sync(left) {
                Ok(()) => {}
                Err(e) if e == EIO => result = Err(EIO),
                Err(e) => {
                    if result.is_ok() {
                        result = Err(e);
                    }
                    if e == EINTR {
                        break;
                    }
                }
            }
        }
        result
    }

    /// `RUVM_IOCTL_EVENT_CREATE`.
    pub(super) fn event_create(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_event>(user)?;
        if args.timeout_ms != 0 {
            return Err(EINVAL);
        }
        let event = Arc::pin_init(Event::new(), GFP_KERNEL_ACCOUNT)?;
        let handle = self.inner.lock().streams.add_event(event)?;
        args.handle = handle;
        if let Err(e) = writer.write(&args) {
            let _gone = self.inner.lock().streams.remove_event(handle);
            return Err(e);
        }
        Ok(())
    }

    /// `RUVM_IOCTL_EVENT_DESTROY`.
    pub(super) fn event_destroy(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_event>(user)?;
        if args.timeout_ms != 0 {
            return Err(EINVAL);
        }
        let _gone = self
            .inner
            .lock()
            .streams
            .remove_event(args.handle)
            .ok_or(ENOENT)?;
        Ok(())
    }

    /// `RUVM_IOCTL_EVENT_QUERY`.
    pub(super) fn event_query(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_event>(user)?;
        if args.timeout_ms != 0 {
            return Err(EINVAL);
        }
        let state = self.event(args.handle)?.state();
        args.status = state.status;
        args.stream = state.stream;
        args.seqno = state.seqno;
        args.fd = -1;
        writer.write(&args)
    }

    /// `RUVM_IOCTL_EVENT_SYNC`.
    pub(super) fn event_sync(&self, user: UserSlice) -> Result {
        let args = args::read::<uapi::ruvm_event>(user)?;
        check_timeout(args.timeout_ms)?;
        let r = self.event(args.handle)?.sync(args.timeout_ms);
        if r.is_ok() || r == Err(EIO) {
            self.settle_pools(false);
        }
        r
    }

    /// `RUVM_IOCTL_EVENT_EXPORT`: the fd is installed only once its number reached the caller.
    pub(super) fn event_export(&self, user: UserSlice) -> Result {
        let (mut args, mut writer) = args::read_write::<uapi::ruvm_event>(user)?;
        if args.timeout_ms != 0 {
            return Err(EINVAL);
        }
        let exported = self.event(args.handle)?.export()?;
        args.fd = i32::try_from(exported.fd())?;
        writer.write(&args)?;
        exported.install();
        Ok(())
    }
}

/// `EINVAL` unless a wait's timeout is 1 to `RUVM_WAIT_MAX_MS`.
fn check_timeout(ms: u32) -> Result {
    if ms == 0 || ms > uapi::RUVM_WAIT_MAX_MS {
        return Err(EINVAL);
    }
    Ok(())
}
