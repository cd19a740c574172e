/* fuzz_safetensors.c: libFuzzer harness for the safetensors reader (mg_st_open_mem and
 * the typed reads). Every tensor of a file it accepts is read whole as f32 and f64, and
 * its first and last rows along each dimension: all must succeed. */
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
      size_t numel = t->nbytes / mg_dtype_size(t->dtype);
      double *x = malloc((numel ? numel : 1) * sizeof *x);
      float *y = malloc((numel ? numel : 1) * sizeof *y);
      if (x && y) {
        if (mg_st_read_f64(f, t->name, t->ndim, t->shape, x, &d) ||
            mg_st_read_f32(f, t->name, t->ndim, t->shape, y, &d))
          abort(); /* a tensor the reader accepted cannot be read */
        for (int k = 0; k < t->ndim; k++)
          if (t->shape[k] > 0 &&
              (mg_st_read_f64_rows(f, t->name, t->ndim, t->shape, k, 0, 1, x, &d) ||
               mg_st_read_f32_rows(f, t->name, t->ndim, t->shape, k, t->shape[k] - 1, 1, y, &d)))
            abort();
      }
      free(x);
      free(y);
    }
    mg_st_meta(f, "format");
    mg_st_close(f);
  }
  mg_diag_clear(&d);
  return 0;
}
