/* mg_lua.h: the sandboxed Lua 5.4 state that runs templates.
 *
 * Only the base, string, table, math and utf8 libraries are opened; dofile, loadfile,
 * require, collectgarbage, print, string.dump and the pattern functions string.match,
 * gmatch and gsub are removed, and string.find is a plain substring search (pattern
 * backtracking runs in C, beyond the instruction cap); package, io, os, debug and
 * coroutine are never opened; load() accepts text chunks only (mode "t"), setmetatable
 * refuses metatables with a __gc field (finalizers run with hooks off, beyond the caps),
 * and _G's metatable is protected. Allocation is capped (mem_bytes, garbage not yet
 * collected included), the instruction count of each mg_lua_run is capped (instructions;
 * library functions that loop in C, string.rep, string.find, table.insert, remove, move
 * and sort, are charged for their work) and so is its wall-clock time (seconds: for work
 * inside single instructions, such as == over long strings); exceeding any aborts the
 * running chunk with MLAGEN_ELIMIT, and pcall
 * inside the chunk cannot catch that: once a cap is hit, the chunk cannot run on. The
 * state stays usable for the next mg_lua_run. Globals persist between runs (the
 * generator opens a fresh state for each kernel). Not thread-safe. */
#ifndef MG_LUA_H
#define MG_LUA_H
#include <stddef.h>

#include "mg_diag.h"

typedef struct lua_State lua_State;
typedef struct mg_lua mg_lua;

typedef struct mg_lua_limits {
  size_t mem_bytes;   /* 0: MG_LUA_DEFAULT_MEM */
  long instructions;  /* per mg_lua_run; 0: MG_LUA_DEFAULT_INSTR */
  double seconds;     /* wall clock per mg_lua_run; 0: MG_LUA_DEFAULT_SECONDS */
} mg_lua_limits;

#define MG_LUA_DEFAULT_MEM ((size_t)64 << 20)  /* 64 MiB */
#define MG_LUA_DEFAULT_INSTR 50000000L         /* 5e7 VM instructions */
#define MG_LUA_DEFAULT_SECONDS 20.0            /* a real template renders in milliseconds */

/* Creates a sandboxed state. lim may be NULL for the defaults.
 * Errors: MLAGEN_ENOMEM. */
int mg_lua_open(mg_lua **out, const mg_lua_limits *lim, mg_diag *d);
void mg_lua_close(mg_lua *L);
/* The raw state, for setting globals and reading results. Run Lua code only through
 * mg_lua_run: code the caller runs itself (lua_pcall) is counted against the last run's
 * limits, and once one is hit it keeps failing until the next mg_lua_run. Read results
 * with raw accessors (lua_rawget...) or inside lua_pcall: a metamethod may raise, and an
 * unprotected error aborts the process. */
lua_State *mg_lua_state(mg_lua *L);

/* Loads (text only) and runs chunk, named chunkname in messages ("@file" gives
 * "file:line"), leaving nres results on the stack (LUA_MULTRET allowed); on failure the
 * stack is as before the call.
 * Errors: MLAGEN_ETEMPLATE (syntax or runtime error; the message is
 * "file:line: error", for a runtime error followed by a Lua traceback), MLAGEN_ELIMIT
 * (memory or instruction cap or time limit, also when the chunk caught the error; the
 * message says which: "file: template exceeded the memory cap of 64 MiB", "file:line:
 * template exceeded the instruction cap of 50000000", "file:line: template exceeded the
 * time limit of 20 s"), MLAGEN_EINVAL (a binary chunk; or the
 * chunk rejected its input by raising error({"message"}): the message alone, without a
 * location or traceback, since the template is not at fault),
 * MLAGEN_ENOMEM (the process itself is out of memory). */
int mg_lua_run(mg_lua *L, const char *chunk, size_t len, const char *chunkname, int nres,
               mg_diag *d);
#endif
