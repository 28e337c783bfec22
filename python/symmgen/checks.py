"""checks.py: the argument checks of dispatch and combine, raised before
anything is queued, each naming the argument, what it got and what was
expected:

    bf16_rank_w2 dispatch: x: got dtype torch.float16, expected torch.bfloat16

The checks read only what any tensor type has (dtype, shape, device,
is_contiguous(), data_ptr()), so they run without torch on stand-ins
(tests/python/cpu/test_checks.py); the torch layer passes torch tensors
and a table from the manifest's dtype names to torch dtypes. Wrong dtype
or a non-tensor: TypeError; wrong shape, device, contiguity, alignment or
a token count out of range: ValueError; calls out of order: RuntimeError.
Nothing here needs torch."""


def _shape_text(shape):
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def tensor(where, name, t, dtypes, shape, device, align=0, traced=False):
    """Check one tensor argument. dtypes: the accepted dtypes (the first is
    the one named in the message); shape: a tuple of sizes, None for any;
    align: bytes its address must be a multiple of (0: none). traced: under
    torch.compile, where t is known to be a tensor and has no address yet
    (libsymm checks the alignment when the op runs)."""
    if not traced and not (hasattr(t, "dtype") and hasattr(t, "shape") and hasattr(t, "data_ptr")):
        raise TypeError(f"{where}: {name}: got {type(t).__name__}, expected a tensor")
    if t.dtype not in dtypes:
        expected = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{where}: {name}: got dtype {t.dtype}, expected {expected}")
    if t.device != device:
        raise ValueError(f"{where}: {name}: got a tensor on {t.device}, expected {device}")
    got = tuple(t.shape)
    if len(got) != len(shape) or any(s is not None and g != s for g, s in zip(got, shape)):
        raise ValueError(f"{where}: {name}: got shape {_shape_text(got)}, expected {_shape_text(shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{where}: {name}: got a non-contiguous tensor (strides {tuple(t.stride())}), "
                         f"expected a contiguous one (call .contiguous())")
    if align and not traced and t.data_ptr() % align:
        raise ValueError(f"{where}: {name}: address {t.data_ptr():#x} is not a multiple of {align} bytes, "
                         f"expected {align}-byte alignment (a view that starts mid-row?)")


def _absent(where, name, t, why):
    if t is not None:
        raise ValueError(f"{where}: {name}: got a tensor, expected None ({why})")


def dispatch(v, device, dtypes, x, topk_idx, topk_weights, x_scales, num_tokens, traced=False):
    """Check dispatch's arguments against a manifest.Variant v; returns T,
    the rows of x. dtypes maps "bf16", "fp16", "fp32", "fp8_e4m3", "int32"
    and "int64" to the framework's dtypes. num_tokens is None or a tensor
    of one int32 or int64 on the device, read there (a value outside 0..T
    is clamped to it). traced: see tensor()."""
    where = f"{v.name} dispatch"
    if (not traced and not hasattr(x, "shape")) or len(x.shape) != 2:
        tensor(where, "x", x, (dtypes[v.dtype],), (None, v.hidden), device, traced=traced)
    rows = x.shape[0]
    if rows > v.max_tokens:
        raise ValueError(f"{where}: x: got {rows} tokens (shape {_shape_text(tuple(x.shape))}), "
                         f"expected at most max_tokens = {v.max_tokens}")
    tensor(where, "x", x, (dtypes[v.dtype],), (rows, v.hidden), device, align=16, traced=traced)
    tensor(where, "topk_idx", topk_idx, (dtypes["int32"], dtypes["int64"]), (rows, v.topk), device,
           traced=traced)
    if v.weights:
        if topk_weights is None:
            raise ValueError(f"{where}: topk_weights: got None, expected a [{rows}, {v.topk}] "
                             f"{dtypes['fp32']} tensor (the variant carries weights)")
        tensor(where, "topk_weights", topk_weights, (dtypes["fp32"],), (rows, v.topk), device, traced=traced)
    else:
        _absent(where, "topk_weights", topk_weights, "the variant has weights = false")
    if v.dtype == "fp8_e4m3":
        if x_scales is None:
            raise ValueError(f"{where}: x_scales: got None, expected [{rows}, {v.scale_cols}] "
                             f"{dtypes['fp32']} scales (dtype fp8_e4m3)")
        tensor(where, "x_scales", x_scales, (dtypes["fp32"],), (rows, v.scale_cols), device, traced=traced)
    else:
        _absent(where, "x_scales", x_scales, f"dtype {v.dtype} has no scales")
    if num_tokens is None:
        return rows
    if not traced and not hasattr(num_tokens, "dtype"):
        raise TypeError(f"{where}: num_tokens: got {type(num_tokens).__name__}, expected None or a one-element "
                        f"int32 tensor on {device} (for a count known on the host, slice x and topk_idx)")
    tensor(where, "num_tokens", num_tokens, (dtypes["int32"], dtypes["int64"]), tuple(num_tokens.shape), device,
           traced=traced)
    if num_tokens.numel() != 1:
        raise ValueError(f"{where}: num_tokens: got shape {_shape_text(tuple(num_tokens.shape))}, "
                         f"expected one element")
    return rows


def combine(v, device, dtypes, y, awaiting, traced=False):
    """Check combine's y against v: [capacity, hidden] of combine_dtype,
    contiguous, 16-byte aligned. awaiting: whether a dispatch waits for its
    combine (RuntimeError otherwise: nothing to combine)."""
    where = f"{v.name} combine"
    if not awaiting:
        raise RuntimeError(f"{where}: no dispatch to combine: every combine follows exactly one dispatch "
                           f"on the variant")
    tensor(where, "y", y, (dtypes[v.combine_dtype],), (v.capacity, v.hidden), device, align=16, traced=traced)


def alternation(v, awaiting):
    """Before a dispatch: the previous one must have been combined."""
    if awaiting:
        raise RuntimeError(f"{v.name} dispatch: the previous dispatch has not been combined: every dispatch "
                           f"must be followed by its combine before the next dispatch (in the backward too: "
                           f"a dispatch whose received rows got no gradient leaves its combine undone)")


def world(v, size, what="the process group"):
    """The variant's world against the number of ranks of the group."""
    if v.world != size:
        raise ValueError(f"variant {v.name}: world {v.world}, but {what} has {size} ranks: "
                         f"expected a variant generated for world {size}")


def autograd(v):
    """Gradients travel through the variant itself (a combine's gradient is
    a dispatch of out's gradient, and the reverse), so its dispatch and
    combine payloads must be one floating dtype."""
    if v.dtype != v.combine_dtype or v.dtype == "fp8_e4m3":
        raise NotImplementedError(
            f"variant {v.name}: autograd sends the gradients back through the variant, which needs "
            f"dtype == combine_dtype (got {v.dtype} and {v.combine_dtype}); pass inputs that do not "
            f"require grad, or use a variant whose dispatch and combine share a dtype")
