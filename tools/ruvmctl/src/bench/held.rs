// SPDX-License-Identifier: GPL-2.0

//! What a stream benchmark case makes (streams, events, mems, pools), let go of when the case
//! ends, failed or not.

use anyhow::{Context as _, Result};
use libruvm::{uapi, Ruvm};

/// What a case made: when dropped, every stream is synchronized (a pool with a live mem is
/// `EBUSY`), then the streams and events are destroyed, the mems freed and the pools
/// destroyed, in that order.
pub(super) struct Held<'a> {
    d: &'a Ruvm,
    streams: Vec<u64>,
    events: Vec<u64>,
    mems: Vec<u64>,
    pools: Vec<u64>,
}

impl<'a> Held<'a> {
    pub(super) fn new(d: &'a Ruvm) -> Self {
        Self {
            d,
            streams: Vec::new(),
            events: Vec::new(),
            mems: Vec::new(),
            pools: Vec::new(),
        }
    }

    /// A new stream on `gpu`.
    pub(super) fn stream(&mut self, gpu: u32) -> Result<u64> {
        let s = self
            .d
            .stream_create(gpu)
            .with_context(|| format!("STREAM_CREATE on GPU {gpu}"))?
            .handle;
        self.streams.push(s);
        Ok(s)
    }

    /// A new event.
    pub(super) fn event(&mut self) -> Result<u64> {
        let e = self.d.event_create().context("EVENT_CREATE")?;
        self.events.push(e);
        Ok(e)
    }

    /// A sysmem mem of `size` bytes in `chunk`-byte chunks (0: the default), DMA-mapped for
    /// `gpu` (what `COPY` and `CE_COPY` need).
    pub(super) fn mem(&mut self, size: u64, chunk: u64, gpu: u32) -> Result<u64> {
        let h = self
            .d
            .mem_alloc(size, chunk, 0)
            .with_context(|| format!("MEM_ALLOC of {size} bytes"))?
            .handle;
        self.mems.push(h);
        self.d
            .mem_gpu(true, h, gpu)
            .with_context(|| format!("MEM_MAP_GPU for GPU {gpu}"))?;
        Ok(h)
    }

    /// A sysmem pool of `chunk`-byte chunks (0: the default) that keeps everything
    /// (threshold ~0), its chunks DMA-mapped for `gpu`.
    pub(super) fn pool(&mut self, chunk: u64, gpu: u32) -> Result<u64> {
        let (p, _) = self.d.pool_create(chunk, u64::MAX).context("POOL_CREATE")?;
        self.pools.push(p);
        self.d
            .pool_access(p, gpu, true)
            .with_context(|| format!("POOL_SET_ACCESS for GPU {gpu}"))?;
        Ok(p)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.streams.is_empty() {
            let _ = self.d.sync_every_stream(uapi::RUVM_WAIT_MAX_MS);
        }
        for &s in &self.streams {
            let _ = self.d.stream_destroy(s);
        }
        for &e in &self.events {
            let _ = self.d.event_destroy(e);
        }
        for &h in &self.mems {
            let _ = self.d.mem_free(h);
        }
        for &p in &self.pools {
            let _ = self.d.pool_destroy(p);
        }
    }
}
