#!/usr/bin/env bash
# setup.sh: install what mlagen needs, build it, then run the main job or the tests.
#
#   scripts/setup.sh           install, build, run the main job on DeepSeek-V3
#                              (mlagen info, generate, compile)
#   scripts/setup.sh --test    install, build, run the whole test suite (ctest); also
#                              torch and transformers (PyPI) into BUILD_DIR/venv
#
# Environment: CUDA_HOME (default /usr/local/cuda), BUILD_DIR (default build),
# JOBS (default: number of cores), MLAGEN_PYTHON (--test: a Python that already imports
# torch and transformers, used by the python tests instead of making BUILD_DIR/venv).
# Debian/Ubuntu packages are installed with apt-get when missing (as root, or through
# sudo). The CUDA toolkit is a prerequisite that Debian does not package: this script
# checks for it and says what is missing. A SASS reader (nvdisasm) comes from the toolkit,
# else from PyPI into BUILD_DIR/tools.
set -euo pipefail

mode=run
case "${1:-}" in
  "") ;;
  --test) mode=test ;;
  -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup.sh: unknown argument '$1' (use --test or nothing)" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
# pip as root (CI) warns on every call that it is root; it is on purpose here: say it never
export PIP_ROOT_USER_ACTION=ignore
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
apt_updated=""
# apt_install PKG...: apt-get install, after one apt-get update per run of this script
apt_install() {
  [ -n "$apt_updated" ] || $sudo apt-get update -qq
  apt_updated=1
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# ---- the CUDA toolkit (not installable from Debian) ---------------------------------
cuda=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
missing=()
[ -f "$cuda/include/nvrtc.h" ] || missing+=("$cuda/include/nvrtc.h (NVRTC headers)")
[ -f "$cuda/include/cuda_bf16.h" ] || missing+=("$cuda/include/cuda_bf16.h (CUDA headers)")
[ -f "$cuda/include/cuda.h" ] || missing+=("$cuda/include/cuda.h (CUDA driver API header)")
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
pkgs=(build-essential binutils python3 cmake pkg-config liblua5.4-dev libcmocka-dev libcjson-dev libssl-dev valgrind
      libopenblas-dev libopenmpi-dev openmpi-bin clang)
need=()
for p in "${pkgs[@]}"; do
  installed "$p" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "setup.sh: missing packages ${need[*]} and no apt-get: install them by hand" >&2
    exit 1
  fi
  echo "setup.sh: installing ${need[*]}"
  apt_install "${need[@]}"
fi
# clang's ASan/UBSan/libFuzzer runtime (tests/fuzz), packaged by clang's major version N:
# libclang-rt-N-dev (Debian 12, Ubuntu 22.04 and later; libclang-rt-dev is the default
# clang's), libclang-common-N-dev before that. The first of these installed or known to apt
# is the one (after an apt-get update where none is known yet).
clang_major=$({ clang --version 2>/dev/null || true; } | sed -n 's/.*clang version \([0-9][0-9]*\)\..*/\1/p' | head -1)
rt_pkgs=(${clang_major:+libclang-rt-$clang_major-dev} libclang-rt-dev
         ${clang_major:+libclang-common-$clang_major-dev})
rt=""
for _ in 1 2; do # twice: before and after an apt-get update
  for p in "${rt_pkgs[@]}"; do
    if installed "$p" || apt-cache show "$p" >/dev/null 2>&1; then rt=$p; break; fi
  done
  if [ -n "$rt" ] || [ -n "$apt_updated" ] || ! command -v apt-get >/dev/null; then break; fi
  $sudo apt-get update -qq
  apt_updated=1
done
if [ -z "$rt" ]; then
  echo "setup.sh: warning: no clang runtime package (${rt_pkgs[*]}) found for clang ${clang_major:-?}; the fuzzers cannot build" >&2
elif ! installed "$rt"; then
  echo "setup.sh: installing $rt (clang ${clang_major:-?}'s sanitizer runtime)"
  apt_install "$rt"
fi

# ---- a SASS reader for tests/test_device_header.c ---------------------------------------
# The toolkit's nvdisasm when it has one; else NVIDIA's nvdisasm wheel from PyPI, installed
# with pip --target into $build/tools (nothing of the system's Python is touched), where
# tests/CMakeLists.txt looks. PyPI has it for CUDA 13 only (nvidia-cuda-nvdisasm 13.2 and
# later): a 13.x toolkit gets its own minor (13.2 for 13.0 and 13.1), a 12.x toolkit the
# oldest 13.x, which reads the sm_80/sm_90a cubins of a CUDA 12 NVRTC as well (checked
# with NVRTC 12.9's). (cuobjdump -sass needs nvdisasm too, so nvdisasm alone.)
case $build in /*) tools=$build/tools ;; *) tools=$root/$build/tools ;; esac
if [ ! -x "$cuda/bin/nvdisasm" ] && ! ls "$tools"/nvidia/*/bin/nvdisasm >/dev/null 2>&1; then
  cuda_version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$cuda/include/cuda.h")
  [ -n "$cuda_version" ] || { echo "setup.sh: no CUDA_VERSION in $cuda/include/cuda.h" >&2; exit 1; }
  major=$((cuda_version / 1000)) minor=$((cuda_version % 1000 / 10))
  case $major in
    13) want="nvidia-cuda-nvdisasm==13.$((minor < 2 ? 2 : minor)).*" ;;
    12) want="nvidia-cuda-nvdisasm==13.2.*" ;;
    *) echo "setup.sh: CUDA $major.$minor in $cuda: 12.x or 13.x is needed" >&2; exit 1 ;;
  esac
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "setup.sh: installing python3-pip (for nvdisasm)"
    apt_install python3-pip
  fi
  pip=(python3 -m pip install -q --no-deps --disable-pip-version-check --target "$tools")
  echo "setup.sh: installing $want into $tools (CUDA $major.$minor has no nvdisasm)"
  # a toolkit newer than PyPI's newest: the newest 13.x. Without it (offline) the build
  # goes on; test_device_header then fails in CI and reports its SASS check skipped elsewhere.
  if ! { "${pip[@]}" "$want" || "${pip[@]}" "nvidia-cuda-nvdisasm>=13.2,<14"; } ||
     ! ls "$tools"/nvidia/*/bin/nvdisasm >/dev/null 2>&1; then
    echo "setup.sh: warning: nvdisasm could not be installed; the SASS check cannot run" >&2
  fi
fi

# ---- CuTe, the reference of tests/test_hopper_layout.cpp ---------------------------------
# The CUTLASS/CuTe headers of PyPI's nvidia-cutlass (headers under
# cutlass_library/source/include), installed like nvdisasm above with pip --target into
# $build/tools, no dependencies. A test reference only: the generated kernels never use it.
# Without it (offline) the build goes on; tool_missing_cute then fails in CI.
if ! [ -f "$tools/cutlass_library/source/include/cute/tensor.hpp" ]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "setup.sh: installing python3-pip (for nvidia-cutlass)"
    apt_install python3-pip
  fi
  echo "setup.sh: installing nvidia-cutlass (CuTe headers) into $tools"
  python3 -m pip install -q --no-deps --disable-pip-version-check --target "$tools" \
    "nvidia-cutlass>=4.0,<5" ||
    echo "setup.sh: warning: nvidia-cutlass could not be installed; test_hopper_layout cannot run" >&2
fi

# ---- PyTorch for the Python package's tests (--test only; python/, docs/torch.md) -----------
# torch and transformers from PyPI into a venv, $build/venv, where tests/CMakeLists.txt finds
# it; then the package itself (pip install ./python). PyPI's Linux torch is the CUDA build
# with NVIDIA's libraries (libtorch needs them to load, even on a CPU): 5.6 GiB, 9 min 17 s
# on a loaded 2-core machine, about 2 min on an idle one (the clean-clone run's 641 s less
# ctest's 454 s and the build), no pip cache; a venv already holding both is kept. The
# versions are the ones the tests were written against (torch 2.15, transformers 5.24). Without
# it (offline) the build goes on and the python tests fail in CI, skip elsewhere.
case $build in /*) venv=$build/venv ;; *) venv=$root/$build/venv ;; esac
# has_torch PYTHON: PYTHON imports torch and transformers (the python tests' needs)
has_torch() { "$1" -c "import torch, transformers" >/dev/null 2>&1; }
py=""  # --test: the python tests' interpreter, given to cmake (empty: its own rule, the venv)
if [ "$mode" = test ] && [ -n "${MLAGEN_PYTHON:-}" ]; then
  if has_torch "$MLAGEN_PYTHON"; then
    py=$MLAGEN_PYTHON
    echo "setup.sh: the python tests use $py (MLAGEN_PYTHON): no venv"
  else
    echo "setup.sh: MLAGEN_PYTHON=$MLAGEN_PYTHON cannot import torch and transformers: making $venv instead" >&2
  fi
fi
if [ "$mode" = test ] && [ -z "$py" ]; then
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || echo "setup.sh: warning: python3 -m venv failed" >&2
  fi
  if [ -x "$venv/bin/python" ]; then
    # Checked by importing both after the install, and tried twice: a CI run once ended with
    # torch in the venv and transformers not (pip exits non-zero after installing part of
    # what it resolved: a dropped connection, a full disk), and python_torch_hf then failed.
    for try in 1 2; do
      has_torch "$venv/bin/python" && break
      echo "setup.sh: installing torch and transformers from PyPI into $venv (minutes; try $try of 2)"
      "$venv/bin/pip" install -q --disable-pip-version-check "torch==2.15.*" "transformers==5.24.*" ||
        echo "setup.sh: warning: pip install torch transformers exited $? (try $try)" >&2
    done
    if ! err=$("$venv/bin/python" -c "import torch, transformers" 2>&1); then
      echo "setup.sh: warning: torch/transformers are not importable from $venv: ${err##*$'\n'}" >&2
      echo "setup.sh: free disk space under $venv: $(df -h "$venv" 2>/dev/null | awk 'NR == 2 { print $4 }')" >&2
    fi
    "$venv/bin/pip" install -q --disable-pip-version-check ./python ||
      echo "setup.sh: warning: pip install ./python failed" >&2
  fi
fi

# ---- build ------------------------------------------------------------------------------
pyarg=()  # --test: always given, so that a value cached by an earlier configure goes too
[ "$mode" = test ] && pyarg=("-DMLAGEN_PYTHON=$py")
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$cuda" ${pyarg[@]+"${pyarg[@]}"}
cmake --build "$build" -j "$jobs"

if [ "$mode" = test ]; then
  ctest --test-dir "$build" --output-on-failure -j "$jobs"
else
  export MLAGEN_CACHE_DIR=${MLAGEN_CACHE_DIR:-$root/$build/jit-cache}
  "$build/mlagen" info
  "$build/mlagen" generate --out "$build/kernels"
  "$build/mlagen" compile
fi
