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
if [ -n "${CMD:-}" ]; then
	exec "$top/tools/vm/run.sh" "$CMD"
fi
exec "$top/tools/vm/run.sh"
