-- example.lua: the variant moe_example.c runs (symmgen writes its stub,
-- example_w2.h and example_w2.c). Two ranks, 16 experts (8 on each), top-4,
-- hidden 1024, bf16 in and out, layout "rank": each token goes once to each
-- rank that holds one of its experts, and combine sums the rows that come
-- back, so the expert work applies the top-k weights.
layout {
  name = "example_w2",
  hidden = 1024,
  topk = 4,
  experts = 16,
  world = 2,
  max_tokens = 128,
  dtype = "bf16",
}
