/* mg_dtype.h: element types of tensors that cross mlagen's boundaries. */
#ifndef MG_DTYPE_H
#define MG_DTYPE_H
#include <stddef.h>
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
#endif
