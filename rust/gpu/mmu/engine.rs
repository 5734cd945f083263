// SPDX-License-Identifier: GPL-2.0

//! The engine's side of a simulated GPU's MMU: a VA translated through the tables in memory
//! (with the TLB), copies through VAs a piece at a time with the MMU's lock held across each
//! piece's bytes, the walk report of one VA, and the test write of a leaf entry. The tables
//! themselves and the mappings are the parent's ([`super`]).

use super::*;

impl Mmu {
    /// Translates `va` of space `space` for `access`, through the TLB, under the MMU's lock
    /// (`st`): the DMA address the engine reaches it at and the bytes left in its page; a
    /// logged fault (`EFAULT`) otherwise. The address is good only while `st` is held.
    fn translate(
        &self,
        st: &mut MmuState,
        space: u64,
        va: u64,
        access: Access,
    ) -> Result<(u64, u64)> {
        let tag = va >> 12;
        // CAST: the remainder is below `TLB_ENTRIES`.
        let slot = (tag % TLB_ENTRIES as u64) as usize;
        if st.dead {
            return Err(ENODEV);
        }
        let cached = st
            .tlb
            .get(slot)
            .copied()
            .flatten()
            .filter(|e| e.tag == tag && e.space == space);
        let (pte, page_size) = match cached {
            Some(e) => (e.pte, e.page_size),
            None => {
                let root = Self::root_of(st, space)
                    .ok_or_else(|| self.fault(va, Fault::NoPde(Level::Pde3).reason()))?;
                let mut r = |ap, addr| self.read_word(ap, addr);
                let t = fmt::walk(&mut r, &root, va, Access::Read)
                    .map_err(|f| self.fault(va, f.reason()))?;
                if let Some(e) = st.tlb.get_mut(slot) {
                    *e = Some(TlbEntry {
                        space,
                        tag,
                        pte: t.pte,
                        page_size: t.page_size,
                    });
                }
                (t.pte, t.page_size)
            }
        };
        if access == Access::Write && pte.read_only {
            return Err(self.fault(va, Fault::ReadOnly.reason()));
        }
        let inside = va & (page_size - 1);
        let addr = pte.addr.checked_add(inside).ok_or(EFAULT)?;
        let dma = self
            .engine_addr(pte.aperture, addr)
            .ok_or_else(|| self.fault(va, "page not backed"))?;
        Ok((dma, page_size - inside))
    }

    /// The engine copies `len` bytes from GPU VA `src` to `dst` of VA space `space`, translating
    /// both as it goes; `EFAULT` (logged) at the first address that does not translate. A
    /// pending signal stops it between pieces.
    pub(crate) fn copy(&self, space: u64, dst: u64, src: u64, len: u64) -> Result {
        check_copy(dst, src, len)?;
        let mut done = 0;
        while done < len {
            if kernel::current!().signal_pending() {
                return Err(ERESTARTSYS);
            }
            done += self.copy_piece(space, dst, src, len, done)?;
        }
        Ok(())
    }

    /// One piece of a copy [`check_copy`] accepted, from byte `done` on: returns its length.
    /// It is translated and moved under the MMU's lock, so an unmap waits for it (see
    /// "Locking"). `ENODEV` once the GPU is going.
    pub(crate) fn copy_piece(
        &self,
        space: u64,
        dst: u64,
        src: u64,
        len: u64,
        done: u64,
    ) -> Result<u64> {
        if done >= len {
            return Err(EINVAL);
        }
        // The GPU is going: stop at this piece (its removal waits for the copy).
        if self.tracker.is_closed() {
            return Err(ENODEV);
        }
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let (s, s_left) = self.translate(st, space, src + done, Access::Read)?;
        let (d, d_left) = self.translate(st, space, dst + done, Access::Write)?;
        let n = (len - done).min(s_left).min(d_left).min(MAX_PIECE as u64);
        // CAST: at most `MAX_PIECE`, a `usize`.
        self.sim.copy(self.id, d, s, n as usize)?;
        drop(guard);
        Ok(n)
    }

    /// Walks `va` of space `space` as the engine would (without the TLB), recording every word
    /// read.
    pub(crate) fn walk(&self, space: u64, va: u64) -> WalkReport {
        let st = self.state.lock();
        self.walk_in(&st, space, va)
    }

    /// [`Mmu::walk`] with the state locked by the caller.
    fn walk_in(&self, st: &MmuState, space: u64, va: u64) -> WalkReport {
        let mut reads = [(Aperture::SysCoherent, 0, 0); WALK_MAX];
        let mut count = 0;
        let result = match Self::root_of(st, space) {
            None if va >= fmt::VA_END => Err(Fault::VaRange),
            None => Err(Fault::NoPde(Level::Pde3)),
            Some(root) => {
                let mut r = |ap, addr| {
                    let v = self.read_word(ap, addr);
                    if let Some(slot) = reads.get_mut(count) {
                        *slot = (ap, addr, v.unwrap_or(0));
                        count += 1;
                    }
                    v
                };
                fmt::walk(&mut r, &root, va, Access::Read)
            }
        };
        WalkReport {
            reads,
            count,
            result,
        }
    }

    /// Overwrites the leaf entry for `va` of space `space` (its PTE, or the PDE0 half of a 2 MiB page; for an
    /// address that does not translate, the PTE or PDE0 slot its walk ended at) with `value`
    /// and invalidates the TLB; returns the old entry. `ENXIO` if the walk did not reach a
    /// leaf slot (a directory above it is missing).
    pub(crate) fn write_leaf(&self, space: u64, va: u64, value: u64) -> Result<u64> {
        // Locked from the walk to the write: the table found cannot be freed in between.
        let mut st = self.state.lock();
        if st.dead {
            return Err(ENODEV);
        }
        let w = self.walk_in(&st, space, va);
        // PDE3, PDE2, PDE1, then the PDE0 half that holds a 2 MiB page.
        const PDE0_LOW: usize = 3;
        let leaf = match w.result {
            Ok(t) if t.page_size == Level::Pde0.span() => PDE0_LOW,
            Ok(_) | Err(Fault::NoPte(_)) => w.count.checked_sub(1).ok_or(ENXIO)?,
            Err(Fault::NoPde(Level::Pde0)) => PDE0_LOW,
            Err(_) => return Err(ENXIO),
        };
        let (ap, addr, old) = w.reads.get(leaf).copied().ok_or(ENXIO)?;
        let at = self.engine_addr(ap, addr).ok_or(ENXIO)?;
        self.sim.write_word(at, value)?;
        st.tlb = [None; TLB_ENTRIES];
        Ok(old)
    }
}
