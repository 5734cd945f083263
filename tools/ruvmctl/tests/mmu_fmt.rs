// SPDX-License-Identifier: GPL-2.0

//! Host tests of the module's GPU page-table format (`rust/gpu/mmu/fmt.rs`, compiled from the
//! module's own source): every field of every entry at its documented bit, round trips, the
//! refusals, and walks through trees built in a memory of words for every page size.

#[path = "../../../rust/gpu/mmu/fmt.rs"]
mod mmu_fmt;

use std::collections::HashMap;

use mmu_fmt::{
    walk, Access, Aperture, EncodeError, Fault, Level, Pde, Pde0, Pte, Translation, PAGE_SIZES,
    VA_END,
};

const K: u64 = 1024;
const M: u64 = 1024 * K;
const G: u64 = 1024 * M;

const APERTURES: [Aperture; 4] = [
    Aperture::Video,
    Aperture::Peer,
    Aperture::SysCoherent,
    Aperture::SysNonCoherent,
];

#[test]
fn levels_cover_49_bits_with_no_gap() {
    let order = [
        Level::Pde3,
        Level::Pde2,
        Level::Pde1,
        Level::Pde0,
        Level::Pte4K,
    ];
    let mut top = 49;
    for l in order {
        assert_eq!(l.shift() + l.bits(), top, "{l:?}");
        top = l.shift();
    }
    assert_eq!(top, 12);
    assert_eq!(Level::Pte64K.shift() + Level::Pte64K.bits(), 21);
    assert_eq!(Level::Pde3.entries(), 4);
    assert_eq!(Level::Pde0.table_size(), 4 * K);
    assert_eq!(Level::Pde2.table_size(), 4 * K);
    assert_eq!(Level::Pte4K.table_size(), 4 * K);
    assert_eq!(Level::Pte64K.table_size(), 256);
    assert_eq!(Level::Pde0.span(), 2 * M);
    assert_eq!(Level::Pde1.span(), 512 * M);
    assert_eq!(
        Level::Pde0.index(0x1_2345_6789_a000),
        (0x1_2345_6789_a000 >> 21) & 0xff
    );
    assert_eq!(Level::for_page(4 * K), Some(Level::Pte4K));
    assert_eq!(Level::for_page(64 * K), Some(Level::Pte64K));
    assert_eq!(Level::for_page(2 * M), Some(Level::Pde0));
    assert_eq!(Level::for_page(128 * K), None);
    assert_eq!(VA_END, 1 << 49);
}

#[test]
fn pte_fields_sit_at_their_bits() {
    let base = Pte::new(0x1234_5000, Aperture::SysCoherent);
    assert_eq!(base.encode(4 * K), Ok(0x1 | (2 << 1) | (0x12345 << 8)));
    let flag = |f: fn(&mut Pte), bit: u64| {
        let mut p = base;
        f(&mut p);
        let e = p.encode(4 * K).unwrap();
        assert_eq!(e ^ base.encode(4 * K).unwrap(), 1 << bit, "bit {bit}");
        assert_eq!(Pte::decode(e), Some(p));
    };
    flag(|p| p.volatile = true, 3);
    flag(|p| p.encrypted = true, 4);
    flag(|p| p.privileged = true, 5);
    flag(|p| p.read_only = true, 6);
    flag(|p| p.atomic_disable = true, 7);
    let mut kind = base;
    kind.kind = 0xfe;
    assert_eq!(kind.encode(4 * K).unwrap() >> 56, 0xfe);
    assert_eq!(Pte::decode(kind.encode(4 * K).unwrap()), Some(kind));
    for (i, a) in APERTURES.into_iter().enumerate() {
        let e = Pte::new(0x20_0000, a).encode(2 * M).unwrap();
        assert_eq!((e >> 1) & 3, i as u64, "{a:?}");
    }
    let mut peer = Pte::new(0x40_0000, Aperture::Peer);
    peer.peer = 5;
    let e = peer.encode(4 * K).unwrap();
    assert_eq!((e >> 33) & 7, 5);
    assert_eq!(Pte::decode(e), Some(peer));
}

#[test]
fn pte_round_trips_every_page_size_and_the_widest_addresses() {
    for size in PAGE_SIZES {
        for a in APERTURES {
            let top = if a.is_sys() { 1 << 58 } else { 1 << 37 };
            for addr in [0, size, 7 * size, top - size] {
                let p = Pte::new(addr, a);
                let e = p
                    .encode(size)
                    .unwrap_or_else(|e| panic!("{a:?} {addr:#x}: {e:?}"));
                assert_eq!(Pte::decode(e), Some(p), "{a:?} {addr:#x} {size:#x}");
            }
            assert_eq!(Pte::new(top, a).encode(size), Err(EncodeError::TooWide));
            assert_eq!(
                Pte::new(size / 2, a).encode(size),
                Err(EncodeError::Misaligned)
            );
        }
    }
    assert_eq!(
        Pte::new(0, Aperture::Video).encode(3 * K),
        Err(EncodeError::Misaligned)
    );
    assert_eq!(
        Pte::new(0, Aperture::Video).encode(2 * K),
        Err(EncodeError::Misaligned)
    );
    let mut p = Pte::new(0, Aperture::Peer);
    p.peer = 8;
    assert_eq!(p.encode(4 * K), Err(EncodeError::BadAperture));
    let mut p = Pte::new(0, Aperture::Video);
    p.peer = 1;
    assert_eq!(p.encode(4 * K), Err(EncodeError::BadAperture));
    // Bit 0 clear is no PTE, whatever else is set.
    assert_eq!(Pte::decode(!1), None);
}

#[test]
fn pde_fields_and_round_trips() {
    let p = Pde::new(0x8765_4000, Aperture::Video);
    assert_eq!(p.encode(), Ok((1 << 1) | (0x87654 << 8)));
    let mut v = Pde::new(0x1000, Aperture::SysNonCoherent);
    v.volatile = true;
    assert_eq!(v.encode(), Ok((3 << 1) | (1 << 3) | (1 << 8)));
    assert_eq!(Pde::decode(v.encode().unwrap()), Some(v));
    for a in [
        Aperture::Video,
        Aperture::SysCoherent,
        Aperture::SysNonCoherent,
    ] {
        let top = if a.is_sys() { 1 << 58 } else { 1 << 37 };
        for addr in [0, 4 * K, top - 4 * K] {
            let p = Pde::new(addr, a);
            assert_eq!(Pde::decode(p.encode().unwrap()), Some(p), "{a:?} {addr:#x}");
        }
        assert_eq!(Pde::new(top, a).encode(), Err(EncodeError::TooWide));
        assert_eq!(Pde::new(256, a).encode(), Err(EncodeError::Misaligned));
    }
    assert_eq!(
        Pde::new(0, Aperture::Peer).encode(),
        Err(EncodeError::BadAperture)
    );
    // Aperture 0 is an invalid PDE; bit 0 set is a PTE.
    assert_eq!(Pde::decode(0x1234_5600), None);
    assert_eq!(Pde::decode((1 << 1) | 1), None);
}

#[test]
fn dual_pde_halves_and_the_2m_page() {
    let big = Pde::new(0x1_0100, Aperture::SysCoherent);
    let small = Pde::new(0x3000, Aperture::Video);
    let d = Pde0::Dual {
        big: Some(big),
        small: Some(small),
    };
    let e = d.encode().unwrap();
    // The big half's address is shifted by 8 from bit 4; the small half as a PDE.
    assert_eq!(e[0], (2 << 1) | (0x101 << 4));
    assert_eq!(e[1], (1 << 1) | (3 << 8));
    assert_eq!(Pde0::decode(e), d);
    for (b, s) in [(Some(big), None), (None, Some(small))] {
        let d = Pde0::Dual { big: b, small: s };
        assert_eq!(Pde0::decode(d.encode().unwrap()), d);
    }
    assert_eq!(Pde0::decode([0, 0]), Pde0::Invalid);
    assert_eq!(Pde0::Invalid.encode(), Ok([0, 0]));
    // A 64K table is 256-byte aligned; the 4K one 4 KiB.
    let bad = Pde0::Dual {
        big: Some(Pde::new(0x80, Aperture::Video)),
        small: None,
    };
    assert_eq!(bad.encode(), Err(EncodeError::Misaligned));
    let bad = Pde0::Dual {
        big: None,
        small: Some(Pde::new(0x100, Aperture::Video)),
    };
    assert_eq!(bad.encode(), Err(EncodeError::Misaligned));
    let widest = Pde0::Dual {
        big: Some(Pde::new((1 << 58) - 256, Aperture::SysCoherent)),
        small: Some(Pde::new((1 << 37) - 4 * K, Aperture::Video)),
    };
    assert_eq!(Pde0::decode(widest.encode().unwrap()), widest);
    let page = Pde0::Page(Pte::new(6 * M, Aperture::Video));
    let e = page.encode().unwrap();
    assert_eq!(e, [1 | (0x600 << 8), 0]);
    assert_eq!(Pde0::decode(e), page);
    assert_eq!(
        Pde0::Page(Pte::new(64 * K, Aperture::Video)).encode(),
        Err(EncodeError::Misaligned)
    );
}

/// A memory of words per aperture, and a bump allocator of tables in it.
#[derive(Default)]
struct Mem {
    words: HashMap<(bool, u64), u64>,
    next: u64,
    reads: usize,
}

impl Mem {
    fn key(a: Aperture, addr: u64) -> (bool, u64) {
        (a.is_sys(), addr)
    }

    fn table(&mut self, level: Level, a: Aperture) -> Pde {
        let size = level.table_size().max(256);
        self.next = self.next.next_multiple_of(size);
        let addr = self.next + 0x10_0000;
        self.next += size;
        for i in 0..size / 8 {
            self.words.insert(Self::key(a, addr + 8 * i), 0);
        }
        Pde::new(addr, a)
    }

    fn put(&mut self, at: &Pde, level: Level, va: u64, words: &[u64]) {
        let base = at.addr + level.index(va) * level.entry_size();
        for (i, w) in words.iter().enumerate() {
            let k = Self::key(at.aperture, base + 8 * i as u64);
            assert!(self.words.contains_key(&k), "outside a table");
            self.words.insert(k, *w);
        }
    }

    fn walk(&mut self, root: &Pde, va: u64, access: Access) -> Result<Translation, Fault> {
        let mut read = |a: Aperture, addr: u64| {
            self.reads += 1;
            self.words.get(&Self::key(a, addr)).copied()
        };
        walk(&mut read, root, va, access)
    }
}

/// A tree mapping `va` (and the 2 MiB around it) down to PDE0, tables in `a`.
fn tree(m: &mut Mem, va: u64, a: Aperture) -> (Pde, Pde) {
    let root = m.table(Level::Pde3, a);
    let mut at = root;
    for l in [Level::Pde3, Level::Pde2, Level::Pde1] {
        let next = m.table(l.next().unwrap(), a);
        m.put(&at, l, va, &[next.encode().unwrap()]);
        at = next;
    }
    (root, at)
}

#[test]
fn walks_find_every_page_size_and_offset() {
    let va = 0x1_2345_6000_0000 + 0x3_4000 + 0x123;
    for a in [Aperture::Video, Aperture::SysCoherent] {
        // 2 MiB page in PDE0's place.
        let mut m = Mem::default();
        let (root, pde0) = tree(&mut m, va, a);
        let pte = Pte::new(14 * M, Aperture::SysCoherent);
        m.put(&pde0, Level::Pde0, va, &Pde0::Page(pte).encode().unwrap());
        let t = m.walk(&root, va, Access::Write).unwrap();
        assert_eq!(
            (t.page_size, t.addr, t.pte),
            (2 * M, 14 * M + (va & (2 * M - 1)), pte)
        );
        // PDE3, PDE2, PDE1, both PDE0 halves: five reads.
        assert_eq!(m.reads, 5);

        // 64 KiB and 4 KiB pages through a dual PDE0.
        let mut m = Mem::default();
        let (root, pde0) = tree(&mut m, va, a);
        let big = m.table(Level::Pte64K, a);
        let small = m.table(Level::Pte4K, a);
        let d = Pde0::Dual {
            big: Some(big),
            small: Some(small),
        };
        m.put(&pde0, Level::Pde0, va, &d.encode().unwrap());
        let p64 = Pte::new(5 * 64 * K, Aperture::Video);
        m.put(&big, Level::Pte64K, va, &[p64.encode(64 * K).unwrap()]);
        let t = m.walk(&root, va, Access::Read).unwrap();
        assert_eq!(
            (t.page_size, t.addr),
            (64 * K, 5 * 64 * K + (va & (64 * K - 1)))
        );
        // The next 64K page has no big PTE: the small table maps its 4K pages.
        let va4 = (va | (64 * K - 1)) + 1 + 0x2000 + 8;
        let p4 = Pte::new(0x7_7000, Aperture::SysNonCoherent);
        m.put(&small, Level::Pte4K, va4, &[p4.encode(4 * K).unwrap()]);
        let t = m.walk(&root, va4, Access::Write).unwrap();
        assert_eq!((t.page_size, t.addr, t.pte), (4 * K, 0x7_7008, p4));
        // Its neighbour has neither.
        assert_eq!(
            m.walk(&root, va4 + 4 * K, Access::Read),
            Err(Fault::NoPte(Level::Pte4K))
        );
    }
}

#[test]
fn walks_fault_where_the_tree_says() {
    let va = 5 * G + 3 * M + 0x1000;
    let mut m = Mem::default();
    let (root, pde0) = tree(&mut m, va, Aperture::Video);
    assert_eq!(m.walk(&root, VA_END, Access::Read), Err(Fault::VaRange));
    assert_eq!(m.walk(&root, u64::MAX, Access::Read), Err(Fault::VaRange));
    // Another PDE3 entry, another PDE1 entry: no directory there.
    assert_eq!(
        m.walk(&root, va + (1 << 47), Access::Read),
        Err(Fault::NoPde(Level::Pde3))
    );
    assert_eq!(
        m.walk(&root, va + 512 * M, Access::Read),
        Err(Fault::NoPde(Level::Pde1))
    );
    assert_eq!(
        m.walk(&root, va, Access::Read),
        Err(Fault::NoPde(Level::Pde0))
    );
    // A dual PDE0 with only a big table: an invalid big PTE and no small table.
    let big = m.table(Level::Pte64K, Aperture::Video);
    let d = Pde0::Dual {
        big: Some(big),
        small: None,
    };
    m.put(&pde0, Level::Pde0, va, &d.encode().unwrap());
    assert_eq!(
        m.walk(&root, va, Access::Read),
        Err(Fault::NoPte(Level::Pte64K))
    );
    // Read-only: reads pass, writes fault.
    let mut ro = Pte::new(0x10_0000, Aperture::Video);
    ro.read_only = true;
    m.put(&big, Level::Pte64K, va, &[ro.encode(64 * K).unwrap()]);
    assert!(m.walk(&root, va, Access::Read).is_ok());
    assert_eq!(m.walk(&root, va, Access::Write), Err(Fault::ReadOnly));
    // A PDE pointing where there is no memory.
    let nowhere = Pde0::Dual {
        big: Some(Pde::new(0x7000_0000, Aperture::Video)),
        small: None,
    };
    m.put(&pde0, Level::Pde0, va, &nowhere.encode().unwrap());
    assert_eq!(
        m.walk(&root, va, Access::Read),
        Err(Fault::BadTable(Level::Pte64K))
    );
    // The same table read through the other aperture is not there either.
    let wrong = Pde::new(root.addr, Aperture::SysCoherent);
    assert_eq!(
        m.walk(&wrong, va, Access::Read),
        Err(Fault::BadTable(Level::Pde3))
    );
    for f in [Fault::VaRange, Fault::ReadOnly, Fault::NoPte(Level::Pte4K)] {
        assert!(!f.reason().is_empty());
    }
}
