#!/usr/bin/env bash
# bench.sh: what `make bench` runs on a GPU host. Generates specs/bench.lua,
# measures the JIT on a full variant (bench/jit_bench.c: NVRTC cold compile,
# warm process, cache miss, cache hit; with NVRTC's own cache on and off),
# then runs bench/moe_bench through symmrun at the world the host has (every
# GPU, one rank per GPU; specs/bench.lua is written for world 2 and is
# generated with -D world=N otherwise): our native backend, our NCCL
# backend, raw NCCL and the copy-engine ceiling, side by side; last,
# bench/link_probe on the same GPUs: what an SM moves pushing, pulling and
# locally (bench/NOTES.md 42).
#
# Results go to bench/out/ (or $BENCH_OUT), three files so that a lent
# device machine (at most 8 files come back from $OUT) brings them all back
# (a fourth, stalls.txt, where the stall watchdog fired: BENCH_STALL_S):
#   bench.log         the machine, the JIT measurement and moe_bench's output
#   moe_bench.csv     one line per row (columns: bench/RESULTS.md)
#   results-entry.md  the tables with the date, the machine and the commit,
#                     appended to bench/RESULTS.md
# plus the PNG plots where gnuplot exists (elsewhere it prints the command that
# makes them later). With $OUT set (a lent device machine) RESULTS.md is left
# alone (append results-entry.md where you commit), and the three files are
# copied to $OUT unless BENCH_OUT already puts them there.
#
# usage: SYMM_BUILD_DIR=build scripts/bench.sh [moe_bench options, e.g. --groups a,b]
# environment:
#   SYMM_BUILD_DIR  the build directory (bin/symmgen, bin/symmrun, bench/*); default build
#   BENCH_OUT       where the results go (default bench/out)
#   BENCH_WORLD     ranks, one per GPU (default: every GPU of the host, at most 8)
#   BENCH_GPUS      device ordinals of the ranks (default 0,1,...,BENCH_WORLD-1)
#   BENCH_MACHINE   the machine, for RESULTS.md (default: the GPUs nvidia-smi names)
#   BENCH_COMMIT    the commit, for RESULTS.md (default: git rev-parse --short HEAD)
#   BENCH_TIMEOUT   seconds moe_bench may run (default 180 x world: 360 at world 2,
#                   720 at 4, 1440 at 8)
#   BENCH_RESULTS   file the entry is appended to (default bench/RESULTS.md, or none
#                   when $OUT is set); "none": append nowhere
#   SYMM_CACHE_DIR  JIT cache of moe_bench (default $SYMM_BUILD_DIR/jit-cache)
#   BENCH_STALL_S   the stall watchdog (default 120; 0: off): while moe_bench runs,
#                   when bench.log has not grown for this many seconds, the host
#                   thread stacks of every moe_bench rank (gdb, else
#                   /usr/local/cuda/bin/cuda-gdb: `thread apply all bt`, each under
#                   a timeout) and nvidia-smi's output go to stalls.txt beside
#                   bench.log (and to $OUT at once), once per stall; it only
#                   reads the log's size every few seconds otherwise
# Without a GPU it says "skipped: no GPU" and exits 0, like `make test-gpu`.
# Exit status: moe_bench's (0 all rows correct, 1 some row FAIL, 2 could not
# run), or 1 when another step failed.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpus.sh"
build=${SYMM_BUILD_DIR:-build}
outdir=${BENCH_OUT:-bench/out}
gen=out/bench
spec=specs/bench.lua
note() { echo "bench: $*"; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    note "skipped: no GPU (run \`make bench\` on a host with 2 NVLink-connected GPUs)"
    exit 0
fi
ngpu=$(gpu_count)
world=${BENCH_WORLD:-$((ngpu < 8 ? ngpu : 8))}
if ! [[ "$world" =~ ^[0-9]+$ ]] || [ "$world" -lt 2 ] || [ "$world" -gt "$ngpu" ]; then
    note "BENCH_WORLD=$world: expected 2..$ngpu ranks, one per GPU (ranks sharing a GPU are time-sliced; found $ngpu GPUs)"
    exit 1
fi
# Every row runs at every rank, and the NCCL backend's and the CPU
# reference's share grow with the world: at world 4 the rows took about
# 450 s where world 2's take about 90 (bench/RESULTS.md 2026-11-26 13:43).
limit=${BENCH_TIMEOUT:-$((180 * world))}
for bin in bin/symmgen bin/symmrun bench/moe_bench bench/jit_bench bench/link_probe; do
    if [ ! -x "$build/$bin" ]; then
        note "$build/$bin is missing: build first (make BUILD=$build gpu-build), or set SYMM_BUILD_DIR"
        exit 1
    fi
done
mkdir -p "$outdir" || exit 1
log=$outdir/bench.log
csv=$outdir/moe_bench.csv
entry=$outdir/results-entry.md
tables=$(mktemp /tmp/moe_bench-tables.XXXXXX) || exit 1
jitlog=$(mktemp /tmp/moe_bench-jit.XXXXXX) || exit 1
probelog=$(mktemp /tmp/moe_bench-probe.XXXXXX) || exit 1
trap 'rm -f "$tables" "$jitlog" "$probelog"' EXIT
rm -f "$csv" "$entry"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMM_CACHE_DIR=${SYMM_CACHE_DIR:-$build/jit-cache}

# The machine and the commit, for the record.
machine=${BENCH_MACHINE:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n "$ngpu" | sort | uniq -c |
    awk '{n=$1; $1=""; sub(/^ /, ""); printf "%s%d x %s", (NR > 1 ? ", " : ""), n, $0}')}
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
commit=${BENCH_COMMIT:-}
if [ -z "$commit" ]; then
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo "unknown (set BENCH_COMMIT)")
    if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        commit="$commit+dirty"
    fi
fi
{
    echo "machine: $machine, driver $driver, commit $commit"
    nvidia-smi -L
    nvidia-smi topo -m 2>/dev/null
} > "$log"

# The bench variants at this world (the spec says world 2).
world_args=()
[ "$world" -ne 2 ] && world_args=(-D "world=$world")
note "generating $spec into $gen (world $world)" | tee -a "$log"
if ! "$build/bin/symmgen" -q "${world_args[@]}" -o "$gen" "$spec" 2>&1 | tee -a "$log"; then
    note "symmgen failed on $spec" | tee -a "$log"
    exit 1
fi

# JIT of the full prefill variant as the runtime compiles it (native
# backend): dispatch and combine as two programs at once, with the NVRTC options the runtime uses (SYMM_NVRTC_DEFAULT_OPTIONS);
# jit_bench uses temporary caches of its own.
note "JIT: bench/jit_bench on $gen/bench_dsv3_prefill.cu" | tee -a "$log"
"$build/bench/jit_bench" "$gen/bench_dsv3_prefill.cu" --iters 3 --parts 2 -- -std=c++17 -default-device \
    2>&1 | tee "$jitlog" | tee -a "$log"
jit_rc=${PIPESTATUS[0]}
# NVRTC 13 caches compiles of its own in the driver's compute cache: the
# same measurement with that cache off is what NVRTC itself costs.
note "JIT: the same with NVRTC's own cache off (CUDA_CACHE_DISABLE=1)" | tee -a "$log"
CUDA_CACHE_DISABLE=1 "$build/bench/jit_bench" "$gen/bench_dsv3_prefill.cu" --iters 3 --parts 2 -- -std=c++17 \
    -default-device 2>&1 | tee -a "$jitlog" | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || jit_rc=1
# The pulling twin (combine = "pull") has a combine of its own to compile.
if [ -f "$gen/bench_dsv3_prefill_pull.cu" ]; then
    note "JIT: bench_dsv3_prefill_pull.cu, NVRTC's own cache off" | tee -a "$log"
    CUDA_CACHE_DISABLE=1 "$build/bench/jit_bench" "$gen/bench_dsv3_prefill_pull.cu" --iters 3 --parts 2 -- -std=c++17 \
        -default-device 2>&1 | tee -a "$jitlog" | tee -a "$log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || jit_rc=1
fi

# $OUT is set and is not $outdir: the results are copied there.
out_elsewhere() {
    [ -n "${OUT:-}" ] && [ "$(realpath "$outdir")" != "$(realpath "$OUT")" ]
}

# The stall watchdog (BENCH_STALL_S): a hang leaves its stacks behind.
stall_s=${BENCH_STALL_S:-120}
if ! [[ "$stall_s" =~ ^[0-9]+$ ]]; then
    note "BENCH_STALL_S=$stall_s: expected whole seconds (0: no watchdog)"
    exit 1
fi
stalls=$outdir/stalls.txt
rm -f "$stalls"
# The moe_bench processes below process $1 (the ranks symmrun started).
moe_bench_pids() {
    ps -e -o pid=,ppid=,comm= 2>/dev/null | awk -v root="$1" '
        { parent[$1] = $2; name[$1] = $3 }
        END { for (p in name) if (name[p] == "moe_bench") {
                  q = p; while (q in parent && q != root && q > 1) q = parent[q]
                  if (q == root) print p } }' | sort -n
}
dump_stall() { # $1: seconds without output
    local debugger="" pid rank
    if command -v gdb >/dev/null 2>&1; then
        debugger=gdb
    elif [ -x /usr/local/cuda/bin/cuda-gdb ]; then
        debugger=/usr/local/cuda/bin/cuda-gdb
    fi
    {
        echo "=== $(date -u '+%Y-%m-%d %H:%M:%S UTC'): bench.log has not grown for $1 s; its last lines:"
        tail -n 5 "$log"
        for pid in $(moe_bench_pids "$$"); do
            rank=$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | sed -n 's/^SYMM_RANK=//p')
            echo "--- moe_bench pid $pid, rank ${rank:-?}: host thread stacks"
            if [ -n "$debugger" ]; then
                timeout -k 5 60 "$debugger" -p "$pid" -batch -ex "thread apply all bt" < /dev/null 2>&1
            else
                echo "(no gdb and no /usr/local/cuda/bin/cuda-gdb here; each thread's kernel wait channel:)"
                for t in /proc/"$pid"/task/*; do echo "${t##*/} $(cat "$t/comm" 2>/dev/null) $(cat "$t/wchan" 2>/dev/null)"; done
            fi
        done
        echo "--- nvidia-smi"
        timeout -k 5 30 nvidia-smi 2>&1
        echo
    } >> "$stalls"
    note "no output for $1 s: the ranks' stacks are in $stalls" | tee -a "$log"
    if out_elsewhere; then
        cp "$stalls" "$log" "$OUT"/ 2>/dev/null
    fi
}
# Polls the log's size (every 5 s, every second for a watchdog under 10 s);
# one dump per stall: the log must grow again before the next.
watch_stalls() {
    local nap=5 size last=-1 since=$SECONDS dumped=0
    [ "$stall_s" -lt 10 ] && nap=1
    while kill -0 "$$" 2>/dev/null; do
        sleep "$nap"
        size=$(stat -c %s "$log" 2>/dev/null || echo 0)
        if [ "$size" != "$last" ]; then
            last=$size since=$SECONDS dumped=0
        elif [ "$dumped" -eq 0 ] && [ $((SECONDS - since)) -ge "$stall_s" ]; then
            dump_stall $((SECONDS - since))
            last=$(stat -c %s "$log" 2>/dev/null || echo 0) dumped=1
        fi
    done
}

gpus=${BENCH_GPUS:-$(seq -s, 0 $((world - 1)))}
note "moe_bench at world $world on GPUs $gpus (at most $limit s)" | tee -a "$log"
watchdog=
if [ "$stall_s" -gt 0 ]; then
    watch_stalls &
    watchdog=$!
fi
timeout -k 10 "$limit" "$build/bin/symmrun" -n "$world" --gpus "$gpus" -- "$build/bench/moe_bench" \
    --manifest "$gen/manifest.json" --csv "$csv" --markdown "$tables" "$@" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
if [ -n "$watchdog" ]; then
    kill "$watchdog" 2>/dev/null
    wait "$watchdog" 2>/dev/null
fi
[ "$rc" -eq 124 ] && note "moe_bench ran out of time (BENCH_TIMEOUT=$limit s)" | tee -a "$log"

# What an SM moves by each path, on the same GPUs (a few seconds); with
# moe_bench's --shared-gpu (a proxy under CUDA MPS), the probe's too.
probe_args=()
[[ " $* " == *" --shared-gpu "* ]] && probe_args+=(--shared-gpu)
note "link_probe on GPUs $gpus" | tee -a "$log"
timeout -k 10 120 "$build/bin/symmrun" -n "$world" --gpus "$gpus" -- "$build/bench/link_probe" --sms 8,16,24,64 \
    --reps 20 "${probe_args[@]}" 2>&1 | sed 's/^\[0\] //' | tee "$probelog" | tee -a "$log"
probe_rc=${PIPESTATUS[0]}

if [ -s "$csv" ]; then
    if command -v gnuplot >/dev/null 2>&1; then
        gnuplot -e "csv='$csv'" bench/plot.gp || note "gnuplot failed"
    else
        note "no gnuplot here; make the plots later on a machine with gnuplot:"
        note "  gnuplot -e \"csv='$csv'\" bench/plot.gp"
    fi
fi

# The entry for bench/RESULTS.md: when, where, which commit, the tables.
{
    echo "### $(date -u '+%Y-%m-%d %H:%M UTC'): $machine (driver $driver), world $world, commit $commit"
    echo
    echo "\`scripts/bench.sh $*\`: moe_bench exit status $rc$([ "$rc" -eq 0 ] || echo ' (see the FAIL rows and bench.log)')."
    echo
    if [ -s "$tables" ]; then
        cat "$tables"
    else
        echo "No tables: moe_bench did not finish. The last lines of its log:"
        echo
        echo '```'
        tail -n 15 "$log"
        echo '```'
    fi
    echo
    echo "JIT of bench_dsv3_prefill.cu and its pulling twin (bench/jit_bench, exit status $jit_rc):"
    echo
    echo '```'
    cat "$jitlog"
    echo '```'
    echo
    echo "What an SM moves (bench/link_probe, exit status $probe_rc; GB/s per SM: bytes loaded and stored):"
    echo
    echo '```'
    cat "$probelog"
    echo '```'
    echo
} > "$entry"
results=${BENCH_RESULTS:-}
if [ -z "$results" ]; then
    results=bench/RESULTS.md
    [ -n "${OUT:-}" ] && results=none
fi
if [ "$results" != none ]; then
    cat "$entry" >> "$results" && note "appended the results to $results"
fi
if out_elsewhere; then
    cp "$log" "$csv" "$entry" "$OUT"/ 2>/dev/null
    [ -f "$stalls" ] && cp "$stalls" "$OUT"/
    note "bench.log, moe_bench.csv and results-entry.md$([ -f "$stalls" ] && echo ', stalls.txt') copied to \$OUT"
fi
[ -n "${OUT:-}" ] && note "append results-entry.md to bench/RESULTS.md where you commit"
note "results in $outdir (moe_bench exit status $rc)"
[ "$jit_rc" -eq 0 ] && [ "$probe_rc" -eq 0 ] || { [ "$rc" -eq 0 ] && rc=1; }
exit "$rc"
