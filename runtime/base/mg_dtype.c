/* mg_dtype.c: bf16 and f16 <-> f32 by bit pattern (see mg_dtype.h). */
#include "mg_dtype.h"

float mg_bf16_to_f32(uint16_t h) { return mg_f32_of_bits((uint32_t)h << 16); }

float mg_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in float */
    float v = (float)man * 5.9604644775390625e-08f;
    return mg_f32_of_bits(mg_bits_of_f32(v) | sign);
  }
  if (exp == 31) return mg_f32_of_bits(sign | 0x7f800000u | man << 13); /* inf, NaN */
  return mg_f32_of_bits(sign | (exp + 112) << 23 | man << 13);
}

uint16_t mg_f32_to_bf16(float x) {
  uint32_t u = mg_bits_of_f32(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

uint16_t mg_f32_to_f16(float x) {
  uint32_t u = mg_bits_of_f32(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff)); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* >= 65520: inf */
  if (a >= 0x38800000u) { /* >= 2^-14: normal */
    a -= 112u << 23;
    a += 0xfffu + ((a >> 13) & 1);
    return (uint16_t)(sign | (a >> 13));
  }
  uint32_t e = a >> 23;
  if (e < 102) return sign; /* < 2^-25 (float subnormals too): rounds to 0 */
  /* value = m * 2^(e-150); in units of 2^-24 that is m >> (126 - e) */
  uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e; /* 14..24 */
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  return (uint16_t)(sign | q); /* q == 0x400 is the smallest normal, as it should be */
}
