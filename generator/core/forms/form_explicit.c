/* form_explicit.c: the explicit form (B1), Megatron-Core's MLA training form.
 *
 * Up-project K_nope and V for all H heads on this rank's S/P tokens, materialize
 * K = [K_nope ; k_rope] per head, all-to-all Q, K, V from sequence shards to head
 * shards (H/P heads, all S tokens), attend, all-to-all O back. The backward mirrors it.
 * Saved: the head-sharded Q, K, V, O and the LSE, as the attention core keeps them. */
#include "form.h"

void mg_form_explicit(mg_plan *p) {
  FORM_DIMS(p);
  form_io f = form_inputs(p);

  /* ---- forward ---- */
  int kv = mg_plan_temp(p, "kv", T, DIMS(B, Sl, H, dkv));
  mg_plan_gemm(p, "kv = c_kv w_kv_b^T (all heads)", f.c_kv, f.w, kv,
               (mg_gemm){.trans_b = 1, .m = B * Sl, .n = H * dkv, .k = dc,
                         .lda = dc, .ldb = dc, .ldc = H * dkv});
  int k = mg_plan_temp(p, "k", T, DIMS(B, Sl, H, dqk));
  int v = mg_plan_temp(p, "v", T, DIMS(B, Sl, H, dv));
  mg_step *s = mg_plan_kernel(p, MG_OP_EXPAND_KV, "k = [k_nope ; k_rope], v", ARGS(kv, f.k_rope),
                              ARGS(k, v));
  s->rope_col = 0, s->rope_w = dr;

  int q_h = mg_plan_temp(p, "q_h", T, DIMS(B, S, Hl, dqk));
  int k_h = mg_plan_temp(p, "k_h", T, DIMS(B, S, Hl, dqk));
  int v_h = mg_plan_temp(p, "v_h", T, DIMS(B, S, Hl, dv));
  mg_plan_seq_to_head(p, f.q, q_h);
  mg_plan_seq_to_head(p, k, k_h);
  mg_plan_seq_to_head(p, v, v_h);

  int o_h = mg_plan_temp(p, "o_h", T, DIMS(B, S, Hl, dv));
  int lse = mg_plan_temp(p, "lse", mg_plan_acc_dtype(p), DIMS(B, Hl, S));
  mg_plan_kernel(p, MG_OP_ATTN_FWD, "attention", ARGS(q_h, k_h, v_h), ARGS(o_h, lse));
  form_output(p, o_h);

  /* ---- backward ---- */
  int do_h = form_backward(p);

  int dq_h = mg_plan_temp(p, "dq_h", T, DIMS(B, S, Hl, dqk));
  int dk_h = mg_plan_temp(p, "dk_h", T, DIMS(B, S, Hl, dqk));
  int dv_h = mg_plan_temp(p, "dv_h", T, DIMS(B, S, Hl, dv));
  mg_plan_kernel(p, MG_OP_ATTN_BWD, "attention backward", ARGS(q_h, k_h, v_h, o_h, lse, do_h),
                 ARGS(dq_h, dk_h, dv_h));

  int dq = mg_plan_output(p, "dq", T, DIMS(B, Sl, H, dqk));
  int dk = mg_plan_temp(p, "dk", T, DIMS(B, Sl, H, dqk));
  int d_v = mg_plan_temp(p, "dv", T, DIMS(B, Sl, H, dv));
  mg_plan_head_to_seq(p, dq_h, dq);
  mg_plan_head_to_seq(p, dk_h, dk);
  mg_plan_head_to_seq(p, dv_h, d_v);

  int dkv_b = mg_plan_temp(p, "dkv", T, DIMS(B, Sl, H, dkv));
  int dk_rope = mg_plan_output(p, "dk_rope", T, DIMS(B, Sl, dr));
  s = mg_plan_kernel(p, MG_OP_SPLIT_DKV, "dkv = [dk_nope ; dv], dk_rope = sum_h dk_r",
                     ARGS(dk, d_v), ARGS(dkv_b, dk_rope));
  s->rope_col = 0, s->rope_w = dr;

  int dc_kv = mg_plan_output(p, "dc_kv", T, DIMS(B, Sl, dc));
  mg_plan_gemm(p, "dc_kv = dkv w_kv_b", dkv_b, f.w, dc_kv,
               (mg_gemm){.m = B * Sl, .n = dc, .k = H * dkv, .lda = H * dkv, .ldb = dc, .ldc = dc});
  int dw = mg_plan_output(p, "dw_kv_b", mg_plan_acc_dtype(p), DIMS(H * dkv, dc));
  mg_plan_gemm(p, "dw_kv_b = dkv^T c_kv (local tokens)", dkv_b, f.c_kv, dw,
               (mg_gemm){.trans_a = 1, .m = H * dkv, .n = dc, .k = B * Sl,
                         .lda = H * dkv, .ldb = dc, .ldc = dc, FORM_TOK_K(p, p->args.rank * Sl)});
}
