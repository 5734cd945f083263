// SPDX-License-Identifier: GPL-2.0

//! What a submission needs from the file that makes it ([`Lookup`]): its mems, events, pools
//! and VA spaces, and the changes to its table a submission's ALLOCs and FREEs make.

use kernel::{prelude::*, sync::Arc};

use crate::mem::{
    pool::{
        pending::{Promise, Tag},
        Pool,
    },
    Made, Mem, StreamAlloc,
};

use super::event::Event;

/// What a submission needs from the file that makes it.
pub(crate) trait Lookup {
    /// The file's mem `handle` (`ENOENT`).
    fn mem(&self, handle: u64) -> Result<Arc<Mem>>;
    /// The handle and offset of the file's mem the submitting process maps at `addr`
    /// (`ENOENT` if none).
    fn handle_at(&self, addr: u64) -> Result<(u64, u64)>;
    /// Finds the file's event of each of `named` (one lookup for a submission, under one
    /// lock).
    fn events(&self, named: &mut [Named]);
    /// The VA space `flags` names (`EPERM` for the kernel's without `CAP_SYS_ADMIN`).
    fn va_space(&self, flags: u32) -> Result<u64>;
    /// The pool an ALLOC names: the file's pool `handle` (`ENOENT`), or with 0 the current
    /// pool of GPU `gpu` (its default made if need be).
    fn pool(&self, handle: u64, gpu: u32) -> Result<Arc<Pool>>;
    /// An ALLOC's mem of `size` bytes from `pool`, for the stream `ask` at point `own`.
    fn alloc(
        &self,
        pool: Arc<Pool>,
        size: u64,
        zero: bool,
        stream: StreamAlloc<'_, '_>,
    ) -> Result<Made>;
    /// Under the file's lock, with `queue` (which queues the submission): takes the handles
    /// `gone` out of the file's table and enters `new`, all or none (`ENOENT` if a handle of
    /// `gone` is not there any more, or what `queue` fails with).
    fn commit(
        &self,
        gone: &mut dyn Iterator<Item = u64>,
        new: &mut dyn Iterator<Item = (u64, &Arc<Mem>)>,
        queue: &mut dyn FnMut() -> Result,
    ) -> Result;
    /// Frees `mem` (its handle gone) on a stream, at point `free` ([`Mem::free_ordered`]).
    /// With `heir`, the chunks become that mem's (it borrowed them).
    fn free(&self, mem: &Arc<Mem>, free: Tag, promise: Option<Promise>, heir: Option<&Mem>);
}

/// An event a submission names: its handle, the file's event of that handle (`None`: the
/// file has none), and the seqno the submission last recorded it at (0: none). Events are moved
/// only once the whole submission is queued.
#[derive(Default)]
pub(crate) struct Named {
    pub(super) handle: u64,
    pub(super) event: Option<Arc<Event>>,
    pub(super) recorded: u64,
}

impl Named {
    /// The handle to look up.
    pub(crate) fn handle(&self) -> u64 {
        self.handle
    }

    /// The file's event of the handle.
    pub(crate) fn found(&mut self, event: Arc<Event>) {
        self.event = Some(event);
    }
}
