/* kernel_test_util.h: what the generated-kernel tests share: 16-bit element conversions
 * (the safetensors module's, tested bit-exactly there) and the seeded normal generator.
 * Header-only; each test includes it once. */
#ifndef MG_KERNEL_TEST_UTIL_H
#define MG_KERNEL_TEST_UTIL_H
#include <math.h>
#include <stdint.h>

#include "mg_safetensors.h"

typedef uint16_t e16; /* storage of __nv_bfloat16 or __half */
typedef e16 bf16;

static inline float bf16_to_float(e16 x) { return mg_st_bf16_to_f32(x); }
static inline e16 float_to_bf16(float f) { return mg_st_f32_to_bf16(f); } /* nearest even */
static inline float half_to_float(e16 h) { return mg_st_f16_to_f32(h); }
static inline e16 float_to_half(float f) { return mg_st_f32_to_f16(f); }  /* nearest even */

/* Seeded inputs: MLAGEN_TEST_SEED (printed by each test) reproduces a run. */
static uint64_t rng_state;
static uint64_t g_test_seed;

/* A standard normal sample: Box-Muller on a 64-bit LCG. */
static inline double randn(void) {
  double u[2];
  for (int i = 0; i < 2; i++) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    u[i] = ((rng_state >> 11) + 0.5) / 9007199254740992.0;
  }
  return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}
#endif
