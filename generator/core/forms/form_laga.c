/* form_laga.c: LAGA (Latent All-Gather Attention, arXiv 2607.17644) and LAGA-R.
 *
 * All-to-all Q to head shards; all-gather only the latent C = [c_kv ; k_rope]; rebuild
 * K_nope and V for this rank's H/P heads over all S tokens from C and the matching rows
 * of w_kv_b; attend in explicit form; all-to-all O back. The backward runs the explicit
 * attention backward, forms dC = [sum_h W_UK[h]^T dK_n + W_UV[h]^T dV ; sum_h dK_r] over
 * this rank's heads and reduce-scatters it.
 *
 * Split keys (mg_step.split_keys, every form of this file and laga-cp): the rebuild writes
 * K_nope only, the attention steps read the shared k_rope from the gathered latent (its
 * columns d_c .. d_c + d_r; plain LAGA: from its copy of them) and the attention backward
 * returns dK's RoPE part summed over the heads, [B, S, d_r], which split_dkv puts into
 * dC[:, d_c:]. No per-head copy of the RoPE key (H/P x d_r per token) is ever written.
 *
 * LAGA keeps Q, K_nope, V, O head-sharded, the LSE and a contiguous copy k_rope_full
 * [B, S, d_r] of the gathered k_rope, which both attention steps read (explicit keeps K
 * with its per-head RoPE copy: LAGA keeps S (H/P - 1) d_r elements less). It gathers the
 * latent again only after the attention backward, where dw_kv_b needs it (d_c + d_r per
 * token, cheap next to keeping it): read by the attention backward, the second gather
 * would hold all S (d_c + d_r) values through it for d_r columns (V2-Lite, S 16384,
 * P 8: backward peak 94.2 MiB against 84.2). LAGA-R (recompute = 1) keeps the gathered
 * latent instead of K_nope and V and rebuilds them in the backward: less memory for one
 * more GEMM; its attention steps read k_rope from that latent.
 *
 * LAGA-F (mg_form_laga_fused, the fused expansion of issue 6) never holds K and V for all
 * of a rank's heads: it walks the H/P heads in head_groups groups of G heads and, per
 * group, rebuilds that group's K_nope/V from the gathered latent into a workspace of
 * G heads, copies the group's Q (and in the backward O, dO, LSE) out of the head-sharded
 * buffers, attends with kernels generated for G heads, and copies the group's O (dQ)
 * back. Each group's buffers are its own, freed after the group's last step, so at most
 * one group's workspace is live (plus the next group's first buffer). The backward rebuilds K/V per group likewise and
 * accumulates dC (and the RoPE sum) over the groups. Saved: Q, O (head-sharded), LSE and
 * the gathered latent, as LAGA-R; peaks drop by (1 - 1/head_groups) of the per-head K, V,
 * KV (and dK, dV, dKV) buffers. In-kernel rebuilding of K/V tiles was rejected: every
 * query tile of every head would redo the d_c x (d_n + d_v) up-projection of each key
 * tile, ~(2 d_c (d_n + d_v)) / (block_m (d_qk + d_v)) = 6.4x the attention FLOPs at
 * DeepSeek's head with block_m 64 (docs/forms.md). */
#include <stdio.h>

#include "form.h"

/* k_h (K_nope), v_h for this rank's heads, through a new kv buffer kv_name. */
static void rebuild_kv(mg_plan *p, int c, int w, int k_h, int v_h, const char *kv_name) {
  FORM_DIMS(p);
  int kv_h = mg_plan_temp(p, kv_name, T, DIMS(B, S, Hl, dkv));
  form_rebuild_kv(p, c, w, h0, Hl, kv_h, k_h, v_h, 0);
}

/* c = all-gather([c_kv ; k_rope]). */
static int gather_latent(mg_plan *p, const form_io *f, const char *local, const char *full) {
  FORM_DIMS(p);
  int c_loc = mg_plan_temp(p, local, T, DIMS(B, Sl, wc));
  mg_plan_kernel(p, MG_OP_CONCAT_LATENT, "c = [c_kv ; k_rope]", ARGS(f->c_kv, f->k_rope), ARGS(c_loc));
  int c = mg_plan_temp(p, full, T, DIMS(B, S, wc));
  mg_plan_all_gather(p, c_loc, c);
  return c;
}

/* dst[r, dst_col + j] = src[r, src_col + j], j < cols, over rows of src_w and dst_w
 * elements: one group's heads out of (or into) a head-sharded buffer, or the k_rope
 * columns out of the gathered latent. */
static void copy_heads(mg_plan *p, const char *label, int src, int64_t src_w, int64_t src_col,
                       int dst, int64_t dst_w, int64_t dst_col, int64_t cols) {
  mg_step *s = mg_plan_kernel(p, MG_OP_COPY_COLS, label, ARGS(src), ARGS(dst));
  s->src_w = src_w, s->src_col = src_col, s->dst_w = dst_w, s->dst_col = dst_col, s->cols = cols;
}

/* Marks attention step s as reading k_rope from kr: the gathered latent c itself (its
 * columns d_c.., form_split_keys) or LAGA's contiguous copy [B, S, d_r] of them. */
static void rope_from(mg_plan *p, int kr, int c, mg_step *s) {
  form_split_keys(p, s);
  if (kr != c) s->rope_col = 0, s->rope_w = p->shape.qk_rope_head_dim;
}

void mg_form_laga(mg_plan *p, int recompute) {
  FORM_DIMS(p);
  form_io f = form_inputs(p);

  /* ---- forward ---- */
  int q_h = mg_plan_temp(p, "q_h", T, DIMS(B, S, Hl, dqk));
  mg_plan_seq_to_head(p, f.q, q_h);
  int c = gather_latent(p, &f, "c_local", "c");
  int k_h = mg_plan_temp(p, "k_h", T, DIMS(B, S, Hl, dn));
  int v_h = mg_plan_temp(p, "v_h", T, DIMS(B, S, Hl, dv));
  rebuild_kv(p, c, f.w, k_h, v_h, "kv_h");
  /* LAGA: the gathered k_rope columns kept for the backward (c is freed here) */
  int kr = recompute ? c : mg_plan_temp(p, "k_rope_full", T, DIMS(B, S, dr));
  if (!recompute) copy_heads(p, "k_rope_full = c[:, d_c:]", c, wc, dc, kr, dr, 0, dr);
  int o_h = mg_plan_temp(p, "o_h", T, DIMS(B, S, Hl, dv));
  int lse = mg_plan_temp(p, "lse", mg_plan_acc_dtype(p), DIMS(B, Hl, S));
  rope_from(p, kr, c,
            mg_plan_kernel(p, MG_OP_ATTN_FWD,
                           recompute ? "attention (k_rope from c)" : "attention (k_rope from k_rope_full)",
                           ARGS(q_h, k_h, v_h, kr), ARGS(o_h, lse)));
  form_output(p, o_h);

  /* ---- backward ---- */
  int do_h = form_backward(p);
  int K = k_h, V = v_h;
  if (recompute) { /* LAGA-R: K_nope and V again from the kept latent */
    K = mg_plan_temp(p, "k_h2", T, DIMS(B, S, Hl, dn));
    V = mg_plan_temp(p, "v_h2", T, DIMS(B, S, Hl, dv));
    rebuild_kv(p, c, f.w, K, V, "kv_h2");
  }
  int dq_h = mg_plan_temp(p, "dq_h", T, DIMS(B, S, Hl, dqk));
  int dk_h = mg_plan_temp(p, "dk_h", T, DIMS(B, S, Hl, dn));
  int dv_h = mg_plan_temp(p, "dv_h", T, DIMS(B, S, Hl, dv));
  int dkr_h = mg_plan_temp(p, "dkr_h", mg_plan_acc_dtype(p), DIMS(B, S, dr));
  rope_from(p, kr, c,
            mg_plan_kernel(p, MG_OP_ATTN_BWD,
                           recompute ? "attention backward (k_rope from c)"
                                     : "attention backward (k_rope from k_rope_full)",
                           ARGS(q_h, K, V, o_h, lse, do_h, kr), ARGS(dq_h, dk_h, dv_h, dkr_h)));
  int dq = mg_plan_output(p, "dq", T, DIMS(B, Sl, H, dqk));
  mg_plan_head_to_seq(p, dq_h, dq);

  int dkv_h = mg_plan_temp(p, "dkv_h", T, DIMS(B, S, Hl, dkv));
  int dc_full = mg_plan_temp(p, "dc", T, DIMS(B, S, wc));
  form_split_keys(p, mg_plan_kernel(p, MG_OP_SPLIT_DKV, "dkv_h = [dk_nope ; dv], dc[:, d_c:] = dk_rope",
                                    ARGS(dk_h, dv_h, dkr_h), ARGS(dkv_h, dc_full)));
  mg_plan_gemm(p, "dc[:, :d_c] = dkv_h w_kv_b[heads]", dkv_h, f.w, dc_full,
               (mg_gemm){.m = B * S, .n = dc, .k = Hl * dkv, .lda = Hl * dkv, .ldb = dc, .ldc = wc,
                         .off_b = h0 * dkv * dc});
  /* LAGA: the latent again, where only dw_kv_b needs it (dK_nope, dV freed by now) */
  int cb = recompute ? c : gather_latent(p, &f, "c_local2", "c2");
  int dw = mg_plan_output(p, "dw_kv_b", mg_plan_acc_dtype(p), DIMS(H * dkv, dc));
  mg_plan_gemm(p, "dw_kv_b[heads] = dkv_h^T c[:, :d_c]", dkv_h, cb, dw,
               (mg_gemm){.trans_a = 1, .m = Hl * dkv, .n = dc, .k = B * S, .lda = Hl * dkv,
                         .ldb = wc, .ldc = dc, .off_c = h0 * dkv * dc, FORM_TOK_K(p, 0)});

  form_latent_grad_output(p, dc_full);
}

/* A group's own temporary buffer "<name><g>" [B, S, G, w] (3-D [B, G, S] when w is 0):
 * each group's buffers are distinct, so each lives only while its group runs. */
static int group_temp(mg_plan *p, const char *name, int g, int64_t G, int64_t w) {
  FORM_DIMS(p);
  char n[24];
  snprintf(n, sizeof n, "%s%d", name, g);
  return w ? mg_plan_temp(p, n, T, DIMS(B, S, G, w)) : mg_plan_temp(p, n, mg_plan_acc_dtype(p), DIMS(B, G, S));
}

void mg_form_laga_fused(mg_plan *p) {
  FORM_DIMS(p);
  const int n_groups = p->args.head_groups;
  const int64_t G = Hl / n_groups;
  form_io f = form_inputs(p);

  /* ---- forward ---- */
  int q_h = mg_plan_temp(p, "q_h", T, DIMS(B, S, Hl, dqk));
  mg_plan_seq_to_head(p, f.q, q_h);
  int c = gather_latent(p, &f, "c_local", "c");
  int o_h = mg_plan_temp(p, "o_h", T, DIMS(B, S, Hl, dv));
  int lse = mg_plan_temp(p, "lse", mg_plan_acc_dtype(p), DIMS(B, Hl, S)); /* rows of H/P S */
  for (int g = 0; g < n_groups; g++) {
    const int64_t hg = g * G;
    int kv_g = group_temp(p, "kv_g", g, G, dkv), k_g = group_temp(p, "k_g", g, G, dn);
    int v_g = group_temp(p, "v_g", g, G, dv), q_g = group_temp(p, "q_g", g, G, dqk);
    int o_g = group_temp(p, "o_g", g, G, dv), lse_g = group_temp(p, "lse_g", g, G, 0);
    form_rebuild_kv(p, c, f.w, h0 + hg, G, kv_g, k_g, v_g, 1);
    copy_heads(p, "q_g = q_h[:, :, group]", q_h, Hl * dqk, hg * dqk, q_g, G * dqk, 0, G * dqk);
    mg_step *s = form_split_keys(p, mg_plan_kernel(p, MG_OP_ATTN_FWD, "attention (group)",
                                                   ARGS(q_g, k_g, v_g, c), ARGS(o_g, lse_g)));
    s->flops *= (double)G / (double)Hl;
    copy_heads(p, "o_h[:, :, group] = o_g", o_g, G * dv, 0, o_h, Hl * dv, hg * dv, G * dv);
    copy_heads(p, "lse[:, group] = lse_g", lse_g, G * S, 0, lse, Hl * S, hg * S, G * S);
  }
  form_output(p, o_h);

  /* ---- backward ---- */
  int do_h = form_backward(p);
  int dq_h = mg_plan_temp(p, "dq_h", T, DIMS(B, S, Hl, dqk));
  int dc_full = mg_plan_temp(p, "dc", T, DIMS(B, S, wc));
  int dw = mg_plan_output(p, "dw_kv_b", mg_plan_acc_dtype(p), DIMS(H * dkv, dc));
  for (int g = 0; g < n_groups; g++) {
    const int64_t hg = g * G;
    int kv_g = group_temp(p, "kv_b", g, G, dkv), k_g = group_temp(p, "k_b", g, G, dn);
    int v_g = group_temp(p, "v_b", g, G, dv), q_g = group_temp(p, "q_b", g, G, dqk);
    int o_g = group_temp(p, "o_b", g, G, dv), do_g = group_temp(p, "do_b", g, G, dv);
    int lse_g = group_temp(p, "lse_b", g, G, 0), dq_g = group_temp(p, "dq_b", g, G, dqk);
    int dk_g = group_temp(p, "dk_b", g, G, dn), dv_g = group_temp(p, "dv_b", g, G, dv);
    int dkr_g = form_group_rope_grad(p, "dkr_b", g), dkv_g = group_temp(p, "dkv_b", g, G, dkv);
    form_rebuild_kv(p, c, f.w, h0 + hg, G, kv_g, k_g, v_g, 1);
    copy_heads(p, "q_g = q_h[:, :, group]", q_h, Hl * dqk, hg * dqk, q_g, G * dqk, 0, G * dqk);
    copy_heads(p, "o_g = o_h[:, :, group]", o_h, Hl * dv, hg * dv, o_g, G * dv, 0, G * dv);
    copy_heads(p, "do_g = do_h[:, :, group]", do_h, Hl * dv, hg * dv, do_g, G * dv, 0, G * dv);
    copy_heads(p, "lse_g = lse[:, group]", lse, Hl * S, hg * S, lse_g, G * S, 0, G * S);
    mg_step *s = form_split_keys(p, mg_plan_kernel(p, MG_OP_ATTN_BWD, "attention backward (group)",
                                                   ARGS(q_g, k_g, v_g, o_g, lse_g, do_g, c),
                                                   ARGS(dq_g, dk_g, dv_g, dkr_g)));
    s->flops *= (double)G / (double)Hl;
    copy_heads(p, "dq_h[:, :, group] = dq_g", dq_g, G * dqk, 0, dq_h, Hl * dqk, hg * dqk, G * dqk);
    form_group_latent_grad(p, g, h0 + hg, G, dk_g, dv_g, dkr_g, dkv_g, dc_full, c, f.w, dw,
                           "dw_kv_b[group] = dkv_g^T c[:, :d_c]");
  }
  int dq = mg_plan_output(p, "dq", T, DIMS(B, Sl, H, dqk));
  mg_plan_head_to_seq(p, dq_h, dq);
  form_latent_grad_output(p, dc_full);
}
