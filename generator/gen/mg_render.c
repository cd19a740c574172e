/* mg_render.c: the template renderer (language in docs/templates.md).
 *
 * Translation. Template line N becomes exactly Lua line N: a statement line is copied
 * as is; a text line becomes calls on one line,
 *     __mg_text(N, "literal"); __mg_expr(N, "src", (src)); __mg_text(N, "rest\n");
 * (the ';' keeps a next line starting with '(' from calling the last result), and line
 * 1 is prefixed with
 *     local __mg_text <const>, __mg_expr <const> = __mg_text, __mg_expr;
 * so the chunk works on constant locals: assigning one is a compile error, and changing
 * the globals has no effect.
 *
 * Running. The two helpers are C closures over a per-render context (a full userdata);
 * they are stored raw in _G just for the run, and the context is disarmed afterwards,
 * so a helper kept by a template raises instead of writing into a stale buffer. The
 * helpers write straight into the output buffer and insert "#line N" directives. */
#include "mg_render.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <string.h>

#include "mlagen.h"

#define PRELUDE "local __mg_text <const>, __mg_expr <const> = __mg_text, __mg_expr; "

/* ---- translation --------------------------------------------------------------- */

/* Appends s[0..n) as a Lua string literal on one line. */
static int add_lua_string(mg_buf *o, const char *s, size_t n) {
  if (mg_buf_add(o, "\"", 1)) return MLAGEN_ENOMEM;
  size_t run = 0; /* start of the pending run of bytes that need no escape */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    switch (c) {
      case '"': memcpy(esc, "\\\"", 3); break;
      case '\\': memcpy(esc, "\\\\", 3); break;
      case '\n': memcpy(esc, "\\n", 3); break;
      case '\r': memcpy(esc, "\\r", 3); break;
      case '\t': memcpy(esc, "\\t", 3); break;
      default:
        if (c >= 0x20 && c != 0x7f) continue;
        snprintf(esc, sizeof esc, "\\%03u", (unsigned)c); /* 3 digits: a digit may follow */
    }
    if (mg_buf_add(o, s + run, i - run) || mg_buf_adds(o, esc)) return MLAGEN_ENOMEM;
    run = i + 1;
  }
  if (mg_buf_add(o, s + run, n - run) || mg_buf_add(o, "\"", 1)) return MLAGEN_ENOMEM;
  return 0;
}

enum { SCAN_OK, SCAN_UNCLOSED, SCAN_COMMENT };

/* s[0..n) is the rest of the line after "${". Finds the '}' that closes it, counting
 * braces and skipping Lua strings ('...', "...", [[...]], [==[...]==]). */
static int scan_expr(const char *s, size_t n, size_t *end) {
  int depth = 1;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '{') {
      depth++;
    } else if (c == '}') {
      if (--depth == 0) {
        *end = i;
        return SCAN_OK;
      }
    } else if (c == '"' || c == '\'') {
      for (i++; i < n && s[i] != c; i++)
        if (s[i] == '\\') i++;
      if (i >= n) return SCAN_UNCLOSED;
    } else if (c == '[') {
      size_t j = i + 1;
      while (j < n && s[j] == '=') j++;
      if (j < n && s[j] == '[') { /* long bracket of level j-i-1 */
        size_t level = j - i - 1, k = j + 1;
        for (;; k++) {
          if (k >= n) return SCAN_UNCLOSED;
          if (s[k] != ']') continue;
          size_t e = k + 1;
          while (e < n && s[e] == '=') e++;
          if (e < n && s[e] == ']' && e - k - 1 == level) break;
        }
        i = k + level + 1; /* the closing ']' */
      }
    } else if (c == '-' && i + 1 < n && s[i + 1] == '-') {
      return SCAN_COMMENT;
    }
  }
  return SCAN_UNCLOSED;
}

/* Emits __mg_text(ln, "lit") for the pending literal, if any. */
static int flush_text(mg_buf *o, mg_buf *lit, long ln) {
  if (lit->len == 0) return 0;
  int rc = mg_buf_addf(o, "__mg_text(%ld, ", ln);
  if (!rc) rc = add_lua_string(o, lit->data, lit->len);
  if (!rc) rc = mg_buf_adds(o, "); ");
  mg_buf_reset(lit);
  return rc;
}

/* Translates text line ln, p[0..n) without its newline; from: where markup may start
 * (after the "@@" of an escaped '@' line; the part before it is in lit already). */
static int text_line(mg_buf *o, mg_buf *lit, long ln, const char *p, size_t n, size_t from,
                     int has_nl, const char *name, mg_diag *d) {
  size_t i = from;
  while (i < n) {
    const char *dollar = memchr(p + i, '$', n - i);
    size_t j = dollar ? (size_t)(dollar - p) : n;
    if (mg_buf_add(lit, p + i, j - i)) return MLAGEN_ENOMEM;
    i = j;
    if (i >= n) break;
    if (i + 2 < n && p[i + 1] == '$' && p[i + 2] == '{') { /* "$${" -> "${" */
      if (mg_buf_add(lit, "${", 2)) return MLAGEN_ENOMEM;
      i += 3;
      continue;
    }
    if (i + 1 >= n || p[i + 1] != '{') { /* a lone '$' */
      if (mg_buf_add(lit, "$", 1)) return MLAGEN_ENOMEM;
      i++;
      continue;
    }
    const char *src = p + i + 2;
    size_t len = 0;
    int sc = scan_expr(src, n - i - 2, &len);
    if (sc == SCAN_UNCLOSED) return mg_diag_set(d, MLAGEN_ETEMPLATE, "%s:%ld: unclosed ${", name, ln);
    if (sc == SCAN_COMMENT)
      return mg_diag_set(d, MLAGEN_ETEMPLATE, "%s:%ld: a Lua comment (--) inside ${...}", name, ln);
    size_t k = 0;
    while (k < len && (src[k] == ' ' || src[k] == '\t')) k++;
    if (k == len) return mg_diag_set(d, MLAGEN_ETEMPLATE, "%s:%ld: empty ${}", name, ln);
    if (flush_text(o, lit, ln) || mg_buf_addf(o, "__mg_expr(%ld, ", ln) ||
        add_lua_string(o, src, len) || mg_buf_adds(o, ", (") || mg_buf_add(o, src, len) ||
        mg_buf_adds(o, ")); "))
      return MLAGEN_ENOMEM;
    i += 2 + len + 1;
  }
  if (has_nl && mg_buf_add(lit, "\n", 1)) return MLAGEN_ENOMEM;
  return flush_text(o, lit, ln) ? MLAGEN_ENOMEM : 0;
}

/* Appends a statement line, its lone '\r's made blanks: Lua counts a '\r' as a line
 * break, which would shift every later line. */
static int statement_line(mg_buf *o, const char *p, size_t n) {
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] != '\r') continue;
    if (mg_buf_add(o, p + run, i - run) || mg_buf_add(o, " ", 1)) return MLAGEN_ENOMEM;
    run = i + 1;
  }
  return mg_buf_add(o, p + run, n - run);
}

int mg_render_translate(const char *tpl, size_t len, const char *name, mg_buf *lua_out,
                        mg_diag *d) {
  if (!name) name = "template";
  size_t start = lua_out->len;
  mg_buf lit;
  mg_buf_init(&lit, 0);
  int rc = mg_buf_adds(lua_out, PRELUDE);
  long ln = 0;
  size_t pos = 0;
  while (!rc && pos < len) {
    ln++;
    const char *p = tpl + pos;
    const char *nl = memchr(p, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - p) : len - pos;
    pos += n + (nl != NULL);
    if (nl && n > 0 && p[n - 1] == '\r') n--; /* CRLF */
    size_t q = 0;
    while (q < n && (p[q] == ' ' || p[q] == '\t')) q++;
    if (q < n && p[q] == '@' && !(q + 1 < n && p[q + 1] == '@')) {
      rc = statement_line(lua_out, p + q + 1, n - q - 1);
    } else if (q < n && p[q] == '@') { /* "@@": keep the blanks and one '@' */
      mg_buf_reset(&lit);
      rc = mg_buf_add(&lit, p, q + 1);
      if (!rc) rc = text_line(lua_out, &lit, ln, p, n, q + 2, nl != NULL, name, d);
    } else {
      mg_buf_reset(&lit);
      rc = text_line(lua_out, &lit, ln, p, n, 0, nl != NULL, name, d);
    }
    if (!rc) rc = mg_buf_add(lua_out, "\n", 1);
  }
  mg_buf_free(&lit);
  if (rc) {
    lua_out->len = start;
    if (lua_out->data) lua_out->data[start] = '\0';
    if (rc == MLAGEN_ENOMEM)
      mg_diag_set(d, rc, "%s: out of memory translating the template", name);
  }
  return rc;
}

/* ---- running ------------------------------------------------------------------- */

typedef struct render_ctx {
  mg_buf *out;       /* NULL when no render is running: the helpers then refuse */
  const char *qname; /* the name escaped for a C string literal */
  long next;         /* template line the compiler gives the next output line; 0: none */
  int status;        /* a failed write (MLAGEN_ELIMIT, MLAGEN_ENOMEM); sticky */
} render_ctx;

static lua_Integer check_line(lua_State *L) {
  lua_Integer ln = luaL_checkinteger(L, 1);
  luaL_argcheck(L, ln >= 1 && ln <= 2147483647, 1, "bad template line");
  return ln;
}

/* Appends s[0..n) of template line ln, first a "#line" when the line starts a new
 * output line that the compiler would number differently. */
static void put(lua_State *L, render_ctx *c, lua_Integer ln, const char *s, size_t n) {
  if (!c->out) luaL_error(L, "template output helper called outside its render");
  if (c->status) luaL_error(L, "template output failed");
  mg_buf *b = c->out;
  int bol = b->len == 0 || b->data[b->len - 1] == '\n';
  int nl_first = !bol && c->next == 0; /* the render started mid-line */
  int directive = (bol || nl_first) && c->next != ln;
  size_t dlen = directive ? (size_t)snprintf(NULL, 0, "#line %lld \"%s\"\n", (long long)ln,
                                             c->qname)
                          : 0;
  size_t need = (size_t)nl_first + dlen;
  if (n > b->max - b->len || need > b->max - b->len - n) {
    c->status = MLAGEN_ELIMIT;
    luaL_error(L, "template output exceeded the cap of %zu bytes", b->max);
  }
  size_t start = b->len;
  int rc = nl_first ? mg_buf_add(b, "\n", 1) : 0;
  if (!rc && directive) rc = mg_buf_addf(b, "#line %lld \"%s\"\n", (long long)ln, c->qname);
  if (!rc) rc = mg_buf_add(b, s, n);
  if (rc) {
    b->len = start;
    if (b->data) b->data[start] = '\0';
    c->status = MLAGEN_ENOMEM;
    luaL_error(L, "out of memory writing the template output");
  }
  if (directive) c->next = (long)ln;
  for (const char *e = s + n; (s = memchr(s, '\n', (size_t)(e - s))) != NULL; s++) c->next++;
}

/* __mg_text(line, literal) */
static int l_text(lua_State *L) {
  render_ctx *c = lua_touserdata(L, lua_upvalueindex(1));
  lua_Integer ln = check_line(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  put(L, c, ln, s, n);
  return 0;
}

/* __mg_expr(line, source, value): tostring(value); nil is an error. */
static int l_expr(lua_State *L) {
  render_ctx *c = lua_touserdata(L, lua_upvalueindex(1));
  lua_Integer ln = check_line(L);
  if (lua_isnoneornil(L, 3))
    return luaL_error(L, "${%s} is nil", luaL_optstring(L, 2, "?"));
  size_t n;
  const char *s = luaL_tolstring(L, 3, &n);
  put(L, c, ln, s, n);
  return 0;
}

/* Protected: pushes a fresh context and stores the helpers over it raw in _G. */
static int install(lua_State *L) {
  render_ctx *c = lua_newuserdatauv(L, sizeof *c, 0);
  memset(c, 0, sizeof *c);
  lua_pushglobaltable(L);
  lua_pushliteral(L, "__mg_text");
  lua_pushvalue(L, 1);
  lua_pushcclosure(L, l_text, 1);
  lua_rawset(L, 2);
  lua_pushliteral(L, "__mg_expr");
  lua_pushvalue(L, 1);
  lua_pushcclosure(L, l_expr, 1);
  lua_rawset(L, 2);
  lua_settop(L, 1);
  return 1;
}

/* Protected: removes the helpers from _G. */
static int uninstall(lua_State *L) {
  lua_pushglobaltable(L);
  lua_pushliteral(L, "__mg_text");
  lua_pushnil(L);
  lua_rawset(L, -3);
  lua_pushliteral(L, "__mg_expr");
  lua_pushnil(L);
  lua_rawset(L, -3);
  return 0;
}

/* The name escaped for a C string literal (control bytes become '?'). */
static int quote_name(mg_buf *q, const char *name) {
  for (const char *s = name; *s; s++) {
    unsigned char c = (unsigned char)*s;
    int rc = (c == '"' || c == '\\') ? mg_buf_addf(q, "\\%c", c)
             : (c < 0x20 || c == 0x7f) ? mg_buf_add(q, "?", 1)
                                       : mg_buf_add(q, s, 1);
    if (rc) return MLAGEN_ENOMEM;
  }
  return mg_buf_add(q, "", 0);
}

int mg_render(mg_lua *M, const char *tpl, size_t len, const char *name, mg_buf *out,
              mg_diag *d) {
  if (!name) name = "template";
  mg_buf code, qname, chunkname;
  mg_buf_init(&code, 0);
  mg_buf_init(&qname, 0);
  mg_buf_init(&chunkname, 0);
  lua_State *L = mg_lua_state(M);
  int base = lua_gettop(L);
  int rc = mg_render_translate(tpl, len, name, &code, d);
  if (!rc && (quote_name(&qname, name) || mg_buf_addf(&chunkname, "@%s", name)))
    rc = mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory", name);
  if (!rc && !lua_checkstack(L, 3))
    rc = mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory (Lua stack)", name);
  if (!rc) {
    lua_pushcfunction(L, install);
    if (lua_pcall(L, 0, 1, 0) != LUA_OK)
      rc = mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory setting up the render", name);
  }
  if (!rc) {
    render_ctx *c = lua_touserdata(L, -1);
    size_t start = out->len;
    c->out = out;
    c->qname = mg_buf_str(&qname);
    rc = mg_lua_run(M, code.data, code.len, chunkname.data, 0, d);
    if (c->status == MLAGEN_ELIMIT)
      rc = mg_diag_set(d, c->status, "%s: template output exceeded the cap of %zu bytes", name,
                       out->max);
    else if (c->status)
      rc = mg_diag_set(d, c->status, "%s: out of memory writing the template output", name);
    c->out = NULL; /* disarm helpers the template may have kept */
    if (rc) {
      out->len = start;
      if (out->data) out->data[start] = '\0';
    }
    lua_pushcfunction(L, uninstall);
    (void)lua_pcall(L, 0, 0, 0); /* best effort: the helpers are disarmed anyway */
  }
  lua_settop(L, base);
  mg_buf_free(&code);
  mg_buf_free(&qname);
  mg_buf_free(&chunkname);
  return rc;
}
