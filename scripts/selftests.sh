#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Build a C selftest as a static binary for the guest, with the kernel's own kselftest
# harness (from the pinned source tree) and the uapi header exactly as users include it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
. "$here/env.sh"

out=${1:?usage: selftests.sh OUTPUT}
src=$top/selftests/$(basename "$out").c
ksrc=$("$here/kernel.sh" source)
mkdir -p "$(dirname "$out")"
gcc -static -O2 -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Werror \
	-I"$top/include/uapi" -I"$ksrc/tools/testing/selftests" \
	-o "$out" "$src"
