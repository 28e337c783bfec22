#!/usr/bin/env bash
# ab-table.sh: the table of scripts/device-run.sh's step ab, from its logs.
#
# usage: scripts/ab-table.sh LOGDIR LABEL
#   LOGDIR holds ab-new-I.log and ab-old-I.log, moe_bench's output for this
#   tree's kernels (new) and LABEL's (old) in round I. Prints every run's
#   rows (p50/p90 us, dispatch / combine), then each row's mean p50 for each
#   side over the rounds, and new minus old (negative: the new kernels are
#   faster). Read a change beside a row whose code it did not touch: the
#   order of a pair has moved unchanged code by 1.5-2.5 us (bench/NOTES.md
#   62, 64).
# Exit status: 0; 1 when LOGDIR holds no ab log; 2 on bad usage.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: scripts/ab-table.sh LOGDIR LABEL" >&2; exit 2; }
dir=$1 label=$2
shopt -s nullglob
logs=("$dir"/ab-new-*.log "$dir"/ab-old-*.log)
[ ${#logs[@]} -gt 0 ] || { echo "ab-table: no ab-new-*.log or ab-old-*.log in $dir" >&2; exit 1; }
# A row of moe_bench's table: "[0] ROW VARIANT T SMS D_P50/D_P90 C_P50/C_P90 ...".
row_re='^\[0\] [a-z][a-z0-9.]* +bench_'
for f in "${logs[@]}"; do
    echo "$(basename "$f" .log):"
    grep -aE "$row_re" "$f" | awk '{ print "  " $2, $6, "/", $7 }'
done
echo
echo "mean p50 us over the rounds (new: this tree, old: $label; new - old below 0: new is faster)"
echo
echo "| row | rounds new/old | dispatch new | dispatch old | new - old | combine new | combine old | new - old |"
echo "|---|---|---|---|---|---|---|---|"
for f in "${logs[@]}"; do
    side=new
    [[ $(basename "$f") == ab-old-* ]] && side=old
    grep -aE "$row_re" "$f" | awk -v s="$side" '{ split($6, d, "/"); split($7, c, "/"); print $2, s, d[1], c[1] }'
done | awk '{ k = $1; if (!(k in seen)) { seen[k] = 1; order[++m] = k }
              n[k, $2]++; d[k, $2] += $3; c[k, $2] += $4 }
    END { for (i = 1; i <= m; i++) { k = order[i]
              if (!n[k, "new"] || !n[k, "old"]) { printf "| %s | %d/%d | | | | | | |\n", k, n[k, "new"], n[k, "old"]; continue }
              dn = d[k, "new"] / n[k, "new"]; do_ = d[k, "old"] / n[k, "old"]
              cn = c[k, "new"] / n[k, "new"]; co = c[k, "old"] / n[k, "old"]
              printf "| %s | %d/%d | %.2f | %.2f | %+.2f | %.2f | %.2f | %+.2f |\n", k, n[k, "new"], n[k, "old"],
                     dn, do_, dn - do_, cn, co, cn - co } }'
