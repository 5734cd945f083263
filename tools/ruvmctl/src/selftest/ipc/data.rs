// SPDX-License-Identifier: GPL-2.0

//! Export data as the header lays it out (`RUVM_EXPORT_DATA_VERSION`): every word checked the
//! documented way, in the documented order.

use std::os::fd::AsFd;

use nix::errno::Errno;

use super::{bad_bytes, counts, exported_mem, setup, unchanged, SIZE};
use crate::selftest::harness::{check, expect_errno, Context, TestResult};
use libruvm::{uapi, ExportData, Ruvm, UserMap};

/// The little-endian word at byte `at` of `x`.
fn word(x: &ExportData, at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&x[at..at + 8]);
    u64::from_le_bytes(w)
}

/// `x` with the word at byte `at` set to `v`.
fn with(mut x: ExportData, at: usize, v: u64) -> ExportData {
    x[at..at + 8].copy_from_slice(&v.to_le_bytes());
    x
}

/// Export data is laid out as documented and the same at every call; every byte of the version
/// word and the zero tail is checked first (`EINVAL`, even with a wrong pool word); pool words and
/// serials naming no mem of the pool are `ENOENT`; genuine data of a pool the file was not given
/// imports nothing; a mem never exported has no key.
pub(super) fn ipc_export_data_layout() -> TestResult {
    let d = setup()?;
    let before = counts(&d)?;
    let (p, q, map) = exported_mem(&d, 21)?;
    let (p2, q2, map2) = exported_mem(&d, 22)?;
    let (pool_of, data) = d.mem_export(q.handle).ctx("MEM_EXPORT")?;
    let (_, again) = d.mem_export(q.handle).ctx("MEM_EXPORT again")?;
    let (_, data2) = d
        .mem_export(q2.handle)
        .ctx("MEM_EXPORT of the other pool's mem")?;
    let v = uapi::RUVM_EXPORT_DATA_VERSION;
    check!(data == again, "MEM_EXPORT gave other data the second time");
    check!(
        word(&data, 0) == v && word(&data2, 0) == v,
        "version words {:#x} {:#x}, wanted {v:#x}",
        word(&data, 0),
        word(&data2, 0)
    );
    check!(
        pool_of == p && word(&data, 8) == p && word(&data2, 8) == p2,
        "pool words {} {} (pools {p} {p2}, MEM_EXPORT said {pool_of})",
        word(&data, 8),
        word(&data2, 8)
    );
    check!(
        word(&data, 16) != 0 && word(&data, 16) != word(&data2, 16),
        "serials {} {}",
        word(&data, 16),
        word(&data2, 16)
    );
    check!(data[24..40] != data2[24..40], "two mems share a key");
    check!(
        data[40..].iter().chain(&data2[40..]).all(|&b| b == 0),
        "a non-zero byte from 40 on"
    );
    let fd = d.pool_export(p).ctx("POOL_EXPORT")?;
    let other = Ruvm::open().ctx("open a second file")?;
    let ip = other.pool_import(fd.as_fd()).ctx("POOL_IMPORT")?;
    check!(ip == p, "the imported pool's handle {ip} is not {p}");
    for byte in (0..8).chain(40..64) {
        for base in [data, data2] {
            let mut x = base;
            x[byte] ^= 0x80;
            expect_errno(
                other.mem_import(ip, &x),
                Errno::EINVAL,
                &format!("MEM_IMPORT with byte {byte} changed"),
            )?;
        }
    }
    let s2 = word(&data2, 16);
    for (x, what) in [
        (with(data, 8, p2), "another pool's word"),
        (with(data, 8, 0), "pool word 0"),
        (
            with(data2, 8, p),
            "another pool's mem under this pool's word",
        ),
        (with(data, 16, s2), "another pool's serial"),
        (with(data, 16, 0), "serial 0"),
        (with(data, 16, u64::MAX), "a serial never made"),
        (data2, "another pool's data"),
    ] {
        expect_errno(
            other.mem_import(ip, &x),
            Errno::ENOENT,
            &format!("MEM_IMPORT: {what}"),
        )?;
    }
    expect_errno(
        other.mem_import(p2, &data2),
        Errno::ENOENT,
        "genuine data through a pool not in the file",
    )?;
    let fresh = d
        .pool_alloc(p, SIZE, 0)
        .ctx("MEM_ALLOC, never exported")?
        .handle;
    let s = word(&data, 16);
    for n in s + 1..=s + 16 {
        expect_errno(
            other.mem_import(ip, &with(data, 16, n)),
            Errno::ENOENT,
            &format!("MEM_IMPORT of serial {n} with another mem's key"),
        )?;
    }
    let m = other.mem_import(ip, &data).ctx("MEM_IMPORT")?;
    let mq = other.mem_query(m.handle).ctx("MEM_QUERY")?;
    let imap = UserMap::of_mem(&other, &mq).ctx("mmap of the import")?;
    check!(
        bad_bytes(&imap, 0, SIZE, 21) == 0,
        "the import's bytes are not the exporter's"
    );
    drop(imap);
    other.mem_free(m.handle).ctx("MEM_FREE of the import")?;
    drop((map, map2));
    for h in [q.handle, q2.handle, fresh] {
        d.mem_free(h).ctx("MEM_FREE")?;
    }
    for pool in [p, p2] {
        d.pool_destroy(pool).ctx("POOL_DESTROY")?;
    }
    drop((other, fd));
    unchanged(&d, &before)
}
