/* test_config.c: HF config.json -> mg_shape (generator/core/mg_config.c). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mg_config.h"
#include "mlagen.h"

#define CONFIGS MLAGEN_TEST_DATA "/configs/"

/* Expected attention dims of a shipped model (MLA.md, "Real MLA models"). */
typedef struct expect {
  const char *name, *model_type;
  int H, d_c, d_r, d_n, d_v, d_q, D;
  double factor, mscale_all_dim;
} expect;

static const expect shipped[] = {
  {"deepseek-v3", "deepseek_v3", 128, 512, 64, 128, 128, 1536, 7168, 40, 1.0},
  {"deepseek-v2-lite", "deepseek_v2", 16, 512, 64, 128, 128, 0, 2048, 40, 0.707},
  {"kimi-k2", "kimi_k2", 64, 512, 64, 128, 128, 1536, 7168, 32, 1.0},
};

/* The scale from the formula, computed here independently of mg_config.c. */
static double expected_scale(double factor, double mscale_all_dim, int d_n, int d_r) {
  double m = 0.1 * mscale_all_dim * log(factor) + 1.0;
  return m * m / sqrt((double)(d_n + d_r));
}

static void check_expect(const mg_shape *s, const expect *e) {
  assert_string_equal(s->model_type, e->model_type);
  assert_int_equal(s->heads, e->H);
  assert_int_equal(s->kv_lora_rank, e->d_c);
  assert_int_equal(s->qk_rope_head_dim, e->d_r);
  assert_int_equal(s->qk_nope_head_dim, e->d_n);
  assert_int_equal(s->v_head_dim, e->d_v);
  assert_int_equal(s->q_lora_rank, e->d_q);
  assert_int_equal(s->hidden_size, e->D);
  assert_string_equal(s->rope_type, "yarn");
  assert_true(s->rope_factor == e->factor);
  assert_true(s->mscale_all_dim == e->mscale_all_dim);
  assert_true(fabs(s->softmax_scale - expected_scale(e->factor, e->mscale_all_dim, e->d_n, e->d_r))
              < 1e-12);
  assert_int_equal(s->n_notes, 0); /* the shipped configs give every value */
}

static void test_shipped_by_name(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++) {
    mg_shape s;
    mg_diag d = MG_DIAG_INIT;
    assert_int_equal(mg_config_load(shipped[i].name, &s, &d), 0);
    assert_null(d.msg);
    assert_string_equal(s.source, shipped[i].name);
    check_expect(&s, &shipped[i]);
  }
}

static void test_shipped_by_path(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/configs/%s.json", MLAGEN_SOURCE_DIR, shipped[i].name);
    mg_shape s;
    mg_diag d = MG_DIAG_INIT;
    assert_int_equal(mg_config_load(path, &s, &d), 0);
    assert_string_equal(s.source, path);
    check_expect(&s, &shipped[i]);
  }
}

static void test_default_and_suffix(void **state) {
  (void)state;
  mg_shape a, b, c;
  assert_int_equal(mg_config_load(NULL, &a, NULL), 0);
  assert_int_equal(mg_config_load("", &b, NULL), 0);
  assert_int_equal(mg_config_load("deepseek-v3.json", &c, NULL), 0);
  assert_string_equal(a.source, MG_CONFIG_DEFAULT);
  assert_string_equal(c.source, "deepseek-v3");
  assert_int_equal(a.heads, 128);
  assert_memory_equal(&a, &b, sizeof a);
  assert_memory_equal(&a, &c, sizeof a);
  assert_string_equal(mg_config_shipped[0], "deepseek-v2-lite");
  assert_null(mg_config_shipped[3]);
}

/* The numbers spelled out: DeepSeek-V3 mscale = 0.1 * 1.0 * ln 40 + 1, scale =
 * mscale^2 / sqrt(128 + 64); MLA.md gives 1.3689 and 0.13523; V2-Lite 0.11472. */
static void test_softmax_scale(void **state) {
  (void)state;
  mg_shape s;
  assert_int_equal(mg_config_load("deepseek-v3", &s, NULL), 0);
  double m = 0.1 * 1.0 * log(40.0) + 1.0;
  assert_true(fabs(s.mscale - m) < 1e-15);
  assert_true(fabs(s.mscale - 1.3689) < 1e-4);
  assert_true(fabs(s.softmax_scale - m * m / sqrt(192.0)) < 1e-15);
  assert_true(fabs(s.softmax_scale - 0.13523) < 1e-5);

  assert_int_equal(mg_config_load("deepseek-v2-lite", &s, NULL), 0);
  m = 0.1 * 0.707 * log(40.0) + 1.0;
  assert_true(fabs(s.softmax_scale - m * m / sqrt(192.0)) < 1e-15);
  assert_true(fabs(s.softmax_scale - 0.11472) < 1e-5);

  assert_int_equal(mg_config_load("kimi-k2", &s, NULL), 0);
  m = 0.1 * 1.0 * log(32.0) + 1.0;
  assert_true(fabs(s.softmax_scale - m * m / sqrt(192.0)) < 1e-15);
}

/* rope_parameters + rope_type (newer transformers) reads as rope_scaling + type. */
static void test_rope_parameters(void **state) {
  (void)state;
  mg_shape v3, s;
  assert_int_equal(mg_config_load("deepseek-v3", &v3, NULL), 0);
  assert_int_equal(mg_config_load(CONFIGS "good_rope_parameters.json", &s, NULL), 0);
  assert_string_equal(s.rope_type, "yarn");
  assert_true(s.rope_factor == 40 && s.mscale_all_dim == 1.0);
  assert_true(s.mscale == v3.mscale && s.softmax_scale == v3.softmax_scale);
  assert_int_equal(s.heads, v3.heads);
  assert_int_equal(s.n_notes, 0);

  /* Both objects, agreeing: accepted. */
  const char *both = "{\"num_attention_heads\": 16, \"kv_lora_rank\": 512,"
                     " \"qk_rope_head_dim\": 64, \"qk_nope_head_dim\": 128, \"v_head_dim\": 128,"
                     " \"q_lora_rank\": null, \"rope_scaling\": {\"type\": \"yarn\","
                     " \"factor\": 40, \"mscale_all_dim\": 1},"
                     " \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 40.0,"
                     " \"mscale_all_dim\": 1.0, \"rope_theta\": 10000}}";
  assert_int_equal(mg_config_parse(both, strlen(both), "both", &s, NULL), 0);
  assert_true(s.softmax_scale == v3.softmax_scale);
}

/* rope_type wins over type when both are given, and says so. */
static void test_rope_type_wins(void **state) {
  (void)state;
  const char *j = "{\"num_attention_heads\": 16, \"kv_lora_rank\": 512, \"qk_rope_head_dim\": 64,"
                  " \"qk_nope_head_dim\": 128, \"v_head_dim\": 128, \"q_lora_rank\": null,"
                  " \"rope_scaling\": {\"type\": \"linear\", \"rope_type\": \"yarn\","
                  " \"factor\": 40, \"mscale_all_dim\": 1.0}}";
  mg_shape s;
  assert_int_equal(mg_config_parse(j, strlen(j), "t", &s, NULL), 0);
  assert_string_equal(s.rope_type, "yarn");
  assert_true(fabs(s.softmax_scale - expected_scale(40, 1.0, 128, 64)) < 1e-15);
  assert_int_equal(s.n_notes, 1);
  assert_non_null(strstr(s.notes[0], "rope_type"));
}

static void test_text_config(void **state) {
  (void)state;
  mg_shape v3, s;
  assert_int_equal(mg_config_load("deepseek-v3", &v3, NULL), 0);
  assert_int_equal(mg_config_load(CONFIGS "good_text_config.json", &s, NULL), 0);
  assert_string_equal(s.model_type, "deepseek_v3");
  assert_int_equal(s.heads, 128); /* not the vision tower's 16 */
  assert_int_equal(s.kv_lora_rank, 512);
  assert_int_equal(s.q_lora_rank, 1536);
  assert_true(s.softmax_scale == v3.softmax_scale);
}

/* Not DeepSeek's numbers: d_n 64, d_r 32, d_v 64, d_c 256, H 40, no rope scaling. */
static void test_generic(void **state) {
  (void)state;
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_config_load(CONFIGS "good_generic.json", &s, &d), 0);
  assert_string_equal(s.model_type, "");
  assert_int_equal(s.heads, 40);
  assert_int_equal(s.kv_lora_rank, 256);
  assert_int_equal(s.qk_rope_head_dim, 32);
  assert_int_equal(s.qk_nope_head_dim, 64);
  assert_int_equal(s.v_head_dim, 64);
  assert_int_equal(s.q_lora_rank, 768);
  assert_int_equal(s.hidden_size, 2560);
  assert_string_equal(s.rope_type, "");
  assert_true(s.rope_factor == 1 && s.mscale == 1);
  assert_true(fabs(s.softmax_scale - 1.0 / sqrt(96.0)) < 1e-15);
  assert_int_equal(s.n_notes, 0);
}

/* A directory is read as an HF model folder holding config.json. */
static void test_model_dir(void **state) {
  (void)state;
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_config_load(CONFIGS "hf-model", &s, &d), 0);
  assert_non_null(strstr(s.source, "hf-model/config.json"));
  assert_int_equal(s.heads, 40);
  assert_int_equal(s.q_lora_rank, 0);
  assert_int_equal(s.hidden_size, 0);
  assert_int_equal(mg_config_load(MLAGEN_TEST_DATA, &s, &d), MLAGEN_EIO);
  assert_non_null(strstr(d.msg, "without config.json"));
  mg_diag_clear(&d);
}

static const char *const mla_keys =
    "\"num_attention_heads\": 16, \"kv_lora_rank\": 512, \"qk_rope_head_dim\": 64,"
    " \"qk_nope_head_dim\": 128, \"v_head_dim\": 128";

static int parse_with(const char *extra, mg_shape *s, mg_diag *d) {
  char j[1024];
  snprintf(j, sizeof j, "{%s%s%s}", mla_keys, extra[0] ? ", " : "", extra);
  return mg_config_parse(j, strlen(j), "inline", s, d);
}

/* Derived values are noted; explicit ones are not. */
static void test_notes(void **state) {
  (void)state;
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(parse_with("", &s, &d), 0);
  assert_int_equal(s.n_notes, 1);
  assert_non_null(strstr(s.notes[0], "q_lora_rank absent"));
  assert_int_equal(s.q_lora_rank, 0);

  assert_int_equal(parse_with("\"q_lora_rank\": null", &s, &d), 0);
  assert_int_equal(s.n_notes, 0);

  assert_int_equal(parse_with("\"q_lora_rank\": null, \"rope_scaling\": {\"type\": \"yarn\","
                              " \"factor\": 40}", &s, &d), 0);
  assert_int_equal(s.n_notes, 1);
  assert_non_null(strstr(s.notes[0], "rope_scaling.mscale_all_dim absent"));
  assert_true(s.mscale == 1.0);
  assert_true(fabs(s.softmax_scale - 1.0 / sqrt(192.0)) < 1e-15);

  /* Explicit mscale_all_dim 0, or yarn factor <= 1: mscale 1, nothing to note. */
  assert_int_equal(parse_with("\"q_lora_rank\": null, \"rope_scaling\": {\"type\": \"yarn\","
                              " \"factor\": 40, \"mscale_all_dim\": 0}", &s, &d), 0);
  assert_int_equal(s.n_notes, 0);
  assert_true(s.mscale == 1.0);
  assert_int_equal(parse_with("\"q_lora_rank\": null, \"rope_scaling\": {\"type\": \"yarn\","
                              " \"factor\": 1, \"mscale_all_dim\": 1}", &s, &d), 0);
  assert_true(s.mscale == 1.0);
  /* Only yarn changes the scale. */
  assert_int_equal(parse_with("\"q_lora_rank\": null, \"rope_scaling\": {\"type\": \"linear\","
                              " \"factor\": 4}", &s, &d), 0);
  assert_string_equal(s.rope_type, "linear");
  assert_true(s.rope_factor == 4 && s.mscale == 1.0);
  assert_null(d.msg);
}

/* JSON numbers are doubles: 128.0 is an integer, 128.5 is not; repeated keys take the
 * last value, as Python's json does. */
static void test_numbers(void **state) {
  (void)state;
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  const char *j = "{\"num_attention_heads\": 16.0, \"kv_lora_rank\": 5.12e2,"
                  " \"qk_rope_head_dim\": 64, \"qk_nope_head_dim\": 128, \"v_head_dim\": 256,"
                  " \"v_head_dim\": 128.0, \"q_lora_rank\": 1536}";
  assert_int_equal(mg_config_parse(j, strlen(j), "n", &s, &d), 0);
  assert_int_equal(s.heads, 16);
  assert_int_equal(s.kv_lora_rank, 512);
  assert_int_equal(s.v_head_dim, 128);

  /* Not NUL-terminated: only len bytes are read. */
  char buf[256];
  size_t n = strlen(j);
  memcpy(buf, j, n);
  memset(buf + n, 'x', sizeof buf - n);
  assert_int_equal(mg_config_parse(buf, n, "n", &s, &d), 0);
  assert_int_equal(mg_config_parse(buf, n + 1, "n", &s, &d), MLAGEN_ECONFIG);
  assert_non_null(strstr(d.msg, "text after the top-level value"));
  mg_diag_clear(&d);
}

/* Messages stay one line whatever the input holds. */
static void test_one_line(void **state) {
  (void)state;
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  const char *cases[][2] = {
    {"\"q_lora_rank\": null, \"rope_scaling\": {\"type\": \"y\\narn\", \"factor\": 4}",
     "unknown rope_scaling type 'y?arn'"},
    {"\"q_lora_rank\": null, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 1e999}",
     "key 'rope_scaling.factor': is inf"},
    {"\"q_lora_rank\": \"a\\nb\"", "is a string (\"a?b\")"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(parse_with(cases[i][0], &s, &d), MLAGEN_ECONFIG);
    assert_non_null(strstr(d.msg, cases[i][1]));
    assert_null(strchr(d.msg, '\n'));
  }
  const char *j = "{\n\n  \"a\": [1, 2\n}";
  assert_int_equal(mg_config_parse(j, strlen(j), "j", &s, &d), MLAGEN_ECONFIG);
  assert_non_null(strstr(d.msg, "j: not valid JSON near line "));
  assert_null(strchr(d.msg, '\n'));
  mg_diag_clear(&d);
}

/* A config nested past cJSON's limit (1000 levels) is named as such, file included, and
 * not as a syntax error; 1000 levels still parse; brackets inside strings do not count. */
static void test_too_deep(void **state) {
  (void)state;
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  const int levels[2] = {1000, 1001}; /* the top-level object is level 1 */
  for (int k = 0; k < 2; k++) {
    const int n = levels[k] - 1;
    char *j = malloc(4096 + 2 * (size_t)n);
    assert_non_null(j);
    size_t len = (size_t)sprintf(j, "{%s, \"q_lora_rank\": null, \"s\": \"[[[{{\", \"x\": ", mla_keys);
    for (int i = 0; i < n; i++) j[len++] = '[';
    for (int i = 0; i < n; i++) j[len++] = ']';
    j[len++] = '}';
    char path[] = "/tmp/mlagen-deep-XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, j, len), (ssize_t)len);
    close(fd);
    const int rc = mg_config_load(path, &s, &d);
    unlink(path);
    free(j);
    if (k == 0) {
      if (rc) fail_msg("%s", d.msg);
      assert_int_equal(s.heads, 16);
      continue;
    }
    assert_int_equal(rc, MLAGEN_ECONFIG);
    assert_non_null(strstr(d.msg, path));
    assert_non_null(strstr(d.msg, "nested deeper than 1000 levels"));
    assert_null(strstr(d.msg, "not valid JSON"));
    assert_null(strchr(d.msg, '\n'));
  }
  mg_diag_clear(&d);
}

/* On error *out is unchanged. */
static void test_out_unchanged(void **state) {
  (void)state;
  mg_shape s, before;
  assert_int_equal(mg_config_load("kimi-k2", &s, NULL), 0);
  before = s;
  assert_int_equal(mg_config_load(CONFIGS "bad_v_limit.json", &s, NULL), MLAGEN_EUNSUPPORTED);
  assert_memory_equal(&s, &before, sizeof s);
  assert_int_equal(mg_config_parse(NULL, 0, "x", &s, NULL), MLAGEN_EINVAL);
  assert_int_equal(mg_config_parse("{}", 2, "x", NULL, NULL), MLAGEN_EINVAL);
}

static void test_not_found(void **state) {
  (void)state;
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  const char *names[] = {"deepseek-v4", CONFIGS "no_such_file.json", "kimi-k2.yaml"};
  for (size_t i = 0; i < 3; i++) {
    assert_int_equal(mg_config_load(names[i], &s, &d), MLAGEN_EIO);
    assert_int_equal(d.status, MLAGEN_EIO);
    assert_non_null(strstr(d.msg, names[i]));
    assert_non_null(strstr(d.msg, "no such file"));
    assert_non_null(strstr(d.msg, "shipped: deepseek-v2-lite, deepseek-v3, kimi-k2"));
    assert_null(strchr(d.msg, '\n'));
  }
  mg_diag_clear(&d);
}

static void test_describe(void **state) {
  (void)state;
  mg_shape s;
  char buf[256];
  assert_int_equal(mg_config_load("deepseek-v3", &s, NULL), 0);
  const char *want = "H=128 d_c=512 d_r=64 d_n=128 d_v=128 d_q=1536 scale=0.135234 "
                     "(yarn factor 40, mscale 1.3689)";
  assert_int_equal(mg_shape_describe(&s, buf, sizeof buf), (int)strlen(want));
  assert_string_equal(buf, want);
  assert_int_equal(mg_config_load("deepseek-v2-lite", &s, NULL), 0);
  mg_shape_describe(&s, buf, sizeof buf);
  assert_non_null(strstr(buf, "d_q=null scale=0.114721 "));
  assert_int_equal(mg_config_load(CONFIGS "good_generic.json", &s, NULL), 0);
  mg_shape_describe(&s, buf, sizeof buf);
  assert_string_equal(buf, "H=40 d_c=256 d_r=32 d_n=64 d_v=64 d_q=768 scale=0.102062");
  /* Truncated output stays terminated; the result is the full length. */
  int full = mg_shape_describe(&s, NULL, 0);
  assert_int_equal(mg_shape_describe(&s, buf, 8), full);
  assert_string_equal(buf, "H=40 d_");
}

/* A malformed config: the status, and strings the one-line message must hold (the
 * key, then what is wrong). */
typedef struct bad {
  const char *file;
  int status;
  const char *key;  /* "key '<key>'" must appear (for a non-MLA model, the bare key);
                     * NULL where no key is to blame */
  const char *what; /* another substring that must appear */
} bad;

static const bad bads[] = {
  {"bad_not_json.json", MLAGEN_ECONFIG, NULL, "not valid JSON near line 4: at ','"},
  {"bad_empty.json", MLAGEN_ECONFIG, NULL, "not valid JSON near line 1: unexpected end of input"},
  {"bad_trailing.json", MLAGEN_ECONFIG, NULL, "text after the top-level value at '}'"},
  {"bad_top_array.json", MLAGEN_ECONFIG, NULL, "top level is an array, expected a JSON object"},
  {"bad_gqa.json", MLAGEN_ECONFIG, "kv_lora_rank",
   "not an MLA model: no kv_lora_rank (this looks like a GQA/MHA config with "
   "num_key_value_heads = 8)"},
  {"bad_missing_kv_lora_rank.json", MLAGEN_ECONFIG, "kv_lora_rank", "missing"},
  {"bad_missing_heads.json", MLAGEN_ECONFIG, "num_attention_heads", "missing"},
  {"bad_missing_rope_dim.json", MLAGEN_ECONFIG, "qk_rope_head_dim", "missing"},
  {"bad_missing_nope_dim.json", MLAGEN_ECONFIG, "qk_nope_head_dim", "missing"},
  {"bad_missing_v_dim.json", MLAGEN_ECONFIG, "v_head_dim", "missing"},
  {"bad_string_dim.json", MLAGEN_ECONFIG, "qk_nope_head_dim", "is a string (\"128\")"},
  {"bad_float_dim.json", MLAGEN_ECONFIG, "v_head_dim", "is 128.5, not an integer"},
  {"bad_bool_dim.json", MLAGEN_ECONFIG, "num_attention_heads", "is a boolean (true)"},
  {"bad_null_dim.json", MLAGEN_ECONFIG, "qk_rope_head_dim", "is null"},
  {"bad_zero_dim.json", MLAGEN_ECONFIG, "v_head_dim", "is 0, expected a positive integer"},
  {"bad_negative_dim.json", MLAGEN_ECONFIG, "kv_lora_rank", "is -512"},
  {"bad_huge_dim.json", MLAGEN_ECONFIG, "num_attention_heads", "beyond the int range"},
  {"bad_odd_rope.json", MLAGEN_ECONFIG, "qk_rope_head_dim", "63 is odd; RoPE rotates pairs"},
  {"bad_q_lora_rank.json", MLAGEN_ECONFIG, "q_lora_rank",
   "is 0, expected a positive integer or null"},
  {"bad_model_type.json", MLAGEN_ECONFIG, "model_type", "expected a string"},
  {"bad_text_config_missing.json", MLAGEN_ECONFIG, "text_config.v_head_dim", "missing"},
  {"bad_unknown_rope.json", MLAGEN_ECONFIG, "rope_scaling.type",
   "unknown rope_scaling type 'su'"},
  {"bad_rope_not_object.json", MLAGEN_ECONFIG, "rope_scaling", "expected an object or null"},
  {"bad_rope_no_type.json", MLAGEN_ECONFIG, "rope_scaling.type", "missing"},
  {"bad_yarn_no_factor.json", MLAGEN_ECONFIG, "rope_scaling.factor", "missing; rope type yarn"},
  {"bad_yarn_factor_string.json", MLAGEN_ECONFIG, "rope_scaling.factor", "expected a number > 0"},
  {"bad_yarn_factor_zero.json", MLAGEN_ECONFIG, "rope_scaling.factor",
   "is 0, expected a number > 0"},
  {"bad_mscale_string.json", MLAGEN_ECONFIG, "rope_scaling.mscale_all_dim", "expected a number"},
  {"bad_mscale_negative.json", MLAGEN_ECONFIG, "rope_scaling.mscale_all_dim", "is -100; a negative"},
  {"bad_rope_parameters_type.json", MLAGEN_ECONFIG, "rope_parameters.rope_type",
   "unknown rope_parameters type 'ntk'"},
  {"bad_rope_conflict.json", MLAGEN_ECONFIG, "rope_parameters", "disagrees with rope_scaling"},
  {"bad_align.json", MLAGEN_EUNSUPPORTED, "qk_nope_head_dim", MG_DIM_ALIGN_WHY},
  {"bad_qk_limit.json", MLAGEN_EUNSUPPORTED, "qk_nope_head_dim", MG_MAX_QK_DIM_WHY},
  {"bad_v_limit.json", MLAGEN_EUNSUPPORTED, "v_head_dim", MG_MAX_V_DIM_WHY},
  {"bad_latent_limit.json", MLAGEN_EUNSUPPORTED, "kv_lora_rank", MG_MAX_LATENT_WHY},
  {"bad_latent_align.json", MLAGEN_EUNSUPPORTED, "kv_lora_rank", MG_LATENT_ALIGN_WHY},
  {"bad_latent_row.json", MLAGEN_EUNSUPPORTED, "kv_lora_rank", MG_MAX_LATENT_ROW_WHY},
  {"bad_heads_limit.json", MLAGEN_EUNSUPPORTED, "num_attention_heads", MG_MAX_HEADS_WHY},
};

static void test_bad_configs(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
    const bad *b = &bads[i];
    char path[512], key[128];
    snprintf(path, sizeof path, "%s%s", CONFIGS, b->file);
    mg_shape s;
    mg_diag d = MG_DIAG_INIT;
    int rc = mg_config_load(path, &s, &d);
    const char *msg = mg_diag_msg(&d);
    if (b->key && strstr(msg, "not an MLA model")) snprintf(key, sizeof key, "%s", b->key);
    else if (b->key) snprintf(key, sizeof key, "key '%s'", b->key);
    int ok = rc == b->status && d.status == b->status && d.msg && strstr(msg, path) == msg &&
             strncmp(msg + strlen(path), ": ", 2) == 0 && (!b->key || strstr(msg, key)) &&
             strstr(msg, b->what) && !strchr(msg, '\n');
    if (!ok) print_message("%s: got %d \"%s\"\n", b->file, rc, msg);
    assert_int_equal(rc, b->status);
    assert_int_equal(d.status, b->status);
    assert_non_null(d.msg);
    assert_ptr_equal(strstr(msg, path), msg); /* starts with "<file>: " */
    assert_memory_equal(msg + strlen(path), ": ", 2);
    if (b->key) assert_non_null(strstr(msg, key));
    assert_non_null(strstr(msg, b->what));
    assert_null(strchr(msg, '\n'));
    mg_diag_clear(&d);
  }
}

/* Keys a config lacks take the default of the model_type's config class in transformers,
 * or are derived as that class derives them; each is noted. Expected values read by hand
 * from transformers 5.24's models/<type>/configuration_<type>.py (field defaults and
 * __post_init__), not from mg_config.c's table. */
static void test_hf_defaults(void **state) {
  (void)state;
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  /* MiniCPM3Config: v_head_dim = hidden_size // num_attention_heads when absent or None */
  assert_int_equal(mg_config_load(CONFIGS "good_minicpm3_no_v.json", &s, &d), 0);
  assert_int_equal(s.v_head_dim, 2560 / 40);
  assert_int_equal(s.heads, 40);
  assert_int_equal(s.kv_lora_rank, 256);
  assert_int_equal(s.qk_rope_head_dim, 32);
  assert_int_equal(s.qk_nope_head_dim, 64);
  assert_int_equal(s.q_lora_rank, 768);
  assert_int_equal(s.n_notes, 1);
  assert_non_null(strstr(s.notes[0], "v_head_dim absent: hidden_size / num_attention_heads = "
                                     "2560 / 40 = 64"));
  assert_non_null(strstr(s.notes[0], "MiniCPM3Config"));
  assert_true(fabs(s.softmax_scale - 1.0 / sqrt(96.0)) < 1e-15);
  const char *j = "{\"model_type\": \"minicpm3\", \"hidden_size\": 1024, \"num_attention_heads\": 16,"
                  " \"v_head_dim\": null}";
  assert_int_equal(mg_config_parse(j, strlen(j), "inline", &s, &d), 0);
  assert_int_equal(s.v_head_dim, 64);
  /* everything absent: H 40, hidden 2560 (so d_v 64), d_c 256, d_q 768, d_r 32, d_n 64 */
  j = "{\"model_type\": \"minicpm3\"}";
  assert_int_equal(mg_config_parse(j, strlen(j), "inline", &s, &d), 0);
  assert_int_equal(s.heads, 40);
  assert_int_equal(s.kv_lora_rank, 256);
  assert_int_equal(s.qk_rope_head_dim, 32);
  assert_int_equal(s.qk_nope_head_dim, 64);
  assert_int_equal(s.v_head_dim, 64);
  assert_int_equal(s.q_lora_rank, 768);
  assert_int_equal(s.hidden_size, 2560);
  assert_int_equal(s.n_notes, 7);
  /* an explicit v_head_dim wins */
  j = "{\"model_type\": \"minicpm3\", \"v_head_dim\": 128}";
  assert_int_equal(mg_config_parse(j, strlen(j), "inline", &s, &d), 0);
  assert_int_equal(s.v_head_dim, 128);
  /* H not dividing hidden_size: MiniCPM3Config raises; so do we, naming the key */
  j = "{\"model_type\": \"minicpm3\", \"hidden_size\": 2560, \"num_attention_heads\": 48}";
  assert_int_equal(mg_config_parse(j, strlen(j), "inline", &s, &d), MLAGEN_ECONFIG);
  assert_non_null(strstr(mg_diag_msg(&d), "key 'v_head_dim'"));
  assert_non_null(strstr(mg_diag_msg(&d), "2560 is not a multiple of 48"));
  mg_diag_clear(&d);

  /* DeepseekV3Config with nothing but model_type: its defaults, every one noted */
  assert_int_equal(mg_config_load(CONFIGS "good_deepseek_v3_bare.json", &s, &d), 0);
  assert_int_equal(s.heads, 128);
  assert_int_equal(s.kv_lora_rank, 512);
  assert_int_equal(s.qk_rope_head_dim, 64);
  assert_int_equal(s.qk_nope_head_dim, 128);
  assert_int_equal(s.v_head_dim, 128);
  assert_int_equal(s.q_lora_rank, 1536);
  assert_int_equal(s.hidden_size, 7168);
  assert_int_equal(s.n_notes, 7);
  assert_non_null(strstr(s.notes[0], "num_attention_heads absent: 128, the default of "
                                     "transformers' DeepseekV3Config"));

  /* One absent key per class: a few other architectures */
  const struct { const char *type; const char *key; int H, d_c, d_r, d_n, d_v, d_q, D; } cls[] = {
    {"deepseek_v2", "DeepseekV2Config", 32, 512, 64, 128, 128, 1536, 4096},
    {"glm4_moe_lite", "Glm4MoeLiteConfig", 20, 512, 64, 192, 256, 768, 2048},
    {"kimi_linear", "KimiLinearConfig", 32, 512, 64, 128, 128, 0, 2304},
    {"longcat_flash", "LongcatFlashConfig", 64, 512, 64, 128, 128, 1536, 6144},
    {"mistral_large4_text", "MistralLarge4TextConfig", 64, 512, 64, 64, 128, 0, 6144},
    {"youtu", "YoutuConfig", 16, 512, 64, 128, 128, 1536, 2048},
  };
  for (size_t i = 0; i < sizeof cls / sizeof cls[0]; i++) {
    char buf[128];
    snprintf(buf, sizeof buf, "{\"model_type\": \"%s\"}", cls[i].type);
    assert_int_equal(mg_config_parse(buf, strlen(buf), "inline", &s, &d), 0);
    assert_int_equal(s.heads, cls[i].H);
    assert_int_equal(s.kv_lora_rank, cls[i].d_c);
    assert_int_equal(s.qk_rope_head_dim, cls[i].d_r);
    assert_int_equal(s.qk_nope_head_dim, cls[i].d_n);
    assert_int_equal(s.v_head_dim, cls[i].d_v);
    assert_int_equal(s.q_lora_rank, cls[i].d_q);
    assert_int_equal(s.hidden_size, cls[i].D);
    assert_non_null(strstr(s.notes[0], cls[i].key));
  }
  /* Mistral4Config fills an absent rope_parameters with yarn factor 128, mscale_all_dim 1 */
  j = "{\"model_type\": \"mistral4\"}";
  assert_int_equal(mg_config_parse(j, strlen(j), "inline", &s, &d), 0);
  assert_string_equal(s.rope_type, "yarn");
  assert_true(s.rope_factor == 128.0);
  const double m = 0.1 * 1.0 * log(128.0) + 1.0;
  assert_true(fabs(s.softmax_scale - m * m / sqrt(128.0)) < 1e-12);
  assert_non_null(strstr(s.notes[s.n_notes - 1], "rope_parameters absent: yarn factor 128"));

  /* No class for the type: absent keys stay errors */
  j = "{\"model_type\": \"custom_mla\", \"kv_lora_rank\": 512}";
  assert_int_equal(mg_config_parse(j, strlen(j), "inline", &s, &d), MLAGEN_ECONFIG);
  assert_non_null(strstr(mg_diag_msg(&d), "missing"));
  mg_diag_clear(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_shipped_by_name),
    cmocka_unit_test(test_shipped_by_path),
    cmocka_unit_test(test_default_and_suffix),
    cmocka_unit_test(test_softmax_scale),
    cmocka_unit_test(test_rope_parameters),
    cmocka_unit_test(test_rope_type_wins),
    cmocka_unit_test(test_text_config),
    cmocka_unit_test(test_generic),
    cmocka_unit_test(test_model_dir),
    cmocka_unit_test(test_notes),
    cmocka_unit_test(test_numbers),
    cmocka_unit_test(test_one_line),
    cmocka_unit_test(test_too_deep),
    cmocka_unit_test(test_out_unchanged),
    cmocka_unit_test(test_not_found),
    cmocka_unit_test(test_describe),
    cmocka_unit_test(test_bad_configs),
    cmocka_unit_test(test_hf_defaults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
