/* mg_jit.h: NVRTC compilation of generated CUDA source to cubin, with a disk cache.
 *
 * Cache key: SHA-256 over the rendered source, every NVRTC option, the extra headers,
 * the NVRTC version, the target arch and the template hash. Entries live in
 * $MLAGEN_CACHE_DIR (default ~/.cache/mlagen) as <key>.cubin files written atomically
 * (temp file + rename); each carries a checksum, and a truncated or corrupt entry is
 * detected, recompiled and replaced, never loaded. */
#ifndef MG_JIT_H
#define MG_JIT_H
#include <stddef.h>

#include "mg_diag.h"
#include "mg_hash.h"

/* A header made available to #include "name" in the source (the templates' device
 * header, for example). Its contents are part of the cache key. */
typedef struct mg_jit_header {
  const char *name;
  const char *data;
  size_t size;
} mg_jit_header;

typedef struct mg_jit_opts {
  const char *arch;              /* real target, e.g. "sm_80", "sm_90a" (required) */
  const char *cache_dir;         /* NULL: $MLAGEN_CACHE_DIR, else ~/.cache/mlagen */
  int no_cache;                  /* 1: neither read nor write the cache */
  const char *template_hash;     /* hex digest of the template set ("" if none) */
  const char *const *options;    /* extra NVRTC options, appended */
  int n_options;
  const mg_jit_header *headers;  /* extra headers */
  int n_headers;
} mg_jit_opts;

/* What ptxas reported for the kernel (from -Xptxas=-v), plus timings. */
typedef struct mg_jit_report {
  int registers;        /* per thread */
  int barriers;         /* named barriers used */
  long spill_stores;    /* bytes */
  long spill_loads;     /* bytes */
  long stack_bytes;     /* stack frame, bytes */
  long smem_bytes;      /* static shared memory, bytes */
  long cmem_bytes;      /* constant bank 0 (kernel parameters), bytes */
  double compile_ms;    /* wall time of the NVRTC compile that produced the cubin */
  double elapsed_ms;    /* wall time of this call (cache lookup included) */
  int cache_hit;        /* 1: loaded from the cache */
} mg_jit_report;

typedef struct mg_cubin {
  void *data;                 /* the cubin (ELF), size bytes */
  size_t size;
  mg_jit_report report;
  char key[MG_HASH_HEX];      /* cache key */
  char *log;                  /* NVRTC log of the compile (ptxas lines), NULL on a hit */
  char *warning;              /* non-fatal problem (cache not writable ...), or NULL */
} mg_cubin;

/* Compiles src (src_name is the name NVRTC uses in messages) to a cubin for o->arch,
 * or loads it from the cache. kernel names the __global__ function whose ptxas figures
 * go into the report (NULL: the first one reported).
 * Errors: MLAGEN_EINVAL (no arch, or an arch NVRTC does not know), MLAGEN_ECOMPILE (the
 * message holds the NVRTC log, whose lines name the template file and line through
 * #line), MLAGEN_EIO (CUDA headers not found: the message says where it looked and to
 * set CUDA_HOME), MLAGEN_ENOMEM. A cache that cannot be read or written is not an
 * error: the kernel is compiled and out->warning says why it was not cached. */
int mg_jit_compile(const char *src, size_t len, const char *src_name, const char *kernel,
                   const mg_jit_opts *o, mg_cubin *out, mg_diag *d);

void mg_cubin_free(mg_cubin *c);

/* The cache directory o would use, written into buf (size n). Returns 0, or
 * MLAGEN_EIO when neither MLAGEN_CACHE_DIR nor HOME is set. */
int mg_jit_cache_dir(const mg_jit_opts *o, char *buf, size_t n, mg_diag *d);

/* NVRTC's version. */
void mg_jit_nvrtc_version(int *major, int *minor);
#endif
