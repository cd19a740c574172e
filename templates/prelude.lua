-- prelude.lua: helpers every kernel template can call. Runs in the sandboxed Lua state
-- before each template; the generator reads back what kernel{} records.
--
-- kernel{...} declares a kernel family next to the code it emits:
--   family    string, e.g. "explicit_fwd"
--   doc       one line for the manifest
--   params    list of {name=, type=, shape=, doc=}: the kernel's arguments, in order;
--             param_list() turns it into the C parameter list, so the signature and the
--             manifest come from one table
--   tunables  {name = {values = {...}, doc = "..."}}: the autotuning space
--   default   function(spec) -> config: the heuristic choice (must pass check)
--   check     function(spec, config) -> nil, or a string saying why the config is invalid
--             (smem over the limit, tiles that do not divide, ...)
--   name      function(spec, config) -> the kernel's symbol name
--   launch    function(spec, config) -> {grid = {d, d, d}, block = {x, y, z}, smem = bytes}
--             where a grid dim d is {value = n} or {arg = "batch"|"seqlen_q"|"seqlen_k",
--             div = n, mul = m}: ceil(arg * m / n), m 1 when absent (mul counts rows
--             that pack several heads per token, as the absorbed MQA kernels do)
-- and the family's facts (each optional) the executors, the autotuner and the benchmark
-- read from the manifest (generator/gen/mg_manifest.h):
--   pass      "fwd" (default) or "bwd": the training pass the kernel belongs to
--   causal    true when the code depends on spec.causal (else the executor generates the
--             kernel non-causal for every plan)
--   varlen    true when the family has a packed-sequence variant (spec.varlen: its last
--             params are cu_seqlens and n_seqs, generator/core/mg_varlen.h's rules); the
--             variant's symbol is name(spec, config) .. "_varlen". A spec.varlen for a
--             family without one is rejected
--   interface list of tunables that change the kernel's parameters or what it computes
--   flops     {pair = n, row = n}: FLOPs per visible (query, key) pair and per query token
--             (all heads) for TFLOP/s; absent for memory-bound kernels
--   params[i].bench  (int parameters) the value a benchmark passes, an expression over
--             B, S, P, H, d_n, d_r, d_v, d_c and the int parameters before it
-- It resolves the configuration (default, then spec.config overrides, each checked
-- against the declared values), validates it, records the kernel for the generator and
-- returns the record: {family, doc, name, params, tunables, config, launch, pass, causal,
-- varlen, interface, flops}.
-- Names starting with __mlagen_ are reserved for the generator.

function ceil_div(a, b) return (a + b - 1) // b end

local elem_types = { bf16 = "__nv_bfloat16", fp16 = "__half" }
local elem_sizes = { bf16 = 2, fp16 = 2 }

-- The CUDA element type of a dtype name.
function elem_type(dtype)
  return elem_types[dtype] or error("unknown dtype '" .. tostring(dtype) .. "'", 2)
end

-- Bytes per element of a dtype name.
function elem_size(dtype)
  return elem_sizes[dtype] or error("unknown dtype '" .. tostring(dtype) .. "'", 2)
end

-- Rejects the input (a tunable override, a shape), as opposed to failing: the generator
-- reports the message alone, without a traceback, as an invalid argument.
function reject(message) error({ message }) end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

local function describe(config)
  local parts = {}
  for _, k in ipairs(sorted_keys(config)) do parts[#parts + 1] = k .. "=" .. tostring(config[k]) end
  return table.concat(parts, " ")
end

local function contains(list, v)
  for _, x in ipairs(list) do if x == v then return true end end
  return false
end

local recorded = nil

-- The record of the last kernel{} call, read by the generator after rendering.
function __mlagen_declared() return recorded end

function kernel(decl)
  if recorded then error("kernel{}: a template declares one kernel", 2) end
  for _, field in ipairs({ "family", "params", "tunables", "default", "check", "name", "launch" }) do
    if decl[field] == nil then error("kernel{}: missing field '" .. field .. "'", 2) end
  end
  local config = decl.default(spec)
  for k, v in pairs(spec.config or {}) do
    local t = decl.tunables[k]
    if not t then
      reject(decl.family .. ": unknown tunable '" .. k .. "' (tunables: " ..
             table.concat(sorted_keys(decl.tunables), ", ") .. ")")
    end
    if not contains(t.values, v) then
      local vals = {}
      for i, x in ipairs(t.values) do vals[i] = tostring(x) end
      reject(decl.family .. ": " .. k .. " = " .. tostring(v) .. " is not one of {" ..
             table.concat(vals, ", ") .. "}")
    end
    config[k] = v
  end
  if decl.pass ~= nil and decl.pass ~= "fwd" and decl.pass ~= "bwd" then
    error("kernel{}: pass must be \"fwd\" or \"bwd\"", 2)
  end
  if decl.causal ~= nil and type(decl.causal) ~= "boolean" then error("kernel{}: causal must be a boolean", 2) end
  if decl.varlen ~= nil and type(decl.varlen) ~= "boolean" then error("kernel{}: varlen must be a boolean", 2) end
  if spec.varlen and not decl.varlen then
    reject(decl.family .. ": no packed-sequence (varlen) variant")
  end
  for _, t in ipairs(decl.interface or {}) do
    if not decl.tunables[t] then error("kernel{}: interface names '" .. tostring(t) .. "', not a tunable", 2) end
  end
  local why = decl.check(spec, config)
  if why then reject(decl.family .. ": configuration " .. describe(config) .. " rejected: " .. why) end
  recorded = {
    family = decl.family,
    doc = decl.doc,
    name = decl.name(spec, config) .. (spec.varlen and "_varlen" or ""),
    params = decl.params,
    tunables = decl.tunables,
    config = config,
    launch = decl.launch(spec, config),
    pass = decl.pass or "fwd",
    causal = decl.causal or false,
    varlen = decl.varlen or false,
    interface = decl.interface,
    flops = decl.flops,
  }
  return recorded
end

-- The parameters a packed-sequence variant takes last (spec.varlen, kernel{} varlen = true;
-- generator/core/mg_varlen.h, mla::Varlen): none for the unpacked kernel, whose signature
-- stays as it was.
function varlen_params()
  if not spec.varlen then return {} end
  return {
    { name = "cu_seqlens", type = "const int*", shape = "[n_seqs + 1]",
      doc = "packed sequences: device int32 document boundaries (cu[0] = 0, non-decreasing, cu[n_seqs] = T <= the token rows; entries may repeat: the executor pads them with T); batch must be 1" },
    { name = "n_seqs", type = "int", doc = "documents in cu_seqlens (an executor may pad it with empty ones)" },
  }
end

-- params with varlen_params() appended.
function append_varlen_params(params)
  for _, p in ipairs(varlen_params()) do params[#params + 1] = p end
  return params
end

-- The explicit attention kernels with split keys (k_packed = 0): params (a list holding a
-- k_rope parameter) with the int ld_k_rope, k_rope's row stride, inserted right after k_rope;
-- packed kernels (packed true) get params as they are. via: how the kernel reads k_rope
-- (appended to the doc). The one statement of the ld_k_rope contract (SPLITKEY.md).
function insert_ld_k_rope(params, packed, via)
  if packed then return params end
  local out = {}
  for _, p in ipairs(params) do
    out[#out + 1] = p
    if p.name == "k_rope" then
      out[#out + 1] = { name = "ld_k_rope", type = "int", bench = "d_r",
        doc = "elements between consecutive k_rope token rows: row t = b * S_k + j at k_rope + t * ld_k_rope, its first d_r elements read (the rest never): >= d_r; d_r for a contiguous [B, S_k, d_r], d_c + d_r for the RoPE columns of the latent c [B, S_k, d_c + d_r] (k_rope = c + d_c)" .. (via or "") }
    end
  end
  assert(#out == #params + 1, "insert_ld_k_rope: no k_rope parameter")
  return out
end

-- "const T* __restrict__ q, int seqlen_q, ..." from a params list.
function param_list(params, indent)
  local out = {}
  for i, p in ipairs(params) do
    local t = p.type
    if t:sub(-1) == "*" then t = t .. " __restrict__" end
    out[i] = t .. " " .. p.name
  end
  return table.concat(out, ",\n" .. (indent or "    "))
end

-- Shared memory per block, bytes: the opt-in dynamic maximum of each architecture is
-- generator/gen/mg_arch.h's, which the generator hands in as arch_smem_optin(name) (an
-- input error for an architecture it does not list); the cap on static __shared__ arrays
-- is the same on every one.
SMEM_STATIC_LIMIT = 48 * 1024

-- The dynamic shared memory a kernel may use on arch (a name such as "sm_90a"). Without one:
-- the limit of the arch the spec is rendered for (spec.arch: sm_86 and sm_89 99 KiB), at
-- most sm_80's 163 KiB, which is also the limit of a spec for no arch in particular (it is
-- compiled for sm_80 and sm_90a alike). The cap keeps the portable families' sm_90a
-- configurations those that were measured; a family written for one arch passes it
-- (attn_fwd_sm90: smem_limit("sm_90a"), 227 KiB).
function smem_limit(arch)
  if arch then return arch_smem_optin(arch) end
  local target = spec and spec.arch ~= nil and spec.arch ~= "" and spec.arch or "sm_80"
  return math.min(arch_smem_optin(target), arch_smem_optin("sm_80"))
end

-- The opening of a kernel: its signature, from the kernel{} record (threads: the C
-- expression of its block size, for __launch_bounds__), and the dynamic shared memory
-- array. Emit it as ${kernel_open(K, "NUM_THREADS")}.
function kernel_open(K, threads)
  return 'extern "C" __global__ void __launch_bounds__(' .. threads .. ', 1)\n' ..
         K.name .. '(\n    ' .. param_list(K.params) .. ') {\n' ..
         '  extern __shared__ __align__(16) unsigned char smem[];'
end

-- The thread prologue of the tensor-core kernels: a thread's index, lane and warp, and its
-- fragment row g (and g + 8) and column pair t (see mla_device.cuh).
function thread_prologue()
  return '  const int tid = threadIdx.x;\n' ..
         '  const int lane = tid & 31;\n' ..
         '  const int warp = tid >> 5;\n' ..
         '  const int g = lane >> 2;  // fragment row (and row + 8)\n' ..
         '  const int t = lane & 3;   // fragment column pair'
end
