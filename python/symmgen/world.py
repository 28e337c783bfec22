"""world.py: a libsymm world from a torch.distributed process group.

The group only introduces the ranks to each other: its rank 0 draws a fresh
job id and secret and broadcasts them through the group, then every rank
joins a symm_world (symm_world.h) with the group's rank and size and
torch's current CUDA device. Everything after that (the symmetric heap, the
kernels' signals) is libsymm's own; the group is used again only for the
gradients of the top-k weights (all_to_all_single, see ops.py).

A group across hosts makes a world across hosts: every rank says its host
(SYMM_HOST_ID, else the hostname; hosts.py), rank 0 adds the root address of
the TCP rendezvous (MASTER_ADDR, else its hostname, and a free port), and
each rank joins with its local rank and local size among its host's ranks."""

import ctypes
import secrets

import torch
import torch.distributed as dist

from . import _lib, hosts


def _device_index(device):
    """The CUDA device ordinal of device (None: torch's current device)."""
    if device is None:
        return torch.cuda.current_device()
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"symmgen.World: device: got {device!r}, expected a CUDA device such as 'cuda:0'")
    return d.index if d.index is not None else torch.cuda.current_device()


class World:
    """The ranks of a process group as a libsymm world.

    World(group=None, device=None, timeout=None): group defaults to the
    default process group (dist.init_process_group must have run; gloo or
    nccl), device to torch.cuda.current_device(), timeout (seconds any
    wait may take) to SYMM_TIMEOUT or 60. Collective over the group.
    Attributes: group, rank, size, device (a torch.device), timeout."""

    def __init__(self, group=None, device=None, timeout=None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("symmgen.World: torch.distributed is not initialized: call "
                               "torch.distributed.init_process_group first (torchrun sets the environment)")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        if self.rank < 0:
            raise ValueError("symmgen.World: this process is not a member of the group")
        index = _device_index(device)
        self.device = torch.device("cuda", index)
        self.timeout = timeout
        self._handle = None
        job_id, secret, root, host, (local_rank, local_size) = self._agree()
        cfg = _lib.WorldConfig(rank=self.rank, size=self.size, local_rank=local_rank, device=index,
                               job_id=job_id.encode(), secret=secret.encode(), socket_dir=None,
                               timeout_s=float(timeout or 0), root_addr=root.encode() if root else None,
                               host_id=host.encode(), local_size=local_size)
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib().symm_world_create(ctypes.byref(cfg), ctypes.byref(handle)))
        self._handle = handle

    def _agree(self):
        """Rank 0's fresh job id and secret (and, across hosts, its root
        address), every rank's host, through the group: (job id, secret,
        root address or None, this rank's host id, (local rank, local size))."""
        me = hosts.host_id()
        if self.rank == 0:
            root = hosts.root_address(hosts.free_port())
            mine = [me, f"torch-{secrets.token_hex(8)}", secrets.token_hex(32), root]
        else:
            mine = [me, None, None, None]
        everyone = [None] * self.size
        dist.all_gather_object(everyone, mine, group=self.group)
        ids = [e[0] for e in everyone]
        layout = hosts.local_layout(ids)
        root = everyone[0][3] if len(set(ids)) > 1 else None
        return everyone[0][1], everyone[0][2], root, me, layout[self.rank]

    @property
    def handle(self):
        """The symm_world pointer (a ctypes c_void_p)."""
        if self._handle is None:
            raise RuntimeError("symmgen.World: used after destroy()")
        return self._handle

    def destroy(self):
        """Leave the world (not collective). Variants made on it must be
        destroyed first."""
        if self._handle is not None:
            _lib.lib().symm_world_destroy(self._handle)
            self._handle = None

    @property
    def host_count(self):
        """How many hosts the world spans."""
        return _lib.lib().symm_world_host_count(self.handle)

    @property
    def host(self):
        """This rank's host index (hosts numbered in the order of their lowest rank)."""
        return _lib.lib().symm_world_host(self.handle)

    def __repr__(self):
        return f"World(rank {self.rank} of {self.size}, {self.device})"
