"""checks.py: dispatch's and combine's argument checks and their messages,
on stand-ins for tensors (no torch)."""
import pytest

from symmgen import checks

DT = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp8_e4m3": "fp8", "int32": "int32", "int64": "int64"}
DEV = "cuda:0"


class T:
    """What the checks read of a tensor."""

    def __init__(self, shape, dtype, device=DEV, contiguous=True, ptr=4096):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device
        self._contiguous, self._ptr = contiguous, ptr

    def is_contiguous(self):
        return self._contiguous

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return (1, self.shape[0])

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n


@pytest.fixture
def rank(default_manifest):
    return default_manifest.variant("bf16_rank_w2")  # hidden 4096, topk 4, max_tokens 256, weights


def args(T_=8, **over):
    a = {"x": T((T_, 4096), "bf16"), "topk_idx": T((T_, 4), "int32"), "topk_weights": T((T_, 4), "fp32"),
         "x_scales": None, "num_tokens": None}
    a.update(over)
    return a


def call(v, **kw):
    a = args(**kw) if "a" not in kw else kw["a"]
    return checks.dispatch(v, DEV, DT, a["x"], a["topk_idx"], a["topk_weights"], a["x_scales"], a["num_tokens"])


def raises(error, text, v, a):
    with pytest.raises(error) as e:
        checks.dispatch(v, DEV, DT, a["x"], a["topk_idx"], a["topk_weights"], a["x_scales"], a["num_tokens"])
    assert str(e.value) == text
    return e


def test_valid_call_returns_rows(rank):
    assert call(rank) == 8
    assert call(rank, T_=0) == 0
    assert call(rank, a=args(topk_idx=T((8, 4), "int64"))) == 8
    assert call(rank, a=args(num_tokens=T((1,), "int32"))) == 8


def test_wrong_dtype(rank):
    raises(TypeError, "bf16_rank_w2 dispatch: x: got dtype fp16, expected bf16", rank, args(x=T((8, 4096), "fp16")))
    raises(TypeError, "bf16_rank_w2 dispatch: topk_idx: got dtype fp32, expected int32 or int64", rank,
           args(topk_idx=T((8, 4), "fp32")))
    raises(TypeError, "bf16_rank_w2 dispatch: topk_weights: got dtype bf16, expected fp32", rank,
           args(topk_weights=T((8, 4), "bf16")))


def test_not_a_tensor(rank):
    raises(TypeError, "bf16_rank_w2 dispatch: topk_idx: got list, expected a tensor", rank, args(topk_idx=[[0]]))
    raises(TypeError, "bf16_rank_w2 dispatch: x: got NoneType, expected a tensor", rank, args(x=None))


def test_wrong_device(rank):
    raises(ValueError, "bf16_rank_w2 dispatch: x: got a tensor on cpu, expected cuda:0", rank,
           args(x=T((8, 4096), "bf16", device="cpu")))
    raises(ValueError, "bf16_rank_w2 dispatch: topk_idx: got a tensor on cuda:1, expected cuda:0", rank,
           args(topk_idx=T((8, 4), "int32", device="cuda:1")))


def test_wrong_shape(rank):
    raises(ValueError, "bf16_rank_w2 dispatch: x: got shape [8, 1024], expected [8, 4096]", rank,
           args(x=T((8, 1024), "bf16")))
    raises(ValueError, "bf16_rank_w2 dispatch: x: got shape [4096], expected [*, 4096]", rank,
           args(x=T((4096,), "bf16")))
    raises(ValueError, "bf16_rank_w2 dispatch: topk_idx: got shape [8, 2], expected [8, 4]", rank,
           args(topk_idx=T((8, 2), "int32")))
    raises(ValueError, "bf16_rank_w2 dispatch: topk_weights: got shape [7, 4], expected [8, 4]", rank,
           args(topk_weights=T((7, 4), "fp32")))


def test_too_many_tokens(rank):
    raises(ValueError, "bf16_rank_w2 dispatch: x: got 257 tokens (shape [257, 4096]), expected at most "
           "max_tokens = 256", rank, args(T_=257))


def test_contiguity_and_alignment(rank):
    e = raises(ValueError, "bf16_rank_w2 dispatch: x: got a non-contiguous tensor (strides (1, 8)), expected a "
               "contiguous one (call .contiguous())", rank, args(x=T((8, 4096), "bf16", contiguous=False)))
    assert e.type is ValueError
    raises(ValueError, "bf16_rank_w2 dispatch: x: address 0x1002 is not a multiple of 16 bytes, expected 16-byte "
           "alignment (a view that starts mid-row?)", rank, args(x=T((8, 4096), "bf16", ptr=0x1002)))


def test_weights_and_scales_presence(rank, default_manifest):
    raises(ValueError, "bf16_rank_w2 dispatch: topk_weights: got None, expected a [8, 4] fp32 tensor (the variant "
           "carries weights)", rank, args(topk_weights=None))
    nw = default_manifest.variant("fp16_rank_w2")  # weights = false, hidden 1024, topk 2
    raises(ValueError, "fp16_rank_w2 dispatch: topk_weights: got a tensor, expected None (the variant has weights "
           "= false)", nw, args(x=T((8, 1024), "fp16"), topk_idx=T((8, 2), "int32"), topk_weights=T((8, 2), "fp32")))
    fp8 = default_manifest.variant("fp8_rank_w2")
    a = args(x=T((8, 4096), "fp8"))
    raises(ValueError, "fp8_rank_w2 dispatch: x_scales: got None, expected [8, 32] fp32 scales (dtype fp8_e4m3)",
           fp8, a)
    a["x_scales"] = T((8, 16), "fp32")
    raises(ValueError, "fp8_rank_w2 dispatch: x_scales: got shape [8, 16], expected [8, 32]", fp8, a)
    a["x_scales"] = T((8, 32), "fp32")
    assert checks.dispatch(fp8, DEV, DT, a["x"], a["topk_idx"], a["topk_weights"], a["x_scales"], None) == 8
    raises(ValueError, "bf16_rank_w2 dispatch: x_scales: got a tensor, expected None (dtype bf16 has no scales)",
           rank, args(x_scales=T((8, 32), "fp32")))


def test_num_tokens(rank):
    raises(TypeError, "bf16_rank_w2 dispatch: num_tokens: got int, expected None or a one-element int32 tensor "
           "on cuda:0 (for a count known on the host, slice x and topk_idx)", rank, args(num_tokens=5))
    raises(TypeError, "bf16_rank_w2 dispatch: num_tokens: got dtype fp32, expected int32 or int64", rank,
           args(num_tokens=T((1,), "fp32")))
    raises(ValueError, "bf16_rank_w2 dispatch: num_tokens: got shape [2], expected one element", rank,
           args(num_tokens=T((2,), "int32")))
    raises(ValueError, "bf16_rank_w2 dispatch: num_tokens: got a tensor on cpu, expected cuda:0", rank,
           args(num_tokens=T((1,), "int32", device="cpu")))


def test_combine(rank):
    y = T((rank.capacity, 4096), "bf16")
    checks.combine(rank, DEV, DT, y, True)
    with pytest.raises(RuntimeError, match="bf16_rank_w2 combine: no dispatch to combine"):
        checks.combine(rank, DEV, DT, y, False)
    with pytest.raises(ValueError, match=r"bf16_rank_w2 combine: y: got shape \[8, 4096\], expected \[512, 4096\]"):
        checks.combine(rank, DEV, DT, T((8, 4096), "bf16"), True)
    with pytest.raises(TypeError, match="bf16_rank_w2 combine: y: got dtype fp32, expected bf16"):
        checks.combine(rank, DEV, DT, T((512, 4096), "fp32"), True)
    with pytest.raises(RuntimeError, match="the previous dispatch has not been combined"):
        checks.alternation(rank, True)
    checks.alternation(rank, False)


def test_world_and_autograd(rank, default_manifest):
    with pytest.raises(ValueError, match="variant bf16_rank_w2: world 2, but the process group has 4 ranks: "
                                         "expected a variant generated for world 4"):
        checks.world(rank, 4)
    checks.world(rank, 2)
    checks.autograd(rank)
    with pytest.raises(NotImplementedError, match=r"needs dtype == combine_dtype \(got bf16 and fp32\)"):
        checks.autograd(default_manifest.variant("bf16_rank_out_fp32_w2"))
    with pytest.raises(NotImplementedError, match=r"got fp8_e4m3 and bf16"):
        checks.autograd(default_manifest.variant("fp8_rank_w2"))
