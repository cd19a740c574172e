/* mg_manifest.h: a generated kernel's manifest entry as a typed C struct.
 *
 * A template's kernel{...} declaration (templates/<family>.cu.tpl, docs/templates.md)
 * becomes, when the generator renders it (mg_gen_kernel), one JSON entry of manifest.json
 * and, parsed once here, an mg_kernel_info: the kernel's name, family, parameters, launch
 * rule, resolved configuration and tunables, and the family's facts the executors, the
 * autotuner and the benchmark need (pass, whether the code depends on causal, a varlen variant, the
 * tunables that change the interface, the FLOP count, the benchmark's argument values).
 * Everything above the generator reads this struct; only this module and the generator
 * see the JSON. */
#ifndef MG_MANIFEST_H
#define MG_MANIFEST_H
#include <stddef.h>

#include "mg_diag.h"
#include "mg_spec.h"

struct cJSON; /* cJSON.h: only the generator and this module's parser use it */

/* What a grid dim is computed from. */
typedef enum mg_grid_src {
  MG_GRID_VALUE = 0, /* a constant: value */
  MG_GRID_BATCH,     /* ceil(batch * mul / div) */
  MG_GRID_SEQLEN_Q,  /* ceil(seqlen_q * mul / div) */
  MG_GRID_SEQLEN_K   /* ceil(seqlen_k * mul / div) */
} mg_grid_src;

/* A kernel's launch rule, from its manifest entry's "launch" object:
 *   {"grid": [d, d, d], "block": [x, y, z], "smem": bytes, ...}
 * with each grid dim d either {"value": n} or {"arg": "batch"|"seqlen_q"|"seqlen_k",
 * "div": n, "mul": m} (div and mul optional, default 1): ceil(arg * mul / div). */
typedef struct mg_launch_rule {
  struct {
    mg_grid_src src;
    long value;    /* MG_GRID_VALUE: the dim, >= 1 */
    long mul, div; /* otherwise: both in 1 .. 2^20 */
  } grid[3];
  unsigned block[3]; /* threads, each >= 1, product <= 1024 */
  size_t smem;       /* dynamic shared memory per CTA, bytes */
} mg_launch_rule;

/* The run-time sizes a grid is computed from (counts, >= 0). */
typedef struct mg_launch_dims {
  long batch, seqlen_q, seqlen_k;
} mg_launch_dims;

/* Parses a manifest "launch" object (cJSON) into *rule. what names the kernel in messages (may be
 * NULL). Returns 0, or MLAGEN_EINVAL (launch or rule NULL; grid or block not arrays of 3;
 * a grid dim with neither or both of "arg" and "value", an unknown "arg", a "div" or "mul"
 * that is not an integer in 1 .. 2^20, a "value" that is not an integer in
 * 1 .. 2^31 - 1; a block dim that is not an integer >= 1 or threads over 1024; "smem" not
 * an integer in 0 .. 2^31 - 1); *rule is zeroed on error. */
int mg_launch_rule_parse(const struct cJSON *launch, const char *what, mg_launch_rule *rule, mg_diag *d);

/* The grid of rule for dims into grid[3]: per dim, value, or ceil(arg * mul / div) with
 * arg the dims field named by the rule. A dim may come out 0 (e.g. seqlen_q = 0): the
 * launch is then empty. Returns 0, or MLAGEN_EINVAL (a NULL argument, a dims field the
 * rule uses is negative), MLAGEN_ELIMIT (x over 2^31 - 1, y or z over 65535; the message
 * gives the dim, its value and the limit). */
int mg_launch_grid(const mg_launch_rule *rule, const mg_launch_dims *dims, unsigned grid[3],
                   mg_diag *d);

#define MG_KERNEL_MAX_PARAMS 24 /* parameters of one kernel */
#define MG_KERNEL_MAX_VALUES 32 /* declared values of one tunable */

/* How a kernel parameter is passed. */
typedef enum mg_param_kind {
  MG_PARAM_IN = 0, /* a const pointer: an input */
  MG_PARAM_OUT,    /* a non-const pointer: an output */
  MG_PARAM_INT,    /* int */
  MG_PARAM_FLOAT,  /* float */
  MG_PARAM_TMAPS   /* CUtensorMaps by value (a type naming TensorMap, no pointer: the sm_90a
                      families' `const __grid_constant__ mla::sm90::TensorMaps<N>`): the
                      launcher passes a pointer to N contiguous CUtensorMaps made for the
                      launch (runtime/exec/mg_sm90_tmap.h mg_sm90_launch_tmaps) */
} mg_param_kind;

/* One kernel parameter, in the kernel's order (kernel{} params). */
typedef struct mg_kernel_param {
  char name[32];
  mg_param_kind kind;
  int is_f32;       /* pointers: 1 for float* (else the spec's 16-bit elem_t) */
  char shape[160];  /* pointers: the declared shape, "[B, S_q, H, d_n + d_r]" ("unused": the
                       configuration does not read it; "" when not declared) */
  char bench[64];   /* ints: the value a benchmark passes, an expression over the shape
                       names (kernel{} params[i].bench; "" when not declared) */
} mg_kernel_param;

/* A declared tunable and its allowed values. */
typedef struct mg_kernel_tunable {
  char name[32];
  int n;
  long values[MG_KERNEL_MAX_VALUES];
} mg_kernel_tunable;

/* A generated kernel's manifest entry, typed. */
typedef struct mg_kernel_info {
  char name[160];   /* the __global__ symbol, extern "C" */
  char family[32];  /* the template family */
  char pass[8];     /* kernel{} pass: "fwd" or "bwd" */
  int causal;       /* kernel{} causal: 1 when the code depends on spec.causal */
  int varlen;       /* kernel{} varlen: 1 when the family has a packed-sequence variant */
  int n_params;
  mg_kernel_param params[MG_KERNEL_MAX_PARAMS];
  int n_config;     /* the resolved configuration, every tunable, names sorted */
  mg_tunable_value config[MG_SPEC_MAX_CONFIG];
  int n_tunables;   /* the declared tunables, names sorted */
  mg_kernel_tunable tunables[MG_SPEC_MAX_CONFIG];
  int n_interface;  /* kernel{} interface: the tunables that change the parameters or what
                       the kernel computes (a tuning candidate is checked against the
                       default configuration with these kept) */
  char interface[MG_SPEC_MAX_CONFIG][32];
  double flops_pair; /* kernel{} flops.pair: FLOPs per visible (query, key) pair, all heads */
  double flops_row;  /* kernel{} flops.row: FLOPs per query token, all heads */
  mg_launch_rule launch;
} mg_kernel_info;

/* Parses one manifest entry (an element of manifest.json's "kernels", as mg_gen_kernel
 * builds it) into *out: "name", "launch" (mg_launch_rule_parse), "family", "params" (each
 * with a string "name" and a "type" of a pointer, "int", "float" or tensor maps by value
 * (a type naming TensorMap); optional "shape",
 * "bench"), and the optional "config" and "tunables" (integers), "pass", "causal", "varlen",
 * "interface", "flops".
 * Errors: MLAGEN_EINVAL (entry NULL, a field missing or mistyped, more than
 * MG_KERNEL_MAX_PARAMS parameters or MG_SPEC_MAX_CONFIG tunables, a name too long; the
 * message names the kernel and the field); *out is zeroed on error. */
int mg_manifest_parse(const struct cJSON *entry, mg_kernel_info *out, mg_diag *d);

/* FLOPs of one call at sequence length seq (batch 1): flops_pair times the visible (query,
 * key) pairs (seq^2, halved when causal) plus flops_row times seq. 0 for a kernel that
 * declares no flops (the layout and element-wise kernels: memory-bound). */
double mg_kernel_flops(const mg_kernel_info *k, int causal, long long seq);

/* The parameter named name of k, or NULL. */
const mg_kernel_param *mg_kernel_param_find(const mg_kernel_info *k, const char *name);

/* 1 if tunable is in k's interface list. */
int mg_kernel_is_interface(const mg_kernel_info *k, const char *tunable);
#endif
