/* fuzz_render.c: libFuzzer harness for the template renderer and the Lua sandbox. The
 * input is a template; it renders in a fresh sandboxed state after the real prelude, as
 * the generator does (with small caps, so a run ends within ~1 s). Any limit hit, Lua
 * error or bad template is fine; a crash, a sanitizer report, a hang past -timeout or an
 * output over its cap are not. The translation alone runs too. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mg_embed.h"
#include "mg_lua.h"
#include "mg_render.h"

static const char SPEC[] =
    "spec = {family = 'attn_fwd', heads = 16, d_n = 128, d_r = 64, d_v = 128, d_c = 512,\n"
    "        dtype = 'bf16', causal = true, config = {}}\n";

static const mg_embedded_file *prelude;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  for (const mg_embedded_file *f = mg_embedded_files; f->path; f++)
    if (strcmp(f->path, "templates/prelude.lua") == 0) prelude = f;
  return prelude ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mg_diag d = MG_DIAG_INIT;
  mg_buf code;
  mg_buf_init(&code, 0);
  mg_render_translate((const char *)data, size, "fuzz.tpl", &code, &d);
  mg_buf_free(&code);
  mg_diag_clear(&d);

  mg_lua_limits lim = {.mem_bytes = (size_t)16 << 20, .instructions = 2000000, .seconds = 2};
  mg_lua *L = NULL;
  if (mg_lua_open(&L, &lim, &d)) abort();
  int rc = mg_lua_run(L, SPEC, sizeof SPEC - 1, "=spec", 0, &d);
  if (!rc) rc = mg_lua_run(L, prelude->data, prelude->size, "@prelude.lua", 0, &d);
  if (rc) abort(); /* the setup itself must run */
  mg_buf out;
  mg_buf_init(&out, (size_t)4 << 20);
  rc = mg_render(L, (const char *)data, size, "fuzz.tpl", &out, &d);
  if (out.len > out.max || (rc && out.len != 0)) abort(); /* a failed render leaves out empty */
  mg_buf_free(&out);
  mg_lua_close(L);
  mg_diag_clear(&d);
  return 0;
}
