"""Data movement as DMA with access patterns (copies, cat, pad, repeat, flips, fills), gathers
(embedding, index_select), ``arange`` on GpSimd and collectives on the ``cc`` engine.
"""
from __future__ import annotations

import math

from neuron_stack.compiler.lower.chain import lane_tiled, lane_view
from neuron_stack.compiler.lower.common import broadcast_view, choose_split, reshape_view
from neuron_stack.compiler.lower.custom import lower_custom
from neuron_stack.compiler.lower.layout import copy_dma, copy_transposed
from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.registry import lowering
from neuron_stack.compiler.lower.tiles import (
    FREE_TILE,
    PMAX,
    Pool,
    View,
    boxes,
    is_ref,
    nbytes_of,
    packet_name,
    view_operand,
)
from neuron_stack.device.collective_cost import collective_ns
from neuron_stack.device.cost import ceil_div, dma_ns, gpsimd_ns
from neuron_stack.ir import Node

COPY_OPS = ("clone", "_to_copy", "copy", "lift_fresh_copy", "alias", "cat", "stack", "constant_pad_nd",
            "repeat", "flip", "roll", "expand_copy", "permute_copy", "view_copy", "_unsafe_view",
            "reshape", "slice_scatter", "select_scatter", "full", "full_like", "zeros", "zeros_like",
            "ones", "ones_like", "scalar_tensor", "new_zeros", "new_ones", "new_full", "fill")


@lowering("copy", ops=COPY_OPS, op_classes=("data_movement", "view"))
def lower_copy(low: Lowerer, n: Node) -> None:
    """clone/_to_copy/cat/pad/... as DMA between HBM access patterns (via SBUF when the dtype changes)."""
    name = packet_name(n.target)
    if not n.outputs:
        return
    spec = n.outputs[0]
    if name == "cat":
        tensors = [low.value(a) for a in n.args[0]]
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        dim = dim % len(spec.shape)
        out = low.out_view(n.name, spec)
        off = 0
        for v in tensors:
            if v.numel == 0:
                continue
            sl = out.with_meta(out.meta.narrow(dim, off, v.shape[dim]))
            _dma_view(low, n.name, sl, v)
            off += v.shape[dim]
        return
    if name in ("clone", "_to_copy", "copy", "lift_fresh_copy", "alias", "expand_copy", "permute_copy", "view_copy",
                "_unsafe_view", "reshape") and n.args and is_ref(n.args[-1] if name == "copy" else n.args[0]):
        src = low.value(n.args[1] if name == "copy" else n.args[0])
        out = low.out_view(n.name, spec)
        if name in ("_unsafe_view", "reshape", "view_copy"):
            src_c = src
            # a reshape of a non-viewable layout: copy element order (row-major of the source)
            out_as = reshape_view(out, src.shape)
            _dma_view(low, n.name, out_as, src_c)
            return
        if name == "expand_copy":
            src = broadcast_view(src, tuple(spec.shape))
        if name == "permute_copy":
            src = src.with_meta(src.meta.permute(n.args[1]))
        _dma_view(low, n.name, out, src)
        return
    if name in ("full", "zeros", "ones", "scalar_tensor", "full_like", "zeros_like", "ones_like", "new_zeros",
                "new_ones", "new_full", "fill"):
        value = {"zeros": 0, "zeros_like": 0, "new_zeros": 0, "ones": 1, "ones_like": 1, "new_ones": 1}.get(name)
        if value is None:
            value = n.args[1] if name in ("full", "full_like", "new_full", "fill") and len(n.args) > 1 else \
                n.args[0] if name == "scalar_tensor" else 0
        out = low.out_view(n.name, spec)
        _memset_view(low, n.name, out, value)
        return
    if name == "constant_pad_nd":
        src = low.value(n.args[0])
        pad = n.args[1]
        value = n.args[2] if len(n.args) > 2 else 0
        out = low.out_view(n.name, spec)
        _memset_view(low, n.name, out, value)
        inner = out.meta
        nd = len(spec.shape)
        for i in range(len(pad) // 2):
            d = nd - 1 - i
            lo, hi = pad[2 * i], pad[2 * i + 1]
            start = max(lo, 0)
            length = spec.shape[d] - start - max(hi, 0)
            inner = inner.narrow(d, start, length)
        srcv = src
        for i in range(len(pad) // 2):
            d = nd - 1 - i
            lo, hi = pad[2 * i], pad[2 * i + 1]
            s0 = max(-lo, 0)
            srcv = srcv.with_meta(srcv.meta.narrow(d, s0, inner.shape[d]))
        _dma_view(low, n.name, out.with_meta(inner), srcv)
        return
    lower_custom(low, n)


def _dma_view(low: Lowerer, node: str, dst: View, src: View) -> None:
    """Copy view ``src`` into view ``dst`` (same shape): HBM->HBM DMA, or through SBUF with a cast."""
    if src.numel == 0:
        return
    if src.dtype == dst.dtype:
        # a transposing copy goes through the Tensor Engine, never element by element over DMA
        if not copy_transposed(low, node, dst, src):
            copy_dma(low, node, dst, src, choose_split(dst.shape, 1 << 16))
        return
    shape = dst.shape
    split = _resident_split(low, src, shape) or _resident_split(low, dst, shape) or choose_split(shape)
    kept = dst.buf not in low.cand or low.lanes_for(dst.buf, low.hbm[dst.buf]["shape"])
    if kept and lane_tiled(low, shape, {0: src}, [], {node: dst}) \
            and None not in (lanes := (lane_view(dst, shape), lane_view(src, shape))):
        # a cast of a decode step's [batch, hidden] in the lane layout (Residency.lanes_for): all 128 lanes
        dst, src = lanes
        shape, split = dst.shape, 1
    Fm = max(1, min(FREE_TILE, math.prod(shape[split:]) if shape[split:] else 1))
    pin = Pool(low, f"{node}.cin", "sbuf", PMAX, Fm, src.dtype, bufs=2)
    pout = Pool(low, f"{node}.cout", "sbuf", PMAX, Fm, dst.dtype, bufs=2)
    for br in boxes(shape[:split], PMAX):
        for bc in boxes(shape[split:], FREE_TILE):
            t = low.load(node, src, br + bc, pin, split)
            o = pout.tile(t.P, t.F)
            low.act(node, o, t.op(), "copy")
            low.store(node, o, dst, br + bc)


def _resident_split(low: Lowerer, v: View, shape) -> int | None:
    """The cut of a cast whose operand ``v`` is kept in SBUF (or may be): after its row length, so each tile
    is a block of the resident value. A cut of its own (``choose_split``: [4, 4, 16, 16] scores as 16 rows of
    256) would read the value back through HBM (batch 4 cost 2.2x batch 2)."""
    meta = low.hbm.get(v.buf)
    if meta is None or low.cand.get(v.buf) not in ("undecided", "resident") or list(meta["shape"]) != list(shape) \
            or low.lanes_for(v.buf, meta["shape"]):
        return None
    C = low.layout_of(v.buf, meta["shape"])[0]
    return next((k for k in range(1, len(shape)) if math.prod(shape[k:]) == C), None)


def _memset_view(low: Lowerer, node: str, dst: View, value) -> None:
    shape = dst.shape
    split = choose_split(shape)
    Fm = max(1, min(FREE_TILE, math.prod(shape[split:]) if shape[split:] else 1))
    pool = Pool(low, f"{node}.fill", "sbuf", PMAX, Fm, dst.dtype, bufs=1)
    t = pool.tile()
    low.vec("MEMSET", node, t, [], value=value)
    for br in boxes(shape[:split], PMAX):
        for bc in boxes(shape[split:], FREE_TILE):
            P = math.prod(x for _, x in br)
            F = math.prod(x for _, x in bc)
            low.store(node, t.rows(0, P).cols(0, F) if True else t, dst, br + bc)


@lowering("embedding", ops=("embedding", "index_select"), op_classes=("gather",))
def lower_embedding(low: Lowerer, n: Node) -> None:
    """embedding(weight, indices) / index_select(x, 0, idx): indices loaded to SBUF, then one
    indirect DMA per 128 rows gathers table rows (descriptors generated on GpSimd)."""
    name = packet_name(n.target)
    if name == "embedding":
        table, idx = low.value(n.args[0]), low.value(n.args[1])
    else:
        table, dim, idx = low.value(n.args[0]), n.args[1], low.value(n.args[2])
        if dim % table.meta.dim() != 0:
            lower_custom(low, n)
            return
    if table.meta.dim() != 2 or not table.meta[0].is_contiguous():
        lower_custom(low, n)
        return
    D = table.shape[1]
    spec = n.outputs[0]
    out = low.out_view(n.name, spec)
    nidx = idx.numel
    flat_idx = reshape_view(idx, (nidx, 1)) or idx.with_meta(idx.meta.reshape(nidx, 1))
    out2 = reshape_view(out, (nidx, D))
    ipool = Pool(low, f"{n.name}.idx", "sbuf", PMAX, 1, idx.dtype, bufs=2)
    for r0 in range(0, nidx, PMAX):
        P = min(PMAX, nidx - r0)
        it = low.load(n.name, flat_idx, [(r0, P), (0, 1)], ipool, 1)
        desc = P
        nb = P * D * nbytes_of(table.dtype)
        low.emit("GATHER", n.name, [], [it.op()], {"note": "descriptor generation"}, dur=gpsimd_ns(low.p, P))
        dst = view_operand(out2, [(r0, P), (0, D)])
        tab = view_operand(table)
        tab["ap"] = [[table.meta.stride()[0], table.shape[0]], [table.meta.stride()[1], D]]
        # latency: trigger-to-start, off the queue (see Lowerer._dma1)
        low.emit("DMA_INDIRECT", n.name, [dst], [tab, it.op()], {"desc": desc},
                 dur=dma_ns(low.p, nb, desc) - low.p.dma_fixed_ns, hbm_read=nb, hbm_write=nb,
                 latency=low.p.dma_fixed_ns)


@lowering("iota", ops=("arange",), op_classes=("gather",))
def lower_iota(low: Lowerer, n: Node) -> None:
    """arange: GpSimd IOTA into SBUF tiles, stored with DMA."""
    spec = n.outputs[0]
    args = [a for a in n.args]
    start, step = 0, 1      # arange(end) | arange(start, end[, step]); the length comes from the output shape
    if len(args) >= 2:
        start = args[0]
        step = args[2] if len(args) > 2 else n.kwargs.get("step", 1)
    step = n.kwargs.get("step", step)
    N = spec.shape[0] if spec.shape else 1
    out = low.out_view(n.name, spec)
    P = min(PMAX, N)
    cols = ceil_div(N, P)
    pool = Pool(low, f"{n.name}.iota", "sbuf", PMAX, cols, spec.dtype, bufs=1)
    t = pool.tile(P, cols)
    low.emit("IOTA", n.name, [t.op()], [], {"base": start, "channel_multiplier": step * cols, "step": step},
             dur=gpsimd_ns(low.p, cols))
    full = (N // cols) * cols
    if full:
        o2 = reshape_view(out.with_meta(out.meta[:full]), (full // cols, cols))
        low.store(n.name, t.rows(0, full // cols), o2, [(0, full // cols), (0, cols)])
    if N > full:
        rem = N - full
        o2 = reshape_view(out.with_meta(out.meta[full:]), (1, rem))
        low.store(n.name, t.rows(full // cols, 1).cols(0, rem), o2, [(0, 1), (0, rem)])


@lowering("collective", op_classes=("collective",))
def lower_collective(low: Lowerer, n: Node) -> None:
    """A collective: one ``cc`` row timed as the runtime's algorithm for its size over the first ``world_size``
    cores (:func:`neuron_stack.device.collective_cost.collective_ns`)."""
    name = packet_name(n.target)
    kind = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
            "reduce_scatter_tensor": "reduce_scatter"}.get(n.target.split(".")[1] if "." in n.target else name, "wait")
    world = int(low.flags.get("world_size", 1) or 1)
    srcs = [view_operand(low.value(a)) for a in n.args if is_ref(a)]
    nb = sum(s.numel * nbytes_of(s.dtype) for s in n.inputs)
    dsts = [view_operand(low.out_view(n.name, n.outputs[0]))] if n.outputs else []
    # a wait synchronises the ranks: one step's latency
    dur = collective_ns(low.p, kind, nb, world) if kind != "wait" else low.p.intranode_step_latency_ns * (world > 1)
    opcode = {"all_reduce": "CC_ALL_REDUCE", "all_gather": "CC_ALL_GATHER",
              "reduce_scatter": "CC_REDUCE_SCATTER"}.get(kind, "CC_WAIT")
    low.emit(opcode, n.name, dsts, srcs, {"aten": n.target, "args": [], "world": world}, dur=dur, small=False)
