"""Fixtures of the CPU tests (no torch, no GPU): the checkout's package
first on the path (test_install.py checks an installed one), and the
default spec generated once into a private cache."""
import os
import sys

import pytest

from support import ROOT

sys.path.insert(0, os.path.join(ROOT, "python"))

from symmgen import manifest, spec  # noqa: E402


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def default_manifest(cache):
    return manifest.load(spec.generate(spec_path=os.path.join(ROOT, "specs", "default.lua"), cache_dir=cache))
