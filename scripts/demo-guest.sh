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

step "two GPUs, two address spaces: each has its own IOMMU domain, so one mem has a table per GPU"
# A 4M mem mapped on GPU 0 only takes IOVAs there first, so the shared mem lands elsewhere.
ruvmctl --fd 3 alloc 4M --page-size 2M
ruvmctl --fd 3 map-gpu 3 0
ruvmctl --fd 3 map-gpu 2 0
ruvmctl --fd 3 map-gpu 2 1
ruvmctl --fd 3 query 2
ruvmctl --fd 3 dma-addrs 2 0
ruvmctl --fd 3 dma-addrs 2 1

step "each GPU's copy engine (edu's DMA engine) copies through its own table: sysmem -> sysmem"
ruvmctl --fd 3 alloc 1M --zero
ruvmctl --fd 3 map-gpu 4 0
ruvmctl --fd 3 map-gpu 4 1
ruvmctl --fd 3 ce-copy 0 4 2 --length 4095
ruvmctl --fd 3 ce-copy 1 4 2 --length 4095 --dst-offset 8192 --src-offset 8192
ruvmctl --fd 3 map-kernel 4
ruvmctl --fd 3 verify 4 --seed 1234 --length 4095
ruvmctl --fd 3 verify 4 --seed 1234 --offset 8192 --length 4095
ruvmctl --fd 3 verify 4 --byte 0 --offset 4095 --length 4097
ruvmctl --fd 3 free 4

step "vidmem: each GPU's memory, from its PMM (the kernel's GPU buddy allocator, 2 MiB root chunks)"
ruvmctl --fd 3 alloc 3M --vidmem 0
ruvmctl --fd 3 alloc 100K --vidmem 1
ruvmctl pmm
ruvmctl --fd 3 gpu-phys 5 0 --offset 2M --length 4096
ruvmctl --fd 3 map-kernel 5 || echo "(vidmem is not CPU-mappable: the copy engine moves its bytes)"

step "copy engines move bytes sysmem -> vidmem -> sysmem on both GPUs; the CPU checks the result"
ruvmctl --fd 3 alloc 1M --zero
ruvmctl --fd 3 map-gpu 7 0
ruvmctl --fd 3 map-gpu 7 1
ruvmctl --fd 3 ce-copy 0 5 2 --length 4095
ruvmctl --fd 3 ce-copy 0 7 5 --length 4095
ruvmctl --fd 3 ce-copy 1 6 2 --length 4095 --dst-offset 8192 --src-offset 8192
ruvmctl --fd 3 ce-copy 1 7 6 --length 4095 --dst-offset 8192 --src-offset 8192
ruvmctl --fd 3 map-kernel 7
ruvmctl --fd 3 verify 7 --seed 1234 --length 4095
ruvmctl --fd 3 verify 7 --seed 1234 --offset 8192 --length 4095

step "freed, the PMMs are back to whole root chunks (uvm's PMM_CHECK_LEAK)"
for h in 3 5 6 7; do ruvmctl --fd 3 free $h; done
ruvmctl pmm
ruvmctl pmm-check-leak 0 --chunk-size 64K
ruvmctl pmm-check-leak 1

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
