/* cli_generate.c: `mlagen generate`: kernels for a model -> .cu files + manifest.json. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "mg_generate.h"
#include "mlagen.h"

static const char help[] =
    "usage: mlagen generate [--model M] [--out DIR] [--sp P] [--dtype bf16|fp16]\n"
    "                       [--set tunable=value]... [--family F]... [--templates DIR]\n"
    "\n"
    "Renders every kernel the model needs (each family, causal and non-causal) into\n"
    "DIR/<kernel>.cu, copies the device headers (mla_device.cuh, mla_device_sm90.cuh)\n"
    "beside them and writes DIR/manifest.json: kernel names, launch rules, parameters,\n"
    "spec and config.\n"
    "\n"
    "  --model M        config.json path or shipped name (default deepseek-v3)\n"
    "  --out DIR        output directory (default mlagen-kernels)\n"
    "  --sp P           sequence-parallel degree: kernels see H / P heads (default 1)\n"
    "  --dtype T        element type of the tensors (default bf16)\n"
    "  --set k=v        override a tunable of every family (e.g. block_m=64), or of one\n"
    "                   family with family.k=v (e.g. explicit_fwd.block_m=16); repeatable\n"
    "  --family F       also render a family no plan runs yet: attn_fwd_sm90 (the sm_90a\n"
    "                   TMA/wgmma forward), one per attn_fwd kernel, with its default\n"
    "                   tunables, k_packed as attn_fwd's, and the --set overrides\n"
    "                   (family.k=v ones are safest); mqa_fwd_sm90 (the sm_90a absorbed\n"
    "                   forward), one per mqa_fwd kernel; mqa_bwd_dkv_sm90 (the sm_90a\n"
    "                   absorbed backward's key side), one per mqa_bwd_dkv kernel;\n"
    "                   mqa_bwd_dq_sm90 (its query side), one per mqa_bwd_dq kernel;\n"
    "                   repeatable\n"
    "  --templates DIR  read templates from DIR instead of the embedded ones\n";

int cli_generate(int argc, char **argv) {
  cli_opts o;
  int rc = cli_parse(argc, argv, "model out sp dtype set family templates", help, &o);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  if ((rc = cli_kernel_dtype(&o))) return rc;
  if (!o.out) o.out = "mlagen-kernels";
  mg_shape shape;
  mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
  int n = 0;
  mg_gen *g;
  if ((rc = cli_prepare_rendered(&o, &shape, specs, MG_SPEC_MAX_KERNELS, &n, &g))) return rc;

  mg_diag d = MG_DIAG_INIT;
  mg_kernel kernels[MG_SPEC_MAX_KERNELS];
  int made = 0;
  for (; !rc && made < n; made++) rc = mg_gen_kernel(g, &specs[made], &kernels[made], &d);
  if (rc) made--; /* the failed one holds nothing */
  if (!rc) rc = mg_gen_write(g, &shape, o.sp, kernels, made, o.out, &d);
  if (!rc) {
    for (int i = 0; i < made; i++) printf("%s/%s\n", o.out, kernels[i].file);
    int n_hdr;
    const mg_jit_header *hdr = mg_gen_headers(g, &n_hdr);
    for (int i = 0; i < n_hdr; i++) printf("%s/%s\n", o.out, hdr[i].name);
    printf("%s/manifest.json\n", o.out);
  } else {
    cli_error("%s", mg_diag_msg(&d));
  }
  for (int i = 0; i < made; i++) mg_kernel_free(&kernels[i]);
  mg_gen_close(g);
  mg_diag_clear(&d);
  return rc == MLAGEN_EINVAL ? CLI_USAGE : rc ? CLI_FAIL : CLI_OK;
}
