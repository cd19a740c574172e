/* mg_fs.h: the few file-system operations mlagen needs, with errors as status codes. */
#ifndef MG_FS_H
#define MG_FS_H
#include <stddef.h>

#include "mg_diag.h"

/* Reads a whole file into a NUL-terminated heap buffer (*data, free() it).
 * Files larger than max bytes are refused, and so is anything but a regular file (a
 * FIFO, device or directory: it is opened non-blocking and checked before any read, so
 * a FIFO without a writer never hangs the caller). Errors: MLAGEN_EIO (cannot open/read,
 * not a regular file; the message names the path and errno text), MLAGEN_ELIMIT (too
 * large), MLAGEN_ENOMEM. */
int mg_fs_read(const char *path, size_t max, char **data, size_t *len, mg_diag *d);

/* Writes len bytes to path atomically: a unique temp file in the same directory,
 * fsync, then rename() over path. Readers see the old file or the whole new one,
 * never a part; concurrent writers leave exactly one complete file. An existing path
 * that is not a regular file (a directory, symlink, FIFO, device) is left alone and
 * refused. Errors: MLAGEN_EIO. */
int mg_fs_write_atomic(const char *path, const void *data, size_t len, mg_diag *d);

/* Whether mg_fs_write_atomic(path, ...) could write there now: path is not an existing
 * non-regular file and a temp file can be created (and is removed) in its directory. For
 * a long job that writes its result at the end: checked before the work. Errors:
 * MLAGEN_EIO (the message as mg_fs_write_atomic's), MLAGEN_ENOMEM. */
int mg_fs_check_writable(const char *path, mg_diag *d);

/* mkdir -p with mode 0755. Errors: MLAGEN_EIO. */
int mg_fs_mkdirs(const char *path, mg_diag *d);

/* 1 if path names an existing regular file, else 0. */
int mg_fs_is_file(const char *path);
#endif
