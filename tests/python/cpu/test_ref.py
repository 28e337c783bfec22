"""ref.py: libsymm's CPU reference through ctypes on plain Python buffers,
against results worked out by hand from DESIGN.md "Semantics"."""
import array
import struct

import pytest

from symmgen import SymmError, ref

H = 8


def f32(values):
    return array.array("f", values)


def i32(values):
    return array.array("i", values)


def rows_of(buf, fmt, width):
    a = array.array(fmt, bytes(buf))
    return [list(a[i:i + width]) for i in range(0, len(a), width)]


def token(s, t):
    """A token's row: every element s * 10 + t (exact in every dtype here)."""
    return [float(s * 10 + t)] * H


def inputs(idx_by_rank, weights_by_rank=None):
    out = []
    for s, idx in enumerate(idx_by_rank):
        x = f32([v for t in range(len(idx)) for v in token(s, t)])
        w = f32([v for row in weights_by_rank[s] for v in row]) if weights_by_rank else None
        out.append(ref.Input(len(idx), x, i32([e for row in idx for e in row]), w))
    return out


# Rank 0 sends t0 (experts 0, 3) to ranks 0 and 1, t1 (1, -1) to rank 0, t2 (2, 3)
# to rank 1; rank 1 sends t0 (3, 2) to rank 1, t1 (0, 2) to both. 4 experts, 2 a rank.
IDX = [[[0, 3], [1, -1], [2, 3]], [[3, 2], [0, 2]]]
W = [[[0.5, 0.25], [1.0, 0.0], [2.0, 4.0]], [[0.5, 8.0], [0.75, 1.5]]]


def test_layout_rank_rows_order_metadata_and_sum():
    cfg = ref.Config(hidden=H, topk=2, experts=4, world=2, max_tokens=4, dtype="fp32", layout="rank")
    ins = inputs(IDX, W)
    res = ref.dispatch(cfg, ins)
    assert res.overflow is None and res.stats == [(0, 0), (0, 0)]
    r0, r1 = res.recv
    assert (r0.rows, r1.rows) == (3, 4)
    assert rows_of(r0.src, "i", 4)[:3] == [[0, 0, -1, 0], [0, 1, -1, 0], [1, 1, -1, 0]]
    assert rows_of(r1.src, "i", 4)[:4] == [[0, 0, -1, 0], [0, 2, -1, 0], [1, 0, -1, 0], [1, 1, -1, 0]]
    assert rows_of(r0.x, "f", H)[:3] == [token(0, 0), token(0, 1), token(1, 1)]
    assert rows_of(r0.topk_idx, "i", 2)[:3] == [[0, -1], [1, -1], [0, -1]]
    assert rows_of(r1.topk_idx, "i", 2)[:4] == [[-1, 1], [0, 1], [1, 0], [-1, 0]]
    assert rows_of(r0.weights, "f", 2)[:3] == [[0.5, 0.0], [1.0, 0.0], [0.75, 0.0]]
    assert list(array.array("i", bytes(r0.expert_count))) == [2, 1]
    assert list(array.array("i", bytes(r1.expert_count))) == [3, 3]
    # y = (p + 1) * recv_x: out[t] = sum over the ranks p that got t of (p + 1) x[t].
    ys = []
    for p, r in enumerate(res.recv):
        got = array.array("f", bytes(r.x))
        ys.append(f32([v * (p + 1) if i < r.rows * H else 0.0 for i, v in enumerate(got)]))
    out0, out1 = ref.combine(cfg, ins, res, ys)
    assert rows_of(out0, "f", H) == [[3 * v for v in token(0, 0)], token(0, 1), [2 * v for v in token(0, 2)]]
    assert rows_of(out1, "f", H) == [[2 * v for v in token(1, 0)], [3 * v for v in token(1, 1)]]


def test_layout_expert_segments_alignment_and_weighted_sum():
    cfg = ref.Config(hidden=H, topk=2, experts=4, world=2, max_tokens=4, dtype="bf16", layout="expert", align=4)
    bf = lambda vals: array.array("H", [ref.f32_to_bf16(v) for v in vals])  # noqa: E731
    ins = []
    for s, idx in enumerate(IDX):
        x = bf([v for t in range(len(idx)) for v in token(s, t)])
        ins.append(ref.Input(len(idx), x, i32([e for row in idx for e in row]),
                             f32([v for row in W[s] for v in row])))
    res = ref.dispatch(cfg, ins)
    r0, r1 = res.recv
    # Rank 0 holds experts 0 (s0 t0 k0, s1 t1 k0) and 1 (s0 t1 k0), expert 1's
    # segment starting at the next multiple of 4.
    assert list(array.array("i", bytes(r0.expert_offset))) == [0, 4]
    assert list(array.array("i", bytes(r0.expert_count))) == [2, 1]
    assert r0.rows == 5
    src0 = rows_of(r0.src, "i", 4)
    assert [src0[i] for i in (0, 1, 4)] == [[0, 0, 0, 0], [1, 1, 0, 0], [0, 1, 0, 0]]
    assert bytes(r0.src[2 * 16:4 * 16]) == bytes([ref.POISON]) * 32  # padding rows untouched
    # Rank 1: expert 2 (s0 t2 k0, s1 t0 k1, s1 t1 k1), expert 3 at 4 (s0 t0 k1, s0 t2 k1, s1 t0 k0).
    assert list(array.array("i", bytes(r1.expert_offset))) == [0, 4]
    assert list(array.array("i", bytes(r1.expert_count))) == [3, 3]
    src1 = rows_of(r1.src, "i", 4)
    assert [src1[i][:3] for i in (0, 1, 2, 4, 5, 6)] == [[0, 2, 0], [1, 0, 1], [1, 1, 1], [0, 0, 1], [0, 2, 1],
                                                          [1, 0, 0]]
    assert list(array.array("f", bytes(r1.weights)))[4:7] == [0.25, 4.0, 0.5]
    # y = recv_x: out[t] = sum over k of w[t, k] x[t] (exact in bf16 here, in any order).
    outs = ref.combine(cfg, ins, res, [r.x for r in res.recv])
    for s, out in enumerate(outs):
        got = [ref.bf16_to_f32(h) for h in array.array("H", bytes(out))]
        for t, row in enumerate(IDX[s]):
            scale = sum(w for e, w in zip(row, W[s][t]) if e >= 0)
            assert got[t * H:(t + 1) * H] == [scale * v for v in token(s, t)], (s, t)


def test_capacity_drops_the_last_rows_and_reports_them():
    cfg = ref.Config(hidden=H, topk=2, experts=4, world=2, max_tokens=4, dtype="fp32", layout="rank", capacity=3)
    res = ref.dispatch(cfg, inputs(IDX, W))
    r0, r1 = res.recv
    assert (r0.rows, r1.rows, r0.dropped, r1.dropped) == (3, 3, 0, 1)
    assert res.stats == [(0, 0), (0, 1)]  # rank 1's t1 was the 4th row for rank 1
    assert "1 rows dropped (capacity 3 rows per rank): dropped at rank 1: 1; sent by rank 1: 1" in res.overflow


def test_invalid_ids_are_skipped_and_counted():
    cfg = ref.Config(hidden=H, topk=2, experts=4, world=2, max_tokens=4, dtype="fp32", layout="rank")
    res = ref.dispatch(cfg, inputs([[[0, 0], [7, 1]], [[-5, 3]]], [[[1, 1], [1, 1]], [[1, 1]]]))
    assert res.stats == [(2, 0), (1, 0)]
    assert (res.recv[0].rows, res.recv[1].rows) == (2, 1)
    assert "3 invalid expert ids (outside -1..3 or repeated in a token's row), skipped: sent by rank 0: 2, " \
           "rank 1: 1" in res.overflow


def test_buffer_sizes_are_checked_before_the_call():
    cfg = ref.Config(hidden=H, topk=2, experts=4, world=2, max_tokens=4, dtype="fp32")
    ins = inputs(IDX, W)
    ins[1].x = f32([0.0] * 3)
    with pytest.raises(ValueError, match=r"in\[1\].x: 12 bytes, expected 64"):
        ref.dispatch(cfg, ins)
    ins = inputs(IDX, W)
    ins[0].topk_weights = None
    with pytest.raises(ValueError, match=r"in\[0\].topk_weights: missing, expected 24 bytes"):
        ref.dispatch(cfg, ins)
    with pytest.raises(ValueError, match=r"inputs: 1 ranks, expected world 2"):
        ref.dispatch(cfg, ins[:1])
    with pytest.raises(ValueError, match=r"in\[0\].tokens: got 5, expected 0..4 \(max_tokens\)"):
        ref.dispatch(cfg, [ref.Input(5, b"", b""), ref.Input(0, b"", b"")])
    res = ref.dispatch(cfg, inputs(IDX, W))
    with pytest.raises(ValueError, match=r"y\[0\]: 4 bytes, expected 256"):
        ref.combine(cfg, inputs(IDX, W), res, [b"\0" * 4, None])


def test_config_errors_carry_libsymm_message():
    with pytest.raises(SymmError) as e:
        ref.Config(hidden=H, topk=2, experts=5, world=2, max_tokens=4, dtype="fp32")
    assert e.value.status == "SYMM_ERR_INVALID_ARG"
    assert "experts" in str(e.value) and "5" in str(e.value)
    with pytest.raises(ValueError, match="ref.Config: layout: got 'diagonal', expected one of rank, expert"):
        ref.Config(hidden=H, topk=2, experts=4, world=2, max_tokens=4, layout="diagonal")


def test_rounding_as_the_gpu():
    assert ref.f32_to_bf16(1.0) == 0x3F80
    assert ref.f32_to_bf16(1.0 + 2 ** -8) == 0x3F80  # a tie goes to even
    assert ref.f32_to_bf16(1.0 + 3 * 2 ** -8) == 0x3F82
    assert ref.f32_to_bf16(float("nan")) == 0x7FFF
    assert ref.f32_to_f16(65520.0) == 0x7C00  # above the largest half: infinity
    assert ref.bf16_to_f32(0x4049) == struct.unpack("f", struct.pack("I", 0x40490000))[0]


@pytest.mark.parametrize("order, want", [("rank", 1.0), ("k", 0.0)])
def test_layout_expert_combine_orders_differ(order, want):
    # Token 0 of rank 0 picks experts 0 (rank 0), 2 (rank 1), 1 (rank 0) with
    # weights 1e8, 1, -1e8 on a row of ones. Order rank: rank 0's part is
    # 1e8 - 1e8 = 0, rank 1's is 1: out 1. Order k: 1e8 + 1 rounds to 1e8
    # in fp32, minus 1e8: out 0.
    cfg = ref.Config(hidden=H, topk=3, experts=4, world=2, max_tokens=4, dtype="fp32", layout="expert",
                     combine_order=order)
    ins = [ref.Input(1, f32([1.0] * H), i32([0, 2, 1]), f32([1e8, 1.0, -1e8])), ref.Input(0, b"", b"", b"")]
    res = ref.dispatch(cfg, ins)
    out0, _ = ref.combine(cfg, ins, res, [r.x for r in res.recv])
    assert list(array.array("f", bytes(out0))) == [want] * H


@pytest.mark.parametrize("hosts, order", [(0, [0, 1, 2, 3]), (2, [0, 2, 1, 3])])
def test_hosts_order_rows_by_local_index_then_host(hosts, order):
    # 4 ranks on 2 hosts (0, 1 | 2, 3), each token 0 for expert 0 (rank 0):
    # across hosts rank 0 receives by (local index, host): ranks 0, 2, 1, 3.
    cfg = ref.Config(hidden=H, topk=1, experts=4, world=4, max_tokens=1, dtype="fp32", hosts=hosts)
    ins = [ref.Input(1, f32([float(s)] * H), i32([0]), f32([1.0])) for s in range(4)]
    res = ref.dispatch(cfg, ins)
    src = array.array("i", bytes(res.recv[0].src))
    assert [src[4 * r] for r in range(4)] == order
