/* mg_varlen.c: packed sequences, see mg_varlen.h. */
#include "mg_varlen.h"

#include "mlagen.h"

int mg_varlen_check(const int32_t *cu, int64_t n_entries, int64_t cap, const char *name,
                    mg_diag *d) {
  if (!name) name = "cu_seqlens";
  if (!cu)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s is NULL: it needs at least one entry "
                       "(cu_seqlens[0] = 0)", name);
  if (n_entries < 1)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s needs at least one entry (cu_seqlens[0] = 0), "
                       "%lld given", name, (long long)n_entries);
  if (cu[0] != 0)
    return mg_diag_set(d, MLAGEN_EINVAL, "%s[0] = %ld, the first boundary must be 0", name,
                       (long)cu[0]);
  for (int64_t i = 1; i < n_entries; i++) {
    if (cu[i] < cu[i - 1])
      return mg_diag_set(d, MLAGEN_EINVAL,
                         "%s[%lld] = %ld is below %s[%lld] = %ld (boundaries must not decrease)",
                         name, (long long)i, (long)cu[i], name, (long long)(i - 1),
                         (long)cu[i - 1]);
    if (cu[i] > cap)
      return mg_diag_set(d, MLAGEN_EINVAL, "%s[%lld] = %ld is past the plan's token capacity %lld",
                         name, (long long)i, (long)cu[i], (long long)cap);
  }
  return 0;
}

int64_t mg_varlen_doc(const int32_t *cu, int64_t n_seqs, int64_t t) {
  if (t < 0 || t >= cu[n_seqs]) return -1;
  int64_t lo = 0, hi = n_seqs; /* the last d with cu[d] <= t lies in [lo, hi) */
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (cu[mid] <= t) lo = mid;
    else hi = mid;
  }
  return lo;
}

void mg_varlen_keys(const int32_t *cu, int64_t n_seqs, int causal, int64_t t, int64_t *lo,
                    int64_t *hi) {
  const int64_t d = mg_varlen_doc(cu, n_seqs, t);
  if (d < 0) {
    *lo = *hi = 0;
    return;
  }
  *lo = cu[d];
  *hi = causal ? t + 1 : cu[d + 1];
}

/* The pairs of the query rows at consecutive positions [a, b): per document d overlapping
 * them, its rows [r0, r1) see (causal) t - cu[d] + 1 keys each, an arithmetic series, or
 * (not causal) the document's length. O(documents overlapped), so the planner's figure costs
 * no more for a large capacity (rows past T count 0). */
static double pairs_of_range(const int32_t *cu, int64_t n_seqs, int causal, int64_t a, int64_t b) {
  if (a < 0) a = 0;
  if (b > cu[n_seqs]) b = cu[n_seqs];
  double n = 0;
  for (int64_t d = a < b ? mg_varlen_doc(cu, n_seqs, a) : n_seqs; d < n_seqs && cu[d] < b; d++) {
    const int64_t r0 = a > cu[d] ? a : cu[d], r1 = b < cu[d + 1] ? b : cu[d + 1];
    if (r1 <= r0) continue;
    const double rows = (double)(r1 - r0);
    n += causal ? rows * (double)(r0 - cu[d] + 1 + r1 - cu[d]) / 2 : rows * (double)(cu[d + 1] - cu[d]);
  }
  return n;
}

double mg_varlen_pairs(const int32_t *cu, int64_t n_seqs, int causal, int64_t S_q,
                       int64_t q_pos0, int64_t q_split, int64_t q_pos1) {
  const int64_t split = q_split < 0 ? 0 : q_split > S_q ? S_q : q_split;
  return pairs_of_range(cu, n_seqs, causal, q_pos0, q_pos0 + split) +
         pairs_of_range(cu, n_seqs, causal, q_pos1, q_pos1 + (S_q - split));
}

int64_t mg_varlen_compact(const int32_t *cu, int64_t n_seqs, int32_t *out, int64_t out_n) {
  int64_t n = 0;
  out[n++] = 0;
  for (int64_t i = 1; i <= n_seqs; i++)
    if (cu[i] != out[n - 1] && n < out_n) out[n++] = cu[i];
  const int64_t used = n;
  for (; n < out_n; n++) out[n] = cu[n_seqs];
  return used;
}
