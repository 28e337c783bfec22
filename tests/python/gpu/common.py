"""What the distributed tests share: the run's process group and device
(made once, at pytest's start), the default spec's variants of this
world, and the inputs and references the tests compare against."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
# The checkout's package, unless the run tests an installed one
# (scripts/device-run.sh's python step).
if not os.environ.get("SYMMGEN_TEST_INSTALLED"):
    sys.path.insert(0, os.path.join(ROOT, "python"))

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the CPU-only CI
    torch = None

BACKEND = os.environ.get("SYMMGEN_TEST_BACKEND") or None
WHY_NOT = None
if torch is None:
    WHY_NOT = "skipped: torch is not installed"
elif "RANK" not in os.environ:
    WHY_NOT = "skipped: not under torchrun (scripts/test-python-gpu.sh starts these tests)"
elif BACKEND != "reference" and not torch.cuda.is_available():
    WHY_NOT = "skipped: no GPU"


class Env:
    """The run's process group, device and options, made once."""
    group = ctl = device = world = None
    size = rank = 0


ENV = Env()


def start():
    if WHY_NOT or ENV.group is not None:
        return
    from datetime import timedelta
    local = int(os.environ.get("LOCAL_RANK", "0"))
    size = int(os.environ["WORLD_SIZE"])
    if BACKEND == "reference" and not torch.cuda.is_available():
        ENV.device = torch.device("cpu")
        kind = "gloo"
    else:
        ngpu = torch.cuda.device_count()
        ENV.device = torch.device("cuda", local % ngpu)
        torch.cuda.set_device(ENV.device)
        kind = os.environ.get("SYMMGEN_TEST_GROUP") or ("nccl" if ngpu >= size else "gloo")
    timeout = timedelta(seconds=float(os.environ.get("SYMMGEN_TEST_TIMEOUT", "120")))
    dist.init_process_group(kind, timeout=timeout, device_id=ENV.device if kind == "nccl" else None)
    ENV.group = dist.group.WORLD
    ENV.ctl = dist.new_group(backend="gloo", timeout=timeout)
    ENV.rank, ENV.size = dist.get_rank(), dist.get_world_size()
    if BACKEND != "reference":
        import symmgen
        ENV.world = symmgen.World(ENV.group)
    if ENV.rank == 0:
        print(f"\n[symmgen tests] world {ENV.size}, {kind} group, device {ENV.device}, "
              f"backend {BACKEND or 'native'}", flush=True)


def default_manifest_path():
    from symmgen import spec
    return spec.generate(spec_path=os.path.join(ROOT, "specs", "default.lua"))


def variants_of_this_world():
    """The names of specs/default.lua's variants of this run's world (at
    collection; the manifest comes from symmgen, through the cache)."""
    if WHY_NOT:
        return ["none"]
    from symmgen import manifest
    m = manifest.load(default_manifest_path())
    return [n for n, v in m.variants.items() if v.world == int(os.environ["WORLD_SIZE"])]




# --- inputs and references ------------------------------------------------------

def make_inputs(v, tokens, seed, s, invalid=True):
    """Rank s's dispatch input (CPU tensors), the same on every rank: x
    (values within fp8's range), int32 topk_idx (distinct experts; with
    invalid: row 1 has a -1, row 2 a repeat, row 3 an id past the last
    expert), float32 topk_weights and fp8 scales."""
    from symmgen.torch_ref import TORCH_DTYPES
    g = torch.Generator().manual_seed(seed * 1000 + s)
    x = (torch.randn(tokens, v.hidden, generator=g) * 4).to(TORCH_DTYPES[v.dtype])
    idx = torch.stack([torch.randperm(v.experts, generator=g)[:v.topk] for _ in range(tokens)]) \
        if tokens else torch.zeros((0, v.topk), dtype=torch.long)
    idx = idx.to(torch.int32)
    if invalid and tokens > 3:
        idx[1, 0] = -1
        if v.topk > 1:
            idx[2, v.topk - 1] = idx[2, 0]
        idx[3, 0] = v.experts + 3
    w = torch.rand(tokens, v.topk, generator=g)
    scales = torch.rand(tokens, v.hidden // 128, generator=g) + 0.5 if v.dtype == "fp8_e4m3" else None
    return {"x": x, "topk_idx": idx, "topk_weights": w if v.weights else None, "x_scales": scales}


def on(device, inputs):
    return {k: (t.to(device) if t is not None else None) for k, t in inputs.items()}


def host_bytes(t):
    return None if t is None else t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def from_bytes(buf, dtype, shape):
    if not len(buf):  # a rank without tokens (torch.frombuffer refuses an empty buffer)
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(buf), dtype=torch.uint8).view(dtype).view(shape)


def cpu_reference(v, world_inputs):
    """libsymm's CPU reference over every rank's input: (cfg, inputs,
    result, recv) with recv[p] rank p's results as tensors named as in
    DispatchResult."""
    from symmgen import ref
    from symmgen.torch_ref import TORCH_DTYPES
    cfg = ref.Config.from_variant(v)
    rin = [ref.Input(i["x"].shape[0], host_bytes(i["x"]), host_bytes(i["topk_idx"]), host_bytes(i["topk_weights"]),
                     host_bytes(i["x_scales"])) for i in world_inputs]
    res = ref.dispatch(cfg, rin)
    recv = []
    cap, L = cfg.rows, cfg.local_experts
    for r in res.recv:
        d = {"recv_x": from_bytes(r.x, TORCH_DTYPES[v.dtype], (cap, v.hidden)),
             "recv_src": from_bytes(r.src, torch.int32, (cap, 4)),
             "num_recv_tokens_per_expert": from_bytes(r.expert_count, torch.int32, (L,)),
             "num_recv_rows": torch.tensor([r.rows], dtype=torch.int32)}
        if v.layout == "expert":
            d["recv_expert_offset"] = from_bytes(r.expert_offset, torch.int32, (L,))
        else:
            d["recv_topk_idx"] = from_bytes(r.topk_idx, torch.int32, (cap, v.topk))
        if v.weights:
            d["recv_topk_weights"] = from_bytes(r.weights, torch.float32, (cap, v.topk) if v.layout == "rank" else (cap,))
        if v.dtype == "fp8_e4m3":
            d["recv_x_scales"] = from_bytes(r.scales, torch.float32, (cap, v.hidden // 128))
        recv.append(d)
    return cfg, rin, res, recv


def cpu_combine(v, cfg, rin, res, ys):
    """The CPU reference's combine of every rank's y (CPU tensors)."""
    from symmgen import ref
    from symmgen.torch_ref import TORCH_DTYPES
    outs = ref.combine(cfg, rin, res, [host_bytes(y) for y in ys])
    return [from_bytes(o, TORCH_DTYPES[v.combine_dtype], (i.tokens, v.hidden)) for o, i in zip(outs, rin)]


def valid_rows(v, result):
    """[capacity] bool (CPU) of the rows a dispatch wrote, from its counts."""
    cap = v.capacity
    count = result["num_recv_tokens_per_expert"].cpu()
    rows = int(result["num_recv_rows"].reshape(-1)[0])
    r = torch.arange(cap)
    if v.layout == "rank":
        return r < rows
    offset = result["recv_expert_offset"].cpu()
    return ((r[None] >= offset[:, None].long()) & (r[None] < (offset + count)[:, None].long())).any(0)


def expert(recv_x, p, combine_dtype):
    """The tests' expert: y = recv_x * (1.5 + p), one rounding, the same on
    the CPU and the GPU."""
    return (recv_x.float() * (1.5 + p)).to(combine_dtype)


def assert_bitwise(got, want, what):
    """got == want bit for bit (CPU copies compared as bytes)."""
    g, w = got.detach().cpu().contiguous(), want.detach().cpu().contiguous()
    assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: {g.dtype}{tuple(g.shape)} vs {w.dtype}{tuple(w.shape)}"
    if g.numel() == 0:  # no rows (a call with 0 tokens): nothing else to compare
        return
    gb, wb = g.view(torch.uint8).reshape(g.shape[0] if g.dim() else 1, -1), w.view(torch.uint8).reshape(
        w.shape[0] if w.dim() else 1, -1)
    bad = (gb != wb).any(-1).nonzero()
    assert bad.numel() == 0, (f"{what}: {bad.numel()} of {gb.shape[0]} rows differ, first row {int(bad[0])}: "
                              f"got {g[int(bad[0])].flatten()[:8].tolist()}, want {w[int(bad[0])].flatten()[:8].tolist()}")


def compare_results(v, got, want, what):
    """Every result of a dispatch, on the rows it wrote (both dicts of
    tensors named as in DispatchResult)."""
    for key in ("num_recv_rows", "num_recv_tokens_per_expert", "recv_expert_offset"):
        if want.get(key) is not None:
            assert_bitwise(got[key], want[key], f"{what}: {key}")
    mask = valid_rows(v, want)
    for key in ("recv_x", "recv_x_scales", "recv_src", "recv_topk_idx", "recv_topk_weights"):
        if want.get(key) is not None:
            assert got[key] is not None, f"{what}: {key} missing"
            assert_bitwise(got[key].cpu()[mask], want[key].cpu()[mask], f"{what}: {key}")


def result_dict(r):
    return {k: getattr(r, k) for k in r._fields}
