#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# make bench: boot the fast guest (2 edu devices behind the IOMMU: 00:03.0 a host GPU, 00:04.0
# an edu GPU; 2 simulated GPUs), run
# `ruvmctl bench` there, then on the host write the samples (results.json), the table
# (table.json) and the size-scaling curves (scaling.svg) into $BENCH_OUT (build/bench) and print
# the table. Reports, never fails on a missed goal; fails only if the bench cannot run.
# BENCH_ARGS: more ruvmctl bench arguments (e.g. "--reps 9", "--max-size 64M").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
. "$here/env.sh"

out=${BENCH_OUT:-$top/build/bench}
mkdir -p "$out"
rm -f "$out/console.log"
RUVMCTL=$top/tools/ruvmctl/target/x86_64-unknown-linux-gnu/release/ruvmctl
# 4 GiB: a 1 GiB mem, its 1 GiB baseline and the 1 GiB memset floor side by side, with room.
env VM_MEM="${VM_MEM:-4G}" VM_TIMEOUT="${VM_TIMEOUT:-3600}" VM_MODARGS="sim_gpus=2 host_gpus=0000:00:03.0" \
	VM_LOG="$out/console.log" CMD="ruvmctl bench --json ${BENCH_ARGS:-}" "$here/vm.sh" fast
"$RUVMCTL" bench-report "$out/console.log" --out "$out"
