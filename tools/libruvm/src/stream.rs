// SPDX-License-Identifier: GPL-2.0

//! Streams and events (`RUVM_IOCTL_STREAM_*`, `RUVM_IOCTL_EVENT_*`): conveniences on
//! [`Ruvm::call`] for the common argument shapes.
//!
//! A stream is a queue of operations ([`crate::op`]) of one open file on one GPU, run in order
//! and asynchronously; an event holds the point it was last recorded at, a dma_fence that
//! [`Ruvm::event_export`] hands out as a sync_file ([`crate::sync_file`]). Both belong to the
//! open file: closing it cancels the work still queued.

use std::os::fd::{FromRawFd, OwnedFd};

use nix::errno::Errno;

use crate::{cmd, op, uapi, Ruvm};

impl Ruvm {
    /// `RUVM_IOCTL_STREAM_STATUS`: the stream's slot of the file's status page (given at the
    /// first call), with its completed point now. Read the slot through [`crate::StatusPage`].
    pub fn stream_status(&self, stream: u64) -> Result<uapi::ruvm_stream_status, Errno> {
        let mut a = uapi::ruvm_stream_status {
            handle: stream,
            ..Default::default()
        };
        self.call(cmd::STREAM_STATUS, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_STREAM_CREATE` on `gpu`: the stream's handle and fence context.
    pub fn stream_create(&self, gpu: u32) -> Result<uapi::ruvm_stream_create, Errno> {
        let mut a = uapi::ruvm_stream_create {
            gpu,
            ..Default::default()
        };
        self.call(cmd::STREAM_CREATE, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_STREAM_DESTROY`: returns at once, the work queued runs on.
    pub fn stream_destroy(&self, stream: u64) -> Result<(), Errno> {
        let mut a = uapi::ruvm_stream_handle {
            handle: stream,
            ..Default::default()
        };
        self.call(cmd::STREAM_DESTROY, &mut a)
    }

    /// `RUVM_IOCTL_STREAM_SUBMIT` of `ops`: the seqno of the first (operation i has that + i).
    /// An empty slice is passed through (the module refuses it).
    ///
    /// The module writes an ALLOC's results into the array it is given: with an ALLOC among
    /// `ops`, a copy is submitted and its results are dropped (use
    /// [`Ruvm::stream_submit_mut`] to read them).
    pub fn stream_submit(&self, stream: u64, ops: &[uapi::ruvm_op]) -> Result<u64, Errno> {
        if ops.iter().any(op::writes_back) {
            return self.stream_submit_mut(stream, &mut ops.to_vec());
        }
        // The module only reads the array: a pointer from a shared borrow is enough.
        self.submit_at(stream, ops.len(), ops.as_ptr() as u64)
    }

    /// `RUVM_IOCTL_STREAM_SUBMIT` of `ops`, which the module may write into: after a successful
    /// submission each ALLOC holds the new mem's handle and mmap offset
    /// ([`op::allocated`]). The seqno of the first operation (operation i has that + i).
    pub fn stream_submit_mut(&self, stream: u64, ops: &mut [uapi::ruvm_op]) -> Result<u64, Errno> {
        self.submit_at(stream, ops.len(), ops.as_mut_ptr() as u64)
    }

    /// `RUVM_IOCTL_STREAM_SUBMIT` of `count` operations at address `ops`.
    fn submit_at(&self, stream: u64, count: usize, ops: u64) -> Result<u64, Errno> {
        let mut a = uapi::ruvm_stream_submit {
            handle: stream,
            count: u32::try_from(count).map_err(|_| Errno::EINVAL)?,
            ops,
            ..Default::default()
        };
        self.call(cmd::STREAM_SUBMIT, &mut a)?;
        Ok(a.first_seqno)
    }

    /// `RUVM_IOCTL_STREAM_QUERY`: seqnos submitted and completed, the sticky error, and the
    /// operation the engine is on (`current_seqno`, 0 if none) with its progress.
    pub fn stream_query(&self, stream: u64) -> Result<uapi::ruvm_stream_query, Errno> {
        let mut a = uapi::ruvm_stream_query {
            handle: stream,
            ..Default::default()
        };
        self.call(cmd::STREAM_QUERY, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_STREAM_SYNC` of one stream, waiting at most `timeout_ms`: `EIO` if it is in
    /// error, `ETIMEDOUT` if its work was not done by then. Once it returns, every operation
    /// submitted before the call has retired and every fence among them has signalled; with 0
    /// or `EIO`, the stream-ordered frees it waited for are observed (their chunks cached, each
    /// pool of the file trimmed to its release threshold).
    pub fn stream_sync(&self, stream: u64, timeout_ms: u32) -> Result<(), Errno> {
        let mut a = uapi::ruvm_stream_sync {
            handle: stream,
            timeout_ms,
            ..Default::default()
        };
        self.call(cmd::STREAM_SYNC, &mut a)
    }

    /// `RUVM_IOCTL_STREAM_SYNC` with `RUVM_SYNC_EVERY_STREAM`: every stream of the file,
    /// destroyed ones with work included, within one deadline (`cudaDeviceSynchronize`). `EIO`
    /// if any is in error.
    pub fn sync_every_stream(&self, timeout_ms: u32) -> Result<(), Errno> {
        let mut a = uapi::ruvm_stream_sync {
            flags: uapi::ruvm_sync_flags_RUVM_SYNC_EVERY_STREAM,
            timeout_ms,
            ..Default::default()
        };
        self.call(cmd::STREAM_SYNC, &mut a)
    }

    /// `RUVM_IOCTL_EVENT_CREATE`: the new event's handle.
    pub fn event_create(&self) -> Result<u64, Errno> {
        let mut a = uapi::ruvm_event::default();
        self.call(cmd::EVENT_CREATE, &mut a)?;
        Ok(a.handle)
    }

    /// `RUVM_IOCTL_EVENT_DESTROY`.
    pub fn event_destroy(&self, event: u64) -> Result<(), Errno> {
        let mut a = uapi::ruvm_event {
            handle: event,
            ..Default::default()
        };
        self.call(cmd::EVENT_DESTROY, &mut a)
    }

    /// `RUVM_IOCTL_EVENT_QUERY`: `status` (0 pending, 1 signalled, -errno), `stream`, `seqno`.
    pub fn event_query(&self, event: u64) -> Result<uapi::ruvm_event, Errno> {
        let mut a = uapi::ruvm_event {
            handle: event,
            ..Default::default()
        };
        self.call(cmd::EVENT_QUERY, &mut a)?;
        Ok(a)
    }

    /// `RUVM_IOCTL_EVENT_SYNC`, waiting at most `timeout_ms` for the event's point: `Ok` if it
    /// signalled without an error, `EIO` if it signalled with one ([`Ruvm::event_query`]'s
    /// `status` says which), `ETIMEDOUT` only if `timeout_ms` passed first, `EINTR` on a
    /// signal.
    pub fn event_sync(&self, event: u64, timeout_ms: u32) -> Result<(), Errno> {
        let mut a = uapi::ruvm_event {
            handle: event,
            timeout_ms,
            ..Default::default()
        };
        self.call(cmd::EVENT_SYNC, &mut a)
    }

    /// `RUVM_IOCTL_EVENT_EXPORT`: the event's point as a new sync_file (close-on-exec).
    pub fn event_export(&self, event: u64) -> Result<OwnedFd, Errno> {
        let mut a = uapi::ruvm_event {
            handle: event,
            ..Default::default()
        };
        self.call(cmd::EVENT_EXPORT, &mut a)?;
        if a.fd < 0 {
            // The module said it made one: a negative number would be its bug.
            return Err(Errno::EBADF);
        }
        // SAFETY: the module installed `a.fd` in this process's table for this call; nothing
        // else in this process knows it, so this is its only owner.
        Ok(unsafe { OwnedFd::from_raw_fd(a.fd) })
    }
}

#[cfg(test)]
mod tests {
    use crate::uapi;

    #[test]
    fn structures_have_the_documented_layout() {
        assert_eq!(std::mem::size_of::<uapi::ruvm_stream_create>(), 40);
        assert_eq!(std::mem::size_of::<uapi::ruvm_stream_handle>(), 32);
        assert_eq!(std::mem::size_of::<uapi::ruvm_stream_submit>(), 48);
        assert_eq!(std::mem::size_of::<uapi::ruvm_stream_query>(), 88);
        assert_eq!(std::mem::size_of::<uapi::ruvm_stream_sync>(), 32);
        assert_eq!(std::mem::size_of::<uapi::ruvm_event>(), 56);
    }

    #[test]
    fn the_query_has_current_seqno_before_its_progress() {
        use std::mem::offset_of;
        use uapi::ruvm_stream_query as Q;
        assert_eq!(offset_of!(Q, failed_seqno), 40);
        assert_eq!(offset_of!(Q, current_seqno), 48);
        assert_eq!(offset_of!(Q, current_done), 56);
        assert_eq!(offset_of!(Q, current_len), 64);
        assert_eq!(offset_of!(Q, reserved), 72);
    }

    #[test]
    fn stream_commands_are_0x40_to_0x49() {
        let nr = |c: u32| (c & 0xff, (c >> 8) & 0xff);
        let m = uapi::RUVM_IOCTL_MAGIC;
        for (i, c) in [
            crate::cmd::STREAM_CREATE.nr,
            crate::cmd::STREAM_DESTROY.nr,
            crate::cmd::STREAM_SUBMIT.nr,
            crate::cmd::STREAM_QUERY.nr,
            crate::cmd::STREAM_SYNC.nr,
            crate::cmd::EVENT_CREATE.nr,
            crate::cmd::EVENT_DESTROY.nr,
            crate::cmd::EVENT_QUERY.nr,
            crate::cmd::EVENT_SYNC.nr,
            crate::cmd::EVENT_EXPORT.nr,
            crate::cmd::STREAM_STATUS.nr,
        ]
        .into_iter()
        .enumerate()
        {
            assert_eq!(nr(c), (0x40 + i as u32, m), "command {i}");
            assert_eq!(c >> 30, 3, "command {i} is read-write");
        }
    }
}
