/* form_absorbed.c: the absorbed form (B2), MQA over the latent.
 *
 * All-to-all Q to head shards; all-gather the latent C = [c_kv ; k_rope] (d_c + d_r per
 * token); absorb W_UK into the query, q_abs[i,h] = [W_UK[h]^T q_n[i,h] ; q_r[i,h]];
 * attend with one shared latent head (keys C, values c_kv); up-project
 * o[i,h] = W_UV[h] o_lat[i,h]; all-to-all O back. The backward reduce-scatters dC.
 * Saved: q_h (for dW_UK), the gathered C, q_abs and o_lat (H/P x (d_c + d_r) and
 * H/P x d_c per token: the memory trap of this form in training) and the LSE.
 * W_UK[h] is rows h (d_n + d_v) .. + d_n of w_kv_b, W_UV[h] the next d_v rows. */
#include "form.h"

void mg_form_absorbed(mg_plan *p) {
  FORM_DIMS(p);
  form_io f = form_inputs(p);
  const int64_t uk = h0 * dkv * dc, uv = (h0 * dkv + dn) * dc, wstride = dkv * dc;

  /* ---- forward ---- */
  int q_h = mg_plan_temp(p, "q_h", T, DIMS(B, S, Hl, dqk));
  mg_plan_seq_to_head(p, f.q, q_h);
  int c_loc = mg_plan_temp(p, "c_local", T, DIMS(B, Sl, wc));
  mg_plan_kernel(p, MG_OP_CONCAT_LATENT, "c = [c_kv ; k_rope]", ARGS(f.c_kv, f.k_rope), ARGS(c_loc));
  int c = mg_plan_temp(p, "c", T, DIMS(B, S, wc));
  mg_plan_all_gather(p, c_loc, c);

  int q_abs = mg_plan_temp(p, "q_abs", T, DIMS(B, S, Hl, wc));
  mg_plan_gemm(p, "q_abs[:, h, :d_c] = q_n W_UK[h]", q_h, f.w, q_abs,
               (mg_gemm){.m = B * S, .n = dc, .k = dn, .lda = Hl * dqk, .ldb = dc, .ldc = Hl * wc,
                         .off_b = uk, .stride_a = dqk, .stride_b = wstride, .stride_c = wc,
                         .batch = (int)Hl});
  mg_step *s = mg_plan_kernel(p, MG_OP_COPY_COLS, "q_abs[:, h, d_c:] = q_r", ARGS(q_h), ARGS(q_abs));
  s->src_col = dn, s->dst_col = dc, s->cols = dr;

  int o_lat = mg_plan_temp(p, "o_lat", T, DIMS(B, S, Hl, dc));
  int lse = mg_plan_temp(p, "lse", mg_plan_acc_dtype(p), DIMS(B, Hl, S));
  mg_plan_kernel(p, MG_OP_MQA_FWD, "MQA attention over the latent", ARGS(q_abs, c), ARGS(o_lat, lse));
  int o_h = mg_plan_temp(p, "o_h", T, DIMS(B, S, Hl, dv));
  mg_plan_gemm(p, "o_h[:, h] = o_lat W_UV[h]^T", o_lat, f.w, o_h,
               (mg_gemm){.trans_b = 1, .m = B * S, .n = dv, .k = dc, .lda = Hl * dc, .ldb = dc,
                         .ldc = Hl * dv, .off_b = uv, .stride_a = dc, .stride_b = wstride,
                         .stride_c = dv, .batch = (int)Hl});
  form_output(p, o_h);

  /* ---- backward ---- */
  int do_h = form_backward(p);
  int do_lat = mg_plan_temp(p, "do_lat", T, DIMS(B, S, Hl, dc));
  mg_plan_gemm(p, "do_lat[:, h] = do_h W_UV[h]", do_h, f.w, do_lat,
               (mg_gemm){.m = B * S, .n = dc, .k = dv, .lda = Hl * dv, .ldb = dc, .ldc = Hl * dc,
                         .off_b = uv, .stride_a = dv, .stride_b = wstride, .stride_c = dc,
                         .batch = (int)Hl});
  int dw = mg_plan_output(p, "dw_kv_b", mg_plan_acc_dtype(p), DIMS(H * dkv, dc));
  mg_plan_gemm(p, "dW_UV[h] = do_h^T o_lat", do_h, o_lat, dw,
               (mg_gemm){.trans_a = 1, .m = dv, .n = dc, .k = B * S, .lda = Hl * dv,
                         .ldb = Hl * dc, .ldc = dc, .off_c = uv, .stride_a = dv, .stride_b = dc,
                         .stride_c = wstride, .batch = (int)Hl, FORM_TOK_K(p, 0)});

  int dq_abs = mg_plan_temp(p, "dq_abs", T, DIMS(B, S, Hl, wc));
  int dc_full = mg_plan_temp(p, "dc", T, DIMS(B, S, wc));
  mg_plan_kernel(p, MG_OP_MQA_BWD, "MQA attention backward", ARGS(q_abs, c, o_lat, lse, do_lat),
                 ARGS(dq_abs, dc_full));

  int dq_h = mg_plan_temp(p, "dq_h", T, DIMS(B, S, Hl, dqk));
  mg_plan_gemm(p, "dq_h[:, h, :d_n] = dq_lat W_UK[h]^T", dq_abs, f.w, dq_h,
               (mg_gemm){.trans_b = 1, .m = B * S, .n = dn, .k = dc, .lda = Hl * wc, .ldb = dc,
                         .ldc = Hl * dqk, .off_b = uk, .stride_a = wc, .stride_b = wstride,
                         .stride_c = dqk, .batch = (int)Hl});
  s = mg_plan_kernel(p, MG_OP_COPY_COLS, "dq_h[:, h, d_n:] = dq_abs[:, h, d_c:]", ARGS(dq_abs),
                     ARGS(dq_h));
  s->src_col = dc, s->dst_col = dn, s->cols = dr;
  mg_plan_gemm(p, "dW_UK[h] = q_n^T dq_lat", q_h, dq_abs, dw,
               (mg_gemm){.trans_a = 1, .m = dn, .n = dc, .k = B * S, .lda = Hl * dqk,
                         .ldb = Hl * wc, .ldc = dc, .off_c = uk, .stride_a = dqk, .stride_b = wc,
                         .stride_c = wstride, .batch = (int)Hl, FORM_TOK_K(p, 0)});

  int dq = mg_plan_output(p, "dq", T, DIMS(B, Sl, H, dqk));
  mg_plan_head_to_seq(p, dq_h, dq);
  form_latent_grad_output(p, dc_full);
}
