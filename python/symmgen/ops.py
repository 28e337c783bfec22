"""ops.py: dispatch and combine as torch.library custom ops under the
symmgen namespace, with fake (meta) implementations for torch.compile and
the autograd formulas of the owned (functional) forms.

    symmgen::dispatch(int buffer, Tensor x, Tensor topk_idx, Tensor? topk_weights,
                      Tensor? x_scales, Tensor? num_tokens, Tensor(a!) recv_x,
                      Tensor(b!) recv_x_scales, ..., Tensor(h!) num_recv_rows) -> ()
    symmgen::combine(int buffer, Tensor y, Tensor(a!) out, Tensor(b!) num_recv_rows) -> ()
        Zero copy: the results land in the variant's buffers, each a tensor
        the op declares mutated (an empty stand-in where the variant has
        none); the caller reads them afterwards. combine also declares the
        row count, which ties it between its dispatch and the next in any
        order a compiler picks. Mutating ops return nothing.
    symmgen::dispatch_owned(...) -> (recv_x, recv_x_scales, recv_src, recv_topk_idx,
                                     recv_topk_weights, num_recv_tokens_per_expert,
                                     recv_expert_offset, num_recv_rows)
    symmgen::combine_owned(...) -> out
        Functional: owned copies out, nothing declared mutated, so autograd
        can be registered. The rows past the received ones are zero.
    symmgen::combine_backward, symmgen::dispatch_backward
        What the backward formulas run on the variant: a dispatch of out's
        gradient, and a combine of the received rows' gradients.

`buffer` is the id of a Buffer in this process (buffer.py). Calls on one
variant alternate dispatch, combine, dispatch, ... on every rank; the
backward keeps that order: combine's backward dispatches, then dispatch's
backward combines (DESIGN.md "Python"). Gradients: layout rank's combine is
a sum over ranks, so its gradient is a dispatch of grad_out; layout
expert's applies the top-k weights, so its gradient is that dispatch times
each row's weight, and the weights' gradient is dot(grad_out[t],
y[row(t, k)]) per received row, taken back to (source rank, token, k)
through an all_to_all_single over the world's process group."""

from typing import Optional, Tuple

import torch
import torch.distributed._functional_collectives as funcol
from torch import Tensor

# Buffer id -> Buffer, for the ops' implementations.
registry = {}

# Library.register_symm_mem_args (after torch 2.11) asks inductor to place
# an argument in torch's own symmetric memory. The arguments our kernels
# read from peers must lie in the variant's symmetric buffer instead, which
# torch does not allocate, so it is detected (and reported) but not used:
# a pulling combine's y is Buffer.combine_buffer, a view of that buffer
# (with combine = "auto" a y anywhere else pushes instead).
HAS_SYMM_MEM_ARGS = hasattr(torch.library.Library, "register_symm_mem_args")


def _buf(buffer):
    try:
        return registry[buffer]
    except KeyError:
        raise RuntimeError(f"symmgen: buffer {buffer} was destroyed (or never made in this process)") from None


# --- zero copy ---------------------------------------------------------------

_RESULTS = ("recv_x", "recv_x_scales", "recv_src", "recv_topk_idx", "recv_topk_weights",
            "num_recv_tokens_per_expert", "recv_expert_offset", "num_recv_rows")


@torch.library.custom_op("symmgen::dispatch", mutates_args=_RESULTS)
def dispatch(buffer: int, x: Tensor, topk_idx: Tensor, topk_weights: Optional[Tensor], x_scales: Optional[Tensor],
             num_tokens: Optional[Tensor], recv_x: Tensor, recv_x_scales: Tensor, recv_src: Tensor,
             recv_topk_idx: Tensor, recv_topk_weights: Tensor, num_recv_tokens_per_expert: Tensor,
             recv_expert_offset: Tensor, num_recv_rows: Tensor) -> None:
    b = _buf(buffer)
    b._check_own((recv_x, recv_x_scales, recv_src, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert,
                  recv_expert_offset, num_recv_rows))
    b._launch_dispatch(x, topk_idx, topk_weights, x_scales, num_tokens)


@dispatch.register_fake
def _(buffer, x, topk_idx, topk_weights, x_scales, num_tokens, *results):
    return None


@torch.library.custom_op("symmgen::combine", mutates_args=("out", "num_recv_rows"))
def combine(buffer: int, y: Tensor, out: Tensor, num_recv_rows: Tensor) -> None:
    _buf(buffer)._launch_combine(y, out)


@combine.register_fake
def _(buffer, y, out, num_recv_rows):
    return None


# --- owned (functional) ------------------------------------------------------

def _empty(b, name):
    """The owned result `name` of Buffer b, shaped as its view (or [0]
    where the variant has none)."""
    shape, dtype = b._result_shapes[name]
    return torch.empty(shape, dtype=dtype, device=b.device)


@torch.library.custom_op("symmgen::dispatch_owned", mutates_args=())
def dispatch_owned(buffer: int, x: Tensor, topk_idx: Tensor, topk_weights: Optional[Tensor],
                   x_scales: Optional[Tensor], num_tokens: Optional[Tensor]
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    b = _buf(buffer)
    b._launch_dispatch(x, topk_idx, topk_weights, x_scales, num_tokens)
    return tuple(b._owned_results())


@dispatch_owned.register_fake
def _(buffer, x, topk_idx, topk_weights, x_scales, num_tokens):
    b = _buf(buffer)
    return tuple(_empty(b, name) for name in b.RESULT_NAMES)


@torch.library.custom_op("symmgen::combine_owned", mutates_args=())
def combine_owned(buffer: int, y: Tensor, topk_idx: Tensor, topk_weights: Optional[Tensor],
                  num_tokens: Optional[Tensor], recv_src: Tensor, recv_topk_weights: Optional[Tensor],
                  num_recv_tokens_per_expert: Tensor, recv_expert_offset: Optional[Tensor],
                  num_recv_rows: Tensor, close: bool) -> Tensor:
    b = _buf(buffer)
    out = b._new_out(topk_idx.shape[0])
    b._launch_combine(y, out)
    return out


@combine_owned.register_fake
def _(buffer, y, topk_idx, topk_weights, num_tokens, recv_src, recv_topk_weights, num_recv_tokens_per_expert,
      recv_expert_offset, num_recv_rows, close):
    return _buf(buffer)._new_out(topk_idx.shape[0])


# --- what the backward formulas run --------------------------------------------

@torch.library.custom_op("symmgen::combine_backward", mutates_args=())
def combine_backward(buffer: int, grad_out: Tensor, topk_idx: Tensor, num_tokens: Optional[Tensor],
                     close: bool) -> Tensor:
    """Dispatch grad_out along the forward's routing (weights 1: the
    dispatch's backward that follows must not apply them) and return the
    received rows, owned, zero past the received ones. close: the forward
    dispatch has no backward, so its combine is run here (on rows nobody
    reads) to keep the variant's calls alternating."""
    b = _buf(buffer)
    b._launch_dispatch(grad_out, topk_idx, b._ones_weights(topk_idx), None, num_tokens)
    rows = b._owned("recv_x")
    if close:
        b._launch_combine(b._views["recv_x"], b._new_out(topk_idx.shape[0]))
    return rows


@combine_backward.register_fake
def _(buffer, grad_out, topk_idx, num_tokens, close):
    return _empty(_buf(buffer), "recv_x")


@torch.library.custom_op("symmgen::dispatch_backward", mutates_args=())
def dispatch_backward(buffer: int, grad_recv_x: Tensor, topk_idx: Tensor, num_tokens: Optional[Tensor]) -> Tensor:
    """Combine the received rows' gradients back to their tokens, without
    the weights. When no combine's backward dispatched this routing first
    (its y needed no gradient), a dispatch of zeros does, so the variant's
    calls still alternate."""
    b = _buf(buffer)
    T = topk_idx.shape[0]
    if not b._awaiting:
        zeros = torch.zeros((T, b.hidden), dtype=b._dtypes[b.variant.dtype], device=b.device)
        b._launch_dispatch(zeros, topk_idx, b._ones_weights(topk_idx), None, num_tokens)
    out = b._new_out(T)
    b._launch_combine(grad_recv_x, out)
    return out


@dispatch_backward.register_fake
def _(buffer, grad_recv_x, topk_idx, num_tokens):
    return _buf(buffer)._new_out(topk_idx.shape[0])


# --- autograd ------------------------------------------------------------------

def valid_rows(b, count, offset, rows):
    """[capacity] bool: the rows a dispatch wrote (layout rank: below the
    row count; layout expert: inside a segment), from its device counts."""
    r = torch.arange(b.capacity, device=count.device)
    if offset is None or offset.numel() == 0:
        return r < rows
    return ((r[None, :] >= offset[:, None]) & (r[None, :] < (offset + count)[:, None])).any(0)


def route_back(b, values, recv_src, valid, tokens):
    """Per received row's (layout expert: [capacity]) or per row and k's
    (layout rank: [capacity, topk]) float32 values, taken back to their
    source rank and summed there: [tokens, topk] float32. Each rank
    scatters into [world, max_tokens * topk] at (source token * topk + k),
    one all_to_all_single with equal splits exchanges that, and the sum over
    ranks holds each entry's one value. No host synchronisation."""
    W, MT, K = b.variant.world, b.variant.max_tokens, b.variant.topk
    src = recv_src.long()
    base = src[:, 0] * (MT * K) + src[:, 1] * K
    if values.dim() == 1:
        index = base + src[:, 2]
    else:
        index = base[:, None] + torch.arange(K, device=values.device)[None, :]
    index = torch.where(valid, index, torch.full_like(index, W * MT * K))
    values = torch.where(valid, values, torch.zeros_like(values))
    send = torch.zeros(W * MT * K + 1, dtype=torch.float32, device=values.device)
    send = send.index_put((index.reshape(-1),), values.reshape(-1).float(), accumulate=True)
    send = send[:W * MT * K]
    if b._collectives_on_host:
        send = send.cpu()
    got = funcol.wait_tensor(funcol.all_to_all_single(send.contiguous(), None, None, b.group))
    return got.to(values.device).view(W, MT, K).sum(0)[:tokens]


def _dispatch_setup(ctx, inputs, output):
    buffer, x, topk_idx, topk_weights, x_scales, num_tokens = inputs
    ctx.buffer = buffer
    ctx.x_dtype = x.dtype
    _, _, src, recv_idx, _, count, offset, rows = output
    ctx.save_for_backward(topk_idx, num_tokens, src, recv_idx, count, offset, rows)


def _dispatch_bwd(ctx, g_recv_x, g_scales, g_src, g_idx, g_recv_w, g_count, g_offset, g_rows):
    b = _buf(ctx.buffer)
    topk_idx, num_tokens, src, recv_idx, count, offset, rows = ctx.saved_tensors
    T = topk_idx.shape[0]
    if g_recv_x is None:
        g_recv_x = torch.zeros((b.capacity, b.hidden), dtype=ctx.x_dtype, device=topk_idx.device)
    grad_x = dispatch_backward(ctx.buffer, g_recv_x.contiguous(), topk_idx, num_tokens)
    grad_w = None
    if ctx.needs_input_grad[3] and g_recv_w is not None and b.variant.layout == "rank":
        valid = valid_rows(b, count, offset, rows)[:, None] & (recv_idx >= 0)
        grad_w = route_back(b, g_recv_w, src, valid, T)
    elif ctx.needs_input_grad[3] and g_recv_w is not None:
        grad_w = route_back(b, g_recv_w, src, valid_rows(b, count, offset, rows), T)
    return None, grad_x if ctx.needs_input_grad[1] else None, None, grad_w, None, None


dispatch_owned.register_autograd(_dispatch_bwd, setup_context=_dispatch_setup)


def _combine_setup(ctx, inputs, output):
    (buffer, y, topk_idx, topk_weights, num_tokens, recv_src, recv_w, count, offset, rows, close) = inputs
    ctx.buffer, ctx.close = buffer, close
    ctx.save_for_backward(y, topk_idx, num_tokens, recv_src, recv_w, count, offset, rows)


def _combine_bwd(ctx, grad_out):
    b = _buf(ctx.buffer)
    y, topk_idx, num_tokens, recv_src, recv_w, count, offset, rows = ctx.saved_tensors
    g_rows = combine_backward(ctx.buffer, grad_out.contiguous(), topk_idx, num_tokens, ctx.close)
    weighted = b.variant.layout == "expert" and b.variant.weights
    grad_y = g_rows
    if weighted:
        grad_y = (g_rows.float() * recv_w[:, None]).to(g_rows.dtype)
    grad_w = None
    if weighted and ctx.needs_input_grad[3]:
        per_row = (g_rows.float() * y.float()).sum(1)
        grad_w = route_back(b, per_row, recv_src, valid_rows(b, count, offset, rows), topk_idx.shape[0])
    return (None, grad_y if ctx.needs_input_grad[1] else None, None, grad_w) + (None,) * 7


combine_owned.register_autograd(_combine_bwd, setup_context=_combine_setup)
