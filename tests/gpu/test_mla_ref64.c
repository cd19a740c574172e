/* test_mla_ref64.c: the GPU forms check's float64 reference (tests/gpu/mla_ref64.h)
 * against the CPU executor's f64 plan of the explicit form (an independent
 * implementation: plan steps, CBLAS GEMMs, scalar attention), at H 4, d_n 32, d_r 16,
 * d_v 32, d_c 64, S 300 (row blocks of 128 and a partial one), causal and not, scores
 * std about 2:
 *   - every row: o, lse, dq, dc_kv, dk_rope, dw_kv_b within 1e-10 (relative to the
 *     output's max);
 *   - rows [0, 128) and [236, 300) only: those rows of o, lse and dq and, causal, dc_kv
 *     and dk_rope of tokens >= 236 equal the full run's, earlier tokens' NaN; no dw_kv_b;
 *     non-causal: no key gradients;
 *   - without rounding the absorbed form's lse equals the explicit one (same math); with
 *     bf16 rounding and grid inputs it moves, by less than 1e-2;
 *   - mr_quantize and mr_round.
 * Exit 0 when every check passed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu_test_util.h"
#include "gpu/mla_ref64.h"

static int g_fail;
#define CHECK(cond, ...)                                \
  do {                                                  \
    if (!(cond)) {                                      \
      fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);   \
      fprintf(stderr, __VA_ARGS__);                     \
      fputc('\n', stderr);                              \
      g_fail++;                                         \
    }                                                   \
  } while (0)

static double rel(const double *a, const double *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) num = fmax(num, fabs(a[i] - b[i])), den = fmax(den, fabs(b[i]));
  return den > 0 ? num / den : num;
}

static void one(int causal) {
  const int H = 4, dn = 32, dr = 16, dv = 32, dc = 64;
  const int64_t S = 300;
  tu_case c = {.shape = tu_shape(H, dn, dr, dv, dc), .B = 1, .S = S, .causal = causal};
  c.shape.softmax_scale = 0.3; /* with N(0, 1) q, c_kv, k_rope: scores std about 2 */
  double *in[TU_N_IN] = {0};
  CHECK(!tu_inputs(&c, 7, in), "inputs");
  for (int k = 0; k < TU_N_IN; k++) /* N(0, 1) for q, c_kv, k_rope as forms_check draws */
    if (k != TU_W && k != TU_DO)
      for (int64_t i = 0; i < tu_in_numel(&c, k); i++) in[k][i] *= 2;
  tu_run r;
  mg_diag d = MG_DIAG_INIT;
  double *want[TU_N_OUT] = {0};
  CHECK(!tu_run_form(&c, MG_FORM_EXPLICIT, 1, 0, NULL, MG_F64, in, &r, &d), "cpu: %s", mg_diag_msg(&d));
  CHECK(!tu_outputs(&c, &r, want), "outputs");
  tu_run_free(&r);

  mr_case m = {.H = H, .dn = dn, .dr = dr, .dv = dv, .dc = dc, .S = S, .causal = causal,
               .scale = 0.3, .rnd = 0};
  mr_out full, part;
  CHECK(!mr_run(&m, in[TU_Q], in[TU_CKV], in[TU_KROPE], in[TU_W], in[TU_DO], &full), "mr_run");
  const double *got[TU_N_OUT] = {full.o, full.lse, full.dq, full.dc_kv, full.dk_rope, full.dw_kv_b};
  double sd = 0; /* scores' spread, for the record */
  for (int k = 0; k < TU_N_OUT; k++) {
    const double e = rel(got[k], want[k], tu_out_numel(&c, k));
    CHECK(e < 1e-10, "%s causal %d: %s differs from the CPU executor by %.3e", "full", causal,
          tu_out_names[k], e);
  }
  CHECK(rel(full.lse_abs, full.lse, H * S) < 1e-12, "absorbed lse without rounding");
  for (int64_t i = 0; i < H * S; i++) sd = fmax(sd, full.lse[i]);

  m.head1 = 128, m.tail0 = 236;
  CHECK(mr_key0(&m) == (causal ? 236 : S), "key0");
  CHECK(!mr_run(&m, in[TU_Q], in[TU_CKV], in[TU_KROPE], in[TU_W], in[TU_DO], &part), "mr_run part");
  CHECK(part.dw_kv_b == NULL, "no dw_kv_b from a subset");
  int bad = 0, nan_ok = 1;
  for (int64_t i = 0; i < S; i++) {
    const int in_set = i < 128 || i >= 236;
    for (int64_t j = 0; j < H * (dn + dr); j++) {
      const double a = part.dq[i * H * (dn + dr) + j], b = full.dq[i * H * (dn + dr) + j];
      if (in_set) bad += !(fabs(a - b) <= 1e-12 * (1 + fabs(b)));
    }
    for (int64_t h = 0; h < H; h++) {
      const double a = part.lse[h * S + i], b = full.lse[h * S + i];
      if (in_set) bad += !(fabs(a - b) <= 1e-12 * (1 + fabs(b)));
    }
    for (int64_t j = 0; j < dc; j++) {
      const double a = part.dc_kv[i * dc + j], b = full.dc_kv[i * dc + j];
      if (i >= mr_key0(&m)) bad += !(fabs(a - b) <= 1e-10 * (1 + fabs(b)));
      else nan_ok &= isnan(a);
    }
  }
  CHECK(!bad, "subset rows differ from the full run: %d elements", bad);
  CHECK(nan_ok, "key gradients before key0 are NaN");
  mr_free(&part);
  mr_free(&full);

  /* bf16 rounding on grid inputs: the absorbed lse differs from the explicit one, a little */
  for (int k = 0; k < TU_N_IN; k++)
    for (int64_t i = 0; i < tu_in_numel(&c, k); i++)
      in[k][i] = mr_round(mr_quantize(in[k][i], k == TU_W ? 10 : 4), 1);
  m.head1 = m.tail0 = 0;
  m.rnd = 1;
  CHECK(!mr_run(&m, in[TU_Q], in[TU_CKV], in[TU_KROPE], in[TU_W], NULL, &full), "mr_run fwd");
  const double e = rel(full.lse_abs, full.lse, H * S);
  CHECK(e > 0 && e < 1e-2, "bf16: absorbed vs explicit lse %.3e", e);
  CHECK(full.dc_kv == NULL && full.dw_kv_b == NULL, "forward only");
  mr_free(&full);
  printf("causal %d: ok (largest lse %.2f)\n", causal, sd);
  for (int k = 0; k < TU_N_OUT; k++) free(want[k]);
  tu_free(in, TU_N_IN);
  mg_diag_clear(&d);
}

int main(void) {
  CHECK(mr_quantize(0.53, 4) == 0.5 && mr_quantize(-0.03, 4) == 0, "quantize");
  CHECK(mr_quantize(0.04, 4) == 0.0625, "quantize up");
  CHECK(mr_round(1.0 + 1.0 / 512, 1) == 1.0 && mr_round(1.0 + 3.0 / 512, 1) == 1.0 + 1.0 / 128,
        "bf16 rounding to nearest even");
  CHECK(mr_round(1.0 + 1.0 / 4096, 2) == 1.0 && mr_round(1.0 + 1.0 / 1024, 2) == 1.0 + 1.0 / 1024,
        "f16 rounding");
  one(1);
  one(0);
  printf("test_mla_ref64: %s\n", g_fail ? "FAILED" : "ok");
  return g_fail ? 1 : 0;
}
