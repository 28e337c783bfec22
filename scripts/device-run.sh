#!/usr/bin/env bash
# device-run.sh: what a lent GPU machine runs in one call (it has no Lua or
# Criterion: binaries are built here and carried with their libraries, see
# shared/device/README.md). Writes logs under $OUT and prints a summary.
# usage: scripts/device-run.sh BUILD_DIR STEP...   steps: runtime, check-quick,
#        check, simhosts-nccl (simulated hosts: NCCL backend at 2 hosts x 1
#        and x 2 ranks and 4 hosts x 1, native refused), companions (check at world 1: the default spec's companions
#        of one rank), hosts (the hybrid backend on simulated hosts: check
#        --backend hybrid of the default spec at --sim-hosts 2 -n 2 (with
#        --time 20 where each rank has a GPU), then --sim-hosts 2 -n 4 and
#        --sim-hosts 4 -n 4 with the ranks that share a GPU at once under
#        CUDA MPS (HOSTS_MPS=0: taking turns);
#        NCCL between ranks that share a GPU over loopback,
#        --nccl-shared-gpu), sanitize-hybrid (memcheck of hosts' first run),
#        models, nccl (check --backend nccl at world 2, and 4 on 4 GPUs;
#        test_variant's nccl_* tests at 2 ranks; memcheck of four variants'
#        NCCL-backend kernels), nccl-specs (check --backend nccl of
#        worlds.lua and models.lua at each world up to the GPUs, and
#        test_variant's nccl_* tests at 4 ranks on 4 GPUs), bench-check, bench-sanitize (check --quick,
#        and memcheck and racecheck, of specs/bench.lua's BENCH_VARIANTS at the host's world: the shapes
#        the default spec lacks, e.g. rows of several chunks), world4, worlds, world8, sanitize, sanitize-w4 (memcheck and
#        racecheck at world 4), variant,
#        auto (combine = "auto": check of the default spec's auto variants at
#        worlds 2 and 4, NCCL and hybrid backends, test_variant's auto tests
#        at 2 and 4 ranks, memcheck and racecheck, and on 2 GPUs moe_bench
#        rows AUTO_GROUPS, default u,a,b,p, table in $OUT's auto.md),
#        test-gpu (make test-gpu MPS=1 SPEC=specs/default.lua; TEST_GPU_SPEC,
#        TEST_GPU_LIMIT, SYMM_TEST_PARTS and SYMM_TEST_WORLDS: a part of it),
#        selfcheck, bench, profile (rows PROFILE_GROUPS at the host's world),
#        spans (where each kind of warp spends its time, PROFILE=2: moe_bench
#        --profile=2 --no-nccl of rows PROFILE_GROUPS, default g,a,b, at the
#        host's world, a rank per GPU, SPANS_REPS timed repetitions, default
#        20; the log also lands in $OUT's spans.log),
#        sweep (bench-tune rows SWEEP_GROUPS with SWEEP_TUNINGS at the host's
#        world, SWEEP_ROUNDS rounds, default 1), inline, tune, dedup, proxy, rtbench,
#        partials (check and the sanitizers with SYMM_TUNE=PUSH_PARTIALS=1 and
#        PARTIALS_TUNE, optional, appended: e.g. PART_BATCH=8),
#        grid (layout expert's parts formed by the whole grid, PARTIAL_GRID,
#        with this rank's own parts too, GRID_OWN, and several chunks a round
#        for parts of few rows, GRID_PACK; bench/NOTES.md 58: check --quick at
#        world 2 with the default (all on), both new knobs off (the last
#        build), each alone, and PARTIAL_GRID off; the default and both off
#        at world 4, at worlds.lua's world 3, and under memcheck and
#        racecheck; GRID_CASES, some of "default old own pack grid0",
#        picks the cases, to split the step over calls; "lean", GRID_LEAN=1,
#        is not in the default list),
#        grid-time (rows GRID_GROUPS, default g, timed with the default, each
#        new knob off, both off (the last build), and the grid at prefill
#        with PUSH_PARTIALS=0; GRID_TUNINGS, space-separated, replaces the
#        list),
#        chains-check (layout expert's chains copied as the heads land,
#        CHAIN_STREAM: check of the default spec's expert variants with the
#        knob on (the default) and off and with CHAIN_WARPS 0 and 8, at world
#        2 and 4, worlds.lua at 2 and 3, with graph replays),
#        chains-sanitize (memcheck and racecheck with the knob on),
#        chains (rows g with CHAIN_STREAM on and off, bench/NOTES.md 57; on
#        2 GPUs), chains-warps (rows g with CHAIN_WARPS 2 and 8),
#        chains-profile (rows g's phase times, moe_bench --profile, with
#        CHAIN_STREAM on and off),
#        chain-words (layout expert's chain copies after the rows from the
#        sources' words, CHAIN_WORDS, bench/NOTES.md 99: check --quick of the
#        default spec with it at every max_tokens (CHAIN_STREAM=0) at world 2
#        (also with BULK_SLOTS 2) and 4 and of worlds.lua at 3, memcheck and
#        racecheck of the default's expert variants),
#        slots (rows SLOTS_GROUPS, default g, with the tunings SLOTS_TUNINGS,
#        default PARTIAL_SLOTS 1, 2, 3 and the bulk-stored parts), interleave (rows a, b, f
#        at the host's world with PUSH_INTERLEAVE on and off),
#        ab (rows AB_GROUPS, default g, at the host's world, a rank per GPU: this tree's kernels and
#        those of the commit scripts/ab-prepare.sh put in BUILD/ab, AB_ROUNDS
#        rounds (default 2) alternated in this call, new first in odd
#        rounds and old first in even ones; table in $OUT's ab.md, with
#        each row's mean p50 a side, scripts/ab-table.sh),
#        probe (link_probe, one rank per GPU: the bytes an SM moves by
#        each path, bench/NOTES.md 42), example (examples/c at 2 ranks),
#        python (the PyTorch package installed offline into python3, the one
#        with torch; its tests under torchrun at world 2 against the
#        installed copy, scripts/test-python-gpu.sh; the example
#        examples/torch_moe), torch (bench/torch_bench.py: the eager
#        Python call over the C call, a captured graph, all_to_all_single;
#        the table lands in $OUT/torch_bench.md), ncu (Nsight Compute's PC
#        sampling of rank 0's kernels NCU_KERNELS (default combine; dispatch's
#        samples are of a pass that times out: scripts/ncu-rank.sh says why)
#        in moe_bench rows NCU_ROWS (default g.prefill,g.decode,b)
#        at the host's world, the peers at speed (scripts/ncu-rank.sh), the
#        kernels compiled with SYMM_JIT_LINEINFO=1: each report's details, its
#        source page by SASS instruction and, through scripts/ncu-lines.py,
#        by line of the templates, in $OUT's ncu.tgz (the last also in the
#        logs); NCU_ARGS, optional, goes to moe_bench)
#        (profile, inline, tune and dedup: on 2 GPUs;
#        dedup times rows g with DEDUP on and off, with layout rank's
#        push warps (bench/NOTES.md 37) and with its staging buffers
#        (BULK_SLOTS 2, NOTES.md 39); inline times
#        rows a, b and f with the timing events between the kernels, as the
#        2-GPU entries of bench/RESULTS.md before 2026-11-25 were; tune
#        times the defaults beside the knobs of bench/NOTES.md entries 7-13
#        and 24 set the other way; proxy: on one GPU, both ranks at once
#        under CUDA MPS, moe_bench --shared-gpu, groups PROXY_GROUPS (a,b,f),
#        then a profile of a,b)
# The device's copy of the tree may carry another commit's .git: the bench
# step's RESULTS entry names BENCH_COMMIT where it is set, else the commit
# `make gpu-build` wrote into BUILD_DIR/COMMIT where it built (the tree the
# binaries and kernels come from), else git's answer here.
# DEVICE_GPUS (optional): use only the first N GPUs, as a machine of N GPUs
# would (the 2-GPU steps and worlds on a 4-GPU machine, in the same call).
# RUN_BUDGET (seconds, optional): the whole invocation's time. Each step's
# limit is cut to what is left less 10 s (the summary and logs.tgz), and a
# step with less than 5 s left is skipped, so the summary always comes back.
# Use it, not an outer `timeout`, to fit several invocations in one call: an
# outer timeout kills this script but not the step it is in (a step's
# timeout runs it in a process group of its own), which then runs on beside
# the next invocation, and the killed invocation leaves no logs.
set -uo pipefail
build=$1; shift
if [ -z "${BENCH_COMMIT:-}" ] && [ -s "$build/COMMIT" ]; then
    BENCH_COMMIT=$(head -c 64 "$build/COMMIT" | tr -cd '0-9a-zA-Z+.-')
    export BENCH_COMMIT
fi
case ${RUN_BUDGET:-} in
'' | *[!0-9]*) [ -z "${RUN_BUDGET:-}" ] || { echo "device-run: RUN_BUDGET must be whole seconds, got '$RUN_BUDGET'"; exit 2; } ;;
esac
. "$(dirname "${BASH_SOURCE[0]}")/gpus.sh"
ngpu=$(machine_gpus)
case ${DEVICE_GPUS:-} in
'') ;;
*[!0-9]* | 0) echo "device-run: DEVICE_GPUS must be a whole number of GPUs from 1, got '$DEVICE_GPUS'"; exit 2 ;;
*) [ "$DEVICE_GPUS" -le "$ngpu" ] || { echo "device-run: DEVICE_GPUS=$DEVICE_GPUS but the machine has $ngpu GPUs"; exit 2; }
   ngpu=$DEVICE_GPUS; export DEVICE_GPUS ;;
esac
# Logs go to one archive under $OUT (the device tool brings back few files).
final=${OUT:-/tmp/out}
out=$(mktemp -d /tmp/symm-logs.XXXXXX)
mkdir -p "$final"
export LD_LIBRARY_PATH=$PWD/.bundle${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMM_TIMEOUT=${SYMM_TIMEOUT:-30} SYMM_CACHE_DIR=/tmp/symm-cache
gpus=$(seq -s, 0 $((ngpu - 1)))
run=$build/bin/symmrun
summary=()
step() { # name limit_s command...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    if [ -n "${RUN_BUDGET:-}" ]; then
        local left=$((RUN_BUDGET - SECONDS - 10))
        if [ "$left" -lt 5 ]; then
            summary+=("$(printf '%-28s skipped: RUN_BUDGET (%s s) spent' "$name" "$RUN_BUDGET")")
            return
        fi
        [ "$limit" -gt "$left" ] && limit=$left
    fi
    timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    summary+=("$(printf '%-28s rc=%-3d %4ds  %s' "$name" "$rc" $((SECONDS - t0)) "$(grep -aE 'passed|Synthesis|FAIL|torch_moe:|overhead of' "$out/$name.log" | tail -n 1 | cut -c1-110)")")
}
# A step's table (a sweep's tune.md): copied to $final and printed after the
# summary, so that it reaches the caller's output even where $final's files
# do not all come back (a device call returns at most 8 files).
tables=()
table() { # from to
    cp "$1" "$2" && tables+=("$2")
}
# specs/bench.lua's variants at the host's world, a rank per GPU: world 2's
# (out/bench, generated above) on 2 GPUs, else generated at world $ngpu into
# out/bench-w$ngpu. Sets bench_dir to the directory (its manifest.json).
bench_at_world() {
    bench_dir=out/bench
    if [ "$ngpu" -ne 2 ]; then
        bench_dir=out/bench-w$ngpu
        $build/bin/symmgen -q -D world=$ngpu -o "$bench_dir" specs/bench.lua >> "$out/machine.log" 2>&1
    fi
}
# memcheck and racecheck of three of the default spec's layout-expert variants
# at world 2 with SYMM_TUNE=$2: steps sanitizer-TOOL-$1.
expert_sanitizers() { # name tune
    for tool in memcheck racecheck; do
        step "sanitizer-$tool-$1" 300 env SYMM_TUNE="$2" $run -n 2 --gpus "$gpus" -- \
            compute-sanitizer --tool $tool --error-exitcode 9 "$build/tests-gpu/check" \
            --manifest out/default/manifest.json --quick --graph-replays 2 \
            --variant fp8_expert_a128_w2 --variant fp16_expert_a8_cap_w2 --variant bf16_expert_w2
    done
}
{ nvidia-smi -L; echo "device-run: using $ngpu GPUs ($gpus)"; } > "$out/machine.log"
$build/bin/symmgen -q -o out/default specs/default.lua >> "$out/machine.log" 2>&1
$build/bin/symmgen -q -o out/models specs/models.lua >> "$out/machine.log" 2>&1
$build/bin/symmgen -q -o out/worlds specs/worlds.lua >> "$out/machine.log" 2>&1
$build/bin/symmgen -q -o out/bench specs/bench.lua >> "$out/machine.log" 2>&1
for s in "$@"; do
    case $s in
    runtime)
        for t in test_heap test_jit_gpu test_nccl; do
            step "$t-n2" 120 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/$t" --jobs 1
            step "$t-n4" 180 $run -n 4 --gpus "$gpus" -- "$build/tests-gpu/$t" --jobs 1
        done ;;
    partials) # layout expert's partial sums pushed whole (default only above max_tokens 512)
        step check-w2-partials 240 env SYMM_TUNE=PUSH_PARTIALS=1${PARTIALS_TUNE:+,$PARTIALS_TUNE} $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --time 20
        for knobs in PARTIAL_SLOTS=2 PARTIAL_SLOTS=3 PARTIAL_LANES=0 PARTIAL_LANES=0,PARTIAL_SLOTS=2; do
            step "check-w2-partials-$knobs" 240 env SYMM_TUNE=PUSH_PARTIALS=1,$knobs${PARTIALS_TUNE:+,$PARTIALS_TUNE} $run -n 2 --gpus "$gpus" -- \
                "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --variant bf16_expert_w2 --variant fp16_expert_a8_cap_w2
        done
        step sanitizer-memcheck-partials 300 env SYMM_TUNE=PUSH_PARTIALS=1${PARTIALS_TUNE:+,$PARTIALS_TUNE} $run -n 2 --gpus "$gpus" -- compute-sanitizer --tool memcheck --error-exitcode 9 \
            "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --graph-replays 2 \
            --variant fp8_expert_a128_w2 --variant fp16_expert_a8_cap_w2 --variant bf16_expert_w2
        step sanitizer-racecheck-partials 300 env SYMM_TUNE=PUSH_PARTIALS=1${PARTIALS_TUNE:+,$PARTIALS_TUNE} $run -n 2 --gpus "$gpus" -- compute-sanitizer --tool racecheck --error-exitcode 9 \
            "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --graph-replays 2 \
            --variant fp8_expert_a128_w2 --variant fp16_expert_a8_cap_w2 ;;
    grid) # layout expert's parts formed by the whole grid (PARTIAL_GRID, default at max_tokens <= 512; GRID_OWN: own
          # parts too; GRID_PACK: several chunks a round for parts of few rows)
        grid_tune() { # name -> SYMM_TUNE
            case $1 in
            default) echo ;; old) echo GRID_OWN=0,GRID_PACK=0 ;; own) echo GRID_PACK=0 ;; pack) echo GRID_OWN=0 ;;
            grid0) echo PARTIAL_GRID=0 ;; lean) echo GRID_LEAN=1 ;;
            esac
        }
        # GRID_CASES (space-separated) picks cases, to split the step over calls
        cases=${GRID_CASES:-default old own pack grid0}
        for g in $cases; do
            step "check-w2-grid-$g" 240 env SYMM_TUNE="$(grid_tune $g)" $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" \
                --manifest out/default/manifest.json --quick --time 20
        done
        for g in $cases; do
            [ "$g" = default ] || [ "$g" = old ] || [ "$g" = lean ] || continue
            step "check-w4-grid-$g" 300 env SYMM_TUNE="$(grid_tune $g)" $run -n 4 --gpus "$gpus" -- "$build/tests-gpu/check" \
                --manifest out/default/manifest.json --quick --graph-replays 20
            step "check-worlds-w3-grid-$g" 200 env SYMM_TUNE="$(grid_tune $g)" $run -n 3 --gpus "$gpus" -- \
                "$build/tests-gpu/check" --manifest out/worlds/manifest.json --quick --graph-replays 5
            expert_sanitizers "grid-$g" "$(grid_tune $g)"
        done ;;
    grid-time) # rows g (bench/NOTES.md 58): the default (PARTIAL_GRID, GRID_OWN, GRID_PACK at decode), each new knob
               # alone, the last build (both off), the grid at prefill; GRID_TUNINGS (space-separated) replaces the list
        # shellcheck disable=SC2086 # the list splits on spaces
        step grid-time 560 env SYMM_BUILD_DIR="$build" BENCH_OUT="$out/grid" scripts/bench-tune.sh --groups "${GRID_GROUPS:-g}" \
            ${GRID_TUNINGS:-default GRID_OWN=0 GRID_PACK=0 GRID_OWN=0,GRID_PACK=0 PUSH_PARTIALS=0,PARTIAL_GRID=1}
          [ -f "$out/grid/tune.md" ] && table "$out/grid/tune.md" "$final/grid.md" ;;
    chains-check) # layout expert's chains copied as the heads land (CHAIN_STREAM, bench/NOTES.md 57)
        expert=(--variant bf16_expert_w2 --variant bf16_expert_order_k_w2 --variant fp8_expert_a128_w2
                --variant fp16_expert_a8_cap_w2 --variant fp16_expert_a8_pull_w2)
        # The default spec's variants have max_tokens <= 512, where the knob
        # is off by default: force it on.
        for knobs in default CHAIN_STREAM=1 CHAIN_STREAM=1,CHAIN_WARPS=0 CHAIN_STREAM=1,CHAIN_WARPS=8,BULK_SLOTS=4; do
            tune=$knobs; [ "$knobs" = default ] && tune=
            step "check-w2-chains-$knobs" 300 env SYMM_TUNE="$tune" $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" \
                --manifest out/default/manifest.json --quick --graph-replays 10 "${expert[@]}"
        done
        for knobs in default CHAIN_STREAM=1; do
            tune=$knobs; [ "$knobs" = default ] && tune=
            step "check-w4-chains-$knobs" 300 env SYMM_TUNE="$tune" $run -n 4 --gpus "$gpus" -- "$build/tests-gpu/check" \
                --manifest out/default/manifest.json --quick --graph-replays 5 --variant bf16_expert_w4 \
                --variant fp8_expert_a128_w4 --variant fp16_expert_a8_cap_w4 --variant bf16_expert_order_k_w4
        done
        for w in 2 3; do # worlds.lua: top-16 chains (up to 15 rows), two peers at world 3
            step "check-worlds-w$w-chains" 200 $run -n $w --gpus "$gpus" -- "$build/tests-gpu/check" \
                --manifest out/worlds/manifest.json --quick --graph-replays 5
        done ;;
    chains-sanitize) # CHAIN_STREAM forced on (these variants' max_tokens is at most 512): under the sanitizers
        expert_sanitizers chains CHAIN_STREAM=1 ;;
    chains) # rows g: the default (chain copies as the heads land above max_tokens 512) against each way forced
        step chains 560 env SYMM_BUILD_DIR="$build" BENCH_OUT="$out/chains" scripts/bench-tune.sh --groups g \
            default CHAIN_STREAM=0 CHAIN_STREAM=1
          [ -f "$out/chains/tune.md" ] && table "$out/chains/tune.md" "$final/chains.md" ;;
    chains-profile) # rows g's phases: with the knob on, "stored" is the last row sent and "rows out" the last copy
        for knobs in default CHAIN_STREAM=0; do
            tune=$knobs; [ "$knobs" = default ] && tune=
            step "chains-profile-$knobs" 280 env SYMM_TUNE="$tune" SYMM_CACHE_DIR=/tmp/symm-cache $run -n 2 --gpus "$gpus" -- \
                "$build/bench/moe_bench" --manifest out/bench/manifest.json --groups g --no-nccl --profile
        done ;;
    chain-words) # layout expert's chain copies after the rows, from the sources' words (CHAIN_WORDS, wherever
        # CHAIN_STREAM is off: by default at max_tokens <= 512; bench/NOTES.md 99, 100), forced at every max_tokens
        step check-w2-chain-words 240 env SYMM_TUNE=CHAIN_STREAM=0 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" \
            --manifest out/default/manifest.json --quick --time 20
        step check-w2-chain-words-slots2 240 env SYMM_TUNE=CHAIN_STREAM=0,BULK_SLOTS=2 $run -n 2 --gpus "$gpus" -- \
            "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --graph-replays 5 \
            --variant bf16_expert_w2 --variant fp16_expert_a8_cap_w2 --variant fp8_expert_a128_w2
        step check-w4-chain-words 300 env SYMM_TUNE=CHAIN_STREAM=0 $run -n 4 --gpus "$gpus" -- "$build/tests-gpu/check" \
            --manifest out/default/manifest.json --quick --graph-replays 20
        step check-worlds-w3-chain-words 200 env SYMM_TUNE=CHAIN_STREAM=0 $run -n 3 --gpus "$gpus" -- \
            "$build/tests-gpu/check" --manifest out/worlds/manifest.json --quick --graph-replays 5
        expert_sanitizers chain-words CHAIN_STREAM=0 ;;
    ab) # this tree's kernels against BUILD/ab's (scripts/ab-prepare.sh REV), alternated in one call, at the
        # host's world (DEVICE_GPUS), a rank per GPU
        bench_at_world
        pm=$bench_dir/manifest.json om=$build/ab/${bench_dir#out/}/manifest.json
        if [ ! -f "$om" ]; then
            summary+=("ab: no $om (run scripts/ab-prepare.sh REV before the call)")
        else
            rev=$(cat "$build/ab/REV" 2>/dev/null || echo unknown)
            for i in $(seq 1 "${AB_ROUNDS:-2}"); do
                # ABBA: the first of a pair ran 1.5-2.5 us slower or faster
                # than the second on unchanged code (bench/NOTES.md 62, 64).
                sides="new old"; [ $((i % 2)) -eq 0 ] && sides="old new"
                for side in $sides; do
                    m=$pm
                    [ "$side" = old ] && m=$om
                    step "ab-$side-$i" 300 env SYMM_CACHE_DIR=/tmp/symm-cache $run -n "$ngpu" --gpus "$gpus" -- \
                        "$build/bench/moe_bench" --manifest "$m" --groups "${AB_GROUPS:-g}" --no-nccl --reps 20
                done
            done
            { echo "rows ${AB_GROUPS:-g} at world $ngpu, us p50/p90, dispatch then combine: this tree (new) against ${rev:0:12} (old), alternated (new first in odd rounds, old first in even ones)"
              echo
              scripts/ab-table.sh "$out" "${rev:0:12}"; } > "$out/ab.md" 2>&1
            table "$out/ab.md" "$final/ab.md"
        fi ;;
    chains-warps) # rows g: warps a block that only copy chains (default 4)
        step chains-warps 560 env SYMM_BUILD_DIR="$build" BENCH_OUT="$out/chains-warps" scripts/bench-tune.sh --groups g \
            CHAIN_WARPS=2 CHAIN_WARPS=8
          [ -f "$out/chains-warps/tune.md" ] && table "$out/chains-warps/tune.md" "$final/chains-warps.md" ;;
    check-quick) step check-w2-quick 240 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --time 20 ;;
    check) step check-w2 400 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json --time 20 ;;
    companions) # the default spec's companions of one rank (spec field hosts: two one-GPU hosts)
        step check-companions-w1 200 $run -n 1 --gpus "$gpus" -- "$build/tests-gpu/check" \
            --manifest out/default/manifest.json --time 20 ;;
    simhosts-nccl) # worlds across 2 simulated hosts (symmrun --sim-hosts): the NCCL backend, native refused
        step check-w2-nccl-2hosts 300 $run -n 2 --gpus "$gpus" --sim-hosts 2 -- "$build/tests-gpu/check" \
            --manifest out/default/manifest.json --backend nccl --quick
        shared=(); [ "$ngpu" -lt 4 ] && shared=(--nccl-shared-gpu)
        step check-w4-nccl-2hosts 300 $run -n 4 --gpus "$gpus" --sim-hosts 2 "${shared[@]}" -- "$build/tests-gpu/check" \
            --manifest out/default/manifest.json --backend nccl --quick
        step check-w4-nccl-4hosts 300 $run -n 4 --gpus "$gpus" --sim-hosts 4 "${shared[@]}" -- "$build/tests-gpu/check" \
            --manifest out/default/manifest.json --backend nccl --quick
        step check-w2-native-2hosts-refused 120 bash -c "out=\$($run -n 2 --gpus $gpus --sim-hosts 2 -- $build/tests-gpu/check \
            --manifest out/default/manifest.json --backend native --quick 2>&1); rc=\$?; echo \"\$out\" | tail -n 3; \
            [ \$rc -ne 0 ] && echo \"\$out\" | grep -q 'the world spans 2 hosts (sim0, sim1): use backend hybrid'" ;;
    hosts) # the hybrid backend across simulated hosts (docs/protocol.md "Across hosts")
        for hw in "2 2" "2 4" "4 4"; do
            read -r hosts w <<< "$hw"
            extra=(--sim-hosts "$hosts")
            [ "$w" -gt "$ngpu" ] && extra+=(--nccl-shared-gpu)
            if [ "$w" -gt "$ngpu" ] && [ "${HOSTS_MPS:-1}" != 0 ]; then
                export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
                mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
                nvidia-cuda-mps-control -d >> "$out/machine.log" 2>&1
                step "check-hybrid-h$hosts-n$w-mps" 300 $run -n "$w" --gpus "$gpus" "${extra[@]}" -- \
                    "$build/tests-gpu/check" --manifest out/default/manifest.json --backend hybrid --quick --skip-unsupported
                echo quit | nvidia-cuda-mps-control
                unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
            else
                # One GPU a rank: also 20 timed calls at max_tokens (NCCL over
                # loopback between the simulated hosts: a floor, not a speed).
                timed=()
                [ "$w" -le "$ngpu" ] && timed=(--time 20)
                step "check-hybrid-h$hosts-n$w" 300 $run -n "$w" --gpus "$gpus" "${extra[@]}" -- \
                    "$build/tests-gpu/check" --manifest out/default/manifest.json --backend hybrid --quick "${timed[@]}"
            fi
        done ;;
    models) step check-models-w2 400 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/models/manifest.json --quick --time 20 ;;
    nccl) step check-w2-nccl 300 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json --backend nccl --quick
        if [ "$ngpu" -ge 4 ]; then
            step check-w4-nccl 300 $run -n 4 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json --backend nccl --quick
        fi
        # test_variant's NCCL-backend tests (timeouts, streams, capture) at 2 ranks
        step test_variant-nccl-n2 200 env SYMM_TEST_MANIFEST=out/default/manifest.json $run -n 2 --gpus "$gpus" -- \
            "$build/tests-gpu/test_variant" --jobs 1 --filter 'variant/nccl_*'
        # the backend's own kernels (pack, gather, scatter, the expert stage's moves) under memcheck
        # (API errors not reported: NCCL's init probes kernels it has no image of for this GPU)
        step sanitizer-memcheck-nccl 300 $run -n 2 --gpus "$gpus" -- compute-sanitizer --tool memcheck \
            --report-api-errors no --error-exitcode 9 \
            "$build/tests-gpu/check" --manifest out/default/manifest.json --backend nccl --quick \
            --variant bf16_rank_w2 --variant fp8_expert_a128_w2 --variant fp16_expert_a8_cap_w2 --variant bf16_expert_w2 ;;
    nccl-specs) # the NCCL backend on worlds.lua and models.lua at every world the GPUs hold, a rank a GPU
        for spec in worlds models; do
            for w in 2 3 4 5 6 7 8; do
                [ "$w" -le "$ngpu" ] && grep -q "\"world\": $w," out/$spec/manifest.json || continue
                step check-$spec-w$w-nccl 300 $run -n $w --gpus "$gpus" -- "$build/tests-gpu/check" \
                    --manifest out/$spec/manifest.json --backend nccl --quick
            done
        done
        [ "$ngpu" -ge 4 ] && step test_variant-nccl-n4 200 env SYMM_TEST_MANIFEST=out/default/manifest.json \
            $run -n 4 --gpus "$gpus" -- "$build/tests-gpu/test_variant" --jobs 1 --filter 'variant/nccl_*' ;;
    world4) step check-w4 300 $run -n 4 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --graph-replays 20 ;;
    worlds) for w in 2 3 5 8; do
            step check-worlds-w$w 200 $run -n $w --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/worlds/manifest.json --quick --graph-replays 20
        done ;;
    sanitize)
        for tool in memcheck racecheck; do
            step sanitizer-$tool 300 $run -n 2 --gpus "$gpus" -- compute-sanitizer --tool $tool --error-exitcode 9 \
                "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --graph-replays 2 \
                --variant bf16_rank_w2 --variant fp8_expert_a128_w2 --variant bf16_rank_cap_w2 \
                --variant bf16_rank_pull_w2 --variant fp16_expert_a8_pull_w2 --variant bf16_expert_order_k_w2
        done ;;
    bench-check | bench-sanitize) # check --quick of specs/bench.lua's variants BENCH_VARIANTS (comma-separated;
        # default its layout-expert variants, both orders, at decode and prefill) at the host's world, a rank per
        # GPU; bench-sanitize: memcheck and racecheck of them (default the decode ones) with two graph replays
        bench_at_world
        bm=$bench_dir/manifest.json
        if [ "$s" = bench-check ]; then
            list=${BENCH_VARIANTS:-bench_dsv3_decode_expert,bench_dsv3_decode_expert_k,bench_dsv3_prefill_expert,bench_dsv3_prefill_expert_k}
        else
            list=${BENCH_VARIANTS:-bench_dsv3_decode_expert,bench_dsv3_decode_expert_k,bench_dsv3_decode_expert_fp8}
        fi
        vargs=()
        IFS=, read -ra names <<< "$list"
        for v in "${names[@]}"; do vargs+=(--variant "$v"); done
        if [ "$s" = bench-check ]; then
            step bench-check 300 $run -n "$ngpu" --gpus "$gpus" -- "$build/tests-gpu/check" --manifest "$bm" --quick \
                --graph-replays 2 "${vargs[@]}"
        else
            for tool in memcheck racecheck; do
                step bench-sanitizer-$tool 400 $run -n "$ngpu" --gpus "$gpus" -- compute-sanitizer --tool $tool \
                    --error-exitcode 9 "$build/tests-gpu/check" --manifest "$bm" --quick --graph-replays 2 "${vargs[@]}"
            done
        fi ;;
    sanitize-w4) # memcheck and racecheck at world 4 (a rank per GPU on 4 GPUs, else two a GPU): layout
        # rank's pushes round the peers (PUSH_INTERLEAVE), both forms of auto, layout expert's parts
        for tool in memcheck racecheck; do
            step sanitizer-$tool-w4 400 $run -n 4 --gpus "$gpus" -- compute-sanitizer --tool $tool --error-exitcode 9 \
                "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --graph-replays 2 \
                --variant bf16_rank_w4 --variant bf16_rank_auto_w4 --variant fp8_expert_a128_w4 --variant bf16_expert_w4
        done ;;
    sanitize-hybrid) # the hybrid backend's kernels (and the companion's) under memcheck, 2 simulated hosts
        # (API errors not reported: NCCL's init probes kernels it has no image
        # of for this GPU, cudaErrorNoKernelImageForDevice, and goes on)
        step sanitizer-memcheck-hybrid 300 $run -n 2 --gpus "$gpus" --sim-hosts 2 -- compute-sanitizer --tool memcheck --report-api-errors no \
            --error-exitcode 9 "$build/tests-gpu/check" --manifest out/default/manifest.json --backend hybrid --quick ;;
    auto) # combine = "auto" (both forms, chosen per call by where y lies; docs/protocol.md): the default
        # spec's auto variants bit for bit with y inside (pull) and outside (push) in alternate calls,
        # native at worlds 2 and 4 (with graph replays), the NCCL backend, the hybrid's auto companion
        # on 2 simulated hosts; test_variant's auto tests (both forms in turn, and y placed differently
        # across ranks failing fast with SYMM_ERR_MISMATCH on every rank) at 2 and 4 ranks; memcheck and
        # racecheck of the world-2 variant; then, on 2 GPUs, rows u (and a, b, p for comparison).
        step auto-check-w2 300 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json \
            --variant bf16_rank_auto_w2 --graph-replays 20 --time 20
        step auto-check-w4 300 $run -n 4 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json \
            --variant bf16_rank_auto_w4 --quick --graph-replays 10
        step auto-check-w2-nccl 200 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" \
            --manifest out/default/manifest.json --variant bf16_rank_auto_w2 --backend nccl --quick
        shared=(); [ "$ngpu" -lt 4 ] && shared=(--nccl-shared-gpu)
        step auto-check-w4-hybrid-2hosts 300 $run -n 4 --gpus "$gpus" --sim-hosts 2 "${shared[@]}" -- \
            "$build/tests-gpu/check" --manifest out/default/manifest.json --variant bf16_rank_auto_w4 --backend hybrid --quick
        for n in 2 4; do
            step auto-test_variant-n$n 200 env SYMM_TEST_MANIFEST=out/default/manifest.json $run -n $n --gpus "$gpus" -- \
                "$build/tests-gpu/test_variant" --jobs 1 --filter 'variant/auto_*'
        done
        for tool in memcheck racecheck; do
            step auto-sanitizer-$tool 300 $run -n 2 --gpus "$gpus" -- compute-sanitizer --tool $tool --error-exitcode 9 \
                "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --graph-replays 2 \
                --variant bf16_rank_auto_w2
        done
        if [ "$ngpu" -ge 2 ]; then
            step auto-bench 400 env SYMM_CACHE_DIR=/tmp/symm-cache $run -n 2 --gpus 0,1 -- "$build/bench/moe_bench" \
                --manifest out/bench/manifest.json --groups "${AUTO_GROUPS:-u,a,b,p}" --no-nccl --markdown "$final/auto.md"
        fi ;;
    variant)
        for n in 2 4; do
            step test_variant-n$n 180 env SYMM_TEST_MANIFEST=out/default/manifest.json $run -n $n --gpus "$gpus" -- "$build/tests-gpu/test_variant" --jobs 1
        done ;;
    selfcheck) step selfcheck 120 scripts/selfcheck.sh "$build" ;;
    example) # examples/c (make gpu-build builds it), its libsymm from build/prefix
        step example 120 env LD_LIBRARY_PATH="$PWD/$build/prefix/lib:$LD_LIBRARY_PATH" \
            $run -n 2 --gpus "$gpus" -- "$build/examples/c/moe_example" ;;
    test-gpu) # make test-gpu MPS=1 on the default spec (make is not there); TEST_GPU_SPEC other specs,
        # TEST_GPU_LIMIT the step's seconds; SYMM_TEST_PARTS and SYMM_TEST_WORLDS pass through
        # (scripts/test-gpu.sh: a part of the run, e.g. world 4 alone). The whole run takes about
        # 17 minutes on 4 GPUs, more than a device call: split it there (bench/NOTES.md "Next")
        step test-gpu "${TEST_GPU_LIMIT:-560}" env SYMM_TEST_MPS=1 SYMM_BUILD_DIR="$build" \
            SPEC="${TEST_GPU_SPEC:-specs/default.lua}" scripts/test-gpu.sh \
            "$build/tests-gpu/test_heap" "$build/tests-gpu/test_jit_gpu" "$build/tests-gpu/test_nccl" \
            "$build/tests-gpu/test_variant" ;;
    bench) step bench "${BENCH_STEP_LIMIT:-570}" env SYMM_BUILD_DIR="$build" BENCH_OUT="$final" scripts/bench.sh ${BENCH_ARGS:-} ;;
    profile) # phase times of rows PROFILE_GROUPS (a,b) at the host's world, a rank per GPU
        bench_at_world
        pm=$bench_dir/manifest.json
        step profile 300 env SYMM_CACHE_DIR=/tmp/symm-cache $run -n "$ngpu" --gpus "$gpus" -- "$build/bench/moe_bench" \
            --manifest "$pm" --groups "${PROFILE_GROUPS:-a,b}" --no-nccl --profile ;;
    spans) # where each kind of warp spends its time (PROFILE=2, docs/api.md "Spans"): rows PROFILE_GROUPS (g,a,b) at
           # the host's world, a rank per GPU
        bench_at_world
        pm=$bench_dir/manifest.json
        step spans 540 env SYMM_CACHE_DIR=/tmp/symm-cache $run -n "$ngpu" --gpus "$gpus" -- "$build/bench/moe_bench" \
            --manifest "$pm" --groups "${PROFILE_GROUPS:-g,a,b}" --no-nccl --profile=2 --reps "${SPANS_REPS:-20}"
          [ -f "$out/spans.log" ] && cp "$out/spans.log" "$final/spans.log" ;;
    sweep) # rows SWEEP_GROUPS (a,b,f) with the tunings SWEEP_TUNINGS at the host's world (SWEEP_WORLD), SWEEP_ROUNDS rounds
        step sweep 540 env SYMM_BUILD_DIR="$build" BENCH_OUT="$out/sweep" BENCH_WORLD="${SWEEP_WORLD:-$ngpu}" \
            scripts/bench-tune.sh --groups "${SWEEP_GROUPS:-a,b,f}" --rounds "${SWEEP_ROUNDS:-1}" ${SWEEP_TUNINGS:-default}
          [ -f "$out/sweep/tune.md" ] && table "$out/sweep/tune.md" "$final/sweep.md" ;;
    inline) step inline 200 env SYMM_CACHE_DIR=/tmp/symm-cache $run -n 2 --gpus "$gpus" -- "$build/bench/moe_bench" \
            --manifest out/bench/manifest.json --groups a,b,f --no-nccl --inline-events ;;
    tune) step tune 540 env SYMM_BUILD_DIR="$build" BENCH_OUT="$out/tune" scripts/bench-tune.sh --groups a,b,f \
            default PREFETCH=0 LOCAL_VEC=1 PUSH_WARPS_SMALL=0 SUM_UNROLL=8 PUSH_BATCH=2 \
            LOCAL_VEC=1,PUSH_WARPS_SMALL=3 LOCAL_VEC=1,BULK_SLOTS=1 BULK_SLOTS=1 PDL=0
          [ -f "$out/tune/tune.md" ] && table "$out/tune/tune.md" "$final/tune.md" ;;
    dedup) step dedup 400 env SYMM_BUILD_DIR="$build" BENCH_OUT="$out/dedup" scripts/bench-tune.sh --groups g default DEDUP=0 \
            PUSH_WARPS=4,PUSH_WARPS_SMALL=3 BULK_SLOTS=2
          [ -f "$out/dedup/tune.md" ] && table "$out/dedup/tune.md" "$final/dedup.md" ;;
    slots) # layout expert's partial sums: staging slots (bench/NOTES.md 52), rows g at world 2
        step slots 400 env SYMM_BUILD_DIR="$build" BENCH_OUT="$out/slots" scripts/bench-tune.sh --groups "${SLOTS_GROUPS:-g}" \
            ${SLOTS_TUNINGS:-default PARTIAL_SLOTS=2 PARTIAL_SLOTS=3 PARTIAL_LANES=0}
          [ -f "$out/slots/tune.md" ] && table "$out/slots/tune.md" "$final/slots.md" ;;
    interleave) # layout rank's pushes round the peers (bench/NOTES.md 53), rows a, b at the host's world
        step interleave 400 env SYMM_BUILD_DIR="$build" BENCH_OUT="$out/interleave" BENCH_WORLD="$ngpu" scripts/bench-tune.sh --groups a,b,f \
            default PUSH_INTERLEAVE=0
          [ -f "$out/interleave/tune.md" ] && table "$out/interleave/tune.md" "$final/interleave.md" ;;
    proxy)
        export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        nvidia-cuda-mps-control -d >> "$out/machine.log" 2>&1
        step proxy 300 env SYMM_CACHE_DIR=/tmp/symm-cache $run -n 2 --gpus 0 -- "$build/bench/moe_bench" \
            --manifest out/bench/manifest.json --shared-gpu --groups "${PROXY_GROUPS:-a,b,f}" --reps 50
        step proxy-profile 120 env SYMM_CACHE_DIR=/tmp/symm-cache $run -n 2 --gpus 0 -- "$build/bench/moe_bench" \
            --manifest out/bench/manifest.json --shared-gpu --groups a,b --profile
        echo quit | nvidia-cuda-mps-control
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY ;;
    world8) # default.lua has no world 8: models.lua's world-8 variants at
            # max_tokens 128 (as make test-gpu runs those too large for
            # several ranks a GPU); worlds.lua's are in the worlds step.
            $build/bin/symmgen -q -D max_tokens=128 -o out/models-t128 specs/models.lua >> "$out/machine.log" 2>&1
            step check-w8-models 300 $run -n 8 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/models-t128/manifest.json --quick --graph-replays 10 ;;
    python) # pip builds nothing here: setup.py takes $build's libsymm.so and symmgen.
        step python-install 300 env SYMMGEN_BUILD_DIR="$(cd "$build" && pwd)" python3 -m pip install --no-index \
            --no-build-isolation --no-deps ./python
        (cd /tmp && python3 -c 'import symmgen, symmgen.ops, symmgen._lib as l; print("symmgen", symmgen.__version__,
            symmgen.__file__, l.library_path(), l.symmgen_path(), "register_symm_mem_args:", symmgen.ops.HAS_SYMM_MEM_ARGS)') \
            >> "$out/python-install.log" 2>&1
        step python-tests 560 env SYMMGEN_TEST_INSTALLED=1 SYMM_BUILD_DIR="$build" LOGS="$out/python-ranks" \
            scripts/test-python-gpu.sh
        if [ "$ngpu" -ge 2 ]; then
            step python-example 240 python3 -m torch.distributed.run --nproc-per-node 2 examples/torch_moe/train.py
        fi ;;
    torch) # On one GPU the two ranks share it under MPS: host costs only (a proxy).
        if [ "$ngpu" -lt 2 ]; then
            export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
            mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
            nvidia-cuda-mps-control -d >> "$out/machine.log" 2>&1
        fi
        step torch-bench 400 python3 -m torch.distributed.run --nproc-per-node 2 bench/torch_bench.py \
            --out "$final/torch_bench.md"
        if [ "$ngpu" -lt 2 ]; then
            echo quit | nvidia-cuda-mps-control
            unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        fi ;;
    ncu) # rank 0 under Nsight Compute (scripts/ncu-rank.sh), one row and kernel a run; the reports' pages as text
        bench_at_world
        pm=$bench_dir/manifest.json
        ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
        # The reports (binary, large) stay out of $out, which logs.tgz packs; their pages as text go in ncu.tgz.
        reps=$(mktemp -d /tmp/symm-ncu.XXXXXX)
        rows=${NCU_ROWS:-g.prefill g.decode b}
        for r in ${rows//,/ }; do
            # A sample every 2^(5+N) cycles: prefill's kernels run about 15 times as long as decode's.
            case $r in *prefill* | a | d | f.* | i.a | p.a | u.a*) iv=3 ;; *) iv=0 ;; esac
            for k in ${NCU_KERNELS:-combine}; do
                rep=$reps/$r-$k
                # shellcheck disable=SC2086 # NCU_ARGS: words
                step "ncu-$r-$k" "${NCU_LIMIT:-200}" env SYMM_CACHE_DIR=/tmp/symm-cache-lineinfo SYMM_JIT_LINEINFO=1 SYMM_JIT_DUMP=1 \
                    NCU="$ncu_bin" NCU_REPORT="$rep" NCU_KERNEL="symm_$k" NCU_INTERVAL="${NCU_INTERVAL:-$iv}" \
                    NCU_SOURCES="$bench_dir" $run -n "$ngpu" --gpus "$gpus" -- scripts/ncu-rank.sh "$build/bench/moe_bench" \
                    --manifest "$pm" --rows "$r" --no-nccl --warmup 3 --reps 3 ${NCU_ARGS:-}
                if [ -f "$rep.ncu-rep" ] && [ -x "$ncu_bin" ]; then
                    "$ncu_bin" -i "$rep.ncu-rep" --page details --print-details all > "$rep-details.txt" 2>&1
                    "$ncu_bin" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep-sass.csv" 2>&1
                    # By line of the templates: the dumped cubins (SYMM_JIT_DUMP) through nvdisasm.
                    python3 scripts/ncu-lines.py "$rep-sass.csv" --elf-dir /tmp/symm-cache-lineinfo > "$rep-lines.txt" 2>&1
                    cp "$rep-lines.txt" "$out/ncu-$r-$k-lines.txt"
                fi
            done
        done
        tar -C "$reps" -czf "$final/ncu.tgz" --exclude='*.ncu-rep' . && rm -rf "$reps" ;;
    probe) # bench/link_probe; PROBE_ARGS (optional) replaces its arguments, e.g. "--sms 24 --kernels load,tld"
        # shellcheck disable=SC2086 # PROBE_ARGS: words
        step link_probe 300 $run -n "$ngpu" --gpus "$gpus" -- "$build/bench/link_probe" \
            ${PROBE_ARGS:---sms 8,16,24,32,48,64 --reps 20} ;;
    rtbench) for n in 2 4; do
            step rtbench-n$n 180 $run -n $n --gpus "$gpus" -- "$build/bench/runtime_bench" --cu out/default/bf16_rank_w2.cu
        done ;;
    *) echo "device-run: unknown step $s (expected runtime, partials, grid, grid-time, check-quick, check, companions, hosts, models, nccl, nccl-specs, world4, worlds, world8, test-gpu, rtbench, sanitize, sanitize-w4, auto, variant, selfcheck, example, bench, profile, spans, inline, tune, dedup, proxy, probe, python, torch, ncu)"; exit 2 ;;
    esac
done
printf '%s\n' "${summary[@]}" | tee "$out/summary.log"
cp "$out/summary.log" "$final/summary.log"
for t in "${tables[@]}"; do
    printf '\n%s:\n' "${t##*/}"
    cat "$t"
done
tar -C "$out" -czf "$final/logs.tgz" . && rm -rf "$out"
