/* fuzz_safetensors.c: libFuzzer harness for the safetensors reader (mg_st_open_mem and
 * the typed reads). Every float tensor of a file it accepts is read whole as f32 and f64,
 * and its first and last rows along each dimension: all must succeed, and its read as
 * integers must be refused; every integer tensor (I32, I64) is read whole as int64 and
 * refused as f64. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "mg_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mg_st_file *f = NULL;
  mg_diag d = MG_DIAG_INIT;
  if (mg_st_open_mem(data, size, "fuzz.safetensors", &f, &d) == 0) {
    for (int i = 0; i < mg_st_count(f); i++) {
      const mg_st_tensor *t = mg_st_at(f, i);
      if (!t || mg_st_find(f, t->name) != t) abort();
      size_t numel = t->nbytes / (t->int_bytes ? (size_t)t->int_bytes : mg_dtype_size(t->dtype));
      double *x = malloc((numel ? numel : 1) * sizeof *x);
      float *y = malloc((numel ? numel : 1) * sizeof *y);
      int64_t *z = malloc((numel ? numel : 1) * sizeof *z);
      if (x && y && z && t->int_bytes) {
        /* an integer tensor (I32, I64): read as int64, refused by the float reads */
        if (mg_st_read_i64(f, t->name, t->ndim, t->shape, z, &d) ||
            !mg_st_read_f64(f, t->name, t->ndim, t->shape, x, &d))
          abort();
      } else if (x && y && z) {
        if (mg_st_read_f64(f, t->name, t->ndim, t->shape, x, &d) ||
            mg_st_read_f32(f, t->name, t->ndim, t->shape, y, &d) ||
            !mg_st_read_i64(f, t->name, t->ndim, t->shape, z, &d))
          abort(); /* a float tensor the reader accepted cannot be read, or reads as integers */
        for (int k = 0; k < t->ndim; k++)
          if (t->shape[k] > 0 &&
              (mg_st_read_f64_rows(f, t->name, t->ndim, t->shape, k, 0, 1, x, &d) ||
               mg_st_read_f32_rows(f, t->name, t->ndim, t->shape, k, t->shape[k] - 1, 1, y, &d)))
            abort();
      }
      mg_diag_clear(&d); /* the refusals' messages */
      free(z);
      free(x);
      free(y);
    }
    mg_st_meta(f, "format");
    mg_st_close(f);
  }
  mg_diag_clear(&d);
  return 0;
}
