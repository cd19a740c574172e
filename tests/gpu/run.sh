#!/usr/bin/env bash
# tests/gpu/run.sh OUTDIR [BUILD_DIR]: the GPU check and benchmark, in one command that
# finishes within 8 minutes on an H200 (see tests/gpu/README.md).
#   1. preflight: the tools found (OUTDIR/preflight.txt)        ~1 s
#   2. build mlagen_bench and mlagen_forms_check (CMake RelWithDebInfo, -j16) into BUILD_DIR
#      (default OUTDIR/build)                                     cap 120 s
#   3. nvidia-smi -q > OUTDIR/nvidia-smi-q.txt, its first 40 lines in nvidia-smi.txt  cap 10 s
#   4. mlagen_bench OUTDIR: the explicit (attn_*) and absorbed (mqa_*) attention kernels
#      checked vs float64, then timed with the layout kernels    cap 190 s
#   5. mlagen_forms_check OUTDIR: every form's forward + backward through the public API
#      vs the CPU executor (H 16, S 256), timed                   cap 60 s
#   6. torch_peer.py OUTDIR: PyTorch SDPA / FlashAttention, and SDPA on the absorbed MQA
#                                                                 cap 90 s
#   7. merge bench.csv and torch.csv: OUTDIR/compare.csv and a table with mlagen ms / peer ms
#                                                                 cap 10 s
# The caps add up to 480 s. A part that fails or times out is reported and the next part
# runs; the exit status is non-zero when any part failed. BENCH_ARGS / FORMS_ARGS /
# PEER_ARGS (environment) add arguments, e.g. BENCH_ARGS="--seqs 1024,4096"
# PEER_ARGS="--seqs 1024,4096".
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
START=$(date +%s)
FAILED=""
note() { echo "== [$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/run.log"; }
fail() { FAILED="$FAILED $1"; note "FAILED: $1 ($2)"; }

# 1. preflight
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "source: $SRC ($(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo 'no git')$(git -C "$SRC" diff --quiet 2>/dev/null || echo ', modified'))"
  for t in cmake cc c++ nvcc nvidia-smi python3 pkg-config; do
    printf '%-12s %s\n' "$t" "$(command -v $t || echo MISSING)"
  done
  echo "CUDA_HOME=${CUDA_HOME:-} ; /usr/local/cuda: $(ls -d /usr/local/cuda* 2>/dev/null | tr '\n' ' ')"
  ls /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda/lib/libnvrtc.so* 2>/dev/null | head -3
  ldconfig -p 2>/dev/null | grep -E 'libcublas\.so|libnvrtc\.so' | head -4
  python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1
  for p in lua5.4 libcjson openblas; do
    printf 'pkg-config %-8s %s\n' "$p" "$(pkg-config --modversion $p 2>/dev/null || echo MISSING)"
  done
  ls /usr/lib/x86_64-linux-gnu/libcmocka.so* /usr/lib/libcmocka.so* 2>/dev/null | head -1 || true
  nproc
} > "$OUT/preflight.txt" 2>&1
note "preflight: $OUT/preflight.txt"; cat "$OUT/preflight.txt"

# 2. build
BENCH="$BUILD/tests/mlagen_bench"
FORMS="$BUILD/tests/mlagen_forms_check"
if [ -n "${NO_BUILD:-}" ] && [ -x "$BENCH" ] && [ -x "$FORMS" ]; then
  note "NO_BUILD set: using the prebuilt $BENCH and $FORMS"
elif note "build into $BUILD" && timeout 120 bash -c "cmake -S '$SRC' -B '$BUILD' -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build '$BUILD' -j16 --target mlagen_bench mlagen_forms_check" \
     > "$OUT/build.log" 2>&1; then
  note "build ok"
else
  rc=$?
  tail -30 "$OUT/build.log"
  fail build "exit $rc$([ $rc = 124 ] && echo ', timed out'), see $OUT/build.log"
  [ -x "$BENCH" ] && note "using the existing $BENCH"
  [ -x "$FORMS" ] && note "using the existing $FORMS"
fi

# cuBLAS for mlagen_forms_check (the CUDA executor dlopens libcublas.so.13/.12/.11): when
# the loader does not know one, the toolkit's or PyTorch's (pip nvidia-cublas) copy
if [ -z "${MLAGEN_LIBCUBLAS:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.1[123] '; then
  for f in /usr/local/cuda/lib64/libcublas.so.1[321] /usr/local/cuda/lib/libcublas.so.1[321] \
           $(python3 -c 'import glob, site; print(" ".join(sorted(sum((glob.glob(p + "/nvidia/cu*/lib/libcublas.so.1*") for p in site.getsitepackages()), []))))' 2>/dev/null); do
    if [ -f "$f" ]; then export MLAGEN_LIBCUBLAS="$f"; break; fi
  done
fi
note "cuBLAS: ${MLAGEN_LIBCUBLAS:-libcublas.so.13/.12/.11 by the dynamic loader}"

# 3. the device
# (into a file first: with a pipe into head, nvidia-smi dies of SIGPIPE, exit 141)
if timeout 10 nvidia-smi -q > "$OUT/nvidia-smi-q.txt" 2>&1 && head -40 "$OUT/nvidia-smi-q.txt" > "$OUT/nvidia-smi.txt"; then
  note "nvidia-smi: $OUT/nvidia-smi.txt"
  grep -E "Product Name|Driver Version|CUDA Version" "$OUT/nvidia-smi.txt"
else
  fail nvidia-smi "exit $?"
fi

# 4. mlagen_bench (its own JIT cache under OUT, so a rerun on the same machine skips NVRTC)
if [ -x "$BENCH" ]; then
  note "mlagen_bench $OUT ${BENCH_ARGS:-}"
  # shellcheck disable=SC2086
  MLAGEN_CACHE_DIR="$OUT/jit-cache" timeout 190 "$BENCH" "$OUT" ${BENCH_ARGS:-} > "$OUT/bench.stdout" 2>&1
  rc=$?
  tail -40 "$OUT/bench.stdout"
  if [ $rc = 0 ]; then note "bench ok"; else fail bench "exit $rc$([ $rc = 124 ] && echo ', timed out')"; fi
else
  fail bench "no $BENCH"
fi

# 5. every form through the public API (the same JIT cache: kernels the bench built are hits)
if [ -x "$FORMS" ]; then
  note "mlagen_forms_check $OUT ${FORMS_ARGS:-}"
  # shellcheck disable=SC2086
  MLAGEN_CACHE_DIR="$OUT/jit-cache" timeout 60 "$FORMS" "$OUT" ${FORMS_ARGS:-} > "$OUT/forms.stdout" 2>&1
  rc=$?
  tail -20 "$OUT/forms.stdout"
  if [ $rc = 0 ]; then note "forms ok"; else fail forms "exit $rc$([ $rc = 124 ] && echo ', timed out')"; fi
else
  fail forms "no $FORMS"
fi

# 6. the peers
note "torch_peer.py $OUT ${PEER_ARGS:-}"
# shellcheck disable=SC2086
timeout 90 python3 "$SRC/tests/gpu/torch_peer.py" "$OUT" ${PEER_ARGS:-} > "$OUT/torch.stdout" 2>&1
rc=$?
tail -40 "$OUT/torch.stdout"
if [ $rc = 0 ]; then note "torch_peer ok"; else fail torch_peer "exit $rc$([ $rc = 124 ] && echo ', timed out')"; fi

# 7. merge: every mlagen row with an op (fwd, bwd, fwd_bwd) against every peer row of the
# same op, H, S and widths (d_qk, d_v: 192/128 explicit, 576/512 the absorbed MQA)
note "compare"
timeout 10 python3 - "$OUT" <<'EOF' || fail compare "exit $?"
import csv, os, sys
out = sys.argv[1]
def rows(name):
    p = os.path.join(out, name)
    return list(csv.DictReader(open(p))) if os.path.exists(p) else []
mine, peer = rows("bench.csv"), rows("torch.csv")
if not mine:
    print("no bench.csv rows"); sys.exit(1)
lines = []
hdr = f"{'mlagen':<18} {'peer':<20} {'op':<8} {'H':>4} {'S':>6} {'d_qk/d_v':>8} {'mlagen ms':>10} {'peer ms':>10} {'ratio':>7} {'mlagen TF/s':>11} {'peer TF/s':>9}"
print(hdr)
with open(os.path.join(out, "compare.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["mlagen", "peer", "op", "H", "S", "d_qk", "d_v", "mlagen_ms", "peer_ms",
                "ratio_mlagen_over_peer", "mlagen_tflops", "peer_tflops"])
    for m in mine:
        if not m["op"]:
            continue
        for p in peer:
            key = ("op", "H", "S", "d_qk", "d_v")
            if tuple(p[k] for k in key) != tuple(m[k] for k in key) or not p["ms"]:
                continue
            r = float(m["ms"]) / float(p["ms"])
            w.writerow([m["kernel"], p["impl"], m["op"], m["H"], m["S"], m["d_qk"], m["d_v"], m["ms"],
                        p["ms"], f"{r:.3f}", m["tflops"], p["tflops"]])
            print(f"{m['kernel']:<18} {p['impl']:<20} {m['op']:<8} {m['H']:>4} {m['S']:>6} "
                  f"{m['d_qk'] + '/' + m['d_v']:>8} {float(m['ms']):>10.3f} {float(p['ms']):>10.3f} "
                  f"{r:>7.2f} {m['tflops']:>11} {p['tflops']:>9}")
print(f"ratio = mlagen ms / peer ms (< 1: mlagen faster); written {os.path.join(out, 'compare.csv')}")
EOF

note "done in $(( $(date +%s) - START )) s; failed:${FAILED:- none}"
[ -z "$FAILED" ]
