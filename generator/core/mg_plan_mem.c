/* mg_plan_mem.c: the static memory layout of a plan (see mg_plan_mem.h).
 *
 * The workspace objects are the non-saved TEMP buffers, live over [first, last], and the
 * steps' staging, live over [i, i]. Placing intervals of known lifetime at fixed offsets
 * is offline dynamic storage allocation (NP-hard in general); a few cheap heuristics run
 * until one reaches the bound (the most bytes live at one step, which no layout beats),
 * and the lowest high-water mark is kept. The scratch (about 60 KiB) is on the heap, so
 * the call is thread-safe and light on the caller's stack. */
#include "mg_plan_mem.h"

#include <stdlib.h>
#include <string.h>

#include "mlagen.h"

#define MAX_OBJS (MG_PLAN_MAX_BUFS + MG_PLAN_MAX_STEPS)
#define MAX_ALIGN ((int64_t)1 << 30)

typedef struct obj {
  int64_t size;   /* bytes, rounded up to align; 0 objects take offset 0 and no room */
  int start, end; /* steps, inclusive */
  int id;         /* buffer id, or -1 - step for a staging */
} obj;

typedef struct objs {
  obj o[MAX_OBJS];
  int n;
  int by_start[MAX_OBJS]; /* object ids by start step, then in id order (buffers first) */
  /* the search's scratch */
  int64_t off[MAX_OBJS], cur_off[MAX_OBJS], best_off[MAX_OBJS];
  int order[MAX_OBJS], cur_order[MAX_OBJS];
  double key1[MAX_OBJS], key2[MAX_OBJS];
  int tmp[2][MAX_OBJS]; /* simulate's and place's lists */
} objs;

/* *r = a + b; 0, or -1 on overflow. */
static int add_ok(int64_t a, int64_t b, int64_t *r) { return __builtin_add_overflow(a, b, r) ? -1 : 0; }

/* b's bytes rounded up to align, into *out; -1 on overflow or a bad shape. */
static int buf_size(const mg_plan_buf *b, int64_t align, int64_t *out) {
  if (b->ndim < 0 || b->ndim > MG_PLAN_MAX_DIMS || (unsigned)b->dtype > MG_F16) return -1;
  int64_t bytes = (int64_t)mg_dtype_size(b->dtype);
  for (int i = 0; i < b->ndim; i++)
    if (b->dims[i] < 0 || __builtin_mul_overflow(bytes, b->dims[i], &bytes)) return -1;
  if (add_ok(bytes, align - 1, &bytes)) return -1;
  *out = bytes & ~(align - 1);
  return 0;
}

static int time_overlap(const obj *a, const obj *b) { return a->start <= b->end && b->start <= a->end; }

/* ---- heuristic 1: simulate the steps with a free list --------------------------------- */

/* Allocates at each step the objects starting there (in plan order, or largest first),
 * first-fit (lowest gap that holds it) or best-fit (smallest such gap), the top of the
 * live objects when no gap holds it; frees the objects ending there. Offsets into off[];
 * returns the high-water mark, or -1 on overflow. */
static int64_t simulate(objs *s, int n_steps, int best_fit, int largest_first, int64_t *off) {
  int *live = s->tmp[0], n_live = 0; /* sorted by offset */
  int *order = s->tmp[1];
  int64_t hwm = 0;
  int k = 0; /* next in by_start */
  for (int i = 0; i < n_steps; i++) {
    int n_new = 0;
    while (k < s->n && s->o[s->by_start[k]].start == i) order[n_new++] = s->by_start[k++];
    if (largest_first) /* stable insertion sort, size descending */
      for (int a = 1; a < n_new; a++) {
        int v = order[a], b = a;
        for (; b > 0 && s->o[order[b - 1]].size < s->o[v].size; b--) order[b] = order[b - 1];
        order[b] = v;
      }
    for (int a = 0; a < n_new; a++) {
      const int id = order[a];
      const int64_t size = s->o[id].size;
      off[id] = 0;
      if (size == 0) continue;
      int64_t cur = 0, best = -1, best_gap = 0;
      int at = n_live, best_at = n_live;
      for (int j = 0; j < n_live; j++) {
        const int64_t gap = off[live[j]] - cur;
        if (gap >= size && (best < 0 || (best_fit && gap < best_gap))) {
          best = cur, best_gap = gap, best_at = j;
          if (!best_fit) break;
        }
        cur = off[live[j]] + s->o[live[j]].size;
      }
      if (best >= 0) {
        cur = best;
        at = best_at;
      }
      int64_t end;
      if (add_ok(cur, size, &end)) return -1;
      if (end > hwm) hwm = end;
      off[id] = cur;
      memmove(&live[at + 1], &live[at], (size_t)(n_live - at) * sizeof live[0]);
      live[at] = id;
      n_live++;
    }
    for (int j = 0; j < n_live;) /* free what ends here */
      if (s->o[live[j]].end == i) {
        memmove(&live[j], &live[j + 1], (size_t)(n_live - j - 1) * sizeof live[0]);
        n_live--;
      } else {
        j++;
      }
  }
  return hwm;
}

/* ---- heuristic 2: offline, in a given order, at the lowest (or tightest) free offset --- */

/* Places the objects in order, each at the lowest offset (best_fit: in the smallest gap
 * that holds it, the top when none does) that does not overlap an object already placed
 * whose lifetime meets its own. Returns the high-water mark, or -1 on overflow. */
static int64_t place(objs *s, const int *order, int best_fit, int64_t *off) {
  int *placed = s->tmp[0], n_placed = 0; /* sorted by offset */
  int64_t hwm = 0;
  for (int a = 0; a < s->n; a++) {
    const int id = order[a];
    const obj *o = &s->o[id];
    off[id] = 0;
    if (o->size == 0) continue;
    int64_t cur = 0, best = -1, best_gap = 0;
    for (int j = 0; j < n_placed; j++) {
      const obj *q = &s->o[placed[j]];
      if (!time_overlap(o, q)) continue;
      const int64_t gap = off[placed[j]] - cur;
      if (gap >= o->size && (best < 0 || gap < best_gap)) {
        best = cur, best_gap = gap;
        if (!best_fit) break;
      }
      const int64_t q_end = off[placed[j]] + q->size;
      if (q_end > cur) cur = q_end;
    }
    if (best >= 0) cur = best;
    int64_t end;
    if (add_ok(cur, o->size, &end)) return -1;
    if (end > hwm) hwm = end;
    off[id] = cur;
    int at = n_placed;
    while (at > 0 && off[placed[at - 1]] > cur) at--;
    memmove(&placed[at + 1], &placed[at], (size_t)(n_placed - at) * sizeof placed[0]);
    placed[at] = id;
    n_placed++;
  }
  return hwm;
}

/* order[] = the objects by key1, then key2, descending; ties by start step, then id
 * (by_start's order). A stable insertion sort: n is at most a few hundred. */
static void sort_by(const objs *s, const double *key1, const double *key2, int *order) {
  for (int a = 0; a < s->n; a++) {
    const int v = s->by_start[a];
    int b = a;
    for (; b > 0; b--) {
      const int u = order[b - 1];
      if (key1[u] > key1[v] || (key1[u] == key1[v] && key2[u] >= key2[v])) break;
      order[b] = u;
    }
    order[b] = v;
  }
}

/* ---- the layout ----------------------------------------------------------------------- */

static int too_large(const mg_plan *p, mg_plan_mem *m, mg_diag *d) {
  memset(m, 0, sizeof *m);
  return mg_diag_set(d, MLAGEN_EINVAL, "plan memory layout: the %s plan's areas would exceed "
                     "2^63 bytes", mg_form_name(p->args.form));
}

static int malformed(mg_diag *d, mg_plan_mem *m, const char *what, int i) {
  memset(m, 0, sizeof *m);
  return mg_diag_set(d, MLAGEN_EINVAL, "plan memory layout: malformed plan: %s %d", what, i);
}

/* The layout proper, p checked; s is scratch. */
static int layout(const mg_plan *p, int64_t align, mg_plan_mem *m, objs *s, mg_diag *d) {
  m->align = align;
  s->n = 0;
  int64_t total = 0; /* of the workspace objects: bounds every sum of live bytes */
  for (int b = 0; b < p->n_bufs; b++) {
    const mg_plan_buf *pb = &p->bufs[b];
    int64_t size;
    if (buf_size(pb, align, &size)) return malformed(d, m, "size of buffer", b);
    m->where[b] = MG_MEM_CALLER;
    if (pb->role != MG_BUF_TEMP) continue;
    if (pb->first < p->n_fwd && pb->last >= p->n_fwd) {
      m->where[b] = MG_MEM_SAVED;
      m->offset[b] = m->saved_bytes;
      if (add_ok(m->saved_bytes, size, &m->saved_bytes)) return too_large(p, m, d);
      continue;
    }
    m->where[b] = MG_MEM_WORKSPACE;
    if (add_ok(total, size, &total)) return too_large(p, m, d);
    s->o[s->n++] = (obj){size, pb->first, pb->last, b};
  }
  for (int i = 0; i < MG_PLAN_MAX_STEPS; i++) m->step_ws[i] = -1;
  for (int i = 0; i < p->n_steps; i++) {
    const int64_t w = p->steps[i].workspace;
    if (w == 0) continue;
    int64_t size;
    if (add_ok(w, align - 1, &size)) return too_large(p, m, d);
    size &= ~(align - 1);
    if (add_ok(total, size, &total)) return too_large(p, m, d);
    s->o[s->n++] = (obj){size, i, i, -1 - i};
  }
  { /* by start step, buffers before stagings, each in id order (a stable counting sort) */
    int k = 0;
    for (int i = 0; i < p->n_steps; i++)
      for (int j = 0; j < s->n; j++)
        if (s->o[j].start == i) s->by_start[k++] = j;
  }

  /* the bound: the most bytes live at one step; no layout does better */
  int64_t bound = 0;
  int peak_step = 0;
  for (int i = 0; i < p->n_steps; i++) {
    int64_t live = 0; /* <= total */
    for (int j = 0; j < s->n; j++)
      if (s->o[j].start <= i && i <= s->o[j].end) live += s->o[j].size;
    if (live > bound) bound = live, peak_step = i;
  }

  /* Candidates, until one reaches the bound: the step simulations (first-fit, best-fit;
   * plan order, largest first), then offline placements in four orders (largest first;
   * the peak step's objects first, largest first; the longest-lived first; the largest
   * size x lifetime first), each at the lowest and at the tightest fit. */
  int64_t best = -1;
  for (int h = 0; h < 12 && best != bound; h++) {
    int64_t hwm;
    if (h < 4) {
      hwm = simulate(s, p->n_steps, h & 1, h >> 1, s->off);
      memcpy(s->order, s->by_start, (size_t)s->n * sizeof s->order[0]);
    } else {
      const int k = (h - 4) / 2;
      for (int j = 0; j < s->n; j++) {
        const obj *o = &s->o[j];
        const double size = (double)o->size, span = o->end - o->start + 1;
        const int at_peak = o->start <= peak_step && peak_step <= o->end;
        s->key1[j] = k == 0 ? size : k == 1 ? at_peak : k == 2 ? span : size * span;
        s->key2[j] = k == 0 ? span : size;
      }
      sort_by(s, s->key1, s->key2, s->order);
      hwm = place(s, s->order, h & 1, s->off);
    }
    if (hwm < 0) return too_large(p, m, d);
    if (best < 0 || hwm < best) {
      best = hwm;
      memcpy(s->best_off, s->off, (size_t)s->n * sizeof s->off[0]);
      memcpy(s->cur_order, s->order, (size_t)s->n * sizeof s->order[0]);
      memcpy(s->cur_off, s->off, (size_t)s->n * sizeof s->off[0]);
    }
  }
  /* Improve: move the first object (in the current order) that reaches the current
   * high-water mark to the front of the order and place again at the lowest fit; a few
   * times, from the best candidate on. */
  int64_t cur = best;
  for (int it = 0; it < 16 && best != bound; it++) {
    int top = -1;
    for (int a = 0; a < s->n && top < 0; a++)
      if (s->cur_off[s->cur_order[a]] + s->o[s->cur_order[a]].size == cur) top = a;
    if (top <= 0) break;
    s->order[0] = s->cur_order[top];
    for (int a = 0, k = 1; a < s->n; a++)
      if (a != top) s->order[k++] = s->cur_order[a];
    if ((cur = place(s, s->order, 0, s->cur_off)) < 0) return too_large(p, m, d);
    memcpy(s->cur_order, s->order, (size_t)s->n * sizeof s->order[0]);
    if (cur < best) {
      best = cur;
      memcpy(s->best_off, s->cur_off, (size_t)s->n * sizeof s->off[0]);
    }
  }

  m->workspace_bytes = best;
  for (int j = 0; j < s->n; j++) {
    const int id = s->o[j].id;
    if (id >= 0)
      m->offset[id] = s->best_off[j];
    else
      m->step_ws[-1 - id] = s->best_off[j];
  }
  return 0;
}

int mg_plan_mem_layout(const mg_plan *p, int64_t align, mg_plan_mem *m, mg_diag *d) {
  if (!p || !m) return mg_diag_set(d, MLAGEN_EINVAL, "plan memory layout: %s is NULL", p ? "m" : "plan");
  memset(m, 0, sizeof *m);
  if (align < 16 || align > MAX_ALIGN || (align & (align - 1)))
    return mg_diag_set(d, MLAGEN_EINVAL, "plan memory layout: align = %lld must be a power of two "
                       "in [16, 2^30]", (long long)align);
  if (p->n_bufs < 0 || p->n_bufs > MG_PLAN_MAX_BUFS) return malformed(d, m, "buffer count", p->n_bufs);
  if (p->n_steps < 0 || p->n_steps > MG_PLAN_MAX_STEPS) return malformed(d, m, "step count", p->n_steps);
  if (p->n_fwd < 0 || p->n_fwd > p->n_steps) return malformed(d, m, "n_fwd", p->n_fwd);
  for (int b = 0; b < p->n_bufs; b++) {
    const mg_plan_buf *pb = &p->bufs[b];
    if (pb->role != MG_BUF_INPUT && pb->role != MG_BUF_OUTPUT && pb->role != MG_BUF_TEMP)
      return malformed(d, m, "role of buffer", b);
    if (pb->role != MG_BUF_INPUT && (pb->first < 0 || pb->last < pb->first || pb->last >= p->n_steps))
      return malformed(d, m, "first/last steps of buffer", b);
  }
  for (int i = 0; i < p->n_steps; i++) {
    const mg_step *s = &p->steps[i];
    if (s->n_in < 0 || s->n_in > MG_STEP_MAX_ARGS || s->n_out < 0 || s->n_out > MG_STEP_MAX_ARGS)
      return malformed(d, m, "argument count of step", i);
    if (s->workspace < 0) return malformed(d, m, "negative workspace of step", i);
    for (int j = 0; j < s->n_in + s->n_out; j++) {
      const int b = j < s->n_in ? s->in[j] : s->out[j - s->n_in];
      if (b < 0 || b >= p->n_bufs) return malformed(d, m, "buffer id out of range in step", i);
      const mg_plan_buf *pb = &p->bufs[b];
      if (pb->role != MG_BUF_INPUT && (i < pb->first || i > pb->last))
        return malformed(d, m, "access outside the buffer's [first, last] in step", i);
    }
  }

  objs *s = malloc(sizeof *s);
  if (!s) return mg_diag_set(d, MLAGEN_ENOMEM, "plan memory layout: out of memory");
  int rc = layout(p, align, m, s, d);
  free(s);
  return rc;
}
