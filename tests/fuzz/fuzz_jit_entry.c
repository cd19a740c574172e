/* fuzz_jit_entry.c: libFuzzer harness for the JIT cache entry reader (mg_jit_entry_read).
 * Almost every mutation breaks the entry's SHA-256, so when the first byte is odd the
 * harness rewrites the checksum to match the mutated body first (the reader's later
 * checks then see the mutation). An entry it accepts must write back (mg_jit_entry_write)
 * and read again to the same cubin and figures. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mg_hash.h"
#include "mg_jit.h"

#define KEY "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define HEADER (8 + 4 + 4 + 8 + MG_HASH_BYTES)

static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int fix = data[0] & 1;
  data++, size--;
  uint8_t *f = malloc(size ? size : 1);
  if (!f) return 0;
  memcpy(f, data, size);
  if (fix && size >= HEADER) { /* sum over meta || cubin as the header sizes say */
    uint64_t body = size - HEADER, mlen = le(f + 12, 4);
    if (mlen <= body) {
      mg_hash_ctx *h = mg_hash_begin();
      mg_hash_add(h, f + HEADER, (size_t)body);
      mg_hash_end(h, f + 24);
    }
  }
  mg_cubin c;
  memset(&c, 0, sizeof c);
  int nomem = 0;
  if (!mg_jit_entry_read(f, size, KEY, &c, &nomem)) {
    mg_buf b;
    mg_buf_init(&b, 0);
    if (mg_jit_entry_write(&c, "k", "sm_90a", &b) == 0) {
      mg_cubin c2;
      memset(&c2, 0, sizeof c2);
      if (mg_jit_entry_read(b.data, b.len, KEY, &c2, &nomem) || c2.size != c.size ||
          memcmp(c2.data, c.data, c.size) != 0 || c2.report.registers != c.report.registers ||
          c2.report.spill_stores != c.report.spill_stores ||
          c2.report.smem_bytes != c.report.smem_bytes ||
          c2.report.wgmma_serialized != c.report.wgmma_serialized)
        abort(); /* an entry written from a read one does not read back */
      mg_cubin_free(&c2);
    }
    mg_buf_free(&b);
    mg_cubin_free(&c);
  }
  free(f);
  return 0;
}
