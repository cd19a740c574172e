/* mg_diag.c: status messages. */
#include "mg_diag.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlagen.h"

static char *vformat(const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) return NULL;
  char *s = malloc((size_t)n + 1);
  if (s) vsnprintf(s, (size_t)n + 1, fmt, ap);
  return s;
}

int mg_diag_set(mg_diag *d, int status, const char *fmt, ...) {
  if (!d) return status;
  va_list ap;
  va_start(ap, fmt);
  char *s = vformat(fmt, ap);
  va_end(ap);
  free(d->msg);
  d->msg = s;
  d->status = status;
  return status;
}

int mg_diag_prefix(mg_diag *d, const char *fmt, ...) {
  if (!d) return 0;
  va_list ap;
  va_start(ap, fmt);
  char *p = vformat(fmt, ap);
  va_end(ap);
  if (!p) return d->status;
  const char *old = d->msg ? d->msg : "";
  size_t n = strlen(p) + strlen(old) + 3;
  char *s = malloc(n);
  if (s) {
    snprintf(s, n, "%s: %s", p, old);
    free(d->msg);
    d->msg = s;
  }
  free(p);
  return d->status;
}

const char *mg_diag_msg(const mg_diag *d) {
  if (!d) return "";
  if (d->msg) return d->msg;
  return d->status ? mlagen_strerror(d->status) : "";
}

void mg_diag_clear(mg_diag *d) {
  if (!d) return;
  free(d->msg);
  d->msg = NULL;
  d->status = 0;
}
