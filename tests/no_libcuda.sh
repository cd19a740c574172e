#!/bin/sh
# no_libcuda.sh FILE: the ELF program or library FILE does not need libcuda (the driver is
# dlopen'ed, so mlagen starts on a machine without one). Fails, never passes, when
# readelf (binutils; scripts/setup.sh installs it) is missing or cannot read FILE's
# dynamic section.
command -v readelf >/dev/null 2>&1 || { echo "readelf not found: install binutils" >&2; exit 1; }
dyn=$(readelf -d "$1") || { echo "readelf -d $1 failed" >&2; exit 1; }
needed=$(echo "$dyn" | grep NEEDED) || { echo "$1: no NEEDED entries (not a dynamic ELF?)" >&2; exit 1; }
if echo "$needed" | grep -i libcuda; then echo "$1 needs libcuda" >&2; exit 1; fi
echo "$1: $(echo "$needed" | wc -l) NEEDED libraries, no libcuda"
