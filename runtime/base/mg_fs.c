/* mg_fs.c: whole-file reads, atomic writes, mkdir -p. */
#include "mg_fs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mlagen.h"

int mg_fs_read(const char *path, size_t max, char **data, size_t *len, mg_diag *d) {
  *data = NULL;
  if (len) *len = 0;
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever
   * (and a device could block too); only a regular file is read, blocking again. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return mg_diag_set(d, MLAGEN_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return mg_diag_set(d, MLAGEN_EIO, "%s: not a regular file (a FIFO, device or directory "
                       "is refused)", path);
  }
  int fl = fcntl(fd, F_GETFL);
  FILE *f = fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 ? NULL : fdopen(fd, "rb");
  if (!f) {
    int e = errno;
    close(fd);
    return mg_diag_set(d, MLAGEN_EIO, "%s: cannot open: %s", path, strerror(e));
  }
  if ((size_t)st.st_size > max) {
    fclose(f);
    return mg_diag_set(d, MLAGEN_ELIMIT, "%s: %lld bytes, over the limit of %zu", path,
                       (long long)st.st_size, max);
  }
  size_t n = (size_t)st.st_size;
  char *p = malloc(n + 1);
  if (!p) {
    fclose(f);
    return mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory reading %zu bytes", path, n);
  }
  size_t got = fread(p, 1, n, f);
  int err = ferror(f);
  fclose(f);
  if (err || got != n) {
    free(p);
    return mg_diag_set(d, MLAGEN_EIO, "%s: read error", path);
  }
  p[n] = '\0';
  *data = p;
  if (len) *len = n;
  return 0;
}

/* The temp file of mg_fs_write_atomic beside path, created (*tmp malloc'ed, *fd open). */
static int open_temp(const char *path, char **tmp, int *fd, mg_diag *d) {
  /* rename() would replace a symlink, a FIFO or a device node (as root, /dev/null) */
  struct stat old;
  if (lstat(path, &old) == 0 && !S_ISREG(old.st_mode))
    return mg_diag_set(d, MLAGEN_EIO, "%s: exists and is not a regular file; not replacing it",
                       path);
  size_t n = strlen(path) + 32;
  *tmp = malloc(n);
  if (!*tmp) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  snprintf(*tmp, n, "%s.tmp.XXXXXX", path);
  *fd = mkstemp(*tmp);
  if (*fd < 0) {
    int rc = mg_diag_set(d, MLAGEN_EIO, "%s: cannot create temp file: %s", path, strerror(errno));
    free(*tmp);
    *tmp = NULL;
    return rc;
  }
  return 0;
}

int mg_fs_check_writable(const char *path, mg_diag *d) {
  char *tmp;
  int fd, rc = open_temp(path, &tmp, &fd, d);
  if (rc) return rc;
  close(fd);
  unlink(tmp);
  free(tmp);
  return 0;
}

int mg_fs_write_atomic(const char *path, const void *data, size_t len, mg_diag *d) {
  char *tmp;
  int fd, rc = open_temp(path, &tmp, &fd, d);
  if (rc) return rc;
  const char *p = data;
  size_t left = len;
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) goto fail;
    p += w;
    left -= (size_t)w;
  }
  if (fchmod(fd, 0644) != 0 || fsync(fd) != 0) goto fail;
  if (close(fd) != 0) {
    fd = -1;
    goto fail;
  }
  fd = -1;
  if (rename(tmp, path) != 0) goto fail;
  free(tmp);
  return 0;
fail:;
  int e = errno;
  if (fd >= 0) close(fd);
  unlink(tmp);
  free(tmp);
  return mg_diag_set(d, MLAGEN_EIO, "%s: write failed: %s", path, strerror(e));
}

int mg_fs_mkdirs(const char *path, mg_diag *d) {
  size_t n = strlen(path);
  char *p = malloc(n + 1);
  if (!p) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory");
  memcpy(p, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
      int rc = mg_diag_set(d, MLAGEN_EIO, "%s: cannot create directory: %s", p, strerror(errno));
      free(p);
      return rc;
    }
    p[i] = c;
  }
  free(p);
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
    return mg_diag_set(d, MLAGEN_EIO, "%s: not a directory", path);
  return 0;
}

int mg_fs_is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
