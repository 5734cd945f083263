#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Run $CMD (a shell command line; empty for an interactive shell) in the guest booted with
# the FLAVOUR kernel and that flavour's ruvm.ko. See tools/vm/run.sh for VM_* settings.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
. "$here/env.sh"

flavour=${1:?usage: vm.sh FLAVOUR}
kdir=$("$here/kernel.sh" dir "$flavour")
export KERNEL_IMAGE=$kdir/arch/x86/boot/bzImage
export RUVM_KO=$top/build/$flavour/rust/ruvm.ko
export RUVMCTL=$top/tools/ruvmctl/target/x86_64-unknown-linux-gnu/release/ruvmctl
export SELFTESTS="${SELFTESTS-$top/build/selftests/ruvm_abi_test}"
# The debug kernel (KASAN, lockdep) runs several times slower under TCG.
[ "$flavour" = debug ] && export VM_TIMEOUT=${VM_TIMEOUT:-900}
# The fast kernel's runs wait mostly on edu's 100 ms transfer timer: an instruction-counted
# clock that skips idle time makes them 3 times faster (main suite 58 s -> 16 s). The debug
# kernel is CPU-bound, and loses more from its two vCPUs sharing one thread than it gains
# (190 s -> 225 s), so it runs without. VM_ICOUNT= (empty) turns it off.
[ "$flavour" = fast ] && export VM_ICOUNT=${VM_ICOUNT-shift=auto,sleep=off}
if [ -n "${CMD:-}" ]; then
	exec "$top/tools/vm/run.sh" "$CMD"
fi
exec "$top/tools/vm/run.sh"
