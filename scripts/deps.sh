#!/usr/bin/env bash
# deps.sh: installs, through apt-get, the Debian packages the build and the
# tests need, and only those that are missing. Run by `make deps`, which
# `make run` and `make test` call first.
#   liblua5.4-dev     Lua 5.4 (static library) embedded in symmgen for specs
#   libcriterion-dev  the test framework
#   pkg-config        to find Criterion's flags
#   clang             `make test` only (passed as an argument): test_spec reads
#                     what the generated stub's headers declare from clang's
#                     AST (-ast-dump=json), to check every such name is refused
#   gnuplot-nox       plots of `make bench` (only needed there)
set -euo pipefail
need=()
for pkg in gcc make liblua5.4-dev libcriterion-dev pkg-config "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
echo "deps: installing ${need[*]}" >&2
sudo=
[ "$(id -u)" -eq 0 ] || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
