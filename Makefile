# SPDX-License-Identifier: GPL-2.0
#
# ruvm: the user-facing entry points. The work is done by scripts/ and tools/; `make help`
# lists the targets. Kbuild (next to this file) is what the kernel's build reads.

TOP := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
FLAVOUR ?= fast
RUVMCTL := $(TOP)/tools/ruvmctl/target/x86_64-unknown-linux-gnu/release/ruvmctl
SELFTEST_BINS := $(TOP)/build/selftests/ruvm_abi_test
export LIBCLANG_PATH ?= /usr/lib/llvm-19/lib

.PHONY: all help deps kernel stock deb module ruvmctl libruvm selftests vm demo check fuzz bench clean FORCE

all: module ruvmctl

help:
	@echo "make demo          boot the guest, load ruvm, show what it does, unload, audit"
	@echo "make check         every test (host, guest on the fast and debug kernels)"
	@echo "make vm CMD='...'  run a command in the guest (no CMD: a shell); VM_EXTRA=files"
	@echo "make fuzz          the fuzzer on the debug kernel: DURATION=seconds, SEED=n, FLAVOUR=fast"
	@echo "make bench         speed and memory against the kernel and user space (build/bench/)"
	@echo "make module        build ruvm.ko for FLAVOUR=fast|debug|stock, or KDIR=/your/kernel"
	@echo "make stock         build ruvm.ko for Debian's stock 7.2 kernel (build/stock/rust/ruvm.ko)"
	@echo "make deb           the DKMS package build/deb/ruvm-dkms_<version>_all.deb"
	@echo "make kernel        build both test kernels into \$$RUVM_CACHE (~/.cache/ruvm)"
	@echo "make ruvmctl       build the static ruvmctl"
	@echo "make libruvm       libruvm's C API (libruvm.a, libruvm.so, libruvm.h) and its example"
	@echo "make deps          install the Debian packages and bindgen the build needs"

deps:
	@$(TOP)/scripts/deps.sh

kernel: deps
	@$(TOP)/scripts/kernel.sh build fast
	@$(TOP)/scripts/kernel.sh build debug

# With KDIR set, build against that tree (a real host's Rust-enabled kernel).
ifneq ($(KDIR),)
module:
	@KDIR=$(KDIR) $(TOP)/scripts/module.sh host $(KMAKE_ARGS)
	@echo "built $(TOP)/build/host/rust/ruvm.ko"
else
module: deps
	@$(TOP)/scripts/module.sh $(FLAVOUR) $(KMAKE_ARGS)
endif

# Debian's stock kernel, built with its own toolchain in a cached trixie chroot.
stock: deps
	@$(TOP)/scripts/stock.sh module
	@echo "built $(TOP)/build/stock/rust/ruvm.ko for Debian's stock kernel"

# The DKMS source package (dkms/; README "Running on your host", Documentation/hosts.rst).
deb:
	@$(TOP)/scripts/deb.sh

ruvmctl: deps
	@cd $(TOP)/tools/ruvmctl && cargo build --release --quiet

# libruvm's C API: libruvm.a and libruvm.so in build/lib (link with -lruvm), its header in
# tools/libruvm/capi/include, and the example program linked statically (it runs in the guest).
CAPI := $(TOP)/tools/libruvm/capi
CAPI_TARGET ?= $(or $(CARGO_TARGET_DIR),$(CAPI)/target)
libruvm: deps
	@cd $(CAPI) && CARGO_TARGET_DIR=$(CAPI_TARGET) cargo build --release --quiet --locked
	@mkdir -p $(TOP)/build/lib $(TOP)/build/examples
	@cp $(CAPI_TARGET)/release/libruvm.a $(CAPI_TARGET)/release/libruvm.so $(TOP)/build/lib/
	for e in alloc_example heap_example; do \
		gcc -static -O2 -std=gnu11 -Wall -Wextra -Werror -I$(TOP)/include/uapi -I$(CAPI)/include \
			-o $(TOP)/build/examples/$$e $(CAPI)/examples/$$e.c \
			-L$(TOP)/build/lib -l:libruvm.a -lpthread -ldl -lm || exit 1; \
	done
	@mkdir -p $(TOP)/build/lib/pkgconfig
	@sed -e 's|@PREFIX@|$(TOP)|' $(CAPI)/libruvm.pc.in > $(TOP)/build/lib/pkgconfig/libruvm.pc

selftests: $(SELFTEST_BINS)

$(TOP)/build/selftests/ruvm_abi_test: $(TOP)/selftests/ruvm_abi_test.c $(TOP)/include/uapi/linux/ruvm.h FORCE
	@$(TOP)/scripts/selftests.sh $@

vm: module ruvmctl selftests
	@$(TOP)/scripts/vm.sh $(FLAVOUR)

demo:
	@$(TOP)/scripts/demo.sh

# The fuzzer, long: DURATION seconds (default 1800) on the debug kernel unless FLAVOUR=fast.
DURATION ?= 1800
FUZZ_FLAVOUR := $(if $(filter command line environment,$(origin FLAVOUR)),$(FLAVOUR),debug)
fuzz: FLAVOUR := $(FUZZ_FLAVOUR)
fuzz: module ruvmctl selftests
	@VM_TIMEOUT=$$(( $(DURATION) + 900 )) VM_MODARGS="sim_gpus=2 enable_test_ioctls=1" \
		CMD="ruvmctl fuzz --ops 1000000000 --duration $(DURATION) --unbind --kill $(if $(filter debug,$(FLAVOUR)),--removal-bound 45) $(if $(SEED),--seed $(SEED))" \
		$(TOP)/scripts/vm.sh $(FLAVOUR)

# Benchmarks in the fast guest: a table of ratios and goals, JSON and an SVG in build/bench/.
bench: module ruvmctl selftests
	@$(TOP)/scripts/bench.sh

check:
	@$(TOP)/scripts/check.sh

clean:
	rm -rf $(TOP)/build $(TOP)/tools/ruvmctl/target $(CAPI)/target

FORCE:
