#!/usr/bin/env bash
# selfcheck.sh: the GPU part of `make run`. On a host with at least 2 GPUs,
# runs dispatch/combine of one variant of the default spec through symmrun
# (one rank per GPU), checks the results against the CPU reference and prints
# one timing line. Elsewhere it says why it did not run.
set -uo pipefail
build=${1:-build}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "self-check: skipped: no GPU"
    exit 0
fi
ngpu=$(nvidia-smi -L | grep -c '^GPU')
if [ "$ngpu" -lt 2 ]; then
    echo "self-check: skipped: needs 2 GPUs, this host has $ngpu"
    exit 0
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -x "$build/tests-gpu/check" ] || make --no-print-directory BUILD="$build" "$build/tests-gpu/check" >/dev/null || exit 1
variant=${SELFCHECK_VARIANT:-bf16_rank_w2}
"$build/bin/symmrun" -n 2 --gpus 0,1 -- "$build/tests-gpu/check" --manifest out/default/manifest.json \
    --variant "$variant" --quick --time 20
rc=$?
[ $rc -eq 0 ] && echo "self-check: dispatch/combine correct on $ngpu GPUs" || echo "self-check: FAILED"
exit $rc
