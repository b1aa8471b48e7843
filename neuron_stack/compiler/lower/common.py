"""Small helpers every op lowering uses: broadcast and reshape views, where to cut a shape into
partition and free dims, the flat [128, n] layout, per-node pool caches.

>>> choose_split((256, 64))
1
"""
from __future__ import annotations

import math

from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.tiles import FREE_TILE, PMAX, View
from neuron_stack.device.cost import ceil_div
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


def n_boxes(shape, limit) -> int:
    inner, j = 1, len(shape)
    while j > 0 and inner * shape[j - 1] <= limit:
        inner *= shape[j - 1]
        j -= 1
    if j == 0:
        return 1
    d = j - 1
    step = max(1, limit // inner)
    return math.prod(shape[:d]) * ceil_div(shape[d], step)


def choose_split(shape: tuple[int, ...], free_limit: int = FREE_TILE) -> int:
    """Where to cut ``shape`` into partition dims and free dims: the cut with the cheapest tiles."""
    if len(shape) <= 1:
        return 0
    best, best_k = None, len(shape) - 1
    for k in range(len(shape) + 1):
        rows, cols = shape[:k], shape[k:]
        nr = n_boxes(rows, PMAX)
        nc = n_boxes(cols, free_limit)
        f = min(math.prod(cols), free_limit) if cols else 1
        # engine cycles plus the tile's DMA descriptors (one per partition row, ~256 B of transfer
        # time each spread over 16 queues ~ 1 cycle): a [1 x 8192] decode row is 4 tiles of
        # [1, 2048], not 64 tiles of one element per partition
        p_rows = min(math.prod(rows), PMAX) if rows else 1
        cost = nr * nc * (max(64, f) + p_rows)
        if best is None or cost < best:
            best, best_k = cost, k
    return best_k


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
