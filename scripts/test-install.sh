#!/usr/bin/env bash
# test-install.sh: the installed library as a user meets it, run by `make
# test` after the CPU tests (no GPU needed):
#   1. make install PREFIX=<a fresh temporary directory>;
#   2. examples/c built from there alone: symmgen from PREFIX/bin, flags from
#      pkg-config (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig), -Werror;
#   3. the example finds the installed libsymm.so.0 through the rpath of
#      symm.pc (ldd), and a program of libsymm alone runs with an empty
#      environment (no LD_LIBRARY_PATH) and gets libsymm's own error.
# The example itself runs under `make test-gpu` (scripts/test-gpu.sh).
# usage: SYMM_BUILD_DIR=build [SYMM_SANFLAGS=...] scripts/test-install.sh
set -euo pipefail
build=${SYMM_BUILD_DIR:-build}
flags=${SYMM_SANFLAGS:-}
prefix=$(mktemp -d /tmp/symm-install.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
fail() { echo "test-install: FAILED: $*" >&2; exit 1; }

make --no-print-directory BUILD="$build" install PREFIX="$prefix" >/dev/null
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
make --no-print-directory -C examples/c BUILD="$prefix/example" SYMMGEN="$prefix/bin/symmgen" \
    CFLAGS="-std=c11 -O2 -g -Wall -Wextra -Werror $flags" LDFLAGS="$flags" >/dev/null ||
    fail "examples/c does not build against the installed library"
libs=$(ldd "$prefix/example/moe_example" || true) # (libcuda.so.1 is missing without a driver)
grep -q "libsymm.so.0 => $prefix/lib/libsymm.so.0" <<<"$libs" ||
    fail "moe_example does not find $prefix/lib/libsymm.so.0: $(grep symm <<<"$libs")"

cat > "$prefix/loads.c" <<'C'
#include <stdio.h>
#include <string.h>
#include "symm_world.h"
int main(void)
{
    symm_world *w = NULL;
    symm_status st = symm_world_create_from_env(&w);
    printf("%s: %s\n", symm_status_name(st), symm_last_error());
    return st == SYMM_ERR_INVALID_ARG && strstr(symm_last_error(), "no rank in the environment") ? 0 : 1;
}
C
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror $flags $(pkg-config --cflags symm) "$prefix/loads.c" -o "$prefix/loads" \
    $(pkg-config --libs symm) || fail "a program of libsymm alone does not build with pkg-config's flags"
out=$(env -i "$prefix/loads" 2>&1) || fail "the installed library does not load or answer: $out"
echo "test-install: make install, examples/c through pkg-config, libsymm found through the rpath: ok"
