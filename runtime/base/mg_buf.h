/* mg_buf.h: a growable byte buffer with a hard size cap (after curl's dynbuf).
 *
 * The contents are always NUL-terminated, so data can be used as a C string when
 * no NUL was added. Every add returns 0 or MLAGEN_ENOMEM (allocation failed, or the
 * buffer would exceed its cap); on failure the buffer is left unchanged. */
#ifndef MG_BUF_H
#define MG_BUF_H
#include <stdarg.h>
#include <stddef.h>

typedef struct mg_buf {
  char *data;  /* NULL until the first add */
  size_t len;  /* bytes in use, excluding the terminating NUL */
  size_t cap;  /* bytes allocated */
  size_t max;  /* the cap on len */
} mg_buf;

#define MG_BUF_DEFAULT_MAX ((size_t)256 << 20) /* 256 MiB */

void mg_buf_init(mg_buf *b, size_t max);
void mg_buf_free(mg_buf *b);
void mg_buf_reset(mg_buf *b); /* len = 0, memory kept */
int mg_buf_add(mg_buf *b, const void *p, size_t n);
int mg_buf_adds(mg_buf *b, const char *s);
int mg_buf_addf(mg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int mg_buf_vaddf(mg_buf *b, const char *fmt, va_list ap);
/* The contents as a C string ("" when empty); valid until the next add or free. */
const char *mg_buf_str(const mg_buf *b);
/* Hands the allocation to the caller (free() it) and re-initializes b. Never NULL
 * unless allocation fails. */
char *mg_buf_take(mg_buf *b, size_t *len);
#endif
