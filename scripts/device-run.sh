#!/usr/bin/env bash
# device-run.sh: what a lent GPU machine runs in one call (it has no Lua or
# Criterion: binaries are built here and carried with their libraries, see
# shared/device/README.md). Writes logs under $OUT and prints a summary.
# usage: scripts/device-run.sh BUILD_DIR STEP...   steps: runtime, check-quick,
#        check, nccl, world4, world8, sanitize, bench
set -uo pipefail
build=$1; shift
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.bundle${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMM_TIMEOUT=${SYMM_TIMEOUT:-30} SYMM_CACHE_DIR=/tmp/symm-cache
ngpu=$(nvidia-smi -L | grep -c '^GPU')
gpus=$(seq -s, 0 $((ngpu - 1)))
run=$build/bin/symmrun
summary=()
step() { # name limit_s command...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    summary+=("$(printf '%-28s rc=%-3d %4ds  %s' "$name" "$rc" $((SECONDS - t0)) "$(grep -aE 'passed|Synthesis|FAIL' "$out/$name.log" | tail -n 1 | cut -c1-110)")")
}
nvidia-smi -L > "$out/machine.log"
$build/bin/symmgen -q -o out/default specs/default.lua >> "$out/machine.log" 2>&1
$build/bin/symmgen -q -o out/models specs/models.lua >> "$out/machine.log" 2>&1
for s in "$@"; do
    case $s in
    runtime)
        for t in test_heap test_jit_gpu test_nccl; do
            step "$t-n2" 120 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/$t" --jobs 1
            step "$t-n4" 180 $run -n 4 --gpus "$gpus" -- "$build/tests-gpu/$t" --jobs 1
        done ;;
    check-quick) step check-w2-quick 240 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --time 20 ;;
    check) step check-w2 400 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json --time 20 ;;
    models) step check-models-w2 400 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/models/manifest.json --quick --time 20 ;;
    nccl) step check-w2-nccl 300 $run -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json --backend nccl --quick ;;
    world4) step check-w4 300 $run -n 4 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --graph-replays 20 ;;
    world8) step check-w8 300 $run -n 8 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json --quick --graph-replays 10 ;;
    *) echo "device-run: unknown step $s (expected runtime, check-quick, check, models, nccl, world4, world8)"; exit 2 ;;
    esac
done
printf '%s\n' "${summary[@]}" | tee "$out/summary.log"
