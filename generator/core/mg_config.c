/* mg_config.c: HF config.json -> mg_shape.
 *
 * Reads the five MLA dims, q_lora_rank, hidden_size, model_type and the RoPE scaling
 * object, derives the softmax scale as DeepSeek's modeling code does, and checks the
 * result against the kernel limits in mg_config.h. Every error is one line:
 * "<name>: key '<key>': <what is wrong>". */
#include "mg_config.h"

#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mg_embed.h"
#include "mg_fs.h"
#include "mlagen.h"

#define CONFIG_MAX_BYTES ((size_t)16 << 20) /* a config.json is a few KiB */

const char *const mg_config_shipped[] = {"deepseek-v2-lite", "deepseek-v3", "kimi-k2", NULL};

/* RoPE types HF's rope_config_validation knows; only yarn changes the softmax scale. */
static const char *const rope_types[] = {"default", "linear", "dynamic", "yarn",
                                         "longrope", "llama3", NULL};

/* Where messages come from: the config's name and the key prefix ("" or "text_config."). */
typedef struct pctx {
  const char *name;
  const char *prefix;
  mg_diag *d;
} pctx;

/* One RoPE scaling object (rope_scaling or rope_parameters), as read. */
typedef struct rope {
  int present;           /* 0: key absent or null */
  char type[32];
  double factor;         /* 1 when absent */
  double mscale_all_dim; /* 0 when absent */
} rope;

__attribute__((format(printf, 4, 5)))
static int key_error(const pctx *c, int status, const char *key, const char *fmt, ...) {
  char what[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return mg_diag_set(c->d, status, "%s: key '%s%s': %s", c->name, c->prefix, key, what);
}

__attribute__((format(printf, 2, 3)))
static void add_note(mg_shape *s, const char *fmt, ...) {
  if (!s || s->n_notes >= MG_SHAPE_MAX_NOTES) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->notes[s->n_notes++], sizeof s->notes[0], fmt, ap);
  va_end(ap);
}

/* Copies at most 32 bytes of s[0..n) into out (48 bytes) for a message: bytes that are
 * not printable ASCII become '?' (keeps messages one line), "..." marks a cut. */
static void snip(const char *s, size_t n, char out[48]) {
  size_t i = 0;
  for (; i < n && i < 32; i++) {
    unsigned char ch = (unsigned char)s[i];
    out[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
  }
  if (i < n) memcpy(out + i, "...", 3), i += 3;
  out[i] = '\0';
}

/* A JSON value in words, for "is <value>, expected ...". */
static void value_words(const cJSON *v, char out[64]) {
  char s[48];
  if (cJSON_IsNull(v)) snprintf(out, 64, "null");
  else if (cJSON_IsBool(v)) snprintf(out, 64, "a boolean (%s)", cJSON_IsTrue(v) ? "true" : "false");
  else if (cJSON_IsNumber(v)) snprintf(out, 64, "%.15g", v->valuedouble);
  else if (cJSON_IsString(v)) {
    snip(v->valuestring, strlen(v->valuestring), s);
    snprintf(out, 64, "a string (\"%s\")", s);
  } else if (cJSON_IsArray(v)) snprintf(out, 64, "an array");
  else if (cJSON_IsObject(v)) snprintf(out, 64, "an object");
  else snprintf(out, 64, "an invalid value");
}

/* The last member named key (Python's json keeps the last of repeated keys; cJSON's
 * lookup would return the first). Case-sensitive, as Python dicts are. */
static const cJSON *member(const cJSON *obj, const char *key) {
  const cJSON *found = NULL;
  for (const cJSON *it = obj ? obj->child : NULL; it; it = it->next)
    if (it->string && strcmp(it->string, key) == 0) found = it;
  return found;
}

/* Reads a present value as an int > 0. 128.0 is accepted (JSON numbers are doubles). */
static int read_pos_int(const pctx *c, const cJSON *v, const char *key, const char *expected,
                        int *out) {
  char w[64];
  value_words(v, w);
  double x = cJSON_IsNumber(v) ? v->valuedouble : 0;
  if (!cJSON_IsNumber(v) || !(x > 0))
    return key_error(c, MLAGEN_ECONFIG, key, "is %s, expected %s", w, expected);
  if (x != floor(x))
    return key_error(c, MLAGEN_ECONFIG, key, "is %s, not an integer (expected %s)", w, expected);
  if (!(x <= INT_MAX))
    return key_error(c, MLAGEN_ECONFIG, key, "is %s, beyond the int range (max %d)", w, INT_MAX);
  *out = (int)x;
  return 0;
}

/* Reads one RoPE scaling object cfg[key]. Notes go to s (NULL: none). */
static int read_rope(const pctx *c, const cJSON *cfg, const char *key, rope *r, mg_shape *s) {
  char k[64], w[64];
  memset(r, 0, sizeof *r);
  r->factor = 1;
  const cJSON *o = member(cfg, key);
  if (!o || cJSON_IsNull(o)) return 0;
  if (!cJSON_IsObject(o)) {
    value_words(o, w);
    return key_error(c, MLAGEN_ECONFIG, key, "is %s, expected an object or null", w);
  }
  r->present = 1;

  /* Type: rope_type wins over the legacy alias type, as rope_config_validation reads
   * rope_scaling.get("rope_type", rope_scaling.get("type")). A null counts as absent. */
  const cJSON *rt = member(o, "rope_type"), *ty = member(o, "type");
  if (cJSON_IsNull(rt)) rt = NULL;
  if (cJSON_IsNull(ty)) ty = NULL;
  const cJSON *t = rt ? rt : ty;
  snprintf(k, sizeof k, "%s.%s", key, rt ? "rope_type" : "type");
  if (!t)
    return key_error(c, MLAGEN_ECONFIG, k,
                     "missing; give type or rope_type (default, linear, dynamic, yarn, "
                     "longrope or llama3)");
  if (!cJSON_IsString(t)) {
    value_words(t, w);
    return key_error(c, MLAGEN_ECONFIG, k, "is %s, expected a string", w);
  }
  int known = 0;
  for (const char *const *p = rope_types; *p; p++)
    if (strcmp(*p, t->valuestring) == 0) known = 1;
  if (!known) {
    char sn[48];
    snip(t->valuestring, strlen(t->valuestring), sn);
    return key_error(c, MLAGEN_ECONFIG, k,
                     "unknown %s type '%s' (known: default, linear, dynamic, yarn, longrope, "
                     "llama3)", key, sn);
  }
  snprintf(r->type, sizeof r->type, "%s", t->valuestring);
  if (rt && cJSON_IsString(ty) && strcmp(ty->valuestring, rt->valuestring) != 0) {
    char sn[48];
    snip(ty->valuestring, strlen(ty->valuestring), sn);
    add_note(s, "%s%s: type '%s' and rope_type '%s' differ; read rope_type, as HF's "
             "rope_config_validation does", c->prefix, key, sn, r->type);
  }
  int yarn = strcmp(r->type, "yarn") == 0;

  /* factor: yarn needs it (DeepSeek's code and HF index rope_scaling["factor"]). */
  snprintf(k, sizeof k, "%s.factor", key);
  const cJSON *f = member(o, "factor");
  if (f && (!cJSON_IsNull(f) || yarn)) {
    value_words(f, w);
    if (!cJSON_IsNumber(f) || !(f->valuedouble > 0) || !isfinite(f->valuedouble))
      return key_error(c, MLAGEN_ECONFIG, k, "is %s, expected a number > 0", w);
    r->factor = f->valuedouble;
  } else if (yarn) {
    return key_error(c, MLAGEN_ECONFIG, k,
                     "missing; rope type yarn needs a factor (HF raises KeyError)");
  }

  snprintf(k, sizeof k, "%s.mscale_all_dim", key);
  const cJSON *m = member(o, "mscale_all_dim");
  if (m && !cJSON_IsNull(m)) {
    value_words(m, w);
    if (!cJSON_IsNumber(m) || !isfinite(m->valuedouble))
      return key_error(c, MLAGEN_ECONFIG, k, "is %s, expected a number", w);
    if (m->valuedouble < 0)
      return key_error(c, MLAGEN_ECONFIG, k,
                       "is %s; a negative value would scale attention logits by a negative or "
                       "vanishing mscale^2", w);
    r->mscale_all_dim = m->valuedouble;
  } else if (yarn) {
    add_note(s, "%s%s absent: DeepSeek's code reads it as 0 (rope_scaling.get(\"mscale_all_dim\", "
             "0)), so mscale = 1", c->prefix, k);
  }
  return 0;
}

/* What transformers' config class of a model_type gives an absent attention key: the
 * class's field default (transformers 5.24, models/<type>/configuration_<type>.py, read
 * field by field), in the order H, d_c, d_r, d_n, d_v (as dims[] below), then d_q (0: None,
 * no query compression) and D. v_head_dim -1: MiniCPM3Config.__post_init__ derives it as
 * hidden_size // num_attention_heads. rope_factor > 0: the class fills an absent
 * rope_parameters with yarn of that factor and mscale_all_dim (Mistral4Config: 128, 1;
 * MistralLarge4TextConfig: 2048, none, so mscale 1). Checked against transformers 5.24
 * by instantiating each class with no arguments (every value equal). Types
 * whose defaults our kernels cannot run (glm5_next_text: qk_rope_head_dim 0) are left
 * out, so their absent keys stay errors. kimi_k2 (Kimi K2's config.json, written for
 * remote code) has no class of its own: KimiK25Config reads a kimi_k2 text_config as
 * deepseek_v3, and so do we. DeepSeek-V4 (head_dim, no kv_lora_rank) is not MLA in this
 * sense and is not read. */
typedef struct hf_defaults {
  const char *model_type;
  const char *cls; /* the config class, for notes */
  int dim[5];      /* H, d_c, d_r, d_n, d_v */
  int q_lora_rank, hidden_size;
  double rope_factor, mscale_all_dim;
} hf_defaults;

static const hf_defaults hf_classes[] = {
  {"axk1", "AXK1Config", {64, 512, 64, 128, 128}, 1536, 7168, 0, 0},
  {"axk2", "AXK2Config", {32, 128, 32, 64, 64}, 384, 2048, 0, 0},
  {"bailing_hybrid", "BailingHybridConfig", {32, 512, 64, 128, 128}, 0, 2560, 0, 0},
  {"deepseek_v2", "DeepseekV2Config", {32, 512, 64, 128, 128}, 1536, 4096, 0, 0},
  {"deepseek_v3", "DeepseekV3Config", {128, 512, 64, 128, 128}, 1536, 7168, 0, 0},
  {"deepseek_v32", "DeepseekV32Config", {128, 512, 64, 128, 128}, 1536, 7168, 0, 0},
  {"dots3_note_text", "Dots3NoteTextConfig", {128, 512, 64, 128, 128}, 1024, 5120, 0, 0},
  {"glm4_moe_lite", "Glm4MoeLiteConfig", {20, 512, 64, 192, 256}, 768, 2048, 0, 0},
  {"glm_moe_dsa", "GlmMoeDsaConfig", {64, 512, 64, 192, 256}, 2048, 6144, 0, 0},
  {"hy_v4", "HYV4Config", {32, 512, 64, 192, 256}, 1536, 2816, 0, 0},
  {"hy_v4_vl_text", "HYV4VLTextConfig", {64, 512, 64, 192, 256}, 2048, 6144, 0, 0},
  {"kimi_linear", "KimiLinearConfig", {32, 512, 64, 128, 128}, 0, 2304, 0, 0},
  {"longcat_flash", "LongcatFlashConfig", {64, 512, 64, 128, 128}, 1536, 6144, 0, 0},
  {"minicpm3", "MiniCPM3Config", {40, 256, 32, 64, -1}, 768, 2560, 0, 0},
  {"mistral4", "Mistral4Config", {32, 256, 64, 64, 128}, 1024, 4096, 128, 1},
  {"mistral_large4_text", "MistralLarge4TextConfig", {64, 512, 64, 64, 128}, 0, 6144, 2048, 0},
  {"sarvam_mla", "SarvamMLAConfig", {64, 512, 64, 128, 128}, 0, 4096, 0, 0},
  {"youtu", "YoutuConfig", {16, 512, 64, 128, 128}, 1536, 2048, 0, 0},
};

/* The defaults of model_type mt, NULL when transformers has no MLA class by that name
 * (kimi_k2 is read as deepseek_v3, as KimiK25Config reads it). */
static const hf_defaults *hf_class(const char *mt) {
  if (mt && strcmp(mt, "kimi_k2") == 0) mt = "deepseek_v3";
  for (size_t i = 0; mt && i < sizeof hf_classes / sizeof hf_classes[0]; i++)
    if (strcmp(hf_classes[i].model_type, mt) == 0) return &hf_classes[i];
  return NULL;
}

/* The five MLA dims, in the order they are checked. */
static const struct dim {
  const char *key;
  const char *what; /* for "missing" */
  size_t off;
} dims[] = {
  {"num_attention_heads", "H, the number of attention heads", offsetof(mg_shape, heads)},
  {"kv_lora_rank", "d_c, the KV latent rank", offsetof(mg_shape, kv_lora_rank)},
  {"qk_rope_head_dim", "d_r, the RoPE head dim", offsetof(mg_shape, qk_rope_head_dim)},
  {"qk_nope_head_dim", "d_n, the no-RoPE head dim", offsetof(mg_shape, qk_nope_head_dim)},
  {"v_head_dim", "d_v, the value head dim", offsetof(mg_shape, v_head_dim)},
};
#define N_DIMS (sizeof dims / sizeof dims[0])

/* "not an MLA model" when cfg has no usable kv_lora_rank and none of the other MLA head
 * dims (a config that has those is an MLA config with kv_lora_rank missing), unless its
 * model_type is an MLA class of transformers (def) and kv_lora_rank is absent. */
static int check_is_mla(const pctx *c, const cJSON *cfg, const cJSON *root,
                        const hf_defaults *def) {
  const cJSON *kv = member(cfg, "kv_lora_rank");
  if (kv && !cJSON_IsNull(kv)) return 0;
  if (!kv && def) return 0; /* an MLA class: an absent kv_lora_rank takes its default */
  for (size_t i = 2; i < N_DIMS; i++)
    if (member(cfg, dims[i].key)) return 0;
  if (kv)
    return mg_diag_set(c->d, MLAGEN_ECONFIG, "%s: not an MLA model: kv_lora_rank is null",
                       c->name);
  const cJSON *kvh = member(cfg, "num_key_value_heads");
  if (cJSON_IsNumber(kvh))
    return mg_diag_set(c->d, MLAGEN_ECONFIG,
                       "%s: not an MLA model: no kv_lora_rank (this looks like a GQA/MHA config "
                       "with num_key_value_heads = %.15g)", c->name, kvh->valuedouble);
  const cJSON *mt = member(cfg, "model_type");
  if (!cJSON_IsString(mt)) mt = member(root, "model_type");
  char sn[48] = "";
  if (cJSON_IsString(mt)) snip(mt->valuestring, strlen(mt->valuestring), sn);
  return mg_diag_set(c->d, MLAGEN_ECONFIG,
                     "%s: not an MLA model: no kv_lora_rank at the top level or under "
                     "text_config%s%s%s", c->name, sn[0] ? " (model_type '" : "", sn,
                     sn[0] ? "')" : "");
}

/* The kernel limits of mg_config.h, with their reasons; MLAGEN_EUNSUPPORTED. */
static int check_limits(const pctx *c, const mg_shape *s) {
  const struct { const char *key; int v; } aligned[] = {
    {"qk_nope_head_dim", s->qk_nope_head_dim}, {"qk_rope_head_dim", s->qk_rope_head_dim},
    {"v_head_dim", s->v_head_dim}, {"kv_lora_rank", s->kv_lora_rank}};
  for (size_t i = 0; i < sizeof aligned / sizeof aligned[0]; i++)
    if (aligned[i].v % MG_DIM_ALIGN)
      return key_error(c, MLAGEN_EUNSUPPORTED, aligned[i].key,
                       "%d is not a multiple of MG_DIM_ALIGN = %d (%s)", aligned[i].v,
                       MG_DIM_ALIGN, MG_DIM_ALIGN_WHY);
  long qk = (long)s->qk_nope_head_dim + s->qk_rope_head_dim;
  if (qk > MG_MAX_QK_DIM)
    return key_error(c, MLAGEN_EUNSUPPORTED, "qk_nope_head_dim",
                     "qk_nope_head_dim + qk_rope_head_dim = %d + %d = %ld exceeds MG_MAX_QK_DIM "
                     "= %d (%s)", s->qk_nope_head_dim, s->qk_rope_head_dim, qk, MG_MAX_QK_DIM,
                     MG_MAX_QK_DIM_WHY);
  if (s->v_head_dim > MG_MAX_V_DIM)
    return key_error(c, MLAGEN_EUNSUPPORTED, "v_head_dim", "%d exceeds MG_MAX_V_DIM = %d (%s)",
                     s->v_head_dim, MG_MAX_V_DIM, MG_MAX_V_DIM_WHY);
  if (s->kv_lora_rank > MG_MAX_LATENT)
    return key_error(c, MLAGEN_EUNSUPPORTED, "kv_lora_rank", "%d exceeds MG_MAX_LATENT = %d (%s)",
                     s->kv_lora_rank, MG_MAX_LATENT, MG_MAX_LATENT_WHY);
  if (s->kv_lora_rank % MG_LATENT_ALIGN)
    return key_error(c, MLAGEN_EUNSUPPORTED, "kv_lora_rank",
                     "%d is not a multiple of MG_LATENT_ALIGN = %d (%s)", s->kv_lora_rank,
                     MG_LATENT_ALIGN, MG_LATENT_ALIGN_WHY);
  long row = (long)s->kv_lora_rank + s->qk_rope_head_dim;
  if (row > MG_MAX_LATENT_ROW)
    return key_error(c, MLAGEN_EUNSUPPORTED, "kv_lora_rank",
                     "kv_lora_rank + qk_rope_head_dim = %d + %d = %ld exceeds MG_MAX_LATENT_ROW "
                     "= %d (%s)", s->kv_lora_rank, s->qk_rope_head_dim, row, MG_MAX_LATENT_ROW,
                     MG_MAX_LATENT_ROW_WHY);
  if (s->heads > MG_MAX_HEADS)
    return key_error(c, MLAGEN_EUNSUPPORTED, "num_attention_heads",
                     "%d exceeds MG_MAX_HEADS = %d (%s)", s->heads, MG_MAX_HEADS,
                     MG_MAX_HEADS_WHY);
  return 0;
}

static size_t skip_ws(const char *s, size_t len, size_t pos) {
  while (pos < len && (s[pos] == ' ' || s[pos] == '\t' || s[pos] == '\r' || s[pos] == '\n')) pos++;
  return pos;
}

/* A parse error: the line of cJSON's error offset and the text found there. */
static int json_error(const pctx *c, const char *json, size_t len, size_t pos, const char *what) {
  int line = 1;
  for (size_t i = 0; i < pos && i < len; i++)
    if (json[i] == '\n') line++;
  size_t at = skip_ws(json, len, pos);
  if (at >= len)
    return mg_diag_set(c->d, MLAGEN_ECONFIG, "%s: not valid JSON near line %d: %sunexpected end "
                       "of input", c->name, line, what);
  size_t eol = at;
  while (eol < len && json[eol] != '\n' && json[eol] != '\r') eol++;
  char sn[48];
  snip(json + at, eol - at, sn); /* the rest of that line */
  return mg_diag_set(c->d, MLAGEN_ECONFIG, "%s: not valid JSON near line %d: %sat '%s'", c->name,
                     line, what, sn);
}

/* The deepest nesting of arrays and objects in json[0, n), strings skipped. */
static int max_depth(const char *json, size_t n) {
  int depth = 0, deepest = 0, in_string = 0;
  for (size_t i = 0; i < n; i++) {
    const char ch = json[i];
    if (in_string) {
      if (ch == '\\') i++;
      else if (ch == '"') in_string = 0;
    } else if (ch == '"') {
      in_string = 1;
    } else if (ch == '[' || ch == '{') {
      if (++depth > deepest) deepest = depth;
    } else if (ch == ']' || ch == '}') {
      depth--;
    }
  }
  return deepest;
}

/* Fills s from the parsed document; s is zeroed except source. */
static int read_shape(const pctx *c0, const cJSON *root, mg_shape *s) {
  pctx c = *c0;
  int rc;
  if (!cJSON_IsObject(root)) {
    char w[64];
    value_words(root, w);
    return mg_diag_set(c.d, MLAGEN_ECONFIG, "%s: top level is %s, expected a JSON object",
                       c.name, w);
  }
  /* Multimodal wrappers (e.g. Kimi-VL) keep the language model's keys in text_config. */
  const cJSON *cfg = root;
  if (!member(root, "kv_lora_rank") && cJSON_IsObject(member(root, "text_config"))) {
    cfg = member(root, "text_config");
    c.prefix = "text_config.";
  }
  /* model_type: the language model's, else the wrapper's. */
  pctx cm = c;
  const cJSON *mt = member(cfg, "model_type");
  if (!mt && cfg != root) mt = member(root, "model_type"), cm.prefix = "";
  if (mt && !cJSON_IsNull(mt)) {
    if (!cJSON_IsString(mt)) {
      char w[64];
      value_words(mt, w);
      return key_error(&cm, MLAGEN_ECONFIG, "model_type", "is %s, expected a string", w);
    }
    snprintf(s->model_type, sizeof s->model_type, "%s", mt->valuestring);
  }
  const hf_defaults *def = hf_class(s->model_type[0] ? s->model_type : NULL);
  if ((rc = check_is_mla(&c, cfg, root, def))) return rc;

  /* An absent key takes the class default, as transformers' config class gives it. */
  int derive_v = 0; /* MiniCPM3: v_head_dim = hidden_size // num_attention_heads */
  for (size_t i = 0; i < N_DIMS; i++) {
    const cJSON *v = member(cfg, dims[i].key);
    int *dst = (int *)((char *)s + dims[i].off);
    if (def && def->dim[i] < 0 && (!v || cJSON_IsNull(v))) {
      derive_v = 1;
      continue;
    }
    if (!v && def) {
      *dst = def->dim[i];
      add_note(s, "%s%s absent: %d, the default of transformers' %s", c.prefix, dims[i].key,
               *dst, def->cls);
      continue;
    }
    if (!v)
      return key_error(&c, MLAGEN_ECONFIG, dims[i].key, "missing (%s, is required for MLA)",
                       dims[i].what);
    if ((rc = read_pos_int(&c, v, dims[i].key, "a positive integer", dst))) return rc;
  }

  /* q_lora_rank: null means no query compression (HF's modeling code: `if
   * config.q_lora_rank is None: q_proj`). */
  const cJSON *q = member(cfg, "q_lora_rank");
  if (!q && def) {
    s->q_lora_rank = def->q_lora_rank;
    if (def->q_lora_rank)
      add_note(s, "%sq_lora_rank absent: %d, the default of transformers' %s", c.prefix,
               def->q_lora_rank, def->cls);
    else
      add_note(s, "%sq_lora_rank absent: None (no query compression), the default of "
               "transformers' %s", c.prefix, def->cls);
  } else if (!q)
    add_note(s, "%sq_lora_rank absent: read as null, no query compression (d_q = 0)", c.prefix);
  else if (!cJSON_IsNull(q) &&
           (rc = read_pos_int(&c, q, "q_lora_rank", "a positive integer or null", &s->q_lora_rank)))
    return rc;
  const cJSON *h = member(cfg, "hidden_size");
  if (h && (rc = read_pos_int(&c, h, "hidden_size", "a positive integer", &s->hidden_size)))
    return rc;
  if (!h && def) {
    s->hidden_size = def->hidden_size;
    add_note(s, "%shidden_size absent: %d, the default of transformers' %s", c.prefix,
             s->hidden_size, def->cls);
  }
  if (derive_v) {
    /* MiniCPM3Config.__post_init__: `if self.v_head_dim is None: self.v_head_dim =
     * hidden_size // num_attention_heads`; its validate_architecture raises unless H
     * divides hidden_size. */
    if (s->hidden_size % s->heads)
      return key_error(&c, MLAGEN_ECONFIG, "v_head_dim",
                       "absent, and %s derives it as hidden_size / num_attention_heads, but "
                       "%d is not a multiple of %d", def->cls, s->hidden_size, s->heads);
    s->v_head_dim = s->hidden_size / s->heads;
    add_note(s, "%sv_head_dim absent: hidden_size / num_attention_heads = %d / %d = %d, as "
             "transformers' %s derives it", c.prefix, s->hidden_size, s->heads, s->v_head_dim,
             def->cls);
  }

  if (s->qk_rope_head_dim % 2)
    return key_error(&c, MLAGEN_ECONFIG, "qk_rope_head_dim",
                     "%d is odd; RoPE rotates pairs of dims, so d_r must be even",
                     s->qk_rope_head_dim);

  /* Newer transformers write rope_parameters (rope_type), older rope_scaling (type). */
  rope rp, rs;
  if ((rc = read_rope(&c, cfg, "rope_parameters", &rp, s))) return rc;
  if ((rc = read_rope(&c, cfg, "rope_scaling", &rs, rp.present ? NULL : s))) return rc;
  if (rp.present && rs.present &&
      (strcmp(rp.type, rs.type) != 0 || rp.factor != rs.factor ||
       rp.mscale_all_dim != rs.mscale_all_dim))
    return key_error(&c, MLAGEN_ECONFIG, "rope_parameters",
                     "disagrees with rope_scaling (%s factor %g mscale_all_dim %g vs %s factor %g "
                     "mscale_all_dim %g); give one of them", rp.type, rp.factor,
                     rp.mscale_all_dim, rs.type, rs.factor, rs.mscale_all_dim);
  if (!rp.present && !rs.present && def && def->rope_factor > 0) {
    /* Mistral4Config.__post_init__ fills an absent rope_parameters with yarn */
    rp.present = 1;
    snprintf(rp.type, sizeof rp.type, "yarn");
    rp.factor = def->rope_factor;
    rp.mscale_all_dim = def->mscale_all_dim;
    add_note(s, "%srope_parameters absent: yarn factor %g mscale_all_dim %g, the default of "
             "transformers' %s", c.prefix, rp.factor, rp.mscale_all_dim, def->cls);
  }
  const rope *r = rp.present ? &rp : &rs;
  snprintf(s->rope_type, sizeof s->rope_type, "%s", r->type);
  s->rope_factor = r->factor;
  s->mscale_all_dim = r->mscale_all_dim;

  /* Softmax scale, as DeepSeek's modeling_deepseek.py (DeepSeek-V2/V3 repos on the HF
   * Hub, DeepseekV2Attention / DeepseekV3Attention.__init__; transformers'
   * modeling_deepseek_v3.py matches): scale = q_head_dim ** -0.5; mscale_all_dim =
   * rope_scaling.get("mscale_all_dim", 0); if mscale_all_dim: scale *= mscale * mscale,
   * mscale = yarn_get_mscale(factor, mscale_all_dim) = 1 if factor <= 1 else
   * 0.1 * mscale_all_dim * ln(factor) + 1. That code does not look at the rope type;
   * we apply it for yarn only (docs/forms.md), the one type whose configs carry mscale_all_dim. */
  s->mscale = 1;
  if (strcmp(s->rope_type, "yarn") == 0 && s->rope_factor > 1 && s->mscale_all_dim != 0)
    s->mscale = 0.1 * s->mscale_all_dim * log(s->rope_factor) + 1;
  double qk = (double)s->qk_nope_head_dim + s->qk_rope_head_dim;
  s->softmax_scale = s->mscale * s->mscale / sqrt(qk);
  if (!(s->softmax_scale > 0) || !isfinite(s->softmax_scale))
    return key_error(&c, MLAGEN_ECONFIG, rp.present ? "rope_parameters.mscale_all_dim"
                                                    : "rope_scaling.mscale_all_dim",
                     "%g gives mscale %g and softmax scale %g", s->mscale_all_dim, s->mscale,
                     s->softmax_scale);

  return check_limits(&c, s);
}

int mg_config_parse(const char *json, size_t len, const char *name, mg_shape *out, mg_diag *d) {
  if (!name) name = "config";
  if (!json || !out)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: mg_config_parse: NULL argument", name);
  pctx c = {name, "", d};
  const char *end = NULL;
  /* cJSON reports the failure position through end (the same offset as
   * cJSON_GetErrorPtr, without its global). A failed allocation reads as a parse error. */
  cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
  if (!root) {
    const size_t at = end ? (size_t)(end - json) : 0;
    /* cJSON stops at its nesting limit as at a syntax error: say which it was */
    if (max_depth(json, at < len ? at + 1 : len) > CJSON_NESTING_LIMIT)
      return mg_diag_set(d, MLAGEN_ECONFIG, "%s: arrays and objects nested deeper than %d "
                         "levels (a config.json nests a few)", name, CJSON_NESTING_LIMIT);
    return json_error(&c, json, len, at, "");
  }
  size_t pos = skip_ws(json, len, (size_t)(end - json));
  if (pos < len) {
    cJSON_Delete(root);
    return json_error(&c, json, len, pos, "text after the top-level value ");
  }
  mg_shape *s = calloc(1, sizeof *s);
  if (!s) {
    cJSON_Delete(root);
    return mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory", name);
  }
  snprintf(s->source, sizeof s->source, "%s", name);
  int rc = read_shape(&c, root, s);
  cJSON_Delete(root);
  if (rc == 0) *out = *s;
  free(s);
  return rc;
}

static int parse_file(const char *path, mg_shape *out, mg_diag *d) {
  char *data;
  size_t len;
  int rc = mg_fs_read(path, CONFIG_MAX_BYTES, &data, &len, d);
  if (rc) return rc;
  rc = mg_config_parse(data, len, path, out, d);
  free(data);
  return rc;
}

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int mg_config_load(const char *model, mg_shape *out, mg_diag *d) {
  if (!out) return mg_diag_set(d, MLAGEN_EINVAL, "mg_config_load: NULL argument");
  if (!model || !*model) model = MG_CONFIG_DEFAULT;
  if (mg_fs_is_file(model)) return parse_file(model, out, d);
  if (is_dir(model)) { /* an HF model folder */
    size_t n = strlen(model) + sizeof "/config.json";
    char *p = malloc(n);
    if (!p) return mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory", model);
    snprintf(p, n, "%s/config.json", model);
    int rc = mg_fs_is_file(p)
                 ? parse_file(p, out, d)
                 : mg_diag_set(d, MLAGEN_EIO, "%s: a directory without config.json", model);
    free(p);
    return rc;
  }
  size_t n = strlen(model);
  if (n > 5 && strcmp(model + n - 5, ".json") == 0) n -= 5;
  for (const char *const *s = mg_config_shipped; *s; s++) {
    if (strlen(*s) != n || strncmp(*s, model, n) != 0) continue;
    char path[64];
    snprintf(path, sizeof path, "configs/%s.json", *s);
    const mg_embedded_file *f = mg_embed_find(path);
    if (!f) return mg_diag_set(d, MLAGEN_EIO, "%s: shipped config %s is not embedded", *s, path);
    return mg_config_parse(f->data, f->size, *s, out, d);
  }
  char list[128] = "";
  for (const char *const *s = mg_config_shipped; *s; s++) {
    size_t at = strlen(list);
    snprintf(list + at, sizeof list - at, "%s%s", at ? ", " : "", *s);
  }
  /* Say why the path could not be used when something is there (a device, a FIFO, a
   * symlink loop), rather than that nothing is. */
  struct stat st;
  if (lstat(model, &st) == 0) {
    if (stat(model, &st) != 0)
      return mg_diag_set(d, MLAGEN_EIO, "%s: cannot open: %s", model, strerror(errno));
    return mg_diag_set(d, MLAGEN_EIO, "%s: not a regular file or a model directory", model);
  }
  return mg_diag_set(d, MLAGEN_EIO, "%s: no such file, and not a shipped model (shipped: %s)",
                     model, list);
}

int mg_shape_validate(const mg_shape *s, const char *name, mg_diag *d) {
  if (!name) name = "shape";
  if (!s) return mg_diag_set(d, MLAGEN_EINVAL, "%s: mg_shape_validate: NULL shape", name);
  pctx c = {name, "", d};
  for (size_t i = 0; i < N_DIMS; i++) {
    int v = *(const int *)((const char *)s + dims[i].off);
    if (v <= 0)
      return key_error(&c, MLAGEN_ECONFIG, dims[i].key, "is %d, expected a positive integer (%s)",
                       v, dims[i].what);
  }
  if (s->qk_rope_head_dim % 2)
    return key_error(&c, MLAGEN_ECONFIG, "qk_rope_head_dim",
                     "%d is odd; RoPE rotates pairs of dims, so d_r must be even",
                     s->qk_rope_head_dim);
  return check_limits(&c, s);
}

int mg_shape_describe(const mg_shape *s, char *buf, size_t n) {
  if (!s) return -1;
  char dq[16] = "null", rp[96] = "";
  if (s->q_lora_rank) snprintf(dq, sizeof dq, "%d", s->q_lora_rank);
  if (s->rope_type[0] && strcmp(s->rope_type, "default") != 0)
    snprintf(rp, sizeof rp, " (%s factor %g, mscale %.5g)", s->rope_type, s->rope_factor,
             s->mscale);
  return snprintf(buf, n, "H=%d d_c=%d d_r=%d d_n=%d d_v=%d d_q=%s scale=%.6g%s", s->heads,
                  s->kv_lora_rank, s->qk_rope_head_dim, s->qk_nope_head_dim, s->v_head_dim, dq,
                  s->softmax_scale, rp);
}
