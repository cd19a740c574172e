/* mg_dtype.h: element types of tensors that cross mlagen's boundaries. */
#ifndef MG_DTYPE_H
#define MG_DTYPE_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum mg_dtype { MG_F32, MG_F64, MG_BF16, MG_F16 } mg_dtype;

/* Bytes per element. */
static inline size_t mg_dtype_size(mg_dtype t) {
  return t == MG_F64 ? 8 : t == MG_F32 ? 4 : 2;
}

/* Lower-case name as used on the command line: "f32", "f64", "bf16", "f16". */
static inline const char *mg_dtype_name(mg_dtype t) {
  static const char *const names[] = {"f32", "f64", "bf16", "f16"};
  return names[t];
}

/* Parses a name ("bf16", "fp16"/"f16", "f32"/"fp32", "f64"/"fp64"); returns 0 or -1. */
static inline int mg_dtype_parse(const char *s, mg_dtype *out) {
  static const struct { const char *name; mg_dtype t; } table[] = {
      {"f32", MG_F32}, {"fp32", MG_F32}, {"f64", MG_F64}, {"fp64", MG_F64},
      {"bf16", MG_BF16}, {"f16", MG_F16}, {"fp16", MG_F16}};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(s, table[i].name) == 0) {
      *out = table[i].t;
      return 0;
    }
  return -1;
}

/* The name kernel specs (mg_kernel_spec.dtype), templates and tuned stores give a 16-bit
 * type: "bf16" or "fp16"; NULL for f32 and f64, which no kernel stores. */
static inline const char *mg_dtype_spec_name(mg_dtype t) {
  return t == MG_BF16 ? "bf16" : t == MG_F16 ? "fp16" : NULL;
}

/* Parses a kernel spec's dtype: "bf16" or "fp16", nothing else; returns 0 or -1. */
static inline int mg_dtype_spec_parse(const char *s, mg_dtype *out) {
  for (int t = MG_BF16; t <= MG_F16; t++)
    if (s && strcmp(s, mg_dtype_spec_name((mg_dtype)t)) == 0) {
      *out = (mg_dtype)t;
      return 0;
    }
  return -1;
}

/* The 16-bit type a kernel spec's dtype names; MG_BF16, the default, when it names none. */
static inline mg_dtype mg_dtype_of_spec(const char *s) {
  mg_dtype t = MG_BF16;
  return mg_dtype_spec_parse(s, &t) ? MG_BF16 : t;
}

/* Element conversions by bit pattern (the safetensors reader and writer, the communicators'
 * reductions, the kernels' checks): exact where the target can hold the value. */
/* A float's bit pattern and back (memcpy: no aliasing rules broken). */
static inline float mg_f32_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t mg_bits_of_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

float mg_bf16_to_f32(uint16_t h);  /* exact */
float mg_f16_to_f32(uint16_t h);   /* exact, subnormals, inf and NaN included */
uint16_t mg_f32_to_bf16(float x);  /* round to nearest even; NaN stays a quiet NaN */
uint16_t mg_f32_to_f16(float x);   /* round to nearest even, to inf past 65504 */
#endif
