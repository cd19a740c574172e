/* mg_spec.c: which kernels a model needs, and tunable overrides. */
#include "mg_spec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg_plan.h"
#include "mlagen.h"

const char *const mg_spec_families[] = {"explicit_fwd",  "attn_fwd",     "attn_bwd_pre", "attn_bwd_dkdv",
                                        "attn_bwd_dq",   "dq_convert",   "a2a_pack",     "a2a_unpack",
                                        "expand_kv",     "split_dkv",    "concat_latent", "split_latent",
                                        "copy_cols",     "mqa_fwd",      "mqa_bwd_dkv",  "mqa_bwd_dq",
                                        "attn_fwd_sm90", "mqa_fwd_sm90", "attn_bwd_dkdv_sm90",
                                        "attn_bwd_dq_sm90", "mqa_bwd_dkv_sm90", "mqa_bwd_dq_sm90",
                                        NULL};

int mg_spec_family_on_request(const char *family) {
  for (const mg_arch_kernels *a = mg_arch_kernel_table; a->arch; a++)
    for (int i = 0; i < MG_SPEC_OP_FAMILIES && a->k.family[i]; i++)
      if (strcmp(family, a->k.family[i]) == 0 && strcmp(family, mg_op_family(a->k.op, i)) != 0)
        return 1;
  return 0;
}

const mg_op_kernels mg_op_kernel_table[] = {
    {MG_OP_ATTN_FWD, {"attn_fwd"}, {"k_packed=1"}},
    {MG_OP_ATTN_BWD, {"attn_bwd_pre", "attn_bwd_dkdv", "attn_bwd_dq"},
     {NULL, "k_packed=1 deterministic=1", "k_packed=1"}},
    {MG_OP_MQA_FWD, {"mqa_fwd"}, {NULL}},
    {MG_OP_MQA_BWD, {"attn_bwd_pre", "mqa_bwd_dkv", "mqa_bwd_dq"}, {NULL, "qsplit=1", NULL}},
    {MG_OP_EXPAND_KV, {"expand_kv"}, {"k_packed=1"}},
    {MG_OP_SPLIT_DKV, {"split_dkv"}, {"k_packed=1"}},
    {MG_OP_CONCAT_LATENT, {"concat_latent"}, {NULL}},
    {MG_OP_SPLIT_LATENT, {"split_latent"}, {NULL}},
    {MG_OP_COPY_COLS, {"copy_cols"}, {NULL}},
    {MG_SPEC_OP_A2A, {"a2a_pack", "a2a_unpack"}, {NULL}},
    {0, {NULL}, {NULL}},
};

/* sm_90a runs the TMA/wgmma explicit attention, forward and backward: attn_fwd_sm90, and
 * attn_bwd_pre (portable) + attn_bwd_dkdv_sm90 + attn_bwd_dq_sm90 with the plans' settings as
 * the mma.sync pair's (issue 14: the sm_90a family for sm_90a targets). Both are checked per
 * element on the host executor's sm_90a emulation (tests/test_attn_fwd_sm90.c,
 * test_attn_bwd_sm90.c, test_cuda_exec sm90 through every explicit-attention form) and
 * neither has run on a device yet: tests/gpu's `sm90` step checks and times them beside the
 * mma.sync kernels first; MLAGEN_MMA_SYNC=1 gives the mma.sync families back. A shape a row's
 * family refuses (d_qk not 64/128/192/256, d_v not an N of its wgmma) runs the portable one.
 * The absorbed rows (mqa_fwd_sm90; mqa_bwd_dkv_sm90 + mqa_bwd_dq_sm90 after attn_bwd_pre) are
 * on request: their maps are bound (mg_sm90_launch_tmaps) and test_cuda_exec sm90's absorbed
 * plan matched the CPU executor through mqa_fwd_sm90 with the row on, but they stay beside
 * the tuned mqa_fwd / mqa_bwd_* (the H200 store's entries) until a GPU has timed them
 * (bench --sm90 does). */
const mg_arch_kernels mg_arch_kernel_table[] = {
    {"sm_90a", {MG_OP_ATTN_FWD, {"attn_fwd_sm90"}, {"k_packed=1"}}, 0},
    {"sm_90a", {MG_OP_MQA_FWD, {"mqa_fwd_sm90"}, {NULL}}, 1},
    {"sm_90a",
     {MG_OP_ATTN_BWD, {"attn_bwd_pre", "attn_bwd_dkdv_sm90", "attn_bwd_dq_sm90"},
      {NULL, "k_packed=1 deterministic=1", "k_packed=1"}},
     0},
    {"sm_90a", {MG_OP_MQA_BWD, {"attn_bwd_pre", "mqa_bwd_dkv_sm90", "mqa_bwd_dq_sm90"}, {NULL, NULL, NULL}}, 1},
    {NULL, {0, {NULL}, {NULL}}, 0},
};

/* The value of s's override `name`, or -1 when it has none. */
static long config_of(const mg_kernel_spec *s, const char *name) {
  for (int i = 0; i < s->n_config; i++)
    if (!strcmp(s->config[i].name, name)) return s->config[i].value;
  return -1;
}

/* The fixed settings of family in the tables (NULL: none). */
static const char *fixed_of(const char *family) {
  for (const mg_op_kernels *t = mg_op_kernel_table; t->family[0]; t++)
    for (int i = 0; i < MG_SPEC_OP_FAMILIES && t->family[i]; i++)
      if (!strcmp(family, t->family[i]) && t->fixed[i]) return t->fixed[i];
  for (const mg_arch_kernels *a = mg_arch_kernel_table; a->arch; a++)
    for (int i = 0; i < MG_SPEC_OP_FAMILIES && a->k.family[i]; i++)
      if (!strcmp(family, a->k.family[i]) && a->k.fixed[i]) return a->k.fixed[i];
  return NULL;
}

const char *mg_op_family(int op, int i) {
  if (i < 0 || i >= MG_SPEC_OP_FAMILIES) return NULL;
  for (const mg_op_kernels *t = mg_op_kernel_table; t->family[0]; t++)
    if (t->op == op) return t->family[i];
  return NULL;
}

static const mg_op_kernels *arch_row(int op, const char *arch) {
  if (!arch || !*arch) return NULL;
  for (const mg_arch_kernels *a = mg_arch_kernel_table; a->arch; a++)
    if (a->k.op == op && !a->on_request && strcmp(a->arch, arch) == 0) return &a->k;
  return NULL;
}

const char *mg_op_family_arch(int op, int i, const char *arch) {
  const mg_op_kernels *r = arch_row(op, arch);
  if (!r) return mg_op_family(op, i);
  return i < 0 || i >= MG_SPEC_OP_FAMILIES ? NULL : r->family[i];
}

const char *mg_family_portable(const char *family) {
  for (const mg_arch_kernels *a = mg_arch_kernel_table; a->arch; a++)
    for (int i = 0; i < MG_SPEC_OP_FAMILIES && a->k.family[i]; i++)
      if (strcmp(family, a->k.family[i]) == 0 && mg_op_family(a->k.op, i)) return mg_op_family(a->k.op, i);
  return family;
}

int mg_family_runs_on(const char *family, const char *arch) {
  if (!strcmp(mg_family_portable(family), family)) return 1;
  for (const mg_arch_kernels *a = mg_arch_kernel_table; a->arch; a++)
    for (int i = 0; i < MG_SPEC_OP_FAMILIES && a->k.family[i]; i++)
      if (arch && !strcmp(a->arch, arch) && !strcmp(a->k.family[i], family)) return 1;
  return 0;
}

int mg_spec_mma_sync_forced(int *on, mg_diag *d) {
  static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no", "off"};
  const char *v = getenv("MLAGEN_MMA_SYNC");
  *on = 0;
  if (!v || !*v) return 0;
  char low[8];
  size_t n = 0;
  for (; v[n] && n + 1 < sizeof low; n++) low[n] = (char)(v[n] >= 'A' && v[n] <= 'Z' ? v[n] - 'A' + 'a' : v[n]);
  low[n] = '\0';
  for (int i = 0; i < 4 && !v[n]; i++) {
    if (!strcmp(low, yes[i])) return *on = 1, 0;
    if (!strcmp(low, no[i])) return 0;
  }
  return mg_diag_set(d, MLAGEN_EINVAL, "MLAGEN_MMA_SYNC=%s: expected 1, true, yes or on (the "
                     "mma.sync families) or 0, false, no, off or empty (the device's)", v);
}

int mg_spec_to_arch(const mg_kernel_spec *s, const char *arch, mg_kernel_spec *out) {
  const char *to = NULL;
  for (const mg_op_kernels *t = mg_op_kernel_table; t->family[0] && !to; t++)
    for (int i = 0; i < MG_SPEC_OP_FAMILIES && t->family[i] && !to; i++)
      if (strcmp(s->family, t->family[i]) == 0) {
        const char *f = mg_op_family_arch(t->op, i, arch);
        if (f && strcmp(f, s->family) != 0) to = f;
      }
  const int split = mg_spec_split_keys(s);
  if (out != s) *out = *s;
  snprintf(out->arch, sizeof out->arch, "%s", arch ? arch : "");
  if (!to) return 0;
  snprintf(out->family, sizeof out->family, "%s", to);
  out->n_config = 0;
  mg_spec_step_tunables(out, split); /* the step's key layout carries over */
  return 1;
}

int mg_spec_for_model(const mg_shape *shape, int sp, const char *dtype, mg_kernel_spec *specs,
                      int max, int *n, mg_diag *d) {
  return mg_spec_for_plan(shape, sp, 0, dtype, specs, max, n, d);
}

int mg_spec_for_plan(const mg_shape *shape, int sp, int head_groups, const char *dtype,
                     mg_kernel_spec *specs, int max, int *n, mg_diag *d) {
  *n = 0;
  if (sp < 1 || sp > shape->heads || shape->heads % sp != 0) {
    /* the Ulysses forms' refusal, in mg_plan_args_check's words (S = H P: every degree
     * dividing H divides S, so its list of degrees is H's divisors) */
    const mg_plan_args a = {.shape = shape, .form = MG_FORM_EXPLICIT, .sp = sp, .batch = 1,
                            .seq = (int64_t)shape->heads * (sp > 0 ? sp : 1), .dtype = MG_BF16};
    const int rc = mg_plan_args_check(&a, &mg_plan_names_no_seq, d);
    return rc ? rc : mg_diag_set(d, MLAGEN_EINVAL, "sequence-parallel degree %d", sp);
  }
  mg_dtype t16;
  if (mg_dtype_spec_parse(dtype, &t16))
    return mg_diag_set(d, MLAGEN_EINVAL, "dtype '%s': expected bf16 or fp16", dtype);
  const int Hl = shape->heads / sp;
  if (head_groups < 0 || head_groups > MG_PLAN_MAX_HEAD_GROUPS || (head_groups && Hl % head_groups))
    return mg_diag_set(d, MLAGEN_EINVAL, "head_groups = %d must divide the %d heads of a rank "
                       "(H / P) and be in [1, %d]", head_groups, Hl, MG_PLAN_MAX_HEAD_GROUPS);
  const int G = Hl / (head_groups ? head_groups : mg_plan_default_head_groups(Hl));
  /* laga-cp attends with all H heads at any P, in its default groups (mg_plan.c) */
  const int Gcp = shape->heads / mg_plan_default_head_groups(shape->heads);
  /* every family at H / P heads; then the absorbed backward's delta (attn_bwd_pre over
   * o_lat, d_c wide); for LAGA-F's group and laga-cp's group, the explicit attention
   * kernels at the group's heads; and the K/V expansion and its backward at the heads of
   * every workspace they fill: the groups', and all H (the Ulysses forms expand before
   * the all-to-all) */
  /* Key layouts (mg_step.split_keys): the listed families at H / P get the packed keys of
   * the explicit plan (mg_spec_plan_tunables); the LAGA plans run split keys (k_packed = 0)
   * at H / P (laga, laga-r) and at their groups' heads; the explicit plan expands packed K
   * for all H heads. */
  const char *const attn_families[] = {mg_op_family(MG_OP_ATTN_FWD, 0), mg_op_family(MG_OP_ATTN_BWD, 0),
                                       mg_op_family(MG_OP_ATTN_BWD, 1), mg_op_family(MG_OP_ATTN_BWD, 2)};
  const char *const kv_families[] = {mg_op_family(MG_OP_EXPAND_KV, 0), mg_op_family(MG_OP_SPLIT_DKV, 0)};
  struct extra_spec { const char *family; int heads, latent_v, split; } extra[1 + 4 * 6];
  int n_extra = 0;
  extra[n_extra++] = (struct extra_spec){mg_op_family(MG_OP_MQA_BWD, 0), Hl, 1, 0};
  const int groups[4] = {Hl, G, Gcp, shape->heads};
  for (int k = 0; k < 4; k++) {
    const int split = k < 3; /* the LAGA family's heads; all H: explicit's expansion */
    if (k > 0 && groups[k] == Hl) continue; /* listed already */
    for (int f = 0; f < 4 && split; f++)
      extra[n_extra++] = (struct extra_spec){attn_families[f], groups[k], 0, 1};
    for (int f = 0; f < 2; f++)
      extra[n_extra++] = (struct extra_spec){kv_families[f], groups[k], 0, split};
  }
  const int n_fam = (int)(sizeof mg_spec_families / sizeof *mg_spec_families) - 1;
  for (int i = 0; i < n_fam + n_extra; i++) {
    if (i < n_fam && mg_spec_family_on_request(mg_spec_families[i])) continue;
    for (int causal = 1; causal >= 0; causal--) {
      if (*n >= max) return mg_diag_set(d, MLAGEN_EINVAL, "more than %d kernel specs", max);
      mg_kernel_spec *s = &specs[(*n)++];
      memset(s, 0, sizeof *s);
      snprintf(s->family, sizeof s->family, "%s", i < n_fam ? mg_spec_families[i] : extra[i - n_fam].family);
      s->heads = i < n_fam ? Hl : extra[i - n_fam].heads;
      s->d_n = shape->qk_nope_head_dim;
      s->d_r = shape->qk_rope_head_dim;
      s->d_v = shape->v_head_dim;
      s->d_c = shape->kv_lora_rank;
      if (i >= n_fam && extra[i - n_fam].latent_v) s->d_n = s->d_v = shape->kv_lora_rank;
      snprintf(s->dtype, sizeof s->dtype, "%s", dtype);
      s->causal = causal;
      mg_spec_step_tunables(s, i >= n_fam && extra[i - n_fam].split);
      for (int j = 0; j < *n - 1; j++) /* an extra that equals a spec already there (d_n = d_v */
        if (memcmp(&specs[j], s, sizeof *s) == 0) { /* = d_c, one head group, or both forms' */
          (*n)--;
          break;
        }
    }
  }
  return 0;
}

int mg_spec_split_keys(const mg_kernel_spec *s) {
  return mg_spec_keyed(s->family) && config_of(s, "k_packed") == 0;
}

int mg_spec_keyed(const char *family) {
  const char *f = fixed_of(family);
  return f && strstr(f, "k_packed=") != NULL;
}

void mg_spec_step_tunables(mg_kernel_spec *s, int split_keys) {
  if (mg_spec_keyed(s->family)) mg_spec_set(s, split_keys ? "k_packed=0" : "k_packed=1", NULL);
  mg_spec_plan_tunables(s);
}

/* The rows of both kernel tables (the op table's, then the arch table's) into rows[0..64);
 * returns their count. */
static int table_rows(const mg_op_kernels *rows[64]) {
  int n = 0;
  for (const mg_op_kernels *t = mg_op_kernel_table; t->family[0] && n < 64; t++) rows[n++] = t;
  for (const mg_arch_kernels *a = mg_arch_kernel_table; a->arch && n < 64; a++) rows[n++] = &a->k;
  return n;
}

void mg_spec_plan_tunables(mg_kernel_spec *s) {
  const int split = mg_spec_split_keys(s);
  const mg_op_kernels *rows[64];
  const int n = table_rows(rows);
  for (int r = 0; r < n; r++)
    for (int i = 0; i < MG_SPEC_OP_FAMILIES && rows[r]->family[i]; i++) {
      const mg_op_kernels *t = rows[r];
      if (strcmp(s->family, t->family[i]) != 0 || !t->fixed[i]) continue;
      char buf[128]; /* "a=1 b=2": each assignment in turn */
      snprintf(buf, sizeof buf, "%s", t->fixed[i]);
      for (char *save = NULL, *a = strtok_r(buf, " ", &save); a; a = strtok_r(NULL, " ", &save))
        mg_spec_set(s, a, NULL);
      if (split) mg_spec_set(s, "k_packed=0", NULL); /* a split-key step's, kept */
      return; /* a family's settings are the same wherever the table lists it */
    }
}

int mg_spec_override_check(const char *assignment, mg_diag *d) {
  const char *eq = strchr(assignment, '='), *dot = strchr(assignment, '.');
  const char *name = dot && (!eq || dot < eq) ? dot + 1 : assignment;
  const size_t flen = name == assignment ? 0 : (size_t)(dot - assignment);
  const size_t nlen = eq && eq > name ? (size_t)(eq - name) : strlen(name);
  char fams[256] = "";
  const mg_op_kernels *rows[64];
  const int n = table_rows(rows);
  for (int r = 0; r < n; r++)
    for (int i = 0; i < MG_SPEC_OP_FAMILIES && rows[r]->family[i]; i++) {
      const char *fam = rows[r]->family[i], *fx = rows[r]->fixed[i];
      if (!fx || (flen && (strlen(fam) != flen || strncmp(fam, assignment, flen)))) continue;
      for (const char *p = fx; *p; p += strcspn(p, " "), p += *p == ' ') /* "a=1 b=2" */
        if (strncmp(p, name, nlen) == 0 && p[nlen] == '=' && !strstr(fams, fam)) {
          const size_t used = strlen(fams);
          snprintf(fams + used, sizeof fams - used, "%s%s", used ? ", " : "", fam);
        }
    }
  if (!fams[0]) return 0;
  const int layout = nlen == 8 && !strncmp(name, "k_packed", 8);
  return mg_diag_set(d, MLAGEN_EINVAL,
                     "'%s': the plans fix %.*s for %s, so it cannot be overridden: a kernel with "
                     "another value is one no plan step runs%s",
                     assignment, (int)nlen, name, fams,
                     layout ? " (k_packed is the step's key layout: 1 for the explicit form, 0 "
                              "for the LAGA forms; generate and compile render both where the "
                              "plans use them)" : "");
}

int mg_spec_set(mg_kernel_spec *s, const char *assignment, mg_diag *d) {
  /* "family.name=value" applies to that family only */
  const char *dot = strchr(assignment, '.'), *eq0 = strchr(assignment, '=');
  if (dot && eq0 && dot < eq0) {
    size_t flen = (size_t)(dot - assignment);
    int known = 0;
    for (const char *const *f = mg_spec_families; *f; f++)
      known |= strlen(*f) == flen && strncmp(*f, assignment, flen) == 0;
    if (!known)
      return mg_diag_set(d, MLAGEN_EINVAL, "'%s': no kernel family '%.*s'", assignment, (int)flen,
                         assignment);
    if (strlen(s->family) != flen || strncmp(s->family, assignment, flen) != 0) return 0;
    assignment = dot + 1;
  }
  const char *eq = strchr(assignment, '=');
  size_t klen = eq ? (size_t)(eq - assignment) : 0;
  if (!eq || klen == 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "'%s': expected tunable=value, e.g. block_m=64", assignment);
  if (klen >= sizeof s->config[0].name)
    return mg_diag_set(d, MLAGEN_EINVAL, "'%.*s': tunable names are at most %zu characters",
                       (int)klen, assignment, sizeof s->config[0].name - 1);
  char *end = NULL;
  errno = 0;
  const char *num = eq + 1;
  long v = strtol(num, &end, 10);
  if (errno || end == num || *end != '\0' || !(*num == '-' || (*num >= '0' && *num <= '9')))
    return mg_diag_set(d, MLAGEN_EINVAL, "'%s': the value must be an integer", assignment);
  int slot = s->n_config;
  for (int i = 0; i < s->n_config; i++)
    if (strncmp(s->config[i].name, assignment, klen) == 0 && s->config[i].name[klen] == '\0') slot = i;
  if (slot == MG_SPEC_MAX_CONFIG)
    return mg_diag_set(d, MLAGEN_EINVAL, "more than %d tunable overrides", MG_SPEC_MAX_CONFIG);
  memcpy(s->config[slot].name, assignment, klen);
  s->config[slot].name[klen] = '\0';
  s->config[slot].value = v;
  if (slot == s->n_config) s->n_config++;
  return 0;
}
