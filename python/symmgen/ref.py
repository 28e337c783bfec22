"""ref.py: libsymm's CPU reference of dispatch and combine (symm_ref.h) on
plain Python buffers: a whole world at once, every rank's input in, every
rank's result out, bit for bit what the GPU must produce.

    cfg = Config.from_variant(manifest.load(path).variant("bf16_rank_w2"))
    inputs = [Input(tokens=T, x=x_bytes, topk_idx=idx_bytes, topk_weights=w_bytes), ...]
    result = dispatch(cfg, inputs)      # result.recv[p].x, .src, ..., result.overflow
    outs = combine(cfg, inputs, result, ys)

Buffers are anything with the buffer protocol (bytes, bytearray,
array.array, memoryview, numpy arrays), in the C layout of symm_ref.h:
x [T, hidden] of dtype, topk_idx [T, topk] int32, topk_weights [T, topk]
float32, x_scales [T, hidden/128] float32. Results are bytearrays.
Nothing here needs torch."""

import ctypes

from . import _lib
from ._lib import COMBINE_ORDERS, DTYPE_SIZES, DTYPES, LAYOUTS, RefConfig, RefInput, RefRecv, RefSendStats

# Whether this libsymm's symm_ref_config has combine_order (layout expert's
# summation order); without it, combine sums in k order.
HAS_COMBINE_ORDER = "combine_order" in dict(RefConfig._fields_)
POISON = 0xA5


class Config:
    """A variant's parameters as symm_ref_config takes them."""

    def __init__(self, hidden, topk, experts, world, max_tokens, dtype="bf16", combine_dtype=None,
                 layout="rank", weights=True, capacity=0, align=1, combine_order=None, hosts=0):
        self.hidden, self.topk, self.experts, self.world = hidden, topk, experts, world
        self.max_tokens, self.dtype, self.layout = max_tokens, dtype, layout
        self.combine_dtype = combine_dtype or ("bf16" if dtype == "fp8_e4m3" else dtype)
        self.weights, self.capacity, self.align = bool(weights), capacity, align
        self.combine_order = combine_order
        # hosts >= 2: the hybrid backend's row order and sums across hosts (symm_ref.h).
        self.hosts = hosts
        for key, table in (("dtype", DTYPES), ("combine_dtype", DTYPES), ("layout", LAYOUTS)):
            if getattr(self, key) not in table:
                raise ValueError(f"ref.Config: {key}: got {getattr(self, key)!r}, expected one of "
                                 f"{', '.join(table)}")
        if combine_order is not None and combine_order not in COMBINE_ORDERS:
            raise ValueError(f"ref.Config: combine_order: got {combine_order!r}, expected rank or k")
        if combine_order == "rank" and layout == "expert" and not HAS_COMBINE_ORDER:
            raise ValueError("ref.Config: combine_order rank: this libsymm's reference sums layout "
                             "expert's combine in k order only")
        self._c = RefConfig(hidden=hidden, topk=topk, experts=experts, world=world, max_tokens=max_tokens,
                            dtype=DTYPES[self.dtype], combine_dtype=DTYPES[self.combine_dtype],
                            layout=LAYOUTS[layout], weights=int(self.weights), capacity=capacity,
                            align=align, hosts=hosts)
        if HAS_COMBINE_ORDER and combine_order is not None:
            self._c.combine_order = COMBINE_ORDERS[combine_order]
        _lib.check(_lib.lib().symm_ref_check_config(ctypes.byref(self._c)))
        self.rows = _lib.lib().symm_ref_capacity(ctypes.byref(self._c))
        self.local_experts = experts // world

    @classmethod
    def from_variant(cls, v):
        """The config of a manifest.Variant."""
        return cls(v.hidden, v.topk, v.experts, v.world, v.max_tokens, v.dtype, v.combine_dtype,
                   v.layout, v.weights, v.capacity, v.align,
                   v.combine_order if "combine_order" in v.fields else None)

    def sizes(self):
        """Bytes of each array of one rank's dispatch result."""
        cap, h, k, L = self.rows, self.hidden, self.topk, self.local_experts
        fp8, rank = self.dtype == "fp8_e4m3", self.layout == "rank"
        return {"x": cap * h * DTYPE_SIZES[self.dtype],
                "scales": cap * (h // _lib.FP8_BLOCK) * 4 if fp8 else 0,
                "src": cap * 16,
                "topk_idx": cap * k * 4 if rank else 0,
                "weights": (cap * k * 4 if rank else cap * 4) if self.weights else 0,
                "expert_count": L * 4, "expert_offset": L * 4}


class Input:
    """One rank's dispatch input (host buffers)."""

    def __init__(self, tokens, x, topk_idx, topk_weights=None, x_scales=None):
        self.tokens, self.x, self.topk_idx = tokens, x, topk_idx
        self.topk_weights, self.x_scales = topk_weights, x_scales


class Recv:
    """One rank's dispatch result: rows (layout rank: rows received; layout
    expert: end of the last segment, at most the capacity), dropped, and
    bytearrays x, scales, src ([rows, 4] int32), topk_idx, weights,
    expert_count, expert_offset (empty where the variant has none)."""

    def __init__(self, cfg):
        for name, size in cfg.sizes().items():
            setattr(self, name, bytearray([POISON]) * size)
        self.capacity, self.rows, self.dropped = cfg.rows, 0, 0


class DispatchResult:
    """recv: a Recv per rank; stats: (invalid, dropped) per source rank;
    overflow: libsymm's message when rows were dropped or ids were
    invalid (the rows that fit are written all the same), else None."""

    def __init__(self, recv, stats, overflow):
        self.recv, self.stats, self.overflow = recv, stats, overflow


class _Pinned:
    """Keeps the ctypes views of Python buffers alive during a call."""

    def __init__(self):
        self.keep = []

    def pointer(self, buf, what, nbytes, writable=False):
        if buf is None:
            if nbytes:
                raise ValueError(f"{what}: missing, expected {nbytes} bytes")
            return None
        mv = memoryview(buf)
        if not mv.c_contiguous:
            raise ValueError(f"{what}: expected a C-contiguous buffer")
        if mv.nbytes != nbytes:
            raise ValueError(f"{what}: {mv.nbytes} bytes, expected {nbytes}")
        if mv.readonly:
            if writable:
                raise ValueError(f"{what}: read-only buffer, expected a writable one")
            buf = bytearray(mv)
        if nbytes == 0:
            return None
        arr = (ctypes.c_char * nbytes).from_buffer(buf)
        self.keep.append(arr)
        return ctypes.addressof(arr)


def _inputs(cfg, inputs, pin, dispatching):
    if len(inputs) != cfg.world:
        raise ValueError(f"inputs: {len(inputs)} ranks, expected world {cfg.world}")
    c_in = (RefInput * cfg.world)()
    h, k, esize = cfg.hidden, cfg.topk, DTYPE_SIZES[cfg.dtype]
    for s, i in enumerate(inputs):
        t = i.tokens
        if not isinstance(t, int) or not 0 <= t <= cfg.max_tokens:
            raise ValueError(f"in[{s}].tokens: got {t!r}, expected 0..{cfg.max_tokens} (max_tokens)")
        c_in[s].tokens = t
        c_in[s].topk_idx = pin.pointer(i.topk_idx, f"in[{s}].topk_idx", t * k * 4)
        if dispatching:
            c_in[s].x = pin.pointer(i.x, f"in[{s}].x", t * h * esize)
            if cfg.dtype == "fp8_e4m3":
                c_in[s].x_scales = pin.pointer(i.x_scales, f"in[{s}].x_scales", t * (h // _lib.FP8_BLOCK) * 4)
        if cfg.weights and (dispatching or cfg.layout == "expert"):
            c_in[s].topk_weights = pin.pointer(i.topk_weights, f"in[{s}].topk_weights", t * k * 4)
    return c_in


def _recv_struct(cfg, r, pin, p):
    sizes = cfg.sizes()
    c = RefRecv(capacity=r.capacity, rows=r.rows, dropped=r.dropped)
    for name, size in sizes.items():
        setattr(c, name, pin.pointer(getattr(r, name), f"recv[{p}].{name}", size, writable=True))
    return c


def dispatch(cfg, inputs):
    """symm_ref_dispatch over the world's inputs; a DispatchResult."""
    pin = _Pinned()
    c_in = _inputs(cfg, inputs, pin, True)
    recv = [Recv(cfg) for _ in range(cfg.world)]
    c_recv = (RefRecv * cfg.world)(*[_recv_struct(cfg, r, pin, p) for p, r in enumerate(recv)])
    c_stats = (RefSendStats * cfg.world)()
    status = _lib.lib().symm_ref_dispatch(ctypes.byref(cfg._c), c_in, c_recv, c_stats)
    overflow = None
    if status != 0:
        err = _lib.error(status)
        if err.status != "SYMM_ERR_OVERFLOW":
            raise err
        overflow = str(err)
    for r, c in zip(recv, c_recv):
        r.rows, r.dropped = c.rows, c.dropped
    return DispatchResult(recv, [(s.invalid, s.dropped) for s in c_stats], overflow)


def combine(cfg, inputs, result, ys):
    """symm_ref_combine: ys[p] is rank p's [capacity, hidden] combine_dtype
    rows (None where it received none); returns a bytearray
    [tokens, hidden] combine_dtype per rank."""
    pin = _Pinned()
    c_in = _inputs(cfg, inputs, pin, False)
    if len(ys) != cfg.world:
        raise ValueError(f"ys: {len(ys)} ranks, expected world {cfg.world}")
    c_recv = (RefRecv * cfg.world)(*[_recv_struct(cfg, r, pin, p) for p, r in enumerate(result.recv)])
    row_bytes = cfg.hidden * DTYPE_SIZES[cfg.combine_dtype]
    c_y = (ctypes.c_void_p * cfg.world)()
    for p, y in enumerate(ys):
        if y is not None:
            c_y[p] = pin.pointer(y, f"y[{p}]", cfg.rows * row_bytes)
    outs = [bytearray(i.tokens * row_bytes) for i in inputs]
    c_out = (ctypes.c_void_p * cfg.world)()
    for s, out in enumerate(outs):
        c_out[s] = pin.pointer(out, f"out[{s}]", len(out), writable=True)
    _lib.check(_lib.lib().symm_ref_combine(ctypes.byref(cfg._c), c_in, c_recv, c_y, c_out))
    return outs


def f32_to_bf16(f):
    """The GPU's round to nearest even of a float to bf16 bits."""
    return _lib.lib().symm_f32_to_bf16(f)


def bf16_to_f32(h):
    return _lib.lib().symm_bf16_to_f32(h)


def f32_to_f16(f):
    return _lib.lib().symm_f32_to_f16(f)


def f16_to_f32(h):
    return _lib.lib().symm_f16_to_f32(h)
