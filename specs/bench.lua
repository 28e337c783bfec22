-- bench.lua: the variants `make bench` measures (bench/moe_bench.c runs them
-- on 2 GPUs, one rank per GPU, beside the NCCL backend, raw NCCL and the
-- copy-engine ceiling).
--
-- The rows of the benchmark (bench/moe_bench.c, table "matrix") name these
-- variants; a name changed here must change there.
--   (a) prefill   bench_dsv3_prefill          DeepSeek-V3 shape, T = 4096
--   (b) decode    bench_dsv3_decode           the same, T = 128 (b.64: at sms 64,
--                 bench_dsv3_decode_sms64     a row of its own)
--   (c)           bench_qwen3_prefill/decode  hidden 4096, 128 experts, top-8
--   (d)           bench_dsv3_prefill          (a) with Zipf-skewed routing
--   (e) sweep     bench_dsv3_sweep            T = 128 .. 8192 (max_tokens 8192)
--   (f) SMs       bench_dsv3_prefill_smsN     (a) at sms 8, 16, 32, 48, 64
--                                             (24 is (a) itself)
--   (g) expert    bench_dsv3_*_expert         (a) and (b) with layout expert (g.k: *_expert_k,
--                                             combine_order = "k")
--   (i) fp8       bench_dsv3_*_fp8            (a), (b) and (g) with fp8_e4m3 dispatch
--   (p) pull      bench_dsv3_*_pull           (a), (b), (f) at 8 and 16 SMs and (g)
--                                             with combine = "pull" (bench/NOTES.md 46)
--   (u) auto      bench_dsv3_*_auto           (a) and (b) with combine = "auto": rows
--                                             u.a, u.b with y in region y (pulling),
--                                             u.a.push, u.b.push with y outside (pushing)
--
-- Everything is bf16 dispatch and combine with top-k weights and the
-- worst-case capacity (no routing can overflow), world 2, sms 24 and
-- combine = "push" unless said otherwise (the rows of before combine =
-- "auto" became the default of layout rank's prefill-sized variants, and
-- at world 4 and more: at -D world=4 the rows stay "push" as written).

local PREFILL, DECODE, SWEEP = 4096, 128, 8192

-- DeepSeek-V3: hidden_size 7168, n_routed_experts 256, num_experts_per_tok 8.
local dsv3 = { hidden = 7168, experts = 256, topk = 8 }
-- Qwen3-235B-A22B: hidden_size 4096, num_experts 128, num_experts_per_tok 8.
local qwen3 = { hidden = 4096, experts = 128, topk = 8 }

-- One variant: a model shape plus the fields that make it different.
local function bench(name, shape, fields)
  local v = { name = name, world = 2, dtype = "bf16", sms = 24, combine = "push" }
  for k, x in pairs(shape) do v[k] = x end
  for k, x in pairs(fields) do v[k] = x end
  return v
end

layout(bench("bench_dsv3_prefill", dsv3, { max_tokens = PREFILL }))
layout(bench("bench_dsv3_decode", dsv3, { max_tokens = DECODE }))
-- (b) with 64 SMs: decode's rows are few, and each SM moves its share
-- through its own copy engine (TMA), so latency falls with more SMs.
layout(bench("bench_dsv3_decode_sms64", dsv3, { max_tokens = DECODE, sms = 64 }))
layout(bench("bench_qwen3_prefill", qwen3, { max_tokens = PREFILL }))
layout(bench("bench_qwen3_decode", qwen3, { max_tokens = DECODE }))

-- One variant serves every T of the sweep: T is an argument of each call.
layout(bench("bench_dsv3_sweep", dsv3, { max_tokens = SWEEP }))

for _, sms in ipairs({ 8, 16, 32, 48, 64 }) do
  layout(bench("bench_dsv3_prefill_sms" .. sms, dsv3, { max_tokens = PREFILL, sms = sms }))
end

-- layout expert, segments unaligned (align 1) so that only the layout
-- differs from (a) and (b).
layout(bench("bench_dsv3_prefill_expert", dsv3, { max_tokens = PREFILL, layout = "expert" }))
layout(bench("bench_dsv3_decode_expert", dsv3, { max_tokens = DECODE, layout = "expert" }))
-- (g.k) the same with combine_order = "k": every (token, expert) row goes
-- back and the source sums them in ascending k (the order before partial
-- sums per rank became the default).
layout(bench("bench_dsv3_prefill_expert_k", dsv3, { max_tokens = PREFILL, layout = "expert", combine_order = "k" }))
layout(bench("bench_dsv3_decode_expert_k", dsv3, { max_tokens = DECODE, layout = "expert", combine_order = "k" }))

-- (i) fp8_e4m3 dispatch (one float scale per 128 elements) with bf16
-- combine, the form DeepSeek-V3 trains and serves with.
layout(bench("bench_dsv3_prefill_fp8", dsv3, { max_tokens = PREFILL, dtype = "fp8_e4m3" }))
layout(bench("bench_dsv3_decode_fp8", dsv3, { max_tokens = DECODE, dtype = "fp8_e4m3" }))
layout(bench("bench_dsv3_prefill_expert_fp8", dsv3, { max_tokens = PREFILL, layout = "expert", dtype = "fp8_e4m3" }))
layout(bench("bench_dsv3_decode_expert_fp8", dsv3, { max_tokens = DECODE, layout = "expert", dtype = "fp8_e4m3" }))

-- combine = "pull": each rank's combine reads its peers' rows of y (y in the
-- symmetric buffer) instead of the peers pushing them back, so an SM stores
-- only the output (bench/NOTES.md 46). The same shapes as (a), (b), (f) at 8
-- and 16 SMs and (g).
layout(bench("bench_dsv3_prefill_pull", dsv3, { max_tokens = PREFILL, combine = "pull" }))
layout(bench("bench_dsv3_decode_pull", dsv3, { max_tokens = DECODE, combine = "pull" }))
for _, sms in ipairs({ 8, 16 }) do
  layout(bench("bench_dsv3_prefill_sms" .. sms .. "_pull", dsv3, { max_tokens = PREFILL, sms = sms, combine = "pull" }))
end
layout(bench("bench_dsv3_prefill_expert_pull", dsv3, { max_tokens = PREFILL, layout = "expert", combine = "pull" }))
layout(bench("bench_dsv3_decode_expert_pull", dsv3, { max_tokens = DECODE, layout = "expert", combine = "pull" }))

-- combine = "auto": both forms in one variant, each call pulling where y lies
-- in the symmetric buffer and pushing elsewhere (the default for layout rank
-- from max_tokens 1024 up, and at world 4 and more). Against (a), (b) and
-- their pulling twins: what the per-call check of the form costs each form.
layout(bench("bench_dsv3_prefill_auto", dsv3, { max_tokens = PREFILL, combine = "auto" }))
layout(bench("bench_dsv3_decode_auto", dsv3, { max_tokens = DECODE, combine = "auto" }))
