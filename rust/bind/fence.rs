// SPDX-License-Identifier: GPL-2.0

//! dma_fence and sync_file glue (the 7.2 `kernel` crate has neither).
//!
//! - [`Fence`]: a reference to any driver's fence (ruvm's own, another process's sync_file,
//!   sw_sync's, vgem's): its status, a bounded wait, an export as a sync_file fd.
//! - [`OwnFence`]: a fence ruvm issues on one of its timelines, signalled exactly once, with or
//!   without an error; one dropped unsignalled signals `ECANCELED`, so no fence of ruvm's is
//!   ever left pending.
//! - [`Watch`]: a callback on a fence's signal, which only wakes its target ([`Wake`]): it may
//!   run in IRQ context, under the signaller's locks.
//!
//! ruvm's fences have no `.release` and no `.wait` operation, so on signal the kernel detaches
//! them from ruvm's ops (dma-fence.c): a sync_file may outlive the module once every fence is
//! signalled and an RCU grace period has passed ([`quiesce`], at unload). Each fence is
//! one kmalloc'd object whose first field is the `dma_fence`: the kernel's default release
//! frees it with `kfree_rcu`, and its timeline name (stored in it) stays readable for the RCU
//! grace period the fence rules ask for.

use core::{
    marker::PhantomData,
    ptr::{self, NonNull},
};

use super::{anon::Exported, errno};
use kernel::{
    bindings,
    fs::{file::FileDescriptorReservation, File},
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{ordering::Relaxed, Atomic},
        Arc,
    },
    time::msecs_to_jiffies,
    types::Opaque,
};

/// Bytes of a timeline name, NUL included (`sync_fence_info.obj_name` holds 32).
pub(crate) const NAME_LEN: usize = 32;

const DMA_FENCE_FLAG_SIGNALED_BIT: u32 = bindings::dma_fence_flag_bits_DMA_FENCE_FLAG_SIGNALED_BIT;

/// A reference to a dma_fence of any driver.
///
/// # Invariants
///
/// `self.0` points at a live fence on which this object holds one reference.
pub(crate) struct Fence(NonNull<bindings::dma_fence>);

// SAFETY: a fence reference may be used and dropped from any thread (dma_fence's refcount and
// its lock make every operation here thread-safe).
unsafe impl Send for Fence {}
// SAFETY: as above; `&Fence` only reads or calls thread-safe functions.
unsafe impl Sync for Fence {}

impl Fence {
    /// Takes over a reference the caller owns.
    ///
    /// # Safety
    ///
    /// `ptr` is null or a fence the caller holds a reference on, which it gives up.
    pub(super) unsafe fn from_owned(ptr: *mut bindings::dma_fence) -> Option<Self> {
        NonNull::new(ptr).map(Self)
    }

    pub(super) fn as_ptr(&self) -> *mut bindings::dma_fence {
        self.0.as_ptr()
    }

    /// The fence of sync_file `fd`; `EINVAL` if `fd` is not an open sync_file.
    pub(crate) fn from_sync_file(fd: u64) -> Result<Self> {
        let fd = i32::try_from(fd).map_err(|_| EINVAL)?;
        // SAFETY: `sync_file_get_fence` takes its own reference on the file, returns a new
        // reference on its fence or null.
        let ptr = unsafe { sync_file_get_fence(fd) };
        // SAFETY: a new reference, or null.
        unsafe { Self::from_owned(ptr) }.ok_or(EINVAL)
    }

    /// The kernel's always-signalled stub fence.
    pub(crate) fn signalled() -> Result<Self> {
        // SAFETY: returns a new reference on the stub.
        let ptr = unsafe { bindings::dma_fence_get_stub() };
        // SAFETY: a new reference (never null in practice).
        unsafe { Self::from_owned(ptr) }.ok_or(ENOMEM)
    }

    /// 0 while pending, 1 when signalled without an error, the negative errno it signalled
    /// with otherwise.
    pub(crate) fn status(&self) -> i32 {
        // SAFETY: by the type invariant the fence is live.
        unsafe { bindings::dma_fence_get_status(self.as_ptr()) }
    }

    /// Whether it has signalled (cheap: the flag only, which every signal sets).
    pub(crate) fn is_signalled(&self) -> bool {
        // SAFETY: by the type invariant the fence is live; `flags` is read atomically.
        let flags = unsafe { ptr::addr_of!((*self.as_ptr()).flags).read_volatile() };
        flags & (1 << DMA_FENCE_FLAG_SIGNALED_BIT) != 0 || self.status() != 0
    }

    /// Its timeline (fence context).
    pub(crate) fn context(&self) -> u64 {
        // SAFETY: by the type invariant the fence is live; `context` is set at init and never
        // changes.
        unsafe { (*self.as_ptr()).context }
    }

    /// Waits until it signals, at most `timeout_ms`: its status then (1, or the negative errno
    /// it signalled with); `ETIMEDOUT`, or `EINTR` on a signal.
    pub(crate) fn wait(&self, timeout_ms: u32) -> Result<i32> {
        let jiffies = msecs_to_jiffies(timeout_ms);
        let jiffies = isize::try_from(jiffies).map_err(|_| EINVAL)?;
        // SAFETY: the fence is live; an interruptible wait of at most `jiffies`.
        let left = unsafe { bindings::dma_fence_wait_timeout(self.as_ptr(), true, jiffies) };
        if left < 0 {
            // -ERESTARTSYS: a signal. The wait has a deadline, so it is not restarted.
            return Err(EINTR);
        }
        match self.status() {
            0 => Err(ETIMEDOUT),
            s => Ok(s),
        }
    }

    /// A new sync_file holding this fence, with a close-on-exec descriptor reserved for it:
    /// the caller tells user space the number, then installs it ([`Exported::install`]).
    pub(crate) fn export(&self) -> Result<Exported> {
        let fd = FileDescriptorReservation::get_unused_fd_flags(bindings::O_CLOEXEC)?;
        // SAFETY: the fence is live; `sync_file_create` takes its own reference on it and
        // returns a sync_file (whose first field is its file, holding one reference) or null.
        let sync = unsafe { sync_file_create(self.as_ptr()) };
        if sync.is_null() {
            return Err(ENOMEM);
        }
        // SAFETY: `sync` is a live sync_file; its first field is the file (include/linux/
        // sync_file.h, whatever the configuration).
        let file = unsafe { (*sync.cast::<SyncFileHead>()).file };
        let file = NonNull::new(file.cast::<File>()).ok_or(ENOMEM)?;
        // SAFETY: the sync_file's file reference is handed over: dropping it (fput) releases
        // the sync_file and its fence reference.
        let file = unsafe { ARef::from_raw(file) };
        Ok(Exported::new(fd, file))
    }
}

impl Clone for Fence {
    fn clone(&self) -> Self {
        // SAFETY: the fence is live; one more reference (`dma_fence_get`).
        unsafe { bindings::refcount_inc(ptr::addr_of_mut!((*self.as_ptr()).refcount.refcount)) };
        Self(self.0)
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        // SAFETY: this object's reference is given back (`dma_fence_put`); the last one
        // releases the fence through its owner's release (ruvm's: `kfree_rcu`).
        unsafe {
            let kref = ptr::addr_of_mut!((*self.as_ptr()).refcount);
            if bindings::refcount_dec_and_test(ptr::addr_of_mut!((*kref).refcount)) {
                bindings::dma_fence_release(kref);
            }
        }
    }
}

/// The first field of `struct sync_file`.
#[repr(C)]
struct SyncFileHead {
    file: *mut bindings::file,
}

// The two sync_file functions: exported, not in the crate's bindings (linux/sync_file.h is not
// in its bindings_helper.h).
extern "C" {
    fn sync_file_create(fence: *mut bindings::dma_fence) -> *mut core::ffi::c_void;
    fn sync_file_get_fence(fd: core::ffi::c_int) -> *mut bindings::dma_fence;
}

/// A fence ruvm issues: its `dma_fence`, then its timeline's name.
#[repr(C)]
struct RawOwn {
    base: bindings::dma_fence,
    name: [u8; NAME_LEN],
}

/// The driver's name every fence of ruvm's reports.
const DRIVER: &CStr = c"ruvm";

/// # Safety
///
/// `fence` is a live fence of ruvm's (its ops are [`OPS`]).
unsafe extern "C" fn driver_name(_fence: *mut bindings::dma_fence) -> *const kernel::ffi::c_char {
    DRIVER.as_char_ptr()
}

/// # Safety
///
/// As [`driver_name`]: `fence` is the first field of a [`RawOwn`].
unsafe extern "C" fn timeline_name(fence: *mut bindings::dma_fence) -> *const kernel::ffi::c_char {
    // SAFETY: ruvm's fences are `RawOwn`s, whose first field is the fence; the name is
    // NUL-terminated (set at creation, never changed).
    unsafe { (*fence.cast::<RawOwn>()).name.as_ptr().cast() }
}

/// ruvm's fence operations: the two names only, so a fence detaches from the module when it
/// signals.
struct Ops(bindings::dma_fence_ops);
// SAFETY: a table of function pointers, never written.
unsafe impl Sync for Ops {}

static OPS: Ops = Ops(bindings::dma_fence_ops {
    get_driver_name: Some(driver_name),
    get_timeline_name: Some(timeline_name),
    enable_signaling: None,
    signaled: None,
    wait: None,
    release: None,
    set_deadline: None,
});

/// A new fence context (a timeline of its own).
pub(crate) fn new_context() -> u64 {
    // SAFETY: no requirement.
    unsafe { bindings::dma_fence_context_alloc(1) }
}

/// A fence of ruvm's, pending until [`OwnFence::signal_at`]; dropped unsignalled, it signals
/// `ECANCELED`.
///
/// # Invariants
///
/// `self.fence` is a `RawOwn` initialised with [`OPS`], on which `self` holds a reference.
pub(crate) struct OwnFence {
    fence: Fence,
    _not_sync: PhantomData<*mut ()>,
}

// SAFETY: signalling and dropping may happen on any thread.
unsafe impl Send for OwnFence {}

impl OwnFence {
    /// A pending fence at `seqno` of timeline `context`, named `name` (truncated to fit).
    pub(crate) fn new(context: u64, seqno: u64, name: &[u8], flags: Flags) -> Result<Self> {
        let mut buf = [0u8; NAME_LEN];
        let n = name.len().min(NAME_LEN - 1);
        buf[..n].copy_from_slice(&name[..n]);
        let raw = KBox::new(
            RawOwn {
                // SAFETY: all-zero is a valid `dma_fence` before `dma_fence_init64`.
                base: unsafe { core::mem::zeroed() },
                name: buf,
            },
            flags.0,
        )?;
        let raw = KBox::into_raw(raw);
        // SAFETY: `raw` is a live kmalloc'd `RawOwn` whose first field is the fence; init
        // takes its one reference, which `fence` owns from here. The kernel frees it with
        // `kfree_rcu` (no `.release`), which fits its kmalloc allocation.
        unsafe {
            bindings::dma_fence_init64(
                ptr::addr_of_mut!((*raw).base),
                &OPS.0,
                ptr::null_mut(),
                context,
                seqno,
            )
        };
        // SAFETY: as above.
        let fence = unsafe { Fence::from_owned(ptr::addr_of_mut!((*raw).base)) }.ok_or(ENOMEM)?;
        Ok(Self {
            fence,
            _not_sync: PhantomData,
        })
    }

    /// A reference to share (an event's point, a sync_file's).
    pub(crate) fn share(&self) -> Fence {
        self.fence.clone()
    }

    /// Signals it: with `result`'s error if any, saying it signalled at `time` ([`now`]'s
    /// clock; earlier for a point reached before its fence was made). Allocates nothing, takes
    /// only the fence's own lock; may run in any context.
    pub(crate) fn signal_at(self, result: Result, time: i64) {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is not used again after its fence is moved out.
        let fence = unsafe { ptr::read(&this.fence) };
        signal_raw(&fence, result, time);
    }
}

/// The fences' clock now (`CLOCK_MONOTONIC`, ns), for [`OwnFence::signal_at`].
pub(crate) fn now() -> i64 {
    // SAFETY: no requirement.
    unsafe { bindings::ktime_get() }
}

fn signal_raw(fence: &Fence, result: Result, time: i64) {
    if let Err(e) = result {
        // SAFETY: the fence is ruvm's and unsignalled (signalled only here, once): setting
        // its error before the signal is what `dma_fence_set_error` does.
        unsafe { ptr::addr_of_mut!((*fence.as_ptr()).error).write(e.to_errno()) };
    }
    // SAFETY: the fence is live.
    unsafe { bindings::dma_fence_signal_timestamp(fence.as_ptr(), time) };
}

impl Drop for OwnFence {
    fn drop(&mut self) {
        signal_raw(&self.fence, Err(errno::ecanceled()), now());
    }
}

/// How to allocate a fence.
#[derive(Clone, Copy)]
pub(crate) struct Flags(kernel::alloc::Flags);

impl Flags {
    /// In a submission, charged to the caller's memory cgroup.
    pub(crate) const USER: Flags = Flags(GFP_KERNEL_ACCOUNT);
}

/// What a [`Watch`] wakes when its fence signals: may be called in IRQ context, under the
/// signaller's locks, so it must only wake (queue work), never block or allocate.
pub(crate) trait Wake: Send + Sync {
    fn wake(this: &Arc<Self>);
}

/// A callback on one fence's signal, waking `T`.
///
/// # Invariants
///
/// While `armed`, `cb` is on `fence`'s callback list (or being run by its signal).
#[pin_data(PinnedDrop)]
pub(crate) struct Watch<T: Wake> {
    #[pin]
    cb: Opaque<bindings::dma_fence_cb>,
    fence: Fence,
    target: Arc<T>,
    armed: Atomic<bool>,
}

// SAFETY: the callback node is touched only by the fence core, under the fence's lock, and by
// `arm`/drop (which take that lock); the rest is `Send`/`Sync` by itself (`T: Wake` is).
unsafe impl<T: Wake> Send for Watch<T> {}
// SAFETY: as above.
unsafe impl<T: Wake> Sync for Watch<T> {}

impl<T: Wake + 'static> Watch<T> {
    /// A watch of `fence`, not yet armed.
    pub(crate) fn new(fence: Fence, target: Arc<T>) -> impl PinInit<Self> {
        pin_init!(Self {
            cb: Opaque::uninit(),
            fence,
            target,
            armed: Atomic::new(false),
        })
    }

    /// The fence watched.
    pub(crate) fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Arms it (once; later calls do nothing): `true` if the callback will run when the fence
    /// signals, `false` if it already has (the callback will not run).
    pub(crate) fn arm(self: Pin<&Self>) -> bool {
        if self.armed.load(Relaxed) {
            return true;
        }
        // SAFETY: the fence is live; `cb` is pinned and stays until `PinnedDrop` removes it;
        // `wake_cb::<T>` reads only this object, which outlives the callback (removed on drop).
        let r = unsafe {
            bindings::dma_fence_add_callback(self.fence.as_ptr(), self.cb.get(), Some(wake_cb::<T>))
        };
        let armed = r == 0;
        self.armed.store(armed, Relaxed);
        armed
    }
}

/// # Safety
///
/// `cb` is the `cb` field of a live `Watch<T>` (the watch removes it before it goes).
unsafe extern "C" fn wake_cb<T: Wake>(
    _fence: *mut bindings::dma_fence,
    cb: *mut bindings::dma_fence_cb,
) {
    // SAFETY: `cb` is the `cb` field of a live `Watch<T>` (the function's contract).
    let watch = unsafe { kernel::container_of!(Opaque::cast_from(cb).cast_mut(), Watch<T>, cb) };
    // SAFETY: the watch is live (see above).
    T::wake(unsafe { &(*watch).target });
}

#[pinned_drop]
impl<T: Wake> PinnedDrop for Watch<T> {
    fn drop(self: Pin<&mut Self>) {
        if self.armed.load(Relaxed) {
            // SAFETY: armed: `cb` was added to the fence; removing it (under the fence's lock)
            // waits out a callback running right now, so none runs after this.
            unsafe { bindings::dma_fence_remove_callback(self.fence.as_ptr(), self.cb.get()) };
        }
    }
}

/// Waits out every reader that may still be in ruvm's fence operations (names are read under
/// RCU): at unload, after the last fence of ruvm's signalled.
pub(crate) fn quiesce() {
    // SAFETY: no requirement; sleeps for a grace period.
    unsafe { bindings::synchronize_rcu() };
}

/// A section that signals fences (lockdep's fence-signalling annotation: inside it, no
/// allocation that may reclaim and no lock held around one). A no-op without lockdep.
pub(crate) struct Signalling {
    #[cfg(CONFIG_LOCKDEP)]
    cookie: bool,
}

impl Signalling {
    pub(crate) fn begin() -> Self {
        Self {
            #[cfg(CONFIG_LOCKDEP)]
            // SAFETY: no requirement; paired with the end in `drop`.
            cookie: unsafe { bindings::dma_fence_begin_signalling() },
        }
    }
}

impl Drop for Signalling {
    fn drop(&mut self) {
        #[cfg(CONFIG_LOCKDEP)]
        // SAFETY: ends the section `begin` opened, with its cookie.
        unsafe {
            bindings::dma_fence_end_signalling(self.cookie)
        };
    }
}
