// SPDX-License-Identifier: GPL-2.0

//! The operations of a stream (`struct ruvm_op`, `RUVM_IOCTL_STREAM_SUBMIT`), one constructor
//! per `enum ruvm_op_kind`.
//!
//! Each sets the fields its kind names and leaves every other one 0, as the module requires;
//! the result is a plain `uapi::ruvm_op`, so a test can still set a field by hand to see it
//! refused.
//!
//! ```no_run
//! use libruvm::{op, Ruvm};
//!
//! let dev = Ruvm::open()?;
//! let s = dev.stream_create(0)?.handle;
//! let e = dev.event_create()?;
//! let (src, dst) = (1, 2); // sysmem mems mapped on GPU 0 (RUVM_IOCTL_MEM_MAP_GPU)
//! dev.stream_submit(s, &[op::copy(dst, 0, src, 0, 4096), op::record(e)])?;
//! dev.event_sync(e, 1000)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Stream-ordered allocation (`RUVM_OP_ALLOC`, `RUVM_OP_FREE`): the module writes an ALLOC's
//! results (the new mem's handle in `dst`, its mmap offset in `dst_offset`) into the submitted
//! array, so submit such a batch with [`crate::Ruvm::stream_submit_mut`] and read them back
//! with [`allocated`]; a later operation of the same batch names the new mem by the ALLOC's
//! index in the array ([`with_dst_index`], [`with_src_index`], [`free_index`]).
//!
//! ```no_run
//! use libruvm::{op, Ruvm};
//!
//! let dev = Ruvm::open()?;
//! let s = dev.stream_create(0)?.handle;
//! // 64 KiB from GPU 0's current pool, zeroed by the engine, then freed in stream order.
//! let mut ops = [op::alloc(0, 64 << 10, true), op::free_index(0)];
//! dev.stream_submit_mut(s, &mut ops)?;
//! let (handle, mmap_offset) = op::allocated(&ops[0]);
//! println!("mem {handle} (mmap offset {mmap_offset:#x}), already freed in the stream");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::os::fd::{AsRawFd, BorrowedFd};

use crate::uapi;

/// `RUVM_OP_COPY`: `length` bytes from mem `src` at `src_offset` to mem `dst` at `dst_offset`,
/// by the stream's GPU's copy engine.
pub fn copy(dst: u64, dst_offset: u64, src: u64, src_offset: u64, length: u64) -> uapi::ruvm_op {
    uapi::ruvm_op {
        kind: uapi::ruvm_op_kind_RUVM_OP_COPY,
        dst,
        dst_offset,
        src,
        src_offset,
        length,
        ..Default::default()
    }
}

/// `RUVM_OP_COPY_VA`: `length` bytes from GPU VA `src` to `dst`, of the kernel VA space or,
/// with `user`, of the file's user VA space.
pub fn copy_va(dst: u64, src: u64, length: u64, user: bool) -> uapi::ruvm_op {
    uapi::ruvm_op {
        kind: uapi::ruvm_op_kind_RUVM_OP_COPY_VA,
        flags: if user {
            uapi::ruvm_va_space_flags_RUVM_VA_USER
        } else {
            0
        },
        dst,
        src,
        length,
        ..Default::default()
    }
}

/// `RUVM_OP_FILL` with the seeded pattern of `seed` (`RUVM_FILL_PATTERN`).
pub fn fill_pattern(dst: u64, offset: u64, length: u64, seed: u64) -> uapi::ruvm_op {
    uapi::ruvm_op {
        kind: uapi::ruvm_op_kind_RUVM_OP_FILL,
        dst,
        dst_offset: offset,
        length,
        value: seed,
        fill_kind: uapi::ruvm_fill_kind_RUVM_FILL_PATTERN,
        ..Default::default()
    }
}

/// `RUVM_OP_FILL` with byte `byte` (`RUVM_FILL_BYTE`).
pub fn fill_byte(dst: u64, offset: u64, length: u64, byte: u8) -> uapi::ruvm_op {
    uapi::ruvm_op {
        fill_kind: uapi::ruvm_fill_kind_RUVM_FILL_BYTE,
        value: u64::from(byte),
        ..fill_pattern(dst, offset, length, 0)
    }
}

/// `RUVM_OP_RECORD`: event `event`'s point becomes this operation.
pub fn record(event: u64) -> uapi::ruvm_op {
    uapi::ruvm_op {
        kind: uapi::ruvm_op_kind_RUVM_OP_RECORD,
        value: event,
        ..Default::default()
    }
}

/// `RUVM_OP_WAIT_EVENT`: wait, at most `timeout_ms`, for the point event `event` has when the
/// operation is submitted.
pub fn wait_event(event: u64, timeout_ms: u32) -> uapi::ruvm_op {
    uapi::ruvm_op {
        kind: uapi::ruvm_op_kind_RUVM_OP_WAIT_EVENT,
        value: event,
        timeout_ms,
        ..Default::default()
    }
}

/// `RUVM_OP_WAIT_FD`: wait, at most `timeout_ms`, for the fence of sync_file `fd` (taken when
/// the operation is submitted: the descriptor may be closed after).
pub fn wait_fd(fd: BorrowedFd<'_>, timeout_ms: u32) -> uapi::ruvm_op {
    wait_raw_fd(fd.as_raw_fd(), timeout_ms)
}

/// [`wait_fd`] with any descriptor number, open or not (for the module's refusals).
pub fn wait_raw_fd(fd: i32, timeout_ms: u32) -> uapi::ruvm_op {
    uapi::ruvm_op {
        kind: uapi::ruvm_op_kind_RUVM_OP_WAIT_FD,
        // CAST: a descriptor number is not negative; a negative one (for tests) keeps its bits.
        value: fd as u32 as u64,
        timeout_ms,
        ..Default::default()
    }
}

/// `RUVM_OP_ALLOC`: a mem of `length` bytes from sysmem pool `pool` (0: the current pool of the
/// stream's GPU, `RUVM_IOCTL_GPU_POOL`), zeroed (when the stream reaches the operation) if
/// `zero`. Its results are written into the submitted array ([`allocated`]).
pub fn alloc(pool: u64, length: u64, zero: bool) -> uapi::ruvm_op {
    uapi::ruvm_op {
        kind: uapi::ruvm_op_kind_RUVM_OP_ALLOC,
        flags: if zero {
            uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO
        } else {
            0
        },
        src: pool,
        length,
        ..Default::default()
    }
}

/// What an ALLOC submitted with [`crate::Ruvm::stream_submit_mut`] made: the new mem's handle
/// and its mmap offset (both 0 before the submission).
pub fn allocated(op: &uapi::ruvm_op) -> (u64, u64) {
    (op.dst, op.dst_offset)
}

/// `RUVM_OP_FREE` of mem `handle` when the stream reaches the operation (its handle is gone at
/// the submission).
pub fn free(handle: u64) -> uapi::ruvm_op {
    uapi::ruvm_op {
        kind: uapi::ruvm_op_kind_RUVM_OP_FREE,
        dst: handle,
        ..Default::default()
    }
}

/// `RUVM_OP_FREE` of the mem the ALLOC at index `i` of the same submission makes.
pub fn free_index(i: usize) -> uapi::ruvm_op {
    with_dst_index(free(0), i)
}

/// `op` (a COPY, FILL or FREE) with its destination the mem the ALLOC at index `i` of the same
/// submission makes (`RUVM_OP_DST_INDEX`).
pub fn with_dst_index(op: uapi::ruvm_op, i: usize) -> uapi::ruvm_op {
    uapi::ruvm_op {
        flags: op.flags | uapi::ruvm_op_flags_RUVM_OP_DST_INDEX,
        dst: i as u64,
        ..op
    }
}

/// `op` (a COPY) with its source the mem the ALLOC at index `i` of the same submission makes
/// (`RUVM_OP_SRC_INDEX`).
pub fn with_src_index(op: uapi::ruvm_op, i: usize) -> uapi::ruvm_op {
    uapi::ruvm_op {
        flags: op.flags | uapi::ruvm_op_flags_RUVM_OP_SRC_INDEX,
        src: i as u64,
        ..op
    }
}

/// `op` (a COPY) with its destination named by address `p` of this process, inside its
/// mapping of a mem of the submitting file (`RUVM_OP_DST_PTR`): a pinned heap's pointer, say.
pub fn with_dst_ptr(op: uapi::ruvm_op, p: *const u8) -> uapi::ruvm_op {
    uapi::ruvm_op {
        flags: op.flags | uapi::ruvm_op_flags_RUVM_OP_DST_PTR,
        dst: p as u64,
        dst_offset: 0,
        ..op
    }
}

/// `op` (a COPY) with its source named by address `p` of this process (`RUVM_OP_SRC_PTR`).
pub fn with_src_ptr(op: uapi::ruvm_op, p: *const u8) -> uapi::ruvm_op {
    uapi::ruvm_op {
        flags: op.flags | uapi::ruvm_op_flags_RUVM_OP_SRC_PTR,
        src: p as u64,
        src_offset: 0,
        ..op
    }
}

/// Whether the module writes into `op` when it is submitted (an ALLOC's results).
pub fn writes_back(op: &uapi::ruvm_op) -> bool {
    op.kind == uapi::ruvm_op_kind_RUVM_OP_ALLOC
}

/// The name of an operation's kind (`copy`, `wait-fd`, ...), for messages.
pub fn kind_name(op: &uapi::ruvm_op) -> String {
    crate::names::value_name(crate::names::OP_KINDS, u64::from(op.kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields each kind names, as the header documents them.
    fn used(op: &uapi::ruvm_op) -> Vec<&'static str> {
        let mut v = Vec::new();
        for (name, set) in [
            ("flags", op.flags != 0),
            ("dst", op.dst != 0),
            ("dst_offset", op.dst_offset != 0),
            ("src", op.src != 0),
            ("src_offset", op.src_offset != 0),
            ("length", op.length != 0),
            ("value", op.value != 0),
            ("fill_kind", op.fill_kind != 0),
            ("timeout_ms", op.timeout_ms != 0),
            ("reserved", op.reserved != 0),
        ] {
            if set {
                v.push(name);
            }
        }
        v
    }

    #[test]
    fn each_kind_sets_only_its_fields() {
        assert_eq!(
            used(&copy(1, 2, 3, 4, 5)),
            ["dst", "dst_offset", "src", "src_offset", "length"]
        );
        assert_eq!(
            used(&copy_va(1, 2, 3, true)),
            ["flags", "dst", "src", "length"]
        );
        assert_eq!(used(&copy_va(1, 2, 3, false)), ["dst", "src", "length"]);
        assert_eq!(
            used(&fill_byte(1, 2, 3, 0x5a)),
            ["dst", "dst_offset", "length", "value", "fill_kind"]
        );
        assert_eq!(
            used(&fill_pattern(1, 2, 3, 4)),
            ["dst", "dst_offset", "length", "value"]
        );
        assert_eq!(used(&record(7)), ["value"]);
        assert_eq!(used(&wait_event(7, 10)), ["value", "timeout_ms"]);
        assert_eq!(used(&wait_raw_fd(3, 10)), ["value", "timeout_ms"]);
        assert_eq!(wait_raw_fd(-1, 1).value, 0xffff_ffff);
        assert_eq!(used(&alloc(5, 4096, false)), ["src", "length"]);
        assert_eq!(used(&alloc(0, 4096, true)), ["flags", "length"]);
        assert_eq!(
            alloc(0, 1, true).flags,
            uapi::ruvm_alloc_flags_RUVM_ALLOC_ZERO
        );
        assert_eq!(used(&free(9)), ["dst"]);
        // Index 0 is the first operation: only the flag says it is an index.
        assert_eq!(used(&free_index(0)), ["flags"]);
        assert_eq!(used(&free_index(3)), ["flags", "dst"]);
    }

    #[test]
    fn index_flags_name_an_earlier_alloc() {
        let dst = uapi::ruvm_op_flags_RUVM_OP_DST_INDEX;
        let src = uapi::ruvm_op_flags_RUVM_OP_SRC_INDEX;
        assert_eq!((dst, src), (1 << 8, 1 << 9));
        let f = free_index(2);
        assert_eq!(
            (f.kind, f.flags, f.dst),
            (uapi::ruvm_op_kind_RUVM_OP_FREE, dst, 2)
        );
        // A copy from a mem of the file into the ALLOC at 0, then from the ALLOC at 1 into it.
        let c = with_dst_index(copy(7, 16, 8, 32, 4096), 0);
        assert_eq!((c.flags, c.dst, c.dst_offset, c.src), (dst, 0, 16, 8));
        let c = with_src_index(c, 1);
        assert_eq!((c.flags, c.dst, c.src, c.src_offset), (dst | src, 0, 1, 32));
        let f = with_dst_index(fill_byte(7, 0, 8, 0x5a), 4);
        assert_eq!((f.flags, f.dst, f.value), (dst, 4, 0x5a));
        assert!(writes_back(&alloc(0, 1, false)));
        assert!(!writes_back(&f) && !writes_back(&free(1)));
        let mut a = alloc(0, 1, false);
        assert_eq!(allocated(&a), (0, 0));
        (a.dst, a.dst_offset) = (12, 0x40_0000);
        assert_eq!(allocated(&a), (12, 0x40_0000));
        assert_eq!(
            crate::names::bit_names(crate::names::OP_FLAGS, u64::from(dst | src)),
            ["dst-index", "src-index"]
        );
    }

    #[test]
    fn kinds_are_named_from_the_header() {
        assert_eq!(kind_name(&copy(1, 0, 2, 0, 1)), "copy");
        assert_eq!(kind_name(&copy_va(1, 2, 3, true)), "copy-va");
        assert_eq!(kind_name(&fill_byte(1, 0, 1, 0)), "fill");
        assert_eq!(kind_name(&record(1)), "record");
        assert_eq!(kind_name(&wait_event(1, 1)), "wait-event");
        assert_eq!(kind_name(&wait_raw_fd(1, 1)), "wait-fd");
        assert_eq!(kind_name(&alloc(0, 1, false)), "alloc");
        assert_eq!(kind_name(&free_index(0)), "free");
        let bad = uapi::ruvm_op {
            kind: 99,
            ..Default::default()
        };
        assert_eq!(kind_name(&bad), "unknown (99)");
    }

    #[test]
    fn the_op_has_the_documented_layout() {
        assert_eq!(std::mem::size_of::<uapi::ruvm_op>(), 72);
        assert_eq!(std::mem::align_of::<uapi::ruvm_op>(), 8);
    }
}
