/* cli_info.c: `mlagen info`: the validated attention shape of a model config. */
#include <stdio.h>

#include "cli.h"

static const char help[] =
    "usage: mlagen info [--model M]\n"
    "\n"
    "Reads a HuggingFace config.json (a path, or a shipped name: deepseek-v3 (default),\n"
    "deepseek-v2-lite, kimi-k2), validates it and prints the MLA shape and the softmax\n"
    "scale mscale^2 / sqrt(d_n + d_r).\n";

int cli_info(int argc, char **argv) {
  cli_opts o;
  int rc = cli_parse(argc, argv, "model", help, &o);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  mg_shape s;
  if ((rc = cli_load_model(&o, &s))) return rc;
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
  return CLI_OK;
}
