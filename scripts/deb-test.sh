#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Test the DKMS package (make deb) as a trixie host with the stock kernel's headers would get
# it, in a throwaway copy of the stock chroot: install its dependencies, configure a DKMS
# signing key (as for Secure Boot), install the package (DKMS builds ruvm.ko for the stock
# kernel), check the module (vermagic, signer), purge the package, and require that nothing it
# made is left. The built module is kept as build/deb/ruvm.ko.
#
# A pass is remembered per package, chroot and kernel: the same package is not tested twice.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
. "$here/env.sh"

die() { echo "deb-test: $*" >&2; exit 1; }

deb=$("$here/deb.sh")
work=$top/build/deb/test
rm -rf "$work"
mkdir -p "$work"
cp "$deb" "$work/"
chroot_dir=$("$here/stock.sh" chroot)
key=$({ sha256sum < "$deb"; basename "$chroot_dir"; cat "$0"; } | sha256sum | cut -c1-12)
stamp=$RUVM_CACHE/stock/deb-passed-$key
if [ -f "$stamp/ruvm.ko" ]; then
	cp "$stamp/ruvm.ko" "$top/build/deb/ruvm.ko"
	echo "deb-test: $(basename "$deb") passed before ($(cat "$stamp/when")); not run again"
	exit 0
fi

# The package regenerates the kernel's Rust build files from linux-source (dkms-build.sh), the
# longest part of its install. That path is proven once per dkms-build.sh, kbuild-rust.sh, this
# test, chroot and kernel; after that the test starts from those files already made, as on a
# host that built ruvm once (the package's cache, /var/lib/ruvm-dkms: the same files that
# `stock.sh prepare` makes with the same script and toolchain), when they are at hand.
regen_key=$({ cat "$top/dkms/dkms-build.sh" "$here/kbuild-rust.sh" "$0"; basename "$chroot_dir"
	echo "$RUVM_KERNEL_PIN"; } | sha256sum | cut -c1-12)
regen=$RUVM_CACHE/stock/deb-regenerated-$regen_key
seeded=0
if [ -f "$regen/when" ] && kb=$("$here/stock.sh" prepared); then
	cp -al "$kb/kdir" "$work/seed-kdir" 2>/dev/null ||
		{ rm -rf "$work/seed-kdir" && cp -a "$kb/kdir" "$work/seed-kdir"; }
	seeded=1
fi

cat > "$work/test.sh" <<'EOF'
set -euo pipefail
rel=$1
deb=$(ls /pkg/ruvm-dkms_*_all.deb)
say() { echo "deb-test: $*"; }
# Everything on the root file system but caches, logs and dpkg's own bookkeeping of the
# package itself: names and kinds (a file that moved or appeared is a difference).
snapshot() {
	find / -xdev \( -path /proc -o -path /dev -o -path /tmp -o -path /run -o -path /pkg \
		-o -path /var/log -o -path /var/cache -o -path /var/lib/apt -o -path /var/lib/dpkg \) \
		-prune -o -printf '%y %p\n' | sort
}
apt-get update -qq
say "installing the package's dependencies and the stock kernel's modules"
# The host: the stock kernel's module tree (as linux-image pulls it in; the image and its
# initramfs are not needed here) and what the package depends on.
apt-get satisfy -y -qq --no-install-recommends \
	"$(dpkg-deb -f "$deb" Depends), openssl, linux-modules-$rel (= $2)" >/dev/null
# A machine owner key, as Documentation/ruvm.rst's Secure Boot section has an administrator
# make one, and DKMS told to sign with it.
openssl req -new -x509 -newkey rsa:2048 -nodes -days 36500 -subj "/CN=ruvm test MOK/" \
	-outform DER -keyout /var/lib/ruvm-test-mok.key -out /var/lib/ruvm-test-mok.der 2>/dev/null
mkdir -p /etc/dkms/framework.conf.d
printf 'mok_signing_key=/var/lib/ruvm-test-mok.key\nmok_certificate=/var/lib/ruvm-test-mok.der\n' \
	> /etc/dkms/framework.conf.d/ruvm-test.conf
# The running kernel (the chroot's host's) made to look installed without Rust, as on most GPU
# hosts today: the install must say so plainly and still build for the stock kernel.
cur=$(uname -r)
mkdir -p "/lib/modules/$cur/build"
printf '# Linux/x86 0.0 Kernel Configuration\n# CONFIG_RUST is not set\n' > "/lib/modules/$cur/build/.config"
snapshot > /tmp/before
# The package's cache of the kernel's Rust build files, as a host that built ruvm once has it
# (the package's removal deletes it: it is not in the snapshot).
if [ -d /pkg/seed-kdir ]; then
	mkdir -p "/var/lib/ruvm-dkms/$rel"
	cp -a /pkg/seed-kdir "/var/lib/ruvm-dkms/$rel/kdir"
	# A regeneration would start by deleting the cache: this must outlive the install.
	touch "/var/lib/ruvm-dkms/$rel/kdir/.ruvm-test-seeded"
	say "the package's cache holds $rel's Rust build files already (their regeneration passed before)"
fi
say "dpkg -i $(basename "$deb")"
dpkg -i "$deb" > /tmp/install.log 2>&1 || { cat /tmp/install.log; tail -n 40 /var/lib/dkms/ruvm/*/build/make.log; exit 1; }
cat /tmp/install.log
if [ -d /pkg/seed-kdir ]; then
	[ -f "/var/lib/ruvm-dkms/$rel/kdir/.ruvm-test-seeded" ] ||
		{ say "the build regenerated the Rust build files its cache held"; exit 1; }
else
	[ -f "/var/lib/ruvm-dkms/$rel/kdir/rust/libkernel.rmeta" ] ||
		{ say "the build did not regenerate $rel's Rust build files into its cache"; exit 1; }
fi
grep -q "^ruvm: the running kernel $cur has no Rust support" /tmp/install.log ||
	{ say "the install did not say that the running kernel $cur has no Rust"; exit 1; }
dkms status ruvm
dkms status ruvm | grep -q "$rel.*installed" || { say "DKMS did not install ruvm for $rel"; exit 1; }
ko=$(find "/lib/modules/$rel" -name 'ruvm.ko*' | head -n 1)
[ -n "$ko" ] || { say "no ruvm.ko under /lib/modules/$rel"; exit 1; }
magic=$(modinfo -F vermagic "$ko")
signer=$(modinfo -F signer "$ko")
say "installed $ko: vermagic '$magic', signer '$signer'"
case "$magic" in "$rel "*) ;; *) say "vermagic is not $rel"; exit 1 ;; esac
[ "$signer" = "ruvm test MOK" ] || { say "the module is not signed with the configured key"; exit 1; }
case "$ko" in
*.xz) xz -dc "$ko" > /pkg/ruvm.ko ;;
*.zst) zstd -dc "$ko" > /pkg/ruvm.ko ;;
*) cp "$ko" /pkg/ruvm.ko ;;
esac
say "dpkg --purge ruvm-dkms"
dpkg --purge ruvm-dkms
snapshot > /tmp/after
if ! diff -u /tmp/before /tmp/after; then
	say "files left behind or removed by install + purge (above)"
	exit 1
fi
say "install, build for $rel, purge: nothing left behind"
EOF
"$here/stock.sh" try "$work" bash /pkg/test.sh "$RUVM_STOCK_RELEASE" "$RUVM_KERNEL_PIN" || die "the package test failed"
[ -s "$work/ruvm.ko" ] || die "the test kept no module"
cp "$work/ruvm.ko" "$top/build/deb/ruvm.ko"
mkdir -p "$stamp"
cp "$work/ruvm.ko" "$stamp/"
date -u +%Y-%m-%dT%H:%MZ > "$stamp/when"
if [ $seeded = 0 ]; then
	mkdir -p "$regen"
	date -u +%Y-%m-%dT%H:%MZ > "$regen/when"
fi
echo "deb-test: $(basename "$deb") passed"
