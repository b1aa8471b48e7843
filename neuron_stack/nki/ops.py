"""Instruction emitters shared by ``nki.isa`` (both call forms) and ``nki.language``.

Each function checks the tile rules for its instruction (naming the kernel line), applies a mask
(the instruction runs on the mask's box) and records the instruction with its cost from
:mod:`neuron_stack.device.cost`, the same formulas the compiler's lowering uses.

>>> import numpy as np
>>> resolve_alu(np.add), resolve_act("exp")
('add', 'exp')
"""
from __future__ import annotations

import math

from neuron_stack.device.cost import (
    gpsimd_ns,
    ldweights_ns,
    matmul_ns,
    scalar_ns,
    vector_ns,
)
from neuron_stack.isa.instructions import ACT_FUNCS, ALU_OPS

from .core import (
    DTYPE_BYTES,
    FLOATS,
    GEMM_MOVING_FMAX,
    GEMM_STATIONARY_FMAX,
    PMAX,
    PSUM_BANK_BYTES,
    NKIError,
    _overlap,
    current,
    dtype_name,
    ndarray,
    where,
)
from .indexing import Idx, box_of, dma_dynamic, restrict

_REDUCE = {"add": "add", "sum": "add", "maximum": "max", "max": "max", "minimum": "min", "min": "min",
           "multiply": "multiply", "prod": "multiply", "logical_and": "logical_and", "logical_or": "logical_or"}
_ALU_ALIAS = {"sub": "subtract", "mul": "multiply", "div": "divide", "true_divide": "divide", "max": "maximum",
              "min": "minimum", "pow": "power"}
_ACT_ALIAS = {"negative": "neg", "gelu_apprx_tanh": "gelu_tanh", "copy": "copy", "sqrt": "sqrt"}


def _name(op) -> str:
    if isinstance(op, str):
        return op
    return getattr(op, "_alu", None) or getattr(op, "_act", None) or getattr(op, "__name__", str(op))


def _resolve(name: str, aliases: dict, known, refusal: str) -> str:
    """``name`` through ``aliases``, refused with ``refusal`` when the engine does not know it."""
    n = aliases.get(name, name)
    if n not in known:
        raise NKIError(f"{where()}: {n!r} is not {refusal}")
    return n


def resolve_alu(op) -> str:
    """The ISA ALU op of ``op`` (``nl.add``, ``np.add`` or ``"add"``)."""
    return _resolve(_name(op), _ALU_ALIAS, ALU_OPS, "a Vector Engine ALU operator; use one of nl.add, "
                    "nl.subtract, nl.multiply, nl.divide, nl.maximum, nl.minimum, ...")


def resolve_act(op) -> str:
    """The ISA activation function of ``op`` (``nl.exp``, ``np.exp`` or ``"exp"``)."""
    return _resolve(getattr(op, "_act", None) or _name(op), _ACT_ALIAS, ACT_FUNCS,
                    "a Scalar Engine activation function; use e.g. nl.exp, nl.tanh, nl.relu, nl.rsqrt, nl.copy")


def resolve_reduce(op) -> str:
    """The ISA reduction of ``op`` (``nl.add``, ``np.maximum`` or ``"max"``)."""
    return _resolve(_name(op), _REDUCE, set(_REDUCE.values()),
                    "a reduction; use nl.add, nl.maximum, nl.minimum or nl.multiply")


# -----------------------------------------------------------------------------------------------

def on_chip(v, what: str) -> ndarray:
    if not isinstance(v, ndarray):
        raise NKIError(f"{where()}: {what} must be an NKI tile, got {type(v).__name__}")
    if v.buf.mem == "hbm":
        raise NKIError(f"{where()}: {what} is in HBM; engines read SBUF/PSUM: load it first (nl.load or "
                       f"nisa.dma_copy into an nl.sbuf tensor)")
    if v.partitions > PMAX:
        raise NKIError(f"{where()}: {what} partition dimension {v.partitions} exceeds maximum {PMAX}")
    return v


def masked_away(v) -> bool:
    """Whether ``v`` is the result of an instruction whose mask selected nothing (so none was issued):
    assigning it or adding it into a tile then writes nothing either."""
    return isinstance(v, ndarray) and not v.buf.writes and getattr(current(), "masked_box", 0) == (v.operand(), None)


def masked_part(dst: ndarray, value):
    """``dst[...] = value`` for a masked result: None when its mask selected nothing (nothing to write), else
    ``(dst, value)`` cut to the box its instruction wrote (both whole when it was not masked)."""
    if masked_away(value):
        return None
    box = getattr(current(), "masked_box", None)
    if isinstance(value, ndarray) and box and box[1] and box[0] == value.operand() and dst.shape == value.shape:
        return restrict(dst, box[1], dst.shape), restrict(value, box[1], value.shape)
    return dst, value


def skip(v: ndarray) -> None:
    """``v``'s instruction is not issued (its mask selected nothing): assigning or adding ``v`` writes nothing
    (:func:`masked_away`), and if nothing else touches it, it takes no SBUF/PSUM space."""
    t = current()
    t.masked_box = (v.operand(), None)
    if v.buf.name in t.tiles and not v.buf.writes:
        t.tiles[v.buf.name]["skipped"] = True


def masked(dst: ndarray, srcs: list, mask) -> tuple | None:
    """(dst, srcs) limited to ``mask``'s box; None when the mask selects nothing."""
    if mask is None:
        return dst, srcs
    box = box_of(mask, dst.shape)
    if box is None:
        return skip(dst)
    current().masked_box = (dst.operand(), box)     # `t[...] = <masked result>` writes only this box of t
    return restrict(dst, box, dst.shape), [restrict(s, box, dst.shape) if isinstance(s, ndarray) else s
                                            for s in srcs]


def _same_partitions(dst: ndarray, srcs: list, name: str) -> None:
    for s in srcs:
        if isinstance(s, ndarray) and s.partitions != dst.partitions:
            raise NKIError(f"{where()}: {name} reads {s.partitions} partitions but writes {dst.partitions}: engines "
                           f"work lane by lane (partition broadcast needs tile.broadcast_to)")
        if (isinstance(s, ndarray) and s.free_size not in (dst.free_size, 1)
                and math.prod(s.shape) != math.prod(dst.shape)):
            raise NKIError(f"{where()}: {name} operand {s.shape} does not match the destination {dst.shape}")


def _fit(s: ndarray, dst: ndarray) -> ndarray:
    """``s`` broadcast to ``dst``'s shape when it is a [P, 1] column (stride 0 along free)."""
    if s.shape == dst.shape or math.prod(s.shape) == math.prod(dst.shape):
        return s
    if s.free_size == 1:
        strides = [0] * len(dst.shape)
        strides[dst.pdim] = s.strides[s.pdim]
        return ndarray(s.buf, dst.shape, s.offset, strides, s.dtype, dst.pdim)
    return s


def tensor_tensor(dst: ndarray, a: ndarray, b: ndarray, op, mask=None) -> int | None:
    """TENSOR_TENSOR: ``dst = op(a, b)`` elementwise on the Vector Engine."""
    t = current()
    on_chip(dst, "tensor_tensor dst"), on_chip(a, "tensor_tensor data1"), on_chip(b, "tensor_tensor data2")
    alu = resolve_alu(op)
    _same_partitions(dst, [a, b], "tensor_tensor")
    r = masked(dst, [a, b], mask)
    if r is None:
        return None
    dst, (a, b) = r
    a, b = _fit(a, dst), _fit(b, dst)
    fast = "psum" in (a.buf.mem, b.buf.mem) or (a.dtype == b.dtype == "bfloat16"
                                                and alu in ("add", "multiply", "subtract"))
    d = vector_ns(t.p, "TENSOR_TENSOR", dst.free_size, 2, dst.dtype, fast, alu)
    return t.emit("TENSOR_TENSOR", [dst], [a, b], {"op": alu}, dur=d)


def _scalar_arg(v, srcs: list, dst: ndarray, what: str):
    if isinstance(v, ndarray):
        on_chip(v, what)
        if v.free_size != 1 or v.partitions != dst.partitions:
            raise NKIError(f"{where()}: {what} {v.shape} must be a per-partition column [{dst.partitions}, 1]")
        srcs.append(v)
        return {"src": len(srcs) - 1}
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        return v                    # integer immediates stay exact (int tiles, bit shifts)
    return float(v)


def tensor_scalar(dst: ndarray, data: ndarray, op0, operand0, reverse0=False, op1=None, operand1=None,
                  reverse1=False, mask=None, engine: str = "vector", reduce_op=None, reduce_res=None) -> int | None:
    """TENSOR_SCALAR: ``dst = op1(op0(data, operand0), operand1)``; operands are immediates or
    per-partition ``[P, 1]`` columns; ``reduce_res`` ([P, 1]) also gets the result reduced along free
    (``nisa.tensor_scalar_reduce``, one instruction)."""
    t = current()
    on_chip(dst, "tensor_scalar dst"), on_chip(data, "tensor_scalar data")
    _same_partitions(dst, [data], "tensor_scalar")
    r = masked(dst, [data, operand0, operand1], mask)
    if r is None:
        return None
    dst, (data, operand0, operand1) = r
    srcs = [data]
    attrs = {"op0": _rev(resolve_alu(op0), reverse0), "scalar0": _scalar_arg(operand0, srcs, dst, "operand0")}
    if op1 is not None:
        attrs["op1"] = _rev(resolve_alu(op1), reverse1)
        attrs["scalar1"] = _scalar_arg(operand1, srcs, dst, "operand1")
    dsts = [dst]
    if reduce_res is not None:
        on_chip(reduce_res, "reduce_res")
        if reduce_res.free_size != 1 or reduce_res.partitions != dst.partitions:
            raise NKIError(f"{where()}: reduce_res {reduce_res.shape} must be a [{dst.partitions}, 1] column")
        attrs["acc_op"] = resolve_reduce(reduce_op or "add")
        dsts.append(reduce_res)
    d = vector_ns(t.p, "TENSOR_SCALAR", dst.free_size, 1, dst.dtype)
    return t.emit("TENSOR_SCALAR", dsts, srcs, attrs, dur=d)


def _rev(alu: str, reverse: bool) -> str:
    if not reverse:
        return alu
    if alu in ("add", "multiply", "maximum", "minimum", "equal", "not_equal"):
        return alu
    if alu in ("subtract", "divide"):
        return {"subtract": "rsub", "divide": "rdivide"}[alu]
    raise NKIError(f"{where()}: reverse operands are not supported for {alu}")


def activation(dst: ndarray, op, data: ndarray, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               mask=None) -> int | None:
    """ACTIVATE: ``dst = op(data * scale + bias)`` on the Scalar Engine, optionally reducing the result
    along the free axis into ``reduce_res`` ([P, 1])."""
    t = current()
    on_chip(dst, "activation dst"), on_chip(data, "activation data")
    func = resolve_act(op)
    _same_partitions(dst, [data], "activation")
    r = masked(dst, [data, bias, scale, reduce_res], mask)
    if r is None:
        return None
    dst, (data, bias, scale, reduce_res) = r
    srcs = [_fit(data, dst)]
    attrs = {"func": func, "bias": _scalar_arg(bias, srcs, dst, "bias") or 0.0,
             "scale": _scalar_arg(scale, srcs, dst, "scale")}
    dsts = [dst]
    if reduce_res is not None:
        on_chip(reduce_res, "reduce_res")
        if reduce_res.free_size != 1:
            raise NKIError(f"{where()}: reduce_res {reduce_res.shape} must be a [P, 1] column")
        attrs["acc_op"] = resolve_reduce(reduce_op or "add")
        dsts.append(reduce_res)
    d = scalar_ns(t.p, dst.free_size, accumulate=reduce_res is not None)
    return t.emit("ACTIVATE", dsts, srcs, attrs, dur=d)


def tensor_reduce(dst: ndarray, op, data: ndarray, axis, negate=False, mask=None) -> int | None:
    """REDUCE over the free axes of ``data`` into ``dst`` [P, 1] on the Vector Engine."""
    t = current()
    on_chip(dst, "tensor_reduce dst"), on_chip(data, "tensor_reduce data")
    axes = [axis] if isinstance(axis, int) else list(axis)
    axes = sorted(a % data.ndim for a in axes)
    if 0 in axes:
        raise NKIError(f"{where()}: tensor_reduce over the partition axis 0 is not an engine instruction; "
                       f"transpose first (nisa.nc_transpose) or use GpSimd partition reduce")
    keep = [d for d in range(1, data.ndim) if d not in axes]
    outer = math.prod(data.shape[d] for d in keep)
    if dst.free_size != outer or dst.partitions != data.partitions:
        raise NKIError(f"{where()}: tensor_reduce dst {dst.shape} must hold [{data.partitions}, {outer}] "
                       f"(the axes not reduced)")
    red = resolve_reduce(op)
    if mask is not None:        # the mask is over data's dims: dst keeps the box of its own (kept) dims
        box = box_of(mask, data.shape)
        if box is None:
            return None
        if dst.ndim == data.ndim:
            dbox = [(0, 1) if d in axes else b for d, b in enumerate(box)]
        elif dst.ndim == 1 + len(keep):
            dbox = [box[0]] + [box[d] for d in keep]
        else:
            dbox = [box[0]] + [(0, n) for n in dst.shape[1:]]
        current().masked_box = (dst.operand(), dbox)
        data, dst = restrict(data, box, data.shape), restrict(dst, dbox, dst.shape)
    attrs = {"op": red}
    if keep:
        # the engine reduces the innermost axes of its access pattern, so the instruction reads the tile with
        # the reduced axes moved last (a permuted access pattern: one instruction, as the compiler emits it)
        if data.pdim:
            raise NKIError(f"{where()}: tensor_reduce of some free axes of a block-layout (nl.par_dim) tile: "
                           f"reduce a [P, ...] view of one block")
        order = [0, *keep, *axes]
        data = ndarray(data.buf, [data.shape[d] for d in order], data.offset, [data.strides[d] for d in order],
                       data.dtype)
        attrs["inner"] = math.prod(data.shape[len(keep) + 1:])
    d = vector_ns(t.p, "REDUCE", data.free_size, 1, data.dtype, alu=red)
    i = t.emit("REDUCE", [dst], [data], attrs, dur=d)
    if negate:
        i = tensor_scalar(dst, dst, "multiply", -1.0)
    return i


def tensor_copy(dst: ndarray, src: ndarray, engine: str = "vector", mask=None) -> int | None:
    """TENSOR_COPY (Vector, dtype conversion, PSUM evacuation) or ACTIVATE copy (``engine='scalar'``)."""
    t = current()
    on_chip(dst, "tensor_copy dst"), on_chip(src, "tensor_copy src")
    if math.prod(src.shape) != math.prod(dst.shape) and src.free_size != 1:
        raise NKIError(f"{where()}: tensor_copy of {src.shape} into {dst.shape}: shapes differ")
    _same_partitions(dst, [src], "tensor_copy")
    r = masked(dst, [src], mask)
    if r is None:
        return None
    dst, (src,) = r
    src = _fit(src, dst)
    if engine == "scalar":
        return activation(dst, "copy", src)
    if engine == "gpsimd":
        return t.emit("TENSOR_COPY", [dst], [src], {}, dur=gpsimd_ns(t.p, dst.free_size))
    return t.emit("TENSOR_COPY", [dst], [src], {}, dur=vector_ns(t.p, "TENSOR_COPY", dst.free_size, 1, dst.dtype))


def nc_matmul(dst: ndarray, stationary: ndarray, moving: ndarray, accumulate=None, mask=None) -> int:
    """LDWEIGHTS + MATMUL: ``dst (+)= stationary.T @ moving``; contraction over the partitions.

    ``accumulate=None`` accumulates into a PSUM region already written by a matmul (an
    accumulation group) and overwrites a fresh one, as the compiler decides from the kernel.
    """
    t = current()
    on_chip(stationary, "nc_matmul stationary"), on_chip(moving, "nc_matmul moving")
    for v, what in ((stationary, "stationary"), (moving, "moving")):
        if v.buf.mem != "sbuf":
            raise NKIError(f"{where()}: nc_matmul {what} is a PSUM tile; the Tensor Engine reads SBUF: copy it "
                           f"to SBUF first (nisa.tensor_copy)")
    if dst.buf.mem != "psum":
        raise NKIError(f"{where()}: nc_matmul writes PSUM; dst is in {dst.buffer} (allocate it with buffer=nl.psum)")
    K, M, N = stationary.partitions, stationary.free_size, moving.free_size
    if M > GEMM_STATIONARY_FMAX:
        raise NKIError(f"{where()}: nc_matmul stationary free size {M} exceeds gemm_stationary_fmax "
                       f"{GEMM_STATIONARY_FMAX}; tile the M dimension")
    if N > GEMM_MOVING_FMAX:
        raise NKIError(f"{where()}: nc_matmul moving free size {N} exceeds gemm_moving_fmax {GEMM_MOVING_FMAX}; "
                       f"tile the N dimension")
    if moving.partitions != K:
        raise NKIError(f"{where()}: nc_matmul contraction mismatch: stationary has {K} partitions, moving "
                       f"{moving.partitions}")
    if dst.partitions != M or dst.free_size != N:
        raise NKIError(f"{where()}: nc_matmul dst {dst.shape} must be [{M}, {N}] (stationary free x moving free)")
    for v in (stationary, moving):
        if v.dtype in ("int32", "int16", "int8", "uint8", "bool"):
            raise NKIError(f"{where()}: nc_matmul takes floating tiles, not {v.dtype}")
    # the allocator places PSUM tiles on bank boundaries (addr -1: not placed yet); address= places them anywhere
    first, last = (max(dst.buf.addr, 0) + f * DTYPE_BYTES[dst.buf.dtype] for f in dst.region()[2:])
    if first // PSUM_BANK_BYTES != last // PSUM_BANK_BYTES:
        raise NKIError(f"{where()}: nc_matmul dst {dst.shape} crosses a 2 KiB PSUM bank boundary; one matmul writes "
                       f"one bank ({GEMM_MOVING_FMAX} fp32)")
    if accumulate is None:
        r = dst.region()
        start = not any(_overlap(r, w) for w in dst.buf.written)
    else:
        start = not accumulate
    mm_dt = "bfloat16" if stationary.dtype in FLOATS and stationary.dtype != "float32" else stationary.dtype
    t.emit("LDWEIGHTS", [], [stationary], {}, dur=ldweights_ns(t.p, M, mm_dt), small=False)
    return t.emit("MATMUL", [dst], [stationary, moving], {"start": start, "stop": True},
                  dur=matmul_ns(t.p, N, M, mm_dt), flops=2 * K * M * N, itype="REGULAR", small=False)


def identity(dtype: str) -> ndarray:
    """The [128, 128] identity tile of this trace (one AFFINE_SELECT on GpSimd, built once)."""
    t = current()
    key = "_identity_" + dtype
    if not hasattr(t, key):
        ident = t.alloc("sbuf", (PMAX, PMAX), dtype, name="identity")
        t.emit("AFFINE_SELECT", [ident], [], {"base": 0, "channel_multiplier": 1, "step": -1, "cmp": "equal",
                                               "on_true": 1.0, "on_false": 0.0}, dur=gpsimd_ns(t.p, PMAX))
        setattr(t, key, ident)
    return getattr(t, key)


def nc_transpose(dst: ndarray, data: ndarray, engine: str = "tensor") -> int:
    """``dst = data.T`` on the Tensor Engine (a matmul of ``data`` against the identity, into PSUM) or,
    ``engine="vector"``, on the Vector Engine (a tile of at most 32 x 32, SBUF or PSUM)."""
    t = current()
    on_chip(data, "nc_transpose data")
    if engine == "vector":
        on_chip(dst, "nc_transpose dst")
        if data.partitions > 32 or data.free_size > 32:
            raise NKIError(f"{where()}: nc_transpose on the Vector Engine takes at most 32 x 32, got {data.shape}; "
                           f"use the Tensor Engine (engine=nisa.tensor_engine)")
        if dst.partitions != data.free_size or dst.free_size != data.partitions:
            raise NKIError(f"{where()}: nc_transpose dst {dst.shape} must be [{data.free_size}, {data.partitions}]")
        return t.emit("TRANSPOSE", [dst], [data], {},
                      dur=vector_ns(t.p, "TENSOR_COPY", data.free_size, 1, data.dtype))
    P, F = data.partitions, data.free_size
    if F > PMAX:
        raise NKIError(f"{where()}: nc_transpose free size {F} exceeds {PMAX} (the result's partitions)")
    if dst.buf.mem != "psum":
        raise NKIError(f"{where()}: nc_transpose on the Tensor Engine writes PSUM; dst is in {dst.buffer}")
    if dst.partitions != F or dst.free_size != P:
        raise NKIError(f"{where()}: nc_transpose dst {dst.shape} must be [{F}, {P}]")
    ident = identity(data.dtype if data.dtype != "float32" else "float32")[0:P, 0:P]
    t.emit("LDWEIGHTS", [], [data], {"row": 0}, dur=ldweights_ns(t.p, F, data.dtype), itype="TRANSPOSE",
           small=False)
    return t.emit("MATMUL", [dst], [data, ident], {"start": True, "stop": True, "transpose": True},
                  dur=matmul_ns(t.p, P, F, data.dtype), flops=2 * P * P * F, itype="TRANSPOSE", small=False)


def iota(dst: ndarray, expr, offset: int = 0, channel_multiplier: int = 0) -> int:
    """IOTA on GpSimd: ``dst[p, f] = offset + p * channel_multiplier + f * step``."""
    t = current()
    on_chip(dst, "iota dst")
    if isinstance(expr, Idx):
        e = expr._pad(2)
        if len(e.shape) != 2:
            raise NKIError(f"{where()}: iota takes a 2-D [partition, free] index expression")
        base, cm, step = e.base + offset, e.coefs[0], e.coefs[1]
    else:
        base, cm, step = int(offset), int(channel_multiplier), int(expr[0][0]) if expr else 0
    return t.emit("IOTA", [dst], [], {"base": base, "channel_multiplier": cm, "step": step},
                  dur=gpsimd_ns(t.p, dst.free_size))


def copy_predicated(dst: ndarray, src: ndarray, predicate: ndarray, reverse: bool = False) -> int:
    """COPY_PREDICATED: ``dst = src`` where ``predicate`` is non-zero (``reverse``: zero), ``dst`` kept elsewhere
    (Vector)."""
    t = current()
    on_chip(dst, "copy_predicated dst"), on_chip(src, "copy_predicated data"), on_chip(predicate, "predicate")
    _same_partitions(dst, [src, predicate], "copy_predicated")
    srcs = [_fit(src, dst), _fit(predicate, dst), dst]
    return t.emit("COPY_PREDICATED", [dst], srcs, {"reverse": True} if reverse else {},
                  dur=vector_ns(t.p, "COPY_PREDICATED", dst.free_size, 2, dst.dtype))


def reciprocal(dst: ndarray, data: ndarray) -> int:
    """RECIPROCAL on the Vector Engine: ``dst = 1 / data``."""
    t = current()
    on_chip(dst, "reciprocal dst"), on_chip(data, "reciprocal data")
    _same_partitions(dst, [data], "reciprocal")
    return t.emit("RECIPROCAL", [dst], [_fit(data, dst)], {},
                  dur=vector_ns(t.p, "RECIPROCAL", dst.free_size, 1, dst.dtype))


BN_STATS_FMAX, BN_STATS_DIM, BN_AGGR_DIM = 512, 6, 2


def bn_stats(dst: ndarray, data: ndarray, mask=None) -> int | None:
    """BN_STATS: per partition (count, mean, variance*count) of the even and of the odd elements of
    ``data`` (free size <= 512, limited to ``mask``'s box) into ``dst`` [P, 6]."""
    t = current()
    on_chip(dst, "bn_stats dst"), on_chip(data, "bn_stats data")
    if mask is not None:
        box = box_of(mask, data.shape)
        if box is None:
            return None
        data = restrict(data, box, data.shape)
    if data.free_size > BN_STATS_FMAX:
        raise NKIError(f"{where()}: bn_stats data has {data.free_size} elements per partition; the limit is "
                       f"{BN_STATS_FMAX} (nl.tile_size.bn_stats_fmax): one bn_stats per 512-element slice, then "
                       f"bn_aggr")
    if dst.free_size != BN_STATS_DIM or dst.partitions != data.partitions:
        raise NKIError(f"{where()}: bn_stats dst {dst.shape} must be [{data.partitions}, {BN_STATS_DIM}]")
    return t.emit("BN_STATS", [dst], [data], {}, dur=vector_ns(t.p, "BN_STATS", data.free_size, 1, data.dtype))


def bn_aggr(dst: ndarray, data: ndarray) -> int:
    """BN_AGGR: the bn_stats records in ``data`` (a multiple of 3 per partition) -> ``dst`` [P, 2] (mean, var)."""
    t = current()
    on_chip(dst, "bn_aggr dst"), on_chip(data, "bn_aggr data")
    if data.free_size % 3:
        raise NKIError(f"{where()}: bn_aggr data {data.shape} must hold (count, mean, var*count) triples: a "
                       f"multiple of 3 elements per partition")
    if dst.free_size != BN_AGGR_DIM or dst.partitions != data.partitions:
        raise NKIError(f"{where()}: bn_aggr dst {dst.shape} must be [{data.partitions}, {BN_AGGR_DIM}]")
    return t.emit("BN_AGGR", [dst], [data], {}, dur=vector_ns(t.p, "BN_AGGR", data.free_size, 1, data.dtype))


def max8(dst: ndarray, data: ndarray) -> int:
    """MAX8 on the Vector Engine: the 8 largest values of each partition of ``data``, descending, into [P, 8]."""
    t = current()
    on_chip(dst, "max8 dst"), on_chip(data, "max8 data")
    if dst.free_size != 8 or dst.partitions != data.partitions or data.free_size < 8:
        raise NKIError(f"{where()}: max8 takes data with >= 8 elements per partition and a dst "
                       f"[{data.partitions}, 8], got {data.shape} -> {dst.shape}")
    return t.emit("MAX8", [dst], [data], {}, dur=vector_ns(t.p, "MAX8", data.free_size, 1, data.dtype))


def find_index8(dst: ndarray, data: ndarray, vals: ndarray) -> int:
    """FIND_INDEX8 on the Vector Engine: per partition, the first index in ``data`` of each of ``vals``' 8 values."""
    t = current()
    on_chip(dst, "nc_find_index8 dst"), on_chip(data, "nc_find_index8 data"), on_chip(vals, "nc_find_index8 vals")
    if dst.free_size != 8 or vals.free_size != 8 or len({dst.partitions, data.partitions, vals.partitions}) != 1:
        raise NKIError(f"{where()}: nc_find_index8 takes vals and dst of [{data.partitions}, 8], got {vals.shape} "
                       f"and {dst.shape}")
    return t.emit("FIND_INDEX8", [dst], [data, vals], {},
                  dur=vector_ns(t.p, "FIND_INDEX8", data.free_size, 1, data.dtype))


def dma_transpose(dst: ndarray, src: ndarray) -> int:
    """A DMA that writes the 2-D ``src`` transposed into ``dst`` (one element per descriptor, slow)."""
    t = current()
    if src.ndim != 2 or dst.ndim != 2 or tuple(dst.shape) != tuple(src.shape[::-1]):
        raise NKIError(f"{where()}: dma_transpose takes a 2-D src and a dst of the reversed shape, got {src.shape} "
                       f"-> {dst.shape}")
    if "psum" in (src.buf.mem, dst.buf.mem):
        raise NKIError(f"{where()}: DMA does not read or write PSUM; copy the tile to SBUF first (nisa.tensor_copy)")
    view = ndarray(src.buf, src.shape[::-1], src.offset, src.strides[::-1], src.dtype)    # element order: src.T
    return t.dma(dst, view)


#: ``expr cmp 0`` for integer expressions, as the GpSimd's three comparisons: (comparison, shift of the base)
_AFFINE_CMP = {"greater_equal": ("greater_equal", 0), "greater": ("greater_equal", -1), "less": ("less", 0),
               "less_equal": ("less", -1), "equal": ("equal", 0)}


def affine_select(dst: ndarray, pred, on_true: ndarray, on_false: float) -> int:
    """AFFINE_SELECT on GpSimd: ``dst = pred ? on_true : on_false`` where ``pred`` is one comparison of
    ``nl.arange`` expressions over the tile's (partition, free) positions."""
    t = current()
    aff = getattr(pred, "affine", None)
    if aff is None:
        raise NKIError(f"{where()}: affine_select needs a predicate that is one comparison of nl.arange "
                       f"expressions (e.g. i_p >= i_f); combine masks with nl.where instead")
    on_chip(dst, "affine_select dst"), on_chip(on_true, "on_true_tile")
    expr, name = aff
    e = expr._pad(2)
    if len(e.shape) != 2:
        raise NKIError(f"{where()}: affine_select takes a 2-D [partition, free] predicate")
    cmp, shift = _AFFINE_CMP[name]
    attrs = {"base": e.base + shift, "channel_multiplier": e.coefs[0], "step": e.coefs[1], "cmp": cmp,
             "on_true": 1.0, "on_false": float(on_false)}
    return t.emit("AFFINE_SELECT", [dst], [_fit(on_true, dst)], attrs, dur=gpsimd_ns(t.p, dst.free_size))


def memset(dst: ndarray, value, engine: str = "vector") -> int:
    """MEMSET: ``dst = value``."""
    t = current()
    on_chip(dst, "memset dst")
    return t.emit("MEMSET", [dst], [], {"value": float(value)},
                  dur=vector_ns(t.p, "MEMSET", dst.free_size, 1, dst.dtype))


def dma_copy(dst: ndarray, src: ndarray, mask=None, rmw_op=None) -> int | None:
    """DMA_DIRECT2D: copy ``src`` into ``dst`` (HBM <-> SBUF, SBUF <-> SBUF, HBM <-> HBM); with ``rmw_op``
    the DMA engine writes ``rmw_op(dst, src)`` instead (``dma_copy(dst_rmw_op=)``, ``nl.atomic_rmw``), ordered
    after earlier writes of dst (write-after-write)."""
    t = current()
    for v, what in ((dst, "dst"), (src, "src")):
        if not isinstance(v, ndarray):
            raise NKIError(f"{where()}: dma_copy {what} must be an NKI tensor, got {type(v).__name__}")
    if src.buf.mem == "psum" or dst.buf.mem == "psum":
        raise NKIError(f"{where()}: DMA does not read or write PSUM; copy the tile to SBUF first (nisa.tensor_copy)")
    if getattr(src, "_gather", None) is not None and rmw_op is None:
        return _dma_gather(dst, src, mask)
    dyn = dma_dynamic(dst, src)
    r = masked(dst, [src], mask)
    if r is None:
        return None
    dst, (src,) = r
    attrs, srcs, dsts = dyn or ({}, [], [])
    rmw = {"rmw": _arith(rmw_op, "a DMA read-modify-write")} if rmw_op is not None else {}
    return t.dma(dst, src, {**attrs, **rmw}, srcs, dsts)


def _dma_gather(dst: ndarray, src: ndarray, mask) -> int | None:
    """GATHER (the DMA descriptors, one per row, generated on GpSimd) + DMA_INDIRECT: partition p of ``dst`` gets
    row ``idx[p]`` of the table, as the compiler lowers an embedding lookup (compiler/lower/data.py)."""
    from neuron_stack.device.cost import dma_ns
    t = current()
    idx, table = src._gather
    box = box_of(mask, dst.shape) if mask is not None else None
    if mask is not None and box is None:
        return None
    if box is not None:
        current().masked_box = (dst.operand(), box)
        dst, src, idx = (restrict(v, box, dst.shape) for v in (dst, src, idx))
        row0 = box[len(box) - len(src.shape)][0]
        table = ndarray(table.buf, (table.shape[0], *src.shape[1:]), src.offset - row0 * table.strides[0],
                        (table.strides[0], *src.strides[1:]), table.dtype)
    if idx.partitions != dst.partitions or math.prod(src.shape) != math.prod(dst.shape):
        raise NKIError(f"{where()}: an indirect DMA of {src.shape} rows into {dst.shape} with {idx.partitions} row "
                       f"numbers: the partitions must match")
    P = dst.partitions
    nbytes = math.prod(dst.shape) * max(DTYPE_BYTES[src.dtype], DTYPE_BYTES[dst.dtype])
    t.emit("GATHER", [], [idx], {"note": "descriptor generation"}, dur=gpsimd_ns(t.p, P))
    return t.emit("DMA_INDIRECT", [dst], [table, idx], {"desc": P}, dur=dma_ns(t.p, nbytes, P) - t.p.dma_fixed_ns,
                  latency=t.p.dma_fixed_ns)


def new_tile(shape, dtype, buffer: str = "sbuf") -> ndarray:
    return current().alloc(buffer, shape, dtype_name(dtype))


_BITVEC = ("bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "logical_xor")


def _arith(op, what: str) -> str:
    alu = resolve_alu(op)
    if alu in _BITVEC:
        raise NKIError(f"{where()}: {what} takes arithmetic operators (nl.add, nl.multiply, ...), not the bitvec "
                       f"operator {alu}")
    return alu
