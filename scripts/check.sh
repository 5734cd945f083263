#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# make check: every test of ruvm. The builds every test needs, then the rest as jobs
# (CHECK_JOBS at once, default 3): the host checks, and the guest runs (the runner's own failure
# modes, the guest suites on the fast, debug and stock kernels, the fuzzer, a tiny bench). Ends
# with "N passed, N failed[, N skipped]" and exits 1 on any failure. Logs are in build/check/.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
. "$here/env.sh"

CHECK_JOBS=${CHECK_JOBS:-3}
if ! [[ "$CHECK_JOBS" =~ ^[1-9][0-9]?$ ]]; then
	echo "make check: CHECK_JOBS must be a number from 1 to 99, not '$CHECK_JOBS'" >&2
	exit 2
fi
logs=$top/build/check
rm -rf "$logs"
mkdir -p "$logs"
pass=0 fail=0 skip=0
t_start=$SECONDS

logname() { printf '%s/%s.log' "$logs" "$(printf '%s' "$1" | tr -c 'a-zA-Z0-9_.-' '_')"; }

passed() { pass=$((pass + 1)); printf 'ok    %s\n' "$1"; }
failed() {
	fail=$((fail + 1))
	printf 'FAIL  %s\n' "$1"
	[ -z "${2:-}" ] || tail -n 30 "$2" | sed 's/^/  | /'
}

finish() {
	echo "# make check took $(((SECONDS - t_start) / 60)) min $(((SECONDS - t_start) % 60)) s; logs in $logs"
	local line="$pass passed, $fail failed"
	[ "$skip" -eq 0 ] || line="$line, $skip skipped"
	echo "$line"
	[ "$fail" -eq 0 ]
	exit $?
}

# A step that is one test: passes when the command exits 0.
step() {
	local name=$1 log t=$SECONDS
	shift
	log=$(logname "$name")
	if "$@" > "$log" 2>&1; then
		passed "$name ($((SECONDS - t)) s)"
	else
		failed "$name ($((SECONDS - t)) s; log: $log)" "$log"
		return 1
	fi
}

# Something every later test needs: a failure ends the run.
prerequisite() {
	step "$@" || finish
}

# --- build what the tests need ------------------------------------------------------------------
prerequisite "deps: packages and bindgen" "$here/deps.sh"
# The stock kernel's trixie chroot is mostly downloads and unpacking: made beside the kernel
# builds (which keep the cores busy), not after them. Its step below waits for it (a lock).
"$here/stock.sh" chroot > "$logs/stock-chroot.log" 2>&1 &
prerequisite "build: fast kernel" "$here/kernel.sh" build fast
prerequisite "build: debug kernel" "$here/kernel.sh" build debug
# Built in the cache's target directory, where the host checks' cargo test builds the same
# dependencies for the same target and profile (compiled once, and not again in a fresh clone),
# then put where the guests take it from.
RUVMCTL=$top/tools/ruvmctl/target/x86_64-unknown-linux-gnu/release/ruvmctl
prerequisite "build: ruvmctl (static)" bash -c "cd '$top/tools/ruvmctl' &&
	CARGO_TARGET_DIR='$RUVM_CACHE/cargo/ruvmctl' cargo build --release --locked &&
	install -D '$RUVM_CACHE/cargo/ruvmctl/x86_64-unknown-linux-gnu/release/ruvmctl' '$RUVMCTL'"
file "$RUVMCTL" | grep -q 'static' || { failed "ruvmctl is not statically linked"; finish; }

# --- host ---------------------------------------------------------------------------------------
# Module builds count as tests: they must be free of rustc and clippy warnings.
module_clean() {
	"$here/module.sh" "$1" CLIPPY=1 > "$logs/module-$1.out" 2>&1
	local rc=$?
	cat "$logs/module-$1.out"
	[ $rc -eq 0 ] || return 1
	! grep -E '^(warning|error)' "$logs/module-$1.out"
}
step "host: module builds clippy-clean for the fast kernel" module_clean fast || finish
step "host: module builds clippy-clean for the debug kernel" module_clean debug || finish
# Debian's stock kernel's builds (its Rust build files, the module, the MSRV lints) are steps of
# the jobs below, beside the guest runs, rather than before them: nothing else waits for them.

step "host: uapi header is valid C with the documented layout (selftests build)" \
	"$here/selftests.sh" "$top/build/selftests/ruvm_abi_test" || finish

# The host checks that nothing else waits for (layouts, formatting, lints, cargo test): run as
# the first job, beside the guest runs.
host_checks() {
	for f in fast debug; do
		step "host: the kernel crate's struct layouts match C ($f kernel)" "$here/layout-check.sh" "$f"
	done

	ksrc=$("$here/kernel.sh" source)
	step "host: module source is rustfmt-clean" \
		bash -c "find '$top/rust' -name '*.rs' -print0 | xargs -0 /usr/bin/rustfmt --check --edition 2021 --config-path '$ksrc/.rustfmt.toml'"
	# The userspace crates: formatting, lints, and cargo test (each test counts). Their lint and test
	# builds go to a target directory in the cache (nothing of them runs in a guest), so that a
	# fresh clone compiles only the two crates themselves, not their dependencies again; cargo
	# locks it, and rebuilds whatever another checkout left different.
	for crate in ruvmctl libruvm; do
		step "host: $crate is rustfmt-clean" bash -c "cd '$top/tools/$crate' && cargo fmt --check"
		step "host: $crate is clippy-clean" \
			env CARGO_TARGET_DIR="$RUVM_CACHE/cargo/$crate" \
			bash -c "cd '$top/tools/$crate' && cargo clippy --release --locked --all-targets -- -D warnings"
		log=$(logname "host: cargo test ($crate)")
		(cd "$top/tools/$crate" && CARGO_TARGET_DIR="$RUVM_CACHE/cargo/$crate" cargo test --release --locked) > "$log" 2>&1
		rc=$?
		n_ok=$(sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\1/p' "$log" | paste -sd+ | bc)
		n_bad=$(sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\2/p' "$log" | paste -sd+ | bc)
		pass=$((pass + ${n_ok:-0}))
		fail=$((fail + ${n_bad:-0}))
		if [ $rc -eq 0 ] && [ "${n_ok:-0}" -gt 0 ]; then
			printf 'ok    host: cargo test, %s (%s tests)\n' "$crate" "$n_ok"
		else
			failed "host: cargo test, $crate (exit $rc, ${n_bad:-?} failed)" "$log"
		fi
	done
	step "host: libruvm's example builds" bash -c "cd '$top/tools/libruvm' &&
		CARGO_TARGET_DIR='$RUVM_CACHE/cargo/libruvm' cargo build --release --locked --examples"
	# In the trixie chroot (made at the start): rustc 1.85, the minimum supported version. Cargo's
	# home (the crates it downloads) is in the cache, not in the chroot, which the DKMS test
	# beside it snapshots.
	step "host: ruvmctl and libruvm build clippy-clean with rustc 1.85 (the MSRV)" \
		"$here/stock.sh" run bash -c 'for c in ruvmctl libruvm libruvm/capi; do
			(cd /ruvm/tools/$c && CARGO_HOME=/cargo-target/home CARGO_TARGET_DIR=/cargo-target/msrv \
				cargo clippy --release --locked --all-targets -- -D warnings) || exit 1; done'
}

# libruvm's C API (tools/libruvm/capi): formatting and lints, the library and its example (a C
# program linked statically against libruvm.a), then the example in a guest with a simulated
# GPU. Its cargo target is in the cache, as the other crates' are.
c_api() {
	local target=$RUVM_CACHE/cargo/capi
	step "host: libruvm's C API is rustfmt- and clippy-clean" bash -c "cd '$top/tools/libruvm/capi' &&
		cargo fmt --check && CARGO_TARGET_DIR='$target' cargo clippy --release --locked -- -D warnings" || return 0
	step "host: libruvm's C API builds; its C example links statically" \
		make -C "$top" --no-print-directory CAPI_TARGET="$target" libruvm || return 0
	step "guest (fast kernel): libruvm's C examples (allocator, pinned heap) fill, read back, give back" \
		env VM_GPUS=0 VM_MODARGS=sim_gpus=1 \
		VM_EXTRA="$top/build/examples/alloc_example $top/build/examples/heap_example" \
		CMD="/extra/alloc_example && /extra/heap_example" "$here/vm.sh" fast
}
# --- the guests' time limits, derived from this machine ------------------------------------------
# A guest run fails for time only at a limit this run derives, never at a figure tuned on another
# machine: a probe guest (the fast kernel: boot, load ruvm, run `true`, unload, audit) is timed
# here now against REF_GUEST_MS, the same probe on an idle 2-core machine of the project's kind
# (2.30 and 2.31 s, 2026-11-28);
# their ratio (at least 1) is this machine's slowness. Every run's limits are its figures on that
# machine times the slowness times CHECK_JOBS (the guests that share the cores at once):
# - the quiet limit (QUIET_S): a guest that prints nothing that long is stuck, and the runner
#   says in which case (each case says when it begins, a long one how far it is);
# - the hard limit (each job's own reference figure, about twice its longest time seen there).
REF_GUEST_MS=2300
QUIET_S=300
probe_ms() {
	local t0 t1
	t0=$(date +%s%N)
	env CMD=true "$here/vm.sh" fast > "$logs/speed-probe.log" 2>&1 || return 1
	t1=$(date +%s%N)
	echo $(((t1 - t0) / 1000000))
}
# Twice, the faster counting: the first also reads the kernel, QEMU and the files from disk.
if ! guest_ms=$(probe_ms) || ! again_ms=$(probe_ms); then
	failed "the speed probe guest failed" "$logs/speed-probe.log"
	finish
fi
[ "$again_ms" -ge "$guest_ms" ] || guest_ms=$again_ms
# Thousandths: the slowness, at least 1.
slowness=$((guest_ms * 1000 / REF_GUEST_MS))
[ "$slowness" -ge 1000 ] || slowness=1000
# limit SECONDS: a reference figure scaled to this machine and this run's concurrency.
limit() { echo $((($1 * slowness * CHECK_JOBS + 999) / 1000)); }
export VM_QUIET_LIMIT
VM_QUIET_LIMIT=$(limit "$QUIET_S")
echo "# guest speed: the probe took $guest_ms ms ($REF_GUEST_MS ms on the reference machine);" \
	"limits x$((slowness / 1000)).$((slowness % 1000 / 100)) x$CHECK_JOBS jobs: quiet $VM_QUIET_LIMIT s"

# --- guest runs, several at once ----------------------------------------------------------------
# Every guest run below is a job. A guest keeps about one host core busy at most (one vCPU runs
# the test, the other mostly idles; the fast kernel's guests wait on timers much of the time), so
# CHECK_JOBS=3 (the default) runs three at once: on 2 cores a fresh-clone make check took 11-15
# min instead of 19-24 one at a time (CHECK_JOBS=1). Guests boot without 5-level paging
# (tools/vm/run.sh): with it, debug kernels booting side by side hit a KASAN report in early
# boot. Each job's lines are printed, and its counts added, in the order it was queued (the
# longest first, so that none is left to run alone at the end).
jobs_dir=$logs/jobs
mkdir -p "$jobs_dir"
njobs=0 printed=0

# Prints the jobs that are done, in order, up to the first one still running.
flush_jobs() {
	local p f s
	while [ $printed -lt $njobs ] && [ -e "$jobs_dir/$printed.counts" ]; do
		cat "$jobs_dir/$printed.out"
		if read -r p f s < "$jobs_dir/$printed.counts" && [ -n "$s" ]; then
			pass=$((pass + p)) fail=$((fail + f)) skip=$((skip + s))
		else
			failed "job $printed (see $jobs_dir/$printed.out) did not report its counts"
		fi
		printed=$((printed + 1))
	done
}

# job FUNCTION ARGS...: runs FUNCTION ARGS in the background once fewer than CHECK_JOBS run.
job() {
	while [ "$(jobs -rp | wc -l)" -ge "$CHECK_JOBS" ]; do
		wait -n
		flush_jobs
	done
	local n=$njobs
	njobs=$((njobs + 1))
	(
		pass=0 fail=0 skip=0
		"$@" > "$jobs_dir/$n.out" 2>&1
		echo "$pass $fail $skip" > "$jobs_dir/$n.counts.tmp"
		mv "$jobs_dir/$n.counts.tmp" "$jobs_dir/$n.counts"
	) &
}

# Waits for every job and prints what is left.
wait_jobs() {
	while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
		wait -n
		flush_jobs
	done
	wait
	flush_jobs
}

# The guest runner's own failure modes: each runs a guest that does something wrong on purpose;
# the runner must report it.
runner_check() {
	local name=$1 want_rc=$2 want_text=$3 out rc
	shift 3
	out=$(logname "$name")
	local t=$SECONDS
	env "$@" "$here/vm.sh" fast > "$out" 2>&1
	rc=$?
	if [ "$rc" -eq "$want_rc" ] && { [ -z "$want_text" ] || grep -q -- "$want_text" "$out"; }; then
		passed "$name ($((SECONDS - t)) s)"
	else
		echo "runner exit $rc, wanted $want_rc and output matching '$want_text'" >> "$out"
		failed "$name ($((SECONDS - t)) s; log: $out)" "$out"
	fi
}
runner_checks() {
	runner_check "runner: the command's exit status comes back" 7 "" CMD='exit 7'
	runner_check "runner: a failing selftest fails the run" 1 "not ok .* planted_failure" \
		CMD='ruvmctl selftest --plant-failure --filter planted_failure'
	runner_check "runner: a kernel WARN fails the run although the command passed" 3 "WARNING:" \
		VM_MODARGS=enable_test_ioctls=1 CMD='ruvmctl test-plant warn'
	# A busy loop: under a skip-idle clock (VM_ICOUNT) a sleeping guest is not stuck.
	runner_check "runner: a hung guest fails the run" 124 "did not finish" VM_TIMEOUT=20 \
		CMD='while :; do :; done'
	# A guest that goes silent is stopped at the quiet limit, naming the case it was in.
	runner_check "runner: a silent guest is stopped, the case it was in named" 124 \
		"printed nothing for 20 s, in case planted_silent_case" VM_QUIET_LIMIT=20 \
		CMD='echo "# running planted_silent_case"; sleep 100000'
	runner_check "runner: a failed insmod fails the run" 125 "insmod" VM_MODARGS=max_alloc_mib=banana CMD=true
}

# The guest suites: KTAP results count one by one; a run whose kernel reported a problem adds a
# failure. 768 MiB guests: small enough that "allocate more than the machine has" fits under the
# default per-mem limit (1 GiB), so that test runs.
guest_suite() {
	local name=$1 flavour=$2 out rc t=$SECONDS
	shift 2
	out=$(logname "guest-$name")
	# The hard limit by flavour (a job may give its own): the quiet limit finds a stuck case.
	local hard=600
	[ "$flavour" = fast ] || hard=1200
	env VM_MEM=768M VM_TIMEOUT="$(limit $hard)" SELFTESTS="$top/build/selftests/ruvm_abi_test $top/selftests/module_lifecycle.sh $top/selftests/run_all.sh $top/selftests/reload.sh" \
		"$@" "$here/vm.sh" "$flavour" > "$out" 2>&1
	rc=$?
	local p f s
	p=$(grep -cE '^ok [0-9]+ ' "$out" | tr -d ' ')
	s=$(grep -cE '^ok [0-9]+ .*# SKIP' "$out" | tr -d ' ')
	f=$(grep -cE '^not ok [0-9]+ ' "$out" | tr -d ' ')
	pass=$((pass + p - s))
	skip=$((skip + s))
	fail=$((fail + f))
	printf '%s  guest (%s): %d passed, %d failed, %d skipped (%d s)\n' \
		"$([ "$f" -eq 0 ] && [ "$rc" -eq 0 ] && echo 'ok  ' || echo FAIL)" "$name" $((p - s)) "$f" "$s" $((SECONDS - t))
	grep -E '^not ok |^ok .*# SKIP' "$out" | sed 's/^/  | /'
	case $rc in
	0) [ "$p" -gt 0 ] || failed "guest ($name): no test ran" "$out" ;;
	1) [ "$f" -gt 0 ] || failed "guest ($name): a suite failed without a KTAP result" "$out" ;;
	*) failed "guest ($name): the run failed (runner exit $rc)" "$out" ;;
	esac
}

# Debian's unmodified stock kernel with the ruvm.ko its own toolchain built: its Rust build files
# regenerated with its own toolchain in a trixie chroot (checked against its .config and
# Module.symvers), then ruvm.ko built there with rustc 1.85.1 and gcc-14, clippy 1.85 clean (the
# same source, toolchain and flags as the DKMS package's build, which dkms_test checks beside).
stock_suite() {
	if ! step "build: Debian's stock kernel's Rust build files (trixie chroot, crate hashes checked)" \
		"$here/stock.sh" prepare ||
		! step "host: module builds clippy-clean for Debian's stock kernel (rustc 1.85.1, gcc-14)" \
			module_clean stock; then
		failed "guest (Debian's stock kernel): not run, its module did not build"
		return
	fi
	# edu GPUs and simulated GPUs in one run: every suite, the C ABI test, the reload.
	guest_suite "Debian's stock kernel" stock RUVM_KO="$top/build/stock/rust/ruvm.ko" \
		VM_MODARGS="sim_gpus=2" CMD=/selftests/run_all.sh
}

# make deb's package in a throwaway trixie chroot: dependencies, a DKMS signing key, install
# (DKMS builds and signs ruvm.ko for the stock kernel), purge, nothing left. A job of its own
# beside the stock kernel's suite: the longest of the host steps.
dkms_test() {
	step "DKMS: make deb's package installs, builds and signs ruvm.ko for the stock kernel, purges clean" \
		"$here/deb-test.sh"
}

# The fuzzer: one counted result, its summary line shown. A new seed each run, printed.
fuzz_run() {
	local name=$1 flavour=$2 out rc t=$SECONDS
	shift 2
	out=$(logname "guest-$name")
	env "$@" "$here/vm.sh" "$flavour" > "$out" 2>&1
	rc=$?
	if [ $rc -eq 0 ]; then
		passed "guest ($name): $(grep -m1 -E '^fuzz: seed .* operations in ' "$out" | sed 's/^fuzz: //') ($((SECONDS - t)) s)"
	else
		failed "guest ($name): runner exit $rc ($((SECONDS - t)) s; log: $out)" "$out"
	fi
}

# make bench in a tiny configuration: proves it still runs and writes its files (it reports
# and never asserts a goal, so a slow machine cannot fail it).
bench_check() {
	BENCH_OUT="$logs/bench" BENCH_ARGS="--reps 1 --max-size 16M" VM_MEM=1G "$here/bench.sh" &&
		for f in results.json table.json scaling.svg; do [ -s "$logs/bench/$f" ] || return 1; done &&
		grep -q '</svg>' "$logs/bench/scaling.svg"
}

# The audit's own tests: the counters against the real objects, and planted leaks of every class
# reported exactly (test ioctls on, per-object reports on). kmemleak's part runs on debug.
# kmemleak's report of the mem leaked for good is expected there, and only there.
plant=(VM_MODARGS="enable_test_ioctls=1 leak_checker=2" CMD="ruvmctl selftest --filter audit_ --filter gpu_iommu"
	VM_EXPECT_KMSG="kmemleak: [0-9]+ new suspected memory leaks")
# A host GPU: the first edu device named by host_gpus, DMA-mapped for but never bound.
host=(VM_MODARGS="host_gpus=0000:00:03.0" CMD="ruvmctl selftest --filter gpu_ --filter vidmem_")
# Simulated GPUs only (no edu devices): the GPU suite on faux devices, with the test ioctls on
# for the engine's fault test.
sim=(VM_GPUS=0 VM_MODARGS="sim_gpus=2 enable_test_ioctls=1"
	CMD="ruvmctl selftest --filter gpu_ --filter vidmem_ --filter audit_counts --filter hard_ --filter fault_ --filter pool_ --filter adv_ --filter stream_ --filter salloc_ --filter ualloc_ --filter ptr_ --filter ipc_ --filter dmabuf_ --filter register_")

# The fault sweeps' debug guests boot with every slab cache marked for failslab but kmemleak's
# own: the sweeps then fail only the other caches' allocations (kmemleak's records of each
# allocation, allocated __GFP_NOWARN from a reserve when that fails, were half the sites and
# all absorbed; see Documentation/testing.rst). In those guests no slab cache is merged with
# another (a marked cache never is); the other debug guests keep the kernel's merging.
spare_kmemleak='slab_debug=A;-,kmemleak_object,kmemleak_scan_area'
# The longest first. The debug kernel's suite: one guest with both kinds of GPU (two edu, two
# simulated) and the test ioctls, as the stock kernel's run (the fast kernel runs each kind on
# its own); every case runs once, on the GPUs it picks. 16 MiB of vidmem per GPU (not 64): the PMM's every-chunk
# checks cost a quarter as much under KASAN, and every vidmem case still fills, splits and
# merges root chunks.
job guest_suite "debug kernel (edu and simulated GPUs)" debug VM_APPEND="$spare_kmemleak" \
	VM_MODARGS="sim_gpus=2 enable_test_ioctls=1 vidmem_mib=16" CMD=/selftests/run_all.sh
# Every failable allocation of a module load failing in turn (debug kernel: kmemleak), with one
# GPU of each kind: a second of the same kind fails the same sites again. About 325 loads,
# 185 of them failed.
job guest_suite "debug kernel, module load fault sweep" debug VM_TIMEOUT="$(limit 1200)" \
	VM_APPEND="$spare_kmemleak" VM_GPUS=1 VM_MODARGS="sim_gpus=1" \
	CMD="RUVM_FAULT_SWEEP_LOAD=1 ruvmctl selftest --filter fault_sweep_module_load"
# Then the DKMS package test (its first run regenerates the stock kernel's Rust build files),
# the host checks, the stock kernel's builds and suite.
job dkms_test
job host_checks
job stock_suite
# What bounds one file: a 64 MiB quota, which a pool's cache counts in (both kernels; the debug
# kernel's run shares the host GPU's guest below).
bounds_params="sim_gpus=1 enable_test_ioctls=1 max_file_mib=64"
bounds_cmd="ruvmctl selftest --filter adv_pool_cache_counts --filter pool_attributes --filter pool_reuse --filter pool_close --filter pool_of_vidmem --filter salloc_reuse_internal_dependencies_when --filter dmabuf_kept --filter dmabuf_import_counts"
# 100,000 operations on the fast kernel; then the debug kernel's checkers (KASAN, lockdep,
# kmemleak, DMA-API debug) under a bounded run: about 200 operations a second there alone, 45 to
# 70 beside the other runs (3,000 to 4,000 in its 60 seconds).
# Its workers unprivileged in a 384 MiB memory cgroup (the resources oracle: kernel memory may
# grow only as far as that group is charged).
# GPU removals there are bounded by 25 s, not 10: a removal unmaps every mem's DMA mappings of the
# GPU, which under KASAN, DMA-API debug and the strict IOMMU took 4.4 s of a 6 s removal alone
# (solo runs: 4.1 to 6.4 s at most; beside the other runs 6.6 s in one). Since the fuzzer also
# allocates and frees on streams (more mems, pending lists with tables), the slowest seen was
# 9.0 s in a make check and 17.4 s in a 300 s run beside three other guests and builds, all of
# it unmapping and page-table work, none of it a wait. Later make checks saw 21.3 s and 34.6 s
# beside the other guests (the same seed alone: 6.2 s), so the bound is 45 s: a removal that
# waits in D state is still the hung-task report's (30 s, a kernel log the verdict fails on),
# and one that waits for ever still goes past this one.
job fuzz_run "debug kernel, fuzzer" debug VM_TIMEOUT=$((60 + $(limit 600))) VM_MODARGS="sim_gpus=2 enable_test_ioctls=1" \
	CMD="ruvmctl fuzz --ops 100000 --duration 60 --unbind --removal-bound 45 --kill --max-size 256K --memcg 384M --unprivileged"
job guest_suite "debug kernel, planted leaks" debug "${plant[@]}"
job guest_suite "fast kernel" fast CMD=/selftests/run_all.sh
# On the debug kernel, the cases a host GPU changes (the rest ran there with edu GPUs above),
# then the bounds of one file (below) in the same guest: ruvm reloaded without the edu devices.
debug_host_cmd="ruvmctl selftest --filter gpu_host --filter gpu_list --filter gpu_dma --filter vidmem_chunk --filter vidmem_mappings"
job guest_suite "debug kernel, host GPU; then max_file_mib=64" debug VM_MODARGS="host_gpus=0000:00:03.0" \
	CMD="$debug_host_cmd; a=\$?; sh /selftests/reload.sh --no-edu '$bounds_params' $bounds_cmd; b=\$?; if [ \$b -gt 1 ]; then echo \"# reload.sh exited \$b: the reload or its suite did not run\"; exit \$b; fi; [ \$a = 0 ] && [ \$b = 0 ]"
job guest_suite "fast kernel, host GPU" fast "${host[@]}"
job runner_checks
job c_api
job step "guest (fast kernel): make bench runs (tiny configuration)" bench_check
job fuzz_run "fast kernel, fuzzer" fast VM_TIMEOUT=$((240 + $(limit 300))) VM_MODARGS="sim_gpus=2 enable_test_ioctls=1" \
	CMD="ruvmctl fuzz --ops 100000 --duration 240 --unbind --kill --memcg 384M --unprivileged"
# The fuzzer with root workers (privileged commands answer, no cgroup), shorter.
job fuzz_run "fast kernel, fuzzer (root workers)" fast VM_TIMEOUT=$((60 + $(limit 300))) VM_MODARGS="sim_gpus=2 enable_test_ioctls=1" \
	CMD="ruvmctl fuzz --ops 100000 --duration 60 --unbind --kill"
job guest_suite "fast kernel, max_file_mib=64" fast VM_GPUS=0 VM_MODARGS="$bounds_params" CMD="$bounds_cmd"
job guest_suite "fast kernel, planted leaks" fast "${plant[@]}"
job guest_suite "fast kernel, simulated GPUs" fast "${sim[@]}"
# Each way of zeroing chunks forced (the default picks the faster at load): zeroed mems over
# dirty pages, the cgroup charge, pools' fresh and reused chunks.
zeroing_cmd="ruvmctl selftest --filter mem_zero --filter mem_charged --filter pool_reuse"
job guest_suite "fast kernel, zeroing=1 (page allocator)" fast VM_MODARGS=zeroing=1 CMD="$zeroing_cmd"
job guest_suite "fast kernel, zeroing=2 (memset)" fast VM_MODARGS=zeroing=2 CMD="$zeroing_cmd"
# Vidmem storage kept for reuse: none (given back at once, as before it was kept), and more than
# the GPUs have (every root's kept, no more: 256 MiB of two edu GPUs, which memory pressure takes
# back); the default's 8 MiB (the list full, the rest given back) ran in the suites above.
keep_cmd="ruvmctl selftest --filter vidmem_ --filter audit_counts_vidmem"
job guest_suite "fast kernel, vidmem_keep_mib=0" fast VM_MODARGS="enable_test_ioctls=1 vidmem_keep_mib=0" \
	CMD="env RUVM_EXPECT_VIDMEM_KEEP_MIB=0 $keep_cmd"
job guest_suite "fast kernel, vidmem_keep_mib=65534" fast \
	VM_MODARGS="enable_test_ioctls=1 vidmem_mib=128 vidmem_keep_mib=65534" \
	CMD="env RUVM_EXPECT_VIDMEM_KEEP_MIB=65534 $keep_cmd"
# GPUs without vidmem: the errnos of asking one for it, and the GPU page tables in DMA-mapped
# sysmem pages instead of vidmem chunks.
job guest_suite "fast kernel, vidmem_mib=0" fast VM_MODARGS="sim_gpus=1 enable_test_ioctls=1 vidmem_mib=0" \
	CMD='ruvmctl selftest --filter vidmem_none --filter pool_bad_inputs --filter gpu_va'
# A full GPU registry (RUVM_MAX_GPUS: 24 edu and 8 simulated GPUs): the list at its largest, and
# an attach refused with ENOSPC and its line.
job guest_suite "fast kernel, 32 GPUs" fast VM_GPUS=24 VM_MODARGS="sim_gpus=8 vidmem_mib=2" \
	CMD='ruvmctl selftest --filter gpu_list --filter gpu_attach'
# The per-file limit, with a limit small enough to reach.
job guest_suite "fast kernel, max_file_mib=16" fast VM_MODARGS=max_file_mib=16 CMD='ruvmctl selftest --filter mem_size_limits --filter info_limits'
# Allocating more than the guest has needs a per-mem limit above its memory (the derived default
# is half of it).
job guest_suite "fast kernel, max_alloc_mib=1024" fast VM_MODARGS='max_alloc_mib=1024 max_file_mib=4096' CMD='ruvmctl selftest --filter mem_beyond_memory --filter info_limits'
wait_jobs

finish
