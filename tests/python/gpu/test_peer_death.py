"""A peer that died surfaces as a Python exception within the variant's
timeout, never a hang (issue 27, item 7). The pair runs outside torchrun,
started by the run's rank 0 (peer_death.py says what each rank does)."""
import os
import socket
import subprocess
import sys

import pytest

from common import BACKEND, ENV, HERE

TIMEOUT_S = 3.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_a_peer_that_dies_is_an_exception_within_the_timeout():
    if BACKEND == "reference" or ENV.device is None or ENV.device.type != "cuda":
        pytest.skip("the native backend's device waits (a GPU)")
    if ENV.rank != 0:
        pytest.skip("the run's rank 0 starts the pair")
    # The pair is a job of its own: none of torchrun's variables.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHELASTIC_", "GROUP_", "ROLE_")) and
           k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    port = free_port()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "peer_death.py"), str(r), port, str(TIMEOUT_S)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in (0, 1)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=180)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the pair hung: a dead peer must end in an error within the timeout")
    print(outs[0][-2000:])
    assert procs[1].returncode == 0, f"rank 1 did not get as far as exiting:\n{outs[1][-3000:]}"
    assert procs[0].returncode == 0 and "peer_death: ok" in outs[0], outs[0][-3000:]
