/* mg_config.h: an MLA model's attention shape, read from a HuggingFace config.json.
 *
 * Accepted: any config that carries kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
 * v_head_dim and num_attention_heads (at the top level or under "text_config", as
 * multimodal wrappers store it). For a model_type that transformers (5.24) ships an MLA
 * config class for (deepseek_v2, deepseek_v3, deepseek_v32, minicpm3, glm4_moe_lite,
 * glm_moe_dsa, kimi_linear, longcat_flash, mistral4, mistral_large4_text, sarvam_mla,
 * youtu, axk1, axk2, bailing_hybrid, dots3_note_text, hy_v4, hy_v4_vl_text; kimi_k2 is
 * read as deepseek_v3, as KimiK25Config does), an absent key takes that class's default,
 * or is derived as the class derives it (MiniCPM3: v_head_dim = hidden_size /
 * num_attention_heads; Mistral4: an absent rope_parameters is yarn factor 128,
 * mscale_all_dim 1); each such value is listed in notes.
 * Notation follows DeepSeek-V2 (arXiv 2405.04434): H, d_c, d_r, d_n, d_v, d_q. */
#ifndef MG_CONFIG_H
#define MG_CONFIG_H
#include <stddef.h>

#include "mg_diag.h"

#define MG_SHAPE_MAX_NOTES 10

/* Kernel limits: the dims the generated kernels can handle, each with its reason.
 * The _WHY strings are printed in the error when a config exceeds a limit; this is the
 * one place for both. */
#define MG_DIM_ALIGN 16
#define MG_DIM_ALIGN_WHY "d_n, d_r, d_v, d_c must be multiples of the mma.sync k16 step"
#define MG_MAX_QK_DIM 256
#define MG_MAX_QK_DIM_WHY "d_n + d_r is an explicit-form Q/K tile row held in registers"
#define MG_MAX_V_DIM 256
#define MG_MAX_V_DIM_WHY "d_v is the explicit-form output accumulator held in registers"
#define MG_MAX_LATENT 1024
#define MG_MAX_LATENT_WHY "d_c is the absorbed-form latent head, split across warps"
#define MG_LATENT_ALIGN 32
#define MG_LATENT_ALIGN_WHY "the absorbed-form kernels split d_c across at least two warps in 16-column steps"
#define MG_MAX_LATENT_ROW 640
#define MG_MAX_LATENT_ROW_WHY "the absorbed-form backward holds (d_c + d_r)-wide latent tiles in 163 KiB of shared memory (sm_80's limit)"
#define MG_MAX_HEADS 4096
#define MG_MAX_HEADS_WHY "H is grid.y of the attention kernels"

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
  int n_notes;           /* values defaulted or derived the way HF's code does, one line each
                          * ("<key> absent: <value>, <from what>") */
  char notes[MG_SHAPE_MAX_NOTES][160];
} mg_shape;

/* Parses config.json text (len bytes, need not be NUL-terminated). name is used in
 * messages ("<name>: key 'x': ...") and copied to out->source. Keys are read from the
 * top level, or from "text_config" when the top level has no kv_lora_rank (then
 * messages name them "text_config.x"). rope_parameters (rope_type) and rope_scaling
 * (type) are both read; rope_type wins over type; if both objects are given they must
 * agree. A repeated key takes its last value, as Python's json does.
 * Errors, each one line naming name and the key; *out is unchanged on error:
 *   MLAGEN_EINVAL   json or out is NULL.
 *   MLAGEN_ECONFIG  not valid JSON ("not valid JSON near line L: ..."); arrays and objects
 *                   nested deeper than cJSON's CJSON_NESTING_LIMIT (1000; "nested deeper
 *                   than 1000 levels"); top level not an
 *                   object; not an MLA model (no kv_lora_rank, and model_type not an
 *                   MLA class above); a dim missing where no class default applies, a
 *                   MiniCPM3 v_head_dim to derive from a hidden_size that
 *                   num_attention_heads does not divide; a dim not an
 *                   integer (string, bool, null, 128.5), <= 0 or beyond int; an odd
 *                   qk_rope_head_dim; q_lora_rank / hidden_size present but not a
 *                   positive integer (q_lora_rank may be null); rope_scaling /
 *                   rope_parameters not an object or null, an unknown rope type, a
 *                   factor not a number > 0, yarn without factor, a non-numeric
 *                   mscale_all_dim, rope_scaling and rope_parameters disagreeing.
 *   MLAGEN_EUNSUPPORTED  a dim beyond the kernel limits above (message gives the limit
 *                   and its reason).
 *   MLAGEN_ENOMEM   out of memory. */
int mg_config_parse(const char *json, size_t len, const char *name, mg_shape *out, mg_diag *d);

/* Reads a config: `model` is a path to a config.json, a directory holding config.json
 * (an HF model folder), or a shipped name (deepseek-v3, deepseek-v2-lite, kimi-k2,
 * with or without ".json"; embedded in the binary). An existing path wins over a
 * shipped name. NULL or "" means the default, deepseek-v3.
 * Errors: MLAGEN_EIO for a name that is neither a file nor shipped (the message lists
 * the shipped names) or a file that cannot be read; MLAGEN_ELIMIT for a file over
 * 16 MiB; otherwise as mg_config_parse. */
int mg_config_load(const char *model, mg_shape *out, mg_diag *d);

/* Checks the five MLA dims of a shape filled by hand (the embedding API's model
 * description) with the rules mg_config_parse applies to a config: each dim > 0, an even
 * qk_rope_head_dim, and the kernel limits above. Messages name name and the config key,
 * as for a config ("<name>: key 'v_head_dim': ..."). Only the dims are read; s is not
 * changed.
 * Errors: MLAGEN_EINVAL s is NULL; MLAGEN_ECONFIG a dim <= 0 or an odd qk_rope_head_dim;
 * MLAGEN_EUNSUPPORTED a dim beyond the kernel limits (message gives the limit and its
 * reason). */
int mg_shape_validate(const mg_shape *s, const char *name, mg_diag *d);

/* Writes one line describing s into buf (n bytes, always NUL-terminated when n > 0), e.g.
 * "H=128 d_c=512 d_r=64 d_n=128 d_v=128 d_q=1536 scale=0.135234 (yarn factor 40,
 * mscale 1.3689)". Returns the length of the whole line, as snprintf does (a result
 * >= n means it was truncated), or -1 on a formatting error. */
int mg_shape_describe(const mg_shape *s, char *buf, size_t n);

/* The shipped model names, NULL-terminated. */
extern const char *const mg_config_shipped[];
#define MG_CONFIG_DEFAULT "deepseek-v3"
#endif
