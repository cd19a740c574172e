/* Host executor harness: see harness.h. */
#include "harness.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

struct mg_host_kernel {
  void *so;
  void *fn;
  mg_host_launch_ex_fn launch;
  int asan;
  char path[1400];
};

/* ---- small helpers ---------------------------------------------------------------- */
static void say(char *msg, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *msg, size_t n, const char *fmt, ...) {
  if (!msg || !n) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, n, fmt, ap);
  va_end(ap);
}

static const char *env_or(const char *v, const char *env, const char *def) {
  if (v && *v) return v;
  const char *e = getenv(env);
  return e && *e ? e : def;
}

/* Two 64-bit FNV-1a streams with different bases: a 128-bit content key. */
typedef struct { uint64_t a, b; } hash128;
static void hash_bytes(hash128 *h, const void *p, size_t n) {
  const unsigned char *s = p;
  for (size_t i = 0; i < n; i++) {
    h->a = (h->a ^ s[i]) * 0x100000001b3ull;
    h->b = (h->b ^ s[i]) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
  }
  /* a separator, so that ("ab", "c") and ("a", "bc") differ */
  h->a = (h->a ^ (uint64_t)n) * 0x100000001b3ull;
  h->b = (h->b ^ (uint64_t)n) * 0x100000001b3ull;
}
static void hash_str(hash128 *h, const char *s) { hash_bytes(h, s ? s : "", s ? strlen(s) : 0); }
static hash128 hash_init(void) {
  hash128 h = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
  return h;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  size_t r;
  while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      char *b2 = realloc(buf, 2 * cap + 1);
      if (!b2) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = b2;
      cap *= 2;
    }
  }
  fclose(f);
  if (!buf) return NULL;
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

/* Writes data to path through a temporary file and rename(), so that a concurrent
 * reader never sees a part. */
static int write_file(const char *path, const void *data, size_t len) {
  char tmp[1200];
  snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return -1;
  int ok = fwrite(data, 1, len, f) == len;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* snprintf into a buffer of n bytes; 0 when it fit. */
#define FMT(buf, n, ...) (snprintf((buf), (n), __VA_ARGS__) >= (int)(n) ? -1 : 0)

static int is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Safe inside single quotes on a sh command line. */
static int quotable(const char *s) { return s && !strchr(s, '\''); }

static void rm_tree(const char *path) {
  char cmd[1200];
  if (!quotable(path) || strncmp(path, "/tmp/mg-host-", 13) != 0) return;
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  if (system(cmd) != 0) fprintf(stderr, "harness: could not remove %s\n", path);
}

/* ---- the cache root --------------------------------------------------------------- */
static char g_root[1024];
static int g_root_temp;

static void remove_root(void) {
  if (g_root_temp) rm_tree(g_root);
}

static int cache_root(char *msg, size_t n) {
  if (g_root[0]) return 0;
  const char *dir = getenv("MG_HOST_CACHE_DIR");
  if (dir && *dir) {
    if (strlen(dir) > 900 || !quotable(dir)) {
      say(msg, n, "MG_HOST_CACHE_DIR is too long or has a quote: %s", dir);
      return -1;
    }
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0) {
      say(msg, n, "cannot create MG_HOST_CACHE_DIR %s", dir);
      return -1;
    }
    snprintf(g_root, sizeof g_root, "%s", dir);
    return 0;
  }
  char tmpl[] = "/tmp/mg-host-XXXXXX";
  if (!mkdtemp(tmpl)) {
    say(msg, n, "mkdtemp: %s", strerror(errno));
    return -1;
  }
  snprintf(g_root, sizeof g_root, "%s", tmpl);
  g_root_temp = 1;
  atexit(remove_root);
  return 0;
}

const char *mg_host_cache_dir(void) { return cache_root(NULL, 0) ? NULL : g_root; }

/* ---- building -------------------------------------------------------------------- */
static int on_path(const char *prog) {
  const char *path = getenv("PATH");
  char buf[1024];
  while (path && *path) {
    size_t k = strcspn(path, ":");
    if (k && k < 900) {
      snprintf(buf, sizeof buf, "%.*s/%s", (int)k, path, prog);
      if (access(buf, X_OK) == 0) return 1;
    }
    path += k + (path[k] == ':');
  }
  return 0;
}

static int want_asan(const mg_host_build_opts *o) {
  const char *e = getenv("MG_HOST_ASAN");
  return (o && o->asan) || (e && !strcmp(e, "1"));
}

static const char *compiler_of(const mg_host_build_opts *o, int asan) {
  const char *cxx = env_or(o ? o->cxx : NULL, "MG_HOST_CXX", "g++");
  if (!asan) return cxx;
  const char *a = env_or(o ? o->asan_cxx : NULL, "MG_HOST_ASAN_CXX", NULL);
  if (a) return a;
  return on_path("clang++") ? "clang++" : cxx;
}

/* " -mfma -ffp-contract=off" on an x86-64 CPU with FMA: fmaf (the mma emulation's inner
 * loop, __fmaf_rn, __hfma) becomes one instruction instead of a call into libm, which
 * computes the same correctly rounded result; contraction stays off, as it is without
 * -mfma, so every other expression rounds as before. MG_HOST_FMA=0: never. */
static const char *fma_flags(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const char *e = getenv("MG_HOST_FMA");
  if (!(e && !strcmp(e, "0")) && __builtin_cpu_supports("fma")) return " -mfma -ffp-contract=off";
#endif
  return "";
}

static int is_clang(const char *cxx) {
  const char *base = strrchr(cxx, '/');
  return strstr(base ? base + 1 : cxx, "clang") != NULL;
}

const char *mg_host_asan_cxx(const mg_host_build_opts *o) { return compiler_of(o, 1); }

int mg_host_asan_cxx_is_clang(const mg_host_build_opts *o) { return is_clang(compiler_of(o, 1)); }

/* Runs cmd with its output in log; on failure puts the log's tail in msg. */
static int run_logged(const char *cmd, const char *log, const char *what, char *msg, size_t n) {
  char full[8192];
  snprintf(full, sizeof full, "%s > '%s' 2>&1", cmd, log);
  if (system(full) == 0) return 0;
  size_t len = 0;
  char *out = read_file(log, &len);
  const char *tail = out ? out : "";
  if (len > 1500) tail = out + len - 1500;
  say(msg, n, "%s failed: %s\n%s", what, cmd, tail);
  free(out);
  return -1;
}

int mg_host_asan_runtime(const mg_host_build_opts *o, char *path, size_t n) {
  const char *cxx = compiler_of(o, 1);
  const char *libs[] = {"libclang_rt.asan-x86_64.so", "libasan.so"};
  if (!quotable(cxx)) return -1;
  for (int i = is_clang(cxx) ? 0 : 1; i < 2; i++) {
    char cmd[1200], line[1024] = "";
    snprintf(cmd, sizeof cmd, "'%s' -print-file-name=%s 2>/dev/null", cxx, libs[i]);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    if (!fgets(line, sizeof line, p)) line[0] = '\0';
    pclose(p);
    line[strcspn(line, "\n")] = '\0';
    if (line[0] == '/' && is_file(line) && strlen(line) < n) {
      snprintf(path, n, "%s", line);
      return 0;
    }
  }
  return -1;
}

int mg_host_process_has_asan(void) {
  void *self = dlopen(NULL, RTLD_NOW);
  int has = self && dlsym(self, "__asan_init") != NULL;
  if (self) dlclose(self);
  return has;
}

/* cuda_host.h precompiled (the header every kernel build force-includes: it pulls in the
 * CUDA headers, most of a small kernel's compile time) with the kernels' own compiler and
 * flags, once per executor key, into <root>/h-<key>/ beside a copy of the header, which
 * never changes once written (clang checks it). dir gets that directory, or stays empty
 * (plain -include) under MG_HOST_PCH=0 or when the compiler cannot precompile it (its
 * log, cuda_host.h.{gch,pch}.failed, then stops later builds from trying again; a header
 * that does not compile fails the kernel build). -1 with msg: the cache is unwritable. */
static int precompiled_header(const char *cxx, const char *flags, const char *host_dir,
                              hash128 key, char *dir, size_t dir_len, char *msg, size_t n) {
  dir[0] = '\0';
  const char *e = getenv("MG_HOST_PCH");
  if (e && !strcmp(e, "0")) return 0;
  char d[1200], hdr[1300], pch[1300], tmp[1400], log[1400], cmd[6144];
  snprintf(d, sizeof d, "%s/h-%016llx%016llx", g_root, (unsigned long long)key.a,
           (unsigned long long)key.b);
  snprintf(hdr, sizeof hdr, "%s/cuda_host.h", d);
  snprintf(pch, sizeof pch, "%s/cuda_host.h.%s", d, is_clang(cxx) ? "pch" : "gch");
  snprintf(log, sizeof log, "%s.failed", pch);
  if (is_file(log)) return 0;
  if (!is_file(pch)) {
    if (mkdir(d, 0755) != 0 && errno != EEXIST) {
      say(msg, n, "mkdir %s: %s", d, strerror(errno));
      return -1;
    }
    if (!is_file(hdr)) { /* link() never replaces: a concurrent writer's copy stays */
      size_t hl = 0;
      char src[1300];
      snprintf(src, sizeof src, "%s/cuda_host.h", host_dir);
      char *text = read_file(src, &hl);
      snprintf(tmp, sizeof tmp, "%s.%ld", hdr, (long)getpid());
      int bad = !text || write_file(tmp, text, hl) || (link(tmp, hdr) != 0 && errno != EEXIST);
      free(text);
      unlink(tmp);
      if (bad) {
        say(msg, n, "cannot copy %s into %s", src, d);
        return -1;
      }
    }
    char tmp_log[1500];
    snprintf(tmp, sizeof tmp, "%s.%ld", pch, (long)getpid());
    snprintf(tmp_log, sizeof tmp_log, "%s.%ld", log, (long)getpid());
    snprintf(cmd, sizeof cmd, "'%s' %s%s -x c++-header '%s' -o '%s' > '%s' 2>&1", cxx, flags,
             is_clang(cxx) ? " -fpch-validate-input-files-content" : "", hdr, tmp, tmp_log);
    if (system(cmd) != 0) {
      rename(tmp_log, log);
      return 0;
    }
    unlink(tmp_log);
    if (rename(tmp, pch) != 0) {
      say(msg, n, "rename %s: %s", tmp, strerror(errno));
      return -1;
    }
  }
  snprintf(dir, dir_len, "%s", d);
  return 0;
}

int mg_host_kernel_build(const char *source, size_t len, const char *file_name,
                         const char *kernel_name, const mg_host_build_opts *o,
                         mg_host_kernel **out, char *msg, size_t n) {
  *out = NULL;
  say(msg, n, "%s", "");
  const int asan = want_asan(o);
  const char *host_dir = env_or(o ? o->host_dir : NULL, "MG_HOST_DIR", NULL);
  const char *cxx = compiler_of(o, asan);
  const char *cuda = env_or(o ? o->cuda_include : NULL, "MG_HOST_CUDA_INCLUDE",
                            "/usr/local/cuda/include");
  if (!host_dir) {
    say(msg, n, "no host_dir (tests/host) given and MG_HOST_DIR not set");
    return -1;
  }
  if (!file_name || !*file_name || strchr(file_name, '/') || !quotable(file_name) ||
      !quotable(host_dir) || !quotable(cxx) || !quotable(cuda)) {
    say(msg, n, "bad file name, or a path with a quote");
    return -1;
  }
  if (asan && !mg_host_process_has_asan()) {
    char rt[1024] = "(unknown: the compiler has no ASan runtime)";
    mg_host_asan_runtime(o, rt, sizeof rt);
    say(msg, n,
        "an ASan build of %s needs the ASan runtime in this process: run it with "
        "LD_PRELOAD=%s ASAN_OPTIONS=detect_leaks=0",
        file_name, rt);
    return -1;
  }
  if (cache_root(msg, n)) return -1;

  /* The executor's files take part in every key. */
  char path[2048];
  size_t hl = 0, cl = 0, ll = 0;
  snprintf(path, sizeof path, "%s/cuda_host.h", host_dir);
  char *h_src = read_file(path, &hl);
  snprintf(path, sizeof path, "%s/cuda_host.cpp", host_dir);
  char *c_src = read_file(path, &cl);
  snprintf(path, sizeof path, "%s/host_launch.h", host_dir);
  char *l_src = read_file(path, &ll);
  /* and the Hopper emulation that cuda_host.h and cuda_host.cpp include, and the
   * generator's per-arch table cuda_host.cpp includes (generator/gen/mg_arch.h) */
  static const char *const more[] = {"hopper_host.h", "hopper_host.cpp", "mg_host_tmap.h",
                                     "../../generator/gen/mg_arch.h"};
  char *m_src[4] = {NULL, NULL, NULL, NULL};
  size_t ml[4] = {0, 0, 0, 0};
  int m_ok = 1;
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", host_dir, more[i]);
    m_ok &= (m_src[i] = read_file(path, &ml[i])) != NULL;
  }
  if (!h_src || !c_src || !l_src || !m_ok) {
    say(msg, n, "cannot read cuda_host.h, cuda_host.cpp, host_launch.h, hopper_host.h, "
        "hopper_host.cpp, mg_host_tmap.h in %s or ../../generator/gen/mg_arch.h from it",
        host_dir);
    free(h_src), free(c_src), free(l_src);
    for (int i = 0; i < 4; i++) free(m_src[i]);
    return -1;
  }

  /* ASan builds at -O0: a kernel compiles about 3.5x faster than at -O1 (clang++: 0.9 s
   * against 3.4 s for attn_bwd_dkdv) and the ASan cases run small shapes, so compiling is
   * most of their time; -ffp-contract=off keeps the rounding of every expression the same */
  int opt = o && o->opt_level > 0 ? o->opt_level : (asan ? 0 : 2);
  char flags[2048];
  snprintf(flags, sizeof flags,
           "-std=c++17 -O%d -fno-strict-aliasing -fPIC -w -I'%s' -I'%s'%s%s%s%s%s%s", opt, cuda, host_dir,
           fma_flags(), (asan || (o && o->debug)) ? " -g" : "",
           asan ? " -fsanitize=address -fno-omit-frame-pointer" : "",
           is_clang(cxx) ? " -femulated-tls" : "", o && o->extra_flags ? " " : "",
           o && o->extra_flags ? o->extra_flags : "");

  hash128 rk = hash_init();
  hash_str(&rk, cxx);
  hash_str(&rk, flags);
  hash_bytes(&rk, h_src, hl);
  hash_bytes(&rk, c_src, cl);
  hash_bytes(&rk, l_src, ll);
  for (int i = 0; i < 4; i++) hash_bytes(&rk, m_src[i], ml[i]), free(m_src[i]);
  free(h_src), free(c_src), free(l_src);
  char rt_obj[1200], cmd[6144];
  snprintf(rt_obj, sizeof rt_obj, "%s/rt-%016llx%016llx.o", g_root, (unsigned long long)rk.a,
           (unsigned long long)rk.b);
  if (!is_file(rt_obj)) {
    char tmp[1300], log[1300];
    snprintf(tmp, sizeof tmp, "%s.%ld.o", rt_obj, (long)getpid());
    snprintf(log, sizeof log, "%s.log", rt_obj);
    snprintf(cmd, sizeof cmd, "'%s' %s -include cuda_host.h -c -x c++ '%s/cuda_host.cpp' -o '%s'",
             cxx, flags, host_dir, tmp);
    if (run_logged(cmd, log, "building the executor", msg, n)) return -1;
    if (rename(tmp, rt_obj) != 0) {
      say(msg, n, "rename %s: %s", tmp, strerror(errno));
      return -1;
    }
  }

  char pch_dir[1200], include[1400] = "cuda_host.h";
  if (precompiled_header(cxx, flags, host_dir, rk, pch_dir, sizeof pch_dir, msg, n)) return -1;
  if (pch_dir[0])
    snprintf(include, sizeof include, "'%s/cuda_host.h'%s", pch_dir,
             is_clang(cxx) ? " -fpch-validate-input-files-content" : "");

  hash128 kk = rk;
  hash_bytes(&kk, source, len);
  hash_str(&kk, file_name);
  for (int i = 0; o && i < o->n_headers; i++) {
    hash_str(&kk, o->headers[i].name);
    hash_bytes(&kk, o->headers[i].data, o->headers[i].size);
  }
  char dir[1200], so[1300];
  snprintf(dir, sizeof dir, "%s/k-%016llx%016llx", g_root, (unsigned long long)kk.a,
           (unsigned long long)kk.b);
  snprintf(so, sizeof so, "%s/k.so", dir);
  if (!is_file(so)) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
      say(msg, n, "mkdir %s: %s", dir, strerror(errno));
      return -1;
    }
    int bad = FMT(path, sizeof path, "%s/%s", dir, file_name) || write_file(path, source, len);
    for (int i = 0; !bad && o && i < o->n_headers; i++) {
      const mg_host_file *f = &o->headers[i];
      if (!f->name || strchr(f->name, '/') || !quotable(f->name)) {
        say(msg, n, "bad header name %s", f->name ? f->name : "(null)");
        return -1;
      }
      bad = FMT(path, sizeof path, "%s/%s", dir, f->name) || write_file(path, f->data, f->size);
    }
    if (bad) {
      say(msg, n, "cannot write the kernel source into %s", dir);
      return -1;
    }
    char tmp[1400], log[1400];
    snprintf(tmp, sizeof tmp, "%s/k.%ld.so", dir, (long)getpid());
    snprintf(log, sizeof log, "%s/build.log", dir);
    /* A build that fails with the precompiled header is repeated without it, so that
     * one the compiler refuses (another version of it) only costs time. */
    for (int plain = !pch_dir[0];; plain = 1) {
      if (FMT(cmd, sizeof cmd,
              "'%s' %s -I'%s' -include %s -shared -x c++ '%s/%s' -x none '%s' -o '%s'", cxx,
              flags, dir, plain ? "cuda_host.h" : include, dir, file_name, rt_obj, tmp)) {
        say(msg, n, "command line too long");
        return -1;
      }
      if (!run_logged(cmd, log, "building the kernel", msg, n)) break;
      if (plain) return -1;
    }
    if (rename(tmp, so) != 0) {
      say(msg, n, "rename %s: %s", tmp, strerror(errno));
      return -1;
    }
  }

  mg_host_kernel *k = calloc(1, sizeof *k);
  if (!k) {
    say(msg, n, "out of memory");
    return -1;
  }
  k->asan = asan;
  snprintf(k->path, sizeof k->path, "%s", so);
  k->so = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!k->so) {
    say(msg, n, "dlopen %s: %s", so, dlerror());
    free(k);
    return -1;
  }
  k->fn = dlsym(k->so, kernel_name);
  *(void **)&k->launch = dlsym(k->so, "mg_host_launch_ex");
  if (!k->fn || !k->launch) {
    say(msg, n, "%s has no %s or mg_host_launch_ex", so, k->fn ? "" : kernel_name);
    mg_host_kernel_free(k);
    return -1;
  }
  *out = k;
  return 0;
}

void *mg_host_kernel_fn(const mg_host_kernel *k) { return k->fn; }

void *mg_host_kernel_sym(const mg_host_kernel *k, const char *name) {
  return dlsym(k->so, name);
}

int mg_host_kernel_asan(const mg_host_kernel *k) { return k->asan; }

const char *mg_host_kernel_path(const mg_host_kernel *k) { return k->path; }

int mg_host_kernel_launch(const mg_host_kernel *k, mg_host_dim3 grid, mg_host_dim3 block,
                          size_t dyn_smem, const mg_host_launch_opts *lo, void (*thunk)(void *),
                          void *ctx, char *msg, size_t msg_len) {
  return k->launch(grid, block, dyn_smem, lo, thunk, ctx, msg, msg_len);
}

void mg_host_kernel_free(mg_host_kernel *k) {
  if (!k) return;
  if (k->so) dlclose(k->so);
  free(k);
}
