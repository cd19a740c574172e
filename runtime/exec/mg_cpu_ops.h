/* mg_cpu_ops.h: the CPU executor's kernels, one function per mg_kernel_op (mg_plan.h).
 *
 * Plain C written for clarity, not speed. Every tensor is a host array of one dtype t,
 * MG_F32 or MG_F64, row-major, with the shapes given below ("rows" is the product of
 * the leading dims). The kernels read and write only the arrays they are given: they
 * allocate nothing. The attention kernels keep three rows of doubles on the stack
 * (3 * MG_CPU_MAX_ROW * 8 bytes = 48 KiB): head dims d_qk and d_v must not exceed
 * MG_CPU_MAX_ROW (the executor checks). Reductions (softmax max and sum, LSE, every
 * dot product and every output row) accumulate in double. The caller (mg_cpu_exec.c)
 * validates shapes; these functions cannot fail. */
#ifndef MG_CPU_OPS_H
#define MG_CPU_OPS_H
#include <stdint.h>

#include "mg_dtype.h"

/* Longest row an attention kernel accumulates on the stack (d_qk, d_v; d_c + d_r and
 * d_c in the absorbed form). */
#define MG_CPU_MAX_ROW 2048

/* MG_OP_EXPAND_KV: k[r, h] = [kv[r, h, :d_n] ; rope[r, rope_col .. rope_col + d_r)],
 * v[r, h] = kv[r, h, d_n:]. kv [rows, H, d_n + d_v], rope [rows, rope_w],
 * k [rows, H, d_n + d_r], v [rows, H, d_v]. Split keys (rope NULL): k [rows, H, d_n] =
 * kv[r, h, :d_n], no RoPE copy (rope_col, rope_w unused). */
void mg_cpu_expand_kv(mg_dtype t, int64_t rows, int64_t H, int64_t dn, int64_t dr, int64_t dv,
                      const void *kv, const void *rope, int64_t rope_col, int64_t rope_w,
                      void *k, void *v);

/* MG_OP_SPLIT_DKV: dkv[r, h] = [dk[r, h, :d_n] ; dv[r, h]],
 * drope[r, rope_col + c] (+)= sum_h dk[r, h, d_n + c] (c < d_r; other columns untouched;
 * accumulate nonzero: added to what drope holds).
 * dk [rows, H, d_n + d_r], dv [rows, H, d_v], dkv [rows, H, d_n + d_v], drope [rows, rope_w].
 * Split keys (dk_rope non-NULL, [rows, d_r], the attention backward's head sum): dk is
 * [rows, H, d_n] and drope[r, rope_col + c] (+)= dk_rope[r, c]. */
void mg_cpu_split_dkv(mg_dtype t, int64_t rows, int64_t H, int64_t dn, int64_t dr, int64_t dv,
                      const void *dk, const void *dvin, const void *dk_rope, void *dkv,
                      void *drope, int64_t rope_col, int64_t rope_w, int accumulate);

/* Attention geometry: B batches of S_q query rows and S_k keys, H query heads. Keys sit
 * at global positions 0 .. S_k - 1; query row i at pos(i) = q_pos0 + i for i < q_split,
 * else q_pos1 + (i - q_split) (mg_step's contract; all zero: pos(i) = i, the queries
 * cover the same tokens as the keys). causal: key j visible to query i iff j <= pos(i).
 * Packed sequences (cu_seqlens non-NULL, B = 1, mg_varlen.h): query i sees only the keys
 * of its document, mg_varlen_keys(cu_seqlens, n_seqs, causal, pos(i)); a row that sees no
 * key (a slack token's) gets o = 0, lse = -inf and dq = 0, and a key no row sees gets
 * dk = dv = 0. Masked pairs are skipped, never multiplied by 0, so NaN in rows outside
 * every range (slack rows of q, k, v, o, do) never reaches a valid output. */
typedef struct mg_cpu_attn {
  mg_dtype t;
  int64_t B, S_q, S_k, H;
  int64_t q_pos0, q_split, q_pos1; /* positions inside [0, S_k) */
  int64_t d_qk, d_v;  /* 1 <= d_qk, d_v <= MG_CPU_MAX_ROW */
  /* Split keys (mg_step.split_keys; explicit attention only): d_r > 0 makes key j of head h
   * [k[b, j, h, :d_qk - d_r] ; k_rope row (b, j)], k being k_nope [B, S_k, H, d_qk - d_r]
   * and row (b, j) of the shared RoPE key at k_rope + (b S_k + j) ld_k_rope (ld_k_rope >=
   * d_r; the gathered latent: k_rope = c + d_c, ld_k_rope = d_c + d_r). The backward then
   * writes dk as dK_nope [B, S_k, H, d_qk - d_r] and dk_rope [B, S_k, d_r], dK's RoPE part
   * summed over the heads. d_r = 0: packed keys, k [B, S_k, H, d_qk]. */
  int64_t d_r, ld_k_rope;
  const void *k_rope;
  void *dk_rope;
  double scale;       /* softmax scale */
  int causal;
  const int32_t *cu_seqlens; /* NULL: one sequence; else n_seqs + 1 checked boundaries */
  int64_t n_seqs;
} mg_cpu_attn;

/* MG_OP_ATTN_FWD: q [B, S_q, H, d_qk], k [B, S_k, H, d_qk] (split keys: see d_r above),
 * v [B, S_k, H, d_v] ->
 * o [B, S_q, H, d_v], lse [B, H, S_q] (natural log of the softmax denominator, scores
 * scaled). */
void mg_cpu_attn_fwd(const mg_cpu_attn *a, const void *q, const void *k, const void *v, void *o,
                     void *lse);

/* MG_OP_ATTN_BWD: FlashAttention's backward. D_i = dO_i . O_i, P = exp(scale q.k - lse),
 * dP = dO V^T, dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
 * Shapes as the forward; dq like q, dk like k, dv like v (split keys: and a->dk_rope). */
void mg_cpu_attn_bwd(const mg_cpu_attn *a, const void *q, const void *k, const void *v,
                     const void *o, const void *lse, const void *d_o, void *dq, void *dk,
                     void *dv);

/* MG_OP_MQA_FWD: one latent head shared by all H query heads. q_abs [B, S_q, H, d_qk],
 * c [B, S_k, d_qk] the keys, its first d_v columns the values (d_v <= d_qk) ->
 * o_lat [B, S_q, H, d_v], lse [B, H, S_q]. */
void mg_cpu_mqa_fwd(const mg_cpu_attn *a, const void *q_abs, const void *c, void *o_lat,
                    void *lse);

/* MG_OP_MQA_BWD: as mg_cpu_attn_bwd with the shared head: dq_abs [B, S, H, d_qk];
 * dc [B, S, d_qk] = sum over heads of the key gradient, plus (first d_v columns) the
 * sum over heads of the value gradient. */
void mg_cpu_mqa_bwd(const mg_cpu_attn *a, const void *q_abs, const void *c, const void *o_lat,
                    const void *lse, const void *do_lat, void *dq_abs, void *dc);

/* MG_OP_CONCAT_LATENT: c[r] = [c_kv[r] ; k_rope[r]]. c_kv [rows, d_c], k_rope [rows, d_r],
 * c [rows, d_c + d_r]. */
void mg_cpu_concat_latent(mg_dtype t, int64_t rows, int64_t dc, int64_t dr, const void *c_kv,
                          const void *k_rope, void *c);

/* MG_OP_SPLIT_LATENT: [dc_kv[r] ; dk_rope[r]] = dc[r]. The inverse of concat. */
void mg_cpu_split_latent(mg_dtype t, int64_t rows, int64_t dc, int64_t dr, const void *dcin,
                         void *dc_kv, void *dk_rope);

/* MG_OP_CHUNK_ORDER: src and dst [B, P S_l, w] (S_l = rows_per_rank); inverse 0:
 * dst[b, pos(q, i)] = src[b, q S_l + i], inverse 1: dst[b, q S_l + i] = src[b, pos(q, i)],
 * pos = mg_cp_pos (laga-cp's token layout, mg_plan.h). */
void mg_cpu_chunk_order(mg_dtype t, int64_t B, int64_t P, int64_t rows_per_rank, int64_t w,
                        const void *src, void *dst, int inverse);

/* MG_OP_COPY_COLS: dst[r, dst_col + j] = src[r, src_col + j] for j < cols, r < rows;
 * src [rows, src_w], dst [rows, dst_w]. */
void mg_cpu_copy_cols(mg_dtype t, int64_t rows, const void *src, int64_t src_w, int64_t src_col,
                      void *dst, int64_t dst_w, int64_t dst_col, int64_t cols);
#endif
