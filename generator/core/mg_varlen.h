/* mg_varlen.h: packed sequences ("varlen", FlashAttention's term), the rules in one place.
 *
 * N documents are concatenated into one token stream of T tokens, held in a buffer of
 * T_cap >= T token rows (a varlen plan is made for the capacity: batch 1, S = T_cap; the
 * rows past T are slack). cu_seqlens [N + 1] (int32) gives the boundaries: cu[0] = 0,
 * non-decreasing, cu[N] = T <= T_cap. A token's global position is its index t in the
 * stream; it belongs to document d when cu[d] <= t < cu[d + 1], and is slack when t >= T.
 * Attention never crosses a document and is causal by the position inside the document,
 * which for two tokens of one document is their order in the stream. So a valid query t of
 * document d sees the keys [cu[d], causal ? t + 1 : cu[d + 1]), one contiguous range; a
 * slack query sees no key (o = 0, lse = -inf, zero gradients), and a slack key is seen by
 * no query. A zero-length document (cu[d] = cu[d + 1]) is valid and owns no token.
 *
 * Under sequence parallelism the stream is split across ranks exactly as an unpacked
 * sequence of S = T_cap tokens (mg_form_token_pos), so a document may span ranks; every rank
 * is given the same, global cu_seqlens. The device side of these rules is mla::Varlen in
 * templates/mla_device.cuh. */
#ifndef MG_VARLEN_H
#define MG_VARLEN_H
#include <stdint.h>

#include "mg_diag.h"

/* Checks cu_seqlens of n_entries = N + 1 entries against a token capacity cap: n_entries
 * >= 1, cu[0] = 0, cu[i] >= cu[i - 1], cu[N] <= cap. name names the array in messages
 * ("cu_seqlens", "tensors->cu_seqlens"). Errors: MLAGEN_EINVAL naming the first bad index,
 * e.g. "cu_seqlens[3] = 10 is below cu_seqlens[2] = 12 (boundaries must not decrease)",
 * "cu_seqlens[5] = 9000 is past the plan's token capacity 8192", cu NULL or n_entries < 1
 * ("cu_seqlens needs at least one entry (cu_seqlens[0] = 0), -1 given", "cu_seqlens is NULL: ..."). */
int mg_varlen_check(const int32_t *cu, int64_t n_entries, int64_t cap, const char *name,
                    mg_diag *d);

/* The document of token t (0 <= t), or -1 when t is slack (t >= cu[n_seqs]). cu is checked
 * (mg_varlen_check) with n_seqs + 1 entries. O(log N). */
int64_t mg_varlen_doc(const int32_t *cu, int64_t n_seqs, int64_t t);

/* The keys [*lo, *hi) the query token t sees (causal or not); *lo = *hi = 0 for slack. */
void mg_varlen_keys(const int32_t *cu, int64_t n_seqs, int causal, int64_t t, int64_t *lo,
                    int64_t *hi);

/* The (query, key) pairs that query rows 0 .. S_q - 1 at positions pos(i) (mg_step's q_pos0,
 * q_split, q_pos1: pos(i) = q_pos0 + i for i < q_split, else q_pos1 + i - q_split; all zero
 * for pos(i) = i) attend: the sum of their key ranges. */
double mg_varlen_pairs(const int32_t *cu, int64_t n_seqs, int causal, int64_t S_q,
                       int64_t q_pos0, int64_t q_split, int64_t q_pos1);

/* How many of `rows` consecutive token rows starting at global position tok0 are valid
 * (not slack) for a stream of T tokens: clamp(T - tok0, 0, rows). */
static inline int64_t mg_varlen_valid_rows(int64_t T, int64_t tok0, int64_t rows) {
  const int64_t v = T - tok0;
  return v < 0 ? 0 : v > rows ? rows : v;
}

/* The device copy of a checked cu_seqlens (n_seqs + 1 entries) for a capacity cap: the
 * boundaries without zero-length documents (they own no token), then T repeated up to
 * out_n = cap + 1 entries, so that a kernel can search a fixed n = cap documents whatever
 * N is (a repeated boundary is a zero-length document). out holds out_n entries, out_n >=
 * (documents with tokens) + 1 (cap + 1 always suffices). Returns the entries written
 * before the padding (documents with tokens + 1). */
int64_t mg_varlen_compact(const int32_t *cu, int64_t n_seqs, int32_t *out, int64_t out_n);
#endif
