"""hosts.py: how the ranks of a process group spread over hosts, for a
world across hosts (world.py); no torch here, so that it is tested on its
own (tests/python/cpu/test_hosts.py).

Every rank says its host id (SYMM_HOST_ID, else the hostname); a rank's
local rank is its index among the ranks of its host in rank order, its
local size their number. Rank 0 picks the root address of the TCP
rendezvous: MASTER_ADDR when set (where torch.distributed's ranks met, so
every host reaches it), else its hostname, and a port free on its host."""

import os
import socket


def host_id():
    """This rank's host identity: SYMM_HOST_ID, else the hostname."""
    return os.environ.get("SYMM_HOST_ID") or socket.gethostname()


def local_layout(hosts):
    """For every rank (hosts[r] its host id), (local rank, local size)."""
    seen, out = {}, []
    for h in hosts:
        out.append(seen.get(h, 0))
        seen[h] = seen.get(h, 0) + 1
    return [(lr, seen[h]) for lr, h in zip(out, hosts)]


def free_port():
    """A TCP port free on this host a moment ago (bound to 0, closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def root_address(port, master_addr=None):
    """"host:port" of rank 0's rendezvous ("[v6]:port" for an IPv6
    literal): MASTER_ADDR, else this host's name."""
    host = master_addr if master_addr is not None else os.environ.get("MASTER_ADDR") or socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
