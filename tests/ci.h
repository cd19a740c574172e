/* ci.h: "are we in CI" for the C tests, the rule of cmake/MlagenCI.cmake (which owns it):
 * $CI set, and not empty, "0" or "false" (as CI services set it; .ci/run sets CI=true when
 * it is unset). In CI a check whose tool is missing fails instead of being skipped. */
#ifndef MLAGEN_TESTS_CI_H
#define MLAGEN_TESTS_CI_H

#include <stdlib.h>
#include <string.h>

static inline int mg_test_in_ci(void) {
  const char *ci = getenv("CI");
  return ci && *ci && strcmp(ci, "0") != 0 && strcmp(ci, "false") != 0;
}

#endif
