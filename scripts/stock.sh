#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# ruvm for Debian's stock kernel (trixie-backports linux-image-$RUVM_STOCK_RELEASE), built with
# the exact toolchain Debian built that kernel with, in a cached trixie chroot.
#
#   scripts/stock.sh chroot        make (or reuse) the trixie chroot; prints its path
#   scripts/stock.sh prepare       regenerate the kernel's Rust build files (rust/*.rmeta,
#                                  libmacros.so, target.json, ...), which Debian's headers
#                                  package lacks, from linux-source + the headers' .config
#                                  (scripts/kbuild-rust.sh); prints the directory whose kdir/
#                                  is the headers completed with them (a KDIR for ruvm)
#   scripts/stock.sh prepared      that directory if prepare made it already, else exit 1
#   scripts/stock.sh module [ARGS] build/stock/rust/ruvm.ko for that kernel (ARGS to make)
#   scripts/stock.sh vmlinuz       print the path of Debian's unmodified vmlinuz
#   scripts/stock.sh run CMD...    run CMD inside the chroot (the project at /ruvm)
#   scripts/stock.sh try DIR CMD... run CMD in a throwaway copy of the chroot (DIR at /pkg)
#
# Why a chroot: Rust symbol names carry a hash of the compiler, so only trixie's rustc 1.85.1
# reproduces the hashes in Debian's Module.symvers, and it needs trixie's glibc. What is
# regenerated is checked, not trusted: olddefconfig must leave Debian's .config unchanged and
# every crate hash in the rebuilt kernel crate must appear in Debian's Module.symvers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
. "$here/env.sh"

die() { echo "stock: $*" >&2; exit 1; }

rel=$RUVM_STOCK_RELEASE
stock=$RUVM_CACHE/stock
# Debian's own names for what the stock kernel was built with (its .config says which).
chroot_pkgs=(rustc="$RUVM_STOCK_RUSTC" rust-src="$RUVM_STOCK_RUSTC" cargo="$RUVM_STOCK_RUSTC"
	rustfmt="$RUVM_STOCK_RUSTC" rust-clippy="$RUVM_STOCK_RUSTC" bindgen="$RUVM_STOCK_BINDGEN"
	libclang-dev gcc-14 make bc bison flex libelf-dev libssl-dev kmod cpio xz-utils dwarves
	libc6-dev patch python3 ca-certificates dkms fakeroot
	"linux-headers-$rel=$RUVM_KERNEL_PIN" "linux-kbuild-${rel%-amd64}=$RUVM_KERNEL_PIN")

chroot_key() {
	printf '%s\n' "$RUVM_STOCK_SUITE" "${chroot_pkgs[@]}" | sha256sum | cut -c1-12
}

chroot_dir() { echo "$stock/chroot-$(chroot_key)"; }

make_chroot() {
	local dir mirror
	dir=$(chroot_dir)
	[ -f "$dir/.ruvm-done" ] && { echo "$dir"; return; }
	command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (make deps installs it)"
	mirror=$("$here/kernel.sh" mirror)
	mkdir -p "$stock"
	exec 8>"$dir.lock"
	flock 8
	[ -f "$dir/.ruvm-done" ] && { echo "$dir"; return; }
	rm -rf "$dir"
	echo "stock: making the $RUVM_STOCK_SUITE chroot $dir" >&2
	local t0=$SECONDS
	mmdebstrap --quiet --variant=minbase --mode=root \
		--aptopt='APT::Install-Recommends "false"' \
		--include="$(IFS=,; echo "${chroot_pkgs[*]}")" \
		"$RUVM_STOCK_SUITE" "$dir" \
		"deb $mirror $RUVM_STOCK_SUITE main" \
		"deb $mirror $RUVM_STOCK_SUITE-updates main" \
		"deb ${mirror%/debian}/debian-security $RUVM_STOCK_SUITE-security main" \
		"deb $mirror $RUVM_STOCK_SUITE-backports main" >&2 ||
		die "mmdebstrap of $RUVM_STOCK_SUITE failed"
	# The mount points of in_chroot, made with the chroot: a command in the chroot writes
	# nothing into it (the DKMS package test snapshots its files beside such commands).
	mkdir -p "$dir/ruvm" "$dir/src" "$dir/kbuild" "$dir/cargo-target"
	touch "$dir/.ruvm-done"
	echo "stock: chroot made in $((SECONDS - t0)) s" >&2
	echo "$dir"
}

# Run a command in the chroot, in a private mount namespace (nothing stays mounted): the
# project at /ruvm, the pristine kernel source at /src (read-only), the stock build at /kbuild,
# and a cargo target directory kept in the cache at /cargo-target.
in_chroot() {
	local dir src kb ct
	dir=$(make_chroot)
	src=$("$here/kernel.sh" source)
	kb=$(kbuild_dir)
	ct=$RUVM_CACHE/stock/cargo-target
	mkdir -p "$kb" "$ct" "$dir/cargo-target"
	unshare --mount --propagation private -- bash -c '
		set -e
		d=$1 top=$2 src=$3 kb=$4 ct=$5
		shift 5
		mount --rbind /dev "$d/dev"
		mount -t proc proc "$d/proc"
		mount -t tmpfs tmpfs "$d/tmp"
		mount --bind "$top" "$d/ruvm"
		mount --bind "$src" "$d/src"
		mount -o remount,bind,ro "$d/src"
		mount --bind "$kb" "$d/kbuild"
		mount --bind "$ct" "$d/cargo-target"
		cp /etc/resolv.conf "$d/etc/resolv.conf" 2>/dev/null || true
		# The host'"'"'s trusted certificates (cargo in the chroot fetches crates through the
		# same network as the host).
		[ ! -f /etc/ssl/certs/ca-certificates.crt ] ||
			mount --bind /etc/ssl/certs/ca-certificates.crt "$d/etc/ssl/certs/ca-certificates.crt"
		exec chroot "$d" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
			LANG=C.UTF-8 "$@"' bash "$dir" "$top" "$src" "$kb" "$ct" "$@"
}

# Run a command in a throwaway copy of the chroot (an overlay whose upper layer is deleted
# after): what it installs or removes never reaches the cached chroot. FILES (a directory) is
# at /pkg inside.
in_overlay() {
	local dir files=$1 tmp
	shift
	dir=$(make_chroot)
	tmp=$(mktemp -d "$stock/overlay.XXXXXX")
	# shellcheck disable=SC2064
	trap "rm -rf '$tmp'" RETURN
	mkdir -p "$tmp/upper" "$tmp/work" "$tmp/root"
	unshare --mount --propagation private -- bash -c '
		set -e
		lower=$1 t=$2 files=$3
		shift 3
		mount -t overlay overlay -o "lowerdir=$lower,upperdir=$t/upper,workdir=$t/work" "$t/root"
		d=$t/root
		mount --rbind /dev "$d/dev"
		mount -t proc proc "$d/proc"
		mount -t tmpfs tmpfs "$d/tmp"
		mkdir -p "$d/pkg"
		mount --bind "$files" "$d/pkg"
		cp /etc/resolv.conf "$d/etc/resolv.conf" 2>/dev/null || true
		[ ! -f /etc/ssl/certs/ca-certificates.crt ] ||
			mount --bind /etc/ssl/certs/ca-certificates.crt "$d/etc/ssl/certs/ca-certificates.crt"
		exec chroot "$d" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
			LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"' bash "$dir" "$tmp" "$files" "$@"
}

# The stock kernel's build directory: keyed by the chroot (the toolchain) and the source.
kbuild_dir() {
	local src
	src=$("$here/kernel.sh" source)
	echo "$stock/kbuild-$rel-$({ chroot_key; basename "$src"; cat "$here/kbuild-rust.sh"; } | sha256sum | cut -c1-12)"
}

# The make arguments Debian's kernel was built with (GCC 14, its release string), read from
# its .config.
kmake_args() {
	in_chroot /ruvm/scripts/kbuild-rust.sh make-args "/usr/src/linux-headers-$rel" "$rel"
}

prepare() {
	local kb
	kb=$(kbuild_dir)
	if [ -f "$kb/.ruvm-done" ]; then
		echo "$kb"
		return
	fi
	make_chroot >/dev/null
	mkdir -p "$kb"
	echo "stock: regenerating the Rust build files of $rel in $kb" >&2
	local t0=$SECONDS
	# The same script the DKMS package runs on a user's host.
	find "$kb" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
	in_chroot /ruvm/scripts/kbuild-rust.sh prepare /src "/usr/src/linux-headers-$rel" /kbuild "$rel" ||
		die "regenerating the Rust build files failed"
	touch "$kb/.ruvm-done"
	echo "stock: prepared in $((SECONDS - t0)) s" >&2
	echo "$kb"
}

# The kernel's Rust build files if `prepare` made them already (prints the directory), else
# exit 1: never makes them (a caller that may run beside `prepare` only reuses them).
prepared() {
	local kb
	kb=$(kbuild_dir)
	[ -f "$kb/.ruvm-done" ] || return 1
	echo "$kb"
}

# Extra arguments go to make (CLIPPY=1: clippy 1.85 too).
module() {
	prepare >/dev/null
	mkdir -p "$top/build/stock"
	# shellcheck disable=SC2016
	in_chroot bash -c 'args=$1; shift; make -C /kbuild/kdir $args M=/ruvm MO=/ruvm/build/stock "$@" modules' \
		bash "$(kmake_args)" "$@" ||
		die "ruvm.ko for $rel failed to build"
	local magic
	magic=$(in_chroot /sbin/modinfo -F vermagic /ruvm/build/stock/rust/ruvm.ko)
	[[ "$magic" == "$rel "* ]] || die "ruvm.ko's vermagic is '$magic', not $rel"
}

# Debian's vmlinuz, unmodified, from the linux-binary package (downloaded once).
vmlinuz() {
	local d=$stock/image-$rel-$RUVM_KERNEL_PIN
	if [ ! -f "$d/vmlinuz" ]; then
		rm -rf "$d.tmp" && mkdir -p "$d.tmp"
		"$here/kernel.sh" download "$d.tmp" "linux-binary-$rel=$RUVM_KERNEL_PIN" >&2
		dpkg-deb -x "$d.tmp"/linux-binary-*.deb "$d.tmp/x"
		mkdir -p "$d"
		cp "$d.tmp/x/usr/lib/modules/$rel/vmlinuz" "$d/vmlinuz"
		rm -rf "$d.tmp"
	fi
	echo "$d/vmlinuz"
}

case "${1:-}" in
chroot) make_chroot ;;
prepare) prepare ;;
prepared) prepared ;;
module) shift; module "$@" ;;
vmlinuz) vmlinuz ;;
run) shift; in_chroot "$@" ;;
try) shift; in_overlay "$@" ;;
*) die "usage: $0 chroot|prepare|module|vmlinuz|run CMD...|try DIR CMD..." ;;
esac
