/* mg_module.c: the module registry. See mg_module.h. */
#include "mg_module.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAME 255
#define MAX_MULDIV (1L << 20)
#define MAX_GRID_X 2147483647L
#define MAX_GRID_YZ 65535L

typedef struct entry {
  mg_module_kernel k;
  char name[MAX_NAME + 1];
} entry;

struct mg_module_registry {
  const mg_driver *drv;
  entry **items; /* each entry allocated on its own: kernel pointers stay valid */
  int n, cap;
};

/* ---- launch rules --------------------------------------------------------------------- */

/* An integer-valued JSON number in lo .. hi into *v. */
static int int_in(const cJSON *j, long lo, long hi, long *v) {
  if (!cJSON_IsNumber(j)) return 0;
  const double x = j->valuedouble;
  if (x != floor(x) || x < (double)lo || x > (double)hi) return 0;
  *v = (long)x;
  return 1;
}

int mg_launch_rule_parse(const cJSON *launch, const char *what, mg_launch_rule *rule, mg_diag *d) {
  if (!rule) return mg_diag_set(d, MLAGEN_EINVAL, "mg_launch_rule_parse: rule is NULL");
  memset(rule, 0, sizeof *rule);
  const char *w = what ? what : "kernel";
  if (!cJSON_IsObject(launch))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: no launch rule (an object with grid, block, smem)", w);
  const cJSON *grid = cJSON_GetObjectItemCaseSensitive(launch, "grid");
  const cJSON *block = cJSON_GetObjectItemCaseSensitive(launch, "block");
  const cJSON *smem = cJSON_GetObjectItemCaseSensitive(launch, "smem");
  int rc = 0;
  if (!cJSON_IsArray(grid) || cJSON_GetArraySize(grid) != 3) {
    rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: launch.grid is not an array of 3 dims", w);
    goto out;
  }
  if (!cJSON_IsArray(block) || cJSON_GetArraySize(block) != 3) {
    rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: launch.block is not an array of 3 integers", w);
    goto out;
  }
  for (int i = 0; i < 3; i++) {
    const cJSON *e = cJSON_GetArrayItem(grid, i);
    const cJSON *arg = cJSON_GetObjectItemCaseSensitive(e, "arg");
    const cJSON *val = cJSON_GetObjectItemCaseSensitive(e, "value");
    const cJSON *div = cJSON_GetObjectItemCaseSensitive(e, "div");
    const cJSON *mul = cJSON_GetObjectItemCaseSensitive(e, "mul");
    if (!cJSON_IsObject(e) || (arg != NULL) == (val != NULL)) {
      rc = mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: launch.grid[%d] is neither {value} nor {arg, div, mul}", w, i);
      goto out;
    }
    if (val) {
      if (!int_in(val, 1, MAX_GRID_X, &rule->grid[i].value)) {
        rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: launch.grid[%d].value is not an integer in 1 .. %ld",
                         w, i, MAX_GRID_X);
        goto out;
      }
      rule->grid[i].src = MG_GRID_VALUE;
      rule->grid[i].mul = rule->grid[i].div = 1;
      continue;
    }
    const char *a = cJSON_IsString(arg) ? arg->valuestring : "";
    if (!strcmp(a, "batch")) rule->grid[i].src = MG_GRID_BATCH;
    else if (!strcmp(a, "seqlen_q")) rule->grid[i].src = MG_GRID_SEQLEN_Q;
    else if (!strcmp(a, "seqlen_k")) rule->grid[i].src = MG_GRID_SEQLEN_K;
    else {
      rc = mg_diag_set(d, MLAGEN_EINVAL,
                       "%s: launch.grid[%d].arg '%s' is not batch, seqlen_q or seqlen_k", w, i,
                       cJSON_IsString(arg) ? a : "(not a string)");
      goto out;
    }
    rule->grid[i].mul = rule->grid[i].div = 1;
    const int bad_div = div && !int_in(div, 1, MAX_MULDIV, &rule->grid[i].div);
    const int bad_mul = mul && !int_in(mul, 1, MAX_MULDIV, &rule->grid[i].mul);
    if (bad_div || bad_mul) {
      rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: launch.grid[%d].%s is not an integer in 1 .. %ld",
                       w, i, bad_div ? "div" : "mul", MAX_MULDIV);
      goto out;
    }
  }
  long threads = 1;
  for (int i = 0; i < 3; i++) {
    long b;
    if (!int_in(cJSON_GetArrayItem(block, i), 1, 1024, &b)) {
      rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: launch.block[%d] is not an integer in 1 .. 1024", w, i);
      goto out;
    }
    rule->block[i] = (unsigned)b;
    threads *= b;
  }
  if (threads > 1024) {
    rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: launch.block is %u x %u x %u = %ld threads, over 1024",
                     w, rule->block[0], rule->block[1], rule->block[2], threads);
    goto out;
  }
  long s;
  if (!int_in(smem, 0, INT_MAX, &s)) {
    rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: launch.smem is not an integer in 0 .. %d bytes", w,
                     INT_MAX);
    goto out;
  }
  rule->smem = (size_t)s;
out:
  if (rc) memset(rule, 0, sizeof *rule);
  return rc;
}

int mg_launch_grid(const mg_launch_rule *rule, const mg_launch_dims *dims, unsigned grid[3],
                   mg_diag *d) {
  if (!rule || !dims || !grid)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_launch_grid: rule, dims or grid is NULL");
  static const char *const names[] = {"value", "batch", "seqlen_q", "seqlen_k"};
  static const char axis[] = "xyz";
  for (int i = 0; i < 3; i++) {
    long long v = rule->grid[i].value;
    if (rule->grid[i].src != MG_GRID_VALUE) {
      const long a = rule->grid[i].src == MG_GRID_BATCH      ? dims->batch
                     : rule->grid[i].src == MG_GRID_SEQLEN_Q ? dims->seqlen_q
                                                             : dims->seqlen_k;
      if (a < 0)
        return mg_diag_set(d, MLAGEN_EINVAL, "grid %c: %s = %ld is negative", axis[i],
                           names[rule->grid[i].src], a);
      if (rule->grid[i].mul < 1 || rule->grid[i].div < 1)
        return mg_diag_set(d, MLAGEN_EINVAL, "grid %c: mul %ld, div %ld (must be >= 1)", axis[i],
                           rule->grid[i].mul, rule->grid[i].div);
      if (a > LLONG_MAX / 4 / rule->grid[i].mul)
        return mg_diag_set(d, MLAGEN_ELIMIT, "grid %c: %s = %ld times %ld overflows", axis[i],
                           names[rule->grid[i].src], a, rule->grid[i].mul);
      v = ((long long)a * rule->grid[i].mul + rule->grid[i].div - 1) / rule->grid[i].div;
    }
    const long lim = i == 0 ? MAX_GRID_X : MAX_GRID_YZ;
    if (v < 0 || v > lim)
      return mg_diag_set(d, MLAGEN_ELIMIT, "grid %c = %lld is over the device limit %ld", axis[i],
                         v, lim);
    grid[i] = (unsigned)v;
  }
  return 0;
}

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

int mg_registry_load_manifest(mg_module_registry *r, const cJSON *entry_json, const void *image,
                              size_t size, const mg_module_kernel **out, mg_diag *d) {
  if (out) *out = NULL;
  if (!entry_json)
    return mg_diag_set(d, MLAGEN_EINVAL, "mg_registry_load_manifest: the manifest entry is NULL");
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(entry_json, "name");
  if (!cJSON_IsString(name))
    return mg_diag_set(d, MLAGEN_EINVAL, "manifest entry without a string \"name\"");
  mg_launch_rule rule;
  int rc = mg_launch_rule_parse(cJSON_GetObjectItemCaseSensitive(entry_json, "launch"),
                                name->valuestring, &rule, d);
  if (rc) return rc;
  return mg_registry_load(r, name->valuestring, image, size, &rule, out, d);
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
