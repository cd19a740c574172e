/* mg_render.h: the template renderer (language in docs/templates.md).
 *
 * A template is text with two kinds of markup:
 *   - a line whose first non-blank character is '@' is a Lua statement;
 *     "@@" at that position emits a literal '@' line instead;
 *   - ${expr} anywhere in a text line is replaced by tostring(expr); "$${" emits "${".
 * The template is translated into a Lua chunk with the same line numbers as the template,
 * so Lua errors and tracebacks name template lines. Output carries #line directives that
 * map every emitted text line back to its template line, so an NVRTC error names the
 * template file and line. */
#ifndef MG_RENDER_H
#define MG_RENDER_H
#include <stddef.h>

#include "mg_buf.h"
#include "mg_diag.h"
#include "mg_lua.h"

/* Translates a template to Lua source (appended to lua_out). name is the template's
 * display path, used in the #line directives. Errors: MLAGEN_ETEMPLATE (an unclosed
 * ${, with name:line), MLAGEN_ENOMEM. */
int mg_render_translate(const char *tpl, size_t len, const char *name, mg_buf *lua_out,
                        mg_diag *d);

/* Translates and runs a template in L, appending its output to out. Globals already set
 * in L (such as `spec`) are visible to the template. Errors: those of
 * mg_render_translate and mg_lua_run. */
int mg_render(mg_lua *L, const char *tpl, size_t len, const char *name, mg_buf *out,
              mg_diag *d);
#endif
