"""Wrong arguments raise a Python exception naming the argument, what it
got and what was expected, before anything is queued (the variant works
normally afterwards); libsymm's own errors carry its message."""
import pytest

from common import BACKEND, ENV, default_manifest_path, make_inputs, on, torch, variants_of_this_world

VARIANTS = variants_of_this_world()


def other_device():
    return torch.device("meta") if ENV.device.type == "cpu" else torch.device("cpu")


def test_wrong_arguments_raise_before_anything_is_queued(buffers):
    buf = buffers("bf16_rank_w2" if "bf16_rank_w2" in VARIANTS else VARIANTS[0])
    v = buf.variant
    good = on(ENV.device, make_inputs(v, 12, seed=41, s=ENV.rank, invalid=False))
    x, idx, w, sc = good["x"], good["topk_idx"], good["topk_weights"], good["x_scales"]
    H, K, name, dev = v.hidden, v.topk, v.name, ENV.device
    cases = [
        (TypeError, f"{name} dispatch: x: got dtype torch.float32, expected {buf.dtype}",
         dict(x=x.float())),
        (ValueError, f"{name} dispatch: x: got a tensor on {other_device()}, expected {dev}",
         dict(x=x.to(other_device()))),
        (ValueError, f"{name} dispatch: x: got shape [12, {H + 16}], expected [12, {H}]",
         dict(x=torch.zeros((12, H + 16), dtype=buf.dtype, device=dev))),
        (ValueError, f"{name} dispatch: x: got a non-contiguous tensor",
         dict(x=torch.zeros((12, 2 * H), dtype=buf.dtype, device=dev)[:, :H])),
        (ValueError, f"{name} dispatch: x: got {v.max_tokens + 1} tokens (shape [{v.max_tokens + 1}, {H}]), "
                     f"expected at most max_tokens = {v.max_tokens}",
         dict(x=torch.zeros((v.max_tokens + 1, H), dtype=buf.dtype, device=dev))),
        (TypeError, f"{name} dispatch: topk_idx: got dtype torch.float32, expected torch.int32 or torch.int64",
         dict(topk_idx=idx.float())),
        (ValueError, f"{name} dispatch: topk_idx: got shape [12, {K + 1}], expected [12, {K}]",
         dict(topk_idx=torch.zeros((12, K + 1), dtype=torch.int32, device=dev))),
        (TypeError, f"{name} dispatch: num_tokens: got int, expected None or a one-element int32 tensor",
         dict(num_tokens=5)),
    ]
    if v.weights:
        cases.append((ValueError, f"{name} dispatch: topk_weights: got None, expected a [12, {K}] torch.float32 "
                                  f"tensor (the variant carries weights)", dict(topk_weights=None)))
    for error, text, change in cases:
        a = dict(x=x, topk_idx=idx, topk_weights=w, x_scales=sc)
        a.update(change)
        num_tokens = a.pop("num_tokens", None)
        with torch.no_grad(), pytest.raises(error) as e:
            buf.dispatch(**a, num_tokens=num_tokens)
        assert str(e.value).startswith(text), f"got {e.value!r}, expected it to start with {text!r}"
    with torch.no_grad():
        with pytest.raises(RuntimeError, match=f"{name} combine: no dispatch to combine"):
            buf.combine(torch.zeros((v.capacity, H), dtype=buf.combine_dtype, device=dev))
        r = buf.dispatch(x, idx, w, sc)
        with pytest.raises(RuntimeError, match=f"{name} dispatch: the previous dispatch has not been combined"):
            buf.dispatch(x, idx, w, sc)
        with pytest.raises(ValueError, match=rf"{name} combine: y: got shape \[12, {H}\], expected "
                                             rf"\[{v.capacity}, {H}\]"):
            buf.combine(torch.zeros((12, H), dtype=buf.combine_dtype, device=dev))
        out = buf.combine(r.recv_x.to(buf.combine_dtype))
        assert out.shape == (12, H)
        # Nothing was queued by the refused calls: the variant still pairs up.
        r = buf.dispatch(x, idx, w, sc)
        buf.combine(r.recv_x.to(buf.combine_dtype))
        if BACKEND != "reference":
            buf.stats()  # no dropped rows, no invalid ids, no timeout


def test_world_mismatch_is_refused_before_create(env):
    import symmgen
    from symmgen import manifest
    m = manifest.load(default_manifest_path())
    other = next(n for n, v in m.variants.items() if v.world != env.size)
    wrong = m.variant(other).world
    with pytest.raises(ValueError, match=f"variant {other}: world {wrong}, but the process group has {env.size} "
                                         f"ranks: expected a variant generated for world {env.size}"):
        symmgen.Buffer(env.world if BACKEND != "reference" else env.group, default_manifest_path(), other,
                       backend=BACKEND)


def test_library_errors_carry_its_message(env):
    import symmgen
    if BACKEND == "reference":
        pytest.skip("libsymm's errors need the native backend")
    with pytest.raises(symmgen.SymmError) as e:
        symmgen.Buffer(env.world, default_manifest_path(), VARIANTS[0], tune="NOPE=1")
    assert e.value.status == "SYMM_ERR_INVALID_ARG"
    assert "symm_variant_options.tune" in str(e.value) and "NOPE" in str(e.value)
    with pytest.raises(symmgen.SpecError, match="field topk: missing"):
        symmgen.Buffer(env.world, {"hidden": 1024, "experts": 8, "max_tokens": 16})
