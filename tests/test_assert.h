/* test_assert.h: assertions the cmocka suites share (include after <cmocka.h>). */
#ifndef MLAGEN_TESTS_TEST_ASSERT_H
#define MLAGEN_TESTS_TEST_ASSERT_H

#include <string.h>

/* Fails the test unless string s (NULL fails) contains sub. */
#define assert_contains(s, sub)                                                     \
  do {                                                                              \
    const char *s_ = (s);                                                           \
    if (!s_ || !strstr(s_, (sub))) fail_msg("'%s' does not contain '%s'", s_ ? s_ : "(null)", (sub)); \
  } while (0)

#endif
