// SPDX-License-Identifier: GPL-2.0

//! Who the current task is, without reading `task_struct` fields from Rust.
//!
//! C header: [`include/linux/pid.h`](srctree/include/linux/pid.h)
//!
//! On the project's 7.2 build the generated layout of `struct task_struct` does not match the C
//! one: `kernel::task::Task::pid()`, which reads the `pid` field, returned the low half of a
//! kernel text address in the guest, while `task_tgid_nr_ns` (a C call) returned the right pid.
//! Measured (fast kernel): `se` is at 128 in both, but `pid` is at 1040 in C and 992 in the
//! bindings, `comm` at 1504 and 1456, and the sizes are 2432 and 2368; `struct pci_dev` and
//! `struct device` agree (`dev` at 184, `iommu_group` at 440, size 1648). So ruvm asks C for
//! the pid and does not read `comm` (7.2 exports no function for it).

/// The current process's id (its thread group id, in the initial pid namespace).
pub(crate) fn current_pid() -> i32 {
    kernel::current!().tgid_nr_ns(None)
}
