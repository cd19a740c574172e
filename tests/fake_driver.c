/* fake_driver.c: see fake_driver.h. */
#include "fake_driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef MLAGEN_FAKE_CUDA
#error "MLAGEN_FAKE_CUDA (the path of the fake driver library) must be defined"
#endif

void fake_driver_use(const char *path) {
  setenv("MLAGEN_LIBCUDA", path ? path : NO_SUCH_LIBCUDA, 1);
  unsetenv("FAKE_CUDA_FAIL_INIT");
}

int fake_driver_open(fake_cuda *f) {
  memset(f, 0, sizeof *f);
  fake_driver_use(MLAGEN_FAKE_CUDA);
  void *h = dlopen(MLAGEN_FAKE_CUDA, RTLD_NOW | RTLD_LOCAL); /* stays open, as the loader's */
  if (!h) {
    fprintf(stderr, "dlopen %s: %s\n", MLAGEN_FAKE_CUDA, dlerror());
    return -1;
  }
  static const char *const names[] = {"fake_cuda_count", "fake_cuda_fail", "fake_cuda_last_launch",
                                      "fake_cuda_attr_value", "fake_cuda_reset", "fake_cublas_stats"};
  void *sym[6];
  for (int i = 0; i < 6; i++)
    if (!(sym[i] = dlsym(h, names[i]))) {
      fprintf(stderr, "%s is not the fake driver: no %s\n", MLAGEN_FAKE_CUDA, names[i]);
      return -1;
    }
  /* dlsym's object pointers into function pointers: copied, as POSIX allows */
  memcpy(&f->count, &sym[0], sizeof sym[0]);
  memcpy(&f->inject, &sym[1], sizeof sym[1]);
  memcpy(&f->last_launch, &sym[2], sizeof sym[2]);
  memcpy(&f->attr_value, &sym[3], sizeof sym[3]);
  memcpy(&f->reset, &sym[4], sizeof sym[4]);
  memcpy(&f->cublas_stats, &sym[5], sizeof sym[5]);
  return 0;
}
