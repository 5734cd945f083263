#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# make demo: build what is missing, boot the guest, load ruvm, show what it does through
# ruvmctl, unload it, and print the runner's audit verdict.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
flavour=${FLAVOUR:-fast}

echo "== building what is missing (first run: packages, the $flavour kernel, ruvm.ko, ruvmctl, the selftests)"
make -s -C "$top" module FLAVOUR="$flavour"
make -s -C "$top" ruvmctl
# The guest runner copies the selftest binaries in (SELFTESTS), so they must exist too.
make -s -C "$top" selftests
echo "== booting the guest ($flavour kernel)"
VM_EXTRA=$here/demo-guest.sh CMD='demo-guest.sh' "$here/vm.sh" "$flavour"
