/* ci_rule.c: exits 1 when tests/ci.h's mg_test_in_ci() says "in CI", else 0 (for
 * tests/ci_rule.cmake, which holds it to cmake/MlagenCI.cmake's rule). */
#include "ci.h"

int main(void) { return mg_test_in_ci() ? 1 : 0; }
