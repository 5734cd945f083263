// SPDX-License-Identifier: GPL-2.0

//! Process steps: user mappings and their faults, forked children, files opened, passed and
//! closed, races between threads.

use super::*;

/// mmap of a mem (or of junk), then reads and writes through `/proc/self/mem`, munmap, mremap.
pub(super) fn user_mapping(w: &World, file: &Arc<Ruvm>, rng: &mut Rng) {
    let d = &**file;
    match rng.below(4) {
        0 | 1 => {
            let h = w.handle(rng);
            let Ok(q) = d.mem_query(h) else { return };
            let len = if rng.one_in(8) {
                4096
            } else {
                q.physical_size as usize
            };
            let offset = if rng.one_in(8) {
                q.mmap_offset + 4096
            } else {
                q.mmap_offset
            };
            let prot = if rng.one_in(10) {
                ProtFlags::PROT_READ | ProtFlags::PROT_EXEC
            } else {
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE
            };
            let flags = if rng.one_in(10) {
                MapFlags::MAP_PRIVATE
            } else {
                MapFlags::MAP_SHARED
            };
            let r = libruvm::UserMap::new(d, offset, len, prot, flags);
            if let Some(m) = w.check("mmap", r, &[ENXIO, EINVAL, EPERM, EACCES, EOPNOTSUPP]) {
                let (addr, len) = (m.as_ptr() as usize, m.len());
                std::mem::forget(m);
                // At another offset it may be another mem (ranges are packed): unknown, 0.
                let of = if offset == q.mmap_offset { h } else { 0 };
                // If the mem was freed meanwhile (the mmap raced the free), it must fault.
                w.touch("new mapping", addr, len, of, offset, Some(d), rng);
                if let Ok(mut maps) = w.maps.lock() {
                    maps.push((addr, len, of, offset, file.clone()));
                }
            }
        }
        2 => {
            // Touch a mapping: a freed mem's is zapped (the read fails), a live one reads.
            let Some((addr, len, h, off, f)) = w.maps.lock().ok().and_then(|m| {
                (!m.is_empty()).then(|| m[rng.below(m.len() as u64) as usize].clone())
            }) else {
                return;
            };
            w.touch("touch", addr, len, h, off, Some(&f), rng);
        }
        _ => {
            let Some((addr, len, h, off, f)) = w.maps.lock().ok().and_then(|mut m| {
                (!m.is_empty()).then(|| {
                    let i = rng.below(m.len() as u64) as usize;
                    m.swap_remove(i)
                })
            }) else {
                return;
            };
            if rng.one_in(2) {
                unmap(addr, len);
                return;
            }
            // Move it (growing is refused: VM_DONTEXPAND); it stays ours at the new address.
            let Some(p) = std::ptr::NonNull::new(addr as *mut std::ffi::c_void) else {
                return;
            };
            // SAFETY: a mapping this worker made and took out of its list; no reference into it.
            let r = unsafe { mremap(p, len, len, MRemapFlags::MREMAP_MAYMOVE, None) };
            let at = match r {
                Ok(n) => n.as_ptr() as usize,
                Err(_) => addr,
            };
            if let Ok(mut maps) = w.maps.lock() {
                maps.push((at, len, h, off, f));
            }
        }
    }
}

/// A child process that frees or queries a handle on the inherited file and exits at once
/// (raw syscalls only: other threads may hold locks the child cannot take).
pub(super) fn forked_child(w: &World, d: &Ruvm, rng: &mut Rng) {
    let mut a = uapi::ruvm_mem_handle {
        handle: w.handle(rng),
        ..Default::default()
    };
    let nr = if rng.one_in(2) {
        cmd::MEM_FREE.nr
    } else {
        cmd::MEM_MAP_CPU_KERNEL.nr
    };
    let fd = d.as_fd().as_raw_fd();
    // SAFETY: the child makes one ioctl with a structure on this stack and calls _exit; it
    // touches nothing else of this process.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => unsafe {
            nix::libc::ioctl(fd, nix::libc::c_ulong::from(nr), std::ptr::from_mut(&mut a));
            nix::libc::_exit(0);
        },
        Ok(ForkResult::Parent { child }) => {
            let _ = nix::sys::wait::waitpid(child, None);
        }
        Err(e) => w.check("fork", Err::<(), _>(e), &[EAGAIN]).unwrap_or(()),
    }
}

/// Open, close, dup, or take a file again from this process with `pidfd_getfd` (no sockets:
/// it needs no `CONFIG_UNIX` for `SCM_RIGHTS`).
pub(super) fn files(w: &World, rng: &mut Rng) {
    let Ok(mut files) = w.files.lock() else {
        return;
    };
    match rng.below(4) {
        0 if files.len() < 4 => {
            if let Ok(f) = Ruvm::open() {
                files.push(Arc::new(f));
            }
        }
        1 if files.len() > 1 => {
            let i = rng.below(files.len() as u64) as usize;
            let f = files[i].clone();
            drop(files);
            // Now and then with its streams busy: the close cancels their work.
            if rng.one_in(2) {
                streams::load_file(w, &f, rng, None);
            }
            if let Ok(mut files) = w.files.lock() {
                files.retain(|x| !Arc::ptr_eq(x, &f));
            }
        }
        2 if !files.is_empty() => {
            let f = files[rng.below(files.len() as u64) as usize].clone();
            drop(files);
            if let Some(passed) = pass_fd(&f) {
                if let Ok(mut files) = w.files.lock() {
                    files.push(Arc::new(passed));
                }
            }
        }
        _ => {}
    }
}

/// The same open file, as a new descriptor taken from this very process with `pidfd_open` and
/// `pidfd_getfd` (what `SCM_RIGHTS` to itself gave, without a socket).
pub(super) fn pass_fd(f: &Ruvm) -> Option<Ruvm> {
    let me = fences::pidfd_open(nix::unistd::getpid()).ok()?;
    let fd = fences::pidfd_getfd(&me, f.as_fd().as_raw_fd()).ok()?;
    Ruvm::from_owned_fd(fd).ok()
}

/// Two calls released at once from two threads, where ordering bugs live: `mmap` of a mem
/// against its `MEM_FREE` (no mapping may read after the free returned), and a simulated GPU's
/// table remapped against a read of its addresses (the engine must still reach the mem).
pub(super) fn race(w: &World, d: &Ruvm, rng: &mut Rng) {
    let barrier = std::sync::Barrier::new(2);
    // The mems made here are listed as this process's while they live (see `offset_in_use`).
    let listed = |h: u64, add: bool| {
        if let Ok(mut hs) = w.handles.lock() {
            if add {
                hs.push(h);
            } else {
                hs.retain(|x| *x != h);
            }
        }
    };
    if rng.one_in(2) || w.sims.is_empty() {
        let Ok(a) = d.mem_alloc(64 << 10, 0, 0) else {
            return;
        };
        listed(a.handle, true);
        let mapped = std::thread::scope(|s| {
            let t = s.spawn(|| {
                barrier.wait();
                libruvm::UserMap::new(
                    d,
                    a.mmap_offset,
                    64 << 10,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED,
                )
                .map(|m| {
                    let r = (m.as_ptr() as usize, m.len());
                    std::mem::forget(m);
                    r
                })
            });
            barrier.wait();
            let freed = d.mem_free(a.handle);
            (t.join(), freed)
        });
        listed(a.handle, false);
        if let (Ok(Ok((addr, len))), Ok(())) = mapped {
            if let Ok(mut f) = w.freed.lock() {
                f.insert(a.handle);
            }
            w.touch("race", addr, len, a.handle, a.mmap_offset, Some(d), rng);
            unmap(addr, len);
        }
        return;
    }
    let g = rng.pick(&w.sims);
    let (Ok(src), Ok(dst)) = (d.mem_alloc(64 << 10, 0, 0), d.mem_alloc(64 << 10, 0, 0)) else {
        return;
    };
    listed(src.handle, true);
    listed(dst.handle, true);
    if d.mem_gpu(true, src.handle, g).is_ok() && d.mem_gpu(true, dst.handle, g).is_ok() {
        std::thread::scope(|s| {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..4 {
                    let _ = d.dma_addrs(src.handle, g, 0, 16);
                }
            });
            barrier.wait();
            for _ in 0..4 {
                let _ = d.mem_gpu(false, src.handle, g);
                let _ = d.mem_gpu(true, src.handle, g);
            }
        });
        let r = d.ce_copy(g, dst.handle, 0, src.handle, 0, 64 << 10);
        // Other threads may free or unmap these mems meanwhile; a DMA fault (EFAULT) would be a
        // table the engine lost.
        w.check(
            "CE_COPY after remaps racing address reads",
            r,
            &[ENODEV, ENOENT, ENXIO],
        );
    }
    let _ = d.mem_free(src.handle);
    let _ = d.mem_free(dst.handle);
    listed(src.handle, false);
    listed(dst.handle, false);
}
