/* mg_manifest.c: a manifest entry (JSON) parsed into mg_kernel_info. See mg_manifest.h. */
#include "mg_manifest.h"

#include <cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlagen.h"

#define MAX_MULDIV (1L << 20)
#define MAX_GRID_X 2147483647L
#define MAX_GRID_YZ 65535L

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

/* ---- the entry ------------------------------------------------------------------------- */

/* A string member key of o into dst (size n); 0 when absent, not a string or too long. */
static int str_into(const cJSON *o, const char *key, char *dst, size_t n) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsString(v) || strlen(v->valuestring) >= n) return 0;
  snprintf(dst, n, "%s", v->valuestring);
  return 1;
}

static int cmp_tv(const void *a, const void *b) {
  return strcmp(((const mg_tunable_value *)a)->name, ((const mg_tunable_value *)b)->name);
}

static int params_of(const cJSON *params, mg_kernel_info *k, mg_diag *d) {
  if (!cJSON_IsArray(params))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: the manifest has no \"params\" array", k->name);
  if (cJSON_GetArraySize(params) > MG_KERNEL_MAX_PARAMS)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: more than %d parameters", k->name, MG_KERNEL_MAX_PARAMS);
  const cJSON *it;
  cJSON_ArrayForEach(it, params) {
    mg_kernel_param *p = &k->params[k->n_params++];
    char type[64];
    if (!str_into(it, "name", p->name, sizeof p->name) || !str_into(it, "type", type, sizeof type))
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: parameter %d has no string name and type (names "
                         "under %zu characters)", k->name, k->n_params - 1, sizeof p->name);
    const size_t tl = strlen(type);
    if (tl && type[tl - 1] == '*') {
      p->kind = strncmp(type, "const", 5) == 0 ? MG_PARAM_IN : MG_PARAM_OUT;
      p->is_f32 = strstr(type, "float") != NULL;
    } else if (strcmp(type, "int") == 0) {
      p->kind = MG_PARAM_INT;
    } else if (strstr(type, "TensorMap")) {
      p->kind = MG_PARAM_TMAPS;
    } else if (strcmp(type, "float") == 0) {
      p->kind = MG_PARAM_FLOAT;
    } else {
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: parameter %s has type '%s' (a pointer, int, "
                         "float or TensorMaps)", k->name, p->name, type);
    }
    if (cJSON_GetObjectItemCaseSensitive(it, "shape") && !str_into(it, "shape", p->shape, sizeof p->shape))
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: parameter %s: shape not a string under %zu "
                         "characters", k->name, p->name, sizeof p->shape);
    if (cJSON_GetObjectItemCaseSensitive(it, "bench") && !str_into(it, "bench", p->bench, sizeof p->bench))
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: parameter %s: bench not a string under %zu "
                         "characters", k->name, p->name, sizeof p->bench);
  }
  return 0;
}

/* An integer a tunable can hold (|v| < 2^31). */
static int tunable_int(const cJSON *v, long *out) {
  if (!cJSON_IsNumber(v) || !(fabs(v->valuedouble) < 2147483648.0) ||
      v->valuedouble != floor(v->valuedouble))
    return 0;
  *out = (long)v->valuedouble;
  return 1;
}

static int config_of(const cJSON *cfg, const cJSON *tun, mg_kernel_info *k, mg_diag *d) {
  if ((cfg && !cJSON_IsObject(cfg)) || (tun && !cJSON_IsObject(tun)))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: the manifest's config or tunables is not an object",
                       k->name);
  const cJSON *it;
  cJSON_ArrayForEach(it, cfg) {
    mg_tunable_value *v = &k->config[k->n_config];
    if (k->n_config == MG_SPEC_MAX_CONFIG || !it->string || !it->string[0] ||
        strlen(it->string) >= sizeof v->name || strpbrk(it->string, ".= ") || !tunable_int(it, &v->value))
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: the manifest's config is not a table of at most %d "
                         "integers", k->name, MG_SPEC_MAX_CONFIG);
    snprintf(v->name, sizeof v->name, "%s", it->string);
    k->n_config++;
  }
  qsort(k->config, (size_t)k->n_config, sizeof k->config[0], cmp_tv);
  cJSON_ArrayForEach(it, tun) { /* keys sorted by the generator */
    mg_kernel_tunable *t = &k->tunables[k->n_tunables];
    const cJSON *vals = cJSON_GetObjectItemCaseSensitive(it, "values"), *v;
    if (k->n_tunables == MG_SPEC_MAX_CONFIG || !it->string || strlen(it->string) >= sizeof t->name ||
        !cJSON_IsArray(vals))
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: more than %d tunables, or a malformed declaration",
                         k->family, MG_SPEC_MAX_CONFIG);
    snprintf(t->name, sizeof t->name, "%s", it->string);
    cJSON_ArrayForEach(v, vals) {
      if (t->n == MG_KERNEL_MAX_VALUES || !tunable_int(v, &t->values[t->n]))
        return mg_diag_set(d, MLAGEN_EINVAL, "%s: tunable %s: more than %d values, or one that is "
                           "not an integer", k->family, t->name, MG_KERNEL_MAX_VALUES);
      t->n++;
    }
    if (t->n == 0)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: tunable %s has no integer values", k->family, t->name);
    k->n_tunables++;
  }
  return 0;
}

/* kernel{}'s family facts: pass, causal, varlen, interface, flops (each optional). */
static int facts_of(const cJSON *e, mg_kernel_info *k, mg_diag *d) {
  const cJSON *pass = cJSON_GetObjectItemCaseSensitive(e, "pass");
  const cJSON *causal = cJSON_GetObjectItemCaseSensitive(e, "causal");
  const cJSON *itf = cJSON_GetObjectItemCaseSensitive(e, "interface");
  const cJSON *flops = cJSON_GetObjectItemCaseSensitive(e, "flops");
  snprintf(k->pass, sizeof k->pass, "fwd");
  if (pass && (!cJSON_IsString(pass) || (strcmp(pass->valuestring, "fwd") && strcmp(pass->valuestring, "bwd"))))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: pass is not \"fwd\" or \"bwd\"", k->family);
  if (pass) snprintf(k->pass, sizeof k->pass, "%s", pass->valuestring);
  if (causal && !cJSON_IsBool(causal))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: causal is not a boolean", k->family);
  k->causal = cJSON_IsTrue(causal);
  const cJSON *varlen = cJSON_GetObjectItemCaseSensitive(e, "varlen");
  if (varlen && !cJSON_IsBool(varlen))
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: varlen is not a boolean", k->family);
  k->varlen = cJSON_IsTrue(varlen);
  if (itf) {
    const cJSON *it;
    if (!cJSON_IsArray(itf) && !(cJSON_IsObject(itf) && !itf->child)) /* {} is an empty list */
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: interface is not a list of tunable names", k->family);
    cJSON_ArrayForEach(it, itf) {
      if (k->n_interface == MG_SPEC_MAX_CONFIG || !cJSON_IsString(it) ||
          strlen(it->valuestring) >= sizeof k->interface[0])
        return mg_diag_set(d, MLAGEN_EINVAL, "%s: interface is not a list of tunable names", k->family);
      snprintf(k->interface[k->n_interface++], sizeof k->interface[0], "%s", it->valuestring);
    }
  }
  if (flops) {
    const cJSON *pair = cJSON_GetObjectItemCaseSensitive(flops, "pair");
    const cJSON *row = cJSON_GetObjectItemCaseSensitive(flops, "row");
    if (!cJSON_IsObject(flops) || (pair && !cJSON_IsNumber(pair)) || (row && !cJSON_IsNumber(row)))
      return mg_diag_set(d, MLAGEN_EINVAL, "%s: flops is not {pair = n, row = n}", k->family);
    k->flops_pair = pair ? pair->valuedouble : 0;
    k->flops_row = row ? row->valuedouble : 0;
  }
  return 0;
}

int mg_manifest_parse(const cJSON *e, mg_kernel_info *out, mg_diag *d) {
  if (!out) return mg_diag_set(d, MLAGEN_EINVAL, "mg_manifest_parse: out is NULL");
  memset(out, 0, sizeof *out);
  int rc = 0;
  if (!cJSON_IsObject(e)) rc = mg_diag_set(d, MLAGEN_EINVAL, "manifest entry is not an object");
  else if (!str_into(e, "name", out->name, sizeof out->name))
    rc = mg_diag_set(d, MLAGEN_EINVAL, "manifest entry without a string \"name\" (under %zu "
                     "characters)", sizeof out->name);
  if (!rc)
    rc = mg_launch_rule_parse(cJSON_GetObjectItemCaseSensitive(e, "launch"), out->name, &out->launch, d);
  if (!rc && !str_into(e, "family", out->family, sizeof out->family))
    rc = mg_diag_set(d, MLAGEN_EINVAL, "%s: manifest entry without a string \"family\"", out->name);
  if (!rc) rc = params_of(cJSON_GetObjectItemCaseSensitive(e, "params"), out, d);
  if (!rc)
    rc = config_of(cJSON_GetObjectItemCaseSensitive(e, "config"),
                   cJSON_GetObjectItemCaseSensitive(e, "tunables"), out, d);
  if (!rc) rc = facts_of(e, out, d);
  if (rc) memset(out, 0, sizeof *out);
  return rc;
}

double mg_kernel_flops(const mg_kernel_info *k, int causal, long long seq) {
  const double S = (double)seq;
  return k->flops_pair * S * S * (causal ? 0.5 : 1.0) + k->flops_row * S;
}

const mg_kernel_param *mg_kernel_param_find(const mg_kernel_info *k, const char *name) {
  for (int i = 0; i < k->n_params; i++)
    if (strcmp(k->params[i].name, name) == 0) return &k->params[i];
  return NULL;
}

int mg_kernel_is_interface(const mg_kernel_info *k, const char *tunable) {
  for (int i = 0; i < k->n_interface; i++)
    if (strcmp(k->interface[i], tunable) == 0) return 1;
  return 0;
}
