/* mg_hash.c: SHA-256 through OpenSSL's EVP interface. */
#include "mg_hash.h"

#include <openssl/evp.h>

#include "mlagen.h"

struct mg_hash_ctx {
  EVP_MD_CTX *md;
  int failed;
};

mg_hash_ctx *mg_hash_begin(void) {
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  if (!md) return NULL;
  if (EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
    EVP_MD_CTX_free(md);
    return NULL;
  }
  mg_hash_ctx *h = OPENSSL_zalloc(sizeof *h);
  if (!h) {
    EVP_MD_CTX_free(md);
    return NULL;
  }
  h->md = md;
  return h;
}

void mg_hash_add(mg_hash_ctx *h, const void *p, size_t n) {
  if (h && n && EVP_DigestUpdate(h->md, p, n) != 1) h->failed = 1;
}

void mg_hash_field(mg_hash_ctx *h, const void *p, size_t n) {
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
  mg_hash_add(h, len, sizeof len);
  mg_hash_add(h, p, n);
}

void mg_hash_field_str(mg_hash_ctx *h, const char *s) {
  size_t n = 0;
  if (s)
    while (s[n]) n++;
  mg_hash_field(h, s ? s : "", n);
}

int mg_hash_end(mg_hash_ctx *h, uint8_t out[MG_HASH_BYTES]) {
  if (!h) return MLAGEN_ENOMEM;
  unsigned int n = 0;
  int ok = !h->failed && EVP_DigestFinal_ex(h->md, out, &n) == 1 && n == MG_HASH_BYTES;
  EVP_MD_CTX_free(h->md);
  OPENSSL_free(h);
  return ok ? 0 : MLAGEN_ENOMEM;
}

int mg_hash(const void *p, size_t n, uint8_t out[MG_HASH_BYTES]) {
  mg_hash_ctx *h = mg_hash_begin();
  mg_hash_add(h, p, n);
  return mg_hash_end(h, out);
}

void mg_hash_hex(const uint8_t h[MG_HASH_BYTES], char out[MG_HASH_HEX]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < MG_HASH_BYTES; i++) {
    out[2 * i] = digits[h[i] >> 4];
    out[2 * i + 1] = digits[h[i] & 15];
  }
  out[2 * MG_HASH_BYTES] = '\0';
}
