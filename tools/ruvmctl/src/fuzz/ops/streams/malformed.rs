// SPDX-License-Identifier: GPL-2.0

//! Malformed stream and event commands, each refused with the errno the documentation gives.

use std::os::fd::OwnedFd;

use libruvm::{cmd, op, uapi, Errno};

use super::{wait_ms, Rng, World};

use Errno::*;

/// Malformed stream and event commands: `EINVAL` (`ENOENT` if another thread destroyed the
/// stream, `EIO` if it is in error, `ENODEV` if its GPU is going, or `EAGAIN` if the queue is
/// full, where the module checks those first), `EFAULT` for unreadable operations.
pub(super) fn malformed(w: &World, rng: &mut Rng) {
    let Some((d, s)) = w.stream(rng) else { return };
    let h = s.handle;
    let e = w.event_of(&d, rng);
    let bad_op = |rng: &mut Rng| -> uapi::ruvm_op {
        let mut o = match rng.below(3) {
            0 => op::record(e),
            1 => op::wait_event(e, wait_ms(rng)),
            _ => op::copy(1, 0, 1, 0, 8),
        };
        match rng.below(4) {
            0 => o.reserved = 1 + rng.below(1 << 20),
            // No such kind (7 and 8 are ALLOC and FREE).
            1 => o.kind = rng.pick(&[0, 9, 0x100, u32::MAX]),
            // A timeout where the kind takes none (RECORD, COPY), or a wait's of 0.
            2 => {
                o.timeout_ms = u32::from(o.kind != uapi::ruvm_op_kind_RUVM_OP_WAIT_EVENT);
            }
            _ => o.flags = 1 << rng.below(32),
        }
        o
    };
    let (what, r, want): (&str, Result<(), Errno>, &[Errno]) = match rng.below(8) {
        0 => (
            "STREAM_SUBMIT of 0 operations",
            d.stream_submit(h, &[]).map(drop),
            &[EINVAL, ENOENT],
        ),
        1 => {
            let ops = vec![op::record(e); uapi::RUVM_MAX_SUBMIT_OPS as usize + 1];
            (
                "STREAM_SUBMIT of RUVM_MAX_SUBMIT_OPS + 1 operations",
                d.stream_submit(h, &ops).map(drop),
                &[EINVAL, ENOENT],
            )
        }
        2 => {
            // A well-formed operation first: all or nothing.
            let ops = [op::record(e), bad_op(rng)];
            (
                "STREAM_SUBMIT of a malformed operation",
                d.stream_submit(h, &ops).map(drop),
                &[EINVAL, ENOENT, EIO, ENODEV, EAGAIN],
            )
        }
        3 => {
            let ms = rng.pick(&[0, uapi::RUVM_WAIT_MAX_MS + 1, u32::MAX]);
            let ops = [op::wait_event(e, ms)];
            (
                "STREAM_SUBMIT of a wait with a timeout out of range",
                d.stream_submit(h, &ops).map(drop),
                &[EINVAL, ENOENT, EIO, ENODEV, EAGAIN],
            )
        }
        4 => {
            let mut a = uapi::ruvm_stream_submit {
                handle: h,
                count: 1,
                ops: rng.pick(&[8, u64::MAX - 4095, 1 << 47]),
                ..Default::default()
            };
            (
                "STREAM_SUBMIT of unreadable operations",
                d.call(cmd::STREAM_SUBMIT, &mut a),
                &[EFAULT, ENOENT],
            )
        }
        5 => {
            let ms = rng.pick(&[0, uapi::RUVM_WAIT_MAX_MS + 1]);
            (
                "STREAM_SYNC with a timeout out of range",
                d.stream_sync(h, ms),
                &[EINVAL],
            )
        }
        6 => {
            let mut a = uapi::ruvm_stream_sync {
                handle: h,
                flags: uapi::ruvm_sync_flags_RUVM_SYNC_EVERY_STREAM,
                timeout_ms: 1,
                ..Default::default()
            };
            (
                "STREAM_SYNC of every stream with a handle",
                d.call(cmd::STREAM_SYNC, &mut a),
                &[EINVAL],
            )
        }
        _ => {
            // A timeout where only EVENT_SYNC takes one, or a reserved word.
            let mut a = uapi::ruvm_event {
                handle: e,
                ..Default::default()
            };
            if rng.one_in(2) {
                a.timeout_ms = 1 + rng.below(100) as u32;
            } else {
                a.reserved[rng.below(2) as usize] = 1;
            }
            let c = rng.pick(&[cmd::EVENT_QUERY, cmd::EVENT_EXPORT, cmd::EVENT_DESTROY]);
            let r = d.call(c, &mut a);
            if r.is_ok() && c.nr == cmd::EVENT_EXPORT.nr {
                // SAFETY: the module installed `a.fd` for this call; nothing else owns it.
                drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(a.fd) });
            }
            (
                "EVENT_QUERY/EXPORT/DESTROY with a timeout or reserved word",
                r,
                &[EINVAL],
            )
        }
    };
    match r {
        Err(e) if want.contains(&e) || e == ENOMEM => {}
        r => w.problem(format!("{what}: {r:?}, wanted one of {want:?}")),
    }
}
