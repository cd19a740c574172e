/* mla_ref64.c: see mla_ref64.h. */
#include "mla_ref64.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mg_safetensors.h" /* bf16 / f16 conversions */

#define MR_BLOCK 128

int mr_row_in(const mr_case *c, int64_t i) {
  if (c->tail0 <= 0 || c->head1 >= c->tail0) return 1;
  return i < c->head1 || i >= c->tail0;
}

int64_t mr_key0(const mr_case *c) {
  if (c->tail0 <= 0 || c->head1 >= c->tail0) return 0;
  return c->causal ? c->tail0 : c->S;
}

double mr_round(double x, int rnd) {
  if (rnd == 1) return mg_bf16_to_f32(mg_f32_to_bf16((float)x));
  if (rnd == 2) return mg_f16_to_f32(mg_f32_to_f16((float)x));
  return x;
}

double mr_quantize(double x, int e) { return ldexp(nearbyint(ldexp(x, e)), -e); }

static double *nan_array(int64_t n) {
  double *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
  if (p)
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
  return p;
}

/* Attention for every head over the rows of c's row set: Q [S, H, dq], K [S, Hk, dq]
 * (query head h reads key head h Hk / H), V [S, Hk, dv] or NULL (lse only); writes lse
 * [H, S] and O [S, H, dv]; with dO: dQ [S, H, dq], and dK, dV (zeroed by the caller)
 * accumulated for keys >= key0. Returns -1 out of memory. */
static int attention(const mr_case *c, int Hk, int dq, int dv, const double *Q, const double *K,
                     const double *V, double *O, double *lse, const double *dO, double *dQ,
                     double *dK, double *dV, int64_t key0) {
  const int64_t S = c->S, H = c->H;
  double *Sb = malloc((size_t)MR_BLOCK * (size_t)S * sizeof *Sb);
  double *dP = dO ? malloc((size_t)MR_BLOCK * (size_t)S * sizeof *dP) : NULL;
  if (!Sb || (dO && !dP)) {
    free(Sb);
    free(dP);
    return -1;
  }
  for (int64_t h = 0; h < H; h++) {
    const int64_t hk = h * Hk / H;
    const double *Kh = K + hk * dq, *Vh = V ? V + hk * dv : NULL;
    for (int64_t i0 = 0; i0 < S; i0 += MR_BLOCK) {
      const int64_t i1 = i0 + MR_BLOCK < S ? i0 + MR_BLOCK : S, R = i1 - i0;
      int any = 0;
      for (int64_t i = i0; i < i1; i++) any |= mr_row_in(c, i);
      if (!any) continue;
      const int64_t kend = c->causal ? i1 : S;
      const double *Qb = Q + (i0 * H + h) * dq;
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)R, (int)kend, dq, c->scale, Qb,
                  (int)(H * dq), Kh, Hk * dq, 0.0, Sb, (int)kend);
      for (int64_t r = 0; r < R; r++) { /* P = exp(s - lse), masked entries 0 */
        double *s = Sb + r * kend, m = -INFINITY, sum = 0;
        const int64_t last = c->causal ? i0 + r : kend - 1;
        for (int64_t j = 0; j <= last; j++) m = s[j] > m ? s[j] : m;
        for (int64_t j = 0; j <= last; j++) sum += exp(s[j] - m);
        const double l = m + log(sum);
        lse[h * S + i0 + r] = l;
        for (int64_t j = 0; j < kend; j++) s[j] = j <= last ? exp(s[j] - l) : 0.0;
      }
      if (!Vh) continue;
      double *Ob = O + (i0 * H + h) * dv;
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)R, dv, (int)kend, 1.0, Sb,
                  (int)kend, Vh, Hk * dv, 0.0, Ob, (int)(H * dv));
      if (!dO) continue;
      const double *dOb = dO + (i0 * H + h) * dv;
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)R, (int)kend, dv, 1.0, dOb,
                  (int)(H * dv), Vh, Hk * dv, 0.0, dP, (int)kend);
      for (int64_t r = 0; r < R; r++) { /* dS = P (dP - delta), delta = dO . O */
        double delta = 0;
        for (int d = 0; d < dv; d++) /* the kernels read o as stored: in the 16-bit dtype */
          delta += dOb[r * H * dv + d] * mr_round(Ob[r * H * dv + d], c->rnd);
        double *p = Sb + r * kend, *g = dP + r * kend;
        for (int64_t j = 0; j < kend; j++) g[j] = p[j] * (g[j] - delta);
      }
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)R, dq, (int)kend, c->scale, dP,
                  (int)kend, Kh, Hk * dq, 0.0, dQ + (i0 * H + h) * dq, (int)(H * dq));
      if (key0 < kend) { /* dK += scale dS^T Q, dV += P^T dO over keys [key0, kend) */
        const int64_t nk = kend - key0;
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, dq, (int)R, c->scale,
                    dP + key0, (int)kend, Qb, (int)(H * dq), 1.0, dK + (key0 * Hk + hk) * dq,
                    Hk * dq);
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, dv, (int)R, 1.0, Sb + key0,
                    (int)kend, dOb, (int)(H * dv), 1.0, dV + (key0 * Hk + hk) * dv, Hk * dv);
      }
    }
  }
  free(Sb);
  free(dP);
  return 0;
}

void mr_free(mr_out *o) {
  free(o->o);
  free(o->lse);
  free(o->lse_abs);
  free(o->dq);
  free(o->dc_kv);
  free(o->dk_rope);
  free(o->dw_kv_b);
  memset(o, 0, sizeof *o);
}

int mr_run(const mr_case *c, const double *q, const double *c_kv, const double *k_rope,
           const double *w, const double *d_o, mr_out *out) {
  memset(out, 0, sizeof *out);
  const int64_t S = c->S, H = c->H;
  const int dn = c->dn, dr = c->dr, dv = c->dv, dc = c->dc, dqk = dn + dr, wr = dn + dv;
  const int full = mr_key0(c) == 0 && (c->tail0 <= 0 || c->head1 >= c->tail0);
  const int64_t key0 = mr_key0(c);
  double *K = calloc((size_t)(S * H * dqk), sizeof *K), *V = calloc((size_t)(S * H * dv), sizeof *V);
  double *dK = NULL, *dV = NULL, *Qa = NULL, *Kc = NULL;
  int rc = -1;
  out->o = nan_array(S * H * dv);
  out->lse = nan_array(H * S);
  out->lse_abs = nan_array(H * S);
  out->dq = nan_array(S * H * dqk);
  if (!K || !V || !out->o || !out->lse || !out->lse_abs || !out->dq) goto done;
  /* K_n[s, h] = rnd(W_UK[h] c_kv[s]), K[s, h, dn:] = k_rope[s], V[s, h] = rnd(W_UV[h] c_kv[s]) */
  for (int64_t h = 0; h < H; h++) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)S, dn, dc, 1.0, c_kv, dc,
                w + h * wr * dc, dc, 0.0, K + h * dqk, (int)(H * dqk));
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)S, dv, dc, 1.0, c_kv, dc,
                w + (h * wr + dn) * dc, dc, 0.0, V + h * dv, (int)(H * dv));
  }
  for (int64_t s = 0; s < S; s++)
    for (int64_t h = 0; h < H; h++) {
      double *k = K + (s * H + h) * dqk, *v = V + (s * H + h) * dv;
      for (int d = 0; d < dn; d++) k[d] = mr_round(k[d], c->rnd);
      for (int d = 0; d < dr; d++) k[dn + d] = k_rope[s * dr + d];
      for (int d = 0; d < dv; d++) v[d] = mr_round(v[d], c->rnd);
    }
  if (d_o) {
    if (!(dK = calloc((size_t)(S * H * dqk), sizeof *dK)) ||
        !(dV = calloc((size_t)(S * H * dv), sizeof *dV)))
      goto done;
  }
  if (attention(c, (int)H, dqk, dv, q, K, V, out->o, out->lse, d_o, out->dq, dK, dV, key0)) goto done;

  /* the absorbed form's lse: q_lat = rnd(W_UK^T q_n) [S, H, dc] with q_rope, keys c [S, dc + dr] */
  if (!(Qa = malloc((size_t)(S * H * (dc + dr)) * sizeof *Qa)) ||
      !(Kc = malloc((size_t)(S * (dc + dr)) * sizeof *Kc)))
    goto done;
  for (int64_t h = 0; h < H; h++)
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)S, dc, dn, 1.0, q + h * dqk,
                (int)(H * dqk), w + h * wr * dc, dc, 0.0, Qa + h * (dc + dr), (int)(H * (dc + dr)));
  for (int64_t s = 0; s < S; s++) {
    for (int64_t h = 0; h < H; h++) {
      double *a = Qa + (s * H + h) * (dc + dr);
      for (int d = 0; d < dc; d++) a[d] = mr_round(a[d], c->rnd);
      for (int d = 0; d < dr; d++) a[dc + d] = q[(s * H + h) * dqk + dn + d];
    }
    memcpy(Kc + s * (dc + dr), c_kv + s * dc, (size_t)dc * sizeof *Kc);
    memcpy(Kc + s * (dc + dr) + dc, k_rope + s * dr, (size_t)dr * sizeof *Kc);
  }
  if (attention(c, 1, dc + dr, dc, Qa, Kc, NULL, NULL, out->lse_abs, NULL, NULL, NULL, NULL, S))
    goto done;

  if (d_o) { /* dc_kv = sum_h W_UK[h]^T dK_n + W_UV[h]^T dV, dk_rope = sum_h dK_r, dw_kv_b */
    out->dc_kv = nan_array(S * dc);
    out->dk_rope = nan_array(S * dr);
    if (!out->dc_kv || !out->dk_rope) goto done;
    if (key0 < S) {
      const int64_t n = S - key0;
      double *dck = out->dc_kv + key0 * dc;
      memset(dck, 0, (size_t)(n * dc) * sizeof *dck);
      for (int64_t h = 0; h < H; h++) {
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, dc, dn, 1.0,
                    dK + (key0 * H + h) * dqk, (int)(H * dqk), w + h * wr * dc, dc, 1.0, dck, dc);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, dc, dv, 1.0,
                    dV + (key0 * H + h) * dv, (int)(H * dv), w + (h * wr + dn) * dc, dc, 1.0, dck, dc);
      }
      for (int64_t s = key0; s < S; s++)
        for (int d = 0; d < dr; d++) {
          double sum = 0;
          for (int64_t h = 0; h < H; h++) sum += dK[(s * H + h) * dqk + dn + d];
          out->dk_rope[s * dr + d] = sum;
        }
    }
    if (full) {
      if (!(out->dw_kv_b = malloc((size_t)(H * wr * dc) * sizeof *out->dw_kv_b))) goto done;
      for (int64_t h = 0; h < H; h++) {
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dn, dc, (int)S, 1.0, dK + h * dqk,
                    (int)(H * dqk), c_kv, dc, 0.0, out->dw_kv_b + h * wr * dc, dc);
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dv, dc, (int)S, 1.0, dV + h * dv,
                    (int)(H * dv), c_kv, dc, 0.0, out->dw_kv_b + (h * wr + dn) * dc, dc);
      }
    }
  }
  rc = 0;
done:
  free(K);
  free(V);
  free(dK);
  free(dV);
  free(Qa);
  free(Kc);
  if (rc) mr_free(out);
  return rc;
}
