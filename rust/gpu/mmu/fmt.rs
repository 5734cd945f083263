// SPDX-License-Identifier: GPL-2.0

//! NVIDIA's GPU page-table format, MMU version 2 (Pascal and later): entries encoded and
//! decoded, and the walk a GPU's MMU does through them.
//!
//! This file depends on `core` only: the module's simulated MMU uses it, and the host tests
//! compile the very same file (`tools/ruvmctl/tests/mmu_fmt.rs`) and check every field, every
//! level and every page size. The layout is the public one of NVIDIA's `dev_mmu.h` for gp100
//! (`NV_MMU_VER2_*`), written here from its field positions.
//!
//! # The tree
//!
//! A 49-bit virtual address is split, high bits first, into:
//!
//! | level    | VA bits | entries | entry bytes | what an entry holds                          |
//! |----------|---------|---------|-------------|----------------------------------------------|
//! | PDE3     | 48..47  | 4       | 8           | a PDE: the PDE2 table                        |
//! | PDE2     | 46..38  | 512     | 8           | a PDE: the PDE1 table                        |
//! | PDE1     | 37..29  | 512     | 8           | a PDE: the PDE0 table                        |
//! | PDE0     | 28..21  | 256     | 16          | a dual PDE (a 64K and a 4K table), or a 2M PTE |
//! | PTE 64K  | 20..16  | 32      | 8           | a PTE for a 64 KiB page                      |
//! | PTE 4K   | 20..12  | 512     | 8           | a PTE for a 4 KiB page                       |
//!
//! Bit 0 of every entry tells a PTE (1: valid) from a PDE (0). A PDE0 entry is 16 bytes: its
//! first half points at the big-page (64 KiB) table, its second at the small-page (4 KiB) table;
//! either or both may be present, and where both are, the big page wins (the small table is for
//! the part of the 2 MiB range not mapped by big pages). A 2 MiB page is a PTE in the first half
//! of a PDE0 entry (the second half zero).
//!
//! # Entries
//!
//! - PTE (8 bytes): bit 0 valid, bits 2..1 aperture (0 video, 1 peer, 2 system coherent,
//!   3 system non-coherent), bit 3 volatile (not cached by the GPU), bit 4 encrypted, bit 5
//!   privileged, bit 6 read-only, bit 7 atomics disabled, the address shifted right by 12 from
//!   bit 8 (bits 53..8 for system memory, 32..8 for video memory: 37-bit vidmem addresses; bits
//!   35..33 are then the peer id), bits 63..56 the kind (0: pitch).
//! - PDE (8 bytes): bit 0 zero, bits 2..1 aperture (0 invalid, 1 video, 2 system coherent,
//!   3 system non-coherent), bit 3 volatile, the table's address shifted right by 12 from bit 8
//!   (53..8 system, 32..8 video).
//! - Dual PDE (16 bytes): the big half as a PDE but for its address, shifted right by 8 from bit
//!   4 (a 64K table is 256 bytes, 256-byte aligned): bits 53..4 system, 32..4 video; the small
//!   half a PDE in the second 8 bytes.

/// The width of a GPU virtual address.
pub(crate) const VA_BITS: u32 = 49;

/// One past the highest GPU virtual address.
pub(crate) const VA_END: u64 = 1 << VA_BITS;

/// The page sizes of the format: 4 KiB, 64 KiB, 2 MiB.
pub(crate) const PAGE_SIZES: [u64; 3] = [4 << 10, 64 << 10, 2 << 20];

/// The levels of the tree, root first; the last three are the three kinds of leaf table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    /// The root: 4 entries.
    Pde3,
    /// 512 entries.
    Pde2,
    /// 512 entries.
    Pde1,
    /// 256 dual entries (or 2 MiB PTEs).
    Pde0,
    /// 32 PTEs for 64 KiB pages.
    Pte64K,
    /// 512 PTEs for 4 KiB pages.
    Pte4K,
}

impl Level {
    /// The lowest VA bit this level's index takes.
    pub(crate) const fn shift(self) -> u32 {
        match self {
            Level::Pde3 => 47,
            Level::Pde2 => 38,
            Level::Pde1 => 29,
            Level::Pde0 => 21,
            Level::Pte64K => 16,
            Level::Pte4K => 12,
        }
    }

    /// How many VA bits this level's index takes.
    pub(crate) const fn bits(self) -> u32 {
        match self {
            Level::Pde3 => 2,
            Level::Pde2 | Level::Pde1 | Level::Pte4K => 9,
            Level::Pde0 => 8,
            Level::Pte64K => 5,
        }
    }

    /// The bytes of one entry.
    pub(crate) const fn entry_size(self) -> u64 {
        match self {
            Level::Pde0 => 16,
            _ => 8,
        }
    }

    /// The entries of one table.
    pub(crate) const fn entries(self) -> u64 {
        1 << self.bits()
    }

    /// The bytes of one table (also its alignment).
    pub(crate) const fn table_size(self) -> u64 {
        self.entries() * self.entry_size()
    }

    /// The index of `va`'s entry in this level's table.
    pub(crate) const fn index(self, va: u64) -> u64 {
        (va >> self.shift()) & (self.entries() - 1)
    }

    /// The VA span one entry covers.
    pub(crate) const fn span(self) -> u64 {
        1 << self.shift()
    }

    /// The level below, for a directory level.
    pub(crate) const fn next(self) -> Option<Level> {
        match self {
            Level::Pde3 => Some(Level::Pde2),
            Level::Pde2 => Some(Level::Pde1),
            Level::Pde1 => Some(Level::Pde0),
            Level::Pde0 | Level::Pte64K | Level::Pte4K => None,
        }
    }

    /// The leaf level of a page size: 2 MiB pages are PTEs in PDE0's place.
    pub(crate) const fn for_page(page_size: u64) -> Option<Level> {
        match page_size {
            0x1000 => Some(Level::Pte4K),
            0x10000 => Some(Level::Pte64K),
            0x200000 => Some(Level::Pde0),
            _ => None,
        }
    }
}

/// Where an entry's address points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Aperture {
    /// The GPU's own memory (vidmem address).
    Video,
    /// Another GPU's memory (PTEs only).
    Peer,
    /// System memory, coherent with the CPU (a DMA address).
    SysCoherent,
    /// System memory, not snooped.
    SysNonCoherent,
}

impl Aperture {
    /// The widest address the entry can hold for this aperture (exclusive).
    const fn addr_end(self) -> u64 {
        match self {
            // 25 bits of 4 KiB frames.
            Aperture::Video | Aperture::Peer => 1 << 37,
            // 46 bits of 4 KiB frames.
            Aperture::SysCoherent | Aperture::SysNonCoherent => 1 << 58,
        }
    }

    /// The address field's mask, in place (bits 8 and up).
    const fn addr_mask(self) -> u64 {
        (self.addr_end() >> 12 << 8) - (1 << 8)
    }

    /// A system-memory aperture.
    pub(crate) const fn is_sys(self) -> bool {
        matches!(self, Aperture::SysCoherent | Aperture::SysNonCoherent)
    }
}

/// Why an entry cannot be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EncodeError {
    /// The address is not aligned to what the entry points at (a page, or a table).
    Misaligned,
    /// The address does not fit the aperture's field.
    TooWide,
    /// A PDE cannot point at a peer GPU; a peer id is 0..=7.
    BadAperture,
}

/// Bit 0: a valid PTE (a PDE has it clear).
const VALID: u64 = 1 << 0;
/// Bits 2..1: the aperture.
const APERTURE_SHIFT: u32 = 1;
const APERTURE_MASK: u64 = 3 << APERTURE_SHIFT;
/// Bit 3: volatile.
const VOLATILE: u64 = 1 << 3;
/// PTE bit 4: encrypted.
const ENCRYPTED: u64 = 1 << 4;
/// PTE bit 5: privileged.
const PRIVILEGED: u64 = 1 << 5;
/// PTE bit 6: read-only.
const READ_ONLY: u64 = 1 << 6;
/// PTE bit 7: atomics disabled.
const ATOMIC_DISABLE: u64 = 1 << 7;
/// PTE bits 35..33: the peer id, for the peer aperture.
const PEER_SHIFT: u32 = 33;
/// PTE bits 63..56: the kind.
const KIND_SHIFT: u32 = 56;

/// A page-table entry: one mapped page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pte {
    /// The page's address in its aperture (aligned to the page).
    pub(crate) addr: u64,
    /// What `addr` is an address of.
    pub(crate) aperture: Aperture,
    /// For [`Aperture::Peer`], which peer (0..=7).
    pub(crate) peer: u8,
    /// Not cached by the GPU.
    pub(crate) volatile: bool,
    /// Encrypted (confidential computing).
    pub(crate) encrypted: bool,
    /// Reachable by privileged (kernel) contexts only.
    pub(crate) privileged: bool,
    /// Writes fault.
    pub(crate) read_only: bool,
    /// Atomics fault.
    pub(crate) atomic_disable: bool,
    /// The memory kind (0: pitch, linear).
    pub(crate) kind: u8,
}

impl Pte {
    /// A valid, writable, cached, unprivileged PTE for `addr` in `aperture`, atomics allowed.
    pub(crate) const fn new(addr: u64, aperture: Aperture) -> Pte {
        Pte {
            addr,
            aperture,
            peer: 0,
            volatile: false,
            encrypted: false,
            privileged: false,
            read_only: false,
            atomic_disable: false,
            kind: 0,
        }
    }

    /// The entry, for a page of `page_size` bytes (the address must be aligned to it).
    pub(crate) fn encode(&self, page_size: u64) -> Result<u64, EncodeError> {
        let page = page_size.is_power_of_two() && page_size >= 0x1000;
        if !page || self.addr & (page_size - 1) != 0 {
            return Err(EncodeError::Misaligned);
        }
        if self.addr >= self.aperture.addr_end() {
            return Err(EncodeError::TooWide);
        }
        let aperture: u64 = match self.aperture {
            Aperture::Video => 0,
            Aperture::Peer => 1,
            Aperture::SysCoherent => 2,
            Aperture::SysNonCoherent => 3,
        };
        let mut e = VALID | (aperture << APERTURE_SHIFT) | (self.addr >> 12 << 8);
        match self.aperture {
            Aperture::Peer if self.peer > 7 => return Err(EncodeError::BadAperture),
            Aperture::Peer => e |= u64::from(self.peer) << PEER_SHIFT,
            _ if self.peer != 0 => return Err(EncodeError::BadAperture),
            _ => {}
        }
        for (set, bit) in [
            (self.volatile, VOLATILE),
            (self.encrypted, ENCRYPTED),
            (self.privileged, PRIVILEGED),
            (self.read_only, READ_ONLY),
            (self.atomic_disable, ATOMIC_DISABLE),
        ] {
            if set {
                e |= bit;
            }
        }
        Ok(e | (u64::from(self.kind) << KIND_SHIFT))
    }

    /// The PTE an entry holds, or `None` if it is not a valid PTE.
    pub(crate) fn decode(e: u64) -> Option<Pte> {
        if e & VALID == 0 {
            return None;
        }
        let aperture = match (e & APERTURE_MASK) >> APERTURE_SHIFT {
            0 => Aperture::Video,
            1 => Aperture::Peer,
            2 => Aperture::SysCoherent,
            _ => Aperture::SysNonCoherent,
        };
        let addr = (e & aperture.addr_mask()) >> 8 << 12;
        let peer = if aperture == Aperture::Peer {
            // CAST: three bits.
            ((e >> PEER_SHIFT) & 7) as u8
        } else {
            0
        };
        Some(Pte {
            addr,
            aperture,
            peer,
            volatile: e & VOLATILE != 0,
            encrypted: e & ENCRYPTED != 0,
            privileged: e & PRIVILEGED != 0,
            read_only: e & READ_ONLY != 0,
            atomic_disable: e & ATOMIC_DISABLE != 0,
            // CAST: the top byte.
            kind: (e >> KIND_SHIFT) as u8,
        })
    }
}

/// A page-directory entry: the next level's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pde {
    /// The table's address in its aperture.
    pub(crate) addr: u64,
    /// Video or system memory (a PDE cannot point at a peer).
    pub(crate) aperture: Aperture,
    /// The table is not cached by the GPU.
    pub(crate) volatile: bool,
}

impl Pde {
    /// A cached PDE for the table at `addr`.
    pub(crate) const fn new(addr: u64, aperture: Aperture) -> Pde {
        Pde {
            addr,
            aperture,
            volatile: false,
        }
    }

    /// The entry with the address shifted right by `shift` from bit `at`.
    fn encode_at(&self, shift: u32, at: u32) -> Result<u64, EncodeError> {
        let aperture: u64 = match self.aperture {
            Aperture::Video => 1,
            Aperture::SysCoherent => 2,
            Aperture::SysNonCoherent => 3,
            Aperture::Peer => return Err(EncodeError::BadAperture),
        };
        if self.addr & ((1 << shift) - 1) != 0 {
            return Err(EncodeError::Misaligned);
        }
        if self.addr >= self.aperture.addr_end() {
            return Err(EncodeError::TooWide);
        }
        let vol = if self.volatile { VOLATILE } else { 0 };
        Ok((aperture << APERTURE_SHIFT) | vol | (self.addr >> shift << at))
    }

    /// The PDE an entry holds (address shifted right by `shift` from bit `at`), or `None` if
    /// its aperture is invalid or it is a PTE.
    fn decode_at(e: u64, shift: u32, at: u32) -> Option<Pde> {
        if e & VALID != 0 {
            return None;
        }
        let aperture = match (e & APERTURE_MASK) >> APERTURE_SHIFT {
            0 => return None,
            1 => Aperture::Video,
            2 => Aperture::SysCoherent,
            _ => Aperture::SysNonCoherent,
        };
        let field = (aperture.addr_end() >> shift << at) - (1 << at);
        Some(Pde {
            addr: (e & field) >> at << shift,
            aperture,
            volatile: e & VOLATILE != 0,
        })
    }

    /// The entry of a PDE3, PDE2 or PDE1 (a table 4 KiB aligned; PDE3's root is 32 bytes but
    /// its children are whole 4 KiB tables).
    pub(crate) fn encode(&self) -> Result<u64, EncodeError> {
        self.encode_at(12, 8)
    }

    /// The PDE an entry of PDE3, PDE2 or PDE1 holds, or `None` for an invalid one.
    pub(crate) fn decode(e: u64) -> Option<Pde> {
        Self::decode_at(e, 12, 8)
    }
}

/// A PDE0 entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pde0 {
    /// Neither table nor page.
    Invalid,
    /// The 64 KiB page table (256 bytes, 256-byte aligned) and the 4 KiB one (4 KiB aligned).
    Dual {
        /// The 64 KiB page table.
        big: Option<Pde>,
        /// The 4 KiB page table.
        small: Option<Pde>,
    },
    /// A 2 MiB page.
    Page(Pte),
}

impl Pde0 {
    /// The 16 bytes of the entry, as two little-endian words.
    pub(crate) fn encode(&self) -> Result<[u64; 2], EncodeError> {
        match self {
            Pde0::Invalid => Ok([0, 0]),
            Pde0::Dual { big, small } => Ok([
                match big {
                    Some(p) => p.encode_at(8, 4)?,
                    None => 0,
                },
                match small {
                    Some(p) => p.encode_at(12, 8)?,
                    None => 0,
                },
            ]),
            Pde0::Page(pte) => Ok([pte.encode(2 << 20)?, 0]),
        }
    }

    /// What the 16 bytes of an entry hold.
    pub(crate) fn decode(e: [u64; 2]) -> Pde0 {
        if let Some(pte) = Pte::decode(e[0]) {
            return Pde0::Page(pte);
        }
        let (big, small) = (Pde::decode_at(e[0], 8, 4), Pde::decode_at(e[1], 12, 8));
        if big.is_none() && small.is_none() {
            Pde0::Invalid
        } else {
            Pde0::Dual { big, small }
        }
    }
}

/// What the MMU was asked to do at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// A load.
    Read,
    /// A store.
    Write,
}

/// Why a walk failed: a GPU MMU fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The address is past the 49-bit VA space.
    VaRange,
    /// An invalid PDE at this level.
    NoPde(Level),
    /// No valid PTE maps the address (the deepest level looked at).
    NoPte(Level),
    /// A write through a read-only PTE.
    ReadOnly,
    /// A table could not be read (where a PDE points is not memory).
    BadTable(Level),
}

impl Fault {
    /// A few words for a fault line.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Fault::VaRange => "address outside the VA space",
            Fault::NoPde(_) => "invalid PDE",
            Fault::NoPte(_) => "invalid PTE",
            Fault::ReadOnly => "write to a read-only page",
            Fault::BadTable(_) => "page table unreadable",
        }
    }
}

/// Where an address went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Translation {
    /// The PTE that maps it.
    pub(crate) pte: Pte,
    /// The size of its page.
    pub(crate) page_size: u64,
    /// The address in the PTE's aperture: the page plus the offset in it.
    pub(crate) addr: u64,
}

/// The reader of a walk: the 8-byte word at byte address `addr` in `aperture`, or `None` if
/// there is no memory there.
pub(crate) trait TableReader {
    /// The word at `addr` in `aperture`.
    fn read(&mut self, aperture: Aperture, addr: u64) -> Option<u64>;
}

impl<F: FnMut(Aperture, u64) -> Option<u64>> TableReader for F {
    fn read(&mut self, aperture: Aperture, addr: u64) -> Option<u64> {
        self(aperture, addr)
    }
}

/// Reads the entry of `level` for `va` in the table `at`.
fn entry<R: TableReader>(r: &mut R, at: &Pde, level: Level, va: u64) -> Result<u64, Fault> {
    let off = level.index(va) * level.entry_size();
    let addr = at.addr.checked_add(off).ok_or(Fault::BadTable(level))?;
    r.read(at.aperture, addr).ok_or(Fault::BadTable(level))
}

/// Walks the tree whose root (PDE3) table is `root` for `va`, as the MMU does: every entry read
/// through `r`, exactly as written.
pub(crate) fn walk<R: TableReader>(
    r: &mut R,
    root: &Pde,
    va: u64,
    access: Access,
) -> Result<Translation, Fault> {
    if va >= VA_END {
        return Err(Fault::VaRange);
    }
    let mut table = *root;
    let mut level = Level::Pde3;
    while let Some(next) = level.next() {
        table = Pde::decode(entry(r, &table, level, va)?).ok_or(Fault::NoPde(level))?;
        level = next;
    }
    // PDE0: 16 bytes, both halves read.
    let lo = entry(r, &table, Level::Pde0, va)?;
    let hi_addr = table.addr.checked_add(8);
    let hi_at = Pde {
        addr: hi_addr.ok_or(Fault::BadTable(Level::Pde0))?,
        ..table
    };
    let hi = entry(r, &hi_at, Level::Pde0, va)?;
    let (pte, page_size) = match Pde0::decode([lo, hi]) {
        Pde0::Invalid => return Err(Fault::NoPde(Level::Pde0)),
        Pde0::Page(pte) => (pte, 2 << 20),
        Pde0::Dual { big, small } => {
            // The big page table first; where its PTE is invalid, the small one.
            let big = match big {
                Some(t) => Pte::decode(entry(r, &t, Level::Pte64K, va)?),
                None => None,
            };
            match (big, small) {
                (Some(pte), _) => (pte, 64 << 10),
                (None, Some(t)) => (
                    Pte::decode(entry(r, &t, Level::Pte4K, va)?)
                        .ok_or(Fault::NoPte(Level::Pte4K))?,
                    4 << 10,
                ),
                (None, None) => return Err(Fault::NoPte(Level::Pte64K)),
            }
        }
    };
    if access == Access::Write && pte.read_only {
        return Err(Fault::ReadOnly);
    }
    Ok(Translation {
        pte,
        page_size,
        addr: pte.addr + (va & (page_size - 1)),
    })
}
