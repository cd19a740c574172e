/* cli_info.c: `mlagen info`: the validated attention shape of a model config. */
#include <stdio.h>

#include "cli.h"
#include "mg_config.h"
#include "mg_diag.h"

static const char help[] =
    "usage: mlagen info [--model M]\n"
    "\n"
    "Reads a HuggingFace config.json (a path, or a shipped name: deepseek-v3 (default),\n"
    "deepseek-v2-lite, kimi-k2), validates it and prints the MLA shape and the softmax\n"
    "scale mscale^2 / sqrt(d_n + d_r). A key the config lacks takes the default of the\n"
    "model_type's config class in transformers, or is derived as that class derives it\n"
    "(MiniCPM3: v_head_dim = hidden_size / num_attention_heads); each such key is listed\n"
    "under 'derived' with its value and where it came from.\n";

int cli_info(int argc, char **argv) {
  cli_opts o;
  int rc = cli_parse(argc, argv, "model", help, &o);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  if (mg_config_load(o.model, &s, &d)) { /* notes go to stdout below, not stderr */
    cli_error("%s", mg_diag_msg(&d));
    mg_diag_clear(&d);
    return CLI_FAIL;
  }
  printf("model             %s (%s)\n", s.source, s.model_type[0] ? s.model_type : "no model_type");
  printf("heads H           %d\n", s.heads);
  printf("kv_lora_rank d_c  %d\n", s.kv_lora_rank);
  printf("qk_rope d_r       %d\n", s.qk_rope_head_dim);
  printf("qk_nope d_n       %d\n", s.qk_nope_head_dim);
  printf("v_head_dim d_v    %d\n", s.v_head_dim);
  printf("q_lora_rank d_q   %d%s\n", s.q_lora_rank, s.q_lora_rank ? "" : " (none)");
  printf("hidden_size D     %d\n", s.hidden_size);
  printf("rope scaling      %s", s.rope_type[0] ? s.rope_type : "none");
  if (s.rope_type[0]) printf(" factor %g mscale_all_dim %g", s.rope_factor, s.mscale_all_dim);
  printf("\nmscale            %.6f\n", s.mscale);
  printf("softmax scale     %.6f\n", s.softmax_scale);
  for (int i = 0; i < s.n_notes; i++) printf("derived           %s\n", s.notes[i]);
  return CLI_OK;
}
