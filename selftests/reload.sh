#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# reload.sh [--no-edu] PARAMS COMMAND...: a second configuration in the same guest. ruvm is
# unloaded with the audit's verdict checked, loaded again with PARAMS (exported as RUVM_MODARGS,
# as the guest's init does for the first load), and COMMAND runs; its exit status is ours.
# --no-edu keeps the edu devices from ruvm's driver (a driver_override no driver has), so that
# only simulated GPUs are there, as in a guest booted without edu devices.
# Exit 125 if the unload or the load failed.
no_edu=0
if [ "${1:-}" = --no-edu ]; then
	no_edu=1
	shift
fi
[ $# -ge 2 ] || { echo "usage: reload.sh [--no-edu] PARAMS COMMAND..." >&2; exit 2; }
params=$1
shift
if [ -d /sys/module/ruvm ] && ! ruvmctl unload; then
	echo "# reload.sh: unloading ruvm: the audit found leaks, or it is still in use"
	exit 125
fi
if [ $no_edu = 1 ]; then
	for d in /sys/bus/pci/devices/*; do
		[ "$(cat "$d/vendor"):$(cat "$d/device")" = 0x1234:0x11e8 ] || continue
		echo ruvm-none > "$d/driver_override" || exit 125
	done
fi
unknown_before=$(dmesg | grep -c "ruvm: unknown parameter")
# shellcheck disable=SC2086 # PARAMS is a list of module parameters
insmod /ruvm/ruvm.ko $params || { echo "# reload.sh: insmod ruvm.ko $params failed"; exit 125; }
# The kernel loads a module despite an unknown parameter: a typo must not pass unnoticed (as
# the guest's init checks the first load).
if [ "$(dmesg | grep -c "ruvm: unknown parameter")" != "$unknown_before" ]; then
	dmesg | grep "ruvm: unknown parameter" | tail -n 1
	echo "# reload.sh: ruvm.ko refused a parameter of '$params'"
	exit 125
fi
export RUVM_MODARGS="$params"
"$@"
