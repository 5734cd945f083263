#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# make deb: build/deb/ruvm-dkms_<version>_all.deb, the module source for DKMS (dkms/) with the
# exact toolchain Debian's stock kernel was built with as dependencies. Built with dpkg-deb
# alone, reproducibly (file times from the last commit). Prints the package's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
. "$here/env.sh"

version=$(cat "$top/VERSION")
out=$top/build/deb
stage=$out/stage
rm -rf "$stage"
mkdir -p "$stage/DEBIAN" "$stage/usr/src/ruvm-$version" "$stage/usr/share/doc/ruvm-dkms"
src=$stage/usr/src/ruvm-$version

# The module's own sources: what git tracks, so a stray build product never ships.
if git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
	files=$(git -C "$top" ls-files Kbuild VERSION include rust)
else
	files=$(cd "$top" && find Kbuild VERSION include rust -type f)
fi
(cd "$top" && printf '%s\n' $files | cpio -pdm --quiet "$src")
cp "$top/dkms/dkms-build.sh" "$top/scripts/kbuild-rust.sh" "$src/"
sed "s/@VERSION@/$version/" "$top/dkms/dkms.conf" > "$src/dkms.conf"
cp "$top/dkms/debian/copyright" "$stage/usr/share/doc/ruvm-dkms/copyright"

# What building ruvm for the stock kernel needs, pinned as that kernel's .config names it.
series=$RUVM_KERNEL_SERIES
bindgen_up=${RUVM_STOCK_BINDGEN%-*}
depends="rustc (= $RUVM_STOCK_RUSTC), rust-src (= $RUVM_STOCK_RUSTC)"
depends+=", bindgen (>= $bindgen_up), bindgen (<< ${bindgen_up%.*}.$((${bindgen_up##*.} + 1)))"
depends+=", libclang-dev, gcc-14, make, bc, bison, flex, libelf-dev, libssl-dev, python3"
depends+=", xz-utils, cpio, kmod, linux-source-$series (= $RUVM_KERNEL_PIN)"
depends+=", linux-headers-$RUVM_STOCK_RELEASE (= $RUVM_KERNEL_PIN)"
size=$(du -sk "$stage/usr" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@DEPENDS@/$depends/" -e "s/@SIZE@/$size/" \
	"$top/dkms/debian/control" > "$stage/DEBIAN/control"
for f in postinst prerm; do
	sed "s/@VERSION@/$version/" "$top/dkms/debian/$f" > "$stage/DEBIAN/$f"
	chmod 755 "$stage/DEBIAN/$f"
done
(cd "$stage" && find usr -type f -print0 | sort -z | xargs -0 md5sum > DEBIAN/md5sums)

# Reproducible: every file dated at the last commit, normal permissions.
epoch=$(git -C "$top" log -1 --format=%ct 2>/dev/null || echo 0)
find "$stage" -exec touch -h -d "@$epoch" {} +
find "$stage/usr" -type d -exec chmod 755 {} +
find "$stage/usr" -type f -exec chmod 644 {} +
chmod 755 "$src/dkms-build.sh" "$src/kbuild-rust.sh"
deb=$out/ruvm-dkms_${version}_all.deb
SOURCE_DATE_EPOCH=$epoch dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
rm -rf "$stage"
echo "$deb"
