"""backends.py: where a Buffer's results live and how its calls run.

Native: the variant in libsymm (native, nccl or hybrid backend), opened from its
manifest on a World; each result is a tensor over the variant's own memory
(DLPack through ctypes), dispatch and combine the C calls on torch's
current stream. Reference: symmgen.torch_ref (all_to_all_single over the
process group) in place of the kernels, on tensors of the same shapes: for
tests of the package on hosts without a GPU."""

import ctypes

import torch

from . import _lib, manifest, torch_ref
from ._dlpack import device_bytes

# Where each result (and combine_buffer) lives: the field of
# symm_recv_buffers, and the manifest region (for the reference backend).
PLACES = {
    "recv_x": ("x", "recv_x"), "recv_x_scales": ("scales", "recv_scales"), "recv_src": ("src", "recv_src"),
    "recv_topk_idx": ("topk_idx", "recv_topk_idx"), "recv_topk_weights": ("weights", "recv_weights"),
    "num_recv_tokens_per_expert": ("expert_count", "expert_count"),
    "recv_expert_offset": ("expert_offset", "expert_offset"), "num_recv_rows": ("rows", "state"),
    "combine_buffer": ("y", "y"),
}
def _nbytes(shape, dtype):
    n = dtype.itemsize
    for s in shape:
        n *= s
    return n


def _typed(raw, dtype, shape):
    """A tensor of dtype and shape over the uint8 tensor raw's memory, not a
    view of it: each result is a tensor of its own to torch.compile, which
    cannot follow a mutation through a view that changes the dtype."""
    return torch.empty(0, dtype=dtype, device=raw.device).set_(raw.untyped_storage(), 0, shape)


def _raw_stream():
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is not None:
        return lambda index: get(index)
    return lambda index: torch.cuda.current_stream(index).cuda_stream


class Native:
    """The variant in libsymm (native, nccl or hybrid backend)."""

    def __init__(self, world, v, shapes, backend, cache_dir, tune, timeout):
        lib = _lib.lib()
        opts = _lib.VariantOptions(backend=_lib.BACKENDS[backend], timeout_s=float(timeout or 0),
                                   cache_dir=cache_dir.encode() if cache_dir else None,
                                   tune=tune.encode() if tune else None)
        handle = ctypes.c_void_p()
        _lib.check(lib.symm_variant_open(world.handle, v.manifest_path.encode(), v.name.encode(),
                                         ctypes.byref(opts), ctypes.byref(handle)))
        self.handle = handle
        rb = _lib.RecvBuffers()
        _lib.check(lib.symm_variant_recv(handle, ctypes.byref(rb)))
        index = world.device.index
        # The hybrid's results live in its companion's symmetric buffer
        # (docs/protocol.md "Across hosts"), laid out as the companion's.
        sym = v
        if lib.symm_variant_backend(handle) == _lib.BACKENDS["hybrid"]:
            sym = manifest.load(v.manifest_path).variant(v.companions[world.host_count])
        self.sym_range = (rb.x - sym.regions["recv_x"][0], rb.x - sym.regions["recv_x"][0] + sym.symmetric_bytes)
        self.results = {}
        for name, (field, _) in PLACES.items():
            ptr = getattr(rb, field)
            if ptr:
                shape, dtype = shapes[name]
                self.results[name] = _typed(device_bytes(ptr, _nbytes(shape, dtype), index), dtype, shape)
        self._args = _lib.DispatchArgs()
        self._args_ref = ctypes.byref(self._args)
        self._dispatch = lib.symm_variant_dispatch
        self._combine = lib.symm_variant_combine
        self._stream = _raw_stream()
        self._index = index
        self._no_rows = torch.empty(16, dtype=torch.uint8, device=world.device)

    def dispatch(self, x, topk_idx, topk_weights, x_scales, num_tokens):
        a = self._args
        a.tokens = x.shape[0]
        a.tokens_dev = num_tokens.data_ptr() if num_tokens is not None else None
        a.x = x.data_ptr()
        a.x_scales = x_scales.data_ptr() if x_scales is not None else None
        a.topk_idx = topk_idx.data_ptr()
        a.topk_weights = topk_weights.data_ptr() if topk_weights is not None else None
        status = self._dispatch(self.handle, self._args_ref, self._stream(self._index))
        if status:
            raise _lib.error(status)

    def combine(self, y, out):
        # An empty out has no address; libsymm wants one even for no rows.
        target = out.data_ptr() or self._no_rows.data_ptr()
        status = self._combine(self.handle, y.data_ptr(), target, self._stream(self._index))
        if status:
            raise _lib.error(status)

    def stats(self):
        st = _lib.VariantStats()
        status = _lib.lib().symm_variant_stats_read(self.handle, self._stream(self._index), ctypes.byref(st))
        values = {name: getattr(st, name) for name, _ in st._fields_}
        return values, (None if status == 0 else _lib.error(status))

    def destroy(self):
        status = _lib.lib().symm_variant_destroy(self.handle)
        self.handle = None
        _lib.check(status)


class Reference:
    """torch_ref (all_to_all_single over the process group) in place of the
    kernels, on buffers laid out as the variant's: for tests of this
    package on hosts without a GPU, and as an executable statement of the
    semantics. Synchronises on every call; not capturable."""

    def __init__(self, group, v, shapes, device):
        self.group, self.v = group, v
        self.sym_range = None
        self.results = {}
        for name, (_, region) in PLACES.items():
            if v.regions.get(region, (0, 0, False))[1] and (name != "recv_expert_offset" or v.layout == "expert"):
                shape, dtype = shapes[name]
                self.results[name] = _typed(torch.zeros(_nbytes(shape, dtype), dtype=torch.uint8, device=device),
                                            dtype, shape)
        self.plan = None

    def dispatch(self, x, topk_idx, topk_weights, x_scales, num_tokens):
        tokens = None if num_tokens is None else max(0, min(int(num_tokens.reshape(-1)[0]), x.shape[0]))
        self.plan, recv = torch_ref.dispatch(self.v, self.group, x, topk_idx, topk_weights, x_scales, tokens)
        self.weights = topk_weights
        for name, t in recv.items():
            if t is not None:
                self.results[name].copy_(t)

    def combine(self, y, out):
        out.copy_(torch_ref.combine(self.v, self.group, self.plan, y, self.weights))

    def stats(self):
        return {}, None

    def destroy(self):
        pass
