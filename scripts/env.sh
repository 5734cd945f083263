# SPDX-License-Identifier: GPL-2.0
# Shared settings for ruvm's scripts: sourced, never run. Every path and pinned version
# lives here so the Makefile, the kernel builder and the guest runner agree.
: "${RUVM_CACHE:=${XDG_CACHE_HOME:-$HOME/.cache}/ruvm}"
RUVM_KERNEL_SERIES=7.2
RUVM_KERNEL_PIN=7.2.12-1~bpo13+1
RUVM_BINDGEN_VERSION=0.73.2
# Debian's stock kernel of the same source, and the trixie toolchain it was built with (its
# .config names them: rustc 1.85.1, bindgen 0.71.1, gcc-14). See scripts/stock.sh.
RUVM_STOCK_RELEASE=7.2.12+deb13-amd64
RUVM_STOCK_SUITE=trixie
RUVM_STOCK_RUSTC=1.85.1+dfsg1-1+deb13u1
RUVM_STOCK_BINDGEN=0.71.1-6
RUVM_BINDGEN=$RUVM_CACHE/tools/bin/bindgen
RUVM_LIBCLANG=/usr/lib/llvm-19/lib
RUVM_RUST_LIB_SRC=
for d in /usr/src/rustc-*/library; do [ -d "$d" ] && RUVM_RUST_LIB_SRC=$d; done
# Debian's rustc (with its library source) and never the rustup one earlier in PATH.
RUVM_KMAKE_ARGS=(ARCH=x86_64 LLVM=-19 RUSTC=/usr/bin/rustc HOSTRUSTC=/usr/bin/rustc
	RUSTDOC=/usr/bin/rustdoc RUSTFMT=/usr/bin/rustfmt CLIPPY_DRIVER=/usr/bin/clippy-driver
	BINDGEN=$RUVM_BINDGEN RUST_LIB_SRC=$RUVM_RUST_LIB_SRC)
export RUVM_CACHE LIBCLANG_PATH=$RUVM_LIBCLANG
