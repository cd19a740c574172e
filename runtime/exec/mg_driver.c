/* mg_driver.c: dlopen libcuda.so.1 once, resolve the entry points through
 * cuGetProcAddress, cuInit. See mg_driver.h. */
#include "mg_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlagen.h"

#define DEFAULT_LIBCUDA "libcuda.so.1"

/* The one load attempt and its outcome. Written once under pthread_once, read-only after. */
static struct {
  pthread_once_t once;
  int status;
  char msg[512];
  mg_driver drv;
} g = {PTHREAD_ONCE_INIT, 0, "", {0}};

static const struct entry {
  const char *name;
  int version;
  size_t off;
} entries[] = {
#define MG_DRIVER__ENTRY(name, version) {#name, version, offsetof(mg_driver, name)},
  MG_DRIVER_ENTRIES(MG_DRIVER__ENTRY)
#undef MG_DRIVER__ENTRY
};
_Static_assert(sizeof(void *) == sizeof(PFN_cuInit_v2000),
               "entry points are stored through void * (cuGetProcAddress's contract)");
_Static_assert(sizeof entries / sizeof entries[0] == MG_DRIVER_N_ENTRIES,
               "MG_DRIVER_N_ENTRIES must count MG_DRIVER_ENTRIES");

__attribute__((format(printf, 2, 3)))
static void fail(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g.msg, sizeof g.msg, fmt, ap);
  va_end(ap);
  g.status = status;
}

/* "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)", or the number when the
 * driver cannot name it. */
static void result_words(const mg_driver *drv, CUresult r, char *buf, size_t n) {
  const char *name = NULL, *text = NULL;
  if (drv && drv->cuGetErrorName && drv->cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
  if (drv && drv->cuGetErrorString && drv->cuGetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
  if (name && text) snprintf(buf, n, "%s (%s)", name, text);
  else if (name) snprintf(buf, n, "%s", name);
  else snprintf(buf, n, "CUresult %d", (int)r);
}

/* cuGetProcAddress in either of its ABIs. */
typedef struct getproc {
  PFN_cuGetProcAddress_v12000 v2; /* "cuGetProcAddress_v2": CUDA >= 12.0 */
  PFN_cuGetProcAddress_v11030 v1; /* "cuGetProcAddress": CUDA 11.3 .. 11.8 */
} getproc;

static CUresult resolve(const getproc *gp, const char *name, int version, void **fn) {
  *fn = NULL;
  if (gp->v2) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = gp->v2(name, fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r == CUDA_SUCCESS && found != CU_GET_PROC_ADDRESS_SUCCESS) r = CUDA_ERROR_NOT_FOUND;
    return r;
  }
  return gp->v1(name, fn, version, CU_GET_PROC_ADDRESS_DEFAULT);
}

static void load(void) {
  mg_driver *drv = &g.drv;
  const char *env = getenv("MLAGEN_LIBCUDA");
  const char *path = env && *env ? env : DEFAULT_LIBCUDA;
  snprintf(drv->path, sizeof drv->path, "%s", path);
  const char *via = env && *env ? " (from MLAGEN_LIBCUDA)" : "";

  dlerror();
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    fail(MLAGEN_ENODRIVER, "no CUDA driver: %s%s not found or not loadable (dlopen: %s)", path,
         via, why ? why : "unknown error");
    return;
  }
  getproc gp = {NULL, NULL};
  /* dlsym returns data pointers; a union converts without a cast between object and
   * function pointer types. */
  union { void *p; PFN_cuGetProcAddress_v12000 v2; PFN_cuGetProcAddress_v11030 v1; } u;
  if ((u.p = dlsym(h, "cuGetProcAddress_v2"))) gp.v2 = u.v2;
  else if ((u.p = dlsym(h, "cuGetProcAddress"))) gp.v1 = u.v1;
  if (!gp.v2 && !gp.v1) {
    fail(MLAGEN_ENODRIVER,
         "no CUDA driver: %s%s has no cuGetProcAddress (a driver older than CUDA 11.3)", path,
         via);
    dlclose(h);
    return;
  }
  for (size_t i = 0; i < MG_DRIVER_N_ENTRIES; i++) {
    void *fn = NULL;
    CUresult r = resolve(&gp, entries[i].name, entries[i].version, &fn);
    if (r != CUDA_SUCCESS || !fn) {
      fail(MLAGEN_ENODRIVER,
           "no CUDA driver: %s%s: cuGetProcAddress(\"%s\", version %d) failed (CUresult %d)",
           path, via, entries[i].name, entries[i].version, (int)r);
      memset(drv, 0, offsetof(mg_driver, driver_version));
      dlclose(h);
      return;
    }
    memcpy((char *)drv + entries[i].off, &fn, sizeof fn);
  }
  { /* optional: left NULL when absent */
    void *fn = NULL;
    if (resolve(&gp, "cuTensorMapEncodeTiled", 12000, &fn) == CUDA_SUCCESS && fn)
      memcpy(&drv->cuTensorMapEncodeTiled, &fn, sizeof fn);
  }
  char words[256];
  CUresult r = drv->cuInit(0);
  if (r != CUDA_SUCCESS) {
    result_words(drv, r, words, sizeof words);
    fail(MLAGEN_ENODRIVER, "no CUDA driver: cuInit failed: %s (library %s%s)", words, path, via);
  } else if ((r = drv->cuDriverGetVersion(&drv->driver_version)) != CUDA_SUCCESS) {
    result_words(drv, r, words, sizeof words);
    fail(MLAGEN_ENODRIVER, "no CUDA driver: cuDriverGetVersion failed: %s (library %s%s)", words,
         path, via);
  }
  if (g.status) {
    memset(drv, 0, offsetof(mg_driver, driver_version));
    dlclose(h);
  }
  /* On success the handle stays open: the table points into the library. */
}

int mg_driver_get(const mg_driver **out, mg_diag *d) {
  if (!out) return mg_diag_set(d, MLAGEN_EINVAL, "mg_driver_get: out is NULL");
  *out = NULL;
  if (pthread_once(&g.once, load) != 0)
    return mg_diag_set(d, MLAGEN_ENODRIVER, "no CUDA driver: pthread_once failed");
  if (g.status) return mg_diag_set(d, g.status, "%s", g.msg);
  *out = &g.drv;
  return 0;
}

int mg_driver_check(const mg_driver *drv, CUresult r, int status, const char *what, mg_diag *d) {
  if (r == CUDA_SUCCESS) return 0;
  char words[256];
  result_words(drv, r, words, sizeof words);
  return mg_diag_set(d, status, "%s: %s", what ? what : "CUDA driver call", words);
}

const char *mg_driver_entry(const mg_driver *drv, int i, void **fn) {
  if (i < 0 || i >= MG_DRIVER_N_ENTRIES) return NULL;
  if (fn && !drv) *fn = NULL;
  if (fn && drv) memcpy(fn, (const char *)drv + entries[i].off, sizeof *fn);
  return entries[i].name;
}
