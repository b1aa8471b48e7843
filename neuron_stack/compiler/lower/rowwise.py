"""Row-wise ops on the Vector and Scalar engines: softmax, log-softmax, layer norm, RMS norm, reductions
(sum, mean, max, min, var, std, any, all, prod, logsumexp) and cumsum; whole rows stay in SBUF when
they fit, else chunked passes.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from neuron_stack.compiler.lower.chain import TileCtx, chain_outputs, epilogue_chain, lane_view, run_chain
from neuron_stack.compiler.lower.common import broadcast_view, output_used, reshape_view
from neuron_stack.compiler.lower.custom import lower_custom
from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.placement import stored_dtype
from neuron_stack.compiler.lower.registry import lower_alone, lowering
from neuron_stack.compiler.lower.resident import lane_layout
from neuron_stack.compiler.lower.tiles import (
    BN_FMAX,
    FLOATS,
    FREE_TILE,
    MOVING_FMAX,
    PMAX,
    Pool,
    Tile,
    View,
    boxes,
    is_ref,
    nbytes_of,
    packet_name,
)
from neuron_stack.device.cost import ceil_div, ldweights_ns, matmul_ns
from neuron_stack.ir import Node

ROWWISE_KINDS = {"_softmax": "softmax", "_log_softmax": "log_softmax", "native_layer_norm": "layer_norm",
            "rms_norm": "rms_norm",
            "sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "logsumexp": "logsumexp",
            "var": "var", "std": "std", "any": "any", "all": "all", "prod": "prod", "cumsum": "cumsum"}
#: ``aten.rms_norm``'s eps when it is None: the machine epsilon of its fp32 computation,
#: ``torch.finfo(torch.float32).eps`` (torch/_decomp/decompositions.py, ``_fused_rms_norm``)
_F32_EPS = 2.0 ** -23


def _rows_free(v: View, dims: list[int]) -> tuple[View, int]:
    """Permute ``dims`` (reduced / normalised) to the end: returns the view and the split point."""
    nd = v.meta.dim()
    dims = sorted(d % nd for d in dims) if nd else []
    keep = [d for d in range(nd) if d not in dims]
    return v.with_meta(v.meta.permute(keep + dims)), len(keep)


def _reduced_dims(n: Node, kind: str, nd: int) -> list[int]:
    """The dims ``n`` reduces or normalises (all of them for a full reduction; none of a 0-d value)."""
    args = n.args
    if nd == 0:
        return []
    if kind in ("softmax", "log_softmax", "cumsum"):
        return [args[1]]
    if kind in ("layer_norm", "rms_norm"):
        return list(range(nd - len(args[1]), nd))   # normalized_shape: the trailing dims
    d = args[1] if len(args) > 1 else n.kwargs.get("dim")
    if d is None or d == []:
        return list(range(nd))
    return [d] if isinstance(d, int) else list(d)


@dataclass
class _Rows:
    """A row-wise op's plan: ``xv`` is the input with the reduced dims last (from ``split``), the kept dims
    ``rows`` go on partitions in blocks of 128, the ``D`` reduced elements of a row in ``chunks`` (one when the
    row ``fits`` SBUF); ``xin``/``work``/``small`` the pools; ``ov`` (or ``ov_map`` for a fused chain) the output."""
    low: Lowerer
    n: Node
    kind: str
    x: View
    dims: list[int]
    xv: View
    split: int
    rows: tuple
    D: int
    chunks: list
    fits: bool
    xin: Pool
    work: Pool
    small: Pool
    members: list
    ov: View | None = None
    ov_map: dict | None = None
    spill_bufs: list = field(default_factory=list)


@lowering("rowwise", ops=ROWWISE_KINDS, op_classes=("reduction", "softmax", "normalization"))
def lower_rowwise(low: Lowerer, n: Node) -> None:
    """Softmax, log-softmax, layer/group norm and reductions: the reduced dims become the free axis,
    the kept dims the partitions; whole rows stay in SBUF when they fit (else chunked passes and,
    for softmax, a spill of the exponentials to HBM)."""
    kind = ROWWISE_KINDS[packet_name(n.target)]
    x = low.value(n.args[0])
    nd = x.meta.dim()
    dims = _reduced_dims(n, kind, nd)
    if kind in ("sum", "mean") and nd and dims in ([nd - 1], [-1]) and n.outputs[0].dtype in FLOATS \
            and _lane_resident(low, x):
        _lane_sum(low, n, x, kind)
        return
    if kind in ("sum", "mean") and _partition_sum(low, n, x, dims, kind):
        return
    xv, split = _rows_free(x, dims)
    rows, free = xv.shape[:split], xv.shape[split:]
    D = math.prod(free) if free else 1
    if kind == "cumsum" and (D > FREE_TILE or len(free) > 1):
        lower_custom(low, n)
        return
    members, alone = epilogue_chain(low, n) if kind in ("layer_norm", "rms_norm") else ([], [])
    if kind == "rms_norm" and dims == [nd - 1] and _lane_resident(low, x) and _lane_rms_norm(low, n, x, members):
        lower_alone(low, alone)
        return
    es = 4
    fits = D * es * 3 <= low.sbuf.cap // 2
    if kind == "rms_norm":     # x kept in its own dtype between the passes, y in its own: two row blocks in flight
        fits = D * (nbytes_of(x.dtype) + nbytes_of(_rms_y_dtype(low, n, members))) * 2 <= low.sbuf.cap
    Fc = D if fits else FREE_TILE
    chunks = boxes(free, Fc) if free else [[]]
    nch = len(chunks)
    # short rows: enough buffers that several row-tile loads are in flight on the DMA queues (with
    # two, each load waited for the previous tile's compute: one queue busy, the others idle)
    depth = max(2, min(16, (low.sbuf.cap // 16) // max(1, D * es))) if fits else 3
    xin = Pool(low, f"{n.name}.x", "sbuf", PMAX, min(D, Fc) if free else 1, x.dtype, bufs=depth)
    work = Pool(low, f"{n.name}.w", "sbuf", PMAX, min(D, Fc) if free else 1, "float32", bufs=depth)
    nbn = sum(ceil_div(math.prod(x for _, x in cb), BN_FMAX) for cb in chunks)
    small = Pool(low, f"{n.name}.s", "sbuf", PMAX, max(8, 3 * nbn, nch), "float32", bufs=8)
    r = _Rows(low, n, kind, x, dims, xv, split, tuple(rows), D, chunks, fits, xin, work, small, members)
    out_spec = n.outputs[0]
    if kind in ("layer_norm", "rms_norm"):
        r.ov_map = chain_outputs(low, n, members, tuple(out_spec.shape))
    elif kind in ("softmax", "log_softmax", "cumsum"):
        r.ov, _ = _rows_free(low.out_view(n.name, out_spec), dims)
    else:   # reduced output: kept dims in order, reduced ones gone (or 1)
        r.ov = reshape_view(low.out_view(n.name, out_spec), tuple(rows) + (1,))
    block = {"softmax": _softmax_block, "log_softmax": _softmax_block, "logsumexp": _softmax_block,
             "layer_norm": _layer_norm_block, "cumsum": _cumsum_block}.get(kind, _reduce_block)
    for br in boxes(tuple(rows), PMAX):
        P = math.prod(x for _, x in br) if rows else 1
        small.tile(P, None)   # unused tile: kept so the pool's rotation (and so the schedule) is unchanged
        if kind == "rms_norm":
            _rms_norm_rows(low, n, x, xv, dims, split, br, chunks, fits, xin, small, members, r.ov_map)
        else:
            block(r, br, P)
    lower_alone(low, alone)


def _softmax_block(r: _Rows, br, P: int) -> None:
    """Softmax, log-softmax or logsumexp of one block of rows: the row max, ``exp(x - max)`` with its sum as the
    Scalar engine's accumulate output (spilled to HBM between passes when a row does not fit), then the
    normalisation."""
    low, n, xv, split, xin, work, small, chunks = r.low, r.n, r.xv, r.split, r.xin, r.work, r.small, r.chunks
    nch, out_spec = len(chunks), r.n.outputs[0]
    m = small.tile(P, 1)
    if r.fits:
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
        if not r.fits:
            xt = low.load(n.name, xv, br + cb, xin, split)
        e = work.tile(P, xt.F)
        low.act(n.name, e, xt.op(), "exp", bias=negm.op(), acc=sums.cols(ci, 1), flops=2 * P * xt.F)
        if r.kind == "softmax" and not r.fits:
            # the exponentials do not fit beside the row: spill them to HBM, reload later
            sc = low.new_scratch("float32", P * e.F)
            sop = {"m": "hbm", "b": sc, "dt": "float32", "o": 0, "ap": [[e.F, P], [1, e.F]]}
            low.dma(n.name, sop, e.op(), spill="save")
            r.spill_bufs.append((cb, sc, e.F))
        es_tiles.append(e)
    if nch > 1:
        low.vec("REDUCE", n.name, s, [sums.op()], op="add")
    else:
        s = sums
    if r.kind == "softmax":
        rcp = small.tile(P, 1)
        low.vec("RECIPROCAL", n.name, rcp, [s.op()])
        for ci, cb in enumerate(chunks):
            if r.fits:
                e = es_tiles[ci]
            else:
                _, sc, F = r.spill_bufs[len(r.spill_bufs) - nch + ci]
                e = work.tile(P, F)
                low.dma(n.name, e.op(), {"m": "hbm", "b": sc, "dt": "float32", "o": 0,
                                         "ap": [[F, P], [1, F]]}, spill="reload")
            o = xin.tile(P, e.F).as_dtype(out_spec.dtype) if out_spec.dtype == r.x.dtype else \
                work.tile(P, e.F).as_dtype(out_spec.dtype)
            low.vec("TENSOR_SCALAR", n.name, o, [e.op(), rcp.op()], op0="multiply", scalar0={"src": 1},
                    flops=P * e.F)
            low.store(n.name, o, r.ov, br + cb)
        return
    ls = small.tile(P, 1)
    low.act(n.name, ls, s.op(), "log")
    if r.kind == "logsumexp":
        o = small.tile(P, 1).as_dtype(out_spec.dtype)
        low.vec("TENSOR_TENSOR", n.name, o, [ls.op(), m.op()], n_inputs=2, op="add")
        low.store(n.name, o, r.ov, br + [(0, 1)])
        return
    tot = small.tile(P, 1)
    low.vec("TENSOR_TENSOR", n.name, tot, [ls.op(), m.op()], n_inputs=2, op="add")
    for ci, cb in enumerate(chunks):
        xt = low.load(n.name, xv, br + cb, xin, split) if not r.fits else xt
        o = work.tile(P, xt.F).as_dtype(out_spec.dtype)
        low.vec("TENSOR_SCALAR", n.name, o, [xt.op(), tot.op()], op0="subtract", scalar0={"src": 1},
                flops=P * xt.F)
        low.store(n.name, o, r.ov, br + cb)


def _layer_norm_block(r: _Rows, br, P: int) -> None:
    """Layer norm of one block of rows: BN_STATS/BN_AGGR for mean and variance, ``(x - mean) * rstd``, the
    affine weight and bias, the fused epilogue; the mean and rstd outputs when read."""
    low, n, xv, split, xin, chunks, args = r.low, r.n, r.xv, r.split, r.xin, r.chunks, r.n.args
    w = low.value(args[2]) if len(args) > 2 and is_ref(args[2]) else None
    bias = low.value(args[3]) if len(args) > 3 and is_ref(args[3]) else None
    eps = args[4] if len(args) > 4 else 1e-5
    stats = r.small.tile(P, 3 * max(1, sum(ceil_div(math.prod(x for _, x in cb), BN_FMAX) for cb in chunks)))
    si = 0
    xts = []
    for cb in chunks:
        xt = low.load(n.name, xv, br + cb, xin, split)
        for f0 in range(0, xt.F, BN_FMAX):
            fl = min(BN_FMAX, xt.F - f0)
            low.vec("BN_STATS", n.name, stats.cols(3 * si, 3), [xt.cols(f0, fl).op()], cost_n=fl, flops=2 * P * fl)
            si += 1
        xts.append(xt)
    mv = r.small.tile(P, 2)
    low.vec("BN_AGGR", n.name, mv, [stats.cols(0, 3 * si).op()], cost_n=si * 3)
    rstd = r.small.tile(P, 1)
    low.vec("TENSOR_SCALAR", n.name, rstd, [mv.cols(1, 1).op()], op0="add", scalar0=eps, op1="power", scalar1=-0.5)
    out_spec = n.outputs[0]
    for ci, cb in enumerate(chunks):
        xt = xts[ci] if r.fits else low.load(n.name, xv, br + cb, xin, split)
        y = r.work.tile(P, xt.F)
        low.vec("TENSOR_SCALAR", n.name, y, [xt.op(), mv.cols(0, 1).op(), rstd.op()], op0="subtract",
                scalar0={"src": 1}, op1="multiply", scalar1={"src": 2}, flops=2 * P * xt.F)
        pools = low.pool_cache.setdefault(("layer_norm", n.name), {"__F": min(r.D, xin.F)})
        ctx = TileCtx(low, xv.shape, br + cb, split, pools)
        for wv, op in ((w, "multiply"), (bias, "add")):
            if wv is None:
                continue
            wt = ctx.load_extra(n.name, _ln_param(wv, r.x, r.dims, split), f"p{op}")
            low.vec("TENSOR_TENSOR", n.name, y, [y.op(), wt.op()], n_inputs=2, op=op, flops=P * xt.F)
        yo = y
        if out_spec.dtype != "float32" and not r.members:
            yo = ctx.out_tile(n.name, "cast", out_spec.dtype)
            low.act(n.name, yo, y.op(), "copy")
        run_chain(ctx, n.name, yo, r.members, r.ov_map)
    # mean and rstd outputs ([rows..., 1...])
    for i, val in ((1, mv.cols(0, 1)), (2, rstd)):
        if len(n.outputs) > i and output_used(low, n, i):
            vv = reshape_view(low.out_view(f"{n.name}:{i}", n.outputs[i]), r.rows + (1,))
            low.store(n.name, val.as_dtype(n.outputs[i].dtype) if n.outputs[i].dtype == "float32" else val, vv,
                      br + [(0, 1)])


def _cumsum_block(r: _Rows, br, P: int) -> None:
    """A running sum along one row block's free axis: one Vector engine scan."""
    xt = r.low.load(r.n.name, r.xv, br + r.chunks[0], r.xin, r.split)
    o = r.work.tile(P, xt.F).as_dtype(r.n.outputs[0].dtype)
    r.low.vec("TENSOR_SCAN", r.n.name, o, [xt.op()], op="add", flops=P * xt.F)
    r.low.store(r.n.name, o, r.ov, br + r.chunks[0])


def _reduce_block(r: _Rows, br, P: int) -> None:
    """A reduction of one block of rows: REDUCE per chunk (then across chunks), or BN_STATS for var/std."""
    low, n, xv, split, xin, small, chunks, kind = r.low, r.n, r.xv, r.split, r.xin, r.small, r.chunks, r.kind
    nch, D, args = len(chunks), r.D, n.args
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
    low.store(n.name, res.as_dtype(res.dtype), r.ov, br + [(0, 1)])


def _rms_y_dtype(low: Lowerer, n: Node, members) -> str:
    """The dtype RMSNorm's y is computed into: the one its output is stored in (the cast type of an fp32
    output only matmuls read, with ``--auto-cast``), or fp32 when a fused epilogue follows."""
    return "float32" if members else stored_dtype(low, n.name, n.outputs[0].dtype)


def _rms_norm_rows(low: Lowerer, n: Node, x: View, xv: View, dims: list[int], split: int, br, chunks, fits: bool,
                   xin: Pool, small: Pool, members, ov_map) -> None:
    """One block of up to 128 rows of ``aten.rms_norm(x, normalized_shape, weight, eps)`` in one pass, as
    the NKI RMSNorm tutorial computes it (aws-neuron/aws-neuron-sdk general/nki/examples/rmsnorm/
    rmsnorm_nki_kernels.py: square, sum along the free axis, rsqrt, multiply by it and by the weight) and
    neuronx-cc runs NxDI's fused ``RmsNorm`` custom call: load x in its own dtype; the sum of squares on the
    Scalar engine as a by-product of ``activation(np.square)`` (its accumulate output, ``activation_reduce``
    in the NKI ISA), 1/D folded into the activation's scale; rstd = (mean + eps)^-0.5 on the Vector engine;
    y = (x * rstd) * w in fp32, one ``scalar_tensor_tensor``; the fused epilogue; written in the output
    dtype (the engines write any dtype: no separate cast). A row longer than SBUF holds is loaded twice (sum,
    then scale), as layer norm."""
    args, kw = n.args, n.kwargs
    P = math.prod(x for _, x in br) if br else 1
    D = math.prod(xv.shape[split:]) if xv.shape[split:] else 1
    wa = args[2] if len(args) > 2 else kw.get("weight")
    w = low.value(wa) if is_ref(wa) else None
    eps = args[3] if len(args) > 3 else kw.get("eps")
    eps = _F32_EPS if eps is None else eps
    pools = low.pool_cache.setdefault(("rms_norm", n.name), {"__F": xin.F})
    ydt = _rms_y_dtype(low, n, members)
    sums = small.tile(P, len(chunks))
    xts = []
    for ci, cb in enumerate(chunks):
        xt = low.load(n.name, xv, br + cb, xin, split)
        # the squares themselves are not needed, only their sum: written to the tile y overwrites next
        sq = TileCtx(low, xv.shape, br + cb, split, pools).out_tile(n.name, "y", ydt)
        low.act(n.name, sq, xt.op(), "square", scale=1.0 / math.sqrt(D), acc=sums.cols(ci, 1), flops=2 * P * xt.F)
        xts.append((xt, sq))
    ms = sums
    if len(chunks) > 1:
        ms = small.tile(P, 1)
        low.vec("REDUCE", n.name, ms, [sums.op()], op="add")
    rstd = small.tile(P, 1)
    low.vec("TENSOR_SCALAR", n.name, rstd, [ms.op()], op0="add", scalar0=eps, op1="power", scalar1=-0.5)
    for ci, cb in enumerate(chunks):
        ctx = TileCtx(low, xv.shape, br + cb, split, pools)
        xt, y = xts[ci] if fits else (low.load(n.name, xv, br + cb, xin, split), ctx.out_tile(n.name, "y", ydt))
        if w is None:
            low.vec("TENSOR_SCALAR", n.name, y, [xt.op(), rstd.op()], op0="multiply", scalar0={"src": 1},
                    flops=P * xt.F)
        else:
            wt = ctx.load_extra(n.name, _ln_param(w, x, dims, split), "pmultiply")
            low.vec("SCALAR_TENSOR_TENSOR", n.name, y, [xt.op(), wt.op(), rstd.op()], n_inputs=2, op0="multiply",
                    scalar0={"src": 2}, op1="multiply", flops=2 * P * xt.F)
        run_chain(ctx, n.name, y, members, ov_map)


def _lane_rms_norm(low: Lowerer, n: Node, x: View, members) -> bool:
    """RMSNorm over the last dim of a value kept in the lane layout (a decode step's [batch, hidden]), on all 128
    lanes: per row, the squares of each partition's ``H / 128`` elements summed by the Scalar engine's accumulate;
    one matmul with a 128 x 128 block of ones stationary adds the 128 partials of every row and hands the sum to
    every partition (``nc_matmul`` contracts over partitions, as :func:`_lane_sum`); rstd on the Vector engine
    and ``(x * rstd) * w`` per row with the weight in the same layout. False when a view does not apply."""
    shape = tuple(x.shape)
    rows, H = shape[:-1], shape[-1]
    R, nk = math.prod(rows), H // PMAX
    args, kw = n.args, n.kwargs
    wa = args[2] if len(args) > 2 else kw.get("weight")
    w = low.value(wa) if is_ref(wa) else None
    eps = args[3] if len(args) > 3 else kw.get("eps")
    eps = _F32_EPS if eps is None else eps
    outs = {k: lane_view(v, shape) for k, v in chain_outputs(low, n, members, shape).items()}
    lmembers = [m.reshaped(shape, True) for m in members]
    wl = reshape_view(w, (PMAX, nk)) if w is not None else None
    if any(v is None for v in outs.values()) or any(m is None for m in lmembers) or (w is not None and wl is None):
        return False
    xl, ydt = lane_view(x, shape), _rms_y_dtype(low, n, members)
    xin = Pool(low, f"{n.name}.x", "sbuf", PMAX, nk, x.dtype, bufs=2)
    pools = low.pool_cache.setdefault(("rms_norm", n.name), {"__F": nk})
    part = Pool(low, f"{n.name}.p", "sbuf", PMAX, R, "float32", bufs=1).tile()
    boxes_r = [[(0, PMAX)] + [(i, 1) for i in idx] + [(0, nk)] for idx in itertools.product(*(range(d) for d in rows))]
    for r, box in enumerate(boxes_r):
        t = low.load(n.name, xl, box, xin, 1)
        sq = TileCtx(low, xl.shape, box, 1, pools, lanes=True).out_tile(n.name, "y", ydt)
        low.act(n.name, sq, t.op(), "square", scale=1.0 / math.sqrt(H), acc=part.cols(r, 1), flops=2 * PMAX * nk)
    ones = Pool(low, f"{n.name}.ones", "sbuf", PMAX, PMAX, "float32", bufs=1).tile()
    low.vec("MEMSET", n.name, ones, [], value=1.0)
    ms = Pool(low, f"{n.name}.acc", "psum", PMAX, R, "float32", bufs=1).tile()
    low.emit("LDWEIGHTS", n.name, [], [ones.op()], {}, dur=ldweights_ns(low.p, PMAX, "float32"))
    low.emit("MATMUL", n.name, [ms.op()], [ones.op(), part.op()], {"start": True, "stop": True},
             dur=matmul_ns(low.p, R, PMAX, "float32"), flops=2 * PMAX * PMAX * R, itype="REGULAR")
    rstd = Pool(low, f"{n.name}.s", "sbuf", PMAX, R, "float32", bufs=1).tile()
    low.vec("TENSOR_SCALAR", n.name, rstd, [ms.op()], op0="add", scalar0=eps, op1="power", scalar1=-0.5)
    wt = low.load(n.name, wl, [(0, PMAX), (0, nk)], Pool(low, f"{n.name}.w", "sbuf", PMAX, nk, w.dtype, bufs=1), 1) \
        if w is not None else None
    for r, box in enumerate(boxes_r):
        t = low.load(n.name, xl, box, xin, 1)
        ctx = TileCtx(low, xl.shape, box, 1, pools, lanes=True)
        y = ctx.out_tile(n.name, "y", ydt)
        if wt is None:
            low.vec("TENSOR_SCALAR", n.name, y, [t.op(), rstd.cols(r, 1).op()], op0="multiply", scalar0={"src": 1},
                    flops=PMAX * nk)
        else:
            low.vec("SCALAR_TENSOR_TENSOR", n.name, y, [t.op(), wt.op(), rstd.cols(r, 1).op()], n_inputs=2,
                    op0="multiply", scalar0={"src": 2}, op1="multiply", flops=2 * PMAX * nk)
        run_chain(ctx, n.name, y, lmembers, outs)
    return True


def _lane_resident(low: Lowerer, x: View) -> bool:
    """``x`` is kept in SBUF in the lane layout (its rows spread over the partitions): few long rows."""
    r = low.res.get(x.buf)
    lanes = lane_layout(x.shape) if x.meta.is_contiguous() and not x.meta.storage_offset() \
        and x.dtype in FLOATS else None
    return lanes is not None and lanes[0] * PMAX == x.shape[-1] and r is not None and not r.evicted \
        and (r.C, r.T) == lanes


class _Ones:
    """A [128, 1] column of ones in SBUF (a Vector memset), the operand that makes a matmul sum over
    partitions; rebuilt when the ring reuses its slot, as the transposes' identity."""

    def __init__(self, low: Lowerer, node: str, dtype: str = "float32"):
        name = "__identity_ones" if dtype == "float32" else f"__identity_ones_{dtype}"
        self.tile = Pool(low, name, "sbuf", PMAX, 1, dtype, bufs=1).tile()
        low.vec("MEMSET", node, self.tile, [], value=1.0)


def _ones(low: Lowerer, node: str, dtype: str = "float32") -> Tile:
    """The column of ones of ``dtype`` in SBUF (built by ``node`` when missing)."""
    key = "ones" if dtype == "float32" else ("ones", dtype)
    if key not in low.identity_tiles:
        low.identity_tiles[key] = _Ones(low, node, dtype)
    return low.identity_tiles[key].tile


def _unit_run(v: View, split: int) -> bool:
    """The dims of ``v`` from ``split`` on are read in runs of more than one element: their innermost
    non-unit dim has stride 1 (else every element is its own DMA descriptor)."""
    dims = [(st, d) for st, d in zip(v.meta.stride()[split:], v.shape[split:]) if d > 1]
    return not dims or dims[-1][0] == 1


def _partition_sum(low: Lowerer, n: Node, x: View, dims: list[int], kind: str) -> bool:
    """Sum (or mean) over dims whose elements are strided in memory while a kept dim is contiguous, e.g.
    a Linear's bias gradient ``grad.sum(0)`` of a [tokens, features] gradient. Reducing along the free
    axis would load the tile transposed, one 4-byte DMA descriptor per element (a [32, 128] fp32 sum took
    4096 descriptors, 62.6 us); instead the reduced dims go to the partitions, loaded in rows of the
    kept dims (one descriptor per row), and the Tensor Engine sums over partitions: a matmul with a
    column of ones stationary and the tile moving accumulates ``ones.T @ x`` = the column sums into one
    PSUM row, 128 rows a matmul (the NKI architecture guide's partition-dim summation on TensorE, as
    the RMSNorm discussion of the NKI performance guide uses it). Returns False (nothing emitted) when
    the free-axis layout already reads contiguous runs."""
    out_spec = n.outputs[0]
    nd = x.meta.dim()
    dims = sorted(d % nd for d in dims) if nd else []
    keep = [d for d in range(nd) if d not in dims]
    if not dims or not keep or x.dtype not in FLOATS or out_spec.dtype not in FLOATS:
        return False
    xv, split = _rows_free(x, dims)
    xk = x.with_meta(x.meta.permute(dims + keep))
    if _unit_run(xv, split) or not _unit_run(xk, len(dims)):
        return False
    red, kept = xk.shape[:len(dims)], xk.shape[len(dims):]
    ov = reshape_view(low.out_view(n.name, out_spec), tuple(kept))
    if ov is None:
        return False
    R = math.prod(red)
    mm_dt = x.dtype if x.dtype in ("bfloat16", "float16") else "float32"
    ones = _ones(low, n.name, mm_dt)
    col = min(math.prod(kept), MOVING_FMAX)
    xin = Pool(low, f"{n.name}.x", "sbuf", PMAX, col, x.dtype, bufs=4)
    acc = Pool(low, f"{n.name}.acc", "psum", 1, col, "float32", bufs=2)
    res = Pool(low, f"{n.name}.s", "sbuf", 1, col, "float32", bufs=2)
    blocks = boxes(tuple(red), PMAX)
    for cb in boxes(tuple(kept), MOVING_FMAX):
        F = math.prod(c for _, c in cb)
        a = acc.tile(1, F)
        loaded = None
        for k, rb in enumerate(blocks):
            P = math.prod(c for _, c in rb)
            t = low.load(n.name, xk, rb + cb, xin, len(dims))
            stat = ones.rows(0, P).as_dtype(mm_dt)
            if loaded != P:     # the stationary column stays in the PE array while its height holds
                low.emit("LDWEIGHTS", n.name, [], [stat.op()], {}, dur=ldweights_ns(low.p, 1, mm_dt))
                loaded = P
            low.emit("MATMUL", n.name, [a.op()], [stat.op(), t.op()],
                     {"start": k == 0, "stop": k == len(blocks) - 1},
                     dur=matmul_ns(low.p, F, 1, mm_dt), flops=2 * P * F, itype="REGULAR")
        r = res.tile(1, F)
        low.vec("TENSOR_SCALAR", n.name, r, [a.op()], op0="multiply", scalar0=1.0 / R if kind == "mean" else 1.0)
        low.store(n.name, r, ov, cb)
    return True


def _lane_sum(low: Lowerer, n: Node, x: View, kind: str) -> None:
    """Sum (or mean) over the last dim of a value kept in the lane layout, e.g. RMSNorm's mean of squares in a
    decode step: each row's ``H / 128`` elements per partition are reduced on the Vector Engine over all
    128 lanes, then the 128 partial sums of every row are added on the Tensor Engine, a matmul with the
    partials stationary and a column of ones moving (``nc_matmul`` contracts over the partition dim: the
    NKI ISA's way to reduce across partitions besides GpSimd's ``tensor_partition_reduce``), into PSUM
    with one row per partition as the output keeps them."""
    rows = x.shape[:-1]
    R, nk = math.prod(rows), x.shape[-1] // PMAX
    xv = lane_view(x, x.shape)                      # [128, *rows, nk]
    ones = _ones(low, n.name)
    xin = Pool(low, f"{n.name}.x", "sbuf", PMAX, nk, x.dtype, bufs=2)
    part = Pool(low, f"{n.name}.p", "sbuf", PMAX, R, "float32", bufs=1).tile()
    for r, idx in enumerate(itertools.product(*(range(d) for d in rows))):
        t = low.load(n.name, xv, [(0, PMAX)] + [(i, 1) for i in idx] + [(0, nk)], xin, 1)
        low.vec("REDUCE", n.name, part.cols(r, 1), [t.op()], op="add", cost_n=nk, flops=PMAX * nk)
    acc = Pool(low, f"{n.name}.acc", "psum", PMAX, 1, "float32", bufs=1).tile(R, 1)
    low.emit("LDWEIGHTS", n.name, [], [part.op()], {}, dur=ldweights_ns(low.p, R, "float32"))
    low.emit("MATMUL", n.name, [acc.op()], [part.op(), ones.op()], {"start": True, "stop": True},
             dur=matmul_ns(low.p, 1, R, "float32"), flops=2 * PMAX * R, itype="REGULAR")
    out_spec = n.outputs[0]
    res = Pool(low, f"{n.name}.s", "sbuf", PMAX, 1, "float32", bufs=1).tile(R, 1)
    low.vec("TENSOR_SCALAR", n.name, res, [acc.op()], op0="multiply",
            scalar0=1.0 / x.shape[-1] if kind == "mean" else 1.0)
    ov = reshape_view(low.out_view(n.name, out_spec), (*rows, 1))
    low.store(n.name, res, ov, [(0, d) for d in rows] + [(0, 1)])


def _ln_param(wv: View, x: View, dims: list[int], split: int) -> View:
    """A layer-norm weight [normalized_shape] as a [rows (stride 0), free] view matching x's tiles."""
    b = broadcast_view(wv, tuple(x.shape))
    nd = x.meta.dim()
    keep = [d for d in range(nd) if d not in dims]
    return b.with_meta(b.meta.permute(keep + sorted(dims)))
