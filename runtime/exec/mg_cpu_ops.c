/* mg_cpu_ops.c: the CPU executor's kernels (see mg_cpu_ops.h), written for clarity.
 *
 * Tensors are f32 or f64 host arrays; the row helpers below switch on the dtype once per
 * row, so the kernels read as index arithmetic over rows. Every reduction accumulates in
 * double. The attention kernels recompute scores instead of storing them, so they need
 * no memory beyond the plan's buffers and a few stack rows of doubles. */
#include "mg_cpu_ops.h"

#include <math.h>

#include <string.h>

#include "mg_plan.h"
#include "mg_varlen.h"

/* ---- row helpers ------------------------------------------------------------------ */

/* Address of element i of an array of dtype t. */
static const void *at_c(mg_dtype t, const void *p, int64_t i) {
  return (const char *)p + (size_t)i * mg_dtype_size(t);
}
static void *at(mg_dtype t, void *p, int64_t i) { return (char *)p + (size_t)i * mg_dtype_size(t); }

static double get(mg_dtype t, const void *p, int64_t i) {
  return t == MG_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static void put(mg_dtype t, void *p, int64_t i, double x) {
  if (t == MG_F64)
    ((double *)p)[i] = x;
  else
    ((float *)p)[i] = (float)x;
}

/* s0 + sum_c a[c] b[c], in double, in order. */
static double dot_from(mg_dtype t, double s0, const void *a, const void *b, int64_t n) {
  double s = s0;
  if (t == MG_F64) {
    const double *x = a, *y = b;
    for (int64_t c = 0; c < n; c++) s += x[c] * y[c];
  } else {
    const float *x = a, *y = b;
    for (int64_t c = 0; c < n; c++) s += (double)x[c] * (double)y[c];
  }
  return s;
}

static double dot(mg_dtype t, const void *a, const void *b, int64_t n) { return dot_from(t, 0, a, b, n); }

/* acc[c] += w x[c]. */
static void axpy(mg_dtype t, double *acc, double w, const void *x, int64_t n) {
  if (t == MG_F64) {
    const double *y = x;
    for (int64_t c = 0; c < n; c++) acc[c] += w * y[c];
  } else {
    const float *y = x;
    for (int64_t c = 0; c < n; c++) acc[c] += w * (double)y[c];
  }
}

/* dst[c] = scale acc[c]. */
static void store(mg_dtype t, void *dst, const double *acc, double scale, int64_t n) {
  for (int64_t c = 0; c < n; c++) put(t, dst, c, scale * acc[c]);
}

/* n elements from src to dst. */
static void copy(mg_dtype t, void *dst, const void *src, int64_t n) {
  memcpy(dst, src, (size_t)n * mg_dtype_size(t));
}

/* ---- layout kernels ----------------------------------------------------------------- */

void mg_cpu_expand_kv(mg_dtype t, int64_t rows, int64_t H, int64_t dn, int64_t dr, int64_t dv,
                      const void *kv, const void *rope, int64_t rope_col, int64_t rope_w,
                      void *k, void *v) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t h = 0; h < H; h++) {
      const int64_t rh = r * H + h, kw = rope ? dn + dr : dn;
      copy(t, at(t, k, rh * kw), at_c(t, kv, rh * (dn + dv)), dn);
      if (rope) copy(t, at(t, k, rh * kw + dn), at_c(t, rope, r * rope_w + rope_col), dr);
      copy(t, at(t, v, rh * dv), at_c(t, kv, rh * (dn + dv) + dn), dv);
    }
}

void mg_cpu_split_dkv(mg_dtype t, int64_t rows, int64_t H, int64_t dn, int64_t dr, int64_t dv,
                      const void *dk, const void *dvin, const void *dk_rope, void *dkv,
                      void *drope, int64_t rope_col, int64_t rope_w, int accumulate) {
  const int64_t kw = dk_rope ? dn : dn + dr;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t h = 0; h < H; h++) {
      const int64_t rh = r * H + h;
      copy(t, at(t, dkv, rh * (dn + dv)), at_c(t, dk, rh * kw), dn);
      copy(t, at(t, dkv, rh * (dn + dv) + dn), at_c(t, dvin, rh * dv), dv);
    }
    for (int64_t c = 0; c < dr; c++) { /* the rope part is shared: its gradient sums heads */
      double s = accumulate ? get(t, drope, r * rope_w + rope_col + c) : 0;
      if (dk_rope) s += get(t, dk_rope, r * dr + c); /* summed by the attention backward */
      else
        for (int64_t h = 0; h < H; h++) s += get(t, dk, (r * H + h) * (dn + dr) + dn + c);
      put(t, drope, r * rope_w + rope_col + c, s);
    }
  }
}

void mg_cpu_concat_latent(mg_dtype t, int64_t rows, int64_t dc, int64_t dr, const void *c_kv,
                          const void *k_rope, void *c) {
  for (int64_t r = 0; r < rows; r++) {
    copy(t, at(t, c, r * (dc + dr)), at_c(t, c_kv, r * dc), dc);
    copy(t, at(t, c, r * (dc + dr) + dc), at_c(t, k_rope, r * dr), dr);
  }
}

void mg_cpu_split_latent(mg_dtype t, int64_t rows, int64_t dc, int64_t dr, const void *dcin,
                         void *dc_kv, void *dk_rope) {
  for (int64_t r = 0; r < rows; r++) {
    copy(t, at(t, dc_kv, r * dc), at_c(t, dcin, r * (dc + dr)), dc);
    copy(t, at(t, dk_rope, r * dr), at_c(t, dcin, r * (dc + dr) + dc), dr);
  }
}

void mg_cpu_copy_cols(mg_dtype t, int64_t rows, const void *src, int64_t src_w, int64_t src_col,
                      void *dst, int64_t dst_w, int64_t dst_col, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    copy(t, at(t, dst, r * dst_w + dst_col), at_c(t, src, r * src_w + src_col), cols);
}

void mg_cpu_chunk_order(mg_dtype t, int64_t B, int64_t P, int64_t rows_per_rank, int64_t w,
                        const void *src, void *dst, int inverse) {
  const int64_t S = P * rows_per_rank;
  for (int64_t b = 0; b < B; b++)
    for (int64_t q = 0; q < P; q++)
      for (int64_t i = 0; i < rows_per_rank; i++) {
        const int64_t ranked = b * S + q * rows_per_rank + i,
                      global = b * S + mg_cp_pos(P, rows_per_rank, q, i);
        copy(t, at(t, dst, (inverse ? ranked : global) * w),
             at_c(t, src, (inverse ? global : ranked) * w), w);
      }
}

/* ---- attention ---------------------------------------------------------------------- */

/* One attention core for both forms. Query head h reads key/value head h * Hk / H:
 * explicit attention has Hk = H (k [B, S, H, d_qk], v [B, S, H, d_v]); the absorbed MQA
 * has Hk = 1 and its values are the first d_v columns of the key rows (v == k,
 * v_w = d_qk). */
typedef struct geom {
  const mg_cpu_attn *a;
  int64_t Hk;  /* key/value heads */
  int64_t v_w; /* elements per (token, kv head) row of the value buffer */
  int v_in_k;  /* values are the keys' first d_v columns (MQA) */
  int64_t k_w; /* elements per (token, kv head) row of the key buffer: d_qk, or d_qk - d_r
                  with split keys (the rest from a->k_rope) */
} geom;

static int64_t kv_head(const geom *g, int64_t h) { return h * g->Hk / g->a->H; }
static int64_t iq(const geom *g, int64_t b, int64_t i, int64_t h) {
  return ((b * g->a->S_q + i) * g->a->H + h) * g->a->d_qk;
}
static int64_t io(const geom *g, int64_t b, int64_t i, int64_t h) {
  return ((b * g->a->S_q + i) * g->a->H + h) * g->a->d_v;
}
static int64_t ik(const geom *g, int64_t b, int64_t j, int64_t hk) {
  return ((b * g->a->S_k + j) * g->Hk + hk) * g->k_w;
}
/* Split keys: element offset of key row (b, j)'s shared RoPE part in a->k_rope. */
static int64_t ikr(const geom *g, int64_t b, int64_t j) {
  return (b * g->a->S_k + j) * g->a->ld_k_rope;
}
/* q_i . K_j of key head hk (split keys: K_nope's k_w, then the shared RoPE row, one sum in
 * the order of a packed row). */
static double qk(const geom *g, const void *qi, const void *k, int64_t b, int64_t j, int64_t hk) {
  const mg_dtype t = g->a->t;
  double s = dot(t, qi, at_c(t, k, ik(g, b, j, hk)), g->k_w);
  if (g->k_w < g->a->d_qk)
    s = dot_from(t, s, at_c(t, qi, g->k_w), at_c(t, g->a->k_rope, ikr(g, b, j)), g->a->d_r);
  return s;
}
/* acc += w K_j of key head hk. */
static void axpy_k(const geom *g, double *acc, double w, const void *k, int64_t b, int64_t j,
                   int64_t hk) {
  const mg_dtype t = g->a->t;
  axpy(t, acc, w, at_c(t, k, ik(g, b, j, hk)), g->k_w);
  if (g->k_w < g->a->d_qk) axpy(t, acc + g->k_w, w, at_c(t, g->a->k_rope, ikr(g, b, j)), g->a->d_r);
}
static int64_t iv(const geom *g, int64_t b, int64_t j, int64_t hk) {
  return ((b * g->a->S_k + j) * g->Hk + hk) * g->v_w;
}
static int64_t ilse(const geom *g, int64_t b, int64_t h, int64_t i) {
  return (b * g->a->H + h) * g->a->S_q + i;
}
/* The global position of query row i (mg_cpu_attn). */
static int64_t qpos(const geom *g, int64_t i) {
  const mg_cpu_attn *a = g->a;
  return i < a->q_split ? a->q_pos0 + i : a->q_pos1 + (i - a->q_split);
}
/* Keys visible to query i, [*lo, *hi): [0, pos(i)] causal, else all; with documents, the
 * keys of pos(i)'s document (none for a slack row). */
static void keys_of(const geom *g, int64_t i, int64_t *lo, int64_t *hi) {
  const mg_cpu_attn *a = g->a;
  if (a->cu_seqlens) {
    mg_varlen_keys(a->cu_seqlens, a->n_seqs, a->causal, qpos(g, i), lo, hi);
    return;
  }
  *lo = 0;
  *hi = a->causal ? qpos(g, i) + 1 : a->S_k;
}

/* Online softmax: one pass over the keys, rescaling the running sum and output row when
 * the running max grows. lse = max + log(sum exp(s - max)). */
static void attn_fwd(const geom *g, const void *q, const void *k, const void *v, void *o,
                     void *lse) {
  const mg_cpu_attn *a = g->a;
  const mg_dtype t = a->t;
  double acc[MG_CPU_MAX_ROW];
  for (int64_t b = 0; b < a->B; b++)
    for (int64_t h = 0; h < a->H; h++)
      for (int64_t i = 0; i < a->S_q; i++) {
        const int64_t hk = kv_head(g, h);
        const void *qi = at_c(t, q, iq(g, b, i, h));
        double m = -INFINITY, l = 0;
        int64_t lo, hi;
        keys_of(g, i, &lo, &hi);
        for (int64_t c = 0; c < a->d_v; c++) acc[c] = 0;
        for (int64_t j = lo; j < hi; j++) {
          const double s = a->scale * qk(g, qi, k, b, j, hk);
          if (s > m) { /* new max: rescale what was summed so far */
            const double r = exp(m - s);
            l *= r;
            for (int64_t c = 0; c < a->d_v; c++) acc[c] *= r;
            m = s;
          }
          const double p = exp(s - m);
          l += p;
          axpy(t, acc, p, at_c(t, v, iv(g, b, j, hk)), a->d_v);
        }
        /* a row without keys: o = 0 (acc is), lse = -inf */
        store(t, at(t, o, io(g, b, i, h)), acc, l > 0 ? 1.0 / l : 0.0, a->d_v);
        put(t, lse, ilse(g, b, h, i), l > 0 ? m + log(l) : -INFINITY);
      }
}

/* P[i, j] and dS[i, j] of one (batch, head) pair of query i and key j. */
static void prob_and_ds(const geom *g, const void *q, const void *k, const void *v,
                        const void *o, const void *lse, const void *d_o, int64_t b, int64_t h,
                        int64_t i, int64_t j, double *p, double *ds) {
  const mg_cpu_attn *a = g->a;
  const mg_dtype t = a->t;
  const int64_t hk = kv_head(g, h);
  const void *qi = at_c(t, q, iq(g, b, i, h)), *doi = at_c(t, d_o, io(g, b, i, h));
  const double s = a->scale * qk(g, qi, k, b, j, hk);
  *p = exp(s - get(t, lse, ilse(g, b, h, i)));
  const double dp = dot(t, doi, at_c(t, v, iv(g, b, j, hk)), a->d_v);  /* dO_i . V_j */
  const double D = dot(t, doi, at_c(t, o, io(g, b, i, h)), a->d_v);    /* dO_i . O_i */
  *ds = *p * (dp - D);
}

/* Two sweeps: over queries for dQ (row i sums over keys), over keys for dK and dV
 * (row j sums over queries and the heads sharing key head hk). */
static void attn_bwd(const geom *g, const void *q, const void *k, const void *v, const void *o,
                     const void *lse, const void *d_o, void *dq, void *dk, void *dv) {
  const mg_cpu_attn *a = g->a;
  const mg_dtype t = a->t;
  double acc_q[MG_CPU_MAX_ROW], acc_k[MG_CPU_MAX_ROW], acc_v[MG_CPU_MAX_ROW];

  /* dQ_i = scale sum_j dS_ij K_j */
  for (int64_t b = 0; b < a->B; b++)
    for (int64_t h = 0; h < a->H; h++)
      for (int64_t i = 0; i < a->S_q; i++) {
        int64_t lo, hi;
        keys_of(g, i, &lo, &hi);
        for (int64_t c = 0; c < a->d_qk; c++) acc_q[c] = 0;
        for (int64_t j = lo; j < hi; j++) {
          double p, ds;
          prob_and_ds(g, q, k, v, o, lse, d_o, b, h, i, j, &p, &ds);
          axpy_k(g, acc_q, ds, k, b, j, kv_head(g, h));
        }
        store(t, at(t, dq, iq(g, b, i, h)), acc_q, a->scale, a->d_qk);
      }

  /* dK_j = scale sum_{h, i} dS_ij Q_i,   dV_j = sum_{h, i} P_ij dO_i; split keys: dK's
   * RoPE part (the last d_r of acc_k) summed over the key heads into acc_r */
  const int split = g->k_w < a->d_qk;
  double acc_r[MG_CPU_MAX_ROW];
  for (int64_t b = 0; b < a->B; b++)
    for (int64_t j = 0; j < a->S_k; j++) {
      for (int64_t c = 0; split && c < a->d_r; c++) acc_r[c] = 0;
      for (int64_t hk = 0; hk < g->Hk; hk++) {
        for (int64_t c = 0; c < a->d_qk; c++) acc_k[c] = 0;
        for (int64_t c = 0; c < a->d_v; c++) acc_v[c] = 0;
        for (int64_t h = 0; h < a->H; h++) {
          if (kv_head(g, h) != hk) continue;
          for (int64_t i = 0; i < a->S_q; i++) {
            int64_t lo, hi;
            keys_of(g, i, &lo, &hi);
            if (j < lo || j >= hi) continue; /* skipped, never multiplied by 0 */
            double p, ds;
            prob_and_ds(g, q, k, v, o, lse, d_o, b, h, i, j, &p, &ds);
            axpy(t, acc_k, ds, at_c(t, q, iq(g, b, i, h)), a->d_qk);
            axpy(t, acc_v, p, at_c(t, d_o, io(g, b, i, h)), a->d_v);
          }
        }
        if (g->v_in_k) { /* one latent row is key and value: its gradient is the sum */
          for (int64_t c = 0; c < a->d_qk; c++) acc_k[c] *= a->scale;
          for (int64_t c = 0; c < a->d_v; c++) acc_k[c] += acc_v[c];
          store(t, at(t, dk, ik(g, b, j, hk)), acc_k, 1.0, a->d_qk);
        } else {
          store(t, at(t, dk, ik(g, b, j, hk)), acc_k, a->scale, g->k_w);
          store(t, at(t, dv, iv(g, b, j, hk)), acc_v, 1.0, a->d_v);
          for (int64_t c = 0; split && c < a->d_r; c++) acc_r[c] += acc_k[g->k_w + c];
        }
      }
      if (split) store(t, at(t, a->dk_rope, (b * a->S_k + j) * a->d_r), acc_r, a->scale, a->d_r);
    }
}

void mg_cpu_attn_fwd(const mg_cpu_attn *a, const void *q, const void *k, const void *v, void *o,
                     void *lse) {
  const geom g = {a, a->H, a->d_v, 0, a->d_qk - a->d_r};
  attn_fwd(&g, q, k, v, o, lse);
}

void mg_cpu_attn_bwd(const mg_cpu_attn *a, const void *q, const void *k, const void *v,
                     const void *o, const void *lse, const void *d_o, void *dq, void *dk,
                     void *dv) {
  const geom g = {a, a->H, a->d_v, 0, a->d_qk - a->d_r};
  attn_bwd(&g, q, k, v, o, lse, d_o, dq, dk, dv);
}

void mg_cpu_mqa_fwd(const mg_cpu_attn *a, const void *q_abs, const void *c, void *o_lat,
                    void *lse) {
  const geom g = {a, 1, a->d_qk, 1, a->d_qk};
  attn_fwd(&g, q_abs, c, c, o_lat, lse);
}

void mg_cpu_mqa_bwd(const mg_cpu_attn *a, const void *q_abs, const void *c, const void *o_lat,
                    const void *lse, const void *do_lat, void *dq_abs, void *dc) {
  const geom g = {a, 1, a->d_qk, 1, a->d_qk};
  attn_bwd(&g, q_abs, c, c, o_lat, lse, do_lat, dq_abs, dc, dc);
}
