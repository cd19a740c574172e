#!/usr/bin/env bash
# tests/gpu/pack.sh [BUILD_DIR] [DEST]: the folder to carry to a lent GPU machine, which
# cannot install Lua, cJSON or cmocka (tests/gpu/README.md). Copies libmlagen.so (for the
# torchcuda step) and mlagen (the CLI, for
# run.sh's tune90 step) into DEST/build, mlagen_bench and
# mlagen_forms_check (and mlagen_forms_check_mpi with CARRY_MPI=1: it needs libmpi on the
# device) from BUILD_DIR/tests (default build) into DEST/build/tests (default build-h200,
# ignored by git), their shared libraries that the device image lacks into DEST/lib (every
# library ldd resolves except glibc's, libgcc_s, libstdc++, libcrypto and NVRTC, which the
# image has), and the wheel named by SANITIZER_WHEEL (nvidia-cuda-sanitizer-api 13.0) into
# DEST/. Prints the size (the device tool carries 64 MiB at most) and the run commands.
# DRY_RUN=1: print what would be copied.
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$SRC/build}
DEST=${2:-$SRC/build-h200}
bins="mlagen_bench mlagen_forms_check"
[ -n "${CARRY_MPI:-}" ] && bins="$bins mlagen_forms_check_mpi"
skip='/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcrypto|libnvrtc[^/]*|ld-linux[^/]*)\.so'
libs=$(for b in $bins; do ldd "$BUILD/tests/$b"; done; ldd "$BUILD/mlagen"; ldd "$BUILD/libmlagen.so")
libs=$(echo "$libs" | awk '/=> \//{print $3}' | sort -u | grep -Ev "$skip" || true)
if [ -n "${DRY_RUN:-}" ]; then
  echo "binaries: $bins (from $BUILD/tests), mlagen, libmlagen.so (from $BUILD)"; echo "libraries:"
  echo "$libs"; echo "wheel: ${SANITIZER_WHEEL:-none}"
  echo "(a run without DRY_RUN copies them into $DEST, prints its size and the device calls)"
  exit 0
fi
mkdir -p "$DEST/build/tests" "$DEST/lib"
for b in $bins; do cp "$BUILD/tests/$b" "$DEST/build/tests/"; done
cp "$BUILD/mlagen" "$DEST/build/" # run.sh's tune90 step
cp -L "$BUILD/libmlagen.so" "$DEST/build/libmlagen.so" # run.sh's torchcuda step (ctypes)
for l in $libs; do cp -L "$l" "$DEST/lib/"; done
if [ -n "${SANITIZER_WHEEL:-}" ]; then cp "$SANITIZER_WHEEL" "$DEST/"; fi
size=$(du -sbL "$DEST" | cut -f1)
echo "$DEST: $((size / 1048576)) MiB ($(ls "$DEST/lib" | tr '\n' ' '))"
[ "$size" -gt $((64 * 1048576)) ] && echo "WARNING: over the 64 MiB the device tool carries"
# DEST inside the repository is carried and named from the repository root on the device
# (\$PWD/rel); any other absolute DEST is named as it is.
case $DEST in
  "$SRC"/*) rel=${DEST#"$SRC"/}; at="\$PWD/$rel" ;;
  /*) rel=$DEST; at=$DEST ;;
  *) rel=$DEST; at="\$PWD/$DEST" ;;
esac
wheel=""
[ -n "${SANITIZER_WHEEL:-}" ] && wheel="SANITIZER_WHEEL=$at/$(basename "$SANITIZER_WHEEL") "
run="LD_LIBRARY_PATH=$at/lib NO_BUILD=1"
echo "run (carry $rel), one device call each, in this order (tests/gpu/README.md):"
echo "1. the sm_90a kernels (the H200's default forward and backward) checked, then timed beside cuDNN:"
echo "  $run STEPS=\"smi sm90 sm90peers\" BUDGET_S=460 bash tests/gpu/run.sh \$OUT/r $rel/build"
echo "2. the sm_90a tune sweep (the store under \$OUT/r/tuned to commit):"
echo "  $run STEPS=\"smi tune90\" BUDGET_S=460 bash tests/gpu/run.sh \$OUT/r $rel/build"
echo "3. the PyTorch package on CUDA tensors, checked, then the whole layer timed beside cuDNN's:"
echo "  $run STEPS=\"smi torchcuda layer\" BUDGET_S=560 bash tests/gpu/run.sh \$OUT/r $rel/build"
echo "4. as time allows: the default steps in three calls, then the mma.sync A/B and packed sequences:"
echo "  $run STEPS=\"smi bench forms forms16k nocausal f16\" bash tests/gpu/run.sh \$OUT/r $rel/build"
echo "  $run ${wheel}STEPS=\"sp2 sanitizer peers compare\" bash tests/gpu/run.sh \$OUT/r $rel/build"
echo "  $run ${wheel}STEPS=sanitizer90 bash tests/gpu/run.sh \$OUT/r $rel/build"
echo "  $run STEPS=\"formsmma varlen formsvl\" bash tests/gpu/run.sh \$OUT/r $rel/build"
# what this pack leaves those steps without (each is then NOT_RUN, never ok)
[ -n "${CARRY_MPI:-}" ] || \
  echo "note: sp2 will be NOT_RUN (mlagen_forms_check_mpi not carried): pack with CARRY_MPI=1 and carry Open MPI (tests/gpu/README.md)"
[ -n "${SANITIZER_WHEEL:-}" ] || \
  echo "note: sanitizer and sanitizer90 will be NOT_RUN (no compute-sanitizer on the device): pack with SANITIZER_WHEEL=<wheel>"
