#!/bin/sh
# Builds and runs the host executor's self-test (tests/host/selftest.cpp) four ways:
# kernels and driver linked statically; kernels in a shared object built as README.md
# says, driven through dlopen/dlsym; and an ASan build (clang++ -femulated-tls when
# clang++ is there, so static __shared__ arrays have ASan bounds; else CXX), which also
# checks that out-of-bounds accesses are reported with the kernel's file:line.
# Usage: run_selftest.sh [BUILD_DIR]
# Env: CXX (g++), CUDA_INC (/usr/local/cuda/include), OPT (-O2), ASAN_CXX (clang++ if
# found, else CXX; "none" skips the ASan build).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
templates=$(cd "$here/../../templates" && pwd)
cxx=${CXX:-g++}
inc=${CUDA_INC:-/usr/local/cuda/include}
opt=${OPT:--O2}
if [ -z "${ASAN_CXX:-}" ]; then
  if command -v clang++ >/dev/null 2>&1; then ASAN_CXX=clang++; else ASAN_CXX=$cxx; fi
fi
if [ $# -ge 1 ]; then
  out=$1
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
# -Wno-unknown-pragmas: kernels say `#pragma unroll`, which g++ does not know (and g++ 12
# ignores `#pragma GCC diagnostic` for it, so cuda_host.h cannot silence it).
# -fno-strict-aliasing: kernels read a bf16 or half pair as its 32-bit register
# (templates/mla_device.cuh's pack2, as CUDA code does), which C++'s aliasing rules forbid
# on the host: g++ -O2 would otherwise assume they do not alias (and warns -Wstrict-aliasing).
flags="-std=c++17 $opt -g -Wall -Wextra -Wno-unknown-pragmas -fno-strict-aliasing -I$inc -I$here -I$templates"

# 1. static: kernels + driver in one program
$cxx $flags -include cuda_host.h -x c++ "$here/selftest.cpp" -x c++ "$here/cuda_host.cpp" \
  -o "$out/selftest" &
# 2. shared object, the command line README.md gives for a kernel
$cxx $flags -fPIC -shared -include cuda_host.h -DMG_SELFTEST_KERNELS \
  -x c++ "$here/selftest.cpp" -x c++ "$here/cuda_host.cpp" -o "$out/selftest_kernels.so"
wait
# 3. driver without CUDA headers, loading it with dlopen
$cxx -std=c++17 $opt -Wall -Wextra -I"$here" -DMG_SELFTEST_DLOPEN "$here/selftest.cpp" \
  -o "$out/selftest_dl" -ldl
# 4. ASan, static
if [ "$ASAN_CXX" != none ]; then
  tls=
  case $($ASAN_CXX --version 2>/dev/null | head -n 1) in *clang*) tls=-femulated-tls ;; esac
  $ASAN_CXX -std=c++17 -O0 -g -fsanitize=address -fno-omit-frame-pointer $tls -Wall -Wextra \
    -Wno-unknown-pragmas -I$inc -I$here -I$templates -include cuda_host.h \
    -x c++ "$here/selftest.cpp" -x c++ "$here/cuda_host.cpp" -o "$out/selftest_asan"
fi

rc=0
"$out/selftest" || rc=1
"$out/selftest_dl" "$out/selftest_kernels.so" || rc=1
if [ "$ASAN_CXX" != none ]; then
  ASAN_OPTIONS=detect_leaks=0 "$out/selftest_asan" || rc=1
fi
exit $rc
