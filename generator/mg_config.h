/* mg_config.h: an MLA model's attention shape, read from a HuggingFace config.json.
 *
 * Accepted: model_type deepseek_v2, deepseek_v3, kimi_k2, and any config that carries
 * kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim and num_attention_heads
 * (at the top level or under "text_config", as multimodal wrappers store it).
 * Notation follows DeepSeek-V2 (arXiv 2405.04434): H, d_c, d_r, d_n, d_v, d_q. */
#ifndef MG_CONFIG_H
#define MG_CONFIG_H
#include "mg_diag.h"

#define MG_SHAPE_MAX_NOTES 4

/* Kernel limits: the dims the generated kernels can handle, each with its reason
 * (printed in the error when a config exceeds it). One place for all of them. */
#define MG_DIM_ALIGN 16     /* d_n, d_r, d_v, d_c: multiple of the mma.sync k16 step */
#define MG_MAX_QK_DIM 256   /* d_n + d_r: explicit-form Q/K tile row in registers */
#define MG_MAX_V_DIM 256    /* d_v: explicit-form output accumulator in registers */
#define MG_MAX_LATENT 1024  /* d_c: absorbed-form latent head, split across warps */
#define MG_MAX_HEADS 4096   /* H: grid.y of the attention kernels */

typedef struct mg_shape {
  char source[256];      /* file path or shipped name the shape came from */
  char model_type[64];   /* config "model_type", "" if absent */
  int heads;             /* H   [num_attention_heads] */
  int kv_lora_rank;      /* d_c [kv_lora_rank] */
  int qk_rope_head_dim;  /* d_r [qk_rope_head_dim], shared by all heads on the key side */
  int qk_nope_head_dim;  /* d_n [qk_nope_head_dim] */
  int v_head_dim;        /* d_v [v_head_dim] */
  int q_lora_rank;       /* d_q [q_lora_rank], 0 when null or absent (V2-Lite) */
  int hidden_size;       /* D   [hidden_size], 0 when absent */
  char rope_type[32];    /* rope_scaling.type / rope_parameters.rope_type, "" if none */
  double rope_factor;    /* rope_scaling.factor, 1 if none */
  double mscale_all_dim; /* rope_scaling.mscale_all_dim, 0 if absent */
  /* yarn attention-temperature factor: 0.1 * mscale_all_dim * ln(factor) + 1 for
   * rope type yarn with factor > 1 and mscale_all_dim != 0, else 1 (DeepSeek-V2
   * modeling code, yarn_get_mscale). */
  double mscale;
  /* mscale^2 / sqrt(d_n + d_r): the softmax scale of the attention scores. */
  double softmax_scale;
  int n_notes;           /* values derived the way HF's code derives them */
  char notes[MG_SHAPE_MAX_NOTES][160];
} mg_shape;

/* Parses config.json text. name is used in messages ("<name>: key 'x': ...").
 * Errors (one line, naming name and the key): MLAGEN_ECONFIG for JSON that does not
 * parse, a non-MLA model (GQA config without kv_lora_rank), a missing, non-integer or
 * non-positive dim, an odd qk_rope_head_dim, an unknown rope type, a bad yarn factor;
 * MLAGEN_EUNSUPPORTED for dims beyond the kernel limits above; MLAGEN_ENOMEM. */
int mg_config_parse(const char *json, size_t len, const char *name, mg_shape *out, mg_diag *d);

/* Reads a config: `model` is a path to a config.json, or a shipped name
 * (deepseek-v3, deepseek-v2-lite, kimi-k2, embedded in the binary); NULL or "" means
 * the default, deepseek-v3. A name that is neither a file nor shipped is
 * MLAGEN_EIO with the list of shipped names. Otherwise as mg_config_parse. */
int mg_config_load(const char *model, mg_shape *out, mg_diag *d);

/* The shipped model names, NULL-terminated. */
extern const char *const mg_config_shipped[];
#define MG_CONFIG_DEFAULT "deepseek-v3"
#endif
