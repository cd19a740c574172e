-- prelude_sm90.lua: Lua helpers of the sm_90a templates (those that #include
-- mla_device_sm90.cuh), run after prelude.lua for those templates only (mg_generate.c), and
-- so, like that header, part of their families' template hashes only: changing it leaves
-- the mma.sync families' tuned entries valid.

-- Columns per TMA box of a 16-bit dimension d: 64 (128-byte swizzle), 32 (64B) or 16 (32B),
-- the widest dividing d (mla_device_sm90.cuh box_width, the device side of the same rule).
function tma_box_width(d) return d % 64 == 0 and 64 or d % 32 == 0 and 32 or 16 end

-- The lists given, one after the other, as one list (a kernel{}'s params from shared parts).
function join_lists(...)
  local out = {}
  for _, l in ipairs({ ... }) do
    for _, v in ipairs(l) do out[#out + 1] = v end
  end
  return out
end

-- The key parameters k_nope, k_rope of an explicit-form kernel reading them through
-- tmaps[1] and tmaps[2]: packed (k_packed = 1), one per-head K in k_nope; split, per-head
-- K_nope (nope_doc says what it is), the shared k_rope and its row stride ld_k_rope.
function explicit_k_params(packed, nope_doc)
  if packed then
    return {
      { name = "k_nope", type = "const elem_t*", shape = "[B, S_k, H, d_n + d_r]", doc = "k_packed = 1: per-head keys K = [K_nope ; k_rope] (read through tmaps[1], tmaps[2])" },
      { name = "k_rope", type = "const elem_t*", shape = "unused",                 doc = "k_packed = 1: unused (may be null)" },
    }
  end
  return insert_ld_k_rope({
    { name = "k_nope", type = "const elem_t*", shape = "[B, S_k, H, d_n]", doc = nope_doc .. " (read through tmaps[1])" },
    { name = "k_rope", type = "const elem_t*", shape = "[B, S_k, d_r]",    doc = "RoPE'd key part shared by all heads, token rows ld_k_rope elements apart (read through tmaps[2])" },
  }, false, " (read only through tmaps[2], whose row stride is ld_k_rope elements: mg_sm90_fwd_tmaps / mg_sm90_bwd_tmaps, runtime/exec/mg_sm90_tmap.h, take it; a multiple of 8)")
end

-- The int and float parameters of every explicit attention kernel, in their order: the
-- lengths, the query rows' positions (the position contract of mg_plan.h) and the scale.
function explicit_scalar_params()
  return {
    { name = "seqlen_q", type = "int", doc = "query tokens per batch item" },
    { name = "seqlen_k", type = "int", doc = "key tokens per batch item" },
    { name = "q_pos0",   type = "int", doc = "global position of query row 0 (keys start at 0); rows i < q_split are at q_pos0 + i; causal keeps key j for row i iff j <= pos(i)" },
    { name = "q_split",  type = "int", doc = "first row of the second chunk (0: one chunk at q_pos1)" },
    { name = "q_pos1",   type = "int", doc = "global position of row q_split; rows i >= q_split are at q_pos1 + i - q_split; >= q_pos0 + q_split (positions increase)" },
    { name = "softmax_scale", type = "float", doc = "mscale^2 / sqrt(d_n + d_r)" },
  }
end

-- The opening of an sm_90a template's anonymous namespace (mla_device_sm90.cuh): its
-- element type elem_t, the wgmma element tag tag_t, pack2(lo, hi) (two floats as one packed
-- pair of elem_t, lo in the low half, rounded to nearest), the heads H and CAUSAL.
function sm90_preamble(spec)
  return 'using namespace mla::sm90;\n' ..
         'typedef ' .. elem_type(spec.dtype) .. ' elem_t;\n' ..
         'typedef mla::sm90::' .. (spec.dtype == "bf16" and "bf16_t" or "f16_t") .. ' tag_t;\n' ..
         '__device__ __forceinline__ unsigned pack2(float lo, float hi) { return mla::pack2<elem_t>(lo, hi); }\n' ..
         'constexpr int H = ' .. spec.heads .. ';\n' ..
         'constexpr bool CAUSAL = ' .. (spec.causal and "true" or "false") .. ';'
end

-- An explicit-form kernel's head dimensions DN, DR, DQK = DN + DR, DV and K_PACKED.
function explicit_dims(spec, packed)
  return 'constexpr int DN = ' .. spec.d_n .. ';\n' ..
         'constexpr int DR = ' .. spec.d_r .. ';\n' ..
         'constexpr int DQK = DN + DR;\n' ..
         'constexpr int DV = ' .. spec.d_v .. ';\n' ..
         'constexpr bool K_PACKED = ' .. (packed and "true" or "false") .. ';'
end

