"""Fixtures of the CPU tests (no torch, no GPU): the default spec
generated once into a private cache."""
import os

import pytest

from symmgen import manifest, spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def default_manifest(cache):
    return manifest.load(spec.generate(spec_path=os.path.join(ROOT, "specs", "default.lua"), cache_dir=cache))
