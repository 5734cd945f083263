#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Build ruvm.ko against one flavour of the project's kernel, or against KDIR.
#
#   scripts/module.sh FLAVOUR [MAKE ARGS...]   -> build/FLAVOUR/rust/ruvm.ko (FLAVOUR fast or
#                                                 debug; stock: Debian's kernel, scripts/stock.sh)
#   KDIR=/path scripts/module.sh host [ARGS]   -> build/host/rust/ruvm.ko, built with the
#                                                 toolchain settings of that tree (pass LLVM=1,
#                                                 RUSTC=... as ARGS when it needs them)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
. "$here/env.sh"

flavour=${1:?usage: module.sh FLAVOUR|host [MAKE ARGS...]}
shift
out=$top/build/$flavour
mkdir -p "$out"
if [ "$flavour" = host ]; then
	: "${KDIR:?KDIR must name a Rust-enabled kernel build tree for the host flavour}"
	exec make -C "$KDIR" M="$top" MO="$out" "$@" modules
fi
[ "$flavour" = stock ] && exec "$here/stock.sh" module "$@"
"$here/kernel.sh" build "$flavour"
kdir=$("$here/kernel.sh" dir "$flavour")
exec make -C "$kdir" M="$top" MO="$out" "${RUVM_KMAKE_ARGS[@]}" "$@" modules
