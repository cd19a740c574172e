#!/bin/sh
# tool_missing.sh WHAT: stands for a check that cannot run because WHAT was not found at
# configure time. In CI (CI set, and not "0" or "false": cmake/MlagenCI.cmake owns the
# rule) it fails; elsewhere it exits 77, which ctest reports as skipped (SKIP_RETURN_CODE),
# never as passed.
echo "not found at configure time: $1 (scripts/setup.sh installs it)" >&2
case "${CI:-}" in ""|0|false) exit 77 ;; esac
exit 1
