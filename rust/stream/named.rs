// SPDX-License-Identifier: GPL-2.0

//! The events a submission names ([`Events`]): looked up in the file once, each once, before
//! its operations are planned; moved once the submission is queued.

use kernel::{prelude::*, sync::Arc};

use crate::uapi;

use super::{
    event::Event,
    few::Few,
    lookup::{Lookup, Named},
};

/// The events a submission names (RECORD, WAIT_EVENT), each once, in the order first named,
/// and each operation's place among them: the lookup in the file, the moves and the drops go
/// over the events named only, and an operation finds its event in one step.
pub(super) struct Events {
    named: Few<Named, IN_PLACE>,
    /// For each operation of the submission, 1 + the place in `named` of the event it names;
    /// 0 for one that names none.
    of_op: Few<u16, IN_PLACE>,
}

/// Events named, and operations, that a submission's tables hold without allocating.
const IN_PLACE: usize = 4;

/// Up to this many events named, duplicates are found by a look along them, not a hash table.
const LINEAR: usize = 8;

/// Whether `op` names an event.
fn names(op: &uapi::ruvm_op) -> bool {
    matches!(
        op.kind,
        uapi::ruvm_op_kind_RUVM_OP_RECORD | uapi::ruvm_op_kind_RUVM_OP_WAIT_EVENT
    )
}

impl Events {
    /// Looks up the events `ops` name in `files`, at once.
    pub(super) fn of(ops: &[uapi::ruvm_op], files: &dyn Lookup) -> Result<Self> {
        let n = ops.iter().filter(|o| names(o)).count();
        if n == 0 {
            // Nothing to look up: no table, and the file's lock is not taken.
            return Ok(Self {
                named: Few::with_capacity(0, GFP_KERNEL)?,
                of_op: Few::with_capacity(0, GFP_KERNEL)?,
            });
        }
        // A place fits in 16 bits.
        const _: () = assert!(super::MAX_SUBMIT <= u16::MAX as u32);
        let size = n
            .checked_mul(2)
            .and_then(usize::checked_next_power_of_two)
            .ok_or(EINVAL)?;
        // Transient (freed before the call returns), bounded by the call, and charged to the
        // caller: the call may wait with it for its stream's turn.
        let mut named = Few::with_capacity(n, GFP_KERNEL_ACCOUNT)?;
        let mut of_op = Few::from_elem(0u16, ops.len(), GFP_KERNEL_ACCOUNT)?;
        // A hash table of the places by handle (open addressing, at most half full: an empty
        // slot ends every search), for the dedup only, when more than a few events are named
        // (else a look along `named` is cheaper than allocating it). Fibonacci hashing: the
        // handles of a file are consecutive numbers.
        let mut index = if n > LINEAR {
            KVec::from_elem(0u16, size, GFP_KERNEL_ACCOUNT)?
        } else {
            KVec::new()
        };
        let mask = size - 1;
        // The last operation's event and place: a RECORD and a WAIT_EVENT of one event often
        // come together.
        let mut last = (0u64, 0u16);
        for (op, place) in ops.iter().zip(of_op.iter_mut()).filter(|(o, _)| names(o)) {
            if last.1 != 0 && last.0 == op.value {
                *place = last.1;
                continue;
            }
            // CAST: at most `n` entries, fewer than u16::MAX (above).
            let next = (named.len() + 1) as u16;
            let found = if index.is_empty() {
                // CAST: as `next`.
                named
                    .iter()
                    .position(|e: &Named| e.handle == op.value)
                    .map(|i| (i + 1) as u16)
            } else {
                // CAST: the top bits of the product, fewer than a usize holds.
                let mut i = (op.value.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & mask;
                let mut probes = 0;
                loop {
                    let slot = index.get_mut(i).ok_or(EINVAL)?;
                    match *slot {
                        0 => {
                            *slot = next;
                            break None;
                        }
                        p => {
                            let entry: &Named = named.get(usize::from(p) - 1).ok_or(EINVAL)?;
                            if entry.handle == op.value {
                                break Some(p);
                            }
                        }
                    }
                    probes += 1;
                    if probes == size {
                        return Err(EINVAL);
                    }
                    i = (i + 1) & mask;
                }
            };
            *place = match found {
                Some(p) => p,
                None => {
                    // Room for `n` was reserved: this does not allocate.
                    named.push(
                        Named {
                            handle: op.value,
                            event: None,
                            recorded: 0,
                        },
                        GFP_KERNEL,
                    )?;
                    next
                }
            };
            last = (op.value, *place);
        }
        drop(index);
        files.events(&mut named);
        Ok(Self { named, of_op })
    }

    /// The event operation `at` of the submission names (`ENOENT` if the file has none), and
    /// the seqno the submission last recorded it at. (`EINVAL` for an operation that names
    /// none: never asked, only RECORD and WAIT_EVENT ask.)
    pub(super) fn get(&mut self, at: usize) -> Result<(&Arc<Event>, &mut u64)> {
        let place = usize::from(*self.of_op.get(at).ok_or(EINVAL)?);
        match place.checked_sub(1).and_then(|p| self.named.get_mut(p)) {
            Some(Named {
                event: Some(e),
                recorded,
                ..
            }) => Ok((e, recorded)),
            Some(_) => Err(ENOENT),
            None => Err(EINVAL),
        }
    }

    /// The events the submission recorded, with the seqno of each one's last record.
    pub(super) fn recorded(&self) -> impl Iterator<Item = (&Arc<Event>, u64)> {
        self.named.iter().filter_map(|n| match &n.event {
            Some(e) if n.recorded != 0 => Some((e, n.recorded)),
            _ => None,
        })
    }
}
