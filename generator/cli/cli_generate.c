/* cli_generate.c: `mlagen generate`: kernels for a model -> .cu files + manifest.json. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "mg_generate.h"
#include "mg_tune.h"
#include "mlagen.h"

static const char help[] =
    "usage: mlagen generate [--model M] [--out DIR] [--sp P] [--dtype bf16|fp16]\n"
    "                       [--arch ARCH] [--set tunable=value]... [--family F]...\n"
    "                       [--templates DIR] [--varlen]\n"
    "\n"
    "Renders every kernel the model needs (each family, causal and non-causal) into\n"
    "DIR/<kernel>.cu, copies the device headers (mla_device.cuh, mla_device_sm90.cuh)\n"
    "beside them and writes DIR/manifest.json: kernel names, launch rules, parameters,\n"
    "spec and config.\n"
    "\n"
    "  --model M        config.json path or shipped name (default deepseek-v3)\n"
    "  --out DIR        output directory (default mlagen-kernels)\n"
    "  --sp P           sequence-parallel degree: kernels see H / P heads (default 1);\n"
    "                   at a P not dividing H only laga-cp runs: its kernels (all H heads,\n"
    "                   the same at any P), with a note\n"
    "  --dtype T        element type of the tensors (default bf16)\n"
    "  --arch ARCH      the families ARCH's CUDA executor runs (sm_90a: attn_fwd_sm90,\n"
    "                   attn_bwd_dkdv_sm90, attn_bwd_dq_sm90, the TMA/wgmma attention, in\n"
    "                   place of attn_fwd, attn_bwd_dkdv, attn_bwd_dq; with MLAGEN_MMA_SYNC=1\n"
    "                   the portable ones, as the executor then runs; an arch family that\n"
    "                   refuses the shape falls back to the portable one, with a note);\n"
    "                   default: the portable mma.sync families (sm_80 and up)\n"
    "  --set k=v        override a tunable of one family with family.k=v (e.g.\n"
    "                   explicit_fwd.block_m=16), or of every family with k=v (each\n"
    "                   family rendered must then declare k and accept v); repeatable;\n"
    "                   the settings the plans fix (k_packed, deterministic, qsplit) are\n"
    "                   refused\n"
    "  --family F       also render F beside the family it stands in for: attn_fwd_sm90\n"
    "                   (the sm_90a TMA/wgmma forward) beside each attn_fwd kernel,\n"
    "                   mqa_fwd_sm90 (the sm_90a absorbed forward, no plan runs yet) beside\n"
    "                   each mqa_fwd one, attn_bwd_dkdv_sm90 and attn_bwd_dq_sm90 (the\n"
    "                   sm_90a deterministic backward) beside each attn_bwd_dkdv /\n"
    "                   attn_bwd_dq one, mqa_bwd_dkv_sm90 and mqa_bwd_dq_sm90 (the sm_90a\n"
    "                   absorbed backward, no plan runs yet) beside each mqa_bwd_dkv /\n"
    "                   mqa_bwd_dq one, or with --arch sm_90a (which renders attn_fwd_sm90,\n"
    "                   attn_bwd_dkdv_sm90, attn_bwd_dq_sm90 in their place) attn_fwd,\n"
    "                   attn_bwd_dkdv or attn_bwd_dq, the mma.sync kernel back beside it\n"
    "                   (the MLAGEN_MMA_SYNC=1 fallback); each with its\n"
    "                   default tunables, its counterpart's k_packed, and the --set overrides\n"
    "                   (family.k=v ones are safest); repeatable\n"
    "  --templates DIR  read templates from DIR instead of the embedded ones\n"
    "  --varlen         also the packed-sequence variants (<kernel>_varlen) of the\n"
    "                   attention families, which plans with mlagen_plan_desc.varlen run\n"
    "                   (docs/packed.md)\n";

int cli_generate(int argc, char **argv) {
  cli_opts o;
  int rc = cli_parse(argc, argv, "model out sp dtype arch set family templates varlen", help, &o);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  if ((rc = cli_kernel_dtype(&o))) return rc;
  if (!o.out) o.out = "mlagen-kernels";
  mg_shape shape;
  mg_kernel_spec specs[MG_SPEC_MAX_KERNELS];
  int n = 0;
  mg_gen *g;
  mg_tune_limits lim;
  mg_diag ad = MG_DIAG_INIT;
  if (o.arch && mg_tune_arch_limits(o.arch, &lim, &ad)) { /* one known architecture */
    cli_error("--arch: %s", mg_diag_msg(&ad));
    mg_diag_clear(&ad);
    return CLI_USAGE;
  }
  if ((rc = cli_prepare_rendered(&o, o.arch, &shape, specs, MG_SPEC_MAX_KERNELS, &n, &g))) return rc;

  mg_diag d = MG_DIAG_INIT;
  static mg_kernel kernels[MG_SPEC_MAX_KERNELS]; /* ~2.5 MiB: not on the stack */
  int made = 0;
  static cli_seen seen; /* ~56 KiB */
  seen.n = 0, seen.n_notes = 0;
  for (int i = 0; !rc && i < n; i++) {
    rc = cli_render(&o, g, &specs[i], &kernels[made], &seen, &d);
    if (!rc && cli_kernel_seen(&seen, &kernels[made])) mg_kernel_free(&kernels[made]); /* a fallback listed */
    else if (!rc) made++;
  }
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
