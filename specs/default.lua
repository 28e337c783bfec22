-- default.lua: the spec `make run` generates and compiles.
--
-- A small matrix that touches every code path of the generator at modest
-- sizes, so compiling all of it stays quick: every dispatch dtype (bf16,
-- fp16, fp32, fp8_e4m3), a few combine dtypes, both receive layouts, with
-- and without top-k weights, on 2 and 4 ranks, two variants per world whose
-- capacity is below the worst case (one per layout), expert layouts with
-- aligned segments, a variant per world on 2 SMs, combines that pull
-- (one per layout and world), combines of both forms (combine = "auto", one
-- per world), and companions for worlds across hosts (hosts: world 1 and 2
-- among them).
--
-- Names read dtype_layout_wWORLD (plus what is special about the variant).
-- See specs/tutorial.lua for what each field means.

-- Shapes shared by the matrix: a small model and a mid-size one.
local small = { hidden = 1024, experts = 8, topk = 2, max_tokens = 128 }
local mid = { hidden = 4096, experts = 32, topk = 4, max_tokens = 256 }

-- A shape plus the fields that make one variant different. layout is called
-- at each declaration, so an error points at that line.
local function with(shape, fields)
  local v = {}
  for k, x in pairs(shape) do v[k] = x end
  for k, x in pairs(fields) do v[k] = x end
  return v
end

for _, w in ipairs({ 2, 4 }) do
  local s = "_w" .. w
  -- Layout rank's combine defaults to "push" below max_tokens 1024 at world
  -- 2 and to "auto" from world 4 (docs/spec.md): the world-4 variants below
  -- keep "push" written, so that both worlds run the pushing program, all
  -- but fp8_rank_w4, which takes the default ("auto").
  local push = w >= 4 and "push" or nil

  -- layout rank: one copy per token and destination rank.
  -- hosts: across hosts (the hybrid backend), a companion per host count,
  -- the native variant of one host's ranks (bf16_rank_w2_h2 has one rank).
  layout(with(mid, { name = "bf16_rank" .. s, world = w, hosts = w == 2 and { 2 } or { 2, 4 }, combine = push }))
  layout(with(small, { name = "fp16_rank" .. s, world = w, dtype = "fp16", weights = false, combine = push }))
  layout(with(small, { name = "fp32_rank" .. s, world = w, dtype = "fp32", combine = push }))
  layout(with(mid, { name = "fp8_rank" .. s, world = w, dtype = "fp8_e4m3" }))

  -- Combine in a different dtype than dispatch.
  layout(with(small, { name = "bf16_rank_out_fp32" .. s, world = w, combine_dtype = "fp32", combine = push }))

  -- layout expert: one copy per (token, expert), packed expert-major.
  layout(with(small, { name = "bf16_expert" .. s, world = w, layout = "expert", weights = false, hosts = { 2 } }))
  -- combine_order = "k": the ascending-k sum of every (token, expert) row,
  -- which travels back whole (the default sums per rank first).
  layout(with(mid, { name = "bf16_expert_order_k" .. s, world = w, layout = "expert", combine_order = "k" }))
  layout(with(mid, { name = "fp8_expert_a128" .. s, world = w, dtype = "fp8_e4m3",
                     combine_dtype = "fp16", layout = "expert", align = 128 }))

  -- Capacity below the worst case (world * max_tokens rows): smaller buffers,
  -- and rows beyond it are dropped and reported instead of written.
  layout(with(mid, { name = "bf16_rank_cap" .. s, world = w, capacity = w * mid.max_tokens // 2, combine = push }))
  -- The same for layout expert (worst case: world * max_tokens * topk rows
  -- plus the padding): segments cut at the capacity, and the rows of a
  -- token that do fit still arrive whole.
  layout(with(mid, { name = "fp16_expert_a8_cap" .. s, world = w, dtype = "fp16", layout = "expert", align = 8,
                     capacity = w * mid.max_tokens * 2 }))

  -- Few SMs: combine sums several tokens a unit and the last ones one a
  -- unit, which the wider variants reach only at thousands of tokens.
  layout(with(mid, { name = "bf16_rank_sms2" .. s, world = w, sms = 2, combine = push }))
  -- combine = "pull": each rank's combine reads its peers' rows of y, which
  -- then lives in the symmetric buffer.
  layout(with(mid, { name = "bf16_rank_pull" .. s, world = w, combine = "pull" }))
  layout(with(small, { name = "fp16_expert_a8_pull" .. s, world = w, dtype = "fp16", layout = "expert",
                       align = 8, combine = "pull" }))
  -- combine = "auto" (layout rank): both forms, each call pulling where y
  -- lies in the symmetric buffer and pushing elsewhere (the default from
  -- max_tokens 1024 up, and at world 4 and more); at world 4 with a
  -- companion of 2 hosts, whose combine is "auto" too.
  layout(with(mid, { name = "bf16_rank_auto" .. s, world = w, combine = "auto", hosts = w == 4 and { 2 } or nil }))
end

-- Top-8 over 64 experts at the largest hidden size of the set, with segments
-- aligned to 64 rows for grouped-GEMM tiles.
layout {
  name = "bf16_expert_a64_w4", hidden = 7168, topk = 8, experts = 64, world = 4,
  max_tokens = 128, layout = "expert", align = 64,
}
