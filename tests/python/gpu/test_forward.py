"""Dispatch and combine of every variant of specs/default.lua at this
world, bit for bit against libsymm's CPU reference and against the
all_to_all_single reference (symmgen.torch_ref)."""
import pytest

from common import (BACKEND, ENV, assert_bitwise, compare_results, cpu_combine, cpu_reference, expert, make_inputs,
                    on, result_dict, torch, variants_of_this_world)

VARIANTS = variants_of_this_world()


def tokens_per_rank(v, full=False):
    """Different T on each rank (one rank sends nothing), or max_tokens on all."""
    if full:
        return [v.max_tokens] * ENV.size
    return [[37, 64, 0, 90][s % 4] % (v.max_tokens + 1) for s in range(ENV.size)]


def run_forward(buf, ins, y_inside=True, **dispatch_kw):
    """This rank's dispatch (zero copy) and combine under no_grad: the
    results (as host copies) and out. y_inside: y written into
    combine_buffer where the variant has one (combine = "pull" or "auto");
    else (combine = "auto": the pushing form) a tensor of its own."""
    mine = on(ENV.device, ins[ENV.rank])
    with torch.no_grad():
        r = buf.dispatch(mine["x"], mine["topk_idx"], mine["topk_weights"], mine["x_scales"], **dispatch_kw)
        got = {k: (t.cpu() if t is not None else None) for k, t in result_dict(r).items()}
        y = expert(r.recv_x, ENV.rank, buf.combine_dtype)
        if buf.combine_buffer is not None and y_inside:
            y = buf.combine_buffer.copy_(y)
        out = buf.combine(y)
    return got, out.cpu()


def check_against_references(buf, ins, got, out):
    v = buf.variant
    cfg, rin, res, recv = cpu_reference(v, ins)
    compare_results(v, got, recv[ENV.rank], f"{v.name} rank {ENV.rank} vs CPU reference")
    ys = [expert(recv[p]["recv_x"], p, buf.combine_dtype) for p in range(ENV.size)]
    assert_bitwise(out, cpu_combine(v, cfg, rin, res, ys)[ENV.rank], f"{v.name} rank {ENV.rank}: combine vs CPU")
    return res


@pytest.mark.parametrize("name", VARIANTS)
def test_dispatch_combine_match_the_references(name, buffers):
    from symmgen import SymmError, torch_ref
    buf = buffers(name)
    v = buf.variant
    ins = [make_inputs(v, t, seed=1, s=s) for s, t in enumerate(tokens_per_rank(v))]
    got, out = run_forward(buf, ins)
    res = check_against_references(buf, ins, got, out)
    # The ids made invalid on purpose are counted, and reported (a rank
    # without tokens, one at world 4, has none to report).
    if BACKEND != "reference":
        if res.stats[ENV.rank][0]:
            with pytest.raises(SymmError, match="invalid topk entries") as e:
                buf.stats()
            assert e.value.status == "SYMM_ERR_OVERFLOW"
        stats = buf.stats(check=False)
        assert (stats["invalid"], stats["dropped_send"]) == res.stats[ENV.rank]
        assert stats["dropped_recv"] == res.recv[ENV.rank].dropped
    # The all_to_all_single reference, on the GPU, gives the same bits.
    mine = on(ENV.device, ins[ENV.rank])
    plan, rr = torch_ref.dispatch(v, ENV.group, mine["x"], mine["topk_idx"], mine["topk_weights"], mine["x_scales"])
    compare_results(v, got, rr, f"{name} rank {ENV.rank} vs torch_ref")
    ref_out = torch_ref.combine(v, ENV.group, plan, expert(rr["recv_x"], ENV.rank, buf.combine_dtype),
                                mine["topk_weights"])
    assert_bitwise(out, ref_out, f"{name} rank {ENV.rank}: combine vs torch_ref")


@pytest.mark.parametrize("name", [n for n in VARIANTS if "_auto_" in n])
def test_auto_combine_takes_y_in_its_buffer_or_anywhere(name, buffers):
    """combine = "auto": y in combine_buffer (pulled) and y elsewhere
    (pushed, no copy) in consecutive calls, each bit for bit."""
    buf = buffers(name)
    v = buf.variant
    assert buf.combine_mode == "auto" and buf.combine_buffer is not None
    for call, inside in enumerate((True, False, False, True)):
        ins = [make_inputs(v, t, seed=10 + call, s=s, invalid=False) for s, t in enumerate(tokens_per_rank(v))]
        got, out = run_forward(buf, ins, y_inside=inside)
        check_against_references(buf, ins, got, out)
        if BACKEND != "reference":
            stats = buf.stats()
            assert stats["mismatch"] == 0 and stats["mismatch_peer"] == -1


@pytest.mark.parametrize("name", [n for n in VARIANTS if "_cap_" in n])
def test_capacity_drops_match_the_reference(name, buffers):
    buf = buffers(name)
    v = buf.variant
    ins = [make_inputs(v, t, seed=2, s=s, invalid=False) for s, t in enumerate(tokens_per_rank(v, full=True))]
    # Every other token of every rank to experts of rank 0, so that rank 0
    # overflows at any world (the default spec's capacities are a fixed
    # multiple of the world: uniform routing overflows only at world 2).
    local = v.experts // ENV.size
    assert v.topk <= local, f"{name}: top-k {v.topk} above the {local} experts of a rank"
    for s, i in enumerate(ins):
        g = torch.Generator().manual_seed(3000 + s)
        for t in range(0, i["topk_idx"].shape[0], 2):
            i["topk_idx"][t] = torch.randperm(local, generator=g)[:v.topk].to(torch.int32)
    got, out = run_forward(buf, ins)
    res = check_against_references(buf, ins, got, out)
    assert any(r.dropped for r in res.recv), "the inputs should overflow the capacity"
    if BACKEND != "reference":
        stats = buf.stats(check=False)
        assert stats["dropped_recv"] == res.recv[ENV.rank].dropped


@pytest.mark.parametrize("name", [n for n in VARIANTS if n.startswith(("bf16_rank_w", "fp16_expert_a8_cap",
                                                                        "fp8_expert"))])
def test_int64_ids_and_owned_copies(name, buffers):
    buf = buffers(name)
    v = buf.variant
    ins = [make_inputs(v, t, seed=3, s=s) for s, t in enumerate(tokens_per_rank(v))]
    got32, out32 = run_forward(buf, ins)
    ins64 = [dict(i, topk_idx=i["topk_idx"].long()) for i in ins]
    got64, out64 = run_forward(buf, ins64)
    compare_results(v, got64, got32, f"{name}: int64 ids")
    assert_bitwise(out64, out32, f"{name}: combine with int64 ids")
    mine = on(ENV.device, ins[ENV.rank])
    with torch.no_grad():
        r = buf.dispatch(mine["x"], mine["topk_idx"], mine["topk_weights"], mine["x_scales"], copy=True)
        assert r.recv_x.data_ptr() != buf._views["recv_x"].data_ptr()
        owned = result_dict(r)
        out = buf.combine(expert(r.recv_x, ENV.rank, buf.combine_dtype))
    compare_results(v, owned, got32, f"{name}: owned copies")
    assert_bitwise(out, out32, f"{name}: combine after an owned dispatch")
    from common import valid_rows
    stale = ~valid_rows(v, owned)
    assert not owned["recv_x"].cpu().view(torch.uint8)[stale].any(), "owned rows past the received ones are zero"


def test_views_are_versioned_and_autograd_refuses_a_stale_one(buffers):
    buf = buffers(VARIANTS[0])
    v = buf.variant
    mine = on(ENV.device, make_inputs(v, 16, seed=4, s=ENV.rank))
    with torch.no_grad():
        r = buf.dispatch(mine["x"], mine["topk_idx"], mine["topk_weights"], mine["x_scales"])
        version = r.recv_x._version
        buf.combine(expert(r.recv_x, 0, buf.combine_dtype))
    scale = torch.ones((), device=ENV.device, requires_grad=True)
    r = buf.dispatch(mine["x"], mine["topk_idx"], mine["topk_weights"], mine["x_scales"], copy=False)
    assert r.recv_x._version > version
    y = r.recv_x * scale.to(r.recv_x.dtype)   # autograd saves the view r.recv_x
    with torch.no_grad():
        buf.combine(y.detach().to(buf.combine_dtype))
        r2 = buf.dispatch(mine["x"], mine["topk_idx"], mine["topk_weights"], mine["x_scales"])
        buf.combine(expert(r2.recv_x, 0, buf.combine_dtype))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.float().sum().backward()


def test_received_row_count_on_device_and_host(buffers):
    """num_recv_rows is on the device; the host int synchronises."""
    buf = buffers(VARIANTS[0])
    v = buf.variant
    ins = [make_inputs(v, t, seed=5, s=s) for s, t in enumerate(tokens_per_rank(v))]
    mine = on(ENV.device, ins[ENV.rank])
    with torch.no_grad():
        r = buf.dispatch(mine["x"], mine["topk_idx"], mine["topk_weights"], mine["x_scales"])
        assert r.num_recv_rows.device == ENV.device
        rows = r.num_recv_rows_host()
        buf.combine(expert(r.recv_x, 0, buf.combine_dtype))
    _, _, res, _ = cpu_reference(v, ins)
    assert rows == res.recv[ENV.rank].rows
