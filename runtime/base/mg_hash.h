/* mg_hash.h: SHA-256 (OpenSSL libcrypto) for cache keys and content checksums. */
#ifndef MG_HASH_H
#define MG_HASH_H
#include <stddef.h>
#include <stdint.h>

#define MG_HASH_BYTES 32
#define MG_HASH_HEX (2 * MG_HASH_BYTES + 1)

typedef struct mg_hash_ctx mg_hash_ctx;

/* Incremental hashing. mg_hash_begin returns NULL when out of memory; a NULL context
 * is accepted by the other calls, and mg_hash_end then returns MLAGEN_ENOMEM. */
mg_hash_ctx *mg_hash_begin(void);
void mg_hash_add(mg_hash_ctx *h, const void *p, size_t n);
/* Adds a length-prefixed field, so ("ab","c") and ("a","bc") hash differently. */
void mg_hash_field(mg_hash_ctx *h, const void *p, size_t n);
void mg_hash_field_str(mg_hash_ctx *h, const char *s);
/* Finishes and frees h; writes the digest. Returns 0 or MLAGEN_ENOMEM. */
int mg_hash_end(mg_hash_ctx *h, uint8_t out[MG_HASH_BYTES]);

/* One-shot digest. */
int mg_hash(const void *p, size_t n, uint8_t out[MG_HASH_BYTES]);
/* Lower-case hex of a digest into out (MG_HASH_HEX bytes with the NUL). */
void mg_hash_hex(const uint8_t h[MG_HASH_BYTES], char out[MG_HASH_HEX]);
#endif
