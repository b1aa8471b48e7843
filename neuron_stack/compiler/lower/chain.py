"""Elementwise steps, shared by standalone elementwise ops and every epilogue: a chain of fused
elementwise nodes (``Node.fused_into``) is applied to its host's output tiles while they are still
in SBUF/PSUM, never as separate loads. Registers the elementwise/activation lowering.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from neuron_stack.compiler.lower.common import (
    broadcast_view,
    choose_split,
    flat128,
    identity_tile,
    pools_for,
    reshape_view,
)
from neuron_stack.compiler.lower.custom import lower_custom
from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.registry import lower_alone, lowering
from neuron_stack.compiler.lower.residency import NOT_TILEWISE as _NOT_TILEWISE
from neuron_stack.compiler.lower.resident import lane_layout
from neuron_stack.compiler.lower.tiles import (
    BINARY,
    CLAMPS,
    FREE_TILE,
    PMAX,
    UNARY_ACT,
    Pool,
    Tile,
    View,
    aten_op,
    boxes,
    is_ref,
    meta_tensor,
    nbytes_of,
    packet_name,
)
from neuron_stack.compiler.partition import refs
from neuron_stack.device.cost import ldweights_ns, matmul_ns, scalar_ns
from neuron_stack.ir import Node


def _chain_path(n: Node, prev: str, low: Lowerer) -> tuple[int, list[Node]] | None:
    """(argument index of ``n`` carrying the previous chain value, view nodes from it to ``n``)."""
    for i, a in enumerate(n.args):
        if not is_ref(a):
            continue
        name, path = a["node"], []
        while name != prev:
            nn = low.by_name.get(name)
            if nn is not None and nn.target == "getitem" and len(nn.args) > 1 and nn.args[1] == 0 \
                    and is_ref(nn.args[0]):
                name = nn.args[0]["node"]      # the first output of a tuple op (batch norm's y)
                continue
            if nn is None or nn.op_class != "view" or not nn.target.startswith("aten."):
                break
            path.append(nn)
            name = next(refs(nn.args), None)
            if name is None:
                break
        if name == prev:
            return i, path[::-1]
    return None


def _replay(low: Lowerer, path: list[Node], meta):
    """Apply the view nodes of ``path`` to ``meta`` (their first tensor argument)."""
    for v in path:
        first = [True]

        def conv(a):
            if is_ref(a):
                if first[0]:
                    first[0] = False
                    return meta
                return low.value(a).meta
            if isinstance(a, list):
                return [conv(x) for x in a]
            if isinstance(a, dict) and "dtype" in a:
                return getattr(torch, a["dtype"])
            return a

        meta = aten_op(v.target)(*conv(v.args), **{k: conv(x) for k, x in v.kwargs.items()})
    return meta


class TileCtx:
    """One tile of an elementwise pass: its box in the tile-coordinate shape, and its pools."""

    def __init__(self, low: Lowerer, host_shape, box, split, pools, lanes: bool = False):
        self.low, self.host_shape, self.box, self.split, self.pools = low, host_shape, box, split, pools
        self.lanes = lanes     # lane-layout tiles ([128, rows x H / 128]: lane_view coordinates)

    def load_extra(self, node: str, v: View, key: str) -> Tile:
        key = f"{key}:{v.dtype}"
        pool = self.pools.get(key)
        if pool is None:
            pool = Pool(self.low, f"{node}.{key}", "sbuf", PMAX, self.pools["__F"], v.dtype,
                        bufs=self.pools.get("__bufs", 2))
            self.pools[key] = pool
        if self.lanes:
            t = lanes_from_rows(self.low, node, v, self.box, pool, self.pools)
            if t is not None:
                return t
        return self.low.load(node, v, self.box, pool, self.split)

    def out_tile(self, node: str, key: str, dtype: str) -> Tile:
        key = f"{key}:{dtype}"
        pool = self.pools.get(key)
        P = math.prod(n for _, n in self.box[:self.split])
        F = math.prod(n for _, n in self.box[self.split:])
        if pool is None:
            pool = Pool(self.low, f"{node}.{key}", "sbuf", PMAX, self.pools["__F"], dtype,
                        bufs=self.pools.get("__bufs", 2))
            self.pools[key] = pool
        return pool.tile(P, F)




class Member:
    """A fused node in its host's epilogue: ``idx`` is the argument carrying the chain value,
    ``extras`` its other tensor arguments viewed in the host's tile coordinates, ``layout`` its
    logical shape with strides into host order (where its output is stored)."""

    def __init__(self, node: Node, idx: int, extras: dict, layout):
        self.node, self.idx, self.extras, self.layout = node, idx, extras, layout

    def reshaped(self, shape, lanes: bool = False) -> "Member | None":
        ex = {}
        for i, v in self.extras.items():
            r = lane_view(v, tuple(shape)) if lanes else reshape_view(v, tuple(shape))
            if r is None:
                return None
            ex[i] = r
        return Member(self.node, self.idx, ex, self.layout)


def lane_view(v: View, shape: tuple[int, ...]) -> View | None:
    """``v`` (of ``shape`` [..., H]) in lane-tile coordinates ``[128, ..., H / 128]``: element ``h`` of a row
    on partition ``h // (H / 128)`` (:func:`.resident.lane_layout`); None when its strides forbid the view.

    >>> lane_view(View("x", "float32", meta_tensor((2, 1024))), (2, 1024)).meta.stride()
    (8, 1024, 1)
    """
    nk = shape[-1] // PMAX
    r = reshape_view(v, tuple(shape[:-1]) + (PMAX, nk))
    if r is None:
        return None
    nd = len(shape) + 1
    return r.with_meta(r.meta.permute([nd - 2, *range(nd - 2), nd - 1]))


def lanes_from_rows(low: Lowerer, node: str, lv: View, box, pool: Pool, pools: dict) -> Tile | None:
    """A whole lane tile of ``lv`` (a lane view, :func:`lane_view`) whose value is not kept in the lane layout
    (a matmul's output rows, a graph input), converted on the Tensor Engine: its rows load as they lie (one
    descriptor per row), and each column ``c`` of the lane layout (elements ``p * H / 128 + c``, a strided
    read) is transposed into PSUM against the identity, as ``layout.copy_transposed`` moves data between
    layouts instead of DMAing it one short run per descriptor. None when it does not apply."""
    rows, nk = lv.shape[1:-1], lv.shape[-1]
    R, nd = math.prod(rows), lv.meta.dim()
    r = low.res.get(lv.buf)
    if r is not None and not r.evicted and (r.C, r.T) == (nk, PMAX) or 0 in lv.meta.stride() \
            or box != [(0, PMAX)] + [(0, d) for d in rows] + [(0, nk)] or R * nk > 512 \
            or PMAX * nk * nbytes_of(lv.dtype) > 32768:
        return None     # in place already, a broadcast, a partial tile, over one PSUM bank, or rows over 32 KiB
    inv = [0] * nd
    for i, d in enumerate([nd - 2, *range(nd - 2), nd - 1]):
        inv[d] = i
    nat = reshape_view(lv.with_meta(lv.meta.permute(inv)), (R, PMAX * nk))
    if nat is None:
        return None
    key = f"__lanes:{lv.dtype}"
    if key not in pools:
        pools[key] = (Pool(low, f"{node}.rows:{lv.dtype}", "sbuf", PMAX, PMAX * nk, lv.dtype, bufs=1),
                      Pool(low, f"{node}.lanes", "psum", PMAX, R * nk, "float32", bufs=1))
    rpool, ppool = pools[key]
    t = low.load(node, nat, [(0, R), (0, PMAX * nk)], rpool, 1)
    if t.free_ap is not None:
        return None
    ident = identity_tile(low, lv.dtype, node)
    ps = ppool.tile(PMAX, R * nk)
    for c in range(nk):
        col = Tile(t.key, t.mem, t.dtype, R, PMAX, t.pitch, t.off + c, ((nk, PMAX),))     # rows' elements c, c + nk...
        low.emit("LDWEIGHTS", node, [], [col.op()], {"row": 0}, dur=ldweights_ns(low.p, PMAX, lv.dtype),
                 itype="TRANSPOSE")
        low.emit("MATMUL", node, [ps.cols(c * R, R).op()], [col.op(), ident.rows(0, R).cols(0, R).op()],
                 {"start": True, "stop": True}, dur=matmul_ns(low.p, R, PMAX, lv.dtype),
                 flops=2 * R * R * PMAX, itype="TRANSPOSE")
    out = pool.tile(PMAX, R * nk)
    # PSUM column c * R + row -> lane column row * nk + c: the evacuation reads with that pattern
    src = {"m": "psum", "b": ps.key, "dt": "float32", "o": ps.off, "ap": [[ps.pitch, PMAX], [1, R], [R, nk]]}
    low.emit("ACTIVATE", node, [out.op()], [src], {"func": "copy", "scale": 1.0, "bias": 0.0},
             dur=scalar_ns(low.p, R * nk))
    return out


def lane_tiled(low: Lowerer, shape, views: dict, members: list, outs: dict) -> bool:
    """Tile an elementwise pass in the lane layout: its rows are few and long, and one of its whole-size
    operands or outputs is kept that way (``Residency.lanes_for``); the operands that are not convert on the
    Tensor Engine (:func:`lanes_from_rows`)."""
    lanes = lane_layout(shape)
    if lanes is None or lanes[0] * PMAX != shape[-1]:
        return False
    ins = [v for v in list(views.values()) + [v for m in members for v in m.extras.values()]
           if 0 not in [st for st, d in zip(v.meta.stride(), v.shape) if d > 1]]
    kept = sum((r := low.res.get(v.buf)) is not None and not r.evicted and (r.C, r.T) == lanes for v in ins)
    stay = sum(v.buf in low.cand and low.lanes_for(v.buf, low.hbm[v.buf]["shape"]) for v in outs.values())
    return kept + stay > 0


def epilogue_chain(low: Lowerer, host: Node) -> tuple[list[Member], list[Node]]:
    """The fused nodes applied in ``host``'s epilogue, and the ones that must be lowered alone
    (after the first node that cannot ride along, the rest of the chain is lowered alone too)."""
    members, alone = [], []
    fused = low.fused.get(host.name, [])
    if not host.outputs:
        return [], list(fused)
    hshape = tuple(host.outputs[0].shape)
    prev, layout = host.name, meta_tensor(hshape)
    for k, f in enumerate(fused):
        m = _member(low, f, prev, layout, hshape)
        if m is None:
            alone.extend(fused[k:])
            break
        members.append(m)
        prev, layout = f.name, m.layout
    return members, alone


def _dense(meta) -> bool:
    """True when ``meta`` is a permutation of a contiguous layout (no gaps, no overlap)."""
    dims = sorted((st, n) for st, n in zip(meta.stride(), meta.shape) if n != 1)
    expect = 1
    for st, n in dims:
        if st != expect:
            return False
        expect *= n
    return True


def _member(low: Lowerer, f: Node, prev: str, layout, hshape) -> Member | None:
    found = _chain_path(f, prev, low)
    if found is None or not f.outputs or packet_name(f.target) in _NOT_TILEWISE:
        return None
    idx, path = found
    try:
        lay = _replay(low, path, layout)
    except Exception:
        return None
    fshape = tuple(f.outputs[0].shape)
    if tuple(lay.shape) != fshape or lay.storage_offset() != 0 or not _dense(lay):
        return None
    nd = lay.dim()
    perm = sorted(range(nd), key=lambda d: -lay.stride()[d])
    extras = {}
    for i, a in enumerate(f.args):
        if i == idx or not is_ref(a):
            continue
        x = broadcast_view(low.value(a), fshape)
        r = reshape_view(x.with_meta(x.meta.permute(perm)), hshape)
        if r is None:
            return None
        extras[i] = r
    return Member(f, idx, extras, lay)


def ew_step(ctx: TileCtx, n: Node, cur: Tile | None, cur_idx: int | None, views: dict[int, View]) -> Tile:
    """Emit the instructions of elementwise node ``n`` for one tile. ``cur`` is the chain tile
    (argument ``cur_idx``); ``views`` maps every other tensor argument to a view in tile coordinates."""
    low = ctx.low
    name = packet_name(n.target)
    out_dt = n.outputs[0].dtype
    tiles: dict[int, Tile] = {}
    scalars: dict[int, Any] = {}
    for i, a in enumerate(n.args):
        if i == cur_idx:
            tiles[i] = cur
        elif is_ref(a):
            tiles[i] = ctx.load_extra(n.name, views[i], f"a{i}")
        elif isinstance(a, (int, float, bool)) or a is None:
            scalars[i] = a
    dst = ctx.out_tile(n.name, "o", out_dt)
    elems = dst.P * dst.F
    tensor_args = sorted(tiles)
    alpha = n.kwargs.get("alpha", 1)

    if name in BINARY and len(n.args) >= 2 and "rounding_mode" not in n.kwargs:
        alu = BINARY[name]
        if 0 in tiles and 1 in tiles:
            b = tiles[1]
            if alpha != 1 and alu in ("add", "subtract", "rsub"):
                tmp = ctx.out_tile(n.name, "alpha", b.dtype)
                low.vec("TENSOR_SCALAR", n.name, tmp, [b.op()], op0="multiply", scalar0=alpha)
                b = tmp
            fast = dst.dtype in ("bfloat16", "float16") and alu in ("add", "subtract", "multiply")
            low.vec("TENSOR_TENSOR", n.name, dst, [tiles[0].op(), b.op()], n_inputs=2, fast=fast, op=alu,
                    flops=elems)
            return dst
        if 0 in tiles and 1 in scalars and alu != "rsub":
            imm = scalars[1] * (alpha if alu in ("add", "subtract") else 1)
            low.vec("TENSOR_SCALAR", n.name, dst, [tiles[0].op()], op0=alu, scalar0=imm, flops=elems)
            return dst
    if name in UNARY_ACT and tensor_args == [0]:
        func = UNARY_ACT[name]
        if name == "gelu" and n.kwargs.get("approximate", "none") == "tanh":
            func = "gelu_tanh"
        if func == "copy" and dst.dtype == tiles[0].dtype:
            low.vec("TENSOR_COPY", n.name, dst, [tiles[0].op()])
        else:
            low.act(n.name, dst, tiles[0].op(), func, flops=elems)
        return dst
    if name == "reciprocal" and tensor_args == [0]:
        low.vec("RECIPROCAL", n.name, dst, [tiles[0].op()], flops=elems)
        return dst
    if name in CLAMPS and tensor_args == [0]:
        lo_k, hi_k = CLAMPS[name]
        lo = n.args[1] if len(n.args) > 1 else n.kwargs.get(lo_k)
        hi = n.args[2] if len(n.args) > 2 else n.kwargs.get(hi_k)
        if name == "hardtanh":
            lo, hi = (-1.0 if lo is None else lo), (1.0 if hi is None else hi)
        elif name == "relu6":
            lo, hi = 0.0, 6.0
        elif name == "clamp_max":
            lo, hi = None, n.args[1]
        ops = {}
        if lo is not None:
            ops.update(op0="maximum", scalar0=lo)
        if hi is not None:
            ops.update({"op1" if ops else "op0": "minimum", "scalar1" if ops else "scalar0": hi})
        if ops:
            low.vec("TENSOR_SCALAR", n.name, dst, [tiles[0].op()], flops=elems, **ops)
        else:
            low.vec("TENSOR_COPY", n.name, dst, [tiles[0].op()])
        return dst
    if name == "where" and len(n.args) == 3 and 0 in tiles:
        # dst = b; dst = where(cond, a, dst): a Vector copy and a predicated copy
        if 2 in tiles:
            low.vec("TENSOR_COPY", n.name, dst, [tiles[2].op()])
        else:
            low.vec("MEMSET", n.name, dst, [], value=scalars.get(2, 0))
        a = tiles.get(1)
        if a is None:
            a = ctx.out_tile(n.name, "imm", out_dt)
            low.vec("MEMSET", n.name, a, [], value=scalars.get(1, 0))
        low.vec("COPY_PREDICATED", n.name, dst, [a.op(), tiles[0].op(), dst.op()], n_inputs=2)
        return dst
    # Any other elementwise ATen op is one pass of its engine over the tile with the op's own
    # semantics (the engine's function table): Scalar for activations, Vector otherwise.
    srcs = [tiles[i].op() for i in tensor_args]
    attrs = {"aten": n.target, "args": _template(n.args, tiles), "kwargs": dict(n.kwargs)}
    if n.op_class == "activation":
        low.emit("ACTIVATE", n.name, [dst.op()], srcs, {**attrs, "func": "aten"},
                 dur=max(1, len(srcs)) * scalar_ns(low.p, dst.F), flops=elems)
    else:
        low.vec("TENSOR_TENSOR", n.name, dst, srcs, n_inputs=max(1, len(srcs)), flops=elems,
                cost_n=dst.F * max(1, len(srcs) - 1), **attrs)
    return dst


def _template(args, tiles: dict[int, Tile]):
    order = {i: k for k, i in enumerate(sorted(tiles))}
    return [{"src": order[i]} if i in tiles else a for i, a in enumerate(args)]


def chain_outputs(low: Lowerer, host: Node, members: list[Member], hshape) -> dict[str, View]:
    """HBM buffers for the chain values used outside the chain, as store views in host order.
    A member's buffer keeps host order with its own logical strides (a permuted layout), so
    consumers read it through an ordinary view."""
    out: dict[str, View] = {}
    names = [host] + [m.node for m in members]
    for k, nd in enumerate(names):
        users = low.users.get(nd.name, [])
        internal = k + 1 < len(names) and users and all(_reaches_only(low, u, names[k + 1].name) for u in users)
        if internal and nd.name not in low.out_refs:
            continue
        spec = nd.outputs[0]
        if k == 0:
            v = low.out_view(nd.name, spec)
            out[nd.name] = reshape_view(v, tuple(hshape))
        else:
            strides = tuple(members[k - 1].layout.stride())
            v = low.out_view(nd.name, spec, strides=strides)
            out[nd.name] = View(v.buf, v.dtype, torch.empty(tuple(hshape), dtype=v.meta.dtype, device="meta"))
    return out


def _reaches_only(low: Lowerer, user: str, target: str) -> bool:
    if user == target:
        return True
    un = low.by_name[user]
    if un.op_class != "view" or un.name in low.out_refs:
        return False
    us = low.users.get(user, [])
    return bool(us) and all(_reaches_only(low, u, target) for u in us)


def run_chain(ctx: TileCtx, host_name: str, cur: Tile, members: list[Member], outs: dict[str, View]) -> Tile:
    """Store the host tile if it escapes, then apply every member and store those that escape."""
    low = ctx.low
    if host_name in outs:
        low.store(host_name, cur, outs[host_name], ctx.box)
    for m in members:
        cur = ew_step(ctx, m.node, cur, m.idx, m.extras)
        if m.node.name in outs:
            low.store(m.node.name, cur, outs[m.node.name], ctx.box)
    return cur


def _row_split(low: Lowerer, views: list[View], shape: tuple[int, ...]) -> int | None:
    """The cut that puts the rows of a resident operand (or output) on partitions, so its tiles are read or
    written in place: element-wise ops can tile either way, the value's other consumers (softmax's rows, a
    matmul) cannot. None when no operand is a contiguous row-tiled value of ``shape``."""
    for v in views:
        if v.buf not in low.cand or tuple(v.shape) != tuple(shape) or not v.meta.is_contiguous():
            continue
        r = low.res.get(v.buf)
        if r is not None and r.evicted:
            continue        # in HBM now: every cut reads it alike
        C = r.C if r is not None else low.row_layout(v.buf, low.hbm.get(v.buf, {}).get("shape", v.shape))[0]
        k = next((k for k in range(1, len(shape)) if math.prod(shape[k:]) == C), None)
        if k:
            return k
    return None


def _row_limit(low: Lowerer, views: list[View], shape: tuple[int, ...], split: int) -> int:
    """The partitions a tile of rows ``shape[:split]`` may take: 128, except that a tile stays within one index
    of the outer row dim when the inner one is shorter than 128 and an operand in SBUF does not hold the two as
    one run of rows (a head-major view ``[heads, 64 tokens, d]`` of a resident ``[64 tokens, heads x d]``, a
    table broadcast over the heads) or holds one head a block (residency.py): a tile of two heads' rows would
    move one of them across partitions by DMA, where one head's rows read the resident tiles in place.

    >>> _row_limit(None, [], (1, 4, 64, 16), 3)
    128
    """
    if split < 2 or shape[split - 2] == 1 or not 1 < shape[split - 1] < PMAX:
        return PMAX     # one row per head (token generation) keeps its tiles
    for v in views:
        if v.buf in low.cand and v.meta.dim() == len(shape):
            st = v.meta.stride()
            if st[split - 2] != st[split - 1] * shape[split - 1]:
                return shape[split - 1]
            r = low.res.get(v.buf)
            if r is not None and r.T < PMAX and r.T == shape[split - 1]:
                return shape[split - 1]
    return PMAX


def _elementwise_alone(low: Lowerer, n: Node) -> None:
    lower_elementwise(low, n, standalone=True)


@lowering("elementwise", op_classes=("elementwise", "activation"), alone=_elementwise_alone)
def lower_elementwise(low: Lowerer, n: Node, standalone: bool = False) -> None:
    """Tiles of [<=128 partitions, <=2048 free]: DMA in every tensor argument (broadcasts are
    stride-0 access patterns), one Vector/Scalar instruction per step, fused steps on the same
    tile, DMA out what escapes."""
    members, alone = ([], []) if standalone else epilogue_chain(low, n)
    if not n.outputs:
        return
    if packet_name(n.target) in _NOT_TILEWISE:
        lower_custom(low, n)
        lower_alone(low, [m.node for m in members] + alone)
        return
    shape = tuple(n.outputs[0].shape)
    views = {i: broadcast_view(low.value(a), shape) for i, a in enumerate(n.args) if is_ref(a)}
    outs = chain_outputs(low, n, members, shape)
    # every operand contiguous and unbroadcast: use all 128 partitions, [128, numel/128]
    tshape = shape
    every = list(views.values()) + [v for m in members for v in m.extras.values()] + list(outs.values())
    lanes = None
    if lane_tiled(low, shape, views, members, outs):
        # a decode step's [batch, hidden]: hidden across the partitions, not batch rows on a few lanes
        lanes = ({i: lane_view(v, shape) for i, v in views.items()}, [m.reshaped(shape, True) for m in members],
                 {k: lane_view(v, shape) for k, v in outs.items()})
        if any(v is None for v in lanes[0].values()) or any(m is None for m in lanes[1]) \
                or any(v is None for v in lanes[2].values()):
            lanes = None
    # values that may stay resident in SBUF are row-tiled (resident.py): tiles must follow their rows
    flat = None if lanes or any(v.buf in low.cand for v in every) else flat128(every, shape)
    if lanes:
        views, members, outs = lanes
        tshape = (PMAX, *shape[:-1], shape[-1] // PMAX)
    elif flat is not None:
        tshape = flat[0]
        views = {i: reshape_view(v, tshape) for i, v in views.items()}
        members = [m.reshaped(tshape) for m in members]
        outs = {k: reshape_view(v, tshape) for k, v in outs.items()}
    split = 1 if lanes else (flat is None and _row_split(low, every, tshape)) or choose_split(tshape)
    F = max(1, min(FREE_TILE, math.prod(tshape[split:]) if tshape[split:] else 1))
    pools = pools_for(low, n.name, F)
    for box_r in boxes(tshape[:split], _row_limit(low, every, tshape, split)):
        for box_c in boxes(tshape[split:], FREE_TILE):
            ctx = TileCtx(low, tshape, box_r + box_c, split, pools, lanes=bool(lanes))
            cur = ew_step(ctx, n, None, None, views)
            run_chain(ctx, n.name, cur, members, outs)
    lower_alone(low, alone)
