#!/usr/bin/env bash
# tests/gpu/run.sh OUTDIR [BUILD_DIR]: the GPU checks and benchmark (tests/gpu/README.md).
# Steps (STEPS selects, default all, in this order; cap = the step's `timeout`, s):
#   build     mlagen_bench, mlagen_forms_check(_mpi) (skipped: NO_BUILD=1)        cap 120
#   smi       nvidia-smi -q                                                          cap  10
#   bench     mlagen_bench: kernels checked vs float64, then timed                  cap 150
#   sm90      (not in the default; sm_90a only) mlagen_bench --sm90 into OUT/sm90:
#             attn_fwd_sm90 and attn_fwd checked vs float64 (H 2 at S 256, each H at
#             S 200: partial tiles; causal and not), the deterministic backward (pre +
#             dkdv + dq, mma.sync and sm_90a) likewise (causal), then timed side by side
#             at H 16,128 x S 1024..16384, the forwards causal and not, the backwards
#             causal; and mqa_fwd_sm90 beside mqa_fwd, pre + mqa_bwd_dkv_sm90 +
#             mqa_bwd_dq_sm90 beside pre + mqa_bwd_dkv + mqa_bwd_dq (576/512, causal)
#             checked vs tests/mqa_ref.h, timed at the same H x S; each timed sequence
#             of at most ~1.5 s or 8 launches (--row-budget-ms 1500: 144 timed
#             sequences, 216 rows, est. ~130 s; SM90_ARGS added)                      cap 300
#   varlen    (not in the default) mlagen_bench --varlen into OUT/varlen: packed
#             sequences (issue 16): the varlen attn_fwd (and on sm_90a attn_fwd_sm90),
#             deterministic backward and mqa_* beside
#             the fixed-length ones at equal lengths (N = 65536 / S documents of S, S in
#             1024, 4096, 16384), then a packed stream of mixed lengths (log-uniform in
#             512 .. 16384, 64k tokens) beside the same documents padded to the longest;
#             H 16, 128; FLOPs per document pair; at H 16 the varlen outputs (O, LSE,
#             dq; at equal lengths dk, dk_rope, dv, dc too) checked against the
#             fixed-length ones (VARLEN_ARGS added)                                  cap 300
#   tune90    (not in the default; sm_90a only) mlagen tune of the sm_90a explicit families
#             (attn_fwd_sm90, attn_bwd_dkdv_sm90, attn_bwd_dq_sm90: tiles, stages, overlap,
#             ping-pong) for DeepSeek-V3 at --sp ${TUNE_SP:-8} (H 16 per rank), causal,
#             timed at S 8192, merged into a copy of tuned/ under OUT/tuned (commit
#             OUT/tuned/sm_90a/<device>.json); TUNE_ARGS added                        cap 420
#   sm90peers (not in the default) torch_peer.py --causal 1,0 --peers sdpa_cudnn,flash_attn3
#             --ops fwd,fwd_bwd into OUT/sm90 (PEER_ARGS added), then compare.py OUT/sm90 cap 150
#   forms     every form through the API at S 4096 (tuned bucket), causal, bf16,
#             full float64 reference, two runs bit for bit, timed; the executor runs
#             what it chooses for the device (sm_90a: attn_fwd_sm90 for the explicit
#             and LAGA forwards, generator/gen/mg_spec.c mg_arch_kernel_table)      cap 120
#   formsmma  (not in the default) the same with MLAGEN_MMA_SYNC=1 (the mma.sync
#             attn_fwd) into OUT/forms-mma: the whole layer's A/B against forms   cap 120
#   forms16k  the same at S 16384 (bucket 16384), reference on rows [0,128) and the
#             last 512 (--ref-rows 512), not timed                                   cap  90
#   nocausal  S 4096 non-causal, full reference, not timed                           cap  90
#   f16       S 1024 f16: checked, or "refused by the API"                           cap  45
#   formsvl   (not in the default) every form's varlen plan (packed sequences, issue 16)
#             through the API at capacity 4096: documents 1, 2, 0, 17, 1024 and the rest
#             of 3840 tokens, NaN in the 256 slack input rows; each document's float64
#             reference, slack outputs exactly 0 (lse -inf); two runs bit for bit, timed cap 120
#   sp2       mpirun -np 2 mlagen_forms_check_mpi --sp 2 (S 1024): both processes on
#             the one GPU, collectives staged through host memory over MPI           cap  90
#   sanitizer compute-sanitizer memcheck, racecheck, synccheck over mlagen_bench
#             --check-only --heads 2 (every kernel's check: H 2 at S 256/255 and 200)
#             60 s, 120 s (racecheck), 60 s                                          cap 240
#   sanitizer90 (sm_90a only) the same over mlagen_bench --sm90 --check-only --heads 2: the
#             sm_90a kernels' checks (attn_fwd_sm90, the executor's forward on an H200, the
#             sm_90a backward, mqa_*_sm90, beside their mma.sync peers); on a device that
#             nvidia-smi says is not compute capability 9.0: NOT_RUN                cap 240
#   peers     torch_peer.py (NOT_RUN where python3 cannot import torch)              cap  90
#   torchcuda (not in the default) tests/gpu/torch_cuda.py: the PyTorch package on CUDA
#             tensors (every form bf16 causal at DeepSeek-V3 heads, H 16, B 2, S 300;
#             explicit non-causal and f16; laga on a packed stream; a side stream's and a
#             second call's forward bit for bit) per element vs tests/python/common.py's
#             float64 reference at gpu_tol.h's bounds; libmlagen.so: MLAGEN_LIBRARY, else
#             BUILD_DIR/libmlagen.so (NOT_RUN without torch or a CUDA device);
#             TORCHCUDA_ARGS added ("--device cpu": the same cases in float32 on the
#             C API's CPU device, to try the step where there is no GPU)              cap 240
#   layer     (not in the default) tests/gpu/torch_layer.py into OUT/layer: the whole layer
#             (the op's boundary) forward and forward+backward through mlagen's PyTorch op,
#             every form, beside the same layer in PyTorch with cuDNN attention, timed
#             (CUDA events, median): DeepSeek-V3 heads, H 16 (one rank of SP 8), S 16384,
#             B 1, bf16, causal; issue 14's layer target. LAYER_ARGS added        cap 300
#   compare   bench.csv x torch.csv -> compare.csv (NOT_RUN: no rows in either)      cap  10
# Every step prints one parseable line:  STEP <name> <ok|ok (unchecked)|FAILED|TIMEOUT|NOT_RUN|REFUSED> <s>s <why>
# and the script ends with:  SUMMARY ok=<..> failed=<..> not_run=<..> refused=<..> unchecked=<..> total=<s>s
# ("ok (unchecked)": the step ran and succeeded but its check was skipped or absent, e.g.
# --no-check, or varlen at H > 16 only; counted with NOT_RUN for the exit status 3)
# A step that fails or times out is FAILED/TIMEOUT, the next step runs, and the exit status
# is 1 at the end. NOT_RUN (a tool or binary absent, or the time budget) and REFUSED (the
# API refused f16) are never "ok" and are listed in the summary; without a failure they make
# the exit status 3 (incomplete: a check that did not run is no pass), unless
# ALLOW_INCOMPLETE=1 (or DRY_RUN=1) says that is expected.
# Budget guard: a step whose cap would end past BUDGET_S (default 560 s since the start)
# is NOT_RUN ("time budget"). One device call runs at most 600 s: run the default in three
# calls, e.g. STEPS="smi bench forms forms16k nocausal f16" then
# STEPS="sp2 sanitizer peers compare", then STEPS=sanitizer90 (same OUTDIR: the JIT cache
# is reused). Issue 14's
# Hopper attention in one call of under 8 minutes: STEPS="smi sm90 sm90peers" (BUDGET_S=460).
# Packed sequences in one call: STEPS="build smi varlen" (BUDGET_S=460). The sm_90a tune
# sweep in one call: STEPS="smi tune90" (BUDGET_S=460).
# The bench's check runs every check twice (bitwise); under a sanitizer too.
# Environment: BENCH_ARGS, SM90_ARGS, VARLEN_ARGS, TUNE_SP, TUNE_ARGS, FORMS_ARGS (added to every forms step), PEER_ARGS, TORCHCUDA_ARGS, LAYER_ARGS; NO_BUILD=1;
# COMPUTE_SANITIZER (the binary), SANITIZER_WHEEL (a carried nvidia-cuda-sanitizer-api
# wheel, unpacked into OUTDIR/tools); MPIRUN (default mpirun); DRY_RUN=1 prints each step's
# command instead of running it (every step then NOT_RUN "dry run"), then the budget guard's
# verdict were every step to take its whole cap (which steps a real run would cut).
set -u
if [ $# -lt 1 ]; then
  echo "usage: $0 OUTDIR [BUILD_DIR]" >&2
  exit 2
fi
OUT=$1
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
BUILD=${2:-$OUT/build}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
STEPS=${STEPS:-build smi bench forms forms16k nocausal f16 sp2 sanitizer sanitizer90 peers compare}
BUDGET_S=${BUDGET_S:-560}
START=$(date +%s)
DRY_SUM=0 DRY_END=0 DRY_CUT="" DRY_NOTE="" # DRY_RUN=1: the budget guard simulated (step)
OK="" FAILED="" NOT_RUN="" REFUSED="" UNCHECKED=""
elapsed() { echo $(( $(date +%s) - START )); }
note() { echo "== [$(elapsed)s] $*" | tee -a "$OUT/run.log"; }
# result NAME STATUS T0 WHY
result() {
  local s=$(( $(date +%s) - $3 ))
  echo "STEP $1 $2 ${s}s $4" | tee -a "$OUT/run.log"
  case $2 in
    ok) OK="$OK $1" ;;
    "ok (unchecked)") UNCHECKED="$UNCHECKED $1" ;;
    NOT_RUN) NOT_RUN="$NOT_RUN $1" ;;
    REFUSED) REFUSED="$REFUSED $1" ;;
    *) FAILED="$FAILED $1" ;;
  esac
}
want() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# step NAME CAP LOG CMD...: runs CMD with `timeout CAP` into OUT/LOG unless the budget or
# DRY_RUN says otherwise; sets RC (the exit status; 124 timed out; -1 not run).
step() {
  local name=$1 cap=$2 log=$3
  shift 3
  T0=$(date +%s)
  RC=-1
  if [ $(( $(elapsed) + cap )) -gt "$BUDGET_S" ]; then
    result "$name" NOT_RUN "$T0" "time budget: ${cap}s cap past BUDGET_S=${BUDGET_S}s at $(elapsed)s"
    return
  fi
  note "$name: $* (cap ${cap}s)"
  if [ -n "${DRY_RUN:-}" ]; then
    # the guard above as a real run would meet it, were every step to take its whole cap
    # (DRY_END: the simulated seconds since the start; DRY_CUT: the steps it would cut)
    DRY_SUM=$(( DRY_SUM + cap ))
    local past=""
    if [ $(( DRY_END + cap )) -gt "$BUDGET_S" ]; then DRY_CUT="$DRY_CUT $name" past="; at the caps, past the budget"
    else DRY_END=$(( DRY_END + cap )); fi
    result "$name" NOT_RUN "$T0" "dry run${DRY_NOTE:+; $DRY_NOTE}$past"
    return
  fi
  timeout "$cap" "$@" > "$OUT/$log" 2>&1
  RC=$?
  tail -25 "$OUT/$log"
}
# finish NAME [WHY [LOG [unchecked]]]: the verdict from RC for a plain step; with "unchecked"
# (the step's check was skipped or absent) a success is "ok (unchecked)", never "ok"
finish() {
  [ "$RC" = -1 ] && return
  if [ "$RC" = 0 ] && [ "${4:-}" = unchecked ]; then result "$1" "ok (unchecked)" "$T0" "${2:-}"
  elif [ "$RC" = 0 ]; then result "$1" ok "$T0" "${2:-}"
  elif [ "$RC" = 124 ]; then result "$1" TIMEOUT "$T0" "timed out, see $OUT/$3${2:+; $2}"
  else result "$1" FAILED "$T0" "exit $RC, see $OUT/$3${2:+; $2}"
  fi
}

# torch for the peers (NO_TORCH: why python3 cannot import it; empty when it can)
NO_TORCH=""
TORCH=$(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>&1) ||
  NO_TORCH=$(echo "$TORCH" | tail -1)
TORCH=$(echo "$TORCH" | tail -1)
# peer_step NAME CAP LOG CMD...: step for a command that needs torch: NOT_RUN without it
peer_step() {
  if [ -n "$NO_TORCH" ] && [ -z "${DRY_RUN:-}" ]; then
    T0=$(date +%s) RC=-1
    result "$1" NOT_RUN "$T0" "no torch: python3 cannot import it ($NO_TORCH)"
    return
  fi
  [ -n "$NO_TORCH" ] && DRY_NOTE="no torch: a real run is NOT_RUN"
  step "$@"
  DRY_NOTE=""
}
# preflight (always): the tools found
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "source: $SRC ($(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo 'no git')$(git -C "$SRC" diff --quiet 2>/dev/null || echo ', modified'))"
  for t in cmake cc c++ nvcc nvidia-smi python3 pkg-config mpirun compute-sanitizer; do
    printf '%-18s %s\n' "$t" "$(command -v $t || echo MISSING)"
  done
  echo "CUDA_HOME=${CUDA_HOME:-} ; /usr/local/cuda: $(ls -d /usr/local/cuda* 2>/dev/null | tr '\n' ' ')"
  ls /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null
  ldconfig -p 2>/dev/null | grep -E 'libcublas\.so|libnvrtc\.so|libmpi\.so' | head -6
  if [ -n "$NO_TORCH" ]; then echo "torch: not importable ($NO_TORCH)"; else echo "torch: $TORCH"; fi
  echo "cores: $(nproc)"
} > "$OUT/preflight.txt" 2>&1
note "preflight: $OUT/preflight.txt; steps: $STEPS; budget ${BUDGET_S}s"
cat "$OUT/preflight.txt"

BENCH="$BUILD/tests/mlagen_bench"
FORMS="$BUILD/tests/mlagen_forms_check"
FORMS_MPI="$BUILD/tests/mlagen_forms_check_mpi"
export MLAGEN_CACHE_DIR="$OUT/jit-cache"
# have BIN: BIN is there to run (a dry run takes every binary as there: its build step
# prints its command instead of building, and each step then prints its own)
have() { [ -n "${DRY_RUN:-}" ] || [ -x "$1" ]; }

if want build; then
  if [ -n "${NO_BUILD:-}" ] && [ -x "$BENCH" ] && [ -x "$FORMS" ]; then
    T0=$(date +%s); result build NOT_RUN "$T0" "NO_BUILD set: prebuilt $BENCH, $FORMS"
  else
    step build 120 build.log bash -c "cmake -S '$SRC' -B '$BUILD' -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build '$BUILD' -j16 --target mlagen_bench mlagen_forms_check mlagen_shared && { cmake --build '$BUILD' -j16 --target mlagen_forms_check_mpi || echo 'no MPI: mlagen_forms_check_mpi not built'; }"
    finish build "" build.log
  fi
fi

# cuBLAS for the forms steps: the loader's, else the toolkit's or PyTorch's copy
if [ -z "${MLAGEN_LIBCUBLAS:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.1[123] '; then
  for f in /usr/local/cuda/lib64/libcublas.so.1[321] /usr/local/cuda/lib/libcublas.so.1[321] \
           $(python3 -c 'import glob, site; print(" ".join(sorted(sum((glob.glob(p + "/nvidia/cu*/lib/libcublas.so.1*") for p in site.getsitepackages()), []))))' 2>/dev/null); do
    if [ -f "$f" ]; then export MLAGEN_LIBCUBLAS="$f"; break; fi
  done
fi
note "cuBLAS: ${MLAGEN_LIBCUBLAS:-libcublas.so.13/.12/.11 by the dynamic loader}"

if want smi; then
  step smi 10 nvidia-smi-q.txt nvidia-smi -q
  [ "$RC" = 0 ] && grep -E "Product Name|Driver Version|CUDA Version" "$OUT/nvidia-smi-q.txt"
  finish smi "" nvidia-smi-q.txt
fi

if want bench; then
  if have "$BENCH"; then
    # shellcheck disable=SC2086
    step bench 150 bench.stdout "$BENCH" "$OUT" ${BENCH_ARGS:-}
    finish bench "" bench.stdout
  else T0=$(date +%s); result bench FAILED "$T0" "no $BENCH"; fi
fi

if want sm90; then
  if have "$BENCH"; then
    # shellcheck disable=SC2086
    step sm90 300 sm90.stdout "$BENCH" "$OUT/sm90" --sm90 --jobs 16 --row-budget-ms 1500 ${SM90_ARGS:-}
    why=$(grep -m1 -E '^check passed|correctness misses|check SKIPPED' "$OUT/sm90.stdout" 2>/dev/null)
    finish sm90 "$why" sm90.stdout "$(case $why in "check passed"*) ;; *) echo unchecked ;; esac)"
  else T0=$(date +%s); result sm90 FAILED "$T0" "no $BENCH"; fi
fi

if want varlen; then
  if have "$BENCH"; then
    # shellcheck disable=SC2086
    step varlen 300 varlen.stdout "$BENCH" "$OUT/varlen" --varlen --jobs 16 --row-budget-ms 1500 --seqs 1024,4096,16384 ${VARLEN_ARGS:-}
    why=$(grep -E 'varlen check (passed|SKIPPED)|varlen check misses' "$OUT/varlen.stdout" 2>/dev/null | tail -1)
    finish varlen "${why:-no varlen check (none at these heads: H <= 16 only)}" varlen.stdout \
      "$(case $why in "varlen check passed"*) ;; *) echo unchecked ;; esac)"
  else T0=$(date +%s); result varlen FAILED "$T0" "no $BENCH"; fi
fi

if want tune90; then
  MLAGEN="$BUILD/mlagen"
  if have "$MLAGEN"; then
    rm -rf "$OUT/tuned" && cp -r "$SRC/tuned" "$OUT/tuned"
    # shellcheck disable=SC2086
    step tune90 420 tune90.stdout env MLAGEN_TUNED_DIR="$OUT/tuned" "$MLAGEN" tune --model deepseek-v3 \
      --sp "${TUNE_SP:-8}" --arch sm_90a --family attn_fwd_sm90 --family attn_bwd_dkdv_sm90 \
      --family attn_bwd_dq_sm90 --causal --seq 8192 ${TUNE_ARGS:-}
    finish tune90 "$(grep -m1 -E 'candidates:' "$OUT/tune90.stdout" 2>/dev/null)" tune90.stdout
  else T0=$(date +%s); result tune90 FAILED "$T0" "no $MLAGEN (tests/gpu/pack.sh carries it)"; fi
fi

if want sm90peers; then
  # shellcheck disable=SC2086
  peer_step sm90peers 150 sm90peers.stdout bash -c "python3 '$SRC/tests/gpu/torch_peer.py' '$OUT/sm90' --causal 1,0 --peers sdpa_cudnn,flash_attn3 --ops fwd,fwd_bwd --mqa-seqs= ${PEER_ARGS:-} && python3 '$SRC/tests/gpu/compare.py' '$OUT/sm90'"
  finish sm90peers "" sm90peers.stdout
fi

# forms_step NAME CAP OUTSUB ARGS...: mlagen_forms_check into OUT/OUTSUB; exit 4 = REFUSED;
# FORMS_ENV (optional, VAR=VALUE): set for the binary through env, in the printed command too
forms_step() {
  local name=$1 cap=$2 sub=$3
  shift 3
  if ! have "$FORMS"; then T0=$(date +%s); result "$name" FAILED "$T0" "no $FORMS"; return; fi
  # shellcheck disable=SC2086
  step "$name" "$cap" "$sub.stdout" ${FORMS_ENV:+env "$FORMS_ENV"} "$FORMS" "$OUT/$sub" "$@" ${FORMS_ARGS:-}
  if [ "$RC" = 4 ]; then result "$name" REFUSED "$T0" "refused by the API: $(grep -s -m1 'refused by the API' "$OUT/$sub.stdout")"
  else
    why=$(grep -s -m1 '^forms: ' "$OUT/$sub.stdout")
    finish "$name" "$why" "$sub.stdout" "$(case $why in *"not checked"*) echo unchecked ;; esac)"
  fi
}
want forms && forms_step forms 120 forms --seq 4096
want formsmma && FORMS_ENV=MLAGEN_MMA_SYNC=1 forms_step formsmma 120 forms-mma --seq 4096
want forms16k && forms_step forms16k 90 forms16k --seq 16384 --ref-rows 512 --iters 0
want nocausal && forms_step nocausal 90 forms-nocausal --seq 4096 --no-causal --iters 0
want f16 && forms_step f16 45 forms-f16 --seq 1024 --dtype f16 --iters 0
want formsvl && forms_step formsvl 120 forms-varlen --seq 4096 --varlen

if want sp2; then
  T0=$(date +%s)
  MPIRUN=${MPIRUN:-mpirun}
  if ! have "$FORMS_MPI"; then result sp2 NOT_RUN "$T0" "no $FORMS_MPI (built without MPI)"
  elif ! command -v "$MPIRUN" > /dev/null; then result sp2 NOT_RUN "$T0" "no $MPIRUN on this machine"
  else
    if [ -n "${DRY_RUN:-}" ] && [ ! -x "$FORMS_MPI" ]; then # said, as the sanitizer's absence
      DRY_NOTE="${DRY_NOTE:+$DRY_NOTE; }no $FORMS_MPI: a real run is NOT_RUN unless the build step makes it"
      note "no $FORMS_MPI yet (pack.sh carries it with CARRY_MPI=1)"
    fi
    flags=""
    "$MPIRUN" --version 2>&1 | grep -q "Open MPI" && flags="--allow-run-as-root --oversubscribe"
    # shellcheck disable=SC2086
    step sp2 90 forms-sp2.stdout "$MPIRUN" -np 2 $flags "$FORMS_MPI" "$OUT/forms-sp2" --sp 2 --seq 1024 ${FORMS_ARGS:-}
    why=$(grep -m1 '^forms: ' "$OUT/forms-sp2.stdout" 2>/dev/null)
    finish sp2 "$why" forms-sp2.stdout "$(case $why in *"not checked"*) echo unchecked ;; esac)"
    DRY_NOTE=""
  fi
fi

# find_sanitizer: SAN = compute-sanitizer ($COMPUTE_SANITIZER, PATH, /usr/local/cuda*, pip
# nvidia-cuda-sanitizer-api, SANITIZER_WHEEL unpacked into OUT/tools), empty when none (once)
SAN_LOOKED=""
find_sanitizer() {
  [ -n "$SAN_LOOKED" ] && return
  SAN_LOOKED=1
  SAN=${COMPUTE_SANITIZER:-}
  for c in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda*/bin/compute-sanitizer \
           /usr/local/cuda*/compute-sanitizer/compute-sanitizer "$OUT"/tools/nvidia/cu*/bin/compute-sanitizer \
           $(python3 -c 'import glob, site; print(" ".join(sorted(sum((glob.glob(p + "/nvidia/cu*/bin/compute-sanitizer") for p in site.getsitepackages()), []))))' 2>/dev/null); do
    [ -z "$SAN" ] && [ -n "$c" ] && [ -x "$c" ] && SAN=$c
  done
  if [ -z "$SAN" ] && [ -n "${SANITIZER_WHEEL:-}" ] && [ -f "$SANITIZER_WHEEL" ]; then
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$SANITIZER_WHEEL" "$OUT/tools" &&
      chmod +x "$OUT"/tools/nvidia/cu*/bin/compute-sanitizer 2>/dev/null
    for c in "$OUT"/tools/nvidia/cu*/bin/compute-sanitizer; do [ -x "$c" ] && SAN=$c; done
  fi
  [ -n "$SAN" ] && note "compute-sanitizer: $SAN ($("$SAN" --version 2>&1 | tail -1))"
}
# sanitize NAME BENCH_ARGS...: compute-sanitizer memcheck (cap 60), racecheck (120) and
# synccheck (60) over mlagen_bench OUT/NAME-<tool> --check-only --heads 2 --jobs 16 BENCH_ARGS,
# the steps NAME-<tool> (NOT_RUN without compute-sanitizer; a dry run prints the commands
# all the same; FAILED when the tool reports errors: its exit code 9)
sanitize() {
  local name=$1 nosan="compute-sanitizer not found (COMPUTE_SANITIZER, PATH, /usr/local/cuda*, pip nvidia-cuda-sanitizer-api, SANITIZER_WHEEL)"
  shift
  T0=$(date +%s)
  find_sanitizer
  if [ -z "$SAN" ] && [ -z "${DRY_RUN:-}" ]; then
    for t in memcheck racecheck synccheck; do result "$name-$t" NOT_RUN "$T0" "$nosan"; done
    return
  elif ! have "$BENCH"; then
    for t in memcheck racecheck synccheck; do result "$name-$t" FAILED "$T0" "no $BENCH"; done
    return
  fi
  local san=$SAN
  if [ -z "$san" ]; then # a dry run prints the commands all the same
    san=compute-sanitizer DRY_NOTE="${DRY_NOTE:+$DRY_NOTE; }compute-sanitizer not found: a real run is NOT_RUN"
    note "$nosan"
  fi
  for t in memcheck racecheck synccheck; do
    extra="" cap=60
    [ $t = racecheck ] && extra="--racecheck-report all" cap=120
    # shellcheck disable=SC2086
    step "$name-$t" $cap "$name-$t.log" "$san" --tool $t $extra --error-exitcode 9 --print-limit 20 \
      "$BENCH" "$OUT/$name-$t" --check-only --heads 2 --jobs 16 "$@"
    if [ "$RC" = 9 ]; then result "$name-$t" FAILED "$T0" "$t reported errors: $(grep -s -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$name-$t.log")"
    else finish "$name-$t" "$(grep -s -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY|needs an sm_90a device' "$OUT/$name-$t.log")" "$name-$t.log"; fi
  done
  DRY_NOTE=""
}
want sanitizer && sanitize sanitizer

# sanitizer90: the same over mlagen_bench --sm90 (the sm_90a kernels: attn_fwd_sm90, the
# executor's forward on an H200, the sm_90a backward and mqa_*_sm90), on an sm_90a device
# only: device 0 (CUDA_VISIBLE_DEVICES' first) by nvidia-smi's compute_cap; on another one
# each sanitizer90-<tool> is NOT_RUN (no sm_90a kernel runs there); where nvidia-smi cannot
# tell, it runs and the bench says (it refuses --sm90 elsewhere: FAILED)
if want sanitizer90; then
  T0=$(date +%s)
  dev=${CUDA_VISIBLE_DEVICES:-0}
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader -i "${dev%%,*}" 2>/dev/null | head -1 | tr -d ' \r')
  if [ -n "${DRY_RUN:-}" ]; then
    DRY_NOTE="sm_90a only (device 0: compute capability ${cc:-unknown})"
    sanitize sanitizer90 --sm90
  elif [ -n "$cc" ] && [ "$cc" != 9.0 ]; then
    for t in memcheck racecheck synccheck; do
      result "sanitizer90-$t" NOT_RUN "$T0" "sm_90a only: device ${dev%%,*} is compute capability $cc (nvidia-smi)"
    done
  else
    [ -z "$cc" ] && note "sanitizer90: nvidia-smi gives no compute capability; the bench decides"
    sanitize sanitizer90 --sm90
  fi
fi

if want peers; then
  # shellcheck disable=SC2086
  peer_step peers 90 torch.stdout python3 "$SRC/tests/gpu/torch_peer.py" "$OUT" ${PEER_ARGS:-}
  finish peers "" torch.stdout
fi

# py_step NAME CAP SCRIPT ARGS...: tests/gpu/SCRIPT over the PyTorch package (python/; torch
# from this machine, libmlagen.so from MLAGEN_LIBRARY, else BUILD_DIR) into OUT/NAME.stdout;
# NOT_RUN without torch or when the script exits 77 (torch sees no CUDA device); the verdict's
# note is the script's summary line "NAME: <count> ...".
py_step() {
  local name=$1 cap=$2 script=$3 lib=${MLAGEN_LIBRARY:-$BUILD/libmlagen.so}
  shift 3
  case $lib in /*) ;; *) lib=$PWD/$lib ;; esac
  if [ -z "$NO_TORCH" ] && [ ! -e "$lib" ] && [ -z "${DRY_RUN:-}" ]; then # (without torch: NOT_RUN below)
    T0=$(date +%s); result "$name" FAILED "$T0" "no $lib (tests/gpu/pack.sh carries it)"; return
  fi
  peer_step "$name" "$cap" "$name.stdout" env MLAGEN_LIBRARY="$lib" \
    PYTHONPATH="$SRC/python:$SRC/tests/python${PYTHONPATH:+:$PYTHONPATH}" python3 "$SRC/tests/gpu/$script" "$@"
  if [ "$RC" = 77 ]; then result "$name" NOT_RUN "$T0" "torch sees no CUDA device"
  else finish "$name" "$(grep -s -m1 "^$name: [0-9]" "$OUT/$name.stdout")" "$name.stdout"; fi
}
# shellcheck disable=SC2086
want torchcuda && py_step torchcuda 240 torch_cuda.py ${TORCHCUDA_ARGS:-}
# shellcheck disable=SC2086
want layer && py_step layer 300 torch_layer.py "$OUT/layer" ${LAYER_ARGS:-}

if want compare; then
  step compare 10 compare.stdout python3 "$SRC/tests/gpu/compare.py" "$OUT"
  if [ "$RC" = 3 ]; then result compare NOT_RUN "$T0" "$(tail -1 "$OUT/compare.stdout")"
  else finish compare "" compare.stdout; fi
fi

if [ -n "${DRY_RUN:-}" ]; then
  if [ -n "$DRY_CUT" ]; then
    note "budget: caps ${DRY_SUM} s against BUDGET_S ${BUDGET_S} s: the guard cuts a step when the seconds since the start plus its cap exceed BUDGET_S, so a real run whose steps each took their whole cap would cut $(echo "$DRY_CUT" | sed 's/^ //; s/ /, /g') (the others end by ${DRY_END} s)"
  else
    note "budget: caps ${DRY_SUM} s against BUDGET_S ${BUDGET_S} s: every step fits even at its whole cap"
  fi
fi

total=$(elapsed)
echo "SUMMARY ok=$(echo $OK | tr ' ' ,) failed=$(echo $FAILED | tr ' ' ,) not_run=$(echo $NOT_RUN | tr ' ' ,) refused=$(echo $REFUSED | tr ' ' ,) unchecked=$(echo $UNCHECKED | tr ' ' ,) total=${total}s" | tee -a "$OUT/run.log"
[ -z "$FAILED" ] || exit 1
# NO_BUILD=1: prebuilt, not a gap (no echo | grep here: an empty NOT_RUN gave one blank line,
# and a run whose every step passed exited 3)
missing=$(for s in $NOT_RUN; do [ "$s" = build ] || printf '%s ' "$s"; done)
if [ -n "$missing$REFUSED$UNCHECKED" ] && [ "${ALLOW_INCOMPLETE:-0}" != 1 ] && [ "${DRY_RUN:-0}" != 1 ]; then
  echo "INCOMPLETE: not run: $missing; refused:$REFUSED; unchecked:$UNCHECKED (exit 3; ALLOW_INCOMPLETE=1 accepts this)" | tee -a "$OUT/run.log"
  exit 3
fi
