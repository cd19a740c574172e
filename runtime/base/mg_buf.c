/* mg_buf.c: growable, capped byte buffer. */
#include "mg_buf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlagen.h"

void mg_buf_init(mg_buf *b, size_t max) {
  b->data = NULL;
  b->len = b->cap = 0;
  b->max = max ? max : MG_BUF_DEFAULT_MAX;
}

void mg_buf_free(mg_buf *b) {
  free(b->data);
  mg_buf_init(b, b->max);
}

void mg_buf_reset(mg_buf *b) {
  b->len = 0;
  if (b->data) b->data[0] = '\0';
}

static int reserve(mg_buf *b, size_t n) {
  if (n > b->max - b->len) return MLAGEN_ENOMEM;
  size_t need = b->len + n + 1;
  if (need <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
  char *p = realloc(b->data, cap);
  if (!p) return MLAGEN_ENOMEM;
  b->data = p;
  b->cap = cap;
  return 0;
}

int mg_buf_add(mg_buf *b, const void *p, size_t n) {
  if (reserve(b, n)) return MLAGEN_ENOMEM;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
  return 0;
}

int mg_buf_adds(mg_buf *b, const char *s) { return mg_buf_add(b, s, strlen(s)); }

int mg_buf_vaddf(mg_buf *b, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) return MLAGEN_EINVAL;
  if (reserve(b, (size_t)n)) return MLAGEN_ENOMEM;
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
  return 0;
}

int mg_buf_addf(mg_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = mg_buf_vaddf(b, fmt, ap);
  va_end(ap);
  return rc;
}

const char *mg_buf_str(const mg_buf *b) { return b->data ? b->data : ""; }

char *mg_buf_take(mg_buf *b, size_t *len) {
  char *p = b->data;
  if (!p) p = calloc(1, 1);
  if (len) *len = b->len;
  b->data = NULL;
  b->len = b->cap = 0;
  return p;
}
