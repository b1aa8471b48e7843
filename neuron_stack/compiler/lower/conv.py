"""Convolution, pooling and inference batch norm on the engines (pass 4).

Convolution is *im2col-free shifted matmuls*: an input band (channels on partitions, a few input
rows x the padded width on the free axis) is loaded once into SBUF, zero padding written by
``MEMSET`` on the border only; every kernel tap (kh, kw) is then one ``LDWEIGHTS`` of the tap's
weights ``W[:, c, kh, kw]^T`` ([C<=128, O<=128]) and one ``MATMUL`` whose moving operand is the
band read through a strided access pattern (rows every ``stride*Wp``, columns every ``stride``,
shifted by the tap), all taps and channel blocks accumulating into one PSUM bank of <=512 output
positions. The bank is evacuated on the Scalar engine with the per-channel bias
(``ACTIVATE copy, bias=column``) and the fused epilogue (ReLU...), then stored. Weights are laid
out at compile time as [C, KH, KW, O] so each channel block is one contiguous load. Patch embeddings
(stride = kernel) and transposed convolutions run the same loop over the layouts of ``convgeom``.

Pooling (max / average) runs on the Vector engine over the same kind of band with (B*C) rows on
partitions: the first tap is a ``TENSOR_COPY`` of its window, every other tap a ``TENSOR_TENSOR``
max/add into the result, average pooling ends with one ``TENSOR_SCALAR`` multiply.
Inference batch norm is per-channel ``scale = w * (var + eps)^-1/2``, ``shift = b - mean * scale``
on [C, 1] columns, then one ``TENSOR_SCALAR`` ``x * scale + shift`` per tile.

>>> import torch
>>> from neuron_stack.frontend.export import capture
>>> from neuron_stack.compiler.legalize import legalize
>>> from neuron_stack.compiler.partition import partition
>>> from neuron_stack.compiler.fuse import fuse
>>> from neuron_stack.compiler.lower import lower
>>> from neuron_stack.device.profiles import get_profile
>>> prog = fuse(partition(legalize(capture(torch.nn.Conv2d(3, 8, 3, padding=1), (torch.randn(1, 3, 8, 8),)))))
>>> sorted({i.opcode for i in lower(prog, 0, get_profile("trn1"), {}).instrs})
['ACTIVATE', 'DMA_DIRECT2D', 'LDWEIGHTS', 'MATMUL', 'MEMSET']
"""
from __future__ import annotations

import math

from neuron_stack.compiler.lower.chain import TileCtx, chain_outputs, epilogue_chain, run_chain
from neuron_stack.compiler.lower.common import output_used, reshape_view
from neuron_stack.compiler.lower.convbn import BNColumns, fusable_bn
from neuron_stack.compiler.lower.convgeom import (
    direct_geometry,
    patch_geometry,
    transposed_geometry,
    views,
    w_box,
    x_box,
)
from neuron_stack.compiler.lower.custom import lower_custom
from neuron_stack.compiler.lower.lowerer import Lowerer
from neuron_stack.compiler.lower.registry import lower_alone, lowering
from neuron_stack.compiler.lower.tiles import (
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
    view_operand,
)
from neuron_stack.device.cost import ceil_div, ldweights_ns, matmul_ns, vector_ns
from neuron_stack.ir import Node

PSUM_BANKS_PER_ACC = 4      # output positions of one accumulation group: up to 4 banks x 512


def _conv_params(n: Node):
    """(stride, padding, dilation, transposed, groups) of aten.convolution, as 2-D tuples."""
    a = list(n.args) + [None] * (9 - len(n.args))
    stride, padding, dilation, transposed, groups = a[3], a[4], a[5], a[6], a[8]
    return list(stride or [1]), list(padding or [0]), list(dilation or [1]), bool(transposed), int(groups or 1)


def _fill_border(low: Lowerer, node: str, t: Tile, rows_lo: int, rows_hi: int, Rin: int, Wp: int, pw: int,
                 W: int, value, piece: int) -> None:
    """MEMSET the padding of a band tile [P, Rin * Wp]: rows outside [rows_lo, rows_hi) and the
    left/right pad columns of the rows in it (the interior is written by the load)."""
    regions = []
    if rows_lo > 0:
        regions.append((0, ((1, rows_lo * Wp),), rows_lo * Wp))
    if rows_hi < Rin:
        regions.append((rows_hi * Wp, ((1, (Rin - rows_hi) * Wp),), (Rin - rows_hi) * Wp))
    nr = rows_hi - rows_lo
    if nr > 0 and pw:
        regions.append((rows_lo * Wp, ((Wp, nr), (1, pw)), nr * pw))
    if nr > 0 and Wp - pw - W > 0:
        regions.append((rows_lo * Wp + pw + W, ((Wp, nr), (1, Wp - pw - W)), nr * (Wp - pw - W)))
    for off, free, F in regions:
        dst = Tile(t.key, t.mem, t.dtype, t.P, F, t.pitch, t.off + off, free)
        low.emit("MEMSET", node, [dst.op()], [], {"value": value},
                 dur=vector_ns(low.p, "MEMSET", F, 1, t.dtype), piece_of=piece)


def _load_band(low: Lowerer, node: str, v: View, rbox: list, hs: int, Rin: int, pw: int, fill, pool: Pool,
               stage: Pool | None, Wp: int | None = None, up: tuple = (1, 1)) -> Tile:
    """Rows ``hs .. hs+Rin`` (may reach into the padding) of ``v`` [..rows.., H, W] restricted to the
    partition box ``rbox`` into a padded band tile [P, Rin x Wp] of ``pool``'s dtype (``Wp``: ``W + 2 pw``
    unless given); through ``stage`` (a cast on the Scalar engine) when the dtypes differ. With ``up``
    (a transposed convolution's stride) the band is the input with zeros between its pixels."""
    if up != (1, 1):
        return _load_upsampled(low, node, v, rbox, hs, Rin, pw, Wp, up, pool, stage)
    H, W = v.shape[-2], v.shape[-1]
    Wp = Wp or W + 2 * pw
    P = math.prod(n for _, n in rbox)
    t = pool.tile(P, Rin * Wp)
    vs, ve = max(hs, 0), min(hs + Rin, H)
    piece = len(low.instrs)           # the border fills and the interior write disjoint parts: no WAW chain
    _fill_border(low, node, t, vs - hs, max(ve - hs, vs - hs), Rin, Wp, pw, W, fill, piece)
    if ve > vs:
        nr = ve - vs
        inner = Tile(t.key, t.mem, t.dtype, P, nr * W, t.pitch, t.off + (vs - hs) * Wp + pw,
                     ((Wp, nr), (1, W)) if Wp != W else ((1, nr * W),))
        box = list(rbox) + [(vs, nr), (0, W)]
        if stage is None or v.dtype == t.dtype:
            low.dma(node, inner.op(), _view_op(v, box), piece_of=piece)
        else:
            st = low.load(node, v, box, stage, len(rbox))
            low.act(node, inner, st.op(), "copy", piece_of=piece)
    return t


def _load_upsampled(low: Lowerer, node: str, v: View, rbox: list, hs: int, Rin: int, pw: int, Wp: int,
                    up: tuple, pool: Pool, stage: Pool) -> Tile:
    """The band of a transposed convolution: one ``MEMSET`` of zeros, then the input rows that fall in it,
    loaded whole (one DMA, contiguous rows) and copied on the Scalar engine to every ``up``-th row and
    column (an SBUF access pattern with steps, no per-element DMA descriptors)."""
    uh, uw = up
    H, W = v.shape[-2], v.shape[-1]
    P = math.prod(n for _, n in rbox)
    t = pool.tile(P, Rin * Wp)
    low.emit("MEMSET", node, [t.op()], [], {"value": 0.0}, dur=vector_ns(low.p, "MEMSET", Rin * Wp, 1, t.dtype))
    i0, i1 = max(0, ceil_div(hs, uh)), min(H, (hs + Rin - 1) // uh + 1)
    if i1 > i0:
        nr = i1 - i0
        st = low.load(node, v, list(rbox) + [(i0, nr), (0, W)], stage, len(rbox))
        inner = Tile(t.key, t.mem, t.dtype, P, nr * W, t.pitch, t.off + (i0 * uh - hs) * Wp + pw,
                     ((uh * Wp, nr), (uw, W)))
        low.act(node, inner, st.op(), "copy")
    return t


def _view_op(v: View, box) -> dict:
    return view_operand(v, box)


def _window(t: Tile, off: int, rows: int, row_step: int, cols: int, col_step: int, dtype: str | None = None) -> dict:
    """The access pattern of a tap's window in a band tile: ``rows`` x ``cols`` starting at ``off``."""
    return {"m": t.mem, "b": t.key, "dt": dtype or t.dtype, "o": t.off + off,
            "ap": [[t.pitch, t.P], [row_step, rows], [col_step, cols]]}


def _chunks(OH: int, OW: int) -> list[tuple[int, int, int, int]]:
    """Output regions of <= 512 positions (one PSUM bank each): (row0, rows, col0, cols)."""
    if OW <= MOVING_FMAX:
        R1 = max(1, MOVING_FMAX // OW)
        return [(r, min(R1, OH - r), 0, OW) for r in range(0, OH, R1)]
    return [(r, 1, c, min(MOVING_FMAX, OW - c)) for r in range(OH) for c in range(0, OW, MOVING_FMAX)]


def _bands(chunks, per_band: int):
    """Consecutive chunks grouped ``per_band`` at a time (chunks of one band share an input band)."""
    return [chunks[i:i + per_band] for i in range(0, len(chunks), per_band)]


def _epilogue_members(low: Lowerer, n: Node, hshape):
    """The fused chain of ``n`` reshaped to the host coordinates ``hshape``; members that cannot be
    (non-contiguous extras) and everything after them are lowered alone."""
    members, alone = epilogue_chain(low, n)
    kept = []
    for k, m in enumerate(members):
        r = m.reshaped(hshape)
        if r is None:
            alone = [x.node for x in members[k:]] + alone
            break
        kept.append((m, r))
    return [m for m, _ in kept], [r for _, r in kept], alone


def _conv_geometry(n: Node, x: View, w: View):
    """(geometry, x view, w view, x partition dims, w partition dims) of ``n``, or None for a GpSimd kernel
    (3-D, or a transposed convolution whose padding crops past the kernel)."""
    stride, padding, dilation, transposed, groups = _conv_params(n)
    nd = x.meta.dim() - 2
    if nd not in (1, 2) or w.meta.dim() != nd + 2:
        return None
    a = list(n.args) + [None] * 9
    opad = list(a[7] or [0])
    if nd == 1:
        x = x.with_meta(x.meta.unsqueeze(2))
        w = w.with_meta(w.meta.unsqueeze(2))
        stride, padding, dilation, opad = ([d] + s[-1:] for d, s in ((1, stride), (0, padding), (1, dilation),
                                                                    (0, opad)))
    stride, padding, dilation, opad = (s * 2 if len(s) == 1 else s for s in (stride, padding, dilation, opad))
    if transposed:
        g = transposed_geometry(x.shape, w.shape, stride, padding, dilation, opad, groups)
    else:
        g = patch_geometry(x.shape, w.shape, stride, padding, dilation, groups)
        if g is not None and views(g, x.meta, w.meta)[0] is None:
            g = None
        g = g or direct_geometry(x.shape, w.shape, stride, padding, dilation, groups)
    if g is None:
        return None
    xm, wm, xs, ws = views(g, x.meta, w.meta)
    return g, x.with_meta(xm), w.with_meta(wm), xs, ws


@lowering("conv", ops=("convolution",), op_classes=("conv",))
def lower_conv(low: Lowerer, n: Node) -> None:
    """aten.convolution (1-D/2-D, any stride, padding, dilation, groups; transposed too) as shifted matmuls;
    see the module docstring and ``convgeom``. 3-D convolutions run as a GpSimd ``CUSTOM_OP``."""
    x, w = low.value(n.args[0]), low.value(n.args[1])
    bias = low.value(n.args[2]) if len(n.args) > 2 and is_ref(n.args[2]) else None
    got = _conv_geometry(n, x, w)
    if got is None:
        low.log.append(f"lower: {n.name} {x.meta.dim() - 2}-D convolution (or a transposed one cropped past its "
                       "kernel) runs as a GpSimd kernel")
        return lower_custom(low, n)
    g, x, w, xsplit, wsplit = got
    mm_dt = low.cast_type if low.auto_cast in ("matmult", "all") and x.dtype == "float32" else x.dtype
    if mm_dt not in FLOATS:
        mm_dt = "float32"
    es = nbytes_of(mm_dt)
    B, OH, OW, G, Og = x.shape[0], g.OH, g.OW, g.G, g.Og
    chunks = _chunks(OH, OW)
    per_band = 2 if OW <= MOVING_FMAX else ceil_div(OW, MOVING_FMAX)
    budget = low.sbuf.cap
    w_bytes = G * len(g.cboxes) * ceil_div(g.wF * es, 64) * 64
    while True:
        bands = _bands(chunks, per_band)
        rows_max = max(sum(c[1] for c in bd) if OW <= MOVING_FMAX else 1 for bd in bands)
        Rin = (rows_max - 1) * g.sh + (g.KH - 1) * g.dh + 1
        band_bytes = 2 * len(g.cboxes) * Rin * g.Wp * es
        if band_bytes + w_bytes <= budget // 2 or per_band == 1 or OW > MOVING_FMAX:
            break
        per_band = 1
    stream = band_bytes + w_bytes > budget // 2 or g.wF * es > budget // 4
    if stream:          # the weights do not stay: one output block at a time (_ConvWeights)
        w_bytes = 2 * ceil_div(g.KH * g.KW * min(PMAX, Og) * es, 64) * 64
    if band_bytes + w_bytes > budget // 2 or OW > PSUM_BANKS_PER_ACC * MOVING_FMAX:
        low.log.append(f"lower: {n.name} convolution working set exceeds SBUF; runs as a GpSimd kernel")
        return lower_custom(low, n)
    if g.kind != "direct":
        low.log.append(f"lower: {n.name} {g.kind} convolution on the Tensor Engine "
                       f"({sum(m for _, m in g.cboxes[0])} contraction rows, {g.KH * g.KW} taps)")
    hshape = (B, G * Og, OH * OW)
    members, members_h, alone = _epilogue_members(low, n, hshape)
    bn = fusable_bn(low, n) if not members else None
    if bn is not None:      # BN (and its activation) ride in this evacuation: convbn.py
        low.done.add(bn.name)
        low.done.update(f.name for f in low.fused.get(bn.name, []))
        members, members_h, bn_alone = _epilogue_members(low, bn, hshape)
        alone = alone + bn_alone
        for i in (1, 2):              # saved mean / invstd are empty in inference: buffers only
            if len(bn.outputs) > i:
                low.out_view(f"{bn.name}:{i}", bn.outputs[i])
    host = bn if bn is not None else n
    out_views = chain_outputs(low, host, members, tuple(host.outputs[0].shape))
    out3 = {k: reshape_view(v, hshape) for k, v in out_views.items()}
    oblocks = [(o0, min(PMAX, Og - o0)) for o0 in range(0, Og, PMAX)]
    wt = _ConvWeights(low, n, g, w, wsplit, mm_dt, stream)
    bt = _bias_columns(low, n, g, bias)
    bnc = None
    if bn is not None:
        blocks = {(gi, oi): (gi * Og + o0, on) for gi in range(G) for oi, (o0, on) in enumerate(oblocks)}
        bnc = BNColumns(low, n.name, bn, blocks, bt).cols
    staged = x.dtype != mm_dt or g.up != (1, 1)
    pools = (Pool(low, f"{n.name}.x", "sbuf", PMAX, Rin * g.Wp, mm_dt, bufs=2 * len(g.cboxes)),
             Pool(low, f"{n.name}.xst", "sbuf", PMAX, Rin * g.Win, x.dtype, bufs=2) if staged else None,
             Pool(low, f"{n.name}.acc", "psum", PMAX, per_band * MOVING_FMAX, "float32", bufs=2),
             {"__F": MOVING_FMAX, "__bufs": 6})
    ctx = (host, members_h, out3, bnc, bias is not None and bt, hshape, host.outputs[0].dtype, per_band)
    for b in range(B):
        for band in bands:
            _conv_band(low, n, g, x, b, band, Rin, xsplit, wt, oblocks, pools, ctx, mm_dt)
    if bn is not None:
        low.finished.add(bn.name)
        low.finished.update(f.name for f in low.fused.get(bn.name, []))
    lower_alone(low, alone)


def _conv_band(low: Lowerer, n: Node, g, x: View, b: int, band, Rin: int, xsplit: int, wt: dict, oblocks,
               pools, ctx, mm_dt: str) -> None:
    """One band of output rows of image ``b``: load its input band per contraction block, one MATMUL per
    tap and output chunk into PSUM, evacuate with the bias / batch norm and the fused epilogue."""
    xpool, xstage, acc_pool, epi_pools = pools
    host, members_h, out3, bnc, bt, hshape, out_dt, per_band = ctx
    r0 = band[0][0]
    hs = r0 * g.sh - g.ph
    taps = [(kh, kw) for kh in range(g.KH) for kw in range(g.KW)]
    for grp in range(g.G):
        xb = [_load_band(low, n.name, x, [(b, 1)] + x_box(g, grp, cb), hs, Rin, g.pw, 0.0, xpool, xstage,
                         Wp=g.Wp, up=g.up) for cb in g.cboxes]
        for oi, (o0, on) in enumerate(oblocks):
            acc = acc_pool.tile(on, per_band * MOVING_FMAX)
            last = (len(g.cboxes) - 1, len(taps) - 1)
            for ci, cb in enumerate(g.cboxes):
                cn = math.prod(m for _, m in cb)
                wtile, per_tap, first = wt.block(grp, ci, o0, on)
                for ti, (kh, kw) in enumerate(taps):
                    stat = wtile.cols(g.tap_col(kh, kw) * per_tap + first, on)
                    low.emit("LDWEIGHTS", n.name, [], [stat.op()], {}, dur=ldweights_ns(low.p, on, mm_dt))
                    for j, (rr, nr, cc, nc) in enumerate(band):
                        off = ((rr - r0) * g.sh + kh * g.dh) * g.Wp + cc * g.sw + kw * g.dw
                        mov = _window(xb[ci], off, nr, g.sh * g.Wp, nc, g.sw)
                        low.emit("MATMUL", n.name, [acc.cols(j * MOVING_FMAX, nr * nc).op()], [stat.op(), mov],
                                 {"start": (ci, ti) == (0, 0), "stop": (ci, ti) == last},
                                 dur=matmul_ns(low.p, nr * nc, on, mm_dt), flops=2 * cn * on * nr * nc,
                                 itype="REGULAR", small=False)
            for j, (rr, nr, cc, nc) in enumerate(band):
                box = [(b, 1), (grp * g.Og + o0, on), (rr * g.OW + cc, nr * nc)]
                tctx = TileCtx(low, hshape, box, 2, epi_pools)
                out_t = tctx.out_tile(n.name, "evac", out_dt if not members_h else "float32")
                src = acc.cols(j * MOVING_FMAX, nr * nc).op()
                if bnc is not None:
                    scale, shift = bnc[grp, oi]
                    low.act(n.name, out_t, src, "copy", bias=shift.op(), scale=scale.op())
                elif bt:
                    low.act(n.name, out_t, src, "copy", bias=bt[grp, oi].op())
                else:
                    low.act(n.name, out_t, src, "copy")
                run_chain(tctx, host.name, out_t, members_h, out3)


class _ConvWeights:
    """The weights as stationary tiles, cast to the matmul dtype through a staging tile. Resident for the
    whole convolution (one [contraction block, taps x Og] tile per (group, block)) when they fit in SBUF
    beside the bands; else (``stream``: SBUF mostly held by resident activations, or a tile past a quarter
    of it) loaded per output block of <= 128 channels where each band uses it, double-buffered."""

    def __init__(self, low: Lowerer, n: Node, g, w: View, wsplit: int, mm_dt: str, stream: bool):
        self.low, self.n, self.g, self.w, self.wsplit, self.stream = low, n, g, w, wsplit, stream
        width = g.KH * g.KW * min(PMAX, g.Og) if stream else g.wF
        self.pool = Pool(low, f"{n.name}.W", "sbuf", PMAX, width, mm_dt, bufs=2 if stream else g.G * len(g.cboxes))
        self.stage = Pool(low, f"{n.name}.Wst", "sbuf", PMAX, width, w.dtype, bufs=2) if w.dtype != mm_dt else None
        self.tiles = {} if stream else {(grp, ci): self._load(w_box(g, grp, cb))
                                        for grp in range(g.G) for ci, cb in enumerate(g.cboxes)}

    def _load(self, box: list) -> Tile:
        if self.stage is None:
            return self.low.load(self.n.name, self.w, box, self.pool, self.wsplit)
        st = self.low.load(self.n.name, self.w, box, self.stage, self.wsplit)
        t = self.pool.tile(st.P, st.F)
        self.low.act(self.n.name, t, st.op(), "copy")
        return t

    def block(self, grp: int, ci: int, o0: int, on: int) -> tuple[Tile, int, int]:
        """(tile, columns per tap, first column) of output channels ``o0 .. o0 + on`` of block (grp, ci)."""
        if not self.stream:
            return self.tiles[grp, ci], self.g.Og, o0
        box = w_box(self.g, grp, self.g.cboxes[ci])
        box[-1] = (box[-1][0] + o0, on)
        return self._load(box), on, 0


def _bias_columns(low: Lowerer, n: Node, g, bias: View | None) -> dict:
    """The bias as one [Og-block, 1] column per (group, block), added while PSUM is evacuated."""
    bt = {}
    if bias is not None:
        oblocks = [(o0, min(PMAX, g.Og - o0)) for o0 in range(0, g.Og, PMAX)]
        bpool = Pool(low, f"{n.name}.bias", "sbuf", PMAX, 1, bias.dtype, bufs=g.G * len(oblocks))
        bcol = bias.with_meta(bias.meta.unsqueeze(1))
        for grp in range(g.G):
            for oi, (o0, on) in enumerate(oblocks):
                bt[grp, oi] = low.load(n.name, bcol, [(grp * g.Og + o0, on), (0, 1)], bpool, 1)
    return bt


def _pool_params(n: Node):
    """(kind, kernel, stride, padding, dilation, divisor) or None when the op needs the GpSimd kernel."""
    name = packet_name(n.target)
    a = list(n.args) + [None] * 8
    k = list(a[1])
    k = k * 2 if len(k) == 1 else k
    s = list(a[2] or k)
    s = s * 2 if len(s) == 1 else s
    p = list(a[3] if a[3] is not None else [0])
    p = p * 2 if len(p) == 1 else p
    if name == "max_pool2d_with_indices":
        d = list(a[4] if a[4] is not None else [1])
        ceil = bool(a[5]) if a[5] is not None else False
        return (None if ceil else ("max", k, s, p, d * 2 if len(d) == 1 else d, 1))
    ceil = bool(a[4]) if a[4] is not None else n.kwargs.get("ceil_mode", False)
    include_pad = a[5] if a[5] is not None else n.kwargs.get("count_include_pad", True)
    override = a[6] if a[6] is not None else n.kwargs.get("divisor_override")
    if ceil or (not include_pad and any(p) and not override):
        return None
    return ("avg", k, s, p, [1, 1], override or k[0] * k[1])


@lowering("pool", ops=("max_pool2d_with_indices", "avg_pool2d"))
def lower_pool(low: Lowerer, n: Node) -> None:
    """max_pool2d (values only) and avg_pool2d: (B*C) rows on partitions, a band of input rows on the
    free axis, one Vector instruction per kernel tap over the output tile (module docstring)."""
    prm = _pool_params(n)
    x = low.value(n.args[0])
    if prm is None or x.meta.dim() != 4 or (packet_name(n.target) == "max_pool2d_with_indices"
                                            and output_used(low, n, 1)):
        low.log.append(f"lower: {n.name} {n.target} (indices, ceil_mode or padding-aware divisor) runs as a "
                       "GpSimd kernel")
        return lower_custom(low, n)
    kind, (KH, KW), (sh, sw), (ph, pw), (dh, dw), divisor = prm
    B, C, H, W = x.shape
    spec = n.outputs[0]
    OH, OW = spec.shape[2], spec.shape[3]
    dt = x.dtype if x.dtype in FLOATS else "float32"
    Wp = W + 2 * pw
    R = max(1, min(OH, FREE_TILE // max(1, Wp * max(sh, 1)), FREE_TILE // max(1, OW)))
    Rin = (R - 1) * sh + (KH - 1) * dh + 1
    if Rin * Wp * nbytes_of(dt) * 4 > low.sbuf.cap // 2:
        low.log.append(f"lower: {n.name} pooling window rows exceed SBUF; runs as a GpSimd kernel")
        return lower_custom(low, n)
    out = low.out_view(n.name, spec)
    if len(n.outputs) > 1:        # the unused indices of max_pool2d_with_indices still name a buffer
        low.out_view(f"{n.name}:1", n.outputs[1])
    fill = float("-inf") if kind == "max" else 0.0
    xpool = Pool(low, f"{n.name}.x", "sbuf", PMAX, Rin * Wp, dt, bufs=2)
    opool = Pool(low, f"{n.name}.o", "sbuf", PMAX, R * OW, spec.dtype, bufs=2)
    stage = Pool(low, f"{n.name}.xst", "sbuf", PMAX, Rin * W, x.dtype, bufs=2) if x.dtype != dt else None
    alu = "max" if kind == "max" else "add"
    for rbox in boxes((B, C), PMAX):
        P = math.prod(m for _, m in rbox)
        for r0 in range(0, OH, R):
            nr = min(R, OH - r0)
            t = _load_band(low, n.name, x, rbox, r0 * sh - ph, Rin, pw, fill, xpool, stage)
            o = opool.tile(P, nr * OW)
            for ti, (kh, kw) in enumerate((kh, kw) for kh in range(KH) for kw in range(KW)):
                win = _window(t, kh * dh * Wp + kw * dw, nr, sh * Wp, OW, sw)
                if ti == 0:
                    low.vec("TENSOR_COPY", n.name, o, [win])
                else:
                    low.vec("TENSOR_TENSOR", n.name, o, [o.op(), win], n_inputs=2,
                            op="maximum" if alu == "max" else "add", flops=P * nr * OW)
            if kind == "avg":
                low.vec("TENSOR_SCALAR", n.name, o, [o.op()], op0="multiply", scalar0=1.0 / divisor, flops=P * nr * OW)
            low.store(n.name, o, out, list(rbox) + [(r0, nr), (0, OW)])


@lowering("batch_norm", ops=("_native_batch_norm_legit_no_training",))
def lower_batch_norm(low: Lowerer, n: Node) -> None:
    """_native_batch_norm_legit_no_training(x, w, b, mean, var, momentum, eps): channels on partitions,
    per-channel scale/shift columns, one ``TENSOR_SCALAR`` (x * scale + shift) per tile."""
    a = list(n.args) + [None] * 7
    x = low.value(a[0])
    if x.meta.dim() < 2:
        return lower_custom(low, n)
    wv, bv = (low.value(a[i]) if is_ref(a[i]) else None for i in (1, 2))
    mean, var = low.value(a[3]), low.value(a[4])
    eps = a[6] if a[6] is not None else 1e-5
    B, C = x.shape[0], x.shape[1]
    S = math.prod(x.shape[2:])
    x3 = reshape_view(x, (B, C, S))
    if x3 is None:
        return lower_custom(low, n)
    hshape = (B, C, S)
    members, members_h, alone = _epilogue_members(low, n, hshape)
    outs = chain_outputs(low, n, members, tuple(n.outputs[0].shape))
    out3 = {k: reshape_view(v, hshape) for k, v in outs.items()}
    for i in (1, 2):              # saved mean / invstd are empty in inference: buffers only
        if len(n.outputs) > i:
            low.out_view(f"{n.name}:{i}", n.outputs[i])
    cblocks = [(c0, min(PMAX, C - c0)) for c0 in range(0, C, PMAX)]
    small = Pool(low, f"{n.name}.s", "sbuf", PMAX, 1, "float32", bufs=6 * len(cblocks))
    cols = {}
    for c0, cn in cblocks:
        col = lambda v: low.load(n.name, v.with_meta(v.meta.unsqueeze(1)), [(c0, cn), (0, 1)], small, 1)  # noqa: E731
        mt, vt = col(mean), col(var)
        scale = small.tile(cn, 1)
        low.vec("TENSOR_SCALAR", n.name, scale, [vt.op()], op0="add", scalar0=eps, op1="power", scalar1=-0.5)
        if wv is not None:
            low.vec("TENSOR_TENSOR", n.name, scale, [scale.op(), col(wv).op()], n_inputs=2, op="multiply")
        shift = small.tile(cn, 1)
        low.vec("TENSOR_TENSOR", n.name, shift, [mt.op(), scale.op()], n_inputs=2, op="multiply")
        if bv is not None:
            low.vec("TENSOR_TENSOR", n.name, shift, [col(bv).op(), shift.op()], n_inputs=2, op="subtract")
        else:
            low.vec("TENSOR_SCALAR", n.name, shift, [shift.op()], op0="multiply", scalar0=-1.0)
        cols[c0] = (scale, shift)
    F = min(FREE_TILE, S)
    xpool = Pool(low, f"{n.name}.x", "sbuf", PMAX, F, x.dtype, bufs=3)
    pools = {"__F": F, "__bufs": 3}
    for b in range(B):
        for c0, cn in cblocks:
            scale, shift = cols[c0]
            for f0 in range(0, S, F):
                fl = min(F, S - f0)
                box = [(b, 1), (c0, cn), (f0, fl)]
                xt = low.load(n.name, x3, box, xpool, 2)
                ctx = TileCtx(low, hshape, box, 2, pools)
                y = ctx.out_tile(n.name, "y", n.outputs[0].dtype if not members else "float32")
                low.vec("TENSOR_SCALAR", n.name, y, [xt.op(), scale.op(), shift.op()], op0="multiply",
                        scalar0={"src": 1}, op1="add", scalar1={"src": 2}, flops=2 * cn * fl)
                run_chain(ctx, n.name, y, members_h, out3)
    lower_alone(low, alone)
