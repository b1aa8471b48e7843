"""Attention scores never leave the chip: a softmax over the last dim of a matmul's output (after
its fused epilogue, e.g. the ``/ sqrt(d)``) runs in that matmul's PSUM evacuation.

The scores of one (batch, head) row block are a [<=128, N] tile in PSUM; with N <= 512 (one bank)
the whole row is there, so max, exp (with the running sum on the Scalar engine's accumulator),
reciprocal and the multiply run on it and only the probabilities are stored, as fused attention
kernels do (NKI's ``flash_fwd``; the arch guide's softmax example keeps the row in SBUF). Before,
the full [B, H, S, S] fp32 scores went to SBUF (or, at BERT-base batch 8, 6.3 MB of HBM spill) and
came back for a separate softmax pass.

>>> from neuron_stack.compiler.lower.attention import SOFTMAX_MAX_ROW
>>> SOFTMAX_MAX_ROW
512
"""
from __future__ import annotations

from neuron_stack.compiler.lower.common import reshape_view
from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.tiles import MOVING_FMAX, PMAX, Pool, Tile, View, packet_name
from neuron_stack.ir import Node

#: the row must fit one PSUM bank of the evacuation (fp32)
SOFTMAX_MAX_ROW = MOVING_FMAX


def fusable_softmax(low: Lowerer, last: str, N: int) -> Node | None:
    """The softmax node reading matmul chain value ``last`` as its only consumer, over its last dim,
    when the row (N) fits one bank; else None."""
    if N > SOFTMAX_MAX_ROW or last in low.out_refs or low._escapes(last):
        return None
    users = low._consumers(last)
    if len(users) != 1:
        return None
    s = low.by_name[next(iter(users))]
    if packet_name(s.target) != "_softmax" or s.name not in low.in_part or s.name in low.done:
        return None
    if s.fused_into or low.fused.get(s.name) or not s.outputs or len(s.args) < 3:
        return None
    src = s.args[0]
    if not (isinstance(src, dict) and src.get("node") == last):
        return None                     # read through a view: the row may not be the tile's row
    nd = len(s.outputs[0].shape)
    if s.args[1] % nd != nd - 1 or s.args[2] or tuple(s.outputs[0].shape)[-1] != N:
        return None
    return s


class SoftmaxEpilogue:
    """Softmax of evacuated score tiles, stored as the softmax node's output."""

    def __init__(self, low: Lowerer, host: str, s: Node, hshape):
        self.low, self.s = low, s
        low.done.add(s.name)
        N = hshape[-1]
        self.small = Pool(low, f"{host}.sm", "sbuf", PMAX, 8, "float32", bufs=8)
        self.work = Pool(low, f"{host}.smw", "sbuf", PMAX, N, "float32", bufs=4)
        out = low.out_view(s.name, s.outputs[0])
        self.view: View = reshape_view(out, tuple(hshape))

    def __call__(self, x: Tile, box) -> None:
        low, name, P = self.low, self.s.name, x.P
        m, negm, sums, r = (self.small.tile(P, 1) for _ in range(4))
        low.vec("REDUCE", name, m, [x.op()], op="max", cost_n=x.F)
        low.vec("TENSOR_SCALAR", name, negm, [m.op()], op0="multiply", scalar0=-1.0)
        e = self.work.tile(P, x.F)
        low.act(name, e, x.op(), "exp", bias=negm.op(), acc=sums.cols(0, 1), flops=2 * P * x.F)
        low.vec("RECIPROCAL", name, r, [sums.op()])
        o = self.work.tile(P, x.F).as_dtype(self.s.outputs[0].dtype)
        low.vec("TENSOR_SCALAR", name, o, [e.op(), r.op()], op0="multiply", scalar0={"src": 1}, flops=P * x.F)
        low.store(name, o, self.view, box)

    def finish(self) -> None:
        self.low.finished.add(self.s.name)
