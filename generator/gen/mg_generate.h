/* mg_generate.h: kernel specs -> CUDA source through the Lua templates.
 *
 * An mg_gen owns one sandboxed Lua state and the template set: the templates embedded
 * in the binary, or the files of a directory given with `--templates DIR` (same file
 * names) for template development. The template set's SHA-256 (template_hash) goes into
 * every JIT cache key and into the manifest; each family's hash (over what renders its
 * kernels) keys its tuned store entries. */
#ifndef MG_GENERATE_H
#define MG_GENERATE_H
#include <stddef.h>

#include "mg_config.h"
#include "mg_diag.h"
#include "mg_jit.h"
#include "mg_manifest.h"
#include "mg_spec.h"

typedef struct mg_gen mg_gen;

/* The device header every generated kernel includes. */
#define MG_DEVICE_HEADER "mla_device.cuh"
/* The Hopper (sm_90a) primitives, a sibling header the sm_90a kernels include after it;
 * optional in a template set (--templates DIR may lack it). */
#define MG_DEVICE_HEADER_SM90 "mla_device_sm90.cuh"
/* Lua helpers of the sm_90a templates, run after prelude.lua for a template naming
 * MG_DEVICE_HEADER_SM90 (and, like that header, in the hash of those families only). */
#define MG_PRELUDE_SM90 "prelude_sm90.lua"

/* Opens a generator. templates_dir NULL means the embedded templates.
 * Errors: MLAGEN_EIO (a template file missing from templates_dir; the message names
 * it), MLAGEN_ENOMEM. */
int mg_gen_open(mg_gen **out, const char *templates_dir, mg_diag *d);
void mg_gen_close(mg_gen *g);

/* Hex SHA-256 of the template set (every file's name and bytes). */
const char *mg_gen_template_hash(const mg_gen *g);

/* Hex SHA-256 of what renders family's kernels: the family's name, its own template
 * "<family>.cu.tpl" and every file of the set that is no family's template (the device
 * header, the Lua prelude; the sm_90a header only when the family's template names it),
 * each file's name and bytes. Changing one family's template
 * changes only that family's hash; changing a shared file changes every family's. Never
 * equal to mg_gen_template_hash. NULL for a family not in mg_spec_families. Valid while g
 * is open. */
const char *mg_gen_family_hash(const mg_gen *g, const char *family);

/* The headers a generated kernel may include at compile time (the device header, then
 * the sm_90a one when the set has it), for NVRTC. Valid while g is open. */
const mg_jit_header *mg_gen_headers(const mg_gen *g, int *n);

/* One generated kernel. */
typedef struct mg_kernel {
  char name[160];    /* the __global__ symbol, extern "C" */
  char file[176];    /* "<name>.cu" */
  char *source;      /* rendered CUDA source, NUL-terminated */
  size_t source_len;
  mg_kernel_info info;   /* this kernel's manifest entry, typed (mg_manifest.h): what the
                            executors, the autotuner and the benchmark read */
  struct cJSON *manifest; /* the same entry as JSON (name, file, spec, config, tunables,
                            launch rule, parameters, family facts), for manifest.json */
  struct mg_gen_acct *acct; /* private: the generator's count of output held */
} mg_kernel;

/* Caps on rendered source: per kernel, and in total over the kernels of one generator
 * held at once (rendered and not yet freed with mg_kernel_free): a template set that
 * renders near the per-kernel cap for every kernel would otherwise hold ~10 GiB. */
#define MG_GEN_KERNEL_MAX ((size_t)256 << 20) /* 256 MiB */
#define MG_GEN_TOTAL_MAX ((size_t)1 << 30)    /* 1 GiB */

/* Renders the template of s->family for spec s. softmax_scale is not baked in (it is a
 * kernel argument); out->info is the kernel's manifest entry parsed once
 * (mg_manifest_parse). Errors: MLAGEN_EINVAL (a tunable override the template does not
 * declare or allow, or a configuration its check rejects: the message says why),
 * MLAGEN_ETEMPLATE (a bug in the template: the message names the template file and
 * line and carries a Lua traceback; or a kernel{} declaration whose entry does not parse:
 * the message names the template and the field), MLAGEN_ELIMIT (the template hit the Lua memory or
 * instruction cap or time limit, or the output cap: MG_GEN_KERNEL_MAX for this kernel,
 * MG_GEN_TOTAL_MAX with the kernels already held), MLAGEN_EINVAL (unknown family),
 * MLAGEN_ENOMEM. */
int mg_gen_kernel(mg_gen *g, const mg_kernel_spec *s, mg_kernel *out, mg_diag *d);
/* Frees k's source and manifest (k may outlive its generator). */
void mg_kernel_free(mg_kernel *k);

/* Test hook: sets g's total output cap (0: MG_GEN_TOTAL_MAX). */
void mg_gen_set_total_max(mg_gen *g, size_t max);

/* Writes kernels[0..n) as <dir>/<file>, the device header, and <dir>/manifest.json
 * (kernels, shape, sp degree, template hash, mlagen version), each atomically; creates
 * dir. Errors: MLAGEN_EIO, MLAGEN_ENOMEM. */
int mg_gen_write(mg_gen *g, const mg_shape *shape, int sp, const mg_kernel *kernels, int n,
                 const char *dir, mg_diag *d);
#endif
