"""``nki.language`` (``nl``): tensors, buffers, indexing, loops, load/store and the common tile ops.

Names and signatures follow the real SDK (reference llm_serving_and_nki.md §1.3-1.7), so a kernel
written for ``neuronxcc.nki.language`` runs after changing its import. Each op records ISA
instructions through :mod:`neuron_stack.nki.ops`: elementwise math on tiles and reductions on the
Vector Engine, activation functions on the Scalar Engine, ``matmul`` / ``transpose`` on the Tensor
Engine, ``load`` / ``store`` as DMAs.

>>> import numpy as np
>>> import neuron_stack.nki as nki
>>> @nki.jit
... def double(a):
...     out = ndarray(a.shape, a.dtype, buffer=shared_hbm)
...     store(out, value=multiply(load(a), 2.0))
...     return out
>>> double(np.ones((4, 8), np.float32))[0, :3]
array([2., 2., 2.], dtype=float32)
"""
from __future__ import annotations

import math

import ml_dtypes  # noqa: F401  (registers bfloat16/fp8 with numpy: `np.zeros(n).astype(nl.bfloat16)`, as samples write)

from . import ops, ops_more
from .core import PMAX, TENSOR_OPS, NKIError, _overlap, current, dtype_name, par_dim, unsupported  # noqa: F401
from .core import ndarray as tensor
from .core import where as _where
from .indexing import DynIdx, Idx, arange, as_rank, ds, mgrid  # noqa: F401
from .loops import (  # noqa: F401  (nl.program_id, nl.affine_range, ...: the grid and loops)
    NKIObject,
    affine_range,
    nc,
    no_reorder,
    num_programs,
    program_id,
    program_ndim,
    sequential_range,
    spmd_dim,
    static_range,
)
from .loops import assignment_at as _assignment_at


# -- dtypes (names; numpy and torch dtypes are accepted wherever a dtype is) --------------------
class _Float(str):
    """A float dtype name that also knows its range (``nl.fp32.min``, used for masked-out scores)."""

    @property
    def min(self) -> float:
        import torch
        return float(torch.finfo(getattr(torch, str(self))).min)

    @property
    def max(self) -> float:
        import torch
        return float(torch.finfo(getattr(torch, str(self))).max)


float32, bfloat16, float16 = _Float("float32"), _Float("bfloat16"), _Float("float16")
tfloat32 = float32
fp32, bf16, fp16 = float32, bfloat16, float16
float8_e4m3, float8_e4m3fn, float8_e5m2 = "float8_e4m3fn", "float8_e4m3fn", "float8_e5m2"
int32, int16, int8, uint32, uint16, uint8, bool_ = "int32", "int16", "int8", "uint32", "uint16", "uint8", "bool"

def sizeinbytes(dtype) -> int:
    """Bytes per element of ``dtype`` (``nki.language.constants.sizeinbytes``).

    >>> sizeinbytes(bfloat16), sizeinbytes("float32"), sizeinbytes(float8_e4m3)
    (2, 4, 1)
    """
    from .core import DTYPE_BYTES
    return DTYPE_BYTES[dtype_name(dtype)]


# -- buffers ------------------------------------------------------------------------------------
sbuf, psum, hbm, shared_hbm, private_hbm = "sbuf", "psum", "hbm", "shared_hbm", "private_hbm"


class tile_size:
    """The hardware tile limits (``nl.tile_size``)."""
    pmax = PMAX
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_num_banks = 8
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512


def is_sbuf(t) -> bool: return t.buf.mem == "sbuf"
def is_psum(t) -> bool: return t.buf.mem == "psum"
def is_hbm(t) -> bool: return t.buf.mem == "hbm"
def is_on_chip(t) -> bool: return t.buf.mem != "hbm"


# -- creation -----------------------------------------------------------------------------------
def ndarray(shape, dtype, buffer=sbuf, name: str = "", address=None):
    """A new tensor in ``buffer``; its contents are undefined (NaN in the simulator) until written.
    ``address=(0, byte)`` places an on-chip tile there instead of the allocator (manual allocation)."""
    return current().alloc(buffer, shape, dtype, name, address)


def full(shape, fill_value, dtype, buffer=sbuf, name: str = "", lazy_initialization: bool = False, **_):
    """A tile filled with ``fill_value`` (one MEMSET). ``lazy_initialization=True`` on a PSUM zeros tile (the
    legacy flash attention's accumulator) issues no MEMSET: the first ``+=`` matmul into each region starts
    its accumulation group instead (anything else first zeroes the region it adds into), as the compiler
    elides the fill."""
    t = ndarray(shape, dtype, buffer, name)
    if t.buf.mem == "hbm":
        raise NKIError(f"{_where()}: nl.full/zeros/ones fill on-chip tiles; fill an SBUF tile and store it")
    if lazy_initialization and t.buf.mem == "psum" and float(fill_value) == 0.0:
        t.buf.lazy_zero = True
        return t
    ops.memset(t, fill_value)
    return t


def zeros(shape, dtype, buffer=sbuf, name: str = "", **kw): return full(shape, 0.0, dtype, buffer, name, **kw)
def ones(shape, dtype, buffer=sbuf, name: str = "", **kw): return full(shape, 1.0, dtype, buffer, name, **kw)
def zeros_like(a, dtype=None, buffer=None, name="", **kw):
    return zeros(a.shape, dtype or a.dtype, buffer or a.buf.mem, name, **kw)
def ones_like(a, dtype=None, buffer=None, name="", **kw):
    return ones(a.shape, dtype or a.dtype, buffer or a.buf.mem, name, **kw)


def empty_like(a, dtype=None, buffer=None, name=""):
    return ndarray(a.shape, dtype or a.dtype, buffer or a.buffer, name)


def static_cast(x, dtype):
    """``x`` converted to ``dtype`` in a new SBUF tile (TENSOR_COPY on the Vector Engine); outside a
    kernel, a host array converted (bf16/fp8 as ``ml_dtypes`` arrays), as the SDK's tests use it.

    >>> static_cast([1.5, 2.25], bfloat16).dtype.name
    'bfloat16'
    """
    if not isinstance(x, tensor):
        import ml_dtypes  # numpy has no bf16/fp8
        import numpy as np
        name = dtype_name(dtype)
        return np.asarray(x).astype(getattr(ml_dtypes, name, None) or np.dtype(name))
    return copy(x, dtype=dtype)


def expand_dims(x, axis):
    """A view of ``x`` with a new size-1 free dimension at ``axis`` (>= 1)."""
    axis = axis % (x.ndim + 1)
    if axis == 0:
        raise NKIError(f"{_where()}: nl.expand_dims cannot add a dim before the partition dim")
    strides = list(x.strides[:axis]) + [1] + list(x.strides[axis:])
    return tensor(x.buf, x.shape[:axis] + (1,) + x.shape[axis:], x.offset, strides, x.dtype, x.pdim)


def where(condition, x, y, dtype=None, mask=None, **_):
    """``condition ? x : y`` elementwise: ``y`` copied, then ``x`` copied over it where ``condition`` is
    non-zero (COPY_PREDICATED on the Vector Engine); ``x`` / ``y`` may be numbers."""
    like = next(v for v in (condition, x, y) if isinstance(v, tensor))
    out = ndarray(like.shape, dtype or (x.dtype if isinstance(x, tensor) else y.dtype if isinstance(y, tensor)
                                        else float32))
    if isinstance(y, tensor):
        ops.tensor_copy(out, y)
    else:
        ops.memset(out, y)
    src = x if isinstance(x, tensor) else full(like.shape, x, out.dtype)
    ops.copy_predicated(out, src, condition)
    return out


# -- data movement ------------------------------------------------------------------------------
def load(src, dtype=None, mask=None, **_):
    """HBM -> a new SBUF tile of ``src``'s shape (DMA). ``mask`` limits the copy to its box."""
    current()
    if not isinstance(src, tensor):
        raise NKIError(f"{_where()}: nl.load takes an HBM tensor, got {type(src).__name__}")
    if src.partitions > PMAX:
        raise NKIError(f"{_where()}: Size of partition dimension {src.partitions} exceeds architecture limitation "
                       f"of {PMAX}; load tiles of at most {PMAX} rows")
    shape = src.shape if len(src.shape) > 1 else (src.shape[0], 1) if src.shape else (1, 1)
    tile = ndarray(shape, dtype_name(dtype) if dtype else src.dtype)
    ops.dma_copy(tile, as_rank(src, shape), mask)
    return tile


def store(dst, value, mask=None, **_):
    """A tile -> HBM (DMA); a PSUM value is first copied to SBUF, as the compiler does."""
    if not isinstance(value, tensor):
        raise NKIError(f"{_where()}: nl.store value must be a tile, got {type(value).__name__}")
    if value.buf.mem == "psum":
        value = copy(value)
    if math.prod(value.shape) != math.prod(dst.shape) and mask is None:
        raise NKIError(f"{_where()}: nl.store of a {value.shape} tile into {dst.shape}")
    ops.dma_copy(as_rank(dst, value.shape) if len(dst.shape) < len(value.shape) else dst, value, mask)


def copy(x, dtype=None, mask=None, **_):
    """A new SBUF tile holding ``x`` (converted to ``dtype``): TENSOR_COPY on the Vector Engine."""
    out = ndarray(x.shape, dtype or x.dtype)
    ops.tensor_copy(out, x, mask=mask)
    return out


def _assign(dst, value) -> None:
    """``dst[...] = value``: a DMA from HBM, a store to HBM, a tile copy, or a memset of a number; a value just
    computed into a temporary tile (``nl.load``, ``nl.exp`` ...) is written straight into ``dst`` (no copy)."""
    t = current()
    if isinstance(value, tensor) and (value.buf, value.offset, value.strides, value.shape) == (
            dst.buf, dst.offset, dst.strides, dst.shape):
        return                  # `t[i] += x` writes t[i] in place; the assignment Python adds is not a copy
    part = ops.masked_part(dst, value)  # a masked result writes its box of dst only (none: nothing at all)
    if part is None:
        return
    dst, value = part
    if isinstance(value, tensor) and dst.buf.mem != "hbm" and t.retarget(value, dst):
        return
    if not isinstance(value, tensor):
        ops.memset(dst, value)
    elif value.buf.mem == "hbm" and dst.buf.mem != "hbm":
        ops.dma_copy(dst, value)
    elif dst.buf.mem == "hbm":
        store(dst, value)
    else:
        ops.tensor_copy(dst, value)


def broadcast_to(x, shape):
    return x.broadcast_to(shape)


def device_print(prefix: str, x) -> None:
    """Print ``x``'s value when the simulator reaches this point (numbers, not timing)."""
    t = current()
    t.prints.append((len(t.instrs), str(prefix), x.operand(), x.shape))


# -- elementwise --------------------------------------------------------------------------------
def load_transpose2d(src, dtype=None, **_):
    """A new SBUF tile holding the 2-D HBM ``src`` transposed (a transposing DMA)."""
    out = ndarray(tuple(src.shape[::-1]), dtype_name(dtype) if dtype else src.dtype)
    ops.dma_transpose(out, src)
    return out


def __getattr__(name):
    raise unsupported("nl", name)


def _result(x, dtype):
    return ndarray(x.shape, dtype or (x.dtype if x.buf.mem != "psum" else float32))


def _unary(func: str):
    def f(x, dtype=None, mask=None, **_):
        out = _result(x, dtype)
        ops.activation(out, func, x, mask=mask)
        return out
    f.__name__ = f._act = func
    f.__doc__ = f"``{func}(x)`` elementwise on the Scalar Engine (ACTIVATE). Example: ``nl.{func}(tile)``."
    return f


exp, log, tanh, sigmoid, relu, silu, gelu, softplus, erf, rsqrt, sqrt, square, abs, sin, cos, sign, reciprocal = (
    _unary(n) for n in ("exp", "log", "tanh", "sigmoid", "relu", "silu", "gelu", "softplus", "erf", "rsqrt",
                        "sqrt", "square", "abs", "sin", "cos", "sign", "reciprocal"))
gelu_apprx_tanh = _unary("gelu_tanh")
trunc, tan, arctan, mish, gelu_apprx_sigmoid, gelu_dx, gelu_apprx_sigmoid_dx, silu_dx, erf_dx = (
    _unary(n) for n in ("trunc", "tan", "arctan", "mish", "gelu_apprx_sigmoid", "gelu_dx", "gelu_apprx_sigmoid_dx",
                        "silu_dx", "erf_dx"))
negative = _unary("neg")
identity = _unary("identity")
floor, ceil = _unary("floor"), _unary("ceil")


def _binary(x, y, op: str, dtype=None, mask=None):
    if op == "add" and isinstance(x, tensor) and isinstance(y, Idx):
        return DynIdx(x, y)             # `idx_tile[0, j] + iy`: an offset read at run time (tensor_copy_dynamic_*)
    xt, yt = isinstance(x, tensor), isinstance(y, tensor)
    if not xt and not yt:
        raise NKIError(f"{_where()}: nl.{op} needs at least one tile operand")
    if xt and yt and x.ndim == y.ndim and x.partitions != y.partitions and 1 in (x.partitions, y.partitions):
        # a one-partition tile broadcasts across the other's partitions, as nl ops broadcast (flash attention
        # backward's `nl.add(nl.zeros((128, 1)), sink)` with a [1, 1] sink)
        one, other = (x, y) if x.partitions == 1 else (y, x)
        wide = one.broadcast_to(tuple(other.shape[d] if d == one.pdim else n for d, n in enumerate(one.shape)))
        x, y = (wide, y) if one is x else (x, wide)
    if xt and yt:
        if x.free_size == 1 and y.free_size > 1:          # [P, 1] column on the left
            out = _result(y, dtype)
            ops.tensor_scalar(out, y, op, x, reverse0=True, mask=mask)
        elif y.free_size == 1 and x.free_size > 1:
            out = _result(x, dtype)
            ops.tensor_scalar(out, x, op, y, mask=mask)
        else:
            out = _result(x, dtype)
            ops.tensor_tensor(out, x, y, op, mask=mask)
        return out
    tile, scalar = (x, y) if xt else (y, x)
    out = _result(tile, dtype)
    exact = isinstance(scalar, int) and op in ("left_shift", "right_shift", "bitwise_and", "bitwise_or", "bitwise_xor")
    ops.tensor_scalar(out, tile, op, scalar if exact else float(scalar), reverse0=not xt, mask=mask)
    return out


def _binop(op: str):
    def f(x, y, dtype=None, mask=None, **_):
        return _binary(x, y, op, dtype, mask)
    f.__name__ = f._alu = op
    f.__doc__ = f"``{op}(x, y)`` elementwise on the Vector Engine; a [P, 1] column or a number broadcasts."
    return f


(add, subtract, multiply, divide, maximum, minimum, power, equal, not_equal, greater, greater_equal, less,
 less_equal, logical_and, logical_or, logical_xor, bitwise_and, bitwise_or, bitwise_xor) = (
    _binop(n) for n in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal",
                        "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and",
                        "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor"))
fmod, mod, left_shift, right_shift, bypass = (_binop(n) for n in ("fmod", "mod", "left_shift", "right_shift",
                                                                   "bypass"))
NkiTensor = tensor


class MemoryRegion:
    """``nl.MemoryRegion``: the buffers as an enum (``nl.MemoryRegion.sbuf`` is ``nl.sbuf``)."""
    sbuf, psum, private_hbm, shared_hbm = "sbuf", "psum", "private_hbm", "shared_hbm"


def logical_not(x, dtype=None, mask=None, **_):
    """``1 - x`` for boolean-like (0/1) tiles, as the SDK's XOR with 1: one TENSOR_SCALAR on the Vector Engine
    (for other values use ``nl.equal(x, 0)``)."""
    out = _result(x, dtype)
    ops.tensor_scalar(out, x, "subtract", 1, reverse0=True, mask=mask)
    return out


def _accumulate(acc, o):
    """``acc += o``: a matmul result just produced is retargeted into ``acc`` (PSUM accumulation), anything else
    is a Vector Engine add; a masked result adds into its box of ``acc`` (nothing, if the mask selected none)."""
    if ops.masked_away(o) or getattr(o, "_mfull", None) == acc.shape != o.shape:
        ops.masked_away(o) or _accumulate(TENSOR_OPS["restrict"](acc, o._mbox, acc.shape), o)
        return acc
    t = current()
    mm = getattr(o, "_mm", None) if isinstance(o, tensor) else None
    # a region no instruction wrote yet: the first matmul starts its accumulation group (as nc_matmul's
    # accumulate=None decides), anything else adds into the zeros a lazy nl.zeros owes it
    fresh = not any(_overlap(acc.region(), w) for w in acc.buf.written)
    if mm is not None and acc.buf.mem == "psum" and mm[0] == len(t.instrs) - 1 and acc.shape == o.shape:
        ins, (_, stat, mov) = t.instrs.pop(), mm
        o.buf.writes.clear()
        o.buf.written.clear()
        t.emit("MATMUL", [acc], [stat, mov], {"start": fresh, "stop": True}, dur=ins.dur, flops=ins.flops,
               itype="REGULAR", small=False, loc=ins.node)
        return acc
    if fresh and acc.buf.lazy_zero:
        ops.memset(acc, 0.0)        # the lazily initialised accumulator's fill, just before its first use
    if isinstance(o, tensor):
        ops.tensor_tensor(acc, acc, o if o.shape == acc.shape or o.free_size > 1 else o.broadcast_to(acc.shape),
                          "add")
    else:
        ops.tensor_scalar(acc, acc, "add", float(o))
    return acc


# -- reductions ---------------------------------------------------------------------------------
def _reduction(red: str):
    def f(x, axis, dtype=None, keepdims=False, mask=None, **_):
        axes = {a % x.ndim for a in ([axis] if isinstance(axis, int) else axis)}
        shape = [n if d not in axes else 1 for d, n in enumerate(x.shape) if keepdims or d not in axes]
        out = ndarray(tuple(shape) if len(shape) > 1 else (x.partitions, 1),
                      dtype or (x.dtype if x.buf.mem != "psum" else float32))
        ops.tensor_reduce(out, red, x, axis, mask=mask)
        return out
    f.__name__ = red
    f.__doc__ = (f"``{red}`` over the free axes (Vector Engine REDUCE); the result is a [P, 1] column. "
                 f"Example: ``nl.{red}(tile, axis=[1])``.")
    return f


sum, max, min, prod = (_reduction(n) for n in ("add", "maximum", "minimum", "multiply"))
sum.__name__, max.__name__, min.__name__, prod.__name__ = "sum", "max", "min", "prod"


def mean(x, axis, dtype=None, keepdims=False, mask=None, **_):
    s = sum(x, axis, dtype=float32, mask=mask)
    out = ndarray(s.shape, dtype or x.dtype)
    ops.tensor_scalar(out, s, "multiply", 1.0 / x.free_size)
    return out


def var(x, axis, dtype=None, keepdims=False, mask=None, **_):
    """Variance over the free axes as the Vector Engine computes it: one ``bn_stats`` per 512-element slice
    into a stats tile, then ``bn_aggr``; the result is a [P, 1] column."""
    P, F = x.partitions, x.free_size
    flat = x if x.ndim == 2 else x.reshape((P, F))
    n = -(-F // ops.BN_STATS_FMAX)
    stats = ndarray((P, ops.BN_STATS_DIM * n), float32)
    for j in range(n):
        lo = j * ops.BN_STATS_FMAX
        hi = F if F < lo + ops.BN_STATS_FMAX else lo + ops.BN_STATS_FMAX     # (min is nl.min here)
        ops.bn_stats(stats[:, j * ops.BN_STATS_DIM:(j + 1) * ops.BN_STATS_DIM], flat[:, lo:hi])
    mean_var = ndarray((P, ops.BN_AGGR_DIM), float32)
    ops.bn_aggr(mean_var, stats)
    out = ndarray((P, 1), dtype or float32)
    ops.tensor_copy(out, mean_var[:, 1:2])
    return out


def softmax(x, axis=-1, dtype=None, **_):
    """Softmax along the free axis: max (Vector), exp(x - max) with a running sum (one ACTIVATE),
    reciprocal and scale."""
    if axis not in (-1, 1, x.ndim - 1):
        raise NKIError(f"{_where()}: nl.softmax runs along the free axis (axis=-1)")
    m = max(x, axis=-1, dtype=float32)
    neg = ndarray(m.shape, float32)
    ops.tensor_scalar(neg, m, "multiply", -1.0)
    e = ndarray(x.shape, float32)
    s = ndarray(m.shape, float32)
    ops.activation(e, "exp", x, bias=neg, reduce_op="add", reduce_res=s)
    r = reciprocal(s)
    out = ndarray(x.shape, dtype or x.dtype)
    ops.tensor_scalar(out, e, "multiply", r)
    return out


def rms_norm(x, w, axis=-1, n=None, epsilon=1e-6, dtype=None, compute_dtype=None, **_):
    """``x / sqrt(mean(x**2) + eps) * w`` along the free axis; ``w`` is [1, D] or [P, D]."""
    n = n or x.free_size
    sq = ndarray(x.shape, float32)
    ss = ndarray((x.partitions, 1), float32)
    ops.activation(sq, "square", x, reduce_op="add", reduce_res=ss)
    ms = ndarray(ss.shape, float32)
    ops.tensor_scalar(ms, ss, "multiply", 1.0 / n, op1="add", operand1=float(epsilon))
    r = rsqrt(ms)
    y = ndarray(x.shape, float32)
    ops.tensor_scalar(y, x, "multiply", r)
    out = ndarray(x.shape, dtype or x.dtype)
    wt = w if w.partitions == x.partitions else w.broadcast_to((x.partitions,) + tuple(w.shape[1:]))
    ops.tensor_tensor(out, y, wt, "multiply")
    return out


# -- Tensor Engine ------------------------------------------------------------------------------
def transpose(x, dtype=None, **_):
    """``x.T`` on the Tensor Engine (a matmul against the identity); the result is in PSUM."""
    out = ndarray((x.free_size, x.partitions), float32, buffer=psum)
    ops.nc_transpose(out, x)
    return out


def matmul(x, y, transpose_x: bool = False, mask=None, **_):
    """``x @ y`` into a new PSUM tile; ``transpose_x=True`` takes ``x`` as [K, M] already (stationary).
    An operand in PSUM (say ``nl.transpose``'s result) is first copied to SBUF, as the compiler did for the
    attention tutorial's v1: ``nl.matmul`` is a language op that places its operands; ``nisa.nc_matmul``,
    the instruction, refuses PSUM operands."""
    stat = x
    if not transpose_x:
        stat = copy(transpose(x), dtype=x.dtype)
    elif x.buf.mem == "psum":
        stat = copy(x, dtype=x.dtype)
    if y.buf.mem == "psum":
        y = copy(y, dtype=y.dtype)
    out = ndarray((stat.free_size, y.free_size), float32, buffer=psum)
    i = ops.nc_matmul(out, stat, y)
    out._mm = (i, stat, y)
    return out


TENSOR_OPS.update(assign=_assign, binary=_binary, accumulate=_accumulate)


# -- random numbers, logical reductions, constants, loop reductions ------------------------------
def random_seed(seed, mask=None, **_):
    """Seed the Vector Engine's random number generator (a 32-bit number, or a [1, 1] tile as the current SDK
    takes it); the same seed gives the same ``nl.dropout`` masks. Unseeded runs use seed 0."""
    ops_more.rng_seed(seed)


def dropout(x, rate, dtype=None, mask=None, **_):
    """``x`` with each element zeroed with probability ``rate`` (a number or a one-element tile), in a new SBUF
    tile: DROPOUT on the Vector Engine. Kept elements are unchanged (the SDK docs specify no rescaling)."""
    if isinstance(rate, tensor):
        if math.prod(rate.shape) != 1:
            raise NKIError(f"{_where()}: nl.dropout rate must be a number or a tile with one element, got {rate.shape}")
        rate = rate.reshape((1, 1)).broadcast_to((x.partitions, 1))
    out = ndarray(x.shape, dtype or (x.dtype if x.buf.mem != "psum" else float32))
    ops_more.dropout(out, x, rate, mask)
    return out


def all(x, axis, dtype=bool_, mask=None, **_):
    """Whether every element along the free axes is non-zero: a [P, 1] column (REDUCE with logical AND on the
    Vector Engine, ``max(MIN_II, N)`` cycles)."""
    out = ndarray((x.partitions, 1), dtype)
    ops.tensor_reduce(out, "logical_and", x, axis, mask=mask)
    return out


def invert(x, dtype=None, mask=None, **_):
    """Bitwise NOT of an integer (or bool) tile, as ``numpy.invert``: ``C - x`` with C = -1 (signed), 2**bits - 1
    (unsigned) or 1 (bool), one TENSOR_SCALAR on the Vector Engine."""
    if x.dtype not in ("int32", "int16", "int8", "uint32", "uint16", "uint8", "bool"):
        raise NKIError(f"{_where()}: nl.invert takes an integer or bool tile, got {x.dtype} (for floats use "
                       f"nl.logical_not or nl.equal(x, 0))")
    c = 1 if x.dtype == "bool" else (1 << 8 * ops.DTYPE_BYTES[x.dtype]) - 1 if x.dtype.startswith("u") else -1
    out = ndarray(x.shape, dtype or x.dtype)
    ops.tensor_scalar(out, x, "subtract", c, reverse0=True, mask=mask)
    return out


def shared_identity_matrix(n, dtype=uint8, dst=None, **_):
    """An [n, n] identity tile in SBUF (the current SDK's form; a legacy ``nl.load`` of it is an SBUF copy).
    Identities of one dtype are built once per kernel: one AFFINE_SELECT on GpSimd."""
    n = int(n)
    if not 0 < n <= PMAX:
        raise NKIError(f"{_where()}: nl.shared_identity_matrix({n}) exceeds the {PMAX} partitions of SBUF")
    ident = ops.identity(dtype_name(dtype))[0:n, 0:n]
    if dst is not None:
        ops.tensor_copy(dst, ident)
        return dst
    return ident


def shared_constant(constant, dtype=None, **_):
    """A shared-HBM tensor holding ``constant`` (a numpy array, or a path to a ``.npy`` file), as the compiler
    embeds it in the NEFF; read it with ``nl.load``."""
    import numpy as np
    arr = np.load(constant) if isinstance(constant, (str, bytes)) or hasattr(constant, "__fspath__") else constant
    arr = np.asarray(arr)
    if arr.dtype == object or arr.size == 0:
        raise NKIError(f"{_where()}: nl.shared_constant takes a non-empty numeric array, got {arr.dtype} {arr.shape}")
    dt = dtype_name(dtype if dtype is not None else arr.dtype)
    from neuron_stack.isa.memory import _round
    t = current()
    out = t.alloc("shared_hbm", arr.shape if arr.ndim else (1,), dt, name=f"constant{len(t.hbm)}")
    value = arr.reshape(out.shape)
    value = _round(dt, value.astype(np.float32)) if dt in ops.FLOATS else value.astype(np.int64)
    t.inits.append((len(t.instrs), out.operand(), value))     # after its NaN fill: the data is there from the start
    t.constants = getattr(t, "constants", 0) + 1               # a captured model cannot carry it yet (lowering.py)
    return out


def loop_reduce(x, op, loop_indices, dtype=None, mask=None, **_):
    """``b = nl.loop_reduce(a, op, loop_indices=[i])`` is ``b = op(b, a)`` in place (the destination is also
    op's other input, as the SDK documents): one TENSOR_TENSOR on the Vector Engine into the tile ``b`` already
    holds (or into the view ``b[...]`` when the line assigns one). ``b`` must be declared before the loop (e.g.
    ``b = nl.zeros(...)``)."""
    import ast
    import inspect
    frame = inspect.currentframe().f_back
    try:
        target = None
        node = _assignment_at(frame)
        try:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target = frame.f_locals.get(node.targets[0].id)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript):
                # ``b[i, :, s] = nl.loop_reduce(a, ...)``: that view of b (the contributed matmul's form)
                target = eval(ast.unparse(node.targets[0]), frame.f_globals, frame.f_locals)  # noqa: S307
        except (IndexError, NameError):
            pass
    finally:
        del frame
    if not isinstance(target, tensor) or target.buf.mem == "hbm":
        raise NKIError(f"{_where()}: nl.loop_reduce writes into its destination, which must be a tile declared "
                       f"before the loop and assigned on this line: b = nl.zeros(...), then b = nl.loop_reduce(a, ...)")
    if dtype is not None and dtype_name(dtype) != target.dtype:
        raise NKIError(f"{_where()}: nl.loop_reduce dtype {dtype_name(dtype)} differs from its destination's "
                       f"{target.dtype}")
    ops.tensor_tensor(target, target, x, op, mask=mask)
    return target


def rand(shape, dtype=float32, buffer=sbuf, name="", **_):
    """A new tile of uniform [0, 1) draws from the Vector Engine PRNG (``nl.random_seed`` seeds it)."""
    out = ndarray(shape, dtype, buffer, name)
    ops_more.rand(out)
    return out


def gather_flattened(data, indices, axis=0, dtype=None, **_):
    """Per partition, the elements of ``data``'s flattened free part at ``indices`` (uint32): a new tile of
    ``indices``' shape (N_GATHER on GpSimd)."""
    if axis not in (0, -1, 1):
        raise NKIError(f"{_where()}: nl.gather_flattened gathers along the flattened free part (axis=0)")
    out = ndarray(indices.shape, dtype or data.dtype)
    ops_more.n_gather(out, data, indices)
    return out


def atomic_rmw(dst, value, op, mask=None, **_):
    """``dst = op(dst, value)`` on an HBM tensor, read-modified-written by one DMA (the DMA engines compute in
    fp32). Indices read from SBUF (``dst[indices_tile, ix]``) are not simulated: the indexing says so."""
    if not isinstance(dst, tensor) or dst.buf.mem != "hbm":
        raise NKIError(f"{_where()}: nl.atomic_rmw updates an HBM tensor in place; dst is "
                       f"{getattr(dst, 'buffer', type(dst).__name__)}")
    ops.dma_copy(dst, value, mask, rmw_op=op)
