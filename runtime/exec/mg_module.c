/* mg_module.c: the module registry. See mg_module.h. */
#include "mg_module.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAME 255

typedef struct entry {
  mg_module_kernel k;
  char name[MAX_NAME + 1];
} entry;

struct mg_module_registry {
  const mg_driver *drv;
  entry **items; /* each entry allocated on its own: kernel pointers stay valid */
  int n, cap;
};

/* ---- the registry ----------------------------------------------------------------------- */

int mg_registry_create(mg_module_registry **out, mg_diag *d) {
  if (!out) return mg_diag_set(d, MLAGEN_EINVAL, "mg_registry_create: out is NULL");
  *out = NULL;
  const mg_driver *drv = NULL;
  int rc = mg_driver_get(&drv, d);
  if (rc) return rc;
  mg_module_registry *r = calloc(1, sizeof *r);
  if (!r) return mg_diag_set(d, MLAGEN_ENOMEM, "module registry: out of memory");
  r->drv = drv;
  *out = r;
  return 0;
}

int mg_registry_destroy(mg_module_registry *r, mg_diag *d) {
  if (!r) return 0;
  int rc = 0;
  for (int i = 0; i < r->n; i++) {
    entry *e = r->items[i];
    CUresult cr = r->drv->cuModuleUnload(e->k.module);
    if (cr != CUDA_SUCCESS && !rc) {
      char what[MAX_NAME + 64];
      snprintf(what, sizeof what, "cuModuleUnload (kernel %s)", e->name);
      rc = mg_driver_fail(r->drv, cr, what, d);
    }
    free(e);
  }
  free(r->items);
  free(r);
  return rc;
}

static entry *lookup(const mg_module_registry *r, const char *name) {
  for (int i = 0; i < r->n; i++)
    if (strcmp(r->items[i]->name, name) == 0) return r->items[i];
  return NULL;
}

int mg_registry_find(const mg_module_registry *r, const char *name, const mg_module_kernel **out,
                     mg_diag *d) {
  if (out) *out = NULL;
  if (!r || !name || !out)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_registry_find: registry, name or out is NULL");
  const entry *e = lookup(r, name);
  if (!e)
    return mg_diag_set(d, MLAGEN_EINVAL, "no kernel '%s' in the module registry (%d loaded)", name,
                       r->n);
  *out = &e->k;
  return 0;
}

int mg_registry_count(const mg_module_registry *r) { return r ? r->n : 0; }

int mg_registry_load(mg_module_registry *r, const char *name, const void *image, size_t size,
                     const mg_launch_rule *rule, const mg_module_kernel **out, mg_diag *d) {
  if (out) *out = NULL;
  if (!r || !name || !image || !rule || !out)
    return mg_diag_set(d, MLAGEN_EINVAL,
                       "mg_registry_load: registry, name, image, rule or out is NULL");
  const size_t len = strlen(name);
  if (len == 0 || len > MAX_NAME)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_registry_load: kernel name of %zu bytes (1 .. %d)",
                       len, MAX_NAME);
  entry *e = lookup(r, name);
  if (e) {
    *out = &e->k;
    return 0;
  }
  if (size == 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_registry_load: kernel %s: the cubin is empty", name);
  if (r->n == r->cap) {
    const int cap = r->cap ? 2 * r->cap : 16;
    entry **items = realloc(r->items, (size_t)cap * sizeof *items);
    if (!items) return mg_diag_set(d, MLAGEN_ENOMEM, "module registry: out of memory");
    r->items = items, r->cap = cap;
  }
  if (!(e = calloc(1, sizeof *e))) return mg_diag_set(d, MLAGEN_ENOMEM, "module registry: out of memory");
  memcpy(e->name, name, len + 1);
  e->k.name = e->name;
  e->k.rule = *rule;
  const mg_driver *drv = r->drv;
  char what[MAX_NAME + 128];
  CUresult cr = drv->cuModuleLoadData(&e->k.module, image);
  if (cr != CUDA_SUCCESS) {
    snprintf(what, sizeof what, "cuModuleLoadData (kernel %s, cubin of %zu bytes)", name, size);
    int rc = mg_driver_fail(drv, cr, what, d);
    free(e);
    return rc;
  }
  int rc = 0;
  cr = drv->cuModuleGetFunction(&e->k.function, e->k.module, name);
  if (cr == CUDA_ERROR_NOT_FOUND) {
    snprintf(what, sizeof what, "kernel '%s' not found in its cubin (cuModuleGetFunction)", name);
    rc = mg_driver_check(drv, cr, MLAGEN_EINVAL, what, d);
  } else if (cr != CUDA_SUCCESS) {
    snprintf(what, sizeof what, "cuModuleGetFunction (kernel %s)", name);
    rc = mg_driver_fail(drv, cr, what, d);
  } else if (rule->smem > MG_DEFAULT_DYN_SMEM) {
    cr = drv->cuFuncSetAttribute(e->k.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 (int)rule->smem);
    if (cr != CUDA_SUCCESS) {
      snprintf(what, sizeof what,
               "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = %zu) (kernel %s)", rule->smem,
               name);
      rc = mg_driver_fail(drv, cr, what, d);
    } else {
      e->k.smem_raised = 1;
    }
  }
  if (rc) {
    drv->cuModuleUnload(e->k.module); /* the error reported is the first one */
    free(e);
    return rc;
  }
  r->items[r->n++] = e;
  *out = &e->k;
  return 0;
}

int mg_registry_load_kernel(mg_module_registry *r, const mg_kernel_info *k, const void *image,
                            size_t size, const mg_module_kernel **out, mg_diag *d) {
  if (out) *out = NULL;
  if (!k) return mg_diag_set(d, MLAGEN_EINVAL, "mg_registry_load_kernel: the kernel is NULL");
  return mg_registry_load(r, k->name, image, size, &k->launch, out, d);
}

int mg_registry_launch(mg_module_registry *r, const mg_module_kernel *k, const mg_launch_dims *dims,
                       CUstream stream, void **args, mg_diag *d) {
  if (!r || !k || !dims)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_registry_launch: registry, kernel or dims is NULL");
  const entry *e = lookup(r, k->name ? k->name : "");
  if (!e || &e->k != k)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_registry_launch: kernel %s is not of this registry",
                       k->name ? k->name : "(unnamed)");
  unsigned grid[3];
  int rc = mg_launch_grid(&k->rule, dims, grid, d);
  if (rc) {
    mg_diag_prefix(d, "kernel %s", k->name);
    return rc;
  }
  if (!grid[0] || !grid[1] || !grid[2]) return 0;
  const unsigned *b = k->rule.block;
  CUresult cr = r->drv->cuLaunchKernel(k->function, grid[0], grid[1], grid[2], b[0], b[1], b[2],
                                       (unsigned)k->rule.smem, stream, args, NULL);
  if (cr == CUDA_SUCCESS) return 0;
  char what[MAX_NAME + 160];
  snprintf(what, sizeof what, "cuLaunchKernel(%s, grid %u,%u,%u, block %u,%u,%u, smem %zu)",
           k->name, grid[0], grid[1], grid[2], b[0], b[1], b[2], k->rule.smem);
  return mg_driver_fail(r->drv, cr, what, d);
}
