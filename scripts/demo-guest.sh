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

step "ruvmctl info --json"
ruvmctl info --json

step "ruvmctl selftest (KTAP)"
ruvmctl selftest

step "unloading ruvm"
rmmod ruvm
[ ! -e /dev/ruvm ] && echo "/dev/ruvm is gone"
dmesg | grep 'ruvm:' | tail -n 1
