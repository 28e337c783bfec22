#!/usr/bin/env bash
# bench-gen.sh: what the generator costs on a build machine (no GPU needed).
#   1. symmgen over a spec of N variants (default 100: real model shapes x
#      dtypes x both layouts x worlds 2, 4, 8), written into a temporary
#      directory; best of 5 runs (hyperfine's mean and min too when present).
#   2. symmgen --check --compile (NVRTC, nothing written) over specs/default.lua
#      and over one full DeepSeek-V3 variant (hidden 7168, topk 8, 256 experts,
#      world 2, max_tokens 4096, bf16), with NVRTC's time per variant (its
#      dispatch and combine programs, as create compiles them).
# Goals (issue): generating 100 variants under 1 s; NVRTC under 500 ms for a
# full dispatch+combine variant.
# usage: scripts/bench-gen.sh [BUILD_DIR]   (default build; env: VARIANTS, RUNS, ARCH)
set -euo pipefail
build=${1:-build}
symmgen=$build/bin/symmgen
variants=${VARIANTS:-100}
runs=${RUNS:-5}
arch=${ARCH:-sm_90a}
[[ -x $symmgen ]] || { echo "bench-gen: $symmgen not found (make BUILD=$build first)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/symm-bench-gen-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# The matrix, in spec form. Shapes from specs/models.lua (hidden, experts,
# topk); gpt-oss's 2880 is not a multiple of 128, so it has no fp8 variant.
cat > "$tmp/matrix.lua" <<EOF
-- bench-gen matrix: the first $variants variants of models x dtypes x layouts x worlds.
local LIMIT = $variants
local models = {
  { "qwen3_30b", 2048, 128, 8 }, { "gpt_oss", 2880, 128, 4 }, { "qwen3_235b", 4096, 128, 8 },
  { "dsv2", 5120, 160, 6 }, { "dsv3", 7168, 256, 8 },
}
local dtypes = { "bf16", "fp8_e4m3", "fp16", "fp32" }
local count = 0
for _, world in ipairs({ 2, 4, 8 }) do
  for _, kind in ipairs({ "rank", "expert" }) do
    for di, dtype in ipairs(dtypes) do
      for mi, m in ipairs(models) do
        local hidden = m[2]
        if count < LIMIT and not (dtype == "fp8_e4m3" and hidden % 128 ~= 0) then
          count = count + 1
          layout {
            name = m[1] .. "_" .. (dtype == "fp8_e4m3" and "fp8" or dtype) .. "_" .. kind .. "_w" .. world,
            hidden = hidden, experts = m[3], topk = m[4], world = world,
            max_tokens = (mi + di) % 2 == 0 and 4096 or 128,
            dtype = dtype, layout = kind, align = kind == "expert" and 128 or 1,
          }
        end
      end
    end
  end
end
EOF

cat > "$tmp/dsv3.lua" <<'EOF'
layout { name = "dsv3_prefill_bf16_w2", hidden = 7168, topk = 8, experts = 256, world = 2,
         max_tokens = 4096, dtype = "bf16" }
EOF

now_ns() { date +%s%N; }
ms() { awk -v ns="$1" 'BEGIN { printf "%.1f", ns / 1e6 }'; }

got=$("$symmgen" --list "$tmp/matrix.lua" | wc -l)
[[ $got -eq $variants ]] || { echo "bench-gen: the matrix declares $got variants, expected $variants" >&2; exit 1; }

# 1. Generation (first run warms the page cache and is not counted).
"$symmgen" -q -o "$tmp/out" "$tmp/matrix.lua"
best=
all=()
for ((i = 0; i < runs; i++)); do
    t0=$(now_ns)
    "$symmgen" -q -o "$tmp/out" "$tmp/matrix.lua"
    t=$(($(now_ns) - t0))
    all+=("$(ms $t)")
    [[ -z $best || $t -lt $best ]] && best=$t
done
files=$(find "$tmp/out" -type f | wc -l)
bytes=$(du -sb "$tmp/out" | cut -f1)
hf=
if command -v hyperfine >/dev/null; then
    # Optional: a hyperfine that fails (an old one without -N) only loses its column.
    if hyperfine -N -w 1 -r 10 --export-json "$tmp/hf.json" "$symmgen -q -o $tmp/out $tmp/matrix.lua" >/dev/null 2>&1; then
        hf=$(awk -F'[:,]' '/"mean"/ { m = $2 } /"min"/ { n = $2 } END { printf "hyperfine: mean %.1f ms, min %.1f ms", m * 1e3, n * 1e3 }' "$tmp/hf.json")
    fi
fi

# 2. NVRTC. symmgen prints "compiled NAME for ARCH in N ms (dispatch D, combine C,
# NCCL backend B ms)" per variant on stderr: the programs the runtime compiles.
# Counted here: D + C, what create compiles for the native backend.
compile() { # label spec
    "$symmgen" --check --compile --arch "$arch" "$2" 2>&1 |
        sed -n "s/^compiled \([^ ]*\) for [^ ]* in [0-9]* ms (dispatch \([0-9]*\), combine \([0-9]*\), .*$/$1 \1 \2 \3/p" |
        awk '{ print $1, $2, $3 + $4 }'
}
default_times=$(compile default specs/default.lua)
dsv3_times=$(for ((i = 0; i < 3; i++)); do compile dsv3 "$tmp/dsv3.lua"; done)
stats() { # numbers on stdin -> "n, min, median, max"
    sort -n | awk '{ v[NR] = $1 } END { if (!NR) { print "none"; exit }
        printf "%d, min %d ms, median %d ms, max %d ms", NR, v[1], v[int((NR + 1) / 2)], v[NR] }'
}

echo "## bench-gen: symmgen $("$symmgen" --version | cut -d' ' -f2), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "| what | result | goal |"
echo "|---|---|---|"
echo "| generate $variants variants ($files files, $((bytes / 1024)) KiB) | best $(ms $best) ms of $runs (${all[*]} ms)${hf:+; $hf} | < 1000 ms |"
echo "| NVRTC, specs/default.lua, per variant: dispatch + combine ($arch, $(nproc) threads) | $(awk '{ print $3 }' <<<"$default_times" | stats) | |"
echo "| NVRTC, dsv3_prefill_bf16_w2 (7168/8/256, w2, 4096 tok, bf16), dispatch + combine, 3 processes | $(awk '{ printf "%s ", $3 }' <<<"$dsv3_times")ms | < 500 ms |"
echo
echo "Per variant, specs/default.lua:"
awk '{ printf "  %-26s %5d ms\n", $2, $3 }' <<<"$default_times"
