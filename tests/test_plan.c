/* test_plan.c: the plans of the six forms, the planner's figures and the plan checker.
 *
 * The explicit form's bytes are checked against sums written out here from MLA.md's
 * conventions; the other forms against the relations the LAGA paper (arXiv 2607.17644)
 * reports at DeepSeek-V3 scale. Varlen plans (packed sequences): the argument rules, the
 * tok_k marks of every weight-gradient GEMM, and attention FLOPs per document pair against
 * a brute-force count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mg_config.h"
#include "mg_plan.h"
#include "mg_plan_check.h"
#include "mlagen.h"

static mg_shape load(const char *model) {
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  if (mg_config_load(model, &s, &d)) fail_msg("%s", mg_diag_msg(&d));
  return s;
}

static void build(mg_plan *p, const mg_shape *s, mg_form f, int P, int B, int64_t S, int causal,
                  mg_dtype t, mg_plan_cost *c) {
  mg_plan_args a = {.shape = s, .form = f, .sp = P, .rank = P - 1, .batch = B, .seq = S,
                    .causal = causal, .dtype = t};
  mg_diag d = MG_DIAG_INIT;
  if (mg_plan_build(p, &a, &d)) fail_msg("%s", mg_diag_msg(&d));
  mg_plan_cost_of(p, c);
}

static mg_plan plan; /* large: keep off the stack */

/* DeepSeek-V3, S = 16384, P = 8, bf16: every explicit figure from first principles. */
static void test_explicit_v3_figures(void **state) {
  (void)state;
  mg_shape s = load("deepseek-v3");
  mg_plan_cost c;
  build(&plan, &s, MG_FORM_EXPLICIT, 8, 1, 16384, 1, MG_BF16, &c);
  const int64_t P = 8, S = 16384, Sl = S / P, H = 128, Hl = H / P, dqk = 192, dv = 128, e = 2;
  /* forward: all-to-all Q, K (rope expanded per head), V, and O back: (P-1)/P of each */
  const int64_t a2a = (Sl * H * dqk * e) / P * (P - 1) * 2 + (Sl * H * dv * e) / P * (P - 1) * 2;
  assert_int_equal(c.sent_fwd, a2a);
  assert_int_equal(c.sent_fwd, 293601280);
  /* backward: all-to-all dO in, dQ, dK, dV out: the same volumes */
  assert_int_equal(c.sent_bwd, a2a);
  /* saved: head-sharded Q, K, V, O (bf16) and the fp32 LSE */
  const int64_t saved = S * Hl * (dqk + dqk + dv + dv) * e + Hl * S * 4;
  assert_int_equal(c.saved, saved);
  /* attention FLOPs, FlashMLA's convention, causal pairs S (S + 1) / 2 */
  const double pairs = (double)S * (S + 1) / 2;
  assert_true(c.attn_flops_fwd == 2.0 * Hl * pairs * (dqk + dv));
  assert_true(c.attn_flops_bwd == 2.0 * Hl * pairs * (3 * dqk + 2 * dv));
  /* up-projection of all heads on local tokens; backward dc_kv and dw_kv_b */
  assert_true(c.gemm_flops_fwd == 2.0 * Sl * H * 256 * 512);
  assert_true(c.gemm_flops_bwd == 2 * c.gemm_flops_fwd);
  assert_true(c.peak_fwd >= c.saved && c.peak_bwd >= c.saved);
}

/* The relations the LAGA paper reports, at DeepSeek-V3 scale (S = 16384, P = 8). */
static void test_forms_relations_v3(void **state) {
  (void)state;
  mg_shape s = load("deepseek-v3");
  mg_plan_cost c[MG_FORM_COUNT];
  for (int f = 0; f < MG_FORM_COUNT; f++) build(&plan, &s, (mg_form)f, 8, 1, 16384, 1, MG_BF16, &c[f]);
  const mg_plan_cost *ex = &c[MG_FORM_EXPLICIT], *ab = &c[MG_FORM_ABSORBED],
                     *la = &c[MG_FORM_LAGA], *lr = &c[MG_FORM_LAGA_R];
  /* absorbed keeps more than explicit: its H/P x d_c intermediates */
  assert_true(ab->saved > ex->saved * 3 / 2);
  /* LAGA keeps what explicit keeps but for the per-head copy of the RoPE key (split keys:
   * K_nope [S, H/P, d_n] instead of K [S, H/P, d_n + d_r], bf16), plus the one gathered
   * k_rope [S, d_r] its attention backward reads; LAGA-R keeps less still */
  assert_int_equal(ex->saved - la->saved, (int64_t)16384 * (128 / 8) * 64 * 2 - (int64_t)16384 * 64 * 2);
  assert_true(lr->saved < la->saved);
  assert_true(la->peak_fwd < ex->peak_fwd && la->peak_bwd < ex->peak_bwd);
  /* LAGA gathers the latent again only after its attention backward (for dw_kv_b): its
   * backward peak stays below LAGA-R's, which holds the latent through the whole backward */
  assert_true(la->peak_bwd < lr->peak_bwd);
  /* LAGA and absorbed send about half of what explicit sends (laga-cp: test_laga_cp) */
  for (int f = MG_FORM_ABSORBED; f <= MG_FORM_LAGA_F; f++) {
    double sent = (double)(c[f].sent_fwd + c[f].sent_bwd) / (double)(ex->sent_fwd + ex->sent_bwd);
    print_message("  %-8s sent %.3f x explicit, saved %.3f x\n", mg_form_name((mg_form)f), sent,
                  (double)c[f].saved / (double)ex->saved);
    assert_true(sent > 0.45 && sent < 0.65);
  }
  /* LAGA-F keeps what LAGA-R keeps and, never holding all heads' K/V, peaks lower in the
   * backward (both forward peaks are the all-to-all of Q, with its staging); it computes
   * the same FLOPs as LAGA-R */
  const mg_plan_cost *lf = &c[MG_FORM_LAGA_F];
  assert_int_equal(lf->saved, lr->saved);
  assert_true(lf->peak_fwd <= lr->peak_fwd && lf->peak_bwd < lr->peak_bwd);
  assert_true(lf->attn_flops_fwd == lr->attn_flops_fwd && lf->attn_flops_bwd == lr->attn_flops_bwd);
  assert_true(lf->gemm_flops_fwd == lr->gemm_flops_fwd && lf->gemm_flops_bwd == lr->gemm_flops_bwd);
  print_message("  laga-f (8 groups of 2 heads) peaks %.1f / %.1f MiB, laga-r %.1f / %.1f MiB\n",
                lf->peak_fwd / 1048576.0, lf->peak_bwd / 1048576.0, lr->peak_fwd / 1048576.0,
                lr->peak_bwd / 1048576.0);
  /* LAGA-R recomputes K/V: one more up-projection GEMM in the backward */
  assert_true(lr->gemm_flops_bwd > la->gemm_flops_bwd);
  assert_true(la->attn_flops_fwd == ex->attn_flops_fwd);
}

/* P = 1: collectives are copies; nothing is sent and no workspace is needed, but for the
 * attention backward's delta (f32 [B, H, S] of the step's queries, mg_plan_kernel). */
static void test_single_rank(void **state) {
  (void)state;
  mg_shape s = load("deepseek-v2-lite");
  for (int f = 0; f < MG_FORM_COUNT; f++) {
    mg_plan_cost c;
    build(&plan, &s, (mg_form)f, 1, 2, 100, 0, MG_F32, &c);
    assert_int_equal(c.sent_fwd + c.sent_bwd, 0);
    for (int i = 0; i < plan.n_steps; i++) {
      const mg_step *st = &plan.steps[i];
      int64_t want = 0;
      if (st->kind == MG_STEP_KERNEL && (st->op == MG_OP_ATTN_BWD || st->op == MG_OP_MQA_BWD)) {
        const mg_plan_buf *q = &plan.bufs[st->in[0]];
        want = 4 * q->dims[0] * q->dims[1] * q->dims[2];
        assert_int_equal(q->dims[0], 2);
        assert_int_equal(q->dims[1], 100);
      }
      assert_int_equal(st->workspace, want);
    }
  }
}

/* Every plan is well formed: inputs never written, every other buffer written before it
 * is read, steps of the forward before those of the backward, outputs where MLA.md puts
 * them, with MLA.md's shapes. */
static void test_plans_well_formed(void **state) {
  (void)state;
  mg_shape s = load("kimi-k2");
  const int P = 4, B = 2;
  const int64_t S = 64, Sl = S / P;
  for (int f = 0; f < MG_FORM_COUNT; f++) {
    mg_plan_cost c;
    build(&plan, &s, (mg_form)f, P, B, S, 1, MG_BF16, &c);
    assert_true(plan.n_fwd > 0 && plan.n_fwd < plan.n_steps);
    for (int i = 0; i < plan.n_steps; i++)
      assert_int_equal(plan.steps[i].pass, i < plan.n_fwd ? MG_FWD : MG_BWD);
    struct { const char *name; mg_buf_role role; int ndim; int64_t dims[4]; } io[] = {
        {"q", MG_BUF_INPUT, 4, {B, Sl, 64, 192}},     {"c_kv", MG_BUF_INPUT, 3, {B, Sl, 512}},
        {"k_rope", MG_BUF_INPUT, 3, {B, Sl, 64}},     {"w_kv_b", MG_BUF_INPUT, 2, {64 * 256, 512}},
        {"do", MG_BUF_INPUT, 4, {B, Sl, 64, 128}},    {"o", MG_BUF_OUTPUT, 4, {B, Sl, 64, 128}},
        {"dq", MG_BUF_OUTPUT, 4, {B, Sl, 64, 192}},   {"dc_kv", MG_BUF_OUTPUT, 3, {B, Sl, 512}},
        {"dk_rope", MG_BUF_OUTPUT, 3, {B, Sl, 64}},   {"dw_kv_b", MG_BUF_OUTPUT, 2, {64 * 256, 512}},
        {"lse", MG_BUF_TEMP, 3, {B, 16, S}},
    };
    if (f == MG_FORM_LAGA_CP) /* all heads, this rank's queries */
      io[sizeof io / sizeof io[0] - 1].dims[1] = 64, io[sizeof io / sizeof io[0] - 1].dims[2] = Sl;
    for (size_t i = 0; i < sizeof io / sizeof io[0]; i++) {
      int b = mg_plan_find(&plan, io[i].name);
      if (b < 0) fail_msg("%s: no buffer %s", mg_form_name((mg_form)f), io[i].name);
      assert_int_equal(plan.bufs[b].role, io[i].role);
      assert_int_equal(plan.bufs[b].ndim, io[i].ndim);
      assert_memory_equal(plan.bufs[b].dims, io[i].dims, sizeof(int64_t) * (size_t)io[i].ndim);
    }
    for (int i = 0; i < plan.n_bufs; i++) {
      const mg_plan_buf *b = &plan.bufs[i];
      if (b->role == MG_BUF_INPUT) continue;
      assert_true(b->first >= 0 && b->last >= b->first);
    }
    /* keys: explicit attends packed per-head K (d_n + d_r), every LAGA form split keys:
     * K_nope d_n wide, k_rope from the latent (the last input), dk_rope [B, S, d_r] summed
     * over the heads in the accumulators' dtype; expand_kv and split_dkv alike */
    int n_attn = 0;
    for (int i = 0; i < plan.n_steps; i++) {
      const mg_step *st = &plan.steps[i];
      if (st->kind != MG_STEP_KERNEL) continue;
      const int split = f == MG_FORM_LAGA || f == MG_FORM_LAGA_R || f == MG_FORM_LAGA_F ||
                        f == MG_FORM_LAGA_CP;
      if (st->op == MG_OP_MQA_FWD || st->op == MG_OP_MQA_BWD || st->op == MG_OP_COPY_COLS ||
          st->op == MG_OP_CONCAT_LATENT || st->op == MG_OP_SPLIT_LATENT || st->op == MG_OP_CHUNK_ORDER) {
        assert_int_equal(st->split_keys, 0);
        continue;
      }
      assert_int_equal(st->split_keys, split);
      const mg_plan_buf *k = &plan.bufs[st->op == MG_OP_EXPAND_KV ? st->out[0] : st->op == MG_OP_SPLIT_DKV ? st->in[0] : st->in[1]];
      assert_int_equal(k->dims[3], split ? 128 : 192);
      if (st->op == MG_OP_ATTN_FWD || st->op == MG_OP_ATTN_BWD) n_attn++;
      if (split && (st->op == MG_OP_ATTN_FWD || st->op == MG_OP_ATTN_BWD)) {
        /* k_rope from the latent's columns d_c.., or (LAGA) from its kept copy [B, S, d_r] */
        const mg_plan_buf *lat = &plan.bufs[st->in[st->n_in - 1]];
        const int copy = f == MG_FORM_LAGA;
        assert_int_equal(lat->dims[2], copy ? 64 : 512 + 64);
        assert_int_equal(st->rope_col, copy ? 0 : 512);
        assert_int_equal(st->rope_w, copy ? 64 : 512 + 64);
      }
      if (split && st->op == MG_OP_ATTN_BWD) {
        const mg_plan_buf *dkr = &plan.bufs[st->out[3]];
        assert_int_equal(dkr->ndim, 3);
        assert_int_equal(dkr->dims[1], S);
        assert_int_equal(dkr->dims[2], 64);
        assert_int_equal(dkr->dtype, MG_F32);
      }
    }
    assert_int_equal(n_attn > 0, f != MG_FORM_ABSORBED);
    /* the forward output is written in the forward, the gradients in the backward */
    assert_true(plan.bufs[mg_plan_find(&plan, "o")].first < plan.n_fwd);
    assert_true(plan.bufs[mg_plan_find(&plan, "dq")].first >= plan.n_fwd);
  }
}

/* laga-f: head groups chosen by default or by the caller; more groups never raise a
 * peak; one group's workspace is what the peaks add over the kept buffers. */
static void test_laga_fused_groups(void **state) {
  (void)state;
  mg_shape s = load("deepseek-v3"); /* H = 128 */
  assert_int_equal(mg_plan_default_head_groups(16), 8);
  assert_int_equal(mg_plan_default_head_groups(128), 8);
  assert_int_equal(mg_plan_default_head_groups(6), 6);
  assert_int_equal(mg_plan_default_head_groups(1), 1);
  assert_int_equal(mg_plan_default_head_groups(11), 1);
  mg_diag d = MG_DIAG_INIT;
  int64_t prev_f = INT64_MAX, prev_b = 0;
  const int groups[] = {1, 2, 4, 8, 16};
  for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
    mg_plan_args a = {.shape = &s, .form = MG_FORM_LAGA_F, .sp = 8, .rank = 3, .batch = 1,
                      .seq = 4096, .causal = 1, .dtype = MG_BF16, .head_groups = groups[i]};
    assert_int_equal(mg_plan_build(&plan, &a, &d), 0);
    assert_int_equal(plan.args.head_groups, groups[i]);
    mg_plan_cost c;
    mg_plan_cost_of(&plan, &c);
    /* the forward only gets smaller workspaces; the backward also holds dq_h, dc and
     * dw_kv_b from the first group on (a single group writes them after attending), so
     * its peak may exceed one group's by at most those three */
    assert_true(c.peak_fwd <= prev_f);
    if (i == 0) prev_b = c.peak_bwd;
    const int64_t early = mg_plan_buf_bytes(&plan.bufs[mg_plan_find(&plan, "dq_h")]) +
                          mg_plan_buf_bytes(&plan.bufs[mg_plan_find(&plan, "dc")]) +
                          mg_plan_buf_bytes(&plan.bufs[mg_plan_find(&plan, "dw_kv_b")]);
    assert_true(c.peak_bwd <= prev_b + early);
    print_message("  laga-f S 4096, %2d groups: peaks %.1f / %.1f MiB\n", groups[i],
                  c.peak_fwd / 1048576.0, c.peak_bwd / 1048576.0);
    prev_f = c.peak_fwd;
    int n_attn = 0;
    for (int k = 0; k < plan.n_steps; k++) n_attn += plan.steps[k].op == MG_OP_ATTN_FWD && plan.steps[k].kind == MG_STEP_KERNEL;
    assert_int_equal(n_attn, groups[i]);
    /* the group workspace: K, V and KV of 16 / groups heads */
    const int b = mg_plan_find(&plan, "k_g0");
    assert_int_equal(plan.bufs[b].dims[2], 16 / groups[i]);
  }
  /* the default, and the most groups at P = 1 (128 heads, 16 groups) fit the plan */
  mg_plan_args a = {.shape = &s, .form = MG_FORM_LAGA_F, .sp = 1, .rank = 0, .batch = 1,
                    .seq = 64, .causal = 1, .dtype = MG_BF16, .head_groups = 16};
  assert_int_equal(mg_plan_build(&plan, &a, &d), 0);
  a.head_groups = 0;
  assert_int_equal(mg_plan_build(&plan, &a, &d), 0);
  assert_int_equal(plan.args.head_groups, 8);
  /* refusals */
  struct { mg_form f; int groups; const char *msg; } bad[] = {
      {MG_FORM_LAGA_F, 3, "head_groups = 3 must divide H / P = 128"},
      {MG_FORM_LAGA_F, 32, "head_groups = 32 must divide"},
      {MG_FORM_LAGA_F, -1, "head_groups = -1 must divide"},
      {MG_FORM_LAGA, 2, "head_groups = 2: only the fused LAGA form (laga-f) and laga-cp have head groups"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    a.form = bad[i].f, a.head_groups = bad[i].groups;
    assert_int_equal(mg_plan_build(&plan, &a, &d), MLAGEN_EINVAL);
    if (!strstr(mg_diag_msg(&d), bad[i].msg)) fail_msg("'%s' not in: %s", bad[i].msg, mg_diag_msg(&d));
  }
  mg_diag_clear(&d);
}

static void test_bad_arguments(void **state) {
  (void)state;
  mg_shape s = load("deepseek-v2-lite"); /* H = 16 */
  mg_diag d = MG_DIAG_INIT;
  struct { int P, rank, B; int64_t S; const char *msg; } bad[] = {
      {3, 0, 1, 96, "does not divide num_attention_heads = 16"},
      {32, 0, 1, 64, "exceeds num_attention_heads = 16"},
      {4, 0, 1, 66, "not divisible by sp = 4"},
      {4, 4, 1, 64, "rank = 4 is outside [0, sp = 4)"},
      {0, 0, 1, 64, "sp = 0"},
      {2, 0, 0, 64, "batch = 0"},
      {2, 0, 1, 0, "seq = 0"},
      {2, 0, 1 << 20, (int64_t)1 << 40, "would exceed 2^56 bytes"}, /* sizes past int64 */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mg_plan_args a = {.shape = &s, .form = MG_FORM_LAGA, .sp = bad[i].P, .rank = bad[i].rank,
                      .batch = bad[i].B, .seq = bad[i].S, .causal = 1, .dtype = MG_BF16};
    assert_int_equal(mg_plan_build(&plan, &a, &d), MLAGEN_EINVAL);
    if (!strstr(mg_diag_msg(&d), bad[i].msg)) fail_msg("'%s' not in: %s", bad[i].msg, mg_diag_msg(&d));
  }
  mg_diag_clear(&d);
  mg_form f;
  assert_int_equal(mg_form_parse("laga-r", &f), 0);
  assert_int_equal(f, MG_FORM_LAGA_R);
  assert_int_equal(mg_form_parse("laga-f", &f), 0);
  assert_int_equal(f, MG_FORM_LAGA_F);
  assert_int_equal(mg_form_parse("laga-cp", &f), 0);
  assert_int_equal(f, MG_FORM_LAGA_CP);
  assert_int_equal(mg_form_parse("flash", &f), -1);
}

/* Sizes whose products pass int64 (`plan --seq 1099511627776 --batch 1048576`, and the
 * extremes the API accepts) are refused by a checked bound before any form multiplies
 * dims (the forms used to compute B*S*H*w and the backward's delta workspace in signed
 * int64 first, undefined behaviour the fuzzers' UBSan build reports). Every form, every
 * extreme; the largest plan just under the bound still builds. */
static void test_huge_sizes_checked(void **state) {
  (void)state;
  mg_shape s = load("deepseek-v3"); /* H = 128 */
  mg_diag d = MG_DIAG_INIT;
  struct { int B; int64_t S; } huge[] = {
      {1 << 20, (int64_t)1 << 40}, {2147483647, (int64_t)1 << 62}, {1, INT64_MAX},
      {2147483647, INT64_MAX - 7}, {1, (int64_t)1 << 46},
  };
  for (int f = 0; f < MG_FORM_COUNT; f++)
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
      mg_plan_args a = {.shape = &s, .form = (mg_form)f, .sp = 1, .rank = 0, .batch = huge[i].B,
                        .seq = huge[i].S, .causal = 1, .dtype = MG_F64};
      assert_int_equal(mg_plan_build(&plan, &a, &d), MLAGEN_EINVAL);
      if (!strstr(mg_diag_msg(&d), "x the model's widths would exceed 2^56 bytes"))
        fail_msg("%s B %d S %lld: %s", mg_form_name((mg_form)f), huge[i].B,
                 (long long)huge[i].S, mg_diag_msg(&d));
    }
  mg_diag_clear(&d);
  /* a long but representable sequence still plans, with finite figures */
  mg_plan_args a = {.shape = &s, .form = MG_FORM_EXPLICIT, .sp = 8, .rank = 0, .batch = 1,
                    .seq = (int64_t)1 << 30, .causal = 1, .dtype = MG_BF16};
  assert_int_equal(mg_plan_build(&plan, &a, &d), 0);
  mg_plan_cost c;
  mg_plan_cost_of(&plan, &c);
  assert_true(c.peak_bwd > 0 && c.peak_fwd > 0 && c.sent_fwd > 0);
}

/* ---- the plan checker (mg_plan_check.h) ------------------------------------------------ */

static mg_plan bad; /* a malformed copy of plan */

/* The first step of kind k (and op, for kernels) in p. */
static int find_step(const mg_plan *p, mg_step_kind k, mg_kernel_op op) {
  for (int i = 0; i < p->n_steps; i++)
    if (p->steps[i].kind == k && (k != MG_STEP_KERNEL || p->steps[i].op == op)) return i;
  fail_msg("%s plan: no step of kind %d op %d", mg_form_name(p->args.form), (int)k, (int)op);
  return -1;
}

/* bad is refused with a message naming step i (-1: no step) and holding what. */
static void expect_bad(int i, const char *what) {
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_plan_check(&bad, &d), MLAGEN_EINVAL);
  char step[160] = "";
  if (i >= 0) snprintf(step, sizeof step, "step %d (%s)", i, bad.steps[i].label);
  if (!strstr(mg_diag_msg(&d), step) || !strstr(mg_diag_msg(&d), what))
    fail_msg("expected '%s' and '%s' in: %s", step, what, mg_diag_msg(&d));
  mg_diag_clear(&d);
}

/* Every plan built passes the checker; each class of malformed step is refused, naming
 * the step and the operand. */
static void test_checker(void **state) {
  (void)state;
  mg_shape s = load("kimi-k2");
  mg_diag d = MG_DIAG_INIT;
  mg_plan_cost c;
  for (int f = 0; f < MG_FORM_COUNT; f++)
    for (int t = 0; t < 2; t++) {
      build(&plan, &s, (mg_form)f, 4, 2, 64, 1, t ? MG_F64 : MG_BF16, &c);
      assert_int_equal(mg_plan_check(&plan, &d), 0);
    }
  assert_int_equal(mg_plan_check(NULL, &d), MLAGEN_EINVAL);
  mg_diag_clear(&d);

  build(&plan, &s, MG_FORM_EXPLICIT, 4, 2, 64, 1, MG_BF16, &c);
  const int fwd = find_step(&plan, MG_STEP_KERNEL, MG_OP_ATTN_FWD);
  const int gemm = find_step(&plan, MG_STEP_GEMM, 0);
  const int a2a = find_step(&plan, MG_STEP_SEQ_TO_HEAD, 0);
  const int ekv = find_step(&plan, MG_STEP_KERNEL, MG_OP_EXPAND_KV);
  bad = plan; /* arity */
  bad.steps[fwd].n_in = 2;
  expect_bad(fwd, "takes 3 inputs and 2 outputs, has 2 and 2");
  bad = plan; /* a buffer that does not exist */
  bad.steps[gemm].in[1] = bad.n_bufs;
  expect_bad(gemm, "input 1: buffer id");
  bad = plan; /* a GEMM operand past its buffer */
  bad.steps[gemm].gemm.ldb += 1;
  expect_bad(gemm, "operand B reads element");
  bad = plan;
  bad.steps[gemm].gemm.m = 0;
  expect_bad(gemm, "operand A");
  bad = plan; /* a dtype: the LSE in the activations' */
  bad.bufs[mg_plan_find(&bad, "lse")].dtype = MG_BF16;
  expect_bad(fwd, "lse is bf16, the step needs f32");
  bad = plan; /* an attention operand of another shape: v where k goes */
  bad.steps[fwd].in[1] = plan.steps[fwd].in[2];
  expect_bad(fwd, "v_h must be [B, S, H, d_qk]");
  bad = plan; /* column arguments */
  bad.steps[ekv].rope_col = 1;
  expect_bad(ekv, "rope columns");
  bad = plan; /* a collective's staging */
  bad.steps[a2a].workspace = 0;
  expect_bad(a2a, "the collective needs");
  bad = plan;
  bad.args.sp = 2;
  expect_bad(a2a, "do not match a all-to-all over 2 ranks");
  bad = plan; /* an unknown op */
  bad.steps[ekv].op = (mg_kernel_op)99;
  expect_bad(ekv, "unknown kernel op 99");
  bad = plan; /* liveness: an input written, lifetimes changed after the build */
  bad.steps[ekv].out[0] = mg_plan_find(&bad, "q");
  expect_bad(ekv, "writes the input q");
  bad = plan;
  bad.bufs[mg_plan_find(&bad, "lse")].first++;
  expect_bad(-1, "buffer lse lives over steps");
  bad = plan; /* the op boundary's names */
  snprintf(bad.bufs[mg_plan_find(&bad, "q")].name, sizeof bad.bufs[0].name, "qq");
  expect_bad(-1, "unknown input qq");

  build(&plan, &s, MG_FORM_ABSORBED, 4, 2, 64, 1, MG_BF16, &c);
  const int cat = find_step(&plan, MG_STEP_KERNEL, MG_OP_CONCAT_LATENT);
  const int mqa = find_step(&plan, MG_STEP_KERNEL, MG_OP_MQA_BWD);
  bad = plan;
  bad.steps[cat].in[0] = plan.steps[cat].in[1], bad.steps[cat].in[1] = plan.steps[cat].in[0];
  expect_bad(cat, "must be d_c, d_r and d_c + d_r wide");
  bad = plan; /* the attention backward's delta */
  bad.steps[mqa].workspace /= 2;
  expect_bad(mqa, "the backward's delta needs");

  build(&plan, &s, MG_FORM_LAGA_F, 4, 2, 64, 1, MG_BF16, &c);
  const int cc = find_step(&plan, MG_STEP_KERNEL, MG_OP_COPY_COLS);
  bad = plan;
  bad.steps[cc].cols = 1 << 20;
  expect_bad(cc, "columns [");
  /* split keys: K_nope d_n wide, the latent's RoPE columns, dk_rope [B, S, d_r] f32; the
   * flag only where the op has split keys */
  const int lb = find_step(&plan, MG_STEP_KERNEL, MG_OP_ATTN_BWD);
  const int sd = find_step(&plan, MG_STEP_KERNEL, MG_OP_SPLIT_DKV);
  bad = plan;
  bad.steps[lb].split_keys = 0;
  expect_bad(lb, "takes 6 inputs and 3 outputs, has 7 and 4");
  bad = plan; /* a per-head K where K_nope goes: its expand_kv made packed */
  for (int i = 0; i < lb; i++)
    if (plan.steps[i].kind == MG_STEP_KERNEL && plan.steps[i].op == MG_OP_EXPAND_KV &&
        plan.steps[i].out[0] == plan.steps[lb].in[1]) {
      bad.steps[i].split_keys = 0, bad.steps[i].n_in = 2, bad.steps[i].in[1] = plan.steps[lb].in[6];
      bad.bufs[plan.steps[lb].in[1]].dims[3] = 128 + 64;
    }
  expect_bad(lb, "must be [B, S, H, d_n (split keys)]");
  bad = plan;
  bad.steps[lb].rope_col = 520;
  expect_bad(lb, "rope columns [520, 584) outside c of width 576");
  bad = plan; /* dk_rope in the activations' dtype */
  bad.bufs[plan.steps[lb].out[3]].dtype = MG_BF16;
  expect_bad(lb, "is bf16, the step needs f32");
  bad = plan; /* split_dkv's dk_rope and dv swapped */
  bad.steps[sd].in[2] = plan.steps[sd].in[1], bad.steps[sd].in[1] = plan.steps[sd].in[2];
  expect_bad(sd, "dkr_b0 has 8192 elements, the step needs");
  bad = plan;
  bad.steps[cc].split_keys = 1;
  expect_bad(cc, "1 only on attention, expand_kv and split_dkv steps");
  /* query positions: only laga-cp's, inside [0, S) */
  bad = plan;
  const int lf = find_step(&plan, MG_STEP_KERNEL, MG_OP_ATTN_FWD);
  bad.steps[lf].q_split = 1;
  expect_bad(lf, "only laga-cp's explicit attention places S / P rows");

  build(&plan, &s, MG_FORM_LAGA_CP, 4, 2, 64, 1, MG_BF16, &c);
  const int cf = find_step(&plan, MG_STEP_KERNEL, MG_OP_ATTN_FWD);
  const int co = find_step(&plan, MG_STEP_KERNEL, MG_OP_CHUNK_ORDER);
  bad = plan;
  bad.steps[cf].q_pos1 = 64 - 1; /* the second chunk's 8 rows would pass S */
  expect_bad(cf, "the second chunk ends at q_pos1 + (rows - q_split) = ");
  bad = plan; /* each bound named */
  bad.steps[cf].q_pos1 = bad.steps[cf].q_pos0 + bad.steps[cf].q_split - 1;
  expect_bad(cf, "q_pos1 must be >= q_pos0 + q_split");
  bad = plan;
  bad.steps[cf].q_split = -1;
  expect_bad(cf, "q_split must be in [0, ");
  bad = plan;
  bad.steps[cf].q_pos0 = 64 - 1, bad.steps[cf].q_pos1 = 64 + 8;
  expect_bad(cf, "the first chunk ends at q_pos0 + q_split = ");
  bad = plan;
  bad.steps[cf].q_pos0 = bad.steps[cf].q_split = bad.steps[cf].q_pos1 = 0;
  expect_bad(cf, "covers 16 tokens, the attention needs all S = 64");
  bad = plan;
  bad.steps[co].ranks = 3;
  expect_bad(co, "ranks 3 must divide the 64 tokens");
  bad = plan;
  bad.bufs[mg_plan_find(&bad, "c")].dims[1] = 32;
  expect_bad(co, "must be [B, S, w] alike");
}

/* laga-cp at DeepSeek-V3, S 16384, P 8, from first principles: the latent's all-gather
 * and reduce-scatter, the kept latent, O and LSE, the exact causal pairs of each rank's
 * two chunks (equal on every rank), the P-fold K/V rebuild; its layout covers every
 * position once for any S_l (odd too) and P > H; its head groups and argument rules. */
static void test_laga_cp(void **state) {
  (void)state;
  mg_shape s = load("deepseek-v3");
  const int64_t P = 8, S = 16384, Sl = S / P, H = 128, dqk = 192, dv = 128, dc = 512, wc = 576,
                dkv = 256, e = 2;
  double attn_sum = 0;
  for (int r = 0; r < P; r++) {
    mg_plan_args a = {.shape = &s, .form = MG_FORM_LAGA_CP, .sp = (int)P, .rank = r, .batch = 1,
                      .seq = S, .causal = 1, .dtype = MG_BF16};
    mg_diag d = MG_DIAG_INIT;
    assert_int_equal(mg_plan_build(&plan, &a, &d), 0);
    mg_plan_cost c;
    mg_plan_cost_of(&plan, &c);
    assert_int_equal(plan.args.head_groups, 8);
    assert_int_equal(c.sent_fwd, Sl * wc * e * (P - 1));
    assert_int_equal(c.sent_bwd, Sl * wc * e * (P - 1));
    assert_int_equal(c.sent_fwd, 16515072); /* 15.75 MiB */
    assert_int_equal(c.saved, S * wc * e + H * Sl * 4 + Sl * H * dv * e);
    /* the pairs: rows r*1024 + i and (15 - r)*1024 + i, i < 1024, see pos + 1 keys */
    double pairs = 0;
    for (int64_t i = 0; i < Sl; i++) pairs += (double)(i < Sl / 2 ? r * (Sl / 2) + i : (2 * P - 1 - r) * (Sl / 2) + i - Sl / 2) + 1;
    assert_true(c.attn_flops_fwd == 2.0 * H * pairs * (dqk + dv));
    assert_true(c.attn_flops_bwd == 2.0 * H * pairs * (3 * dqk + 2 * dv));
    assert_true(pairs == 1024.0 * 1024 * 15 + 1024.0 * 1025); /* the same on every rank */
    attn_sum += c.attn_flops_fwd;
    /* rebuild of all H heads over all S keys: forward once, backward once plus dC, dW */
    assert_true(c.gemm_flops_fwd == 2.0 * S * H * dkv * dc);
    assert_true(c.gemm_flops_bwd == 3 * c.gemm_flops_fwd);
    mg_diag_clear(&d);
  }
  /* the ranks together attend every causal pair once */
  assert_true(attn_sum == 2.0 * H * ((double)S * (S + 1) / 2) * (dqk + dv));

  /* the layout: a permutation of [0, S) for even and odd S_l, P > H included */
  const int64_t cases[][2] = {{2, 8}, {3, 9}, {4, 4}, {8, 40}, {32, 96}, {5, 5}, {1, 7}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const int64_t Pk = cases[k][0], Sk = cases[k][1], Slk = Sk / Pk;
    char seen[128] = {0};
    for (int64_t r = 0; r < Pk; r++)
      for (int64_t i = 0; i < Slk; i++) {
        const int64_t pos = mg_form_token_pos(MG_FORM_LAGA_CP, Pk, Slk, r, i);
        assert_true(pos >= 0 && pos < Sk && !seen[pos]);
        seen[pos] = 1;
        assert_int_equal(mg_form_token_pos(MG_FORM_LAGA, Pk, Slk, r, i), r * Slk + i);
      }
  }
  assert_int_equal(mg_cp_pos(4, 4, 1, 0), 2);  /* chunks 1 and 6 of 8 */
  assert_int_equal(mg_cp_pos(4, 4, 1, 2), 12);
  assert_int_equal(mg_cp_pos(3, 3, 0, 2), 8);  /* a = 2, b = 1: 0, 1 | 8 */

  /* P > H (V2-Lite, H 16, P 32) builds; the Ulysses forms are refused naming laga-cp */
  mg_shape lite = load("deepseek-v2-lite");
  mg_diag d = MG_DIAG_INIT;
  mg_plan_args a = {.shape = &lite, .form = MG_FORM_LAGA_CP, .sp = 32, .rank = 31, .batch = 2,
                    .seq = 96, .causal = 1, .dtype = MG_F32};
  assert_int_equal(mg_plan_build(&plan, &a, &d), 0);
  assert_int_equal(plan.heads_local, 16);
  a.form = MG_FORM_EXPLICIT;
  assert_int_equal(mg_plan_build(&plan, &a, &d), MLAGEN_EINVAL);
  if (!strstr(mg_diag_msg(&d), "sp = 32 exceeds num_attention_heads = 16") ||
      !strstr(mg_diag_msg(&d), "the all-gather context-parallel form laga-cp keeps all H heads") ||
      !strstr(mg_diag_msg(&d), "(explicit, absorbed, laga, laga-r, laga-f)"))
    fail_msg("%s", mg_diag_msg(&d));
  /* head groups: a divisor of H, at most 16 */
  a.form = MG_FORM_LAGA_CP, a.sp = 3, a.rank = 0;
  const struct { int groups, ok; } hg[] = {{1, 1}, {4, 1}, {16, 1}, {3, 0}, {32, 0}, {-2, 0}};
  for (size_t k = 0; k < sizeof hg / sizeof hg[0]; k++) {
    a.head_groups = hg[k].groups;
    const int rc = mg_plan_build(&plan, &a, &d);
    assert_int_equal(rc, hg[k].ok ? 0 : MLAGEN_EINVAL);
    if (!hg[k].ok && !strstr(mg_diag_msg(&d), "must divide H = 16"))
      fail_msg("%d: %s", hg[k].groups, mg_diag_msg(&d));
    int n_attn = 0;
    for (int i = 0; hg[k].ok && i < plan.n_steps; i++)
      n_attn += plan.steps[i].kind == MG_STEP_KERNEL && plan.steps[i].op == MG_OP_ATTN_BWD;
    if (hg[k].ok) assert_int_equal(n_attn, hg[k].groups);
  }
  mg_diag_clear(&d);
}

/* mg_plan_time_of against a hand computation of the explicit form (docs/forms.md, its steps
 * written out from the form's math, not from the plan): DeepSeek-V2-Lite (H 16, d_c 512,
 * d_r 64, d_n 128, d_v 128), S 4096, P 2, B 1, non-causal, bf16, on a made-up device of
 * 100 TFLOP/s, 1000 GB/s and a 50 GB/s link, chosen so that some steps are compute-bound
 * and some memory-bound. */
static double roof(double flops, double bytes) {
  const double tc = flops / 100e12, tm = bytes / 1000e9;
  return tc > tm ? tc : tm;
}

static void test_time_by_hand(void **state) {
  (void)state;
  mg_shape s = load("deepseek-v2-lite");
  mg_plan_cost c;
  build(&plan, &s, MG_FORM_EXPLICIT, 2, 1, 4096, 0, MG_BF16, &c);
  const mg_device_model dev = {.tflops = 100, .hbm_gbps = 1000, .link_gbps = 50};
  mg_plan_time t;
  mg_plan_time_of(&plan, &dev, &t);

  const double S = 4096, Sl = 2048, H = 16, Hl = 8, dc = 512, dr = 64, dqk = 192, dv = 128;
  const double dkv = 256, e = 2, pairs = S * S, link = 50e9;
  /* forward: kv GEMM, expand, 3 all-to-alls, attention, all-to-all O */
  double fwd = roof(2 * Sl * H * dkv * dc, e * (Sl * dc + dc * H * dkv + Sl * H * dkv));
  fwd += roof(0, e * (Sl * H * dkv + Sl * dr + Sl * H * dqk + Sl * H * dv));
  fwd += 0.5 * e * Sl * H * (dqk + dqk + dv) / link;
  fwd += roof(2 * Hl * pairs * (dqk + dv), e * S * Hl * (2 * dqk + 2 * dv) + 4 * Hl * S);
  fwd += 0.5 * e * S * Hl * dv / link;
  /* backward: all-to-all dO, attention backward, 3 all-to-alls, split, two GEMMs */
  double bwd = 0.5 * e * S * Hl * dv / link;
  bwd += roof(2 * Hl * pairs * (3 * dqk + 2 * dv),
              e * S * Hl * (dqk + dqk + dv + dv + dv) + 4 * Hl * S + e * S * Hl * (2 * dqk + dv));
  bwd += 0.5 * e * Sl * H * (2 * dqk + dv) / link;
  bwd += roof(0, e * (Sl * H * dqk + Sl * H * dv + Sl * H * dkv + Sl * dr));
  bwd += roof(2 * Sl * dc * H * dkv, e * (Sl * H * dkv + H * dkv * dc + Sl * dc));
  bwd += roof(2 * H * dkv * dc * Sl, e * (H * dkv * Sl + Sl * dc) + 4 * H * dkv * dc);
  assert_true(fabs(t.fwd_s - fwd) <= 1e-12 * fwd);
  assert_true(fabs(t.bwd_s - bwd) <= 1e-12 * bwd);
  const double comm_fwd = 0.5 * e * (Sl * H * (2 * dqk + dv) + S * Hl * dv) / link;
  assert_true(fabs(t.comm_fwd_s - comm_fwd) <= 1e-12 * comm_fwd);
  assert_true(fabs(t.fwd_s - t.compute_fwd_s - t.comm_fwd_s) <= 1e-15);
}

/* ---- packed sequences (varlen) ------------------------------------------------------- */

/* The plan args of a varlen plan of form f, rank r of P, capacity S, documents cu (n_cu
 * entries; NULL: none given). */
static mg_plan_args varlen_args(const mg_shape *s, mg_form f, int P, int r, int64_t S, int causal,
                                const int32_t *cu, int64_t n_cu) {
  mg_plan_args a = {.shape = s, .form = f, .sp = P, .rank = r, .batch = 1, .seq = S,
                    .causal = causal, .dtype = MG_BF16, .varlen = 1, .cu_seqlens = cu,
                    .n_cu = n_cu};
  return a;
}

static void expect_args_refused(const mg_plan_args *a, const char *text) {
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_plan_build(&plan, a, &d), MLAGEN_EINVAL);
  if (!strstr(mg_diag_msg(&d), text)) fail_msg("'%s' not in: %s", text, mg_diag_msg(&d));
  mg_diag_clear(&d);
}

/* Varlen arguments: batch 1, documents only with varlen and checked against the capacity;
 * the plan keeps no pointer to them. */
static void test_varlen_args(void **state) {
  (void)state;
  mg_shape s = load("deepseek-v2-lite");
  const int32_t cu[] = {0, 5, 5, 40}, down[] = {0, 9, 4}, past[] = {0, 30, 70};
  mg_plan_args a = varlen_args(&s, MG_FORM_LAGA, 2, 0, 64, 1, cu, 4);
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_plan_build(&plan, &a, &d), 0);
  assert_true(plan.args.varlen && plan.args.cu_seqlens == NULL && plan.args.n_cu == 0);
  a.batch = 2;
  expect_args_refused(&a, "plan: batch = 2 with varlen (packed sequences)");
  a.batch = 1;
  a.cu_seqlens = down, a.n_cu = 3;
  expect_args_refused(&a, "plan: cu_seqlens[2] = 4 is below cu_seqlens[1] = 9");
  a.cu_seqlens = past;
  expect_args_refused(&a, "plan: cu_seqlens[2] = 70 is past the plan's token capacity 64");
  a.n_cu = 0;
  expect_args_refused(&a, "cu_seqlens needs at least one entry");
  a.cu_seqlens = NULL, a.n_cu = 3;
  expect_args_refused(&a, "cu_seqlens is NULL");
  a.n_cu = 0; /* no documents: the worst case, one document of S tokens */
  assert_int_equal(mg_plan_build(&plan, &a, &d), 0);
  a.varlen = 0, a.cu_seqlens = cu, a.n_cu = 4;
  expect_args_refused(&a, "cu_seqlens given (4 entries) for a plan without varlen");
  /* the plan check: a varlen plan has batch 1 */
  a = varlen_args(&s, MG_FORM_EXPLICIT, 1, 0, 64, 1, NULL, 0);
  assert_int_equal(mg_plan_build(&plan, &a, &d), 0);
  plan.args.batch = 2;
  assert_int_equal(mg_plan_check(&plan, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "varlen with batch 2"));
  mg_diag_clear(&d);
}

/* Every weight-gradient GEMM (the steps writing dw_kv_b) of a varlen plan is marked tok_k
 * with k over the token rows it contracts at their first global position (explicit: this
 * rank's S / P tokens at rank S / P; the others all S tokens from 0), and no other GEMM;
 * an unpacked plan marks none; the plan check refuses tok_k on an unpacked plan and token
 * rows past S. */
static void test_varlen_tok_k(void **state) {
  (void)state;
  mg_shape s = load("deepseek-v2-lite"); /* H = 16 */
  mg_diag d = MG_DIAG_INIT;
  const int64_t S = 96, P = 4, r = 2, Sl = S / P;
  for (int f = 0; f < MG_FORM_COUNT; f++)
    for (int varlen = 0; varlen < 2; varlen++) {
      mg_plan_args a = varlen_args(&s, (mg_form)f, (int)P, (int)r, S, 1, NULL, 0);
      a.varlen = varlen;
      if (mg_plan_build(&plan, &a, &d)) fail_msg("%s", mg_diag_msg(&d));
      const int dw = mg_plan_find(&plan, "dw_kv_b");
      int marked = 0;
      for (int i = 0; i < plan.n_steps; i++) {
        const mg_step *st = &plan.steps[i];
        if (st->kind != MG_STEP_GEMM) continue;
        const int weight = st->out[0] == dw;
        if (!varlen || !weight) {
          if (st->gemm.tok_k || st->gemm.tok0)
            fail_msg("%s varlen %d step %d (%s): tok_k %d tok0 %lld", mg_form_name((mg_form)f),
                     varlen, i, st->label, st->gemm.tok_k, (long long)st->gemm.tok0);
          continue;
        }
        const int64_t k = f == MG_FORM_EXPLICIT ? Sl : S, tok0 = f == MG_FORM_EXPLICIT ? r * Sl : 0;
        if (!(st->gemm.tok_k == 1 && st->gemm.k == k && st->gemm.tok0 == tok0))
          fail_msg("%s step %d (%s): tok_k %d k %lld tok0 %lld, expected 1 %lld %lld",
                   mg_form_name((mg_form)f), i, st->label, st->gemm.tok_k, (long long)st->gemm.k,
                   (long long)st->gemm.tok0, (long long)k, (long long)tok0);
        marked++;
      }
      /* explicit and laga: one; absorbed: dW_UV and dW_UK; laga-f, laga-cp: one per group */
      const int want = !varlen ? 0
                       : f == MG_FORM_ABSORBED ? 2
                       : f == MG_FORM_LAGA_F || f == MG_FORM_LAGA_CP ? plan.args.head_groups
                                                                     : 1;
      assert_int_equal(marked, want);
      if (!varlen) { /* the check: tok_k only on varlen plans */
        const int g = find_step(&plan, MG_STEP_GEMM, 0);
        plan.steps[g].gemm.tok_k = 1;
        assert_int_equal(mg_plan_check(&plan, &d), MLAGEN_EINVAL);
        assert_non_null(strstr(mg_diag_msg(&d), "this plan is not varlen"));
      } else { /* token rows inside [0, S) */
        for (int i = 0; i < plan.n_steps; i++)
          if (plan.steps[i].gemm.tok_k) {
            plan.steps[i].gemm.tok0 = S - plan.steps[i].gemm.k + 1;
            break;
          }
        assert_int_equal(mg_plan_check(&plan, &d), MLAGEN_EINVAL);
        assert_non_null(strstr(mg_diag_msg(&d), "token rows must lie inside [0, S = 96)"));
      }
    }
  mg_diag_clear(&d);
}

/* The (query, key) pairs of queries at positions pos[0 .. n) inside documents cu, counted
 * one query at a time with a linear walk over the boundaries (not mg_varlen_*). */
static double brute_pairs(const int32_t *cu, int64_t n_cu, int causal, const int64_t *pos, int64_t n) {
  double pairs = 0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t d = 0; d + 1 < n_cu; d++)
      if (cu[d] <= pos[i] && pos[i] < cu[d + 1])
        pairs += (double)(causal ? pos[i] - cu[d] + 1 : cu[d + 1] - cu[d]);
  return pairs;
}

/* Attention FLOPs of varlen plans with documents equal FlashMLA's convention over the pairs
 * inside the documents, counted by brute force: every form, P = 1, 2, 4, every rank (laga-cp's
 * two chunks differ), causal and not; without documents, the unpacked figures. */
static void test_varlen_flops(void **state) {
  (void)state;
  mg_shape s = load("deepseek-v2-lite");
  const int32_t cu[] = {0, 1, 3, 6, 23, 87, 87, 287}; /* 33 slack tokens of 320 */
  const int64_t n_cu = 8, S = 320;
  const double dqk = s.qk_nope_head_dim + s.qk_rope_head_dim, dv = s.v_head_dim,
               aqk = s.kv_lora_rank + s.qk_rope_head_dim, av = s.kv_lora_rank;
  static int64_t pos[320];
  mg_diag d = MG_DIAG_INIT;
  mg_plan_cost c, u;
  static mg_plan unpacked;
  for (int P = 1; P <= 4; P *= 2)
    for (int r = 0; r < P; r++)
      for (int causal = 0; causal < 2; causal++)
        for (int f = 0; f < MG_FORM_COUNT; f++) {
          const int cp = f == MG_FORM_LAGA_CP;
          const int64_t Sl = S / P, nq = cp ? Sl : S;
          for (int64_t i = 0; i < nq; i++) pos[i] = cp ? mg_cp_pos(P, Sl, r, i) : i;
          const double pairs = brute_pairs(cu, n_cu, causal, pos, nq);
          const double H = cp ? s.heads : s.heads / P;
          const double wf = f == MG_FORM_ABSORBED ? aqk + av : dqk + dv,
                       wb = f == MG_FORM_ABSORBED ? 3 * aqk + 2 * av : 3 * dqk + 2 * dv;
          mg_plan_args a = varlen_args(&s, (mg_form)f, P, r, S, causal, cu, n_cu);
          if (mg_plan_build(&plan, &a, &d)) fail_msg("%s", mg_diag_msg(&d));
          mg_plan_cost_of(&plan, &c);
          const double fwd = 2 * H * pairs * wf, bwd = 2 * H * pairs * wb;
          if (!(fabs(c.attn_flops_fwd - fwd) <= 1e-12 * fwd && fabs(c.attn_flops_bwd - bwd) <= 1e-12 * bwd))
            fail_msg("%s P %d rank %d causal %d: attention FLOPs %.6g / %.6g, per document pair "
                     "%.6g / %.6g", mg_form_name((mg_form)f), P, r, causal, c.attn_flops_fwd,
                     c.attn_flops_bwd, fwd, bwd);
          /* no documents given: the unpacked plan's figures */
          a.cu_seqlens = NULL, a.n_cu = 0;
          if (mg_plan_build(&plan, &a, &d)) fail_msg("%s", mg_diag_msg(&d));
          mg_plan_cost_of(&plan, &c);
          a.varlen = 0;
          if (mg_plan_build(&unpacked, &a, &d)) fail_msg("%s", mg_diag_msg(&d));
          mg_plan_cost_of(&unpacked, &u);
          assert_true(c.attn_flops_fwd == u.attn_flops_fwd && c.attn_flops_bwd == u.attn_flops_bwd);
          assert_true(u.attn_flops_fwd > fwd);
        }
  mg_diag_clear(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_explicit_v3_figures), cmocka_unit_test(test_forms_relations_v3),
      cmocka_unit_test(test_single_rank),         cmocka_unit_test(test_plans_well_formed),
      cmocka_unit_test(test_laga_fused_groups), cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_huge_sizes_checked), cmocka_unit_test(test_checker),
      cmocka_unit_test(test_time_by_hand),        cmocka_unit_test(test_laga_cp),
      cmocka_unit_test(test_varlen_args),         cmocka_unit_test(test_varlen_tok_k),
      cmocka_unit_test(test_varlen_flops),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
