/* mqa_ref.h: float64 reference of the absorbed form's MQA attention over the latent, the
 * independent check of templates/mqa_fwd.cu.tpl and mqa_bwd_*.cu.tpl (tests only).
 *
 * One shared latent head (MLA.md, absorbed form; DeepSeek-V2, arXiv 2405.04434, 2.1.3):
 *   q  [B, S_q, H, d_c + d_r]   absorbed queries [W_UK^T q_n ; q_r] per head
 *   c  [B, S_k, d_c + d_r]      keys [c_kv ; k_rope]; the values are c[.., :d_c]
 *   o  [B, S_q, H, d_c]         o[i, h] = sum_j softmax_j(scale q[i, h] . c[j]) c[j, :d_c]
 *   lse [B, H, S_q]             natural-log logsumexp of the scaled scores (-inf: no key)
 * Causal: key j is visible to query i iff j <= q_pos0 + i. Packed sequences (the _varlen
 * entries, batch 1; issue 16, FlashAttention's varlen): cu [n_cu + 1] splits the token
 * stream into documents, and query i (at token t = q_pos0 + i) of document d sees the keys
 * [cu[d], causal ? t + 1 : cu[d + 1]); a token at or past cu[n_cu] (slack) sees none and is
 * seen by none (attn_ref.h's attn_ref_doc_keys: the one walk over cu the references share). Only the rows and keys a query sees are read, so NaN in slack rows of any
 * input stays out of the reference. The backward, from dout
 * [B, S_q, H, d_c]: dS = P (dP - rowsum(dO o)), dP = dO c[:, :d_c]^T;
 *   dq [B, S_q, H, d_c + d_r] = scale dS c
 *   dc [B, S_k, d_c + d_r]    = sum over heads of scale dS^T q, plus P^T dO in [:, :d_c]
 *                               (c_kv is both key and value).
 * Everything in double; straightforward loops (no blocking, no online softmax), so it
 * shares no structure with the kernels it checks.
 *
 * mqa_ref_bwd_mixed is the backward's 16-bit-aware mode: it models what mqa_bwd_dkv and
 * mqa_bwd_dq do by design, so that a test's tolerance sees the kernels' own noise and not
 * these planned roundings: P = exp(scale S - lse) from the forward's stored lse (fp32),
 * delta = rowsum(dO o) from its stored o (16-bit), and P and scale dS rounded to the 16-bit
 * operand type before the products that use them. With flip_dq / flip_dc not NULL it also
 * bounds, per gradient element, what the P and scale dS elements within the kernels' own
 * fp32 error (eps, relative to their natural size) of a rounding boundary can change when
 * the kernel rounds them the other way (as attn_ref.h's flip_*). */
#ifndef MG_MQA_REF_H
#define MG_MQA_REF_H
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref.h"

/* The keys [*lo, *hi) the query at token t sees: cu NULL, [0, causal ? t + 1 : S_k) within
 * [0, S_k); else its document's (attn_ref_doc_keys: empty for slack tokens). */
static void mqa_ref_keys(const int *cu, int n_cu, int S_k, int causal, int t, int *lo, int *hi) {
  *lo = 0, *hi = 0;
  if (!cu) {
    *hi = causal ? (t + 1 < S_k ? t + 1 : S_k) : S_k;
    if (*hi < 0) *hi = 0;
    return;
  }
  long l, h;
  attn_ref_doc_keys(cu, n_cu, causal, t, &l, &h);
  *lo = (int)l, *hi = (int)h;
}

/* Scores of one query row against keys [lo, hi), scaled; returns the logsumexp
 * (-INFINITY when the range is empty) and leaves p[j] = softmax probabilities (0 outside
 * the range). */
static double mqa_ref_row(int S_k, int d_c, int d_r, int lo, int hi, double scale,
                          const double *qrow, const double *cb, double *p) {
  const int w = d_c + d_r;
  double mx = -INFINITY;
  for (int j = 0; j < S_k; j++) p[j] = 0;
  for (int j = lo; j < hi; j++) {
    double s = 0;
    for (int k = 0; k < w; k++) s += qrow[k] * cb[(size_t)j * w + k];
    p[j] = s * scale;
    if (p[j] > mx) mx = p[j];
  }
  if (hi <= lo) return -INFINITY;
  double sum = 0;
  for (int j = lo; j < hi; j++) {
    p[j] = exp(p[j] - mx);
    sum += p[j];
  }
  for (int j = lo; j < hi; j++) p[j] /= sum;
  return mx + log(sum);
}

/* Forward: o and lse from q and c (layouts above); packed sequences when cu is not NULL. */
static inline void mqa_ref_fwd_varlen(int B, int S_q, int S_k, int H, int d_c, int d_r,
                                      int causal, int q_pos0, const int *cu, int n_cu,
                                      double scale, const double *q, const double *c, double *o,
                                      double *lse) {
  const int w = d_c + d_r;
  double *p = malloc(sizeof(double) * (size_t)(S_k > 0 ? S_k : 1));
  for (int b = 0; b < B; b++)
    for (int i = 0; i < S_q; i++)
      for (int h = 0; h < H; h++) {
        const double *qrow = q + (((size_t)b * S_q + i) * H + h) * w;
        const double *cb = c + (size_t)b * S_k * w;
        int lo, hi;
        mqa_ref_keys(cu, n_cu, S_k, causal, q_pos0 + i, &lo, &hi);
        lse[((size_t)b * H + h) * S_q + i] = mqa_ref_row(S_k, d_c, d_r, lo, hi, scale, qrow, cb, p);
        double *orow = o + (((size_t)b * S_q + i) * H + h) * d_c;
        for (int k = 0; k < d_c; k++) {
          double acc = 0;
          for (int j = lo; j < hi; j++) acc += p[j] * cb[(size_t)j * w + k];
          orow[k] = acc;
        }
      }
  free(p);
}

static inline void mqa_ref_fwd(int B, int S_q, int S_k, int H, int d_c, int d_r, int causal,
                               int q_pos0, double scale, const double *q, const double *c,
                               double *o, double *lse) {
  mqa_ref_fwd_varlen(B, S_q, S_k, H, d_c, d_r, causal, q_pos0, NULL, 0, scale, q, c, o, lse);
}

/* Backward with the 16-bit-aware mode when round is not NULL: o16 [B, S_q, H, d_c] and
 * lse32 [B, H, S_q] are the forward's stored outputs, round the operand rounding. With
 * round NULL (o16, lse32 unused) the exact gradients. dq and dc are overwritten; packed
 * sequences when cu is not NULL (a row without keys reads nothing and gets dq = 0). */
static inline void mqa_ref_bwd_mixed_varlen(int B, int S_q, int S_k, int H, int d_c, int d_r,
                                     int causal, int q_pos0, const int *cu, int n_cu,
                                     double scale, const double *q,
                                     const double *c, const double *dout, const double *o16,
                                     const double *lse32, double (*round)(double), double eps,
                                     double *flip_dq, double *flip_dc, double *dq, double *dc) {
  const int w = d_c + d_r;
  double *p = malloc(sizeof(double) * (size_t)(S_k > 0 ? S_k : 1));
  double *o = malloc(sizeof(double) * (size_t)d_c);
  memset(dq, 0, sizeof(double) * (size_t)B * S_q * H * w);
  memset(dc, 0, sizeof(double) * (size_t)B * S_k * w);
  if (flip_dq) memset(flip_dq, 0, sizeof(double) * (size_t)B * S_q * H * w);
  if (flip_dc) memset(flip_dc, 0, sizeof(double) * (size_t)B * S_k * w);
  for (int b = 0; b < B; b++)
    for (int i = 0; i < S_q; i++)
      for (int h = 0; h < H; h++) {
        const size_t row = ((size_t)b * S_q + i) * H + h;
        const double *qrow = q + row * w, *dorow = dout + row * d_c;
        const double *cb = c + (size_t)b * S_k * w;
        double *dcb = dc + (size_t)b * S_k * w, *dqrow = dq + row * w;
        int lo, hi;
        mqa_ref_keys(cu, n_cu, S_k, causal, q_pos0 + i, &lo, &hi);
        if (hi <= lo) continue;
        mqa_ref_row(S_k, d_c, d_r, lo, hi, scale, qrow, cb, p);
        double delta = 0; /* rowsum(dO o) */
        for (int k = 0; k < d_c; k++) {
          o[k] = 0;
          for (int j = lo; j < hi; j++) o[k] += p[j] * cb[(size_t)j * w + k];
          delta += dorow[k] * (round ? o16[row * d_c + k] : o[k]);
        }
        const double ls = round ? lse32[((size_t)b * H + h) * S_q + i] : 0;
        for (int j = lo; j < hi; j++) {
          if (p[j] == 0) continue;
          const double *cj = cb + (size_t)j * w;
          double pj = p[j];
          if (round) { /* P from the stored lse */
            double sdot = 0;
            for (int k = 0; k < w; k++) sdot += qrow[k] * cj[k];
            pj = exp(sdot * scale - ls);
          }
          double dp = 0;
          for (int k = 0; k < d_c; k++) dp += dorow[k] * cj[k];
          double ds = pj * (dp - delta) * scale, amb_p = 0, amb_ds = 0;
          if (round) {
            const double ep = eps * pj, eds = eps * pj * (fabs(dp) + fabs(delta)) * scale;
            amb_p = fabs(round(pj + ep) - round(pj - ep));
            amb_ds = fabs(round(ds + eds) - round(ds - eds));
            ds = round(ds), pj = round(pj);
          }
          for (int k = 0; k < w; k++) {
            dqrow[k] += ds * cj[k];
            dcb[(size_t)j * w + k] += ds * qrow[k];
          }
          for (int k = 0; k < d_c; k++) dcb[(size_t)j * w + k] += pj * dorow[k];
          if (flip_dq && amb_ds > 0)
            for (int k = 0; k < w; k++) flip_dq[row * w + k] += amb_ds * fabs(cj[k]);
          if (flip_dc && (amb_ds > 0 || amb_p > 0)) {
            double *f = flip_dc + ((size_t)b * S_k + j) * w;
            for (int k = 0; k < w; k++) f[k] += amb_ds * fabs(qrow[k]);
            for (int k = 0; k < d_c; k++) f[k] += amb_p * fabs(dorow[k]);
          }
        }
      }
  free(o);
  free(p);
}

static inline void mqa_ref_bwd_mixed(int B, int S_q, int S_k, int H, int d_c, int d_r,
                                     int causal, int q_pos0, double scale, const double *q,
                                     const double *c, const double *dout, const double *o16,
                                     const double *lse32, double (*round)(double), double eps,
                                     double *flip_dq, double *flip_dc, double *dq, double *dc) {
  mqa_ref_bwd_mixed_varlen(B, S_q, S_k, H, d_c, d_r, causal, q_pos0, NULL, 0, scale, q, c, dout,
                           o16, lse32, round, eps, flip_dq, flip_dc, dq, dc);
}

/* Backward: dq and dc from q, c and dout (the forward is recomputed here, exactly). dq and
 * dc are overwritten. */
static inline void mqa_ref_bwd(int B, int S_q, int S_k, int H, int d_c, int d_r, int causal,
                               int q_pos0, double scale, const double *q, const double *c,
                               const double *dout, double *dq, double *dc) {
  mqa_ref_bwd_mixed(B, S_q, S_k, H, d_c, d_r, causal, q_pos0, scale, q, c, dout, NULL, NULL,
                    NULL, 0, NULL, NULL, dq, dc);
}
#endif
