#!/usr/bin/env bash
# ncu-rank.sh PROG [ARGS...]: run by symmrun as every rank's program. Rank 0
# (SYMM_RANK) runs PROG under Nsight Compute (ncu), every other rank runs it
# plainly, so one rank's kernels are profiled while its peers run at speed.
#
# What it samples (by default): where each warp stood and why it did not
# issue, by instruction (PC sampling). Seen on the lent H200 machines (ncu
# 2025.3.1, 2026-11-28): PC sampling takes two passes whatever is asked
# for, and ncu runs the kernel a second time on this rank alone. What
# came of it:
#   - combine: almost no samples in the waits for the peers (their rows
#     and flags were in place when the sampled pass ran): the samples show
#     the kernel's own work (loads, sums, stores), not its waits; the
#     row may fail afterwards with a timeout;
#   - dispatch: the sampled pass waited for its peers until its timeout
#     (SYMM_TIMEOUT): no usable samples.
# Replaying the whole job instead (ncu --replay-mode application
# --target-processes all on symmrun) deadlocks: ncu holds the other
# ranks' launches while it profiles one rank's kernel.
#
# Environment:
#   NCU_REPORT    the report's path, without .ncu-rep (required on rank 0)
#   NCU_KERNEL    a regular expression of the kernel's name (symm_combine)
#   NCU_SKIP      launches of it to skip first (3: past moe_bench's check)
#   NCU_COUNT     launches of it to profile (1)
#   NCU_METRICS   ncu's --metrics (the stall reasons' PC sampling)
#   NCU_INTERVAL  ncu's --sampling-interval, 0..31: a sample every
#                 2^(5+N) cycles of each scheduler (auto)
#   NCU_SOURCES   folders where ncu finds the kernels' source (the
#                 generated .cu files; with SYMM_JIT_LINEINFO=1 the samples
#                 map to its lines)
#   NCU           the ncu program (ncu on PATH, else /usr/local/cuda/bin/ncu)
set -u
if [ $# -eq 0 ]; then
    echo "usage: ncu-rank.sh PROG [ARGS...] (under symmrun: rank 0 under ncu)" >&2
    exit 2
fi
if [ "${SYMM_RANK:-}" != 0 ]; then
    exec "$@"
fi
if [ -z "${NCU_REPORT:-}" ]; then
    echo "ncu-rank.sh: NCU_REPORT (the report's path without .ncu-rep) is not set" >&2
    exit 2
fi
ncu=${NCU:-}
if [ -z "$ncu" ]; then
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
fi
if ! [ -x "$ncu" ]; then
    echo "ncu-rank.sh: no Nsight Compute ($ncu is not an executable): set NCU" >&2
    exit 2
fi
# Each stall reason by name (the source page then has a column for each,
# by instruction), without smsp__pcsamp_sample_count: with it, or with
# ncu's two groups of the reasons, ncu took two passes.
stalls=
for r in barrier branch_resolving dispatch_stall drain imc_miss lg_throttle long_scoreboard math_pipe_throttle \
    membar mio_throttle misc no_instructions not_selected selected short_scoreboard sleeping tex_throttle wait \
    warpgroup_arrive; do
    stalls=$stalls${stalls:+,}smsp__pcsamp_warps_issue_stalled_$r
done
args=(--target-processes application-only --clock-control none --cache-control none
      -k "regex:${NCU_KERNEL:-symm_combine}" --launch-skip "${NCU_SKIP:-3}" --launch-count "${NCU_COUNT:-1}"
      --metrics "${NCU_METRICS:-$stalls}" --import-source yes -f -o "$NCU_REPORT")
# Options that not every ncu has: asked for only where its --help lists them.
help=$("$ncu" --help 2>&1)
case $help in *--sampling-interval*) args+=(--sampling-interval "${NCU_INTERVAL:-auto}") ;; esac
if [ -n "${NCU_SOURCES:-}" ]; then
    case $help in *--source-folders*) args+=(--source-folders "$NCU_SOURCES") ;; esac
fi
exec "$ncu" "${args[@]}" "$@"
