/* mg_jit.h: NVRTC compilation of generated CUDA source to cubin, with a disk cache.
 *
 * Cache key: SHA-256 over a key-format version, the rendered source and its name (the
 * name lands in the -lineinfo), every NVRTC option in order (the target arch and the
 * fixed options included; the -I path of the CUDA headers is not, the toolkit's
 * version.json beside that include dir is, when present), the extra headers' names and
 * contents, the NVRTC version, the template hash and the kernel named for the report.
 * Entries live in o->cache_dir, else $MLAGEN_CACHE_DIR, else ~/.cache/mlagen, as
 * <key>.cubin files written atomically (temp file + rename); each carries a checksum
 * (format: see mg_jit.c), and a truncated or corrupt entry is detected, recompiled and
 * replaced, never loaded.
 *
 * NVRTC options: --gpu-architecture=<arch> -std=c++17 -lineinfo --ptxas-options=-v
 * -I<CUDA include dir>, then o->options. The CUDA include dir is the first of
 * $CUDA_HOME/include, $CUDA_PATH/include, the build's CUDA include dirs and
 * /usr/local/cuda/include that holds cuda_bf16.h. */
#ifndef MG_JIT_H
#define MG_JIT_H
#include <stddef.h>

#include "mg_buf.h"
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
  int wgmma_serialized; /* 0; else ptxas serialized the kernel's wgmma.mma_async (correct
                           but several times slower): the number of its first note
                           naming the kernel, 7510..7520 for C7510..C7520 (1 if the note
                           had no number) */
  double compile_ms;    /* wall time of the NVRTC compile that produced the cubin */
  double elapsed_ms;    /* wall time of this call (cache lookup included) */
  int cache_hit;        /* 1: loaded from the cache (the figures and compile_ms are the
                           cached compile's) */
} mg_jit_report;

typedef struct mg_cubin {
  void *data;                 /* the cubin (ELF), size bytes */
  size_t size;
  mg_jit_report report;
  char key[MG_HASH_HEX];      /* cache key */
  char *log;                  /* NVRTC log of the compile (ptxas lines), NULL on a hit */
  char *warning;              /* non-fatal problem (cache not writable ...), or NULL */
} mg_cubin;

/* Compiles src (len bytes, no NUL; src_name is the name NVRTC uses in messages) to a
 * cubin for o->arch, or loads it from the cache. kernel names the __global__ function
 * whose ptxas figures go into the report: its plain name, which also matches its C++
 * mangled name (_Z<len><name>...); NULL: the first one ptxas reports. A named kernel
 * ptxas does not report leaves the figures 0 and sets out->warning.
 * On success the caller owns *out (mg_cubin_free); on failure *out is empty.
 * The source and the headers may #include only the headers of o->headers and the CUDA
 * headers <cuda_bf16.h> and <cuda_fp16.h>: any other include (a host path, a computed
 * include, #include_next, #import, #embed) is refused before NVRTC runs, since NVRTC
 * would read the host file, print it in its log, and the cache key would not cover it.
 * Errors: MLAGEN_EINVAL (no arch, an arch NVRTC does not know or a virtual one such as
 * compute_90 that yields no cubin, an option NVRTC rejects, a NUL byte in the source or
 * a header, a newline in arch or kernel, a refused #include: "name: #include "x"
 * refused: ..."), MLAGEN_ECOMPILE (the message holds the NVRTC
 * log, whose lines name the template file and line through #line), MLAGEN_EIO (CUDA
 * headers not found: the message says where it looked and to set CUDA_HOME),
 * MLAGEN_ENOMEM. A cache that cannot be read or written is not an
 * error: the kernel is compiled and out->warning says why it was not cached. */
int mg_jit_compile(const char *src, size_t len, const char *src_name, const char *kernel,
                   const mg_jit_opts *o, mg_cubin *out, mg_diag *d);

void mg_cubin_free(mg_cubin *c);

/* The ptxas figures of kernel (the name mg_jit_compile takes) from log, a compile's NVRTC
 * log (mg_cubin.log: one compile's log holds every entry function of the source), into r:
 * registers, barriers, spills, stack, smem, cmem and wgmma_serialized (ptxas's note
 * "(C75xx) ... wgmma.mma_async instructions are serialized ... in the function '<name>'"
 * naming the kernel, a function that is no entry of the log, such as a non-inlined
 * device function, or no function); the timings and cache_hit are 0.
 * Returns 1, or 0 when the log has no such entry function (r then all 0). */
int mg_jit_report_parse(const char *log, const char *kernel, mg_jit_report *r);

/* The cache entry format (mg_jit.c), for the fuzzer and tests. mg_jit_entry_read checks
 * the n bytes of an entry file for key: NULL when it is an intact entry of that key
 * (out's data, size, report and key are filled: mg_cubin_free it), else why it is
 * unusable (nothing kept; *nomem set when the reason is a failed allocation). */
const char *mg_jit_entry_read(const void *data, size_t n, const char *key, mg_cubin *out,
                              int *nomem);
/* Serializes c (its key, report and cubin) as an entry, appended to b. kernel and arch
 * go into the metadata. Errors: MLAGEN_ENOMEM. */
int mg_jit_entry_write(const mg_cubin *c, const char *kernel, const char *arch, mg_buf *b);

/* The cache directory o would use (o may be NULL), written into buf (size n). Returns 0,
 * MLAGEN_EIO when neither MLAGEN_CACHE_DIR nor HOME is set, or MLAGEN_ELIMIT when the
 * path does not fit in n bytes. Creates nothing. */
int mg_jit_cache_dir(const mg_jit_opts *o, char *buf, size_t n, mg_diag *d);

/* NVRTC's version (0.0 if NVRTC cannot say); either pointer may be NULL. */
void mg_jit_nvrtc_version(int *major, int *minor);
#endif
