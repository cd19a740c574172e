/* test_comm_stub.c: a build without NCCL still builds, and its communicator says why it
 * cannot work. This executable compiles runtime/comm/mg_comm_nccl.c without MLAGEN_HAVE_NCCL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "mg_comm.h"
#include "mlagen.h"

static void test_stub_refuses(void **state) {
  (void)state;
  mg_comm *c = (mg_comm *)1;
  mg_diag d = MG_DIAG_INIT;
  int dummy;
  assert_int_equal(mg_comm_nccl_wrap(&c, &dummy, NULL, &d), MLAGEN_ENONCCL);
  assert_null(c);
  assert_non_null(strstr(mg_diag_msg(&d), "built without NCCL"));
  assert_string_equal(mlagen_strerror(MLAGEN_ENONCCL), "NCCL is not available (not built in, libnccl.so.2 not found)");
  mg_diag_clear(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_stub_refuses)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
