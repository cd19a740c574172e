/* mg_diag.h: the message that goes with a status code.
 *
 * Every fallible internal function takes an mg_diag* as its last argument. On failure
 * it sets a one-line (or, for compiler logs and Lua tracebacks, multi-line) message and
 * returns the status code; callers propagate the code and leave the message alone.
 * A NULL mg_diag* is accepted everywhere and discards the message. */
#ifndef MG_DIAG_H
#define MG_DIAG_H
#include <stddef.h>

typedef struct mg_diag {
  int status;   /* the last status set, 0 if none */
  char *msg;    /* heap, NUL-terminated; NULL if none */
} mg_diag;

#define MG_DIAG_INIT {0, NULL}

/* Sets the message (printf format) and returns status, for `return mg_diag_set(...)`. */
int mg_diag_set(mg_diag *d, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prepends "prefix: " to the current message (adds context as an error travels up). */
int mg_diag_prefix(mg_diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The message, or the status description if no message was set, or "" if neither. */
const char *mg_diag_msg(const mg_diag *d);
void mg_diag_clear(mg_diag *d);
#endif
