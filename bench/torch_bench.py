"""torch_bench.py: what the PyTorch package costs over the C library, and
what a PyTorch user has without either, at decode shapes.

    torchrun --nproc-per-node 2 bench/torch_bench.py [--variants NAME,...] [--out FILE]

For each variant of specs/bench.lua named (default the DeepSeek-V3 decode
rows (b) and (g): T = 128, hidden 7168, top-8 of 256 experts, bf16):
  host us per call   the host time of one call issued back to back (no
                     synchronisation inside the loop): the C functions
                     through ctypes (the ctypes call itself is "ffi"),
                     symmgen.Buffer's eager dispatch/combine, and the
                     torch.library ops; "overhead" is the eager call over
                     the C call (the target is at most 5 us)
  GPU us per pair    a dispatch and its combine: eager, and replayed from a
                     CUDA graph of 20 pairs captured from Python and from
                     the C calls (the two should agree within noise)
  all_to_all         the same dispatch and combine written with
                     torch.distributed.all_to_all_single (routing on the
                     host: one synchronisation per call), wall us per pair
Two GPUs: a rank each, an nccl group. One GPU: both ranks on it, a gloo
group (run it under CUDA MPS): a proxy for the host costs only, and the
all_to_all row goes through host memory."""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import symmgen
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import symmgen
from symmgen import _lib  # noqa: E402


def host_us(fn, iters, reps, ctl):
    """Median over reps of the host time per fn() in a loop of iters."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        dist.barrier(group=ctl)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        times.append((t1 - t0) / iters * 1e6)
    return statistics.median(times)


def gpu_us(fn, iters, reps, ctl, per=1):
    """Median over reps of the GPU time per fn() (CUDA events), divided by per."""
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        torch.cuda.synchronize()
        dist.barrier(group=ctl)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters / per)
    return statistics.median(times)


def wall_us(fn, iters, reps, ctl):
    """Median wall time per fn() with the GPU waited for (fn synchronises anyway)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        dist.barrier(group=ctl)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(times)


def inputs(v, tokens, device, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, v.hidden, generator=g).to(torch.bfloat16).to(device)
    idx = torch.stack([torch.randperm(v.experts, generator=g)[:v.topk] for _ in range(tokens)]).int().to(device)
    w = torch.rand(tokens, v.topk, generator=g).to(device)
    return x, idx, w


class AllToAll:
    """Dispatch and combine as a PyTorch user writes them with
    all_to_all_single: layout rank (each token once to each rank of its
    experts) or layout expert (once per (token, k)); the expert is the
    identity."""

    def __init__(self, v, group, host):
        self.v, self.group, self.host = v, group, host
        self.W = dist.get_world_size(group)

    def a2a(self, t, send, recv):
        dev = t.device
        if self.host:
            t = t.cpu()
        out = t.new_empty((sum(recv),) + tuple(t.shape[1:]))
        dist.all_to_all_single(out, t.contiguous(), recv, send, group=self.group)
        return out.to(dev)

    def pair(self, x, idx, w):
        v, W = self.v, self.W
        owner = idx.long() // (v.experts // W)
        if v.layout == "rank":
            goes = torch.zeros(x.shape[0], W, dtype=torch.bool, device=x.device)
            goes.scatter_(1, owner, True)
            nz = goes.t().nonzero()
            dest, tok = nz[:, 0], nz[:, 1]
            scale = None
        else:
            order = torch.sort(idx.reshape(-1).long(), stable=True).indices
            tok, dest = order // v.topk, owner.reshape(-1)[order]
            scale = w.reshape(-1)[order]
        send = torch.bincount(dest, minlength=W)
        recv = self.a2a(send, [1] * W, [1] * W)
        send, recv = send.tolist(), recv.tolist()
        rows = self.a2a(x[tok], send, recv)
        back = self.a2a(rows, recv, send).float()
        if scale is not None:
            back = back * scale[:, None]
        return torch.zeros(x.shape, dtype=torch.float32, device=x.device).index_add_(0, tok, back).to(x.dtype)


def measure(buf, args, ctl, host_collectives):
    v, dev = buf.variant, buf.device
    if v.dtype != "bf16" or v.combine_dtype != "bf16":
        raise SystemExit(f"torch_bench: {v.name}: {v.dtype} -> {v.combine_dtype}: this bench times bf16 variants")
    T = min(args.tokens, v.max_tokens)
    x, idx, w = inputs(v, T, dev, 1 + buf.rank)
    lib = _lib.lib()
    native = buf._backend
    stream = torch.cuda.current_stream().cuda_stream
    out = torch.empty((T, v.hidden), dtype=buf.combine_dtype, device=dev)
    y = buf._views["recv_x"] if buf.combine_buffer is None else buf.combine_buffer
    a = native._args
    a.tokens, a.tokens_dev, a.x, a.x_scales = T, None, x.data_ptr(), None
    a.topk_idx, a.topk_weights = idx.data_ptr(), w.data_ptr()
    handle, args_ref = native.handle, native._args_ref

    def c_pair():
        lib.symm_variant_dispatch(handle, args_ref, stream)
        lib.symm_variant_combine(handle, y.data_ptr(), out.data_ptr(), stream)

    def py_pair():
        r = buf.dispatch(x, idx, w)
        buf.combine(r.recv_x if buf.combine_buffer is None else buf.combine_buffer, out=out)

    def py_pair_alloc():
        r = buf.dispatch(x, idx, w)
        buf.combine(r.recv_x if buf.combine_buffer is None else buf.combine_buffer)

    def op_pair():
        torch.ops.symmgen.dispatch(buf._id, x, idx, w, None, None, *buf._mutable)
        o = torch.empty((T, v.hidden), dtype=buf.combine_dtype, device=dev)
        torch.ops.symmgen.combine(buf._id, y, o, buf._views["num_recv_rows"])

    res = {}
    with torch.no_grad():
        for _ in range(5):
            py_pair()
        res["ffi"] = host_us(lambda: lib.symm_clear_error(), args.iters, args.reps, ctl)
        res["c"] = host_us(c_pair, args.iters, args.reps, ctl) / 2
        res["python"] = host_us(py_pair, args.iters, args.reps, ctl) / 2
        res["python_alloc"] = host_us(py_pair_alloc, args.iters, args.reps, ctl) / 2
        res["op"] = host_us(op_pair, args.iters, args.reps, ctl) / 2
        res["eager_gpu"] = gpu_us(py_pair, args.iters, args.reps, ctl)
        # Graphs of 20 pairs, from Python (the count on the device) and from C.
        full = x if T == v.max_tokens else torch.zeros((v.max_tokens, v.hidden), dtype=x.dtype, device=dev)
        full_idx = idx if T == v.max_tokens else torch.full((v.max_tokens, v.topk), -1, dtype=torch.int32,
                                                             device=dev)
        full_w = w if T == v.max_tokens else torch.zeros((v.max_tokens, v.topk), device=dev)
        full[:T], full_idx[:T], full_w[:T] = x, idx, w
        count = torch.tensor([T], dtype=torch.int32, device=dev)
        full_out = out if T == v.max_tokens else torch.empty((v.max_tokens, v.hidden), dtype=out.dtype, device=dev)
        graphs = {}
        for kind in ("python", "c"):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                py_pair()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(20):
                    if kind == "python":
                        r = buf.dispatch(full, full_idx, full_w, num_tokens=count)
                        buf.combine(r.recv_x if buf.combine_buffer is None else buf.combine_buffer, out=full_out)
                    else:
                        s = torch.cuda.current_stream().cuda_stream
                        lib.symm_variant_dispatch(handle, args_ref, s)
                        lib.symm_variant_combine(handle, y.data_ptr(), out.data_ptr(), s)
            graphs[kind] = g
        res["graph_python"] = gpu_us(graphs["python"].replay, max(1, args.iters // 20), args.reps, ctl, per=20)
        res["graph_c"] = gpu_us(graphs["c"].replay, max(1, args.iters // 20), args.reps, ctl, per=20)
        a2a = AllToAll(v, buf.group, host_collectives)
        a2a.pair(x, idx, w)
        res["a2a"] = wall_us(lambda: a2a.pair(x, idx, w), max(1, args.iters // 10), args.reps, ctl)
    return T, res


ROWS = [("ffi", "ctypes call of an empty C function (host us)"),
        ("c", "C call, dispatch or combine (host us per call)"),
        ("python", "Buffer.dispatch / Buffer.combine(out=) eager (host us per call)"),
        ("python_alloc", "the same, combine allocating out (host us per call)"),
        ("overhead", "eager Python over C (host us per call; target <= 5)"),
        ("op", "torch.ops.symmgen.dispatch / combine (host us per call)"),
        ("eager_gpu", "eager dispatch + combine (GPU us per pair)"),
        ("graph_python", "CUDA graph from Python, 20 pairs (GPU us per pair)"),
        ("graph_c", "CUDA graph from the C calls, 20 pairs (GPU us per pair)"),
        ("a2a", "all_to_all_single dispatch + combine (wall us per pair)")]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default=os.path.join(ROOT, "specs", "bench.lua"))
    p.add_argument("--variants", default="bench_dsv3_decode,bench_dsv3_decode_expert")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = p.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    ngpu = torch.cuda.device_count()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % ngpu)
    torch.cuda.set_device(device)
    kind = "nccl" if ngpu >= world else "gloo"
    dist.init_process_group(kind, device_id=device if kind == "nccl" else None)
    ctl = dist.new_group(backend="gloo")
    world_ = symmgen.World()
    results = {}
    for name in args.variants.split(","):
        with symmgen.Buffer(world_, args.spec, name) as buf:
            T, res = measure(buf, args, ctl, kind == "gloo")
        res["overhead"] = res["python"] - res["c"]
        everyone = [None] * world
        dist.all_gather_object(everyone, res, group=ctl)
        results[name] = (T, everyone)
    world_.destroy()
    if dist.get_rank() == 0:
        names = list(results)
        lines = [f"torch_bench: {world} ranks, {torch.cuda.get_device_name(device)} x {ngpu}, {kind} group, "
                 f"torch {torch.__version__} (median of {args.reps}; rank 0 / rank 1)", "",
                 "| | " + " | ".join(f"{n} (T={results[n][0]})" for n in names) + " |",
                 "|---|" + "---|" * len(names)]
        for key, label in ROWS:
            cells = [" / ".join(f"{r[key]:.2f}" for r in results[n][1]) for n in names]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        worst = max(r["overhead"] for n in names for r in results[n][1])
        lines += ["", f"overhead of the eager Python call over the C call: at most {worst:.2f} us "
                      f"({'within' if worst <= 5 else 'ABOVE'} the 5 us target)"]
        text = "\n".join(lines)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
