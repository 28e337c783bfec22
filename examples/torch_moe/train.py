"""A small Mixture-of-Experts layer trained with expert parallelism through
symmgen, beside the same model without it; their losses must match.

    torchrun --nproc-per-node 2 examples/torch_moe/train.py [--steps 5]

Each rank holds experts/world of the experts (expert parallel) and its own
batch of tokens. A router picks the top-k experts of each token;
symmgen's dispatch sends the token to them (layout expert: rows grouped by
local expert, as a grouped GEMM wants them), each expert runs on its
segment, and combine brings the outputs back, weighted by the router.
The reference model holds every expert on every rank and computes the
same layer locally; both train with SGD on the sum of the ranks' losses.
On one GPU the two ranks share it (a gloo group; best under CUDA MPS)."""
import argparse
import os
import sys

import torch
import torch.distributed as dist

try:
    import symmgen
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import symmgen

HIDDEN, EXPERTS, TOPK, TOKENS = 256, 8, 2, 96


def route(router, x):
    """Top-k experts of each token and their renormalised weights."""
    probs = torch.softmax(x @ router, dim=-1)
    weights, idx = torch.topk(probs, TOPK, dim=-1)
    return idx, weights / weights.sum(-1, keepdim=True)


def moe_parallel(buf, router, experts, x):
    """The layer with this rank's experts: dispatch, a loop over the local
    experts' segments, combine."""
    idx, weights = route(router, x)
    r = buf.dispatch(x, idx, weights)
    counts = r.num_recv_tokens_per_expert.tolist()   # the loop below needs them on the host
    offsets = r.recv_expert_offset.tolist()
    y = torch.zeros_like(r.recv_x)
    for j, (start, n) in enumerate(zip(offsets, counts)):
        y[start:start + n] = torch.relu(r.recv_x[start:start + n] @ experts[j])
    return x + buf.combine(y)


def moe_local(router, experts, x):
    """The same layer with every expert here: out[t] = sum over k of
    w[t, k] * expert_{idx[t, k]}(x[t])."""
    idx, weights = route(router, x)
    out = torch.zeros_like(x)
    for k in range(TOPK):
        y = torch.relu(torch.einsum("th,thg->tg", x, experts[idx[:, k]]))
        out = out + weights[:, k:k + 1] * y
    return x + out


def train(group, device, steps=5, lr=0.5, backend=None):
    """Train both models for steps; returns their losses (sums over ranks)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    local = EXPERTS // world
    g = torch.Generator().manual_seed(0)
    router0 = torch.randn(HIDDEN, EXPERTS, generator=g) / HIDDEN ** 0.5
    experts0 = torch.randn(EXPERTS, HIDDEN, HIDDEN, generator=g) / HIDDEN ** 0.5
    data = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(TOKENS, HIDDEN, generator=data).to(device)
    target = torch.randn(TOKENS, HIDDEN, generator=data).to(device)

    # Expert parallel: this rank's experts only.
    router = router0.clone().to(device).requires_grad_()
    mine = experts0[rank * local:(rank + 1) * local].clone().to(device).requires_grad_()
    # Reference: every expert, replicated.
    router_ref = router0.clone().to(device).requires_grad_()
    every = experts0.clone().to(device).requires_grad_()

    spec = {"name": "torch_moe", "hidden": HIDDEN, "topk": TOPK, "experts": EXPERTS, "max_tokens": TOKENS,
            "dtype": "fp32", "layout": "expert"}
    losses, losses_ref = [], []
    with symmgen.Buffer(group, spec, backend=backend) as buf:
        for _ in range(steps):
            loss = (moe_parallel(buf, router, mine, x) - target).square().mean()
            loss.backward()
            loss_ref = (moe_local(router_ref, every, x) - target).square().mean()
            loss_ref.backward()
            both = torch.stack([loss.detach(), loss_ref.detach()])
            dist.all_reduce(both, group=group)
            losses.append(both[0].item())
            losses_ref.append(both[1].item())
            # Replicated parameters: the gradient of the sum over ranks.
            for p in (router, router_ref, every):
                dist.all_reduce(p.grad, group=group)
            with torch.no_grad():
                for p in (router, mine, router_ref, every):
                    p -= lr * p.grad
                    p.grad = None
    return losses, losses_ref


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--backend", default=None, help="symmgen backend: native (default), nccl or reference")
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        group_kind = "nccl" if torch.cuda.device_count() >= world else "gloo"
    else:
        device, group_kind = torch.device("cpu"), "gloo"
    dist.init_process_group(group_kind)
    losses, losses_ref = train(dist.group.WORLD, device, args.steps, backend=args.backend)
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, losses_ref))
    if dist.get_rank() == 0:
        for step, (a, b) in enumerate(zip(losses, losses_ref)):
            print(f"step {step}: loss {a:.6f} (expert parallel) {b:.6f} (reference)")
        print(f"torch_moe: {'losses match' if worst < 1e-4 else 'LOSSES DIFFER'} "
              f"(largest relative difference {worst:.2e}, {world} ranks, {group_kind} group)")
    dist.destroy_process_group()
    sys.exit(0 if worst < 1e-4 else 1)


if __name__ == "__main__":
    main()
