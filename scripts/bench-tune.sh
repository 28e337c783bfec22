#!/usr/bin/env bash
# bench-tune.sh: time several kernel tunings (SYMM_TUNE, docs/api.md "Tuning")
# side by side on a GPU host (world 2, or BENCH_WORLD ranks, one per GPU):
# one moe_bench run per tuning
# (native backend and copy-engine ceiling; no NCCL, which no knob changes),
# each checked bit for bit against the CPU reference before it is timed, then
# one table of dispatch and combine p50 per row and tuning.
#
# usage: SYMM_BUILD_DIR=build scripts/bench-tune.sh [--groups a,b,f] [--] TUNING...
#   a TUNING is a SYMM_TUNE value in quotes ("" or default: the defaults), e.g.
#   scripts/bench-tune.sh --groups a,b default "PUSH_WARPS=4" "PUSH_WARPS=12,PUSH_BATCH=8"
# environment: SYMM_BUILD_DIR (default build), BENCH_OUT (default bench/out/tune),
#   BENCH_WORLD (ranks, one per GPU; default 2: specs/bench.lua's world, else
#   generated with -D world=N), BENCH_GPUS (default 0,1,...,BENCH_WORLD-1),
#   BENCH_TIMEOUT (seconds per tuning, default 240).
# Output: $BENCH_OUT/tune-N.csv and tune-N.log per tuning, tune.md (the table).
# Exit status: 0 every tuning ran and passed; 1 otherwise; 0 with a note
# when there is no GPU.
set -uo pipefail
build=${SYMM_BUILD_DIR:-build}
outdir=${BENCH_OUT:-bench/out/tune}
limit=${BENCH_TIMEOUT:-240}
world=${BENCH_WORLD:-2}
groups=a,b,f
note() { echo "bench-tune: $*"; }

tunings=()
while [ $# -gt 0 ]; do
    case $1 in
        --groups) [ $# -ge 2 ] || { note "--groups needs a value"; exit 2; }; groups=$2; shift 2 ;;
        --) shift; tunings+=("$@"); break ;;
        -*) note "unknown option $1 (usage: bench-tune.sh [--groups a,b,f] TUNING...)"; exit 2 ;;
        *) tunings+=("$1"); shift ;;
    esac
done
[ ${#tunings[@]} -gt 0 ] || { note "no tuning given (usage: bench-tune.sh [--groups a,b,f] TUNING...)"; exit 2; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    note "skipped: no GPU"
    exit 0
fi
ngpu=$(nvidia-smi -L | grep -c '^GPU')
if ! [[ "$world" =~ ^[0-9]+$ ]] || [ "$world" -lt 2 ] || [ "$world" -gt "$ngpu" ]; then
    note "BENCH_WORLD=$world: expected 2..$ngpu ranks, one per GPU (found $ngpu GPUs)"
    exit 1
fi
gpus=${BENCH_GPUS:-$(seq -s, 0 $((world - 1)))}
for bin in bin/symmgen bin/symmrun bench/moe_bench; do
    [ -x "$build/$bin" ] || { note "$build/$bin is missing: build first (make BUILD=$build gpu-build)"; exit 1; }
done
mkdir -p "$outdir" || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMM_CACHE_DIR=${SYMM_CACHE_DIR:-$build/jit-cache}
world_args=()
[ "$world" -ne 2 ] && world_args=(-D "world=$world")
"$build/bin/symmgen" -q "${world_args[@]}" -o out/bench specs/bench.lua || { note "symmgen specs/bench.lua failed"; exit 1; }

failed=0
for i in "${!tunings[@]}"; do
    t=${tunings[$i]}
    [ "$t" = default ] && t=
    note "tuning $i: ${t:-the defaults}"
    SYMM_TUNE=$t timeout -k 10 "$limit" "$build/bin/symmrun" -n "$world" --gpus "$gpus" -- "$build/bench/moe_bench" \
        --manifest out/bench/manifest.json --groups "$groups" --no-nccl --csv "$outdir/tune-$i.csv" \
        > "$outdir/tune-$i.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || { failed=1; note "tuning $i: moe_bench exit status $rc (see $outdir/tune-$i.log)"; tail -n 5 "$outdir/tune-$i.log"; }
done

# One table: a line per row and tuning (CSV columns: bench/RESULTS.md).
{
    echo "| row | tuning | dispatch us p50/p90 | combine us p50/p90 | dispatch GB/s | combine GB/s | ceiling GB/s | status |"
    echo "|---|---|---|---|---|---|---|---|"
    for i in "${!tunings[@]}"; do
        t=${tunings[$i]}
        [ -s "$outdir/tune-$i.csv" ] || continue
        awk -F, -v t="${t:-default}" 'NR == 1 { for (c = 1; c <= NF; c++) col[$c] = c; next }
            { printf "%s\t| %s | %s | %s/%s | %s/%s | %s | %s | %s | %s |\n", $col["row"], $col["row"], t,
              $col["dispatch_p50_us"], $col["dispatch_p90_us"], $col["combine_p50_us"], $col["combine_p90_us"],
              $col["dispatch_gbs"], $col["combine_gbs"], $col["ceiling_gbs"], $col["status"] }' "$outdir/tune-$i.csv"
    done | sort -s -t"$(printf '\t')" -k1,1 | cut -f2-
} > "$outdir/tune.md"
cat "$outdir/tune.md"
exit $failed
