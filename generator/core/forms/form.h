/* form.h: shorthand shared by the form files (generator/core/forms/), so each reads as
 * the list of steps it is. Not a public header. */
#ifndef MG_FORM_H
#define MG_FORM_H
#include <stdio.h>

#include "forms.h"
#include "mg_plan_builder.h"

/* The dimensions every form uses, from the plan (docs/forms.md notation). */
#define FORM_DIMS(p)                                                                    \
  const int64_t B = (p)->args.batch, S = (p)->args.seq, Sl = (p)->seq_local;           \
  const int64_t H = (p)->shape.heads, Hl = (p)->heads_local;                            \
  const int64_t dn = (p)->shape.qk_nope_head_dim, dr = (p)->shape.qk_rope_head_dim;    \
  const int64_t dv = (p)->shape.v_head_dim, dc = (p)->shape.kv_lora_rank;              \
  const int64_t dqk = dn + dr, wc = dc + dr, dkv = dn + dv;                              \
  const int64_t h0 = (int64_t)(p)->args.rank * Hl; /* this rank's first head */        \
  const mg_dtype T = (p)->args.dtype;                                                   \
  (void)B, (void)S, (void)Sl, (void)H, (void)Hl, (void)dn, (void)dr, (void)dv, (void)dc; \
  (void)dqk, (void)wc, (void)dkv, (void)h0, (void)T

/* The designated initializers that mark a weight-gradient GEMM, whose k runs over token
 * rows starting at global position tok0 (mg_gemm.tok_k): set on varlen plans only. Every
 * such GEMM contracts the tokens in global order (a rank's own S_l at r S_l, or all S
 * from 0: the gathered latent and the head-sharded buffers hold them so, laga-cp's after
 * its chunk reordering). */
#define FORM_TOK_K(p, tok0_) .tok_k = (p)->args.varlen != 0, .tok0 = (p)->args.varlen ? (tok0_) : 0

#define DIMS(...) (sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__}
#define ARGS(...) ((const int[]){__VA_ARGS__, -1})
#define NONE ((const int[]){-1})

/* The op's inputs, outputs and weight gradient, the same in every form (docs/forms.md). */
typedef struct form_io {
  int q, c_kv, k_rope, w; /* forward inputs */
  int o;                  /* forward output */
} form_io;

static inline form_io form_inputs(mg_plan *p) {
  FORM_DIMS(p);
  form_io f;
  f.q = mg_plan_input(p, "q", T, DIMS(B, Sl, H, dqk));
  f.c_kv = mg_plan_input(p, "c_kv", T, DIMS(B, Sl, dc));
  f.k_rope = mg_plan_input(p, "k_rope", T, DIMS(B, Sl, dr));
  f.w = mg_plan_input(p, "w_kv_b", T, DIMS(H * dkv, dc));
  f.o = -1;
  return f;
}

/* o = all-to-all of the head-sharded o_h back to sequence shards: the forward's output. */
static inline int form_output(mg_plan *p, int o_h) {
  FORM_DIMS(p);
  int o = mg_plan_output(p, "o", T, DIMS(B, Sl, H, dv));
  mg_plan_head_to_seq(p, o_h, o);
  return o;
}

/* Starts the backward: the input do, all-to-all to head shards; returns do_h. */
static inline int form_backward(mg_plan *p) {
  FORM_DIMS(p);
  mg_plan_backward(p);
  int d_o = mg_plan_input(p, "do", T, DIMS(B, Sl, H, dv));
  int do_h = mg_plan_temp(p, "do_h", T, DIMS(B, S, Hl, dv));
  mg_plan_seq_to_head(p, d_o, do_h);
  return do_h;
}
/* The latent gradient dc [B, S, d_c + d_r] (summed over this rank's heads, all S tokens)
 * reduce-scattered to this rank's tokens and split into the outputs dc_kv and dk_rope:
 * the end of every latent-gathering form's backward. */
static inline void form_latent_grad_output(mg_plan *p, int dc_full) {
  FORM_DIMS(p);
  int dc_loc = mg_plan_temp(p, "dc_local", T, DIMS(B, Sl, wc));
  mg_plan_reduce_scatter(p, dc_full, dc_loc);
  int dc_kv = mg_plan_output(p, "dc_kv", T, DIMS(B, Sl, dc));
  int dk_rope = mg_plan_output(p, "dk_rope", T, DIMS(B, Sl, dr));
  mg_plan_kernel(p, MG_OP_SPLIT_LATENT, "[dc_kv ; dk_rope] = dc", ARGS(dc_loc), ARGS(dc_kv, dk_rope));
}

/* Marks step s (attention, expand_kv or split_dkv) as running with split keys
 * (mg_step.split_keys): the shared RoPE key is columns d_c .. d_c + d_r of the gathered
 * latent c [B, S, d_c + d_r]. Returns s. */
static inline mg_step *form_split_keys(mg_plan *p, mg_step *s) {
  FORM_DIMS(p);
  s->split_keys = 1, s->rope_col = dc, s->rope_w = wc;
  return s;
}

/* kv = c[:, :d_c] w_kv_b[heads h .. h + G)^T [B, S, G, d_n + d_v] from the gathered latent
 * c [B, S, d_c + d_r], then k_nope [B, S, G, d_n] and v from it (split keys: the attention
 * reads k_rope from c), as two steps; h is the global first head; labels for one head group
 * (group != 0) or this rank's heads. */
static inline void form_rebuild_kv(mg_plan *p, int c, int w, int64_t h, int64_t G, int kv,
                                   int k_nope, int v, int group) {
  FORM_DIMS(p);
  mg_plan_gemm(p, group ? "kv_g = c[:, :d_c] w_kv_b[group]^T" : "kv_h = c[:, :d_c] w_kv_b[heads]^T",
               c, w, kv,
               (mg_gemm){.trans_b = 1, .m = B * S, .n = G * dkv, .k = dc, .lda = wc, .ldb = dc,
                         .ldc = G * dkv, .off_b = h * dkv * dc});
  form_split_keys(p, mg_plan_kernel(p, MG_OP_EXPAND_KV, group ? "k_nope_g, v_g = kv_g" : "k_nope_h, v_h = kv_h",
                                    ARGS(kv), ARGS(k_nope, v)));
}

/* Head group g's (global heads h .. h + G) gradients through the latent, from its
 * attention-backward dk_g [B, S, G, d_n] (dK_nope), dv_g [B, S, G, d_v] and dkr_g
 * [B, S, d_r] (dK's RoPE part summed over the group's heads): dkv_g = [dk_nope ; dv],
 * dc[:, d_c:] (+)= dkr_g, dc[:, :d_c] (+)= dkv_g w_kv_b[group] into dc_full
 * [B, S, d_c + d_r] (set by group 0, added by the others), and dw_kv_b[group] = dkv_g^T
 * c[:, :d_c] into dw [H d_kv, d_c] (step label dw_label). */
static inline void form_group_latent_grad(mg_plan *p, int g, int64_t h, int64_t G, int dk_g,
                                          int dv_g, int dkr_g, int dkv_g, int dc_full, int c,
                                          int w, int dw, const char *dw_label) {
  FORM_DIMS(p);
  mg_step *s = mg_plan_kernel(p, MG_OP_SPLIT_DKV,
                              g ? "dkv_g = [dk_nope ; dv], dc[:, d_c:] += dk_rope_g"
                                : "dkv_g = [dk_nope ; dv], dc[:, d_c:] = dk_rope_g",
                              ARGS(dk_g, dv_g, dkr_g), ARGS(dkv_g, dc_full));
  form_split_keys(p, s)->accumulate = g > 0;
  mg_plan_gemm(p, g ? "dc[:, :d_c] += dkv_g w_kv_b[group]" : "dc[:, :d_c] = dkv_g w_kv_b[group]",
               dkv_g, w, dc_full,
               (mg_gemm){.m = B * S, .n = dc, .k = G * dkv, .lda = G * dkv, .ldb = dc, .ldc = wc,
                         .off_b = h * dkv * dc, .beta = g > 0});
  mg_plan_gemm(p, dw_label, dkv_g, c, dw,
               (mg_gemm){.trans_a = 1, .m = G * dkv, .n = dc, .k = B * S, .lda = G * dkv,
                         .ldb = wc, .ldc = dc, .off_c = h * dkv * dc, FORM_TOK_K(p, 0)});
}

/* A group's RoPE key gradient "<name><g>" [B, S, d_r] in the accumulators' dtype (the
 * attention backward sums it over the group's heads in fp32). */
static inline int form_group_rope_grad(mg_plan *p, const char *name, int g) {
  FORM_DIMS(p);
  char n[24];
  snprintf(n, sizeof n, "%s%d", name, g);
  return mg_plan_temp(p, n, mg_plan_acc_dtype(p), DIMS(B, S, dr));
}
#endif
