#!/usr/bin/env bash
# test-python.sh: the Python package's CPU tests (tests/python/cpu: no torch,
# no GPU) under pytest, with the package from python/ and the binaries of
# $SYMM_BUILD_DIR. A python without pytest, setuptools and wheel (the
# install test needs the last two) gets a virtual environment with them in
# .cache/python-venv (outside build/, which travels to the GPU machines),
# from PyPI, made once.
# usage: SYMM_BUILD_DIR=build scripts/test-python.sh [PYTEST_ARGS...]
set -euo pipefail
build=${SYMM_BUILD_DIR:-build}
py=${PYTHON:-python3}
ready() { "$1" -c 'import pytest, setuptools, wheel' 2>/dev/null; }
if ! ready "$py"; then
    venv=.cache/python-venv
    if ! ready "$venv/bin/python"; then
        echo "test-python: making $venv with pytest, setuptools and wheel"
        "$py" -m venv "$venv"
        "$venv/bin/python" -m pip install -q --upgrade pip "setuptools>=70" wheel pytest
    fi
    py=$venv/bin/python
fi
echo "== python (tests/python/cpu, $("$py" --version))"
SYMMGEN_BUILD_DIR=$build exec "$py" -m pytest -q -p no:cacheprovider tests/python/cpu "$@"
