#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# DKMS's build command for ruvm: dkms-build.sh KERNELRELEASE HEADERS_DIR (run in the module
# source, which it builds in place: rust/ruvm.ko).
#
# A Rust module needs the kernel's Rust build files (crate metadata, proc macros), which
# Debian's linux-headers packages lack. When the headers have them (a kernel built here, or
# Ubuntu's linux-lib-rust), they are used as they are. Otherwise they are regenerated once per
# kernel from linux-source of the same version, with the toolchain the kernel was built with,
# into /var/lib/ruvm-dkms/<release>/ (kbuild-rust.sh, checked against the kernel's .config and
# Module.symvers); the source is unpacked for that and deleted after.
set -euo pipefail
rel=${1:?kernel release}
hdr=${2:?kernel headers directory}
here=$(cd "$(dirname "$0")" && pwd)
kbr=$here/kbuild-rust.sh
cache=${RUVM_DKMS_CACHE:-/var/lib/ruvm-dkms}/$rel

die() { echo "ruvm: $*" >&2; exit 1; }

hdr=$(readlink -f "$hdr")
"$kbr" check "$hdr"
if [ -f "$hdr/rust/libkernel.rmeta" ]; then
	kdir=$hdr
elif [ -f "$cache/kdir/rust/libkernel.rmeta" ] && cmp -s "$cache/kdir/Module.symvers" "$hdr/Module.symvers"; then
	kdir=$cache/kdir
else
	# The source of the same version: the linux-source-X.Y package's tarball.
	version=$(sed -n 's/^# Linux\/[a-z0-9_]* \([0-9][0-9.]*\) Kernel Configuration$/\1/p' "$hdr/.config" | head -n 1)
	[ -n "$version" ] || die "$hdr/.config does not say its kernel version"
	series=$(echo "$version" | cut -d. -f1-2)
	tarball=/usr/src/linux-source-$series.tar.xz
	[ -f "$tarball" ] || die "$rel's headers have no Rust build files and $tarball is missing: install linux-source-$series of the same version as the kernel"
	if command -v dpkg-query >/dev/null; then
		want=$(dpkg-query -W -f '${Version}' "$(dpkg-query -S "$hdr/.config" 2>/dev/null | cut -d: -f1 | head -n 1)" 2>/dev/null || true)
		have=$(dpkg-query -W -f '${Version}' "linux-source-$series" 2>/dev/null || true)
		[ -z "$want" ] || [ "$want" = "$have" ] ||
			die "linux-source-$series is version $have but the kernel $rel is $want: install linux-source-$series=$want"
	fi
	echo "ruvm: regenerating $rel's Rust build files (once per kernel) in $cache" >&2
	rm -rf "$cache"
	mkdir -p "$cache/src"
	trap 'rm -rf "$cache/src"' EXIT
	tar -xJf "$tarball" -C "$cache/src" --strip-components=1
	"$kbr" prepare "$cache/src" "$hdr" "$cache" "$rel"
	rm -rf "$cache/src"
	kdir=$cache/kdir
fi
# shellcheck disable=SC2046
make -C "$kdir" M="$here" $("$kbr" make-args "$hdr" "$rel") modules
