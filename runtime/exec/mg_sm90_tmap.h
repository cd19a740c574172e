/* mg_sm90_tmap.h: the CUtensorMaps of the sm_90a families' `tmaps` parameters (attn_fwd_sm90's
 * four, mqa_fwd_sm90's two, the backward's five, the absorbed backward's three).
 *
 * attn_fwd_sm90 (templates/attn_fwd_sm90.cu.tpl) reads Q, K_nope (or the packed per-head
 * K), k_rope and V through TMA: its last parameter holds 4 CUtensorMaps by value. This
 * module is the one place above the template that knows their dims, strides, boxes and
 * swizzles (the template's `tmaps` doc states the same contract); the CUDA
 * executor and the GPU benchmark (tests/gpu/bench.c) both call it. Maps are encoded with
 * cuTensorMapEncodeTiled, the driver loader's optional entry (runtime/exec/mg_driver.h),
 * on the host, for each launch, and passed by value: the kernel parameter is `const
 * __grid_constant__ mla::sm90::TensorMaps<4>` (an MG_PARAM_TMAPS parameter), whose
 * cuLaunchKernel argument is a pointer to the 4 maps. The launch copies them into the
 * parameter space, so the host array may be reused as soon as cuLaunchKernel returns; the
 * tensors must stay alive while the kernel runs (a map holds their addresses).
 *
 * Why by value and not in device memory: the maps hold the tensors' addresses, which the
 * CUDA executor learns only at each pass (the caller's tensors and workspace), so maps in
 * device memory would need a buffer in the workspace, an asynchronous upload per pass, and
 * a fence.proxy.tensormap::generic.acquire in every CTA before the first TMA load (a map
 * rewritten in global memory may otherwise be read stale from the descriptor cache). As
 * kernel parameters (what CUTLASS and FlashAttention-3 do) none of that exists.
 *
 * The backward's kernels (attn_bwd_dkdv_sm90, attn_bwd_dq_sm90) take 5 maps likewise
 * (`TensorMaps<5>`, mg_sm90_bwd_tmaps below).
 *
 * Per map (dims innermost first; 16-bit elements; no interleave, L2 promotion none, zero
 * out-of-bounds fill; W(d) = 64, 32 or 16 columns for d a multiple of 64, 32, 16, with
 * swizzle 128B, 64B, 32B):
 *   [0] q       dims {d_qk, H, S_q, B}               box {W(d_qk), 1, block_m, 1}
 *   [1] k_nope  dims {d_n (packed: d_qk), H, S_k, B} box {W(d_n), 1, block_n, 1}
 *   [2] split:  k_rope dims {d_r, S_k, B}            box {W(d_r), block_n, 1}
 *               (row stride ld_k_rope elements: the tensors' ld_k_rope below)
 *       packed: K      dims {d_qk, H, S_k, B}        box {W(d_r), 1, block_n, 1}
 *   [3] v       dims {d_v, H, S_k, B}                box {W(d_v), 1, block_n, 1}
 * The batch item is a dimension of its own, so a tile's rows past its item's end are TMA's
 * zero fill, never the next item's tokens (whose NaN or inf would otherwise reach this
 * item's results through 0 * x). Every other map's rows are contiguous (row stride = its
 * innermost dim). A size of 0 is encoded as 1 (the driver needs dims >= 1; the kernel then
 * launches no CTA or masks every key). */
#ifndef MG_SM90_TMAP_H
#define MG_SM90_TMAP_H
#include "mg_diag.h"
#include "mg_driver.h"
#include "mg_manifest.h"

/* Maps per attn_fwd_sm90 launch, and their bytes (each CUtensorMap is 128 bytes, 64-byte
 * aligned). */
#define MG_SM90_FWD_TMAPS 4
#define MG_SM90_FWD_TMAP_BYTES (MG_SM90_FWD_TMAPS * sizeof(CUtensorMap))

/* The tensors one attn_fwd_sm90 launch reads (device addresses, 16-byte aligned) and the
 * run-time sizes: q [B, S_q, H, d_qk]; k_nope [B, S_k, H, d_n] (k_packed = 1:
 * [B, S_k, H, d_qk], and k_rope is unused, may be 0); k_rope [B, S_k, d_r], token row t at
 * k_rope + t * ld_k_rope (the kernels' ld_k_rope argument; e.g. k_rope = c + d_c and
 * ld_k_rope = d_c + d_r for the latent c's RoPE columns); v [B, S_k, H, d_v]. */
typedef struct mg_sm90_fwd_tensors {
  CUdeviceptr q, k_nope, k_rope, v;
  long batch, seqlen_q, seqlen_k; /* >= 0 */
  /* Split keys: elements between k_rope's token rows, >= d_r, times 2 bytes a multiple of 16
   * (TMA's global strides are); 0 means d_r (contiguous). Not read when k_packed = 1. */
  long ld_k_rope;
} mg_sm90_fwd_tensors;

/* Encodes the 4 maps of kernel k (an attn_fwd_sm90 manifest entry: its configuration gives
 * block_m, block_n, k_packed) for spec s (heads, d_n, d_r, d_v, dtype "bf16" or "fp16") and
 * the tensors t into maps[0..4) (host memory). Returns 0, or:
 *   MLAGEN_EINVAL       a NULL argument; k not of family attn_fwd_sm90 or s's family
 *                       differing; block_m, block_n or k_packed missing from k's
 *                       configuration; a dim not a positive multiple of 16; a negative size;
 *                       an unknown dtype; a tensor address not 16-byte aligned (or 0 when
 *                       read); split keys: an ld_k_rope under d_r, not a multiple of 8
 *                       elements (16 bytes), or of 2^40 bytes or more (the message names
 *                       ld_k_rope and what TMA needs); a head or batch step (the product of
 *                       the dims below it) of 2^40 bytes or more, TMA's stride limit (the
 *                       message names the map and the dim); cuTensorMapEncodeTiled rejecting a map (the
 *                       message names the map, its dims and box, and the CUDA error).
 *   MLAGEN_EUNSUPPORTED the loaded driver has no cuTensorMapEncodeTiled (a driver older
 *                       than CUDA 12.0): attn_fwd_sm90 cannot run; the mma.sync attn_fwd
 *                       can.
 * maps is zeroed first, so it never holds a partial set on error. */
int mg_sm90_fwd_tmaps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                      const mg_sm90_fwd_tensors *t, CUtensorMap maps[MG_SM90_FWD_TMAPS],
                      mg_diag *d);

/* The five CUtensorMaps of the sm_90a attention backward's `tmaps` parameter
 * (templates/attn_bwd_dkdv_sm90.cu.tpl, attn_bwd_dq_sm90.cu.tpl; `const __grid_constant__
 * mla::sm90::TensorMaps<5>`, by value as attn_fwd_sm90's), per map (as above; W_K =
 * the smaller of W(d_n), W(d_r), so that K_nope's and k_rope's boxes are alike and the K
 * tile is one run of W_K-column boxes):
 *   [0] q       dims {d_qk, H, S_q, B}               box {W(d_qk), 1, block_m, 1}
 *   [1] k_nope  dims {d_n (packed: d_qk), H, S_k, B} box {W_K, 1, block_n, 1}
 *   [2] split:  k_rope dims {d_r, S_k, B}            box {W_K, block_n, 1}
 *               (row stride ld_k_rope elements, as the forward's)
 *       packed: K      dims {d_qk, H, S_k, B}        box {W_K, 1, block_n, 1}
 *   [3] v       dims {d_v, H, S_k, B}                box {W(d_v), 1, block_n, 1}
 *   [4] dout    dims {d_v, H, S_q, B}                box {W(d_v), 1, block_m, 1} */
#define MG_SM90_BWD_TMAPS 5
#define MG_SM90_BWD_TMAP_BYTES (MG_SM90_BWD_TMAPS * sizeof(CUtensorMap))

/* The tensors of one backward launch: mg_sm90_fwd_tensors's (ld_k_rope likewise), plus dout
 * [B, S_q, H, d_v]. */
typedef struct mg_sm90_bwd_tensors {
  CUdeviceptr q, k_nope, k_rope, v, dout;
  long batch, seqlen_q, seqlen_k; /* >= 0 */
  long ld_k_rope;                 /* as mg_sm90_fwd_tensors's: 0 means d_r */
} mg_sm90_bwd_tensors;

/* Encodes the 5 maps of kernel k (an attn_bwd_dkdv_sm90 or attn_bwd_dq_sm90 manifest entry:
 * its configuration gives block_m, block_n, k_packed) for spec s into maps[0..5). Returns 0,
 * or the errors of mg_sm90_fwd_tmaps (the family checked being one of those two). */
int mg_sm90_bwd_tmaps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                      const mg_sm90_bwd_tensors *t, CUtensorMap maps[MG_SM90_BWD_TMAPS],
                      mg_diag *d);

/* mqa_fwd_sm90 (templates/mqa_fwd_sm90.cu.tpl, the absorbed forward) reads q and the latent
 * c through the 2 maps of its `tmaps` parameter, `const __grid_constant__
 * mla::sm90::TensorMaps<2>`, by value as attn_fwd_sm90's (3D, dims innermost first, the batch
 * item a dim of its own as above; W = W(d_c + d_r) with its swizzle):
 *   [0] q  dims {d_c + d_r, S_q*H, B}  box {W, 64, 1}       (the packed rows r = i H + h)
 *   [1] c  dims {d_c + d_r, S_k, B}    box {W, block_n, 1}
 * q [B, S_q, H, d_c + d_r] and c [B, S_k, d_c + d_r]: device addresses, 16-byte aligned. */
#define MG_SM90_MQA_TMAPS 2
#define MG_SM90_MQA_TMAP_BYTES (MG_SM90_MQA_TMAPS * sizeof(CUtensorMap))
typedef struct mg_sm90_mqa_tensors {
  CUdeviceptr q, c;
  long batch, seqlen_q, seqlen_k; /* >= 0 */
} mg_sm90_mqa_tensors;

/* Encodes the 2 maps of kernel k (an mqa_fwd_sm90 manifest entry: its configuration gives
 * block_n) for spec s (heads, d_c, d_r, dtype) and the tensors t into maps[0..2) (host
 * memory; zeroed first). Returns 0, or MLAGEN_EINVAL (a NULL argument; k not of family
 * mqa_fwd_sm90 or s's family differing; block_n missing; d_c or d_r not a positive multiple
 * of 16; a negative size; an unknown dtype; an address null or not 16-byte aligned;
 * cuTensorMapEncodeTiled rejecting a map, named) or MLAGEN_EUNSUPPORTED (no
 * cuTensorMapEncodeTiled in the driver: the mma.sync mqa_fwd runs without it). */
int mg_sm90_mqa_tmaps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                      const mg_sm90_mqa_tensors *t, CUtensorMap maps[MG_SM90_MQA_TMAPS],
                      mg_diag *d);

/* The absorbed backward, mqa_bwd_dkv_sm90 and mqa_bwd_dq_sm90 (templates/mqa_bwd_dkv_sm90.cu.tpl,
 * mqa_bwd_dq_sm90.cu.tpl), reads q, c and dout through the 3 maps of its `tmaps` parameter,
 * `const __grid_constant__ mla::sm90::TensorMaps<3>`, by value (3D as mqa_fwd_sm90's, W =
 * W(d_c + d_r) with its swizzle for all three; both kernels' tiles are 64 rows):
 *   [0] q     dims {d_c + d_r, S_q*H, B}  box {W, 64, 1}
 *   [1] c     dims {d_c + d_r, S_k, B}    box {W, 64, 1}
 *   [2] dout  dims {d_c, S_q*H, B}        box {W, 64, 1}
 * q [B, S_q, H, d_c + d_r], c [B, S_k, d_c + d_r], dout [B, S_q, H, d_c]: device addresses,
 * 16-byte aligned. */
#define MG_SM90_MQA_BWD_TMAPS 3
#define MG_SM90_MQA_BWD_TMAP_BYTES (MG_SM90_MQA_BWD_TMAPS * sizeof(CUtensorMap))
typedef struct mg_sm90_mqa_bwd_tensors {
  CUdeviceptr q, c, dout;
  long batch, seqlen_q, seqlen_k; /* >= 0 */
} mg_sm90_mqa_bwd_tensors;

/* Encodes the 3 maps of kernel k (an mqa_bwd_dkv_sm90 or mqa_bwd_dq_sm90 manifest entry;
 * no tunable is read) for spec s (heads, d_c, d_r, dtype) and the tensors t into
 * maps[0..3) (host memory; zeroed first). Returns 0, or mg_sm90_mqa_tmaps's errors (the
 * family checked being one of those two; no block_n needed), MLAGEN_EUNSUPPORTED naming
 * the mma.sync mqa_bwd_dkv / mqa_bwd_dq. */
int mg_sm90_mqa_bwd_tmaps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                          const mg_sm90_mqa_bwd_tensors *t,
                          CUtensorMap maps[MG_SM90_MQA_BWD_TMAPS], mg_diag *d);

/* The most maps one MG_PARAM_TMAPS parameter holds. */
#define MG_SM90_MAX_TMAPS 8

/* The maps of kernel k's MG_PARAM_TMAPS parameter (spec s) for one launch, from the launch's
 * other arguments: args[i] points at parameter i's value as cuLaunchKernel takes it (a
 * pointer parameter: at its device address, 8 bytes; an int: at its value, as ld_k_rope is
 * read for the split-key maps; the MG_PARAM_TMAPS one is not read) and dims are the launch's sizes (batch, seqlen_q, seqlen_k). The one place that knows
 * which tensors each sm_90a family maps: attn_fwd_sm90 (mg_sm90_fwd_tmaps over its params
 * q, k_nope, k_rope, v), mqa_fwd_sm90 (mg_sm90_mqa_tmaps over q, c), attn_bwd_dkdv_sm90 and
 * attn_bwd_dq_sm90 (mg_sm90_bwd_tmaps over q, k_nope, k_rope, v, dout), mqa_bwd_dkv_sm90 and
 * mqa_bwd_dq_sm90 (mg_sm90_mqa_bwd_tmaps over q, c, dout). Writes *n maps into
 * maps[0 .. max). Returns 0, or the encoders' errors, or
 * MLAGEN_EINVAL (a NULL argument; k has no MG_PARAM_TMAPS parameter, or a family
 * without an encoder here; max too small). */
int mg_sm90_launch_tmaps(const mg_driver *drv, const mg_kernel_spec *s, const mg_kernel_info *k,
                         void *const *args, const mg_launch_dims *dims, CUtensorMap *maps, int max,
                         int *n, mg_diag *d);
#endif
