#!/usr/bin/env bash
# test-gpu.sh: the GPU tests, through symmrun, on the GPUs of this host.
#   - the runtime's GPU tests (heap, JIT, NCCL) at 2 ranks and 4 ranks;
#   - the dispatch/combine matrix (tests/gpu/check.c) over every variant of
#     the specs (SPEC=path for one spec; default: specs/default.lua,
#     specs/worlds.lua and specs/models.lua) at every world they declare
#     (world 1 too: the companions of spec field hosts, native only):
#     one rank per GPU where the GPUs suffice (native and NCCL backend), else
#     several ranks per GPU (time-sliced: correctness only, the quick matrix;
#     the NCCL backend too at worlds up to NCCL_SHARED_MAX, by default 4 or
#     two ranks a GPU where that is more (world 8 on 4 GPUs), through
#     symmrun --nccl-shared-gpu: NCCL over loopback sockets;
#     a variant above 2^22 elements per rank's input runs again from the
#     same spec generated with max_tokens = 128, every other field kept, so
#     that every shape, dtype and layout is checked at a size time-slicing
#     can afford; a layout-rank variant that takes combine's default is
#     "push" there, below max_tokens 1024, where it was "auto": the
#     default spec's "auto" variants check that form);
#   - with the default spec, its world-2 variants again at both ends of the
#     tuning knobs' ranges (SYMM_TUNE, docs/api.md "Tuning");
#   - with the default spec, worlds across simulated hosts (symmrun
#     --sim-hosts): the NCCL backend, native's refusal, and the hybrid
#     backend's variants (those with companions) at 2 hosts x 1 rank, 2 x 2
#     and 4 x 1;
#   - first, examples/c's moe_example at 2 ranks (BUILD/examples/c).
# With SYMM_TEST_MPS=1 (make test-gpu MPS=1) the native checks of worlds
# larger than the GPU count run with every rank a client of a CUDA MPS
# daemon that this script starts (and stops) with directories of its own:
# the ranks sharing a GPU then run at once, as ranks on separate GPUs do,
# instead of taking turns (a stronger test of the device protocol, and
# faster); the Criterion tests and the NCCL backend stay time-sliced.
# Without a GPU it says "skipped: no GPU" and exits 0.
# A whole run takes about 17 minutes on 4 x H200; to split it over sessions
# or calls, SYMM_TEST_PARTS names the parts to run (default all of them:
# "runtime matrix hosts tunings": examples/c and the Criterion tests, the
# spec matrix, the simulated hosts, the tuning knobs' ends) and
# SYMM_TEST_WORLDS the worlds of the matrix (default every world a spec
# declares), e.g. SYMM_TEST_PARTS="matrix hosts tunings" SYMM_TEST_WORLDS=4.
# usage: SYMM_BUILD_DIR=build scripts/test-gpu.sh TEST_BINARIES...
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpus.sh"
build=${SYMM_BUILD_DIR:-build}
# The parts and worlds asked for (checked first, GPU or not).
parts=" ${SYMM_TEST_PARTS:-runtime matrix hosts tunings} "
worlds=" $(echo "${SYMM_TEST_WORLDS:-1 2 3 4 5 6 7 8}" | tr ',' ' ') "
for p in $parts; do
    case $p in runtime | matrix | hosts | tunings) ;;
    *) echo "test-gpu: SYMM_TEST_PARTS: unknown part $p (expected some of: runtime matrix hosts tunings)"; exit 2 ;;
    esac
done
for w in $worlds; do
    [[ "$w" =~ ^[1-8]$ ]] || { echo "test-gpu: SYMM_TEST_WORLDS: $w is not a world of 1 to 8 ranks"; exit 2; }
done
case ${NCCL_SHARED_MAX-1} in
'' | *[!0-9]*) echo "test-gpu: NCCL_SHARED_MAX: expected a world (a whole number of ranks), got '$NCCL_SHARED_MAX'"; exit 2 ;;
esac
part() { [[ "$parts" == *" $1 "* ]]; }
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "test-gpu: skipped: no GPU"
    exit 0
fi
ngpu=$(gpu_count)
gpus=$(seq -s, 0 $((ngpu - 1)))
nccl_shared_max=${NCCL_SHARED_MAX:-$((2 * ngpu > 4 ? 2 * ngpu : 4))}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMM_CACHE_DIR=${SYMM_CACHE_DIR:-$build/jit-cache}
run=$build/bin/symmrun
passed=0 failed=0
note() { echo "test-gpu: $*"; }
record() { if [ "$1" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); note "FAILED: $2"; fi; }

# SYMM_TEST_MPS=1: an MPS daemon of this run's own, for the native checks
# of ranks sharing GPUs (`shared` prefixes their symmrun).
shared=()
if [ -n "${SYMM_TEST_MPS:-}" ] && [ "${SYMM_TEST_MPS}" != 0 ]; then
    if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
        note "SYMM_TEST_MPS=$SYMM_TEST_MPS: nvidia-cuda-mps-control not found (it comes with the NVIDIA driver)"
        exit 1
    fi
    mps=$(mktemp -d /tmp/symm-mps.XXXXXX)
    mkdir -p "$mps/pipe" "$mps/log"
    shared=(env CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log")
    if ! "${shared[@]}" nvidia-cuda-mps-control -d; then
        note "SYMM_TEST_MPS=$SYMM_TEST_MPS: nvidia-cuda-mps-control -d failed (log: $mps/log)"
        exit 1
    fi
    trap 'echo quit | "${shared[@]}" nvidia-cuda-mps-control; rm -rf "$mps"' EXIT
    note "CUDA MPS daemon started ($mps): ranks sharing a GPU run at once in the native checks"
fi
# The native check of world w: check ARGS... through symmrun, its output
# also in $native_log. Under MPS where the ranks share GPUs; a variant whose
# blocks cannot all be resident at once there (the runtime refuses it,
# SYMM_ERR_UNSUPPORTED, and check --skip-unsupported lists it) runs again
# with the ranks taking turns. ARGS hold no --variant, or only in $variants;
# symmrun gets the options in $run_extra too.
native_log=
variants=()
run_extra=()
at_once() { [ "$1" -gt "$ngpu" ] && [ ${#shared[@]} -gt 0 ]; } # w: its native check goes under MPS
native_check() { # w label args...
    local w=$1 label=$2
    shift 2
    native_log=$(mktemp)
    if ! at_once "$w"; then
        $run -n "$w" --gpus "$gpus" "${run_extra[@]}" -- "$build/tests-gpu/check" "$@" "${variants[@]}" | tee "$native_log"
        record "${PIPESTATUS[0]}" "$label"
        return
    fi
    "${shared[@]}" $run -n "$w" --gpus "$gpus" "${run_extra[@]}" -- "$build/tests-gpu/check" "$@" "${variants[@]}" \
        --skip-unsupported | tee "$native_log"
    record "${PIPESTATUS[0]}" "$label, ranks at once under MPS"
    local apart=()
    while read -r v; do apart+=(--variant "$v"); done < <(sed -n 's/^\[0\] unsupported \([^ :]*\):.*/\1/p' "$native_log")
    if [ ${#apart[@]} -gt 0 ]; then
        note "the $((${#apart[@]} / 2)) variant(s) too wide to run at once under MPS, the ranks taking turns"
        $run -n "$w" --gpus "$gpus" "${run_extra[@]}" -- "$build/tests-gpu/check" "$@" "${apart[@]}"
        record $? "$label, ranks taking turns"
    fi
}

# examples/c, as a user runs it: 2 ranks, checked against the CPU reference.
# It finds libsymm through its rpath (BUILD/prefix, where make installs it for
# the example), or, on a machine the build was copied to, LD_LIBRARY_PATH.
example=$build/examples/c/moe_example
if ! part runtime; then
    note "examples/c and the Criterion tests: not in SYMM_TEST_PARTS"
elif [ -x "$example" ]; then
    note "examples/c: moe_example with 2 ranks on $ngpu GPU(s)"
    LD_LIBRARY_PATH="$(cd "$build" && pwd)/prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        $run -n 2 --gpus "$gpus" -- "$example"
    record $? "examples/c moe_example -n 2"
else
    record 1 "examples/c: $example is not built (make test-gpu, or make gpu-build, builds it)"
fi

# The Criterion tests (test_variant) open their variants from this manifest.
if [ -z "${SYMM_TEST_MANIFEST:-}" ]; then
    $build/bin/symmgen -q specs/default.lua || record 1 "symmgen specs/default.lua (SYMM_TEST_MANIFEST)"
    export SYMM_TEST_MANIFEST=out/default/manifest.json
fi

part runtime || set --
for t in "$@"; do
    for n in 2 4; do
        note "$(basename "$t") with $n ranks on $ngpu GPU(s)"
        $run -n "$n" --gpus "$gpus" -- "$t" --jobs 1
        record $? "$(basename "$t") -n $n"
        # Ranks sharing GPUs: the NCCL tests again, with NCCL let share them.
        filter=
        case "$(basename "$t")" in
        test_nccl) filter='*' ;;
        test_variant) filter='variant/nccl_*' ;;
        esac
        if [ -n "$filter" ] && [ "$n" -gt "$ngpu" ] && [ -z "${SYMM_SKIP_NCCL:-}" ]; then
            note "$(basename "$t") ($filter) with $n ranks on $ngpu GPU(s), symmrun --nccl-shared-gpu"
            $run -n "$n" --gpus "$gpus" --nccl-shared-gpu -- "$t" --jobs 1 --filter "$filter"
            record $? "$(basename "$t") -n $n --nccl-shared-gpu"
        fi
    done
done

specs=${SPEC:-specs/default.lua specs/worlds.lua specs/models.lua}
part matrix || specs=
SMALL_TOKENS=128
for spec in $specs; do
    name=$(basename "$spec" .lua)
    out=$build/gpu-out/$name
    rm -rf "$out-t$SMALL_TOKENS"
    $build/bin/symmgen -q -o "$out" "$spec" || { record 1 "symmgen $spec"; continue; }
    # World 1: the companions of two hosts of one GPU each (spec field
    # hosts), native only.
    for w in $(seq 1 8); do
        grep -q "\"world\": $w," "$out/manifest.json" || continue
        [[ "$worlds" == *" $w "* ]] || { note "$name: world $w not in SYMM_TEST_WORLDS"; continue; }
        extra=()
        [ "$w" -gt "$ngpu" ] && extra=(--quick --max-elems 4194304)
        note "$name: world $w on $ngpu GPU(s), native ${extra[*]}$(at_once "$w" && echo ", ranks at once under MPS")"
        variants=()
        native_check "$w" "check $name world $w native" --manifest "$out/manifest.json" "${extra[@]}"
        # The variants too large for time-sliced ranks, at a smaller max_tokens.
        large=()
        while read -r v; do large+=(--variant "$v"); done < <(sed -n 's/^\[0\] skip \([^ ]*\) .*/\1/p' "$native_log")
        rm -f "$native_log"
        if [ ${#large[@]} -gt 0 ]; then
            small=$out-t$SMALL_TOKENS
            [ -f "$small/manifest.json" ] || $build/bin/symmgen -q -D max_tokens=$SMALL_TOKENS -o "$small" "$spec" ||
                { record 1 "symmgen -D max_tokens=$SMALL_TOKENS $spec"; continue; }
            note "$name: world $w, the $((${#large[@]} / 2)) skipped variant(s) with max_tokens = $SMALL_TOKENS"
            variants=("${large[@]}")
            native_check "$w" "check $name world $w native, max_tokens $SMALL_TOKENS" \
                --manifest "$small/manifest.json" --quick
            rm -f "$native_log"
            if [ "$w" -le "$nccl_shared_max" ] && [ -z "${SYMM_SKIP_NCCL:-}" ]; then
                note "$name: world $w, the same with the nccl backend, symmrun --nccl-shared-gpu"
                $run -n "$w" --gpus "$gpus" --nccl-shared-gpu -- "$build/tests-gpu/check" \
                    --manifest "$small/manifest.json" --backend nccl --quick "${large[@]}"
                record $? "check $name world $w nccl (--nccl-shared-gpu), max_tokens $SMALL_TOKENS"
            fi
        fi
        if [ "$w" -eq 1 ]; then
            continue
        elif [ "$w" -le "$ngpu" ] && [ -z "${SYMM_SKIP_NCCL:-}" ]; then
            note "$name: world $w, nccl backend"
            $run -n "$w" --gpus "$gpus" -- "$build/tests-gpu/check" --manifest "$out/manifest.json" --backend nccl
            record $? "check $name world $w nccl"
        elif [ "$w" -le "$nccl_shared_max" ] && [ -z "${SYMM_SKIP_NCCL:-}" ]; then
            # The quick matrix, the large variants at max_tokens 128 (above).
            note "$name: world $w on $ngpu GPU(s), nccl backend, symmrun --nccl-shared-gpu ${extra[*]}"
            $run -n "$w" --gpus "$gpus" --nccl-shared-gpu -- "$build/tests-gpu/check" --manifest "$out/manifest.json" \
                --backend nccl "${extra[@]}"
            record $? "check $name world $w nccl (--nccl-shared-gpu)"
        fi
    done
done
# The hosts and the tunings check the default spec's variants, which the
# matrix part generates: without it, generated here.
if ! part matrix && { part hosts || part tunings; } && { [ -z "${SPEC:-}" ] || [ "$SPEC" = specs/default.lua ]; }; then
    $build/bin/symmgen -q -o "$build/gpu-out/default" specs/default.lua || record 1 "symmgen specs/default.lua"
fi
# A world across hosts: 2 simulated hosts of this machine (symmrun
# --sim-hosts: TCP rendezvous, a host world each, NCCL between the hosts over
# loopback). The NCCL backend must give the same results, bit for bit; the
# native one must refuse, naming the hosts.
if part hosts && [ -z "${SYMM_SKIP_NCCL:-}" ] && { [ -z "${SPEC:-}" ] || [ "$SPEC" = specs/default.lua ]; }; then
    out=$build/gpu-out/default
    for hw in "2 2" "2 4" "4 4"; do
        read -r h w <<< "$hw"
        grep -q "\"world\": $w," "$out/manifest.json" || continue
        nccl_shared=()
        [ "$w" -gt "$ngpu" ] && nccl_shared=(--nccl-shared-gpu)
        note "default: world $w on $h simulated hosts, nccl backend ${nccl_shared[*]}"
        $run -n "$w" --gpus "$gpus" --sim-hosts "$h" "${nccl_shared[@]}" -- "$build/tests-gpu/check" \
            --manifest "$out/manifest.json" --backend nccl --quick
        record $? "check default world $w nccl, $h simulated hosts ${nccl_shared[*]}"
    done
    # The hybrid backend (docs/protocol.md "Across hosts"): the variants with
    # a companion for the host count, bit for bit against the reference's
    # hybrid order, at 2 hosts x 1 rank, 2 hosts x 2 ranks and 4 hosts x 1
    # rank. Ranks sharing a GPU: NCCL between them over loopback
    # (--nccl-shared-gpu), the companions' kernels at once under MPS where
    # SYMM_TEST_MPS is on (as the native checks), else taking turns.
    for hw in "2 2" "2 4" "4 4"; do
        read -r hosts w <<< "$hw"
        grep -q "\"world\": $w," "$out/manifest.json" || continue
        run_extra=(--sim-hosts "$hosts")
        [ "$w" -gt "$ngpu" ] && run_extra+=(--nccl-shared-gpu)
        note "default: world $w on $hosts simulated hosts, hybrid backend ${run_extra[*]}$(at_once "$w" && echo ", ranks at once under MPS")"
        variants=()
        native_check "$w" "check default world $w hybrid, $hosts simulated hosts" --manifest "$out/manifest.json" \
            --backend hybrid --quick
        rm -f "$native_log"
    done
    run_extra=()
    note "default: world 2 on 2 simulated hosts, native backend must refuse"
    refusal=$($run -n 2 --gpus "$gpus" --sim-hosts 2 -- "$build/tests-gpu/check" --manifest "$out/manifest.json" \
        --backend native --quick 2>&1)
    rc=$?
    echo "$refusal" | tail -3
    [ "$rc" -ne 0 ] && echo "$refusal" | grep -q "the world spans 2 hosts (sim0, sim1): use backend hybrid"
    record $? "check default world 2 native refused on 2 simulated hosts"
fi
# The tuning knobs (docs/api.md "Tuning") at the ends of their ranges: the same
# results, bit for bit, on the default spec at world 2 (quick matrix); at the
# top end with the profile's spans (PROFILE=2) recorded in every kernel.
if part tunings && { [ -z "${SPEC:-}" ] || [ "$SPEC" = specs/default.lua ]; }; then
    out=$build/gpu-out/default
    for tune in "BULK_SLOTS=1,PUSH_WARPS=1,PUSH_WARPS_SMALL=0,PUSH_BATCH=32,PART_BATCH=1,SUM_UNROLL=1,SUM_GATHER=16,PREFETCH=0,LOCAL_VEC=0,PROFILE=0,PDL=0,DEDUP=0,PUSH_PARTIALS=0,PARTIAL_SLOTS=1,PARTIAL_LANES=0,PUSH_INTERLEAVE=0,PARTIAL_GRID=0,GRID_OWN=0,GRID_PACK=0,CHAIN_STREAM=0,CHAIN_WARPS=0,SUM_PREFETCH=0,PART_FLAT=0,PUSH_SLOTS=1,GRID_LEAN=0,SUM_LEAN=0,PART_ORDER=0,BASE_LOADS=1,PUSH_ORDER=0,COUNT16=0,STEAL=0,PUSH_DEAL=0,SUM_EARLY=1" \
                "BULK_SLOTS=4,PUSH_WARPS=16,PUSH_WARPS_SMALL=1,PUSH_BATCH=1,PART_BATCH=32,SUM_UNROLL=10,SUM_GATHER=1,PREFETCH=1,LOCAL_VEC=1,PROFILE=2,PDL=1,DEDUP=1,PUSH_PARTIALS=1,PARTIAL_SLOTS=4,PARTIAL_LANES=1,PUSH_INTERLEAVE=1,PARTIAL_GRID=1,GRID_OWN=1,GRID_PACK=1,CHAIN_STREAM=1,CHAIN_WARPS=8,SUM_PREFETCH=1,PART_FLAT=1,PUSH_SLOTS=4,GRID_LEAN=1,SUM_LEAN=1,PART_ORDER=1,BASE_LOADS=32,PUSH_ORDER=1,COUNT16=1,STEAL=1,PUSH_DEAL=1,SUM_EARLY=0" \
                "BULK_SLOTS=4,DEDUP=1,CHAIN_STREAM=0" \
                "BULK_SLOTS=2,CHAIN_STREAM=0"; do
        note "default: world 2, native, SYMM_TUNE=$tune"
        variants=()
        SYMM_TUNE=$tune native_check 2 "check default world 2, SYMM_TUNE=$tune" --manifest "$out/manifest.json" --quick
        rm -f "$native_log"
    done
fi
echo "test-gpu: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
