#!/usr/bin/env bash
# test-python-gpu.sh: the PyTorch package's distributed tests
# (tests/python/gpu) under torchrun at world 2 (SYMM_TEST_PY_WORLD=N: N
# ranks, 2 to 8, at most one a GPU where there are several GPUs; any on
# the CPU's reference backend), with a python that has torch:
#   2 or more GPUs: a rank per GPU, an nccl process group;
#   one GPU: both ranks on it, a gloo process group, and (unless
#     SYMM_TEST_MPS=0) a CUDA MPS daemon of this run's own so that they run
#     at once (the native backend's ranks must all be resident);
#   no GPU: "skipped: no GPU" (SYMMGEN_TEST_BACKEND=reference runs the tests
#     on the CPU against the all_to_all_single reference backend instead).
# Every rank's log goes to $LOGS (default $SYMM_BUILD_DIR/python-gpu-logs);
# rank 0's is shown.
# usage: SYMM_BUILD_DIR=build [PYTHON=python3] [SYMMGEN_TEST_INSTALLED=1] [SYMM_TEST_PY_STACKS=s]
#        scripts/test-python-gpu.sh [PYTEST_ARGS...]
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpus.sh"
build=$(cd "${SYMM_BUILD_DIR:-build}" 2>/dev/null && pwd || echo "${SYMM_BUILD_DIR:-build}")
py=${PYTHON:-python3}
note() { echo "test-python-gpu: $*"; }
world=${SYMM_TEST_PY_WORLD:-2}
if ! [[ "$world" =~ ^[2-8]$ ]]; then
    note "SYMM_TEST_PY_WORLD=$world: expected 2 to 8 ranks"
    exit 2
fi
if ! [[ "${SYMM_TEST_PY_STACKS:-120}" =~ ^[1-9][0-9]*$ ]]; then
    note "SYMM_TEST_PY_STACKS=$SYMM_TEST_PY_STACKS: expected whole seconds above 0"
    exit 2
fi
if ! "$py" -c 'import torch' 2>/dev/null; then
    note "skipped: $py cannot import torch"
    exit 0
fi
ngpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    ngpu=$(gpu_count)
fi
if [ "$ngpu" -eq 0 ] && [ "${SYMMGEN_TEST_BACKEND:-}" != reference ]; then
    note "skipped: no GPU"
    exit 0
fi
if { [ "$ngpu" -ge 2 ] && [ "$world" -gt "$ngpu" ]; } || { [ "$ngpu" -eq 1 ] && [ "$world" -ne 2 ]; }; then
    note "SYMM_TEST_PY_WORLD=$world: at most one rank a GPU ($ngpu GPU(s) here; one GPU takes 2 ranks under MPS)"
    exit 2
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMM_CACHE_DIR=${SYMM_CACHE_DIR:-$build/jit-cache}
# SYMMGEN_TEST_INSTALLED=1: the installed package with the binaries inside
# it; else the checkout's python/ with $SYMM_BUILD_DIR's.
[ -n "${SYMMGEN_TEST_INSTALLED:-}" ] || export SYMMGEN_BUILD_DIR=$build
logs=${LOGS:-$build/python-gpu-logs}
mkdir -p "$logs"
if [ "$ngpu" -eq 1 ] && [ "${SYMM_TEST_MPS:-1}" != 0 ] && ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    note "nvidia-cuda-mps-control not found: the two ranks take turns on the GPU (slower)"
elif [ "$ngpu" -eq 1 ] && [ "${SYMM_TEST_MPS:-1}" != 0 ]; then
    mps=$(mktemp -d /tmp/symm-mps.XXXXXX)
    mkdir -p "$mps/pipe" "$mps/log"
    export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
    if ! nvidia-cuda-mps-control -d; then
        note "nvidia-cuda-mps-control -d failed (log: $mps/log); SYMM_TEST_MPS=0 runs without MPS"
        exit 1
    fi
    trap 'echo quit | nvidia-cuda-mps-control; rm -rf "$mps"' EXIT
    note "one GPU: both ranks on it under a CUDA MPS daemon ($mps)"
fi
note "$("$py" -c 'import torch; print("torch", torch.__version__)'), $ngpu GPU(s), world $world, logs in $logs"
# Each test's name as it starts, every rank's in its log, and (pytest's
# faulthandler) every thread's stack once a test has run for
# SYMM_TEST_PY_STACKS seconds (default 120): a run cut short by its limit
# still says which test each rank was in, and where.
"$py" -m torch.distributed.run --nproc-per-node "$world" --log-dir "$logs" --tee 3 --local-ranks-filter 0 \
    -m pytest -v -p no:cacheprovider -rs -o faulthandler_timeout="${SYMM_TEST_PY_STACKS:-120}" tests/python/gpu "$@"
