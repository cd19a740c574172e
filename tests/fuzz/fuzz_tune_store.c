/* fuzz_tune_store.c: libFuzzer harness for the tuned-store reader (mg_tune_store_parse).
 * A store it accepts must serialize (mg_tune_store_json) and read back to the same
 * number of entries. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mg_tune_store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mg_tune_store s;
  mg_diag d = MG_DIAG_INIT;
  if (mg_tune_store_parse((const char *)data, size, "fuzz.json", &s, &d) == 0) {
    mg_tune_header_mismatch(&s.header, &s.header);
    char *text = mg_tune_store_json(&s);
    if (text) {
      mg_tune_store t;
      if (mg_tune_store_parse(text, strlen(text), "again.json", &t, &d) != 0 || t.n != s.n)
        abort(); /* what the writer wrote, the reader refuses */
      for (int i = 0; i < s.n; i++)
        if (!mg_tune_entry_same_key(&s.entries[i], &t.entries[i])) abort();
      mg_tune_store_free(&t);
      free(text);
    }
    mg_tune_store_free(&s);
  }
  mg_diag_clear(&d);
  return 0;
}
