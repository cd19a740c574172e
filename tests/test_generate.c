/* test_generate.c: templates -> CUDA -> NVRTC for real model shapes.
 *
 * Every generated kernel compiles for sm_80 and sm_90a with zero spill bytes; template
 * and NVRTC errors name the template file and line; tunable overrides are checked;
 * the manifest describes what was generated. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_config.h"
#include "mg_embed.h"
#include "mg_fs.h"
#include "mg_generate.h"
#include "mg_plan.h" /* mg_kernel_op */
#include "mg_jit.h"
#include "mg_spec.h"
#include "mlagen.h"

/* An MLA shape unlike DeepSeek's (MiniCPM3-like: d_n 64, d_r 32, d_v 64, d_c 256, H 40). */
static const char unusual_json[] =
    "{\"model_type\": \"minicpm3\", \"num_attention_heads\": 40, \"kv_lora_rank\": 256,"
    " \"qk_rope_head_dim\": 32, \"qk_nope_head_dim\": 64, \"v_head_dim\": 64,"
    " \"q_lora_rank\": 768, \"hidden_size\": 2560}";

static void load_shape(const char *model, mg_shape *s) {
  mg_diag d = MG_DIAG_INIT;
  int rc = model ? mg_config_load(model, s, &d)
                 : mg_config_parse(unusual_json, strlen(unusual_json), "unusual", s, &d);
  if (rc) fail_msg("%s", mg_diag_msg(&d));
}

static long launch_smem_static(const mg_kernel *k) {
  const cJSON *launch = cJSON_GetObjectItemCaseSensitive(k->manifest, "launch");
  const cJSON *smem = cJSON_GetObjectItemCaseSensitive(launch, "smem_static");
  assert_true(cJSON_IsNumber(smem));
  return (long)smem->valuedouble;
}

/* Generates every kernel of a model and compiles each for the n_archs of archs (compile_model:
 * sm_80 and sm_90a; 0: generated only). The JIT cache
 * ($MLAGEN_CACHE_DIR) is used: ctest gives these tests and cli_compile_v2_lite one cache
 * and runs them one at a time, so a kernel two models share (same source, name and
 * options: the same key) is compiled once per cold run, by the first of them. */
static int exhaustive(void);

/* 1 when specs[i] equals an earlier spec of specs[0..i) but for its heads: the same family,
 * head dims, dtype, causality, packing and tunables. Its registers, spills and shared memory
 * were the other's in every pair measured: DeepSeek-V3 at 16, 64 and 128 heads (8ed989c, and
 * 68 groups again at 58c403e), the unusual shape's 12 pairs at 40 heads and its head groups
 * (21537c1, under MLAGEN_TEST_EXHAUSTIVE=1, which compiles them all); but for split_dkv,
 * whose registers depend on its heads (80 at 16 heads, 40 at 64 and 128), always compiled. */
static int same_but_heads(const mg_kernel_spec *specs, int i) {
  if (!strcmp(specs[i].family, "split_dkv")) return 0;
  for (int j = 0; j < i; j++) {
    mg_kernel_spec a = specs[j];
    a.heads = specs[i].heads;
    if (memcmp(&a, &specs[i], sizeof a) == 0) return 1;
  }
  return 0;
}

static void compile_model_on(const char *model, int sp, int n_archs, const char *const *archs) {
  mg_shape shape;
  load_shape(model, &shape);
  mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
  int n = 0;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_spec_for_model(&shape, sp, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &d), 0);
  assert_true(n >= 2);
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  int n_hdr;
  const mg_jit_header *hdr = mg_gen_headers(g, &n_hdr);
  int skipped = 0;
  for (int i = 0; i < n; i++) {
    mg_kernel k;
    if (mg_gen_kernel(g, &specs[i], &k, &d)) fail_msg("%s", mg_diag_msg(&d));
    /* rendered (the template's checks run on every spec); compiled once per head width */
    const int skip = !exhaustive() && same_but_heads(specs, i);
    skipped += skip && n_archs > 0;
    for (int a = 0; a < n_archs && !skip; a++) {
      mg_jit_opts o = {.arch = archs[a], .template_hash = mg_gen_template_hash(g),
                       .headers = hdr, .n_headers = n_hdr};
      mg_cubin c;
      if (mg_jit_compile(k.source, k.source_len, k.file, k.name, &o, &c, &d))
        fail_msg("%s", mg_diag_msg(&d));
      print_message("  %-56s %-6s regs %3d spill %ld+%ld smem %ld\n", k.name, archs[a],
                    c.report.registers, c.report.spill_stores, c.report.spill_loads,
                    c.report.smem_bytes);
      assert_true(c.report.registers > 0);
      assert_int_equal(c.report.spill_stores, 0);
      assert_int_equal(c.report.spill_loads, 0);
      assert_int_equal(c.report.smem_bytes, launch_smem_static(&k));
      mg_cubin_free(&c);
    }
    mg_kernel_free(&k);
  }
  if (skipped)
    print_message("  %d of %d kernels not compiled: another width of heads of the same kernel "
                  "was (all under MLAGEN_TEST_EXHAUSTIVE=1)\n", skipped, n);
  mg_gen_close(g);
}

static const char *const both_archs[] = {"sm_80", "sm_90a"};
static void compile_model(const char *model, int sp) { compile_model_on(model, sp, 2, both_archs); }

/* 1 under the ctest configuration exhaustive (MLAGEN_TEST_EXHAUSTIVE=1). */
static int exhaustive(void) {
  const char *e = getenv("MLAGEN_TEST_EXHAUSTIVE");
  return e && strcmp(e, "1") == 0;
}
/* DeepSeek-V3 at 128 heads: by default for sm_90a, the H200's arch; for sm_80 too under the
 * ctest configuration exhaustive: each of its sm_80 kernels had the registers of the same
 * family, dims and tunables at 16 heads (test_v2_lite, test_v3_sp8; split_dkv: 40 at 128
 * heads, 80 at 16; measured at 8ed989c), about 10 s of the suite. */
/* The model compiles below run for sm_90a (the H200's arch) by default and for sm_80 too
 * under the ctest configuration exhaustive (MLAGEN_TEST_EXHAUSTIVE=1): on sm_80 every family
 * compiles by default through test_unusual, and the attention families at DeepSeek's heads
 * through the kernel suites' NVRTC sweeps (test_attn_fwd, test_attn_bwd, test_mqa_*), which
 * compile for both archs. DeepSeek-V2-Lite's kernels (H 16) are DeepSeek-V3's at SP 8 but
 * for laga-f's head groups. */
static void test_v2_lite(void **state) {
  (void)state;
  compile_model_on("deepseek-v2-lite", 1, exhaustive() ? 2 : 1, exhaustive() ? both_archs : both_archs + 1);
}
static void test_v3(void **state) {
  (void)state;
  compile_model_on("deepseek-v3", 1, exhaustive() ? 2 : 1, exhaustive() ? both_archs : both_archs + 1);
}
static void test_v3_sp8(void **state) {
  (void)state;
  compile_model_on("deepseek-v3", 8, exhaustive() ? 2 : 1, exhaustive() ? both_archs : both_archs + 1);
}
/* Kimi K2 is DeepSeek-V3's dims at 64 heads (test_v3: 128, test_v3_sp8 and test_v2_lite:
 * 16). By default its kernels are generated (the templates' checks run on every one) but not
 * compiled: each of its sm_90a kernels had the registers of the same family, dims and
 * tunables at 16 and 128 heads (split_dkv: 40 at 64 and 128 heads, 80 at 16; measured at
 * 8ed989c), so its compiles repeat test_v3's and test_v2_lite's. The ctest configuration
 * exhaustive (MLAGEN_TEST_EXHAUSTIVE=1) compiles them for sm_80 and sm_90a (about 30 s). */
static void test_kimi_k2(void **state) {
  (void)state;
  compile_model_on("kimi-k2", 1, exhaustive() ? 2 : 0, both_archs);
}
static void test_unusual(void **state) { (void)state; compile_model(NULL, 1); }

/* Every configuration of the tunable space that the template's check keeps compiles for
 * sm_80 and sm_90a without spills, causal and not (neither is always the larger: ptxas held
 * the non-causal block_m 64 / 8 warps to 80 registers and spilled where the causal one took
 * 97, before the template's launch bounds said one CTA per SM). Every configuration is
 * rendered (the check runs on all); by default those that bring a block_m or a num_warps
 * not compiled yet for the shape (every kept value at least once), causal and non-causal in
 * turn, all of them both ways under MLAGEN_TEST_EXHAUSTIVE=1. The JIT cache is used, as in compile_model. */
static void test_all_kept_configs(void **state) {
  (void)state;
  const char *models[] = {"deepseek-v3", NULL};
  const int block_m[] = {16, 32, 64}, warps[] = {2, 4, 8};
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  int n_hdr, kept = 0, rejected = 0, compiled = 0;
  const mg_jit_header *hdr = mg_gen_headers(g, &n_hdr);
  for (int m = 0; m < 2; m++) {
    mg_shape shape;
    load_shape(models[m], &shape);
    mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
    int n;
    assert_int_equal(mg_spec_for_model(&shape, 1, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &d), 0);
    mg_kernel_spec s[3][3];
    int ok[3][3] = {{0}}, pick[3][3] = {{0}};
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 3; j++) { /* rendered: the template's check runs on every one */
        s[i][j] = specs[0];
        char a[32], b[32];
        snprintf(a, sizeof a, "block_m=%d", block_m[i]);
        snprintf(b, sizeof b, "num_warps=%d", warps[j]);
        assert_int_equal(mg_spec_set(&s[i][j], a, &d), 0);
        assert_int_equal(mg_spec_set(&s[i][j], b, &d), 0);
        mg_kernel k;
        int rc = mg_gen_kernel(g, &s[i][j], &k, &d);
        if (rc == MLAGEN_EINVAL && strstr(mg_diag_msg(&d), "rejected")) {
          rejected++;
          continue;
        }
        if (rc) fail_msg("%s", mg_diag_msg(&d));
        mg_kernel_free(&k);
        kept++, ok[i][j] = 1;
      }
    /* compiled: all, or first those bringing both a new block_m and a new num_warps, then
     * those bringing either */
    int seen_m = 0, seen_w = 0;
    for (int both = 1; both >= 0; both--)
      for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
          const int new_m = !(seen_m >> i & 1), new_w = !(seen_w >> j & 1);
          if (!ok[i][j] || pick[i][j] || !(exhaustive() || (both ? new_m && new_w : new_m || new_w)))
            continue;
          pick[i][j] = 1, seen_m |= 1 << i, seen_w |= 1 << j;
        }
    int n_pick = 0;
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 3; j++) {
        if (!pick[i][j]) continue;
        const int turn = (n_pick++ + m) % 2; /* by default causal or not, in turn */
        for (int causal = 1; causal >= 0; causal--) {
          if (!exhaustive() && causal != turn) continue;
          mg_kernel k;
          s[i][j].causal = causal;
          if (mg_gen_kernel(g, &s[i][j], &k, &d)) fail_msg("%s", mg_diag_msg(&d));
          compiled++;
          for (int arch = 0; arch < 2; arch++) {
            mg_jit_opts o = {.arch = arch ? "sm_90a" : "sm_80", .headers = hdr,
                             .n_headers = n_hdr, .template_hash = mg_gen_template_hash(g)};
            mg_cubin c;
            if (mg_jit_compile(k.source, k.source_len, k.file, k.name, &o, &c, &d))
              fail_msg("%s", mg_diag_msg(&d));
            print_message("  %-56s %-6s regs %3d spill %ld+%ld\n", k.name, o.arch,
                          c.report.registers, c.report.spill_stores, c.report.spill_loads);
            assert_int_equal(c.report.spill_stores + c.report.spill_loads, 0);
            mg_cubin_free(&c);
          }
          mg_kernel_free(&k);
        }
      }
  }
  print_message("  %d configurations kept (%d compiled), %d rejected by the template's check\n",
                kept, compiled, rejected);
  assert_true(kept >= 8 && rejected >= 2 && compiled >= 4);
  mg_diag_clear(&d);
  mg_gen_close(g);
}

static mg_kernel_spec v3_spec(int causal) {
  mg_shape shape;
  load_shape("deepseek-v3", &shape);
  mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
  int n = 0;
  assert_int_equal(mg_spec_for_model(&shape, 1, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, NULL), 0);
  for (int i = 0; i < n; i++)
    if (specs[i].causal == causal) return specs[i];
  fail();
  return specs[0];
}

static void test_tunable_overrides(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  mg_kernel_spec s = v3_spec(1);
  mg_kernel k;
  assert_int_equal(mg_spec_set(&s, "block_m=16", &d), 0);
  assert_int_equal(mg_spec_set(&s, "num_warps=2", &d), 0);
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), 0);
  assert_non_null(strstr(k.name, "_bm16_w2"));
  const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(k.manifest, "config");
  assert_int_equal(cJSON_GetObjectItemCaseSensitive(cfg, "block_m")->valueint, 16);
  assert_int_equal(cJSON_GetObjectItemCaseSensitive(cfg, "num_warps")->valueint, 2);
  mg_kernel_free(&k);

  s = v3_spec(1);
  assert_int_equal(mg_spec_set(&s, "block_m=24", &d), 0);
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_EINVAL);
  assert_string_equal(mg_diag_msg(&d), "explicit_fwd: block_m = 24 is not one of {16, 32, 64}");

  s = v3_spec(1);
  assert_int_equal(mg_spec_set(&s, "tile_q=64", &d), 0);
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "unknown tunable 'tile_q'"));

  s = v3_spec(1); /* 64 rows on 4 warps: 16 rows per warp */
  assert_int_equal(mg_spec_set(&s, "block_m=64", &d), 0);
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "more than 8 rows per warp"));
  assert_null(strstr(mg_diag_msg(&d), "traceback"));

  s = v3_spec(1); /* d_qk 256, d_v 256, 64 rows: 65792 bytes of smem, over 48 KiB */
  s.d_n = 192;
  s.d_v = 256;
  assert_int_equal(mg_spec_set(&s, "block_m=64", &d), 0);
  assert_int_equal(mg_spec_set(&s, "num_warps=8", &d), 0);
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "needs 65792 bytes of shared memory"));

  assert_int_equal(mg_spec_set(&s, "block_m", &d), MLAGEN_EINVAL);
  assert_int_equal(mg_spec_set(&s, "block_m=x", &d), MLAGEN_EINVAL);
  mg_diag_clear(&d);
  mg_gen_close(g);
}

static void test_spec_errors(void **state) {
  (void)state;
  mg_shape shape;
  load_shape("deepseek-v2-lite", &shape); /* 16 heads */
  mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
  int n;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_spec_for_model(&shape, 3, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "sp = 3 does not divide num_attention_heads = 16"));
  assert_non_null(strstr(mg_diag_msg(&d), "laga-cp"));
  /* no S here: the degrees are H's divisors, and the message says so */
  assert_non_null(strstr(mg_diag_msg(&d), "sp values dividing H (and the sequence length) work "
                                          "(here 1, 2, 4, 8, 16)"));
  assert_null(strstr(mg_diag_msg(&d), " S "));
  assert_int_equal(mg_spec_for_model(&shape, 1, "fp8", specs, MG_SPEC_MAX_KERNELS, &n, &d), MLAGEN_EINVAL);
  assert_int_equal(mg_spec_for_model(&shape, 16, "fp16", specs, MG_SPEC_MAX_KERNELS, &n, &d), 0);
  assert_int_equal(specs[0].heads, 1);
  mg_diag_clear(&d);
}

/* Copies the embedded template set into dir, replacing `line` (1-based) of
 * explicit_fwd.cu.tpl with `text`. */
static void write_templates(const char *dir, int line, const char *text) {
  assert_int_equal(mg_fs_mkdirs(dir, NULL), 0);
  for (const mg_embedded_file *f = mg_embedded_files; f->path; f++) {
    if (strncmp(f->path, "templates/", 10) != 0) continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, f->path + 10);
    if (line > 0 && strcmp(f->path, "templates/explicit_fwd.cu.tpl") == 0) {
      char *out = malloc(f->size + strlen(text) + 2);
      const char *p = f->data;
      size_t o = 0;
      for (int l = 1; *p; l++) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p + 1) : strlen(p);
        if (l == line) {
          o += (size_t)sprintf(out + o, "%s\n", text);
        } else {
          memcpy(out + o, p, len);
          o += len;
        }
        p += len;
      }
      assert_int_equal(mg_fs_write_atomic(path, out, o, NULL), 0);
      free(out);
    } else {
      assert_int_equal(mg_fs_write_atomic(path, f->data, f->size, NULL), 0);
    }
  }
}

/* The line number of the first line of the embedded template containing needle. */
static int template_line_of(const char *needle) {
  const char *t = mg_embed_find("templates/explicit_fwd.cu.tpl")->data;
  const char *hit = strstr(t, needle);
  assert_non_null(hit);
  int line = 1;
  for (const char *p = t; p < hit; p++) line += *p == '\n';
  return line;
}

static void test_nvrtc_error_names_template_line(void **state) {
  (void)state;
  char dir[] = "/tmp/mlagen-tpl-XXXXXX";
  assert_non_null(mkdtemp(dir));
  int line = template_line_of("const float scale_log2");
  write_templates(dir, line, "  const float scale_log2 = softmax_scale * undefined_symbol;");
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, dir, &d), 0);
  mg_kernel_spec s = v3_spec(1);
  mg_kernel k;
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), 0);
  int n_hdr;
  const mg_jit_header *hdr = mg_gen_headers(g, &n_hdr);
  mg_jit_opts o = {.arch = "sm_90a", .no_cache = 1, .headers = hdr, .n_headers = n_hdr};
  mg_cubin c;
  assert_int_equal(mg_jit_compile(k.source, k.source_len, k.file, k.name, &o, &c, &d), MLAGEN_ECOMPILE);
  char expect[600];
  snprintf(expect, sizeof expect, "%s/explicit_fwd.cu.tpl(%d)", dir, line);
  if (!strstr(mg_diag_msg(&d), expect)) fail_msg("expected '%s' in:\n%s", expect, mg_diag_msg(&d));
  assert_non_null(strstr(mg_diag_msg(&d), "undefined_symbol"));
  mg_kernel_free(&k);
  mg_gen_close(g);

  /* a Lua error in the template names the template file and line, with a traceback */
  write_templates(dir, template_line_of("@ local ESIZE"), "@ local ESIZE = elem_size(spec.no_such_field)");
  assert_int_equal(mg_gen_open(&g, dir, &d), 0);
  assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_ETEMPLATE);
  snprintf(expect, sizeof expect, "%s/explicit_fwd.cu.tpl:%d:", dir, template_line_of("@ local ESIZE"));
  if (!strstr(mg_diag_msg(&d), expect)) fail_msg("expected '%s' in:\n%s", expect, mg_diag_msg(&d));
  assert_non_null(strstr(mg_diag_msg(&d), "unknown dtype"));
  assert_non_null(strstr(mg_diag_msg(&d), "traceback"));
  mg_gen_close(g);
  mg_diag_clear(&d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

/* The typed manifest (mg_kernel.info) says what the JSON entry says, the family facts of
 * kernel{} are checked where they are declared, and the parser refuses malformed entries. */
static void test_kernel_facts(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  for (const char *const *f = mg_spec_families; *f; f++) {
    mg_kernel_spec s = v3_spec(1);
    snprintf(s.family, sizeof s.family, "%s", *f);
    mg_kernel k;
    if (mg_gen_kernel(g, &s, &k, &d)) fail_msg("%s: %s", *f, mg_diag_msg(&d));
    const mg_kernel_info *i = &k.info;
    assert_string_equal(i->name, k.name);
    assert_string_equal(i->family, *f);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(k.manifest, "params");
    assert_int_equal(i->n_params, cJSON_GetArraySize(params));
    for (int p = 0; p < i->n_params; p++) {
      const cJSON *e = cJSON_GetArrayItem(params, p);
      assert_string_equal(i->params[p].name, cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring);
      const char *type = cJSON_GetObjectItemCaseSensitive(e, "type")->valuestring;
      const mg_param_kind want = strchr(type, '*') ? (strncmp(type, "const", 5) ? MG_PARAM_OUT : MG_PARAM_IN)
                                 : strcmp(type, "int") == 0   ? MG_PARAM_INT
                                 : strcmp(type, "float") == 0 ? MG_PARAM_FLOAT
                                 : strncmp(type, "const __grid_constant__ mla::sm90::TensorMaps<", 46) == 0
                                     ? MG_PARAM_TMAPS /* <4> attn_fwd_sm90, <2> mqa_fwd_sm90, <5> the backward */
                                     : (mg_param_kind)-1;
      assert_int_equal(i->params[p].kind, want);
    }
    const cJSON *block = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(k.manifest, "launch"), "block");
    for (int b = 0; b < 3; b++)
      assert_int_equal(i->launch.block[b], cJSON_GetArrayItem(block, b)->valueint);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(k.manifest, "config");
    assert_int_equal(i->n_config, cJSON_GetArraySize(cfg));
    for (int c = 0; c < i->n_config; c++)
      assert_int_equal(i->config[c].value, cJSON_GetObjectItemCaseSensitive(cfg, i->config[c].name)->valueint);
    assert_true(i->n_tunables >= 1);
    for (int t = 0; t < i->n_interface; t++) { /* an interface tunable is a declared one */
      int found = 0;
      for (int u = 0; u < i->n_tunables; u++) found |= strcmp(i->tunables[u].name, i->interface[t]) == 0;
      assert_true(found);
    }
    assert_true(strcmp(i->pass, "fwd") == 0 || strcmp(i->pass, "bwd") == 0);
    mg_kernel_free(&k);
  }
  mg_gen_close(g);

  /* the prelude checks the facts where they are declared */
  char dir[] = "/tmp/mlagen-tpl-XXXXXX";
  assert_non_null(mkdtemp(dir));
  const int line = template_line_of("@   family = \"explicit_fwd\",");
  static const struct { const char *text, *msg; } bad[] = {
      {"@   family = \"explicit_fwd\", interface = { \"nope\" },", "interface names 'nope', not a tunable"},
      {"@   family = \"explicit_fwd\", pass = \"sideways\",", "pass must be \"fwd\" or \"bwd\""},
      {"@   family = \"explicit_fwd\", causal = 1,", "causal must be a boolean"},
      {"@   family = \"explicit_fwd\", flops = \"many\",", "flops is not {pair = n, row = n}"},
  };
  for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
    write_templates(dir, line, bad[b].text);
    assert_int_equal(mg_gen_open(&g, dir, &d), 0);
    mg_kernel_spec s = v3_spec(1);
    mg_kernel k;
    assert_int_equal(mg_gen_kernel(g, &s, &k, &d), MLAGEN_ETEMPLATE);
    if (!strstr(mg_diag_msg(&d), bad[b].msg)) fail_msg("expected '%s' in:\n%s", bad[b].msg, mg_diag_msg(&d));
    mg_gen_close(g);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);

  /* the parser */
  static const struct { const char *json, *msg; } ent[] = {
      {"{\"name\": \"k\", \"family\": \"f\", \"params\": [{\"name\": \"x\", \"type\": \"double\"}], "
       "\"launch\": {\"grid\": [{\"value\": 1}, {\"value\": 1}, {\"value\": 1}], \"block\": [32, 1, 1], \"smem\": 0}}",
       "parameter x has type 'double'"},
      {"{\"name\": \"k\", \"family\": \"f\", \"params\": [], \"config\": {\"b\": 1.5}, "
       "\"launch\": {\"grid\": [{\"value\": 1}, {\"value\": 1}, {\"value\": 1}], \"block\": [32, 1, 1], \"smem\": 0}}",
       "config is not a table"},
      {"{\"name\": \"k\", \"params\": [], "
       "\"launch\": {\"grid\": [{\"value\": 1}, {\"value\": 1}, {\"value\": 1}], \"block\": [32, 1, 1], \"smem\": 0}}",
       "without a string \"family\""},
  };
  for (size_t e = 0; e < sizeof ent / sizeof ent[0]; e++) {
    cJSON *j = cJSON_Parse(ent[e].json);
    assert_non_null(j);
    mg_kernel_info info;
    assert_int_equal(mg_manifest_parse(j, &info, &d), MLAGEN_EINVAL);
    if (!strstr(mg_diag_msg(&d), ent[e].msg)) fail_msg("expected '%s' in:\n%s", ent[e].msg, mg_diag_msg(&d));
    assert_string_equal(info.name, ""); /* zeroed on error */
    cJSON_Delete(j);
  }
  mg_diag_clear(&d);
}

static void test_template_hash_and_override(void **state) {
  (void)state;
  char dir[] = "/tmp/mlagen-tpl-XXXXXX";
  assert_non_null(mkdtemp(dir));
  write_templates(dir, 0, NULL);
  mg_gen *a, *b;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_gen_open(&a, NULL, &d), 0);
  assert_int_equal(mg_gen_open(&b, dir, &d), 0);
  assert_string_equal(mg_gen_template_hash(a), mg_gen_template_hash(b)); /* same bytes */
  mg_gen_close(b);
  write_templates(dir, 1, "@ -- edited");
  assert_int_equal(mg_gen_open(&b, dir, &d), 0);
  assert_string_not_equal(mg_gen_template_hash(a), mg_gen_template_hash(b));
  mg_gen_close(b);
  char path[128];
  snprintf(path, sizeof path, "%s/prelude.lua", dir);
  assert_int_equal(remove(path), 0);
  assert_int_equal(mg_gen_open(&b, dir, &d), MLAGEN_EIO);
  assert_non_null(strstr(mg_diag_msg(&d), "prelude.lua"));
  mg_gen_close(a);
  mg_diag_clear(&d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_manifest(void **state) {
  (void)state;
  char dir[] = "/tmp/mlagen-gen-XXXXXX";
  assert_non_null(mkdtemp(dir));
  mg_shape shape;
  load_shape("kimi-k2", &shape);
  mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
  int n;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_spec_for_model(&shape, 4, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &d), 0);
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  static mg_kernel k[MG_SPEC_MAX_KERNELS]; /* ~2.5 MiB: not on the stack */
  for (int i = 0; i < n; i++) assert_int_equal(mg_gen_kernel(g, &specs[i], &k[i], &d), 0);
  assert_int_equal(mg_gen_write(g, &shape, 4, k, n, dir, &d), 0);

  char path[256];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  char *text;
  size_t len;
  assert_int_equal(mg_fs_read(path, 1 << 20, &text, &len, &d), 0);
  cJSON *m = cJSON_Parse(text);
  free(text);
  assert_non_null(m);
  assert_string_equal(cJSON_GetObjectItem(m, "template_hash")->valuestring, mg_gen_template_hash(g));
  assert_int_equal(cJSON_GetObjectItem(m, "sp")->valueint, 4);
  const cJSON *model = cJSON_GetObjectItem(m, "model");
  assert_int_equal(cJSON_GetObjectItem(model, "num_attention_heads")->valueint, 64);
  const cJSON *list = cJSON_GetObjectItem(m, "kernels");
  assert_int_equal(cJSON_GetArraySize(list), n);
  const cJSON *k0 = cJSON_GetArrayItem(list, 0);
  assert_string_equal(cJSON_GetObjectItem(k0, "name")->valuestring, k[0].name);
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(k0, "spec"), "heads")->valueint, 16);
  const cJSON *params = cJSON_GetObjectItem(k0, "params");
  const char *names[] = {"q", "k_nope", "k_rope", "v", "o", "lse", "seqlen_q", "seqlen_k", "q_pos0",
                         "softmax_scale"};
  assert_int_equal(cJSON_GetArraySize(params), 10);
  for (int i = 0; i < 10; i++)
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(params, i), "name")->valuestring, names[i]);
  const cJSON *grid = cJSON_GetObjectItem(cJSON_GetObjectItem(k0, "launch"), "grid");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(grid, 0), "arg")->valuestring, "seqlen_q");
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(grid, 1), "value")->valueint, 16);
  cJSON_Delete(m);

  /* the .cu files and the device header are there, and the source carries #line */
  snprintf(path, sizeof path, "%s/%s", dir, k[0].file);
  assert_true(mg_fs_is_file(path));
  snprintf(path, sizeof path, "%s/%s", dir, MG_DEVICE_HEADER);
  assert_true(mg_fs_is_file(path));
  assert_non_null(strstr(k[0].source, "#line "));
  assert_non_null(strstr(k[0].source, "\"templates/explicit_fwd.cu.tpl\""));
  for (int i = 0; i < n; i++) mg_kernel_free(&k[i]);
  mg_gen_close(g);
  mg_diag_clear(&d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

/* A model whose d_n = d_v = d_c (so the absorbed backward's delta kernel is the explicit
 * one) and whose ranks hold one LAGA-F group: every spec, hence every kernel name, once. */
/* mg_spec_for_plan lists every attention, K/V expansion and dK/dV split kernel each form's
 * plan launches at that P, at the heads the CUDA executor asks for (mg_cuda_exec.c: the
 * q buffer's heads, the expanded buffer's): laga-cp's group heads (H / its default groups,
 * at any P) and laga-f's included. deepseek-v2-lite at P = 4: laga-cp attends 2 heads,
 * laga-f 1, Ulysses 4. */
static void test_specs_cover_plans(void **state) {
  (void)state;
  static const char *const models[] = {"deepseek-v2-lite", "deepseek-v3", NULL};
  static const int sps[] = {1, 2, 4, 8};
  mg_plan *p = malloc(sizeof *p);
  assert_non_null(p);
  for (int m = 0; m < 3; m++) {
    mg_shape shape;
    load_shape(models[m], &shape);
    for (size_t si = 0; si < sizeof sps / sizeof *sps; si++) {
      const int P = sps[si];
      if (shape.heads % P) continue;
      mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
      int n = 0;
      mg_diag d = MG_DIAG_INIT;
      if (mg_spec_for_plan(&shape, P, 0, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &d))
        fail_msg("%s", mg_diag_msg(&d));
      int checked = 0;
      for (int f = 0; f < MG_FORM_COUNT; f++)
        for (int causal = 0; causal < 2; causal++) {
          const mg_plan_args a = {.shape = &shape, .form = (mg_form)f, .sp = P, .batch = 1,
                                  .seq = 4 * P, .causal = causal, .dtype = MG_BF16};
          if (mg_plan_build(p, &a, &d)) fail_msg("form %d P %d: %s", f, P, mg_diag_msg(&d));
          for (int i = 0; i < p->n_steps; i++) {
            const mg_step *st = &p->steps[i];
            if (st->kind != MG_STEP_KERNEL ||
                (st->op != MG_OP_ATTN_FWD && st->op != MG_OP_ATTN_BWD &&
                 st->op != MG_OP_EXPAND_KV && st->op != MG_OP_SPLIT_DKV))
              continue;
            const int heads = (int)p->bufs[st->in[0]].dims[2];
            for (int k = 0; k < MG_SPEC_OP_FAMILIES && mg_op_family(st->op, k); k++) {
              int found = 0;
              for (int j = 0; j < n && !found; j++)
                found = !strcmp(specs[j].family, mg_op_family(st->op, k)) &&
                        specs[j].heads == heads && specs[j].causal == causal &&
                        specs[j].d_n == shape.qk_nope_head_dim &&
                        /* the step's key layout (split keys: k_packed = 0) */
                        mg_spec_split_keys(&specs[j]) == (st->split_keys && mg_spec_keyed(specs[j].family));
              if (!found)
                fail_msg("%s P %d form %d: step %d (%s) needs %s at %d heads, %s, %s keys: not listed",
                         models[m] ? models[m] : "unusual", P, f, i, st->label,
                         mg_op_family(st->op, k), heads, causal ? "causal" : "non-causal",
                         st->split_keys ? "split" : "packed");
              checked++;
            }
          }
        }
      assert_true(checked > 0);
    }
  }
  free(p);
}

static void test_specs_unique(void **state) {
  (void)state;
  const char *json =
      "{\"model_type\": \"deepseek_v3\", \"num_attention_heads\": 16, \"kv_lora_rank\": 128,"
      " \"qk_rope_head_dim\": 64, \"qk_nope_head_dim\": 128, \"v_head_dim\": 128}";
  mg_shape shape;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_config_parse(json, strlen(json), "dn=dv=dc", &shape, &d), 0);
  const int sps[2] = {1, 16};
  for (int k = 0; k < 2; k++) {
    mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
    int n = 0;
    assert_int_equal(mg_spec_for_model(&shape, sps[k], "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &d), 0);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < i; j++)
        if (!memcmp(&specs[i], &specs[j], sizeof specs[i]))
          fail_msg("sp %d: spec %d (%s) repeats spec %d", sps[k], i, specs[i].family, j);
  }
  /* a head-group count that does not divide a rank's heads */
  mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
  int n = 0;
  assert_int_equal(mg_spec_for_plan(&shape, 1, 3, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "head_groups = 3"));
  assert_int_equal(mg_spec_for_plan(&shape, 1, 2, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &d), 0);
  int found = 0;
  for (int i = 0; i < n; i++) found |= !strcmp(specs[i].family, "attn_fwd") && specs[i].heads == 8;
  assert_true(found);
  mg_diag_clear(&d);
}

/* The per-arch family table (mg_arch_kernel_table) and what reads it: sm_90a runs
 * attn_fwd_sm90 for the explicit forward, attn_bwd_dkdv_sm90 / attn_bwd_dq_sm90 for its
 * backward and the portable families for everything else; sm_80, sm_86,
 * sm_89 and no arch run the portable ones; the plan tunables of attn_fwd_sm90 (k_packed = 1)
 * come from its row; mg_spec_for_model lists no arch family. */
static void test_arch_families(void **state) {
  (void)state;
  static const char *const portable_archs[] = {NULL, "", "sm_80", "sm_86", "sm_89"};
  for (size_t a = 0; a < sizeof portable_archs / sizeof *portable_archs; a++)
    for (int op = MG_SPEC_OP_A2A; op <= MG_OP_COPY_COLS; op++)
      for (int i = 0; i < MG_SPEC_OP_FAMILIES; i++) {
        const char *f = mg_op_family_arch(op, i, portable_archs[a]), *p = mg_op_family(op, i);
        assert_true(f == p || (f && p && !strcmp(f, p)));
      }
  assert_string_equal(mg_op_family_arch(MG_OP_ATTN_FWD, 0, "sm_90a"), "attn_fwd_sm90");
  assert_null(mg_op_family_arch(MG_OP_ATTN_FWD, 1, "sm_90a"));
  /* the explicit backward: attn_bwd_pre (portable) then the sm_90a dK/dV and dQ kernels */
  static const char *const bwd90[3] = {"attn_bwd_pre", "attn_bwd_dkdv_sm90", "attn_bwd_dq_sm90"};
  for (int i = 0; i < 3; i++) {
    assert_string_equal(mg_op_family_arch(MG_OP_ATTN_BWD, i, "sm_90a"), bwd90[i]);
    assert_string_equal(mg_op_family_arch(MG_OP_ATTN_BWD, i, "sm_80"), mg_op_family(MG_OP_ATTN_BWD, i));
  }
  assert_string_equal(mg_family_portable("attn_bwd_dkdv_sm90"), "attn_bwd_dkdv");
  assert_string_equal(mg_family_portable("attn_bwd_dq_sm90"), "attn_bwd_dq");
  /* the absorbed backward's row is on request: mqa_bwd_dkv / mqa_bwd_dq on sm_90a */
  assert_string_equal(mg_op_family_arch(MG_OP_MQA_BWD, 1, "sm_90a"), "mqa_bwd_dkv");
  assert_string_equal(mg_family_portable("attn_fwd_sm90"), "attn_fwd");
  assert_string_equal(mg_family_portable("attn_fwd"), "attn_fwd");
  assert_true(mg_family_runs_on("attn_fwd_sm90", "sm_90a"));
  assert_false(mg_family_runs_on("attn_fwd_sm90", "sm_80"));
  assert_true(mg_family_runs_on("attn_fwd", "sm_90a"));
  assert_true(mg_spec_family_on_request("attn_fwd_sm90"));
  assert_false(mg_spec_family_on_request("attn_fwd"));
  /* mqa_fwd_sm90's row is on request: the absorbed forward stays mqa_fwd on sm_90a, the
   * family is sm_90a's and rendered on request beside mqa_fwd */
  assert_string_equal(mg_op_family_arch(MG_OP_MQA_FWD, 0, "sm_90a"), "mqa_fwd");
  assert_string_equal(mg_family_portable("mqa_fwd_sm90"), "mqa_fwd");
  assert_true(mg_family_runs_on("mqa_fwd_sm90", "sm_90a"));
  assert_false(mg_family_runs_on("mqa_fwd_sm90", "sm_80"));
  assert_true(mg_spec_family_on_request("mqa_fwd_sm90"));
  /* a plan spec of attn_fwd (k_packed = 1, plus an override) becomes attn_fwd_sm90 with the
   * row's fixed k_packed = 1 and nothing else; other families and archs are unchanged */
  mg_kernel_spec s = v3_spec(1), t;
  snprintf(s.family, sizeof s.family, "attn_fwd");
  mg_spec_plan_tunables(&s);
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_spec_set(&s, "block_m=128", &d), 0);
  assert_int_equal(mg_spec_to_arch(&s, "sm_90a", &t), 1);
  assert_string_equal(t.family, "attn_fwd_sm90");
  assert_int_equal(t.n_config, 1);
  assert_string_equal(t.config[0].name, "k_packed");
  assert_int_equal(t.config[0].value, 1);
  assert_int_equal(mg_spec_to_arch(&s, "sm_80", &t), 0);
  assert_string_equal(t.arch, "sm_80"); /* only the target set */
  memset(t.arch, 0, sizeof t.arch);
  assert_memory_equal(&s, &t, sizeof s);
  snprintf(s.family, sizeof s.family, "attn_bwd_dq");
  assert_int_equal(mg_spec_to_arch(&s, "sm_90a", &t), 1);
  assert_string_equal(t.family, "attn_bwd_dq_sm90");
  snprintf(s.family, sizeof s.family, "mqa_bwd_dq");
  assert_int_equal(mg_spec_to_arch(&s, "sm_90a", &t), 0);
  assert_string_equal(t.family, "mqa_bwd_dq");
  mg_shape shape;
  load_shape("deepseek-v3", &shape);
  mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
  int n = 0;
  assert_int_equal(mg_spec_for_model(&shape, 1, "bf16", specs, MG_SPEC_MAX_KERNELS, &n, &d), 0);
  for (int i = 0; i < n; i++) assert_string_not_equal(specs[i].family, "attn_fwd_sm90");
  for (int i = 0; i < n; i++) assert_string_not_equal(specs[i].family, "mqa_fwd_sm90");
  /* the shared-memory limit of the target: every kernel rendered for sm_86 and sm_89 fits
   * their 99 KiB (at sm_80's defaults several need 109-152 KiB); sm_80 and sm_90a render
   * the portable families exactly as a spec for no arch does (their limit is sm_80's),
   * attn_fwd_sm90 takes sm_90a's 227 KiB */
  mg_gen *g;
  assert_int_equal(mg_gen_open(&g, NULL, &d), 0);
  static const char *const archs[] = {"sm_86", "sm_89", "sm_80", "sm_90a"};
  int over_80 = 0;
  for (int i = 0; i < n; i++) {
    mg_kernel base;
    if (mg_gen_kernel(g, &specs[i], &base, &d)) fail_msg("%s: %s", specs[i].family, mg_diag_msg(&d));
    over_80 += base.info.launch.smem > 99 * 1024;
    for (int a = 0; a < 4; a++) {
      mg_kernel_spec as;
      mg_spec_to_arch(&specs[i], archs[a], &as);
      assert_string_equal(as.arch, archs[a]);
      mg_kernel k;
      if (mg_gen_kernel(g, &as, &k, &d)) fail_msg("%s %s: %s", archs[a], as.family, mg_diag_msg(&d));
      const long limit = a < 2 ? 99 * 1024 : strcmp(mg_family_portable(as.family), as.family) ? 227 * 1024 : 163 * 1024;
      if ((long)k.info.launch.smem > limit)
        fail_msg("%s %s: %zu bytes of shared memory, over %ld", archs[a], k.name, k.info.launch.smem, limit);
      if (a >= 2 && !strcmp(as.family, specs[i].family)) {
        assert_string_equal(k.name, base.name);
        assert_true(k.source_len == base.source_len && !memcmp(k.source, base.source, k.source_len));
      }
      mg_kernel_free(&k);
    }
    mg_kernel_free(&base);
  }
  assert_true(over_80 > 0); /* the check above is not vacuous */
  mg_gen_close(g);
}

int main(void) {
  const char *filter = getenv("MLAGEN_TEST_FILTER"); /* a cmocka pattern: one ctest entry */
  if (filter) cmocka_set_test_filter(filter);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_specs_unique),
      cmocka_unit_test(test_specs_cover_plans),
      cmocka_unit_test(test_spec_errors),
      cmocka_unit_test(test_tunable_overrides),
      cmocka_unit_test(test_template_hash_and_override),
      cmocka_unit_test(test_manifest),
      cmocka_unit_test(test_kernel_facts),
      cmocka_unit_test(test_nvrtc_error_names_template_line),
      cmocka_unit_test(test_v2_lite),
      cmocka_unit_test(test_v3),
      cmocka_unit_test(test_v3_sp8),
      cmocka_unit_test(test_kimi_k2),
      cmocka_unit_test(test_unusual),
      cmocka_unit_test(test_all_kept_configs),
      cmocka_unit_test(test_arch_families),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
