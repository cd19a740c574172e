/* mla_ref64.h: a float64 reference of one MLA layer (docs/forms.md's semantics) for the GPU forms
 * check, fast enough for the tuned buckets' sequence lengths (GEMMs through CBLAS dgemm,
 * attention in row blocks of 128 with the scores recomputed, never an S x S matrix).
 *
 * It models the one rounding that moves the LSE beyond 1e-5: the form's attention inputs
 * are rounded to the plan's 16-bit dtype before attention. The explicit family (explicit,
 * laga, laga-r, laga-f) attends over K_n = rnd(W_UK c_kv) and V = rnd(W_UV c_kv); the
 * absorbed form over q_lat = rnd(W_UK^T q_n) and the latent c = [c_kv ; k_rope]. With
 * inputs on a coarse grid (mr_quantize) those GEMMs are exact in f32 whatever cuBLAS's
 * summation order, so the reference's rounded values are the GPU's, bit for bit. The
 * outputs o, dq, dc_kv, dk_rope, dw_kv_b come from the explicit family's attention
 * (every form equals it up to rounding); lse per family. The backward's delta = dO . o
 * takes o rounded to the dtype, as the attention backward reads the stored o.
 *
 * Rows: every query row is independent given K and V, so o, lse and dq can be computed
 * for some rows only; causal dK_j, dV_j depend only on rows i >= j, so with the rows a
 * tail [tail0, S) (plus a head [0, head1)) the key gradients of tail tokens, hence
 * dc_kv and dk_rope there, are exact. dw_kv_b sums over every token: full runs only. */
#ifndef MLA_REF64_H
#define MLA_REF64_H
#include <stdint.h>

/* One case: DeepSeek-style head dims, B = 1, S tokens, the softmax scale, causal, and the
 * rounding of the attention inputs (0 none, 1 bf16, 2 f16). */
typedef struct mr_case {
  int H, dn, dr, dv, dc;
  int64_t S;
  int causal;
  double scale;
  int rnd;
  /* Rows computed: [0, head1) and [tail0, S); tail0 = 0 (or head1 >= tail0): every row. */
  int64_t head1, tail0;
} mr_case;

/* The reference's outputs (malloc'd by mr_run, freed by mr_free). o, lse, lse_abs and dq
 * are valid on the case's rows (mr_row_in; row blocks of 128 touching none of them are
 * NaN, others computed whole); dc_kv and dk_rope are valid for tokens >= mr_key0 (NaN
 * before); dw_kv_b is NULL unless every row was computed. */
typedef struct mr_out {
  double *o;       /* [S, H, dv] */
  double *lse;     /* [H, S] natural log, explicit family */
  double *lse_abs; /* [H, S] the absorbed form's */
  double *dq;      /* [S, H, dn + dr] */
  double *dc_kv;   /* [S, dc] */
  double *dk_rope; /* [S, dr] */
  double *dw_kv_b; /* [H (dn + dv), dc] or NULL */
} mr_out;

/* 1 when row i is in c's row set. */
int mr_row_in(const mr_case *c, int64_t i);
/* The first token whose key gradients (dc_kv, dk_rope) the reference has exactly: 0 for
 * a full run, tail0 for a causal subset run, S (none) for a non-causal subset run. */
int64_t mr_key0(const mr_case *c);

/* x rounded to the 16-bit type (rnd 1 bf16, 2 f16, 0 unchanged), round to nearest even. */
double mr_round(double x, int rnd);

/* Snaps x to the grid of step 2^-e (so products and sums of the layer's GEMMs are exact in
 * f32, and x itself exact in bf16 for |x| < 2^(8 - e)). */
double mr_quantize(double x, int e);

/* Runs the reference on q [S, H, dn + dr], c_kv [S, dc], k_rope [S, dr], w_kv_b
 * [H (dn + dv), dc], d_o [S, H, dv] (d_o NULL: forward only, no gradients). Returns 0,
 * or -1 out of memory (*out freed). */
int mr_run(const mr_case *c, const double *q, const double *c_kv, const double *k_rope,
           const double *w_kv_b, const double *d_o, mr_out *out);

void mr_free(mr_out *out);
#endif
