/* mg_lua.c: the sandboxed Lua 5.4 state that runs templates.
 *
 * Memory. The allocator counts live bytes and refuses growth past the cap. Lua answers a
 * refused request with an emergency collection and one identical retry, and only a
 * refused retry makes it raise; so a refusal is soft until the next growth request
 * shows whether it was retried. It becomes a hard hit when the retry is refused too, when
 * the next request is not its retry (a luaL_Buffer, for one, raises at once), or when
 * the request alone exceeds the cap. After a hard hit every growth is refused until
 * the run ends, and the run fails with MLAGEN_ELIMIT even if the template caught the
 * error.
 *
 * Instructions. A count hook adds up VM instructions per run. Library functions that
 * loop in C, where the hook cannot see, are charged for their work: table.move per
 * element, string.rep per repetition of an empty string, table.insert/remove per element shifted (their
 * length is taken once, so a lying __len cannot make the loop longer than charged),
 * string.find per candidate position and bytes compared, table.sort per comparison and
 * bytes compared (its comparisons go through a charging C function).
 *
 * Time. Work no charge can see (== or < over long strings: one VM instruction each, but
 * memcmp or strcoll over megabytes) is bounded by a wall-clock limit per run, checked by
 * the count hook, by charge() and by the allocator (every large request and every 256th
 * one); a refused allocation past the deadline aborts the run like a hard memory hit.
 * One instruction can cost time in proportion to the memory in use (the longest string),
 * so the hook fires every HOOK_STEP instructions while little is in use and more often
 * as it grows (every instruction at 64 MiB): between two checks at most ~HOOK_BYTES
 * bytes' worth of such work runs.
 *
 * Once the instruction cap, the time limit or a hard
 * memory hit is reached, the run is aborting: the hook fires on every instruction and
 * raises, so no enclosing pcall can run further Lua code without raising again. It
 * raises a memory error, which calls no message handler: Lua calls a handler for an
 * error raised in a hook with hooks off, so an xpcall handler could loop unchecked.
 * For the same reason (hooks off) __gc finalizers are refused.
 *
 * Counters and flags are reset at the start of each mg_lua_run. */
#include "mg_lua.h"

#include "mg_arch.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mlagen.h"

#define HOOK_STEP 1000 /* instructions between two count-hook calls */
#define BIG_ALLOC ((size_t)64 << 10) /* requests this large check the clock */
#define HOOK_BYTES ((size_t)64 << 20) /* hook step x memory in use, at most */

struct mg_lua {
  lua_State *L;
  size_t mem_cap, mem_used;
  long instr_cap, instr_count;
  int mem_hit;      /* a hard memory hit in this run: all growth is refused */
  int mem_pending;  /* the last growth request was refused; its signature follows */
  void *pend_ptr;
  size_t pend_osize, pend_nsize;
  int instr_hit;    /* the instruction cap was reached in this run */
  int aborting;     /* the hook raises on every instruction */
  int first_hit;    /* 'm', 'i' or 't': the limit reached first */
  double seconds;   /* the wall-clock limit of a run */
  double deadline;  /* CLOCK_MONOTONIC seconds; 0: no run in progress, no limit */
  int time_hit;     /* the deadline passed in this run */
  unsigned alloc_tick; /* allocations since the last clock check */
  int step;         /* instructions between two count-hook calls now */
  char where[LUA_IDSIZE + 24]; /* "src:line: " of the instruction-cap or time-limit hit */
};

/* ---- limits --------------------------------------------------------------------- */

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 1 once the run's deadline has passed (sticky for the run). */
static int time_up(mg_lua *M) {
  if (!M->time_hit && M->deadline > 0 && mono_now() > M->deadline) {
    M->time_hit = 1;
    if (!M->first_hit) M->first_hit = 't';
  }
  return M->time_hit;
}

static void count_hook(lua_State *L, lua_Debug *ar);

/* Sets the hook's step for the memory now in use (see Time above). */
static void update_step(mg_lua *M) {
  size_t step = M->mem_used > HOOK_BYTES / HOOK_STEP ? HOOK_BYTES / M->mem_used : HOOK_STEP;
  if (step < 1) step = 1;
  if ((int)step != M->step && !M->aborting) {
    M->step = (int)step;
    lua_sethook(M->L, count_hook, LUA_MASKCOUNT, M->step);
  }
}

static void mem_hard_hit(mg_lua *M) {
  if (!M->mem_hit && !M->first_hit) M->first_hit = 'm';
  M->mem_hit = 1;
}

static void *mg_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  mg_lua *M = ud;
  size_t old = ptr ? osize : 0; /* osize is a type tag when ptr is NULL */
  if (nsize == 0) {
    free(ptr);
    M->mem_used -= old;
    return NULL;
  }
  if (nsize > old) {
    /* Past the deadline every growth is refused: the run aborts at its next request. */
    if ((nsize - old >= BIG_ALLOC || ++M->alloc_tick % 256 == 0) && time_up(M)) {
      M->mem_hit = 1;
      M->mem_pending = 0;
      return NULL;
    }
    int retry = M->mem_pending && ptr == M->pend_ptr && osize == M->pend_osize &&
                nsize == M->pend_nsize;
    if (M->mem_pending && !retry) mem_hard_hit(M); /* the refusal was final */
    M->mem_pending = 0;
    if (M->mem_hit || nsize - old > M->mem_cap - M->mem_used) {
      if (retry || M->mem_hit || nsize > M->mem_cap) {
        mem_hard_hit(M);
      } else {
        M->mem_pending = 1;
        M->pend_ptr = ptr;
        M->pend_osize = osize;
        M->pend_nsize = nsize;
      }
      return NULL;
    }
  }
  void *p = realloc(ptr, nsize);
  if (!p) return nsize <= old ? ptr : NULL; /* a failed shrink keeps the block */
  M->mem_used = M->mem_used - old + nsize;
  if (nsize >= old + BIG_ALLOC && M->L) update_step(M);
  return p;
}

static mg_lua *get_host(lua_State *L) {
  void *ud = NULL;
  lua_getallocf(L, &ud);
  return ud;
}

/* Starts aborting the run (unless it already is) and raises. ar: where the run is. */
static void abort_run(lua_State *L, mg_lua *M, lua_Debug *ar) {
  if (!M->aborting) {
    if (!M->mem_hit) {
      if (!M->time_hit) {
        M->instr_hit = 1;
        if (!M->first_hit) M->first_hit = 'i';
      }
      M->where[0] = '\0';
      if (ar && lua_getinfo(L, "Sl", ar) && ar->currentline > 0)
        snprintf(M->where, sizeof M->where, "%s:%d: ", ar->short_src, ar->currentline);
    }
    M->aborting = 1;
    lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
  }
  /* Raise a memory error by a refused allocation: no message handler runs for it. */
  M->mem_hit = 1;
  lua_newuserdatauv(L, 1, 0);
  luaL_error(L, "template aborted"); /* not reached: the allocation is refused */
}

static void count_hook(lua_State *L, lua_Debug *ar) {
  mg_lua *M = get_host(L);
  if (!M->aborting) {
    M->instr_count += M->step;
    if (M->instr_count <= M->instr_cap && !M->mem_hit && !time_up(M)) {
      update_step(M);
      return;
    }
  }
  abort_run(L, M, ar);
}

/* Charges n instructions for work a C function does in a loop of its own. */
static void charge(lua_State *L, lua_Unsigned n) {
  mg_lua *M = get_host(L);
  if (!M->aborting && n <= (lua_Unsigned)(M->instr_cap - M->instr_count) && !time_up(M)) {
    M->instr_count += (long)n;
    return;
  }
  lua_Debug ar;
  abort_run(L, M, lua_getstack(L, 1, &ar) ? &ar : NULL);
}

/* Aborts: whatever Lua code still runs stops at once, with no memory. */
static void trip_all(mg_lua *M) {
  M->mem_hit = 1;
  M->aborting = 1;
  lua_sethook(M->L, count_hook, LUA_MASKCOUNT, 1);
}

/* Fresh counters; start: a run begins (its deadline starts now), else none is running. */
static void reset_limits(mg_lua *M, int start) {
  M->mem_hit = M->mem_pending = 0;
  M->instr_hit = M->aborting = M->first_hit = M->time_hit = 0;
  M->instr_count = 0;
  M->where[0] = '\0';
  M->deadline = start ? mono_now() + M->seconds : 0;
  M->step = 0;
  update_step(M);
}

/* ---- the sandbox ------------------------------------------------------------------ */

/* load() that accepts text chunks only: load(chunk [, chunkname [, mode [, env]]]) with
 * mode forced to "t"; env is passed on when given (even as nil). */
static int sandbox_load(lua_State *L) {
  int n = lua_gettop(L);
  lua_settop(L, 4);
  lua_pushvalue(L, lua_upvalueindex(1)); /* the original load */
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2);
  lua_pushliteral(L, "t");
  if (n >= 4) lua_pushvalue(L, 4);
  lua_call(L, n >= 4 ? 4 : 3, LUA_MULTRET);
  return lua_gettop(L) - 4;
}

/* setmetatable() that refuses a metatable with a __gc field: finalizers run with hooks
 * off, so no cap could stop one. (An object is marked for finalization only when its
 * metatable has __gc at setmetatable time, so adding __gc later has no effect.) */
static int sandbox_setmetatable(lua_State *L) {
  if (lua_type(L, 2) == LUA_TTABLE) {
    lua_pushliteral(L, "__gc");
    if (lua_rawget(L, 2) != LUA_TNIL)
      return luaL_error(L, "__gc metamethods are not allowed in templates");
    lua_pop(L, 1);
  }
  lua_settop(L, 2);
  lua_pushvalue(L, lua_upvalueindex(1)); /* the original setmetatable */
  lua_insert(L, 1);
  lua_call(L, 2, 1);
  return 1;
}

/* table.move() charged one instruction per element: its loop runs in C, where the count
 * hook never fires, and its range is not bounded by memory (moving nils allocates
 * nothing). */
static int sandbox_table_move(lua_State *L) {
  lua_Integer f = luaL_checkinteger(L, 2), e = luaL_checkinteger(L, 3);
  if (e >= f) charge(L, (lua_Unsigned)e - (lua_Unsigned)f + 1);
  int n = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1)); /* the original table.move */
  lua_insert(L, 1);
  lua_call(L, n, 1);
  return 1;
}

/* string.find() as a plain substring search: Lua patterns backtrack in C, where the
 * instruction cap cannot reach (("a"):rep(1e6):find(".-b") runs for minutes), so
 * templates get no pattern matching: find(s, needle [, init]) only, with string.find's
 * results and init rules. The search is charged per candidate position, per 256 bytes
 * scanned and per 64 bytes of needle compared: a 2 MB needle in a 4 MB string is ~10^12
 * byte compares. */
static int sandbox_find(lua_State *L) {
  size_t ls, lp;
  const char *s = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  lua_Integer init = luaL_optinteger(L, 3, 1);
  if (init == 0) init = 1;
  else if (init < 0) init = init < -(lua_Integer)ls ? 1 : (lua_Integer)ls + init + 1;
  if ((lua_Unsigned)init - 1u > (lua_Unsigned)ls) { /* beyond the end, as string.find */
    luaL_pushfail(L);
    return 1;
  }
  size_t at = (size_t)init - 1;
  if (lp == 0) {
    lua_pushinteger(L, (lua_Integer)at + 1);
    lua_pushinteger(L, (lua_Integer)at);
    return 2;
  }
  while (ls - at >= lp) {
    const char *c = memchr(s + at, p[0], ls - at - lp + 1);
    size_t skipped = (c ? (size_t)(c - s) : ls - lp + 1) - at;
    charge(L, 1 + (lua_Unsigned)skipped / 256 + (lua_Unsigned)lp / 64);
    if (!c) break;
    at = (size_t)(c - s);
    if (memcmp(c + 1, p + 1, lp - 1) == 0) {
      lua_pushinteger(L, (lua_Integer)at + 1);
      lua_pushinteger(L, (lua_Integer)(at + lp));
      return 2;
    }
    at++;
  }
  luaL_pushfail(L);
  return 1;
}

/* string.rep(s, n [, sep]) charged per repetition when s and sep are empty:
 * ("").rep("", math.maxinteger) allocates nothing and would loop for centuries. Otherwise
 * the result's allocation (memory cap) bounds the loop before it starts. */
static int sandbox_rep(lua_State *L) {
  size_t l = 0, lsep = 0;
  luaL_checklstring(L, 1, &l);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_optlstring(L, 3, "", &lsep);
  if (n > 0 && l + lsep == 0) charge(L, (lua_Unsigned)n / 8 + 1);
  int top = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1)); /* the original string.rep */
  lua_insert(L, 1);
  lua_call(L, top, 1);
  return 1;
}

/* table.insert(t, [pos,] v), as Lua's, with the shift charged per element: a __len that
 * returns math.maxinteger made the C loop run forever. The length is read once. */
static int sandbox_insert(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer e = luaL_len(L, 1);
  if (e == LUA_MAXINTEGER) charge(L, LUA_MAXINTEGER); /* beyond any cap: aborts */
  e++; /* the first empty slot */
  lua_Integer pos = e;
  switch (lua_gettop(L)) {
    case 2: break;
    case 3:
      pos = luaL_checkinteger(L, 2);
      luaL_argcheck(L, (lua_Unsigned)pos - 1u < (lua_Unsigned)e, 2, "position out of bounds");
      charge(L, (lua_Unsigned)(e - pos) + 1);
      for (lua_Integer i = e; i > pos; i--) {
        lua_geti(L, 1, i - 1);
        lua_seti(L, 1, i);
      }
      break;
    default: return luaL_error(L, "wrong number of arguments to 'insert'");
  }
  lua_seti(L, 1, pos);
  return 0;
}

/* table.remove(t [, pos]), as Lua's, with the shift charged per element. */
static int sandbox_remove(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer size = luaL_len(L, 1);
  lua_Integer pos = luaL_optinteger(L, 2, size);
  if (pos != size)
    luaL_argcheck(L, (lua_Unsigned)pos - 1u <= (lua_Unsigned)size, 2, "position out of bounds");
  if (pos < size) charge(L, (lua_Unsigned)(size - pos) + 1);
  lua_geti(L, 1, pos);
  for (; pos < size; pos++) {
    lua_geti(L, 1, pos + 1);
    lua_seti(L, 1, pos);
  }
  lua_pushnil(L);
  lua_seti(L, 1, pos);
  return 1;
}

/* Charges one comparison of a and b (stack 1, 2): 1, plus one per byte a string compare
 * may read (strcoll walks a string full of NULs one chunk, one call, at a time). */
static void charge_compare(lua_State *L) {
  size_t la = 0, lb = 0;
  if (lua_type(L, 1) == LUA_TSTRING && lua_type(L, 2) == LUA_TSTRING) {
    lua_tolstring(L, 1, &la);
    lua_tolstring(L, 2, &lb);
  }
  charge(L, 1 + (lua_Unsigned)(la < lb ? la : lb));
}

/* The comparison table.sort gets: a < b (upvalue: none) or the template's function. */
static int sort_less(lua_State *L) {
  lua_settop(L, 2);
  charge_compare(L);
  if (lua_isnoneornil(L, lua_upvalueindex(1))) {
    lua_pushboolean(L, lua_compare(L, 1, 2, LUA_OPLT));
    return 1;
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, 2, 1);
  return 1;
}

/* table.sort(t [, comp]) with every comparison charged: the built-in comparison of long
 * strings runs in C, tens of MB of strings took minutes. */
static int sandbox_sort(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  lua_pushcclosure(L, sort_less, 1); /* comp (or nil) as the upvalue */
  lua_pushvalue(L, lua_upvalueindex(1)); /* the original table.sort */
  lua_insert(L, 1);
  lua_call(L, 2, 0);
  return 0;
}

/* arch_smem_optin(name): the opt-in shared memory per block of the architecture name
 * ("sm_90a"), bytes, generator/gen/mg_arch.h's; an input error (no traceback) naming the
 * architectures it knows for any other name. */
static int arch_smem_optin(lua_State *L) {
  const char *name = lua_tostring(L, 1);
  const mg_arch_facts *f = mg_arch_named(name);
  if (f) {
    lua_pushinteger(L, (lua_Integer)f->smem);
    return 1;
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, "unknown GPU architecture '");
  luaL_addstring(&b, name ? name : luaL_typename(L, 1));
  luaL_addstring(&b, "': no shared-memory limit for it (known: sm_NN with an optional a (NN >= "
                     "90) or f (NN >= 100) suffix, NN one of");
  for (int i = 0; i < MG_ARCH_COUNT; i++) {
    char sm[16];
    snprintf(sm, sizeof sm, " %d", mg_arch_table[i].sm);
    luaL_addstring(&b, sm);
  }
  luaL_addstring(&b, ")");
  luaL_pushresult(&b);
  lua_createtable(L, 1, 0);
  lua_insert(L, -2);
  lua_rawseti(L, -2, 1);
  return lua_error(L);
}

static int setup(lua_State *L) {
  static const luaL_Reg libs[] = {
      {LUA_GNAME, luaopen_base},        {LUA_STRLIBNAME, luaopen_string},
      {LUA_TABLIBNAME, luaopen_table},  {LUA_MATHLIBNAME, luaopen_math},
      {LUA_UTF8LIBNAME, luaopen_utf8},
  };
  static const char *const removed[] = {"dofile", "loadfile", "require", "collectgarbage",
                                        "print", "package", "io", "os", "debug",
                                        "coroutine"};
  for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
    luaL_requiref(L, libs[i].name, libs[i].func, 1);
    lua_pop(L, 1);
  }
  lua_pushglobaltable(L);
  for (size_t i = 0; i < sizeof removed / sizeof removed[0]; i++) {
    lua_pushnil(L);
    lua_setfield(L, -2, removed[i]);
  }
  /* string.dump is also ("x"):dump, since the string metatable's __index is `string`;
   * the same holds for the pattern functions, removed because their backtracking runs
   * in C beyond the instruction cap (find stays, as a plain search). */
  lua_getfield(L, -1, LUA_STRLIBNAME);
  static const char *const str_removed[] = {"dump", "match", "gmatch", "gsub"};
  for (size_t i = 0; i < sizeof str_removed / sizeof str_removed[0]; i++) {
    lua_pushnil(L);
    lua_setfield(L, -2, str_removed[i]);
  }
  lua_pushcfunction(L, sandbox_find);
  lua_setfield(L, -2, "find");
  lua_getfield(L, -1, "rep");
  lua_pushcclosure(L, sandbox_rep, 1);
  lua_setfield(L, -2, "rep");
  lua_pop(L, 1);
  lua_getfield(L, -1, LUA_TABLIBNAME);
  lua_getfield(L, -1, "move");
  lua_pushcclosure(L, sandbox_table_move, 1);
  lua_setfield(L, -2, "move");
  lua_getfield(L, -1, "sort");
  lua_pushcclosure(L, sandbox_sort, 1);
  lua_setfield(L, -2, "sort");
  lua_pushcfunction(L, sandbox_insert);
  lua_setfield(L, -2, "insert");
  lua_pushcfunction(L, sandbox_remove);
  lua_setfield(L, -2, "remove");
  lua_pop(L, 1);
  lua_getfield(L, -1, "load");
  lua_pushcclosure(L, sandbox_load, 1);
  lua_setfield(L, -2, "load");
  lua_getfield(L, -1, "setmetatable");
  lua_pushcclosure(L, sandbox_setmetatable, 1);
  lua_setfield(L, -2, "setmetatable");
  /* Protect _G's metatable: setmetatable(_G, ...) raises "cannot change a protected
   * metatable", so no template can hook global access for the later ones. */
  lua_createtable(L, 0, 1);
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
  lua_pushcfunction(L, arch_smem_optin);
  lua_setfield(L, -2, "arch_smem_optin");
  lua_pop(L, 1);
  return 0;
}

int mg_lua_open(mg_lua **out, const mg_lua_limits *lim, mg_diag *d) {
  *out = NULL;
  mg_lua *M = calloc(1, sizeof *M);
  if (!M) return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory creating the Lua state");
  M->mem_cap = lim && lim->mem_bytes ? lim->mem_bytes : MG_LUA_DEFAULT_MEM;
  M->instr_cap = lim && lim->instructions > 0 ? lim->instructions : MG_LUA_DEFAULT_INSTR;
  M->seconds = lim && lim->seconds > 0 ? lim->seconds : MG_LUA_DEFAULT_SECONDS;
  M->L = lua_newstate(mg_alloc, M);
  if (!M->L) {
    free(M);
    return mg_diag_set(d, MLAGEN_ENOMEM, "cannot create the Lua state");
  }
  lua_pushcfunction(M->L, setup);
  if (lua_pcall(M->L, 0, 0, 0) != LUA_OK) {
    lua_close(M->L);
    free(M);
    return mg_diag_set(d, MLAGEN_ENOMEM, "cannot create the Lua state (memory cap too small?)");
  }
  reset_limits(M, 0);
  *out = M;
  return 0;
}

void mg_lua_close(mg_lua *M) {
  if (!M) return;
  trip_all(M); /* pending __gc finalizers get no time and no memory */
  lua_close(M->L);
  free(M);
}

lua_State *mg_lua_state(mg_lua *M) { return M->L; }

/* ---- running ------------------------------------------------------------------- */

/* Message handler: the error as a string, with a traceback. An input error raised as
 * error({"message"}) passes through unchanged (no traceback: the template is fine). */
static int msg_handler(lua_State *L) {
  if (lua_type(L, 1) == LUA_TTABLE && lua_rawgeti(L, 1, 1) == LUA_TSTRING) {
    lua_settop(L, 1);
    return 1;
  }
  lua_settop(L, 1);
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      msg = lua_tostring(L, -1);
    else
      msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  /* An error raised in C (a library function's: "invalid order function for sorting") or
   * with no position (error(x, 0), a non-string error object) gets the innermost template
   * line's "file:line:" in front, as Lua's own runtime errors have it; a message that
   * starts with the position of any Lua frame on the stack (error(x, 2): the caller's)
   * keeps its own. */
  lua_Debug ar;
  char inner[LUA_IDSIZE + 24] = "";
  int positioned = 0;
  for (int lv = 1; !positioned && lua_getstack(L, lv, &ar); lv++) {
    if (!lua_getinfo(L, "Sl", &ar)) break;
    if (ar.currentline <= 0) continue; /* a C function */
    char where[LUA_IDSIZE + 24];
    snprintf(where, sizeof where, "%s:%d:", ar.short_src, ar.currentline);
    if (!inner[0]) snprintf(inner, sizeof inner, "%s", where);
    positioned = strncmp(msg, where, strlen(where)) == 0;
  }
  if (inner[0] && !positioned) msg = lua_pushfstring(L, "%s %s", inner, msg);
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* The chunk's display name: "@file" and "=name" lose their first character. */
static const char *display_name(const char *chunkname) {
  if (!chunkname) return "template";
  return (*chunkname == '@' || *chunkname == '=') ? chunkname + 1 : chunkname;
}

static int limit_error(mg_lua *M, int which, const char *chunkname, mg_diag *d) {
  if (which == 'm') {
    size_t cap = M->mem_cap;
    const size_t mib = (size_t)1 << 20, kib = (size_t)1 << 10;
    const char *unit = cap % mib == 0 ? "MiB" : cap % kib == 0 ? "KiB" : "bytes";
    size_t n = cap % mib == 0 ? cap / mib : cap % kib == 0 ? cap / kib : cap;
    return mg_diag_set(d, MLAGEN_ELIMIT, "%s: template exceeded the memory cap of %zu %s",
                       display_name(chunkname), n, unit);
  }
  if (which == 't') {
    if (M->where[0])
      return mg_diag_set(d, MLAGEN_ELIMIT, "%stemplate exceeded the time limit of %g s",
                         M->where, M->seconds);
    return mg_diag_set(d, MLAGEN_ELIMIT, "%s: template exceeded the time limit of %g s",
                       display_name(chunkname), M->seconds);
  }
  if (M->where[0])
    return mg_diag_set(d, MLAGEN_ELIMIT, "%stemplate exceeded the instruction cap of %ld",
                       M->where, M->instr_cap);
  return mg_diag_set(d, MLAGEN_ELIMIT, "%s: template exceeded the instruction cap of %ld",
                     display_name(chunkname), M->instr_cap);
}

int mg_lua_run(mg_lua *M, const char *chunk, size_t len, const char *chunkname, int nres,
               mg_diag *d) {
  lua_State *L = M->L;
  if (len > 0 && chunk[0] == LUA_SIGNATURE[0])
    return mg_diag_set(d, MLAGEN_EINVAL, "%s: binary chunks are not accepted",
                       display_name(chunkname));
  if (!lua_checkstack(L, 2))
    return mg_diag_set(d, MLAGEN_ENOMEM, "out of memory (Lua stack)");
  reset_limits(M, 1);
  int base = lua_gettop(L);
  lua_pushcfunction(L, msg_handler);
  int st = luaL_loadbufferx(L, chunk, len, chunkname ? chunkname : "=template", "t");
  if (st == LUA_OK) st = lua_pcall(L, 0, nres, base + 1);
  lua_remove(L, base + 1); /* the handler; results (or the error) move down */

  int rc = 0;
  if (M->mem_pending) mem_hard_hit(M); /* refused last, never retried */
  if (M->first_hit) {
    /* Even when the template caught the error and finished, the run failed. */
    rc = limit_error(M, M->first_hit, chunkname, d);
    lua_settop(L, base);
    trip_all(M);
    lua_gc(L, LUA_GCCOLLECT); /* free what the aborted run left; finalizers die at once */
  } else if (st == LUA_ERRMEM) {
    rc = mg_diag_set(d, MLAGEN_ENOMEM, "%s: out of memory", display_name(chunkname));
    lua_settop(L, base);
  } else if (st != LUA_OK) {
    /* No conversion of a non-string here: it could allocate outside protection. */
    const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (lua_type(L, -1) == LUA_TTABLE && lua_rawgeti(L, -1, 1) == LUA_TSTRING)
      rc = mg_diag_set(d, MLAGEN_EINVAL, "%s", lua_tostring(L, -1)); /* an input error */
    else if (msg)
      rc = mg_diag_set(d, MLAGEN_ETEMPLATE, "%s", msg);
    else
      rc = mg_diag_set(d, MLAGEN_ETEMPLATE, "%s: (error object is a %s value)",
                       display_name(chunkname), luaL_typename(L, -1));
    lua_settop(L, base);
  }
  reset_limits(M, 0);
  return rc;
}
