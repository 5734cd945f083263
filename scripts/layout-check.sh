#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Check that the kernel crate's view of C structures (bindgen's layouts) matches C's, for the
# structures whose fields the kernel crate reads: every field offset and the size, compiled
# both ways against one flavour's kernel build. Nothing is loaded: two throwaway modules are
# compiled and their constant tables read back from the object files.
#
#   scripts/layout-check.sh FLAVOUR [STRUCT...]     (default: task_struct pci_dev device)
#
# Why: with CONFIG_SCHEDSTATS=n, `struct sched_statistics` is an empty ____cacheline_aligned
# structure; bindgen drops the alignment of an empty structure, so every task_struct field after
# `stats` came out 48 bytes early in Rust (Task::pid() read the wrong word). The test kernels set
# CONFIG_SCHEDSTATS=y, as Debian's kernels do; this check keeps it from coming back.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"

flavour=${1:?usage: layout-check.sh FLAVOUR [STRUCT...]}
shift
structs=("$@")
[ ${#structs[@]} -gt 0 ] || structs=(task_struct pci_dev device)
kdir=$("$here/kernel.sh" dir "$flavour")
gen=$kdir/rust/bindings/bindings_generated.rs
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

# Named fields of bindgen's struct (bitfield units and anonymous members have no C name).
fields() {
	awk -v s="pub struct $1 {" '$0 ~ "^" s { on = 1; next } on && /^}/ { exit } on' "$gen" |
		sed -n 's/^ *pub \([a-z_][a-z0-9_]*\): .*/\1/p' | grep -v '^_bitfield_\|^__bindgen\|^_unused'
}

mkdir -p "$work/c" "$work/rs"
{
	echo '#include <linux/module.h>'
	echo '#include <linux/sched.h>'
	echo '#include <linux/pci.h>'
	echo '#include <linux/device.h>'
	echo 'MODULE_LICENSE("GPL");'
} > "$work/c/off.c"
{
	echo '//! Field offsets.'
	echo 'use kernel::prelude::*;'
	echo 'module! { type: M, name: "rsoff", authors: ["ruvm"], description: "offsets", license: "GPL", }'
	echo 'struct M;'
	echo 'impl kernel::Module for M { fn init(_m: &'"'"'static ThisModule) -> Result<Self> { Ok(M) } }'
} > "$work/rs/rsoff.rs"
for s in "${structs[@]}"; do
	fields "$s" > "$work/$s.fields"
	[ -s "$work/$s.fields" ] || { echo "layout: no struct $s in the bindings" >&2; exit 1; }
	n=$(($(wc -l < "$work/$s.fields") + 1))
	{
		echo "const unsigned long off_$s[] = {"
		# bindgen appends `_` to C names that are Rust keywords (`type` -> `type_`).
		sed -E 's/^(type|match|ref|move|fn|impl|mod|loop|use|where|self|super|crate|box|priv|dyn|async|await|try|override|final|macro|abstract|become|do|typeof|unsized|virtual|yield|gen)_$/\1/' \
			"$work/$s.fields" | sed "s/.*/  offsetof(struct $s, &),/"
		echo "  sizeof(struct $s) };"
	} >> "$work/c/off.c"
	{
		echo "#[no_mangle] #[used] pub static OFF_$s: [usize; $n] = ["
		sed "s/.*/  core::mem::offset_of!(kernel::bindings::$s, &),/" "$work/$s.fields"
		echo "  core::mem::size_of::<kernel::bindings::$s>() ];"
	} >> "$work/rs/rsoff.rs"
done
echo 'obj-m := off.o' > "$work/c/Kbuild"
echo 'obj-m := rsoff.o' > "$work/rs/Kbuild"
for d in c rs; do
	make -s -C "$kdir" M="$work/$d" "${RUVM_KMAKE_ARGS[@]}" modules > "$work/$d.log" 2>&1 ||
		{ cat "$work/$d.log" >&2; exit 1; }
done

# The table `name` (n words) from an object file.
table() {
	local obj=$1 name=$2 n=$3 line sec off bin
	line=$(objdump -t "$obj" | awk -v n="$name" '$NF == n')
	[ -n "$line" ] || { echo "layout: no symbol $name in $obj" >&2; return 1; }
	sec=$(echo "$line" | awk '{print $4}')
	off=$((16#$(echo "$line" | awk '{print $1}')))
	# One file per call: the two tables are read at the same time.
	bin="$work/$name.bin"
	objcopy -O binary --only-section="$sec" "$obj" "$bin"
	od -An -t u8 -w8 -v -j "$off" -N $((n * 8)) "$bin" | tr -d ' '
}

bad=0
for s in "${structs[@]}"; do
	n=$(($(wc -l < "$work/$s.fields") + 1))
	paste -d' ' <(cat "$work/$s.fields"; echo SIZE) <(table "$work/c/off.o" "off_$s" "$n") \
		<(table "$work/rs/rsoff.o" "OFF_$s" "$n") > "$work/$s.cmp"
	# Every row must have both numbers; then they must agree.
	diffs=$(awk 'NF != 3 || $2 != $3' "$work/$s.cmp")
	if [ -n "$diffs" ]; then
		bad=1
		echo "layout: struct $s differs between C and the kernel crate's bindings (field C Rust):"
		echo "$diffs" | head -n 5 | sed 's/^/  /'
	else
		echo "layout: struct $s: $((n - 1)) fields and the size agree"
	fi
done
exit $bad
