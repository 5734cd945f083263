// SPDX-License-Identifier: GPL-2.0

//! The fault injector of the sweeps: the kernel's `fail-nth` armed for every allocation
//! (failslab and fail_page_alloc), restored on drop.

use std::fs;

use super::*;

const FAIL_NTH: &str = "/proc/thread-self/fail-nth";

/// Fault injection armed for `fail-nth` on every allocation; restored on drop.
pub(super) struct Injector {
    saved: Vec<(&'static str, String)>,
    /// This thread's `fail-nth`, opened once: opening it again after a call would allocate,
    /// and be failed by a countdown the call did not use up.
    nth: fs::File,
}

impl Injector {
    const KNOBS: [(&'static str, &'static str); 4] = [
        ("/sys/kernel/debug/failslab/ignore-gfp-wait", "N"),
        ("/sys/kernel/debug/fail_page_alloc/ignore-gfp-wait", "N"),
        ("/sys/kernel/debug/fail_page_alloc/ignore-gfp-highmem", "N"),
        ("/sys/kernel/debug/fail_page_alloc/min-order", "0"),
    ];
    /// failslab's cache filter: only caches marked `failslab` fail.
    const CACHE_FILTER: &'static str = "/sys/kernel/debug/failslab/cache-filter";

    /// `Skip` on a kernel without fault injection.
    pub(super) fn new() -> Result<Self, Stop> {
        if fs::metadata(FAIL_NTH).is_err() || fs::metadata(Self::KNOBS[0].0).is_err() {
            return Err(Stop::Skip(
                "no fault injection in this kernel (the debug kernel has it)".into(),
            ));
        }
        let nth = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(FAIL_NTH)
            .ctx("open fail-nth")?;
        let mut me = Self {
            saved: Vec::new(),
            nth,
        };
        let filter = Self::checker_caches_spared().then_some((Self::CACHE_FILTER, "Y"));
        if filter.is_some() {
            println!("# fault injection: kmemleak's own caches spared (failslab's cache filter)");
        }
        for (path, value) in Self::KNOBS.into_iter().chain(filter) {
            let old = fs::read_to_string(path).ctx(path)?;
            me.saved.push((path, old.trim().to_owned()));
            fs::write(path, value).ctx(path)?;
        }
        Ok(me)
    }

    /// Whether the guest booted with every slab cache marked `failslab` but kmemleak's own
    /// (`slab_debug=A;-,kmemleak_object,kmemleak_scan_area`, as make check's sweep guests
    /// do): kmemleak's two caches there and unmarked, every other cache of `/sys/kernel/slab`
    /// (aliases, which are links, aside) marked. kmemleak records each allocation it tracks in
    /// an object of its own, allocated `__GFP_NOWARN` and taken from its reserve pool when that
    /// fails: every such site is absorbed, touches nothing of ruvm's, and was half of a sweep's
    /// sites. Then the cache filter is turned on, and `fail-nth` counts every other cache's
    /// allocations as before. A narrower marking (some caches only) leaves the filter off.
    fn checker_caches_spared() -> bool {
        const SPARED: [&str; 2] = ["kmemleak_object", "kmemleak_scan_area"];
        let Ok(dir) = fs::read_dir("/sys/kernel/slab") else {
            return false;
        };
        let mut spared = 0;
        for e in dir.flatten() {
            if e.file_type().map_or(true, |t| t.is_symlink()) {
                continue;
            }
            let Ok(v) = fs::read_to_string(e.path().join("failslab")) else {
                return false;
            };
            let name = e.file_name();
            let spare = SPARED.iter().any(|s| name == *s);
            // A spared cache marked, or another unmarked.
            if spare == (v.trim() == "1") {
                return false;
            }
            spared += usize::from(spare);
        }
        spared == SPARED.len() && fs::metadata(Self::CACHE_FILTER).is_ok()
    }

    /// Runs `f` with the `n`th failable allocation of this thread failing. Returns its result
    /// and whether the `n`th allocation was reached.
    pub(super) fn with_nth<T>(&self, n: u32, f: impl FnOnce() -> T) -> Result<(T, bool), Stop> {
        use std::os::unix::fs::FileExt;
        self.nth
            .write_at(n.to_string().as_bytes(), 0)
            .ctx("arm fail-nth")?;
        let r = f();
        let mut buf = [0u8; 16];
        let got = self.nth.read_at(&mut buf, 0).ctx("read fail-nth")?;
        self.nth.write_at(b"0", 0).ctx("disarm fail-nth")?;
        let left: u32 = std::str::from_utf8(&buf[..got])
            .map_err(|e| Stop::Fail(format!("fail-nth: {e}")))?
            .trim()
            .parse()
            .map_err(|e| Stop::Fail(format!("fail-nth: {e}")))?;
        Ok((r, left == 0))
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        use std::os::unix::fs::FileExt;
        let _ = self.nth.write_at(b"0", 0);
        for (path, value) in &self.saved {
            let _ = fs::write(path, value);
        }
    }
}
