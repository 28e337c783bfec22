# gpus.sh (sourced by the scripts that run on GPUs): machine_gpus prints the
# GPUs nvidia-smi names on this host; gpu_count prints those, or only the
# first DEVICE_GPUS of them where that is set (scripts/device-run.sh checks
# it against machine_gpus and exports it, so the scripts its steps run see
# the machine it sees).
machine_gpus() {
    nvidia-smi -L | grep -c '^GPU'
}
gpu_count() {
    local n
    n=$(machine_gpus)
    if [ -n "${DEVICE_GPUS:-}" ] && [ "$DEVICE_GPUS" -lt "$n" ]; then
        n=$DEVICE_GPUS
    fi
    echo "$n"
}
