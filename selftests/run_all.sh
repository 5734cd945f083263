#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Every in-guest suite, one after another (ruvm loaded at the start). Each prints its own KTAP.
# Exit 1 if any suite failed (kselftest's 4, "skipped", is not a failure).
rc=0
suite() {
	echo "# suite: $*"
	"$@"
	r=$?
	case $r in 0|4) ;; *) echo "# suite $1 exited $r"; rc=1 ;; esac
}
suite ruvmctl selftest
suite /selftests/ruvm_abi_test
# The module as the runner loaded it, unloaded with the audit's verdict checked.
if ! ruvmctl unload; then
	echo "# unloading ruvm after the suites: the audit found leaks"
	rc=1
fi
suite /selftests/module_lifecycle.sh
exit $rc
