#!/bin/sh
# Builds and runs the host executor's self-test (tests/host/selftest.cpp) three ways:
# kernels and driver linked statically; kernels in a shared object built as README.md
# says, driven through dlopen/dlsym. Usage: run_selftest.sh [BUILD_DIR]
# Env: CXX (g++), CUDA_INC (/usr/local/cuda/include), OPT (-O2).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cxx=${CXX:-g++}
inc=${CUDA_INC:-/usr/local/cuda/include}
opt=${OPT:--O2}
if [ $# -ge 1 ]; then
  out=$1
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
# -Wno-unknown-pragmas: kernels say `#pragma unroll`, which g++ does not know (and g++ 12
# ignores `#pragma GCC diagnostic` for it, so cuda_host.h cannot silence it).
flags="-std=c++17 $opt -g -Wall -Wextra -Wno-unknown-pragmas -I$inc -I$here"

# 1. static: kernels + driver in one program
$cxx $flags -include cuda_host.h -x c++ "$here/selftest.cpp" -x c++ "$here/cuda_host.cpp" \
  -o "$out/selftest"
# 2. shared object, the command line README.md gives for a kernel
$cxx $flags -fPIC -shared -include cuda_host.h -DMG_SELFTEST_KERNELS \
  -x c++ "$here/selftest.cpp" -x c++ "$here/cuda_host.cpp" -o "$out/selftest_kernels.so"
# 3. driver without CUDA headers, loading it with dlopen
$cxx -std=c++17 $opt -Wall -Wextra -I"$here" -DMG_SELFTEST_DLOPEN "$here/selftest.cpp" \
  -o "$out/selftest_dl" -ldl

rc=0
"$out/selftest" || rc=1
"$out/selftest_dl" "$out/selftest_kernels.so" || rc=1
exit $rc
