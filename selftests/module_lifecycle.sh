#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Module load/unload in the guest, as KTAP: repeated insmod/unload cycles (each unload checked
# by the audit's verdict), bad parameters, the audit silent at leak_checker=0, rmmod refused
# while a file of /dev/ruvm is open, and refused (clearly, at once) while a dma-buf ruvm
# exported lives, then accepted with a clean verdict once it is gone. Expects ruvm not to be
# loaded when it starts.
KO=${RUVM_KO:-/ruvm/ruvm.ko}
n=0 failed=0
ok() { n=$((n + 1)); echo "ok $n $1"; }
notok() { n=$((n + 1)); failed=1; echo "# $1: $2"; echo "not ok $n $1"; }

echo "TAP version 13"
echo "1..7"

if [ -d /sys/module/ruvm ]; then
	echo "# ruvm is already loaded"
	echo "Bail out!"
	exit 1
fi

why=
for i in 1 2 3 4 5; do
	insmod "$KO" || { why="insmod failed in cycle $i"; break; }
	[ -c /dev/ruvm ] || { why="no /dev/ruvm after insmod in cycle $i"; break; }
	ruvmctl info > /dev/null || { why="ruvmctl info failed in cycle $i"; break; }
	# Unload and check the audit's verdict, read from memory the module writes at unload.
	ruvmctl unload > /dev/null || { why="unload (with its audit verdict) failed in cycle $i"; break; }
	[ ! -e /dev/ruvm ] || { why="/dev/ruvm still there after rmmod in cycle $i"; break; }
done
[ -z "$why" ] && ok insmod_rmmod_cycles || notok insmod_rmmod_cycles "$why"

# Parameters the module cannot honour fail the load, leave nothing behind, and say why.
why=
# host_gpus: no device there, not an address, a function past 7, one named twice, nine of
# them, longer than 256 bytes.
nine=0000:00:01.0,0000:00:01.1,0000:00:01.2,0000:00:01.3,0000:00:01.4,0000:00:01.5,0000:00:01.6,0000:00:01.7,0000:00:02.0
long=$(printf '0000:00:03.0,%.0s' $(seq 1 20))0000:00:03.0
for bad in vidmem_mib=3 vidmem_mib=65536 vidmem_keep_mib=3 vidmem_keep_mib=65536 sim_gpus=9 zeroing=3 leak_checker=3 host_gpus=0000:ff:1f.7 host_gpus=0xffff \
	host_gpus=0000:00:03.8 host_gpus=0000:00:03.0,00:03.0 host_gpus=$nine host_gpus=$long; do
	if insmod "$KO" "$bad" 2> /dev/null; then
		why="insmod with $bad succeeded"
		rmmod ruvm
		break
	fi
	if [ -d /sys/module/ruvm ] || [ -e /dev/ruvm ] || [ -e /sys/bus/faux/devices/ruvm-sim0 ]; then
		why="a failed insmod with $bad left the module or its devices behind"
		break
	fi
	dmesg | tail -n 5 | grep -q 'ruvm: ' || { why="no error line for $bad"; break; }
done
[ -z "$why" ] && ok bad_parameters_fail_the_load || notok bad_parameters_fail_the_load "$why"

# leak_checker=0: no audit line at all (not for a file closed with a mem in it, not at unload),
# while the unload state still carries the verdict.
why=
lines() { dmesg | grep -c 'ruvm: audit:'; }
before=$(lines)
if ! insmod "$KO" leak_checker=0; then
	why="insmod with leak_checker=0 failed"
else
	# RUVM_IOCTL_AUDIT's level, as ruvmctl stats shows it.
	level=$(ruvmctl stats | sed -n 's/.*(leak_checker=\([0-9]*\)).*/\1/p')
	[ "$level" = 0 ] || why="RUVM_IOCTL_AUDIT reports level '$level'"
	# The mem is reclaimed when ruvmctl's file closes.
	ruvmctl alloc 64K > /dev/null || why="${why:-alloc failed}"
	ruvmctl unload > /dev/null || why="${why:-unload (with its audit verdict) failed}"
	after=$(lines)
	[ "$after" = "$before" ] || why="${why:-$((after - before)) audit lines at leak_checker=0}"
fi
[ -z "$why" ] && ok leak_checker_0_logs_nothing || notok leak_checker_0_logs_nothing "$why"

insmod "$KO" || { notok rmmod_refused_while_open "insmod failed"; echo "Bail out!"; exit 1; }
exec 3<> /dev/ruvm
if rmmod ruvm 2> /dev/null; then
	notok rmmod_refused_while_open "rmmod succeeded with /dev/ruvm open"
	exec 3>&-
	exit 1
fi
ok rmmod_refused_while_open
exec 3>&-
if ruvmctl unload; then
	ok rmmod_after_last_close
else
	notok rmmod_after_last_close "rmmod failed after the file was closed"
fi
# A dma-buf holds the module: a background process keeps the buffer of a mem (whose file,
# ruvmctl's, is closed) and nothing else of ruvm's is open.
insmod "$KO" || { notok rmmod_refused_while_a_dmabuf_lives "insmod failed"; echo "Bail out!"; exit 1; }
why=
holder=/tmp/ruvm-dmabuf-holder
rm -f "$holder"
exec 3<> /dev/ruvm
h=$(ruvmctl --fd 3 alloc 64K --json | sed -n 's/.*"handle": *\([0-9]*\).*/\1/p')
[ -n "$h" ] || why="alloc failed"
if [ -z "$why" ]; then
	# The buffer outlives the file (closed below) in `sleep`.
	ruvmctl --fd 3 dmabuf export "$h" --run "sleep 120 3>&- & echo \$! > $holder" > /dev/null 2>&1 ||
		why="dmabuf export failed"
fi
exec 3>&-
if [ -z "$why" ]; then
	start=$(date +%s)
	msg=$(timeout 10 rmmod ruvm 2>&1) && why="rmmod succeeded with a dma-buf alive"
	[ -n "$why" ] || [ $(($(date +%s) - start)) -lt 5 ] || why="rmmod took $(($(date +%s) - start)) s"
	[ -n "$why" ] || echo "$msg" | grep -qiE "in use|unavailable|busy" || why="rmmod said: $msg"
	[ -d /sys/module/ruvm ] || why="${why:-the module went}"
fi
[ -z "$why" ] && ok rmmod_refused_while_a_dmabuf_lives || notok rmmod_refused_while_a_dmabuf_lives "$why"
[ -s "$holder" ] && { kill "$(cat "$holder")" 2> /dev/null; while kill -0 "$(cat "$holder")" 2> /dev/null; do sleep 0.1; done; }
if ruvmctl unload > /dev/null; then
	ok rmmod_after_the_dmabuf_closed
else
	notok rmmod_after_the_dmabuf_closed "unload (with its audit verdict) failed after the buffer's last descriptor closed"
fi
echo "# Totals: pass:$((n - failed)) fail:$failed xfail:0 xpass:0 skip:0 error:0"
exit $failed
