/* gpu_common.c: see gpu_common.h. */
#include "gpu/gpu_common.h"

#include <stdarg.h>
#include <time.h>

FILE *g_log;
int g_rank = -1;
const mg_driver *drv;

void say(const char *fmt, ...) {
  if (g_rank > 0) return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
  if (g_log) {
    va_start(ap, fmt);
    vfprintf(g_log, fmt, ap);
    va_end(ap);
    fflush(g_log);
  }
}

double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cu(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return 0;
  mg_diag d = MG_DIAG_INIT;
  mg_driver_check(drv, r, MLAGEN_EIO, what, &d);
  if (g_rank >= 0) fprintf(stderr, "[rank %d] CUDA error: %s\n", g_rank, mg_diag_msg(&d));
  say("CUDA error: %s\n", mg_diag_msg(&d));
  mg_diag_clear(&d);
  return -1;
}

CUevent *gpu_events(void) {
  static CUevent ev[GPU_EVENTS];
  static int n_ev;
  for (; n_ev < GPU_EVENTS; n_ev++)
    if (CU(drv->cuEventCreate(&ev[n_ev], CU_EVENT_DEFAULT))) return NULL;
  return ev;
}

int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}
