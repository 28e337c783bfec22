"""A forward (dispatch, an expert, combine) captured once with
torch.cuda.graph and replayed with a different token count each time, the
count read on the device: the same bits as eager calls."""
import pytest

from common import BACKEND, ENV, assert_bitwise, expert, make_inputs, on, torch, variants_of_this_world

VARIANTS = variants_of_this_world()


@pytest.mark.parametrize("name", VARIANTS)
def test_graph_replays_with_varying_token_counts(name, buffers):
    if BACKEND == "reference":
        pytest.skip("the reference backend synchronises: nothing to capture")
    buf = buffers(name)
    v = buf.variant
    rows = min(v.max_tokens, 64)
    static = on(ENV.device, make_inputs(v, rows, seed=31, s=ENV.rank, invalid=False))
    num_tokens = torch.zeros(1, dtype=torch.int32, device=ENV.device)

    def forward(x, topk_idx, topk_weights, x_scales, **kw):
        r = buf.dispatch(x, topk_idx, topk_weights, x_scales, **kw)
        y = expert(r.recv_x, ENV.rank, buf.combine_dtype)
        if buf.combine_buffer is not None:
            y = buf.combine_buffer.copy_(y)
        return buf.combine(y), r.num_recv_rows

    with torch.no_grad():
        num_tokens.fill_(rows)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward(**static, num_tokens=num_tokens)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, got_rows = forward(**static, num_tokens=num_tokens)
        for step, tokens in enumerate([rows, 1, 17, 0, rows // 2 + ENV.rank]):
            fresh = on(ENV.device, make_inputs(v, tokens, seed=32 + step, s=ENV.rank, invalid=step % 2 == 0))
            for key, t in fresh.items():
                if t is not None:
                    static[key][:tokens].copy_(t)
            num_tokens.fill_(tokens)
            graph.replay()
            replayed, replayed_rows = out[:tokens].clone(), got_rows.clone()
            want, want_rows = forward(**fresh)
            assert_bitwise(replayed, want, f"{name}: replay {step} with {tokens} tokens vs eager")
            assert_bitwise(replayed_rows, want_rows, f"{name}: replay {step}: received rows")
    torch.cuda.synchronize()
