/* mg_embed.h: files compiled into the binary (templates/ and configs/).
 *
 * The table is generated at build time by cmake/embed_files.cmake. Paths are relative
 * to the source root, e.g. "templates/explicit_fwd.cu.tpl", "configs/deepseek-v3.json". */
#ifndef MG_EMBED_H
#define MG_EMBED_H
#include <stddef.h>

typedef struct mg_embedded_file {
  const char *path;  /* NULL terminates the table */
  const char *data;  /* NUL-terminated; size excludes the NUL */
  size_t size;
} mg_embedded_file;

extern const mg_embedded_file mg_embedded_files[];

/* The embedded file at path, or NULL. */
const mg_embedded_file *mg_embed_find(const char *path);
#endif
