"""buffer.py: Buffer, the object a PyTorch program holds: one generated
variant created on the ranks of a process group, with dispatch and
combine taking and returning torch tensors.

    buf = symmgen.Buffer(group, {"hidden": 4096, "topk": 8, "experts": 64,
                                 "max_tokens": 256, "dtype": "bf16", "layout": "expert"})
    r = buf.dispatch(x, topk_idx, topk_weights)       # r.recv_x, r.num_recv_tokens_per_expert, ...
    y = experts(r.recv_x, r.num_recv_tokens_per_expert, r.recv_expert_offset)
    out = buf.combine(y)

Calls run on torch's current stream and never wait on the host (except
the methods that say they synchronise). Under torch.compile they become
the custom ops of ops.py; with autograd recording they go through the owned
(functional) ops, whose backward formulas run the variant again."""

import hashlib
import json
import os
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from . import checks, manifest, ops, torch_ref
from . import spec as spec_mod
from .backends import Native, Reference

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "fp8_e4m3": torch.float8_e4m3fn, "int32": torch.int32, "int64": torch.int64}


class DispatchResult(NamedTuple):
    """What dispatch returns (capacity = the variant's receive rows; rows at
    and past num_recv_rows, and layout expert's padding rows, hold stale
    data in the zero-copy views, zeros in owned results).

    recv_x:             [capacity, hidden] dtype, the received rows
    recv_x_scales:      [capacity, hidden / 128] float32 (fp8_e4m3), else None
    recv_src:           [capacity, 4] int32: source rank, source token, k (layout
                        expert) or -1, 0
    recv_topk_idx:      layout rank: [capacity, topk] int32 local expert ids, -1
                        where the expert is not on this rank; else None
    recv_topk_weights:  [capacity, topk] (rank) or [capacity] (expert) float32, or
                        None without weights
    num_recv_tokens_per_expert: [local experts] int32, rows per local expert
    recv_expert_offset: layout expert: [local experts] int32 segment starts; else None
    num_recv_rows:      [1] int32: rows received (layout expert: the end of the last
                        segment), on the device"""
    recv_x: torch.Tensor
    recv_x_scales: Optional[torch.Tensor]
    recv_src: torch.Tensor
    recv_topk_idx: Optional[torch.Tensor]
    recv_topk_weights: Optional[torch.Tensor]
    num_recv_tokens_per_expert: torch.Tensor
    recv_expert_offset: Optional[torch.Tensor]
    num_recv_rows: torch.Tensor

    def num_recv_rows_host(self):
        """num_recv_rows as a Python int. Synchronises: waits for the
        dispatch (and everything before it on the stream)."""
        return int(self.num_recv_rows.item())


RESULT_NAMES = DispatchResult._fields
_ROW_RESULTS = ("recv_x", "recv_x_scales", "recv_src", "recv_topk_idx", "recv_topk_weights")
_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_increment_version = torch._C._increment_version
_I32, _F32 = torch.int32, torch.float32


class Buffer:
    """One variant on the ranks of a process group.

    Buffer(group=None, spec=None, name=None, *, defines=None, cache_dir=None,
           backend=None, tune=None, timeout=None, device=None)

    group:   a torch.distributed ProcessGroup (default: the default group), or
             a symmgen.World; the ranks of one host. Collective over it.
    spec:    a dict of spec fields ({"hidden": 4096, "topk": 8, ...}; world
             defaults to the group's size, name to "symmgen_torch"), a Lua
             spec file (name picks the variant when it declares several;
             defines: -D overrides {field: value}), or a manifest.json that
             symmgen wrote (or its directory).
    cache_dir: generated specs and JIT cubins (default SYMM_CACHE_DIR, else
             ~/.cache/symmgen).
    backend: None (SYMM_BACKEND, else native on one host and hybrid on a
             world of several), "native", "nccl", "hybrid" (across hosts:
             NCCL between hosts, NVLink within; not capturable), or
             "reference" (torch_ref over the group: no GPU needed, slow).
    tune:    kernel tuning knobs "NAME=value,..." (README "Tuning").
    timeout: seconds any wait may take (default SYMM_TIMEOUT or 60).
    device:  the CUDA device (default torch.cuda.current_device()).

    Attributes: name, hidden, topk, experts, world_size, local_experts,
    max_tokens, dtype and combine_dtype (torch dtypes), layout, weights,
    capacity, align, sms, combine_mode ("push", "pull" or "auto"),
    combine_order, variant (the manifest's manifest.Variant), rank, group,
    device, combine_buffer (combine = "pull": where y should be written;
    "auto": where y may be written for the faster, pulling form).
    destroy() is collective; use the Buffer as a context manager or call it
    on every rank."""

    RESULT_NAMES = RESULT_NAMES
    _dtypes = DTYPES
    _next_id = 1

    def __init__(self, group=None, spec=None, name=None, *, defines=None, cache_dir=None, backend=None,
                 tune=None, timeout=None, device=None):
        from .world import World
        self._world = None
        self._own_world = False
        self._id = None
        if backend not in (None, "native", "nccl", "hybrid", "reference"):
            raise ValueError(f"symmgen.Buffer: backend: got {backend!r}, expected None, 'native', 'nccl', "
                             f"'hybrid' or 'reference'")
        if isinstance(group, World):
            self._world, self.group = group, group.group
        else:
            if not dist.is_initialized():
                raise RuntimeError("symmgen.Buffer: torch.distributed is not initialized: call "
                                   "torch.distributed.init_process_group first")
            self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        size = dist.get_world_size(self.group)
        path, name = _manifest_path(spec, name, size, defines, cache_dir)
        self.variant = v = manifest.load(path).variant(name)
        checks.world(v, size)
        self._result_shapes = self._shapes()
        if backend == "reference":
            self.device = torch.device(device) if device is not None else (
                torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
            self._backend = Reference(self.group, v, self._result_shapes, self.device)
        else:
            if self._world is None:
                self._world, self._own_world = World(self.group, device=device, timeout=timeout), True
            self.device = self._world.device
            try:
                self._backend = Native(self._world, v, self._result_shapes, backend, cache_dir, tune, timeout)
            except BaseException:
                if self._own_world:
                    self._world.destroy()
                raise
        self._views = self._backend.results
        self.combine_buffer = self._views.get("combine_buffer")
        self._zero_copy = DispatchResult(*[self._views.get(n) for n in RESULT_NAMES])
        # What the zero-copy op declares it mutates: every result (a tensor
        # of its own where the variant has none).
        self._mutable = tuple(self._views[n] if n in self._views else
                              torch.empty(0, dtype=torch.uint8, device=self.device) for n in RESULT_NAMES)
        # What every dispatch bumps the version counter of (what a caller holds).
        self._versioned = tuple(self._views[n] for n in RESULT_NAMES if n in self._views)
        self._awaiting = False
        self._rows = 0
        self._last = None
        self._sym_range = self._backend.sym_range
        # What the per-call checks compare against, at hand.
        self._x_dtype, self._y_dtype = DTYPES[v.dtype], DTYPES[v.combine_dtype]
        self._hidden, self._topk, self._max_tokens = v.hidden, v.topk, v.max_tokens
        self._has_weights, self._scale_cols, self._pull = v.weights, v.scale_cols, v.pull
        self._y_shape = (v.capacity, v.hidden)
        self._weighted = v.layout == "expert" and v.weights
        self._collectives_on_host = torch_ref.on_host(self.group, self.device)
        self._id = Buffer._make_id(v, size, backend)
        ops.registry[self._id] = self

    @staticmethod
    def _make_id(v, size, backend):
        """The buffer's id, the ops' first argument: the variant's every
        field, the world and the backend hashed (48 bits) above a count of
        the buffers made in this process (14 bits). A compiled graph holds
        the id as a constant, and inductor keeps compiled graphs on disk
        across processes, keyed by the graph: the shapes the fake kernels
        gave (the capacity, the hidden size, ...) must follow from the id,
        or a graph compiled for one spec or world would be taken for
        another's (seen: world 4's capacity asserted in a world-2 job)."""
        sig = json.dumps({"variant": v.fields, "world": size, "backend": backend or "native"}, sort_keys=True,
                         default=str)
        h = int.from_bytes(hashlib.blake2b(sig.encode(), digest_size=6).digest(), "big")
        while True:
            seq = Buffer._next_id & 0x3FFF
            Buffer._next_id += 1
            made = (h << 14) | seq
            if made not in ops.registry:
                return made

    # --- the variant's fields ---------------------------------------------------
    name = property(lambda self: self.variant.name)
    hidden = property(lambda self: self.variant.hidden)
    topk = property(lambda self: self.variant.topk)
    experts = property(lambda self: self.variant.experts)
    world_size = property(lambda self: self.variant.world)
    local_experts = property(lambda self: self.variant.local_experts)
    max_tokens = property(lambda self: self.variant.max_tokens)
    dtype = property(lambda self: DTYPES[self.variant.dtype])
    combine_dtype = property(lambda self: DTYPES[self.variant.combine_dtype])
    layout = property(lambda self: self.variant.layout)
    weights = property(lambda self: self.variant.weights)
    capacity = property(lambda self: self.variant.capacity)
    align = property(lambda self: self.variant.align)
    sms = property(lambda self: self.variant.sms)
    combine_mode = property(lambda self: self.variant.combine)
    combine_order = property(lambda self: self.variant.combine_order)

    def __repr__(self):
        return f"symmgen.Buffer({self.variant!r}, rank {self.rank}, {self.device})"

    # --- views of the variant's buffers -------------------------------------------
    def _shapes(self):
        v, cap = self.variant, self.variant.capacity
        L, K = v.local_experts, v.topk
        f32, i32 = torch.float32, torch.int32
        shapes = {"recv_x": ((cap, v.hidden), DTYPES[v.dtype]),
                  "recv_x_scales": ((cap, v.scale_cols), f32) if v.scale_cols else None,
                  "recv_src": ((cap, 4), i32),
                  "recv_topk_idx": ((cap, K), i32) if v.layout == "rank" else None,
                  "recv_topk_weights": (((cap, K) if v.layout == "rank" else (cap,)), f32) if v.weights else None,
                  "num_recv_tokens_per_expert": ((L,), i32),
                  "recv_expert_offset": ((L,), i32) if v.layout == "expert" else None,
                  "num_recv_rows": ((1,), i32),
                  "combine_buffer": ((cap, v.hidden), DTYPES[v.combine_dtype]) if v.has_y_region else None}
        # Absent results travel through the owned ops as empty tensors.
        return {k: s if s is not None else ((0,), f32) for k, s in shapes.items()}

    def _check_own(self, tensors):
        """The zero-copy ops must get this buffer's own tensors: a copy (what
        a functionalization pass makes when it cannot prove the op may write
        in place) would not hold what the peers wrote."""
        if any(t.data_ptr() != own.data_ptr() for t, own in zip(tensors, self._mutable)):
            raise RuntimeError(
                f"{self.name}: the zero-copy op got a copy of the variant's buffers (torch.compile could not "
                f"let it write in place, for instance because a result of an earlier dispatch is read after a "
                f"later one): pass copy=True to dispatch")

    # --- launches (argument checks done) ----------------------------------------
    def _launch_dispatch(self, x, topk_idx, topk_weights, x_scales, num_tokens):
        self._backend.dispatch(x, topk_idx, topk_weights, x_scales, num_tokens)
        self._awaiting = True
        self._rows = x.shape[0]
        _increment_version(self._versioned)

    def _launch_combine(self, y, out):
        # combine = "pull": the peers read y in the symmetric buffer, so a y
        # elsewhere goes there first. "auto" takes y where it is (libsymm
        # pulls inside the buffer and pushes elsewhere).
        if self._pull and not self._inside(y):
            y = self.combine_buffer.copy_(y)
        self._backend.combine(y, out)
        self._awaiting = False

    def _inside(self, y):
        """Whether y lies in the variant's symmetric buffer (where a pulling
        combine's peers read it)."""
        start = y.data_ptr()
        if self._sym_range is None:
            return start in (self.combine_buffer.data_ptr(), self._views["recv_x"].data_ptr())
        return self._sym_range[0] <= start and start + y.numel() * y.element_size() <= self._sym_range[1]

    def _new_out(self, tokens):
        return torch.empty((tokens, self.variant.hidden), dtype=self._y_dtype, device=self.device)

    def _ones_weights(self, topk_idx):
        if not self.variant.weights:
            return None
        return torch.ones(topk_idx.shape, dtype=torch.float32, device=self.device)

    def _valid_rows(self):
        return ops.valid_rows(self, self._views["num_recv_tokens_per_expert"],
                              self._views.get("recv_expert_offset"), self._views["num_recv_rows"])

    def _owned(self, name, valid=None):
        """An owned copy of result name; per-row results are zero past the
        rows the dispatch wrote."""
        view = self._views.get(name)
        if view is None:
            return torch.empty(self._result_shapes[name][0], dtype=self._result_shapes[name][1],
                               device=self.device)
        if name not in _ROW_RESULTS:
            return view.clone()
        if valid is None:
            valid = self._valid_rows()
        mask = valid.view((-1,) + (1,) * (view.dim() - 1))
        raw = view.view(torch.uint8) if view.element_size() == 1 else view
        return torch.where(mask, raw, torch.zeros((), dtype=raw.dtype, device=raw.device)).view(view.dtype)

    def _owned_results(self):
        valid = self._valid_rows()
        return [self._owned(name, valid) for name in RESULT_NAMES]

    # --- argument preparation ----------------------------------------------------
    @staticmethod
    def _idx32(topk_idx):
        if topk_idx.dtype == torch.int32:
            return topk_idx
        # An id beyond int32 stays invalid rather than wrapping onto a valid one.
        return topk_idx.clamp(-(1 << 31), (1 << 31) - 1).to(torch.int32).contiguous()

    def _tokens32(self, num_tokens, rows):
        """The device token count as the kernels read it: as given when it is
        one int32 and x holds max_tokens rows (the kernels clamp to
        0..max_tokens and report a clamp), else clamped to x's rows here."""
        if num_tokens is None:
            return None
        if num_tokens.dtype == torch.int32 and rows == self.variant.max_tokens and num_tokens.is_contiguous():
            return num_tokens
        return num_tokens.reshape(1).clamp(0, rows).to(torch.int32)

    # --- dispatch -------------------------------------------------------------------
    def dispatch(self, x, topk_idx, topk_weights=None, x_scales=None, *, num_tokens=None, copy=None):
        """Send each token to the ranks of its experts.

        x:            [T, hidden] of the variant's dtype (torch.bfloat16, ...), contiguous,
                      on this rank's device; T <= max_tokens (T may differ per rank)
        topk_idx:     [T, topk] int32 or int64 expert ids (-1: none); int64 is
                      converted on the GPU
        topk_weights: [T, topk] float32 when the variant carries weights, else None
        x_scales:     [T, hidden / 128] float32 for fp8_e4m3 (x then torch.float8_e4m3fn)
        num_tokens:   None, or a one-element int32/int64 tensor on the device: how
                      many leading rows of x to send, read on the GPU (clamped to
                      0..T), so that one captured CUDA graph serves any count; an
                      int32 count with T = max_tokens costs no extra kernel
        copy:         False: the results are views of the variant's buffers (zero
                      copy), valid until the next dispatch, which bumps their
                      version counter (autograd then refuses a saved view);
                      True: owned tensors; None (default): views, or owned
                      tensors while autograd records (torch.is_grad_enabled())

        Returns a DispatchResult. Runs on the current stream, no host
        synchronisation. Every dispatch must be followed by its combine
        before the next dispatch, on every rank in the same order.
        Differentiable (when the dispatch and combine dtypes agree): the
        gradient of x is a combine of recv_x's gradient, that of
        topk_weights comes back from recv_topk_weights' gradient."""
        if _compiling():
            return self._dispatch_traced(x, topk_idx, topk_weights, x_scales, num_tokens, copy)
        recording = _grad_enabled()
        if copy or (copy is None and recording):
            return self._dispatch_owned(x, topk_idx, topk_weights, x_scales, num_tokens, False)
        if recording and (x.requires_grad or (topk_weights is not None and topk_weights.requires_grad)):
            raise ValueError(f"{self.name} dispatch: copy=False with inputs that require grad: the zero-copy "
                             f"results cannot carry gradients; pass copy=None or True")
        # The common call is checked here in one expression (the per-call
        # cost matters at decode); anything else, or anything wrong, goes
        # through checks.dispatch, which names what is wrong.
        d = self.device
        try:
            rows, hidden = x.shape
            ok = (x.dtype is self._x_dtype and hidden == self._hidden and rows <= self._max_tokens
                  and topk_idx.dtype is _I32 and num_tokens is None and x.device == d and topk_idx.device == d
                  and topk_idx.shape == (rows, self._topk) and x.is_contiguous() and topk_idx.is_contiguous()
                  and not x.data_ptr() & 15)
            if ok:
                w = topk_weights
                ok = (w is None) if not self._has_weights else (
                    w is not None and w.dtype is _F32 and w.device == d and w.shape == (rows, self._topk)
                    and w.is_contiguous())
            if ok:
                sc = x_scales
                ok = (sc is None) if not self._scale_cols else (
                    sc is not None and sc.dtype is _F32 and sc.device == d and sc.shape == (rows, self._scale_cols)
                    and sc.is_contiguous())
        except (AttributeError, TypeError, ValueError):
            ok = False
        if not ok:
            checks.dispatch(self.variant, d, DTYPES, x, topk_idx, topk_weights, x_scales, num_tokens)
        if self._awaiting:
            checks.alternation(self.variant, True)
        if topk_idx.dtype is not _I32:
            topk_idx = self._idx32(topk_idx)
        tok = None if num_tokens is None else self._tokens32(num_tokens, x.shape[0])
        self._backend.dispatch(x, topk_idx, topk_weights, x_scales, tok)
        self._awaiting = True
        self._rows = x.shape[0]
        _increment_version(self._versioned)
        self._last = (topk_idx, topk_weights, tok, None, False)
        return self._zero_copy

    def _dispatch_owned(self, x, topk_idx, topk_weights, x_scales, num_tokens, traced):
        checks.dispatch(self.variant, self.device, DTYPES, x, topk_idx, topk_weights, x_scales, num_tokens,
                        traced=traced)
        tracked = torch.is_grad_enabled() and (
            x.requires_grad or (topk_weights is not None and topk_weights.requires_grad))
        if tracked:
            checks.autograd(self.variant)
        if not traced and self._awaiting:
            checks.alternation(self.variant, True)
        idx, tok = self._idx32(topk_idx), self._tokens32(num_tokens, x.shape[0])
        outs = torch.ops.symmgen.dispatch_owned(self._id, x, idx, topk_weights, x_scales, tok)
        result = DispatchResult(*[t if name in self._views else None for name, t in zip(RESULT_NAMES, outs)])
        self._last = (idx, topk_weights, tok, result, tracked)
        return result

    def _dispatch_traced(self, x, topk_idx, topk_weights, x_scales, num_tokens, copy):
        if copy or (copy is None and torch.is_grad_enabled()):
            return self._dispatch_owned(x, topk_idx, topk_weights, x_scales, num_tokens, True)
        checks.dispatch(self.variant, self.device, DTYPES, x, topk_idx, topk_weights, x_scales, num_tokens,
                        traced=True)
        idx, tok = self._idx32(topk_idx), self._tokens32(num_tokens, x.shape[0])
        torch.ops.symmgen.dispatch(self._id, x, idx, topk_weights, x_scales, tok, *self._mutable)
        self._last = (idx, topk_weights, tok, None, False)
        return self._zero_copy

    # --- combine ----------------------------------------------------------------------
    def combine(self, y, *, out=None):
        """Bring the expert outputs back and sum them per token.

        y:   [capacity, hidden] of the variant's combine dtype, aligned with the
             last dispatch's recv_x (recv_x itself when the dtypes agree). With
             combine = "pull" the peers read y from the variant's symmetric
             buffer: write it into combine_buffer (or use recv_x) for zero copy;
             any other y is first copied there. With combine = "auto" any y
             is taken where it is: in combine_buffer (or recv_x) the peers read
             it (the faster form at prefill sizes), elsewhere each rank pushes
             its rows back; every rank must place y alike in a call, else the
             call fails on every rank (stats(): mismatch, SymmError
             SYMM_ERR_MISMATCH).
        out: optional [T, hidden] combine-dtype tensor to write into instead of
             a new one (not while autograd records).

        Returns out [T, hidden] in the combine dtype, T as the last dispatch's
        x (rows at and past a device num_tokens are not written). Layout
        rank: the sum over the ranks that received each token; layout
        expert: the top-k weights applied (DESIGN.md "Semantics"). Runs on
        the current stream, no host synchronisation. Differentiable."""
        if _compiling():
            return self._combine_traced(y, out)
        if _grad_enabled() and self._combine_records(y):
            if out is not None:
                raise ValueError(f"{self.name} combine: out given while autograd records: the differentiable "
                                 f"combine returns a new tensor")
            return self._combine_owned(y, False)
        d = self.device
        try:
            ok = (self._awaiting and y.dtype is self._y_dtype and y.shape == self._y_shape and y.device == d
                  and y.is_contiguous() and not y.data_ptr() & 15)
            if ok and out is not None:
                ok = (out.dtype is self._y_dtype and out.shape == (self._rows, self._hidden) and out.device == d
                      and out.is_contiguous() and not out.data_ptr() & 15)
        except (AttributeError, TypeError):
            ok = False
        if not ok:
            checks.combine(self.variant, d, DTYPES, y, self._awaiting)
            if out is not None:
                checks.tensor(f"{self.name} combine", "out", out, (self._y_dtype,), (self._rows, self._hidden), d,
                              align=16)
        if out is None:
            out = torch.empty((self._rows, self._hidden), dtype=self._y_dtype, device=d)
        self._launch_combine(y, out)
        return out

    def _combine_records(self, y):
        last = self._last
        return y.requires_grad or (self._weighted and last is not None and last[1] is not None
                                   and last[1].requires_grad)

    def _combine_owned(self, y, traced):
        checks.combine(self.variant, self.device, DTYPES, y, traced or self._awaiting, traced=traced)
        checks.autograd(self.variant)
        idx, weights, tok, result, tracked = self._last
        if result is None:
            # The dispatch was zero copy: what the backward reads must not be
            # overwritten by later dispatches.
            result = DispatchResult(*[self._owned(n) if n in self._views else None for n in RESULT_NAMES])
        return torch.ops.symmgen.combine_owned(
            self._id, y, idx, weights if self._weighted else None, tok, result.recv_src,
            result.recv_topk_weights if self._weighted else None, result.num_recv_tokens_per_expert,
            result.recv_expert_offset, result.num_recv_rows, not tracked)

    def _combine_traced(self, y, out):
        if torch.is_grad_enabled() and self._combine_records(y):
            return self._combine_owned(y, True)
        checks.combine(self.variant, self.device, DTYPES, y, True, traced=True)
        if out is None:
            out = torch.empty((self._last_tokens(), self.variant.hidden), dtype=self._y_dtype, device=self.device)
        torch.ops.symmgen.combine(self._id, y, out, self._views["num_recv_rows"])
        return out

    def _last_tokens(self):
        if self._last is None:
            raise RuntimeError(f"{self.name} combine: no dispatch to combine")
        return self._last[0].shape[0]

    # --- state ----------------------------------------------------------------------
    def stats(self, check=True):
        """The last dispatch's statistics as a dict (calls, tokens, recv_rows,
        invalid, dropped_send, dropped_recv, clamped, timed_out, timeout_peer,
        timeout_phase, mismatch, mismatch_peer). Synchronises the current
        stream. check: raise SymmError (libsymm's message) when rows were
        dropped, ids were invalid, T was clamped, a peer timed out, or (combine
        = "auto") a peer placed y otherwise than this rank in a call."""
        values, err = self._backend.stats()
        if check and err is not None:
            raise err
        return values

    def destroy(self):
        """Collective: free the variant (and the world, when the Buffer made
        it). The views it handed out must not be used afterwards."""
        if self._id is None:
            return
        ops.registry.pop(self._id, None)
        self._id = None
        try:
            self._backend.destroy()
        finally:
            if self._own_world:
                self._world.destroy()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()


def _manifest_path(spec, name, world_size, defines, cache_dir):
    """(manifest path, variant name) for what Buffer's spec argument names."""
    if isinstance(spec, dict):
        if defines:
            raise TypeError("symmgen.Buffer: defines: for a spec file; put the fields in the dict instead")
        fields = dict(spec)
        fields.setdefault("world", world_size)
        fields.setdefault("name", name or "symmgen_torch")
        if name is not None and fields["name"] != name:
            raise ValueError(f"symmgen.Buffer: name {name!r} differs from the dict's name {fields['name']!r}")
        return spec_mod.generate_fields(fields, cache_dir=cache_dir), fields["name"]
    if spec is None:
        raise TypeError("symmgen.Buffer: spec: expected a dict of spec fields, a .lua spec file or a manifest.json")
    path = os.fspath(spec)
    if path.endswith(".lua"):
        return spec_mod.generate(spec_path=path, defines=defines, cache_dir=cache_dir), name
    if defines:
        raise TypeError("symmgen.Buffer: defines: for a spec file, not a manifest (it is generated already)")
    if os.path.isdir(path):
        path = os.path.join(path, "manifest.json")
    if path.endswith(".json"):
        return path, name
    raise ValueError(f"symmgen.Buffer: spec {path!r}: expected a dict of spec fields, a .lua spec file or a "
                     f"manifest.json")
