/* mg_jit.c: NVRTC compilation to cubin, with a checksummed disk cache.
 *
 * Cache entry <dir>/<key>.cubin (integers little-endian):
 *   "MLAGENJ1"   8 bytes  magic
 *   version      u32      ENTRY_VERSION
 *   meta_len     u32
 *   cubin_len    u64
 *   sum          32 bytes SHA-256 of meta || cubin
 *   meta         meta_len bytes of "key=value\n" lines (the ptxas report, compile_ms,
 *                kernel, arch)
 *   cubin        cubin_len bytes, an ELF image
 * An entry whose sizes do not add up to the file size exactly, whose checksum or magic
 * is wrong, whose meta lacks a field or whose cubin is not ELF is treated as a miss:
 * the source is recompiled and the entry rewritten (atomically, so concurrent writers
 * of the same key leave one complete file). So is an entry of another format version:
 * version 3 added wgmma_serialized, which a version-2 entry cannot say (its log is gone),
 * so such an entry is compiled once more rather than read as "not serialized". */
#include "mg_jit.h"

#include <errno.h>
#include <limits.h>
#include <nvrtc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "mg_buf.h"
#include "mg_fs.h"
#include "mlagen.h"

#ifndef MLAGEN_CUDA_INCLUDE_DIR
#define MLAGEN_CUDA_INCLUDE_DIR ""
#endif

#define KEY_FORMAT "mlagen-jit-key/1" /* bump when anything below changes the cubin */
#define ENTRY_MAGIC "MLAGENJ1"
#define ENTRY_VERSION 3u /* 3: wgmma_serialized; a version-2 entry is a miss */
#define ENTRY_HEADER (8 + 4 + 4 + 8 + MG_HASH_BYTES)
#define ENTRY_MAX ((size_t)256 << 20)
#define VERSION_JSON_MAX ((size_t)1 << 20)

/* Options every compile gets, after --gpu-architecture and before the -I and o->options. */
static const char *const fixed_opts[] = {"-std=c++17", "-lineinfo", "--ptxas-options=-v"};
#define N_FIXED ((int)(sizeof fixed_opts / sizeof fixed_opts[0]))

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static char *dup_mem(const void *p, size_t n) {
  char *s = malloc(n + 1);
  if (!s) return NULL;
  if (n) memcpy(s, p, n);
  s[n] = '\0';
  return s;
}

static const char *env_nonempty(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

void mg_jit_nvrtc_version(int *major, int *minor) {
  int a = 0, b = 0;
  if (nvrtcVersion(&a, &b) != NVRTC_SUCCESS) a = b = 0;
  if (major) *major = a;
  if (minor) *minor = b;
}

void mg_cubin_free(mg_cubin *c) {
  if (!c) return;
  free(c->data);
  free(c->log);
  free(c->warning);
  memset(c, 0, sizeof *c);
}

/* ---- the cache directory ------------------------------------------------------ */

static int cache_dir_buf(const mg_jit_opts *o, mg_buf *b, mg_diag *d) {
  const char *v;
  int rc;
  if (o && o->cache_dir && *o->cache_dir)
    rc = mg_buf_adds(b, o->cache_dir);
  else if ((v = env_nonempty("MLAGEN_CACHE_DIR")))
    rc = mg_buf_adds(b, v);
  else if ((v = env_nonempty("HOME")))
    rc = mg_buf_addf(b, "%s/.cache/mlagen", v);
  else
    return mg_diag_set(d, MLAGEN_EIO,
                       "no JIT cache directory: neither MLAGEN_CACHE_DIR nor HOME is set");
  return rc ? mg_diag_set(d, rc, "out of memory") : 0;
}

int mg_jit_cache_dir(const mg_jit_opts *o, char *buf, size_t n, mg_diag *d) {
  mg_buf b;
  mg_buf_init(&b, 0);
  int rc = cache_dir_buf(o, &b, d);
  if (rc == 0 && b.len >= n)
    rc = mg_diag_set(d, MLAGEN_ELIMIT, "JIT cache directory path (%zu bytes) does not fit in %zu",
                     b.len, n);
  if (rc == 0) memcpy(buf, mg_buf_str(&b), b.len + 1);
  mg_buf_free(&b);
  return rc;
}

/* ---- the CUDA include directory ---------------------------------------------- */

/* Appends dir (n bytes) to tried; returns 1 if dir/cuda_bf16.h exists. */
static int try_include(const char *dir, size_t n, mg_buf *tried) {
  if (n == 0) return 0;
  char *p = malloc(n + sizeof "/cuda_bf16.h");
  if (!p) return 0;
  memcpy(p, dir, n);
  memcpy(p + n, "/cuda_bf16.h", sizeof "/cuda_bf16.h");
  int ok = mg_fs_is_file(p);
  free(p);
  mg_buf_addf(tried, "%s%.*s", tried->len ? ", " : "", (int)n, dir);
  return ok;
}

/* The first of $CUDA_HOME/include, $CUDA_PATH/include, the build's CUDA include dirs,
 * /usr/local/cuda/include that holds cuda_bf16.h, in *dir (free() it). */
static int find_cuda_include(char **dir, mg_diag *d) {
  static const char *const envs[] = {"CUDA_HOME", "CUDA_PATH"};
  mg_buf tried, cand;
  mg_buf_init(&tried, 0);
  mg_buf_init(&cand, 0);
  *dir = NULL;
  for (size_t i = 0; i < 2 && !*dir; i++) {
    const char *v = env_nonempty(envs[i]);
    if (!v) continue;
    mg_buf_reset(&cand);
    if (mg_buf_addf(&cand, "%s/include", v)) goto nomem;
    if (try_include(cand.data, cand.len, &tried)) *dir = mg_buf_take(&cand, NULL);
  }
  for (const char *p = MLAGEN_CUDA_INCLUDE_DIR; *p && !*dir;) {
    size_t n = strcspn(p, ";");
    if (try_include(p, n, &tried) && !(*dir = dup_mem(p, n))) goto nomem;
    p += n;
    if (*p == ';') p++;
  }
  if (!*dir) {
    const char *def = "/usr/local/cuda/include";
    if (try_include(def, strlen(def), &tried) && !(*dir = dup_mem(def, strlen(def)))) goto nomem;
  }
  int rc = 0;
  if (!*dir)
    rc = mg_diag_set(d, MLAGEN_EIO,
                     "CUDA headers not found (cuda_bf16.h): looked in %s; set CUDA_HOME",
                     mg_buf_str(&tried));
  mg_buf_free(&tried);
  mg_buf_free(&cand);
  return rc;
nomem:
  mg_buf_free(&tried);
  mg_buf_free(&cand);
  return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
}

/* ---- the cache key -------------------------------------------------------------- */

static void hash_int(mg_hash_ctx *h, long long v) {
  char s[32];
  snprintf(s, sizeof s, "%lld", v);
  mg_hash_field_str(h, s);
}

/* SHA-256 over: KEY_FORMAT, the source and its name (the name lands in the line info),
 * the options in order but opts[skip] (the -I path: the toolkit's version.json next to
 * the include dir stands for the headers, when present), the extra headers, the NVRTC
 * version, the template hash and the kernel the report is for. */
static int make_key(const char *src, size_t len, const char *src_name, const char *kernel,
                    const char *const *opts, int nopts, int skip, const char *incdir,
                    const mg_jit_opts *o, char key[MG_HASH_HEX], mg_diag *d) {
  mg_hash_ctx *h = mg_hash_begin();
  mg_hash_field_str(h, KEY_FORMAT);
  mg_hash_field(h, src, len);
  mg_hash_field_str(h, src_name);
  hash_int(h, nopts - 1);
  for (int i = 0; i < nopts; i++)
    if (i != skip) mg_hash_field_str(h, opts[i]);

  size_t n = strlen(incdir) + sizeof "/../version.json";
  char *vpath = malloc(n);
  char *vjson = NULL;
  size_t vlen = 0;
  if (vpath) {
    snprintf(vpath, n, "%s/../version.json", incdir);
    if (mg_fs_read(vpath, VERSION_JSON_MAX, &vjson, &vlen, NULL) != 0) vlen = 0;
  }
  mg_hash_field(h, vjson ? vjson : "", vlen);
  free(vjson);
  free(vpath);

  hash_int(h, o->n_headers);
  for (int i = 0; i < o->n_headers; i++) {
    mg_hash_field_str(h, o->headers[i].name);
    mg_hash_field(h, o->headers[i].data ? o->headers[i].data : "", o->headers[i].size);
  }
  int ma, mi;
  mg_jit_nvrtc_version(&ma, &mi);
  hash_int(h, ma);
  hash_int(h, mi);
  mg_hash_field_str(h, o->template_hash ? o->template_hash : "");
  mg_hash_field_str(h, kernel ? kernel : "");
  uint8_t dig[MG_HASH_BYTES];
  int hrc = mg_hash_end(h, dig);
  if (!vpath || hrc) {
    return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory hashing the JIT cache key");
  }
  mg_hash_hex(dig, key);
  return 0;
}

/* ---- the ptxas report ---------------------------------------------------------- */

/* 1 if the reported entry name is kernel, plainly or Itanium-mangled (_Z<len><name>...). */
static int name_matches(const char *name, size_t n, const char *kernel) {
  size_t k = strlen(kernel);
  if (n == k && memcmp(name, kernel, k) == 0) return 1;
  char pre[40];
  int m = snprintf(pre, sizeof pre, "_Z%zu", k);
  return m > 0 && n > (size_t)m + k && memcmp(name, pre, (size_t)m) == 0 &&
         memcmp(name + m, kernel, k) == 0;
}

/* Parses the comma-separated "<N> <what>" items of one ptxas line ("Used 12 registers,
 * used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]" or "0 bytes stack frame, 0 bytes
 * spill stores, 0 bytes spill loads") into r. Unknown items are ignored. */
static void parse_items(const char *line, size_t n, mg_jit_report *r) {
  const char *p = line, *end = line + n;
  while (p < end) {
    const char *q = memchr(p, ',', (size_t)(end - p));
    if (!q) q = end;
    const char *s = p;
    while (s < q && (*s < '0' || *s > '9')) s++;
    long v = 0;
    while (s < q && *s >= '0' && *s <= '9' && v < LONG_MAX / 10) v = v * 10 + (*s++ - '0');
    while (s < q && *s == ' ') s++;
    size_t w = (size_t)(q - s);
    while (w && (s[w - 1] == ' ' || s[w - 1] == '\r')) w--;
#define IS(lit) (w >= sizeof lit - 1 && memcmp(s, lit, sizeof lit - 1) == 0)
    if (s < q) {
      if (IS("registers")) r->registers = (int)(v > INT_MAX ? INT_MAX : v);
      else if (IS("barrier")) r->barriers = (int)(v > INT_MAX ? INT_MAX : v);
      else if (IS("bytes smem")) r->smem_bytes = v;
      else if (IS("bytes cmem[0]")) r->cmem_bytes = v;
      else if (IS("bytes stack frame")) r->stack_bytes = v;
      else if (IS("bytes spill stores")) r->spill_stores = v;
      else if (IS("bytes spill loads")) r->spill_loads = v;
    }
#undef IS
    p = q + 1;
  }
}

static const char *find_in(const char *p, size_t n, const char *lit) {
  size_t k = strlen(lit);
  for (size_t i = 0; i + k <= n; i++)
    if (memcmp(p + i, lit, k) == 0) return p + i;
  return NULL;
}

/* ptxas's note that it serialized a function's wgmma (NVRTC 13, before the entry lines):
 * "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are
 * serialized due to <reason> in the function '<name>'", name as the entry lines spell it
 * (mangled for C++ linkage). Returns the warning's number (7514) for the first such line
 * naming the entry ent (ent_len bytes) or a function that is no entry of the log (a
 * non-inlined device function, charged to every entry) or no function at all, 1 if
 * that line has no "(C<number>)", 0 if there is none. */
static int parse_serialized(const char *log, const char *ent, size_t ent_len) {
  static const char tag[] = "wgmma.mma_async instructions are serialized";
  static const char fn_tag[] = "in the function '";
  static const char entry_tag[] = "Compiling entry function '";
  for (const char *p = log; *p;) {
    size_t n = strcspn(p, "\n");
    const char *t = find_in(p, n, tag), *f = t ? find_in(t, (size_t)(p + n - t), fn_tag) : NULL;
    if (t) {
      int ours = !f; /* a note naming no function: for every entry */
      size_t m = 0;
      if (f) {
        f += sizeof fn_tag - 1;
        while (f + m < p + n && f[m] != '\'') m++;
        ours = m == ent_len && memcmp(f, ent, m) == 0;
      }
      if (f && !ours) { /* an entry function other than ent? */
        ours = 1;
        for (const char *e = log; (e = strstr(e, entry_tag)); e += sizeof entry_tag - 1) {
          const char *q = e + sizeof entry_tag - 1;
          if (strncmp(q, f, m) == 0 && q[m] == '\'') ours = 0;
        }
      }
      if (ours) {
        const char *c = find_in(p, n, "(C");
        int code = 0;
        for (c = c ? c + 2 : NULL; c && *c >= '0' && *c <= '9' && code < 100000; c++)
          code = code * 10 + (*c - '0');
        return code > 1 ? code : 1;
      }
    }
    p += n;
    if (*p == '\n') p++;
  }
  return 0;
}

/* Fills r from the ptxas lines of log for kernel (NULL: the first entry function) and
 * writes the entry's reported name into name (size nsz). Returns 1 if it was found. */
static int parse_report(const char *log, const char *kernel, mg_jit_report *r, char *name,
                        size_t nsz) {
  static const char entry_tag[] = "Compiling entry function '";
  static const char props_tag[] = "Function properties for ";
  const char *ent = NULL; /* the matched entry's name */
  size_t ent_len = 0;
  int own_props = 0;      /* the last "Function properties" line was for the entry */
  for (const char *p = log; p && *p;) {
    size_t n = strcspn(p, "\n");
    const char *t;
    if ((t = find_in(p, n, entry_tag))) {
      if (ent) break; /* the next entry: ours is complete */
      t += sizeof entry_tag - 1;
      size_t m = 0;
      while (t + m < p + n && t[m] != '\'') m++;
      if (!kernel || name_matches(t, m, kernel)) {
        ent = t;
        ent_len = m;
        own_props = 0;
      }
    } else if (ent && (t = find_in(p, n, props_tag))) {
      t += sizeof props_tag - 1;
      size_t m = (size_t)(p + n - t);
      while (m && (t[m - 1] == ' ' || t[m - 1] == '\r')) m--;
      own_props = m == ent_len && memcmp(t, ent, m) == 0;
    } else if (ent && find_in(p, n, "bytes stack frame")) {
      if (own_props) parse_items(p, n, r);
    } else if (ent && find_in(p, n, "registers")) {
      parse_items(p, n, r);
    }
    p += n;
    if (*p == '\n') p++;
  }
  if (!ent) return 0;
  r->wgmma_serialized = parse_serialized(log, ent, ent_len);
  snprintf(name, nsz, "%.*s", (int)ent_len, ent);
  return 1;
}

int mg_jit_report_parse(const char *log, const char *kernel, mg_jit_report *r) {
  char name[256];
  memset(r, 0, sizeof *r);
  if (parse_report(log, kernel, r, name, sizeof name)) return 1;
  memset(r, 0, sizeof *r);
  return 0;
}

/* ---- cache entries -------------------------------------------------------------- */

static void put_le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* Sums of meta || cubin. */
static int entry_sum(const void *meta, size_t mlen, const void *cubin, size_t clen,
                     uint8_t out[MG_HASH_BYTES]) {
  mg_hash_ctx *h = mg_hash_begin();
  mg_hash_add(h, meta, mlen);
  mg_hash_add(h, cubin, clen);
  return mg_hash_end(h, out);
}

/* Serializes c (its report and cubin) as an entry into b. */
static int entry_build(const mg_cubin *c, const char *kname, const char *arch, mg_buf *b) {
  mg_buf meta;
  mg_buf_init(&meta, 0);
  const mg_jit_report *r = &c->report;
  /* in [0, 1e12] ms before the cast: a read entry may carry any figure (fuzz_jit_entry
   * found compile_ms=99999999999999999 overflowing long long) */
  double ms = r->compile_ms >= 0 ? (r->compile_ms < 1e12 ? r->compile_ms : 1e12) : 0;
  long long us = (long long)(ms * 1000.0 + 0.5);
  int rc = mg_buf_addf(&meta,
                       "key=%s\nkernel=%s\narch=%s\nregisters=%d\nbarriers=%d\nspill_stores=%ld\n"
                       "spill_loads=%ld\nstack_bytes=%ld\nsmem_bytes=%ld\ncmem_bytes=%ld\n"
                       "compile_ms=%lld.%03lld\nwgmma_serialized=%d\n",
                       c->key, kname, arch, r->registers, r->barriers, r->spill_stores, r->spill_loads,
                       r->stack_bytes, r->smem_bytes, r->cmem_bytes, us / 1000, us % 1000,
                       r->wgmma_serialized);
  uint8_t head[ENTRY_HEADER];
  memcpy(head, ENTRY_MAGIC, 8);
  put_le(head + 8, ENTRY_VERSION, 4);
  put_le(head + 12, meta.len, 4);
  put_le(head + 16, c->size, 8);
  if (!rc) rc = entry_sum(meta.data, meta.len, c->data, c->size, head + 24);
  if (!rc) rc = mg_buf_add(b, head, sizeof head);
  if (!rc) rc = mg_buf_add(b, meta.data, meta.len);
  if (!rc) rc = mg_buf_add(b, c->data, c->size);
  mg_buf_free(&meta);
  return rc ? MLAGEN_ENOMEM : 0;
}

/* Strict non-negative decimal; for compile_ms, one optional fraction. */
static int parse_num(const char *s, size_t n, int frac, long *ip, double *dp) {
  long v = 0;
  size_t i = 0;
  if (n == 0) return -1;
  for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
    if (v > (LONG_MAX - 9) / 10) return -1;
    v = v * 10 + (s[i] - '0');
  }
  if (i == 0) return -1;
  double f = 0, scale = 1;
  if (frac && i < n && s[i] == '.') {
    for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) f += (s[i] - '0') * (scale /= 10);
  }
  if (i != n) return -1;
  if (ip) *ip = v;
  if (dp) *dp = (double)v + f;
  return 0;
}

/* Parses the meta lines into r. Returns 0 if every report field was present. */
static int meta_parse(const char *m, size_t n, mg_jit_report *r) {
  static const char *const keys[] = {"registers",   "barriers",   "spill_stores",
                                     "spill_loads", "stack_bytes", "smem_bytes",
                                     "cmem_bytes",  "compile_ms",  "wgmma_serialized"};
  unsigned seen = 0;
  const char *end = m + n;
  while (m < end) {
    const char *nl = memchr(m, '\n', (size_t)(end - m));
    if (!nl) return -1; /* every line ends with \n */
    const char *eq = memchr(m, '=', (size_t)(nl - m));
    if (!eq) return -1;
    size_t klen = (size_t)(eq - m), vlen = (size_t)(nl - eq - 1);
    for (int i = 0; i < 9; i++) {
      if (strlen(keys[i]) != klen || memcmp(m, keys[i], klen) != 0) continue;
      long v;
      double f;
      if (parse_num(eq + 1, vlen, i == 7, &v, &f)) return -1;
      switch (i) {
        case 0: r->registers = v > INT_MAX ? INT_MAX : (int)v; break;
        case 1: r->barriers = v > INT_MAX ? INT_MAX : (int)v; break;
        case 2: r->spill_stores = v; break;
        case 3: r->spill_loads = v; break;
        case 4: r->stack_bytes = v; break;
        case 5: r->smem_bytes = v; break;
        case 6: r->cmem_bytes = v; break;
        case 7: r->compile_ms = f; break;
        default: r->wgmma_serialized = v > INT_MAX ? INT_MAX : (int)v; break;
      }
      seen |= 1u << i;
    }
    m = nl + 1;
  }
  return seen == 0x1ffu ? 0 : -1;
}

/* Validates an entry file's bytes. On success fills out->data/size and the report and
 * returns NULL; else returns why the entry is unusable (nothing is kept). */
static const char *entry_load(const char *f, size_t n, const char *key, mg_cubin *out,
                              int *nomem) {
  const uint8_t *u = (const uint8_t *)f;
  if (n == 0) return "empty file";
  if (n < ENTRY_HEADER) return "shorter than the header";
  if (memcmp(u, ENTRY_MAGIC, 8) != 0) return "bad magic";
  if (get_le(u + 8, 4) != ENTRY_VERSION) return "unknown format version";
  uint64_t mlen = get_le(u + 12, 4), clen = get_le(u + 16, 8);
  uint64_t body = (uint64_t)n - ENTRY_HEADER;
  if (mlen > body || clen != body - mlen) return "sizes do not match the file size";
  const char *meta = f + ENTRY_HEADER, *cubin = meta + mlen;
  uint8_t sum[MG_HASH_BYTES];
  if (entry_sum(meta, (size_t)mlen, cubin, (size_t)clen, sum) != 0) {
    *nomem = 1;
    return "out of memory";
  }
  if (memcmp(sum, u + 24, MG_HASH_BYTES) != 0) return "checksum mismatch";
  if (clen < 4 || memcmp(cubin, "\x7f" "ELF", 4) != 0) return "cubin is not ELF";
  mg_jit_report r;
  memset(&r, 0, sizeof r);
  if (meta_parse(meta, (size_t)mlen, &r) != 0) return "bad metadata";
  /* An intact entry of another kernel (a file copied or renamed) is not this one. */
  char want[MG_HASH_HEX + 6];
  snprintf(want, sizeof want, "key=%s\n", key);
  size_t wl = strlen(want);
  if (mlen < wl || memcmp(meta, want, wl) != 0) return "entry belongs to another key";
  void *p = malloc((size_t)clen);
  if (!p) {
    *nomem = 1;
    return "out of memory";
  }
  memcpy(p, cubin, (size_t)clen);
  out->data = p;
  out->size = (size_t)clen;
  out->report = r;
  return NULL;
}

const char *mg_jit_entry_read(const void *data, size_t n, const char *key, mg_cubin *out,
                              int *nomem) {
  int nm = 0;
  const char *why = entry_load(data, n, key, out, &nm);
  if (nomem) *nomem = nm;
  if (!why) snprintf(out->key, sizeof out->key, "%s", key);
  return why;
}

int mg_jit_entry_write(const mg_cubin *c, const char *kernel, const char *arch, mg_buf *b) {
  return entry_build(c, kernel, arch, b);
}

/* ---- NVRTC ---------------------------------------------------------------------- */

/* Compiles; fills out->data/size/log/report (compile_ms and the ptxas figures) and
 * writes the reported kernel name into kname. The program is always destroyed. */
static int nvrtc_compile(const char *src, const char *src_name, const char *kernel,
                         const char *const *opts, int nopts, const mg_jit_opts *o,
                         mg_cubin *out, char *kname, size_t ksz, mg_buf *warn, mg_diag *d) {
  int rc = 0, nh = o->n_headers;
  char **hdata = NULL;
  const char **hnames = NULL;
  nvrtcProgram prog = NULL;
  char *log = NULL;
  if (nh > 0) {
    hdata = calloc((size_t)nh, sizeof *hdata);
    hnames = calloc((size_t)nh, sizeof *hnames);
    if (!hdata || !hnames) goto nomem;
    for (int i = 0; i < nh; i++) {
      const mg_jit_header *h = &o->headers[i];
      hnames[i] = h->name;
      if (!(hdata[i] = dup_mem(h->data ? h->data : "", h->size))) goto nomem;
    }
  }
  double t0 = now_ms();
  nvrtcResult nr = nvrtcCreateProgram(&prog, src, src_name, nh, (const char *const *)hdata,
                                      hnames);
  if (nr != NVRTC_SUCCESS) {
    prog = NULL;
    if (nr == NVRTC_ERROR_OUT_OF_MEMORY) goto nomem;
    rc = mg_diag_set(d, MLAGEN_ECOMPILE, "NVRTC could not create a program for %s: %s", src_name,
                     nvrtcGetErrorString(nr));
    goto done;
  }
  nr = nvrtcCompileProgram(prog, nopts, opts);
  size_t lsz = 0;
  if (nvrtcGetProgramLogSize(prog, &lsz) == NVRTC_SUCCESS && lsz > 0) {
    if (!(log = malloc(lsz + 1))) goto nomem;
    if (nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = '\0';
    log[lsz] = '\0';
    /* no trailing blank lines in messages */
    for (size_t n = strlen(log); n > 0 && (log[n - 1] == '\n' || log[n - 1] == ' '); n--) log[n - 1] = '\0';
  }
  const char *arch = o->arch, *l = log ? log : "";
  if (nr == NVRTC_ERROR_INVALID_OPTION) {
    if (strstr(l, "gpu-architecture"))
      rc = mg_diag_set(d, MLAGEN_EINVAL, "NVRTC does not know the GPU architecture '%s': %s", arch,
                       l);
    else
      rc = mg_diag_set(d, MLAGEN_EINVAL, "NVRTC rejected an option (compiling for %s): %s", arch,
                       l);
    goto done;
  }
  if (nr == NVRTC_ERROR_OUT_OF_MEMORY) goto nomem;
  if (nr != NVRTC_SUCCESS) {
    if (nr == NVRTC_ERROR_COMPILATION)
      rc = mg_diag_set(d, MLAGEN_ECOMPILE, "NVRTC compile of %s for %s failed:\n%s", src_name, arch,
                       l);
    else
      rc = mg_diag_set(d, MLAGEN_ECOMPILE, "NVRTC compile of %s for %s failed (%s):\n%s", src_name,
                       arch, nvrtcGetErrorString(nr), l);
    goto done;
  }
  size_t csz = 0;
  if (nvrtcGetCUBINSize(prog, &csz) != NVRTC_SUCCESS || csz == 0) {
    rc = mg_diag_set(d, MLAGEN_EINVAL,
                     "NVRTC produced no cubin for '%s': give a real architecture (sm_XX), not a "
                     "virtual one (compute_XX)", arch);
    goto done;
  }
  if (!(out->data = malloc(csz))) goto nomem;
  if ((nr = nvrtcGetCUBIN(prog, out->data)) != NVRTC_SUCCESS) {
    rc = mg_diag_set(d, MLAGEN_ECOMPILE, "NVRTC could not return the cubin of %s: %s", src_name,
                     nvrtcGetErrorString(nr));
    goto done;
  }
  out->size = csz;
  out->report.compile_ms = now_ms() - t0;
  if (!parse_report(l, kernel, &out->report, kname, ksz)) {
    snprintf(kname, ksz, "%s", kernel ? kernel : "");
    if (kernel &&
        mg_buf_addf(warn, "%sptxas reported no entry function '%s'", warn->len ? "; " : "", kernel))
      goto nomem;
  }
  out->log = log ? log : dup_mem("", 0);
  log = NULL;
  if (!out->log) goto nomem;
  goto done;
nomem:
  rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory compiling %s", src_name);
done:
  if (prog) nvrtcDestroyProgram(&prog);
  for (int i = 0; hdata && i < nh; i++) free(hdata[i]);
  free(hdata);
  free(hnames);
  free(log);
  return rc;
}

/* ---- #include policy ------------------------------------------------------------ */

/* The CUDA headers a source or header may include, as <name> only (the device header
 * includes these); any other host file could be read by NVRTC, printed in its error log
 * and left out of the cache key. */
static const char *const cuda_headers[] = {"cuda_bf16.h", "cuda_fp16.h"};

static int is_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Skips blanks (not newlines) and block comments from i; returns the new position. */
static size_t skip_blank(const char *t, size_t n, size_t i) {
  for (;;) {
    while (i < n && (t[i] == ' ' || t[i] == '\t' || t[i] == '\f' || t[i] == '\v' || t[i] == '\r'))
      i++;
    if (i + 1 < n && t[i] == '/' && t[i + 1] == '*') {
      const char *e = find_in(t + i + 2, n - i - 2, "*/");
      i = e ? (size_t)(e - t) + 2 : n;
      continue;
    }
    return i;
  }
}

/* The directive after a '#' at i (its length k: "#", "%:" or "??="): if it includes a
 * file, the operand must name an allowed header. Returns 0 or an error. */
static int check_directive(const char *t, size_t n, size_t i, size_t k, const char *what,
                           const mg_jit_opts *o, mg_diag *d) {
  size_t j = skip_blank(t, n, i + k), w = j;
  while (w < n && is_ident(t[w])) w++;
  size_t wl = w - j;
#define WORD(lit) (wl == sizeof lit - 1 && memcmp(t + j, lit, wl) == 0)
  if (!(WORD("include") || WORD("include_next") || WORD("import") || WORD("embed"))) {
    if (wl == 0 && j < n && t[j] == '\\') /* a universal character name in a directive */
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: a '\\' right after '#' is not accepted", what);
    return 0;
  }
#undef WORD
  size_t a = skip_blank(t, n, w);
  char close = a < n && t[a] == '"' ? '"' : a < n && t[a] == '<' ? '>' : 0;
  size_t b = a + 1;
  while (close && b < n && t[b] != close && t[b] != '\n') b++;
  if (!close || b >= n || t[b] != close)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: #%.*s without a plain \"name\" or <name> is not accepted (only "
                       "the device header and the CUDA headers it uses may be included)",
                       what, (int)wl, t + j);
  const char *name = t + a + 1;
  size_t nl = b - a - 1;
  for (int h = 0; h < o->n_headers; h++)
    if (strlen(o->headers[h].name) == nl && memcmp(o->headers[h].name, name, nl) == 0) return 0;
  for (size_t h = 0; close == '>' && h < sizeof cuda_headers / sizeof *cuda_headers; h++)
    if (strlen(cuda_headers[h]) == nl && memcmp(cuda_headers[h], name, nl) == 0) return 0;
  mg_buf allowed;
  mg_buf_init(&allowed, 0);
  for (int h = 0; h < o->n_headers; h++) mg_buf_addf(&allowed, "\"%s\", ", o->headers[h].name);
  for (size_t h = 0; h < sizeof cuda_headers / sizeof *cuda_headers; h++)
    mg_buf_addf(&allowed, "<%s>%s", cuda_headers[h],
                h + 1 < sizeof cuda_headers / sizeof *cuda_headers ? ", " : "");
  int rc = mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: #%.*s %c%.*s%c refused: generated code may include only %s (another "
                       "file would be read from the host and is not part of the cache key)",
                       what, (int)wl, t + j, t[a], (int)(nl > 200 ? 200 : nl), name, close,
                       mg_buf_str(&allowed));
  mg_buf_free(&allowed);
  return rc;
}

/* Refuses a source or header (what names it) that includes anything but the extra
 * headers and the CUDA headers above. Lexes just enough C++ to know code from comments
 * and literals (raw strings and digit separators included), after line splicing; every
 * '#' in code followed by include, include_next, import or embed is checked, wherever it
 * stands, so a mistake here errs on the side of refusing. */
static int check_includes(const char *src, size_t len, const char *what, const mg_jit_opts *o,
                          mg_diag *d) {
  char *t = malloc(len + 1);
  if (!t) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  size_t n = 0;
  for (size_t i = 0; i < len; i++) { /* phase 2: backslash-newline splicing */
    if (src[i] == '\\' && i + 1 < len && src[i + 1] == '\n') { i++; continue; }
    if (src[i] == '\\' && i + 2 < len && src[i + 1] == '\r' && src[i + 2] == '\n') { i += 2; continue; }
    t[n++] = src[i];
  }
  int rc = 0;
  size_t i = 0;
  while (i < n && !rc) {
    char c = t[i];
    if (c == '/' && i + 1 < n && t[i + 1] == '/') {
      while (i < n && t[i] != '\n') i++;
    } else if (c == '/' && i + 1 < n && t[i + 1] == '*') {
      const char *e = find_in(t + i + 2, n - i - 2, "*/");
      i = e ? (size_t)(e - t) + 2 : n;
    } else if (c == '#' || (c == '%' && i + 1 < n && t[i + 1] == ':') ||
               (c == '?' && i + 2 < n && t[i + 1] == '?' && t[i + 2] == '=')) {
      size_t k = c == '#' ? 1 : c == '%' ? 2 : 3;
      rc = check_directive(t, n, i, k, what, o, d);
      i += k;
    } else if (c >= '0' && c <= '9') { /* a pp-number, digit separators and exponents in it */
      while (i < n && (is_ident(t[i]) || t[i] == '.' ||
                       (t[i] == '\'' && i + 1 < n && is_ident(t[i + 1])) ||
                       ((t[i] == '+' || t[i] == '-') && strchr("eEpP", t[i - 1]))))
        i++;
    } else if (is_ident(c)) { /* an identifier; an encoding prefix starts a literal */
      size_t j = i;
      while (j < n && is_ident(t[j])) j++;
      int raw = t[j - 1] == 'R' && j - i <= 3 && j < n && t[j] == '"' &&
                (j - i == 1 || ((j - i == 2 && strchr("uUL", t[i])) ||
                                (j - i == 3 && t[i] == 'u' && t[i + 1] == '8')));
      size_t q = j + 1, dl = 0;
      while (raw && q < n && dl <= 16 && t[q] != '(' && !strchr(" ()\\\t\v\f\n", t[q])) q++, dl++;
      if (raw && q < n && t[q] == '(') { /* R"delim( ... )delim" */
        size_t e = q + 1;
        while (e < n && !(t[e] == ')' && e + 1 + dl < n &&
                          memcmp(t + e + 1, t + j + 1, dl) == 0 && t[e + 1 + dl] == '"'))
          e++;
        i = e < n ? e + dl + 2 : n;
      } else {
        i = j; /* a prefixed ordinary literal is lexed as one next */
      }
    } else if (c == '"' || c == '\'') { /* a literal ends at its quote or the line's end */
      for (i++; i < n && t[i] != c && t[i] != '\n'; i++)
        if (t[i] == '\\' && i + 1 < n && t[i + 1] != '\n') i++;
      if (i < n && t[i] == c) i++;
    } else {
      i++;
    }
  }
  free(t);
  return rc;
}

/* ---- mg_jit_compile ------------------------------------------------------------ */

static int check_args(const char *src, size_t len, const char *kernel, const mg_jit_opts *o,
                      mg_diag *d) {
  if (!src) return mg_diag_set(d, MLAGEN_EINVAL, "mg_jit_compile: no source");
  if (!o || !o->arch || !*o->arch)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_jit_compile: no target architecture (e.g. sm_90a)");
  if (strchr(o->arch, '\n') || (kernel && strchr(kernel, '\n')))
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_jit_compile: newline in the arch or kernel name");
  if (memchr(src, '\0', len))
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_jit_compile: source holds a NUL byte");
  if (o->n_options < 0 || (o->n_options > 0 && !o->options) || o->n_headers < 0 ||
      (o->n_headers > 0 && !o->headers))
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_jit_compile: bad option or header count");
  for (int i = 0; i < o->n_options; i++)
    if (!o->options[i])
      return mg_diag_set(d, MLAGEN_EINVAL, "mg_jit_compile: option %d is NULL", i);
  for (int i = 0; i < o->n_headers; i++) {
    const mg_jit_header *h = &o->headers[i];
    if (!h->name || (!h->data && h->size) || (h->data && memchr(h->data, '\0', h->size)))
      return mg_diag_set(d, MLAGEN_EINVAL,
                         "mg_jit_compile: header %d (%s) has no name, or a NUL byte", i,
                         h->name ? h->name : "?");
  }
  return 0;
}

int mg_jit_compile(const char *src, size_t len, const char *src_name, const char *kernel,
                   const mg_jit_opts *o, mg_cubin *out, mg_diag *d) {
  if (!out) return mg_diag_set(d, MLAGEN_EINVAL, "mg_jit_compile: no output");
  memset(out, 0, sizeof *out);
  int rc = check_args(src, len, kernel, o, d);
  if (rc) return rc;
  double t0 = now_ms();
  if (!src_name || !*src_name) src_name = "mlagen_kernel.cu";
  /* No host file reaches NVRTC: includes are checked in the source and the headers. */
  rc = check_includes(src, len, src_name, o, d);
  for (int i = 0; !rc && i < o->n_headers; i++)
    rc = check_includes(o->headers[i].data ? o->headers[i].data : "", o->headers[i].size,
                        o->headers[i].name, o, d);
  if (rc) return rc;

  char *incdir = NULL, *srcz = NULL, *archopt = NULL, *incopt = NULL, *path = NULL;
  const char **opts = NULL;
  char *file = NULL;
  size_t flen = 0;
  mg_buf warn, entry, dir;
  mg_buf_init(&warn, 0);
  mg_buf_init(&entry, 0);
  mg_buf_init(&dir, 0);
  char kname[256] = "";

  if ((rc = find_cuda_include(&incdir, d))) goto done;
  /* Options: arch, fixed, -I, user (the CUDA include dir is searched before any user -I).
   * The key takes all of them but the -I. */
  int nopts = 1 + N_FIXED + 1 + o->n_options, k = 0;
  size_t an = strlen(o->arch) + sizeof "--gpu-architecture=";
  size_t in = strlen(incdir) + sizeof "-I";
  opts = calloc((size_t)nopts, sizeof *opts);
  archopt = malloc(an);
  incopt = malloc(in);
  if (!opts || !archopt || !incopt || !(srcz = dup_mem(src, len))) goto nomem;
  snprintf(archopt, an, "--gpu-architecture=%s", o->arch);
  snprintf(incopt, in, "-I%s", incdir);
  opts[k++] = archopt;
  for (int i = 0; i < N_FIXED; i++) opts[k++] = fixed_opts[i];
  int inc_at = k;
  opts[k++] = incopt;
  for (int i = 0; i < o->n_options; i++) opts[k++] = o->options[i];
  if ((rc = make_key(src, len, src_name, kernel, opts, nopts, inc_at, incdir, o, out->key, d)))
    goto done;

  /* Lookup. Any trouble with the cache is a warning, never an error. */
  int use_cache = !o->no_cache;
  if (use_cache) {
    mg_diag cd = MG_DIAG_INIT;
    if (cache_dir_buf(o, &dir, &cd) || mg_fs_mkdirs(mg_buf_str(&dir), &cd)) {
      if (cd.status == MLAGEN_ENOMEM) {
        mg_diag_clear(&cd);
        goto nomem;
      }
      use_cache = 0;
      if (mg_buf_addf(&warn, "not cached: %s", mg_diag_msg(&cd))) rc = MLAGEN_ENOMEM;
    }
    mg_diag_clear(&cd);
    if (rc) goto nomem;
  }
  if (use_cache) {
    size_t pn = dir.len + 1 + MG_HASH_HEX + sizeof ".cubin";
    if (!(path = malloc(pn))) goto nomem;
    snprintf(path, pn, "%s/%s.cubin", mg_buf_str(&dir), out->key);
    struct stat st;
    if (stat(path, &st) == 0 || errno != ENOENT) {
      mg_diag rd = MG_DIAG_INIT;
      int r = mg_fs_read(path, ENTRY_MAX, &file, &flen, &rd);
      const char *why = NULL;
      int nomem = 0;
      if (r == MLAGEN_ENOMEM) nomem = 1;
      else if (r == MLAGEN_ELIMIT) why = "larger than 256 MiB";
      else if (r) {
        if (mg_buf_addf(&warn, "cache entry %s could not be read (%s); recompiled", path,
                        mg_diag_msg(&rd)))
          nomem = 1;
      } else if (!(why = entry_load(file, flen, out->key, out, &nomem))) {
        out->report.cache_hit = 1;
        mg_diag_clear(&rd);
        goto done;
      }
      mg_diag_clear(&rd);
      if (nomem) goto nomem;
      if (why && mg_buf_addf(&warn, "cache entry %s was corrupt (%s); recompiled", path, why))
        goto nomem;
      free(file);
      file = NULL;
    }
  }

  if ((rc = nvrtc_compile(srcz, src_name, kernel, opts, nopts, o, out, kname, sizeof kname,
                          &warn, d)))
    goto done;
  if (use_cache) {
    mg_diag wd = MG_DIAG_INIT;
    if ((rc = entry_build(out, kname, o->arch, &entry))) goto nomem;
    if (mg_fs_write_atomic(path, entry.data, entry.len, &wd) &&
        mg_buf_addf(&warn, "%snot cached: %s", warn.len ? "; " : "", mg_diag_msg(&wd))) {
      mg_diag_clear(&wd);
      goto nomem;
    }
    mg_diag_clear(&wd);
  }
  goto done;
nomem:
  rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
done:
  if (rc == 0 && warn.len && !(out->warning = mg_buf_take(&warn, NULL)))
    rc = mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  if (rc) {
    mg_cubin_free(out);
  } else {
    out->report.elapsed_ms = now_ms() - t0;
  }
  mg_buf_free(&warn);
  mg_buf_free(&entry);
  mg_buf_free(&dir);
  free(file);
  free(path);
  free(opts);
  free(archopt);
  free(incopt);
  free(srcz);
  free(incdir);
  return rc;
}
