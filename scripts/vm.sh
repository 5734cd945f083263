#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Run $CMD (a shell command line; empty for an interactive shell) in the guest booted with the
# FLAVOUR kernel (fast, debug, or stock: Debian's own) and that flavour's ruvm.ko. See
# tools/vm/run.sh for VM_* settings.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
. "$here/env.sh"

flavour=${1:?usage: vm.sh FLAVOUR}
if [ "$flavour" = stock ]; then
	# Debian's unmodified kernel and the ruvm.ko built for it (scripts/stock.sh).
	KERNEL_IMAGE=$("$here/stock.sh" vmlinuz)
else
	KERNEL_IMAGE=$("$here/kernel.sh" dir "$flavour")/arch/x86/boot/bzImage
fi
export KERNEL_IMAGE
# RUVM_KO may name another build of the module for that kernel (the DKMS package test does).
export RUVM_KO=${RUVM_KO:-$top/build/$flavour/rust/ruvm.ko}
export RUVMCTL=$top/tools/ruvmctl/target/x86_64-unknown-linux-gnu/release/ruvmctl
export SELFTESTS="${SELFTESTS-$top/build/selftests/ruvm_abi_test}"
# The debug kernel (KASAN, lockdep) runs several times slower under TCG.
[ "$flavour" = debug ] && export VM_TIMEOUT=${VM_TIMEOUT:-900}
if [ -n "${CMD:-}" ]; then
	exec "$top/tools/vm/run.sh" "$CMD"
fi
exec "$top/tools/vm/run.sh"
