/* mg_safetensors.c: safetensors files in (validated, converted to float/double) and out
 * (atomic). See mg_safetensors.h for the format and the contract. */
#include "mg_safetensors.h"

#include <cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_buf.h"
#include "mg_fs.h"
#include "mlagen.h"

/* JSON numbers are doubles: integers are exact up to 2^53, which bounds dims and
 * offsets far beyond any file that fits in memory. */
#define MAX_JSON_INT 9007199254740992.0

struct mg_st_file {
  char *path;
  unsigned char *bytes; /* the whole file, NUL-terminated */
  size_t len;
  const unsigned char *data; /* the data section */
  size_t data_len;
  int n;
  mg_st_tensor *t;               /* in data-offset order */
  const mg_st_tensor **by_name;  /* sorted by name */
  int nmeta;
  char **meta; /* key0, value0, key1, value1, ... */
};

/* ---- little-endian loads and stores (element conversions: mg_dtype.h) -------------- */

static uint16_t ld16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t ld64(const unsigned char *p) { return ld32(p) | (uint64_t)ld32(p + 4) << 32; }
static void st16(unsigned char *p, uint16_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
}
static void st32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void st64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static double f64_of_bits(uint64_t u) {
  double x;
  memcpy(&x, &u, 8);
  return x;
}
static uint64_t bits_of_f64(double x) {
  uint64_t u;
  memcpy(&u, &x, 8);
  return u;
}

/* ---- helpers ------------------------------------------------------------------------ */

static const char *st_dtype_name(mg_dtype t) {
  switch (t) {
    case MG_F32: return "F32";
    case MG_F64: return "F64";
    case MG_BF16: return "BF16";
    case MG_F16: return "F16";
  }
  return "?";
}

/* A stored type: a float dtype (*int_bytes = 0), or I32 / I64 (*int_bytes 4 / 8, *out the
 * float type of the same width, for byte counts). */
static int st_dtype_parse(const char *s, mg_dtype *out, int *int_bytes) {
  static const struct { const char *name; mg_dtype t; int int_bytes; } table[] = {
      {"F32", MG_F32, 0}, {"F64", MG_F64, 0}, {"BF16", MG_BF16, 0}, {"F16", MG_F16, 0},
      {"I32", MG_F32, 4}, {"I64", MG_F64, 8}};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(s, table[i].name) == 0) {
      *out = table[i].t;
      *int_bytes = table[i].int_bytes;
      return 0;
    }
  return -1;
}

/* The stored type's name of a tensor read from a file ("F32", "I64"). */
static const char *st_type_name(const mg_st_tensor *t) {
  return t->int_bytes == 4 ? "I32" : t->int_bytes == 8 ? "I64" : st_dtype_name(t->dtype);
}

/* 1 if s[0..n) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF);
 * else 0 and *bad = the offset of the first bad byte. */
static int utf8_valid(const unsigned char *s, size_t n, size_t *bad) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    size_t k;
    unsigned lo = 0x80, hi = 0xbf;
    if (c < 0x80) {
      i++;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      k = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      k = 2;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      k = 3;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      goto fail;
    }
    if (n - i <= k) goto fail;
    if (s[i + 1] < lo || s[i + 1] > hi) goto fail;
    for (size_t j = 2; j <= k; j++)
      if (s[i + j] < 0x80 || s[i + j] > 0xbf) goto fail;
    i += k + 1;
  }
  return 1;
fail:
  if (bad) *bad = i;
  return 0;
}

/* A name made fit for a one-line message: control bytes as '?', cut at 60 bytes. */
typedef struct { char s[72]; } shown;
static shown show(const char *name) {
  shown r;
  size_t i = 0;
  for (; name[i] && i < 60; i++) {
    unsigned char c = (unsigned char)name[i];
    r.s[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
  }
  if (name[i]) {
    memcpy(r.s + i, "...", 4);
  } else {
    r.s[i] = '\0';
  }
  return r;
}

typedef struct { char s[MG_ST_MAX_DIMS * 22 + 4]; } shape_str;
static shape_str fmt_shape(int ndim, const int64_t *shape) {
  shape_str r;
  size_t k = 0;
  r.s[k++] = '[';
  for (int i = 0; i < ndim && i < MG_ST_MAX_DIMS; i++)
    k += (size_t)snprintf(r.s + k, sizeof r.s - k, "%s%" PRId64, i ? ", " : "", shape[i]);
  snprintf(r.s + k, sizeof r.s - k, "]");
  return r;
}

/* numel and byte count of a shape, 0 on success, -1 on overflow (of int64 or size_t). */
static int shape_bytes(int ndim, const int64_t *shape, mg_dtype t, size_t *numel,
                       size_t *nbytes) {
  uint64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    uint64_t s = (uint64_t)shape[i];
    if (s != 0 && n > (uint64_t)INT64_MAX / s) return -1;
    n *= s;
  }
  size_t sz = mg_dtype_size(t);
  if (n > SIZE_MAX / sz) return -1;
  *numel = (size_t)n;
  *nbytes = (size_t)n * sz;
  return 0;
}

/* 0 and *v when j is a JSON number holding an integer in [0, 2^53]; else -1. */
static int json_uint(const cJSON *j, uint64_t *v) {
  if (!cJSON_IsNumber(j)) return -1;
  double x = j->valuedouble;
  if (!(x >= 0 && x <= MAX_JSON_INT)) return -1;
  uint64_t u = (uint64_t)x;
  if ((double)u != x) return -1;
  *v = u;
  return 0;
}

/* ---- reading -------------------------------------------------------------------------- */

void mg_st_close(mg_st_file *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) free((char *)f->t[i].name);
  for (int i = 0; i < 2 * f->nmeta; i++) free(f->meta[i]);
  free(f->meta);
  free(f->t);
  free(f->by_name);
  free(f->bytes);
  free(f->path);
  free(f);
}

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

static int cmp_offset(const void *a, const void *b) {
  const mg_st_tensor *x = a, *y = b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int cmp_name(const void *a, const void *b) {
  const mg_st_tensor *const *x = a, *const *y = b;
  return strcmp((*x)->name, (*y)->name);
}

/* Fills tensor *t from the header entry e (its name already set). */
static int parse_entry(const mg_st_file *f, const cJSON *e, mg_st_tensor *t, mg_diag *d) {
  const char *p = f->path;
  shown nm = show(t->name);
  if (!cJSON_IsObject(e))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': entry is not a JSON object", p, nm.s);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
  const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  static const char *const keys[] = {"dtype", "shape", "data_offsets"};
  const cJSON *vals[] = {dt, sh, of};
  for (int i = 0; i < 3; i++)
    if (!vals[i])
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': missing \"%s\"", p, nm.s, keys[i]);

  if (!cJSON_IsString(dt))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': \"dtype\" is not a string", p, nm.s);
  if (st_dtype_parse(dt->valuestring, &t->dtype, &t->int_bytes) != 0) {
    shown ds = show(dt->valuestring);
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: tensor '%s': dtype %s is not supported: expected BF16, F16, F32, "
                       "F64, I32 or I64", p, nm.s, ds.s);
  }

  if (!cJSON_IsArray(sh))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': \"shape\" is not an array", p, nm.s);
  int ndim = cJSON_GetArraySize(sh);
  if (ndim > MG_ST_MAX_DIMS)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': %d dims, more than the %d supported",
                       p, nm.s, ndim, MG_ST_MAX_DIMS);
  t->ndim = ndim;
  int i = 0;
  for (const cJSON *x = sh->child; x; x = x->next, i++) {
    uint64_t v;
    if (json_uint(x, &v) != 0) {
      if (cJSON_IsNumber(x))
        return mg_diag_set(d, MLAGEN_EINVAL,
                           "%s: tensor '%s': shape dim %d (%.17g) is not a non-negative integer",
                           p, nm.s, i, x->valuedouble);
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': shape dim %d is not a number", p,
                         nm.s, i);
    }
    t->shape[i] = (int64_t)v;
  }
  size_t numel, need;
  if (shape_bytes(ndim, t->shape, t->dtype, &numel, &need) != 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': shape %s overflows the byte count",
                       p, nm.s, fmt_shape(ndim, t->shape).s);

  uint64_t b, en;
  if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 || json_uint(of->child, &b) != 0 ||
      json_uint(of->child->next, &en) != 0)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: tensor '%s': \"data_offsets\" is not an array of two non-negative "
                       "integers", p, nm.s);
  if (b > en)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] begin after "
                       "they end", p, nm.s, b, en);
  if (en > f->data_len)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] run past the "
                       "end of the %zu-byte data section", p, nm.s, b, en, f->data_len);
  if (en - b != need)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                       " bytes, but %s shape %s needs %zu", p, nm.s, b, en, en - b,
                       st_type_name(t), fmt_shape(ndim, t->shape).s, need);
  t->offset = (size_t)b;
  t->nbytes = need;
  return 0;
}

static int parse_meta(mg_st_file *f, const cJSON *m, mg_diag *d) {
  if (cJSON_IsNull(m)) return 0;
  if (!cJSON_IsObject(m))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: \"__metadata__\" is not a JSON object", f->path);
  int n = cJSON_GetArraySize(m);
  f->meta = calloc((size_t)n * 2 + 1, sizeof *f->meta);
  if (!f->meta) return mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory", f->path);
  for (const cJSON *x = m->child; x; x = x->next) {
    if (!cJSON_IsString(x))
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: \"__metadata__\" entry '%s' is not a string",
                         f->path, show(x->string).s);
    char *k = dupstr(x->string), *v = dupstr(x->valuestring);
    if (!k || !v) {
      free(k);
      free(v);
      return mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory", f->path);
    }
    f->meta[2 * f->nmeta] = k;
    f->meta[2 * f->nmeta + 1] = v;
    f->nmeta++;
  }
  return 0;
}

static int parse_file(mg_st_file *f, mg_diag *d) {
  const char *p = f->path;
  if (f->len < 8)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: %zu bytes, shorter than the 8-byte safetensors header length", p,
                       f->len);
  uint64_t hn = ld64(f->bytes);
  if (hn > MG_ST_MAX_HEADER)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: header length %" PRIu64 " is over the limit of %" PRIu64
                       " bytes (not a safetensors file?)", p, hn, MG_ST_MAX_HEADER);
  if (hn > f->len - 8)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: header length %" PRIu64 " runs past the end of the %zu-byte file", p,
                       hn, f->len);
  const char *hdr = (const char *)f->bytes + 8;
  size_t hlen = (size_t)hn, bad = 0;
  f->data = f->bytes + 8 + hlen;
  f->data_len = f->len - 8 - hlen;
  if (!utf8_valid((const unsigned char *)hdr, hlen, &bad))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: header is not valid UTF-8 (at header byte %zu)", p,
                       bad);
  const char *end = NULL;
  /* JSON has no raw NUL; cJSON would stop there and accept a truncated header */
  const char *nul = memchr(hdr, '\0', hlen);
  if (nul)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: header holds a NUL byte (at header byte %zu)", p,
                       (size_t)(nul - hdr));
  cJSON *root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
  if (!root)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: header is not valid JSON (at header byte %zu)", p,
                       end && end >= hdr ? (size_t)(end - hdr) : (size_t)0);
  int rc = 0;
  for (const char *q = end; q < hdr + hlen; q++)
    if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
      rc = mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: header has text after the JSON object (at header byte %zu)", p,
                       (size_t)(q - hdr));
      goto done;
    }
  if (!cJSON_IsObject(root)) {
    rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: header is not a JSON object", p);
    goto done;
  }
  int total = cJSON_GetArraySize(root);
  f->t = calloc((size_t)total + 1, sizeof *f->t);
  f->by_name = calloc((size_t)total + 1, sizeof *f->by_name);
  if (!f->t || !f->by_name) {
    rc = mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory", p);
    goto done;
  }
  int seen_meta = 0;
  for (const cJSON *e = root->child; e; e = e->next) {
    if (strcmp(e->string, "__metadata__") == 0) {
      if (seen_meta++) {
        rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: \"__metadata__\" appears twice", p);
        goto done;
      }
      if ((rc = parse_meta(f, e, d)) != 0) goto done;
      continue;
    }
    size_t nlen = strlen(e->string);
    if (nlen > MG_ST_MAX_NAME) {
      rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': name is %zu bytes, over the limit of %d",
                       p, show(e->string).s, nlen, MG_ST_MAX_NAME);
      goto done;
    }
    mg_st_tensor *t = &f->t[f->n];
    if (!(t->name = dupstr(e->string))) {
      rc = mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory", p);
      goto done;
    }
    f->n++;
    if ((rc = parse_entry(f, e, t, d)) != 0) goto done;
  }

  /* No name twice. */
  for (int i = 0; i < f->n; i++) f->by_name[i] = &f->t[i];
  qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name);
  for (int i = 1; i < f->n; i++)
    if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0) {
      rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s' appears twice in the header", p,
                       show(f->by_name[i]->name).s);
      goto done;
    }

  /* The tensors tile the data section: no overlap, no hole, nothing after the last. */
  qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_offset);
  size_t pos = 0;
  for (int i = 0; i < f->n; i++) {
    const mg_st_tensor *t = &f->t[i];
    if (t->offset < pos) {
      const mg_st_tensor *u = &f->t[i - 1]; /* pos > 0 means a previous one ends at pos */
      rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap",
                       p, show(u->name).s, u->offset, u->offset + u->nbytes, show(t->name).s,
                       t->offset, t->offset + t->nbytes);
      goto done;
    }
    if (t->offset > pos) {
      rc = mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: data section bytes [%zu, %zu) belong to no tensor (a hole before '%s')",
                       p, pos, t->offset, show(t->name).s);
      goto done;
    }
    pos = t->offset + t->nbytes;
  }
  if (pos != f->data_len) {
    rc = mg_diag_set(d, MLAGEN_EINVAL,
                     "%s: data section bytes [%zu, %zu) belong to no tensor (trailing bytes)", p,
                     pos, f->data_len);
    goto done;
  }
  /* Sorting moved the tensors: point by_name at their new places. */
  for (int i = 0; i < f->n; i++) f->by_name[i] = &f->t[i];
  qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name);
done:
  cJSON_Delete(root);
  return rc;
}

static int open_common(mg_st_file *f, mg_st_file **out, mg_diag *d) {
  int rc = parse_file(f, d);
  if (rc != 0) {
    mg_st_close(f);
    return rc;
  }
  *out = f;
  return 0;
}

int mg_st_open(const char *path, mg_st_file **out, mg_diag *d) {
  *out = NULL;
  mg_st_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = dupstr(path))) {
    free(f);
    return mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory", path);
  }
  char *bytes;
  int rc = mg_fs_read(path, SIZE_MAX / 2, &bytes, &f->len, d);
  if (rc != 0) {
    mg_st_close(f);
    return rc;
  }
  f->bytes = (unsigned char *)bytes;
  return open_common(f, out, d);
}

int mg_st_open_mem(const void *bytes, size_t len, const char *label, mg_st_file **out,
                   mg_diag *d) {
  *out = NULL;
  if (!label) label = "<memory>";
  mg_st_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = dupstr(label)) || len == SIZE_MAX || !(f->bytes = malloc(len + 1))) {
    mg_st_close(f);
    return mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory", label);
  }
  if (len) memcpy(f->bytes, bytes, len);
  f->bytes[len] = 0;
  f->len = len;
  return open_common(f, out, d);
}

int mg_st_count(const mg_st_file *f) { return f->n; }

const mg_st_tensor *mg_st_at(const mg_st_file *f, int i) {
  return i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const mg_st_tensor *mg_st_find(const mg_st_file *f, const char *name) {
  mg_st_tensor key;
  key.name = name;
  const mg_st_tensor *pk = &key;
  const mg_st_tensor *const *r = bsearch(&pk, f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name);
  return r ? *r : NULL;
}

const void *mg_st_data(const mg_st_file *f, const mg_st_tensor *t) { return f->data + t->offset; }

const char *mg_st_meta(const mg_st_file *f, const char *key) {
  for (int i = f->nmeta - 1; i >= 0; i--) /* the last wins, as in a JSON map */
    if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
  return NULL;
}

const char *mg_st_path(const mg_st_file *f) { return f->path; }

/* Finds name and checks its shape; *numel on success. */
static int lookup(const mg_st_file *f, const char *name, int ndim, const int64_t *shape,
                  const mg_st_tensor **out, size_t *numel, mg_diag *d) {
  const mg_st_tensor *t = mg_st_find(f, name);
  if (!t) return mg_diag_set(d, MLAGEN_EINVAL, "%s: no tensor named '%s'", f->path, show(name).s);
  if (ndim < 0 || ndim > MG_ST_MAX_DIMS)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': asked for %d dims (0..%d)", f->path,
                       show(name).s, ndim, MG_ST_MAX_DIMS);
  int same = t->ndim == ndim;
  for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
  if (!same)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s' has shape %s, expected %s", f->path,
                       show(name).s, fmt_shape(t->ndim, t->shape).s, fmt_shape(ndim, shape).s);
  *out = t;
  *numel = t->nbytes / mg_dtype_size(t->dtype);
  return 0;
}

static void to_f32(const unsigned char *s, mg_dtype t, size_t n, float *o) {
  switch (t) {
    case MG_F32:
      for (size_t i = 0; i < n; i++) o[i] = mg_f32_of_bits(ld32(s + 4 * i));
      break;
    case MG_F64:
      for (size_t i = 0; i < n; i++) o[i] = (float)f64_of_bits(ld64(s + 8 * i));
      break;
    case MG_BF16:
      for (size_t i = 0; i < n; i++) o[i] = mg_bf16_to_f32(ld16(s + 2 * i));
      break;
    case MG_F16:
      for (size_t i = 0; i < n; i++) o[i] = mg_f16_to_f32(ld16(s + 2 * i));
      break;
  }
}

static void to_f64(const unsigned char *s, mg_dtype t, size_t n, double *o) {
  switch (t) {
    case MG_F32:
      for (size_t i = 0; i < n; i++) o[i] = (double)mg_f32_of_bits(ld32(s + 4 * i));
      break;
    case MG_F64:
      for (size_t i = 0; i < n; i++) o[i] = f64_of_bits(ld64(s + 8 * i));
      break;
    case MG_BF16:
      for (size_t i = 0; i < n; i++) o[i] = (double)mg_bf16_to_f32(ld16(s + 2 * i));
      break;
    case MG_F16:
      for (size_t i = 0; i < n; i++) o[i] = (double)mg_f16_to_f32(ld16(s + 2 * i));
      break;
  }
}

/* Reads dims [start, start+count) along dim into out (float when dbl == 0, else double).
 * dim = -1 reads the whole tensor. */
static int read_any(const mg_st_file *f, const char *name, int ndim, const int64_t *shape,
                    int dim, int64_t start, int64_t count, void *out, int dbl, mg_diag *d) {
  const mg_st_tensor *t = NULL;
  size_t numel = 0;
  int rc = lookup(f, name, ndim, shape, &t, &numel, d);
  if (rc != 0) return rc;
  if (t->int_bytes)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s' is %s: expected a float tensor (BF16, "
                       "F16, F32 or F64)", f->path, show(name).s, st_type_name(t));
  size_t es = mg_dtype_size(t->dtype), os = dbl ? sizeof(double) : sizeof(float);
  const unsigned char *src = f->data + t->offset;
  size_t outer = 1, len = numel, stride = numel, skip = 0;
  if (dim >= 0) {
    if (dim >= ndim)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': slice dim %d, but it has %d dims",
                         f->path, show(name).s, dim, ndim);
    if (start < 0 || count < 0 || start > shape[dim] || count > shape[dim] - start)
      return mg_diag_set(d, MLAGEN_EINVAL,
                         "%s: tensor '%s': slice start %" PRId64 " count %" PRId64
                         " does not fit in dim %d of size %" PRId64, f->path, show(name).s,
                         start, count, dim, shape[dim]);
    size_t inner = 1;
    for (int i = 0; i < dim; i++) outer *= (size_t)shape[i];
    for (int i = dim + 1; i < ndim; i++) inner *= (size_t)shape[i];
    if (numel == 0) outer = 0; /* a zero dim elsewhere: nothing to copy */
    stride = (size_t)shape[dim] * inner;
    skip = (size_t)start * inner;
    len = (size_t)count * inner;
  }
  if (!out && outer * len > 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': output buffer is NULL", f->path,
                       show(name).s);
  unsigned char *o = out;
  for (size_t k = 0; k < outer && len > 0; k++) {
    const unsigned char *s = src + (k * stride + skip) * es;
    if (dbl)
      to_f64(s, t->dtype, len, (double *)(void *)(o + k * len * os));
    else
      to_f32(s, t->dtype, len, (float *)(void *)(o + k * len * os));
  }
  return 0;
}

int mg_st_read_i64(const mg_st_file *f, const char *name, int ndim, const int64_t *shape,
                   int64_t *out, mg_diag *d) {
  const mg_st_tensor *t = NULL;
  size_t numel = 0;
  int rc = lookup(f, name, ndim, shape, &t, &numel, d);
  if (rc != 0) return rc;
  if (!t->int_bytes)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s' is %s: expected an integer tensor "
                       "(I32 or I64)", f->path, show(name).s, st_type_name(t));
  if (!out && numel > 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': output buffer is NULL", f->path,
                       show(name).s);
  const unsigned char *src = f->data + t->offset;
  for (size_t i = 0; i < numel; i++) /* two's complement, sign-extended */
    out[i] = t->int_bytes == 4 ? (int64_t)(int32_t)ld32(src + 4 * i) : (int64_t)ld64(src + 8 * i);
  return 0;
}

int mg_st_read_f32(const mg_st_file *f, const char *name, int ndim, const int64_t *shape,
                   float *out, mg_diag *d) {
  return read_any(f, name, ndim, shape, -1, 0, 0, out, 0, d);
}

int mg_st_read_f64(const mg_st_file *f, const char *name, int ndim, const int64_t *shape,
                   double *out, mg_diag *d) {
  return read_any(f, name, ndim, shape, -1, 0, 0, out, 1, d);
}

int mg_st_read_f32_rows(const mg_st_file *f, const char *name, int ndim,
                        const int64_t *shape, int dim, int64_t start, int64_t count,
                        float *out, mg_diag *d) {
  if (dim < 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': slice dim %d is negative", f->path,
                       show(name).s, dim);
  return read_any(f, name, ndim, shape, dim, start, count, out, 0, d);
}

int mg_st_read_f64_rows(const mg_st_file *f, const char *name, int ndim,
                        const int64_t *shape, int dim, int64_t start, int64_t count,
                        double *out, mg_diag *d) {
  if (dim < 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: tensor '%s': slice dim %d is negative", f->path,
                       show(name).s, dim);
  return read_any(f, name, ndim, shape, dim, start, count, out, 1, d);
}

/* ---- writing -------------------------------------------------------------------------- */

typedef struct wtensor {
  char *name;
  mg_dtype dtype;
  int ndim;
  int64_t shape[MG_ST_MAX_DIMS];
  size_t nbytes;
  unsigned char *data; /* little-endian, nbytes */
  size_t offset;       /* assigned by write */
} wtensor;

struct mg_st_writer {
  wtensor *t;
  int n, cap;
  char **meta; /* key, value pairs */
  int nmeta, metacap;
};

int mg_st_writer_new(mg_st_writer **out, mg_diag *d) {
  *out = calloc(1, sizeof **out);
  return *out ? 0 : mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
}

void mg_st_writer_free(mg_st_writer *w) {
  if (!w) return;
  for (int i = 0; i < w->n; i++) {
    free(w->t[i].name);
    free(w->t[i].data);
  }
  for (int i = 0; i < 2 * w->nmeta; i++) free(w->meta[i]);
  free(w->t);
  free(w->meta);
  free(w);
}

static int utf8_str(const char *s) { return utf8_valid((const unsigned char *)s, strlen(s), NULL); }

/* Validates and appends a tensor; the caller fills its data from src (numel values). */
static int writer_add(mg_st_writer *w, const char *name, mg_dtype dtype, int ndim,
                      const int64_t *shape, const void *src, int src_f64, mg_diag *d) {
  size_t nlen = strlen(name);
  if (nlen > MG_ST_MAX_NAME)
    return mg_diag_set(d, MLAGEN_EINVAL, "tensor '%s': name is %zu bytes, over the limit of %d",
                       show(name).s, nlen, MG_ST_MAX_NAME);
  if (!utf8_str(name))
    return mg_diag_set(d, MLAGEN_EINVAL, "tensor '%s': name is not valid UTF-8", show(name).s);
  if (strcmp(name, "__metadata__") == 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "'__metadata__' is reserved and cannot name a tensor");
  for (int i = 0; i < w->n; i++)
    if (strcmp(w->t[i].name, name) == 0)
      return mg_diag_set(d, MLAGEN_EINVAL, "tensor '%s' was already added", show(name).s);
  if (ndim < 0 || ndim > MG_ST_MAX_DIMS)
    return mg_diag_set(d, MLAGEN_EINVAL, "tensor '%s': %d dims, expected 0..%d", show(name).s,
                       ndim, MG_ST_MAX_DIMS);
  if ((unsigned)dtype > MG_F16)
    return mg_diag_set(d, MLAGEN_EINVAL, "tensor '%s': unknown dtype %d", show(name).s, (int)dtype);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return mg_diag_set(d, MLAGEN_EINVAL, "tensor '%s': shape %s has a negative dim",
                         show(name).s, fmt_shape(ndim, shape).s);
  size_t numel, nbytes;
  if (shape_bytes(ndim, shape, dtype, &numel, &nbytes) != 0 ||
      numel > SIZE_MAX / (src_f64 ? 8 : 4))
    return mg_diag_set(d, MLAGEN_EINVAL, "tensor '%s': shape %s overflows the byte count",
                       show(name).s, fmt_shape(ndim, shape).s);
  if (numel > 0 && !src)
    return mg_diag_set(d, MLAGEN_EINVAL, "tensor '%s': data is NULL", show(name).s);
  if (w->n == w->cap) {
    int nc = w->cap ? 2 * w->cap : 8;
    wtensor *nt = realloc(w->t, (size_t)nc * sizeof *nt);
    if (!nt) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
    w->t = nt;
    w->cap = nc;
  }
  wtensor *t = &w->t[w->n];
  memset(t, 0, sizeof *t);
  t->name = dupstr(name);
  t->data = malloc(nbytes ? nbytes : 1);
  if (!t->name || !t->data) {
    free(t->name);
    free(t->data);
    return mg_diag_set(d, MLAGEN_ENOMEM, "tensor '%s': out of memory for %zu bytes",
                       show(name).s, nbytes);
  }
  t->dtype = dtype;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  t->nbytes = nbytes;
  const float *sf = src;
  const double *sd = src;
  unsigned char *o = t->data;
  for (size_t i = 0; i < numel; i++) {
    switch (dtype) {
      case MG_F64: st64(o + 8 * i, bits_of_f64(src_f64 ? sd[i] : (double)sf[i])); break;
      case MG_F32: st32(o + 4 * i, mg_bits_of_f32(sf[i])); break;
      case MG_BF16: st16(o + 2 * i, mg_f32_to_bf16(sf[i])); break;
      case MG_F16: st16(o + 2 * i, mg_f32_to_f16(sf[i])); break;
    }
  }
  w->n++;
  return 0;
}

int mg_st_writer_add_f32(mg_st_writer *w, const char *name, int ndim, const int64_t *shape,
                         const float *data, mg_diag *d) {
  return writer_add(w, name, MG_F32, ndim, shape, data, 0, d);
}

int mg_st_writer_add_f64(mg_st_writer *w, const char *name, int ndim, const int64_t *shape,
                         const double *data, mg_diag *d) {
  return writer_add(w, name, MG_F64, ndim, shape, data, 1, d);
}

int mg_st_writer_add_f32_as(mg_st_writer *w, const char *name, mg_dtype dtype, int ndim,
                            const int64_t *shape, const float *data, mg_diag *d) {
  return writer_add(w, name, dtype, ndim, shape, data, 0, d);
}

int mg_st_writer_add_meta(mg_st_writer *w, const char *key, const char *value, mg_diag *d) {
  if (!utf8_str(key) || !utf8_str(value))
    return mg_diag_set(d, MLAGEN_EINVAL, "metadata '%s': key or value is not valid UTF-8",
                       show(key).s);
  for (int i = 0; i < w->nmeta; i++)
    if (strcmp(w->meta[2 * i], key) == 0)
      return mg_diag_set(d, MLAGEN_EINVAL, "metadata key '%s' was already added", show(key).s);
  if (w->nmeta == w->metacap) {
    int nc = w->metacap ? 2 * w->metacap : 4;
    char **nm = realloc(w->meta, (size_t)nc * 2 * sizeof *nm);
    if (!nm) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
    w->meta = nm;
    w->metacap = nc;
  }
  char *k = dupstr(key), *v = dupstr(value);
  if (!k || !v) {
    free(k);
    free(v);
    return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  }
  w->meta[2 * w->nmeta] = k;
  w->meta[2 * w->nmeta + 1] = v;
  w->nmeta++;
  return 0;
}

/* Appends s as a JSON string literal. */
static int json_str(mg_buf *b, const char *s) {
  int rc = mg_buf_add(b, "\"", 1);
  for (; *s && rc == 0; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      rc = mg_buf_add(b, e, 2);
    } else if (c < 0x20) {
      rc = mg_buf_addf(b, "\\u%04x", c);
    } else {
      rc = mg_buf_add(b, s, 1);
    }
  }
  return rc ? rc : mg_buf_add(b, "\"", 1);
}

int mg_st_writer_write(mg_st_writer *w, const char *path, mg_diag *d) {
  /* Data layout: 8-byte types, then 4, then 2, each group in the order added. */
  size_t data_len = 0;
  for (size_t es = 8; es >= 2; es /= 2)
    for (int i = 0; i < w->n; i++) {
      wtensor *t = &w->t[i];
      if (mg_dtype_size(t->dtype) != es) continue;
      if (t->nbytes > SIZE_MAX - data_len)
        return mg_diag_set(d, MLAGEN_EINVAL, "%s: the data would overflow the size type", path);
      t->offset = data_len;
      data_len += t->nbytes;
    }

  mg_buf h;
  mg_buf_init(&h, MG_BUF_DEFAULT_MAX);
  int rc = mg_buf_add(&h, "{", 1);
  const char *sep = "";
  if (w->nmeta > 0) {
    rc = rc ? rc : mg_buf_adds(&h, "\"__metadata__\":{");
    for (int i = 0; i < w->nmeta && rc == 0; i++) {
      rc = mg_buf_adds(&h, i ? "," : "");
      rc = rc ? rc : json_str(&h, w->meta[2 * i]);
      rc = rc ? rc : mg_buf_add(&h, ":", 1);
      rc = rc ? rc : json_str(&h, w->meta[2 * i + 1]);
    }
    rc = rc ? rc : mg_buf_add(&h, "}", 1);
    sep = ",";
  }
  for (int i = 0; i < w->n && rc == 0; i++) {
    const wtensor *t = &w->t[i];
    rc = mg_buf_adds(&h, sep);
    sep = ",";
    rc = rc ? rc : json_str(&h, t->name);
    rc = rc ? rc : mg_buf_addf(&h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t->dtype));
    for (int k = 0; k < t->ndim && rc == 0; k++)
      rc = mg_buf_addf(&h, "%s%" PRId64, k ? "," : "", t->shape[k]);
    rc = rc ? rc : mg_buf_addf(&h, "],\"data_offsets\":[%zu,%zu]}", t->offset,
                               t->offset + t->nbytes);
  }
  rc = rc ? rc : mg_buf_add(&h, "}", 1);
  while (rc == 0 && (8 + h.len) % 8 != 0) rc = mg_buf_add(&h, " ", 1);
  if (rc != 0) {
    mg_buf_free(&h);
    return mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory building the header", path);
  }
  if ((uint64_t)h.len > MG_ST_MAX_HEADER) {
    rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: header of %zu bytes is over the limit of %" PRIu64,
                     path, h.len, MG_ST_MAX_HEADER);
    mg_buf_free(&h);
    return rc;
  }
  if (data_len > SIZE_MAX - 8 - h.len) {
    mg_buf_free(&h);
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: the file would overflow the size type", path);
  }
  size_t total = 8 + h.len + data_len;
  unsigned char *file = malloc(total);
  if (!file) {
    mg_buf_free(&h);
    return mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory for %zu bytes", path, total);
  }
  st64(file, (uint64_t)h.len);
  memcpy(file + 8, h.data, h.len);
  unsigned char *data = file + 8 + h.len;
  for (int i = 0; i < w->n; i++)
    if (w->t[i].nbytes) memcpy(data + w->t[i].offset, w->t[i].data, w->t[i].nbytes);
  mg_buf_free(&h);
  rc = mg_fs_write_atomic(path, file, total, d);
  free(file);
  return rc;
}
