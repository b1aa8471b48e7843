"""Layout changes (copies between views) lowered as neuronx-cc does, never as per-element DMA.

A copy whose source and destination agree on their contiguous dimension is a DMA whose descriptors
each move one contiguous run, spread over the core's DMA queues when it is big. A copy that
*transposes* (the source's unit-stride dimension is not the destination's: the key transpose of
attention, a permute followed by ``contiguous()``) would need one descriptor per element on a DMA
engine; the compiler instead loads natural tiles (long runs along the source's contiguous
dimension), transposes each 128 x 128 block on the Tensor Engine (a matmul against the identity,
``nc_transpose``), and stores rows that are contiguous in the destination (reference §5.3, §5.4;
the DMA guide: "below 256 B per partition severely overhead-bound").

>>> import torch
>>> from neuron_stack.compiler.lower.tiles import View
>>> src = View("x", "float32", torch.empty(4, 64, 128, device="meta").transpose(1, 2))
>>> transpose_dims(View("y", "float32", torch.empty(4, 128, 64, device="meta")), src)
(1, 2)
"""
from __future__ import annotations

import itertools
import math

from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.matmul import transpose_to
from neuron_stack.compiler.lower.resident import translate
from neuron_stack.compiler.lower.tiles import PMAX, Pool, View, boxes, nbytes_of, view_operand
from neuron_stack.device.cost import ceil_div, dma_min_piece_bytes, scalar_ns, vector_ns

#: a DMA whose contiguous runs are shorter than this is element-bound (DMA guide: < 256 B per
#: partition is overhead-bound; a run of a few elements pays a descriptor each)
MIN_RUN_BYTES = 64
#: at most this many Tensor Engine transposes for one copy (beyond it, the DMA path is used)
MAX_TRANSPOSE_TILES = 1 << 14


def _unit_dim(v: View) -> int | None:
    """The innermost dimension of ``v`` with unit stride and more than one element, or None."""
    st, sh = v.meta.stride(), v.shape
    for d in reversed(range(len(sh))):
        if sh[d] > 1 and st[d] == 1:
            return d
    return None


def _run_bytes(v: View) -> int:
    """Bytes per contiguous run of ``v``'s access pattern (the merged innermost unit-stride dim)."""
    ap = view_operand(v)["ap"]
    s, n = ap[-1]
    return (n if s == 1 else 1) * nbytes_of(v.dtype)


def transpose_dims(dst: View, src: View) -> tuple[int, int] | None:
    """``(i, j)`` when copying ``src`` to ``dst`` transposes: ``i`` is unit-stride in the source,
    ``j`` in the destination, and the copy's common contiguous run is shorter than MIN_RUN_BYTES."""
    i, j = _unit_dim(src), _unit_dim(dst)
    if i is None or j is None or i == j:
        return None
    if min(_run_bytes(src), _run_bytes(dst)) >= MIN_RUN_BYTES:
        return None
    return i, j


def copy_transposed(low: Lowerer, node: str, dst: View, src: View) -> bool:
    """``dst[...] = src[...]`` through Tensor Engine transposes when the copy transposes; False when
    it does not (the caller DMAs it). Natural loads put the destination's contiguous dim ``j`` on
    partitions and the source's ``i`` on the free axis; each block is transposed to [i, j] and
    stored with runs contiguous in ``dst``. Example: the key transpose ``k.transpose(-2, -1)
    .contiguous()`` of attention at batch > 1."""
    dims = transpose_dims(dst, src)
    if dims is None:
        return False
    i, j = dims
    shape = dst.shape
    batch = [d for d in range(len(shape)) if d not in (i, j)]
    n_tiles = math.prod(shape[d] for d in batch) * ceil_div(shape[i], PMAX) * ceil_div(shape[j], PMAX)
    if n_tiles > MAX_TRANSPOSE_TILES:
        return False
    dt = src.dtype
    nat = Pool(low, f"{node}.nat", "sbuf", PMAX, PMAX, dt, bufs=4)
    out = Pool(low, f"{node}.tout", "sbuf", PMAX, PMAX, dt, bufs=4)
    tp = Pool(low, f"{node}.tp", "psum", PMAX, PMAX, "float32", bufs=2)
    s_meta = src.meta.permute(batch + [j, i])      # [..., j, i]: rows along j, runs along i
    d_meta = dst.meta.permute(batch + [i, j])      # [..., i, j]: rows along i, runs along j
    for idx in itertools.product(*(range(shape[d]) for d in batch)):
        s2, d2 = src.with_meta(s_meta[idx]), dst.with_meta(d_meta[idx])
        for j0 in range(0, shape[j], PMAX):
            jl = min(PMAX, shape[j] - j0)
            for i0 in range(0, shape[i], PMAX):
                il = min(PMAX, shape[i] - i0)
                t = low.load(node, s2, [(j0, jl), (i0, il)], nat, 1)        # [jl, il]
                o = out.tile(il, jl)
                transpose_to(low, node, t, o, tp)
                low.store(node, o, d2, [(i0, il), (j0, jl)])
    return True


def copy_dma(low: Lowerer, node: str, dst: View, src: View, split: int) -> None:
    """A same-dtype copy as DMAs of boxes of ``dst``'s shape (dims before ``split`` are rows): one
    descriptor per contiguous run; a big copy is cut into up to one piece per DMA queue, each piece
    long enough to amortise the fixed cost (as the compiler spreads a transfer over the queues)."""
    shape = dst.shape
    inner = math.prod(shape[split:]) if shape[split:] else 1
    total = math.prod(shape) * nbytes_of(dst.dtype)
    min_piece = dma_min_piece_bytes(low.p)
    piece = max(total / low.p.dma_queues, min_piece)
    rows = max(1, min(PMAX * 64, int(piece // max(1, inner * nbytes_of(dst.dtype)))))
    plan = [br + bc for br in boxes(shape[:split], rows) for bc in boxes(shape[split:], 1 << 16)]
    if not all(_on_chip_ok(low, view_operand(v, box)) for box in plan for v in (dst, src)):
        # a pattern crossing a resident value's row blocks would evict it to HBM: copy one
        # [rows, columns] matrix (the last two dims) per DMA instead, each inside a row block
        last = math.prod(shape[-2:]) if len(shape) >= 2 else math.prod(shape)
        plan = [b for box in boxes(shape, max(1, last)) for b in _inside_blocks(low, dst, src, box)]
    for box in plan:
        _copy_box(low, node, dst, src, box)


def _copy_box(low: Lowerer, node: str, dst: View, src: View, box) -> None:
    """``box`` copied by one engine copy when every element keeps its partition, else halved along its outer
    dims (batch, heads: never the last two, a matrix) so that the parts that keep theirs are engine copies
    and only those that move across partitions are DMAs (at 64 tokens and batch 2, half a head split lands
    on its own partitions: two sequences share a 128-row block)."""
    if _lane_copy(low, node, dst, src, box):
        return
    d = next((k for k, (_, n) in enumerate(box[:-2]) if n > 1), None)
    if d is None or _sbuf_pattern(low, dst, box) is None or _sbuf_pattern(low, src, box) is None:
        low.dma(node, view_operand(dst, box), view_operand(src, box))
        return
    s0, n = box[d]
    lo, hi = list(box), list(box)
    lo[d], hi[d] = (s0, n // 2), (s0 + n // 2, n - n // 2)
    _copy_box(low, node, dst, src, lo)
    _copy_box(low, node, dst, src, hi)


def _inside_blocks(low: Lowerer, dst: View, src: View, box) -> list:
    """``box`` cut in halves along its outermost dim of more than one element until each piece stays
    inside the row blocks of the resident values it touches (a batch's 160 rows of a value tiled in
    128-row blocks straddle two blocks: two pieces, not an eviction); a single element is left as is."""
    if all(_on_chip_ok(low, view_operand(v, box)) for v in (dst, src)):
        return [box]
    d = next((k for k, (_, n) in enumerate(box) if n > 1), None)
    if d is None:
        return [box]
    s0, n = box[d]
    h = n // 2
    lo, hi = list(box), list(box)
    lo[d], hi[d] = (s0, h), (s0 + h, n - h)
    return _inside_blocks(low, dst, src, lo) + _inside_blocks(low, dst, src, hi)


def _sbuf_pattern(low: Lowerer, v: View, box) -> tuple[dict, list] | None:
    """The box of ``v`` over its SBUF-resident layout: (operand, kinds) with one entry per dim of
    more than one element, or None when ``v`` is not resident or the pattern is not expressible."""
    r = low.res.get(v.buf)
    if r is None or r.evicted or r.off < 0:
        return None
    st = v.meta.stride()
    o = v.meta.storage_offset() + sum(s0 * k for (s0, _), k in zip(box, st))
    dims = [(k, n) for (_, n), k in zip(box, st) if n > 1]
    t = translate(r, int(o), dims)
    if t is None or len(t[1]) != len(dims):
        return None
    return {"m": "sbuf", "b": r.key, "dt": v.dtype, "o": t[0], "ap": t[1]}, t[2], r.psize


def _lane_copy(low: Lowerer, node: str, dst: View, src: View, box) -> bool:
    """A copy between two SBUF-resident values that keeps every element in its partition (the head
    split of attention: a token's row stays on its partition, only its columns move) is one engine
    copy with access patterns, not a DMA: engines read and write any free-axis pattern of their
    lane. True when emitted."""
    got = [_sbuf_pattern(low, v, box) for v in (dst, src)]
    if any(g is None for g in got):
        return False
    (d, dk, dps), (s, sk, sps) = got
    if dk != sk or [n for _, n in d["ap"]] != [n for _, n in s["ap"]] or d["o"] // dps != s["o"] // sps:
        return False
    if any(k == "p" and a[0] // dps != b[0] // sps for k, a, b in zip(dk, d["ap"], s["ap"])):
        return False
    order = [i for i, k in enumerate(dk) if k == "p"] + [i for i, k in enumerate(dk) if k != "p"]
    if not order or dk[order[0]] != "p" or sum(k == "p" for k in dk) != 1:
        return False
    d["ap"], s["ap"] = [d["ap"][i] for i in order], [s["ap"][i] for i in order]
    per_lane = math.prod(n for _, n in d["ap"][1:])
    if low.engine_busy.get("scalar", 0.0) <= low.engine_busy.get("vector", 0.0):
        low.emit("ACTIVATE", node, [d], [s], {"func": "copy", "scale": 1.0, "bias": 0.0},
                 dur=scalar_ns(low.p, per_lane))
    else:
        low.emit("TENSOR_COPY", node, [d], [s], {},
                 dur=vector_ns(low.p, "TENSOR_COPY", per_lane, 1, dst.dtype))
    return True


def _on_chip_ok(low: Lowerer, op: dict) -> bool:
    """False when ``op`` addresses a value resident in SBUF with a pattern its layout cannot express."""
    if op["b"] in low.cand and low.cand[op["b"]] == "undecided":
        low._decide(op["b"])
    return low._try_on_chip(op) is not None
