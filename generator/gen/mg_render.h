/* mg_render.h: the template renderer (language in docs/templates.md).
 *
 * A template is text with two kinds of markup:
 *   - a line whose first non-blank character is '@' is a Lua statement;
 *     "@@" at that position emits a literal '@' line instead;
 *   - ${expr} anywhere in a text line is replaced by tostring(expr) (nil is an error);
 *     "$${" emits "${".
 * The template is translated into a Lua chunk with the same line numbers as the template,
 * so Lua errors and tracebacks name template lines. Output carries #line directives that
 * map every emitted text line back to its template line, so an NVRTC error names the
 * template file and line. Names starting with __mg_ are reserved for the renderer. */
#ifndef MG_RENDER_H
#define MG_RENDER_H
#include <stddef.h>

#include "mg_buf.h"
#include "mg_diag.h"
#include "mg_lua.h"

/* Translates a template to Lua source (appended to lua_out; left as it was on failure).
 * name is the template's display path, used in messages. The chunk calls the helpers
 * that mg_render provides; it is exposed for tests and debugging.
 * Errors: MLAGEN_ETEMPLATE (an unclosed or empty ${, or a Lua comment inside one, with
 * "name:line: "), MLAGEN_ENOMEM. */
int mg_render_translate(const char *tpl, size_t len, const char *name, mg_buf *lua_out,
                        mg_diag *d);

/* Translates and runs a template in L (chunkname "@" name), appending its output to out;
 * on failure out is left as it was. name is also the file name in the #line directives.
 * Globals already set in L (such as `spec`) are visible to the template.
 * Errors: those of mg_render_translate and mg_lua_run; MLAGEN_ELIMIT also when the
 * output would exceed out's cap (out->max). */
int mg_render(mg_lua *L, const char *tpl, size_t len, const char *name, mg_buf *out,
              mg_diag *d);
#endif
