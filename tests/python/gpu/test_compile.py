"""torch.compile(fullgraph=True) of a module that dispatches, runs an
expert and combines: traced without a graph break through the fake
implementations, and giving the eager results bit for bit (zero copy under
no_grad, owned copies, and a training step's forward and backward)."""
import shutil

import pytest

from common import ENV, assert_bitwise, make_inputs, on, torch, variants_of_this_world

# Layout rank, layout expert with weights and a capacity, a pulling combine:
# each compile costs seconds, so a few variants that between them take
# every path of the Python layer.
VARIANTS = [n for n in variants_of_this_world()
            if n == "none" or n.startswith(("bf16_rank_w", "fp16_expert_a8_cap", "bf16_rank_pull"))]
TRAINED = [n for n in VARIANTS if n == "none" or n.startswith("fp16_expert_a8_cap")]
# inductor needs a C compiler (triton builds its launcher with one); without
# one, dynamo's "eager" backend (the zero-copy path: fake tensors, no
# functionalization) and "aot_eager" (the owned ops and autograd) still
# trace everything through the fake implementations.
HAVE_CC = bool(shutil.which("gcc") or shutil.which("cc"))


class MoE(torch.nn.Module if torch else object):
    def __init__(self, buf, copy=None):
        super().__init__()
        self.buf, self.copy = buf, copy
        self.scale = torch.nn.Parameter(torch.tensor(1.25, device=ENV.device))

    def forward(self, x, topk_idx, topk_weights, x_scales):
        r = self.buf.dispatch(x, topk_idx, topk_weights, x_scales, copy=self.copy)
        y = (r.recv_x.float() * self.scale).to(self.buf.combine_dtype)
        if self.buf.combine_buffer is not None and self.copy is False:
            y = self.buf.combine_buffer.copy_(y)
        return self.buf.combine(y)


def compiled(module, training):
    torch._dynamo.reset()
    backend = "inductor" if HAVE_CC else ("aot_eager" if training else "eager")
    return torch.compile(module, fullgraph=True, backend=backend), backend


def args(buf, mine):
    return mine["x"], mine["topk_idx"], mine["topk_weights"], mine["x_scales"]


@pytest.mark.parametrize("name, copy", [(n, c) for n in VARIANTS for c in (False, True)
                                         if not (c and "pull" in n)])
def test_compiled_forward_equals_eager(name, copy, buffers):
    buf = buffers(name)
    mine = on(ENV.device, make_inputs(buf.variant, 40 + 7 * ENV.rank, seed=21, s=ENV.rank))
    moe = MoE(buf, copy=copy)
    fast, backend = compiled(moe, training=copy)
    with torch.no_grad():
        want = moe(*args(buf, mine)).clone()
        for _ in range(2):  # the second call runs the compiled graph as it is
            got = fast(*args(buf, mine))
    assert_bitwise(got, want, f"{name}: compiled ({backend}, copy={copy}) vs eager")


@pytest.mark.parametrize("name", TRAINED)
def test_compiled_training_step_equals_eager(name, buffers):
    buf = buffers(name)
    mine = on(ENV.device, make_inputs(buf.variant, 33, seed=22, s=ENV.rank))
    results = []
    for use_compile in (False, True):
        moe = MoE(buf)
        run, backend = compiled(moe, training=True) if use_compile else (moe, "eager")
        x = mine["x"].float().requires_grad_()
        w = mine["topk_weights"].clone().requires_grad_() if buf.variant.weights else None
        out = run(x.to(buf.dtype), mine["topk_idx"], w, None)
        out.float().square().sum().backward()
        results.append((out.detach(), x.grad, moe.scale.grad, w.grad if w is not None else None, backend))
    (o0, gx0, gs0, gw0, _), (o1, gx1, gs1, gw1, backend) = results
    assert_bitwise(o1, o0, f"{name}: compiled ({backend}) training forward")
    # inductor may keep a fused backward's intermediates in fp32 where eager
    # rounds them to the dtype: the gradients agree to the dtype's precision.
    tol = {torch.bfloat16: 1e-2, torch.float16: 1e-3, torch.float32: 1e-5}[buf.dtype]
    torch.testing.assert_close(gx1, gx0, rtol=tol, atol=tol * gx0.abs().max().item())
    torch.testing.assert_close(gs1, gs0, rtol=tol, atol=0)
    if gw0 is not None:
        torch.testing.assert_close(gw1, gw0, rtol=tol, atol=tol * gw0.abs().max().item())
