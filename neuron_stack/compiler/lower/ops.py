"""Per-op-class lowerings of pass 4 (see :mod:`neuron_stack.compiler.lower.lowerer` for the model they share).

Each ``lower_*`` function takes the :class:`~neuron_stack.compiler.lower.lowerer.Lowerer` and one node and emits its
instructions. :func:`dispatch` picks the lowering; ops without a dedicated one run as a GpSimd
library kernel (``CUSTOM_OP``) so every op of every class gets instructions and a time.

>>> dispatch_name("aten.addmm.default", "matmul"), dispatch_name("aten.sort.default", "data_movement")
('lower_matmul', 'lower_custom')
"""
from __future__ import annotations

import math
from typing import Any

from neuron_stack.device.cost import ceil_div, gpsimd_ns, ldweights_ns, matmul_ns, ring_collective_ns
from neuron_stack.ir import Node
from neuron_stack.compiler.lower.lowerer import (BINARY, BN_FMAX, CLAMPS, FLOATS, FREE_TILE, MOVING_FMAX, PMAX, STAT_FMAX, UNARY_ACT,
                    Lowerer, Pool, Tile, View, _meta, _packet_name, _refs, boxes, nbytes_of, view_operand)

# ----------------------------------------------------------------------------------------------
# helpers


def _is_ref(a) -> bool:
    return isinstance(a, dict) and set(a) == {"node"}


def _torch():
    import torch
    return torch


def _bcast(v: View, shape: tuple[int, ...]) -> View:
    """``v`` broadcast to ``shape`` (stride-0 dims): loads of it fill whole tiles."""
    if v.shape == tuple(shape):
        return v
    return v.with_meta(v.meta.broadcast_to(shape))


def _reshape_view(v: View, shape: tuple[int, ...]) -> View | None:
    try:
        return v.with_meta(v.meta.view(shape))
    except RuntimeError:
        return None


def _n_boxes(shape, limit) -> int:
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
        nr = _n_boxes(rows, PMAX)
        nc = _n_boxes(cols, free_limit)
        f = min(math.prod(cols), free_limit) if cols else 1
        cost = nr * nc * max(64, f)
        if best is None or cost < best:
            best, best_k = cost, k
    return best_k


def _flat128(views: list[View], shape: tuple[int, ...]) -> tuple[tuple[int, ...], list[View]] | None:
    """Contiguous operands of an elementwise op viewed as [128, numel/128]: full partitions."""
    n = math.prod(shape)
    if n < PMAX * 64 or n % PMAX:
        return None
    new = (PMAX, n // PMAX)
    out = []
    for v in views:
        if not v.meta.is_contiguous():
            return None
        r = _reshape_view(v, new)
        if r is None:
            return None
        out.append(r)
    return new, out


# ----------------------------------------------------------------------------------------------
# constants: compile-time layout and dtype choices


def prepare_constants(low: Lowerer) -> None:
    """Weights are laid out and cast at compile time, as neuronx-cc does: a weight used as a
    matmul operand whose contraction dim is contiguous is stored transposed (so tiles load with
    long contiguous rows), and with ``--auto-cast`` it is stored in the cast type."""
    torch = _torch()
    low.const_strides: dict[str, tuple] = {}
    low.const_dtype: dict[str, str] = {}
    low.preparing = True
    for n in low.nodes:
        if dispatch_name(n.target, n.op_class) == "lower_conv" and len(n.args) > 1 and _is_ref(n.args[1]):
            from neuron_stack.compiler.lower.conv import conv_weight_strides
            w = low.value(n.args[1])
            base = low.hbm.get(w.buf, {}).get("shape", [])
            if w.buf in low.const_names and len(base) in (3, 4) and tuple(base) == w.shape:
                low.const_strides[w.buf] = conv_weight_strides(base)      # [C, *K, O] storage
                if low.auto_cast in ("matmult", "all") and w.dtype == "float32" and _only_matmul_users(low, w.buf):
                    low.const_dtype[w.buf] = low.cast_type
            continue
        if n.op_class != "matmul" or n.fused_into:
            continue
        ops = _matmul_operands(low, n)
        if ops is None:
            continue
        a, b = ops[0], ops[1]
        for v, want_contig_dim in ((a, -2), (b, -1)):
            if v.buf not in low.const_names or len(low.hbm.get(v.buf, {}).get("shape", [])) != 2:
                continue
            if v.meta.stride()[want_contig_dim] != 1 and v.meta.dim() >= 2:
                base = low.hbm[v.buf]["shape"]
                low.const_strides[v.buf] = (1, base[0])      # column-major storage
            if low.auto_cast in ("matmult", "all") and v.dtype == "float32" and _only_matmul_users(low, v.buf):
                low.const_dtype[v.buf] = low.cast_type
    # forget the views resolved while looking, so they are rebuilt over the chosen layouts
    low.values.clear()
    low.hbm.clear()
    low.inputs.clear()
    low.preparing = False
    del torch


def _only_matmul_users(low: Lowerer, name: str) -> bool:
    for u in low.users.get(name, []):
        un = low.by_name[u]
        if un.op_class == "view":
            if not _only_matmul_users(low, u):
                return False
        elif un.op_class not in ("matmul", "conv"):
            return False
    return True


# ----------------------------------------------------------------------------------------------
# dispatch

_ROWWISE = {"_softmax": "softmax", "_log_softmax": "log_softmax", "native_layer_norm": "layer_norm",
            "sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "logsumexp": "logsumexp",
            "var": "var", "std": "std", "any": "any", "all": "all", "prod": "prod", "cumsum": "cumsum"}
_DM_COPY = ("clone", "_to_copy", "copy", "lift_fresh_copy", "alias", "cat", "stack", "constant_pad_nd",
            "repeat", "flip", "roll", "expand_copy", "permute_copy", "view_copy", "_unsafe_view",
            "reshape", "slice_scatter", "select_scatter", "full", "full_like", "zeros", "zeros_like",
            "ones", "ones_like", "scalar_tensor", "new_zeros", "new_ones", "new_full", "fill")


def dispatch_name(target: str, op_class: str) -> str:
    """Name of the lowering function for an op (data-driven; see :func:`dispatch`)."""
    name = _packet_name(target)
    if op_class == "matmul" and name in ("mm", "addmm", "bmm", "baddbmm", "mv", "dot", "addmv"):
        return "lower_matmul"
    if op_class == "conv" and name == "convolution":
        return "lower_conv"
    if name in ("max_pool2d_with_indices", "avg_pool2d"):
        return "lower_pool"
    if name == "_native_batch_norm_legit_no_training":
        return "lower_batch_norm"
    if op_class in ("elementwise", "activation"):
        return "lower_elementwise"
    if name in _ROWWISE and op_class in ("reduction", "softmax", "normalization"):
        return "lower_rowwise"
    if op_class == "gather" and name in ("embedding", "index_select"):
        return "lower_embedding"
    if op_class == "gather" and name == "arange":
        return "lower_iota"
    if op_class in ("data_movement", "view") and name in _DM_COPY:
        return "lower_copy"
    if op_class == "collective":
        return "lower_collective"
    return "lower_custom"


_CONV_MODULE = ("lower_conv", "lower_pool", "lower_batch_norm")   # in lower_conv.py (built on this module)


def dispatch(n: Node):
    """The lowering function for node ``n``."""
    name = dispatch_name(n.target, n.op_class)
    if name in _CONV_MODULE:
        from neuron_stack.compiler.lower import conv as lower_conv
        return getattr(lower_conv, name)
    return globals()[name]


# ----------------------------------------------------------------------------------------------
# elementwise steps (shared by standalone elementwise ops and every epilogue)

def _chain_path(n: Node, prev: str, low: Lowerer) -> tuple[int, list[Node]] | None:
    """(argument index of ``n`` carrying the previous chain value, view nodes from it to ``n``)."""
    for i, a in enumerate(n.args):
        if not _is_ref(a):
            continue
        name, path = a["node"], []
        while name != prev:
            nn = low.by_name.get(name)
            if nn is None or nn.op_class != "view" or not nn.target.startswith("aten."):
                break
            path.append(nn)
            name = next(_refs(nn.args), None)
            if name is None:
                break
        if name == prev:
            return i, path[::-1]
    return None


def _replay(low: Lowerer, path: list[Node], meta):
    """Apply the view nodes of ``path`` to ``meta`` (their first tensor argument)."""
    torch = _torch()
    for v in path:
        first = [True]

        def conv(a):
            if _is_ref(a):
                if first[0]:
                    first[0] = False
                    return meta
                return low.value(a).meta
            if isinstance(a, list):
                return [conv(x) for x in a]
            if isinstance(a, dict) and "dtype" in a:
                return getattr(torch, a["dtype"])
            return a

        from neuron_stack.compiler.lower.lowerer import _aten_op
        meta = _aten_op(v.target)(*conv(v.args), **{k: conv(x) for k, x in v.kwargs.items()})
    return meta


class TileCtx:
    """One tile of an elementwise pass: its box in the tile-coordinate shape, and its pools."""

    def __init__(self, low: Lowerer, host_shape, box, split, pools):
        self.low, self.host_shape, self.box, self.split, self.pools = low, host_shape, box, split, pools

    def load_extra(self, node: str, v: View, key: str) -> Tile:
        key = f"{key}:{v.dtype}"
        pool = self.pools.get(key)
        if pool is None:
            pool = Pool(self.low, f"{node}.{key}", "sbuf", PMAX, self.pools["__F"], v.dtype,
                        bufs=self.pools.get("__bufs", 2))
            self.pools[key] = pool
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


_NOT_TILEWISE = ("triu", "tril", "glu", "mse_loss", "mse_loss_backward", "fill", "logit")


class Member:
    """A fused node in its host's epilogue: ``idx`` is the argument carrying the chain value,
    ``extras`` its other tensor arguments viewed in the host's tile coordinates, ``layout`` its
    logical shape with strides into host order (where its output is stored)."""

    def __init__(self, node: Node, idx: int, extras: dict, layout):
        self.node, self.idx, self.extras, self.layout = node, idx, extras, layout

    def reshaped(self, shape) -> "Member | None":
        ex = {}
        for i, v in self.extras.items():
            r = _reshape_view(v, tuple(shape))
            if r is None:
                return None
            ex[i] = r
        return Member(self.node, self.idx, ex, self.layout)


def _chain(low: Lowerer, host: Node) -> tuple[list[Member], list[Node]]:
    """The fused nodes applied in ``host``'s epilogue, and the ones that must be lowered alone
    (after the first node that cannot ride along, the rest of the chain is lowered alone too)."""
    members, alone = [], []
    fused = low.fused.get(host.name, [])
    if not host.outputs:
        return [], list(fused)
    hshape = tuple(host.outputs[0].shape)
    prev, layout = host.name, _meta(hshape)
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
    if found is None or not f.outputs or _packet_name(f.target) in _NOT_TILEWISE:
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
        if i == idx or not _is_ref(a):
            continue
        x = _bcast(low.value(a), fshape)
        r = _reshape_view(x.with_meta(x.meta.permute(perm)), hshape)
        if r is None:
            return None
        extras[i] = r
    return Member(f, idx, extras, lay)


def ew_step(ctx: TileCtx, n: Node, cur: Tile | None, cur_idx: int | None, views: dict[int, View]) -> Tile:
    """Emit the instructions of elementwise node ``n`` for one tile. ``cur`` is the chain tile
    (argument ``cur_idx``); ``views`` maps every other tensor argument to a view in tile coordinates."""
    low = ctx.low
    name = _packet_name(n.target)
    out_dt = n.outputs[0].dtype
    tiles: dict[int, Tile] = {}
    scalars: dict[int, Any] = {}
    for i, a in enumerate(n.args):
        if i == cur_idx:
            tiles[i] = cur
        elif _is_ref(a):
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
        from neuron_stack.device.cost import scalar_ns
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
    torch = _torch()
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
            out[nd.name] = _reshape_view(v, tuple(hshape))
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


def _lower_alone(low: Lowerer, alone: list[Node]) -> None:
    for f in alone:
        if dispatch_name(f.target, f.op_class) == "lower_elementwise":
            lower_elementwise(low, f, standalone=True)
        else:
            dispatch(f)(low, f)


def _pools(low: Lowerer, key: str, F: int) -> dict:
    cache = low.__dict__.setdefault("_pool_cache", {})
    return cache.setdefault((key, F), {"__F": F})


# ----------------------------------------------------------------------------------------------
# elementwise / activation


def lower_elementwise(low: Lowerer, n: Node, standalone: bool = False) -> None:
    """Tiles of [<=128 partitions, <=2048 free]: DMA in every tensor argument (broadcasts are
    stride-0 access patterns), one Vector/Scalar instruction per step, fused steps on the same
    tile, DMA out what escapes."""
    members, alone = ([], []) if standalone else _chain(low, n)
    if not n.outputs:
        return
    if _packet_name(n.target) in _NOT_TILEWISE:
        lower_custom(low, n)
        _lower_alone(low, [m.node for m in members] + alone)
        return
    shape = tuple(n.outputs[0].shape)
    views = {i: _bcast(low.value(a), shape) for i, a in enumerate(n.args) if _is_ref(a)}
    outs = chain_outputs(low, n, members, shape)
    # every operand contiguous and unbroadcast: use all 128 partitions, [128, numel/128]
    tshape = shape
    every = list(views.values()) + [v for m in members for v in m.extras.values()] + list(outs.values())
    # values that may stay resident in SBUF are row-tiled (resident.py): tiles must follow their rows
    flat = None if any(v.buf in low.cand for v in every) else _flat128(every, shape)
    if flat is not None:
        tshape = flat[0]
        views = {i: _reshape_view(v, tshape) for i, v in views.items()}
        members = [m.reshaped(tshape) for m in members]
        outs = {k: _reshape_view(v, tshape) for k, v in outs.items()}
    split = choose_split(tshape)
    F = max(1, min(FREE_TILE, math.prod(tshape[split:]) if tshape[split:] else 1))
    pools = _pools(low, n.name, F)
    for box_r in boxes(tshape[:split], PMAX):
        for box_c in boxes(tshape[split:], FREE_TILE):
            ctx = TileCtx(low, tshape, box_r + box_c, split, pools)
            cur = ew_step(ctx, n, None, None, views)
            run_chain(ctx, n.name, cur, members, outs)
    _lower_alone(low, alone)


# ----------------------------------------------------------------------------------------------
# matmul


def _matmul_operands(low: Lowerer, n: Node):
    """(A [..,M,K], B [..,K,N], bias or None, alpha, beta, batched) as views, or None."""
    name = _packet_name(n.target)
    a = n.args
    try:
        if name == "mm":
            A, B, C, alpha, beta = low.value(a[0]), low.value(a[1]), None, 1, 1
        elif name == "addmm":
            C, A, B = low.value(a[0]), low.value(a[1]), low.value(a[2])
            beta, alpha = n.kwargs.get("beta", 1), n.kwargs.get("alpha", 1)
        elif name == "bmm":
            A, B, C, alpha, beta = low.value(a[0]), low.value(a[1]), None, 1, 1
        elif name == "baddbmm":
            C, A, B = low.value(a[0]), low.value(a[1]), low.value(a[2])
            beta, alpha = n.kwargs.get("beta", 1), n.kwargs.get("alpha", 1)
        elif name in ("mv", "addmv"):
            off = 1 if name == "addmv" else 0
            A, x = low.value(a[off]), low.value(a[off + 1])
            B = x.with_meta(x.meta.unsqueeze(-1))
            C = low.value(a[0]) if name == "addmv" else None
            beta, alpha = n.kwargs.get("beta", 1), n.kwargs.get("alpha", 1)
        elif name == "dot":
            x, y = low.value(a[0]), low.value(a[1])
            A, B, C, alpha, beta = x.with_meta(x.meta.unsqueeze(0)), y.with_meta(y.meta.unsqueeze(-1)), None, 1, 1
        else:
            return None
    except (KeyError, IndexError, TypeError):
        return None
    return A, B, C, alpha, beta


class _Identity:
    """The [128, 128] identity in SBUF used by Tensor Engine transposes, built on GpSimd by the
    first op that needs it (its instruction belongs to that op, so it has a source line) and
    rebuilt when the tile-pool ring has reused its slot (``Lowerer.claim`` forgets it)."""

    def __init__(self, low: Lowerer, dtype: str, node: str):
        self.tile = Pool(low, f"__identity_{dtype}", "sbuf", PMAX, PMAX, dtype, bufs=1).tile()
        low.emit("AFFINE_SELECT", node, [self.tile.op()], [],
                 {"cmp": "equal", "channel_multiplier": 1, "step": -1, "base": 0, "on_true": 1.0,
                  "on_false": 0.0}, dur=gpsimd_ns(low.p, PMAX))


def _identity(low: Lowerer, dtype: str, node: str) -> Tile:
    ids = low.__dict__.setdefault("_identity", {})
    if dtype not in ids:
        ids[dtype] = _Identity(low, dtype, node)
    return ids[dtype].tile


def transpose_to(low: Lowerer, node: str, src: Tile, dst: Tile, psum_pool: Pool, engine: str = "vector") -> None:
    """dst[F, P] = src[P, F].T on the Tensor Engine (matmul against the identity), via PSUM."""
    ident = _identity(low, src.dtype, node)
    pt = psum_pool.tile(src.F, src.P)
    low.emit("LDWEIGHTS", node, [], [src.op()], {"row": 0}, dur=ldweights_ns(low.p, src.F, src.dtype),
             itype="TRANSPOSE")
    low.emit("MATMUL", node, [pt.op()], [src.op(), ident.rows(0, src.P).cols(0, src.P).op()],
             {"start": True, "stop": True}, dur=matmul_ns(low.p, src.P, src.F, src.dtype),
             flops=2 * src.P * src.P * src.F, itype="TRANSPOSE")
    if engine == "scalar":
        low.act(node, dst, pt.op(), "copy")
    else:
        low.vec("TENSOR_COPY", node, dst, [pt.op()])


def lower_matmul(low: Lowerer, n: Node) -> None:
    """out[M,N] = A[M,K] @ B[K,N] (batched for bmm): stationary A^T tiles [K<=128, M<=128],
    moving B tiles [K<=128, N<=512] accumulating over K in PSUM banks, evacuated through the
    epilogue (alpha, bias, fused activations) to SBUF and stored."""
    ops = _matmul_operands(low, n)
    if ops is None:
        lower_custom(low, n)
        return
    A, B, C, alpha, beta = ops
    members, alone = _chain(low, n)
    oshape = tuple(n.outputs[0].shape)
    batched = A.meta.dim() == 3
    if A.meta.dim() > 3 or B.meta.dim() > 3:
        lower_custom(low, n)
        _lower_alone(low, alone)
        return
    M, K = A.shape[-2], A.shape[-1]
    N = B.shape[-1]
    nb = A.shape[0] if batched else 1
    mm_dt = low.cast_type if low.auto_cast in ("matmult", "all") and A.dtype == "float32" else A.dtype
    if mm_dt not in FLOATS:
        mm_dt = "float32"
    out_dt = n.outputs[0].dtype
    # the output as [nb, M, N] (dot/mv produce fewer dims)
    out_views = chain_outputs(low, n, members, oshape)
    hshape = (nb, M, N)
    out3 = {k: _reshape_view(v, hshape) for k, v in out_views.items()}
    members = [m.reshaped(hshape) for m in members]
    if any(m is None for m in members):
        raise AssertionError("matmul epilogue operands are contiguous reshapes of the output")
    Cv = None
    if C is not None:
        Cv = _reshape_view(_bcast(C, oshape), hshape) if oshape != hshape else _bcast(C, oshape)
        if Cv is not None and oshape != hshape:
            pass
        if Cv is None:
            Cv = _bcast(C.with_meta(C.meta.reshape(-1) if C.numel == M * N else C.meta), (M, N)) if False else None
        if Cv is not None and Cv.meta.dim() == 2:
            Cv = Cv.with_meta(Cv.meta.unsqueeze(0))
    A3 = A if batched else A.with_meta(A.meta.unsqueeze(0))
    B3 = B if B.meta.dim() == 3 else B.with_meta(B.meta.unsqueeze(0).expand(nb, K, N))
    nk = ceil_div(K, PMAX)
    NG = min(N, 2 * MOVING_FMAX)
    MG = min(M, 4 * STAT_FMAX)
    a_direct = A3.meta.stride()[-2] == 1 or M == 1      # A^T rows are contiguous along M
    b_direct = B3.meta.stride()[-1] == 1 or N == 1
    # pools (SBUF bytes per partition; PSUM banks)
    es = nbytes_of(mm_dt)
    b_bytes = nk * NG * es
    budget = low.sbuf.cap          # the tile-pool ring (the rest of SBUF holds resident values)
    panel_resident = b_bytes <= budget // 2
    # double-buffer the moving panel when two fit: the next panel loads while this one multiplies
    panel_bufs = (2 * nk if 2 * b_bytes <= budget // 2 else nk) if panel_resident else 3
    bpool = Pool(low, f"{n.name}.B", "sbuf", PMAX, NG, mm_dt, bufs=panel_bufs)
    atpool = Pool(low, f"{n.name}.AT", "sbuf", PMAX, MG, mm_dt, bufs=min(2 * nk, max(2, (budget // 4) // (MG * es))))
    acc_pool = Pool(low, f"{n.name}.acc", "psum", PMAX, NG, "float32", bufs=2)
    tp_pool = Pool(low, f"{n.name}.tp", "psum", PMAX, PMAX, "float32", bufs=2) if not (a_direct and b_direct) else None
    nat_pool = Pool(low, f"{n.name}.nat", "sbuf", PMAX, PMAX, A.dtype, bufs=8) if not (a_direct and b_direct) else None
    ld_pool = None
    if (a_direct or b_direct) and (A.dtype != mm_dt or B.dtype != mm_dt):
        ld_pool = Pool(low, f"{n.name}.ld", "sbuf", PMAX, max(NG, MG), A.dtype, bufs=2)
    # stores are slow next to one bank's evacuation: enough output slots to keep PSUM draining
    epi_pools = {"__F": min(NG, MOVING_FMAX), "__bufs": 6}

    def load_cast(v: View, box, pool: Pool, split: int) -> Tile:
        """DMA a box; cast to the matmul dtype on the way (auto-cast) through a staging tile."""
        if v.dtype == mm_dt:
            return low.load(n.name, v, box, pool, split)
        stage = low.load(n.name, v, box, ld_pool, split)
        t = pool.tile(stage.P, stage.F)
        low.act(n.name, t, stage.op(), "copy")
        return t

    def transposed(v2: View, r0, rn, c0, cn, pool: Pool) -> Tile:
        """Tile [cn, rn] = v2[r0:r0+rn, c0:c0+cn].T through natural loads + TensorE transposes."""
        t = pool.tile(cn, rn)
        for rr in range(0, rn, PMAX):
            rlen = min(PMAX, rn - rr)
            src = low.load(n.name, v2, [(r0 + rr, rlen), (c0, cn)], nat_pool, 1)
            transpose_to(low, n.name, src, t.cols(rr, rlen).as_dtype(mm_dt), tp_pool)
        return t

    for b in range(nb):
        Ab = A3.with_meta(A3.meta[b])
        Bb = B3.with_meta(B3.meta[b])
        ATv = Ab.with_meta(Ab.meta.t())          # [K, M]
        for n0 in range(0, N, NG):
            nw = min(NG, N - n0)
            panel = []

            def moving(kb):
                k0, kl = kb * PMAX, min(PMAX, K - kb * PMAX)
                if b_direct:
                    return load_cast(Bb, [(k0, kl), (n0, nw)], bpool, 1)
                # B = W.T with K contiguous: natural tiles of W [n, k] transposed on TensorE
                Wv = Bb.with_meta(Bb.meta.t())   # [N, K]
                return transposed(Wv, n0, nw, k0, kl, bpool)

            if panel_resident:
                panel = [moving(kb) for kb in range(nk)]
            for m0 in range(0, M, MG):
                mw = min(MG, M - m0)
                ats = []
                for kb in range(nk):
                    k0, kl = kb * PMAX, min(PMAX, K - kb * PMAX)
                    if a_direct:
                        ats.append(load_cast(ATv, [(k0, kl), (m0, mw)], atpool, 1))
                    else:
                        ats.append(transposed(Ab, m0, mw, k0, kl, atpool))
                for ms in range(0, mw, STAT_FMAX):
                    mp = min(STAT_FMAX, mw - ms)
                    acc = acc_pool.tile(mp, nw)
                    for kb in range(nk):
                        kl = min(PMAX, K - kb * PMAX)
                        stat = ats[kb].cols(ms, mp)
                        mov_t = panel[kb] if panel_resident else moving(kb)
                        low.emit("LDWEIGHTS", n.name, [], [stat.op()], {}, dur=ldweights_ns(low.p, mp, mm_dt))
                        for c0 in range(0, nw, MOVING_FMAX):
                            cw = min(MOVING_FMAX, nw - c0)
                            low.emit("MATMUL", n.name, [acc.cols(c0, cw).op()], [stat.op(), mov_t.cols(c0, cw).op()],
                                     {"start": kb == 0, "stop": kb == nk - 1},
                                     dur=matmul_ns(low.p, cw, mp, mm_dt), flops=2 * kl * mp * cw, itype="REGULAR",
                                     small=False)
                    # evacuate PSUM through the epilogue, one bank (<=512 columns) at a time
                    for c0 in range(0, nw, MOVING_FMAX):
                        cw = min(MOVING_FMAX, nw - c0)
                        box = [(b, 1), (m0 + ms, mp), (n0 + c0, cw)]
                        ctx = TileCtx(low, hshape, box, 2, epi_pools)
                        src = acc.cols(c0, cw)
                        out_t = ctx.out_tile(n.name, "evac", out_dt if not members else "float32")
                        if Cv is not None:
                            ctile = ctx.load_extra(n.name, Cv.with_meta(Cv.meta.expand(nb, M, N)) if Cv.meta.shape[0] != nb else Cv, "bias")
                            if beta != 1:     # into a fresh tile: ctile may be a resident value read in place
                                scaled = ctx.out_tile(n.name, "beta", ctile.dtype)
                                low.vec("TENSOR_SCALAR", n.name, scaled, [ctile.op()], op0="multiply", scalar0=beta)
                                ctile = scaled
                            if alpha != 1:
                                low.vec("TENSOR_SCALAR", n.name, out_t, [src.op()], op0="multiply", scalar0=alpha)
                                low.vec("TENSOR_TENSOR", n.name, out_t, [out_t.op(), ctile.op()], n_inputs=2, op="add",
                                        flops=mp * cw)
                            else:
                                low.vec("TENSOR_TENSOR", n.name, out_t, [src.op(), ctile.op()], n_inputs=2, op="add",
                                        flops=mp * cw)
                        else:
                            low.act(n.name, out_t, src.op(), "copy", scale=alpha)
                        run_chain(ctx, n.name, out_t, members, out3)
    _lower_alone(low, alone)


# ----------------------------------------------------------------------------------------------
# generic: a GpSimd library kernel over whole tensors


def lower_custom(low: Lowerer, n: Node) -> None:
    """Ops without a dedicated lowering run as one GpSimd ``CUSTOM_OP`` over whole HBM tensors
    (GpSimd cores reach memory through their own DMA): ``150 + N`` cycles per 128-lane pass."""
    srcs, template = [], []
    for a in n.args:
        template.append(_tmpl(low, a, srcs))
    kwargs = {k: _tmpl(low, v, srcs) for k, v in n.kwargs.items()}
    dsts = []
    for i, spec in enumerate(n.outputs):
        key = n.name if i == 0 else f"{n.name}:{i}"
        v = low.out_view(key, spec)
        dsts.append(view_operand(v))
    elems = sum(math.prod(s.shape) for s in n.inputs) + sum(math.prod(s.shape) for s in n.outputs)
    nread = sum(math.prod(_shape(o)) * nbytes_of(o["dt"]) for o in srcs)
    nwrite = sum(spec.numel * nbytes_of(spec.dtype) for spec in n.outputs)
    dur = gpsimd_ns(low.p, ceil_div(elems, PMAX)) + (nread + nwrite) / low.p.dma_bytes_per_ns_per_engine
    low.emit("CUSTOM_OP", n.name, dsts, srcs, {"aten": n.target, "args": template, "kwargs": kwargs},
             dur=dur, flops=n.flops, hbm_read=nread, hbm_write=nwrite, small=False)


def _shape(o: dict) -> list[int]:
    return [num for _, num in o["ap"]]


def _tmpl(low: Lowerer, a, srcs: list):
    if _is_ref(a):
        v = low.value(a)
        op = view_operand(v)
        op["shape"] = list(v.shape)
        op["strides"] = list(v.meta.stride())
        op["o"] = int(v.meta.storage_offset())
        srcs.append(op)
        return {"src": len(srcs) - 1}
    if isinstance(a, list):
        return [_tmpl(low, x, srcs) for x in a]
    return a


# ----------------------------------------------------------------------------------------------
# data movement: DMA with access patterns


def lower_copy(low: Lowerer, n: Node) -> None:
    """clone/_to_copy/cat/pad/... as DMA between HBM access patterns (via SBUF when the dtype changes)."""
    name = _packet_name(n.target)
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
    if name in ("clone", "_to_copy", "copy", "lift_fresh_copy", "alias", "expand_copy", "permute_copy",
                "view_copy", "_unsafe_view", "reshape") and n.args and _is_ref(n.args[-1] if name == "copy" else n.args[0]):
        src = low.value(n.args[1] if name == "copy" else n.args[0])
        out = low.out_view(n.name, spec)
        if name in ("_unsafe_view", "reshape", "view_copy"):
            src_c = src
            # a reshape of a non-viewable layout: copy element order (row-major of the source)
            out_as = _reshape_view(out, src.shape)
            _dma_view(low, n.name, out_as, src_c)
            return
        if name == "expand_copy":
            src = _bcast(src, tuple(spec.shape))
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
        shape = dst.shape
        split = choose_split(shape, 1 << 16)
        # big HBM->HBM copies: one DMA per 128-row box keeps each descriptor list bounded
        for br in boxes(shape[:split], PMAX * 64):
            for bc in boxes(shape[split:], 1 << 16):
                low.dma(node, view_operand(dst, br + bc), view_operand(src, br + bc))
        return
    shape = dst.shape
    split = choose_split(shape)
    Fm = max(1, min(FREE_TILE, math.prod(shape[split:]) if shape[split:] else 1))
    pin = Pool(low, f"{node}.cin", "sbuf", PMAX, Fm, src.dtype, bufs=2)
    pout = Pool(low, f"{node}.cout", "sbuf", PMAX, Fm, dst.dtype, bufs=2)
    for br in boxes(shape[:split], PMAX):
        for bc in boxes(shape[split:], FREE_TILE):
            t = low.load(node, src, br + bc, pin, split)
            o = pout.tile(t.P, t.F)
            low.act(node, o, t.op(), "copy")
            low.store(node, o, dst, br + bc)


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


# ----------------------------------------------------------------------------------------------
# row-wise: softmax, layer norm, group norm, reductions


def _rows_free(v: View, dims: list[int]) -> tuple[View, int]:
    """Permute ``dims`` (reduced / normalised) to the end: returns the view and the split point."""
    nd = v.meta.dim()
    dims = sorted(d % nd for d in dims) if nd else []
    keep = [d for d in range(nd) if d not in dims]
    return v.with_meta(v.meta.permute(keep + dims)), len(keep)


def lower_rowwise(low: Lowerer, n: Node) -> None:
    """Softmax, log-softmax, layer/group norm and reductions: the reduced dims become the free axis,
    the kept dims the partitions; whole rows stay in SBUF when they fit (else chunked passes and,
    for softmax, a spill of the exponentials to HBM)."""
    kind = _ROWWISE[_packet_name(n.target)]
    x = low.value(n.args[0])
    nd = x.meta.dim()
    args = n.args
    if kind in ("softmax", "log_softmax"):
        dims = [args[1]]
    elif kind == "layer_norm":
        dims = list(range(nd - len(args[1]), nd))
    elif kind == "cumsum":
        dims = [args[1]]
    else:
        d = args[1] if len(args) > 1 else n.kwargs.get("dim")
        if d is None or d == []:
            dims = list(range(nd))
        else:
            dims = [d] if isinstance(d, int) else list(d)
    if nd == 0:
        dims = []
    if kind in ("var", "std") and _packet_name(n.target) and "correction" not in n.kwargs and len(args) > 2 \
            and isinstance(args[2], bool):
        pass
    xv, split = _rows_free(x, dims)
    rows, free = xv.shape[:split], xv.shape[split:]
    D = math.prod(free) if free else 1
    if kind == "cumsum" and (D > FREE_TILE or len(free) > 1):
        lower_custom(low, n)
        return
    members, alone = _chain(low, n) if kind in ("layer_norm",) else ([], [])
    es = 4
    fits = D * es * 3 <= low.sbuf.cap // 2
    Fc = D if fits else FREE_TILE
    chunks = boxes(free, Fc) if free else [[]]
    nch = len(chunks)
    xin = Pool(low, f"{n.name}.x", "sbuf", PMAX, min(D, Fc) if free else 1, x.dtype, bufs=2 if fits else 3)
    work = Pool(low, f"{n.name}.w", "sbuf", PMAX, min(D, Fc) if free else 1, "float32", bufs=2 if fits else 3)
    nbn = sum(ceil_div(math.prod(x for _, x in cb), BN_FMAX) for cb in chunks)
    small = Pool(low, f"{n.name}.s", "sbuf", PMAX, max(8, 3 * nbn, nch), "float32", bufs=8)
    out_spec = n.outputs[0]
    if kind in ("softmax", "log_softmax", "cumsum"):
        out = low.out_view(n.name, out_spec)
        ov, _ = _rows_free(out, dims)
    elif kind == "layer_norm":
        ov_map = chain_outputs(low, n, members, tuple(out_spec.shape))
    else:
        out = low.out_view(n.name, out_spec)
        # reduced output: kept dims in order, reduced ones gone (or 1)
        ov = _reshape_view(out, tuple(rows) + (1,))
    spill_bufs = []
    for br in boxes(tuple(rows), PMAX):
        P = math.prod(x for _, x in br) if rows else 1
        st = small.tile(P, None)
        if kind in ("softmax", "log_softmax", "logsumexp"):
            m = small.tile(P, 1)
            if fits:
                xt = low.load(n.name, xv, br + chunks[0], xin, split)
                low.vec("REDUCE", n.name, m, [xt.op()], op="max", cost_n=xt.F)
            else:
                parts = small.tile(P, nch)
                for ci, cb in enumerate(chunks):
                    xt = low.load(n.name, xv, br + cb, xin, split)
                    low.vec("REDUCE", n.name, parts.cols(ci, 1), [xt.op()], op="max", cost_n=xt.F)
                low.vec("REDUCE", n.name, m, [parts.op()], op="max")
            negm = small.tile(P, 1)
            low.vec("TENSOR_SCALAR", n.name, negm, [m.op()], op0="multiply", scalar0=-1.0)
            s = small.tile(P, 1)
            sums = small.tile(P, nch)
            es_tiles = []
            for ci, cb in enumerate(chunks):
                if not fits:
                    xt = low.load(n.name, xv, br + cb, xin, split)
                e = work.tile(P, xt.F)
                low.act(n.name, e, xt.op(), "exp", bias=negm.op(), acc=sums.cols(ci, 1), flops=2 * P * xt.F)
                if kind == "softmax" and not fits:
                    # the exponentials do not fit beside the row: spill them to HBM, reload later
                    sc = low.new_scratch("float32", P * e.F)
                    sop = {"m": "hbm", "b": sc, "dt": "float32", "o": 0, "ap": [[e.F, P], [1, e.F]]}
                    low.dma(n.name, sop, e.op(), spill="save")
                    spill_bufs.append((cb, sc, e.F))
                es_tiles.append(e)
            if nch > 1:
                low.vec("REDUCE", n.name, s, [sums.op()], op="add")
            else:
                s = sums
            if kind == "softmax":
                r = small.tile(P, 1)
                low.vec("RECIPROCAL", n.name, r, [s.op()])
                for ci, cb in enumerate(chunks):
                    if fits:
                        e = es_tiles[ci]
                    else:
                        _, sc, F = spill_bufs[len(spill_bufs) - nch + ci]
                        e = work.tile(P, F)
                        low.dma(n.name, e.op(), {"m": "hbm", "b": sc, "dt": "float32", "o": 0,
                                                 "ap": [[F, P], [1, F]]}, spill="reload")
                    o = xin.tile(P, e.F).as_dtype(out_spec.dtype) if out_spec.dtype == x.dtype else \
                        work.tile(P, e.F).as_dtype(out_spec.dtype)
                    low.vec("TENSOR_SCALAR", n.name, o, [e.op(), r.op()], op0="multiply", scalar0={"src": 1},
                            flops=P * e.F)
                    low.store(n.name, o, ov, br + cb)
            else:
                ls = small.tile(P, 1)
                low.act(n.name, ls, s.op(), "log")
                if kind == "logsumexp":
                    o = small.tile(P, 1).as_dtype(out_spec.dtype)
                    low.vec("TENSOR_TENSOR", n.name, o, [ls.op(), m.op()], n_inputs=2, op="add")
                    low.store(n.name, o, ov, br + [(0, 1)])
                else:
                    tot = small.tile(P, 1)
                    low.vec("TENSOR_TENSOR", n.name, tot, [ls.op(), m.op()], n_inputs=2, op="add")
                    for ci, cb in enumerate(chunks):
                        xt = low.load(n.name, xv, br + cb, xin, split) if not fits else xt
                        o = work.tile(P, xt.F).as_dtype(out_spec.dtype)
                        low.vec("TENSOR_SCALAR", n.name, o, [xt.op(), tot.op()], op0="subtract", scalar0={"src": 1},
                                flops=P * xt.F)
                        low.store(n.name, o, ov, br + cb)
            continue
        if kind == "layer_norm":
            w = low.value(args[2]) if len(args) > 2 and _is_ref(args[2]) else None
            bias = low.value(args[3]) if len(args) > 3 and _is_ref(args[3]) else None
            eps = args[4] if len(args) > 4 else 1e-5
            stats = small.tile(P, 3 * max(1, sum(ceil_div(math.prod(x for _, x in cb), BN_FMAX) for cb in chunks)))
            si = 0
            xts = []
            for cb in chunks:
                xt = low.load(n.name, xv, br + cb, xin, split)
                for f0 in range(0, xt.F, BN_FMAX):
                    fl = min(BN_FMAX, xt.F - f0)
                    low.vec("BN_STATS", n.name, stats.cols(3 * si, 3), [xt.cols(f0, fl).op()], cost_n=fl,
                            flops=2 * P * fl)
                    si += 1
                xts.append(xt)
            mv = small.tile(P, 2)
            low.vec("BN_AGGR", n.name, mv, [stats.cols(0, 3 * si).op()], cost_n=si * 3)
            rstd = small.tile(P, 1)
            low.vec("TENSOR_SCALAR", n.name, rstd, [mv.cols(1, 1).op()], op0="add", scalar0=eps, op1="power",
                    scalar1=-0.5)
            hshape = tuple(out_spec.shape)
            for ci, cb in enumerate(chunks):
                xt = xts[ci] if fits else low.load(n.name, xv, br + cb, xin, split)
                y = work.tile(P, xt.F)
                low.vec("TENSOR_SCALAR", n.name, y, [xt.op(), mv.cols(0, 1).op(), rstd.op()], op0="subtract",
                        scalar0={"src": 1}, op1="multiply", scalar1={"src": 2}, flops=2 * P * xt.F)
                pools = low.__dict__.setdefault("_ln_pools", {}).setdefault(n.name, {"__F": min(D, Fc)})
                ctx = TileCtx(low, xv.shape, br + cb, split, pools)
                for wv, op in ((w, "multiply"), (bias, "add")):
                    if wv is None:
                        continue
                    wt = ctx.load_extra(n.name, _ln_param(wv, x, dims, split), f"p{op}")
                    low.vec("TENSOR_TENSOR", n.name, y, [y.op(), wt.op()], n_inputs=2, op=op, flops=P * xt.F)
                yo = y
                if out_spec.dtype != "float32" and not members:
                    yo = ctx.out_tile(n.name, "cast", out_spec.dtype)
                    low.act(n.name, yo, y.op(), "copy")
                run_chain(ctx, n.name, yo, members, ov_map)
            # mean and rstd outputs ([rows..., 1...])
            for i, val in ((1, mv.cols(0, 1)), (2, rstd)):
                key = f"{n.name}:{i}"
                if len(n.outputs) > i and _used(low, n, i):
                    v = low.out_view(key, n.outputs[i])
                    vv = _reshape_view(v, tuple(rows) + (1,))
                    low.store(n.name, val.as_dtype(n.outputs[i].dtype) if n.outputs[i].dtype == "float32" else val, vv,
                              br + [(0, 1)])
            continue
        if kind == "cumsum":
            xt = low.load(n.name, xv, br + chunks[0], xin, split)
            o = work.tile(P, xt.F).as_dtype(out_spec.dtype)
            low.vec("TENSOR_SCAN", n.name, o, [xt.op()], op="add", flops=P * xt.F)
            low.store(n.name, o, ov, br + chunks[0])
            continue
        # reductions
        red_op = {"sum": "add", "mean": "add", "max": "max", "min": "min", "any": "max", "all": "min",
                  "prod": "multiply", "var": "var", "std": "var"}[kind]
        res = small.tile(P, 1)
        if red_op == "var":
            stats = small.tile(P, 3 * max(1, sum(ceil_div(math.prod(x for _, x in cb), BN_FMAX) for cb in chunks)))
            si = 0
            for cb in chunks:
                xt = low.load(n.name, xv, br + cb, xin, split)
                for f0 in range(0, xt.F, BN_FMAX):
                    fl = min(BN_FMAX, xt.F - f0)
                    low.vec("BN_STATS", n.name, stats.cols(3 * si, 3), [xt.cols(f0, fl).op()], cost_n=fl)
                    si += 1
            mv = small.tile(P, 2)
            low.vec("BN_AGGR", n.name, mv, [stats.cols(0, 3 * si).op()], cost_n=3 * si)
            corr = n.kwargs.get("correction", 1 if not (len(args) > 2 and args[2] is False) else 0)
            if corr is None:
                corr = 1
            low.vec("TENSOR_SCALAR", n.name, res, [mv.cols(1, 1).op()], op0="multiply",
                    scalar0=D / max(D - corr, 1) if D - corr > 0 else float("nan"))
            if kind == "std":
                low.act(n.name, res, res.op(), "sqrt")
        else:
            parts = small.tile(P, nch) if nch > 1 else res
            for ci, cb in enumerate(chunks):
                xt = low.load(n.name, xv, br + cb, xin, split)
                low.vec("REDUCE", n.name, parts.cols(ci, 1) if nch > 1 else res, [xt.op()], op=red_op, cost_n=xt.F,
                        flops=P * xt.F)
            if nch > 1:
                low.vec("REDUCE", n.name, res, [parts.op()], op=red_op)
            if kind == "mean":
                low.vec("TENSOR_SCALAR", n.name, res, [res.op()], op0="multiply", scalar0=1.0 / max(D, 1))
        low.store(n.name, res.as_dtype(res.dtype), ov, br + [(0, 1)])
    _lower_alone(low, alone)


def _used(low: Lowerer, n: Node, i: int) -> bool:
    for u in low.users.get(n.name, []):
        un = low.by_name[u]
        if un.target == "getitem" and un.args[1] == i:
            return True
    return False


def _ln_param(wv: View, x: View, dims: list[int], split: int) -> View:
    """A layer-norm weight [normalized_shape] as a [rows (stride 0), free] view matching x's tiles."""
    b = _bcast(wv, tuple(x.shape))
    nd = x.meta.dim()
    keep = [d for d in range(nd) if d not in dims]
    return b.with_meta(b.meta.permute(keep + sorted(dims)))


# ----------------------------------------------------------------------------------------------
# gather, iota, collectives, conv


def lower_embedding(low: Lowerer, n: Node) -> None:
    """embedding(weight, indices) / index_select(x, 0, idx): indices loaded to SBUF, then one
    indirect DMA per 128 rows gathers table rows (descriptors generated on GpSimd)."""
    name = _packet_name(n.target)
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
    flat_idx = _reshape_view(idx, (nidx, 1)) or idx.with_meta(idx.meta.reshape(nidx, 1))
    out2 = _reshape_view(out, (nidx, D))
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
        from neuron_stack.device.cost import dma_ns
        i = low.emit("DMA_INDIRECT", n.name, [dst], [tab, it.op()], {"desc": desc},
                     dur=dma_ns(low.p, nb, desc) - low.p.dma_fixed_ns, hbm_read=nb, hbm_write=nb)
        low.instrs[i].latency = low.p.dma_fixed_ns       # trigger-to-start, off the queue (see Lowerer._dma1)


def lower_iota(low: Lowerer, n: Node) -> None:
    """arange: GpSimd IOTA into SBUF tiles, stored with DMA."""
    spec = n.outputs[0]
    args = [a for a in n.args]
    start, end, step = 0, None, 1
    if len(args) == 1:
        end = args[0]
    elif len(args) >= 2:
        start, end = args[0], args[1]
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
        o2 = _reshape_view(out.with_meta(out.meta[:full]), (full // cols, cols))
        low.store(n.name, t.rows(0, full // cols), o2, [(0, full // cols), (0, cols)])
    if N > full:
        rem = N - full
        o2 = _reshape_view(out.with_meta(out.meta[full:]), (1, rem))
        low.store(n.name, t.rows(full // cols, 1).cols(0, rem), o2, [(0, 1), (0, rem)])


def lower_collective(low: Lowerer, n: Node) -> None:
    """A collective: one ``cc`` row timed as a ring over NeuronLink
    (:func:`neuron_stack.device.cost.ring_collective_ns`)."""
    name = _packet_name(n.target)
    kind = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
            "reduce_scatter_tensor": "reduce_scatter"}.get(n.target.split(".")[1] if "." in n.target else name, "wait")
    world = int(low.flags.get("world_size", 1) or 1)
    srcs = [view_operand(low.value(a)) for a in n.args if _is_ref(a)]
    nb = sum(s.numel * nbytes_of(s.dtype) for s in n.inputs)
    dsts = [view_operand(low.out_view(n.name, n.outputs[0]))] if n.outputs else []
    dur = ring_collective_ns(low.p, kind, nb, world)
    opcode = {"all_reduce": "CC_ALL_REDUCE", "all_gather": "CC_ALL_GATHER", "reduce_scatter": "CC_REDUCE_SCATTER"}.get(kind, "CC_WAIT")
    low.emit(opcode, n.name, dsts, srcs, {"aten": n.target, "args": [], "world": world}, dur=dur, small=False)
