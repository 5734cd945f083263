#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Fetch the pinned linux-source-7.2 and build one flavour of the test kernel.
#
#   scripts/kernel.sh build FLAVOUR   build (or reuse) the flavour; prints nothing else on a hit
#   scripts/kernel.sh dir FLAVOUR     print the flavour's build directory (the KDIR for modules)
#
# FLAVOUR is "fast" or "debug". The build lives in $RUVM_CACHE/build/<flavour>-<key>, where key
# hashes the kernel version, the config fragments and the toolchain versions: a change to any of
# them gives a new build, an unchanged one costs nothing. Clones share the cache.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
. "$here/env.sh"

die() { echo "kernel: $*" >&2; exit 1; }

# The Debian mirror this machine already uses, read from its own apt sources.
debian_mirror() {
	local f uri
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f")
		[ -n "$uri" ] && { echo "$uri"; return; }
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		uri=$(awk '$1 == "deb" && $2 !~ /security/ && $2 ~ /debian/ { print $2; exit }' "$f")
		[ -n "$uri" ] && { echo "$uri"; return; }
	done
	die "no Debian mirror found in /etc/apt sources"
}

# A private apt configuration for trixie-backports (the system's sources are left untouched).
# Sets apt_opts; updates the lists once per run.
apt_setup() {
	local apt="$RUVM_CACHE/apt"
	mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/none"
	echo "Types: deb
URIs: $(debian_mirror)
Suites: trixie-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" > "$apt/none/ruvm.sources"
	apt_opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt/none"
		-o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
		-o "APT::Sources::With::Default=false" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
	apt-get "${apt_opts[@]}" -qq update >&2 || die "apt-get update for trixie-backports failed"
}

# Download packages (NAME=VERSION ...) from trixie-backports into DIR.
download() {
	local dir=$1
	shift
	apt_setup
	mkdir -p "$dir"
	(cd "$dir" && apt-get "${apt_opts[@]}" -qq download "$@" >&2) || die "download of $* failed"
}

# Download linux-source-7.2 and unpack it once into the cache. Prints the source directory.
fetch_source() {
	local apt="$RUVM_CACHE/apt" srcroot="$RUVM_CACHE/src"
	mkdir -p "$srcroot"
	local have
	have=$(cat "$srcroot/current" 2>/dev/null || true)
	if [ -n "$have" ] && [ -f "$srcroot/$have/.ruvm-unpacked" ]; then
		echo "$srcroot/$have"
		return
	fi
	apt_setup
	local ver="$RUVM_KERNEL_PIN"
	if ! apt-cache "${apt_opts[@]}" show "linux-source-$RUVM_KERNEL_SERIES=$ver" >/dev/null 2>&1; then
		ver=$(apt-cache "${apt_opts[@]}" madison "linux-source-$RUVM_KERNEL_SERIES" |
			awk '{print $3}' | sort -V | tail -n 1)
		[ -n "$ver" ] || die "linux-source-$RUVM_KERNEL_SERIES is not offered by the archive"
		echo "kernel: pinned $RUVM_KERNEL_PIN is gone, using $ver" >&2
	fi
	local dl="$apt/dl"
	rm -rf "$dl" && mkdir -p "$dl"
	(cd "$dl" && apt-get "${apt_opts[@]}" -qq download "linux-source-$RUVM_KERNEL_SERIES=$ver" >&2) ||
		die "download of linux-source-$RUVM_KERNEL_SERIES=$ver failed"
	local name="linux-$ver"
	rm -rf "${srcroot:?}/$name" && mkdir -p "$srcroot/$name"
	echo "kernel: unpacking linux-source-$RUVM_KERNEL_SERIES $ver" >&2
	dpkg-deb --fsys-tarfile "$dl"/linux-source-*.deb |
		tar -xO --wildcards '*/linux-source-*.tar.xz' |
		tar -xJ -C "$srcroot/$name" --strip-components=1
	rm -rf "$dl"
	touch "$srcroot/$name/.ruvm-unpacked"
	echo "$name" > "$srcroot/current"
	echo "$srcroot/$name"
}

# The project's kernel patches (kernel/patches/*.patch, applied in name order), as one hash.
patches_hash() {
	cat "$top"/kernel/patches/*.patch 2>/dev/null | sha256sum | cut -c1-12
}

# The source with the project's patches applied: a copy of the pristine tree (hard links, so
# it costs little; patch replaces the files it changes instead of writing through the links,
# and the pristine tree, which the stock-kernel build uses, stays untouched). Prints its path.
patched_source() {
	local src p f
	src=$(fetch_source)
	p="$src-p$(patches_hash)"
	if [ ! -f "$p/.ruvm-patched" ]; then
		rm -rf "$p"
		cp -al "$src" "$p"
		for f in "$top"/kernel/patches/*.patch; do
			[ -f "$f" ] || continue
			# Break the hard links of the files the patch touches before it writes them.
			sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$f" | while read -r t; do
				[ -f "$p/$t" ] && cp --remove-destination "$src/$t" "$p/$t"
			done
			patch -p1 -s -d "$p" < "$f" >&2 || die "patch $(basename "$f") does not apply"
		done
		touch "$p/.ruvm-patched"
	fi
	echo "$p"
}

# The cache key: kernel version, patches, fragments, and the tools that shape the build.
build_key() {
	local src=$1 flavour=$2
	{
		basename "$src"
		cat "$top/kernel/common.config" "$top/kernel/$flavour.config"
		/usr/bin/rustc --version; clang-19 --version | head -n 1; "$RUVM_BINDGEN" --version
	} | sha256sum | cut -c1-12
}

build_dir() {
	local src
	src=$(patched_source)
	echo "$RUVM_CACHE/build/$1-$(build_key "$src" "$1")"
}

build() {
	local flavour=$1 src out
	[ -f "$top/kernel/$flavour.config" ] || die "unknown flavour '$flavour' (fast or debug)"
	"$here/deps.sh"
	src=$(patched_source)
	out="$RUVM_CACHE/build/$flavour-$(build_key "$src" "$flavour")"
	[ -f "$out/.ruvm-done" ] && return 0
	mkdir -p "$out"
	exec 9>"$out/.lock"
	flock 9
	[ -f "$out/.ruvm-done" ] && return 0
	local kmake=(make -C "$src" O="$out" "${RUVM_KMAKE_ARGS[@]}")
	echo "kernel: building $flavour in $out"
	local t0=$SECONDS
	"${kmake[@]}" -s rustavailable >/dev/null || { "${kmake[@]}" rustavailable; die "Rust toolchain not usable"; }
	"${kmake[@]}" -s tinyconfig >/dev/null
	(cd "$out" && KCONFIG_CONFIG=.config "$src/scripts/kconfig/merge_config.sh" -m -O "$out" .config \
		"$top/kernel/common.config" "$top/kernel/$flavour.config" >/dev/null)
	"${kmake[@]}" -s olddefconfig >/dev/null
	check_config "$out/.config" "$top/kernel/common.config" "$top/kernel/$flavour.config"
	# vmlinux and what out-of-tree modules need; no in-tree modules (ruvm needs none of them).
	"${kmake[@]}" -j"$(nproc)" bzImage modules_prepare >"$out/build.log" 2>&1 ||
		{ tail -n 40 "$out/build.log"; die "kernel build failed (log: $out/build.log)"; }
	# With no in-tree modules, vmlinux's exports are the whole symbol table modules link to.
	cp "$out/vmlinux.symvers" "$out/Module.symvers"
	touch "$out/.ruvm-done"
	echo "kernel: $flavour built in $((SECONDS - t0)) s"
}

# Every option a fragment sets must have taken effect: a silently dropped option would
# otherwise give a kernel that lacks what the tests rely on.
check_config() {
	local config=$1 bad=0 line key want got
	shift
	while IFS= read -r line; do
		case "$line" in
		CONFIG_*=*) key=${line%%=*}; want=${line#*=} ;;
		"# CONFIG_"*" is not set") key=${line#\# }; key=${key%% *}; want=n ;;
		*) continue ;;
		esac
		got=$(grep -E "^$key=" "$config" | cut -d= -f2- || true)
		[ -n "$got" ] || got=n
		if [ "$got" != "$want" ]; then
			echo "kernel: $key wanted $want, got $got" >&2
			bad=1
		fi
	done < <(cat "$@")
	[ $bad -eq 0 ] || die "config fragment did not take effect"
}

case "${1:-}" in
build) build "${2:?flavour}" ;;
dir) build_dir "${2:?flavour}" ;;
source) fetch_source ;;
mirror) debian_mirror ;;
download) shift; download "$@" ;;
*) die "usage: $0 build|dir FLAVOUR | source | mirror | download DIR PKG=VER..." ;;
esac
