"""Small helpers every op lowering uses: broadcast and reshape views, the flat [128, n] layout,
per-node pool caches (where to cut a shape into partition and free dims, ``choose_split``, is in
:mod:`.tiles`: the resident layout follows that cut).
"""
from __future__ import annotations

import math

from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.tiles import PMAX, View
from neuron_stack.compiler.lower.tiles import choose_split as choose_split  # re-exported: chain.py, data.py
from neuron_stack.ir import Node


def broadcast_view(v: View, shape: tuple[int, ...]) -> View:
    """``v`` broadcast to ``shape`` (stride-0 dims): loads of it fill whole tiles."""
    if v.shape == tuple(shape):
        return v
    return v.with_meta(v.meta.broadcast_to(shape))


def reshape_view(v: View, shape: tuple[int, ...]) -> View | None:
    """``v`` reshaped without a copy, or None when its strides forbid it (a stride-0 broadcast of a
    causal mask merged with a real dim: torch's meta ``view`` raises ValueError there, not RuntimeError)."""
    try:
        return v.with_meta(v.meta.view(shape))
    except (RuntimeError, ValueError):
        return None


def flat128(views: list[View], shape: tuple[int, ...]) -> tuple[tuple[int, ...], list[View]] | None:
    """Contiguous operands of an elementwise op viewed as [128, numel/128]: full partitions."""
    n = math.prod(shape)
    if n < PMAX * 64 or n % PMAX:
        return None
    new = (PMAX, n // PMAX)
    out = []
    for v in views:
        if not v.meta.is_contiguous():
            return None
        r = reshape_view(v, new)
        if r is None:
            return None
        out.append(r)
    return new, out


def pools_for(low: Lowerer, key: str, F: int) -> dict:
    cache = low.pool_cache
    return cache.setdefault((key, F), {"__F": F})


def output_used(low: Lowerer, n: Node, i: int) -> bool:
    for u in low.users.get(n.name, []):
        un = low.by_name[u]
        if un.target == "getitem" and un.args[1] == i:
            return True
    return False
