/* test_varlen.c: the packed-sequence rules (generator/core/mg_varlen.h) on hand cases.
 *
 *   check     each malformed cu_seqlens is refused naming the first bad index (not
 *             starting at 0, decreasing, past the capacity, NULL, no entry) with the
 *             caller's name for the array; zero-length documents, T < cap and T = cap pass
 *   doc/keys  the document of every token and its key range (causal and not) against
 *             values written out by hand, slack tokens and zero-length documents included
 *   pairs     mg_varlen_pairs against the hand-summed counts, with two-chunk positions, and
 *             against a row-by-row count on random streams
 *   rows      mg_varlen_valid_rows at, before and past the end of the stream
 *   compact   the device copy: zero-length documents dropped, T repeated to the end */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "mg_varlen.h"
#include "mlagen.h"

/* cu refused with MLAGEN_EINVAL and a message holding text. */
static void refused(const int32_t *cu, int64_t n, int64_t cap, const char *name, const char *text) {
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_varlen_check(cu, n, cap, name, &d), MLAGEN_EINVAL);
  if (!strstr(mg_diag_msg(&d), text)) fail_msg("'%s' not in: %s", text, mg_diag_msg(&d));
  mg_diag_clear(&d);
}

static void test_check(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  const int32_t ok[] = {0, 0, 3, 3, 10}, full[] = {0, 4, 8}, one[] = {0};
  assert_int_equal(mg_varlen_check(ok, 5, 12, NULL, &d), 0);   /* empty documents, slack */
  assert_int_equal(mg_varlen_check(full, 3, 8, NULL, &d), 0);   /* T = cap */
  assert_int_equal(mg_varlen_check(one, 1, 8, NULL, &d), 0);    /* no document: all slack */
  const int32_t start[] = {2, 5}, down[] = {0, 4, 6, 5, 9}, past[] = {0, 4, 9, 13};
  refused(start, 2, 8, NULL, "cu_seqlens[0] = 2, the first boundary must be 0");
  refused(down, 5, 16, NULL, "cu_seqlens[3] = 5 is below cu_seqlens[2] = 6 (boundaries must not decrease)");
  refused(past, 4, 12, NULL, "cu_seqlens[3] = 13 is past the plan's token capacity 12");
  refused(past, 4, 8, NULL, "cu_seqlens[2] = 9 is past"); /* the first bad index */
  refused(NULL, 3, 8, NULL, "cu_seqlens is NULL");
  refused(ok, 0, 8, NULL, "cu_seqlens needs at least one entry");
  refused(ok, -1, 8, NULL, "cu_seqlens needs at least one entry (cu_seqlens[0] = 0), -1 given");
  refused(down, 5, 16, "tensors->cu_seqlens", "tensors->cu_seqlens[3] = 5 is below tensors->cu_seqlens[2]");
  mg_diag_clear(&d);
}

/* Documents [0, 3), [3, 3) (empty), [3, 4), [4, 9); T = 9, tokens 9 .. 11 slack. */
static const int32_t cu[] = {0, 3, 3, 4, 9};
#define N_SEQS 4

static void test_doc_and_keys(void **state) {
  (void)state;
  const int64_t doc[12] = {0, 0, 0, 2, 3, 3, 3, 3, 3, -1, -1, -1};
  /* causal: [doc start, t + 1); not: [doc start, doc end) */
  const int64_t lo[12] = {0, 0, 0, 3, 4, 4, 4, 4, 4, 0, 0, 0};
  const int64_t hi_c[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0};
  const int64_t hi_n[12] = {3, 3, 3, 4, 9, 9, 9, 9, 9, 0, 0, 0};
  for (int64_t t = 0; t < 12; t++) {
    assert_int_equal(mg_varlen_doc(cu, N_SEQS, t), doc[t]);
    for (int causal = 0; causal < 2; causal++) {
      int64_t l = -7, h = -7;
      mg_varlen_keys(cu, N_SEQS, causal, t, &l, &h);
      assert_int_equal(l, lo[t]);
      assert_int_equal(h, causal ? hi_c[t] : hi_n[t]);
    }
  }
  /* leading and trailing empty documents: the token goes to the last document starting at
   * or before it that owns it */
  const int32_t edges[] = {0, 0, 0, 2, 2};
  assert_int_equal(mg_varlen_doc(edges, 4, 0), 2);
  assert_int_equal(mg_varlen_doc(edges, 4, 1), 2);
  assert_int_equal(mg_varlen_doc(edges, 4, 2), -1);
}

static void test_pairs(void **state) {
  (void)state;
  /* all rows: causal 1+2+3 + 1 + 1+2+3+4+5 = 22; not 3*3 + 1 + 5*5 = 35; slack adds none */
  assert_true(mg_varlen_pairs(cu, N_SEQS, 1, 12, 0, 0, 0) == 22);
  assert_true(mg_varlen_pairs(cu, N_SEQS, 0, 12, 0, 0, 0) == 35);
  /* rows at positions 2, 3 then 7, 8, 9 (q_pos0 2, q_split 2, q_pos1 7):
   * causal 3 + 1 + 4 + 5 + 0 = 13; not 3 + 1 + 5 + 5 + 0 = 14 */
  assert_true(mg_varlen_pairs(cu, N_SEQS, 1, 5, 2, 2, 7) == 13);
  assert_true(mg_varlen_pairs(cu, N_SEQS, 0, 5, 2, 2, 7) == 14);
  /* random streams (zero-length documents, slack) and two-chunk positions, against a
   * row-by-row count with its own document search */
  unsigned seed = 7;
  for (int rep = 0; rep < 200; rep++) {
    int32_t c[12];
    const int n = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 10;
    c[0] = 0;
    for (int i = 1; i <= n; i++) c[i] = c[i - 1] + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 6;
    const int64_t cap = c[n] + 3, sq = 1 + (int64_t)((seed = seed * 1103515245u + 12345u) >> 16) % cap;
    const int64_t split = (int64_t)((seed = seed * 1103515245u + 12345u) >> 16) % (sq + 1);
    const int64_t p0 = (int64_t)((seed = seed * 1103515245u + 12345u) >> 16) % 4;
    const int64_t p1 = p0 + split + (int64_t)((seed = seed * 1103515245u + 12345u) >> 16) % 4;
    for (int causal = 0; causal < 2; causal++) {
      double want = 0;
      for (int64_t i = 0; i < sq; i++) {
        const int64_t t = i < split ? p0 + i : p1 + (i - split);
        for (int d = 0; d < n; d++)
          if (c[d] <= t && t < c[d + 1]) want += causal ? (double)(t - c[d] + 1) : (double)(c[d + 1] - c[d]);
      }
      const double got = mg_varlen_pairs(c, n, causal, sq, p0, split, p1);
      if (got != want) fail_msg("rep %d causal %d: %.0f pairs, want %.0f", rep, causal, got, want);
    }
  }
}

static void test_valid_rows(void **state) {
  (void)state;
  assert_int_equal(mg_varlen_valid_rows(9, 0, 12), 9);  /* the stream ends inside */
  assert_int_equal(mg_varlen_valid_rows(9, 6, 3), 3);   /* all valid */
  assert_int_equal(mg_varlen_valid_rows(9, 6, 6), 3);
  assert_int_equal(mg_varlen_valid_rows(9, 9, 3), 0);   /* all slack */
  assert_int_equal(mg_varlen_valid_rows(9, 12, 3), 0);
  assert_int_equal(mg_varlen_valid_rows(0, 0, 4), 0);   /* an empty stream */
}

static void test_compact(void **state) {
  (void)state;
  int32_t out[13];
  memset(out, 0x7f, sizeof out);
  /* capacity 12: boundaries 0 3 4 9 (the empty document dropped), then 9 to entry 12 */
  assert_int_equal(mg_varlen_compact(cu, N_SEQS, out, 13), 4);
  const int32_t want[13] = {0, 3, 4, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
  assert_memory_equal(out, want, sizeof want);
  const int32_t empty[] = {0, 0, 0};
  int32_t o2[4];
  assert_int_equal(mg_varlen_compact(empty, 2, o2, 4), 1); /* no document with tokens */
  for (int i = 0; i < 4; i++) assert_int_equal(o2[i], 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_check),       cmocka_unit_test(test_doc_and_keys),
      cmocka_unit_test(test_pairs),       cmocka_unit_test(test_valid_rows),
      cmocka_unit_test(test_compact),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
