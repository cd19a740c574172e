/* mg_tune_store.h: the tuned store and its lookup at plan time.
 *
 * `mlagen tune` (mg_tune.h, the sweep) writes its winners to the store,
 * tuned/<arch>/<device>.json; the CUDA executor and `mlagen plan --explain` read it at plan
 * time through mg_tune_lookup / mg_tune_choose. Schema, bucketing: docs/tuning.md. */
#ifndef MG_TUNE_STORE_H
#define MG_TUNE_STORE_H
#include <stddef.h>

#include "mg_diag.h"
#include "mg_generate.h"
#include "mg_spec.h"

/* 3: each entry carries its family's template hash (mg_gen_family_hash when it was tuned);
 * the header's template_hash is information only. 2: candidates carry "verdict" (and
 * "reason" when discarded at timing). Files of schema 1 and 2 are still read: their entries
 * take the header's template_hash (the whole set's), so they apply only while the whole
 * template set is unchanged. Writes are 3. */
#define MG_TUNE_SCHEMA 3

/* A full configuration: every tunable of a family, names sorted. */
typedef struct mg_tune_config {
  int n;
  mg_tunable_value v[MG_SPEC_MAX_CONFIG];
} mg_tune_config;

/* "block_m=64 num_warps=4" into buf (size n); "" for an empty config. Returns buf. */
char *mg_tune_config_str(const mg_tune_config *c, char *buf, size_t n);

enum mg_tune_verdict {
  MG_TUNE_KEPT = 0,     /* compiled and not pruned: worth timing */
  MG_TUNE_REJECTED = 1, /* the template's check rejected the configuration */
  MG_TUNE_PRUNED = 2,   /* compiled, pruned by the ptxas report */
  MG_TUNE_FAILED = 3,   /* rendering or compilation failed (a template bug) */
  MG_TUNE_FAILED_LAUNCH = 4, /* timing: failed to load, launch or run on the GPU */
  MG_TUNE_WRONG_RESULT = 5   /* timing: outputs differ from the reference's */
};
#define MG_TUNE_N_VERDICTS 6
const char *mg_tune_verdict_name(int verdict);

/* ---- the store ------------------------------------------------------------------- */

/* Sequence-length bucket: the smallest power of two >= seq, at least MG_TUNE_MIN_BUCKET
 * (seq <= 0 gives MG_TUNE_MIN_BUCKET). */
#define MG_TUNE_MIN_BUCKET 256LL
long long mg_tune_bucket(long long seq);

typedef struct mg_tune_header {
  int schema;               /* MG_TUNE_SCHEMA */
  char mlagen_version[32];
  char template_hash[80];   /* the whole set's (mg_gen_template_hash) at the last write:
                               information; entries carry their own */
  char nvrtc_version[16];   /* "12.8" */
  int driver_version;       /* cuDriverGetVersion */
  char device[128];         /* device name as the driver reports it */
  char arch[16];            /* "sm_90a" */
  int sm_count;
} mg_tune_header;

/* One candidate of an entry: discarded at timing (verdict MG_TUNE_FAILED_LAUNCH,
 * "failed-launch" in the file, or MG_TUNE_WRONG_RESULT, "wrong-result": reason says why,
 * the times are 0 and not written), else timed ("kept", with its times). */
typedef struct mg_tune_timing {
  mg_tune_config config;
  double p20_ms, p50_ms, p80_ms;
  int verdict;
  char reason[256];
} mg_tune_timing;

typedef struct mg_tune_entry {
  /* key */
  char family[32];
  char form[16];            /* "" when the kernel serves every form */
  char pass[8];             /* "fwd" / "bwd": the kernel's kernel{} pass, written by
                               `mlagen tune` (not part of the key: the family fixes it) */
  int heads, d_n, d_r, d_v, d_c;
  char dtype[8];
  int causal;
  long long seq_bucket;     /* mg_tune_bucket */
  /* value */
  char template_hash[80];   /* mg_gen_family_hash of the family when it was tuned; read
                               from a schema 1/2 file: the header's (the whole set's) */
  mg_tune_config config;    /* the winner */
  double p20_ms, p50_ms, p80_ms, tflops;
  int n_candidates;
  mg_tune_timing *candidates; /* heap, every timed or discarded candidate */
} mg_tune_entry;

typedef struct mg_tune_store {
  mg_tune_header header;
  int n;
  mg_tune_entry *entries;
} mg_tune_store;

void mg_tune_store_free(mg_tune_store *s);

/* The entry's key layout: for a family whose kernels' interface includes k_packed
 * (mg_spec_keyed) the k_packed of its config (1 packed keys, 0 split), else -1 (also for
 * such a family's entry whose config does not give k_packed). Part of the key: the two
 * layouts are two kernels, tuned and stored apart. */
long mg_tune_entry_layout(const mg_tune_entry *e);

/* 1 if a and b have the same key: family, form, shape (heads, d_n, d_r, d_v, d_c, dtype,
 * causal), seq_bucket and key layout (mg_tune_entry_layout). */
int mg_tune_entry_same_key(const mg_tune_entry *a, const mg_tune_entry *b);

/* The store file of (arch, device) under dir (NULL: mg_tune_store_dir()):
 * <dir>/<arch>/<device>.json, the device name with every character outside
 * [A-Za-z0-9._-] replaced by '_'. Errors: MLAGEN_ELIMIT (does not fit), MLAGEN_EINVAL. */
int mg_tune_store_path(const char *dir, const char *arch, const char *device, char *buf,
                       size_t n, mg_diag *d);

/* The store directory: $MLAGEN_TUNED_DIR, else "./tuned". */
const char *mg_tune_store_dir(void);

/* Reads a store file. Errors: MLAGEN_EIO (missing or unreadable), MLAGEN_ECONFIG (not
 * JSON, or not a store: a missing or mistyped field; the message names it), MLAGEN_ENOMEM.
 * On success the caller frees *out. */
int mg_tune_store_read(const char *path, mg_tune_store *out, mg_diag *d);

/* mg_tune_store_read on text[0..len) (no NUL needed; one inside is refused), named name in
 * messages. Every number read as an integer must be integral and in its field's range
 * (a schema of 1e300 is corrupt, not cast). Same errors as mg_tune_store_read but
 * MLAGEN_EIO. */
int mg_tune_store_parse(const char *text, size_t len, const char *name, mg_tune_store *out,
                        mg_diag *d);

/* Serializes a store (pretty JSON, entries in the given order; an entry without a
 * template_hash is written with the header's); heap, free(). */
char *mg_tune_store_json(const mg_tune_store *s);

/* Why header h (of a file) must not be trusted for expected: NULL when it matches
 * (schema 1 .. MG_TUNE_SCHEMA, device, arch), else a static description ("device
 * differs" ...). The template hash is not compared: each entry carries its own. */
const char *mg_tune_header_mismatch(const mg_tune_header *h, const mg_tune_header *expected);

/* Whether mg_tune_store_add could write the store of (arch, device) under dir (NULL:
 * mg_tune_store_dir()): creates the directories, checks that the last one is writable and
 * that the store file and its lock are absent or regular files (not a symbolic link, a
 * directory, a device). `mlagen tune` calls it before timing, so a sweep's results are not
 * lost at the end. Errors: MLAGEN_EIO (naming the path and why), MLAGEN_ELIMIT,
 * MLAGEN_EINVAL, MLAGEN_ENOMEM. */
int mg_tune_store_writable(const char *dir, const char *arch, const char *device, mg_diag *d);

/* Adds entries[0..n) to the store of (h->arch, h->device) under dir, merging with what is
 * there: under an flock() on <file>.lock, reads the file, replaces the entries with the
 * same key (mg_tune_entry_same_key: a packed-key and a split-key entry are both kept), keeps the others whatever their template hash, writes atomically with h as
 * the header (schema MG_TUNE_SCHEMA). An entry given with an empty template_hash is
 * written with h->template_hash. A corrupt file or one whose header does not match h
 * (mg_tune_header_mismatch) is not merged: its entries are dropped, the file is rewritten,
 * and *warning (may be NULL; heap, free()) says so. Errors: MLAGEN_EIO, MLAGEN_ENOMEM. */
int mg_tune_store_add(const char *dir, const mg_tune_header *h, const mg_tune_entry *entries,
                      int n, char **warning, mg_diag *d);

/* The entry key of spec s (family, shape) at seq, with form ("" or NULL: none); pass is
 * left "" for the caller, who has the rendered kernel (mg_kernel_info.pass), and so is the
 * config, which gives the key layout (mg_tune_entry_layout: the winner's k_packed). */
void mg_tune_entry_key(mg_tune_entry *e, const mg_kernel_spec *s, const char *form,
                       long long seq);

/* ---- lookup at plan time ------------------------------------------------------------ */

enum mg_tune_source { MG_TUNE_DEFAULT = 0, MG_TUNE_TUNED = 1 };

/* The configuration to use for spec s at sequence length seq on (arch, device): the
 * store entry with the same family, form (an entry for `form`, else one with no form),
 * pass, shape, bucket and key layout (s's k_packed for a keyed family, mg_spec_keyed; an
 * entry without one, or s without one, matches either; when the store has only an entry
 * of the other layout, that one: mg_tune_choose refuses it) if the store of (arch, device) under store_dir (NULL:
 * mg_tune_store_dir()) has one, its header matches (device, arch, schema) and the entry
 * is current: its template_hash equals family_hash (mg_gen_family_hash of s->family now)
 * or set_hash (mg_gen_template_hash now: an entry stamped with the whole set's hash, from
 * a schema 1/2 file, applies while the whole set is unchanged). family_hash NULL skips
 * that check. Else the template's default, *config empty (n = 0: render the spec without
 * overrides to see it). *why (heap, free(); may be NULL) says which and why:
 * "tuned: <file> entry attn_fwd causal bucket 4096 (...), p50 0.120 ms, ..." or
 * "default: no tuned store for sm_90a/unknown (<file>)", "default: <file> is corrupt
 * (...)", "default: <file> ignored: device differs", "default: the attn_bwd_dkdv template
 * changed since it was tuned (<file> entry ... : entry hash <12 hex>, now <12 hex>)",
 * "default: <file> has no entry ..." (a stale entry for `form` does not hide a current
 * form-less one). Returns MG_TUNE_TUNED
 * or MG_TUNE_DEFAULT (never fails: a store problem means the default; MLAGEN_ENOMEM is the
 * only negative return). */
int mg_tune_lookup(const char *store_dir, const char *arch, const char *device,
                   const char *family_hash, const char *set_hash, const mg_kernel_spec *s,
                   const char *form, long long seq, mg_tune_config *config, char **why);

/* The spec a kernel is generated from at run time: s with the tuned store's configuration
 * (mg_tune_lookup) applied when there is one, then mg_spec_plan_tunables (the plans'
 * interface wins over a stored value), checked by rendering it with g; a stored
 * configuration that does not apply (an unknown tunable, a value the template rejects, a
 * key layout other than the step's: k_packed differing from s's for a keyed family,
 * mg_spec_keyed, "it has k_packed=1, the step runs k_packed=0 (split keys)") falls back to
 * s itself. *out is the spec to generate; why (n bytes, may be NULL) says
 * which and why, "tuned: ..." only when the stored configuration is what *out carries.
 * The one place the CUDA executor and `mlagen plan --explain` choose a configuration.
 * kernel (may be NULL) receives *out rendered (mg_kernel_free it), so the caller does not
 * render it again. Errors: MLAGEN_ENOMEM; with kernel, mg_gen_kernel's for *out (d says
 * which; *kernel is then empty). */
int mg_tune_choose(mg_gen *g, const char *store_dir, const char *arch, const char *device,
                   const mg_kernel_spec *s, const char *form, long long seq, mg_kernel_spec *out,
                   char *why, size_t n, mg_kernel *kernel, mg_diag *d);

/* The configuration kernel{} resolves for s (its default with s's overrides applied),
 * read from the manifest. Errors: those of mg_gen_kernel. */
int mg_tune_resolved_config(mg_gen *g, const mg_kernel_spec *s, mg_tune_config *config,
                            mg_diag *d);
#endif