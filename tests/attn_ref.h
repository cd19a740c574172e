/* attn_ref.h: float64 reference of explicit (per-head) MLA attention, forward and backward,
 * the independent check of templates/explicit_fwd.cu.tpl, attn_fwd.cu.tpl and
 * attn_bwd_*.cu.tpl (tests only; mqa_ref.h is its sibling for the absorbed form).
 *
 * Layouts (MLA.md, explicit form; every head has its own keys here: a test with a shared
 * k_rope copies it into each head's K and sums dK's rope columns over the heads):
 *   q    [B, S_q, H, d_qk]      k [B, S_k, H, d_qk]      v [B, S_k, H, d_v]
 *   o    [B, S_q, H, d_v]       o[i, h] = sum_j softmax_j(scale q[i, h] . k[j, h]) v[j, h]
 *   lse  [B, H, S_q]            natural-log logsumexp of the scaled scores (-inf: no key)
 * Causal: key j (keys at positions 0 .. S_k - 1) is visible to query row i iff j <= pos(i),
 * the row's global position (attn_ref_pos): q_pos0 + i, or with two chunks (q_split > 0, the
 * all-gather context-parallel form's queries) q_pos1 + i - q_split from row q_split on. The
 * kernels' own convention differs only for q_split = 0 (there: one chunk at q_pos1), so
 * the tests pass them (q_pos0, 0, q_pos0) for one chunk. The backward, from dout
 * [B, S_q, H, d_v]: dP = dO V^T, dS = P (dP - rowsum(dO o)), dq = scale dS K,
 * dk = scale dS^T q, dv = P^T dO (dq, dk, dv in q's, k's and v's layouts).
 * Packed sequences (attn_ref_fwd_docs, attn_ref_bwd_docs: FlashAttention's varlen,
 * generator/core/mg_varlen.h): the tokens of docs->n documents are concatenated, document e
 * holding positions [cu[e], cu[e + 1]); a query at position p of document e sees the keys
 * [cu[e], causal ? p + 1 : cu[e + 1]), a query at a position no document holds (slack) sees
 * none. attn_ref_doc_keys finds the document by its own loop over cu (no shared code with
 * mg_varlen or mla::Varlen; mqa_ref.h uses it too).
 * Everything in double; straightforward loops (no blocking, no online softmax), so it
 * shares no structure with the kernels it checks. Checked by finite differences in
 * test_attn_bwd.c (test_reference_finite_differences).
 *
 * The backward's 16-bit-aware mode (attn_ref_mixed) models what the tensor-core backward
 * does by design, so that a test's tolerance sees the kernel's own noise and not these
 * planned roundings: it takes the forward's stored o (16-bit) and lse (fp32), computes
 * P = exp(scale S - lse) from that lse and delta = rowsum(dO o) from that o, and rounds P
 * (before dV = P^T dO) and dS (before dq = scale dS K and dk = scale dS^T q) to the
 * operands' 16-bit type. A P or dS element within the kernel's own fp32 error (eps, relative
 * to its natural size) of a rounding boundary may round to the other neighbour in the
 * kernel: the mode can add, per gradient element, the sum over such terms of the two
 * roundings' difference times the other factor (flip_*), a bound a test adds to its
 * tolerance for that element alone. */
#ifndef MG_ATTN_REF_H
#define MG_ATTN_REF_H
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The shapes of one problem. */
typedef struct attn_ref_dims {
  int B, S_q, S_k, H, d_qk, d_v, causal, q_pos0;
  double scale;
  int q_split, q_pos1; /* two chunks when q_split > 0 (attn_ref_pos) */
} attn_ref_dims;

/* Packed sequences: n documents, boundaries cu [n + 1] (a NULL attn_ref_docs: one sequence). */
typedef struct attn_ref_docs {
  const int *cu;
  int n;
} attn_ref_docs;

/* The global position of query row i. */
static inline long attn_ref_pos(const attn_ref_dims *d, int i) {
  return d->q_split > 0 && i >= d->q_split ? (long)d->q_pos1 + (i - d->q_split) : (long)d->q_pos0 + i;
}

/* The keys [*lo, *hi) a query at position p sees among the documents cu [n + 1]: its
 * document's [cu[e], causal ? p + 1 : cu[e + 1]); none (lo = hi = 0) at a position no
 * document holds (slack). */
static inline void attn_ref_doc_keys(const int *cu, int n, int causal, long p, long *lo,
                                     long *hi) {
  *lo = *hi = 0;
  for (int e = 0; e < n; e++)
    if (cu[e] <= p && p < cu[e + 1]) {
      *lo = cu[e], *hi = causal ? p + 1 : cu[e + 1];
      return;
    }
}

/* The keys [*lo, *hi) query row i sees (clipped to 0 .. S_k); docs NULL: one sequence. */
static inline void attn_ref_keys(const attn_ref_dims *d, const attn_ref_docs *docs, int i,
                                 long *lo, long *hi) {
  const long p = attn_ref_pos(d, i);
  *lo = 0, *hi = d->causal ? p + 1 : d->S_k;
  if (docs) attn_ref_doc_keys(docs->cu, docs->n, d->causal, p, lo, hi);
  if (*hi > d->S_k) *hi = d->S_k;
  if (*lo < 0) *lo = 0;
}

/* Softmax probabilities p[0..S_k) of query row (b, i, h) (0 where masked); returns the
 * logsumexp (-INFINITY when no key is visible, then every p is 0). Reads only the visible
 * keys (NaN elsewhere cannot reach the result). */
static inline double attn_ref_row(const attn_ref_dims *d, const attn_ref_docs *docs, int b,
                                  int i, int h, const double *q, const double *k, double *p) {
  const double *qi = q + (((size_t)b * d->S_q + i) * d->H + h) * d->d_qk;
  double mx = -INFINITY;
  long lo, hi;
  attn_ref_keys(d, docs, i, &lo, &hi);
  for (int j = 0; j < d->S_k; j++) {
    if (j < lo || j >= hi) {
      p[j] = -INFINITY;
      continue;
    }
    const double *kj = k + (((size_t)b * d->S_k + j) * d->H + h) * d->d_qk;
    double s = 0;
    for (int c = 0; c < d->d_qk; c++) s += qi[c] * kj[c];
    p[j] = s * d->scale;
    if (p[j] > mx) mx = p[j];
  }
  if (mx == -INFINITY) {
    for (int j = 0; j < d->S_k; j++) p[j] = 0;
    return -INFINITY;
  }
  double sum = 0;
  for (int j = 0; j < d->S_k; j++) {
    p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx);
    sum += p[j];
  }
  for (int j = 0; j < d->S_k; j++) p[j] /= sum;
  return mx + log(sum);
}

/* Forward: o and lse (layouts above); a row without keys gets o = 0, lse = -inf. docs:
 * packed sequences (NULL: one sequence, as attn_ref_fwd). */
static inline void attn_ref_fwd_docs(const attn_ref_dims *d, const attn_ref_docs *docs,
                                     const double *q, const double *k, const double *v,
                                     double *o, double *lse) {
  double *p = malloc(sizeof(double) * (size_t)(d->S_k > 0 ? d->S_k : 1));
  for (int b = 0; b < d->B; b++)
    for (int h = 0; h < d->H; h++)
      for (int i = 0; i < d->S_q; i++) {
        lse[((size_t)b * d->H + h) * d->S_q + i] = attn_ref_row(d, docs, b, i, h, q, k, p);
        double *oi = o + (((size_t)b * d->S_q + i) * d->H + h) * d->d_v;
        for (int c = 0; c < d->d_v; c++) oi[c] = 0;
        for (int j = 0; j < d->S_k; j++) {
          if (p[j] == 0) continue;
          const double *vj = v + (((size_t)b * d->S_k + j) * d->H + h) * d->d_v;
          for (int c = 0; c < d->d_v; c++) oi[c] += p[j] * vj[c];
        }
      }
  free(p);
}
static inline void attn_ref_fwd(const attn_ref_dims *d, const double *q, const double *k,
                                const double *v, double *o, double *lse) {
  attn_ref_fwd_docs(d, NULL, q, k, v, o, lse);
}

/* The backward's 16-bit-aware mode (see above): the forward's stored outputs and the
 * rounding of the MMA operands. */
typedef struct attn_ref_mixed {
  const double *o;          /* [B, S_q, H, d_v]: the stored o, for delta */
  const double *lse;        /* [B, H, S_q]: the stored lse, for P */
  double (*round)(double);  /* to the 16-bit operand type and back */
  double eps;               /* relative error of the kernel's fp32 P and dS (for flip_*) */
  double *flip_dq, *flip_dk, *flip_dv; /* out when not NULL: per element, dq's layout etc. */
} attn_ref_mixed;

/* |round(x + e) - round(x - e)|: how far x's rounding may move within +-e. */
static inline double attn_ref_ambiguity(double (*round)(double), double x, double e) {
  return fabs(round(x + e) - round(x - e));
}

/* Backward: dq, dk, dv (overwritten) from q, k, v and dout; the forward is recomputed
 * exactly. o and lse, when not NULL, receive the exact forward's outputs too. mx: NULL
 * for the exact gradients, else the 16-bit-aware mode. docs: packed sequences (NULL: one
 * sequence, as attn_ref_bwd). */
static inline void attn_ref_bwd_docs(const attn_ref_dims *d, const attn_ref_docs *docs,
                                     const double *q, const double *k, const double *v,
                                     const double *dout, double *dq, double *dk, double *dv,
                                     double *o, double *lse, const attn_ref_mixed *mx) {
  const int dqk = d->d_qk, dvw = d->d_v;
  double *p = malloc(sizeof(double) * (size_t)(d->S_k > 0 ? d->S_k : 1));
  double *oi = malloc(sizeof(double) * (size_t)(dvw > 0 ? dvw : 1));
  memset(dq, 0, sizeof(double) * (size_t)d->B * d->S_q * d->H * dqk);
  memset(dk, 0, sizeof(double) * (size_t)d->B * d->S_k * d->H * dqk);
  memset(dv, 0, sizeof(double) * (size_t)d->B * d->S_k * d->H * dvw);
  const size_t nq = (size_t)d->B * d->S_q * d->H, nk = (size_t)d->B * d->S_k * d->H;
  if (mx && mx->flip_dq) memset(mx->flip_dq, 0, sizeof(double) * nq * dqk);
  if (mx && mx->flip_dk) memset(mx->flip_dk, 0, sizeof(double) * nk * dqk);
  if (mx && mx->flip_dv) memset(mx->flip_dv, 0, sizeof(double) * nk * dvw);
  for (int b = 0; b < d->B; b++)
    for (int h = 0; h < d->H; h++)
      for (int i = 0; i < d->S_q; i++) {
        const size_t row = ((size_t)b * d->S_q + i) * d->H + h;
        const double l = attn_ref_row(d, docs, b, i, h, q, k, p);
        if (lse) lse[((size_t)b * d->H + h) * d->S_q + i] = l;
        const double *qi = q + row * dqk, *doi = dout + row * dvw;
        double delta = 0; /* rowsum(dO o) */
        for (int c = 0; c < dvw; c++) {
          oi[c] = 0;
          for (int j = 0; j < d->S_k; j++)
            if (p[j] != 0) oi[c] += p[j] * v[(((size_t)b * d->S_k + j) * d->H + h) * dvw + c];
          delta += doi[c] * oi[c];
        }
        if (o) memcpy(o + row * dvw, oi, sizeof(double) * (size_t)dvw);
        if (mx) { /* P from the stored lse, delta from the stored o */
          const double ls = mx->lse[((size_t)b * d->H + h) * d->S_q + i];
          delta = 0;
          for (int c = 0; c < dvw; c++) delta += doi[c] * mx->o[row * dvw + c];
          for (int j = 0; j < d->S_k; j++)
            if (p[j] != 0) {
              const double *kj = k + (((size_t)b * d->S_k + j) * d->H + h) * dqk;
              double sdot = 0;
              for (int c = 0; c < dqk; c++) sdot += qi[c] * kj[c];
              p[j] = exp(sdot * d->scale - ls);
            }
        }
        for (int j = 0; j < d->S_k; j++) {
          if (p[j] == 0) continue;
          const size_t kr = ((size_t)b * d->S_k + j) * d->H + h;
          const double *kj = k + kr * dqk, *vj = v + kr * dvw;
          double dp = 0;
          for (int c = 0; c < dvw; c++) dp += doi[c] * vj[c];
          double ds = p[j] * (dp - delta), pv = p[j], amb_p = 0, amb_ds = 0;
          if (mx) {
            amb_p = attn_ref_ambiguity(mx->round, pv, mx->eps * pv);
            amb_ds = attn_ref_ambiguity(mx->round, ds, mx->eps * pv * (fabs(dp) + fabs(delta)));
            ds = mx->round(ds), pv = mx->round(pv);
          }
          ds *= d->scale;
          for (int c = 0; c < dqk; c++) {
            dq[row * dqk + c] += ds * kj[c];
            dk[kr * dqk + c] += ds * qi[c];
          }
          for (int c = 0; c < dvw; c++) dv[kr * dvw + c] += pv * doi[c];
          if (amb_ds > 0 && mx->flip_dq)
            for (int c = 0; c < dqk; c++)
              mx->flip_dq[row * dqk + c] += amb_ds * d->scale * fabs(kj[c]);
          if (amb_ds > 0 && mx->flip_dk)
            for (int c = 0; c < dqk; c++)
              mx->flip_dk[kr * dqk + c] += amb_ds * d->scale * fabs(qi[c]);
          if (amb_p > 0 && mx->flip_dv)
            for (int c = 0; c < dvw; c++) mx->flip_dv[kr * dvw + c] += amb_p * fabs(doi[c]);
        }
      }
  free(oi);
  free(p);
}
static inline void attn_ref_bwd(const attn_ref_dims *d, const double *q, const double *k,
                                const double *v, const double *dout, double *dq, double *dk,
                                double *dv, double *o, double *lse, const attn_ref_mixed *mx) {
  attn_ref_bwd_docs(d, NULL, q, k, v, dout, dq, dk, dv, o, lse, mx);
}
#endif
