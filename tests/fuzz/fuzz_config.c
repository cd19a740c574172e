/* fuzz_config.c: libFuzzer harness for the model config reader (mg_config_parse: a
 * Hugging Face config.json -> mg_shape, limits checked). A shape it accepts must
 * validate again and describe itself. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "mg_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mg_shape s;
  mg_diag d = MG_DIAG_INIT;
  if (mg_config_parse((const char *)data, size, "fuzz.json", &s, &d) == 0) {
    char buf[512];
    if (mg_shape_validate(&s, "fuzz.json", &d) != 0) abort(); /* accepted, then refused */
    mg_shape_describe(&s, buf, sizeof buf);
  }
  mg_diag_clear(&d);
  return 0;
}
