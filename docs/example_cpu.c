/* example_cpu.c: one whole training step of an MLA attention layer through include/mlagen.h,
 * on the host: the C API's CPU device (MLAGEN_DEVICE_CPU, f32 and f64) needs no GPU and no
 * driver, and runs the same plans and layouts as a CUDA plan (bf16, f16) does on a device.
 *
 * A small model (H 4, d_c 64, d_r 16, d_n 32, d_v 32), the LAGA form, B 1, S 16, f64,
 * causal, one rank: the caller allocates every tensor and the workspace and saved area the
 * plan asks for (mlagen_plan_sizes), runs mlagen_forward then mlagen_backward, and checks
 * o against attention written out as DeepSeek's modeling code computes it (w_kv_b is HF's
 * kv_b_proj.weight): per head h, K_nope = c_kv W_k^T and V = c_kv W_v^T with W_k, W_v the
 * rows [h (d_n + d_v), + d_n) and [+ d_n, + d_v) of w_kv_b; scores softmax_scale
 * (q_nope K_nope^T + q_rope k_rope^T), causal; o = softmax(scores) V. Prints the worst error and exits 1 if
 * it is above 1e-12.
 *
 * A CUDA plan differs in the device pointers and the stream; at sp_size > 1 the plan takes
 * the trainer's collectives (mlagen_plan_set_comm, an ncclComm_t; or
 * mlagen_plan_set_comm_ops, callbacks, which a CPU plan needs) and each rank passes its
 * own shard (mlagen_token_position).
 *
 * Build: cc example_cpu.c -I<prefix>/include -L<prefix>/lib -Wl,-rpath,<prefix>/lib
 * -lmlagen -lm (or find_package(mlagen) and link mlagen::mlagen). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlagen.h"

enum { H = 4, DC = 64, DR = 16, DN = 32, DV = 32, S = 16 };

/* A tensor of the plan's shape (mlagen_sizes) at data. */
static mlagen_tensor tensor(void *data, const mlagen_tensor_info *i) {
  mlagen_tensor t = {.data = data, .dtype = i->dtype, .ndim = i->ndim};
  memcpy(t.dims, i->dims, sizeof t.dims);
  return t;
}

/* Uniform in [-a, a) from a small LCG: inputs with a realistic spread. */
static double *random_buffer(size_t bytes, double a, uint64_t *state) {
  double *p = malloc(bytes);
  for (size_t i = 0; p && i < bytes / sizeof *p; i++) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = a * (2.0 * (double)(*state >> 11) / 9007199254740992.0 - 1.0);
  }
  return p;
}

/* o[s][h][:] by the op's definition (the comment above), float64. */
static void reference_row(const double *q, const double *c_kv, const double *k_rope,
                          const double *w, double scale, int s, int h, double *o) {
  double score[S], m = -INFINITY, sum = 0;
  const double *qh = q + ((size_t)s * H + h) * (DN + DR);
  const double *wk = w + (size_t)h * (DN + DV) * DC, *wv = wk + (size_t)DN * DC;
  for (int t = 0; t <= s; t++) { /* causal: keys 0 .. s */
    double acc = 0;
    for (int j = 0; j < DN; j++) {
      double k = 0;
      for (int c = 0; c < DC; c++) k += c_kv[(size_t)t * DC + c] * wk[(size_t)j * DC + c];
      acc += qh[j] * k;
    }
    for (int j = 0; j < DR; j++) acc += qh[DN + j] * k_rope[(size_t)t * DR + j];
    score[t] = scale * acc;
    if (score[t] > m) m = score[t];
  }
  for (int t = 0; t <= s; t++) sum += score[t] = exp(score[t] - m);
  for (int j = 0; j < DV; j++) {
    double acc = 0;
    for (int t = 0; t <= s; t++) {
      double v = 0;
      for (int c = 0; c < DC; c++) v += c_kv[(size_t)t * DC + c] * wv[(size_t)j * DC + c];
      acc += score[t] / sum * v;
    }
    o[j] = acc;
  }
}

int main(void) {
  mlagen_context *ctx = NULL;
  mlagen_model *model = NULL;
  mlagen_plan *plan = NULL;
  void *buf[10] = {0}, *workspace = NULL, *saved = NULL;
  int rc, status = 1;

  if ((rc = mlagen_context_create(&ctx))) {
    fprintf(stderr, "context: %s\n", mlagen_last_message(NULL));
    return 1;
  }
  const double scale = 1.0 / sqrt((double)(DN + DR));
  const mlagen_model_desc md = {.num_attention_heads = H, .kv_lora_rank = DC,
                                .qk_rope_head_dim = DR, .qk_nope_head_dim = DN,
                                .v_head_dim = DV, .softmax_scale = scale};
  const mlagen_plan_desc pd = {.form = MLAGEN_FORM_LAGA, .batch = 1, .seq = S, .sp_rank = 0,
                               .sp_size = 1, .causal = 1, .dtype = MLAGEN_DTYPE_F64,
                               .device = MLAGEN_DEVICE_CPU};
  mlagen_sizes z;
  if ((rc = mlagen_model_from_desc(ctx, &md, &model)) ||
      (rc = mlagen_plan_create(ctx, model, &pd, &plan)) || (rc = mlagen_plan_sizes(plan, &z))) {
    fprintf(stderr, "%s: %s\n", mlagen_status_name(rc), mlagen_last_message(ctx));
    goto done;
  }

  /* Every tensor in its own buffer (no call works in place): inputs random (scores of std
   * about 2), outputs written by the passes; the workspace and the saved area as large as
   * the plan says, 16-byte aligned (malloc's are). */
  const mlagen_tensor_info *info[10] = {&z.q, &z.c_kv, &z.k_rope, &z.w_kv_b, &z.d_o,
                                        &z.o, &z.dq, &z.dc_kv, &z.dk_rope, &z.dw_kv_b};
  const double spread[10] = {1.7, 1.0, 1.7, 0.3, 1.0, 0, 0, 0, 0, 0};
  uint64_t state = 1;
  for (int k = 0; k < 10; k++)
    if (!(buf[k] = spread[k] > 0 ? random_buffer(info[k]->bytes, spread[k], &state)
                                 : calloc(1, info[k]->bytes)))
      goto oom;
  if (!(workspace = malloc(z.workspace_bytes ? z.workspace_bytes : 1)) ||
      !(saved = malloc(z.saved_bytes ? z.saved_bytes : 1)))
    goto oom;
  const mlagen_tensors t = {.q = tensor(buf[0], &z.q), .c_kv = tensor(buf[1], &z.c_kv),
                            .k_rope = tensor(buf[2], &z.k_rope),
                            .w_kv_b = tensor(buf[3], &z.w_kv_b), .d_o = tensor(buf[4], &z.d_o),
                            .o = tensor(buf[5], &z.o), .dq = tensor(buf[6], &z.dq),
                            .dc_kv = tensor(buf[7], &z.dc_kv),
                            .dk_rope = tensor(buf[8], &z.dk_rope),
                            .dw_kv_b = tensor(buf[9], &z.dw_kv_b)};

  /* The step: the forward writes o and the saved area; the backward reads the saved area
   * (unchanged in between) and writes the four gradients. The workspace need not survive. */
  if ((rc = mlagen_forward(plan, &t, workspace, z.workspace_bytes, saved, z.saved_bytes, NULL)) ||
      (rc = mlagen_backward(plan, &t, workspace, z.workspace_bytes, saved, z.saved_bytes, NULL))) {
    fprintf(stderr, "%s: %s\n", mlagen_status_name(rc), mlagen_last_message(ctx));
    goto done;
  }

  double worst = 0, want[DV];
  const double *o = buf[5];
  for (int s = 0; s < S; s++)
    for (int h = 0; h < H; h++) {
      reference_row(buf[0], buf[1], buf[2], buf[3], scale, s, h, want);
      for (int j = 0; j < DV; j++) {
        const double e = fabs(o[((size_t)s * H + h) * DV + j] - want[j]) / (1 + fabs(want[j]));
        if (!(e <= worst)) worst = e; /* NaN too */
      }
    }
  double norm[4] = {0};
  for (int k = 0; k < 4; k++)
    for (size_t i = 0; i < info[6 + k]->bytes / sizeof(double); i++)
      norm[k] += ((const double *)buf[6 + k])[i] * ((const double *)buf[6 + k])[i];
  printf("laga, f64, B 1, S %d, H %d: workspace %zu bytes, saved %zu bytes\n", S, H,
         z.workspace_bytes, z.saved_bytes);
  printf("o against attention written out: worst |err| / (1 + |ref|) %.1e\n", worst);
  printf("gradient norms: dq %.4g, dc_kv %.4g, dk_rope %.4g, dw_kv_b %.4g\n", sqrt(norm[0]),
         sqrt(norm[1]), sqrt(norm[2]), sqrt(norm[3]));
  status = worst <= 1e-12 ? 0 : 1;
  if (status) fprintf(stderr, "o differs from the reference by %.1e\n", worst);
  goto done;
oom:
  fprintf(stderr, "out of memory\n");
done:
  for (int k = 0; k < 10; k++) free(buf[k]);
  free(workspace), free(saved);
  mlagen_plan_destroy(plan);
  mlagen_model_destroy(model);
  mlagen_context_destroy(ctx);
  return status;
}
