#!/usr/bin/env bash
# selfcheck.sh: the GPU part of `make run`. Runs dispatch/combine of one
# variant of the default spec through symmrun on 2 ranks, checks the results
# bit for bit against the CPU reference and prints one timing line. With 2 or
# more GPUs each rank has its own GPU; on a host with one GPU both ranks share
# it (time-sliced: the check holds, the timing is not that of NVLink).
# Without a GPU it says so and exits 0.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpus.sh"
build=${1:-build}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "self-check: skipped: no GPU"
    exit 0
fi
ngpu=$(gpu_count)
gpus=0,1
if [ "$ngpu" -lt 2 ]; then
    gpus=0
    echo "self-check: one GPU: both ranks share GPU 0 (time-sliced); the timing below is not NVLink's"
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -x "$build/tests-gpu/check" ] || make --no-print-directory BUILD="$build" "$build/tests-gpu/check" >/dev/null || exit 1
variant=${SELFCHECK_VARIANT:-bf16_rank_w2}
"$build/bin/symmrun" -n 2 --gpus "$gpus" -- "$build/tests-gpu/check" --manifest out/default/manifest.json \
    --variant "$variant" --quick --time 20
rc=$?
[ $rc -eq 0 ] && echo "self-check: dispatch/combine correct on 2 ranks, $ngpu GPU(s)" || echo "self-check: FAILED"
exit $rc
