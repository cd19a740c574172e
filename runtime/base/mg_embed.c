/* mg_embed.c: lookup in the embedded file table. */
#include "mg_embed.h"

#include <string.h>

const mg_embedded_file *mg_embed_find(const char *path) {
  for (const mg_embedded_file *f = mg_embedded_files; f->path; f++)
    if (strcmp(f->path, path) == 0) return f;
  return NULL;
}
