/* gpu_common.h: what the GPU programs (bench.c, forms_check.c) share: the log that goes
 * to stdout and OUTDIR/<program>.log, a wall clock, the driver and its error report, and
 * the float order for medians. */
#ifndef MLAGEN_TESTS_GPU_COMMON_H
#define MLAGEN_TESTS_GPU_COMMON_H

#include <stdio.h>

#include "mg_driver.h"

extern FILE *g_log;           /* say() writes here too when set */
extern int g_rank;            /* the MPI rank (forms_check), or -1: no ranks (bench) */
extern const mg_driver *drv;  /* the loaded driver (mg_driver_get) */

/* printf to stdout and g_log, both flushed; nothing on ranks other than 0. */
__attribute__((format(printf, 1, 2))) void say(const char *fmt, ...);

/* Seconds on the monotonic clock. */
double wall_s(void);

/* 0 when r is CUDA_SUCCESS; else says "CUDA error: <what>: <NAME> (<string>)" (and, with
 * ranks, writes it to stderr tagged "[rank r]") and returns -1. */
int cu(CUresult r, const char *what);
#define CU(call) cu((call), #call)

/* GPU_EVENTS events for timing (a pass's or a row's iterations between back-to-back
 * events), created at the first call; NULL after a CUDA error (said). */
#define GPU_EVENTS 257
CUevent *gpu_events(void);

/* qsort order of floats, ascending. */
int cmp_float(const void *a, const void *b);

#endif
