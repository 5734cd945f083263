#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Install what building and testing ruvm needs on Debian 12 (bookworm): the LLVM/Rust
# toolchain the pinned kernel wants, QEMU, busybox for the guest, and bindgen-cli.
# Idempotent and quiet when everything is already there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"

pkgs=(bc bison flex libelf-dev libssl-dev cpio xz-utils gzip pahole make gcc libc6-dev patch
      clang-19 lld-19 llvm-19 libclang-19-dev
      rustc-web rust-web-src rust-web-clippy rustfmt-web
      qemu-system-x86 busybox-static ca-certificates mmdebstrap)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "deps: installing ${missing[*]}"
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: need root to apt-get install the packages above" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# bindgen-cli at a pinned version (kernel 7.2 needs >= 0.71.1), installed into the cache
# so every clone shares it and the system's cargo setup is left alone.
if [ ! -x "$RUVM_BINDGEN" ] || ! "$RUVM_BINDGEN" --version 2>/dev/null | grep -q "$RUVM_BINDGEN_VERSION"; then
	echo "deps: cargo install bindgen-cli $RUVM_BINDGEN_VERSION"
	mkdir -p "$RUVM_CACHE/tools"
	LIBCLANG_PATH=$RUVM_LIBCLANG cargo install --quiet --locked --root "$RUVM_CACHE/tools" \
		bindgen-cli --version "$RUVM_BINDGEN_VERSION"
fi
