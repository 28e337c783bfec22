#!/usr/bin/env bash
# ab-prepare.sh: the bench kernels of another commit, for timing them beside
# this tree's in the same device call (scripts/device-run.sh step ab). Rows
# timed in different calls land on different machines of the same kind,
# whose spread can exceed a change's effect (bench/RESULTS.md 2026-11-26
# ~14:05: 585-622 us for the same code); alternating the two sets of
# kernels in one call is the comparison bench/NOTES.md trusts.
#
# usage: scripts/ab-prepare.sh REV [SPEC]
#   builds REV's symmgen in a temporary git worktree (its templates are
#   built into it), generates SPEC (default specs/bench.lua, read from this
#   tree) with it into $SYMM_BUILD_DIR/ab/bench (default build/ab/bench,
#   replacing what was there) and, at worlds 4 and 8 (-D world=W, for a
#   host of that many GPUs), into .../ab/bench-wW, writes the commit to
#   .../ab/REV, and
#   removes the worktree. The build directory is what the
#   device call carries; the device's symmrun and moe_bench are this tree's
#   (the variant descriptor's ABI must match: REV's generated code is
#   checked by the runtime when the variants are created).
# Exit status: 0 done; 1 REV unknown, a build or the generation failed.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/ab-prepare.sh REV [SPEC]" >&2; exit 2; }
rev=$(git rev-parse --verify --quiet "$1^{commit}") || { echo "ab-prepare: $1: not a commit here" >&2; exit 1; }
spec=${2:-specs/bench.lua}
[ -f "$spec" ] || { echo "ab-prepare: $spec: no such spec" >&2; exit 1; }
wt=$(mktemp -d /tmp/symm-ab.XXXXXX)
cleanup() { git worktree remove --force "$wt" >/dev/null 2>&1 || true; rm -rf "$wt"; git worktree prune; }
trap cleanup EXIT
git worktree add --detach --quiet "$wt" "$rev"
make -C "$wt" --no-print-directory build/bin/symmgen >"$wt.log" 2>&1 ||
    { tail -20 "$wt.log" >&2; echo "ab-prepare: building $rev's symmgen failed" >&2; rm -f "$wt.log"; exit 1; }
rm -f "$wt.log"
ab=${SYMM_BUILD_DIR:-build}/ab
rm -rf "$ab"
mkdir -p "$ab"
"$wt/build/bin/symmgen" -q -o "$ab/bench" "$spec"
for w in 4 8; do
    "$wt/build/bin/symmgen" -q -D world=$w -o "$ab/bench-w$w" "$spec"
done
echo "$rev" > "$ab/REV"
echo "ab-prepare: $(git log -1 --format='%h %s' "$rev" | cut -c1-70): $(find "$ab/bench" -name '*.cu' | wc -l) variants in $ab/bench"
