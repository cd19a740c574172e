/* test_plan_mem.c: the static memory layout of a plan (generator/core/mg_plan_mem.h).
 *
 * Every form, on DeepSeek-V3, DeepSeek-V2-Lite and Kimi K2, P = 1, 2, 4, 8, B = 1 and 2,
 * causal and not (laga-f with 1, 2 and 8 head groups): checked by brute force at every
 * step (no two live workspace objects overlap, offsets aligned, everything inside its
 * area, the saved area exactly the aligned saved buffers, the live workspace bytes equal
 * to the planner's live bytes less the outputs and saved buffers), and the workspace's
 * high-water mark printed against the planner's figures: the fragmentation report. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "mg_config.h"
#include "mg_plan.h"
#include "mg_plan_mem.h"
#include "mlagen.h"

static mg_plan plan; /* large: keep off the stack */
static mg_plan_mem mem;

static mg_shape load(const char *model) {
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  if (mg_config_load(model, &s, &d)) fail_msg("%s", mg_diag_msg(&d));
  return s;
}

static int64_t up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* What one layout measures against the planner. */
typedef struct figures {
  int64_t workspace;    /* the layout's high-water mark */
  int64_t bound;        /* max over steps of the live workspace objects, aligned: no layout
                           of this liveness does better */
  int64_t planner_ws;   /* max over steps of the planner's live bytes less the outputs and
                           saved buffers (unaligned) */
  int64_t planner_peak; /* max(peak_fwd, peak_bwd) */
  int64_t saved, planner_saved;
} figures;

/* Builds the plan, lays it out with align, checks the layout by brute force. */
static figures check(const mg_shape *s, mg_form f, int P, int B, int64_t S, int causal,
                     mg_dtype t, int groups, int64_t align) {
  mg_plan_args a = {.shape = s, .form = f, .sp = P, .rank = P - 1, .batch = B, .seq = S,
                    .causal = causal, .dtype = t, .head_groups = groups};
  mg_diag d = MG_DIAG_INIT;
  if (mg_plan_build(&plan, &a, &d)) fail_msg("%s", mg_diag_msg(&d));
  if (mg_plan_mem_layout(&plan, align, &mem, &d)) fail_msg("%s", mg_diag_msg(&d));
  mg_diag_clear(&d);
  mg_plan_cost c;
  mg_plan_cost_of(&plan, &c);
  const mg_plan *p = &plan;
  const int nf = p->n_fwd;
  assert_int_equal(mem.align, align);
  assert_int_equal(mem.saved_bytes % align, 0);
  assert_int_equal(mem.workspace_bytes % align, 0);

  /* where each buffer lives; the saved area is the aligned saved buffers, disjoint */
  int64_t saved_sum = 0;
  for (int b = 0; b < p->n_bufs; b++) {
    const mg_plan_buf *pb = &p->bufs[b];
    const int64_t size = up(mg_plan_buf_bytes(pb), align);
    const mg_mem_where want = pb->role != MG_BUF_TEMP                  ? MG_MEM_CALLER
                              : pb->first < nf && pb->last >= nf ? MG_MEM_SAVED
                                                                       : MG_MEM_WORKSPACE;
    assert_int_equal(mem.where[b], want);
    assert_int_equal(mem.offset[b] % align, 0);
    assert_true(mem.offset[b] >= 0);
    if (want == MG_MEM_SAVED) {
      saved_sum += size;
      assert_true(mem.offset[b] + size <= mem.saved_bytes);
      for (int q = 0; q < b; q++)
        if (mem.where[q] == MG_MEM_SAVED) {
          const int64_t qs = up(mg_plan_buf_bytes(&p->bufs[q]), align);
          assert_true(mem.offset[b] + size <= mem.offset[q] || mem.offset[q] + qs <= mem.offset[b]);
        }
    }
    if (want == MG_MEM_WORKSPACE) assert_true(mem.offset[b] + size <= mem.workspace_bytes);
  }
  assert_int_equal(mem.saved_bytes, saved_sum);
  assert_true(mem.saved_bytes >= c.saved);

  figures fg = {.workspace = mem.workspace_bytes, .saved = mem.saved_bytes,
                .planner_saved = c.saved,
                .planner_peak = c.peak_fwd > c.peak_bwd ? c.peak_fwd : c.peak_bwd};
  /* every step: the live workspace objects are pairwise disjoint and inside the area; they
   * are exactly the planner's live bytes less the caller's outputs and the saved buffers */
  int64_t lo[MG_PLAN_MAX_BUFS + 1], hi[MG_PLAN_MAX_BUFS + 1], planner_live = 0;
  for (int i = 0; i < p->n_steps; i++) {
    const mg_step *st = &p->steps[i];
    assert_true(st->workspace > 0 ? mem.step_ws[i] >= 0 : mem.step_ws[i] == -1);
    int n = 0;
    int64_t live_aligned = 0, live_raw = 0, outputs = 0, saved = 0;
    for (int b = 0; b < p->n_bufs; b++) {
      const mg_plan_buf *pb = &p->bufs[b];
      if (pb->role == MG_BUF_INPUT || pb->first > i) continue;
      const int64_t bytes = mg_plan_buf_bytes(pb);
      const int same_pass = (pb->first < nf) == (i < nf);
      if (pb->role == MG_BUF_OUTPUT) {
        if (same_pass) outputs += bytes; /* outputs stay counted to the end of their pass */
        continue;
      }
      if (pb->last < i) continue;
      if (mem.where[b] == MG_MEM_SAVED) {
        saved += bytes;
        continue;
      }
      lo[n] = mem.offset[b];
      hi[n++] = mem.offset[b] + up(bytes, align);
      live_aligned += up(bytes, align);
      live_raw += bytes;
    }
    if (st->workspace > 0) {
      assert_int_equal(mem.step_ws[i] % align, 0);
      lo[n] = mem.step_ws[i];
      hi[n++] = mem.step_ws[i] + up(st->workspace, align);
      live_aligned += up(st->workspace, align);
      live_raw += st->workspace;
    }
    for (int x = 0; x < n; x++) {
      assert_true(lo[x] >= 0 && hi[x] <= mem.workspace_bytes);
      for (int y = 0; y < x; y++)
        if (hi[x] > lo[x] && hi[y] > lo[y] && !(hi[x] <= lo[y] || hi[y] <= lo[x]))
          fail_msg("%s P=%d step %d (%s): objects [%lld, %lld) and [%lld, %lld) overlap",
                   mg_form_name(f), P, i, st->label, (long long)lo[x], (long long)hi[x],
                   (long long)lo[y], (long long)hi[y]);
    }
    /* the planner's live bytes at step i, as mg_plan_cost_of counts them */
    if (i == nf) {
      planner_live = 0;
      for (int b = 0; b < p->n_bufs; b++)
        if (p->bufs[b].role == MG_BUF_TEMP && p->bufs[b].first < nf && p->bufs[b].last >= nf)
          planner_live += mg_plan_buf_bytes(&p->bufs[b]);
    }
    for (int b = 0; b < p->n_bufs; b++)
      if (p->bufs[b].role != MG_BUF_INPUT && p->bufs[b].first == i)
        planner_live += mg_plan_buf_bytes(&p->bufs[b]);
    const int64_t planner_now = planner_live + st->workspace;
    assert_true(planner_now <= (i < nf ? c.peak_fwd : c.peak_bwd));
    assert_int_equal(planner_now - outputs - saved, live_raw);
    if (live_raw > fg.planner_ws) fg.planner_ws = live_raw;
    if (live_aligned > fg.bound) fg.bound = live_aligned;
    for (int b = 0; b < p->n_bufs; b++)
      if (p->bufs[b].role == MG_BUF_TEMP && p->bufs[b].last == i)
        planner_live -= mg_plan_buf_bytes(&p->bufs[b]);
  }
  for (int i = p->n_steps; i < MG_PLAN_MAX_STEPS; i++) assert_int_equal(mem.step_ws[i], -1);
  assert_true(mem.workspace_bytes >= fg.bound);
  /* the layout never needs more than the planner's peak (at coarser alignments small
   * buffers may round past it) */
  if (align <= 256) assert_true(mem.workspace_bytes <= fg.planner_peak);
  /* deterministic */
  static mg_plan_mem again;
  assert_int_equal(mg_plan_mem_layout(&plan, align, &again, NULL), 0);
  assert_memory_equal(&mem, &again, sizeof mem);
  return fg;
}

static double mib(int64_t x) { return (double)x / 1048576.0; }

static void print_row(const char *what, const figures *fg) {
  print_message("  %-34s ws %9.2f  bound %9.2f  frag %6.2f%%  planner-ws %9.2f  peak %9.2f  "
                "saved %9.2f (planner %9.2f) MiB\n",
                what, mib(fg->workspace), mib(fg->bound),
                fg->bound ? 100.0 * (double)(fg->workspace - fg->bound) / (double)fg->bound : 0.0,
                mib(fg->planner_ws), mib(fg->planner_peak), mib(fg->saved), mib(fg->planner_saved));
}

/* The sweep: every form, three models, P, B, causal, laga-f's head groups. */
static void test_sweep(void **state) {
  (void)state;
  static const char *const models[] = {"deepseek-v3", "deepseek-v2-lite", "kimi-k2"};
  static const int groups[] = {1, 2, 8};
  int n = 0;
  double worst = 0;
  char worst_what[128] = "";
  for (int mi = 0; mi < 3; mi++) {
    const mg_shape s = load(models[mi]);
    for (int P = 1; P <= 8; P *= 2)
      for (int B = 1; B <= 2; B++)
        for (int causal = 0; causal <= 1; causal++)
          for (int f = 0; f < MG_FORM_COUNT; f++)
            for (int g = 0; g < (f == MG_FORM_LAGA_F ? 3 : 1); g++) {
              const int hg = f == MG_FORM_LAGA_F ? groups[g] : 0;
              if (hg && (s.heads / P) % hg) continue;
              const int64_t S = 64 * P;
              const mg_dtype t = (B + causal) % 2 ? MG_BF16 : MG_F32;
              figures fg = check(&s, (mg_form)f, P, B, S, causal, t, hg, 256);
              n++;
              const double frag = (double)(fg.workspace - fg.bound) / (double)fg.bound;
              if (frag > worst) {
                worst = frag;
                snprintf(worst_what, sizeof worst_what, "%s %s P=%d B=%d causal=%d groups=%d",
                         models[mi], mg_form_name((mg_form)f), P, B, causal, hg);
              }
            }
  }
  print_message("  %d layouts checked; worst fragmentation %.2f%% over the bound (%s)\n", n,
                100 * worst, worst_what[0] ? worst_what : "none");
  assert_true(n > 300);
}

/* The fragmentation report: DeepSeek-V3, S = 16384, P = 8, bf16, and a few small shapes. */
static void test_report(void **state) {
  (void)state;
  const mg_shape v3 = load("deepseek-v3"), lite = load("deepseek-v2-lite"), kimi = load("kimi-k2");
  struct {
    const mg_shape *s;
    const char *model;
    int P, B;
    int64_t S;
    int causal;
    mg_dtype t;
  } shapes[] = {
      {&v3, "v3", 8, 1, 16384, 1, MG_BF16},  {&v3, "v3", 1, 1, 4096, 1, MG_BF16},
      {&kimi, "kimi-k2", 4, 2, 8192, 1, MG_BF16}, {&lite, "v2-lite", 2, 2, 96, 0, MG_F32},
      {&lite, "v2-lite", 8, 1, 64, 1, MG_F32},
  };
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    print_message("  %s S=%lld P=%d B=%d %s:\n", shapes[k].model, (long long)shapes[k].S,
                  shapes[k].P, shapes[k].B, mg_dtype_name(shapes[k].t));
    for (int f = 0; f < MG_FORM_COUNT; f++) {
      figures fg = check(shapes[k].s, (mg_form)f, shapes[k].P, shapes[k].B, shapes[k].S,
                         shapes[k].causal, shapes[k].t, 0, 256);
      print_row(mg_form_name((mg_form)f), &fg);
      /* the headline shape: every form's layout reaches the bound (no fragmentation) */
      if (k == 0) assert_int_equal(fg.workspace, fg.bound);
    }
  }
  /* laga-f's head groups at V3 scale */
  for (int g = 1; g <= 16; g *= 2) {
    figures fg = check(&v3, MG_FORM_LAGA_F, 8, 1, 16384, 1, MG_BF16, g, 256);
    char what[40];
    snprintf(what, sizeof what, "v3 laga-f %d groups", g);
    print_row(what, &fg);
  }
}

/* Other alignments lay out the same plans correctly. */
static void test_alignments(void **state) {
  (void)state;
  const mg_shape s = load("deepseek-v2-lite");
  for (int64_t align = 16; align <= 4096; align *= 4)
    for (int f = 0; f < MG_FORM_COUNT; f++) check(&s, (mg_form)f, 2, 1, 48, 1, MG_BF16, 0, align);
}

static void expect_einval(const mg_plan *p, int64_t align, const char *says) {
  mg_diag d = MG_DIAG_INIT;
  memset(&mem, 0x5a, sizeof mem);
  assert_int_equal(mg_plan_mem_layout(p, align, &mem, &d), MLAGEN_EINVAL);
  if (!strstr(mg_diag_msg(&d), says)) fail_msg("message '%s' lacks '%s'", mg_diag_msg(&d), says);
  mg_diag_clear(&d);
  if (p) assert_int_equal(mem.workspace_bytes, 0); /* zeroed */
}

static void test_errors(void **state) {
  (void)state;
  const mg_shape s = load("deepseek-v3");
  mg_plan_args a = {.shape = &s, .form = MG_FORM_LAGA, .sp = 8, .rank = 0, .batch = 1,
                    .seq = 64, .causal = 1, .dtype = MG_BF16};
  assert_int_equal(mg_plan_build(&plan, &a, NULL), 0);
  expect_einval(NULL, 256, "plan is NULL");
  assert_int_equal(mg_plan_mem_layout(&plan, 256, NULL, NULL), MLAGEN_EINVAL);
  const int64_t bad_align[] = {0, 1, 8, 24, 100, 255, -256, (int64_t)1 << 31};
  for (size_t k = 0; k < sizeof bad_align / sizeof bad_align[0]; k++)
    expect_einval(&plan, bad_align[k], "align");
  assert_int_equal(mg_plan_mem_layout(&plan, 16, &mem, NULL), 0);
  assert_int_equal(mg_plan_mem_layout(&plan, (int64_t)1 << 30, &mem, NULL), 0);

  /* malformed plans */
  static mg_plan bad;
  bad = plan;
  bad.n_fwd = bad.n_steps + 1;
  expect_einval(&bad, 256, "n_fwd");
  bad = plan;
  bad.steps[3].in[0] = bad.n_bufs;
  expect_einval(&bad, 256, "buffer id out of range");
  bad = plan;
  bad.n_bufs = MG_PLAN_MAX_BUFS + 1;
  expect_einval(&bad, 256, "buffer count");
  bad = plan;
  int t = -1;
  for (int b = 0; b < bad.n_bufs && t < 0; b++)
    if (bad.bufs[b].role == MG_BUF_TEMP && bad.bufs[b].last > bad.bufs[b].first) t = b;
  assert_true(t >= 0);
  bad.bufs[t].last = bad.bufs[t].first; /* read after its last step */
  expect_einval(&bad, 256, "outside the buffer's [first, last]");
  bad = plan;
  bad.bufs[t].first = -1;
  expect_einval(&bad, 256, "first/last");
  bad = plan;
  bad.steps[0].workspace = -1;
  expect_einval(&bad, 256, "negative workspace");
  bad = plan;
  bad.bufs[t].dims[0] = (int64_t)1 << 62; /* its size overflows */
  expect_einval(&bad, 256, "size of buffer");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sweep),      cmocka_unit_test(test_report),
      cmocka_unit_test(test_alignments), cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
