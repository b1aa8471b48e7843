"""Convolution, pooling and inference batch norm on the engines (pass 4).

Convolution is *im2col-free shifted matmuls*: an input band (channels on partitions, a few input
rows x the padded width on the free axis) is loaded once into SBUF, zero padding written by
``MEMSET`` on the border only; every kernel tap (kh, kw) is then one ``LDWEIGHTS`` of the tap's
weights ``W[:, c, kh, kw]^T`` ([C<=128, O<=128]) and one ``MATMUL`` whose moving operand is the
band read through a strided access pattern (rows every ``stride*Wp``, columns every ``stride``,
shifted by the tap), all taps and channel blocks accumulating into one PSUM bank of <=512 output
positions. The bank is evacuated on the Scalar engine with the per-channel bias
(``ACTIVATE copy, bias=column``) and the fused epilogue (ReLU...), then stored. Weights are laid
out at compile time as [C, KH, KW, O] so each channel block is one contiguous load.

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
               stage: Pool | None) -> Tile:
    """Rows ``hs .. hs+Rin`` (may reach into the padding) of ``v`` [..rows.., H, W] restricted to the
    partition box ``rbox`` into a padded band tile [P, Rin x (W + 2 pw)] of ``pool``'s dtype;
    through ``stage`` (a cast on the Scalar engine) when the dtypes differ."""
    H, W = v.shape[-2], v.shape[-1]
    Wp = W + 2 * pw
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


@lowering("conv", ops=("convolution",), op_classes=("conv",))
def lower_conv(low: Lowerer, n: Node) -> None:
    """aten.convolution (1-D/2-D, any stride, padding, dilation, groups) as shifted matmuls; see the
    module docstring. Transposed and 3-D convolutions run as a GpSimd ``CUSTOM_OP``."""
    stride, padding, dilation, transposed, groups = _conv_params(n)
    x, w = low.value(n.args[0]), low.value(n.args[1])
    bias = low.value(n.args[2]) if len(n.args) > 2 and is_ref(n.args[2]) else None
    nd = x.meta.dim() - 2
    if transposed or nd not in (1, 2) or w.meta.dim() != nd + 2:
        low.log.append(f"lower: {n.name} {'transposed ' if transposed else ''}{nd}-D convolution runs as a "
                       "GpSimd kernel")
        return lower_custom(low, n)
    if nd == 1:
        x = x.with_meta(x.meta.unsqueeze(2))
        w = w.with_meta(w.meta.unsqueeze(2))
        stride, padding, dilation = [1] + stride[-1:], [0] + padding[-1:], [1] + dilation[-1:]
    stride, padding, dilation = (s * 2 if len(s) == 1 else s for s in (stride, padding, dilation))
    B, C, H, W = x.shape
    O, Cg, KH, KW = w.shape
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    OH = (H + 2 * ph - dh * (KH - 1) - 1) // sh + 1
    OW = (W + 2 * pw - dw * (KW - 1) - 1) // sw + 1
    G, Og = groups, O // groups
    mm_dt = low.cast_type if low.auto_cast in ("matmult", "all") and x.dtype == "float32" else x.dtype
    if mm_dt not in FLOATS:
        mm_dt = "float32"
    es = nbytes_of(mm_dt)
    Wp = W + 2 * pw
    cblocks = [(c0, min(PMAX, Cg - c0)) for c0 in range(0, Cg, PMAX)]
    oblocks = [(o0, min(PMAX, Og - o0)) for o0 in range(0, Og, PMAX)]
    chunks = _chunks(OH, OW)
    per_band = 2 if OW <= MOVING_FMAX else ceil_div(OW, MOVING_FMAX)
    budget = low.sbuf.cap
    w_bytes = G * len(cblocks) * ceil_div(KH * KW * Og * es, 64) * 64
    while True:
        bands = _bands(chunks, per_band)
        rows_max = max(sum(c[1] for c in bd) if OW <= MOVING_FMAX else 1 for bd in bands)
        Rin = (rows_max - 1) * sh + (KH - 1) * dh + 1
        band_bytes = 2 * len(cblocks) * Rin * Wp * es
        if band_bytes + w_bytes <= budget // 2 or per_band == 1 or OW > MOVING_FMAX:
            break
        per_band = 1
    if band_bytes + w_bytes > budget // 2 or OW > PSUM_BANKS_PER_ACC * MOVING_FMAX or Og * KH * KW * es > budget // 4:
        low.log.append(f"lower: {n.name} convolution working set exceeds SBUF; runs as a GpSimd kernel")
        return lower_custom(low, n)
    hshape = (B, O, OH * OW)
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
    out_dt = host.outputs[0].dtype

    wt, bt = _resident_weights(low, n, w, bias, G, cblocks, oblocks, mm_dt)
    bnc = None
    if bn is not None:
        blocks = {(g, oi): (g * Og + o0, on) for g in range(G) for oi, (o0, on) in enumerate(oblocks)}
        bnc = BNColumns(low, n.name, bn, blocks, bt).cols
    xpool = Pool(low, f"{n.name}.x", "sbuf", PMAX, Rin * Wp, mm_dt, bufs=2 * len(cblocks))
    xstage = Pool(low, f"{n.name}.xst", "sbuf", PMAX, Rin * W, x.dtype, bufs=2) if x.dtype != mm_dt else None
    acc_pool = Pool(low, f"{n.name}.acc", "psum", PMAX, per_band * MOVING_FMAX, "float32", bufs=2)
    epi_pools = {"__F": MOVING_FMAX, "__bufs": 6}
    taps = [(kh, kw) for kh in range(KH) for kw in range(KW)]
    for b in range(B):
        for band in bands:
            r0 = band[0][0]
            hs = r0 * sh - ph
            for g in range(G):
                xb = [_load_band(low, n.name, x, [(b, 1), (g * Cg + c0, cn)], hs, Rin, pw, 0.0, xpool, xstage)
                      for c0, cn in cblocks]
                for oi, (o0, on) in enumerate(oblocks):
                    acc = acc_pool.tile(on, per_band * MOVING_FMAX)
                    last = (len(cblocks) - 1, len(taps) - 1)
                    for ci, (c0, cn) in enumerate(cblocks):
                        for ti, (kh, kw) in enumerate(taps):
                            stat = wt[g, ci].cols(ti * Og + o0, on)
                            low.emit("LDWEIGHTS", n.name, [], [stat.op()], {}, dur=ldweights_ns(low.p, on, mm_dt))
                            for j, (rr, nr, cc, nc) in enumerate(band):
                                off = ((rr - r0) * sh + kh * dh) * Wp + cc * sw + kw * dw
                                mov = _window(xb[ci], off, nr, sh * Wp, nc, sw)
                                low.emit("MATMUL", n.name, [acc.cols(j * MOVING_FMAX, nr * nc).op()], [stat.op(), mov],
                                         {"start": (ci, ti) == (0, 0), "stop": (ci, ti) == last},
                                         dur=matmul_ns(low.p, nr * nc, on, mm_dt), flops=2 * cn * on * nr * nc,
                                         itype="REGULAR", small=False)
                    for j, (rr, nr, cc, nc) in enumerate(band):
                        box = [(b, 1), (g * Og + o0, on), (rr * OW + cc, nr * nc)]
                        ctx = TileCtx(low, hshape, box, 2, epi_pools)
                        out_t = ctx.out_tile(n.name, "evac", out_dt if not members else "float32")
                        src = acc.cols(j * MOVING_FMAX, nr * nc).op()
                        if bnc is not None:
                            scale, shift = bnc[g, oi]
                            low.act(n.name, out_t, src, "copy", bias=shift.op(), scale=scale.op())
                        elif bias is not None:
                            low.act(n.name, out_t, src, "copy", bias=bt[g, oi].op())
                        else:
                            low.act(n.name, out_t, src, "copy")
                        run_chain(ctx, host.name, out_t, members_h, out3)
    if bn is not None:
        low.finished.add(bn.name)
        low.finished.update(f.name for f in low.fused.get(bn.name, []))
    lower_alone(low, alone)


def _resident_weights(low: Lowerer, n: Node, w: View, bias: View | None, G: int, cblocks, oblocks, mm_dt: str):
    """The weights, resident for the whole convolution: one [Cg-block, KH*KW*Og] tile per (group, block), cast
    to the matmul dtype through a staging tile; the bias as one [Og-block, 1] column per (group, block), added
    while PSUM is evacuated. Returns ``(weights, bias columns)`` keyed by ``(group, block)``."""
    O, _, KH, KW = w.shape
    Og = O // G
    wv = w.with_meta(w.meta.permute(1, 2, 3, 0))               # [Cg, KH, KW, O]
    wpool = Pool(low, f"{n.name}.W", "sbuf", PMAX, KH * KW * Og, mm_dt, bufs=G * len(cblocks))
    wstage = Pool(low, f"{n.name}.Wst", "sbuf", PMAX, KH * KW * Og, w.dtype, bufs=2) if w.dtype != mm_dt else None
    wt = {}
    for g in range(G):
        for ci, (c0, cn) in enumerate(cblocks):
            box = [(c0, cn), (0, KH), (0, KW), (g * Og, Og)]
            if wstage is None:
                wt[g, ci] = low.load(n.name, wv, box, wpool, 1)
            else:
                st = low.load(n.name, wv, box, wstage, 1)
                t = wpool.tile(cn, KH * KW * Og)
                low.act(n.name, t, st.op(), "copy")
                wt[g, ci] = t
    bt = {}
    if bias is not None:
        bpool = Pool(low, f"{n.name}.bias", "sbuf", PMAX, 1, bias.dtype, bufs=G * len(oblocks))
        bcol = bias.with_meta(bias.meta.unsqueeze(1))
        for g in range(G):
            for oi, (o0, on) in enumerate(oblocks):
                bt[g, oi] = low.load(n.name, bcol, [(g * Og + o0, on), (0, 1)], bpool, 1)
    return wt, bt


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
