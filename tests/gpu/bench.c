/* bench.c (mlagen_bench): the generated attention kernels on a real GPU, checked against
 * float64 references and timed with CUDA events.
 *
 *   mlagen_bench OUTDIR [--seqs 1024,4096,8192,16384] [--heads 16,128] [--iters 20]
 *                       [--warmup 3] [--sets 4] [--seed N] [--check-only] [--row-budget-ms MS]
 *                       [--no-check] [--no-mqa] [--jobs N]
 *
 * For DeepSeek-V3 head shapes (d_n 128, d_r 64, d_v 128, d_c 512), bf16, causal, B = 1,
 * it generates attn_fwd (k_packed 0 and 1), attn_bwd_pre, attn_bwd_dkdv (deterministic 0
 * and 1) and attn_bwd_dq, and the absorbed form's mqa_fwd, attn_bwd_pre at d_n = d_v = d_c,
 * mqa_bwd_dkv and mqa_bwd_dq (d_qk = d_c + d_r = 576, d_v = d_c = 512; --no-mqa: not these),
 * with their default configurations, for H = 2 (the check; not built with --no-check) and
 * every H of --heads,
 * compiles them with NVRTC for the device (sm_90a for compute capability 9.0,
 * sm_<major><minor> otherwise) on --jobs threads (default: the CPUs, at most 16), loads
 * them through the driver (runtime/exec/mg_driver.c) and sets their dynamic shared memory
 * limit.
 *
 * Check: H = 2, S = 256, and every timed H at S = 200 (a partial tile): random bf16
 * inputs from the seed; the forward (both key layouts: the packed K is built from the
 * same k_nope and k_rope, so one reference serves both) against a float64 O and LSE; the
 * backward in both modes (pre + dkdv atomic; pre + dkdv deterministic + dq), given the
 * reference's O (rounded to bf16) and LSE (fp32) as attn_fwd stores them, against float64
 * dq, dk_nope, dk_rope (summed over heads) and dv. Compared per element
 * (tests/check_close.h: |err| <= atol + rtol |ref|; tolerances in tests/gpu/gpu_tol.h: atol
 * a multiple of the reference's rms, the LSE at GPU_TOL_LSE_ATOL + GPU_TOL_LSE_RTOL |lse|)
 * and by an L2 bound; the
 * forward and the deterministic backward run twice and compare bit for bit (the atomic
 * dkdv is not deterministic by design). The absorbed kernels likewise (check_mqa, against tests/mqa_ref.h) at H = 2,
 * S = 255, and every timed H at S = 200 (72 from H = 64 on: the float64 reference costs
 * S^2 H): O (latent) and LSE of mqa_fwd, then pre + mqa_bwd_dkv + mqa_bwd_dq given the
 * reference O and LSE: dq, dc_kv = dc[:, :d_c], dk_rope = dc[:, d_c:], each run twice and
 * compared bit for bit. Any miss: exit 1
 * before timing.
 *
 * Timing: per (H, S), --sets input sets (default 4; fewer if device memory is short) of
 * q, k_nope, k_rope, packed K, v, dO, and the O, LSE and delta the kernels produce from
 * them. Iteration i uses set i mod sets, so a kernel never re-reads the inputs the
 * previous iteration left in L2 (the smallest shape's set is ~20 MB, four sets exceed the
 * H200's 50 MB L2). Outputs (dq, dq_accum, dk, dv) are one buffer each. --warmup launches,
 * then --iters launches, each between two events recorded back to back on one stream;
 * the median is reported. A row whose warm-up launch is slow gets fewer iterations
 * (at least 5) so one row stays within --row-budget-ms (default 6000). dq_accum and
 * dk_rope are not re-zeroed between timed dkdv launches (atomics add into stale values;
 * the time is the same).
 *
 * Rows: each kernel alone, "bwd_atomic" (pre + dkdv launched back to back, timed as one),
 * "bwd_det" (pre + dkdv_det + dq), and "fwd+bwd_atomic" / "fwd+bwd_det" (the sum of the
 * attn_fwd median and the pipeline's). FLOPs by MLA.md's convention: forward
 * 2 H pairs (d_qk + d_v), backward 2 H pairs (3 d_qk + 2 d_v), pairs = S (S + 1) / 2. The
 * backward's FLOPs go to the rows that do the whole backward: bwd_atomic, bwd_det, and
 * dkdv alone in the atomic mode (it computes dQ too); dkdv_det and dq alone have none
 * (the dq kernel recomputes P and dP: extra work the convention does not count); pre has
 * none. Bytes: the minimum a row must move, every input read once and every output
 * written once (a pipeline's intermediates, delta, excluded).
 *
 * Absorbed rows (time_mqa; d_qk/d_v 576/512 in the table): mqa_fwd (op fwd), the backward
 * pipeline attn_bwd_pre + mqa_bwd_dkv + mqa_bwd_dq timed once with an event after each
 * kernel, giving mqa_bwd_pre, mqa_bwd_dkv, mqa_bwd_dq (their medians) and mqa_bwd (the
 * whole, op bwd), and mqa_fwd+bwd (op fwd_bwd, the sum). FLOPs by MLA.md with the
 * absorbed dims on mqa_fwd, mqa_bwd and mqa_fwd+bwd; input sets as for attention, 2 to
 * --sets, enough for 200 MB.
 *
 * Layout and element-wise kernels (a2a_pack, a2a_unpack, dq_convert, expand_kv, split_dkv,
 * concat_latent, split_latent, copy_cols), built with their default configurations for
 * every H of --heads: timed only (their results are checked on the host executor), at
 * the shapes the plans give them for DeepSeek-V3 under SP of degree 128 / H (see
 * layout_rows), each with rotating buffer sets; memory-bound, so their rows carry no
 * FLOPs and report bytes moved and GB/s.
 *
 * --sm90 (sm_90a devices only; run.sh's sm90 step): nothing but the explicit forwards,
 * attn_fwd (mma.sync) beside attn_fwd_sm90 (TMA, wgmma; issue 14), each causal and not, split
 * keys (LAGA's), and attn_fwd_sm90 with packed keys (the explicit plan's: a per-head K, as
 * cuDNN's SDPA reads): checked as above (O and LSE per element, H 2 at S 256 and each H at
 * S 200, two runs bit for bit; the non-causal reference over every key), then timed at
 * --heads x --seqs (rows attn_fwd, attn_fwd_sm90, attn_fwd_sm90_kp, attn_fwd_full,
 * attn_fwd_sm90_full, attn_fwd_sm90_kp_full; non-causal FLOPs over S^2 pairs; the table's
 * causal column). attn_fwd_sm90's four tensor maps come from the
 * runtime's mg_sm90_fwd_tmaps (runtime/exec/mg_sm90_tmap.h), passed by value. Then
 * the explicit backward, causal, mma.sync beside sm_90a (attn_bwd_dkdv_sm90,
 * attn_bwd_dq_sm90; their five maps from mg_sm90_bwd_tmaps, by value): checked
 * (check_sm90_bwd) and timed (time_sm90_bwd: each kernel, the pipelines bwd_det,
 * bwd_det_sm90, bwd_atomic, bwd_atomic_sm90, the packed-key ones *_kp, and fwd+bwd_det,
 * fwd+bwd_sm90, fwd+bwd_det_kp, fwd+bwd_sm90_kp beside the peers' fwd_bwd rows;
 * fwd+bwd_sm90_kp is the explicit plan's attention: attn_fwd_sm90_kp + bwd_det_sm90_kp).
 * Unless --no-mqa, the absorbed kernels too (issue 15): mqa_fwd (mma.sync) beside mqa_fwd_sm90
 * (TMA, wgmma; its two tensor maps from mg_sm90_mqa_tmaps, by value), and the backward
 * attn_bwd_pre (over o_lat) + mqa_bwd_dkv + mqa_bwd_dq beside attn_bwd_pre + mqa_bwd_dkv_sm90
 * + mqa_bwd_dq_sm90 (their three maps each from mg_sm90_mqa_bwd_tmaps, by value), causal,
 * d_c 512, d_r 64: each checked by check_mqa against tests/mqa_ref.h (two runs bit for bit),
 * then timed by time_mqa at --heads x --seqs in the same run (rows mqa_fwd, mqa_bwd_pre,
 * mqa_bwd_dkv, mqa_bwd_dq, mqa_bwd, mqa_fwd+bwd, then mqa_fwd_sm90, mqa_bwd_dkv_sm90,
 * mqa_bwd_dq_sm90, mqa_bwd_sm90, mqa_fwd+bwd_sm90; 576/512; FLOPs as the absorbed rows).
 *
 * Launch rules: a grid dim is {value = n} or {arg = "batch"|"seqlen_q"|"seqlen_k",
 * mul = m, div = n} (mul and div optional, default 1): ceil(arg * m / n).
 *
 * Writes OUTDIR/bench.log (everything printed) and OUTDIR/bench.csv (the table).
 * Exit: 0 ok; 1 a CUDA error (named by cuGetErrorName), a compile error or a correctness
 * miss; 2 usage, or no CUDA driver (the loader's "no CUDA driver: ..." message). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "mg_config.h"
#include "mg_driver.h"
#include "mg_fs.h"
#include "mg_generate.h"
#include "mg_jit.h"
#include "mg_sm90_tmap.h"
#include "mg_spec.h"
#include "mlagen.h"

#include "check_close.h"
#include "gpu/gpu_common.h"
#include "gpu/gpu_tol.h"
#include "kernel_test_util.h"
#include "mqa_ref.h"

enum { DN = 128, DR = 64, DV = 128, DQK = DN + DR, DC = 512, H_MODEL = 128 };
/* the absorbed form's MQA over the latent: d_qk = d_c + d_r, d_v = d_c */
enum { MQK = DC + DR, MV = DC };
#define MAX_LIST 16
#define MAX_HEADS 8

/* ---- output: everything goes to stdout and OUTDIR/bench.log (say, gpu_common.h) ------- */
static CUstream g_stream;

/* Device allocations, all freed at exit (a failure path leaves nothing to track). */
#define MAX_ALLOCS 256
static CUdeviceptr g_allocs[MAX_ALLOCS];
static int g_n_allocs;

static int dalloc(CUdeviceptr *p, size_t bytes) {
  *p = 0;
  if (g_n_allocs == MAX_ALLOCS) {
    say("bench: too many device allocations\n");
    return -1;
  }
  if (CU(drv->cuMemAlloc(p, bytes ? bytes : 16))) return -1;
  g_allocs[g_n_allocs++] = *p;
  return 0;
}

/* Frees the allocations made since there were `base` of them (newest first). */
static void free_since(int base) {
  while (g_n_allocs > base) cu(drv->cuMemFree(g_allocs[--g_n_allocs]), "cuMemFree");
}

static void dfree_all(void) {
  for (int i = 0; i < g_n_allocs; i++) cu(drv->cuMemFree(g_allocs[i]), "cuMemFree");
  g_n_allocs = 0;
}

/* ---- kernels ----------------------------------------------------------------------------- */
/* The attention kernels, explicit (attn_*) and absorbed (mqa_*: the MQA over the latent,
 * its backward's delta from attn_bwd_pre generated with d_n = d_v = d_c) (checked, then
 * timed), then the layout and element-wise kernels the plans run around them (timed
 * only: memory-bound, reported in GB/s; their results are checked on the host executor
 * by tests/test_layout.c and tests/test_plan_ops.c). */
enum {
  K_FWD, K_FWD_KP, K_PRE, K_DKDV, K_DKDV_DET, K_DQ,  /* explicit attention */
  K_MQA_FWD, K_MQA_PRE, K_MQA_DKV, K_MQA_DQ,         /* absorbed: NATTN checked kernels */
  K_A2A_PACK, K_A2A_UNPACK, K_DQ_CONVERT, K_EXPAND_KV, K_SPLIT_DKV, K_CONCAT_LATENT,
  K_SPLIT_LATENT, K_COPY_COLS,
  /* --sm90 only (sm_90a): the explicit forwards, causal (K_FWD, K_FWD_SM90) and not; the
   * sm_90a deterministic backward (beside K_PRE, K_DKDV_DET, K_DQ), causal, with split keys
   * (the LAGA plans': K_DKDV_DET's and K_DKDV_SM90's head loop) and packed ones (the
   * explicit plan's: *_KP, a CTA per key tile and head; those also non-causal, *_KP_FULL);
   * the absorbed forward's sm_90a kernel (beside K_MQA_FWD) and backward's (beside
   * K_MQA_DKV, K_MQA_DQ), causal */
  K_FWD_SM90, K_FWD_FULL, K_FWD_SM90_FULL, K_DKDV_SM90, K_DQ_SM90, K_DKDV_SM90_AT,
  K_DKDV_KP, K_DQ_KP, K_DKDV_SM90_KP, K_DQ_SM90_KP,
  K_DKDV_KP_FULL, K_DQ_KP_FULL, K_DKDV_SM90_KP_FULL, K_DQ_SM90_KP_FULL,
  K_FWD_SM90_KP, K_FWD_SM90_KP_FULL, /* attn_fwd_sm90 with packed keys (the explicit plan's) */
  K_MQA_FWD_SM90, K_MQA_DKV_SM90, K_MQA_DQ_SM90,
  /* --varlen only: the packed-sequence variants (spec.varlen, issue 16) of the explicit
   * deterministic pipeline and the absorbed one, beside K_FWD, K_PRE, K_DKDV_DET, K_DQ and
   * K_MQA_FWD, K_MQA_PRE, K_MQA_DKV, K_MQA_DQ */
  K_FWD_VL, K_PRE_VL, K_DKDV_VL, K_DQ_VL, K_MQA_FWD_VL, K_MQA_PRE_VL, K_MQA_DKV_VL, K_MQA_DQ_VL,
  /* --varlen on an sm_90a device: attn_fwd_sm90's varlen variant, beside K_FWD_SM90 */
  K_FWD_SM90_VL,
  NK
};
#define NATTN (K_MQA_DQ + 1)
static const char *const k_label[NK] = {"attn_fwd", "attn_fwd_kpacked", "bwd_pre",
                                        "bwd_dkdv", "bwd_dkdv_det", "bwd_dq",
                                        "mqa_fwd", "mqa_bwd_pre", "mqa_bwd_dkv", "mqa_bwd_dq",
                                        "a2a_pack", "a2a_unpack", "dq_convert", "expand_kv",
                                        "split_dkv", "concat_latent", "split_latent", "copy_cols",
                                        "attn_fwd_sm90", "attn_fwd_full", "attn_fwd_sm90_full",
                                        "bwd_dkdv_sm90", "bwd_dq_sm90", "bwd_dkdv_sm90_at",
                                        "bwd_dkdv_kp", "bwd_dq_kp", "bwd_dkdv_sm90_kp", "bwd_dq_sm90_kp",
                                        "bwd_dkdv_kp_full", "bwd_dq_kp_full", "bwd_dkdv_sm90_kp_full",
                                        "bwd_dq_sm90_kp_full", "attn_fwd_sm90_kp", "attn_fwd_sm90_kp_full",
                                        "mqa_fwd_sm90", "mqa_bwd_dkv_sm90", "mqa_bwd_dq_sm90",
                                        "attn_fwd_varlen", "bwd_pre_varlen", "bwd_dkdv_varlen",
                                        "bwd_dq_varlen", "mqa_fwd_varlen", "mqa_bwd_pre_varlen",
                                        "mqa_bwd_dkv_varlen", "mqa_bwd_dq_varlen",
                                        "attn_fwd_sm90_varlen"};
static const char *const k_family[NK] = {"attn_fwd", "attn_fwd", "attn_bwd_pre",
                                         "attn_bwd_dkdv", "attn_bwd_dkdv", "attn_bwd_dq",
                                         "mqa_fwd", "attn_bwd_pre", "mqa_bwd_dkv", "mqa_bwd_dq",
                                         "a2a_pack", "a2a_unpack", "dq_convert", "expand_kv",
                                         "split_dkv", "concat_latent", "split_latent",
                                         "copy_cols", "attn_fwd_sm90", "attn_fwd", "attn_fwd_sm90",
                                         "attn_bwd_dkdv_sm90", "attn_bwd_dq_sm90", "attn_bwd_dkdv_sm90",
                                         "attn_bwd_dkdv", "attn_bwd_dq", "attn_bwd_dkdv_sm90", "attn_bwd_dq_sm90",
                                         "attn_bwd_dkdv", "attn_bwd_dq", "attn_bwd_dkdv_sm90", "attn_bwd_dq_sm90",
                                         "attn_fwd_sm90", "attn_fwd_sm90",
                                         "mqa_fwd_sm90", "mqa_bwd_dkv_sm90", "mqa_bwd_dq_sm90",
                                         "attn_fwd", "attn_bwd_pre", "attn_bwd_dkdv", "attn_bwd_dq",
                                         "mqa_fwd", "attn_bwd_pre", "mqa_bwd_dkv", "mqa_bwd_dq",
                                         "attn_fwd_sm90"};
static const char *const k_set[NK][2] = {{NULL, NULL}, {"k_packed=1", NULL}, {NULL, NULL},
                                         {NULL, NULL}, {"deterministic=1", NULL}, {NULL, NULL},
                                         [K_DKDV_SM90_AT] = {"deterministic=0", NULL},
                                         [K_DKDV_KP] = {"k_packed=1", "deterministic=1"},
                                         [K_DQ_KP] = {"k_packed=1", NULL},
                                         [K_DKDV_SM90_KP] = {"k_packed=1", "deterministic=1"},
                                         [K_DQ_SM90_KP] = {"k_packed=1", NULL},
                                         [K_DKDV_KP_FULL] = {"k_packed=1", "deterministic=1"},
                                         [K_DQ_KP_FULL] = {"k_packed=1", NULL},
                                         [K_DKDV_SM90_KP_FULL] = {"k_packed=1", "deterministic=1"},
                                         [K_DQ_SM90_KP_FULL] = {"k_packed=1", NULL},
                                         [K_FWD_SM90_KP] = {"k_packed=1", NULL},
                                         [K_FWD_SM90_KP_FULL] = {"k_packed=1", NULL},
                                         [K_DKDV_VL] = {"deterministic=1", NULL}};
/* The varlen variant of a --varlen kernel (its unpacked params, then cu_seqlens, n_seqs). */
static int is_varlen(int which) { return which >= K_FWD_VL; }
/* The backward kernels of packed keys (k_packed = 1: K [S, H, d_qk], dK likewise). */
static int is_packed_bwd(int which) { return which >= K_DKDV_KP && which <= K_DQ_SM90_KP_FULL; }
/* The parameter lists the launches below pass, checked against each manifest. */
#define K_MAX_PARAMS 24
static const char *const k_params[NK][K_MAX_PARAMS] = {
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "q_split",
     "q_pos1", "softmax_scale"},
    {"q", "k_nope", "k_rope", "v", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "q_split",
     "q_pos1", "softmax_scale"},
    {"o", "dout", "delta", "dq_accum", "seqlen_q"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "dout", "lse", "delta", "dq_accum", "dk_nope", "dk_rope", "dv",
     "seqlen_q", "seqlen_k", "q_pos0", "q_split", "q_pos1", "softmax_scale"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "dout", "lse", "delta", "dq_accum", "dk_nope", "dk_rope", "dv",
     "seqlen_q", "seqlen_k", "q_pos0", "q_split", "q_pos1", "softmax_scale"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "dout", "lse", "delta", "dq", "seqlen_q", "seqlen_k", "q_pos0",
     "q_split", "q_pos1", "softmax_scale"},
    {"q", "c", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "softmax_scale"},
    {"o", "dout", "delta", "dq_accum", "seqlen_q"},
    {"q", "c", "dout", "lse", "delta", "dc", "seqlen_q", "seqlen_k", "q_pos0", "softmax_scale"},
    {"q", "c", "dout", "lse", "delta", "dq", "seqlen_q", "seqlen_k", "q_pos0", "softmax_scale"},
    {"src", "send", "seqlen_local", "batch", "heads_total", "sp", "width", "direction"},
    {"recv", "dst", "seqlen_local", "batch", "heads_total", "sp", "width", "direction"},
    {"dq_accum", "dq", "seqlen_q"},
    {"kv", "rope", "k", "v", "rows", "rope_col", "rope_w"},
    {"dk", "dv", "dkv", "drope", "rows", "rope_col", "rope_w", "accumulate"},
    {"c_kv", "k_rope", "c", "rows"},
    {"dc", "dc_kv", "dk_rope", "rows"},
    {"src", "dst", "rows", "src_w", "src_col", "dst_w", "dst_col", "cols"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "q_split",
     "q_pos1", "softmax_scale", "tmaps"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "q_split",
     "q_pos1", "softmax_scale"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "q_split",
     "q_pos1", "softmax_scale", "tmaps"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "dout", "lse", "delta", "dq_accum", "dk_nope", "dk_rope", "dv",
     "seqlen_q", "seqlen_k", "q_pos0", "q_split", "q_pos1", "softmax_scale", "tmaps"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "dout", "lse", "delta", "dq", "seqlen_q", "seqlen_k", "q_pos0",
     "q_split", "q_pos1", "softmax_scale", "tmaps"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "dout", "lse", "delta", "dq_accum", "dk_nope", "dk_rope", "dv",
     "seqlen_q", "seqlen_k", "q_pos0", "q_split", "q_pos1", "softmax_scale", "tmaps"},
    {"q", "k_nope", "k_rope", "v", "dout", "lse", "delta", "dq_accum", "dk_nope", "dk_rope", "dv",
     "seqlen_q", "seqlen_k", "q_pos0", "q_split", "q_pos1", "softmax_scale"},
    {"q", "k_nope", "k_rope", "v", "dout", "lse", "delta", "dq", "seqlen_q", "seqlen_k", "q_pos0",
     "q_split", "q_pos1", "softmax_scale"},
    {"q", "k_nope", "k_rope", "v", "dout", "lse", "delta", "dq_accum", "dk_nope", "dk_rope", "dv",
     "seqlen_q", "seqlen_k", "q_pos0", "q_split", "q_pos1", "softmax_scale", "tmaps"},
    {"q", "k_nope", "k_rope", "v", "dout", "lse", "delta", "dq", "seqlen_q", "seqlen_k", "q_pos0",
     "q_split", "q_pos1", "softmax_scale", "tmaps"},
    {"q", "k_nope", "k_rope", "v", "dout", "lse", "delta", "dq_accum", "dk_nope", "dk_rope", "dv",
     "seqlen_q", "seqlen_k", "q_pos0", "q_split", "q_pos1", "softmax_scale"},
    {"q", "k_nope", "k_rope", "v", "dout", "lse", "delta", "dq", "seqlen_q", "seqlen_k", "q_pos0",
     "q_split", "q_pos1", "softmax_scale"},
    {"q", "k_nope", "k_rope", "v", "dout", "lse", "delta", "dq_accum", "dk_nope", "dk_rope", "dv",
     "seqlen_q", "seqlen_k", "q_pos0", "q_split", "q_pos1", "softmax_scale", "tmaps"},
    {"q", "k_nope", "k_rope", "v", "dout", "lse", "delta", "dq", "seqlen_q", "seqlen_k", "q_pos0",
     "q_split", "q_pos1", "softmax_scale", "tmaps"},
    {"q", "k_nope", "k_rope", "v", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "q_split", "q_pos1",
     "softmax_scale", "tmaps"},
    {"q", "k_nope", "k_rope", "v", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "q_split", "q_pos1",
     "softmax_scale", "tmaps"},
    {"q", "c", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "softmax_scale", "tmaps"},
    {"q", "c", "dout", "lse", "delta", "dc", "seqlen_q", "seqlen_k", "q_pos0", "softmax_scale",
     "tmaps"},
    {"q", "c", "dout", "lse", "delta", "dq", "seqlen_q", "seqlen_k", "q_pos0", "softmax_scale",
     "tmaps"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "q_split",
     "q_pos1", "softmax_scale", "cu_seqlens", "n_seqs"},
    {"o", "dout", "delta", "dq_accum", "seqlen_q", "cu_seqlens", "n_seqs"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "dout", "lse", "delta", "dq_accum", "dk_nope", "dk_rope", "dv",
     "seqlen_q", "seqlen_k", "q_pos0", "q_split", "q_pos1", "softmax_scale", "cu_seqlens",
     "n_seqs"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "dout", "lse", "delta", "dq", "seqlen_q", "seqlen_k", "q_pos0",
     "q_split", "q_pos1", "softmax_scale", "cu_seqlens", "n_seqs"},
    {"q", "c", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "softmax_scale", "cu_seqlens",
     "n_seqs"},
    {"o", "dout", "delta", "dq_accum", "seqlen_q", "cu_seqlens", "n_seqs"},
    {"q", "c", "dout", "lse", "delta", "dc", "seqlen_q", "seqlen_k", "q_pos0", "softmax_scale",
     "cu_seqlens", "n_seqs"},
    {"q", "c", "dout", "lse", "delta", "dq", "seqlen_q", "seqlen_k", "q_pos0", "softmax_scale",
     "cu_seqlens", "n_seqs"},
    {"q", "k_nope", "k_rope", "ld_k_rope", "v", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0", "q_split",
     "q_pos1", "softmax_scale", "tmaps", "cu_seqlens", "n_seqs"},
};
static int is_sm90(int which) {
  return which == K_FWD_SM90 || which == K_FWD_SM90_FULL || which == K_FWD_SM90_VL ||
         which == K_FWD_SM90_KP || which == K_FWD_SM90_KP_FULL;
}
/* attn_fwd_sm90 with packed keys (K [S, H, d_qk] in k_nope; no ld_k_rope) */
static int is_packed_fwd_sm90(int which) { return which == K_FWD_SM90_KP || which == K_FWD_SM90_KP_FULL; }
static int is_causal(int which) {
  return which != K_FWD_FULL && which != K_FWD_SM90_FULL && which != K_FWD_SM90_KP_FULL &&
         !(which >= K_DKDV_KP_FULL && which <= K_DQ_SM90_KP_FULL);
}
/* --sm90: mma.sync beside sm_90a: the explicit forwards (attn_fwd, attn_fwd_sm90) causal
 * and not, the deterministic backwards (attn_bwd_pre + attn_bwd_dkdv deterministic +
 * attn_bwd_dq beside attn_bwd_pre + attn_bwd_dkdv_sm90 + attn_bwd_dq_sm90) causal, and
 * (unless --no-mqa) the absorbed forward mqa_fwd beside mqa_fwd_sm90 and backward (attn_bwd_pre
 * + mqa_bwd_dkv + mqa_bwd_dq beside attn_bwd_pre + mqa_bwd_dkv_sm90 + mqa_bwd_dq_sm90), causal,
 * checked and timed (the issue 14 and 15 step of run.sh: STEPS=sm90). */
static int g_sm90, g_no_mqa;
/* --varlen: packed sequences (issue 16): the varlen kernels beside the fixed-length ones at
 * equal lengths, and a packed stream of mixed lengths beside the same documents padded to
 * the longest (time_varlen). g_vl_sm90: --varlen on an sm_90a device, where attn_fwd_sm90
 * (the CUDA executor's forward there) and its varlen variant are timed too. */
static int g_varlen, g_vl_sm90;

typedef struct gk {
  int heads, which;
  char name[160];
  mg_kernel k;          /* the rendered source and its manifest */
  mg_cubin cubin;
  int rc;               /* of the compile */
  mg_diag d;
  CUmodule mod;
  CUfunction fn;
  mg_launch_rule rule;  /* the manifest's launch rule */
} gk;

typedef struct kset {
  int heads;
  int timed; /* one of --heads: the layout kernels are built and timed too */
  gk k[NK];
} kset;

/* The kernels built for ks: --sm90, the explicit and (unless --no-mqa) absorbed attention
 * kernels, mma.sync and sm_90a; else the checked attention kernels, and the layout ones for
 * a timed H. */
static int wanted(const kset *ks, int which) {
  if (g_varlen) {
    const int mqa = which == K_MQA_FWD || which == K_MQA_PRE || which == K_MQA_DKV ||
                    which == K_MQA_DQ || (which >= K_MQA_FWD_VL && which <= K_MQA_DQ_VL);
    if (which == K_FWD_SM90 || which == K_FWD_SM90_VL) return g_vl_sm90;
    return (!mqa || !g_no_mqa) && (which == K_FWD || which == K_PRE || which == K_DKDV_DET ||
                                   which == K_DQ || (which >= K_FWD_VL && which <= K_MQA_DQ_VL) || mqa);
  }
  if (g_sm90)
    return which == K_FWD || which == K_PRE || which == K_DKDV || which == K_DKDV_DET ||
           which == K_DQ || (which >= K_FWD_SM90 && which < K_MQA_FWD_SM90) ||
           (!g_no_mqa && ((which >= K_MQA_FWD && which < NATTN) || (which >= K_MQA_FWD_SM90 && which <= K_MQA_DQ_SM90)));
  return which < NATTN || (ks->timed && which < K_FWD_SM90);
}

static mg_kernel_spec make_spec(int which, int H) {
  mg_kernel_spec s;
  memset(&s, 0, sizeof s);
  snprintf(s.family, sizeof s.family, "%s", k_family[which]);
  s.heads = H, s.d_n = DN, s.d_r = DR, s.d_v = DV, s.d_c = DC, s.causal = is_causal(which);
  s.varlen = is_varlen(which);
  if (which == K_MQA_PRE || which == K_MQA_PRE_VL) s.d_n = s.d_v = DC; /* delta over the latent output [.., d_c] */
  snprintf(s.dtype, sizeof s.dtype, "bf16");
  for (int i = 0; i < 2 && k_set[which][i]; i++) {
    mg_diag d = MG_DIAG_INIT;
    if (mg_spec_set(&s, k_set[which][i], &d)) {
      say("bench: %s\n", mg_diag_msg(&d));
      exit(1);
    }
  }
  return s;
}

/* Checks the kernel's parameter names (its typed manifest, mg_kernel.info) against
 * k_params, and takes its launch rule. */
static int read_manifest(gk *g) {
  const mg_kernel_info *m = &g->k.info;
  int n = 0;
  for (; n < m->n_params; n++) {
    const char *want = n < K_MAX_PARAMS ? k_params[g->which][n] : NULL;
    if (!want || strcmp(m->params[n].name, want) != 0) {
      say("bench: %s: parameter %d is '%s', the launch passes '%s'\n", g->name, n,
          m->params[n].name, want ? want : "(nothing)");
      return -1;
    }
  }
  if (n == 0 || (n < K_MAX_PARAMS && k_params[g->which][n])) {
    say("bench: %s: %d parameters in the manifest, the launch passes more\n", g->name, n);
    return -1;
  }
  g->rule = m->launch;
  return 0;
}

static const char *g_arch;
static const mg_jit_header *g_hdr;
static int g_n_hdr;
static const char *g_template_hash;

static void compile_one(gk *g) {
  mg_jit_opts jo = {.arch = g_arch, .template_hash = g_template_hash, .headers = g_hdr,
                    .n_headers = g_n_hdr};
  g->rc = mg_jit_compile(g->k.source, g->k.source_len, g->k.file, g->k.name, &jo, &g->cubin, &g->d);
}

/* NVRTC compiles on --jobs threads (default: the CPUs, at most 16), each taking the next
 * kernel of the list (NVRTC programs and the JIT cache's atomic writes are thread-safe). */
static int g_jobs;
static gk **g_todo;
static int g_n_todo, g_next_todo;
static pthread_mutex_t g_todo_lock = PTHREAD_MUTEX_INITIALIZER;

static void *compile_thread(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&g_todo_lock);
    const int i = g_next_todo < g_n_todo ? g_next_todo++ : -1;
    pthread_mutex_unlock(&g_todo_lock);
    if (i < 0) return NULL;
    compile_one(g_todo[i]);
  }
}

static void compile_all(gk **all, int n) {
  int jobs = g_jobs > 0 ? g_jobs : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (jobs > 16) jobs = 16;
  if (jobs > n) jobs = n;
  g_todo = all, g_n_todo = n, g_next_todo = 0;
  pthread_t th[16];
  int started = 0;
  for (int t = 1; t < jobs; t++)
    if (pthread_create(&th[started], NULL, compile_thread, NULL) == 0) started++;
  compile_thread(NULL); /* this thread too; with no helper it does them all */
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  say("compile threads: %d\n", started + 1);
}

/* Renders, compiles (or takes from the JIT cache), loads. */
static int build_all(mg_gen *gen, kset *sets, int n_sets, int max_optin_smem) {
  gk *all[MAX_HEADS * NK];
  int n = 0;
  for (int s = 0; s < n_sets; s++)
    for (int w = 0; w < NK; w++) {
      if (!wanted(&sets[s], w)) continue;
      gk *g = &sets[s].k[w];
      memset(g, 0, sizeof *g);
      g->heads = sets[s].heads, g->which = w;
      mg_kernel_spec spec = make_spec(w, g->heads);
      mg_diag d = MG_DIAG_INIT;
      if (mg_gen_kernel(gen, &spec, &g->k, &d)) {
        say("bench: generate %s H=%d: %s\n", k_label[w], g->heads, mg_diag_msg(&d));
        mg_diag_clear(&d);
        return -1;
      }
      snprintf(g->name, sizeof g->name, "%s", g->k.name);
      if (read_manifest(g)) return -1;
      all[n++] = g;
    }
  double t0 = wall_s();
  compile_all(all, n); /* ~0.4 s each on a miss (the mqa_* kernels several seconds) */
  say("compiled %d kernels for %s in %.1f s (NVRTC)\n", n, g_arch, wall_s() - t0);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    gk *g = all[i];
    if (g->rc) {
      say("bench: compile %s: %s\n", g->name, mg_diag_msg(&g->d));
      bad = 1;
      continue;
    }
    const mg_jit_report *r = &g->cubin.report;
    say("  %-72s regs %3d spill %ld/%ld smem %zu%s\n", g->name, r->registers, r->spill_stores,
        r->spill_loads, g->rule.smem, r->cache_hit ? " (cached)" : "");
    if ((long)g->rule.smem > max_optin_smem) {
      say("bench: %s needs %zu bytes of dynamic shared memory, the device allows %d\n", g->name,
          g->rule.smem, max_optin_smem);
      bad = 1;
      continue;
    }
    if (CU(drv->cuModuleLoadData(&g->mod, g->cubin.data))) { bad = 1; continue; }
    if (CU(drv->cuModuleGetFunction(&g->fn, g->mod, g->name))) { bad = 1; continue; }
    if (g->rule.smem > 0 &&
        CU(drv->cuFuncSetAttribute(g->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   (int)g->rule.smem))) {
      bad = 1;
      continue;
    }
  }
  return bad ? -1 : 0;
}

static void free_all_kernels(kset *sets, int n_sets) {
  for (int s = 0; s < n_sets; s++)
    for (int w = 0; w < NK; w++) {
      gk *g = &sets[s].k[w];
      if (g->mod) cu(drv->cuModuleUnload(g->mod), "cuModuleUnload");
      mg_cubin_free(&g->cubin);
      mg_kernel_free(&g->k);
      mg_diag_clear(&g->d);
    }
}

/* Launches g on the bench stream by its manifest's launch rule (a zero grid: nothing). */
static int launch(const gk *g, int B, int sq, int sk, void **args) {
  unsigned dim[3];
  const mg_launch_dims dims = {.batch = B, .seqlen_q = sq, .seqlen_k = sk};
  mg_diag d = MG_DIAG_INIT;
  if (mg_launch_grid(&g->rule, &dims, dim, &d)) {
    say("bench: %s: %s\n", g->name, mg_diag_msg(&d));
    mg_diag_clear(&d);
    return -1;
  }
  if (!dim[0] || !dim[1] || !dim[2]) return 0;
  const unsigned *b = g->rule.block;
  char what[256];
  snprintf(what, sizeof what, "cuLaunchKernel(%s, grid %u,%u,%u, block %u, smem %zu)", g->name,
           dim[0], dim[1], dim[2], b[0], g->rule.smem);
  return cu(drv->cuLaunchKernel(g->fn, dim[0], dim[1], dim[2], b[0], b[1], b[2],
                                (unsigned)g->rule.smem, g_stream, args, NULL),
            what);
}

/* One problem's device tensors (split keys, plus the packed K built from them). */
typedef struct dev_tensors {
  CUdeviceptr q, kn, kr, kp, v, dout, o, lse, delta;
} dev_tensors;
typedef struct dev_outputs {
  CUdeviceptr o, lse, dq_accum, dq, dkn, dkr, dv;
  CUdeviceptr dkp; /* packed keys' per-head dK [S, H, d_qk] (is_packed_bwd) */
} dev_outputs;

static const CUdeviceptr NULLP = 0;

/* The kernels' argument lists. */
static int run_fwd(const gk *g, const dev_tensors *t, CUdeviceptr o, CUdeviceptr lse, int S,
                   float scale) {
  int q_pos0 = 0, q_split = 0, q_pos1 = 0, ldr = DR;
  if (g->which == K_FWD_KP) { /* packed keys: no ld_k_rope */
    CUdeviceptr none = NULLP;
    void *args[] = {(void *)&t->q, (void *)&t->kp, &none, (void *)&t->v, &o, &lse,
                    &S, &S, &q_pos0, &q_split, &q_pos1, &scale};
    return launch(g, 1, S, S, args);
  }
  void *args[] = {(void *)&t->q, (void *)&t->kn, (void *)&t->kr, &ldr, (void *)&t->v, &o, &lse,
                  &S,            &S,             &q_pos0,        &q_split, &q_pos1,     &scale};
  return launch(g, 1, S, S, args);
}
/* attn_fwd_sm90's 4 tensor maps (sm90_maps), passed by value: the launch copies them. */
typedef CUtensorMap fwd_maps[MG_SM90_FWD_TMAPS];
/* attn_fwd_sm90 (split keys, or packed: is_packed_fwd_sm90) with its 4 tensor maps tmaps. */
static int run_fwd_sm90(const gk *g, const dev_tensors *t, CUdeviceptr o, CUdeviceptr lse, int S,
                        float scale, const CUtensorMap *tmaps) {
  int q_pos0 = 0, q_split = 0, q_pos1 = 0, ldr = DR;
  if (is_packed_fwd_sm90(g->which)) { /* K per head in k_nope; k_rope unused, no ld_k_rope */
    CUdeviceptr none = NULLP;
    void *args[] = {(void *)&t->q, (void *)&t->kp, &none, (void *)&t->v, &o, &lse, &S, &S,
                    &q_pos0, &q_split, &q_pos1, &scale, (void *)tmaps};
    return launch(g, 1, S, S, args);
  }
  void *args[] = {(void *)&t->q, (void *)&t->kn, (void *)&t->kr, &ldr, (void *)&t->v, &o, &lse,
                  &S,           &S,            &q_pos0,       &q_split,      &q_pos1,
                  &scale,       (void *)tmaps};
  return launch(g, 1, S, S, args);
}
/* Any explicit forward of the --sm90 step: attn_fwd (split keys) or attn_fwd_sm90 (split or
 * packed keys). */
static int run_any_fwd(const gk *g, const dev_tensors *t, CUdeviceptr o, CUdeviceptr lse, int S,
                       float scale, const CUtensorMap *tmaps) {
  return is_sm90(g->which) ? run_fwd_sm90(g, t, o, lse, S, scale, tmaps)
                           : run_fwd(g, t, o, lse, S, scale);
}
/* attn_fwd_sm90's tensor maps over t (B = 1, S tokens) into maps, encoded by the runtime's
 * helper (runtime/exec/mg_sm90_tmap.h, as the CUDA executor does). */
static int sm90_maps(const gk *g, const dev_tensors *t, int S, fwd_maps maps) {
  const mg_kernel_spec spec = make_spec(g->which, g->heads);
  const int kp = is_packed_fwd_sm90(g->which); /* packed: K in k_nope's map, no k_rope */
  const mg_sm90_fwd_tensors tt = {t->q, kp ? t->kp : t->kn, kp ? NULLP : t->kr, t->v, 1, S, S, DR};
  mg_diag d = MG_DIAG_INIT;
  if (mg_sm90_fwd_tmaps(drv, &spec, &g->k.info, &tt, maps, &d)) {
    say("bench: %s: %s\n", g->name, mg_diag_msg(&d));
    mg_diag_clear(&d);
    return -1;
  }
  return 0;
}
static int run_pre(const gk *g, const dev_tensors *t, CUdeviceptr dq_accum, int S) {
  void *args[] = {(void *)&t->o, (void *)&t->dout, (void *)&t->delta, &dq_accum, &S};
  return launch(g, 1, S, S, args);
}
static int run_dkdv(const gk *g, const dev_tensors *t, CUdeviceptr dq_accum, const dev_outputs *out,
                    int S, float scale) {
  int q_pos0 = 0, q_split = 0, q_pos1 = 0, ldr = DR;
  if (is_packed_bwd(g->which)) { /* K and dK per head: no k_rope, ld_k_rope, dk_rope */
    CUdeviceptr none = NULLP;
    void *args[] = {(void *)&t->q, (void *)&t->kp, &none, (void *)&t->v, (void *)&t->dout,
                    (void *)&t->lse, (void *)&t->delta, &dq_accum, (void *)&out->dkp, &none,
                    (void *)&out->dv, &S, &S, &q_pos0, &q_split, &q_pos1, &scale};
    return launch(g, 1, S, S, args);
  }
  void *args[] = {(void *)&t->q,  (void *)&t->kn,    (void *)&t->kr, &ldr,    (void *)&t->v,
                  (void *)&t->dout, (void *)&t->lse, (void *)&t->delta, &dq_accum,
                  (void *)&out->dkn, (void *)&out->dkr, (void *)&out->dv, &S, &S, &q_pos0,
                  &q_split, &q_pos1, &scale};
  return launch(g, 1, S, S, args);
}
static int run_dq(const gk *g, const dev_tensors *t, const dev_outputs *out, int S, float scale) {
  int q_pos0 = 0, q_split = 0, q_pos1 = 0, ldr = DR;
  if (is_packed_bwd(g->which)) {
    CUdeviceptr none = NULLP;
    void *args[] = {(void *)&t->q, (void *)&t->kp, &none, (void *)&t->v, (void *)&t->dout,
                    (void *)&t->lse, (void *)&t->delta, (void *)&out->dq, &S, &S, &q_pos0,
                    &q_split, &q_pos1, &scale};
    return launch(g, 1, S, S, args);
  }
  void *args[] = {(void *)&t->q,    (void *)&t->kn,  (void *)&t->kr, &ldr,    (void *)&t->v,
                  (void *)&t->dout, (void *)&t->lse, (void *)&t->delta, (void *)&out->dq,
                  &S, &S, &q_pos0, &q_split, &q_pos1, &scale};
  return launch(g, 1, S, S, args);
}

/* The sm_90a backward's 5 tensor maps (sm90_bwd_maps), passed by value: the launch copies
 * them. */
typedef CUtensorMap bwd_maps[MG_SM90_BWD_TMAPS];
/* The sm_90a backward's kernels (split or packed keys) with their 5 tensor maps tmaps. */
static int run_dkdv_sm90(const gk *g, const dev_tensors *t, CUdeviceptr dq_accum,
                         const dev_outputs *out, int S, float scale, const CUtensorMap *tmaps) {
  int q_pos0 = 0, q_split = 0, q_pos1 = 0, ldr = DR;
  if (is_packed_bwd(g->which)) {
    CUdeviceptr none = NULLP;
    void *args[] = {(void *)&t->q, (void *)&t->kp, &none, (void *)&t->v, (void *)&t->dout,
                    (void *)&t->lse, (void *)&t->delta, &dq_accum, (void *)&out->dkp, &none,
                    (void *)&out->dv, &S, &S, &q_pos0, &q_split, &q_pos1, &scale, (void *)tmaps};
    return launch(g, 1, S, S, args);
  }
  void *args[] = {(void *)&t->q,  (void *)&t->kn,    (void *)&t->kr, &ldr,    (void *)&t->v,
                  (void *)&t->dout, (void *)&t->lse, (void *)&t->delta, &dq_accum,
                  (void *)&out->dkn, (void *)&out->dkr, (void *)&out->dv, &S, &S, &q_pos0,
                  &q_split, &q_pos1, &scale, (void *)tmaps};
  return launch(g, 1, S, S, args);
}
static int run_dq_sm90(const gk *g, const dev_tensors *t, const dev_outputs *out, int S,
                       float scale, const CUtensorMap *tmaps) {
  int q_pos0 = 0, q_split = 0, q_pos1 = 0, ldr = DR;
  if (is_packed_bwd(g->which)) {
    CUdeviceptr none = NULLP;
    void *args[] = {(void *)&t->q, (void *)&t->kp, &none, (void *)&t->v, (void *)&t->dout,
                    (void *)&t->lse, (void *)&t->delta, (void *)&out->dq, &S, &S, &q_pos0,
                    &q_split, &q_pos1, &scale, (void *)tmaps};
    return launch(g, 1, S, S, args);
  }
  void *args[] = {(void *)&t->q,    (void *)&t->kn,  (void *)&t->kr, &ldr,    (void *)&t->v,
                  (void *)&t->dout, (void *)&t->lse, (void *)&t->delta, (void *)&out->dq,
                  &S, &S, &q_pos0, &q_split, &q_pos1, &scale, (void *)tmaps};
  return launch(g, 1, S, S, args);
}
/* The backward kernel g's tensor maps over t (B = 1, S tokens) into maps, encoded by the
 * runtime's helper (runtime/exec/mg_sm90_tmap.h's mg_sm90_bwd_tmaps). */
static int sm90_bwd_maps(const gk *g, const dev_tensors *t, int S, bwd_maps maps) {
  const mg_kernel_spec spec = make_spec(g->which, g->heads);
  const int kp = is_packed_bwd(g->which); /* packed: K's maps both over kp */
  const mg_sm90_bwd_tensors tt = {t->q, kp ? t->kp : t->kn, kp ? NULLP : t->kr, t->v, t->dout, 1, S, S, kp ? 0 : DR};
  mg_diag d = MG_DIAG_INIT;
  if (mg_sm90_bwd_tmaps(drv, &spec, &g->k.info, &tt, maps, &d)) {
    say("bench: %s: %s\n", g->name, mg_diag_msg(&d));
    mg_diag_clear(&d);
    return -1;
  }
  return 0;
}

static float softmax_scale(void) { return (float)(1.0 / sqrt((double)DQK) * 1.3689 * 1.3689); }

/* The absorbed form's kernels (docs/absorbed.md): q [S, H, d_c + d_r], the latent
 * c = [c_kv ; k_rope] [S, d_c + d_r] (keys; its first d_c columns are the values),
 * o and dout [S, H, d_c], lse and delta [H, S], dq like q, dc like c. B = 1, q_pos0 = 0. */
typedef struct mqa_tensors {
  CUdeviceptr q, c, dout, o, lse, delta;
} mqa_tensors;

static int run_mqa_fwd(const gk *g, const mqa_tensors *t, CUdeviceptr o, CUdeviceptr lse, int S,
                       float scale) {
  int q_pos0 = 0;
  void *args[] = {(void *)&t->q, (void *)&t->c, &o, &lse, &S, &S, &q_pos0, &scale};
  return launch(g, 1, S, S, args);
}
/* mqa_fwd_sm90's 2 tensor maps (sm90_mqa_maps), passed by value: the launch copies them. */
typedef CUtensorMap mqa_maps[MG_SM90_MQA_TMAPS];
/* mqa_fwd_sm90 with its 2 tensor maps tmaps. */
static int run_mqa_fwd_sm90(const gk *g, const mqa_tensors *t, CUdeviceptr o, CUdeviceptr lse,
                            int S, float scale, const CUtensorMap *tmaps) {
  int q_pos0 = 0;
  void *args[] = {(void *)&t->q, (void *)&t->c, &o, &lse, &S, &S, &q_pos0, &scale, (void *)tmaps};
  return launch(g, 1, S, S, args);
}
/* mqa_fwd or mqa_fwd_sm90 (tmaps: its maps). */
static int run_any_mqa_fwd(const gk *g, const mqa_tensors *t, CUdeviceptr o, CUdeviceptr lse,
                           int S, float scale, const CUtensorMap *tmaps) {
  return g->which == K_MQA_FWD_SM90 ? run_mqa_fwd_sm90(g, t, o, lse, S, scale, tmaps)
                                    : run_mqa_fwd(g, t, o, lse, S, scale);
}
/* mqa_fwd_sm90's tensor maps over t (B = 1, S tokens) into maps, encoded by the runtime's
 * helper (runtime/exec/mg_sm90_tmap.h). */
static int sm90_mqa_maps(const gk *g, const mqa_tensors *t, int S, mqa_maps maps) {
  const mg_kernel_spec spec = make_spec(g->which, g->heads);
  const mg_sm90_mqa_tensors tt = {t->q, t->c, 1, S, S};
  mg_diag d = MG_DIAG_INIT;
  if (mg_sm90_mqa_tmaps(drv, &spec, &g->k.info, &tt, maps, &d)) {
    say("bench: %s: %s\n", g->name, mg_diag_msg(&d));
    mg_diag_clear(&d);
    return -1;
  }
  return 0;
}
static int run_mqa_pre(const gk *g, const mqa_tensors *t, int S) {
  CUdeviceptr none = NULLP; /* no dq_accum: the MQA backward writes dq itself */
  void *args[] = {(void *)&t->o, (void *)&t->dout, (void *)&t->delta, &none, &S};
  return launch(g, 1, S, S, args);
}
/* The sm_90a absorbed backward's 3 tensor maps (sm90_mqa_bwd_maps), passed by value. */
typedef CUtensorMap mqa_bwd_maps[MG_SM90_MQA_BWD_TMAPS];
/* mqa_bwd_dkv (out: dc) and mqa_bwd_dq (out: dq) take the same arguments; their sm_90a
 * kernels (mqa_bwd_dkv_sm90, mqa_bwd_dq_sm90) those and their maps tmaps (the mma.sync ones
 * have no 11th parameter: the driver reads only the kernel's own). */
static int run_mqa_bwd(const gk *g, const mqa_tensors *t, CUdeviceptr out, int S, float scale,
                       const CUtensorMap *tmaps) {
  int q_pos0 = 0;
  void *args[] = {(void *)&t->q,     (void *)&t->c, (void *)&t->dout, (void *)&t->lse,
                  (void *)&t->delta, &out,          &S,               &S,
                  &q_pos0,           &scale,        (void *)tmaps};
  return launch(g, 1, S, S, args);
}
/* mqa_bwd_dkv_sm90's or mqa_bwd_dq_sm90's tensor maps over t (B = 1, S tokens) into maps,
 * encoded by the runtime's helper (runtime/exec/mg_sm90_tmap.h's mg_sm90_mqa_bwd_tmaps). */
static int sm90_mqa_bwd_maps(const gk *g, const mqa_tensors *t, int S, mqa_bwd_maps maps) {
  const mg_kernel_spec spec = make_spec(g->which, g->heads);
  const mg_sm90_mqa_bwd_tensors tt = {t->q, t->c, t->dout, 1, S, S};
  mg_diag d = MG_DIAG_INIT;
  if (mg_sm90_mqa_bwd_tmaps(drv, &spec, &g->k.info, &tt, maps, &d)) {
    say("bench: %s: %s\n", g->name, mg_diag_msg(&d));
    mg_diag_clear(&d);
    return -1;
  }
  return 0;
}

/* ---- the check -------------------------------------------------------------------------- */
typedef struct host_case {
  int H, S;
  size_t nq, nkn, nkr, nv, no, nl;
  e16 *q, *kn, *kr, *kp, *v, *dout, *o16;
  float *lse32;
  double *r_o, *r_lse, *r_dq, *r_dkn, *r_dkr, *r_dv;
} host_case;

static void *xcalloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz);
  if (!p) {
    say("bench: out of host memory\n");
    exit(1);
  }
  return p;
}

static e16 *rand_bf16(size_t n) {
  e16 *p = xcalloc(n, sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = float_to_bf16((float)randn());
  return p;
}

/* Inputs and the float64 forward and backward (B = 1, causal, split keys); the packed K
 * [S, H, d_qk] is [k_nope[s,h] ; k_rope[s]]. Same math as tests/test_attn_bwd.c. */
static void case_init(host_case *c, int H, int S, int causal) {
  memset(c, 0, sizeof *c);
  c->H = H, c->S = S;
  c->nq = (size_t)S * H * DQK, c->nkn = (size_t)S * H * DN, c->nkr = (size_t)S * DR;
  c->nv = c->no = (size_t)S * H * DV, c->nl = (size_t)H * S;
  c->q = rand_bf16(c->nq), c->kn = rand_bf16(c->nkn), c->kr = rand_bf16(c->nkr);
  c->v = rand_bf16(c->nv), c->dout = rand_bf16(c->no);
  c->kp = xcalloc(c->nq, sizeof *c->kp);
  for (int s = 0; s < S; s++)
    for (int h = 0; h < H; h++) {
      e16 *dst = c->kp + ((size_t)s * H + h) * DQK;
      memcpy(dst, c->kn + ((size_t)s * H + h) * DN, DN * sizeof *dst);
      memcpy(dst + DN, c->kr + (size_t)s * DR, DR * sizeof *dst);
    }
  c->o16 = xcalloc(c->no, sizeof *c->o16);
  c->lse32 = xcalloc(c->nl, sizeof *c->lse32);
  c->r_o = xcalloc(c->no, sizeof(double)), c->r_lse = xcalloc(c->nl, sizeof(double));
  c->r_dq = xcalloc(c->nq, sizeof(double)), c->r_dkn = xcalloc(c->nkn, sizeof(double));
  c->r_dkr = xcalloc(c->nkr, sizeof(double)), c->r_dv = xcalloc(c->nv, sizeof(double));
  const double scale = softmax_scale();
  double *sc = xcalloc((size_t)S, sizeof *sc), *kf = xcalloc((size_t)S * DQK, sizeof *kf);
  double qf[DQK], dof[DV], oi[DV];
  for (int h = 0; h < H; h++) {
    for (int j = 0; j < S; j++)
      for (int d = 0; d < DQK; d++) kf[(size_t)j * DQK + d] = bf16_to_float(c->kp[((size_t)j * H + h) * DQK + d]);
    for (int i = 0; i < S; i++) {
      const size_t row = (size_t)i * H + h;
      for (int d = 0; d < DQK; d++) qf[d] = bf16_to_float(c->q[row * DQK + d]);
      for (int d = 0; d < DV; d++) dof[d] = bf16_to_float(c->dout[row * DV + d]);
      const int nk = causal ? i + 1 : S;
      double mx = -INFINITY;
      for (int j = 0; j < nk; j++) {
        double dot = 0;
        for (int d = 0; d < DQK; d++) dot += qf[d] * kf[(size_t)j * DQK + d];
        sc[j] = dot * scale;
        if (sc[j] > mx) mx = sc[j];
      }
      double sum = 0;
      for (int j = 0; j < nk; j++) sum += exp(sc[j] - mx);
      const double lse = mx + log(sum);
      for (int d = 0; d < DV; d++) oi[d] = 0;
      for (int j = 0; j < nk; j++) {
        const double p = exp(sc[j] - lse);
        const e16 *vj = c->v + ((size_t)j * H + h) * DV;
        for (int d = 0; d < DV; d++) oi[d] += p * bf16_to_float(vj[d]);
      }
      double delta = 0;
      for (int d = 0; d < DV; d++) {
        c->r_o[row * DV + d] = oi[d];
        c->o16[row * DV + d] = float_to_bf16((float)oi[d]);
        delta += dof[d] * oi[d];
      }
      c->r_lse[(size_t)h * S + i] = lse;
      c->lse32[(size_t)h * S + i] = (float)lse;
      for (int j = 0; j < nk; j++) {
        const double p = exp(sc[j] - lse);
        const size_t tok = (size_t)j;
        const e16 *vj = c->v + (tok * H + h) * DV;
        double dp = 0;
        for (int d = 0; d < DV; d++) dp += dof[d] * bf16_to_float(vj[d]);
        const double ds = p * (dp - delta) * scale;
        for (int d = 0; d < DV; d++) c->r_dv[(tok * H + h) * DV + d] += p * dof[d];
        for (int d = 0; d < DQK; d++) c->r_dq[row * DQK + d] += ds * kf[(size_t)j * DQK + d];
        for (int d = 0; d < DN; d++) c->r_dkn[(tok * H + h) * DN + d] += ds * qf[d];
        for (int d = 0; d < DR; d++) c->r_dkr[tok * DR + d] += ds * qf[DN + d];
      }
    }
  }
  free(sc), free(kf);
}

static void case_free(host_case *c) {
  free(c->q), free(c->kn), free(c->kr), free(c->kp), free(c->v), free(c->dout), free(c->o16);
  free(c->lse32), free(c->r_o), free(c->r_lse), free(c->r_dq), free(c->r_dkn), free(c->r_dkr);
  free(c->r_dv);
}

static int upload(CUdeviceptr *p, const void *src, size_t bytes) {
  if (dalloc(p, bytes)) return -1;
  return CU(drv->cuMemcpyHtoD(*p, src, bytes));
}
static int alloc_nan(CUdeviceptr *p, size_t bytes) { /* 0xff..: NaN in bf16 and fp32 */
  if (dalloc(p, bytes)) return -1;
  return CU(drv->cuMemsetD8(*p, 0xff, bytes));
}
static int sync_stream(const char *after) {
  char what[200];
  snprintf(what, sizeof what, "cuStreamSynchronize after %s", after);
  return cu(drv->cuStreamSynchronize(g_stream), what);
}
static int download(void *dst, CUdeviceptr src, size_t bytes) {
  return CU(drv->cuMemcpyDtoH(dst, src, bytes));
}

enum { TOL_O, TOL_GRAD, TOL_LSE, TOL_ABS_O, TOL_ABS_GRAD }; /* ABS: the MQA kernels */

/* Per element (tests/check_close.h) over rows x [col0, col0 + ncols) of a row-major array
 * of width w (bf16, or f32 when f32): |got - ref| <= atol + rtol |ref| with gpu_tol.h's
 * tolerances for kind tol (atol a multiple of the checked reference's rms; the lse
 * absolute), and for outputs and gradients the L2 bound. One line: the worst element, L2,
 * the noise (max |err| / rms). Returns 1 when it passed, else counts a miss in *fails. */
static int check_elems(const char *what, const void *got, int f32, const double *ref, size_t rows,
                       int w, int col0, int ncols, int tol, int *fails) {
  double ss = 0, se = 0;
  for (size_t r = 0; r < rows; r++)
    for (int k = col0; k < col0 + ncols; k++) ss += ref[r * (size_t)w + (size_t)k] * ref[r * (size_t)w + (size_t)k];
  const double m = (double)rows * ncols, rms = m > 0 ? sqrt(ss / m) : 0;
  const double atol = tol == TOL_LSE ? GPU_TOL_LSE_ATOL
                      : tol == TOL_O ? GPU_TOL_O_ATOL_RMS * rms
                      : tol == TOL_ABS_O ? GPU_TOL_ABS_O_ATOL_RMS * rms
                      : tol == TOL_ABS_GRAD ? GPU_TOL_ABS_GRAD_ATOL_RMS * rms : GPU_TOL_GRAD_ATOL_RMS * rms;
  const int out = tol == TOL_O || tol == TOL_ABS_O;
  const double rtol = tol == TOL_LSE ? GPU_TOL_LSE_RTOL : out ? GPU_TOL_RTOL : GPU_TOL_GRAD_RTOL;
  cc_result c = cc_init();
  for (size_t r = 0; r < rows; r++)
    for (int k = col0; k < col0 + ncols; k++) {
      const size_t i = r * (size_t)w + (size_t)k;
      const double x = f32 ? ((const float *)got)[i] : bf16_to_float(((const e16 *)got)[i]);
      cc_add(&c, (int64_t)i, x, ref[i], atol, rtol);
      se += (x - ref[i]) * (x - ref[i]);
    }
  const double l2 = ss > 0 ? sqrt(se / ss) : sqrt(se), l2_tol = tol == TOL_O ? GPU_TOL_O_L2 : tol == TOL_ABS_O ? GPU_TOL_ABS_O_L2
                                                   : tol == TOL_ABS_GRAD ? GPU_TOL_ABS_GRAD_L2 : GPU_TOL_GRAD_L2;
  const int ok = cc_ok(&c) && (tol == TOL_LSE || l2 <= l2_tol);
  char buf[512];
  cc_describe(&c, what, atol, rtol, w, buf, sizeof buf);
  say("    %s %s", ok ? "ok  " : "FAIL", buf);
  if (tol != TOL_LSE) say("; L2 %.2e (bound %.0e)", l2, l2_tol);
  say("; noise max|err|/rms %.2e\n", rms > 0 ? c.max_abs / rms : c.max_abs);
  if (!ok) ++*fails;
  return ok;
}

/* Two runs' outputs byte for byte: "bitwise equal", or the first differing element (es 2:
 * bf16, 4: f32); a difference counts a miss in *fails. */
static int same_bits(const char *what, const void *a, const void *b, size_t n, int es, int *fails) {
  size_t i = 0;
  while (i < n && !memcmp((const char *)a + i * es, (const char *)b + i * es, (size_t)es)) i++;
  if (i == n) {
    say("    %-28s bitwise equal (two runs)\n", what);
    return 1;
  }
  const double x = es == 4 ? ((const float *)a)[i] : bf16_to_float(((const e16 *)a)[i]);
  const double y = es == 4 ? ((const float *)b)[i] : bf16_to_float(((const e16 *)b)[i]);
  say("    %-28s FAIL: differs between two runs, first at element %zu: %.9g then %.9g\n", what, i, x, y);
  ++*fails;
  return 0;
}

/* The backward's gradients against c's float64 reference (check_elems, TOL_GRAD): dq
 * (bf16, or the fp32 dq_accum when dq_f32), dk_nope, dk_rope (fp32) and dv, S rows each. */
static void check_grads(const host_case *c, int S, const void *dq, int dq_f32, const e16 *dkn,
                        const float *dkr, const e16 *dv, int *fails) {
  check_elems(dq_f32 ? "dq (fp32 dq_accum)" : "dq", dq, dq_f32, c->r_dq, (size_t)S, (int)(c->nq / S), 0, (int)(c->nq / S), TOL_GRAD, fails);
  check_elems("dk_nope", dkn, 0, c->r_dkn, (size_t)S, (int)(c->nkn / S), 0, (int)(c->nkn / S), TOL_GRAD, fails);
  check_elems("dk_rope", dkr, 1, c->r_dkr, (size_t)S, (int)(c->nkr / S), 0, (int)(c->nkr / S), TOL_GRAD, fails);
  check_elems("dv", dv, 0, c->r_dv, (size_t)S, (int)(c->nv / S), 0, (int)(c->nv / S), TOL_GRAD, fails);
}

/* Two runs' gradients (dq, dk_nope, dk_rope, dv) bit for bit (same_bits). */
static void same_grads(const host_case *c, const e16 *dq, const e16 *dq2, const e16 *dkn,
                       const e16 *dkn2, const float *dkr, const float *dkr2, const e16 *dv,
                       const e16 *dv2, int *fails) {
  same_bits("dq", dq, dq2, c->nq, 2, fails);
  same_bits("dk_nope", dkn, dkn2, c->nkn, 2, fails);
  same_bits("dk_rope", dkr, dkr2, c->nkr, 4, fails);
  same_bits("dv", dv, dv2, c->nv, 2, fails);
}

/* Packed keys' per-head dK [S, H, d_qk] as the split keys' gradients: dk_nope [S, H, d_n]
 * and dk_rope [S, d_r], the RoPE columns summed over the heads in order (as split_dkv does,
 * in fp32; a NaN anywhere stays). */
static void unpack_dk(const host_case *c, const e16 *dkp, e16 *dkn, float *dkr) {
  for (int s = 0; s < c->S; s++) {
    for (int d = 0; d < DR; d++) dkr[(size_t)s * DR + d] = 0.f;
    for (int h = 0; h < c->H; h++) {
      const e16 *row = dkp + ((size_t)s * c->H + h) * DQK;
      memcpy(dkn + ((size_t)s * c->H + h) * DN, row, DN * sizeof *row);
      for (int d = 0; d < DR; d++) dkr[(size_t)s * DR + d] += bf16_to_float(row[DN + d]);
    }
  }
}

/* Checks every kernel of ks at (H = ks->heads, S). Returns -1 on a CUDA error, else the
 * number of misses. */
static int check_set(const kset *ks, int S) {
  const int H = ks->heads;
  double t0 = wall_s();
  host_case c;
  case_init(&c, H, S, 1);
  say("check H=%d S=%d B=1 causal (float64 reference %.1f s)\n", H, S, wall_s() - t0);
  int fails = 0, rc = -1;
  const float scale = softmax_scale();
  const int base = g_n_allocs;
  dev_tensors t;
  dev_outputs out;
  memset(&t, 0, sizeof t), memset(&out, 0, sizeof out);
  e16 *o = xcalloc(c.no, sizeof *o), *dq = xcalloc(c.nq, sizeof *dq);
  e16 *dkn = xcalloc(c.nkn, sizeof *dkn), *dv = xcalloc(c.nv, sizeof *dv);
  float *lse = xcalloc(c.nl, sizeof *lse), *dq_accum = xcalloc(c.nq, sizeof *dq_accum);
  float *dkr = xcalloc(c.nkr, sizeof *dkr);
  e16 *o2 = xcalloc(c.no, sizeof *o2), *dq2 = xcalloc(c.nq, sizeof *dq2); /* second runs */
  e16 *dkn2 = xcalloc(c.nkn, sizeof *dkn2), *dv2 = xcalloc(c.nv, sizeof *dv2);
  float *lse2 = xcalloc(c.nl, sizeof *lse2), *dkr2 = xcalloc(c.nkr, sizeof *dkr2);
  if (upload(&t.q, c.q, c.nq * 2) || upload(&t.kn, c.kn, c.nkn * 2) ||
      upload(&t.kr, c.kr, c.nkr * 2) || upload(&t.kp, c.kp, c.nq * 2) ||
      upload(&t.v, c.v, c.nv * 2) || upload(&t.dout, c.dout, c.no * 2) ||
      upload(&t.o, c.o16, c.no * 2) || upload(&t.lse, c.lse32, c.nl * 4) ||
      alloc_nan(&t.delta, c.nl * 4) || alloc_nan(&out.o, c.no * 2) || alloc_nan(&out.lse, c.nl * 4) ||
      alloc_nan(&out.dq_accum, c.nq * 4) || alloc_nan(&out.dq, c.nq * 2) ||
      alloc_nan(&out.dkn, c.nkn * 2) || alloc_nan(&out.dkr, c.nkr * 4) || alloc_nan(&out.dv, c.nv * 2))
    goto done;
  /* the forward, both key layouts, twice (the second run compared bit for bit) */
  for (int w = K_FWD; w <= K_FWD_KP; w++) {
    for (int run = 0; run < 2; run++) {
      if (CU(drv->cuMemsetD8(out.o, 0xff, c.no * 2)) || CU(drv->cuMemsetD8(out.lse, 0xff, c.nl * 4)))
        goto done;
      if (run_fwd(&ks->k[w], &t, out.o, out.lse, S, scale) || sync_stream(ks->k[w].name)) goto done;
      if (download(run ? o2 : o, out.o, c.no * 2) || download(run ? lse2 : lse, out.lse, c.nl * 4)) goto done;
    }
    say("  %s\n", ks->k[w].name);
    check_elems("O", o, 0, c.r_o, (size_t)S, (int)(c.no / S), 0, (int)(c.no / S), TOL_O, &fails);
    check_elems("LSE", lse, 1, c.r_lse, (size_t)H, S, 0, S, TOL_LSE, &fails);
    same_bits("O", o, o2, c.no, 2, &fails);
    same_bits("LSE", lse, lse2, c.nl, 4, &fails);
  }
  /* the backward, atomic: pre (zeroes dq_accum) + dkdv; dk_rope zeroed first (atomics: not
   * deterministic by design, so not compared bit for bit) */
  if (CU(drv->cuMemsetD8(out.dkr, 0, c.nkr * 4)) || CU(drv->cuMemsetD8(out.dkn, 0xff, c.nkn * 2)) ||
      CU(drv->cuMemsetD8(out.dv, 0xff, c.nv * 2)) || CU(drv->cuMemsetD8(t.delta, 0xff, c.nl * 4)))
    goto done;
  if (run_pre(&ks->k[K_PRE], &t, out.dq_accum, S) || sync_stream(ks->k[K_PRE].name)) goto done;
  if (run_dkdv(&ks->k[K_DKDV], &t, out.dq_accum, &out, S, scale) || sync_stream(ks->k[K_DKDV].name))
    goto done;
  if (download(dq_accum, out.dq_accum, c.nq * 4) || download(dkn, out.dkn, c.nkn * 2) ||
      download(dkr, out.dkr, c.nkr * 4) || download(dv, out.dv, c.nv * 2))
    goto done;
  say("  %s + %s\n", ks->k[K_PRE].name, ks->k[K_DKDV].name);
  check_grads(&c, S, dq_accum, 1, dkn, dkr, dv, &fails);
  /* the backward, deterministic: pre (no dq_accum) + dkdv_det + dq, twice */
  for (int run = 0; run < 2; run++) {
    if (CU(drv->cuMemsetD8(out.dkr, 0xff, c.nkr * 4)) || CU(drv->cuMemsetD8(out.dkn, 0xff, c.nkn * 2)) ||
        CU(drv->cuMemsetD8(out.dv, 0xff, c.nv * 2)) || CU(drv->cuMemsetD8(out.dq, 0xff, c.nq * 2)) ||
        CU(drv->cuMemsetD8(t.delta, 0xff, c.nl * 4)))
      goto done;
    if (run_pre(&ks->k[K_PRE], &t, NULLP, S) || sync_stream(ks->k[K_PRE].name)) goto done;
    if (run_dkdv(&ks->k[K_DKDV_DET], &t, NULLP, &out, S, scale) ||
        sync_stream(ks->k[K_DKDV_DET].name))
      goto done;
    if (run_dq(&ks->k[K_DQ], &t, &out, S, scale) || sync_stream(ks->k[K_DQ].name)) goto done;
    if (download(run ? dq2 : dq, out.dq, c.nq * 2) || download(run ? dkn2 : dkn, out.dkn, c.nkn * 2) ||
        download(run ? dkr2 : dkr, out.dkr, c.nkr * 4) || download(run ? dv2 : dv, out.dv, c.nv * 2))
      goto done;
  }
  say("  %s + %s + %s\n", ks->k[K_PRE].name, ks->k[K_DKDV_DET].name, ks->k[K_DQ].name);
  check_grads(&c, S, dq, 0, dkn, dkr, dv, &fails);
  same_grads(&c, dq, dq2, dkn, dkn2, dkr, dkr2, dv, dv2, &fails);
  rc = fails;
done:
  /* free this check's buffers (the latest allocations) */
  free_since(base);
  free(o), free(dq), free(dkn), free(dv), free(lse), free(dq_accum), free(dkr);
  free(o2), free(dq2), free(dkn2), free(dv2), free(lse2), free(dkr2);
  case_free(&c);
  return rc;
}

/* --sm90: checks attn_fwd and attn_fwd_sm90 (split keys, then packed: the explicit plan's)
 * of ks at (H = ks->heads, S), causal and not, each run twice (the second compared bit for
 * bit), O and LSE per element against the float64 reference (gpu_tol.h). Returns -1 on a
 * CUDA error, else the number of misses. */
static int check_sm90(const kset *ks, int S) {
  const int H = ks->heads;
  int fails = 0, rc = -1;
  const float scale = softmax_scale();
  const int base = g_n_allocs;
  host_case c;
  memset(&c, 0, sizeof c);
  e16 *o = NULL, *o2 = NULL;
  float *lse = NULL, *lse2 = NULL;
  for (int causal = 1; causal >= 0; causal--) {
    double t0 = wall_s();
    case_free(&c);
    case_init(&c, H, S, causal);
    say("check H=%d S=%d B=1 %s (float64 reference %.1f s)\n", H, S,
        causal ? "causal" : "non-causal", wall_s() - t0);
    free(o), free(o2), free(lse), free(lse2);
    o = xcalloc(c.no, sizeof *o), o2 = xcalloc(c.no, sizeof *o2);
    lse = xcalloc(c.nl, sizeof *lse), lse2 = xcalloc(c.nl, sizeof *lse2);
    dev_tensors t;
    CUdeviceptr out_o, out_lse;
    memset(&t, 0, sizeof t);
    if (upload(&t.q, c.q, c.nq * 2) || upload(&t.kn, c.kn, c.nkn * 2) ||
        upload(&t.kr, c.kr, c.nkr * 2) || upload(&t.kp, c.kp, c.nq * 2) ||
        upload(&t.v, c.v, c.nv * 2) || alloc_nan(&out_o, c.no * 2) || alloc_nan(&out_lse, c.nl * 4))
      goto done;
    const int ws[3] = {causal ? K_FWD : K_FWD_FULL, causal ? K_FWD_SM90 : K_FWD_SM90_FULL,
                       causal ? K_FWD_SM90_KP : K_FWD_SM90_KP_FULL};
    for (int i = 0; i < 3; i++) {
      const gk *g = &ks->k[ws[i]];
      fwd_maps maps;
      memset(maps, 0, sizeof maps);
      if (is_sm90(g->which) && sm90_maps(g, &t, S, maps)) goto done;
      for (int run = 0; run < 2; run++) {
        if (CU(drv->cuMemsetD8(out_o, 0xff, c.no * 2)) || CU(drv->cuMemsetD8(out_lse, 0xff, c.nl * 4)))
          goto done;
        if (run_any_fwd(g, &t, out_o, out_lse, S, scale, maps) || sync_stream(g->name)) goto done;
        if (download(run ? o2 : o, out_o, c.no * 2) || download(run ? lse2 : lse, out_lse, c.nl * 4))
          goto done;
      }
      say("  %s\n", g->name);
      check_elems("O", o, 0, c.r_o, (size_t)S, (int)(c.no / S), 0, (int)(c.no / S), TOL_O, &fails);
      check_elems("LSE", lse, 1, c.r_lse, (size_t)H, S, 0, S, TOL_LSE, &fails);
      same_bits("O", o, o2, c.no, 2, &fails);
      same_bits("LSE", lse, lse2, c.nl, 4, &fails);
    }
  }
  rc = fails;
done:
  free_since(base);
  free(o), free(o2), free(lse), free(lse2);
  case_free(&c);
  return rc;
}

/* --sm90: checks the deterministic backwards of ks at (H = ks->heads, S), causal, B = 1,
 * given the reference O (bf16) and LSE (fp32): attn_bwd_pre + attn_bwd_dkdv (deterministic)
 * + attn_bwd_dq, then attn_bwd_pre + attn_bwd_dkdv_sm90 + attn_bwd_dq_sm90, each twice (the
 * second compared bit for bit), dq, dk_nope, dk_rope and dv per element against the float64
 * reference (gpu_tol.h); then the atomic attn_bwd_pre + attn_bwd_dkdv_sm90 (deterministic =
 * 0) once, dq_accum in place of dq. Returns -1 on a CUDA error, else the number of misses. */
static int check_sm90_bwd(const kset *ks, int S, int causal) {
  const int H = ks->heads;
  double t0 = wall_s();
  host_case c;
  case_init(&c, H, S, causal);
  say("check H=%d S=%d B=1 %s backward (float64 reference %.1f s)\n", H, S,
      causal ? "causal" : "non-causal", wall_s() - t0);
  int fails = 0, rc = -1;
  const float scale = softmax_scale();
  const int base = g_n_allocs;
  dev_tensors t;
  dev_outputs out;
  memset(&t, 0, sizeof t), memset(&out, 0, sizeof out);
  e16 *dq[2] = {xcalloc(c.nq, 2), xcalloc(c.nq, 2)}, *dkn[2] = {xcalloc(c.nkn, 2), xcalloc(c.nkn, 2)};
  e16 *dv[2] = {xcalloc(c.nv, 2), xcalloc(c.nv, 2)};
  float *dkr[2] = {xcalloc(c.nkr, 4), xcalloc(c.nkr, 4)}, *dqa = xcalloc(c.nq, 4);
  e16 *dkp[2] = {xcalloc(c.nq, 2), xcalloc(c.nq, 2)};
  bwd_maps maps[4];
  if (upload(&t.q, c.q, c.nq * 2) || upload(&t.kn, c.kn, c.nkn * 2) ||
      upload(&t.kr, c.kr, c.nkr * 2) || upload(&t.kp, c.kp, c.nq * 2) || upload(&t.v, c.v, c.nv * 2) ||
      upload(&t.dout, c.dout, c.no * 2) || upload(&t.o, c.o16, c.no * 2) ||
      upload(&t.lse, c.lse32, c.nl * 4) || alloc_nan(&t.delta, c.nl * 4) ||
      alloc_nan(&out.dq, c.nq * 2) || alloc_nan(&out.dkn, c.nkn * 2) ||
      alloc_nan(&out.dkr, c.nkr * 4) || alloc_nan(&out.dv, c.nv * 2) || alloc_nan(&out.dkp, c.nq * 2) ||
      sm90_bwd_maps(&ks->k[K_DKDV_SM90], &t, S, maps[0]) ||
      sm90_bwd_maps(&ks->k[K_DQ_SM90], &t, S, maps[1]) ||
      sm90_bwd_maps(&ks->k[causal ? K_DKDV_SM90_KP : K_DKDV_SM90_KP_FULL], &t, S, maps[2]) ||
      sm90_bwd_maps(&ks->k[causal ? K_DQ_SM90_KP : K_DQ_SM90_KP_FULL], &t, S, maps[3]))
    goto done;
  /* mma.sync, then sm_90a; split keys (the LAGA plans'), then packed (the explicit plan's:
   * its dK per head, checked as dk_nope and the RoPE part summed over the heads) */
  for (int v = causal ? 0 : 2; v < 4; v++) { /* non-causal: the packed pipelines only */
    const int sm90 = v & 1, packed = v >> 1;
    static const int dkdv_k[4] = {K_DKDV_DET, K_DKDV_SM90, K_DKDV_KP, K_DKDV_SM90_KP};
    static const int dq_k[4] = {K_DQ, K_DQ_SM90, K_DQ_KP, K_DQ_SM90_KP};
    static const int dkdv_full[4] = {0, 0, K_DKDV_KP_FULL, K_DKDV_SM90_KP_FULL};
    static const int dq_full[4] = {0, 0, K_DQ_KP_FULL, K_DQ_SM90_KP_FULL};
    const gk *kd = &ks->k[causal ? dkdv_k[v] : dkdv_full[v]], *kq = &ks->k[causal ? dq_k[v] : dq_full[v]];
    for (int run = 0; run < 2; run++) {
      if (CU(drv->cuMemsetD8(out.dkr, 0xff, c.nkr * 4)) || CU(drv->cuMemsetD8(out.dkn, 0xff, c.nkn * 2)) ||
          CU(drv->cuMemsetD8(out.dkp, 0xff, c.nq * 2)) ||
          CU(drv->cuMemsetD8(out.dv, 0xff, c.nv * 2)) || CU(drv->cuMemsetD8(out.dq, 0xff, c.nq * 2)) ||
          CU(drv->cuMemsetD8(t.delta, 0xff, c.nl * 4)))
        goto done;
      if (run_pre(&ks->k[K_PRE], &t, NULLP, S) || sync_stream(ks->k[K_PRE].name)) goto done;
      if ((sm90 ? run_dkdv_sm90(kd, &t, NULLP, &out, S, scale, maps[2 * packed]) : run_dkdv(kd, &t, NULLP, &out, S, scale)) ||
          sync_stream(kd->name))
        goto done;
      if ((sm90 ? run_dq_sm90(kq, &t, &out, S, scale, maps[2 * packed + 1]) : run_dq(kq, &t, &out, S, scale)) ||
          sync_stream(kq->name))
        goto done;
      if (download(dq[run], out.dq, c.nq * 2) || download(dv[run], out.dv, c.nv * 2))
        goto done;
      if (packed) {
        if (download(dkp[run], out.dkp, c.nq * 2)) goto done;
        unpack_dk(&c, dkp[run], dkn[run], dkr[run]);
      } else if (download(dkn[run], out.dkn, c.nkn * 2) || download(dkr[run], out.dkr, c.nkr * 4)) {
        goto done;
      }
    }
    say("  %s + %s + %s\n", ks->k[K_PRE].name, kd->name, kq->name);
    check_grads(&c, S, dq[0], 0, dkn[0], dkr[0], dv[0], &fails);
    same_grads(&c, dq[0], dq[1], dkn[0], dkn[1], dkr[0], dkr[1], dv[0], dv[1], &fails);
    if (packed) same_bits("dk (packed, per head)", dkp[0], dkp[1], c.nq, 2, &fails);
  }
  /* the atomic sm_90a backward: pre (zeroes dq_accum) + attn_bwd_dkdv_sm90 deterministic = 0
   * (dk_rope zeroed first; atomics: not compared bit for bit) */
  if (causal) {
    const gk *ka = &ks->k[K_DKDV_SM90_AT];
    CUdeviceptr dq_accum = 0;
    bwd_maps amaps;
    if (alloc_nan(&dq_accum, c.nq * 4) || sm90_bwd_maps(ka, &t, S, amaps) ||
        CU(drv->cuMemsetD8(out.dkr, 0, c.nkr * 4)) || CU(drv->cuMemsetD8(out.dkn, 0xff, c.nkn * 2)) ||
        CU(drv->cuMemsetD8(out.dv, 0xff, c.nv * 2)) || CU(drv->cuMemsetD8(t.delta, 0xff, c.nl * 4)))
      goto done;
    if (run_pre(&ks->k[K_PRE], &t, dq_accum, S) || sync_stream(ks->k[K_PRE].name)) goto done;
    if (run_dkdv_sm90(ka, &t, dq_accum, &out, S, scale, amaps) || sync_stream(ka->name)) goto done;
    if (download(dqa, dq_accum, c.nq * 4) || download(dkn[0], out.dkn, c.nkn * 2) ||
        download(dkr[0], out.dkr, c.nkr * 4) || download(dv[0], out.dv, c.nv * 2))
      goto done;
    say("  %s + %s\n", ks->k[K_PRE].name, ka->name);
    check_grads(&c, S, dqa, 1, dkn[0], dkr[0], dv[0], &fails);
  }
  rc = fails;
done:
  free_since(base);
  for (int i = 0; i < 2; i++) free(dq[i]), free(dkn[i]), free(dv[i]), free(dkr[i]), free(dkp[i]);
  free(dqa);
  case_free(&c);
  return rc;
}

/* The S at which the absorbed kernels of H heads are checked: the float64 reference costs
 * about S^2 H (d_c + d_r) x 6 operations, so the H = 128 check uses fewer tokens (still a
 * partial key tile: 72 is not a multiple of 32 or 64). */
static int mqa_check_seq(int H, int first) { return first ? 255 : H >= 64 ? 72 : 200; }

/* Checks the absorbed kernels of ks at (H = ks->heads, S), causal, B = 1, against the
 * float64 reference of tests/mqa_ref.h: mqa_fwd's O and LSE; then the backward pipeline
 * attn_bwd_pre (d_v = d_c) + mqa_bwd_dkv + mqa_bwd_dq given the reference O (rounded to
 * bf16) and LSE (fp32) as mqa_fwd stores them: dq, dc_kv = dc[:, :d_c] and
 * dk_rope = dc[:, d_c:]. Under --sm90 likewise mqa_fwd_sm90, and pre + mqa_bwd_dkv_sm90 +
 * mqa_bwd_dq_sm90 (their tensor maps from the runtime, by value). Each run twice, the second
 * compared bit for bit. Outputs NaN-filled first. Returns -1 on a CUDA error, else the
 * number of misses. */
static int check_mqa(const kset *ks, int S) {
  const int H = ks->heads;
  const size_t nq = (size_t)S * H * MQK, nc = (size_t)S * MQK, no = (size_t)S * H * MV;
  const size_t nl = (size_t)H * S;
  const double scale = softmax_scale();
  double t0 = wall_s();
  e16 *q = rand_bf16(nq), *c = rand_bf16(nc), *dout = rand_bf16(no);
  double *qd = xcalloc(nq, sizeof *qd), *cd = xcalloc(nc, sizeof *cd), *dod = xcalloc(no, sizeof *dod);
  for (size_t i = 0; i < nq; i++) qd[i] = bf16_to_float(q[i]);
  for (size_t i = 0; i < nc; i++) cd[i] = bf16_to_float(c[i]);
  for (size_t i = 0; i < no; i++) dod[i] = bf16_to_float(dout[i]);
  double *r_o = xcalloc(no, sizeof *r_o), *r_lse = xcalloc(nl, sizeof *r_lse);
  double *r_dq = xcalloc(nq, sizeof *r_dq), *r_dc = xcalloc(nc, sizeof *r_dc);
  mqa_ref_fwd(1, S, S, H, DC, DR, 1, 0, scale, qd, cd, r_o, r_lse);
  mqa_ref_bwd(1, S, S, H, DC, DR, 1, 0, scale, qd, cd, dod, r_dq, r_dc);
  e16 *o16 = xcalloc(no, sizeof *o16);
  float *lse32 = xcalloc(nl, sizeof *lse32);
  for (size_t i = 0; i < no; i++) o16[i] = float_to_bf16((float)r_o[i]);
  for (size_t i = 0; i < nl; i++) lse32[i] = (float)r_lse[i];
  say("check mqa H=%d S=%d B=1 causal, d_qk %d d_v %d (float64 reference %.1f s)\n", H, S, MQK, MV,
      wall_s() - t0);
  e16 *o = xcalloc(no, sizeof *o), *dq = xcalloc(nq, sizeof *dq), *dc = xcalloc(nc, sizeof *dc);
  float *lse = xcalloc(nl, sizeof *lse);
  e16 *o2 = xcalloc(no, sizeof *o2), *dq2 = xcalloc(nq, sizeof *dq2), *dc2 = xcalloc(nc, sizeof *dc2);
  float *lse2 = xcalloc(nl, sizeof *lse2);
  int fails = 0, rc = -1;
  const int base = g_n_allocs;
  mqa_tensors t;
  CUdeviceptr d_o, d_lse, d_dq, d_dc;
  memset(&t, 0, sizeof t);
  if (upload(&t.q, q, nq * 2) || upload(&t.c, c, nc * 2) || upload(&t.dout, dout, no * 2) ||
      upload(&t.o, o16, no * 2) || upload(&t.lse, lse32, nl * 4) || alloc_nan(&t.delta, nl * 4) ||
      alloc_nan(&d_o, no * 2) || alloc_nan(&d_lse, nl * 4) || alloc_nan(&d_dq, nq * 2) ||
      alloc_nan(&d_dc, nc * 2))
    goto done;
  const gk *k = ks->k;
  for (int sm90 = 0; sm90 < 1 + g_sm90; sm90++) { /* mma.sync, then (--sm90) sm_90a */
    const gk *kf = &k[sm90 ? K_MQA_FWD_SM90 : K_MQA_FWD];
    mqa_maps fmaps;
    memset(fmaps, 0, sizeof fmaps);
    if (sm90 && sm90_mqa_maps(kf, &t, S, fmaps)) goto done;
    for (int run = 0; run < 2; run++) { /* twice: the second compared bit for bit */
      if (CU(drv->cuMemsetD8(d_o, 0xff, no * 2)) || CU(drv->cuMemsetD8(d_lse, 0xff, nl * 4))) goto done;
      if (run_any_mqa_fwd(kf, &t, d_o, d_lse, S, (float)scale, fmaps) || sync_stream(kf->name))
        goto done;
      if (download(run ? o2 : o, d_o, no * 2) || download(run ? lse2 : lse, d_lse, nl * 4)) goto done;
    }
    say("  %s\n", kf->name);
    check_elems("O (latent)", o, 0, r_o, (size_t)S, (int)(no / S), 0, (int)(no / S), TOL_ABS_O, &fails);
    check_elems("LSE", lse, 1, r_lse, (size_t)H, S, 0, S, TOL_LSE, &fails);
    same_bits("O (latent)", o, o2, no, 2, &fails);
    same_bits("LSE", lse, lse2, nl, 4, &fails);
  }
  for (int sm90 = 0; sm90 < 1 + g_sm90; sm90++) {
    const gk *kd = &k[sm90 ? K_MQA_DKV_SM90 : K_MQA_DKV], *kq = &k[sm90 ? K_MQA_DQ_SM90 : K_MQA_DQ];
    mqa_bwd_maps bmaps[2];
    memset(bmaps, 0, sizeof bmaps);
    if (sm90 && (sm90_mqa_bwd_maps(kd, &t, S, bmaps[0]) || sm90_mqa_bwd_maps(kq, &t, S, bmaps[1])))
      goto done;
    for (int run = 0; run < 2; run++) {
      if (CU(drv->cuMemsetD8(d_dq, 0xff, nq * 2)) || CU(drv->cuMemsetD8(d_dc, 0xff, nc * 2)) ||
          CU(drv->cuMemsetD8(t.delta, 0xff, nl * 4)))
        goto done;
      if (run_mqa_pre(&k[K_MQA_PRE], &t, S) || sync_stream(k[K_MQA_PRE].name)) goto done;
      if (run_mqa_bwd(kd, &t, d_dc, S, (float)scale, bmaps[0]) || sync_stream(kd->name)) goto done;
      if (run_mqa_bwd(kq, &t, d_dq, S, (float)scale, bmaps[1]) || sync_stream(kq->name)) goto done;
      if (download(run ? dq2 : dq, d_dq, nq * 2) || download(run ? dc2 : dc, d_dc, nc * 2)) goto done;
    }
    say("  %s + %s + %s\n", k[K_MQA_PRE].name, kd->name, kq->name);
    check_elems("dq", dq, 0, r_dq, (size_t)S, (int)(nq / S), 0, (int)(nq / S), TOL_ABS_GRAD, &fails);
    check_elems("dc_kv (dc[:, :d_c])", dc, 0, r_dc, (size_t)S, MQK, 0, DC, TOL_ABS_GRAD, &fails);
    check_elems("dk_rope (dc[:, d_c:])", dc, 0, r_dc, (size_t)S, MQK, DC, DR, TOL_ABS_GRAD, &fails);
    same_bits("dq", dq, dq2, nq, 2, &fails);
    same_bits("dc", dc, dc2, nc, 2, &fails);
  }
  rc = fails;
done:
  free_since(base);
  free(q), free(c), free(dout), free(qd), free(cd), free(dod), free(r_o), free(r_lse), free(r_dq);
  free(r_dc), free(o16), free(lse32), free(o), free(dq), free(dc), free(lse);
  free(o2), free(dq2), free(dc2), free(lse2);
  return rc;
}

/* ---- timing ----------------------------------------------------------------------------- */
typedef struct row {
  char kernel[48], op[16];
  int H, S;
  int dqk, dv; /* the attention's widths: 192/128 (explicit), 576/512 (absorbed, mqa_*) */
  double ms, flops, bytes;
  int iters;
  int causal; /* 1 but for --sm90's non-causal forwards */
} row;
#define MAX_ROWS 512
static row g_rows[MAX_ROWS];
static int g_n_rows;

static int g_iters = 20, g_warmup = 3, g_max_sets = 4;
static double g_row_budget_ms = 6000;

/* A random pool the device buffers are filled from (each buffer at its own offset). */
#define POOL (1u << 24)
static e16 *g_pool;

static int fill_random(CUdeviceptr p, size_t n_elems, size_t seed_off) {
  size_t off = (seed_off * 2654435761u) % POOL, done = 0;
  while (done < n_elems) {
    size_t n = n_elems - done < POOL - off ? n_elems - done : POOL - off;
    if (CU(drv->cuMemcpyHtoD(p + done * 2, g_pool + off, n * 2))) return -1;
    done += n, off = 0;
  }
  return 0;
}

/* A launch sequence of n_steps kernels timed step by step: fn(ctx, set, j) launches step
 * j. As time_row (warm-up, the first warm-up sized for --row-budget-ms, at least 5
 * iterations, at most (GPU_EVENTS - 1) / n_steps), with an event after every step, all recorded back to back on one stream;
 * ms[j] is the median of step j, ms[n_steps] the median of the whole sequence (event to
 * event, so the steps' medians need not add up to it exactly). */
typedef int (*step_fn)(void *ctx, int set, int step);

static int time_steps(const char *label, step_fn fn, void *ctx, int n_steps, int n_sets, double *ms,
                      int *iters) {
  CUevent *const ev = gpu_events();
  if (!ev) return -1;
  float w_ms = 0;
  for (int i = 0; i < g_warmup || i < 1; i++) {
    if (CU(drv->cuEventRecord(ev[0], g_stream))) return -1;
    for (int j = 0; j < n_steps; j++)
      if (fn(ctx, i % n_sets, j)) return -1;
    if (CU(drv->cuEventRecord(ev[1], g_stream)) || CU(drv->cuEventSynchronize(ev[1])) ||
        CU(drv->cuEventElapsedTime(&w_ms, ev[0], ev[1])))
      return -1;
  }
  int n = g_iters;
  if (w_ms > 0 && n * w_ms > g_row_budget_ms) {
    n = (int)(g_row_budget_ms / w_ms);
    if (n < 5) n = 5;
    if (n > g_iters) n = g_iters;
    say("  (%s: %.1f ms per launch, %d iterations instead of %d)\n", label, w_ms, n, g_iters);
  }
  if (n > (GPU_EVENTS - 1) / n_steps) n = (GPU_EVENTS - 1) / n_steps;
  if (CU(drv->cuEventRecord(ev[0], g_stream))) return -1;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n_steps; j++) {
      if (fn(ctx, (i + 1) % n_sets, j)) return -1;
      if (CU(drv->cuEventRecord(ev[i * n_steps + j + 1], g_stream))) return -1;
    }
  char what[160];
  snprintf(what, sizeof what, "cuEventSynchronize after timing %s", label);
  if (cu(drv->cuEventSynchronize(ev[n * n_steps]), what)) return -1;
  float t[GPU_EVENTS - 1];
  for (int j = 0; j <= n_steps; j++) {
    for (int i = 0; i < n; i++) {
      const int a = i * n_steps + (j < n_steps ? j : 0), b = j < n_steps ? a + 1 : a + n_steps;
      if (CU(drv->cuEventElapsedTime(&t[i], ev[a], ev[b]))) return -1;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_float);
    ms[j] = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  }
  *iters = n;
  return 0;
}

typedef int (*launch_fn)(void *ctx, int set);
typedef struct one_step {
  launch_fn fn;
  void *ctx;
} one_step;
static int one_step_launch(void *p, int set, int step) {
  (void)step;
  const one_step *o = p;
  return o->fn(o->ctx, set);
}

/* One launch per iteration (time_steps with one step); its median ms. */
static int time_row(const char *label, launch_fn fn, void *ctx, int n_sets, double *ms, int *iters) {
  one_step o = {fn, ctx};
  double m[2];
  if (time_steps(label, one_step_launch, &o, 1, n_sets, m, iters)) return -1;
  *ms = m[0];
  return 0;
}

/* How many buffer sets of set_bytes (beside out_bytes, once) a timing rotates through: about
 * target_bytes' worth (at least 2; 0: max_sets), at most max_sets, fewer while they would
 * take over 85% of free_b; 0, said ("<what> H=.. S=..: needs .. skipped"), when not even
 * one fits. */
static int sets_that_fit(const char *what, int H, int S, double set_bytes, double out_bytes,
                         double target_bytes, int max_sets, size_t free_b) {
  int n = max_sets;
  if (target_bytes > 0) {
    n = (int)ceil(target_bytes / set_bytes);
    if (n < 2) n = 2;
    if (n > max_sets) n = max_sets;
  }
  while (n > 1 && n * set_bytes + out_bytes > 0.85 * (double)free_b) n--;
  if (set_bytes + out_bytes > 0.85 * (double)free_b) {
    say("%s%sH=%d S=%d: needs %.1f GB, %.1f GB free: skipped\n", what, *what ? " " : "", H, S,
        (set_bytes + out_bytes) / 1e9, free_b / 1e9);
    return 0;
  }
  return n;
}

/* sets_that_fit for the device's free memory now, at most --sets: the count, 0 when none
 * fits, -1 on a CUDA error. */
static int device_sets(const char *what, int H, int S, double set_bytes, double out_bytes,
                       double target_bytes) {
  size_t free_b = 0, total_b = 0;
  if (CU(drv->cuMemGetInfo(&free_b, &total_b))) return -1;
  return sets_that_fit(what, H, S, set_bytes, out_bytes, target_bytes, g_max_sets, free_b);
}

typedef struct tctx {
  const kset *ks;
  int S;
  float scale;
  dev_tensors t[8];
  dev_outputs out;
  int which; /* a kernel, or -1: bwd_atomic, -2: bwd_det */
} tctx;

static int tlaunch(void *p, int set) {
  tctx *x = p;
  const dev_tensors *t = &x->t[set];
  const gk *k = x->ks->k;
  switch (x->which) {
    case K_FWD:
    case K_FWD_KP: return run_fwd(&k[x->which], t, t->o, t->lse, x->S, x->scale);
    case K_PRE: return run_pre(&k[K_PRE], t, x->out.dq_accum, x->S);
    case K_DKDV: return run_dkdv(&k[K_DKDV], t, x->out.dq_accum, &x->out, x->S, x->scale);
    case K_DKDV_DET: return run_dkdv(&k[K_DKDV_DET], t, NULLP, &x->out, x->S, x->scale);
    case K_DQ: return run_dq(&k[K_DQ], t, &x->out, x->S, x->scale);
    case -1:
      return run_pre(&k[K_PRE], t, x->out.dq_accum, x->S) ||
             run_dkdv(&k[K_DKDV], t, x->out.dq_accum, &x->out, x->S, x->scale);
    default:
      return run_pre(&k[K_PRE], t, NULLP, x->S) ||
             run_dkdv(&k[K_DKDV_DET], t, NULLP, &x->out, x->S, x->scale) ||
             run_dq(&k[K_DQ], t, &x->out, x->S, x->scale);
  }
}

/* Appends a row (the explicit widths, causal) and returns it; past MAX_ROWS, a scratch row
 * not kept. */
static row *add_row(const char *kernel, const char *op, int H, int S, double ms, double flops,
                    double bytes, int iters) {
  static row scratch;
  row *r = g_n_rows == MAX_ROWS ? &scratch : &g_rows[g_n_rows++];
  snprintf(r->kernel, sizeof r->kernel, "%s", kernel);
  snprintf(r->op, sizeof r->op, "%s", op);
  r->H = H, r->S = S, r->ms = ms, r->flops = flops, r->bytes = bytes, r->iters = iters;
  r->dqk = DQK, r->dv = DV, r->causal = 1;
  return r;
}

/* Times fn (time_row) and appends its row (add_row); NULL on a CUDA error. */
static row *timed_row(const char *label, const char *op, launch_fn fn, void *ctx, int n_sets,
                      int H, int S, double flops, double bytes) {
  double ms;
  int iters;
  if (time_row(label, fn, ctx, n_sets, &ms, &iters)) return NULL;
  return add_row(label, op, H, S, ms, flops, bytes, iters);
}

static void print_row(const row *r) {
  char tf[16] = "-";
  if (r->flops > 0) snprintf(tf, sizeof tf, "%.1f", r->flops / (r->ms * 1e-3) / 1e12);
  say("%-18s %4d %6d %5d/%-3d %6s %10.3f %8s %10.1f %8.0f %5d\n", r->kernel, r->H, r->S, r->dqk, r->dv,
      r->causal ? "yes" : "no", r->ms, tf, r->bytes / 1e6, r->bytes / (r->ms * 1e-3) / 1e9, r->iters);
}

static void print_header(void) {
  say("%-18s %4s %6s %9s %6s %10s %8s %10s %8s %5s\n", "kernel", "H", "S", "d_qk/d_v", "causal",
      "ms(median)", "TFLOP/s", "MB moved", "GB/s", "iters");
}

/* What alloc_set allocates beyond q, kn, kr, v, o, lse: the packed K kp; the backward's
 * kp, dout and delta. */
enum { SET_KP = 1, SET_BWD = 3 };
/* Allocates set `s` of the attention tensors at (H, S): q, kn, kr, v random (and kp when
 * `what` has SET_KP, dout too for SET_BWD), o, lse (and delta for SET_BWD) NaN-filled.
 * Returns nonzero on a CUDA error. */
static int alloc_set(dev_tensors *t, int s, int H, int S, int what) {
  const int kp = what & SET_KP, bwd = what == SET_BWD;
  const size_t nq = (size_t)S * H * DQK, nkn = (size_t)S * H * DN, nkr = (size_t)S * DR;
  const size_t nv = (size_t)S * H * DV, no = nv, nl = (size_t)H * S;
  const size_t seed = (size_t)s * 16;
  return dalloc(&t->q, nq * 2) || fill_random(t->q, nq, seed + 1) || dalloc(&t->kn, nkn * 2) ||
         fill_random(t->kn, nkn, seed + 2) || dalloc(&t->kr, nkr * 2) ||
         fill_random(t->kr, nkr, seed + 3) ||
         (kp && (dalloc(&t->kp, nq * 2) || fill_random(t->kp, nq, seed + 4))) ||
         dalloc(&t->v, nv * 2) || fill_random(t->v, nv, seed + 5) ||
         (bwd && (dalloc(&t->dout, no * 2) || fill_random(t->dout, no, seed + 6))) ||
         alloc_nan(&t->o, no * 2) || alloc_nan(&t->lse, nl * 4) ||
         (bwd && alloc_nan(&t->delta, nl * 4));
}

/* Times every row at (H = ks->heads, S). Returns -1 on a CUDA error. */
static int time_shape(const kset *ks, int S) {
  const int H = ks->heads;
  const size_t nq = (size_t)S * H * DQK, nkn = (size_t)S * H * DN, nkr = (size_t)S * DR;
  const size_t nv = (size_t)S * H * DV, no = nv, nl = (size_t)H * S;
  const double set_bytes = 2.0 * (nq + nkn + nkr + nq + nv + 2 * no) + 4.0 * 2 * nl;
  const double out_bytes = 4.0 * nq + 2.0 * nq + 2.0 * nkn + 4.0 * nkr + 2.0 * nv;
  const int n_sets = device_sets("", H, S, set_bytes, out_bytes, 0);
  if (n_sets <= 0) return n_sets;
  const int base = g_n_allocs;
  double t0 = wall_s();
  tctx x;
  memset(&x, 0, sizeof x);
  x.ks = ks, x.S = S, x.scale = softmax_scale();
  int rc = -1;
  for (int s = 0; s < n_sets; s++)
    if (alloc_set(&x.t[s], s, H, S, SET_BWD)) goto done;
  if (alloc_nan(&x.out.dq_accum, nq * 4) || alloc_nan(&x.out.dq, nq * 2) ||
      alloc_nan(&x.out.dkn, nkn * 2) || dalloc(&x.out.dkr, nkr * 4) ||
      CU(drv->cuMemsetD8(x.out.dkr, 0, nkr * 4)) || alloc_nan(&x.out.dv, nv * 2))
    goto done;
  /* each set's O and LSE from the forward, delta from pre: the backward's real inputs */
  for (int s = 0; s < n_sets; s++)
    if (run_fwd(&ks->k[K_FWD], &x.t[s], x.t[s].o, x.t[s].lse, S, x.scale) ||
        run_pre(&ks->k[K_PRE], &x.t[s], NULLP, S))
      goto done;
  if (sync_stream("the forward and pre that prepare the timing inputs")) goto done;
  say("H=%d S=%d: %d input sets of %.0f MB, outputs %.0f MB (%.1f s to fill)\n", H, S, n_sets,
      set_bytes / 1e6, out_bytes / 1e6, wall_s() - t0);

  const double pairs = (double)S * (S + 1) / 2;
  const double f_fwd = 2.0 * H * pairs * (DQK + DV), f_bwd = 2.0 * H * pairs * (3 * DQK + 2 * DV);
  const double b_q = 2.0 * nq, b_kn = 2.0 * nkn, b_kr = 2.0 * nkr, b_v = 2.0 * nv, b_o = 2.0 * no;
  const double b_l = 4.0 * nl;
  const double b_fwd = b_q + b_kn + b_kr + b_v + b_o + b_l, b_fwd_kp = b_q + b_q + b_v + b_o + b_l;
  const double b_pre = 2 * b_o + b_l + 4.0 * nq;
  const double b_bin = b_q + b_kn + b_kr + b_v + b_o /* dout */ + 2 * b_l /* lse, delta */;
  const double b_bout = b_kn + 4.0 * nkr + b_v;
  const struct { int which; const char *op; double flops, bytes; } rows[] = {
      {K_FWD, "fwd", f_fwd, b_fwd},
      {K_FWD_KP, "fwd", f_fwd, b_fwd_kp},
      {K_PRE, "", 0, b_pre},
      {K_DKDV, "", f_bwd, b_bin + 4.0 * nq + b_bout},
      {K_DKDV_DET, "", 0, b_bin + b_bout},
      {K_DQ, "", 0, b_bin + b_q},
      {-1, "bwd", f_bwd, (b_q + b_kn + b_kr + b_v + 2 * b_o + b_l) + 4.0 * nq + b_bout},
      {-2, "bwd", f_bwd, (b_q + b_kn + b_kr + b_v + 2 * b_o + b_l) + b_q + b_bout},
  };
  double ms_fwd = 0, ms_bwd[2] = {0, 0};
  int it_fwd = 0, it_bwd[2] = {0, 0};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    x.which = rows[i].which;
    const char *label = x.which >= 0 ? k_label[x.which] : x.which == -1 ? "bwd_atomic" : "bwd_det";
    const row *r = timed_row(label, rows[i].op, tlaunch, &x, n_sets, H, S, rows[i].flops,
                             rows[i].bytes);
    if (!r) goto done;
    print_row(r);
    if (x.which == K_FWD) ms_fwd = r->ms, it_fwd = r->iters;
    if (x.which < 0) ms_bwd[-x.which - 1] = r->ms, it_bwd[-x.which - 1] = r->iters;
  }
  /* forward + backward: sums of the medians (the forward in the split-key layout) */
  const double b_fb_in = b_q + b_kn + b_kr + b_v + b_o /* dout */;
  const double b_fb_out = b_o + b_l + b_kn + 4.0 * nkr + b_v;
  print_row(add_row("fwd+bwd_atomic", "fwd_bwd", H, S, ms_fwd + ms_bwd[0], f_fwd + f_bwd,
                    b_fb_in + b_fb_out + 4.0 * nq, it_fwd < it_bwd[0] ? it_fwd : it_bwd[0]));
  print_row(add_row("fwd+bwd_det", "fwd_bwd", H, S, ms_fwd + ms_bwd[1], f_fwd + f_bwd,
                    b_fb_in + b_fb_out + b_q, it_fwd < it_bwd[1] ? it_fwd : it_bwd[1]));
  rc = 0;
done:
  free_since(base);
  return rc;
}

/* --sm90: times attn_fwd and attn_fwd_sm90 (split keys: LAGA's; packed, attn_fwd_sm90_kp:
 * the explicit plan's, per-head K as cuDNN's SDPA reads) at (H = ks->heads, S), causal and
 * not, the input sets rotated as time_shape's. Returns -1 on a CUDA error. */
typedef struct sctx {
  const kset *ks;
  int S, which;
  float scale;
  dev_tensors t[8];
  fwd_maps maps[8][4]; /* per set: K_FWD_SM90's, K_FWD_SM90_FULL's, K_FWD_SM90_KP's, _KP_FULL's */
} sctx;

/* The index of kernel which's maps in sctx.maps[set] (0 for the mma.sync attn_fwd: unused). */
static int smap(int which) {
  return which == K_FWD_SM90_FULL ? 1 : which == K_FWD_SM90_KP ? 2 : which == K_FWD_SM90_KP_FULL ? 3 : 0;
}

static int slaunch(void *p, int set) {
  sctx *x = p;
  const dev_tensors *t = &x->t[set];
  return run_any_fwd(&x->ks->k[x->which], t, t->o, t->lse, x->S, x->scale, x->maps[set][smap(x->which)]);
}

static int time_sm90(const kset *ks, int S) {
  const int H = ks->heads;
  const size_t nq = (size_t)S * H * DQK, nkn = (size_t)S * H * DN, nkr = (size_t)S * DR;
  const size_t nv = (size_t)S * H * DV, no = nv, nl = (size_t)H * S;
  const double set_bytes = 2.0 * (nq + nkn + nkr + nq + nv + no) + 4.0 * nl; /* + packed K */
  const int n_sets = device_sets("", H, S, set_bytes, 0, 0);
  if (n_sets <= 0) return n_sets;
  const int base = g_n_allocs;
  sctx x;
  memset(&x, 0, sizeof x);
  x.ks = ks, x.S = S, x.scale = softmax_scale();
  int rc = -1;
  static const int sm90_fwds[4] = {K_FWD_SM90, K_FWD_SM90_FULL, K_FWD_SM90_KP, K_FWD_SM90_KP_FULL};
  for (int s = 0; s < n_sets; s++) {
    if (alloc_set(&x.t[s], s, H, S, SET_KP)) goto done;
    for (int i = 0; i < 4; i++)
      if (sm90_maps(&ks->k[sm90_fwds[i]], &x.t[s], S, x.maps[s][smap(sm90_fwds[i])])) goto done;
  }
  /* bytes: split keys read K_nope and the shared k_rope, packed ones the per-head K */
  const double b = 2.0 * (nq + nkn + nkr + nv + no) + 4.0 * nl, b_kp = 2.0 * (nq + nq + nv + no) + 4.0 * nl;
  const int order[6] = {K_FWD, K_FWD_SM90, K_FWD_SM90_KP, K_FWD_FULL, K_FWD_SM90_FULL, K_FWD_SM90_KP_FULL};
  for (int i = 0; i < 6; i++) {
    x.which = order[i];
    const int causal = is_causal(x.which);
    const double pairs = causal ? (double)S * (S + 1) / 2 : (double)S * S;
    row *r = timed_row(k_label[x.which], "fwd", slaunch, &x, n_sets, H, S,
                       2.0 * H * pairs * (DQK + DV), is_packed_fwd_sm90(x.which) ? b_kp : b);
    if (!r) goto done;
    r->causal = causal;
    print_row(r);
  }
  rc = 0;
done:
  free_since(base);
  return rc;
}

/* --sm90: times the deterministic backwards at (H = ks->heads, S), causal, B = 1, the
 * mma.sync kernels (bwd_dkdv_det, bwd_dq) beside the sm_90a ones (bwd_dkdv_sm90,
 * bwd_dq_sm90), each alone, then the pipelines bwd_det (attn_bwd_pre + attn_bwd_dkdv
 * deterministic + attn_bwd_dq) and bwd_det_sm90 (attn_bwd_pre + the two sm_90a kernels),
 * which carry the backward's FLOPs (MLA.md: 2 H pairs (3 d_qk + 2 d_v)); the atomic ones
 * (bwd_dkdv: attn_bwd_dkdv deterministic = 0, bwd_dkdv_sm90_at: attn_bwd_dkdv_sm90
 * deterministic = 0, each with dQ, alone and after attn_bwd_pre as bwd_atomic /
 * bwd_atomic_sm90; dq_convert not included, as time_shape's bwd_atomic); and fwd+bwd_det /
 * fwd+bwd_sm90 (op fwd_bwd: attn_fwd's / attn_fwd_sm90's causal median from time_sm90
 * plus the pipeline's). Inputs as
 * time_shape's (O and LSE from attn_fwd, delta from attn_bwd_pre). Returns -1 on a CUDA
 * error. */
typedef struct bctx {
  const kset *ks;
  int S, which; /* a kernel, or -1: bwd_det, -2: bwd_det_sm90, -3: bwd_atomic, -4: bwd_atomic_sm90,
                 -5: bwd_det_kp, -6: bwd_det_sm90_kp (packed keys), -7, -8: those non-causal */
  float scale;
  dev_tensors t[8];
  dev_outputs out;
  bwd_maps maps[8][7]; /* per set: K_DKDV_SM90's, K_DQ_SM90's, K_DKDV_SM90_AT's, K_DKDV_SM90_KP's,
                          K_DQ_SM90_KP's, K_DKDV_SM90_KP_FULL's, K_DQ_SM90_KP_FULL's */
} bctx;

/* The deterministic backward pipeline: attn_bwd_pre, dK/dV kernel kd, dQ kernel kq (the
 * sm_90a ones with their maps md, mq; NULL: the mma.sync ones). */
static int det_pipeline(const bctx *x, const dev_tensors *t, int kd, int kq, const CUtensorMap *md,
                        const CUtensorMap *mq) {
  const gk *k = x->ks->k;
  return run_pre(&k[K_PRE], t, NULLP, x->S) ||
         (md ? run_dkdv_sm90(&k[kd], t, NULLP, &x->out, x->S, x->scale, md)
             : run_dkdv(&k[kd], t, NULLP, &x->out, x->S, x->scale)) ||
         (mq ? run_dq_sm90(&k[kq], t, &x->out, x->S, x->scale, mq) : run_dq(&k[kq], t, &x->out, x->S, x->scale));
}

static int blaunch(void *p, int set) {
  bctx *x = p;
  const dev_tensors *t = &x->t[set];
  const gk *k = x->ks->k;
  bwd_maps *const m = x->maps[set];
  switch (x->which) {
    case K_DKDV_DET: return run_dkdv(&k[K_DKDV_DET], t, NULLP, &x->out, x->S, x->scale);
    case K_DQ: return run_dq(&k[K_DQ], t, &x->out, x->S, x->scale);
    case K_DKDV_SM90: return run_dkdv_sm90(&k[K_DKDV_SM90], t, NULLP, &x->out, x->S, x->scale, m[0]);
    case K_DKDV: return run_dkdv(&k[K_DKDV], t, x->out.dq_accum, &x->out, x->S, x->scale);
    case K_DKDV_SM90_AT:
      return run_dkdv_sm90(&k[K_DKDV_SM90_AT], t, x->out.dq_accum, &x->out, x->S, x->scale, m[2]);
    case -3:
      return run_pre(&k[K_PRE], t, x->out.dq_accum, x->S) ||
             run_dkdv(&k[K_DKDV], t, x->out.dq_accum, &x->out, x->S, x->scale);
    case -4:
      return run_pre(&k[K_PRE], t, x->out.dq_accum, x->S) ||
             run_dkdv_sm90(&k[K_DKDV_SM90_AT], t, x->out.dq_accum, &x->out, x->S, x->scale, m[2]);
    case K_DQ_SM90: return run_dq_sm90(&k[K_DQ_SM90], t, &x->out, x->S, x->scale, m[1]);
    case K_DKDV_KP: return run_dkdv(&k[K_DKDV_KP], t, NULLP, &x->out, x->S, x->scale);
    case K_DQ_KP: return run_dq(&k[K_DQ_KP], t, &x->out, x->S, x->scale);
    case K_DKDV_SM90_KP: return run_dkdv_sm90(&k[K_DKDV_SM90_KP], t, NULLP, &x->out, x->S, x->scale, m[3]);
    case K_DQ_SM90_KP: return run_dq_sm90(&k[K_DQ_SM90_KP], t, &x->out, x->S, x->scale, m[4]);
    case K_DKDV_SM90_KP_FULL:
      return run_dkdv_sm90(&k[K_DKDV_SM90_KP_FULL], t, NULLP, &x->out, x->S, x->scale, m[5]);
    case K_DQ_SM90_KP_FULL: return run_dq_sm90(&k[K_DQ_SM90_KP_FULL], t, &x->out, x->S, x->scale, m[6]);
    case -7: return det_pipeline(x, t, K_DKDV_KP_FULL, K_DQ_KP_FULL, NULL, NULL);
    case -8: return det_pipeline(x, t, K_DKDV_SM90_KP_FULL, K_DQ_SM90_KP_FULL, m[5], m[6]);
    case -5: return det_pipeline(x, t, K_DKDV_KP, K_DQ_KP, NULL, NULL);
    case -6: return det_pipeline(x, t, K_DKDV_SM90_KP, K_DQ_SM90_KP, m[3], m[4]);
    case -1: return det_pipeline(x, t, K_DKDV_DET, K_DQ, NULL, NULL);
    default: return det_pipeline(x, t, K_DKDV_SM90, K_DQ_SM90, m[0], m[1]);
  }
}

static int time_sm90_bwd(const kset *ks, int S) {
  const int H = ks->heads;
  const size_t nq = (size_t)S * H * DQK, nkn = (size_t)S * H * DN, nkr = (size_t)S * DR;
  const size_t nv = (size_t)S * H * DV, no = nv, nl = (size_t)H * S;
  const double set_bytes = 2.0 * (nq + nkn + nkr + nq + nv + 2 * no) + 4.0 * 2 * nl;
  const double out_bytes = 2.0 * nq + 2.0 * nkn + 4.0 * nkr + 2.0 * nv + 2.0 * nq; /* + dkp */
  const int n_sets = device_sets("bwd", H, S, set_bytes, out_bytes, 0);
  if (n_sets <= 0) return n_sets;
  const int base = g_n_allocs;
  bctx x;
  memset(&x, 0, sizeof x);
  x.ks = ks, x.S = S, x.scale = softmax_scale();
  int rc = -1;
  for (int s = 0; s < n_sets; s++)
    if (alloc_set(&x.t[s], s, H, S, SET_BWD) || sm90_bwd_maps(&ks->k[K_DKDV_SM90], &x.t[s], S, x.maps[s][0]) ||
        sm90_bwd_maps(&ks->k[K_DQ_SM90], &x.t[s], S, x.maps[s][1]) ||
        sm90_bwd_maps(&ks->k[K_DKDV_SM90_AT], &x.t[s], S, x.maps[s][2]) ||
        sm90_bwd_maps(&ks->k[K_DKDV_SM90_KP], &x.t[s], S, x.maps[s][3]) ||
        sm90_bwd_maps(&ks->k[K_DQ_SM90_KP], &x.t[s], S, x.maps[s][4]) ||
        sm90_bwd_maps(&ks->k[K_DKDV_SM90_KP_FULL], &x.t[s], S, x.maps[s][5]) ||
        sm90_bwd_maps(&ks->k[K_DQ_SM90_KP_FULL], &x.t[s], S, x.maps[s][6]))
      goto done;
  if (alloc_nan(&x.out.dq, nq * 2) || alloc_nan(&x.out.dkn, nkn * 2) || alloc_nan(&x.out.dq_accum, nq * 4) ||
      alloc_nan(&x.out.dkp, nq * 2) ||
      dalloc(&x.out.dkr, nkr * 4) || CU(drv->cuMemsetD8(x.out.dkr, 0, nkr * 4)) || alloc_nan(&x.out.dv, nv * 2))
    goto done;
  for (int s = 0; s < n_sets; s++)
    if (run_fwd(&ks->k[K_FWD], &x.t[s], x.t[s].o, x.t[s].lse, S, x.scale) ||
        run_pre(&ks->k[K_PRE], &x.t[s], NULLP, S))
      goto done;
  if (sync_stream("the forward and pre that prepare the backward's timing inputs")) goto done;
  const double pairs = (double)S * (S + 1) / 2, f_bwd = 2.0 * H * pairs * (3 * DQK + 2 * DV);
  const double f_bwd_full = 2.0 * H * (double)S * S * (3 * DQK + 2 * DV);
  const double b_q = 2.0 * nq, b_kn = 2.0 * nkn, b_kr = 2.0 * nkr, b_v = 2.0 * nv, b_o = 2.0 * no;
  const double b_l = 4.0 * nl, b_bin = b_q + b_kn + b_kr + b_v + b_o + 2 * b_l;
  const double b_bout = b_kn + 4.0 * nkr + b_v;
  const double b_pipe = (b_q + b_kn + b_kr + b_v + 2 * b_o + b_l) + b_q + b_bout;
  /* packed keys (the explicit plan's): K and dK per head, [S, H, d_qk] each */
  const double b_bin_kp = b_bin - b_kn - b_kr + b_q, b_bout_kp = b_q + b_v;
  const double b_pipe_kp = (b_q + b_q + b_v + 2 * b_o + b_l) + b_q + b_bout_kp;
  /* (the non-causal rows time the same inputs: the values the causal forward left in o and
   * lse do not change a launch's work) */
  const struct { int which; const char *label, *op; double flops, bytes; int full; } rows[] = {
      {K_DKDV_DET, "bwd_dkdv_det", "", 0, b_bin + b_bout, 0},
      {K_DKDV_SM90, "bwd_dkdv_sm90", "", 0, b_bin + b_bout, 0},
      {K_DQ, "bwd_dq", "", 0, b_bin + b_q, 0},
      {K_DQ_SM90, "bwd_dq_sm90", "", 0, b_bin + b_q, 0},
      {-1, "bwd_det", "bwd", f_bwd, b_pipe, 0},
      {-2, "bwd_det_sm90", "bwd", f_bwd, b_pipe, 0},
      {K_DKDV, "bwd_dkdv", "", f_bwd, b_bin + 4.0 * nq + b_bout, 0},
      {K_DKDV_SM90_AT, "bwd_dkdv_sm90_at", "", f_bwd, b_bin + 4.0 * nq + b_bout, 0},
      {-3, "bwd_atomic", "bwd", f_bwd, b_pipe - b_q + 4.0 * nq, 0},
      {-4, "bwd_atomic_sm90", "bwd", f_bwd, b_pipe - b_q + 4.0 * nq, 0},
      {K_DKDV_KP, "bwd_dkdv_kp", "", 0, b_bin_kp + b_bout_kp, 0},
      {K_DKDV_SM90_KP, "bwd_dkdv_sm90_kp", "", 0, b_bin_kp + b_bout_kp, 0},
      {K_DQ_KP, "bwd_dq_kp", "", 0, b_bin_kp + b_q, 0},
      {K_DQ_SM90_KP, "bwd_dq_sm90_kp", "", 0, b_bin_kp + b_q, 0},
      {-5, "bwd_det_kp", "bwd", f_bwd, b_pipe_kp, 0},
      {-6, "bwd_det_sm90_kp", "bwd", f_bwd, b_pipe_kp, 0},
      {K_DKDV_SM90_KP_FULL, "bwd_dkdv_sm90_kp", "", 0, b_bin_kp + b_bout_kp, 1},
      {K_DQ_SM90_KP_FULL, "bwd_dq_sm90_kp", "", 0, b_bin_kp + b_q, 1},
      {-7, "bwd_det_kp", "bwd", f_bwd_full, b_pipe_kp, 1},
      {-8, "bwd_det_sm90_kp", "bwd", f_bwd_full, b_pipe_kp, 1},
  };
  double ms_bwd[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int it_bwd[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    x.which = rows[i].which;
    row *r = timed_row(rows[i].label, rows[i].op, blaunch, &x, n_sets, H, S, rows[i].flops, rows[i].bytes);
    if (!r) goto done;
    r->causal = !rows[i].full;
    print_row(r);
    if (x.which < 0) ms_bwd[-x.which - 1] = r->ms, it_bwd[-x.which - 1] = r->iters;
  }
  /* forward + backward (op fwd_bwd, beside the peers' fwd_bwd rows): the forward's median
   * from time_sm90's row at (H, S) plus the pipeline's: split keys (bwd_det, bwd_det_sm90),
   * and packed (bwd_det_kp, bwd_det_sm90_kp: the explicit plan's backward), causal and not;
   * fwd+bwd_sm90_kp is the explicit plan's attention whole (attn_fwd_sm90_kp's forward),
   * fwd+bwd_det_kp takes the mma.sync split-key forward's time (its packed one, which reads
   * more of K, is not timed here) */
  const char *const fwd[6] = {"attn_fwd", "attn_fwd_sm90", "attn_fwd", "attn_fwd_sm90_kp", "attn_fwd_full",
                              "attn_fwd_sm90_kp_full"};
  const char *const fb[6] = {"fwd+bwd_det", "fwd+bwd_sm90", "fwd+bwd_det_kp", "fwd+bwd_sm90_kp",
                             "fwd+bwd_det_kp", "fwd+bwd_sm90_kp"};
  static const int pipe[6] = {0, 1, 4, 5, 6, 7}; /* ms_bwd's index */
  const double f_fwd = 2.0 * H * pairs * (DQK + DV);
  for (int k = 0; k < 6; k++)
    for (int r = 0; r < g_n_rows; r++) {
      const row *f = &g_rows[r];
      const int full = k >= 4; /* the non-causal sums */
      if (strcmp(f->kernel, fwd[k]) || f->H != H || f->S != S || f->causal == full) continue;
      row *fr = add_row(fb[k], "fwd_bwd", H, S, f->ms + ms_bwd[pipe[k]],
                        full ? 2.0 * H * (double)S * S * (DQK + DV) + f_bwd_full : f_fwd + f_bwd,
                        (b_q + (k == 3 || k == 5 ? b_q : b_kn + b_kr) + b_v + b_o) + (b_o + b_l) +
                            (k < 2 ? b_pipe : b_pipe_kp),
                        f->iters < it_bwd[pipe[k]] ? f->iters : it_bwd[pipe[k]]);
      fr->causal = !full;
      print_row(fr);
      break;
    }
  rc = 0;
done:
  free_since(base);
  return rc;
}

/* ---- the absorbed form's kernels (mqa_*) ------------------------------------------------ */
typedef struct mctx {
  const kset *ks;
  int S;
  float scale;
  mqa_tensors t[8];
  CUdeviceptr dq, dc; /* one buffer each */
  int bwd;            /* 0: mqa_fwd; 1: pre, dkv, dq */
  int sm90;           /* the sm_90a kernels (--sm90) in place of the mma.sync ones */
  mqa_maps fmaps[8];  /* per set: mqa_fwd_sm90's (--sm90) */
  mqa_bwd_maps bmaps[8][2]; /* per set: mqa_bwd_dkv_sm90's, mqa_bwd_dq_sm90's (--sm90) */
} mctx;

static int mlaunch(void *p, int set, int step) {
  const mctx *x = p;
  const mqa_tensors *t = &x->t[set];
  const gk *k = x->ks->k;
  if (!x->bwd)
    return run_any_mqa_fwd(&k[x->sm90 ? K_MQA_FWD_SM90 : K_MQA_FWD], t, t->o, t->lse, x->S,
                           x->scale, x->fmaps[set]);
  switch (step) {
    case 0: return run_mqa_pre(&k[K_MQA_PRE], t, x->S);
    case 1:
      return run_mqa_bwd(&k[x->sm90 ? K_MQA_DKV_SM90 : K_MQA_DKV], t, x->dc, x->S, x->scale,
                         x->bmaps[set][0]);
    default:
      return run_mqa_bwd(&k[x->sm90 ? K_MQA_DQ_SM90 : K_MQA_DQ], t, x->dq, x->S, x->scale,
                         x->bmaps[set][1]);
  }
}

/* Times the absorbed form's kernels at (H = ks->heads, S), B = 1, causal: mqa_fwd, and the
 * backward attn_bwd_pre (d_v = d_c) + mqa_bwd_dkv + mqa_bwd_dq timed kernel by kernel in
 * the same launches. Input sets: q, c, dout random (set 0 from the pool, the others
 * device copies of it), o and lse from mqa_fwd, delta from pre; as many sets as make
 * 200 MB (4 x the H200's L2), 2 to --sets. FLOPs (MLA.md, absorbed: d_qk = d_c + d_r,
 * d_v = d_c): forward 2 H pairs (d_qk + d_v) on mqa_fwd, backward 2 H pairs
 * (3 d_qk + 2 d_v) on the pipeline row mqa_bwd (the dkv and dq kernels each recompute P and
 * dP: their rows carry none). Bytes: every input read once, every output written once
 * (delta excluded from the pipeline's). Under --sm90 the same rows again for the sm_90a
 * kernels in the same run, on the same input sets (their tensor maps from the runtime, by
 * value): mqa_fwd_sm90, mqa_bwd_dkv_sm90, mqa_bwd_dq_sm90, mqa_bwd_sm90 (pre +
 * mqa_bwd_dkv_sm90 + mqa_bwd_dq_sm90) and mqa_fwd+bwd_sm90 (pre is the same kernel: no
 * second row). Returns -1 on a CUDA error. */
static int time_mqa(const kset *ks, int S) {
  const int H = ks->heads;
  const size_t nq = (size_t)S * H * MQK, nc = (size_t)S * MQK, no = (size_t)S * H * MV;
  const size_t nl = (size_t)H * S;
  const double set_bytes = 2.0 * (nq + nc + 2 * no) + 4.0 * 2 * nl, out_bytes = 2.0 * (nq + nc);
  const int n_sets = device_sets("mqa", H, S, set_bytes, out_bytes, 200e6);
  if (n_sets <= 0) return n_sets;
  const int base = g_n_allocs;
  double t0 = wall_s();
  mctx x;
  memset(&x, 0, sizeof x);
  x.ks = ks, x.S = S, x.scale = softmax_scale();
  int rc = -1;
  for (int s = 0; s < n_sets; s++) {
    mqa_tensors *t = &x.t[s];
    if (dalloc(&t->q, nq * 2) || dalloc(&t->c, nc * 2) || dalloc(&t->dout, no * 2) ||
        alloc_nan(&t->o, no * 2) || alloc_nan(&t->lse, nl * 4) || alloc_nan(&t->delta, nl * 4))
      goto done;
    if (s == 0) {
      if (fill_random(t->q, nq, 101) || fill_random(t->c, nc, 102) || fill_random(t->dout, no, 103))
        goto done;
    } else if (CU(drv->cuMemcpyDtoDAsync(t->q, x.t[0].q, nq * 2, g_stream)) ||
               CU(drv->cuMemcpyDtoDAsync(t->c, x.t[0].c, nc * 2, g_stream)) ||
               CU(drv->cuMemcpyDtoDAsync(t->dout, x.t[0].dout, no * 2, g_stream))) {
      goto done;
    }
    if (g_sm90 && (sm90_mqa_maps(&ks->k[K_MQA_FWD_SM90], t, S, x.fmaps[s]) ||
                   sm90_mqa_bwd_maps(&ks->k[K_MQA_DKV_SM90], t, S, x.bmaps[s][0]) ||
                   sm90_mqa_bwd_maps(&ks->k[K_MQA_DQ_SM90], t, S, x.bmaps[s][1])))
      goto done;
  }
  if (alloc_nan(&x.dq, nq * 2) || alloc_nan(&x.dc, nc * 2)) goto done;
  for (int s = 0; s < n_sets; s++)
    if (run_mqa_fwd(&ks->k[K_MQA_FWD], &x.t[s], x.t[s].o, x.t[s].lse, S, x.scale) ||
        run_mqa_pre(&ks->k[K_MQA_PRE], &x.t[s], S))
      goto done;
  if (sync_stream("the mqa forward and pre that prepare the timing inputs")) goto done;
  say("mqa H=%d S=%d: %d input sets of %.0f MB, outputs %.0f MB (%.1f s to fill)\n", H, S, n_sets,
      set_bytes / 1e6, out_bytes / 1e6, wall_s() - t0);

  const double pairs = (double)S * (S + 1) / 2;
  const double f_fwd = 2.0 * H * pairs * (MQK + MV), f_bwd = 2.0 * H * pairs * (3 * MQK + 2 * MV);
  const double b_q = 2.0 * nq, b_c = 2.0 * nc, b_o = 2.0 * no, b_l = 4.0 * nl;
  const double b_bin = b_q + b_c + b_o /* dout */ + 2 * b_l /* lse, delta */;
  for (int sm90 = 0; sm90 < 1 + g_sm90; sm90++) { /* mma.sync, then (--sm90) sm_90a */
    double ms_f[2], ms_b[4]; /* per step, then the whole sequence (time_steps) */
    int it_f, it_b;
    const char *const sfx = sm90 ? "_sm90" : "";
    char lf[32], lb[32];
    snprintf(lf, sizeof lf, "mqa_fwd%s", sfx), snprintf(lb, sizeof lb, "mqa_bwd%s", sfx);
    x.sm90 = sm90, x.bwd = 0;
    if (time_steps(lf, mlaunch, &x, 1, n_sets, ms_f, &it_f)) goto done;
    x.bwd = 1;
    if (time_steps(lb, mlaunch, &x, 3, n_sets, ms_b, &it_b)) goto done;
    const struct { const char *label, *op; double ms, flops, bytes; int iters; } rows[] = {
        {"mqa_fwd", "fwd", ms_f[0], f_fwd, b_q + b_c + b_o + b_l, it_f},
        {"mqa_bwd_pre", "", ms_b[0], 0, 2 * b_o + b_l, it_b},
        {"mqa_bwd_dkv", "", ms_b[1], 0, b_bin + b_c, it_b},
        {"mqa_bwd_dq", "", ms_b[2], 0, b_bin + b_q, it_b},
        {"mqa_bwd", "bwd", ms_b[3], f_bwd, b_q + b_c + 2 * b_o + b_l + b_q + b_c, it_b},
        {"mqa_fwd+bwd", "fwd_bwd", ms_f[0] + ms_b[3], f_fwd + f_bwd,
         b_q + b_c + b_o /* dout */ + b_o + b_l /* o, lse out */ + b_q + b_c, it_f < it_b ? it_f : it_b},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
      if (sm90 && i == 1) continue; /* pre: the mma.sync pipeline's row */
      char label[48];
      snprintf(label, sizeof label, "%s%s", rows[i].label, sfx);
      row *r = add_row(label, rows[i].op, H, S, rows[i].ms, rows[i].flops, rows[i].bytes,
                       rows[i].iters);
      r->dqk = MQK, r->dv = MV;
      print_row(r);
    }
  }
  rc = 0;
done:
  free_since(base);
  return rc;
}

/* ---- the layout and element-wise kernels: memory-bound, timed in GB/s ------------------ */
/* One row: a kernel, its device buffers (inputs first), its int arguments, the bytes it
 * must move (every input element read once, every output element written once). */
#define L_BUFS 4
#define L_MAX_SETS 16
typedef struct lrow {
  const char *label;
  int which;
  int n_bufs;
  double buf_bytes[L_BUFS];
  int n[6];      /* the int arguments, in the kernel's order */
  int sq;        /* the launch rule's seqlen_q (batch is 1) */
  double bytes;  /* moved */
  int h_indep;   /* the same work for every H: timed with the first H only */
} lrow;

typedef struct lctx {
  const gk *g;
  const lrow *r;
  CUdeviceptr buf[L_MAX_SETS][L_BUFS];
} lctx;

static int llaunch(void *p, int set) {
  const lctx *x = p;
  CUdeviceptr b[L_BUFS];
  int n[6];
  memcpy(b, x->buf[set], sizeof b);
  memcpy(n, x->r->n, sizeof n);
  const int sq = x->r->sq;
  switch (x->r->which) {
    case K_A2A_PACK:
    case K_A2A_UNPACK: {
      void *a[] = {&b[0], &b[1], &n[0], &n[1], &n[2], &n[3], &n[4], &n[5]};
      return launch(x->g, 1, sq, sq, a);
    }
    case K_DQ_CONVERT: {
      void *a[] = {&b[0], &b[1], &n[0]};
      return launch(x->g, 1, sq, sq, a);
    }
    case K_EXPAND_KV: {
      void *a[] = {&b[0], &b[1], &b[2], &b[3], &n[0], &n[1], &n[2]};
      return launch(x->g, 1, sq, sq, a);
    }
    case K_SPLIT_DKV: { /* n[3]: accumulate (0, as the explicit and LAGA plans) */
      void *a[] = {&b[0], &b[1], &b[2], &b[3], &n[0], &n[1], &n[2], &n[3]};
      return launch(x->g, 1, sq, sq, a);
    }
    case K_CONCAT_LATENT: /* c_kv, k_rope -> c */
    case K_SPLIT_LATENT: { /* dc -> dc_kv, dk_rope */
      void *a[] = {&b[0], &b[1], &b[2], &n[0]};
      return launch(x->g, 1, sq, sq, a);
    }
    default: { /* K_COPY_COLS */
      void *a[] = {&b[0], &b[1], &n[0], &n[1], &n[2], &n[3], &n[4], &n[5]};
      return launch(x->g, 1, sq, sq, a);
    }
  }
}

/* The rows at (H, S), B = 1, into rows[]; returns how many. The shapes are those of the
 * plans (generator/core/forms/) for DeepSeek-V3 (H_MODEL = 128 heads, d_c 512) under Ulysses
 * SP of degree P = 128 / H (H = 16: one rank of P = 8; H = 128: P = 1), H being the heads
 * a rank's kernels see and S the global sequence length:
 *   a2a_pack_q / a2a_unpack_q  direction 0 (SEQ_TO_HEAD) of q, w = d_qk: [S/P, 128, w] ->
 *                              [P][S/P, H, w] and back to [S, H, w]
 *   a2a_pack_o / a2a_unpack_o  direction 1 (HEAD_TO_SEQ) of o, w = d_v
 *   dq_convert                 dq_accum fp32 [S, H, d_qk] -> dq bf16
 *   expand_kv                  LAGA's rebuild: kv [S, H, d_n + d_v] and the rope columns
 *                              of c [S, d_c + d_r] -> k [S, H, d_qk], v [S, H, d_v]
 *   split_dkv                  its backward: dk, dv -> dkv, dc[:, d_c:] = sum_h dk_r
 *   concat_latent              [c_kv ; k_rope] -> c [S, d_c + d_r] (independent of H)
 *   split_latent               dc -> [dc_kv ; dk_rope] (independent of H)
 *   copy_cols                  the absorbed form's q_abs[:, h, d_c:] = q[:, h, d_n:]:
 *                              S * H rows of d_r columns
 * Rows over S tokens (rows = B * S) launch with seqlen_q = S, batch = 1 (the manifest's
 * grid: S CTAs, grid-stride over the rows). */
static int layout_rows(int H, int S, lrow *rows) {
  const int P = H_MODEL % H == 0 ? H_MODEL / H : 1, HT = H * P, Sl = S / P;
  const double e = 2.0; /* bf16 */
  int n = 0;
  if (S % P == 0) {
    const int w[2] = {DQK, DV};
    const char *lab[2][2] = {{"a2a_pack_q", "a2a_unpack_q"}, {"a2a_pack_o", "a2a_unpack_o"}};
    for (int dir = 0; dir < 2; dir++)
      for (int u = 0; u < 2; u++) {
        const double b = e * S * H * w[dir];
        rows[n++] = (lrow){lab[dir][u], u ? K_A2A_UNPACK : K_A2A_PACK, 2, {b, b}, {Sl, 1, HT, P, w[dir], dir},
                           Sl, 2 * b, 0};
      }
  }
  rows[n++] = (lrow){"dq_convert", K_DQ_CONVERT, 2, {4.0 * S * H * DQK, e * S * H * DQK}, {S},
                     S, (4.0 + e) * S * H * DQK, 0};
  {
    const double kv = e * S * H * (DN + DV), c = e * S * (DC + DR), k = e * S * H * DQK;
    const double v = e * S * H * DV;
    rows[n++] = (lrow){"expand_kv", K_EXPAND_KV, 4, {kv, c, k, v}, {S, DC, DC + DR}, S,
                       kv + e * S * DR + k + v, 0};
    rows[n++] = (lrow){"split_dkv", K_SPLIT_DKV, 4, {k, v, kv, c}, {S, DC, DC + DR}, S,
                       k + v + kv + e * S * DR, 0};
    const double ckv = e * S * DC, kr = e * S * DR;
    rows[n++] = (lrow){"concat_latent", K_CONCAT_LATENT, 3, {ckv, kr, c}, {S}, S, 2 * c, 1};
    rows[n++] = (lrow){"split_latent", K_SPLIT_LATENT, 3, {c, ckv, kr}, {S}, S, 2 * c, 1};
  }
  rows[n++] = (lrow){"copy_cols", K_COPY_COLS, 2, {e * S * H * DQK, e * S * H * (DC + DR)},
                     {S * H, DQK, DN, DC + DR, DC, DR}, S, 2 * e * S * H * DR, 0};
  return n;
}

/* Times the layout rows at (H = ks->heads, S); first: the first timed H (the rows that do
 * not depend on H run there only). Each row gets its own buffers in as many sets (inputs
 * and outputs together) as make ~150 MB, 2 to 16 (iteration i uses set i mod sets, so
 * neither its reads nor its writes hit lines the previous launch left in L2); buffers are
 * zeroed, not random (copies: the values do not change the time). Returns -1 on a CUDA
 * error. */
static int time_layout(const kset *ks, int S, int first) {
  const int H = ks->heads;
  lrow rows[16];
  const int n_rows = layout_rows(H, S, rows);
  size_t free_b = 0, total_b = 0;
  if (CU(drv->cuMemGetInfo(&free_b, &total_b))) return -1;
  for (int i = 0; i < n_rows; i++) {
    const lrow *r = &rows[i];
    if (r->h_indep && !first) continue;
    const gk *g = &ks->k[r->which];
    double set_bytes = 0;
    for (int b = 0; b < r->n_bufs; b++) set_bytes += r->buf_bytes[b];
    const int n_sets = sets_that_fit(r->label, H, S, set_bytes, 0, 150e6, L_MAX_SETS, free_b);
    if (!n_sets) continue;
    const int base = g_n_allocs;
    lctx x;
    memset(&x, 0, sizeof x);
    x.g = g, x.r = r;
    int rc = 0;
    for (int s = 0; s < n_sets && !rc; s++)
      for (int b = 0; b < r->n_bufs && !rc; b++)
        rc = dalloc(&x.buf[s][b], (size_t)r->buf_bytes[b]) ||
             CU(drv->cuMemsetD8(x.buf[s][b], 0, (size_t)r->buf_bytes[b]));
    double ms = 0;
    int iters = 0;
    if (!rc) rc = time_row(r->label, llaunch, &x, n_sets, &ms, &iters);
    free_since(base);
    if (rc) return -1;
    print_row(add_row(r->label, "", H, S, ms, 0, r->bytes, iters));
  }
  return 0;
}

static int write_csv(const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) {
    say("bench: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  fprintf(f, "tool,kernel,op,H,S,d_qk,d_v,causal,ms,tflops,bytes,gbps,iters\n");
  for (int i = 0; i < g_n_rows; i++) {
    const row *r = &g_rows[i];
    fprintf(f, "mlagen,%s,%s,%d,%d,%d,%d,%d,%.4f,", r->kernel, r->op, r->H, r->S, r->dqk, r->dv,
            r->causal, r->ms);
    if (r->flops > 0) fprintf(f, "%.2f", r->flops / (r->ms * 1e-3) / 1e12);
    fprintf(f, ",%.0f,%.1f,%d\n", r->bytes, r->bytes / (r->ms * 1e-3) / 1e9, r->iters);
  }
  return fclose(f) == 0 ? 0 : -1;
}

/* The summary: every row again under a header (after the progress lines), then
 * <outdir>/bench.csv (its path left in path[n]). 0, or -1 when the CSV cannot be written. */
static int finish_table(const char *outdir, char *path, size_t n) {
  say("\n");
  print_header();
  for (int i = 0; i < g_n_rows; i++) print_row(&g_rows[i]);
  snprintf(path, n, "%s/bench.csv", outdir);
  if (write_csv(path)) return -1;
  say("wrote %s\n", path);
  return 0;
}

/* ---- --varlen: packed sequences (issue 16) ---------------------------------------------- */
/* One configuration of the --varlen timings: the fixed-length kernels over B documents of S
 * tokens each ([B, S, ..] buffers, unpacked launches of batch B), or the varlen ones over one
 * packed stream of S = cap token rows (batch 1; cu_seqlens on the device as the CUDA executor
 * uploads it: the boundaries of the documents with tokens, padded with T to cap + 1 entries,
 * n_seqs = cap). The same buffers serve both: a packed [T, ..] stream of equal documents is
 * the memory of a [B, S, ..] batch. The explicit deterministic pipeline (attn_fwd; pre +
 * attn_bwd_dkdv deterministic + attn_bwd_dq) and the absorbed one (mqa_fwd; pre + mqa_bwd_dkv
 * + mqa_bwd_dq), causal. */
typedef struct vctx {
  const kset *ks;
  int varlen, B, S;
  float scale;
  dev_tensors t;   /* explicit: q, kn, kr, v, dout, o, lse, delta */
  dev_outputs out; /* explicit: dq, dkn, dkr, dv */
  mqa_tensors m;   /* absorbed: q, c, dout, o, lse, delta */
  CUdeviceptr mdq, mdc, cu;
  int n_seqs;
  int mqa, bwd, sm90; /* what vstep launches (sm90: attn_fwd_sm90, its maps in maps) */
  fwd_maps maps;
} vctx;

/* Step j of x's pipeline (the forward: one step; the backward: pre, dkdv or dkv, dq). The
 * varlen kernels take two more arguments (cu_seqlens, n_seqs); the fixed ones ignore them
 * (cuLaunchKernel reads only a kernel's own parameters). */
static int vstep(void *p, int set, int j) {
  (void)set;
  vctx *x = p;
  const gk *k = x->ks->k;
  const int vl = x->varlen;
  int S = x->S, z = 0, ldr = DR; /* contiguous k_rope (ld_k_rope = d_r) */
  float sc = x->scale;
  CUdeviceptr none = NULLP;
  void *const cu[2] = {&x->cu, &x->n_seqs};
  if (x->sm90) {
    dev_tensors *t = &x->t;
    void *a[] = {&t->q, &t->kn, &t->kr, &ldr, &t->v, &t->o, &t->lse, &S, &S, &z, &z, &z, &sc,
                 (void *)x->maps, cu[0], cu[1]};
    return launch(&k[vl ? K_FWD_SM90_VL : K_FWD_SM90], x->B, S, S, a);
  }
  if (!x->mqa) {
    dev_tensors *t = &x->t;
    dev_outputs *o = &x->out;
    if (!x->bwd) {
      void *a[] = {&t->q, &t->kn, &t->kr, &ldr, &t->v, &t->o, &t->lse, &S, &S, &z, &z, &z, &sc, cu[0], cu[1]};
      return launch(&k[vl ? K_FWD_VL : K_FWD], x->B, S, S, a);
    }
    if (j == 0) {
      void *a[] = {&t->o, &t->dout, &t->delta, &none, &S, cu[0], cu[1]};
      return launch(&k[vl ? K_PRE_VL : K_PRE], x->B, S, S, a);
    }
    if (j == 1) {
      void *a[] = {&t->q, &t->kn, &t->kr, &ldr, &t->v, &t->dout, &t->lse, &t->delta, &none, &o->dkn,
                   &o->dkr, &o->dv, &S, &S, &z, &z, &z, &sc, cu[0], cu[1]};
      return launch(&k[vl ? K_DKDV_VL : K_DKDV_DET], x->B, S, S, a);
    }
    void *a[] = {&t->q, &t->kn, &t->kr, &ldr, &t->v, &t->dout, &t->lse, &t->delta, &o->dq, &S, &S,
                 &z, &z, &z, &sc, cu[0], cu[1]};
    return launch(&k[vl ? K_DQ_VL : K_DQ], x->B, S, S, a);
  }
  mqa_tensors *m = &x->m;
  if (!x->bwd) {
    void *a[] = {&m->q, &m->c, &m->o, &m->lse, &S, &S, &z, &sc, cu[0], cu[1]};
    return launch(&k[vl ? K_MQA_FWD_VL : K_MQA_FWD], x->B, S, S, a);
  }
  if (j == 0) {
    void *a[] = {&m->o, &m->dout, &m->delta, &none, &S, cu[0], cu[1]};
    return launch(&k[vl ? K_MQA_PRE_VL : K_MQA_PRE], x->B, S, S, a);
  }
  void *a[] = {&m->q, &m->c, &m->dout, &m->lse, &m->delta, j == 1 ? &x->mdc : &x->mdq, &S, &S,
               &z, &sc, cu[0], cu[1]};
  return launch(&k[j == 1 ? (vl ? K_MQA_DKV_VL : K_MQA_DKV) : (vl ? K_MQA_DQ_VL : K_MQA_DQ)],
                x->B, S, S, a);
}

/* Device buffers for `tokens` token rows at H heads (both forms unless --no-mqa; inputs
 * random, outputs NaN) and a cu_seqlens of cap_cu int32. 0, 1 when they do not fit (said),
 * -1 on a CUDA error. */
static int valloc(vctx *x, int H, long tokens, int cap_cu) {
  const size_t T = (size_t)tokens;
  const double per_tok = 2.0 * (2 * H * DQK + 2 * H * DN + 3 * DR + 4 * H * DV) + 8.0 * H +
                         (g_no_mqa ? 0 : 2.0 * (2 * H * MQK + 2 * MQK + 2 * H * MV) + 8.0 * H);
  const int fits = device_sets("varlen", H, (int)tokens, per_tok * (double)tokens, 0, 0);
  if (fits <= 0) return fits < 0 ? -1 : 1;
  dev_tensors *t = &x->t;
  dev_outputs *o = &x->out;
  if (dalloc(&t->q, T * H * DQK * 2) || fill_random(t->q, T * H * DQK, 1) ||
      dalloc(&t->kn, T * H * DN * 2) || fill_random(t->kn, T * H * DN, 2) ||
      dalloc(&t->kr, T * DR * 2) || fill_random(t->kr, T * DR, 3) ||
      dalloc(&t->v, T * H * DV * 2) || fill_random(t->v, T * H * DV, 4) ||
      dalloc(&t->dout, T * H * DV * 2) || fill_random(t->dout, T * H * DV, 5) ||
      alloc_nan(&t->o, T * H * DV * 2) || alloc_nan(&t->lse, T * H * 4) ||
      alloc_nan(&t->delta, T * H * 4) || alloc_nan(&o->dq, T * H * DQK * 2) ||
      alloc_nan(&o->dkn, T * H * DN * 2) || alloc_nan(&o->dkr, T * DR * 4) ||
      alloc_nan(&o->dv, T * H * DV * 2) || dalloc(&x->cu, (size_t)cap_cu * 4))
    return -1;
  if (g_no_mqa) return 0;
  mqa_tensors *m = &x->m;
  if (dalloc(&m->q, T * H * MQK * 2) || fill_random(m->q, T * H * MQK, 6) ||
      dalloc(&m->c, T * MQK * 2) || fill_random(m->c, T * MQK, 7) ||
      dalloc(&m->dout, T * H * MV * 2) || fill_random(m->dout, T * H * MV, 8) ||
      alloc_nan(&m->o, T * H * MV * 2) || alloc_nan(&m->lse, T * H * 4) ||
      alloc_nan(&m->delta, T * H * 4) || alloc_nan(&x->mdq, T * H * MQK * 2) ||
      alloc_nan(&x->mdc, T * MQK * 2))
    return -1;
  return 0;
}

/* Uploads the executor's device copy of documents len[0..n) (mg_varlen_compact's: the
 * boundaries of the non-empty ones, T repeated up to cap + 1 entries) into x->cu. */
static int vupload_cu(vctx *x, const int *len, int n, int cap) {
  int32_t *b = xcalloc((size_t)cap + 1, sizeof *b);
  int k = 1;
  for (int i = 0; i < n; i++)
    if (len[i] > 0) b[k] = b[k - 1] + len[i], k++;
  for (; k <= cap; k++) b[k] = b[k - 1];
  const int rc = CU(drv->cuMemcpyHtoD(x->cu, b, ((size_t)cap + 1) * 4));
  free(b);
  x->n_seqs = cap;
  return rc ? -1 : 0;
}

/* A configuration's outputs on the host, for --varlen's check (vcheck). */
typedef struct vsnap {
  e16 *o, *dq, *mo, *mdq;
  float *lse, *mlse;
  e16 *dkn, *dv, *mdc; /* keys: equal lengths only (NULL otherwise) */
  float *dkr;
} vsnap;

/* Times x's pipelines (explicit forward, backward; absorbed forward, backward; on an sm_90a
 * device first attn_fwd_sm90, its tensor maps encoded for x's B and S) and appends their
 * rows "<what>_<label>" (kernel column), op vl_fwd / vl_bwd, at (H, S): FLOPs for `pairs`
 * (query, key) pairs (per document), bytes for `tokens` rows. ms[5] gets the medians (fwd,
 * bwd, mqa_fwd, mqa_bwd, fwd_sm90; 0 for what is left out). With s90 (not NULL), attn_fwd_sm90's
 * O and LSE of `rows` token rows are downloaded into s90->o, s90->lse (the later rows
 * overwrite them). */
static int vtime(vctx *x, int H, int S, const char *label, double pairs, double tokens,
                 double ms[5], vsnap *s90, size_t rows) {
  const double Tk = tokens;
  const double b_q = 2.0 * Tk * H * DQK, b_kn = 2.0 * Tk * H * DN, b_kr = 2.0 * Tk * DR;
  const double b_v = 2.0 * Tk * H * DV, b_o = b_v, b_l = 4.0 * Tk * H;
  const double mq = 2.0 * Tk * H * MQK, mc = 2.0 * Tk * MQK, mo = 2.0 * Tk * H * MV;
  const struct { int mqa, bwd, sm90, at; const char *what, *op; double flops, bytes; } rows_[] = {
      {0, 0, 1, 4, "fwd_sm90", "vl_fwd", 2.0 * H * pairs * (DQK + DV), b_q + b_kn + b_kr + b_v + b_o + b_l},
      {0, 0, 0, 0, "fwd", "vl_fwd", 2.0 * H * pairs * (DQK + DV), b_q + b_kn + b_kr + b_v + b_o + b_l},
      {0, 1, 0, 1, "bwd", "vl_bwd", 2.0 * H * pairs * (3 * DQK + 2 * DV),
       b_q + b_kn + b_kr + b_v + 2 * b_o + b_l + b_q + b_kn + 2 * b_kr + b_v},
      {1, 0, 0, 2, "mqa_fwd", "vl_fwd", 2.0 * H * pairs * (MQK + MV), mq + mc + mo + b_l},
      {1, 1, 0, 3, "mqa_bwd", "vl_bwd", 2.0 * H * pairs * (3 * MQK + 2 * MV), mq + mc + 2 * mo + b_l + mq + mc},
  };
  for (int i = 0; i < 5; i++) ms[i] = 0;
  for (int i = 0; i < 5; i++) {
    if ((rows_[i].mqa && g_no_mqa) || (rows_[i].sm90 && !g_vl_sm90)) continue;
    x->mqa = rows_[i].mqa, x->bwd = rows_[i].bwd, x->sm90 = rows_[i].sm90;
    if (x->sm90) {
      const gk *g = &x->ks->k[x->varlen ? K_FWD_SM90_VL : K_FWD_SM90];
      const mg_kernel_spec spec = make_spec(g->which, g->heads);
      const mg_sm90_fwd_tensors tt = {x->t.q, x->t.kn, x->t.kr, x->t.v, x->B, x->S, x->S, DR};
      mg_diag d = MG_DIAG_INIT;
      if (mg_sm90_fwd_tmaps(drv, &spec, &g->k.info, &tt, x->maps, &d)) {
        say("bench: %s: %s\n", g->name, mg_diag_msg(&d));
        mg_diag_clear(&d);
        return -1;
      }
    }
    char name[48];
    snprintf(name, sizeof name, "%s_%s", rows_[i].what, label);
    double m[4];
    int iters;
    const int rc = time_steps(name, vstep, x, rows_[i].bwd ? 3 : 1, 1, m, &iters);
    x->sm90 = 0;
    if (rc) return -1;
    const int at = rows_[i].at;
    ms[at] = m[rows_[i].bwd ? 3 : 0];
    row *r = add_row(name, rows_[i].op, H, S, ms[at], rows_[i].flops, rows_[i].bytes, iters);
    if (rows_[i].mqa) r->dqk = MQK, r->dv = MV;
    print_row(r);
    if (rows_[i].sm90 && s90) {
      s90->o = xcalloc(rows * H * DV, 2), s90->lse = xcalloc(rows * H, 4);
      if (sync_stream("attn_fwd_sm90") || download(s90->o, x->t.o, rows * H * DV * 2) ||
          download(s90->lse, x->t.lse, rows * H * 4))
        return -1;
    }
  }
  return 0;
}

static void vratio(const char *what, const double a[5], const double b[5]) {
  say("  %s: fwd %.3f bwd %.3f mqa_fwd %.3f mqa_bwd %.3f", what, b[0] > 0 ? a[0] / b[0] : 0,
      b[1] > 0 ? a[1] / b[1] : 0, b[2] > 0 ? a[2] / b[2] : 0, b[3] > 0 ? a[3] / b[3] : 0);
  if (g_vl_sm90) say(" fwd_sm90 %.3f", b[4] > 0 ? a[4] / b[4] : 0);
  say("\n");
}

/* --varlen's check (unless --no-check; at H <= 16, where the downloads stay small): the
 * varlen kernels' outputs on the packed documents against the fixed-length kernels' on the
 * same documents as a batch (equal lengths) or padded to the longest (the mixed stream):
 * O, LSE and dq of every valid row (a padded batch's valid queries see the same keys),
 * explicit and absorbed (and on an sm_90a device attn_fwd_sm90's O and LSE), and at equal lengths (no padding queries to give the keys
 * gradients) the key gradients too: dk_nope, dk_rope (fp32), dv, and the absorbed dc (d_c +
 * d_r columns); per element: |packed - batch| <= 2e-2 rms(batch) + 1e-2 |batch| (bf16
 * outputs of the same arithmetic), LSE 1e-3 (1 + |batch|); a NaN fails. */

static void vsnap_free(vsnap *s) {
  free(s->o), free(s->dq), free(s->mo), free(s->mdq), free(s->lse), free(s->mlse);
  free(s->dkn), free(s->dv), free(s->mdc), free(s->dkr);
  memset(s, 0, sizeof *s);
}

/* The outputs of `rows` token rows (batch x S, or the packed capacity) to the host; with
 * keys, the key gradients too. */
static int vsnap_take(const vctx *x, int H, size_t rows, int keys, vsnap *s) {
  memset(s, 0, sizeof *s);
  s->o = xcalloc(rows * H * DV, 2), s->dq = xcalloc(rows * H * DQK, 2);
  s->lse = xcalloc(rows * H, 4);
  if (sync_stream("the varlen timings") || download(s->o, x->t.o, rows * H * DV * 2) ||
      download(s->dq, x->out.dq, rows * H * DQK * 2) || download(s->lse, x->t.lse, rows * H * 4))
    return -1;
  if (keys) {
    s->dkn = xcalloc(rows * H * DN, 2), s->dv = xcalloc(rows * H * DV, 2), s->dkr = xcalloc(rows * DR, 4);
    if (download(s->dkn, x->out.dkn, rows * H * DN * 2) || download(s->dv, x->out.dv, rows * H * DV * 2) ||
        download(s->dkr, x->out.dkr, rows * DR * 4))
      return -1;
  }
  if (g_no_mqa) return 0;
  s->mo = xcalloc(rows * H * MV, 2), s->mdq = xcalloc(rows * H * MQK, 2);
  s->mlse = xcalloc(rows * H, 4);
  if (keys) {
    s->mdc = xcalloc(rows * MQK, 2);
    if (download(s->mdc, x->mdc, rows * MQK * 2)) return -1;
  }
  return download(s->mo, x->m.o, rows * H * MV * 2) || download(s->mdq, x->mdq, rows * H * MQK * 2) ||
         download(s->mlse, x->m.lse, rows * H * 4);
}

/* Element i of a bf16 (f32 0) or fp32 (f32 1) array. */
static double vget(const void *p, int f32, size_t i) {
  return f32 ? ((const float *)p)[i] : bf16_to_float(((const e16 *)p)[i]);
}

/* Row widths w (elements, bf16 or with f32 fp32) of documents len[0..n): batch row (d, i)
 * at d * spad + i, packed row cu[d] + i. Returns 1 (said) when an element is off. */
static int vcmp_rows_t(const char *what, const void *batch, const void *packed, int f32, size_t w,
                       const int *len, int n, int spad) {
  double ss = 0;
  size_t cnt = 0;
  for (int d = 0; d < n; d++)
    for (int i = 0; i < len[d]; i++)
      for (size_t k = 0; k < w; k++) {
        const double v = vget(batch, f32, ((size_t)d * spad + i) * w + k);
        if (isfinite(v)) ss += v * v, cnt++;
      }
  const double rms = cnt && ss > 0 ? sqrt(ss / (double)cnt) : 1.0;
  double worst = 0;
  long bad = 0, at = -1;
  for (int d = 0, t0 = 0; d < n; t0 += len[d], d++)
    for (int i = 0; i < len[d]; i++)
      for (size_t k = 0; k < w; k++) {
        const double b = vget(batch, f32, ((size_t)d * spad + i) * w + k);
        const double p = vget(packed, f32, ((size_t)t0 + i) * w + k);
        const double err = fabs(p - b), tol = 2e-2 * rms + 1e-2 * fabs(b);
        if (!(err <= tol)) {
          if (!bad) at = t0 + i;
          bad++;
        }
        if (!(err <= worst)) worst = isfinite(err) ? err : INFINITY;
      }
  say("    %-24s %s (max |err| %.3g, rms %.3g)", what, bad ? "FAIL" : "ok  ", worst, rms);
  if (bad) say(": %ld elements off, the first at packed token %ld", bad, at);
  say("\n");
  return bad != 0;
}
static int vcmp_rows(const char *what, const e16 *batch, const e16 *packed, size_t w,
                     const int *len, int n, int spad) {
  return vcmp_rows_t(what, batch, packed, 0, w, len, n, spad);
}

/* LSE: batch [n, H, spad], packed [H, cap]. */
static int vcmp_lse(const char *what, const float *batch, const float *packed, int H,
                    const int *len, int n, int spad, int cap) {
  long bad = 0;
  double worst = 0;
  for (int d = 0, t0 = 0; d < n; t0 += len[d], d++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < len[d]; i++) {
        const double b = batch[((size_t)d * H + h) * spad + i], p = packed[(size_t)h * cap + t0 + i];
        const double err = fabs(p - b);
        if (!(err <= 1e-3 * (1 + fabs(b)))) bad++;
        if (!(err <= worst)) worst = isfinite(err) ? err : INFINITY;
      }
  say("    %-24s %s (max |err| %.3g)%s\n", what, bad ? "FAIL" : "ok  ", worst, bad ? "" : "");
  return bad != 0;
}

/* The check of one configuration: a batch snapshot (n documents padded to spad) against the
 * packed one (capacity cap), and on an sm_90a device attn_fwd_sm90's (b90, p90: O and LSE
 * only). Returns the misses. */
static int vcheck(const char *what, int H, const vsnap *b, const vsnap *p, const vsnap *b90,
                  const vsnap *p90, const int *len, int n, int spad, int cap) {
  say("  check %s (H=%d, %d documents): varlen (packed) against fixed-length (batch)\n", what, H, n);
  int miss90 = 0;
  if (b90->o && p90->o)
    miss90 = vcmp_rows("O (sm_90a)", b90->o, p90->o, (size_t)H * DV, len, n, spad) +
             vcmp_lse("LSE (sm_90a)", b90->lse, p90->lse, H, len, n, spad, cap);
  int miss = vcmp_rows("O", b->o, p->o, (size_t)H * DV, len, n, spad) +
             vcmp_lse("LSE", b->lse, p->lse, H, len, n, spad, cap) +
             vcmp_rows("dq", b->dq, p->dq, (size_t)H * DQK, len, n, spad);
  if (b->dkn && p->dkn)
    miss += vcmp_rows("dk_nope", b->dkn, p->dkn, (size_t)H * DN, len, n, spad) +
            vcmp_rows_t("dk_rope (fp32)", b->dkr, p->dkr, 1, DR, len, n, spad) +
            vcmp_rows("dv", b->dv, p->dv, (size_t)H * DV, len, n, spad);
  if (!g_no_mqa)
    miss += vcmp_rows("O (latent)", b->mo, p->mo, (size_t)H * MV, len, n, spad) +
            vcmp_lse("LSE (absorbed)", b->mlse, p->mlse, H, len, n, spad, cap) +
            vcmp_rows("dq (absorbed)", b->mdq, p->mdq, (size_t)H * MQK, len, n, spad);
  if (!g_no_mqa && b->mdc && p->mdc)
    miss += vcmp_rows("dc (absorbed)", b->mdc, p->mdc, MQK, len, n, spad);
  return miss + miss90;
}

/* Moves documents len[0..n) of every input from the padded layout (row d * spad + i) to the
 * packed one (row cu[d] + i), through a scratch of spad rows, so that the packed run sees
 * the padded run's documents. */
static int vpack_inputs(vctx *x, int H, const int *len, int n, int spad) {
  const struct { CUdeviceptr p; size_t w; } in[] = {
      {x->t.q, (size_t)H * DQK}, {x->t.kn, (size_t)H * DN}, {x->t.kr, DR},
      {x->t.v, (size_t)H * DV},  {x->t.dout, (size_t)H * DV}, {x->m.q, (size_t)H * MQK},
      {x->m.c, MQK},             {x->m.dout, (size_t)H * MV}};
  const int n_in = g_no_mqa ? 5 : 8;
  CUdeviceptr scratch;
  if (dalloc(&scratch, (size_t)spad * H * MQK * 2)) return -1;
  for (int k = 0; k < n_in; k++) {
    const size_t rb = in[k].w * 2;
    for (int d = 0, t0 = 0; d < n; t0 += len[d], d++) {
      const CUdeviceptr src = in[k].p + (size_t)d * spad * rb, dst = in[k].p + (size_t)t0 * rb;
      if (src == dst || !len[d]) continue;
      if (CU(drv->cuMemcpyDtoDAsync(scratch, src, (size_t)len[d] * rb, g_stream)) ||
          CU(drv->cuMemcpyDtoDAsync(dst, scratch, (size_t)len[d] * rb, g_stream)))
        return -1;
    }
  }
  return 0;
}

/* --varlen at H = ks->heads: (1) for each S of seqs, N = tokens / S documents of S tokens:
 * the fixed-length kernels (batch N) beside the varlen ones (the same documents packed),
 * equal work, rows *_fixed and *_varlen at S; (2) a packed stream of mixed lengths (log-
 * uniform in [tokens / 128, tokens / 4] from the seed: [512, 16384] at 64k tokens; up to
 * `tokens` tokens) beside the same documents
 * padded to the longest (batch N at S_max): rows *_packed (S = T) and *_padded (S = S_max),
 * both with the FLOPs of the documents' own pairs (the padded rows' TFLOP/s is the useful
 * rate). On an sm_90a device attn_fwd_sm90 (fixed) and its varlen variant too (rows
 * fwd_sm90_*: the CUDA executor's forward there; maps encoded per configuration). With `check` (at H <= 16) each configuration's outputs too (vcheck), misses
 * added to *misses. Returns -1 on a CUDA error. */
static int time_varlen(const kset *ks, const int *seqs, int n_seqs, long tokens, int check,
                       int *misses) {
  const int H = ks->heads;
  const int chk = check && H <= 16;
  vsnap sb, sp, sb90, sp90; /* sb90, sp90: attn_fwd_sm90's O and LSE (sm_90a) */
  memset(&sb90, 0, sizeof sb90), memset(&sp90, 0, sizeof sp90);
  for (int i = 0; i < n_seqs; i++) {
    const int S = seqs[i];
    const int N = tokens / S > 0 ? (int)(tokens / S) : 1;
    const int base = g_n_allocs;
    vctx x;
    memset(&x, 0, sizeof x);
    x.ks = ks, x.scale = softmax_scale();
    const int rc = valloc(&x, H, (long)N * S, N * S + 1);
    if (rc) {
      free_since(base);
      if (rc < 0) return -1;
      continue;
    }
    int *len = xcalloc((size_t)N, sizeof *len);
    for (int d = 0; d < N; d++) len[d] = S;
    if (vupload_cu(&x, len, N, N * S)) return -1;
    say("varlen H=%d: %d documents of %d tokens, fixed-length (batch %d) beside varlen (packed, "
        "cu_seqlens of %d entries)\n", H, N, S, N, N * S + 1);
    const double pairs = (double)N * S * (S + 1) / 2;
    double fixed[5], varlen[5];
    x.varlen = 0, x.B = N, x.S = S;
    if (vtime(&x, H, S, "fixed", pairs, (double)N * S, fixed, chk ? &sb90 : NULL, (size_t)N * S)) return -1;
    if (chk && vsnap_take(&x, H, (size_t)N * S, 1, &sb)) return -1;
    x.varlen = 1, x.B = 1, x.S = N * S;
    if (vtime(&x, H, S, "varlen", pairs, (double)N * S, varlen, chk ? &sp90 : NULL, (size_t)N * S)) return -1;
    vratio("varlen / fixed (ms)", varlen, fixed);
    if (chk) {
      if (vsnap_take(&x, H, (size_t)N * S, 1, &sp)) return -1;
      *misses += vcheck("equal lengths", H, &sb, &sp, &sb90, &sp90, len, N, S, N * S);
      vsnap_free(&sb), vsnap_free(&sp), vsnap_free(&sb90), vsnap_free(&sp90);
    }
    free(len);
    free_since(base);
  }
  /* the mixed stream */
  int len[512], n = 0, smax = 0;
  long T = 0;
  uint64_t st = g_test_seed ^ 0x9e3779b97f4a7c15ull;
  const int lmin = (int)(tokens / 128) > 1 ? (int)(tokens / 128) : 1; /* 512 at 64k tokens */
  while (n < 512) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    int L = (int)(lmin * pow(32.0, (double)(st >> 11) / 9007199254740992.0));
    if (T + L > tokens) L = (int)(tokens - T);
    if (L < lmin) break;
    len[n++] = L, T += L;
    if (L > smax) smax = L;
  }
  if (!n) return 0;
  char list[4096];
  int at = 0;
  for (int d = 0; d < n && at < (int)sizeof list - 16; d++) at += snprintf(list + at, sizeof list - at, "%s%d", d ? "," : "", len[d]);
  double pairs = 0;
  for (int d = 0; d < n; d++) pairs += (double)len[d] * (len[d] + 1) / 2;
  say("varlen H=%d: a packed stream of %d documents, T = %ld tokens (capacity %ld), lengths %s; "
      "padded: batch %d at S_max = %d (%.0f%% padding)\n", H, n, T, tokens, list, n, smax,
      100.0 * (1.0 - (double)T / ((double)n * smax)));
  const int base = g_n_allocs;
  vctx x;
  memset(&x, 0, sizeof x);
  x.ks = ks, x.scale = softmax_scale();
  const long rows = (long)n * smax > tokens ? (long)n * smax : tokens;
  const int no_mqa = g_no_mqa;
  int rc = valloc(&x, H, rows, (int)tokens + 1);
  if (rc == 1 && !g_no_mqa) { /* both forms do not fit: the explicit one alone */
    free_since(base);
    g_no_mqa = 1;
    say("varlen H=%d: the explicit form alone\n", H);
    rc = valloc(&x, H, rows, (int)tokens + 1);
  }
  if (rc) {
    free_since(base);
    g_no_mqa = no_mqa;
    return rc < 0 ? -1 : 0;
  }
  double padded[5], packed[5];
  x.varlen = 0, x.B = n, x.S = smax;
  if (vtime(&x, H, smax, "padded", pairs, (double)n * smax, padded, chk ? &sb90 : NULL, (size_t)n * smax)) return -1;
  if (chk && (vsnap_take(&x, H, (size_t)n * smax, 0, &sb) || vpack_inputs(&x, H, len, n, smax)))
    return -1;
  if (vupload_cu(&x, len, n, (int)tokens)) return -1;
  x.varlen = 1, x.B = 1, x.S = (int)tokens;
  if (vtime(&x, H, (int)T, "packed", pairs, (double)tokens, packed, chk ? &sp90 : NULL, (size_t)tokens)) return -1;
  vratio("packed / padded (ms)", packed, padded);
  if (chk) {
    if (vsnap_take(&x, H, (size_t)tokens, 0, &sp)) return -1;
    *misses += vcheck("mixed lengths", H, &sb, &sp, &sb90, &sp90, len, n, smax, (int)tokens);
    vsnap_free(&sb), vsnap_free(&sp), vsnap_free(&sb90), vsnap_free(&sp90);
  }
  g_no_mqa = no_mqa;
  free_since(base);
  return 0;
}

/* ---- main ------------------------------------------------------------------------------- */
static int parse_list(const char *s, int *out, int max) {
  int n = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *end;
    long v = strtol(tok, &end, 10);
    if (*end || v < 1 || v > 1 << 20 || n == max) return -1;
    out[n++] = (int)v;
  }
  return n;
}

static int usage(void) {
  fprintf(stderr,
          "usage: mlagen_bench OUTDIR [--seqs LIST] [--heads LIST] [--iters N] [--warmup N]\n"
          "                    [--sets N] [--seed N] [--check-only] [--row-budget-ms MS]\n"
          "                    [--no-check (timing without the check: the fake-driver test)]\n"
          "                    [--no-mqa (without the absorbed kernels)] [--jobs N (NVRTC threads)]\n"
          "                    [--sm90 (sm_90a only: attn_fwd beside attn_fwd_sm90, causal and not,\n"
          "                     the backward beside attn_bwd_dkdv_sm90 + attn_bwd_dq_sm90, causal,\n"
          "                     mqa_fwd beside mqa_fwd_sm90 and the mqa backward beside\n"
          "                     mqa_bwd_dkv_sm90 + mqa_bwd_dq_sm90, causal: checked then timed)]\n"
          "                    [--varlen (packed sequences: the varlen kernels beside the fixed\n"
          "                     ones at equal lengths (--seqs), a packed stream of mixed lengths\n"
          "                     beside it padded to the longest; timed only)] [--vl-tokens N (65536)]\n"
          "  defaults: --seqs 1024,4096,8192,16384 --heads 16,128 --iters 20 --warmup 3 --sets 4\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2 || argv[1][0] == '-') return usage();
  const char *outdir = argv[1];
  int seqs[MAX_LIST] = {1024, 4096, 8192, 16384}, n_seqs = 4;
  int heads[MAX_HEADS] = {16, 128}, n_heads = 2;
  unsigned long long seed = 20250711;
  int check_only = 0, no_check = 0, no_mqa = 0;
  long vl_tokens = 65536;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--check-only")) { check_only = 1; continue; }
    if (!strcmp(a, "--no-check")) { no_check = 1; continue; }
    if (!strcmp(a, "--no-mqa")) { no_mqa = g_no_mqa = 1; continue; }
    if (!strcmp(a, "--sm90")) { g_sm90 = 1; continue; }
    if (!strcmp(a, "--varlen")) { g_varlen = 1; continue; }
    if (!v) return usage();
    i++;
    if (!strcmp(a, "--seqs")) { if ((n_seqs = parse_list(v, seqs, MAX_LIST)) < 1) return usage(); }
    else if (!strcmp(a, "--heads")) { if ((n_heads = parse_list(v, heads, MAX_HEADS - 1)) < 1) return usage(); }
    else if (!strcmp(a, "--iters")) { if ((g_iters = atoi(v)) < 1 || g_iters > 256) return usage(); }
    else if (!strcmp(a, "--warmup")) { if ((g_warmup = atoi(v)) < 0) return usage(); }
    else if (!strcmp(a, "--sets")) { if ((g_max_sets = atoi(v)) < 1 || g_max_sets > 8) return usage(); }
    else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 0);
    else if (!strcmp(a, "--jobs")) { if ((g_jobs = atoi(v)) < 1 || g_jobs > 16) return usage(); }
    else if (!strcmp(a, "--row-budget-ms")) { if ((g_row_budget_ms = atof(v)) <= 0) return usage(); }
    else if (!strcmp(a, "--vl-tokens")) { if ((vl_tokens = atol(v)) < 512 || vl_tokens > (1L << 22)) return usage(); }
    else return usage();
  }
  mg_diag d = MG_DIAG_INIT;
  if (mg_fs_mkdirs(outdir, &d)) {
    fprintf(stderr, "bench: %s\n", mg_diag_msg(&d));
    return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/bench.log", outdir);
  if (!(g_log = fopen(path, "w"))) {
    fprintf(stderr, "bench: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  if (mg_driver_get(&drv, &d)) {
    say("bench: %s\n", mg_diag_msg(&d));
    fclose(g_log);
    return mg_diag_msg(&d) && d.status == MLAGEN_ENODRIVER ? 2 : 1;
  }
  int rc = 1;
  CUdevice dev;
  CUcontext ctx = NULL;
  int retained = 0, major = 0, minor = 0, sms = 0, optin = 0;
  char name[256] = "";
  mg_gen *gen = NULL;
  kset sets[MAX_HEADS];
  memset(sets, 0, sizeof sets);
  int n_sets = 0;
  if (CU(drv->cuDeviceGet(&dev, 0)) || CU(drv->cuDeviceGetName(name, sizeof name, dev)) ||
      CU(drv->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)) ||
      CU(drv->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)) ||
      CU(drv->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)) ||
      CU(drv->cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev)))
    goto out;
  if (CU(drv->cuDevicePrimaryCtxRetain(&ctx, dev))) goto out;
  retained = 1;
  if (CU(drv->cuCtxSetCurrent(ctx)) || CU(drv->cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING)))
    goto out;
  char arch[16];
  if (major == 9 && minor == 0) snprintf(arch, sizeof arch, "sm_90a");
  else snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
  g_arch = arch;
  g_vl_sm90 = g_varlen && !strcmp(arch, "sm_90a");
  if (g_sm90 && strcmp(arch, "sm_90a")) {
    say("bench: --sm90 needs an sm_90a device (compute capability 9.0); this one is %s\n", arch);
    goto out;
  }
  int nv_major, nv_minor;
  mg_jit_nvrtc_version(&nv_major, &nv_minor);
  say("device: %s, compute capability %d.%d, %d SMs, %d bytes opt-in smem per block; driver %d; "
      "NVRTC %d.%d; arch %s; seed %llu\n",
      name, major, minor, sms, optin, drv->driver_version, nv_major, nv_minor, arch, seed);
  rng_state = g_test_seed = seed;
  if (mg_gen_open(&gen, NULL, &d)) {
    say("bench: %s\n", mg_diag_msg(&d));
    goto out;
  }
  g_hdr = mg_gen_headers(gen, &g_n_hdr);
  g_template_hash = mg_gen_template_hash(gen);
  if (g_sm90 && g_varlen) {
    say("bench: --sm90 and --varlen are separate runs\n");
    goto out;
  }
  const int vl_check = !no_check; /* --varlen: packed against batch (vcheck), not float64 */
  if (g_varlen) no_check = 1;
  if (!no_check) sets[n_sets++].heads = 2; /* the check's first set (S 256); only checked */
  for (int i = 0; i < n_heads; i++) {
    int dup = 0;
    for (int j = 0; j < n_sets; j++)
      if (sets[j].heads == heads[i]) dup = 1, sets[j].timed = !check_only;
    if (!dup) sets[n_sets].timed = !check_only, sets[n_sets++].heads = heads[i];
  }
  if (build_all(gen, sets, n_sets, optin)) goto out;

  /* the check: H = 2 at S = 256, then every timed H at S = 200 */
  int misses = 0;
  for (int s = 0; s < n_sets && !no_check; s++) {
    int r = g_sm90 ? check_sm90(&sets[s], s == 0 ? 256 : 200) : check_set(&sets[s], s == 0 ? 256 : 200);
    if (r < 0) goto out;
    misses += r;
    if (g_sm90) {
      for (int causal = 1; causal >= 0; causal--) {
        if ((r = check_sm90_bwd(&sets[s], s == 0 ? 256 : 200, causal)) < 0) goto out;
        misses += r;
      }
    }
    if (!no_mqa) {
      const int sq = mqa_check_seq(sets[s].heads, s == 0);
      if ((r = check_mqa(&sets[s], sq)) < 0) goto out;
      misses += r;
    }
  }
  if (misses) {
    say("bench: %d correctness misses: no timing\n", misses);
    goto out;
  }
  if (!g_varlen) say(no_check ? "check SKIPPED (--no-check)\n" : "check passed\n");
  if (check_only) {
    rc = 0;
    goto out;
  }

  g_pool = xcalloc(POOL, sizeof *g_pool);
  for (size_t i = 0; i < POOL; i++) g_pool[i] = float_to_bf16((float)randn());
  if (g_varlen) {
    say("\nTiming --varlen: bf16, causal, d_n %d d_r %d d_v %d (mqa_*: d_qk %d d_v %d); warm-up "
        "%d, median of %d; FLOPs per document pair (MLA.md); fwd = attn_fwd, bwd = pre + dkdv "
        "(deterministic) + dq, mqa_bwd = pre + mqa_bwd_dkv + mqa_bwd_dq; %ld tokens\n",
        DN, DR, DV, MQK, MV, g_warmup, g_iters, vl_tokens);
    print_header();
    int vl_misses = 0;
    for (int h = 0; h < n_heads; h++)
      for (int s = 0; s < n_sets; s++)
        if (sets[s].heads == heads[h] &&
            time_varlen(&sets[s], seqs, n_seqs, vl_tokens, vl_check, &vl_misses))
          goto out;
    if (finish_table(outdir, path, sizeof path)) goto out;
    if (vl_misses) say("bench: %d varlen check misses (packed against batch)\n", vl_misses);
    else say(vl_check ? "varlen check passed (H <= 16)\n" : "varlen check SKIPPED (--no-check)\n");
    rc = vl_misses ? 1 : 0;
    goto out;
  }
  say("\nTiming: B=1, bf16, causal, d_n %d d_r %d d_v %d; warm-up %d, median of %d; FLOPs per "
      "MLA.md (bwd rows: bwd_atomic, bwd_det, and bwd_dkdv alone carry the backward's FLOPs; "
      "mqa_* (absorbed, d_qk %d d_v %d): mqa_fwd and the pipeline mqa_bwd); "
      "layout kernels: bytes moved and GB/s\n",
      DN, DR, DV, g_warmup, g_iters, MQK, MV);
  if (g_sm90)
    say("--sm90: mma.sync beside sm_90a (TMA, wgmma): the forwards attn_fwd, attn_fwd_sm90 "
        "causal (pairs S(S+1)/2) and not (S^2); the backwards causal (bwd_det, bwd_det_sm90: "
        "pre + dkdv + dq; bwd_atomic, bwd_atomic_sm90: pre + dkdv with atomic dQ); split keys; "
        "mqa_fwd beside mqa_fwd_sm90 and mqa_bwd (pre + dkv + dq) beside mqa_bwd_sm90 (576/512), "
        "causal\n");
  print_header();
  for (int h = 0; h < n_heads; h++) {
    const kset *ks = NULL;
    for (int s = 0; s < n_sets; s++)
      if (sets[s].heads == heads[h]) ks = &sets[s];
    for (int i = 0; i < n_seqs; i++) {
      if (g_sm90 ? time_sm90(ks, seqs[i]) || time_sm90_bwd(ks, seqs[i]) ||
                       (!no_mqa && time_mqa(ks, seqs[i]))
                 : time_shape(ks, seqs[i]) || (!no_mqa && time_mqa(ks, seqs[i])) ||
                       time_layout(ks, seqs[i], h == 0))
        goto out;
    }
  }
  if (finish_table(outdir, path, sizeof path)) goto out;
  rc = 0;
out:
  if (g_n_rows && rc) {
    snprintf(path, sizeof path, "%s/bench.csv", outdir);
    write_csv(path); /* what was measured before the failure */
  }
  free(g_pool);
  dfree_all();
  free_all_kernels(sets, n_sets);
  if (g_stream) cu(drv->cuStreamDestroy(g_stream), "cuStreamDestroy");
  if (retained) cu(drv->cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease");
  mg_gen_close(gen);
  mg_diag_clear(&d);
  say("%s\n", rc ? "bench: FAILED" : "bench: ok");
  fclose(g_log);
  return rc;
}
