// SPDX-License-Identifier: GPL-2.0

//! A shrinker memory cgroups reach: the kernel's memcg-aware `list_lru` of small slab objects
//! ("anchors"), one per owner of reclaimable memory, each on the list of the memory cgroup its
//! owner was made in while the owner has something to give back.
//!
//! C headers: [`include/linux/list_lru.h`](srctree/include/linux/list_lru.h),
//! [`include/linux/shrinker.h`](srctree/include/linux/shrinker.h),
//! [`include/linux/slab.h`](srctree/include/linux/slab.h)
//!
//! A cgroup's own reclaim (its `memory.max` reached) calls only the shrinkers whose bit is set
//! for it, and a module can set that bit only through a `list_lru` whose per-cgroup lists exist
//! (`set_shrinker_bit` and `memcg_list_lru_alloc` are not exported): an anchor allocated with
//! `kmem_cache_alloc_lru` from an accounted cache makes its cgroup's list, and `list_lru_add_obj`
//! puts it there and sets the bit. An anchor carries its owner's key and the pages the owner
//! could give back now (which the owner keeps up to date). The count callback walks the
//! cgroup's list adding up the pages (and takes off the list an anchor with none, so that the
//! next to have some sets the bit again); the scan callback notes up to [`SCAN_KEYS`] keys under
//! the list's lock, and the policy code gives back from those owners with the lock released.

use core::ptr::NonNull;

use kernel::{
    bindings, ffi,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc,
    },
    types::Opaque,
};

/// `SHRINKER_NUMA_AWARE` and `SHRINKER_MEMCG_AWARE` (`BIT()` macros bindgen does not expand).
const SHRINKER_NUMA_AWARE: u32 = 1 << 2;
const SHRINKER_MEMCG_AWARE: u32 = 1 << 3;

/// The most owners one scan gives back from.
pub(crate) const SCAN_KEYS: usize = 16;

/// What the shrinker asks of the policy code, in reclaim (it must only try its locks).
pub(crate) trait LruShrink {
    /// Gives back up to `pages` pages from the owners of `keys`: how many went.
    fn shrink(keys: &[u64], pages: u64) -> u64;
}

/// One anchor: a slab object on the list.
#[repr(C)]
struct AnchorObj {
    link: bindings::list_head,
    /// The owner's key.
    key: u64,
    /// The pages the owner could give back now.
    pages: Atomic<u64>,
}

/// The shrinker, its list and the anchors' slab cache.
///
/// # Invariants
///
/// `shrinker` is registered with the callbacks of the `S` it was made for, its `private_data`
/// this object (which never moves: it lives in an `Arc`); `lru` was initialised memcg-aware
/// for it; `cache` makes objects of [`AnchorObj`]'s size, accounted. Every anchor holds a
/// reference to this object, so none outlives the list or the cache.
pub(crate) struct LruShrinker {
    shrinker: NonNull<bindings::shrinker>,
    lru: KBox<Opaque<bindings::list_lru>>,
    cache: NonNull<bindings::kmem_cache>,
}

// SAFETY: the kernel uses all three from any thread; this object only frees them.
unsafe impl Send for LruShrinker {}
// SAFETY: the list and the cache are the kernel's, with their own locks.
unsafe impl Sync for LruShrinker {}

/// An owner's place on the list, freed (and off the list) on drop.
///
/// # Invariants
///
/// `obj` was allocated from `shrinker.cache` for `shrinker.lru` and initialised; it is on the
/// list only while this object lives (the drop takes it off, under the list's lock, before
/// freeing it), so a walk of the list only meets live anchors.
pub(crate) struct Anchor {
    obj: NonNull<AnchorObj>,
    shrinker: Arc<LruShrinker>,
}

// SAFETY: the object's link is touched under the list's lock only, its fields are atomic or
// never written after it is made.
unsafe impl Send for Anchor {}
// SAFETY: as above.
unsafe impl Sync for Anchor {}

/// The anchor whose link is `item`.
///
/// # Safety
///
/// `item` is the link of a live [`AnchorObj`].
unsafe fn anchor_of(item: *mut bindings::list_head) -> *mut AnchorObj {
    // `link` is the first field of a `#[repr(C)]` structure.
    item.cast()
}

/// What the count's walk adds up.
struct Tally {
    pages: u64,
    /// Anchors met with pages.
    seen: u64,
}

/// The most anchors one count walks (under the list's spinlock); beyond it the total is
/// estimated from those walked.
const COUNT_WALK: ffi::c_ulong = 1024;

/// Walk callback of the count: adds up the anchors' pages into `*arg` (a [`Tally`]), and takes
/// an anchor with none off the list.
///
/// # Safety
///
/// Called by `list_lru_walk_one` under the list's lock, for an item of an [`Anchor`]'s list,
/// with the `arg` [`count`] passed.
unsafe extern "C" fn count_one(
    item: *mut bindings::list_head,
    list: *mut bindings::list_lru_one,
    arg: *mut ffi::c_void,
) -> bindings::lru_status {
    // SAFETY: an item on the list is a live anchor's link (the invariant of `Anchor`).
    let pages = unsafe { (*anchor_of(item)).pages.load(Relaxed) };
    if pages == 0 {
        // SAFETY: `item` is on `list`, whose lock is held.
        unsafe { bindings::list_lru_isolate(list, item) };
        return bindings::lru_status::LRU_REMOVED;
    }
    // SAFETY: `arg` is the `Tally` `count` passed.
    let tally = unsafe { &mut *arg.cast::<Tally>() };
    tally.pages = tally.pages.saturating_add(pages);
    tally.seen += 1;
    // Moved to the tail: the next count walks others first.
    bindings::lru_status::LRU_ROTATE
}

/// Keys noted by a scan.
struct Keys {
    keys: [u64; SCAN_KEYS],
    n: usize,
}

/// Walk callback of the scan: notes the owner's key in `*arg` (a [`Keys`]) and moves it to the
/// list's tail, so that the next scan starts with others.
///
/// # Safety
///
/// As [`count_one`], with the `arg` [`scan`] passed.
unsafe extern "C" fn scan_one(
    item: *mut bindings::list_head,
    _list: *mut bindings::list_lru_one,
    arg: *mut ffi::c_void,
) -> bindings::lru_status {
    // SAFETY: as in `count_one`.
    let key = unsafe { (*anchor_of(item)).key };
    // SAFETY: `arg` is the `Keys` `scan` passed.
    let keys = unsafe { &mut *arg.cast::<Keys>() };
    if let Some(k) = keys.keys.get_mut(keys.n) {
        *k = key;
        keys.n += 1;
        return bindings::lru_status::LRU_ROTATE;
    }
    // Not `LRU_STOP`, which 7.2 expects returned with the list's lock dropped.
    bindings::lru_status::LRU_SKIP
}

/// The list of this shrinker, for a callback.
///
/// # Safety
///
/// `shrinker` is registered by [`LruShrinker::new`], so its `private_data` is a live
/// [`LruShrinker`].
unsafe fn lru_of(shrinker: *mut bindings::shrinker) -> *mut bindings::list_lru {
    // SAFETY: see above.
    unsafe { (*(*shrinker).private_data.cast::<LruShrinker>()).lru.get() }
}

/// The kernel's `count_objects` callback: the pages the owners on `sc`'s cgroup's list (of
/// `sc`'s node) could give back.
///
/// # Safety
///
/// Called by reclaim for a shrinker registered by [`LruShrinker::new`], with a valid `sc`.
unsafe extern "C" fn count(
    shrinker: *mut bindings::shrinker,
    sc: *mut bindings::shrink_control,
) -> ffi::c_ulong {
    let mut tally = Tally { pages: 0, seen: 0 };
    let mut walk = COUNT_WALK;
    // SAFETY: the list is this shrinker's; `sc` is valid for the call; the callback gets the
    // `Tally` it expects.
    let listed = unsafe {
        let lru = lru_of(shrinker);
        bindings::list_lru_walk_one(
            lru,
            (*sc).nid,
            (*sc).memcg,
            Some(count_one),
            core::ptr::from_mut(&mut tally).cast(),
            &mut walk,
        );
        bindings::list_lru_count_one(lru, (*sc).nid, (*sc).memcg)
    };
    // A list longer than one walk: the rest estimated at the walked anchors' mean.
    let listed = u64::try_from(listed).unwrap_or(u64::MAX);
    let pages = match tally.seen {
        0 => 0,
        n if listed > n => tally.pages / n * listed,
        _ => tally.pages,
    };
    match pages {
        // `SHRINK_EMPTY` (`~0UL - 1`): nothing here (the cgroup's bit may be cleared).
        0 => !0 - 1,
        n => ffi::c_ulong::try_from(n).unwrap_or(ffi::c_ulong::MAX - 2),
    }
}

/// The kernel's `scan_objects` callback: gives back up to `sc.nr_to_scan` pages from the owners
/// on `sc`'s cgroup's list.
///
/// # Safety
///
/// As [`count`].
unsafe extern "C" fn scan<S: LruShrink>(
    shrinker: *mut bindings::shrinker,
    sc: *mut bindings::shrink_control,
) -> ffi::c_ulong {
    let mut keys = Keys {
        keys: [0; SCAN_KEYS],
        n: 0,
    };
    let mut walk = SCAN_KEYS as ffi::c_ulong;
    // SAFETY: as in `count`; the callback gets the `Keys` it expects.
    let want = unsafe {
        bindings::list_lru_walk_one(
            lru_of(shrinker),
            (*sc).nid,
            (*sc).memcg,
            Some(scan_one),
            core::ptr::from_mut(&mut keys).cast(),
            &mut walk,
        );
        (*sc).nr_to_scan
    };
    let noted = keys.keys.get(..keys.n).unwrap_or(&[]);
    super::shrinker::scanned(S::shrink(noted, u64::try_from(want).unwrap_or(u64::MAX)))
}

impl LruShrinker {
    /// Registers a memcg- and NUMA-aware shrinker named `name` with `S`'s callbacks, its list,
    /// and the anchors' slab cache (also named `name`).
    pub(crate) fn new<S: LruShrink>(name: &'static CStr) -> Result<Arc<Self>> {
        // The name is a format: one with a conversion would read an argument that is not there.
        if name.to_bytes().contains(&b'%') {
            return Err(EINVAL);
        }
        let size = u32::try_from(core::mem::size_of::<AnchorObj>())?;
        let mut args = bindings::kmem_cache_args::default();
        // SAFETY: `name` is a NUL-terminated string that lives as long as the module, as a
        // cache's name must; `args` is a valid, zeroed (all unused) argument structure.
        let cache = unsafe {
            bindings::__kmem_cache_create_args(
                name.as_char_ptr(),
                size,
                &mut args,
                (1 as bindings::slab_flags_t) << bindings::_slab_flag_bits__SLAB_ACCOUNT,
            )
        };
        let cache = NonNull::new(cache).ok_or(ENOMEM)?;
        let flags = SHRINKER_MEMCG_AWARE | SHRINKER_NUMA_AWARE;
        // SAFETY: `name` has no conversion (checked above), so no argument follows.
        let shrinker = unsafe { bindings::shrinker_alloc(flags, name.as_char_ptr()) };
        let Some(shrinker) = NonNull::new(shrinker) else {
            // SAFETY: made above, no object allocated from it.
            unsafe { bindings::kmem_cache_destroy(cache.as_ptr()) };
            return Err(ENOMEM);
        };
        // Zeroed, not merely uninitialised: `__list_lru_init` reads its lockdep `key` (set by
        // `list_lru_init_memcg_key` only), and a stale one there is "not registered" to lockdep
        // (seen on a reload of the module on the debug kernel).
        let lru = match KBox::new(Opaque::<bindings::list_lru>::zeroed(), GFP_KERNEL) {
            Ok(l) => l,
            Err(e) => {
                // SAFETY: allocated above and not registered; made above, nothing in it.
                unsafe {
                    bindings::shrinker_free(shrinker.as_ptr());
                    bindings::kmem_cache_destroy(cache.as_ptr());
                }
                return Err(e.into());
            }
        };
        // SAFETY: `lru` is zeroed memory for a list not initialised yet (no lockdep key);
        // `shrinker` is allocated (its id assigned) and not registered, as
        // `list_lru_init_memcg` needs.
        let r = unsafe { bindings::__list_lru_init(lru.get(), true, shrinker.as_ptr()) };
        if r != 0 {
            // SAFETY: as above.
            unsafe {
                bindings::shrinker_free(shrinker.as_ptr());
                bindings::kmem_cache_destroy(cache.as_ptr());
            }
            return Err(Error::from_errno(r));
        }
        let me = match Arc::new(
            Self {
                shrinker,
                lru,
                cache,
            },
            GFP_KERNEL,
        ) {
            Ok(me) => me,
            Err(e) => {
                // The object was dropped: its `Drop` freed the shrinker (not registered,
                // which `shrinker_free` allows), the list and the cache.
                return Err(e.into());
            }
        };
        // SAFETY: the shrinker was just allocated and is not registered: these fields are its
        // owner's to set before `shrinker_register`. `private_data` is the object in the `Arc`,
        // which outlives the registration (its drop unregisters first).
        unsafe {
            let p = shrinker.as_ptr();
            (*p).count_objects = Some(count);
            (*p).scan_objects = Some(scan::<S>);
            (*p).seeks = 2; // DEFAULT_SEEKS
            (*p).private_data = core::ptr::from_ref::<Self>(&*me).cast_mut().cast();
            bindings::shrinker_register(p);
        }
        // INVARIANT: registered with `S`'s callbacks, its list and cache set up above.
        Ok(me)
    }
}

impl Drop for LruShrinker {
    fn drop(&mut self) {
        // SAFETY: by the type invariant: `shrinker_free` unregisters the shrinker (or frees an
        // unregistered one) and waits for callbacks in flight; then no anchor is left (each
        // held a reference to this object), so the list is empty and the cache has no object.
        unsafe {
            bindings::shrinker_free(self.shrinker.as_ptr());
            bindings::list_lru_destroy(self.lru.get());
            bindings::kmem_cache_destroy(self.cache.as_ptr());
        }
    }
}

impl Anchor {
    /// A new anchor for the owner of `key`, charged (with its cgroup's list) to the calling
    /// task's memory cgroup; not on the list until it has pages ([`Anchor::set_pages`]).
    pub(crate) fn new(shrinker: &Arc<LruShrinker>, key: u64) -> Result<Self> {
        // SAFETY: the cache and the list are live (the invariant of `LruShrinker`).
        let p = unsafe {
            bindings::kmem_cache_alloc_lru_noprof(
                shrinker.cache.as_ptr(),
                shrinker.lru.get(),
                bindings::GFP_KERNEL_ACCOUNT,
            )
        };
        let obj = NonNull::new(p.cast::<AnchorObj>()).ok_or(ENOMEM)?;
        // SAFETY: a fresh object of `AnchorObj`'s size and alignment, ours alone; an empty list
        // head points at itself (`INIT_LIST_HEAD`, an inline).
        unsafe {
            let o = obj.as_ptr();
            let link = &raw mut (*o).link;
            (*link).next = link;
            (*link).prev = link;
            (&raw mut (*o).key).write(key);
            (&raw mut (*o).pages).write(Atomic::new(0));
        }
        // INVARIANT: allocated for the list and initialised; not on the list.
        Ok(Self {
            obj,
            shrinker: shrinker.clone(),
        })
    }

    /// Notes that the owner could give back `pages` pages now: the anchor goes on its cgroup's
    /// list when they become more than none (setting the cgroup's shrinker bit if the list was
    /// empty), and off it when they become none. The owner serialises its calls.
    pub(crate) fn set_pages(&self, pages: u64) {
        // SAFETY: a live object (the type invariant).
        let old = unsafe { (*self.obj.as_ptr()).pages.xchg(pages, Relaxed) };
        if (old == 0) != (pages == 0) {
            self.listed(pages != 0);
        }
    }

    /// Puts the anchor on its cgroup's list, or takes it off; either is a no-op if it is
    /// already so. The pages are stored before, so a walk that meets the anchor reads them.
    fn listed(&self, on: bool) {
        let lru = self.shrinker.lru.get();
        // SAFETY: the anchor is an accounted object of the list's cache, its link initialised
        // (the type invariant); the list's lock serialises this with the walks.
        unsafe {
            let link = &raw mut (*self.obj.as_ptr()).link;
            if on {
                bindings::list_lru_add_obj(lru, link);
            } else {
                bindings::list_lru_del_obj(lru, link);
            }
        }
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        // INVARIANT: off the list before it is freed.
        self.listed(false);
        // SAFETY: off the list (no walk can reach it now); allocated from this cache.
        unsafe {
            bindings::kmem_cache_free(self.shrinker.cache.as_ptr(), self.obj.as_ptr().cast())
        };
    }
}
