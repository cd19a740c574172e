/* mg_tune_store.c: the tuned store (tuned/<arch>/<device>.json) and its lookup at plan
 * time. See mg_tune_store.h. */
#define _DEFAULT_SOURCE 1 /* flock() */
#include "mg_tune_store.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "mg_buf.h"
#include <unistd.h>

#include "mg_fs.h"
#include "mlagen.h"

#ifndef MLAGEN_VERSION
#define MLAGEN_VERSION "0.0.0"
#endif
#define STORE_MAX_BYTES (64u << 20)

/* ---- small helpers ------------------------------------------------------------------ */

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...) {
  mg_buf b;
  mg_buf_init(&b, 0);
  va_list ap;
  va_start(ap, fmt);
  int rc = mg_buf_vaddf(&b, fmt, ap);
  va_end(ap);
  if (rc) {
    mg_buf_free(&b);
    return NULL;
  }
  return mg_buf_take(&b, NULL);
}

char *mg_tune_config_str(const mg_tune_config *c, char *buf, size_t n) {
  if (n == 0) return buf;
  buf[0] = '\0';
  size_t used = 0;
  for (int i = 0; i < c->n && used < n; i++) {
    int w = snprintf(buf + used, n - used, "%s%s=%ld", i ? " " : "", c->v[i].name, c->v[i].value);
    if (w < 0) break;
    used += (size_t)w;
  }
  return buf;
}

/* By name, then value: a file naming a tunable twice reads back in one order (the first
 * k_packed, mg_tune_entry_layout, is then the same after a write and a read). */
static int cmp_tv(const void *a, const void *b) {
  const mg_tunable_value *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->value > y->value) - (x->value < y->value);
}

static void config_sort(mg_tune_config *c) {
  qsort(c->v, (size_t)c->n, sizeof c->v[0], cmp_tv);
}

const char *mg_tune_verdict_name(int verdict) {
  switch (verdict) {
    case MG_TUNE_KEPT: return "kept";
    case MG_TUNE_REJECTED: return "rejected-by-check";
    case MG_TUNE_PRUNED: return "pruned";
    case MG_TUNE_FAILED_LAUNCH: return "failed-launch";
    case MG_TUNE_WRONG_RESULT: return "wrong-result";
    default: return "failed";
  }
}


static int config_from_json(const cJSON *obj, mg_tune_config *c) {
  memset(c, 0, sizeof *c);
  if (!cJSON_IsObject(obj)) return -1;
  const cJSON *it;
  cJSON_ArrayForEach(it, obj) {
    /* integers a tunable can hold (|v| < 2^31), names a tunable can have */
    if (!cJSON_IsNumber(it) || !it->string || c->n == MG_SPEC_MAX_CONFIG ||
        strlen(it->string) >= sizeof c->v[0].name || !(fabs(it->valuedouble) < 2147483648.0) ||
        it->valuedouble != floor(it->valuedouble) || strpbrk(it->string, ".= ") || !it->string[0])
      return -1;
    snprintf(c->v[c->n].name, sizeof c->v[0].name, "%s", it->string);
    c->v[c->n].value = (long)it->valuedouble;
    c->n++;
  }
  if (c->n == 0) return -1; /* every family has tunables: "{}" names no configuration */
  config_sort(c);
  return 0;
}

static cJSON *config_to_json(const mg_tune_config *c) {
  cJSON *o = cJSON_CreateObject();
  for (int i = 0; o && i < c->n; i++) cJSON_AddNumberToObject(o, c->v[i].name, (double)c->v[i].value);
  return o;
}

int mg_tune_resolved_config(mg_gen *g, const mg_kernel_spec *s, mg_tune_config *config,
                            mg_diag *d) {
  mg_kernel k;
  int rc = mg_gen_kernel(g, s, &k, d);
  if (rc) return rc;
  memset(config, 0, sizeof *config);
  config->n = k.info.n_config; /* names sorted */
  memcpy(config->v, k.info.config, sizeof k.info.config);
  mg_kernel_free(&k);
  return 0;
}

/* ---- the store ------------------------------------------------------------------------- */

long long mg_tune_bucket(long long seq) {
  long long b = MG_TUNE_MIN_BUCKET;
  while (b < seq && b < (1LL << 62)) b <<= 1;
  return b;
}

const char *mg_tune_store_dir(void) {
  const char *e = getenv("MLAGEN_TUNED_DIR");
  return e && *e ? e : "./tuned";
}

int mg_tune_store_path(const char *dir, const char *arch, const char *device, char *buf,
                       size_t n, mg_diag *d) {
  if (!arch || !*arch || !device || !*device || strchr(arch, '/'))
    return mg_diag_set(d, MLAGEN_EINVAL, "store path: empty arch or device, or '/' in the arch");
  char dev[128];
  size_t i = 0;
  for (; device[i] && i < sizeof dev - 1; i++) {
    char ch = device[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '.' || ch == '_' || ch == '-';
    dev[i] = ok ? ch : '_';
  }
  dev[i] = '\0';
  if (dev[0] == '.') dev[0] = '_'; /* no ".", "..", hidden files */
  int w = snprintf(buf, n, "%s/%s/%s.json", dir ? dir : mg_tune_store_dir(), arch, dev);
  if (w < 0 || (size_t)w >= n) return mg_diag_set(d, MLAGEN_ELIMIT, "store path too long");
  return 0;
}

void mg_tune_store_free(mg_tune_store *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++) free(s->entries[i].candidates);
  free(s->entries);
  s->entries = NULL;
  s->n = 0;
}

/* The key layout k_packed among v[0..n) of a keyed family (mg_spec_keyed: k_packed is its
 * kernels' interface), else (another family, or no k_packed given) -1. */
static long layout_of(const char *family, const mg_tunable_value *v, int n) {
  if (!mg_spec_keyed(family)) return -1;
  for (int i = 0; i < n; i++)
    if (!strcmp(v[i].name, "k_packed")) return v[i].value;
  return -1;
}

long mg_tune_entry_layout(const mg_tune_entry *e) {
  return layout_of(e->family, e->config.v, e->config.n);
}

/* The key but the key layout. */
static int same_shape_key(const mg_tune_entry *a, const mg_tune_entry *b) {
  return strcmp(a->family, b->family) == 0 && strcmp(a->form, b->form) == 0 &&
         a->heads == b->heads && a->d_n == b->d_n &&
         a->d_r == b->d_r && a->d_v == b->d_v && a->d_c == b->d_c &&
         strcmp(a->dtype, b->dtype) == 0 && a->causal == b->causal &&
         a->seq_bucket == b->seq_bucket;
}

int mg_tune_entry_same_key(const mg_tune_entry *a, const mg_tune_entry *b) {
  return same_shape_key(a, b) && mg_tune_entry_layout(a) == mg_tune_entry_layout(b);
}

void mg_tune_entry_key(mg_tune_entry *e, const mg_kernel_spec *s, const char *form,
                       long long seq) {
  memset(e, 0, sizeof *e);
  snprintf(e->family, sizeof e->family, "%s", s->family);
  snprintf(e->form, sizeof e->form, "%s", form ? form : "");
  e->heads = s->heads;
  e->d_n = s->d_n;
  e->d_r = s->d_r;
  e->d_v = s->d_v;
  e->d_c = s->d_c;
  snprintf(e->dtype, sizeof e->dtype, "%s", s->dtype);
  e->causal = s->causal;
  e->seq_bucket = mg_tune_bucket(seq);
}

static void add_timing(cJSON *o, double p20, double p50, double p80) {
  cJSON_AddNumberToObject(o, "p20_ms", p20);
  cJSON_AddNumberToObject(o, "p50_ms", p50);
  cJSON_AddNumberToObject(o, "p80_ms", p80);
}

char *mg_tune_store_json(const mg_tune_store *s) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return NULL;
  const mg_tune_header *h = &s->header;
  cJSON_AddNumberToObject(root, "schema", h->schema);
  cJSON_AddStringToObject(root, "mlagen_version", h->mlagen_version);
  cJSON_AddStringToObject(root, "template_hash", h->template_hash);
  cJSON_AddStringToObject(root, "nvrtc_version", h->nvrtc_version);
  cJSON_AddNumberToObject(root, "driver_version", h->driver_version);
  cJSON_AddStringToObject(root, "device", h->device);
  cJSON_AddStringToObject(root, "arch", h->arch);
  cJSON_AddNumberToObject(root, "sm_count", h->sm_count);
  cJSON *arr = cJSON_AddArrayToObject(root, "entries");
  for (int i = 0; arr && i < s->n; i++) {
    const mg_tune_entry *e = &s->entries[i];
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddItemToArray(arr, o);
    cJSON_AddStringToObject(o, "family", e->family);
    if (e->form[0]) cJSON_AddStringToObject(o, "form", e->form);
    cJSON_AddStringToObject(o, "pass", e->pass);
    cJSON *sh = cJSON_AddObjectToObject(o, "shape");
    cJSON_AddNumberToObject(sh, "heads", e->heads);
    cJSON_AddNumberToObject(sh, "d_n", e->d_n);
    cJSON_AddNumberToObject(sh, "d_r", e->d_r);
    cJSON_AddNumberToObject(sh, "d_v", e->d_v);
    cJSON_AddNumberToObject(sh, "d_c", e->d_c);
    cJSON_AddStringToObject(sh, "dtype", e->dtype);
    cJSON_AddBoolToObject(sh, "causal", e->causal);
    cJSON_AddNumberToObject(o, "seq_bucket", (double)e->seq_bucket);
    cJSON_AddStringToObject(o, "template_hash", e->template_hash[0] ? e->template_hash : h->template_hash);
    cJSON_AddItemToObject(o, "config", config_to_json(&e->config));
    add_timing(o, e->p20_ms, e->p50_ms, e->p80_ms);
    cJSON_AddNumberToObject(o, "tflops", e->tflops);
    cJSON *cands = cJSON_AddArrayToObject(o, "candidates");
    for (int j = 0; cands && j < e->n_candidates; j++) {
      cJSON *c = cJSON_CreateObject();
      if (!c) break;
      cJSON_AddItemToArray(cands, c);
      const mg_tune_timing *t = &e->candidates[j];
      const int discarded = t->verdict == MG_TUNE_FAILED_LAUNCH || t->verdict == MG_TUNE_WRONG_RESULT;
      cJSON_AddItemToObject(c, "config", config_to_json(&t->config));
      cJSON_AddStringToObject(c, "verdict", mg_tune_verdict_name(discarded ? t->verdict : MG_TUNE_KEPT));
      if (!discarded) add_timing(c, t->p20_ms, t->p50_ms, t->p80_ms);
      else cJSON_AddStringToObject(c, "reason", t->reason);
    }
  }
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  return text;
}

/* Field readers: set *bad to the field name on a missing or mistyped field. */
static double num(const cJSON *o, const char *key, const char **bad) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
    if (!*bad) *bad = key;
    return 0;
  }
  return v->valuedouble;
}

/* A timing: a number above 0 (a time of 0 or below was never measured); a rate
 * (zero_ok): 0 or above (a layout kernel does no FLOPs). */
static double positive(const cJSON *o, const char *key, int zero_ok, const char **bad) {
  double v = num(o, key, bad);
  if (!*bad && !(v > 0 || (zero_ok && v == 0))) *bad = key;
  return v;
}

/* An integral number in [lo, hi]; anything else (1e300, 2.5, -1 for a count) sets *bad
 * and reads as 0, so no out-of-range double is ever cast. */
static long long inum(const cJSON *o, const char *key, long long lo, long long hi,
                      const char **bad) {
  const char *was = *bad;
  double v = num(o, key, bad);
  if (*bad != was) return 0;
  if (!(v >= (double)lo && v <= (double)hi) || v != floor(v)) {
    if (!*bad) *bad = key;
    return 0;
  }
  return (long long)v;
}

static void str(const cJSON *o, const char *key, char *dst, size_t n, int optional,
                const char **bad) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  dst[0] = '\0';
  if (!v && optional) return;
  if (!cJSON_IsString(v) || strlen(v->valuestring) >= n) {
    if (!*bad) *bad = key;
    return;
  }
  snprintf(dst, n, "%s", v->valuestring);
}

static int read_entry(const cJSON *o, mg_tune_entry *e, const char **bad) {
  memset(e, 0, sizeof *e);
  if (!cJSON_IsObject(o)) {
    *bad = "entries[]";
    return -1;
  }
  str(o, "family", e->family, sizeof e->family, 0, bad);
  str(o, "form", e->form, sizeof e->form, 1, bad);
  str(o, "pass", e->pass, sizeof e->pass, 0, bad);
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
  if (!cJSON_IsObject(sh) && !*bad) *bad = "shape";
  e->heads = (int)inum(sh, "heads", 0, INT_MAX, bad);
  e->d_n = (int)inum(sh, "d_n", 0, INT_MAX, bad);
  e->d_r = (int)inum(sh, "d_r", 0, INT_MAX, bad);
  e->d_v = (int)inum(sh, "d_v", 0, INT_MAX, bad);
  e->d_c = (int)inum(sh, "d_c", 0, INT_MAX, bad);
  str(sh, "dtype", e->dtype, sizeof e->dtype, 0, bad);
  const cJSON *causal = cJSON_GetObjectItemCaseSensitive(sh, "causal");
  if (!cJSON_IsBool(causal) && !*bad) *bad = "causal";
  e->causal = cJSON_IsTrue(causal);
  e->seq_bucket = inum(o, "seq_bucket", 0, (long long)1 << 53, bad);
  /* absent (schemas 1 and 2): the caller gives it the header's */
  str(o, "template_hash", e->template_hash, sizeof e->template_hash, 1, bad);
  if (config_from_json(cJSON_GetObjectItemCaseSensitive(o, "config"), &e->config) && !*bad)
    *bad = "config";
  e->p20_ms = positive(o, "p20_ms", 0, bad);
  e->p50_ms = positive(o, "p50_ms", 0, bad);
  e->p80_ms = positive(o, "p80_ms", 0, bad);
  e->tflops = positive(o, "tflops", 1, bad);
  const cJSON *cands = cJSON_GetObjectItemCaseSensitive(o, "candidates");
  if (!cJSON_IsArray(cands) && !*bad) *bad = "candidates";
  if (*bad) return -1;
  int nc = cJSON_GetArraySize(cands);
  if (nc > 0) {
    e->candidates = calloc((size_t)nc, sizeof *e->candidates);
    if (!e->candidates) return -2;
  }
  const cJSON *c;
  cJSON_ArrayForEach(c, cands) {
    mg_tune_timing *t = &e->candidates[e->n_candidates++];
    if (config_from_json(cJSON_GetObjectItemCaseSensitive(c, "config"), &t->config) && !*bad)
      *bad = "candidates[].config";
    /* "verdict": absent or "kept" for a timed candidate, else one discarded at timing */
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, "verdict");
    t->verdict = MG_TUNE_KEPT;
    if (v && !cJSON_IsString(v) && !*bad) *bad = "candidates[].verdict";
    if (cJSON_IsString(v)) {
      if (strcmp(v->valuestring, mg_tune_verdict_name(MG_TUNE_FAILED_LAUNCH)) == 0)
        t->verdict = MG_TUNE_FAILED_LAUNCH;
      else if (strcmp(v->valuestring, mg_tune_verdict_name(MG_TUNE_WRONG_RESULT)) == 0)
        t->verdict = MG_TUNE_WRONG_RESULT;
      else if (strcmp(v->valuestring, mg_tune_verdict_name(MG_TUNE_KEPT)) != 0 && !*bad)
        *bad = "candidates[].verdict";
    }
    if (t->verdict == MG_TUNE_KEPT) {
      t->p20_ms = positive(c, "p20_ms", 0, bad);
      t->p50_ms = positive(c, "p50_ms", 0, bad);
      t->p80_ms = positive(c, "p80_ms", 0, bad);
    } else {
      str(c, "reason", t->reason, sizeof t->reason, 1, bad);
    }
  }
  return *bad ? -1 : 0;
}

static int store_parse(const char *path, const char *text, mg_tune_store *out, mg_diag *d) {
  if (!path) path = "<memory>";
  memset(out, 0, sizeof *out);
  cJSON *root = cJSON_Parse(text);
  if (!root) return mg_diag_set(d, MLAGEN_ECONFIG, "%s: not valid JSON", path);
  const char *bad = NULL;
  mg_tune_header *h = &out->header;
  if (!cJSON_IsObject(root)) bad = "the top level (not an object)";
  h->schema = (int)inum(root, "schema", 0, INT_MAX, &bad);
  str(root, "mlagen_version", h->mlagen_version, sizeof h->mlagen_version, 0, &bad);
  str(root, "template_hash", h->template_hash, sizeof h->template_hash, 0, &bad);
  str(root, "nvrtc_version", h->nvrtc_version, sizeof h->nvrtc_version, 0, &bad);
  h->driver_version = (int)inum(root, "driver_version", 0, INT_MAX, &bad);
  str(root, "device", h->device, sizeof h->device, 0, &bad);
  str(root, "arch", h->arch, sizeof h->arch, 0, &bad);
  h->sm_count = (int)inum(root, "sm_count", 0, INT_MAX, &bad);
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "entries");
  if (!cJSON_IsArray(arr) && !bad) bad = "entries";
  int rc = 0;
  if (!bad) {
    int n = cJSON_GetArraySize(arr);
    out->entries = n ? calloc((size_t)n, sizeof *out->entries) : NULL;
    if (n && !out->entries) rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
      if (rc || bad) break;
      mg_tune_entry *t = &out->entries[out->n];
      int r = read_entry(e, t, &bad);
      out->n++; /* counted even on failure, so its candidates are freed */
      if (!t->template_hash[0]) memcpy(t->template_hash, h->template_hash, sizeof t->template_hash);
      if (r == -2) rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
    }
  }
  cJSON_Delete(root);
  if (!rc && bad)
    rc = mg_diag_set(d, MLAGEN_ECONFIG, "%s: not a tuned store: missing or invalid '%s'", path, bad);
  if (rc) mg_tune_store_free(out);
  return rc;
}

int mg_tune_store_read(const char *path, mg_tune_store *out, mg_diag *d) {
  memset(out, 0, sizeof *out);
  char *text = NULL;
  size_t len = 0;
  int rc = mg_fs_read(path, STORE_MAX_BYTES, &text, &len, d);
  if (rc == MLAGEN_ELIMIT) rc = MLAGEN_ECONFIG; /* too large: treated as corrupt */
  if (rc) return rc;
  rc = mg_tune_store_parse(text, len, path, out, d);
  free(text);
  return rc;
}

int mg_tune_store_parse(const char *text, size_t len, const char *name, mg_tune_store *out,
                        mg_diag *d) {
  memset(out, 0, sizeof *out);
  if (!name) name = "<memory>";
  if (memchr(text, '\0', len))
    return mg_diag_set(d, MLAGEN_ECONFIG, "%s: not a tuned store: a NUL byte", name);
  if (len > STORE_MAX_BYTES)
    return mg_diag_set(d, MLAGEN_ECONFIG, "%s: not a tuned store: larger than %zu bytes", name,
                       (size_t)STORE_MAX_BYTES);
  char *z = malloc(len + 1);
  if (!z) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  memcpy(z, text, len);
  z[len] = '\0';
  int rc = store_parse(name, z, out, d);
  free(z);
  return rc;
}

const char *mg_tune_header_mismatch(const mg_tune_header *h, const mg_tune_header *expected) {
  /* schemas 1 and 2 read as subsets of 3 (no verdicts; entries without their own hash) */
  if (h->schema < 1 || h->schema > MG_TUNE_SCHEMA) return "schema version differs";
  if (strcmp(h->device, expected->device) != 0) return "device differs";
  if (strcmp(h->arch, expected->arch) != 0) return "arch differs";
  return NULL;
}

static int copy_entry(mg_tune_entry *dst, const mg_tune_entry *src) {
  *dst = *src;
  dst->candidates = NULL;
  if (src->n_candidates > 0) {
    dst->candidates = malloc((size_t)src->n_candidates * sizeof *dst->candidates);
    if (!dst->candidates) {
      dst->n_candidates = 0;
      return -1;
    }
    memcpy(dst->candidates, src->candidates, (size_t)src->n_candidates * sizeof *dst->candidates);
  }
  return 0;
}

static char *dirname_of(const char *path) {
  char *dir = strdup(path);
  if (!dir) return NULL;
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  else snprintf(dir, 2, ".");
  return dir;
}

int mg_tune_store_writable(const char *dir, const char *arch, const char *device, mg_diag *d) {
  char path[4096], lock[4200];
  int rc = mg_tune_store_path(dir, arch, device, path, sizeof path, d);
  if (rc) return rc;
  snprintf(lock, sizeof lock, "%s.lock", path);
  char *pdir = dirname_of(path);
  if (!pdir) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  rc = mg_fs_mkdirs(pdir, d);
  if (!rc && access(pdir, W_OK) != 0)
    rc = mg_diag_set(d, MLAGEN_EIO, "%s: not writable: %s", pdir, strerror(errno));
  free(pdir);
  if (rc) return rc;
  struct stat st;
  if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return mg_diag_set(d, MLAGEN_EIO, "%s is %s, not a regular file: the store is written in "
                       "place of it only as a regular file (remove it, or set MLAGEN_TUNED_DIR)",
                       path, S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISDIR(st.st_mode) ? "a directory" : "special");
  if (lstat(lock, &st) == 0 && !S_ISREG(st.st_mode))
    return mg_diag_set(d, MLAGEN_EIO, "%s is not a regular file", lock);
  return 0;
}

int mg_tune_store_add(const char *dir, const mg_tune_header *h, const mg_tune_entry *entries,
                      int n, char **warning, mg_diag *d) {
  if (warning) *warning = NULL;
  char path[4096], lock[4200];
  int rc = mg_tune_store_path(dir, h->arch, h->device, path, sizeof path, d);
  if (rc) return rc;
  snprintf(lock, sizeof lock, "%s.lock", path);
  char *pdir = dirname_of(path);
  if (!pdir) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  rc = mg_fs_mkdirs(pdir, d);
  free(pdir);
  if (rc) return rc;
  int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return mg_diag_set(d, MLAGEN_EIO, "%s: cannot open: %s", lock, strerror(errno));
  while (flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      int e = errno;
      close(fd);
      return mg_diag_set(d, MLAGEN_EIO, "%s: flock: %s", lock, strerror(e));
    }
  }
  mg_tune_store old, merged;
  memset(&old, 0, sizeof old);
  memset(&merged, 0, sizeof merged);
  mg_diag rd = MG_DIAG_INIT;
  int have_old = 0;
  if (mg_fs_is_file(path)) {
    int r = mg_tune_store_read(path, &old, &rd);
    if (r == MLAGEN_ENOMEM) {
      rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
      goto out;
    }
    if (r) {
      if (warning) *warning = xasprintf("%s: corrupt, replaced (its entries are dropped): %s", path,
                                        mg_diag_msg(&rd));
    } else {
      const char *why = mg_tune_header_mismatch(&old.header, h);
      if (why) {
        if (warning) *warning = xasprintf("%s: %s, replaced (its %d entries are dropped)", path, why, old.n);
        mg_tune_store_free(&old);
      } else {
        have_old = 1;
      }
    }
  }
  merged.header = *h;
  merged.header.schema = MG_TUNE_SCHEMA;
  int cap = (have_old ? old.n : 0) + n;
  merged.entries = cap ? calloc((size_t)cap, sizeof *merged.entries) : NULL;
  if (cap && !merged.entries) {
    rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; have_old && i < old.n; i++) {
    int replaced = 0;
    for (int j = 0; j < n && !replaced; j++) replaced = mg_tune_entry_same_key(&old.entries[i], &entries[j]);
    if (replaced) continue;
    merged.entries[merged.n] = old.entries[i]; /* move */
    old.entries[i].candidates = NULL;
    merged.n++;
  }
  for (int j = 0; j < n; j++) {
    int dup = 0; /* a later entry of the same key wins */
    for (int k = j + 1; k < n && !dup; k++) dup = mg_tune_entry_same_key(&entries[j], &entries[k]);
    if (dup) continue;
    if (copy_entry(&merged.entries[merged.n], &entries[j])) {
      rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
      goto out;
    }
    merged.n++;
  }
  char *text = mg_tune_store_json(&merged);
  if (!text) {
    rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
    goto out;
  }
  rc = mg_fs_write_atomic(path, text, strlen(text), d);
  free(text);
out:
  if (have_old) mg_tune_store_free(&old);
  mg_tune_store_free(&merged);
  mg_diag_clear(&rd);
  flock(fd, LOCK_UN);
  close(fd);
  return rc;
}

/* ---- lookup -------------------------------------------------------------------------- */

/* Whether entry e was tuned with the templates that render its kernels now. */
static int entry_current(const mg_tune_entry *e, const char *family_hash, const char *set_hash) {
  if (!family_hash) return 1;
  return strcmp(e->template_hash, family_hash) == 0 || (set_hash && strcmp(e->template_hash, set_hash) == 0);
}

int mg_tune_lookup(const char *store_dir, const char *arch, const char *device,
                   const char *family_hash, const char *set_hash, const mg_kernel_spec *s,
                   const char *form, long long seq, mg_tune_config *config, char **why) {
  memset(config, 0, sizeof *config);
  if (why) *why = NULL;
  char path[4096];
  mg_diag d = MG_DIAG_INIT;
  char *msg = NULL;
  int result = MG_TUNE_DEFAULT;
  mg_tune_entry key;
  mg_tune_entry_key(&key, s, form, seq);
  if (mg_tune_store_path(store_dir, arch, device, path, sizeof path, &d)) {
    msg = xasprintf("default: no tuned store for %s/%s (%s)", arch ? arch : "?",
                    device ? device : "?", mg_diag_msg(&d));
    goto done;
  }
  if (!mg_fs_is_file(path)) {
    msg = xasprintf("default: no tuned store for %s/%s (%s)", arch, device, path);
    goto done;
  }
  mg_tune_store st;
  int rc = mg_tune_store_read(path, &st, &d);
  if (rc == MLAGEN_ENOMEM) {
    mg_diag_clear(&d);
    return MLAGEN_ENOMEM;
  }
  if (rc) {
    msg = xasprintf("default: %s is corrupt, ignored (%s)", path, mg_diag_msg(&d));
    goto done;
  }
  mg_tune_header expect;
  memset(&expect, 0, sizeof expect);
  snprintf(expect.device, sizeof expect.device, "%s", device);
  snprintf(expect.arch, sizeof expect.arch, "%s", arch);
  const char *mismatch = mg_tune_header_mismatch(&st.header, &expect);
  if (mismatch) {
    msg = xasprintf("default: %s ignored: %s", path, mismatch);
    mg_tune_store_free(&st);
    goto done;
  }
  /* the step's key layout: an entry of that layout (or of none) first; one measured for the
   * other layout only when there is none (mg_tune_choose then says it does not apply) */
  const long want = layout_of(s->family, s->config, s->n_config);
  const mg_tune_entry *hit = NULL, *stale = NULL, *other = NULL;
  for (int pass = 0; pass < 2 && !hit; pass++) { /* this form's entry, then a form-less one */
    if (pass == 1 && !key.form[0]) break;
    mg_tune_entry k2 = key;
    if (pass == 1) k2.form[0] = '\0';
    for (int i = 0; i < st.n && !hit; i++) {
      if (!same_shape_key(&st.entries[i], &k2)) continue;
      const long got = mg_tune_entry_layout(&st.entries[i]);
      const int current = entry_current(&st.entries[i], family_hash, set_hash);
      if (want >= 0 && got >= 0 && got != want) {
        if (current && !other) other = &st.entries[i];
      } else if (current) {
        hit = &st.entries[i];
      } else if (!stale) {
        stale = &st.entries[i];
      }
    }
  }
  if (!hit && !stale) hit = other;
  if (!hit && stale) {
    /* the hashes' first 12 characters, or as many as it takes to tell them apart (an entry's
     * hash cut short shares a prefix with the right one) */
    int w = 12;
    while (w < 64 && strncmp(stale->template_hash, family_hash, (size_t)w) == 0 &&
           (stale->template_hash[w] || family_hash[w]))
      w++;
    msg = xasprintf("default: the %s template changed since it was tuned (%s entry %s%s%s %s bucket "
                    "%lld: entry hash %.*s, now %.*s)", stale->family, path, stale->family,
                    stale->form[0] ? " form " : "", stale->form,
                    stale->causal ? "causal" : "non-causal", stale->seq_bucket, w,
                    stale->template_hash, w, family_hash);
  } else if (hit) {
    *config = hit->config;
    char cfg[256];
    msg = xasprintf("tuned: %s entry %s%s%s %s bucket %lld (%s), p50 %.3f ms, %.1f TFLOP/s", path,
                    hit->family, hit->form[0] ? " form " : "", hit->form,
                    hit->causal ? "causal" : "non-causal", hit->seq_bucket,
                    mg_tune_config_str(&hit->config, cfg, sizeof cfg), hit->p50_ms, hit->tflops);
    result = MG_TUNE_TUNED;
  } else {
    msg = xasprintf("default: %s has no entry for %s %s H=%d d_n=%d d_r=%d d_v=%d d_c=%d %s "
                    "bucket %lld", path, key.family, key.causal ? "causal" : "non-causal",
                    key.heads, key.d_n, key.d_r, key.d_v, key.d_c, key.dtype, key.seq_bucket);
  }
  mg_tune_store_free(&st);
done:
  mg_diag_clear(&d);
  if (why) *why = msg;
  else free(msg);
  if (why && !*why) return MLAGEN_ENOMEM;
  return result;
}

int mg_tune_choose(mg_gen *g, const char *store_dir, const char *arch, const char *device,
                   const mg_kernel_spec *s, const char *form, long long seq, mg_kernel_spec *out,
                   char *why, size_t n, mg_kernel *kernel, mg_diag *d) {
  char scratch[8];
  if (!why) why = scratch, n = sizeof scratch;
  if (kernel) memset(kernel, 0, sizeof *kernel);
  *out = *s;
  mg_spec_plan_tunables(out);
  mg_tune_config cfg;
  char *w = NULL;
  const char *fam_hash = mg_gen_family_hash(g, out->family);
  int src = mg_tune_lookup(store_dir, arch, device, fam_hash ? fam_hash : "", mg_gen_template_hash(g),
                           out, form, seq, &cfg, &w);
  if (src < 0) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  snprintf(why, n, "%s", w ? w : "");
  free(w);
  if (src == MG_TUNE_TUNED) {
    mg_kernel_spec t = *out;
    mg_diag td = MG_DIAG_INIT;
    int rc = 0;
    for (int j = 0; j < cfg.n && !rc; j++) {
      char a[64];
      snprintf(a, sizeof a, "%s=%ld", cfg.v[j].name, cfg.v[j].value);
      rc = mg_spec_set(&t, a, &td);
    }
    /* the step's key layout (k_packed, mg_spec_step_tunables) is the kernel's interface: a
     * configuration measured for the other layout was measured for another kernel */
    const long want = layout_of(out->family, out->config, out->n_config),
               got = layout_of(out->family, cfg.v, cfg.n);
    if (!rc && got >= 0 && got != want)
      rc = mg_diag_set(&td, MLAGEN_EINVAL, "it has k_packed=%ld, the step runs k_packed=%ld (%s keys)",
                       got, want, want ? "packed" : "split");
    mg_spec_plan_tunables(&t);
    mg_kernel k;
    if (!rc && (rc = mg_gen_kernel(g, &t, &k, &td)) == 0) {
      *out = t;
      if (kernel) *kernel = k;
      else mg_kernel_free(&k);
      return 0;
    }
    snprintf(why, n, "default: the stored configuration does not apply (%s)", mg_diag_msg(&td));
    mg_diag_clear(&td);
  }
  return kernel ? mg_gen_kernel(g, out, kernel, d) : 0;
}
