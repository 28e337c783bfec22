-- tutorial.lua: a walk-through of symmgen specs. It is itself a valid spec:
--
--     symmgen specs/tutorial.lua          (writes out/tutorial/)
--
-- A spec is a Lua file that declares variants. Each call
--
--     layout { field = value, ... }
--
-- declares one variant: one specialized pair of dispatch/combine kernels
-- with its own C API, named after the variant. The file is ordinary Lua, so
-- loops, local variables and functions work; what it cannot do is reach
-- the outside world (no os, io, load, print, ...): a spec only describes.
--
-- The fields:
--
--   name          the C identifier prefix of the variant's API; letters,
--                 digits and _, unique in the file (ignoring case). required
--                 Not a C or C++ keyword, nor a name the generated header's
--                 includes declare: no _ first, no _t last, no cu, CU or
--                 symm_ prefix, not NULL, free, INT8_MAX, ...
--   hidden        elements per token (the model's hidden size).     required
--   topk          experts each token is routed to, 1..16.           required
--   experts       experts in total; a multiple of world.            required
--   world         ranks (GPUs) in the expert-parallel group, 2..128. required
--                 Expert e lives on rank e / (experts / world).
--   max_tokens    most tokens one rank passes to one call; buffers are
--                 sized for it.                                     required
--   dtype         what dispatch moves: "bf16" (default), "fp16", "fp32",
--                 or "fp8_e4m3" (with one float scale per 128 elements).
--   combine_dtype what combine moves and returns: "bf16", "fp16" or "fp32".
--                 Default: the same as dtype ("bf16" when dtype is fp8).
--   layout        how received rows are arranged on each rank:
--                   "rank"   (default) one copy per token and destination
--                            rank, ordered by source rank then token;
--                   "expert" one copy per (token, chosen expert), packed
--                            expert by expert: the input of a grouped GEMM.
--   weights       whether dispatch carries the top-k weights (default
--                 true). Which side applies them depends on the layout:
--                 with "expert", combine multiplies each row by its weight;
--                 with "rank", combine only sums the rows the ranks send
--                 back (as DeepEP's normal mode does), so the expert
--                 computation applies the weights, which arrive with each
--                 received row.
--   capacity      rows each rank can receive. Default: the worst case, so
--                 nothing can ever overflow (see the trade-off below).
--   align         layout "expert" only: each expert's segment starts at a
--                 multiple of this many rows (default 1; 64 or 128 match
--                 grouped-GEMM tiles).
--   sms           how many SMs the kernels may use (default 24).
--   combine       how combine brings each token's rows back to it:
--                   "push" the rank that holds a row sends it back; y may
--                          be any device memory;
--                   "pull" each rank reads its tokens' rows from its peers'
--                          y, storing half as much (bench/NOTES.md 46), so y
--                          must lie in the variant's symmetric buffer;
--                   "auto" (layout "rank") both, chosen per call: y in the
--                          symmetric buffer pulls, y elsewhere pushes, alike
--                          on every rank; the memory of both.
--                 Default: "auto" for layout "rank" from max_tokens 1024 up
--                 or from world 4 (pull is the faster there), else "push".
--   combine_order layout "expert" only: the fixed order of combine's sums.
--                   "rank" (default) each rank that holds rows of a token
--                          first sums them, w * y in ascending k in fp32,
--                          rounded once to combine_dtype; the token's
--                          output is the sum of those parts in ascending
--                          rank, in fp32, rounded once. Only one row per
--                          (token, rank) crosses NVLink back, as in layout
--                          "rank" (combine at prefill 2.2x faster than "k":
--                          407 against 883 us at T = 4096, hidden 7168,
--                          top-8 of 256 on two H200s, 646 against 1226 on
--                          four; at decode, where the grid forms the parts,
--                          1.5x: 28 against 42 us at T = 128; RESULTS.md).
--                   "k"    the sum of w * y over the token's experts in
--                          ascending k, in fp32, rounded once: no
--                          intermediate rounding, but every (token, expert)
--                          row travels back.
--                 Both are bitwise reproducible; they differ in the last
--                 bits because "rank" rounds each part.
--   hosts         the host counts the variant also runs on across hosts
--                 (default none: one host). For each H, symmgen writes a
--                 companion NAME_hH, the native variant of one host's
--                 world / H ranks, which the hybrid backend runs inside each
--                 host while NCCL crosses between hosts (docs/protocol.md).
--
-- A mistake is reported with the file, the line of the layout call, the
-- variant, the field, the value and what was expected. Had the first
-- variant below written hidden = "4096" (a string), symmgen would say
--
--   specs/tutorial.lua:102: variant first: field hidden: got "4096", expected an integer > 0
--
-- Every field can be overridden for all variants from the command line:
--
--     symmgen -D max_tokens=1024 specs/tutorial.lua
--
-- and the checks then apply to the new values: with -D max_tokens=256 the
-- variant "capped" below (capacity 8192) is refused, its worst case being
-- 2048 rows, and the message says which -D was in effect.

-- 1. The simplest variant: the five required shape fields and a name.
-- Everything else takes its default: bf16 in and out, layout "rank",
-- weights on, worst-case capacity.
layout {
  name = "first",
  hidden = 4096,
  topk = 2,
  experts = 8,
  world = 2,
  max_tokens = 256,
}

-- 2. fp8 dispatch: tokens travel as fp8 e4m3 with one float scale per 128
-- elements (so hidden must be a multiple of 128), which halves the bytes on
-- the wire against bf16. Combine cannot be fp8: it defaults to bf16 here.
layout {
  name = "fp8_dispatch",
  hidden = 7168, topk = 8, experts = 64, world = 4, max_tokens = 128,
  dtype = "fp8_e4m3",
}

-- 3. layout "expert" for a grouped GEMM: rows arrive sorted by local expert,
-- and align = 128 starts each expert's segment on a 128-row tile. Padding
-- rows cost capacity: up to (align - 1) per local expert.
layout {
  name = "grouped_gemm",
  hidden = 4096, topk = 4, experts = 32, world = 4, max_tokens = 512,
  layout = "expert", align = 128,
}

-- 4. A matrix: loops declare many variants at once. Names must stay unique,
-- so build them from the loop variables.
for _, w in ipairs({ 2, 4, 8 }) do
  for _, dtype in ipairs({ "bf16", "fp16" }) do
    layout {
      name = "matrix_" .. dtype .. "_w" .. w,
      hidden = 2048, topk = 4, experts = 64, world = w, max_tokens = 256,
      dtype = dtype,
    }
  end
end

-- 5. Helper functions keep a spec short when many variants share a shape.
-- Keep the layout call where the variant is declared (the helper returns
-- the table) and error messages point at that line.
local function moe(name, world, extra)
  local v = { name = name, hidden = 2048, topk = 6, experts = 64, world = world, max_tokens = 1024 }
  for k, x in pairs(extra or {}) do v[k] = x end
  return v
end

layout(moe("helper_w2", 2))
layout(moe("helper_w4_fp32_out", 4, { combine_dtype = "fp32" }))
layout(moe("helper_w4_no_weights", 4, { weights = false }))

-- 6. The capacity trade-off. By default each rank's receive buffer holds the
-- worst case: with layout "rank" that is world * max_tokens rows (every token
-- of every rank sent here), with layout "expert"
--     world * max_tokens * min(topk, experts / world) + (experts / world) * (align - 1).
-- Real routing is far more even than that, so a smaller capacity saves a lot
-- of memory (here 8 * 4096 rows of 7168 bf16 = 448 MiB per rank for the
-- worst case, against 112 MiB for a quarter of it). The price: rows that do
-- not fit are dropped, counted on the device, and reported as an error by
-- the host API; they are never written out of bounds. Pick a capacity with
-- headroom over what your router produces, or keep the default.
local w, t = 8, 4096
layout {
  name = "capped",
  hidden = 7168, topk = 8, experts = 256, world = w, max_tokens = t,
  capacity = w * t // 4,
}

-- 7. combine = "pull": each rank's combine reads the rows its tokens need
-- from its peers' y, instead of each peer pushing them back. An SM then
-- stores each row once instead of twice, which matters most with few SMs
-- (bench/NOTES.md 46). The price is where y lives: in the variant's
-- symmetric buffer, where the peers can read it. Write the expert output to
-- the y that NAME_recv gives (or over its x when dtype and combine_dtype
-- agree) and pass that pointer to combine; any other pointer is refused.
-- Leave combine out and this layout-rank variant of 4096 tokens gets
-- "auto": the same pull where y lies there, a push where it does not, at
-- the memory of both forms (docs/spec.md).
layout {
  name = "pulled",
  hidden = 7168, topk = 8, experts = 256, world = 2, max_tokens = 4096,
  sms = 8, combine = "pull",
}

-- 8. Across hosts: hosts = { 2 } adds the companion "across_h2" (world 8,
-- 128 experts, 2 * 4096 tokens a call), which a world of 2 hosts x 8 GPUs
-- runs with the hybrid backend: a token crosses the network once per
-- destination host, to the GPU of the same local index there, which spreads
-- it over NVLink; combine sums within each host first and sends one row per
-- (token, host) back.
layout {
  name = "across",
  hidden = 7168, topk = 8, experts = 256, world = 16, max_tokens = 4096,
  hosts = { 2 },
}
