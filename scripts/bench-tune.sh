#!/usr/bin/env bash
# bench-tune.sh: time several kernel tunings (SYMM_TUNE, docs/api.md "Tuning")
# side by side on a GPU host (world 2, or BENCH_WORLD ranks, one per GPU):
# one moe_bench run per tuning
# (native backend and copy-engine ceiling; no NCCL, which no knob changes),
# each checked bit for bit against the CPU reference before it is timed, then
# one table of dispatch and combine p50 per row and tuning.
#
# usage: SYMM_BUILD_DIR=build scripts/bench-tune.sh [--groups a,b,f] [--rounds N] [--dry-run]
#          [--] TUNING...
#   a TUNING is a SYMM_TUNE value in quotes ("" or default: the defaults), e.g.
#   scripts/bench-tune.sh --groups a,b default "PUSH_WARPS=4" "PUSH_WARPS=12,PUSH_BATCH=8"
#   --rounds N (1..20, default 1): run the list N times, in the given order in
#   odd rounds and reversed in even ones (A B, B A, ...): the first of two
#   runs of unchanged code has come out 1.5-2.5 us off the second at decode
#   (bench/NOTES.md 62, 64), so a comparison needs both orders.
#   --dry-run: print the runs in order (round, tuning) and exit.
# environment: SYMM_BUILD_DIR (default build), BENCH_OUT (default bench/out/tune),
#   BENCH_WORLD (ranks, one per GPU; default 2: specs/bench.lua's world, else
#   generated with -D world=N), BENCH_GPUS (default 0,1,...,BENCH_WORLD-1),
#   BENCH_TIMEOUT (seconds per tuning, default 240).
# Output: $BENCH_OUT/tune-N.csv and tune-N.log per tuning, tune.md (the table).
# Exit status: 0 every tuning ran and passed; 1 otherwise; 0 with a note
# when there is no GPU.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpus.sh"
build=${SYMM_BUILD_DIR:-build}
outdir=${BENCH_OUT:-bench/out/tune}
limit=${BENCH_TIMEOUT:-240}
world=${BENCH_WORLD:-2}
groups=a,b,f
note() { echo "bench-tune: $*"; }

usage="usage: bench-tune.sh [--groups a,b,f] [--rounds N] [--dry-run] TUNING..."
tunings=()
rounds=1
dry=0
while [ $# -gt 0 ]; do
    case $1 in
        --groups) [ $# -ge 2 ] || { note "--groups needs a value"; exit 2; }; groups=$2; shift 2 ;;
        --rounds)
            [ $# -ge 2 ] || { note "--rounds needs a value"; exit 2; }
            [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] && [ "$2" -le 20 ] ||
                { note "--rounds \"$2\": expected an integer 1..20"; exit 2; }
            rounds=$2; shift 2 ;;
        --dry-run) dry=1; shift ;;
        --) shift; tunings+=("$@"); break ;;
        -*) note "unknown option $1 ($usage)"; exit 2 ;;
        *) tunings+=("$1"); shift ;;
    esac
done
[ ${#tunings[@]} -gt 0 ] || { note "no tuning given ($usage)"; exit 2; }
# The runs: round r takes the list in order when r is odd, reversed when even.
run_tuning=()
run_round=()
for r in $(seq 1 "$rounds"); do
    for j in "${!tunings[@]}"; do
        k=$j
        [ $((r % 2)) -eq 0 ] && k=$((${#tunings[@]} - 1 - j))
        run_tuning+=("${tunings[$k]}")
        run_round+=("$r")
    done
done
if [ "$dry" -eq 1 ]; then
    for i in "${!run_tuning[@]}"; do
        t=${run_tuning[$i]}
        [ -z "$t" ] && t=default
        echo "run $i: round ${run_round[$i]}, tuning $t"
    done
    exit 0
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    note "skipped: no GPU"
    exit 0
fi
ngpu=$(gpu_count)
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
for i in "${!run_tuning[@]}"; do
    t=${run_tuning[$i]}
    [ "$t" = default ] && t=
    note "run $i (round ${run_round[$i]}): ${t:-the defaults}"
    SYMM_TUNE=$t timeout -k 10 "$limit" "$build/bin/symmrun" -n "$world" --gpus "$gpus" -- "$build/bench/moe_bench" \
        --manifest out/bench/manifest.json --groups "$groups" --no-nccl --csv "$outdir/tune-$i.csv" \
        > "$outdir/tune-$i.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || { failed=1; note "run $i: moe_bench exit status $rc (see $outdir/tune-$i.log)"; tail -n 5 "$outdir/tune-$i.log"; }
done

# One table: a line per row and run, in run order within a row (CSV columns:
# bench/RESULTS.md); with --rounds, the round too, and then the mean p50 of
# each row and tuning over the rounds.
{
    rcol=""; rsep=""
    [ "$rounds" -gt 1 ] && { rcol=" round |"; rsep="---|"; }
    echo "| row | tuning |$rcol dispatch us p50/p90 | combine us p50/p90 | dispatch GB/s | combine GB/s | ceiling GB/s | status |"
    echo "|---|---|$rsep---|---|---|---|---|---|"
    for i in "${!run_tuning[@]}"; do
        t=${run_tuning[$i]}
        [ -s "$outdir/tune-$i.csv" ] || continue
        r=""; [ "$rounds" -gt 1 ] && r=" ${run_round[$i]} |"
        awk -F, -v t="${t:-default}" -v r="$r" 'NR == 1 { for (c = 1; c <= NF; c++) col[$c] = c; next }
            { printf "%s\t| %s | %s |%s %s/%s | %s/%s | %s | %s | %s | %s |\n", $col["row"], $col["row"], t, r,
              $col["dispatch_p50_us"], $col["dispatch_p90_us"], $col["combine_p50_us"], $col["combine_p90_us"],
              $col["dispatch_gbs"], $col["combine_gbs"], $col["ceiling_gbs"], $col["status"] }' "$outdir/tune-$i.csv"
    done | sort -s -t"$(printf '\t')" -k1,1 | cut -f2-
    if [ "$rounds" -gt 1 ]; then
        echo
        echo "| row | tuning | rounds | mean dispatch us p50 | mean combine us p50 |"
        echo "|---|---|---|---|---|"
        for i in "${!run_tuning[@]}"; do
            t=${run_tuning[$i]}
            [ -s "$outdir/tune-$i.csv" ] || continue
            awk -F, -v t="${t:-default}" 'NR == 1 { for (c = 1; c <= NF; c++) col[$c] = c; next }
                { printf "%s\t%s\t%s\t%s\n", $col["row"], t, $col["dispatch_p50_us"], $col["combine_p50_us"] }' \
                "$outdir/tune-$i.csv"
        done | awk -F'\t' '{ k = $1 "\t" $2; if (!(k in n)) order[++m] = k; n[k]++; d[k] += $3; c[k] += $4 }
            END { for (i = 1; i <= m; i++) { k = order[i]; split(k, f, "\t")
                  printf "%s\t| %s | %s | %d | %.2f | %.2f |\n", f[1], f[1], f[2], n[k], d[k] / n[k], c[k] / n[k] } }' |
            sort -s -t"$(printf '\t')" -k1,1 | cut -f2-
    fi
} > "$outdir/tune.md"
cat "$outdir/tune.md"
exit $failed
