"""Convolution + inference batch norm (+ the activation fused after it) in one PSUM evacuation.

``y = act(BN(conv(x) + b))`` is ``act(conv(x) * scale + (b * scale + shift))`` with per-channel
``scale = w / sqrt(var + eps)``, ``shift = beta - mean * scale``: channels are the partitions of the
conv's output tiles, so the evacuating ``ACTIVATE`` takes ``scale`` and the combined shift as [C, 1]
columns and the activation runs right after on the same tile. The conv's output is never stored and
the batch norm pass (load, multiply-add, store: a round trip per tile) disappears, as neuronx-cc
folds BN into the convolution for inference.

>>> from neuron_stack.compiler.lower.convbn import BN_TARGET
>>> BN_TARGET
'aten._native_batch_norm_legit_no_training.default'
"""
from __future__ import annotations

from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.tiles import PMAX, Pool, is_ref
from neuron_stack.ir import Node

BN_TARGET = "aten._native_batch_norm_legit_no_training.default"


def fusable_bn(low: Lowerer, conv: Node) -> Node | None:
    """The inference batch norm that is the conv's only consumer (reading it directly), or None."""
    if conv.name in low.out_refs or low._escapes(conv.name):
        return None
    users = low._consumers(conv.name)
    if len(users) != 1:
        return None
    bn = low.by_name[next(iter(users))]
    if bn.target != BN_TARGET or bn.name not in low.in_part or bn.name in low.done or bn.fused_into:
        return None
    a = bn.args
    if not (isinstance(a[0], dict) and a[0].get("node") == conv.name):
        return None
    return bn


class BNColumns:
    """Per-channel (scale, shift) columns of ``bn`` with the conv bias folded in: ``blocks`` maps a key
    to its channel range (start, count), ``bias_cols`` the same keys to the conv's bias columns."""

    def __init__(self, low: Lowerer, host: str, bn: Node, blocks: dict, bias_cols: dict):
        a = list(bn.args) + [None] * 7
        wv, bv = (low.value(a[i]) if is_ref(a[i]) else None for i in (1, 2))
        mean, var = low.value(a[3]), low.value(a[4])
        eps = a[6] if a[6] is not None else 1e-5
        small = Pool(low, f"{host}.bn", "sbuf", PMAX, 1, "float32", bufs=6 * len(blocks))
        self.cols = {}
        for key, (c0, cn) in blocks.items():
            def col(v, c0=c0, cn=cn):
                return low.load(bn.name, v.with_meta(v.meta.unsqueeze(1)), [(c0, cn), (0, 1)], small, 1)
            mt, vt = col(mean), col(var)
            scale = small.tile(cn, 1)
            low.vec("TENSOR_SCALAR", bn.name, scale, [vt.op()], op0="add", scalar0=eps, op1="power",
                    scalar1=-0.5)
            if wv is not None:
                low.vec("TENSOR_TENSOR", bn.name, scale, [scale.op(), col(wv).op()], n_inputs=2,
                        op="multiply")
            # shift = beta - mean * scale (+ conv bias * scale)
            shift = small.tile(cn, 1)
            low.vec("TENSOR_TENSOR", bn.name, shift, [mt.op(), scale.op()], n_inputs=2, op="multiply")
            if bv is not None:
                low.vec("TENSOR_TENSOR", bn.name, shift, [col(bv).op(), shift.op()], n_inputs=2,
                        op="subtract")
            else:
                low.vec("TENSOR_SCALAR", bn.name, shift, [shift.op()], op0="multiply", scalar0=-1.0)
            if key in bias_cols:
                bs = small.tile(cn, 1)
                low.vec("TENSOR_TENSOR", bn.name, bs, [bias_cols[key].op(), scale.op()], n_inputs=2,
                        op="multiply")
                low.vec("TENSOR_TENSOR", bn.name, shift, [shift.op(), bs.op()], n_inputs=2, op="add")
            self.cols[key] = (scale, shift)
