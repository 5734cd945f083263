#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Regenerate a distribution kernel's Rust build files, which its headers package lacks
# (rust/*.rmeta, libmacros.so, scripts/target.json, ...), so that out-of-tree Rust modules can
# be built for it. Shared by scripts/stock.sh (the project's tests, in a trixie chroot) and
# the DKMS package (on a user's host), so both build the same way.
#
#   kbuild-rust.sh check HEADERS          is HEADERS' kernel Rust-enabled? (exit 1 and say why)
#   kbuild-rust.sh make-args HEADERS REL  the make arguments that kernel was built with
#   kbuild-rust.sh prepare SRC HEADERS OUT REL
#
# HEADERS is the kernel's headers directory (its .config and Module.symvers), SRC the same
# version's full source tree, OUT an empty directory, REL the kernel release. prepare leaves
# OUT/kdir: the headers directory completed with the Rust build files (what Ubuntu ships as
# linux-lib-rust), a KDIR for `make -C OUT/kdir M=...` that no longer needs SRC. Nothing is
# trusted: olddefconfig must leave the .config unchanged (same compiler, bindgen and source as
# the kernel's own build) and every Rust crate hash in Module.symvers must be carried by the
# regenerated crates (the same rustc), else it fails with what differs.
set -euo pipefail

die() { echo "ruvm: $*" >&2; exit 1; }

config_value() { sed -n "s/^$1=\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$2" | head -n 1; }

check() {
	local hdr=$1
	[ -f "$hdr/.config" ] || die "no kernel headers at $hdr (install the linux-headers package of that kernel)"
	if ! grep -q '^CONFIG_RUST=y' "$hdr/.config"; then
		die "the kernel at $hdr has no Rust support (CONFIG_RUST is not set): ruvm is a Rust module and needs a Rust-enabled kernel, such as Debian's linux-image-7.2 from trixie-backports"
	fi
}

# The compiler the kernel was built with, from its .config: GCC builds name their gcc, LLVM
# builds need LLVM=1.
make_args() {
	local hdr=$1 rel=$2 cc arch
	cc=$(config_value CONFIG_CC_VERSION_TEXT "$hdr/.config" | awk '{ print $1 }')
	case "$(uname -m)" in
	x86_64) arch=x86_64 ;;
	aarch64) arch=arm64 ;;
	*) die "unsupported architecture $(uname -m)" ;;
	esac
	if grep -q '^CONFIG_CC_IS_CLANG=y' "$hdr/.config"; then
		echo "ARCH=$arch LLVM=1 KERNELRELEASE=$rel"
	else
		[ -n "$cc" ] || die "$hdr/.config does not name its compiler"
		command -v "$cc" >/dev/null || die "the kernel was built with $cc, which is not installed"
		echo "ARCH=$arch CC=$cc HOSTCC=$cc KERNELRELEASE=$rel"
	fi
}

prepare() {
	local src=$1 hdr=$2 out=$3 rel=$4 args o
	check "$hdr"
	args=$(make_args "$hdr" "$rel")
	[ -f "$src/Makefile" ] || die "no kernel source at $src"
	[ -f "$hdr/Module.symvers" ] || die "$hdr has no Module.symvers"
	o=$out/o
	rm -rf "$o" "$out/kdir"
	mkdir -p "$o"
	cp "$hdr/.config" "$o/.config"
	# shellcheck disable=SC2086
	make -s -C "$src" O="$o" $args olddefconfig
	if ! diff -u <(grep -v '^#' "$hdr/.config" | sed '/^$/d') <(grep -v '^#' "$o/.config" | sed '/^$/d') >&2; then
		die "olddefconfig changed the kernel's .config (above): this toolchain or source is not the one $rel was built with (its .config: $(config_value CONFIG_RUSTC_VERSION_TEXT "$hdr/.config"), $(config_value CONFIG_BINDGEN_VERSION_TEXT "$hdr/.config"), $(config_value CONFIG_CC_VERSION_TEXT "$hdr/.config"))"
	fi
	# shellcheck disable=SC2086
	make -C "$src" O="$o" $args -j"$(nproc)" modules_prepare > "$out/prepare.log" 2>&1 ||
		{ tail -n 40 "$out/prepare.log" >&2; die "modules_prepare failed (log: $out/prepare.log)"; }
	local crates='(kernel|pin_init|ffi|core|alloc|compiler_builtins|bindings|uapi|macros)'
	local want have missing
	want=$(grep -oE "Cs[0-9A-Za-z]+_[0-9]+$crates" "$hdr/Module.symvers" | sort -u || true)
	[ -n "$want" ] || die "no Rust symbols in $hdr/Module.symvers"
	have=$(nm "$o"/rust/*.o 2>/dev/null | grep -oE "Cs[0-9A-Za-z]+_[0-9]+$crates" | sort -u || true)
	missing=$(comm -23 <(echo "$want") <(echo "$have"))
	[ -z "$missing" ] || die "crate hashes in Module.symvers that the regenerated crates do not carry (another rustc?): $(echo $missing)"

	# The KDIR: the headers as they are, their scripts/ as a real directory (target.json goes
	# in it), and the Rust crates' metadata, proc macros and generated sources (no objects:
	# they are linked into the kernel already).
	local k=$out/kdir
	cp -a "$hdr" "$k"
	# Relative links (Debian's scripts/ and tools/ point into linux-kbuild) made absolute: the
	# copy lives elsewhere.
	local l t
	while IFS= read -r l; do
		t=$(readlink "$l")
		[ "${t#/}" != "$t" ] || ln -sfn "$(readlink -f "$hdr/${l#"$k"/}")" "$l"
	done < <(find "$k" -type l)
	printf 'KBUILD_OUTPUT := $(CURDIR)\ninclude %s\n' "$(sed -n 's/^include //p' "$hdr/Makefile")" > "$k/Makefile"
	if [ -L "$k/scripts" ]; then
		rm "$k/scripts"
		cp -a "$(readlink -f "$hdr/scripts")" "$k/scripts"
	fi
	[ ! -f "$o/scripts/target.json" ] || cp "$o/scripts/target.json" "$k/scripts/"
	(cd "$o" && find rust -type f ! -name '*.o' ! -name '.*.cmd' ! -name '*.d' | cpio -pdm --quiet "$k")
	rm -rf "$o"
	echo "ruvm: $rel's Rust build files regenerated in $k; crate hashes match Module.symvers: $(echo $want)" >&2
}

case "${1:-}" in
check) check "${2:?headers}" ;;
make-args) make_args "${2:?headers}" "${3:?release}" ;;
prepare) prepare "${2:?source}" "${3:?headers}" "${4:?out}" "${5:?release}" ;;
*) die "usage: $0 check HEADERS | make-args HEADERS REL | prepare SRC HEADERS OUT REL" ;;
esac
