/* mg_lua.h: the sandboxed Lua 5.4 state that runs templates.
 *
 * Only the base, string, table, math and utf8 libraries are opened; dofile, loadfile,
 * require, collectgarbage, print and string.dump are removed, and load() accepts text
 * chunks only (mode "t"). Allocation is capped (mem_bytes) and the instruction count of
 * each mg_lua_run is capped (instructions); exceeding either aborts the running chunk
 * with MLAGEN_ELIMIT. One mg_lua per generator; not thread-safe. */
#ifndef MG_LUA_H
#define MG_LUA_H
#include <stddef.h>

#include "mg_diag.h"

typedef struct lua_State lua_State;
typedef struct mg_lua mg_lua;

typedef struct mg_lua_limits {
  size_t mem_bytes;   /* 0: MG_LUA_DEFAULT_MEM */
  long instructions;  /* per mg_lua_run; 0: MG_LUA_DEFAULT_INSTR */
} mg_lua_limits;

#define MG_LUA_DEFAULT_MEM ((size_t)64 << 20)  /* 64 MiB */
#define MG_LUA_DEFAULT_INSTR 50000000L         /* 5e7 VM instructions */

/* Creates a sandboxed state. lim may be NULL for the defaults.
 * Errors: MLAGEN_ENOMEM. */
int mg_lua_open(mg_lua **out, const mg_lua_limits *lim, mg_diag *d);
void mg_lua_close(mg_lua *L);
/* The raw state, for setting globals and reading results. */
lua_State *mg_lua_state(mg_lua *L);

/* Loads (text only) and runs chunk, named chunkname in messages ("@file" gives
 * "file:line"), leaving nres results on the stack (LUA_MULTRET allowed).
 * Errors: MLAGEN_ETEMPLATE (syntax or runtime error; the message is
 * "file:line: error" followed by a Lua traceback), MLAGEN_ELIMIT (memory or instruction
 * cap; the message says which), MLAGEN_EINVAL (a binary chunk). */
int mg_lua_run(mg_lua *L, const char *chunk, size_t len, const char *chunkname, int nres,
               mg_diag *d);
#endif
