"""Installing from a clean clone with the README's offline command:
`pip install --no-build-isolation --no-deps ./python` builds libsymm.so and
symmgen with make (the clone has no build/) and ships them in the package,
which then works from anywhere without LD_LIBRARY_PATH."""
import os
import subprocess
import sys

import pytest

from support import ROOT


def have(module):
    return subprocess.run([sys.executable, "-c", f"import {module}"], stderr=subprocess.DEVNULL).returncode == 0


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if not (have("setuptools") and have("wheel") and have("pip")):
        pytest.skip("needs pip, setuptools and wheel in this python (scripts/test-python.sh provides them)")
    if subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
        pytest.skip("not a git checkout")
    d = tmp_path_factory.mktemp("install")
    clone, target = d / "clone", d / "site"
    subprocess.check_call(["git", "clone", "-q", "--no-hardlinks", ROOT, str(clone)])
    assert not (clone / "build").exists()
    env = {k: v for k, v in os.environ.items() if k not in ("SYMMGEN_BUILD_DIR", "LD_LIBRARY_PATH")}
    run = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                          "--no-index", "--target", str(target), str(clone / "python")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert run.returncode == 0, run.stdout.decode()[-4000:]
    return d, target, env


PROBE = r"""
import os, sys, symmgen
from symmgen import _lib, manifest, ref, spec
assert os.path.dirname(symmgen.__file__).startswith(sys.argv[1]), symmgen.__file__
assert _lib.symmgen_path().startswith(sys.argv[1]), _lib.symmgen_path()
assert _lib.library_path().startswith(sys.argv[1]), _lib.library_path()
path = spec.generate_fields({"name": "probe", "hidden": 1024, "topk": 2, "experts": 8, "world": 2,
                             "max_tokens": 16}, cache_dir=sys.argv[2])
v = manifest.load(path).variant("probe")
cfg = ref.Config.from_variant(v)
print(symmgen.__version__, v.capacity, cfg.rows)
"""


def test_installed_package_runs_its_own_binaries(installed):
    d, target, env = installed
    assert os.access(target / "symmgen" / "_bin" / "symmgen", os.X_OK)
    assert (target / "symmgen" / "_bin" / "libsymm.so").is_file()
    env = dict(env, PYTHONPATH=str(target))
    out = subprocess.check_output([sys.executable, "-c", PROBE, str(target), str(d / "cache")], cwd=str(d), env=env)
    version = open(os.path.join(ROOT, "VERSION")).read().strip()
    assert out.decode().split() == [version, "32", "32"]


def test_clone_was_built_by_the_install(installed):
    d, _, _ = installed
    assert (d / "clone" / "build" / "lib" / "libsymm.so").is_file()
    assert (d / "clone" / "build" / "bin" / "symmgen").is_file()
