"""setup.py: installs the symmgen package with the two files it runs,
libsymm.so and the symmgen generator, copied from the repository's build
directory (built with `make` first when they are missing).

The package itself is pure Python (ctypes); the wheel is still tagged for
this platform since it carries those binaries."""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BINARIES = (("lib", "libsymm.so"), ("bin", "symmgen"))


def _version():
    with open(os.path.join(REPO, "VERSION")) as f:
        return f.read().strip()


def _build_dir():
    """SYMMGEN_BUILD_DIR (relative: to the repository root), else build/."""
    return os.path.join(REPO, os.environ.get("SYMMGEN_BUILD_DIR") or "build")


def _ensure_built(build):
    """libsymm.so and symmgen from build; `make` builds them when missing
    (it needs a C compiler, Lua 5.4 and the CUDA headers: make them here and
    carry build/ to a machine without those)."""
    missing = [name for sub, name in BINARIES if not os.path.isfile(os.path.join(build, sub, name))]
    if not missing:
        return
    if not os.path.isfile(os.path.join(REPO, "Makefile")):
        raise SystemExit(f"symmgen: {', '.join(missing)} not in {build} and no repository to build them in: "
                         f"set SYMMGEN_BUILD_DIR to a build directory")
    print(f"symmgen: {', '.join(missing)} missing from {build}: running make")
    jobs = str(min(os.cpu_count() or 1, 8))
    subprocess.check_call(["make", "-C", REPO, "-j", jobs, f"BUILD={build}", "all"])


class BuildPy(build_py):
    def run(self):
        super().run()
        build = _build_dir()
        _ensure_built(build)
        dest = os.path.join(self.build_lib, "symmgen", "_bin")
        os.makedirs(dest, exist_ok=True)
        for sub, name in BINARIES:
            target = os.path.join(dest, name)
            shutil.copyfile(os.path.join(build, sub, name), target)
            os.chmod(target, 0o755)
        shutil.copyfile(os.path.join(REPO, "VERSION"), os.path.join(self.build_lib, "symmgen", "VERSION"))


cmdclass = {"build_py": BuildPy}
try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70: the wheel package's, when installed
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

if bdist_wheel is not None:
    class BdistWheel(bdist_wheel):
        """py3-none-<platform>: any Python 3, this platform's binaries."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return ("py3", "none") + tuple(super().get_tag()[2:])

    cmdclass["bdist_wheel"] = BdistWheel

setup(version=_version(), cmdclass=cmdclass)
