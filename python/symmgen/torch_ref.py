"""torch_ref.py: dispatch and combine built from
torch.distributed.all_to_all_single and ordinary tensor ops: what a PyTorch
user has without this library, and the reference the GPU tests check the
variants against, bit for bit (exact=True) and through PyTorch autograd
(exact=False: plain fp32 arithmetic, differentiable).

    plan, recv = dispatch(v, group, x, topk_idx, topk_weights, x_scales, tokens)
    out = combine(v, group, plan, y, topk_weights)

It follows DESIGN.md "Semantics" for one rank of the group (v is a
manifest.Variant): the rows, their order, the per-expert counts and
offsets, the capacity's drops, and combine's summation order and roundings
(layout expert: per rank then across ranks, or in k order, as
v.combine_order says). The counts go through the host (one
synchronisation per call), so none of it can be captured in a CUDA graph."""

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                "fp8_e4m3": torch.float8_e4m3fn}
FP8_BLOCK = 128


def fma32(a, b, c):
    """fmaf(a, b, c) elementwise on float32 tensors, rounded once as the
    GPU's fmaf rounds: the product is exact in float64, the sum is rounded
    to odd in float64 (its exact error from TwoSum), then to float32,
    which gives the correctly rounded result."""
    p = a.double() * b.double()
    cd = c.double()
    s = cd + p
    bb = s - cd
    err = (cd - (s - bb)) + (p - bb)
    even = (s.view(torch.int64) & 1) == 0
    toward = torch.where(err > 0, torch.full_like(s, float("inf")), torch.full_like(s, float("-inf")))
    s = torch.where((err != 0) & even, torch.nextafter(s, toward), s)
    return s.float()


def _fma(exact):
    if exact:
        return fma32
    return lambda a, b, c: c + a * b


def valid_mask(topk_idx, experts):
    """[T, K] bool: an id in [0, experts) unlike every earlier id of its row."""
    idx = topk_idx.long()
    ok = (idx >= 0) & (idx < experts)
    for k in range(1, idx.shape[1]):
        ok[:, k] &= ~(idx[:, :k] == idx[:, k:k + 1]).any(1)
    return ok


def on_host(group, device):
    """Whether a collective of the group on device goes through host
    memory: gloo moves CPU tensors (a one-GPU test runs its ranks on a
    gloo group)."""
    return device.type == "cuda" and dist.get_backend(group) == "gloo"


def _a2a(group, t, send_counts, recv_counts, differentiable):
    """all_to_all_single of the rows of t with host split sizes."""
    device = t.device
    if on_host(group, device):
        t = t.cpu()
    out = t.new_empty((sum(recv_counts),) + tuple(t.shape[1:]))
    if differentiable:
        out = dist_fn.all_to_all_single(out, t, recv_counts, send_counts, group=group)
    else:
        dist.all_to_all_single(out, t.contiguous(), recv_counts, send_counts, group=group)
    return out.to(device)


class Plan:
    """What a dispatch leaves for its combine: per item sent (in send
    order) its token and k, per item received (in receive order) its row
    here (-1: dropped), the split sizes, and T."""


def dispatch(v, group, x, topk_idx, topk_weights=None, x_scales=None, tokens=None, exact=True):
    """This rank's dispatch: returns (plan, recv) with recv a dict of
    capacity-sized tensors named as in DispatchResult (recv_x,
    recv_x_scales, recv_src, recv_topk_idx, recv_topk_weights,
    num_recv_tokens_per_expert, recv_expert_offset, num_recv_rows; None
    where the variant has none). Rows past the received ones are zero.
    tokens: how many leading rows of x to send (default all).
    exact=False makes recv_x and recv_topk_weights differentiable."""
    if exact:
        with torch.no_grad():
            return _dispatch(v, group, x, topk_idx, topk_weights, x_scales, tokens, True)
    return _dispatch(v, group, x, topk_idx, topk_weights, x_scales, tokens, False)


def _dispatch(v, group, x, topk_idx, topk_weights, x_scales, tokens, exact):
    W, rank = dist.get_world_size(group), dist.get_rank(group)
    T = x.shape[0] if tokens is None else int(tokens)
    L, K, cap, dev = v.experts // W, v.topk, v.capacity, x.device
    idx = topk_idx[:T].long()
    valid = valid_mask(idx, v.experts)
    owner = torch.where(valid, idx // L, torch.zeros_like(idx))
    if v.layout == "rank":
        goes = torch.zeros(T, W, dtype=torch.bool, device=dev)
        for k in range(K):
            goes |= torch.nn.functional.one_hot(owner[:, k], W).bool() & valid[:, k:k + 1]
        nz = goes.t().nonzero()
        send_p, send_t = nz[:, 0], nz[:, 1]
        send_k = torch.full_like(send_t, -1)
        local = (valid[send_t] & (owner[send_t] == send_p[:, None]))
        ids = torch.where(local, idx[send_t] - send_p[:, None] * L, torch.full_like(idx[send_t], -1))
        meta = torch.stack([torch.full_like(send_t, rank), send_t, send_k, torch.zeros_like(send_t)], 1)
        meta = torch.cat([meta, ids], 1)
        w_sent = None
        if v.weights:
            w_sent = torch.where(local, topk_weights[:T][send_t].float(), torch.zeros((), device=dev))
    else:
        nz = valid.nonzero()
        order = torch.sort(idx[nz[:, 0], nz[:, 1]], stable=True).indices
        send_t, send_k = nz[order, 0], nz[order, 1]
        e = idx[send_t, send_k]
        send_p = e // L
        meta = torch.stack([torch.full_like(send_t, rank), send_t, send_k, e - send_p * L], 1)
        w_sent = topk_weights[:T][send_t, send_k].float()[:, None] if v.weights else None
    sc = torch.bincount(send_p, minlength=W).tolist()
    # The counts go where the group's backend moves tensors (nccl: the GPU).
    rc = _a2a(group, torch.tensor(sc, device=dev), [1] * W, [1] * W, False).tolist()

    plan = Plan()
    plan.recv_w = None
    plan.send_t, plan.send_k, plan.send_counts, plan.recv_counts, plan.T = send_t, send_k, sc, rc, T
    if exact:
        rows = _a2a(group, x[:T].view(torch.uint8)[send_t], sc, rc, False).view(x.dtype)
    else:
        rows = _a2a(group, x[:T][send_t].float(), sc, rc, True).to(x.dtype)
    meta_r = _a2a(group, meta.int(), sc, rc, False)
    w_r = None if w_sent is None else _a2a(group, w_sent, sc, rc, not exact)
    scales_r = None
    if v.dtype == "fp8_e4m3":
        scales_r = _a2a(group, x_scales[:T][send_t].float(), sc, rc, False)

    n = meta_r.shape[0]
    count = torch.zeros(L, dtype=torch.int32, device=dev)
    offset = None
    if v.layout == "rank":
        pos = torch.arange(n, device=dev)
        kept = pos < cap
        ids_r = meta_r[:, 4:]
        kept_ids = ids_r[kept]
        count += torch.bincount(kept_ids[kept_ids >= 0].long(), minlength=L).int()
        n_rows = min(n, cap)
    else:
        e_r = meta_r[:, 3].long()
        by_e = torch.sort(e_r, stable=True).indices
        cnt = torch.bincount(e_r, minlength=L).tolist()
        offs, end = [], 0
        for j in range(L):
            if j > 0:
                end = (end + v.align - 1) // v.align * v.align
            offs.append(end)
            end += cnt[j]
        # The i-th row in (expert, source rank, token) order is row i - first[e]
        # of expert e's segment.
        first = torch.tensor([sum(cnt[:j]) for j in range(L)], dtype=torch.long, device=dev)
        off_t = torch.tensor(offs, dtype=torch.long, device=dev)
        e_sorted = e_r[by_e]
        pos = torch.empty(n, dtype=torch.long, device=dev)
        pos[by_e] = off_t[e_sorted] + torch.arange(n, device=dev) - first[e_sorted]
        kept = pos < cap
        count = torch.tensor([max(0, min(cap - o, c)) for o, c in zip(offs, cnt)], dtype=torch.int32, device=dev)
        offset = torch.tensor([min(o, cap) for o in offs], dtype=torch.int32, device=dev)
        n_rows = min(end, cap)
    plan.recv_pos = torch.where(kept, pos, torch.full_like(pos, -1))
    plan.recv_kept = kept
    plan.recv_meta = meta_r

    kp = pos[kept]
    recv_x = torch.zeros((cap, v.hidden * x.element_size()), dtype=torch.uint8, device=dev).view(x.dtype)
    if exact:
        recv_x.view(torch.uint8)[kp] = rows[kept].view(torch.uint8)
    else:
        recv_x = recv_x.index_put((kp,), rows[kept])
    src = torch.zeros((cap, 4), dtype=torch.int32, device=dev)
    src[kp, :3] = meta_r[kept, :3]
    out = {"recv_x": recv_x, "recv_x_scales": None, "recv_src": src, "recv_topk_idx": None,
           "recv_topk_weights": None, "num_recv_tokens_per_expert": count, "recv_expert_offset": offset,
           "num_recv_rows": torch.tensor([n_rows], dtype=torch.int32, device=dev)}
    if scales_r is not None:
        out["recv_x_scales"] = torch.zeros((cap, v.hidden // FP8_BLOCK), dtype=torch.float32, device=dev)
        out["recv_x_scales"][kp] = scales_r[kept]
    if v.layout == "rank":
        out["recv_topk_idx"] = torch.zeros((cap, K), dtype=torch.int32, device=dev)
        out["recv_topk_idx"][kp] = meta_r[kept, 4:]
    if w_r is not None:
        shape = (cap, K) if v.layout == "rank" else (cap,)
        wz = torch.zeros(shape, dtype=torch.float32, device=dev)
        wk = w_r[kept] if v.layout == "rank" else w_r[kept, 0]
        out["recv_topk_weights"] = wz.index_put((kp,), wk)
        plan.recv_w = w_r[:, 0] if v.layout == "expert" else None
    return plan, out


def combine(v, group, plan, y, topk_weights=None, exact=True):
    """This rank's combine of y [capacity, hidden] (combine dtype, aligned
    with the dispatch's rows) after dispatch(...) gave plan: out
    [T, hidden] in the combine dtype, summed in the order and with the
    roundings of DESIGN.md "Semantics". exact=False: differentiable fp32
    arithmetic (w * y + acc rounded twice, any order of the k within a
    rank)."""
    if exact:
        with torch.no_grad():
            return _combine(v, group, plan, y, topk_weights, True)
    return _combine(v, group, plan, y, topk_weights, False)


def _combine(v, group, plan, y, topk_weights, exact):
    W = dist.get_world_size(group)
    K, dev, cdt = v.topk, y.device, TORCH_DTYPES[v.combine_dtype]
    fma = _fma(exact)
    kept, pos = plan.recv_kept, plan.recv_pos.clamp(min=0)
    back = torch.where(kept[:, None], y[pos].float(), torch.zeros((), device=dev))
    T = plan.T
    acc = torch.zeros((T, v.hidden), dtype=torch.float32, device=dev)
    if v.layout == "expert" and v.combine_order == "rank":
        # Each rank sums its rows of a token (ascending k), rounds once, and
        # sends one row per token back.
        meta = plan.recv_meta
        key = meta[:, 0].long() * (1 << 32) + meta[:, 1].long()
        groups, gid = torch.unique(key, sorted=True, return_inverse=True)
        part = torch.zeros((groups.shape[0], v.hidden), dtype=torch.float32, device=dev)
        w = plan.recv_w if v.weights else torch.ones(meta.shape[0], device=dev)
        # Every k, empty ones too: a rank without rows must still reach y in
        # the autograd graph, or its backward skips the collective the
        # peers' backward waits in.
        for k in range(K):
            sel = (meta[:, 2] == k).nonzero()[:, 0]
            g = gid[sel]
            part = part.index_copy(0, g, fma(w[sel, None].expand(-1, v.hidden), back[sel], part[g]))
        part = part.to(cdt)
        g_src = (groups >> 32).tolist()
        send_counts = [g_src.count(p) for p in range(W)]
        recv_counts = _a2a(group, torch.tensor(send_counts, device=dev), [1] * W, [1] * W, False).tolist()
        tokens = _a2a(group, (groups & 0xFFFFFFFF).int(), send_counts, recv_counts, False).long()
        rows = _a2a(group, part.float(), send_counts, recv_counts, not exact)
        start = 0
        for p in range(W):
            t = tokens[start:start + recv_counts[p]]
            acc = acc.index_add(0, t, rows[start:start + recv_counts[p]])
            start += recv_counts[p]
        return acc.to(cdt)
    rows = _a2a(group, back, plan.recv_counts, plan.send_counts, not exact)
    if v.layout == "rank":
        start = 0
        for p in range(W):
            n = plan.send_counts[p]
            acc = acc.index_add(0, plan.send_t[start:start + n], rows[start:start + n])
            start += n
        return acc.to(cdt)
    # Layout expert in k order: fmaf over the valid k of a token, ascending.
    # (Every k, empty ones too: a rank without tokens still reaches rows in
    # the autograd graph, so its backward joins the peers' all_to_all.)
    for k in range(K):
        sel = (plan.send_k == k).nonzero()[:, 0]
        t = plan.send_t[sel]
        w = topk_weights[t, k].float()[:, None] if v.weights else torch.ones((sel.numel(), 1), device=dev)
        acc = acc.index_copy(0, t, fma(w.expand(-1, v.hidden), rows[sel], acc[t]))
    return acc.to(cdt)
