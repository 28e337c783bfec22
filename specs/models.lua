-- models.lua: the MoE layers of well-known open models, as variants.
--
-- Each model's numbers come from its Hugging Face config.json (field names
-- in the comment above it). Each model gets:
--   prefill: max_tokens 4096 tokens per rank per call,
--   decode:  max_tokens 128 (one step of a large decode batch),
-- on the expert-parallel worlds that divide its expert count, with layout
-- "rank" (the default). Some also get a layout "expert" variant with align
-- 128, which hands a grouped GEMM its input with every expert's segment
-- starting on a 128-row tile.
--
-- capacity is left at the worst case everywhere, so no routing can ever
-- overflow; see specs/tutorial.lua for trading that memory away.
--
-- Names read model_phase_dtype[_expert][_pull]_wWORLD (_pull: combine = "pull").

local PREFILL, DECODE = 4096, 128

-- One model: its shape, and the name prefix its variants share.
local function model(prefix, hidden, experts, topk)
  return { prefix = prefix, hidden = hidden, experts = experts, topk = topk }
end

-- The fields of one variant of model m; extra holds the rest (world, ...).
local function shape(m, phase, dtype, extra)
  local v = {
    hidden = m.hidden, experts = m.experts, topk = m.topk,
    max_tokens = phase == "prefill" and PREFILL or DECODE,
    dtype = dtype,
  }
  local kind = (extra.layout == "expert" and "_expert" or "") .. (extra.combine == "pull" and "_pull" or "")
  v.name = m.prefix .. "_" .. phase .. "_" .. (dtype == "fp8_e4m3" and "fp8" or dtype) .. kind .. "_w" .. extra.world
  for k, x in pairs(extra) do v[k] = x end
  return v
end

-- DeepSeek-V3 (deepseek-ai/DeepSeek-V3): hidden_size 7168, n_routed_experts
-- 256, num_experts_per_tok 8. Its shared expert runs locally and is not
-- dispatched. Dispatch in bf16 or in fp8 e4m3 with per-128 scales, the
-- format of its own fp8 training recipe; combine stays bf16.
local dsv3 = model("dsv3", 7168, 256, 8)
for _, w in ipairs({ 2, 4, 8 }) do
  layout(shape(dsv3, "prefill", "bf16", { world = w }))
  layout(shape(dsv3, "prefill", "fp8_e4m3", { world = w }))
  layout(shape(dsv3, "decode", "fp8_e4m3", { world = w }))
end
for _, w in ipairs({ 4, 8 }) do
  layout(shape(dsv3, "prefill", "fp8_e4m3", { world = w, layout = "expert", align = 128 }))
end
-- combine = "pull" (each rank reads its peers' y): both layouts at
-- DeepSeek-V3's size.
for _, w in ipairs({ 2, 8 }) do
  layout(shape(dsv3, "prefill", "bf16", { world = w, combine = "pull" }))
end
layout(shape(dsv3, "prefill", "fp8_e4m3", { world = 4, layout = "expert", align = 128, combine = "pull" }))

-- Qwen3-235B-A22B (Qwen/Qwen3-235B-A22B): hidden_size 4096, num_experts 128,
-- num_experts_per_tok 8.
local qwen3_235b = model("qwen3_235b", 4096, 128, 8)
for _, w in ipairs({ 4, 8 }) do
  layout(shape(qwen3_235b, "prefill", "bf16", { world = w }))
  layout(shape(qwen3_235b, "decode", "bf16", { world = w }))
end
layout(shape(qwen3_235b, "prefill", "bf16", { world = 8, layout = "expert", align = 128 }))

-- Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B): hidden_size 2048, num_experts 128,
-- num_experts_per_tok 8.
local qwen3_30b = model("qwen3_30b", 2048, 128, 8)
for _, w in ipairs({ 4, 8 }) do
  layout(shape(qwen3_30b, "prefill", "bf16", { world = w }))
end
layout(shape(qwen3_30b, "decode", "fp8_e4m3", { world = 8 }))

-- Mixtral 8x7B (mistralai/Mixtral-8x7B-v0.1): hidden_size 4096,
-- num_local_experts 8, num_experts_per_tok 2. At world 8 each rank holds
-- one expert.
local mixtral = model("mixtral_8x7b", 4096, 8, 2)
for _, w in ipairs({ 2, 4, 8 }) do
  layout(shape(mixtral, "prefill", "bf16", { world = w }))
end

-- gpt-oss-120b (openai/gpt-oss-120b): hidden_size 2880, num_local_experts
-- 128, num_experts_per_tok 4. 2880 is not a multiple of 128, so no fp8
-- dispatch (one scale per 128 elements); bf16 it is.
local gpt_oss = model("gpt_oss_120b", 2880, 128, 4)
for _, w in ipairs({ 2, 4, 8 }) do
  layout(shape(gpt_oss, "prefill", "bf16", { world = w }))
end
layout(shape(gpt_oss, "prefill", "bf16", { world = 4, layout = "expert", align = 128 }))

-- DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite): hidden_size 2048,
-- n_routed_experts 64, num_experts_per_tok 6.
local dsv2_lite = model("dsv2_lite", 2048, 64, 6)
for _, w in ipairs({ 2, 4, 8 }) do
  layout(shape(dsv2_lite, "prefill", "bf16", { world = w }))
end

-- Llama 4 Maverick (meta-llama/Llama-4-Maverick-17B-128E, text_config):
-- hidden_size 5120, num_local_experts 128, num_experts_per_tok 1; its shared
-- expert runs locally.
local maverick = model("llama4_maverick", 5120, 128, 1)
for _, w in ipairs({ 4, 8 }) do
  layout(shape(maverick, "prefill", "bf16", { world = w }))
end
layout(shape(maverick, "prefill", "bf16", { world = 8, layout = "expert", align = 128 }))

-- DBRX (databricks/dbrx-base): d_model 6144, ffn_config.moe_num_experts 16,
-- ffn_config.moe_top_k 4.
local dbrx = model("dbrx", 6144, 16, 4)
for _, w in ipairs({ 2, 4, 8 }) do
  layout(shape(dbrx, "prefill", "bf16", { world = w }))
end
