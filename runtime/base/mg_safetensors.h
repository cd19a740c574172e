/* mg_safetensors.h: reading and writing tensors in the safetensors format.
 *
 * The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian u64 N,
 * then N bytes of UTF-8 JSON mapping each tensor name to
 *   {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
 * (offsets relative to the first byte after the header) plus an optional
 * "__metadata__" object of string -> string, then the data section: every tensor's
 * elements, row-major and little-endian, packed with no holes and no overlaps.
 *
 * mlagen reads BF16, F16, F32 and F64 tensors and converts them to float or double, and
 * I32 and I64 tensors (index arrays such as cu_seqlens) as int64_t; the writer stores F32
 * and F64 as given, and BF16 or F16 rounded to nearest even.
 *
 * Every function that can fail returns 0 or a negative MLAGEN_E* status and, on
 * failure, sets a one-line message in *d (NULL discards it) that names the file and,
 * when one tensor is at fault, the tensor. */
#ifndef MG_SAFETENSORS_H
#define MG_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>

#include "mg_diag.h"
#include "mg_dtype.h"

#define MG_ST_MAX_DIMS 8                       /* dims per tensor */
#define MG_ST_MAX_NAME 255                     /* bytes per tensor name */
#define MG_ST_MAX_HEADER ((uint64_t)100000000) /* header bytes (as the official reader) */

/* One tensor of an open file. Valid until mg_st_close(). */
typedef struct mg_st_tensor {
  const char *name;              /* NUL-terminated UTF-8 */
  mg_dtype dtype;                /* a float tensor's type; for I32 / I64 the float type of
                                  * the same width (F32 / F64) */
  int int_bytes;                 /* 0: a float tensor; 4 (I32) or 8 (I64): an integer
                                  * tensor, read by mg_st_read_i64 only */
  int ndim;                      /* 0 for a scalar */
  int64_t shape[MG_ST_MAX_DIMS]; /* shape[ndim..] are 0 */
  size_t offset;                 /* data_offsets[0]: start within the data section */
  size_t nbytes;                 /* data_offsets[1] - data_offsets[0] = numel * dtype size */
} mg_st_tensor;

typedef struct mg_st_file mg_st_file;

/* ---- reading -------------------------------------------------------------------- */

/* Reads the whole file at path into memory and validates it. On success *out is an
 * open file (mg_st_close() it); on failure *out is NULL.
 * Errors:
 *   MLAGEN_EIO     the file cannot be opened or read (message has the errno text)
 *   MLAGEN_ENOMEM  out of memory
 *   MLAGEN_EINVAL  malformed content, each with its own message naming the file:
 *                  shorter than 8 bytes; header length N over MG_ST_MAX_HEADER or past
 *                  the end of the file; header not UTF-8, not JSON, not a JSON object,
 *                  or followed by anything but whitespace padding; "__metadata__" not
 *                  an object of strings; and, naming the tensor: entry not an object;
 *                  dtype/shape/data_offsets missing or of the wrong JSON type; a dim
 *                  negative or not an integer; more than MG_ST_MAX_DIMS dims; a dtype
 *                  other than BF16, F16, F32, F64, I32 or I64 ("U8 is not supported:
 *                  ...");
 *                  data_offsets not two integers with begin <= end <= data section
 *                  size; end - begin != numel * dtype size; numel or byte count
 *                  overflowing; a name longer than MG_ST_MAX_NAME bytes; a name twice;
 *                  two tensors overlapping; bytes of the data section that belong to no
 *                  tensor (a hole, or trailing bytes).
 * Shapes with a zero dim (0 bytes) and scalars (shape []) are valid. */
int mg_st_open(const char *path, mg_st_file **out, mg_diag *d);

/* As mg_st_open() on len bytes already in memory (copied); label names them in
 * messages (e.g. "<memory>"). Same errors, less MLAGEN_EIO. */
int mg_st_open_mem(const void *bytes, size_t len, const char *label, mg_st_file **out,
                   mg_diag *d);

/* Frees everything; NULL is a no-op. */
void mg_st_close(mg_st_file *f);

/* Number of tensors, and the i-th (0 <= i < count) in data-offset order; NULL when i
 * is out of range. */
int mg_st_count(const mg_st_file *f);
const mg_st_tensor *mg_st_at(const mg_st_file *f, int i);

/* The tensor called name, or NULL. */
const mg_st_tensor *mg_st_find(const mg_st_file *f, const char *name);

/* The raw little-endian bytes of tensor t (t from this file), t->nbytes long. */
const void *mg_st_data(const mg_st_file *f, const mg_st_tensor *t);

/* The "__metadata__" value for key, or NULL when absent. */
const char *mg_st_meta(const mg_st_file *f, const char *key);

/* The file's path (or label), as given to open. */
const char *mg_st_path(const mg_st_file *f);

/* Reads tensor name into out (numel floats), checking that its shape is exactly
 * shape[0..ndim). BF16, F16 and F32 convert exactly; F64 rounds to nearest even.
 * Errors (MLAGEN_EINVAL): no tensor called name; its shape differs (the message names
 * the tensor and gives both shapes); ndim outside 0..MG_ST_MAX_DIMS; out NULL with a
 * nonzero element count; an integer tensor ("tensor 'x' is I64: expected a float
 * tensor ..."). */
int mg_st_read_f32(const mg_st_file *f, const char *name, int ndim, const int64_t *shape,
                   float *out, mg_diag *d);

/* As mg_st_read_f32(), into doubles; every dtype converts exactly. */
int mg_st_read_f64(const mg_st_file *f, const char *name, int ndim, const int64_t *shape,
                   double *out, mg_diag *d);

/* Reads integer tensor name (I32 or I64) into out (numel int64_t, I32 sign-extended),
 * checking its shape as mg_st_read_f32() does. Errors (MLAGEN_EINVAL): those of
 * mg_st_read_f32(), and a float tensor ("tensor 'x' is F32: expected an integer tensor
 * (I32 or I64)"). */
int mg_st_read_i64(const mg_st_file *f, const char *name, int ndim, const int64_t *shape,
                   int64_t *out, mg_diag *d);

/* Reads the slice [start, start + count) along dimension dim of tensor name, whose full
 * shape must be shape[0..ndim). out receives the slice row-major: its shape is shape
 * with shape[dim] replaced by count. Example: ranks of a sequence-parallel run take
 * their shard of a [B, S, H, D] tensor with dim = 1, start = rank * S/P, count = S/P.
 * Errors (MLAGEN_EINVAL): those of mg_st_read_f32(); dim outside 0..ndim-1; start or
 * count negative or start + count > shape[dim]. */
int mg_st_read_f32_rows(const mg_st_file *f, const char *name, int ndim,
                        const int64_t *shape, int dim, int64_t start, int64_t count,
                        float *out, mg_diag *d);
int mg_st_read_f64_rows(const mg_st_file *f, const char *name, int ndim,
                        const int64_t *shape, int dim, int64_t start, int64_t count,
                        double *out, mg_diag *d);

/* ---- writing -------------------------------------------------------------------- */

typedef struct mg_st_writer mg_st_writer;

/* A writer with no tensors. Errors: MLAGEN_ENOMEM. */
int mg_st_writer_new(mg_st_writer **out, mg_diag *d);

/* Adds tensor name of shape shape[0..ndim), copying numel values from data (data may
 * be NULL when numel is 0). _f32 stores F32, _f64 stores F64, _f32_as stores dtype
 * (BF16 and F16 rounded to nearest even, overflow to inf; F64 widened exactly).
 * Errors: MLAGEN_EINVAL for a name already added, "__metadata__", longer than
 * MG_ST_MAX_NAME bytes or not UTF-8; ndim outside 0..MG_ST_MAX_DIMS; a negative dim;
 * a byte count that overflows; data NULL with numel > 0. MLAGEN_ENOMEM. On error the
 * writer is unchanged. */
int mg_st_writer_add_f32(mg_st_writer *w, const char *name, int ndim, const int64_t *shape,
                         const float *data, mg_diag *d);
int mg_st_writer_add_f64(mg_st_writer *w, const char *name, int ndim, const int64_t *shape,
                         const double *data, mg_diag *d);
int mg_st_writer_add_f32_as(mg_st_writer *w, const char *name, mg_dtype dtype, int ndim,
                            const int64_t *shape, const float *data, mg_diag *d);

/* Adds "__metadata__" entry key = value. Errors: MLAGEN_EINVAL for a key already
 * added or a key or value that is not UTF-8; MLAGEN_ENOMEM. */
int mg_st_writer_add_meta(mg_st_writer *w, const char *key, const char *value, mg_diag *d);

/* Writes the file atomically (a temp file in the same directory, fsync, rename): path
 * afterwards holds either its old content or the whole new file, and no temp file is
 * left. The header lists tensors in the order added and is padded with spaces so the
 * data starts 8-byte aligned; the data are laid out 8-byte types first, so every
 * tensor starts aligned to its element size. The writer can be written again.
 * Errors: MLAGEN_EIO (cannot create, write or rename; message names path and errno
 * text); MLAGEN_EINVAL (header over MG_ST_MAX_HEADER); MLAGEN_ENOMEM. */
int mg_st_writer_write(mg_st_writer *w, const char *path, mg_diag *d);

/* Frees the writer; NULL is a no-op. */
void mg_st_writer_free(mg_st_writer *w);
#endif
