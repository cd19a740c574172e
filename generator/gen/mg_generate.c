/* mg_generate.c: render kernel templates and write the generated sources. */
#include "mg_generate.h"

#include <cJSON.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_buf.h"
#include "mg_embed.h"
#include "mg_fs.h"
#include "mg_hash.h"
#include "mg_lua.h"
#include "mg_render.h"
#include "mlagen.h"

#define MG_TEMPLATE_MAX ((size_t)4 << 20)
#define MG_MAX_TEMPLATES 32
#define MG_MAX_FAMILIES 32 /* mg_spec_families' entries, at most */

typedef struct mg_template {
  char name[64];     /* file name, e.g. "explicit_fwd.cu.tpl" */
  char display[512]; /* path shown in messages and #line directives */
  char *data;
  size_t size;
} mg_template;

/* Output held by a generator's kernels; shared by the generator and each kernel it made
 * (refs), so a kernel freed after mg_gen_close still finds it. */
struct mg_gen_acct {
  size_t live; /* bytes of source rendered and not yet freed */
  size_t max;  /* the cap on live */
  long refs;
};

static void acct_release(struct mg_gen_acct *a) {
  if (a && --a->refs == 0) free(a);
}

struct mg_gen {
  struct mg_gen_acct *acct;
  mg_lua *lua;
  mg_template files[MG_MAX_TEMPLATES];
  int n_files;
  mg_jit_header headers[2]; /* the device headers, for NVRTC: MG_DEVICE_HEADER[, _SM90] */
  int n_headers;
  char hash[MG_HASH_HEX]; /* the whole template set */
  char family_hash[MG_MAX_FAMILIES][MG_HASH_HEX]; /* by mg_spec_families index; "" when
                                                      the set has no such template */
};

static const mg_template *find_file(const mg_gen *g, const char *name) {
  for (int i = 0; i < g->n_files; i++)
    if (strcmp(g->files[i].name, name) == 0) return &g->files[i];
  return NULL;
}

/* The template set is the embedded templates/ files; a templates_dir supplies files of
 * the same names. */
static int load_templates(mg_gen *g, const char *dir, mg_diag *d) {
  static const char prefix[] = "templates/";
  for (const mg_embedded_file *f = mg_embedded_files; f->path; f++) {
    if (strncmp(f->path, prefix, sizeof prefix - 1) != 0) continue;
    if (g->n_files == MG_MAX_TEMPLATES)
      return mg_diag_set(d, MLAGEN_ELIMIT, "more than %d template files", MG_MAX_TEMPLATES);
    mg_template *t = &g->files[g->n_files];
    const char *base = f->path + sizeof prefix - 1;
    snprintf(t->name, sizeof t->name, "%s", base);
    if (dir) {
      if ((size_t)snprintf(t->display, sizeof t->display, "%s/%s", dir, base) >= sizeof t->display)
        return mg_diag_set(d, MLAGEN_ELIMIT, "--templates: path longer than %zu bytes",
                           sizeof t->display - 1);
      int rc = mg_fs_read(t->display, MG_TEMPLATE_MAX, &t->data, &t->size, d);
      if (rc) return mg_diag_prefix(d, "--templates %s", dir);
    } else {
      snprintf(t->display, sizeof t->display, "%s", f->path);
      t->data = malloc(f->size + 1);
      if (!t->data) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
      memcpy(t->data, f->data, f->size + 1);
      t->size = f->size;
    }
    g->n_files++;
  }
  return 0;
}

/* Families rendered from one template with a direction switch (the template reads
 * spec.family): family -> that template. Every other family's is "<family>.cu.tpl". */
static const char *const shared_templates[][2] = {
    {"a2a_pack", "a2a.cu.tpl"},           {"a2a_unpack", "a2a.cu.tpl"},
    {"concat_latent", "latent.cu.tpl"}, {"split_latent", "latent.cu.tpl"},
};

/* The template file of family into out (64 bytes). */
static void template_of(const char *family, char out[64]) {
  for (size_t i = 0; i < sizeof shared_templates / sizeof shared_templates[0]; i++)
    if (strcmp(family, shared_templates[i][0]) == 0) {
      snprintf(out, 64, "%s", shared_templates[i][1]);
      return;
    }
  snprintf(out, 64, "%s.cu.tpl", family);
}

/* Whether name is some family's template (not the device header or the prelude: files
 * every rendering uses). */
static int is_family_template(const char *name) {
  char t[64];
  for (int f = 0; mg_spec_families[f]; f++) {
    template_of(mg_spec_families[f], t);
    if (strcmp(name, t) == 0) return 1;
  }
  return 0;
}

/* Whether the n bytes at data contain the string s. */
static int mentions(const char *data, size_t n, const char *s) {
  size_t k = strlen(s);
  for (size_t i = 0; i + k <= n; i++)
    if (memcmp(data + i, s, k) == 0) return 1;
  return 0;
}

/* Hex SHA-256 of every file's name and bytes into hex: the whole set when family is NULL,
 * else the family's own template and every file that is no family's template ("" when
 * the set lacks the family's template). The family's name goes first, so a family hash
 * never equals the set's. Returns 0 or MLAGEN_ENOMEM. */
static int hash_files(const mg_gen *g, const char *family, char hex[MG_HASH_HEX]) {
  int found = 0;
  char own[64] = ""; /* the family's template; none for an unknown family */
  for (int f = 0; family && mg_spec_families[f]; f++)
    if (strcmp(mg_spec_families[f], family) == 0) template_of(family, own);
  /* The sm_90a header and the sm_90a Lua helpers belong to a family's hash only when its
   * template names the header, so that adding or changing them leaves the mma.sync
   * families' tuned entries valid. */
  int uses_sm90 = 0;
  for (int i = 0; own[0] && i < g->n_files; i++)
    if (strcmp(g->files[i].name, own) == 0)
      uses_sm90 = mentions(g->files[i].data, g->files[i].size, MG_DEVICE_HEADER_SM90);
  mg_hash_ctx *h = mg_hash_begin();
  if (family) mg_hash_field_str(h, family);
  for (int i = 0; i < g->n_files; i++) {
    int mine = family && strcmp(g->files[i].name, own) == 0;
    if (family && !mine && is_family_template(g->files[i].name)) continue;
    if (family && !uses_sm90 && (strcmp(g->files[i].name, MG_DEVICE_HEADER_SM90) == 0 ||
                                 strcmp(g->files[i].name, MG_PRELUDE_SM90) == 0))
      continue;
    found |= mine;
    mg_hash_field_str(h, g->files[i].name);
    mg_hash_field(h, g->files[i].data, g->files[i].size);
  }
  uint8_t digest[MG_HASH_BYTES];
  if (mg_hash_end(h, digest)) return MLAGEN_ENOMEM;
  mg_hash_hex(digest, hex);
  if (family && !found) hex[0] = '\0';
  return 0;
}

int mg_gen_open(mg_gen **out, const char *templates_dir, mg_diag *d) {
  *out = NULL;
  mg_gen *g = calloc(1, sizeof *g);
  if (g && !(g->acct = calloc(1, sizeof *g->acct))) {
    free(g);
    g = NULL;
  }
  if (!g) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  g->acct->max = MG_GEN_TOTAL_MAX;
  g->acct->refs = 1;
  int rc = load_templates(g, templates_dir, d);
  const mg_template *hdr = rc ? NULL : find_file(g, MG_DEVICE_HEADER);
  if (!rc && !hdr)
    rc = mg_diag_set(d, MLAGEN_EIO, "template set has no %s", MG_DEVICE_HEADER);
  if (rc) {
    mg_gen_close(g);
    return rc;
  }
  g->headers[0] = (mg_jit_header){MG_DEVICE_HEADER, hdr->data, hdr->size};
  g->n_headers = 1;
  const mg_template *h90 = find_file(g, MG_DEVICE_HEADER_SM90);
  if (h90) g->headers[g->n_headers++] = (mg_jit_header){MG_DEVICE_HEADER_SM90, h90->data, h90->size};

  rc = hash_files(g, NULL, g->hash);
  for (int f = 0; !rc && f < MG_MAX_FAMILIES && mg_spec_families[f]; f++)
    rc = hash_files(g, mg_spec_families[f], g->family_hash[f]);
  if (rc) {
    mg_gen_close(g);
    return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  }
  *out = g;
  return 0;
}

void mg_gen_close(mg_gen *g) {
  if (!g) return;
  for (int i = 0; i < g->n_files; i++) free(g->files[i].data);
  mg_lua_close(g->lua);
  acct_release(g->acct);
  free(g);
}

void mg_gen_set_total_max(mg_gen *g, size_t max) { g->acct->max = max ? max : MG_GEN_TOTAL_MAX; }

const char *mg_gen_template_hash(const mg_gen *g) { return g->hash; }

const char *mg_gen_family_hash(const mg_gen *g, const char *family) {
  for (int f = 0; family && f < MG_MAX_FAMILIES && mg_spec_families[f]; f++)
    if (strcmp(mg_spec_families[f], family) == 0)
      return g->family_hash[f][0] ? g->family_hash[f] : NULL;
  return NULL;
}

const mg_jit_header *mg_gen_headers(const mg_gen *g, int *n) {
  *n = g->n_headers;
  return g->headers;
}

/* ---- Lua <-> C ------------------------------------------------------------------- */

static void push_spec(lua_State *L, const mg_kernel_spec *s) {
  lua_newtable(L);
  lua_pushstring(L, s->family);
  lua_setfield(L, -2, "family");
  const struct { const char *k; int v; } ints[] = {
      {"heads", s->heads}, {"d_n", s->d_n}, {"d_r", s->d_r}, {"d_v", s->d_v}, {"d_c", s->d_c}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    lua_pushinteger(L, ints[i].v);
    lua_setfield(L, -2, ints[i].k);
  }
  lua_pushstring(L, s->dtype);
  lua_setfield(L, -2, "dtype");
  lua_pushboolean(L, s->causal);
  lua_setfield(L, -2, "causal");
  lua_pushboolean(L, s->varlen);
  lua_setfield(L, -2, "varlen");
  lua_pushstring(L, s->arch);
  lua_setfield(L, -2, "arch");
  lua_newtable(L);
  for (int i = 0; i < s->n_config; i++) {
    lua_pushinteger(L, s->config[i].value);
    lua_setfield(L, -2, s->config[i].name);
  }
  lua_setfield(L, -2, "config");
}

static int is_sequence(lua_State *L, int idx) {
  lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
  if (n == 0) return 0;
  lua_Integer count = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    count++;
  }
  return count == n;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Converts the Lua value at idx to JSON: sequences become arrays, other tables objects
 * with sorted keys (so manifests are byte-stable); functions are skipped. */
static cJSON *to_json(lua_State *L, int idx, int depth) {
  idx = lua_absindex(L, idx);
  switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN: return cJSON_CreateBool(lua_toboolean(L, idx));
    case LUA_TSTRING: return cJSON_CreateString(lua_tostring(L, idx));
    case LUA_TNUMBER: return cJSON_CreateNumber(lua_tonumber(L, idx));
    case LUA_TTABLE: break;
    default: return NULL;
  }
  if (depth > 16 || !lua_checkstack(L, 4)) return NULL;
  if (is_sequence(L, idx)) {
    cJSON *arr = cJSON_CreateArray();
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    for (lua_Integer i = 1; arr && i <= n; i++) {
      lua_rawgeti(L, idx, i);
      cJSON *v = to_json(L, -1, depth + 1);
      lua_pop(L, 1);
      if (v) cJSON_AddItemToArray(arr, v);
    }
    return arr;
  }
  const char *keys[256];
  int n = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING && n < 256) keys[n++] = lua_tostring(L, -1);
  }
  qsort(keys, (size_t)n, sizeof keys[0], cmp_str);
  cJSON *obj = cJSON_CreateObject();
  for (int i = 0; obj && i < n; i++) {
    lua_pushstring(L, keys[i]);
    lua_rawget(L, idx); /* raw: a metamethod error here would be unprotected */
    cJSON *v = to_json(L, -1, depth + 1);
    lua_pop(L, 1);
    if (v) cJSON_AddItemToObject(obj, keys[i], v);
  }
  return obj;
}

/* [A-Za-z_][A-Za-z0-9_]* of at most max characters, no NUL inside. */
static int is_identifier(const char *s, size_t len, size_t max) {
  if (!s || len == 0 || len > max || strlen(s) != len) return 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return 0;
  }
  return 1;
}

static int family_known(const char *family) {
  for (const char *const *f = mg_spec_families; *f; f++)
    if (strcmp(*f, family) == 0) return 1;
  return 0;
}

int mg_gen_kernel(mg_gen *g, const mg_kernel_spec *s, mg_kernel *out, mg_diag *d) {
  memset(out, 0, sizeof *out);
  if (!family_known(s->family))
    return mg_diag_set(d, MLAGEN_EINVAL, "unknown kernel family '%s'", s->family);
  char tname[64];
  template_of(s->family, tname);
  const mg_template *tpl = find_file(g, tname), *prelude = find_file(g, "prelude.lua");
  if (!tpl || !prelude)
    return mg_diag_set(d, MLAGEN_EIO, "template set has no %s", tpl ? "prelude.lua" : tname);

  /* A fresh state for each kernel: no template sees globals, metatables or library
   * changes left by another, so a kernel's source never depends on generation order. */
  mg_lua_close(g->lua);
  g->lua = NULL;
  int rc = mg_lua_open(&g->lua, NULL, d);
  if (rc) return rc;
  lua_State *L = mg_lua_state(g->lua);
  push_spec(L, s);
  lua_setglobal(L, "spec");
  char chunkname[sizeof prelude->display + 1];
  snprintf(chunkname, sizeof chunkname, "@%s", prelude->display);
  rc = mg_lua_run(g->lua, prelude->data, prelude->size, chunkname, 0, d);
  if (rc) return rc;
  /* An sm_90a template (one naming the sm_90a header) also gets the sm_90a Lua helpers. */
  const mg_template *prelude90 = find_file(g, MG_PRELUDE_SM90);
  if (prelude90 && mentions(tpl->data, tpl->size, MG_DEVICE_HEADER_SM90)) {
    char chunk90[sizeof prelude90->display + 1];
    snprintf(chunk90, sizeof chunk90, "@%s", prelude90->display);
    rc = mg_lua_run(g->lua, prelude90->data, prelude90->size, chunk90, 0, d);
    if (rc) return rc;
  }

  /* The output may take what the per-kernel and the total caps both leave. */
  struct mg_gen_acct *a = g->acct;
  size_t left = a->live < a->max ? a->max - a->live : 0;
  int total_bound = left < MG_GEN_KERNEL_MAX;
  mg_buf src;
  mg_buf_init(&src, total_bound ? left : MG_GEN_KERNEL_MAX);
  rc = mg_render(g->lua, tpl->data, tpl->size, tpl->display, &src, d);
  if (rc == MLAGEN_ELIMIT && total_bound && strstr(mg_diag_msg(d), "template output exceeded"))
    rc = mg_diag_set(d, MLAGEN_ELIMIT,
                     "%s: rendered output exceeded the total cap of %zu MiB for the kernels of "
                     "one generation (%zu MiB already held)",
                     tpl->display, a->max >> 20, a->live >> 20);
  if (rc) {
    mg_buf_free(&src);
    return rc;
  }

  lua_getglobal(L, "__mlagen_declared");
  if (lua_pcall(L, 0, 1, 0) != LUA_OK || !lua_istable(L, -1)) {
    lua_pop(L, 1);
    mg_buf_free(&src);
    return mg_diag_set(d, MLAGEN_ETEMPLATE, "%s: the template declared no kernel (call kernel{...})",
                       tpl->display);
  }
  lua_pushliteral(L, "name");
  lua_rawget(L, -2);
  const char *name = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
  if (!is_identifier(name, lua_rawlen(L, -1), sizeof out->name - 1)) {
    lua_pop(L, 2);
    mg_buf_free(&src);
    return mg_diag_set(d, MLAGEN_ETEMPLATE,
                       "%s: the kernel name must be a C identifier of at most %zu characters "
                       "(it names the extern \"C\" symbol and the .cu file)",
                       tpl->display, sizeof out->name - 1);
  }
  snprintf(out->name, sizeof out->name, "%s", name);
  lua_pop(L, 1);
  snprintf(out->file, sizeof out->file, "%s.cu", out->name);

  cJSON *m = to_json(L, -1, 0);
  lua_pop(L, 1);
  cJSON *spec = cJSON_CreateObject();
  if (!m || !spec) {
    cJSON_Delete(m);
    cJSON_Delete(spec);
    mg_buf_free(&src);
    return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  }
  cJSON_AddNumberToObject(spec, "heads", s->heads);
  cJSON_AddNumberToObject(spec, "d_n", s->d_n);
  cJSON_AddNumberToObject(spec, "d_r", s->d_r);
  cJSON_AddNumberToObject(spec, "d_v", s->d_v);
  cJSON_AddNumberToObject(spec, "d_c", s->d_c);
  cJSON_AddStringToObject(spec, "dtype", s->dtype);
  cJSON_AddBoolToObject(spec, "causal", s->causal);
  if (s->varlen) cJSON_AddBoolToObject(spec, "varlen", 1);
  if (s->arch[0]) cJSON_AddStringToObject(spec, "arch", s->arch);
  cJSON_AddItemToObject(m, "spec", spec);
  cJSON_AddStringToObject(m, "file", out->file);
  cJSON_AddStringToObject(m, "template", tname);
  out->manifest = m;
  mg_diag pd = MG_DIAG_INIT;
  if (mg_manifest_parse(m, &out->info, &pd)) { /* the one parse of the entry */
    rc = mg_diag_set(d, MLAGEN_ETEMPLATE, "%s: %s", tpl->display, mg_diag_msg(&pd));
    mg_diag_clear(&pd);
    mg_buf_free(&src);
    mg_kernel_free(out);
    return rc;
  }
  out->source = mg_buf_take(&src, &out->source_len);
  if (!out->source) {
    mg_kernel_free(out);
    return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  }
  out->acct = a;
  a->refs++;
  a->live += out->source_len;
  return 0;
}

void mg_kernel_free(mg_kernel *k) {
  if (!k) return;
  if (k->acct) {
    k->acct->live -= k->source_len < k->acct->live ? k->source_len : k->acct->live;
    acct_release(k->acct);
  }
  free(k->source);
  cJSON_Delete(k->manifest);
  memset(k, 0, sizeof *k);
}

static int write_file(const char *dir, const char *name, const void *data, size_t len, mg_diag *d) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *path = malloc(n);
  if (!path) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  snprintf(path, n, "%s/%s", dir, name);
  int rc = mg_fs_write_atomic(path, data, len, d);
  free(path);
  return rc;
}

/* Removes the first n kernel files and the first `headers` device headers from dir. */
static void remove_written(const char *dir, const mg_kernel *kernels, int n, int headers,
                           const mg_gen *g) {
  char path[4200];
  for (int i = 0; i < n + headers; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, i < n ? kernels[i].file : g->headers[i - n].name);
    remove(path);
  }
}

int mg_gen_write(mg_gen *g, const mg_shape *shape, int sp, const mg_kernel *kernels, int n,
                 const char *dir, mg_diag *d) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++)
      if (strcmp(kernels[i].name, kernels[j].name) == 0)
        return mg_diag_set(d, MLAGEN_ETEMPLATE, "two kernels are named %s", kernels[i].name);
  int rc = mg_fs_mkdirs(dir, d);
  if (rc) return rc;
  /* The manifest is written last; on any failure the files this call wrote are removed,
   * so a directory never holds a manifest and sources of different runs. */
  int written = 0;
  for (; written < n && !rc; written++)
    rc = write_file(dir, kernels[written].file, kernels[written].source, kernels[written].source_len, d);
  if (rc) written--;
  int hw = 0;
  for (; !rc && hw < g->n_headers; hw++)
    rc = write_file(dir, g->headers[hw].name, g->headers[hw].data, g->headers[hw].size, d);
  if (rc) { /* the kernels written, and the headers before the one that failed */
    remove_written(dir, kernels, written, hw ? hw - 1 : 0, g);
    return rc;
  }

  cJSON *root = cJSON_CreateObject();
  cJSON *model = cJSON_AddObjectToObject(root, "model");
  cJSON *list = cJSON_AddArrayToObject(root, "kernels");
  cJSON *hdrs = cJSON_AddArrayToObject(root, "headers");
  if (!root || !model || !list || !hdrs) {
    cJSON_Delete(root);
    remove_written(dir, kernels, n, g->n_headers, g);
    return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  }
  cJSON_AddStringToObject(root, "mlagen_version", MLAGEN_VERSION);
  cJSON_AddStringToObject(root, "template_hash", g->hash);
  cJSON_AddNumberToObject(root, "sp", sp);
  for (int i = 0; i < g->n_headers; i++)
    cJSON_AddItemToArray(hdrs, cJSON_CreateString(g->headers[i].name));
  cJSON_AddStringToObject(model, "source", shape->source);
  cJSON_AddStringToObject(model, "model_type", shape->model_type);
  cJSON_AddNumberToObject(model, "num_attention_heads", shape->heads);
  cJSON_AddNumberToObject(model, "kv_lora_rank", shape->kv_lora_rank);
  cJSON_AddNumberToObject(model, "qk_rope_head_dim", shape->qk_rope_head_dim);
  cJSON_AddNumberToObject(model, "qk_nope_head_dim", shape->qk_nope_head_dim);
  cJSON_AddNumberToObject(model, "v_head_dim", shape->v_head_dim);
  cJSON_AddNumberToObject(model, "mscale", shape->mscale);
  cJSON_AddNumberToObject(model, "softmax_scale", shape->softmax_scale);
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(list, cJSON_Duplicate(kernels[i].manifest, 1));
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  if (!text) {
    remove_written(dir, kernels, n, g->n_headers, g);
    return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  }
  size_t len = strlen(text);
  mg_buf b;
  mg_buf_init(&b, 0);
  rc = mg_buf_add(&b, text, len);
  if (!rc) rc = mg_buf_adds(&b, "\n");
  free(text);
  if (rc) {
    mg_buf_free(&b);
    remove_written(dir, kernels, n, g->n_headers, g);
    return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  }
  rc = write_file(dir, "manifest.json", b.data, b.len, d);
  mg_buf_free(&b);
  if (rc) remove_written(dir, kernels, n, g->n_headers, g);
  return rc;
}
