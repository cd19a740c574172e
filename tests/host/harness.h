/* Host executor harness: build a generated kernel's .cu text into a shared object once
 * per test run and launch it (C11 and C++; no CUDA headers).
 *
 *   mg_host_build_opts bo = {0};
 *   bo.host_dir = ".../tests/host";          // cuda_host.h, cuda_host.cpp
 *   mg_host_kernel *k;
 *   char msg[2048];
 *   if (mg_host_kernel_build(src, len, "k.cu", "my_kernel", &bo, &k, msg, sizeof msg)) ...
 *   my_kernel_fn fn = (my_kernel_fn)mg_host_kernel_fn(k);
 *   mg_host_launch_opts lo = {0};             // seed, round robin, NaN fill
 *   rc = mg_host_kernel_launch(k, grid, block, dyn_smem, &lo, thunk, &args, msg, sizeof msg);
 *   mg_host_kernel_free(k);
 *
 * The source is written, with the headers it includes, to a directory named by a hash of
 * everything that goes into the build (source, headers, compiler and flags, the executor's
 * own files); an object already built there is loaded without compiling again. The
 * directory lives under a temporary directory made on first use and removed at exit,
 * or under $MG_HOST_CACHE_DIR (kept) when that is set. The executor itself
 * (cuda_host.cpp) is compiled, and cuda_host.h precompiled (MG_HOST_PCH=0: not), once
 * per compiler and flags. */
#ifndef MG_HOST_HARNESS_H
#define MG_HOST_HARNESS_H

#include <stddef.h>

#include "host_launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A file written next to the kernel source (the templates' device header, ...). */
typedef struct mg_host_file {
  const char *name;
  const char *data;
  size_t size;
} mg_host_file;

typedef struct mg_host_build_opts {
  const char *host_dir;     /* holds cuda_host.h and cuda_host.cpp; NULL: $MG_HOST_DIR */
  const char *cxx;          /* NULL: $MG_HOST_CXX, else "g++" */
  const char *cuda_include; /* NULL: $MG_HOST_CUDA_INCLUDE, else /usr/local/cuda/include */
  const mg_host_file *headers;
  int n_headers;
  /* 1: an ASan build (also when $MG_HOST_ASAN=1): -fsanitize=address -g -O0, compiled by
   * asan_cxx (NULL: $MG_HOST_ASAN_CXX, else clang++ when on PATH, else cxx); with clang,
   * -femulated-tls, so static __shared__ arrays have ASan bounds too. The process must
   * already have the matching ASan runtime (LD_PRELOAD=mg_host_asan_runtime()): loading
   * the object fails with a message saying so otherwise. */
  int asan;
  const char *asan_cxx;
  int opt_level;           /* 0: default (2, or 0 under ASan); else 1..3 */
  int debug;               /* 1: -g (ASan builds always have it) */
  const char *extra_flags; /* appended to the compiler's command line, or NULL */
} mg_host_build_opts;

typedef struct mg_host_kernel mg_host_kernel;

/* Builds (or finds already built) source (len bytes) as file_name in a directory of its
 * own with the headers, loads it and finds kernel_name. Returns 0, or -1 with the reason
 * (the compiler's output for a failed build) in msg. */
int mg_host_kernel_build(const char *source, size_t len, const char *file_name,
                         const char *kernel_name, const mg_host_build_opts *o,
                         mg_host_kernel **out, char *msg, size_t msg_len);

/* The kernel function (cast it to the kernel's signature), or any other symbol of the
 * object by name (NULL when absent). */
void *mg_host_kernel_fn(const mg_host_kernel *k);
void *mg_host_kernel_sym(const mg_host_kernel *k, const char *name);

/* Whether it was built with ASan, and the shared object's path. */
int mg_host_kernel_asan(const mg_host_kernel *k);
const char *mg_host_kernel_path(const mg_host_kernel *k);

/* mg_host_launch_ex of the kernel's object: thunk(ctx) is every thread's body and calls
 * the kernel function with the arguments in ctx. lo may be NULL. */
int mg_host_kernel_launch(const mg_host_kernel *k, mg_host_dim3 grid, mg_host_dim3 block,
                          size_t dyn_smem, const mg_host_launch_opts *lo, void (*thunk)(void *),
                          void *ctx, char *msg, size_t msg_len);

/* Unloads the kernel (the built object stays in the cache directory). */
void mg_host_kernel_free(mg_host_kernel *k);

/* The ASan runtime an ASan build of o needs preloaded (LD_PRELOAD) into the process that
 * loads it: 0 and its path in path, or -1 when the compiler has none. */
int mg_host_asan_runtime(const mg_host_build_opts *o, char *path, size_t n);

/* The directory builds go into (made on first use), or NULL when it cannot be made. */
const char *mg_host_cache_dir(void);

/* 1 when this process has an ASan runtime loaded. */
int mg_host_process_has_asan(void);

/* The compiler ASan builds use (o->asan_cxx, else $MG_HOST_ASAN_CXX, else clang++ when on
 * PATH, else the normal compiler), and whether it is clang (only then do static
 * __shared__ arrays get ASan bounds, through -femulated-tls). */
const char *mg_host_asan_cxx(const mg_host_build_opts *o);
int mg_host_asan_cxx_is_clang(const mg_host_build_opts *o);

#ifdef __cplusplus
}
#endif

#endif /* MG_HOST_HARNESS_H */
