/* form_laga.c: LAGA (Latent All-Gather Attention, arXiv 2607.17644) and LAGA-R.
 *
 * All-to-all Q to head shards; all-gather only the latent C = [c_kv ; k_rope]; rebuild
 * K_nope and V for this rank's H/P heads over all S tokens from C and the matching rows
 * of w_kv_b; attend in explicit form; all-to-all O back. The backward runs the explicit
 * attention backward, forms dC = [sum_h W_UK[h]^T dK_n + W_UV[h]^T dV ; sum_h dK_r] over
 * this rank's heads and reduce-scatters it.
 *
 * LAGA keeps what the explicit form keeps (Q, K, V, O head-sharded, LSE) and gathers the
 * latent again in the backward, where dw_kv_b needs it (d_c + d_r per token, cheap next
 * to keeping it). LAGA-R (recompute = 1) keeps the gathered latent instead of K and V
 * and rebuilds them in the backward: less memory than explicit for one more GEMM. */
#include "form.h"

/* k_h, v_h = expand(c w_kv_b[this rank's heads]^T), as two steps. */
static void rebuild_kv(mg_plan *p, int c, int w, int k_h, int v_h, const char *kv_name) {
  FORM_DIMS(p);
  int kv_h = mg_plan_temp(p, kv_name, T, DIMS(B, S, Hl, dkv));
  mg_plan_gemm(p, "kv_h = c[:, :d_c] w_kv_b[heads]^T", c, w, kv_h,
               (mg_gemm){.trans_b = 1, .m = B * S, .n = Hl * dkv, .k = dc, .lda = wc, .ldb = dc,
                         .ldc = Hl * dkv, .off_b = h0 * dkv * dc});
  mg_step *s = mg_plan_kernel(p, MG_OP_EXPAND_KV, "k_h = [k_nope ; k_rope], v_h", ARGS(kv_h, c),
                              ARGS(k_h, v_h));
  s->rope_col = dc, s->rope_w = wc;
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

void mg_form_laga(mg_plan *p, int recompute) {
  FORM_DIMS(p);
  form_io f = form_inputs(p);

  /* ---- forward ---- */
  int q_h = mg_plan_temp(p, "q_h", T, DIMS(B, S, Hl, dqk));
  mg_plan_seq_to_head(p, f.q, q_h);
  int c = gather_latent(p, &f, "c_local", "c");
  int k_h = mg_plan_temp(p, "k_h", T, DIMS(B, S, Hl, dqk));
  int v_h = mg_plan_temp(p, "v_h", T, DIMS(B, S, Hl, dv));
  rebuild_kv(p, c, f.w, k_h, v_h, "kv_h");
  int o_h = mg_plan_temp(p, "o_h", T, DIMS(B, S, Hl, dv));
  int lse = mg_plan_temp(p, "lse", mg_plan_acc_dtype(p), DIMS(B, Hl, S));
  mg_plan_kernel(p, MG_OP_ATTN_FWD, "attention", ARGS(q_h, k_h, v_h), ARGS(o_h, lse));
  form_output(p, o_h);

  /* ---- backward ---- */
  int do_h = form_backward(p);
  int K = k_h, V = v_h;
  if (recompute) { /* LAGA-R: K and V again from the kept latent */
    K = mg_plan_temp(p, "k_h2", T, DIMS(B, S, Hl, dqk));
    V = mg_plan_temp(p, "v_h2", T, DIMS(B, S, Hl, dv));
    rebuild_kv(p, c, f.w, K, V, "kv_h2");
  }
  int dq_h = mg_plan_temp(p, "dq_h", T, DIMS(B, S, Hl, dqk));
  int dk_h = mg_plan_temp(p, "dk_h", T, DIMS(B, S, Hl, dqk));
  int dv_h = mg_plan_temp(p, "dv_h", T, DIMS(B, S, Hl, dv));
  mg_plan_kernel(p, MG_OP_ATTN_BWD, "attention backward", ARGS(q_h, K, V, o_h, lse, do_h),
                 ARGS(dq_h, dk_h, dv_h));
  int dq = mg_plan_output(p, "dq", T, DIMS(B, Sl, H, dqk));
  mg_plan_head_to_seq(p, dq_h, dq);

  int dkv_h = mg_plan_temp(p, "dkv_h", T, DIMS(B, S, Hl, dkv));
  int dc_full = mg_plan_temp(p, "dc", T, DIMS(B, S, wc));
  mg_step *s = mg_plan_kernel(p, MG_OP_SPLIT_DKV, "dkv_h = [dk_nope ; dv], dc[:, d_c:] = sum_h dk_r",
                              ARGS(dk_h, dv_h), ARGS(dkv_h, dc_full));
  s->rope_col = dc, s->rope_w = wc;
  mg_plan_gemm(p, "dc[:, :d_c] = dkv_h w_kv_b[heads]", dkv_h, f.w, dc_full,
               (mg_gemm){.m = B * S, .n = dc, .k = Hl * dkv, .lda = Hl * dkv, .ldb = dc, .ldc = wc,
                         .off_b = h0 * dkv * dc});
  int cb = recompute ? c : gather_latent(p, &f, "c_local2", "c2");
  int dw = mg_plan_output(p, "dw_kv_b", mg_plan_acc_dtype(p), DIMS(H * dkv, dc));
  mg_plan_gemm(p, "dw_kv_b[heads] = dkv_h^T c[:, :d_c]", dkv_h, cb, dw,
               (mg_gemm){.trans_a = 1, .m = Hl * dkv, .n = dc, .k = B * S, .lda = Hl * dkv,
                         .ldb = wc, .ldc = dc, .off_c = h0 * dkv * dc});

  int dc_loc = mg_plan_temp(p, "dc_local", T, DIMS(B, Sl, wc));
  mg_plan_reduce_scatter(p, dc_full, dc_loc);
  int dc_kv = mg_plan_output(p, "dc_kv", T, DIMS(B, Sl, dc));
  int dk_rope = mg_plan_output(p, "dk_rope", T, DIMS(B, Sl, dr));
  mg_plan_kernel(p, MG_OP_SPLIT_LATENT, "[dc_kv ; dk_rope] = dc", ARGS(dc_loc), ARGS(dc_kv, dk_rope));
}
