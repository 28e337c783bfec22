"""The distributed tests of the PyTorch package: pytest under torchrun at
world 2 (scripts/test-python-gpu.sh starts them): a rank per GPU with an
nccl group where there are enough GPUs, else the ranks share GPU 0 with a
gloo group (and libsymm's native backend, best under CUDA MPS).

Without torch, outside torchrun, or without a GPU, every test is skipped
and says why ("skipped: no GPU"). SYMMGEN_TEST_BACKEND=reference runs them
on the CPU against the all_to_all_single reference backend instead (the
Python layer's logic without a GPU; CUDA graphs are then skipped).

Every rank runs the same tests in the same order; after each test the
ranks exchange their outcomes, so a failure on any rank fails the test on
rank 0, whose output is the one shown."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import BACKEND, ENV, WHY_NOT, default_manifest_path, dist, start  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if WHY_NOT:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=WHY_NOT))


def pytest_configure(config):
    start()


def pytest_unconfigure(config):
    if ENV.group is not None:
        if ENV.world is not None:
            ENV.world.destroy()
        dist.destroy_process_group()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.symmgen_failed = report.failed


@pytest.fixture(autouse=True)
def in_step(request):
    """Ranks start each test together and learn whether another rank failed it."""
    if WHY_NOT:
        yield
        return
    dist.barrier(group=ENV.ctl)
    yield
    failed = [None] * ENV.size
    dist.all_gather_object(failed, bool(getattr(request.node, "symmgen_failed", False)), group=ENV.ctl)
    others = [r for r, f in enumerate(failed) if f and r != ENV.rank]
    if others and not getattr(request.node, "symmgen_failed", False):
        pytest.fail(f"rank(s) {', '.join(map(str, others))} failed this test (see their logs)")


@pytest.fixture(scope="session")
def env():
    return ENV


@pytest.fixture(scope="session")
def buffers():
    """One Buffer per variant, made on first use and kept for the session
    (destroyed at its end, on every rank)."""
    import symmgen
    made = {}

    def get(name, **kw):
        key = (name, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = symmgen.Buffer(ENV.world if BACKEND != "reference" else ENV.group,
                                       default_manifest_path(), name, backend=BACKEND, **kw)
        return made[key]
    yield get
    for b in made.values():
        b.destroy()
