#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# What `make demo` shows inside the guest. Grows with every capability ruvm gains.
set -e
step() { echo; echo "=== $*"; }

step "the guest: a q35 machine behind an Intel IOMMU, with QEMU edu PCI devices as test GPUs"
for d in /sys/bus/pci/devices/*; do
	if [ "$(cat "$d/vendor")" = 0x1234 ] && [ "$(cat "$d/device")" = 0x11e8 ]; then
		echo "edu device at ${d##*/}, IOMMU group $(basename "$(readlink "$d/iommu_group")")"
	fi
done

step "ruvm is loaded: /dev/ruvm"
grep '^ruvm ' /proc/modules
ls -l /dev/ruvm
dmesg | grep 'ruvm:'

step "ruvmctl info"
ruvmctl info

step "ruvmctl gpus: the test GPUs, bound by ruvm's own PCI driver (ruvm-edu)"
ruvmctl gpus

step "ruvmctl info --json"
ruvmctl info --json

step "a sysmem mem: 7 MiB + 17 bytes in 64K chunks, zeroed (the shell holds /dev/ruvm open as fd 3)"
exec 3<> /dev/ruvm
ruvmctl --fd 3 alloc 7M+17 --page-size 64K --zero
ruvmctl --fd 3 alloc 1M --page-size 2M

step "the kernel writes the size-seeded pattern through its vmap; user space reads it through mmap"
ruvmctl --fd 3 map-kernel 1
ruvmctl --fd 3 fill 1
ruvmctl --fd 3 mmap-verify 1

step "user space writes through mmap; the kernel reads it through its vmap"
ruvmctl --fd 3 mmap-fill 1 --seed 1234
ruvmctl --fd 3 verify 1 --seed 1234

step "a corrupted byte is found, exactly"
ruvmctl --fd 3 mmap-fill 1 --offset 4097 --length 1 --byte 0
ruvmctl --fd 3 verify 1 --seed 1234 || echo "(verify exits 1 on a mismatch, as it should)"

step "the kernel copies between mems through their mappings"
ruvmctl --fd 3 map-kernel 2
ruvmctl --fd 3 copy 2 1 --length 1M
ruvmctl --fd 3 mmap-verify 2 --seed 1234 --length 4096
ruvmctl --fd 3 query 1
ruvmctl info | grep 'live mems'

step "the 1M mem DMA-mapped for both GPUs: one address table per GPU (IOVAs: each GPU has its IOMMU domain)"
ruvmctl --fd 3 map-gpu 2 0
ruvmctl --fd 3 map-gpu 2 1
ruvmctl --fd 3 query 2
ruvmctl --fd 3 dma-addrs 2 0
ruvmctl --fd 3 dma-addrs 2 1

step "each GPU's copy engine (edu's DMA engine) copies through its own table: sysmem -> sysmem"
ruvmctl --fd 3 alloc 1M --zero
ruvmctl --fd 3 map-gpu 3 0
ruvmctl --fd 3 map-gpu 3 1
ruvmctl --fd 3 ce-copy 0 3 2 --length 4095
ruvmctl --fd 3 ce-copy 1 3 2 --length 4095 --dst-offset 8192 --src-offset 8192
ruvmctl --fd 3 map-kernel 3
ruvmctl --fd 3 verify 3 --seed 1234 --length 4095
ruvmctl --fd 3 verify 3 --seed 1234 --offset 8192 --length 4095
ruvmctl --fd 3 verify 3 --byte 0 --offset 4095 --length 4097
ruvmctl --fd 3 free 3

step "usage statistics (also in /sys/kernel/debug/ruvm/stats) and the audit's live counts"
ruvmctl stats

step "free one; close the file with the other still in it: the module reclaims it (and says so)"
ruvmctl --fd 3 free 1
ruvmctl --fd 3 query 1 || echo "(handle 1 is gone)"
exec 3>&-
ruvmctl info | grep 'live mems'
dmesg | grep 'audit: reclaimed'
ruvmctl stats --json | grep -E '"(reserved_peak|allocs|frees)"'

step "ruvmctl selftest (KTAP)"
ruvmctl selftest | tail -n 3

step "unloading ruvm: the verdict comes back through memory the module writes at unload"
mark=$(ruvmctl audit --mark)
ruvmctl unload
[ ! -e /dev/ruvm ] && echo "/dev/ruvm is gone"

step "the leak audit: ruvm's report in the kernel log since the mark, kmemleak, DMA-API errors"
ruvmctl audit --since "$mark" --require-unload
