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
    local_gather_ns,
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
from .indexing import Idx, box_of, restrict

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


def masked(dst: ndarray, srcs: list, mask) -> tuple | None:
    """(dst, srcs) limited to ``mask``'s box; None when the mask selects nothing."""
    if mask is None:
        return dst, srcs
    box = box_of(mask, dst.shape)
    if box is None:
        return None
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
    if axes != list(range(1, data.ndim)):
        raise NKIError(f"{where()}: tensor_reduce axis={axis}: reduce all free axes (1..{data.ndim - 1}) at once")
    if dst.free_size != 1 or dst.partitions != data.partitions:
        raise NKIError(f"{where()}: tensor_reduce dst {dst.shape} must be [{data.partitions}, 1]")
    red = resolve_reduce(op)
    r = masked(data, [dst], mask)
    if r is None:
        return None
    data, (dst,) = r
    d = vector_ns(t.p, "REDUCE", data.free_size, 1, data.dtype, alu=red)
    i = t.emit("REDUCE", [dst], [data], {"op": red}, dur=d)
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
    return t.emit("MATMUL", [dst], [data, ident], {"start": True, "stop": True},
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
    r = masked(dst, [src], mask)
    if r is None:
        return None
    dst, (src,) = r
    if rmw_op is None:
        return t.dma(dst, src)
    return t.dma(dst, src, {"rmw": _arith(rmw_op, "a DMA read-modify-write")})


def new_tile(shape, dtype, buffer: str = "sbuf") -> ndarray:
    return current().alloc(buffer, shape, dtype_name(dtype))


# -- the rest of the ISA: scans, selects, random numbers, GpSimd gathers and partition reductions ------------
_BITVEC = ("bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "logical_xor")
_INTS = ("int32", "int16", "int8", "uint32", "uint16", "uint8", "bool")
_CMP = ("equal", "less", "less_equal", "greater", "greater_equal")


def _arith(op, what: str) -> str:
    alu = resolve_alu(op)
    if alu in _BITVEC:
        raise NKIError(f"{where()}: {what} takes arithmetic operators (nl.add, nl.multiply, ...), not the bitvec "
                       f"operator {alu}")
    return alu


def _not_both_psum(a: ndarray, b: ndarray, name: str) -> None:
    if a.buf.mem == b.buf.mem == "psum":
        raise NKIError(f"{where()}: {name} inputs cannot both reside in PSUM; copy one to SBUF (nisa.tensor_copy)")


def _same_size(dst: ndarray, srcs: list, name: str) -> None:
    for s in srcs:
        if s.partitions != dst.partitions or s.free_size != dst.free_size:
            raise NKIError(f"{where()}: {name} operand {s.shape} must have the partitions and elements per partition "
                           f"of {dst.shape}")


def _reduce_res(reduce_res, dst: ndarray, attrs: dict, dsts: list) -> None:
    if reduce_res is not None:
        on_chip(reduce_res, "reduce_res")
        if reduce_res.free_size != 1 or reduce_res.partitions != dst.partitions:
            raise NKIError(f"{where()}: reduce_res {reduce_res.shape} must be a [{dst.partitions}, 1] column")
        dsts.append(reduce_res)
        if attrs["reduce_cmd"] == "idle":       # asking for the result means reducing this instruction's output
            attrs["reduce_cmd"] = "reset_reduce"


def tensor_tensor_scan(dst: ndarray, data0: ndarray, data1: ndarray, initial, op0, op1, reverse0=False,
                       reverse1=False, mask=None) -> int | None:
    """TENSOR_TENSOR_SCAN on the Vector Engine: ``dst[:, i] = op1(op0(data0[:, i], dst[:, i-1]), data1[:, i])``,
    ``initial`` standing in for ``dst[:, -1]`` (a number or a [P, 1] column); ``max(MIN_II, 2N)`` cycles."""
    t = current()
    for v, what in ((dst, "dst"), (data0, "data0"), (data1, "data1")):
        on_chip(v, f"tensor_tensor_scan {what}")
    _not_both_psum(data0, data1, "tensor_tensor_scan")
    _same_size(dst, [data0, data1], "tensor_tensor_scan")
    r = masked(dst, [data0, data1, initial], mask)
    if r is None:
        return None
    dst, (data0, data1, initial) = r
    srcs = [data0, data1]
    attrs = {"op0": _rev(_arith(op0, "tensor_tensor_scan"), reverse0),
             "op1": _rev(_arith(op1, "tensor_tensor_scan"), reverse1),
             "initial": _scalar_arg(initial, srcs, dst, "initial")}
    return t.emit("TENSOR_TENSOR_SCAN", [dst], srcs, attrs,
                  dur=vector_ns(t.p, "TENSOR_TENSOR_SCAN", dst.free_size, 2, dst.dtype))


def scalar_tensor_tensor(dst: ndarray, data: ndarray, op0, operand0, op1, operand1: ndarray, reverse0=False,
                         reverse1=False, mask=None) -> int | None:
    """SCALAR_TENSOR_TENSOR on the Vector Engine: ``dst = op1(op0(data, operand0), operand1)``; ``operand0`` a
    number or a [P, 1] column, ``operand1`` a tile of ``data``'s size. ``N`` cycles for bf16 subtract-then-multiply
    of an even N, else ``2N`` (legacy docstring)."""
    t = current()
    for v, what in ((dst, "dst"), (data, "data"), (operand1, "operand1")):
        on_chip(v, f"scalar_tensor_tensor {what}")
    _not_both_psum(data, operand1, "scalar_tensor_tensor data and operand1")
    _same_size(dst, [data, operand1], "scalar_tensor_tensor")
    r = masked(dst, [data, operand0, operand1], mask)
    if r is None:
        return None
    dst, (data, operand0, operand1) = r
    a0, a1 = _arith(op0, "scalar_tensor_tensor"), _arith(op1, "scalar_tensor_tensor")
    srcs = [data, operand1]
    attrs = {"op0": _rev(a0, reverse0), "scalar0": _scalar_arg(operand0, srcs, dst, "operand0"),
             "op1": _rev(a1, reverse1)}
    fast = (data.dtype == operand1.dtype == "bfloat16" and (a0, a1) == ("subtract", "multiply")
            and dst.free_size % 2 == 0)
    return t.emit("SCALAR_TENSOR_TENSOR", [dst], srcs, attrs,
                  dur=vector_ns(t.p, "SCALAR_TENSOR_TENSOR", dst.free_size, 2, dst.dtype, fast))


def _reduce_cmd(cmd) -> str:
    name = getattr(cmd, "name", cmd) or "idle"
    if name not in ("idle", "reset", "reduce", "reset_reduce", "load_reduce"):
        raise NKIError(f"{where()}: reduce_cmd {cmd!r} is not one of nisa.reduce_cmd.idle/reset/reduce/reset_reduce")
    if name == "load_reduce":
        raise NKIError(f"{where()}: reduce_cmd.load_reduce is not simulated for selects; use reset_reduce or reduce")
    return name


def _max_only(reduce_op, name: str) -> None:
    if reduce_op is not None and resolve_reduce(reduce_op) != "max":
        raise NKIError(f"{where()}: {name} reduces with nl.maximum only, got {_name(reduce_op)}")


def select_reduce(dst: ndarray, predicate: ndarray, on_true: ndarray, on_false, reduce_res=None, reduce_cmd="idle",
                  reduce_op=None, reverse_pred=False) -> int:
    """SELECT_REDUCE on the Vector Engine: ``dst = where(predicate, on_true, on_false)`` (``reverse_pred`` flips
    the predicate), the running max of the result kept in the accumulators per ``reduce_cmd`` and read into
    ``reduce_res``. Two tiles read: ``max(MIN_II, 2N)`` cycles (+MIN_II for the read-out)."""
    t = current()
    for v, what in ((dst, "dst"), (predicate, "predicate"), (on_true, "on_true")):
        on_chip(v, f"select_reduce {what}")
    _not_both_psum(on_true, predicate, "select_reduce on_true and predicate")
    _same_size(dst, [predicate, on_true], "select_reduce")
    if predicate.dtype not in ("int8", "uint8", "int16", "uint16"):
        raise NKIError(f"{where()}: select_reduce predicate is {predicate.dtype}; it must be int8, uint8, int16 or "
                       f"uint16 (compute it with dtype=nl.uint8)")
    if on_true.dtype in ("tfloat32", "int32", "uint32"):
        raise NKIError(f"{where()}: select_reduce on_true cannot be {on_true.dtype}")
    _max_only(reduce_op, "select_reduce")
    srcs = [predicate, on_true]
    attrs = {"on_false": _scalar_arg(on_false, srcs, dst, "on_false"), "reduce_cmd": _reduce_cmd(reduce_cmd),
             "reverse_pred": bool(reverse_pred)}
    dsts = [dst]
    _reduce_res(reduce_res, dst, attrs, dsts)
    return t.emit("SELECT_REDUCE", dsts, srcs, attrs,
                  dur=vector_ns(t.p, "SELECT_REDUCE", dst.free_size, 2, dst.dtype, accumulate=len(dsts) > 1))


FP32_MIN = -3.4028234663852886e38


def range_select(dst: ndarray, on_true: ndarray, comp_op0, comp_op1, bound0: ndarray, bound1: ndarray,
                 reduce_cmd="reset_reduce", reduce_res=None, reduce_op=None, range_start=0,
                 on_false_value=FP32_MIN) -> int:
    """RANGE_SELECT on the Vector Engine (NeuronCore-v3+): keep ``on_true[p, i]`` where ``comp_op0(range_start + i,
    bound0[p])`` and ``comp_op1(range_start + i, bound1[p])``, else ``on_false_value`` (FP32_MIN); the running max
    goes to the accumulators and ``reduce_res``. ``max(MIN_II, N)`` cycles (+MIN_II for the read-out)."""
    t = current()
    if t.p.name not in ("trn2",):
        raise NKIError(f"{where()}: nisa.range_select needs NeuronCore-v3 (trn2) but the target is {t.p.name}: set "
                       f"NEURON_PLATFORM_TARGET_OVERRIDE=trn2 or @nki.jit(platform_target='trn2')")
    for v, what in ((dst, "dst"), (on_true, "on_true_tile"), (bound0, "bound0"), (bound1, "bound1")):
        on_chip(v, f"range_select {what}")
    _same_size(dst, [on_true], "range_select")
    if on_true.dtype not in FLOATS:
        raise NKIError(f"{where()}: range_select on_true_tile must be a float tile, got {on_true.dtype}")
    for b, what in ((bound0, "bound0"), (bound1, "bound1")):
        if b.dtype != "float32":
            raise NKIError(f"{where()}: range_select {what} must be float32, got {b.dtype}")
    cmps = [_name(c) for c in (comp_op0, comp_op1)]
    for c in cmps:
        if c not in _CMP:
            raise NKIError(f"{where()}: range_select comparison {c!r} is not one of nl.equal, nl.less, nl.less_equal, "
                           f"nl.greater, nl.greater_equal")
    if float(on_false_value) != FP32_MIN:
        raise NKIError(f"{where()}: range_select on_false_value must be nl.fp32.min (-3.4028235e+38), a hardware "
                       f"constraint; got {on_false_value}")
    if not isinstance(range_start, int):
        raise NKIError(f"{where()}: range_select range_start must be a compile-time integer")
    _max_only(reduce_op, "range_select")
    srcs = [on_true]
    attrs = {"cmp0": cmps[0], "cmp1": cmps[1], "bound0": _scalar_arg(bound0, srcs, dst, "bound0"),
             "bound1": _scalar_arg(bound1, srcs, dst, "bound1"), "range_start": range_start,
             "on_false": FP32_MIN, "reduce_cmd": _reduce_cmd(reduce_cmd)}
    dsts = [dst]
    _reduce_res(reduce_res, dst, attrs, dsts)
    return t.emit("RANGE_SELECT", dsts, srcs, attrs,
                  dur=vector_ns(t.p, "RANGE_SELECT", dst.free_size, 1, dst.dtype, accumulate=len(dsts) > 1))


def rng_seed(seed) -> int:
    """RNG_SEED: seed the Vector Engine's PRNG with a 32-bit number or the value of a [1, 1] tile; the same seed
    gives the same sequence of dropout masks."""
    t = current()
    if isinstance(seed, ndarray):
        on_chip(seed, "seed")
        if seed.partitions != 1 or seed.free_size != 1:
            raise NKIError(f"{where()}: the seed must be a [1, 1] tile, got {seed.shape}")
        return t.emit("RNG_SEED", [], [seed], {"seed": None}, dur=vector_ns(t.p, "RNG_SEED", 1))
    if not isinstance(seed, int):
        raise NKIError(f"{where()}: the seed must be an integer or a [1, 1] tile, got {type(seed).__name__}")
    return t.emit("RNG_SEED", [], [], {"seed": int(seed) & 0xFFFFFFFF}, dur=vector_ns(t.p, "RNG_SEED", 1))


def dropout(dst: ndarray, data: ndarray, prob, mask=None) -> int | None:
    """DROPOUT on the Vector Engine: each element of ``data`` is replaced by 0 with probability ``prob`` (a number or
    a [P, 1] column), drawn from the engine's PRNG (``nl.random_seed``); kept elements are unchanged (the docs
    specify no rescaling). ``max(MIN_II, N)`` cycles."""
    t = current()
    on_chip(dst, "dropout dst"), on_chip(data, "dropout data")
    _same_size(dst, [data], "dropout")
    if data.dtype in _INTS and dst.dtype != data.dtype:
        raise NKIError(f"{where()}: dropout of an integer tile keeps its dtype ({data.dtype}), dst is {dst.dtype}")
    if isinstance(prob, ndarray):
        if data.dtype in _INTS and prob.dtype != "float32":
            raise NKIError(f"{where()}: dropout of an integer tile needs a float32 prob, got {prob.dtype}")
    elif not 0.0 <= float(prob) <= 1.0:
        raise NKIError(f"{where()}: dropout probability {prob} is outside [0, 1]")
    r = masked(dst, [data, prob], mask)
    if r is None:
        return None
    dst, (data, prob) = r
    srcs = [data]
    attrs = {"prob": _scalar_arg(prob, srcs, dst, "prob")}
    return t.emit("DROPOUT", [dst], srcs, attrs, dur=vector_ns(t.p, "DROPOUT", dst.free_size, 1, dst.dtype))


def _gpsimd_sbuf(v: ndarray, what: str) -> None:
    on_chip(v, what)
    if v.buf.mem != "sbuf":
        raise NKIError(f"{where()}: {what} is in PSUM; the GpSimd Engine reads and writes SBUF only (copy it first)")


def partition_reduce(dst: ndarray, op, data: ndarray) -> int:
    """PARTITION_REDUCE on GpSimd: ``dst[0, ...] = op`` over the partitions of ``data`` (add, max, bitwise_or,
    bitwise_and). The docs give no cycle formula; GpSimd's ``150 + N`` (N = elements per partition) is used."""
    t = current()
    _gpsimd_sbuf(dst, "tensor_partition_reduce dst"), _gpsimd_sbuf(data, "tensor_partition_reduce data")
    name = {"add": "add", "sum": "add", "maximum": "max", "max": "max", "amax": "max",
            "bitwise_or": "bitwise_or", "bitwise_and": "bitwise_and"}.get(_name(op))
    if name is None:
        raise NKIError(f"{where()}: tensor_partition_reduce op must be nl.add, nl.maximum, nl.bitwise_or or "
                       f"nl.bitwise_and, got {_name(op)}")
    if name.startswith("bitwise") and data.dtype not in _INTS:
        raise NKIError(f"{where()}: tensor_partition_reduce {name} needs an integer tile, got {data.dtype}")
    if dst.partitions != 1 or dst.free_size != data.free_size:
        raise NKIError(f"{where()}: tensor_partition_reduce dst {dst.shape} must have 1 partition and "
                       f"{data.free_size} elements")
    return t.emit("PARTITION_REDUCE", [dst], [data], {"op": name}, dur=gpsimd_ns(t.p, data.free_size))


def local_gather(dst: ndarray, src: ndarray, index: ndarray, num_elem_per_idx: int = 1,
                 num_valid_indices: int | None = None) -> int:
    """LOCAL_GATHER on GpSimd: each of the 8 cores gathers, for its 16 partitions, ``num_elem_per_idx`` contiguous
    elements at each of its indices (its ``index`` slice flattened partition-first); cost from the legacy docstring
    (:func:`neuron_stack.device.cost.local_gather_ns`)."""
    t = current()
    for v, what in ((dst, "dst"), (src, "src_buffer"), (index, "index")):
        _gpsimd_sbuf(v, f"local_gather {what}")
    P = src.partitions
    if index.partitions != P or P % 16:
        raise NKIError(f"{where()}: local_gather src_buffer and index need the same partitions, a multiple of 16; got "
                       f"{P} and {index.partitions}")
    if index.dtype != "uint16":
        raise NKIError(f"{where()}: local_gather indices must be uint16, got {index.dtype}")
    k = int(num_elem_per_idx)
    if k not in (1, 2, 4, 8, 16, 32):
        raise NKIError(f"{where()}: local_gather num_elem_per_idx must be one of 1, 2, 4, 8, 16, 32; got {k}")
    per_core = index.free_size * 16
    nv = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < nv <= min(per_core, 4096):
        raise NKIError(f"{where()}: local_gather num_valid_indices {nv} must be in 1..{min(per_core, 4096)} (the "
                       f"indices of one 16-partition slice, at most 4096)")
    if dst.dtype != src.dtype:
        raise NKIError(f"{where()}: local_gather keeps the dtype: dst is {dst.dtype}, src_buffer {src.dtype}")
    if dst.partitions != P or dst.free_size != nv * k:
        raise NKIError(f"{where()}: local_gather dst {dst.shape} must be [{P}, {nv} x {k}] elements")
    return t.emit("LOCAL_GATHER", [dst], [src, index], {"num_elem_per_idx": k, "num_valid_indices": nv},
                  dur=local_gather_ns(t.p, nv, k, DTYPE_BYTES[src.dtype]))


def rand(dst: ndarray, bits: int = 0) -> int:
    """RAND on the Vector Engine: ``dst`` filled from the engine PRNG, uniform in [0, 1) (``nl.rand``) or, with
    ``bits``, the low ``bits`` of 32 random bits (``nisa.rng``). The docs give no cost; one-input ``max(MIN_II, N)``."""
    t = current()
    on_chip(dst, "rand dst")
    signed = dst.dtype in ("int8", "int16", "int32")
    return t.emit("RAND", [dst], [], {"bits": bits, "signed": signed},
                  dur=vector_ns(t.p, "RAND", dst.free_size, 1, dst.dtype))


def match_replace8(dst: ndarray, data: ndarray, vals: ndarray, imm: float, dst_idx: ndarray | None = None) -> int:
    """MATCH_REPLACE8 on the Vector Engine: the first occurrence of each of ``vals``' 8 values per partition of
    ``data`` becomes ``imm`` in ``dst``; ``dst_idx`` (optional, [P, 8]) gets their indices. ``max(MIN_II, N)``."""
    t = current()
    for v, what in ((dst, "dst"), (data, "data"), (vals, "vals")):
        on_chip(v, f"nc_match_replace8 {what}")
    _same_size(dst, [data], "nc_match_replace8")
    if vals.free_size != 8 or vals.partitions != data.partitions:
        raise NKIError(f"{where()}: nc_match_replace8 vals {vals.shape} must hold 8 values per partition "
                       f"([{data.partitions}, 8])")
    if not 8 <= data.free_size <= 16384:
        raise NKIError(f"{where()}: nc_match_replace8 data has {data.free_size} elements per partition; 8..16384")
    dsts = [dst]
    if dst_idx is not None:
        on_chip(dst_idx, "nc_match_replace8 dst_idx")
        if dst_idx.free_size != 8 or dst_idx.dtype not in ("uint16", "uint32"):
            raise NKIError(f"{where()}: nc_match_replace8 dst_idx must be [P, 8] uint16 or uint32, got "
                           f"{dst_idx.shape} {dst_idx.dtype}")
        dsts.append(dst_idx)
    return t.emit("MATCH_REPLACE8", dsts, [data, vals], {"imm": float(imm)},
                  dur=vector_ns(t.p, "MATCH_REPLACE8", data.free_size, 1, data.dtype))


def stream_shuffle(dst: ndarray, src: ndarray, mask) -> int:
    """SHUFFLE on the Vector Engine: within every 32-partition quadrant, partition ``i`` of ``dst`` gets partition
    ``mask[i]`` of ``src`` (255 leaves it); in place allowed. ``max(MIN_II, N)`` cycles (one input)."""
    t = current()
    on_chip(dst, "nc_stream_shuffle dst"), on_chip(src, "nc_stream_shuffle src")
    mask = [int(m) for m in mask]
    if len(mask) != 32 or any(not (0 <= m < 32 or m == 255) for m in mask):
        raise NKIError(f"{where()}: nc_stream_shuffle shuffle_mask must be 32 partition numbers in 0..31 (or 255 to "
                       f"keep one), got {len(mask)} values")
    if dst.dtype != src.dtype or dst.free_size != src.free_size:
        raise NKIError(f"{where()}: nc_stream_shuffle dst and src need the same dtype and elements per partition")
    active = -(-max(dst.partitions, src.partitions) // 32) * 32
    allowed = {32: (0, 32, 64, 96), 64: (0, 64)}.get(active, (0,))
    for v, what in ((src, "src"), (dst, "dst")):
        start = v.region()[0]
        if start not in allowed:
            raise NKIError(f"{where()}: nc_stream_shuffle {what} starts at partition {start}; with {active} active "
                           f"partitions it must start at {' or '.join(map(str, allowed))}")
    return t.emit("SHUFFLE", [dst], [src, dst], {"mask": mask},
                  dur=vector_ns(t.p, "SHUFFLE", src.free_size, 1, src.dtype))


def tensor_scalar_cumulative(dst: ndarray, src: ndarray, op0, op1, imm0, imm1=None, reduce_cmd="reset_reduce") -> int:
    """TENSOR_SCALAR_CUMULATIVE on the Vector Engine: ``reg = op1(op0(src[:, i], imm0), reg)``, ``dst[:, i] = reg``,
    the register starting per ``reduce_cmd`` (op1's identity, ``imm1``, or where the last accumulation left it).
    The docs give no cost; one input ``max(MIN_II, N)``."""
    t = current()
    on_chip(dst, "tensor_scalar_cumulative dst"), on_chip(src, "tensor_scalar_cumulative src")
    _same_size(dst, [src], "tensor_scalar_cumulative")
    for v in (dst, src):
        if v.dtype in ("int32", "uint32"):
            raise NKIError(f"{where()}: tensor_scalar_cumulative does not take {v.dtype} tiles (an ISA limitation)")
    a1 = _arith(op1, "tensor_scalar_cumulative")
    if a1 not in ("add", "subtract", "multiply", "maximum", "minimum"):
        raise NKIError(f"{where()}: tensor_scalar_cumulative op1 must be add, subtract, multiply, maximum or minimum")
    cmd = getattr(reduce_cmd, "name", reduce_cmd)
    if cmd not in ("reset_reduce", "reduce", "load_reduce"):
        raise NKIError(f"{where()}: tensor_scalar_cumulative reduce_cmd must be reset_reduce, reduce or load_reduce")
    if cmd == "load_reduce" and imm1 is None:
        raise NKIError(f"{where()}: reduce_cmd=load_reduce needs imm1, the accumulator's starting value")
    srcs = [src]
    attrs = {"op0": _arith(op0, "tensor_scalar_cumulative"), "op1": a1, "reduce_cmd": cmd,
             "imm0": _scalar_arg(imm0, srcs, dst, "imm0"), "imm1": _scalar_arg(imm1, srcs, dst, "imm1")}
    return t.emit("TENSOR_SCALAR_CUMULATIVE", [dst], srcs, attrs,
                  dur=vector_ns(t.p, "TENSOR_SCALAR_CUMULATIVE", dst.free_size, 1, dst.dtype))


def n_gather(dst: ndarray, data: ndarray, indices: ndarray) -> int:
    """N_GATHER on GpSimd: ``dst[p, j] = data[p, indices[p, j]]`` over each partition's flattened free elements.
    It is ``ceil(N / 512)`` ISA instructions (the docstring): that many GpSimd starts plus N cycles."""
    t = current()
    for v, what in ((dst, "dst"), (data, "data"), (indices, "indices")):
        _gpsimd_sbuf(v, f"nc_n_gather {what}")
    if indices.dtype != "uint32":
        raise NKIError(f"{where()}: nc_n_gather indices must be uint32, got {indices.dtype}")
    if dst.dtype != data.dtype:
        raise NKIError(f"{where()}: nc_n_gather keeps the dtype: dst is {dst.dtype}, data {data.dtype}")
    if len({dst.partitions, data.partitions, indices.partitions}) != 1 or dst.free_size != indices.free_size:
        raise NKIError(f"{where()}: nc_n_gather dst {dst.shape} must have the partitions of data and the elements of "
                       f"indices {indices.shape}")
    n = dst.free_size
    groups = -(-n // 512)
    return t.emit("N_GATHER", [dst], [data, indices], {},
                  dur=(groups * t.p.gpsimd_start_cycles + n) / t.p.gpsimd_clock_ghz)


def sequence_bounds(dst: ndarray, segment_ids: ndarray) -> int:
    """SEQUENCE_BOUNDS on GpSimd: per element, the [start, end) of its segment (padding id 0: n and -1) into
    ``dst`` [1, 2, n]; ``150 + N`` cycles."""
    t = current()
    _gpsimd_sbuf(dst, "sequence_bounds dst"), _gpsimd_sbuf(segment_ids, "sequence_bounds segment_ids")
    if segment_ids.partitions != 1:
        raise NKIError(f"{where()}: sequence_bounds takes segment ids in one partition, got {segment_ids.shape}")
    for v in (dst, segment_ids):
        if v.dtype not in ("float32", "int32"):
            raise NKIError(f"{where()}: sequence_bounds tiles must be float32 or int32, got {v.dtype}")
    if dst.partitions != 1 or dst.free_size != 2 * segment_ids.free_size:
        raise NKIError(f"{where()}: sequence_bounds dst {dst.shape} must be [1, 2, {segment_ids.free_size}]")
    return t.emit("SEQUENCE_BOUNDS", [dst], [segment_ids], {}, dur=gpsimd_ns(t.p, segment_ids.free_size))


def nonzero_with_count(dst: ndarray, src: ndarray, index_offset: int = 0, padding_val: int = -1) -> int:
    """NONZERO_WITH_COUNT on GpSimd (NeuronCore-v3+): in partitions 0, 16, ..., 112 the indices of ``src``'s
    non-zero elements (+ ``index_offset``), ``padding_val`` after them, their count last; ``150 + N`` cycles."""
    t = current()
    if t.p.name != "trn2":
        raise NKIError(f"{where()}: nisa.nonzero_with_count needs NeuronCore-v3 (trn2) but the target is {t.p.name}")
    _gpsimd_sbuf(dst, "nonzero_with_count dst"), _gpsimd_sbuf(src, "nonzero_with_count src")
    if src.dtype not in ("float32", "int32") or dst.dtype != "int32":
        raise NKIError(f"{where()}: nonzero_with_count takes a float32/int32 src and an int32 dst")
    if dst.partitions != src.partitions or dst.free_size != src.free_size + 1:
        raise NKIError(f"{where()}: nonzero_with_count dst {dst.shape} needs one more element per partition than "
                       f"src {src.shape}")
    return t.emit("NONZERO_WITH_COUNT", [dst], [src, dst], {"index_offset": int(index_offset),
                                                            "padding_val": int(padding_val)},
                  dur=gpsimd_ns(t.p, src.free_size))


def tensor_copy_dynamic(dst: ndarray, src: ndarray, side: str) -> int:
    """TENSOR_COPY_DYNAMIC: ``dst = src`` where the ``side`` view (made by indexing with an SBUF value,
    ``t[ix, idx[0, j] + iy]``) moves by that value at run time; ``max(600, N)`` cycles (MIN_II_DYNAMIC, docstring).
    The whole tile it can reach counts as accessed, so the schedule waits as the hardware must."""
    t = current()
    name = f"tensor_copy_dynamic_{side}"
    on_chip(dst, f"{name} dst"), on_chip(src, f"{name} src")
    dyn_view = src if side == "src" else dst
    dyn = getattr(dyn_view, "_dyn", None)
    if dyn is None:
        raise NKIError(f"{where()}: {name} needs a {side} indexed by an SBUF value, e.g. t[ix, idx_tile[0, j] + iy]")
    idx, stride, limit, root = dyn
    if idx.buf.mem != "sbuf" or idx.dtype not in ("int32", "uint32", "int16", "uint16", "int8", "uint8"):
        raise NKIError(f"{where()}: {name} reads its offset from an integer SBUF tile, got {idx.dtype} in {idx.buffer}")
    if src.partitions != dst.partitions or src.free_size != dst.free_size:
        raise NKIError(f"{where()}: {name} src {src.shape} and dst {dst.shape} need the same partitions and elements")
    attrs = {"side": side, "stride": int(stride), "limit": int(limit)}
    dur = vector_ns(t.p, "TENSOR_COPY_DYNAMIC", src.free_size, 1, dst.dtype)
    if side == "src":
        return t.emit("TENSOR_COPY_DYNAMIC", [dst], [src, idx, root], attrs, dur=dur)
    return t.emit("TENSOR_COPY_DYNAMIC", [dst, root], [src, idx], attrs, dur=dur)


def dma_compute(dst: ndarray, srcs: list, reduce_op, scales=None) -> int:
    """DMA_COMPUTE: ``dst = srcs[0] + srcs[1] + ...`` computed by a DMA engine in fp32 (only ``nl.add`` and scales of
    1.0, as the docs allow), timed as one DMA moving every source and the destination."""
    from neuron_stack.device.cost import dma_ns
    t = current()
    srcs = list(srcs)
    if not 1 <= len(srcs) <= 16 or not all(isinstance(v, ndarray) for v in [dst, *srcs]):
        raise NKIError(f"{where()}: dma_compute takes 1 to 16 source tensors and a dst tensor")
    if resolve_alu(reduce_op) != "add" or any(float(s) != 1.0 for s in (scales or [])):
        raise NKIError(f"{where()}: dma_compute supports reduce_op=nl.add with scales of 1.0 only (the SDK's limit)")
    for v in (dst, *srcs):
        if v.buf.mem == "psum":
            raise NKIError(f"{where()}: DMA does not read or write PSUM; copy the tile to SBUF first")
        if math.prod(v.shape) != math.prod(dst.shape):
            raise NKIError(f"{where()}: dma_compute operands need the element count of dst {dst.shape}, got {v.shape}")
    nbytes = sum(math.prod(v.shape) * DTYPE_BYTES[v.dtype] for v in (dst, *srcs))
    desc = max(v.partitions if v.buf.mem != "hbm" else 1 for v in (dst, *srcs)) * (len(srcs) + 1)
    return t.emit("DMA_COMPUTE", [dst], srcs, {"desc": desc}, dur=dma_ns(t.p, nbytes, desc) - t.p.dma_fixed_ns,
                  latency=t.p.dma_fixed_ns)
