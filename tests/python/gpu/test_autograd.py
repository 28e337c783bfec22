"""Backward through dispatch and combine against PyTorch autograd of the
all_to_all_single reference (symmgen.torch_ref, exact=False): the
gradients of x, of the top-k weights (layout expert: through combine's
weighting; layout rank: through recv_topk_weights) and of an expert
parameter; forward values bit for bit as without autograd."""
import pytest

from common import (ENV, assert_bitwise, make_inputs, on, torch, variants_of_this_world)

VARIANTS = variants_of_this_world()


def trainable(name):
    from symmgen import manifest
    from common import default_manifest_path
    v = manifest.load(default_manifest_path()).variant(name)
    return v.dtype == v.combine_dtype and v.dtype != "fp8_e4m3"


TRAINABLE = [n for n in VARIANTS if n == "none" or trainable(n)]
REFUSED = [n for n in VARIANTS if n != "none" and not trainable(n)]
TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-4} if torch else {}


def expert(v, recv_x, recv_topk_weights, scale, dtype):
    """A differentiable expert: rows times a learnt scale (and, for layout
    rank with weights, times 1 + the row's received weights, so that their
    gradient flows back through dispatch)."""
    y = recv_x * scale.to(recv_x.dtype)
    if v.layout == "rank" and v.weights:
        y = y * (1 + recv_topk_weights.sum(1, keepdim=True)).to(y.dtype)
    return y.to(dtype)


def leaves(v, mine, x_grad=True):
    x = mine["x"].float().clone().requires_grad_(x_grad)
    w = mine["topk_weights"].clone().requires_grad_() if v.weights else None
    scale = torch.tensor(1.25, device=ENV.device, requires_grad=True)
    return x, w, scale


def ours(buf, mine, x, w, scale, layers=1):
    h = x
    for _ in range(layers):
        r = buf.dispatch(h.to(buf.dtype), mine["topk_idx"], w)
        out = buf.combine(expert(buf.variant, r.recv_x, r.recv_topk_weights, scale, buf.combine_dtype))
        h = h + out.float() if layers > 1 else out
    return h


def reference(buf, mine, x, w, scale, layers=1, exact=False):
    from symmgen import torch_ref
    v, h = buf.variant, x
    for _ in range(layers):
        plan, rec = torch_ref.dispatch(v, ENV.group, h.to(buf.dtype), mine["topk_idx"], w, exact=exact)
        y = expert(v, rec["recv_x"], rec.get("recv_topk_weights"), scale, buf.combine_dtype)
        out = torch_ref.combine(v, ENV.group, plan, y, w, exact=exact)
        h = h + out.float() if layers > 1 else out
    return h


def close(got, want, dtype, what):
    tol = TOL[dtype]
    # (A rank may have no tokens: [29, 48, 0, 61] at world 4.)
    scale = (want.abs().max().item() if want.numel() else 0.0) or 1.0
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale, msg=lambda m: f"{what}: {m}")


def run_both(buf, mine, layers=1, x_grad=True):
    g = torch.randn((mine["x"].shape[0], buf.hidden), generator=torch.Generator().manual_seed(7 + ENV.rank))
    g = g.to(ENV.device)
    x, w, scale = leaves(buf.variant, mine, x_grad)
    out = ours(buf, mine, x, w, scale, layers)
    (out.float() * g).sum().backward()
    xr, wr, sr = leaves(buf.variant, mine, x_grad)
    out_r = reference(buf, mine, xr, wr, sr, layers)
    (out_r.float() * g).sum().backward()
    return (out, x, w, scale), (out_r, xr, wr, sr)


@pytest.mark.parametrize("name", TRAINABLE)
def test_gradients_match_reference_autograd(name, buffers):
    buf = buffers(name)
    v = buf.variant
    mine = on(ENV.device, make_inputs(v, [29, 48, 0, 61][ENV.rank % 4], seed=11, s=ENV.rank))
    (out, x, w, scale), (out_r, xr, wr, sr) = run_both(buf, mine)
    with torch.no_grad():
        exact = reference(buf, mine, x.detach(), w.detach() if w is not None else None, scale.detach(), exact=True)
    assert_bitwise(out, exact, f"{name}: forward with autograd vs the exact reference")
    close(out.float(), out_r.float(), buf.dtype, f"{name}: forward")
    close(x.grad, xr.grad, buf.dtype, f"{name}: grad of x")
    close(scale.grad, sr.grad, buf.dtype, f"{name}: grad of the expert's scale")
    if w is not None:
        close(w.grad, wr.grad, torch.float32 if buf.dtype == torch.float32 else buf.dtype,
              f"{name}: grad of topk_weights")


@pytest.mark.parametrize("name", [n for n in TRAINABLE if n.startswith(("bf16_rank_w", "fp16_expert_a8_pull",
                                                                          "bf16_expert_w", "none"))])
def test_expert_only_gradients_and_two_layers(name, buffers):
    buf = buffers(name)
    mine = on(ENV.device, make_inputs(buf.variant, 24, seed=12, s=ENV.rank))
    # x needs no gradient: combine's backward closes the dispatch it makes.
    (out, x, w, scale), (out_r, xr, wr, sr) = run_both(buf, mine, x_grad=False)
    close(scale.grad, sr.grad, buf.dtype, f"{name}: grad of the scale, x without grad")
    # Two layers on one buffer: the backward's calls alternate and the
    # first layer's saved rows are owned copies.
    (out, x, w, scale), (out_r, xr, wr, sr) = run_both(buf, mine, layers=2)
    close(x.grad, xr.grad, buf.dtype, f"{name}: grad of x through two layers")
    close(scale.grad, sr.grad, buf.dtype, f"{name}: grad of the scale through two layers")
    with torch.no_grad():  # the variant is back to a clean alternation
        r = buf.dispatch(mine["x"], mine["topk_idx"], mine["topk_weights"])
        buf.combine(r.recv_x.to(buf.combine_dtype))


@pytest.mark.parametrize("name", REFUSED or ["none"])
def test_autograd_refused_before_anything_is_queued(name, buffers):
    if name == "none":
        pytest.skip("every variant of this world can be trained")
    buf = buffers(name)
    mine = on(ENV.device, make_inputs(buf.variant, 8, seed=13, s=ENV.rank))
    x = mine["x"].float().requires_grad_() if buf.dtype != torch.float8_e4m3fn else None
    w = mine["topk_weights"].clone().requires_grad_() if buf.variant.weights else None
    if x is None and w is None:
        pytest.skip("nothing of this variant's input can require grad")
    with pytest.raises(NotImplementedError, match="dtype == combine_dtype"):
        buf.dispatch(x.to(buf.dtype) if x is not None else mine["x"], mine["topk_idx"], w, mine["x_scales"])
    with torch.no_grad():
        r = buf.dispatch(mine["x"], mine["topk_idx"], mine["topk_weights"], mine["x_scales"])
        buf.combine(r.recv_x.float().to(buf.combine_dtype))
