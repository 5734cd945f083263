#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Boot the ruvm test guest and run one command in it.
#
#   tools/vm/run.sh [COMMAND...]        no command: an interactive shell in the guest
#
# The guest: QEMU TCG, q35 + intel-iommu, VM_GPUS QEMU `edu` PCI devices, the chosen kernel,
# an initramfs with busybox, ruvm.ko, ruvmctl, the selftests and VM_EXTRA files (in /extra,
# which is on PATH). ruvm is loaded before the command (VM_INSMOD=0 to skip) and unloaded
# after it.
#
# Exit status: the command's own status when the kernel stayed clean; otherwise
#   3   the kernel reported a problem (BUG/WARN/Oops/KASAN/lockdep/kmemleak/DMA-API error),
#       unloading ruvm failed, or ruvm's audit of the unload found a leak, whatever the
#       command returned
#   124 the guest did not finish within VM_TIMEOUT seconds, or printed nothing for
#       VM_QUIET_LIMIT seconds (the selftest case it was in is said)
#   125 the guest died before reporting (panic, QEMU failure) or insmod failed
#
# Settings (environment): KERNEL_IMAGE, RUVM_KO, RUVMCTL (required); SELFTESTS (files for
# /selftests); VM_EXTRA (files for /extra); VM_MODARGS (insmod arguments); VM_INSMOD (1);
# VM_GPUS (2); VM_TIMEOUT (300); VM_MEM (1G); VM_LOG (console log path); VM_VERBOSE (1 shows
# the console live); VM_EXPECT_KMSG (extended regex of kernel lines a test expects: such lines
# are reported but do not count as errors; see Documentation/testing.rst); VM_ICOUNT (QEMU
# -icount options, e.g. shift=auto,sleep=off; empty: none); VM_BOOT_WAIT (240: seconds for /init
# to say it booted before the guest is booted once more); VM_QUIET_LIMIT (0: off; else the
# seconds the guest may print nothing before it is stopped as stuck); VM_APPEND (more kernel
# parameters).
set -euo pipefail

die() { echo "vm: $*" >&2; exit 125; }

: "${KERNEL_IMAGE:?KERNEL_IMAGE must name a bzImage}"
: "${RUVM_KO:?RUVM_KO must name ruvm.ko}"
: "${RUVMCTL:?RUVMCTL must name the ruvmctl binary}"
VM_INSMOD=${VM_INSMOD:-1}
VM_BOOT_WAIT=${VM_BOOT_WAIT:-240}
VM_GPUS=${VM_GPUS:-2}
VM_TIMEOUT=${VM_TIMEOUT:-300}
VM_MEM=${VM_MEM:-1G}
VM_MODARGS=${VM_MODARGS:-}
VM_VERBOSE=${VM_VERBOSE:-0}
VM_EXPECT_KMSG=${VM_EXPECT_KMSG:-}
VM_ICOUNT=${VM_ICOUNT:-}
VM_QUIET_LIMIT=${VM_QUIET_LIMIT:-0}
VM_APPEND=${VM_APPEND:-}
quiet=0

for f in "$KERNEL_IMAGE" "$RUVM_KO" "$RUVMCTL" /bin/busybox; do
	[ -f "$f" ] || die "missing $f"
done
[[ "$VM_GPUS" =~ ^[0-9]+$ ]] && [ "$VM_GPUS" -le 32 ] || die "VM_GPUS must be 0..32"
[[ "$VM_TIMEOUT" =~ ^[0-9]+$ ]] || die "VM_TIMEOUT must be a number of seconds"
[[ "$VM_QUIET_LIMIT" =~ ^[0-9]+$ ]] || die "VM_QUIET_LIMIT must be a number of seconds"

work=$(mktemp -d "${TMPDIR:-/tmp}/ruvm-vm.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp,ruvm,selftests,extra,etc}
cp /bin/busybox "$root/bin/busybox"
cp "$RUVM_KO" "$root/ruvm/ruvm.ko"
cp "$RUVMCTL" "$root/bin/ruvmctl"
for f in ${SELFTESTS:-}; do cp "$f" "$root/selftests/"; done
for f in ${VM_EXTRA:-}; do
	[ -e "$f" ] || die "VM_EXTRA file $f does not exist"
	cp -r "$f" "$root/extra/"
done

# A fresh nonce per run: nothing the command prints can forge the runner's markers.
nonce=$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
interactive=0
if [ $# -eq 0 ]; then
	interactive=1
else
	printf '%s\n' "$*" > "$root/cmd"
fi

cat > "$root/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/extra HOME=/tmp
# What ruvm was loaded with, for tests that reload it or check its limits (7.2's Rust modules
# have no parameter files in sysfs).
export RUVM_MODARGS="$VM_MODARGS"
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mkdir -p /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
end() { echo "RUVM-END-$nonce rc=\$1"; poweroff -f; }
echo "RUVM-BOOTED-$nonce"
if [ "$VM_INSMOD" = 1 ]; then
	insmod /ruvm/ruvm.ko $VM_MODARGS || { echo "RUVM-INSMOD-FAILED-$nonce"; end 125; }
	# The kernel loads a module despite an unknown parameter; a typo must not pass unnoticed.
	if dmesg | grep -q "ruvm: unknown parameter"; then
		dmesg | grep "ruvm: unknown parameter"
		echo "RUVM-INSMOD-FAILED-$nonce"
		end 125
	fi
fi
if [ $interactive = 1 ]; then
	echo "ruvm guest: ruvmctl, /selftests and /extra are here; exit to power off"
	setsid cttyhack sh -l
	rc=0
else
	echo "RUVM-OUT-BEGIN-$nonce"
	sh /cmd
	rc=\$?
	echo "RUVM-OUT-END-$nonce rc=\$rc"
fi
audit_args=
if [ -d /sys/module/ruvm ]; then
	# ruvm's own audit of this unload: only what the log says after this marker.
	mark=\$(ruvmctl audit --mark 2>/dev/null) && audit_args="--since \$mark --require-unload"
	rmmod ruvm || echo "RUVM-RMMOD-FAILED-$nonce"
fi
# ruvm's audit without a kmemleak scan (the scans below are the run's own), then kmemleak's
# wait: it reports only objects older than about 5 s, counted from the unload.
echo "RUVM-AUDIT-BEGIN-$nonce"
ruvmctl audit --no-kmemleak \$audit_args
echo "RUVM-AUDIT-END-$nonce rc=\$?"
if [ -w /sys/kernel/debug/kmemleak ]; then
	sleep 6
	# Two scans: an object changed since the last scan is only reported by the next one.
	echo scan > /sys/kernel/debug/kmemleak
	echo scan > /sys/kernel/debug/kmemleak
	echo "RUVM-KMEMLEAK-BEGIN-$nonce"
	cat /sys/kernel/debug/kmemleak
	echo "RUVM-KMEMLEAK-END-$nonce"
fi
if [ -r /sys/kernel/debug/dma-api/error_count ]; then
	echo "RUVM-DMA-ERRORS-$nonce \$(cat /sys/kernel/debug/dma-api/error_count)"
fi
echo "RUVM-DMESG-BEGIN-$nonce"
dmesg
echo "RUVM-DMESG-END-$nonce"
end \$rc
EOF
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initramfs.cpio.gz"

# oops=panic: an oops ends the run at once (panic=-1 reboots, -no-reboot makes QEMU exit)
# instead of leaving a half-dead guest to time out.
# no_timer_check: at boot the kernel checks that timer interrupts arrive within a short TSC-timed
# delay through the IO-APIC and, with interrupt remapping on, panics if they do not; under TCG on
# a loaded host the check can lose that race ("timer doesn't work through Interrupt-remapped
# IO-APIC" at 0.1 s: once in a make check with three guests at a time). The parameter skips the
# check, as virtual machines commonly do; the timer works.
append="console=ttyS0 panic=-1 oops=panic intel_iommu=on iommu.strict=1 printk.devkmsg=on"
append="$append no_timer_check"
[ -z "$VM_APPEND" ] || append="$append $VM_APPEND"
[ $interactive = 1 ] || append="$append quiet"
# la57=off: with 5-level paging, Linux 7.2 reads "is LA57 on" from the boot CPU's feature bits,
# which identify_cpu() clears and reads again with interrupts on; a timer interrupt in that
# window made KASAN see the per-CPU area's direct-map address as wild (a report at ~0.007 s,
# before ruvm loads; 5 of 18 debug boots three at a time on a loaded host). 4-level paging has
# no such window.
qemu=(qemu-system-x86_64 -machine q35,kernel-irqchip=split -cpu max,la57=off -smp 2 -m "$VM_MEM"
	-device intel-iommu,intremap=on -nographic -no-reboot
	-kernel "$KERNEL_IMAGE" -initrd "$work/initramfs.cpio.gz" -append "$append")
for ((i = 0; i < VM_GPUS; i++)); do qemu+=(-device edu); done
# With -icount ...,sleep=off the virtual clock jumps over idle time, so the edu engine's 100 ms
# completion timer costs no wall time (but the vCPUs then share one host thread).
[ -z "$VM_ICOUNT" ] || qemu+=(-icount "$VM_ICOUNT")

if [ $interactive = 1 ]; then
	exec "${qemu[@]}"
fi

log=${VM_LOG:-$work/console.log}
mkdir -p "$(dirname "$log")"
set +e
if [ "$VM_VERBOSE" = 1 ]; then
	timeout -k 5 "$VM_TIMEOUT" "${qemu[@]}" < /dev/null 2>&1 | tee "$log"
	qrc=${PIPESTATUS[0]}
else
	# A guest whose /init has not said it booted within VM_BOOT_WAIT seconds hung before
	# userspace (seen once in many make check runs: nothing past the boot ROM on a busy host):
	# it is booted once more, and said so. So is one whose kernel died before /init (no ruvm
	# code has run then: seen once, a NULL dereference in mask_ioapic_irq at 0.03 s under TCG
	# on a host running a whole make check); what it printed is said first.
	for attempt in 1 2; do
		timeout -k 5 "$VM_TIMEOUT" "${qemu[@]}" < /dev/null > "$log" 2>&1 &
		qpid=$!
		booted=0
		for ((s = 0; s < VM_BOOT_WAIT; s++)); do
			if grep -aq "RUVM-BOOTED-$nonce" "$log" || ! kill -0 "$qpid" 2> /dev/null; then
				booted=1
				break
			fi
			sleep 1
		done
		if [ $booted = 0 ] && [ $attempt = 1 ]; then
			kill "$qpid" 2> /dev/null
			wait "$qpid"
			echo "vm: the guest did not reach /init within $VM_BOOT_WAIT s; booting it again" >&2
			continue
		fi
		if [ $attempt = 1 ] && ! grep -aq "RUVM-BOOTED-$nonce" "$log"; then
			# The guest stopped before /init said it booted: its kernel died on the way.
			wait "$qpid"
			echo "vm: the guest's kernel died before /init (before any ruvm code ran); booting it again. It said:" >&2
			tr -d '\r' < "$log" | grep -aE 'Kernel panic|BUG:|Oops|RIP:|KASAN' | head -n 6 | sed 's/^/vm:   /' >&2
			continue
		fi
		# The command must keep printing: a guest silent for VM_QUIET_LIMIT seconds is stuck
		# (its cases say when each begins, the long ones how far they are), whatever its
		# total time.
		if [ "$VM_QUIET_LIMIT" -gt 0 ]; then
			size=-1 still=0
			while kill -0 "$qpid" 2> /dev/null; do
				sleep 2
				now=$(stat -c %s "$log")
				if [ "$now" != "$size" ]; then
					size=$now still=0
				else
					still=$((still + 2))
				fi
				if [ $still -ge "$VM_QUIET_LIMIT" ]; then
					quiet=1
					kill "$qpid" 2> /dev/null
					break
				fi
			done
		fi
		wait "$qpid"
		qrc=$?
		break
	done
fi
set -e
tr -d '\r' < "$log" > "$work/log"

# Lines between the BEGIN and END markers of a section. Markers are matched anywhere in a line:
# a kernel message printed from another CPU may share the line.
section() {
	awk -v b="RUVM-$1-BEGIN-$nonce" -v e="RUVM-$1-END-$nonce" \
		'index($0, e) { f = 0 } f { print } index($0, b) { f = 1 }' "$work/log"
}

# The command's output. With `quiet`, the only kernel lines among it are errors, which belong there.
[ "$VM_VERBOSE" = 1 ] || section OUT

# Kernel problems: any of these in the kernel log fails the run, whatever the command said.
# (DMA-API debug errors are counted by its error_count, read separately: its log lines also
# include informational ones.)
# A line the test declared expected (VM_EXPECT_KMSG) is listed but not counted.
patterns='(WARNING:|BUG:|BUG at|Oops|general protection fault|Kernel panic|UBSAN:|KASAN|'
patterns+='possible recursive locking|inconsistent lock state|DEBUG_LOCKS_WARN_ON|'
patterns+='suspected memory leak|INFO: task .* blocked for more than|detected stalls|'
patterns+='Out of memory|oom-kill)'

# The case the guest was in when it was stopped (the selftests say when each begins).
running() {
	local c
	c=$(grep -a '^# running ' "$work/log" | tail -n 1 | sed 's/^# running //')
	echo "${c:-(no selftest case had begun)}"
}

if ! grep -aq "RUVM-END-$nonce rc=" "$work/log"; then
	if [ "$quiet" = 1 ]; then
		echo "vm: FAIL: the guest printed nothing for $VM_QUIET_LIMIT s, in case $(running); console tail:" >&2
		tail -n 30 "$work/log" >&2
		exit 124
	fi
	if [ "$qrc" -eq 124 ] || [ "$qrc" -eq 137 ]; then
		echo "vm: FAIL: the guest did not finish within $VM_TIMEOUT s, in case $(running); console tail:" >&2
		tail -n 30 "$work/log" >&2
		exit 124
	fi
	echo "vm: FAIL: the guest stopped without reporting (QEMU exit $qrc)" >&2
	if grep -aqE "$patterns" "$work/log"; then
		echo "vm: the kernel reported:" >&2
		grep -aE -A12 "$patterns" "$work/log" | head -n 60 | sed 's/^/  | /' >&2
	else
		tail -n 40 "$work/log" | sed 's/^/  | /' >&2
	fi
	exit 125
fi
if grep -aq "RUVM-INSMOD-FAILED-$nonce" "$work/log"; then
	echo "vm: FAIL: insmod ruvm.ko $VM_MODARGS failed; console tail:" >&2
	tail -n 20 "$work/log" >&2
	exit 125
fi
rc=$(sed -n "s/.*RUVM-END-$nonce rc=\([0-9]*\).*/\1/p" "$work/log" | tail -n 1)

# A line the test declared expected (VM_EXPECT_KMSG) is listed but not counted.
section DMESG > "$work/dmesg"
bad=$(grep -aE "$patterns" "$work/dmesg" || true)
if [ -n "$VM_EXPECT_KMSG" ] && [ -n "$bad" ]; then
	expected=$(grep -aE "$VM_EXPECT_KMSG" <<< "$bad" || true)
	[ -z "$expected" ] || sed 's/^/vm: expected: /' <<< "$expected" >&2
	bad=$(grep -avE "$VM_EXPECT_KMSG" <<< "$bad" || true)
fi
problems=()
[ -z "$bad" ] || problems+=("kernel log:"$'\n'"$bad")
leaks=$(section KMEMLEAK)
[ -z "$leaks" ] || problems+=("kmemleak:"$'\n'"$leaks")
dma=$(sed -n "s/.*RUVM-DMA-ERRORS-$nonce \([0-9]*\).*/\1/p" "$work/log" | tail -n 1)
[ -z "$dma" ] || [ "$dma" -eq 0 ] || problems+=("DMA-API debug: $dma errors")
grep -aq "RUVM-RMMOD-FAILED-$nonce" "$work/log" && problems+=("rmmod ruvm failed")
audit_rc=$(sed -n "s/.*RUVM-AUDIT-END-$nonce rc=\([0-9]*\).*/\1/p" "$work/log" | tail -n 1)
[ "${audit_rc:-1}" -eq 0 ] || problems+=("ruvmctl audit:"$'\n'"$(section AUDIT)")

kml="not in this kernel"
grep -aq "RUVM-KMEMLEAK-BEGIN-$nonce" "$work/log" && kml=$([ -z "$leaks" ] && echo clean || echo LEAKS)
echo "vm: verdict: kernel log $([ -z "$bad" ] && echo clean || echo 'has errors');" \
	"ruvm audit $([ "${audit_rc:-1}" -eq 0 ] && echo clean || echo LEAKS);" \
	"kmemleak ${kml}; DMA-API debug errors ${dma:-not in this kernel};" \
	"rmmod $(grep -aq "RUVM-RMMOD-FAILED-$nonce" "$work/log" && echo FAILED || echo ok);" \
	"command exit $rc" >&2
if ((${#problems[@]})); then
	echo "vm: FAIL: the kernel reported problems (command exit $rc):" >&2
	printf '%s\n' "${problems[@]}" | sed 's/^/  /' >&2
	# Enough context to debug without the full log.
	grep -aE -A12 "$patterns" "$work/dmesg" | head -n 80 | sed 's/^/  | /' >&2 || true
	exit 3
fi
exit "$rc"
