// SPDX-License-Identifier: GPL-2.0

//! Bad flags and reserved fields, and unwritable arguments.

use super::*;

// --- refusals ------------------------------------------------------------------------------

/// Each unknown flag bit and each reserved element non-zero is EINVAL, for a mem's byte and
/// for an address that is not ruvm memory, and the argument is left as it was.
pub(super) fn ptr_bad_flags_and_reserved_are_einval() -> TestResult {
    let d = setup()?;
    let (q, g) = mapped_mem(&d, 4 * K, 0)?;
    let on_stack = std::hint::black_box(0u64);
    for (addr, what) in [
        (g.base(), "a mem's byte"),
        (std::ptr::addr_of!(on_stack) as u64, "a stack address"),
    ] {
        let mut bad = Vec::new();
        for bit in 0..32 {
            bad.push((
                uapi::ruvm_ptr_attrs {
                    addr,
                    flags: 1 << bit,
                    ..Default::default()
                },
                format!("flags bit {bit}"),
            ));
        }
        for i in 0..2 {
            let mut a = none(addr);
            a.reserved[i] = 1 << 63;
            bad.push((a, format!("reserved[{i}]")));
        }
        for (a, field) in bad {
            let mut arg = uapi::ruvm_ptr_attrs {
                type_: 0x55,
                handle: 0x66,
                ..a
            };
            expect_errno(
                d.call(cmd::PTR_ATTRS, &mut arg),
                Errno::EINVAL,
                &format!("PTR_ATTRS of {what} with {field}"),
            )?;
            same(
                &arg,
                &uapi::ruvm_ptr_attrs {
                    type_: 0x55,
                    handle: 0x66,
                    ..a
                },
                &format!("the argument of a refused PTR_ATTRS ({what}, {field})"),
            )?;
        }
    }
    drop(g);
    d.mem_free(q.handle).ctx("MEM_FREE")
}

/// An argument that cannot be read or written back is EFAULT: NULL, a PROT_NONE page, a
/// read-only page, one straddling the end of a writable page into a read-only one, and one in
/// a freed mem's (zapped) mapping; in a live mem's mapping it works, and answers for itself.
pub(super) fn ptr_unwritable_argument_is_efault() -> TestResult {
    let d = setup()?;
    let size = std::mem::size_of::<uapi::ruvm_ptr_attrs>();
    let call = |at: *mut u8| {
        // SAFETY: each address given is either unmapped, not writable, or `size` bytes of a
        // mapping of this case that nothing else uses during the call.
        unsafe { d.ioctl_ptr(cmd::PTR_ATTRS.nr, at.cast()) }
    };
    expect_errno(call(std::ptr::null_mut()), Errno::EFAULT, "a NULL argument")?;
    // Two pages: the argument written into them, then protected.
    let two = UserMapAnon::new(2 * PAGE, MapFlags::MAP_PRIVATE)?;
    let first = two.ptr.as_ptr().cast::<u8>();
    let put = |at: *mut u8, addr: u64| {
        let a = none(addr);
        // SAFETY: `at` is `size` writable bytes of `two` (checked by the callers' offsets).
        unsafe { at.cast::<uapi::ruvm_ptr_attrs>().write_unaligned(a) };
    };
    let stack = std::hint::black_box(0u64);
    let stack_addr = std::ptr::addr_of!(stack) as u64;
    put(first, stack_addr);
    // SAFETY: `two`'s mapping; nothing holds a reference into it.
    unsafe { mprotect(two.ptr, 2 * PAGE, ProtFlags::PROT_READ) }.ctx("mprotect")?;
    expect_errno(call(first), Errno::EFAULT, "a read-only argument")?;
    // SAFETY: as above.
    unsafe { mprotect(two.ptr, 2 * PAGE, ProtFlags::PROT_NONE) }.ctx("mprotect")?;
    expect_errno(call(first), Errno::EFAULT, "a PROT_NONE argument")?;
    // Straddling: its first 40 bytes writable, the rest read-only.
    // SAFETY: as above.
    unsafe {
        mprotect(
            two.ptr,
            2 * PAGE,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
        )
    }
    .ctx("mprotect")?;
    // SAFETY: inside `two`: `size` bytes from 40 before the second page.
    let straddle = unsafe { first.add(PAGE - 40) };
    put(straddle, stack_addr);
    // SAFETY: the second page of `two`.
    let second = NonNull::new(unsafe { first.add(PAGE) }.cast::<c_void>())
        .ok_or_else(|| Stop::Fail("a null page".into()))?;
    // SAFETY: as above.
    unsafe { mprotect(second, PAGE, ProtFlags::PROT_READ) }.ctx("mprotect")?;
    expect_errno(
        call(straddle),
        Errno::EFAULT,
        "an argument whose last bytes are read-only",
    )?;
    drop(two);

    // In a mem's own mapping: it answers for its own address; once the mem is freed, EFAULT.
    let (q, g) = mapped_mem(&d, 4 * K, 0)?;
    let base = g.base();
    put(g.at(0), base);
    call(g.at(0)).ctx("PTR_ATTRS with its argument in a mem's mapping")?;
    // SAFETY: the argument, in the live mapping, written back by the call.
    let got = unsafe { g.at(0).cast::<uapi::ruvm_ptr_attrs>().read_unaligned() };
    same(
        &got,
        &mem_byte(&q, base, 0),
        "an argument in a mem's mapping, about itself",
    )?;
    d.mem_free(q.handle).ctx("MEM_FREE")?;
    expect_errno(
        call(g.at(0)),
        Errno::EFAULT,
        "an argument in a freed mem's mapping",
    )?;
    check!(
        size == 104,
        "struct ruvm_ptr_attrs is {size} bytes, the header says 104"
    );
    Ok(())
}
