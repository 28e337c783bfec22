-- worlds.lua: small variants at world sizes the lent machines reach only with
-- several ranks per GPU (3, 5, 8), so the GPU test matrix checks that nothing
-- assumes a power of two or a rank per GPU. Ranks sharing a GPU are
-- time-sliced: keep the shapes small.
for _, w in ipairs({ 3, 5, 8 }) do
  local s = "_w" .. w
  layout { name = "bf16_rank" .. s, hidden = 1024, topk = 4, experts = 4 * w, world = w,
           max_tokens = 96, sms = 8 }
  layout { name = "fp8_rank_cap" .. s, hidden = 512, topk = 6, experts = 2 * w, world = w,
           max_tokens = 64, dtype = "fp8_e4m3", capacity = w * 40, sms = 8 }
  -- combine = "pull" with rows dropped at the capacity: each rank reads its
  -- peers' y, and a dropped row is read from nobody.
  layout { name = "fp8_rank_cap_pull" .. s, hidden = 512, topk = 6, experts = 2 * w, world = w,
           max_tokens = 64, dtype = "fp8_e4m3", capacity = w * 40, sms = 8, combine = "pull" }
  layout { name = "bf16_expert_a16" .. s, hidden = 2048, topk = 3, experts = 3 * w, world = w,
           max_tokens = 80, layout = "expert", align = 16, sms = 8 }
  layout { name = "fp32_expert" .. s, hidden = 256, topk = 8, experts = 16 * w, world = w,
           max_tokens = 50, dtype = "fp32", layout = "expert", weights = false, sms = 8 }
end

-- The largest topk the spec allows, with the world small enough that every
-- destination of a token is sure to repeat ranks (layout rank) and many
-- segments per rank (layout expert).
for _, w in ipairs({ 2, 3 }) do
  local s = "_w" .. w
  layout { name = "bf16_rank_k16" .. s, hidden = 512, topk = 16, experts = 16 * w, world = w,
           max_tokens = 64, sms = 8 }
  layout { name = "fp16_expert_k16" .. s, hidden = 256, topk = 16, experts = 32 * w, world = w,
           max_tokens = 48, dtype = "fp16", layout = "expert", align = 8, sms = 8 }
  layout { name = "fp16_expert_k16_pull" .. s, hidden = 256, topk = 16, experts = 32 * w, world = w,
           max_tokens = 48, dtype = "fp16", layout = "expert", align = 8, sms = 8, combine = "pull" }
end
