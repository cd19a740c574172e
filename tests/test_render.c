/* test_render.c: the sandboxed Lua host (mg_lua) and the template renderer (mg_render). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <lauxlib.h>
#include <lua.h>

#include "mg_lua.h"
#include "mg_render.h"
#include "mlagen.h"

/* ---- helpers ------------------------------------------------------------------- */

static mg_lua *open_lua_t(size_t mem, long instr, double seconds) {
  mg_lua_limits lim = {mem, instr, seconds};
  mg_lua *L = NULL;
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_lua_open(&L, &lim, &d), 0);
  assert_non_null(L);
  mg_diag_clear(&d);
  return L;
}

static mg_lua *open_lua(size_t mem, long instr) { return open_lua_t(mem, instr, 0); }

/* Renders tpl as "t.tpl"; the output (or "") is in out, the message in d. */
static int render(mg_lua *L, const char *tpl, mg_buf *out, mg_diag *d) {
  mg_buf_reset(out);
  mg_diag_clear(d);
  return mg_render(L, tpl, strlen(tpl), "t.tpl", out, d);
}

static void expect_render(mg_lua *L, const char *tpl, const char *expect) {
  mg_buf out;
  mg_buf_init(&out, 0);
  mg_diag d = MG_DIAG_INIT;
  int rc = render(L, tpl, &out, &d);
  if (rc) fail_msg("render failed (%d): %s", rc, mg_diag_msg(&d));
  assert_string_equal(mg_buf_str(&out), expect);
  mg_buf_free(&out);
  mg_diag_clear(&d);
}

/* Renders tpl expecting status; the message must contain each non-NULL needle. */
static void expect_error(mg_lua *L, const char *tpl, int status, const char *n1,
                         const char *n2) {
  mg_buf out;
  mg_buf_init(&out, 0);
  mg_diag d = MG_DIAG_INIT;
  int rc = render(L, tpl, &out, &d);
  if (rc != status) fail_msg("status %d, expected %d: %s", rc, status, mg_diag_msg(&d));
  /* one position in front of the message, never two ("t.tpl:2: t.tpl:5: ...") */
  const char *m = mg_diag_msg(&d), *first = strstr(m, ".tpl:");
  if (first && strncmp(m, "t.tpl:", 6) == 0) {
    const char *sp = strchr(m, ' ');
    if (sp && strncmp(sp + 1, "t.tpl:", 6) == 0) fail_msg("two positions: %s", m);
  }
  if (n1 && !strstr(mg_diag_msg(&d), n1)) fail_msg("'%s' not in: %s", n1, mg_diag_msg(&d));
  if (n2 && !strstr(mg_diag_msg(&d), n2)) fail_msg("'%s' not in: %s", n2, mg_diag_msg(&d));
  assert_string_equal(mg_buf_str(&out), ""); /* a failed render leaves out unchanged */
  mg_buf_free(&out);
  mg_diag_clear(&d);
}

/* Runs a plain chunk with mg_lua_run. */
static void expect_run(mg_lua *L, const char *chunk, int status, const char *n1,
                       const char *n2) {
  mg_diag d = MG_DIAG_INIT;
  lua_State *S = mg_lua_state(L);
  int top = lua_gettop(S);
  int rc = mg_lua_run(L, chunk, strlen(chunk), "@sb.lua", 0, &d);
  if (rc != status) fail_msg("%s: status %d, expected %d: %s", chunk, rc, status, mg_diag_msg(&d));
  if (n1 && !strstr(mg_diag_msg(&d), n1)) fail_msg("'%s' not in: %s", n1, mg_diag_msg(&d));
  if (n2 && !strstr(mg_diag_msg(&d), n2)) fail_msg("'%s' not in: %s", n2, mg_diag_msg(&d));
  assert_int_equal(lua_gettop(S), top);
  mg_diag_clear(&d);
}

/* The state still renders after an aborted run. */
static void expect_usable(mg_lua *L) {
  expect_render(L, "ok ${1 + 1}\n", "#line 1 \"t.tpl\"\nok 2\n");
}

/* ---- the language -------------------------------------------------------------- */

static void test_expressions(void **state) {
  (void)state;
  mg_lua *L = open_lua(0, 0);
  expect_render(L, "a ${1+2} b ${'x' .. \"y\"} c\n", "#line 1 \"t.tpl\"\na 3 b xy c\n");
  expect_render(L, "${3} ${3.0} ${7 // 2} ${7 / 2} ${2^10} ${true}\n",
                "#line 1 \"t.tpl\"\n3 3.0 3 3.5 1024.0 true\n");
  expect_render(L, "v = ${string.format('%05.2f|%d|%s', 3.14159, 42, 'k')};\n",
                "#line 1 \"t.tpl\"\nv = 03.14|42|k;\n");
  /* nested braces, strings holding braces and quotes, a long string */
  expect_render(L, "${ ({a = {b = 5}}).a.b } ${#{1, 2, 3}} ${'}' .. \"{\\\"}\"} ${[[}]]}\n",
                "#line 1 \"t.tpl\"\n5 3 }{\"} }\n");
  /* literal "${", "@", a lone '$', and characters Lua strings must escape */
  expect_render(L, "$${x} costs $5 \\ \"q\" \t tab\n",
                "#line 1 \"t.tpl\"\n${x} costs $5 \\ \"q\" \t tab\n");
  expect_render(L, "@@include x\n  @@ ${1}\n", "#line 1 \"t.tpl\"\n@include x\n  @ 1\n");
  mg_lua_close(L);
}

static void test_statements(void **state) {
  (void)state;
  mg_lua *L = open_lua(0, 0);
  /* conditionals; a statement line indented; statement lines emit nothing */
  expect_render(L,
                "@ local n = 4\n"
                "  @ if n > 3 then\n"
                "big ${n}\n"
                "@ else\n"
                "small ${n}\n"
                "@ end\n",
                "#line 3 \"t.tpl\"\nbig 4\n");
  /* a function defined in the template, emitting text, called later */
  expect_render(L,
                "@ local function field(t, n)\n"
                "  ${t} ${n};\n"
                "@ end\n"
                "struct S {\n"
                "@ field('int', 'a')\n"
                "@ field('float', 'b')\n"
                "};\n",
                "#line 4 \"t.tpl\"\nstruct S {\n"
                "#line 2 \"t.tpl\"\n  int a;\n"
                "#line 2 \"t.tpl\"\n  float b;\n"
                "#line 7 \"t.tpl\"\n};\n");
  /* the example of docs/templates.md */
  lua_State *S = mg_lua_state(L);
  lua_createtable(S, 0, 1);
  lua_pushinteger(S, 16);
  lua_setfield(S, -2, "heads");
  lua_setglobal(S, "spec");
  expect_render(L,
                "@ local n = spec.heads\n"
                "// ${n} heads\n"
                "@ for i = 0, 1 do\n"
                "float acc${i} = ${i * 0.5}f;\n"
                "@ end\n"
                "$${not an expression} @@ is text too\n",
                "#line 2 \"t.tpl\"\n// 16 heads\n"
                "#line 4 \"t.tpl\"\nfloat acc0 = 0.0f;\n"
                "#line 4 \"t.tpl\"\nfloat acc1 = 0.5f;\n"
                "#line 6 \"t.tpl\"\n${not an expression} @@ is text too\n");
  /* a statement line starting with '(' does not call the text line before it */
  expect_render(L, "x\n@ (function() end)()\ny\n",
                "#line 1 \"t.tpl\"\nx\n#line 3 \"t.tpl\"\ny\n");
  mg_lua_close(L);
}

static void test_line_directives(void **state) {
  (void)state;
  mg_lua *L = open_lua(0, 0);
  /* directives only where the numbering breaks: first line, loop, after statements */
  expect_render(L,
                "// head\n"
                "// two\n"
                "@ for i = 1, 3 do\n"
                "x${i} = ${i * i};\n"
                "y${i};\n"
                "@ end\n"
                "// tail\n",
                "#line 1 \"t.tpl\"\n// head\n// two\n"
                "#line 4 \"t.tpl\"\nx1 = 1;\ny1;\n"
                "#line 4 \"t.tpl\"\nx2 = 4;\ny2;\n"
                "#line 4 \"t.tpl\"\nx3 = 9;\ny3;\n"
                "#line 7 \"t.tpl\"\n// tail\n");
  /* a value holding a newline: the next line gets a directive */
  expect_render(L, "a ${'1\\n2'} b\nc\n", "#line 1 \"t.tpl\"\na 1\n2 b\n#line 2 \"t.tpl\"\nc\n");
  /* a value ending in a newline: the rest of the line is re-synchronized */
  expect_render(L, "${'v\\n'}w\nz\n", "#line 1 \"t.tpl\"\nv\n#line 1 \"t.tpl\"\nw\nz\n");
  /* no trailing newline; CRLF input */
  expect_render(L, "a\r\n@ local v = 2\r\nb ${v}", "#line 1 \"t.tpl\"\na\n#line 3 \"t.tpl\"\nb 2");
  /* empty template, statement-only template */
  expect_render(L, "", "");
  expect_render(L, "@ local x = 1\n", "");
  /* the name is escaped in the directive */
  mg_buf out;
  mg_buf_init(&out, 0);
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_render(L, "q\n", 2, "a\"b\\c.tpl", &out, &d), 0);
  assert_string_equal(mg_buf_str(&out), "#line 1 \"a\\\"b\\\\c.tpl\"\nq\n");
  /* output is appended; a render starting mid-line starts its own line */
  mg_buf_reset(&out);
  mg_buf_adds(&out, "prev");
  assert_int_equal(mg_render(L, "q\n", 2, "t.tpl", &out, &d), 0);
  assert_string_equal(mg_buf_str(&out), "prev\n#line 1 \"t.tpl\"\nq\n");
  mg_buf_free(&out);
  mg_lua_close(L);
}

static void test_translate(void **state) {
  (void)state;
  mg_buf o;
  mg_buf_init(&o, 0);
  mg_diag d = MG_DIAG_INIT;
  const char *tpl = "a${x}b\n@ y()\n\n$${\"}";
  assert_int_equal(mg_render_translate(tpl, strlen(tpl), "t.tpl", &o, &d), 0);
  assert_string_equal(mg_buf_str(&o),
                      "local __mg_text <const>, __mg_expr <const> = __mg_text, __mg_expr; "
                      "__mg_text(1, \"a\"); __mg_expr(1, \"x\", (x)); __mg_text(1, \"b\\n\"); \n"
                      " y()\n"
                      "__mg_text(3, \"\\n\"); \n"
                      "__mg_text(4, \"${\\\"}\"); \n");
  /* unclosed ${, at the line it opens on; an unclosed string inside one */
  const char *bad[] = {"ok\n\nx ${a + {1}\n", "ok\n\nx ${'}' .. \"}}\n", "ok\n\n${[==[}]=]}\n"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mg_buf_reset(&o);
    assert_int_equal(mg_render_translate(bad[i], strlen(bad[i]), "t.tpl", &o, &d),
                     MLAGEN_ETEMPLATE);
    assert_string_equal(mg_diag_msg(&d), "t.tpl:3: unclosed ${");
    assert_int_equal(o.len, 0);
  }
  assert_int_equal(mg_render_translate("${ }", 4, "t.tpl", &o, &d), MLAGEN_ETEMPLATE);
  assert_string_equal(mg_diag_msg(&d), "t.tpl:1: empty ${}");
  assert_int_equal(mg_render_translate("${a -- b}", 9, "t.tpl", &o, &d), MLAGEN_ETEMPLATE);
  assert_non_null(strstr(mg_diag_msg(&d), "t.tpl:1: "));
  mg_buf_free(&o);
  mg_diag_clear(&d);
}

static void test_errors(void **state) {
  (void)state;
  mg_lua *L = open_lua(0, 0);
  /* a runtime error on template line 7 */
  expect_error(L, "a\n@ local t = {}\nb\n\n@ for i = 1, 2 do\nc\n${t.x.y}\n@ end\n",
               MLAGEN_ETEMPLATE, "t.tpl:7: attempt to index a nil value", "stack traceback:");
  /* ... raised from a template function: the traceback names both lines */
  expect_error(L, "@ local function f()\n@   error('boom')\n@ end\nx\n@ f()\n", MLAGEN_ETEMPLATE,
               "t.tpl:2: boom", "t.tpl:5:");
  /* errors raised in C (library functions) or without a position get the template line
   * in front too: the message itself names it, not only the traceback */
  expect_error(L, "a\n@ local t = {} for i = 1, 200 do t[i] = i end\n"
               "@ table.sort(t, function(x, y) return true end)\n",
               MLAGEN_ETEMPLATE, "t.tpl:3: invalid order function for sorting", NULL);
  expect_error(L, "a\nb\n@ error({})\n", MLAGEN_ETEMPLATE, "t.tpl:3: (error object is a table value)",
               NULL);
  expect_error(L, "@ error('no position', 0)\n", MLAGEN_ETEMPLATE, "t.tpl:1: no position", NULL);
  /* error(msg, 2) from a template function names its caller's line, once (a prefix of the
   * function's own line in front of it would point at the wrong place: prelude.lua's checks) */
  expect_error(L, "@ local function check(x)\n@   error('bad ' .. x, 2)\n@ end\nx\n@ check('y')\n",
               MLAGEN_ETEMPLATE, "t.tpl:5: bad y", NULL);
  /* a syntax error names its line */
  expect_error(L, "a\nb\n@ if then\n", MLAGEN_ETEMPLATE, "t.tpl:3:", "near 'then'");
  expect_error(L, "a\n@ for i = 1, 2 do\nb\n", MLAGEN_ETEMPLATE, "t.tpl:", "'end' expected");
  /* a lone '\r' in a statement line does not shift the line numbers */
  expect_error(L, "@ local a = 1\r local b = 2\nx\n@ error('e')\n", MLAGEN_ETEMPLATE,
               "t.tpl:3: e", NULL);
  /* an unclosed ${ */
  expect_error(L, "a\nb ${x\n", MLAGEN_ETEMPLATE, "t.tpl:2: unclosed ${", NULL);
  /* a nil expression: the line and the expression */
  expect_error(L, "a\n${spec_typo.x}\n", MLAGEN_ETEMPLATE, "t.tpl:2:", "spec_typo");
  expect_error(L, "a\n\n  ${nope}\n", MLAGEN_ETEMPLATE, "t.tpl:3: ${nope} is nil", NULL);
  expect_error(L, "${(function() end)()}\n", MLAGEN_ETEMPLATE, "t.tpl:1: ${(function() end)()} is nil",
               NULL);
  /* error objects that are not strings */
  expect_error(L, "@ error({})\n", MLAGEN_ETEMPLATE, "(error object is a table value)", NULL);
  expect_error(L, "@ error()\n", MLAGEN_ETEMPLATE, "(error object is a nil value)", NULL);
  expect_error(L, "@ error(setmetatable({}, {__tostring = function() return 'custom' end}))\n",
               MLAGEN_ETEMPLATE, "custom", NULL);
  expect_error(L, "@ error(42)\n", MLAGEN_ETEMPLATE, "42", NULL);
  /* a __tostring that returns no string */
  expect_error(L, "${setmetatable({}, {__tostring = function() return {} end})}\n",
               MLAGEN_ETEMPLATE, "t.tpl:1:", "__tostring");
  expect_usable(L);
  mg_lua_close(L);
}

static void test_globals_from_c(void **state) {
  (void)state;
  mg_lua *L = open_lua(0, 0);
  lua_State *S = mg_lua_state(L);
  lua_createtable(S, 0, 3);
  lua_pushinteger(S, 128);
  lua_setfield(S, -2, "head_dim");
  lua_pushstring(S, "mla_fwd");
  lua_setfield(S, -2, "name");
  lua_createtable(S, 2, 0);
  lua_pushinteger(S, 16);
  lua_rawseti(S, -2, 1);
  lua_pushinteger(S, 64);
  lua_rawseti(S, -2, 2);
  lua_setfield(S, -2, "tiles");
  lua_setglobal(S, "spec");
  expect_render(L,
                "__global__ void ${spec.name}() {\n"
                "@ for i, t in ipairs(spec.tiles) do\n"
                "  int t${i} = ${t} * ${spec.head_dim};\n"
                "@ end\n"
                "}\n",
                "#line 1 \"t.tpl\"\n__global__ void mla_fwd() {\n"
                "#line 3 \"t.tpl\"\n  int t1 = 16 * 128;\n"
                "#line 3 \"t.tpl\"\n  int t2 = 64 * 128;\n"
                "#line 5 \"t.tpl\"\n}\n");
  /* the helpers are not left in _G, and a kept helper refuses to write later */
  expect_render(L, "@ kept = __mg_text\n", "");
  lua_getglobal(S, "__mg_text");
  assert_true(lua_isnil(S, -1));
  lua_pop(S, 1);
  expect_error(L, "@ kept(1, 'x')\n", MLAGEN_ETEMPLATE, "outside its render", NULL);
  /* changing the reserved globals does not break the render; assigning the reserved
   * locals is a compile error */
  expect_render(L, "@ _G.__mg_text = nil; _ENV.__mg_expr = print\na ${1}\n",
                "#line 2 \"t.tpl\"\na 1\n");
  expect_error(L, "a\n@ __mg_text = nil\n", MLAGEN_ETEMPLATE,
               "t.tpl:2: attempt to assign to const variable '__mg_text'", NULL);
  /* mg_lua_run leaves the results */
  mg_diag d = MG_DIAG_INIT;
  int top = lua_gettop(S);
  const char *chunk = "return spec.head_dim * 2, 'x'";
  assert_int_equal(mg_lua_run(L, chunk, strlen(chunk), "=r", 2, &d), 0);
  assert_int_equal(lua_gettop(S), top + 2);
  assert_int_equal(lua_tointeger(S, -2), 256);
  assert_string_equal(lua_tostring(S, -1), "x");
  lua_settop(S, top);
  mg_lua_close(L);
}

static void test_output_cap(void **state) {
  (void)state;
  mg_lua *L = open_lua(0, 0);
  mg_buf out;
  mg_buf_init(&out, 64);
  mg_diag d = MG_DIAG_INIT;
  const char *tpl = "@ for i = 1, 100 do\n@ pcall(function()\nline ${i}\n@ end)\n@ end\n";
  assert_int_equal(mg_render(L, tpl, strlen(tpl), "t.tpl", &out, &d), MLAGEN_ELIMIT);
  assert_non_null(strstr(mg_diag_msg(&d), "output exceeded the cap of 64 bytes"));
  assert_int_equal(out.len, 0);
  mg_buf_free(&out);
  mg_diag_clear(&d);
  expect_usable(L);
  mg_lua_close(L);
}

/* ---- the sandbox --------------------------------------------------------------- */

static void test_sandbox_globals(void **state) {
  (void)state;
  mg_lua *L = open_lua(0, 0);
  expect_run(L, "os.execute('touch /tmp/mlagen-pwned')", MLAGEN_ETEMPLATE,
             "sb.lua:1: attempt to index a nil value (global 'os')", "stack traceback:");
  expect_run(L, "\nlocal f = io.open('/etc/passwd')", MLAGEN_ETEMPLATE,
             "sb.lua:2: attempt to index a nil value (global 'io')", NULL);
  expect_run(L, "require('os')", MLAGEN_ETEMPLATE, "global 'require'", NULL);
  expect_run(L, "dofile('/etc/passwd')", MLAGEN_ETEMPLATE, "global 'dofile'", NULL);
  expect_run(L, "loadfile('/etc/passwd')", MLAGEN_ETEMPLATE, "global 'loadfile'", NULL);
  expect_run(L, "print('x')", MLAGEN_ETEMPLATE, "global 'print'", NULL);
  expect_run(L, "collectgarbage()", MLAGEN_ETEMPLATE, "global 'collectgarbage'", NULL);
  expect_run(L, "debug.getregistry()", MLAGEN_ETEMPLATE, "global 'debug'", NULL);
  expect_run(L, "package.loadlib('x', 'y')", MLAGEN_ETEMPLATE, "global 'package'", NULL);
  expect_run(L, "coroutine.wrap(print)", MLAGEN_ETEMPLATE, "global 'coroutine'", NULL);
  expect_run(L, "assert(os == nil and io == nil and debug == nil and package == nil)", 0, NULL,
             NULL);
  /* string.dump is gone, also through the string metatable */
  expect_run(L, "string.dump(function() end)", MLAGEN_ETEMPLATE, "field 'dump'", NULL);
  expect_run(L, "('x'):dump()", MLAGEN_ETEMPLATE, "method 'dump'", NULL);
  expect_run(L, "getmetatable('').__index.dump(print)", MLAGEN_ETEMPLATE, "field 'dump'", NULL);
  /* _G's metatable is protected */
  expect_run(L, "setmetatable(_G, {__index = function() return 1 end})", MLAGEN_ETEMPLATE,
             "cannot change a protected metatable", NULL);
  /* the libraries that are there work */
  expect_run(L,
             "assert(math.max(1, 2) == 2 and table.concat({'a', 'b'}) == 'ab'"
             " and utf8.char(65) == 'A' and ('%d'):format(3) == '3')",
             0, NULL, NULL);
  /* the render path refuses the same way */
  expect_error(L, "x\n${os.getenv('HOME')}\n", MLAGEN_ETEMPLATE, "t.tpl:2:", "global 'os'");
  mg_lua_close(L);
}

/* No pattern matching (its backtracking runs in C, beyond the instruction cap); find is a
 * plain search. Input errors raised as error({msg}) are EINVAL without a traceback. */
static void test_sandbox_patterns_and_input_errors(void **state) {
  (void)state;
  mg_lua *L = open_lua(0, 1000000);
  expect_run(L, "('a'):rep(30):match(('a?'):rep(30) .. ('a'):rep(30) .. 'b')", MLAGEN_ETEMPLATE,
             "method 'match'", NULL);
  expect_run(L, "string.gsub('x', 'x', 'y')", MLAGEN_ETEMPLATE, "field 'gsub'", NULL);
  expect_run(L, "string.gmatch('x', '.')", MLAGEN_ETEMPLATE, "field 'gmatch'", NULL);
  expect_run(L, "assert(('a.c'):find('.c') == 2 and ('abc'):find('.c') == nil)", 0, NULL, NULL);
  expect_run(L, "assert(select('#', ('a'):rep(1e6):find('.-b')) == 1)", 0, NULL, NULL); /* nil */
  expect_run(L, "error({'block_m = 7 is not allowed'})", MLAGEN_EINVAL, "block_m = 7 is not allowed",
             NULL);
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_lua_run(L, "error({'bad input'})", 20, "@sb.lua", 0, &d), MLAGEN_EINVAL);
  assert_string_equal(mg_diag_msg(&d), "bad input");
  mg_diag_clear(&d);
  expect_usable(L);
  mg_lua_close(L);
}

static void test_sandbox_binary_chunks(void **state) {
  (void)state;
  mg_lua *L = open_lua(0, 0);
  /* a binary chunk handed to mg_lua_run */
  mg_diag d = MG_DIAG_INIT;
  assert_int_equal(mg_lua_run(L, "\x1bLua\x54\x00", 6, "@bin", 0, &d), MLAGEN_EINVAL);
  assert_non_null(strstr(mg_diag_msg(&d), "binary chunks are not accepted"));
  /* a binary chunk through load(), as a string and through a reader, with any mode */
  expect_run(L, "assert(load('\\27Lua\\84\\0'))", MLAGEN_ETEMPLATE, "binary chunk", NULL);
  expect_run(L, "assert(load('\\27Lua\\84\\0', 'x', 'b'))", MLAGEN_ETEMPLATE, "binary chunk",
             NULL);
  expect_run(L, "assert(load('\\27Lua\\84\\0', 'x', 'bt', {}))", MLAGEN_ETEMPLATE,
             "binary chunk", NULL);
  expect_run(L,
             "local s = '\\27Lua\\84\\0' local f = function() local r = s s = nil return r end\n"
             "assert(load(f, 'x', 'b'))",
             MLAGEN_ETEMPLATE, "binary chunk", NULL);
  /* load(string.dump(f)) fails earlier: there is no string.dump */
  expect_run(L, "load(string.dump(function() end))", MLAGEN_ETEMPLATE, "field 'dump'", NULL);
  /* text chunks load; an env is passed through */
  expect_run(L, "assert(load('return 1 + 1')() == 2)", 0, NULL, NULL);
  expect_run(L, "assert(load('return x', 'c', 't', {x = 7})() == 7)", 0, NULL, NULL);
  expect_run(L, "assert(load('return os', 'c', 'b', {os = 5})() == 5)", 0, NULL, NULL);
  mg_diag_clear(&d);
  mg_lua_close(L);
}

static void test_sandbox_instruction_cap(void **state) {
  (void)state;
  mg_lua *L = open_lua(0, 1000000);
  expect_run(L, "while true do end", MLAGEN_ELIMIT, "instruction cap of 1000000", "sb.lua:1:");
  expect_run(L, "return 1", 0, NULL, NULL);
  /* pcall cannot swallow the limit, however deeply nested */
  expect_run(L, "while true do pcall(function() while true do end end) end", MLAGEN_ELIMIT,
             "instruction cap", NULL);
  expect_run(L,
             "local function f() while true do end end\n"
             "local function g() while true do pcall(f) end end\n"
             "while true do pcall(g) xpcall(g, g) end",
             MLAGEN_ELIMIT, "instruction cap", NULL);
  /* ... nor an xpcall message handler (which Lua would call with hooks off), nor a
   * __close handler; __gc finalizers (also run with hooks off) are refused outright */
  expect_run(L, "xpcall(function() while true do end end, function() while true do end end)",
             MLAGEN_ELIMIT, "instruction cap", NULL);
  expect_run(L, "xpcall(function() error('x') end, function() while true do end end)",
             MLAGEN_ELIMIT, "instruction cap", NULL);
  expect_run(L, "setmetatable({}, {__gc = function() while true do end end})",
             MLAGEN_ETEMPLATE, "__gc metamethods are not allowed", NULL);
  expect_run(L, "setmetatable({}, {__gc = false})", MLAGEN_ETEMPLATE, "__gc", NULL);
  expect_run(L,
             "while true do pcall(function()\n"
             "  local x <close> = setmetatable({}, {__close = function() while true do end end})\n"
             "  while true do end end) end",
             MLAGEN_ELIMIT, "instruction cap", NULL);
  /* table.move loops in C, out of the hook's sight: it is charged per element */
  expect_run(L, "table.move({}, 1, 1e12, 1)", MLAGEN_ELIMIT, "sb.lua:1: template exceeded", NULL);
  expect_run(L, "local t = table.move({1, 2, 3}, 1, 3, 2) assert(t[4] == 3 and t[2] == 1)", 0,
             NULL, NULL);
  /* the cap counts per run: many small runs pass */
  for (int i = 0; i < 20; i++) expect_run(L, "for i = 1, 200000 do end", 0, NULL, NULL);
  /* the render path */
  expect_error(L, "a\n@ while true do\n@ end\n", MLAGEN_ELIMIT, "t.tpl:", "instruction cap");
  expect_usable(L);
  mg_lua_close(L);
}

/* Library functions that loop in C are charged for their work, so the instruction cap
 * stops them at once (each of these ran for minutes to forever under the default caps);
 * their ordinary uses still work. */
static void test_sandbox_c_loops_charged(void **state) {
  (void)state;
  mg_lua *L = open_lua(0, 0); /* the generator's limits */
  expect_run(L, "local s = ('').rep('', math.maxinteger)", MLAGEN_ELIMIT,
             "sb.lua:1: template exceeded the instruction cap", NULL);
  expect_run(L, "local s = string.rep('', 1e15, '')", MLAGEN_ELIMIT, "instruction cap", NULL);
  expect_run(L, "assert(('ab'):rep(3, ',') == 'ab,ab,ab' and ('').rep('', 100) == '')", 0, NULL,
             NULL);
  /* insert/remove on a table whose __len lies: the shift is charged, the length read once */
  const char *lying = "local t = setmetatable({}, {__len = function() return math.maxinteger end})\n";
  const char *calls[] = {"table.insert(t, 1, 'x')", "table.insert(t, 'x')", "table.remove(t, 1)"};
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    char chunk[256];
    snprintf(chunk, sizeof chunk, "%s%s", lying, calls[i]);
    expect_run(L, chunk, MLAGEN_ELIMIT, "sb.lua:2: template exceeded the instruction cap", NULL);
  }
  expect_run(L,
             "local n = 0 local t = setmetatable({}, {__len = function() n = n + 1\n"
             "  return n == 1 and 2 or math.maxinteger - 1 end})\n"
             "table.insert(t, 1, 'x') assert(rawget(t, 1) == 'x' and n == 1)",
             0, NULL, NULL);
  expect_run(L,
             "local t = {1, 2, 3} table.insert(t, 1, 0) table.insert(t, 5) assert(#t == 5)\n"
             "assert(table.remove(t, 1) == 0 and table.remove(t) == 5 and #t == 3)\n"
             "assert(t[1] == 1 and t[3] == 3 and table.remove({}) == nil)\n"
             "assert(not pcall(table.insert, t, 9, 1) and not pcall(table.insert, t))",
             0, NULL, NULL);
  /* plain find of a 2 MB needle in a 4 MB string: ~10^12 byte compares */
  expect_run(L, "local s = ('a'):rep(4e6) local n = ('a'):rep(2e6) .. 'b' local i = s:find(n)",
             MLAGEN_ELIMIT, "instruction cap", NULL);
  expect_run(L,
             "assert(('hello world'):find('o w') == 5 and select(2, ('abc'):find('bc')) == 3)\n"
             "assert(('abc'):find('') == 1 and ('abc'):find('', 10) == nil and ('abc'):find('c', -1) == 3)\n"
             "assert(('aaab'):find('ab', 2) == 3 and ('abc'):find('x') == nil and ('a.c'):find('.', 1) == 2)",
             0, NULL, NULL);
  /* table.sort over megabytes of strings, full of NULs (strcoll walks them a chunk at a time) */
  expect_run(L,
             "local t = {} local z = ('\\0'):rep(1e6)\n"
             "for i = 1, 40 do t[i] = z .. string.char(65 + i % 26) end\n"
             "table.sort(t)",
             MLAGEN_ELIMIT, "instruction cap", NULL);
  expect_run(L,
             "local t = {5, 3, 9, 1} table.sort(t) assert(t[1] == 1 and t[4] == 9)\n"
             "table.sort(t, function(a, b) return a > b end) assert(t[1] == 9 and t[4] == 1)\n"
             "local s = {'b', 'a', 'c'} table.sort(s) assert(table.concat(s) == 'abc')\n"
             "assert(not pcall(table.sort, {1, 'x'}))",
             0, NULL, NULL);
  expect_usable(L);
  mg_lua_close(L);
}

/* Work inside single instructions (== and < over long strings) is bounded by the
 * wall-clock limit, checked by the hook (which fires more often as memory grows) and by
 * the allocator: each of these ran for minutes. A clear limit error, not a hang. */
static void test_sandbox_time_limit(void **state) {
  (void)state;
  mg_lua *L = open_lua_t(0, 0, 0.5);
  expect_run(L,
             "local a = ('x'):rep(1 << 24) .. 'a' local b = ('x'):rep(1 << 24) .. 'b'\n"
             "for i = 1, 1e7 do local e = (a == b) end",
             MLAGEN_ELIMIT, "sb.lua", "template exceeded the time limit of 0.5 s");
  expect_run(L,
             "local a = ('\\0'):rep(1 << 23) .. 'a' local b = ('\\0'):rep(1 << 23) .. 'b'\n"
             "for i = 1, 1e7 do local e = (a < b) end",
             MLAGEN_ELIMIT, "time limit", NULL);
  /* pcall does not catch it */
  expect_run(L,
             "local a = ('x'):rep(1 << 24) .. 'a' local b = ('x'):rep(1 << 24) .. 'b'\n"
             "while true do pcall(function() for i = 1, 1e7 do local e = (a == b) end end) end",
             MLAGEN_ELIMIT, "time limit", NULL);
  expect_usable(L); /* the next run has its own time */
  mg_lua_close(L);
}

static void test_sandbox_memory_cap(void **state) {
  (void)state;
  mg_lua *L = open_lua((size_t)8 << 20, 0);
  expect_run(L, "local t = {} for i = 1, 1e9 do t[i] = ('x'):rep(1e6) .. i end", MLAGEN_ELIMIT,
             "sb.lua: template exceeded the memory cap of 8 MiB", NULL);
  expect_run(L, "return 1", 0, NULL, NULL);
  expect_run(L, "local s = ('x'):rep(1e9)", MLAGEN_ELIMIT, "memory cap of 8 MiB", NULL);
  expect_run(L, "local s = ('x'):rep(1e3, ('y'):rep(1e4))", MLAGEN_ELIMIT, "memory cap", NULL);
  expect_run(L, "local s = table.concat({('x'):rep(3e6), ('x'):rep(3e6)})", MLAGEN_ELIMIT,
             "memory cap", NULL);
  /* string.rep refuses results over 2 GiB itself */
  expect_run(L, "local s = ('x'):rep(1e10)", MLAGEN_ETEMPLATE, "resulting string too large", NULL);
  expect_run(L, "local t = {} for i = 1, 1e8 do t[i] = i end", MLAGEN_ELIMIT, "memory cap",
             NULL);
  /* pcall cannot swallow it: the cap stays tripped for the rest of the run */
  expect_run(L,
             "local ok = pcall(function() local s = ('x'):rep(1e8) end)\n"
             "local t = {} for i = 1, 100 do t[i] = {} end",
             MLAGEN_ELIMIT, "memory cap", NULL);
  expect_run(L,
             "local f = function() local t = {} for i = 1, 1e9 do t[i] = ('x'):rep(1e5) .. i end end\n"
             "while true do pcall(f) end",
             MLAGEN_ELIMIT, "memory cap", NULL);
  /* the memory of the aborted runs was given back */
  expect_run(L, "local t = {} for i = 1, 5 do t[i] = ('x'):rep(1e6) .. i end", 0, NULL, NULL);
  expect_error(L, "a\n@ local s = ('x'):rep(1e9)\n", MLAGEN_ELIMIT, "t.tpl", "memory cap");
  expect_usable(L);
  mg_lua_close(L);
}

static void test_sandbox_recursion(void **state) {
  (void)state;
  /* deep Lua recursion needs ~70 MiB before Lua's own stack limit: under a smaller cap
   * it is a memory-cap error */
  mg_lua *L = open_lua((size_t)8 << 20, 0);
  expect_run(L, "local function f() return 1 + f() end f()", MLAGEN_ELIMIT, "memory cap", NULL);
  mg_lua_close(L);
  L = open_lua((size_t)128 << 20, 0);
  /* Lua stack overflow and C stack overflow are ordinary errors */
  expect_run(L, "local function f() return 1 + f() end f()", MLAGEN_ETEMPLATE, "stack overflow",
             NULL);
  expect_run(L, "local t = setmetatable({}, {__index = function(t, k) return t[k] end}) local x = t.x",
             MLAGEN_ETEMPLATE, "stack overflow", NULL);
  expect_run(L, "local function f() return pcall(f) end f()", 0, NULL, NULL);
  expect_run(L, "local function loop() assert(pcall(loop)) end local e, m = xpcall(loop, loop)",
             0, NULL, NULL);
  expect_run(L, "local s = ('x'):rep(300, '(') local f = load('return ' .. s)", 0, NULL, NULL);
  expect_run(L, "assert(load('return ' .. ('('):rep(1000) .. '1' .. (')'):rep(1000)))",
             MLAGEN_ETEMPLATE, "overflow", NULL);
  expect_usable(L);
  mg_lua_close(L);
}

static void test_open_and_close(void **state) {
  (void)state;
  mg_diag d = MG_DIAG_INIT;
  mg_lua *L = NULL;
  /* a cap too small to open the libraries */
  mg_lua_limits tiny = {4096, 0, 0};
  assert_int_equal(mg_lua_open(&L, &tiny, &d), MLAGEN_ENOMEM);
  assert_null(L);
  /* defaults */
  assert_int_equal(mg_lua_open(&L, NULL, &d), 0);
  expect_usable(L);
  /* __gc added to a metatable after setmetatable is never called (not at close either,
   * where it would run with hooks off) */
  expect_run(L,
             "local mt = {} keep = setmetatable({}, mt)\n"
             "mt.__gc = function() while true do end end\n"
             "local mt2 = {} setmetatable({}, mt2) mt2.__gc = function() while true do end end",
             0, NULL, NULL);
  mg_lua_close(L);
  mg_lua_close(NULL);
  mg_diag_clear(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_expressions),
      cmocka_unit_test(test_statements),
      cmocka_unit_test(test_line_directives),
      cmocka_unit_test(test_translate),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_globals_from_c),
      cmocka_unit_test(test_output_cap),
      cmocka_unit_test(test_sandbox_globals),
      cmocka_unit_test(test_sandbox_binary_chunks),
      cmocka_unit_test(test_sandbox_instruction_cap),
      cmocka_unit_test(test_sandbox_memory_cap),
      cmocka_unit_test(test_sandbox_c_loops_charged), cmocka_unit_test(test_sandbox_time_limit),
      cmocka_unit_test(test_sandbox_recursion),
      cmocka_unit_test(test_sandbox_patterns_and_input_errors),
      cmocka_unit_test(test_open_and_close),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
