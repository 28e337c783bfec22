"""hosts.py (how a group's ranks spread over hosts) and a world across two
simulated hosts made through _lib's WorldConfig, as World does, by four
forked processes (no torch: the group's all-gather is done by hand)."""
import ctypes
import multiprocessing
import os
import secrets
import tempfile

import pytest

from symmgen import _lib, hosts


def test_local_layout_numbers_ranks_within_each_host_in_rank_order():
    assert hosts.local_layout(["a", "a", "b", "b"]) == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert hosts.local_layout(["a", "b", "a", "a"]) == [(0, 3), (0, 1), (1, 3), (2, 3)]
    assert hosts.local_layout(["x"]) == [(0, 1)]


def test_root_address_prefers_master_addr_and_brackets_ipv6(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "node01")
    assert hosts.root_address(29600) == "node01:29600"
    assert hosts.root_address(5, master_addr="fd00::1") == "[fd00::1]:5"
    monkeypatch.delenv("MASTER_ADDR")
    assert hosts.root_address(7).endswith(":7")
    monkeypatch.setenv("SYMM_HOST_ID", "sim3")
    assert hosts.host_id() == "sim3"
    assert 0 < hosts.free_port() < 65536


def _rank(rank, ids, job, secret, root, base, out):
    """One rank, as World.__init__ configures it once the group has agreed."""
    local_rank, local_size = hosts.local_layout(ids)[rank]
    sub = os.path.join(base, ids[rank])
    os.makedirs(sub, mode=0o700, exist_ok=True)
    cfg = _lib.WorldConfig(rank=rank, size=len(ids), local_rank=local_rank, device=-1, job_id=job.encode(),
                           secret=secret.encode(), socket_dir=sub.encode(), timeout_s=10.0,
                           root_addr=root.encode(), host_id=ids[rank].encode(), local_size=local_size)
    lib = _lib.lib()
    handle = ctypes.c_void_p()
    status = lib.symm_world_create(ctypes.byref(cfg), ctypes.byref(handle))
    if status:
        out.put((rank, _lib.error(status).args[0]))
        return
    mine = ctypes.c_int(100 + rank)
    everyone = (ctypes.c_int * len(ids))()
    status = lib.symm_world_allgather(handle, ctypes.byref(mine), everyone, ctypes.sizeof(mine))
    host_world = lib.symm_world_host_world(handle)
    out.put((rank, (status, list(everyone), lib.symm_world_host_count(handle), lib.symm_world_host(handle),
                    lib.symm_world_host_name(handle, lib.symm_world_host(handle)).decode(),
                    lib.symm_world_local_rank(handle), lib.symm_world_size(host_world),
                    lib.symm_world_rank(host_world))))
    lib.symm_world_destroy(handle)


def test_a_world_across_two_simulated_hosts_through_world_config():
    try:
        _lib.lib()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    ids = ["sim0", "sim1", "sim0", "sim1"]  # not host-major: local ranks from the layout
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as base:
        root, job = f"127.0.0.1:{hosts.free_port()}", f"py-{secrets.token_hex(6)}"
        procs = [ctx.Process(target=_rank, args=(r, ids, job, "s3cret", root, base, out)) for r in range(4)]
        for p in procs:
            p.start()
        results = dict(out.get(timeout=30) for _ in procs)
        for p in procs:
            p.join(timeout=10)
    for r in range(4):
        got = results[r]
        assert not isinstance(got, str), f"rank {r}: {got}"
        status, everyone, host_count, host, name, local_rank, host_size, host_rank = got
        assert status == 0 and everyone == [100, 101, 102, 103]
        assert (host_count, host, name) == (2, r % 2, ids[r])
        assert local_rank == r // 2 and host_size == 2 and host_rank == r // 2
