#!/usr/bin/env bash
# setup.sh: install what mlagen needs, build it, then run the main job or the tests.
#
#   scripts/setup.sh           install, build, run the main job on DeepSeek-V3
#                              (mlagen info, generate, compile)
#   scripts/setup.sh --test    install, build, run the whole test suite (ctest)
#
# Environment: CUDA_HOME (default /usr/local/cuda), BUILD_DIR (default build),
# JOBS (default: number of cores). Debian/Ubuntu packages are installed with apt-get
# when missing (as root, or through sudo). The CUDA toolkit is a prerequisite that
# Debian does not package: this script checks for it and says what is missing.
set -euo pipefail

mode=run
case "${1:-}" in
  "") ;;
  --test) mode=test ;;
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup.sh: unknown argument '$1' (use --test or nothing)" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

# ---- the CUDA toolkit (not installable from Debian) ---------------------------------
cuda=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
missing=()
[ -f "$cuda/include/nvrtc.h" ] || missing+=("$cuda/include/nvrtc.h (NVRTC headers)")
[ -f "$cuda/include/cuda_bf16.h" ] || missing+=("$cuda/include/cuda_bf16.h (CUDA headers)")
ls "$cuda"/lib64/libnvrtc.so* "$cuda"/lib/libnvrtc.so* >/dev/null 2>&1 || \
  missing+=("$cuda/lib64/libnvrtc.so (NVRTC library)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: the CUDA toolkit (12.x or 13.x) was not found at $cuda:" >&2
  for m in "${missing[@]}"; do echo "  missing: $m" >&2; done
  echo "Install it from NVIDIA (https://developer.nvidia.com/cuda-downloads) and set" >&2
  echo "CUDA_HOME to its directory. No GPU or driver is needed to build and test." >&2
  exit 1
fi
[ -f "$cuda/include/nccl.h" ] || \
  echo "setup.sh: note: NCCL not found under $cuda; building without the NCCL communicator" >&2

# ---- Debian packages ------------------------------------------------------------------
pkgs=(build-essential cmake pkg-config liblua5.4-dev libcmocka-dev libcjson-dev libssl-dev valgrind
      libopenblas-dev libopenmpi-dev openmpi-bin clang libclang-rt-14-dev)
need=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "setup.sh: missing packages ${need[*]} and no apt-get: install them by hand" >&2
    exit 1
  fi
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup.sh: installing ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# ---- build ------------------------------------------------------------------------------
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$cuda"
cmake --build "$build" -j "$jobs"

if [ "$mode" = test ]; then
  ctest --test-dir "$build" --output-on-failure -j "$jobs"
else
  export MLAGEN_CACHE_DIR=${MLAGEN_CACHE_DIR:-$root/$build/jit-cache}
  "$build/mlagen" info
  "$build/mlagen" generate --out "$build/kernels"
  "$build/mlagen" compile
fi
