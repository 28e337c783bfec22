"""Worlds from process groups: a subgroup (its own gloo group over the same
ranks, as an expert-parallel group of one host would be) gives a world of
its ranks, on which a variant works as on the default group's."""
from common import BACKEND, ENV, assert_bitwise, default_manifest_path, expert, make_inputs, on, torch, dist


def test_world_and_buffer_from_a_subgroup(buffers):
    import symmgen
    sub = dist.new_group(ranks=list(range(ENV.size)), backend="gloo")
    name = f"bf16_rank_w{ENV.size}"
    if BACKEND != "reference":
        world = symmgen.World(sub)
        assert (world.rank, world.size, world.device) == (dist.get_rank(sub), ENV.size, ENV.device)
    else:
        world = sub
    try:
        with symmgen.Buffer(world, default_manifest_path(), name, backend=BACKEND) as buf:
            assert buf.group is sub
            mine = on(ENV.device, make_inputs(buf.variant, 21, seed=51, s=ENV.rank))
            with torch.no_grad():
                r = buf.dispatch(mine["x"], mine["topk_idx"], mine["topk_weights"])
                out = buf.combine(expert(r.recv_x, ENV.rank, buf.combine_dtype)).clone()
        main = buffers(buf.variant.name)
        with torch.no_grad():
            r = main.dispatch(mine["x"], mine["topk_idx"], mine["topk_weights"])
            want = main.combine(expert(r.recv_x, ENV.rank, main.combine_dtype))
        assert_bitwise(out, want, "the subgroup's buffer vs the default group's")
    finally:
        if BACKEND != "reference":
            world.destroy()
