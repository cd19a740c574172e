/* form_laga_cp.c: laga-cp, all-gather context parallelism over the latent.
 *
 * Queries, outputs and their gradients stay sequence-sharded with all H heads on every
 * rank. The forward's only collective is the all-gather of the latent C = [c_kv ; k_rope]
 * (d_c + d_r values per token); the gathered shards arrive in rank order and a layout
 * kernel (MG_OP_CHUNK_ORDER) puts them in global order. Each rank then walks the H heads in
 * head_groups groups of G heads, as LAGA-F walks its H/P: per group it rebuilds that
 * group's K_nope/V over all S keys from the latent (one GEMM and expand_kv, a workspace of
 * G heads; split keys, mg_step.split_keys: the attention reads k_rope from the latent), copies the group's queries out of q and attends this rank's S_l queries over
 * all S keys (the attention step's query positions: mg_cp_pos, two chunks per rank), and
 * copies the group's O and LSE back. The backward rebuilds K/V per group likewise from the
 * kept latent, runs the attention backward, writes the group's dQ, accumulates
 * dC = [W_UK^T dK_nope + W_UV^T dV ; sum_h dK_rope] over the groups (the attention
 * backward returns the head sum of dK_rope) and writes the group's
 * rows of dw_kv_b (this rank's partial sum: the full gradient is the sum over the group,
 * as for every form); then puts dC back in rank order and reduce-scatters it. Nothing else
 * crosses the wire: (d_c + d_r)(P - 1) values per local token and pass.
 *
 * Saved: the gathered latent [B, S, d_c + d_r], the LSE [B, H, S_l] and a copy of O
 * [B, S_l, H, d_v] (the attention backward's row sums dO . O need O, and the op's
 * backward does not take o). The price is the P-fold K/V rebuild: every rank up-projects
 * all S tokens for all H heads (2 B S H (d_n + d_v) d_c FLOPs per rebuild; the forward
 * rebuilds once, the backward once more, plus its two GEMMs of the same size). With one
 * head group the steps attend the whole q, o and do directly, with no copies. */
#include <stdio.h>

#include "form.h"

/* A group's own temporary "<name><g>" [B, n, G, w] (3-D [B, G, n] when w is 0). */
static int cp_temp(mg_plan *p, const char *name, int g, int64_t n, int64_t G, int64_t w) {
  FORM_DIMS(p);
  char s[24];
  snprintf(s, sizeof s, "%s%d", name, g);
  return w ? mg_plan_temp(p, s, T, DIMS(B, n, G, w)) : mg_plan_temp(p, s, mg_plan_acc_dtype(p), DIMS(B, G, n));
}

/* dst[r, dst_col + j] = src[r, src_col + j], j < cols, over rows of src_w and dst_w
 * elements: a group's heads out of (or into) a buffer of all H heads. */
static void cp_cols(mg_plan *p, const char *label, int src, int64_t src_w, int64_t src_col,
                    int dst, int64_t dst_w, int64_t dst_col, int64_t cols) {
  mg_step *s = mg_plan_kernel(p, MG_OP_COPY_COLS, label, ARGS(src), ARGS(dst));
  s->src_w = src_w, s->src_col = src_col, s->dst_w = dst_w, s->dst_col = dst_col, s->cols = cols;
}

/* Heads [hg, hg + G) of a [rows, H, w] buffer into a [rows, G, w] one. */
static void cp_in(mg_plan *p, const char *label, int whole, int group, int64_t hg, int64_t G,
                  int64_t w) {
  cp_cols(p, label, whole, p->shape.heads * w, hg * w, group, G * w, 0, G * w);
}

/* A [rows, G, w] group buffer back into heads [hg, hg + G) of a [rows, H, w] one. */
static void cp_out(mg_plan *p, const char *label, int group, int whole, int64_t hg, int64_t G,
                   int64_t w) {
  cp_cols(p, label, group, G * w, 0, whole, p->shape.heads * w, hg * w, G * w);
}

/* This rank's query positions on attention step s: two chunks (mg_cp_pos). */
static void cp_positions(mg_plan *p, mg_step *s) {
  FORM_DIMS(p);
  const int64_t P = p->args.sp, r = p->args.rank, a = (Sl + 1) / 2;
  mg_plan_attn_positions(p, s, mg_cp_pos(P, Sl, r, 0), a, mg_cp_pos(P, Sl, r, a));
}

static int cp_order(mg_plan *p, const char *label, int src, int dst, int inverse) {
  mg_step *s = mg_plan_kernel(p, MG_OP_CHUNK_ORDER, label, ARGS(src), ARGS(dst));
  s->ranks = p->args.sp, s->inverse = inverse;
  return dst;
}

void mg_form_laga_cp(mg_plan *p) {
  FORM_DIMS(p);
  const int n_groups = p->args.head_groups, one = n_groups == 1;
  const int64_t G = H / n_groups;
  form_io f = form_inputs(p);

  /* ---- forward ---- */
  int c_loc = mg_plan_temp(p, "c_local", T, DIMS(B, Sl, wc));
  mg_plan_kernel(p, MG_OP_CONCAT_LATENT, "c = [c_kv ; k_rope]", ARGS(f.c_kv, f.k_rope), ARGS(c_loc));
  int c_rank = mg_plan_temp(p, "c_ranks", T, DIMS(B, S, wc));
  mg_plan_all_gather(p, c_loc, c_rank);
  int c = cp_order(p, "c = c_ranks in global order", c_rank,
                   mg_plan_temp(p, "c", T, DIMS(B, S, wc)), 0);
  int o_s = mg_plan_temp(p, "o_s", T, DIMS(B, Sl, H, dv)); /* O kept for the backward */
  int lse = mg_plan_temp(p, "lse", mg_plan_acc_dtype(p), DIMS(B, H, Sl));
  for (int g = 0; g < n_groups; g++) {
    const int64_t hg = g * G;
    int kv_g = cp_temp(p, "kv_g", g, S, G, dkv), k_g = cp_temp(p, "k_g", g, S, G, dn);
    int v_g = cp_temp(p, "v_g", g, S, G, dv);
    form_rebuild_kv(p, c, f.w, hg, G, kv_g, k_g, v_g, 1);
    int q_g = one ? f.q : cp_temp(p, "q_g", g, Sl, G, dqk);
    int o_g = one ? o_s : cp_temp(p, "o_g", g, Sl, G, dv);
    int lse_g = one ? lse : cp_temp(p, "lse_g", g, Sl, G, 0);
    if (!one) cp_in(p, "q_g = q[:, :, group]", f.q, q_g, hg, G, dqk);
    cp_positions(p, form_split_keys(p, mg_plan_kernel(p, MG_OP_ATTN_FWD, "attention, own queries over all keys",
                                                      ARGS(q_g, k_g, v_g, c), ARGS(o_g, lse_g))));
    if (one) continue;
    cp_out(p, "o_s[:, :, group] = o_g", o_g, o_s, hg, G, dv);
    cp_out(p, "lse[:, group] = lse_g", lse_g, lse, hg, G, Sl); /* rows of [B, H, S_l] */
  }
  int o = mg_plan_output(p, "o", T, DIMS(B, Sl, H, dv));
  mg_step *s = mg_plan_kernel(p, MG_OP_COPY_COLS, "o = o_s", ARGS(o_s), ARGS(o));
  s->cols = dv;

  /* ---- backward ---- */
  mg_plan_backward(p);
  int d_o = mg_plan_input(p, "do", T, DIMS(B, Sl, H, dv));
  int dq = mg_plan_output(p, "dq", T, DIMS(B, Sl, H, dqk));
  int dc_full = mg_plan_temp(p, "dc", T, DIMS(B, S, wc));
  int dw = mg_plan_output(p, "dw_kv_b", mg_plan_acc_dtype(p), DIMS(H * dkv, dc));
  for (int g = 0; g < n_groups; g++) {
    const int64_t hg = g * G;
    int kv_g = cp_temp(p, "kv_b", g, S, G, dkv), k_g = cp_temp(p, "k_b", g, S, G, dn);
    int v_g = cp_temp(p, "v_b", g, S, G, dv);
    form_rebuild_kv(p, c, f.w, hg, G, kv_g, k_g, v_g, 1);
    int q_g = one ? f.q : cp_temp(p, "q_b", g, Sl, G, dqk);
    int o_g = one ? o_s : cp_temp(p, "o_b", g, Sl, G, dv);
    int do_g = one ? d_o : cp_temp(p, "do_b", g, Sl, G, dv);
    int lse_g = one ? lse : cp_temp(p, "lse_b", g, Sl, G, 0);
    int dq_g = one ? dq : cp_temp(p, "dq_b", g, Sl, G, dqk);
    int dk_g = cp_temp(p, "dk_b", g, S, G, dn), dv_g = cp_temp(p, "dv_b", g, S, G, dv);
    int dkr_g = form_group_rope_grad(p, "dkr_b", g);
    int dkv_g = cp_temp(p, "dkv_b", g, S, G, dkv);
    if (!one) {
      cp_in(p, "q_g = q[:, :, group]", f.q, q_g, hg, G, dqk);
      cp_in(p, "o_g = o_s[:, :, group]", o_s, o_g, hg, G, dv);
      cp_in(p, "do_g = do[:, :, group]", d_o, do_g, hg, G, dv);
      cp_in(p, "lse_g = lse[:, group]", lse, lse_g, hg, G, Sl);
    }
    cp_positions(p, form_split_keys(p, mg_plan_kernel(p, MG_OP_ATTN_BWD, "attention backward, own queries",
                                                      ARGS(q_g, k_g, v_g, o_g, lse_g, do_g, c),
                                                      ARGS(dq_g, dk_g, dv_g, dkr_g))));
    if (!one) cp_out(p, "dq[:, :, group] = dq_g", dq_g, dq, hg, G, dqk);
    form_group_latent_grad(p, g, hg, G, dk_g, dv_g, dkr_g, dkv_g, dc_full, c, f.w, dw,
                           "dw_kv_b[group] = dkv_g^T c[:, :d_c] (partial)");
  }
  int dc_rank = cp_order(p, "dc_ranks = dc in rank order", dc_full,
                         mg_plan_temp(p, "dc_ranks", T, DIMS(B, S, wc)), 1);
  form_latent_grad_output(p, dc_rank);
}
