# gpus.sh (sourced by the scripts that run on GPUs): gpu_count prints the
# GPUs nvidia-smi names on this host, or only the first DEVICE_GPUS of them
# where that is set (scripts/device-run.sh checks it and exports it, so the
# scripts its steps run see the machine it sees).
gpu_count() {
    local n
    n=$(nvidia-smi -L | grep -c '^GPU')
    if [ -n "${DEVICE_GPUS:-}" ] && [ "$DEVICE_GPUS" -lt "$n" ]; then
        n=$DEVICE_GPUS
    fi
    echo "$n"
}
