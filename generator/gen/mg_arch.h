/* mg_arch.h: per-architecture facts, the one owner of each: the opt-in shared memory one
 * block may use (static + dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize; CUDA C++
 * Programming Guide, "Technical Specifications per Compute Capability") and the residency
 * limits the tuner's occupancy pruning uses. Read by the tuner (generator/gen/mg_tune.c),
 * the templates (the Lua state's arch_smem_optin(name), set by generator/gen/mg_lua.c, which
 * prelude.lua's smem_limit calls) and the host executor's launch check
 * (tests/host/cuda_host.cpp). Header only, C and C++. */
#ifndef MG_ARCH_H
#define MG_ARCH_H

typedef struct mg_arch_facts {
  int sm;         /* compute capability major * 10 + minor: 80, 90, ... */
  long smem;      /* opt-in shared memory per block, bytes */
  int max_warps;  /* resident warps per SM (0: no occupancy table, the tuner refuses it) */
  int max_ctas;   /* resident CTAs per SM */
} mg_arch_facts;

static const mg_arch_facts mg_arch_table[] = {
    {70, 96 * 1024, 0, 0},    {72, 96 * 1024, 0, 0},     {75, 64 * 1024, 0, 0},
    {80, 163 * 1024, 64, 32}, /* A100 */
    {86, 99 * 1024, 48, 16},  /* GA10x */
    {87, 163 * 1024, 48, 16}, /* Orin */
    {89, 99 * 1024, 48, 24},  /* Ada */
    {90, 227 * 1024, 64, 32}, /* H100/H200 */
    {100, 227 * 1024, 64, 32}, /* B200 */
    {101, 227 * 1024, 0, 0},  {103, 227 * 1024, 64, 32}, {110, 227 * 1024, 0, 0},
    {120, 99 * 1024, 48, 32}, /* RTX Blackwell */
    {121, 99 * 1024, 0, 0},
};
#define MG_ARCH_COUNT ((int)(sizeof mg_arch_table / sizeof mg_arch_table[0]))

/* The oldest architecture mlagen's kernels run on: they use bf16 mma.sync.m16n8k16 and
 * cp.async (sm_80). Callers refuse an older name (mg_arch_sm below MG_ARCH_MIN_SM, listed in
 * the table or not) as too old. */
#define MG_ARCH_MIN_SM 80
/* Their refusal of such a name (printf format: the name, then MG_ARCH_MIN_SM). */
#define MG_ARCH_TOO_OLD_FMT "architecture '%s': mlagen's kernels need sm_%d or newer (bf16 mma.sync, cp.async)"

/* The facts of sm (e.g. 90 for sm_90 and sm_90a), or NULL for an architecture not listed. */
static inline const mg_arch_facts *mg_arch_find(int sm) {
  for (int i = 0; i < MG_ARCH_COUNT; i++)
    if (mg_arch_table[i].sm == sm) return &mg_arch_table[i];
  return 0;
}

/* The compute capability (major * 10 + minor) an architecture name says: "sm_" then 2 or 3
 * digits, optionally one feature suffix: "a" (architecture-specific, sm_90 and newer) or
 * "f" (family-specific, sm_100 and newer), as NVRTC takes them ("sm_80" 80, "sm_90a" 90,
 * "sm_100f" 100, "sm_60" 60); -1 for anything else ("sm_80a", "sm_90f", "sm_090"). Listed in
 * mg_arch_table or not. */
static inline int mg_arch_sm(const char *name) {
  if (!name || name[0] != 's' || name[1] != 'm' || name[2] != '_' || name[3] == '0') return -1;
  const char *p = name + 3;
  int sm = 0, digits = 0;
  for (; *p >= '0' && *p <= '9' && digits < 5; p++, digits++) sm = sm * 10 + (*p - '0');
  if (digits < 2 || digits > 3 || (*p && ((*p != 'a' && *p != 'f') || p[1]))) return -1;
  if ((*p == 'a' && sm < 90) || (*p == 'f' && sm < 100)) return -1; /* NVRTC has no such target */
  return sm;
}

/* The facts of an architecture name (mg_arch_sm's rule); NULL for anything else or an
 * architecture not listed. */
static inline const mg_arch_facts *mg_arch_named(const char *name) {
  const int sm = mg_arch_sm(name);
  return sm < 0 ? 0 : mg_arch_find(sm);
}
#endif
