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

step "vidmem: each GPU's memory, from its PMM (uvm's chunk tree: 2 MiB root chunks split into 64K and 4K)"
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

step "ruvmctl selftest (KTAP): its totals, and any case that failed with its reason"
ruvmctl selftest | grep -E '^not ok|^# [a-z_]+:|^# Totals'

step "unloading ruvm: the verdict comes back through memory the module writes at unload"
mark=$(ruvmctl audit --mark)
ruvmctl unload
[ ! -e /dev/ruvm ] && echo "/dev/ruvm is gone"

step "the leak audit: ruvm's report in the kernel log since the mark, kmemleak, DMA-API errors"
ruvmctl audit --since "$mark" --require-unload

step "GPU virtual mappings: ruvm loaded again with two simulated GPUs, which have an MMU"
insmod /ruvm/ruvm.ko sim_gpus=2 enable_test_ioctls=1
ruvmctl gpus
# The simulated GPUs' ids, from the registry.
set -- $(ruvmctl gpus | awk '/simulated GPU/ {print $1}')
s0=$1 s1=$2
exec 3<> /dev/ruvm
va() { ruvmctl --fd 3 gpu-va "$@" --json | grep '"va"' | tr -dc 0-9; }

step "one mem at the same GPU kernel VA on both GPUs (uvm_mem's map_gpu_kernel); page tables in each GPU's memory"
ruvmctl --fd 3 alloc 4M --page-size 64K
ruvmctl --fd 3 map-kernel 1
ruvmctl --fd 3 fill 1
ruvmctl --fd 3 map-gpu 1 "$s0" --kernel
ruvmctl --fd 3 map-gpu 1 "$s1" --kernel
ruvmctl --fd 3 gpu-va 1 "$s0"
ruvmctl --fd 3 gpu-va 1 "$s1"
ruvmctl --fd 3 query 1
src=$(va 1 "$s0")

step "the engine copies through GPU VAs, walking the tables as written; the CPU checks the result"
ruvmctl --fd 3 alloc 4M --page-size 2M --zero
ruvmctl --fd 3 map-gpu 2 "$s1" --kernel
dst=$(va 2 "$s1")
ruvmctl ce-copy-va "$s1" "$dst" "$src" 4M
ruvmctl --fd 3 map-kernel 2
ruvmctl --fd 3 verify 2 --seed 4194304
ruvmctl pt-dump "$s1" "$((src + 65536 + 8))"
ruvmctl pt-dump "$s1" "$dst"
cat /sys/kernel/debug/ruvm/page_tables
ruvmctl stats | grep '^audit'

step "a user mapping at a VA of this file's own GPU VA space (map_gpu_user), read-only: the GPU's write faults"
ruvmctl --fd 3 map-gpu 1 "$s0" --user 0x100000000 --read-only
ruvmctl --fd 3 map-gpu 2 "$s0" --user 0x200000000
ruvmctl --fd 3 ce-copy-va --user "$s0" 0x200000000 0x100000000 64K
ruvmctl --fd 3 verify 2 --seed 4194304 --length 64K
ruvmctl --fd 3 query 1
ruvmctl --fd 3 ce-copy-va --user "$s0" 0x100000000 0x200000000 64K || echo "(a write through a read-only PTE: an MMU fault)"
dmesg | grep 'MMU fault' | tail -n 1

step "unmapped, the old VA faults: the TLB was invalidated, the tables it emptied are freed"
ruvmctl --fd 3 unmap-gpu 1 "$s1" --kernel
ruvmctl ce-copy-va "$s1" "$dst" "$src" 4096 || echo "(an MMU fault, as it should be)"
dmesg | grep 'MMU fault' | tail -n 1
ruvmctl pt-dump "$s1" "$src"

step "freed with mappings alive, in uvm_mem's order; no page table is left"
ruvmctl --fd 3 free 1
ruvmctl --fd 3 free 2
ruvmctl stats | grep '^audit'
cat /sys/kernel/debug/ruvm/page_tables

# The handle of a new mem or pool, from its JSON.
handle() { grep -m1 '"handle"' | tr -dc 0-9; }

step "memory pools (CUDA's cudaMemPool_t): a pool of 64K chunks that keeps everything (threshold max), its mems DMA-mapped for GPU $s0"
p=$(ruvmctl --fd 3 pool create --page-size 64K --threshold max --json | handle)
ruvmctl --fd 3 pool access "$p" "$s0"
ruvmctl --fd 3 pool get "$p"

step "it warms up: the first mem's chunks are new (misses); freed, they stay cached, mapped"
m=$(ruvmctl --fd 3 alloc 256K --pool "$p" --json | handle)
ruvmctl --fd 3 query "$m"
ruvmctl --fd 3 free "$m"
ruvmctl --fd 3 pool get "$p"

step "the next mem of the same size is a hit: the same chunks, already mapped for the GPU, zeroed as asked"
m=$(ruvmctl --fd 3 alloc 256K --pool "$p" --zero --json | handle)
ruvmctl --fd 3 query "$m"
ruvmctl --fd 3 mmap-verify "$m" --byte 0
ruvmctl --fd 3 pool get "$p"
ruvmctl --fd 3 free "$m"

step "ruvmctl stats: what every pool reserves, against what its mems use (memory a pool holds is never a mystery)"
ruvmctl stats | sed -n '/^pools/,$p'

step "trim to 0 (cudaMemPoolTrimTo): the cache is given back"
ruvmctl --fd 3 pool trim "$p" 0
ruvmctl --fd 3 pool destroy "$p"

step "stream-ordered allocation (cudaMallocAsync / cudaFreeAsync): alloc and free are operations of a stream on GPU $s0"
st=$(ruvmctl --fd 3 stream create --gpu "$s0" --json | grep -m1 '"stream"' | tr -dc 0-9)
r=$(ruvmctl --fd 3 pool create --threshold 0 --json | handle)
ruvmctl --fd 3 pool access "$r" "$s0"
a=$(ruvmctl --fd 3 stream alloc "$st" 1M --pool "$r" --json | handle)
ruvmctl --fd 3 dma-addrs "$a" "$s0" | head -n 3
ruvmctl --fd 3 stream free "$st" "$a"

step "freed on the stream, its chunks wait in the pool, pending: the same stream takes them again at once"
ruvmctl --fd 3 pool get "$r" | grep -E 'reserved|used|pending|hits'
b=$(ruvmctl --fd 3 stream alloc "$st" 1M --pool "$r" --json | handle)
ruvmctl --fd 3 dma-addrs "$b" "$s0" | head -n 3
ruvmctl --fd 3 stream free "$st" "$b"

step "a synchronize observes the free: the release threshold (0) gives the chunks back"
ruvmctl --fd 3 pool get "$r" | grep -E 'reserved|pending'
ruvmctl --fd 3 stream sync "$st"
ruvmctl --fd 3 pool get "$r" | grep -E 'reserved|pending'
ruvmctl --fd 3 stream destroy "$st"
ruvmctl --fd 3 pool destroy "$r"

step "IPC pools: two processes share a pool (CUDA's cudaMemPoolExportToShareableHandle / ImportPointer); the importer cannot allocate from it"
ruvmctl pool share --size 1M --gpu "$s0"

step "memory pressure: a pool caches 192M; a tmpfs then takes more than the guest has without it: the shrinker gives the cache back"
q=$(ruvmctl --fd 3 pool create --page-size 2M --threshold max --json | handle)
m=$(ruvmctl --fd 3 alloc 192M --pool "$q" --json | handle)
ruvmctl --fd 3 free "$m"
ruvmctl --fd 3 pool get "$q" | grep -E 'reserved|cached'
mkdir -p /mnt/fill
mount -t tmpfs -o size=100% fill /mnt/fill
avail=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
echo "MemAvailable ${avail} MiB; writing $((avail + 96)) MiB to tmpfs"
dd if=/dev/zero of=/mnt/fill/f bs=1M count=$((avail + 96)) 2>&1 | tail -n 1
ruvmctl --fd 3 pool get "$q" | grep -E 'reserved|cached'
rm /mnt/fill/f
umount /mnt/fill
ruvmctl --fd 3 pool destroy "$q"
exec 3>&-
ruvmctl stats | grep '^audit'
mark=$(ruvmctl audit --mark)
ruvmctl unload
ruvmctl audit --since "$mark" --require-unload
