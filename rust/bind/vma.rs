// SPDX-License-Identifier: GPL-2.0

//! User mappings: the VMA operations that tie a VMA to its owner, fill it on fault, and zap it.
//!
//! C header: [`include/linux/mm.h`](srctree/include/linux/mm.h)
//!
//! The 7.2 `kernel::mm::virt` API can insert pages into a new VMA but cannot give it
//! `vm_operations_struct`. Each VMA of ours holds a reference on its owner (an `Arc` in
//! `vm_private_data`): taken when it is installed or copied (`open`: mremap), dropped when it
//! goes (`close`). So whatever the VMA maps lives at least as long as the VMA. Splitting is
//! refused (`may_split`): a mapping is all of its owner or nothing.
//!
//! Pages are inserted by the `fault` handler, or by the owner's `mmap` itself ([`new_pages`])
//! before it calls [`install`]. `mmap` runs before the VMA is linked into the file's mappings,
//! so an `unmap_mapping_range` that runs meanwhile misses the pages `mmap` inserted: an owner
//! that inserts them there must zap again once that `mmap` is over (its mm's mmap lock, which
//! `mmap` holds for writing, can be taken). A fault runs on a linked VMA, and the owner decides
//! under its own lock whether to insert (then a later zap finds the page) or to refuse
//! (`SIGBUS`).

use core::marker::PhantomData;

use kernel::{
    bindings,
    ffi::{c_int, c_ulong},
    fs::File,
    mm::{
        virt::{flags as vm_flags, VmaMixedMap, VmaNew, VmaRef},
        Mm,
    },
    page::{BorrowedPage, PAGE_SIZE},
    prelude::*,
    sync::{aref::ARef, Arc},
    types::ForeignOwnable,
};

/// What a VMA of ours belongs to.
pub(crate) trait VmaOwner: Send + Sync + 'static {
    /// A VMA now maps it (installed, or copied by mremap).
    fn vma_opened(&self);
    /// A VMA that mapped it is gone.
    fn vma_closed(&self);
    /// Page `index` of the owner was touched: insert it (and, if it likes, neighbours) with
    /// [`VmaPages::insert`], or fail (the access gets `SIGBUS`).
    fn fault(&self, index: usize, vma: &VmaPages<'_>) -> Result;
}

/// One of our VMAs, its pages being inserted: by a page fault (the mmap lock held for reading)
/// or by `mmap` before [`install`] (held for writing).
pub(crate) struct VmaPages<'a> {
    vma: &'a VmaMixedMap,
}

/// The pages of a VMA being created by `mmap`, to insert before [`install`]. If `mmap` then
/// fails, the kernel unmaps whatever was inserted.
pub(crate) fn new_pages(vma: &VmaNew) -> VmaPages<'_> {
    VmaPages {
        vma: vma.set_mixedmap(),
    }
}

impl VmaPages<'_> {
    /// Maps `page` as page `index` of the VMA (counted from its start). A page already there is
    /// left as it is.
    pub(crate) fn insert(&self, index: usize, page: &BorrowedPage<'_>) -> Result {
        let offset = index.checked_mul(PAGE_SIZE).ok_or(EINVAL)?;
        let addr = self.vma.start().checked_add(offset).ok_or(EINVAL)?;
        if addr >= self.vma.end() {
            return Err(EINVAL);
        }
        match self.vma.vm_insert_page(addr, page) {
            Err(e) if e == EBUSY => Ok(()),
            r => r,
        }
    }

    /// Pages in the VMA.
    pub(crate) fn pages(&self) -> usize {
        (self.vma.end() - self.vma.start()) / PAGE_SIZE
    }
}

struct VmOps<T>(PhantomData<T>);

impl<T: VmaOwner> VmOps<T> {
    const OPS: bindings::vm_operations_struct = bindings::vm_operations_struct {
        open: Some(Self::open as unsafe extern "C" fn(_)),
        close: Some(Self::close as unsafe extern "C" fn(_)),
        may_split: Some(Self::may_split as unsafe extern "C" fn(_, _) -> _),
        fault: Some(Self::fault as unsafe extern "C" fn(_) -> _),
        // SAFETY: all other fields are optional callbacks or plain values, for which all-zero
        // means "none".
        ..unsafe { core::mem::zeroed() }
    };

    /// # Safety
    ///
    /// `vma` is a copy (`vm_area_dup`) of a VMA set up by [`install`] for `T`, which still holds
    /// its reference.
    unsafe extern "C" fn open(vma: *mut bindings::vm_area_struct) {
        // SAFETY: the copied `vm_private_data` came from `Arc::<T>::into_foreign` and the
        // original VMA's reference keeps it alive during this call.
        let owner: Arc<T> = unsafe { Arc::<T>::borrow((*vma).vm_private_data) }.into();
        owner.vma_opened();
        // The copy owns this new reference; `vm_private_data` already holds the same pointer.
        let _ = owner.into_foreign();
    }

    /// # Safety
    ///
    /// `vma` was set up by [`install`] or [`Self::open`] for `T` and is going away.
    unsafe extern "C" fn close(vma: *mut bindings::vm_area_struct) {
        // SAFETY: the VMA owns one reference, made by `into_foreign`; it is given back here, once.
        let owner = unsafe { Arc::<T>::from_foreign((*vma).vm_private_data) };
        owner.vma_closed();
    }

    /// # Safety
    ///
    /// Called by the mm core for one of our VMAs; it touches nothing.
    unsafe extern "C" fn may_split(_vma: *mut bindings::vm_area_struct, _addr: c_ulong) -> c_int {
        // CAST: EINVAL is 22.
        -(bindings::EINVAL as c_int)
    }

    /// # Safety
    ///
    /// Called by the mm core with `vmf` describing a fault in a VMA set up by [`install`] for
    /// `T`, the mmap lock held (for reading at least).
    unsafe extern "C" fn fault(vmf: *mut bindings::vm_fault) -> bindings::vm_fault_t {
        // SAFETY: `vmf` is valid for the call; its VMA is ours, alive, and has `VM_MIXEDMAP`
        // (set by `VmaNew::set_mixedmap` before `install`); the mmap lock is held meanwhile.
        let (vma, pgoff) = unsafe {
            let v = &(*vmf).__bindgen_anon_1;
            (VmaMixedMap::from_raw(v.vma), v.pgoff)
        };
        // SAFETY: `vm_private_data` holds the VMA's reference, alive during the call.
        let owner = unsafe { Arc::<T>::borrow((*vma.as_ptr()).vm_private_data) };
        // SAFETY: the VMA is valid during the call.
        let base = unsafe { (*vma.as_ptr()).vm_pgoff };
        let index: usize = pgoff.wrapping_sub(base);
        match owner.fault(index, &VmaPages { vma }) {
            Ok(()) => bindings::vm_fault_reason_VM_FAULT_NOPAGE,
            Err(e) if e == ENOMEM => bindings::vm_fault_reason_VM_FAULT_OOM,
            Err(_) => bindings::vm_fault_reason_VM_FAULT_SIGBUS,
        }
    }
}

/// The VMA operations of owners of type `T`, for the owner's one `static` (whose address tells
/// its VMAs apart: [`owner_at`]). Typed, so that a VMA installed with `T`'s table is only ever
/// read back as `T`'s.
pub(crate) struct Ops<T>(bindings::vm_operations_struct, PhantomData<T>);

// SAFETY: the table holds function pointers only, never written after it is made.
unsafe impl<T> Sync for Ops<T> {}

impl<T: VmaOwner> Ops<T> {
    /// The table for owners of type `T`.
    pub(crate) const fn new() -> Self {
        Self(VmOps::<T>::OPS, PhantomData)
    }
}

/// Ties a VMA being created to `owner`, which then fills it on fault, with `T`'s operations
/// `ops` (its `static`); call it last, when nothing can fail any more, so that a failed `mmap`
/// leaves no reference behind.
pub(crate) fn install<T: VmaOwner>(vma: &VmaNew, owner: Arc<T>, ops: &'static Ops<T>) {
    let _ = vma.set_mixedmap();
    owner.vma_opened();
    let vma = vma.as_ptr();
    // SAFETY: `vma` is being set up by our `mmap` callback, so nothing else uses these fields
    // yet; the operations table is `'static`, and the reference stored is given back by `close`.
    unsafe {
        (*vma).vm_private_data = owner.into_foreign();
        (*vma).vm_ops = &ops.0;
    }
}

/// The owner of the calling process's VMA at `addr`, if that VMA was installed with `ops` (the
/// operations of owners of type `T`), and the file offset `addr` maps (bytes); `None` for any
/// other address (none mapped there, or another mapping), or a task with no address space.
pub(crate) fn owner_at<T: VmaOwner>(addr: usize, ops: &'static Ops<T>) -> Option<(Arc<T>, u64)> {
    let task = kernel::current!();
    let mm = task.mm()?;
    let guard = mm.mmap_read_lock();
    let vma = guard.vma_lookup(addr)?;
    let v = vma.as_ptr();
    // SAFETY: the VMA is valid while the mmap lock is held, and these fields do not change
    // under it.
    let (vm_ops, private, pgoff) = unsafe { ((*v).vm_ops, (*v).vm_private_data, (*v).vm_pgoff) };
    if !core::ptr::eq(vm_ops, &ops.0) {
        return None;
    }
    // SAFETY: a VMA with `T`'s operations holds a reference on its owner in `vm_private_data`
    // (made by `install` or `open`, given back by `close`), which the mmap lock keeps alive
    // during this borrow.
    let owner: Arc<T> = unsafe { Arc::<T>::borrow(private) }.into();
    let into = u64::try_from(addr.checked_sub(vma.start())?).ok()?;
    let offset = u64::try_from(pgoff)
        .ok()?
        .checked_mul(PAGE_SIZE as u64)?
        .checked_add(into)?;
    Some((owner, offset))
}

/// The file offset the VMA maps, in bytes.
pub(crate) fn offset(vma: &VmaRef) -> Option<u64> {
    // SAFETY: `vma` is valid for the borrow, and `vm_pgoff` is stable while it is being set up.
    let pgoff = unsafe { (*vma.as_ptr()).vm_pgoff };
    u64::try_from(pgoff).ok()?.checked_mul(PAGE_SIZE as u64)
}

/// `PROT_READ | PROT_WRITE` and `MAP_SHARED` of the uapi (`asm-generic/mman-common.h`,
/// `linux/mman.h`): the same values on every architecture.
const PROT_RW: c_ulong = 0x1 | 0x2;
const MAP_SHARED: c_ulong = 0x01;

/// Maps `len` bytes of `file` from byte `offset` into the calling process, shared and
/// read-write, where the kernel chooses (as `mmap(NULL, len, PROT_READ | PROT_WRITE,
/// MAP_SHARED, fd, offset)` would, the file's own `mmap` handler included). Returns the
/// address. No lock of the caller's may be held: the handler runs under the mmap lock.
pub(crate) fn map_into_current(file: &File, offset: u64, len: u64) -> Result<usize> {
    let len = c_ulong::try_from(len).map_err(|_| EOVERFLOW)?;
    let offset = c_ulong::try_from(offset).map_err(|_| EOVERFLOW)?;
    // SAFETY: `file` is an open file the caller holds for the call; `vm_mmap` takes the
    // calling process's mmap lock itself and checks every argument.
    let addr = unsafe { bindings::vm_mmap(file.as_ptr(), 0, len, PROT_RW, MAP_SHARED, offset) };
    // An error is returned as a negative errno in the address (`IS_ERR_VALUE`).
    let as_err = addr as isize;
    if (-4095..0).contains(&as_err) {
        // CAST: in -4095..0, so it fits `i32`.
        return Err(Error::from_errno(as_err as i32));
    }
    // `unsigned long` is `usize` in the kernel crate: an address.
    Ok(addr)
}

/// The calling process's address space, held (`mmgrab`: its structure cannot be reused for
/// another process while held); `None` for a kernel thread.
pub(crate) fn current_mm() -> Option<ARef<Mm>> {
    let task = kernel::current!();
    task.mm().map(|mm| ARef::from(&**mm))
}

/// The calling process's address space as an identity (its structure's address; 0 for a
/// kernel thread): equal to another's only while both are the same live address space, or
/// while something holds the first (as a [`super::notifier::RangeWatch`] does).
pub(crate) fn current_mm_id() -> usize {
    let task = kernel::current!();
    task.mm().map_or(0, |m| m.as_raw() as usize)
}

/// Whether `mm` is the calling process's address space.
pub(crate) fn is_current_mm(mm: &Mm) -> bool {
    let task = kernel::current!();
    task.mm()
        .is_some_and(|m| core::ptr::eq(m.as_raw(), mm.as_raw()))
}

/// Unmaps `[addr, addr + len)` from the calling process if it is exactly one VMA of `owner`
/// (made with `ops`); returns whether it did. The check is made under the mmap lock and the
/// unmap takes it again: a thread of the same process that unmaps and maps the range in
/// between makes it unmap that mapping (its own memory, as a racing `munmap` would).
pub(crate) fn unmap_if_owned<T: VmaOwner>(
    addr: usize,
    len: usize,
    ops: &'static Ops<T>,
    owner: &T,
) -> Result<bool> {
    let task = kernel::current!();
    let Some(mm) = task.mm() else {
        return Ok(false);
    };
    let end = addr.checked_add(len).ok_or(EOVERFLOW)?;
    let ours = {
        let guard = mm.mmap_read_lock();
        guard.vma_lookup(addr).is_some_and(|vma| {
            let v = vma.as_ptr();
            // SAFETY: the VMA is valid while the mmap lock is held; these fields do not change
            // under it.
            let (vm_ops, private) = unsafe { ((*v).vm_ops, (*v).vm_private_data) };
            if !core::ptr::eq(vm_ops, &ops.0) {
                return false;
            }
            // SAFETY: a VMA with `T`'s operations holds a reference on its owner in
            // `vm_private_data` (see `owner_at`), alive while the mmap lock is held.
            let theirs = unsafe { Arc::<T>::borrow(private) };
            core::ptr::eq(&*theirs, owner) && vma.start() == addr && vma.end() == end
        })
    };
    if !ours {
        return Ok(false);
    }
    // SAFETY: `vm_munmap` takes the calling process's mmap lock and checks the range.
    let r = unsafe { bindings::vm_munmap(addr as c_ulong, len) };
    if r < 0 {
        return Err(Error::from_errno(r));
    }
    Ok(true)
}

/// Removes the page-table entries of every user mapping of `[offset, offset + len)` of the file
/// (in every process), so that later accesses fault. The VMAs themselves stay until unmapped.
pub(crate) fn zap(file: &File, offset: u64, len: u64) -> Result {
    let begin = i64::try_from(offset).map_err(|_| EOVERFLOW)?;
    let len = i64::try_from(len).map_err(|_| EOVERFLOW)?;
    // SAFETY: `f_mapping` of an open file is valid; `unmap_mapping_range` takes its own locks.
    unsafe { bindings::unmap_mapping_range((*file.as_ptr()).f_mapping, begin, len, 1) };
    Ok(())
}

/// What a range of the calling process's address space is, for pinning its pages long-term
/// (`RUVM_IOCTL_MEM_REGISTER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RangeKind {
    /// Mapped all through, with the access asked, by mappings whose pages may be pinned.
    Pinnable,
    /// Some page of it is in no mapping (or the task has no address space).
    Hole,
    /// A mapping of it cannot be read, or written when writing was asked.
    NoAccess,
    /// A mapping whose pages the kernel does not pin long-term: `VM_IO` or `VM_PFNMAP`, a
    /// file on fs-dax, secretmem (`memfd_secret`).
    Unpinnable,
    /// A mapping made with the operations `ours` (already ruvm memory).
    Ours,
}

/// Whether any bit of `flag` is set in `flags` (a function, as `flag` is 0 on a kernel
/// without the feature: `S_DAX` without `CONFIG_FS_DAX`).
fn any_set(flags: u32, flag: u32) -> bool {
    flags & flag != 0
}

/// What `[addr, addr + len)` of the calling process is (see [`RangeKind`]): its mappings in
/// address order, the first that is not pinnable deciding. Checked under the mmap lock, which
/// is then released: the range may change before its pages are pinned (which checks again).
pub(crate) fn range_kind<T: VmaOwner>(
    addr: usize,
    len: usize,
    write: bool,
    ours: &'static Ops<T>,
) -> RangeKind {
    let Some(end) = addr.checked_add(len) else {
        return RangeKind::Hole;
    };
    let task = kernel::current!();
    let Some(mm) = task.mm() else {
        return RangeKind::Hole;
    };
    let guard = mm.mmap_read_lock();
    let mut at = addr;
    while at < end {
        let Some(vma) = guard.vma_lookup(at) else {
            return RangeKind::Hole;
        };
        let flags = vma.flags();
        let v = vma.as_ptr();
        // SAFETY: the VMA is valid while the mmap lock is held, and these fields do not
        // change under it; a file's inode and superblock live as long as the file, which the
        // VMA holds.
        let (vm_ops, dax, secret) = unsafe {
            let file = (*v).vm_file;
            let (dax, secret) = if file.is_null() {
                (false, false)
            } else {
                let inode = (*file).f_inode;
                (
                    any_set((*inode).i_flags, bindings::S_DAX),
                    (*(*inode).i_sb).s_magic == bindings::SECRETMEM_MAGIC as c_ulong,
                )
            };
            ((*v).vm_ops, dax, secret)
        };
        if core::ptr::eq(vm_ops, &ours.0) {
            return RangeKind::Ours;
        }
        if flags & (vm_flags::IO | vm_flags::PFNMAP) != 0 || dax || secret {
            return RangeKind::Unpinnable;
        }
        let mut need = vm_flags::READ;
        if write {
            need |= vm_flags::WRITE;
        }
        if flags & need != need {
            return RangeKind::NoAccess;
        }
        at = vma.end();
    }
    RangeKind::Pinnable
}
