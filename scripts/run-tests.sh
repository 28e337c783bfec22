#!/usr/bin/env bash
# run-tests.sh: runs Criterion test binaries one after another, shows their
# output, and closes with one line "tests: N passed, N failed". Exits non-zero
# when any test failed or crashed, or when a binary could not run at all.
set -uo pipefail
passed=0 failed=0 broken=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for bin in "$@"; do
    echo "== $(basename "$bin")"
    "$bin" --jobs 2 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    line=$(grep -a 'Synthesis: Tested:' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "run-tests: $(basename "$bin") exited $rc without a Criterion summary" >&2
        broken=$((broken + 1))
        continue
    fi
    p=$(sed -n 's/.*Passing: \([0-9]*\).*/\1/p' <<<"$line")
    f=$(sed -n 's/.*Failing: \([0-9]*\).*/\1/p' <<<"$line")
    c=$(sed -n 's/.*Crashing: \([0-9]*\).*/\1/p' <<<"$line")
    passed=$((passed + p))
    failed=$((failed + f + c))
    [ "$rc" -ne 0 ] && [ $((f + c)) -eq 0 ] && broken=$((broken + 1))
    # Criterion passes a test whose process reported a leak or undefined
    # behaviour (sanitizer builds): such a report fails the binary here.
    if grep -aqE 'ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:' "$log"; then
        echo "run-tests: $(basename "$bin"): sanitizer report above" >&2
        broken=$((broken + 1))
    fi
done
echo "tests: $passed passed, $((failed + broken)) failed"
[ $((failed + broken)) -eq 0 ]
