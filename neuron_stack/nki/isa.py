"""``nki.isa`` (``nisa``): one call per hardware instruction, in both API forms.

New NKI passes the destination first and returns nothing (``nisa.tensor_copy(dst, src)``); legacy
NKI returned a new tile (``t = nisa.tensor_copy(src)``). Each function accepts both: a call whose
first tensor is followed by the instruction's own tensors (or that names ``dst=``) is the new form.
The instructions map onto ISA opcodes (docs/isa.md): ``nc_matmul`` -> LDWEIGHTS + MATMUL,
``nc_transpose`` -> a TRANSPOSE matmul, ``activation`` -> ACTIVATE, ``tensor_tensor`` ->
TENSOR_TENSOR, ``tensor_scalar`` -> TENSOR_SCALAR, ``tensor_reduce`` -> REDUCE, ``tensor_copy`` ->
TENSOR_COPY, ``iota`` -> IOTA, ``memset`` -> MEMSET, ``dma_copy`` -> DMA_DIRECT2D, and most others onto an
opcode of their own name (``tensor_tensor_scan`` -> TENSOR_TENSOR_SCAN, ``local_gather`` -> LOCAL_GATHER, ...).

>>> import numpy as np
>>> import neuron_stack.nki as nki
>>> import neuron_stack.nki.language as nl
>>> @nki.jit
... def add_one(a):
...     out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
...     t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
...     dma_copy(dst=t, src=a)
...     tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
...     dma_copy(dst=out, src=t)
...     return out
>>> add_one(np.zeros((2, 3), np.float32))
array([[1., 1., 1.],
       [1., 1., 1.]], dtype=float32)
"""
from __future__ import annotations

import numpy as np

from . import ops, ops_more
from .core import NKIError, current, dtype_name, unsupported, where
from .core import ndarray as _T


class engine:
    """``nisa.engine``: where an instruction runs (``engine.vector`` ...)."""
    unknown, tensor, scalar, gpsimd, dma, vector, sync = ("unknown", "tensor", "scalar", "gpsimd", "dma", "vector",
                                                          "sync")


tensor_engine, scalar_engine, gpsimd_engine, vector_engine = "tensor", "scalar", "gpsimd", "vector"   # legacy names
unknown_engine = "unknown"
NkiValidationError = NKIError       # the SDK's error for a hardware constraint violated


class matmul_perf_mode:
    """``nisa.matmul_perf_mode``: ``double_row`` (FP8, NeuronCore-v3+): two row groups contracted at once, issued
    as two accumulating matmuls (see ``_matmul``)."""
    none, double_row = "none", "double_row"


class dma_engine:
    """``nisa.dma_engine``: which DMA moves a ``sendrecv`` (multi-core, not simulated)."""
    dma, gpsimd_dma = "dma", "gpsimd_dma"


class reduce_cmd:
    """``nisa.reduce_cmd``: how ``activation``'s accumulator starts (each call here resets it)."""
    idle, reset, reduce, reset_reduce, load_reduce = "idle", "reset", "reduce", "reset_reduce", "load_reduce"


class nc_version:
    gen2, gen3, gen4 = 2, 3, 4


def get_nc_version():
    """The NeuronCore generation of the simulated device (trn1/inf2: gen2, trn2: gen3)."""
    return nc_version.gen3 if current().p.name == "trn2" else nc_version.gen2


class oob_mode:
    error, skip = "error", "skip"


class dge_mode:
    unknown, swdge, hwdge, none = "unknown", "swdge", "hwdge", "none"


def _bind(args, new: bool, optional=(), **given) -> list:
    """The one parameter parser of both call forms: each parameter in ``given`` (its keyword value, None when not
    passed by keyword; in signature order, ``dst`` first) not passed by keyword takes the next positional argument;
    the legacy form (``new`` False) has no ``dst``; an ``optional`` parameter with no argument left stays None.

    >>> _bind((1, 2), True, dst=None, data=None, op="add")
    [1, 2, 'add']
    >>> _bind((2,), False, optional=("axis",), dst=None, data=None, axis=None)
    [None, 2, None]
    """
    a = list(args)
    out = []
    for name, value in given.items():
        if name == "dst" and not new:
            out.append(None)
        elif value is not None:
            out.append(value)
        else:
            out.append(a.pop(0) if a or name not in optional else None)
    return out


def _new(dtype, shape, buffer="sbuf"):
    return current().alloc(buffer, shape, dtype_name(dtype))


def _eng(e) -> str:
    return "vector" if e in (None, "unknown") else str(e)


def nc_matmul(*args, dst=None, stationary=None, moving=None, accumulate=None, is_transpose=False, mask=None,
              is_stationary_onezero=False, is_moving_onezero=False, tile_position=(), tile_size=(), perf_mode=None,
              **_):
    """``dst (+)= stationary.T @ moving`` (new form) or ``return stationary.T @ moving`` in a new PSUM tile
    (legacy). Stationary is [K<=128, M<=128], moving [K, N<=512], dst [M, N] in PSUM."""
    new = len(args) == 3 or dst is not None
    dst, stationary, moving = _bind(args, new, dst=dst, stationary=stationary, moving=moving)
    if new:
        if is_transpose:
            return ops.nc_transpose(dst, stationary)
        cut = _unmasked(dst, mask, stationary, moving)
        if cut is not None:
            _matmul(*cut[1:], accumulate, None, perf_mode)
        return None
    if str(perf_mode or "none").startswith("double_row"):
        shape = (stationary.shape[-1], moving.shape[-1])
    else:   # the result keeps the moving tile's free dims (a [K, k0, k1] moving gives [M, k0, k1])
        shape = (stationary.free_size, *(moving.shape[:moving.pdim] + moving.shape[moving.pdim + 1:] or (1,)))
    out = _new("float32", shape, "psum")
    cut = _unmasked(out, mask, stationary, moving)
    if cut is None:
        ops.skip(out)
        return out              # nothing selected: no instruction, and `acc += out` adds nothing
    if cut[0] is not None:      # the box of the product: `acc[...] += d` retargets its matmul into that box of acc
        box, d, s, m = cut
        s, m = _to_sbuf(s), _to_sbuf(m)
        d._mm, d._mfull, d._mbox = (_matmul(d, s, m, None, None, perf_mode), s, m), out.shape, box
        return d
    stationary, moving = _to_sbuf(stationary), _to_sbuf(moving)
    i = _matmul(out, stationary, moving, None, None, perf_mode)
    if hasattr(stationary, "_mbox") or hasattr(moving, "_mbox"):
        _mask_result(out, stationary, moving)
    if stationary.ndim == 2:        # `acc += nc_matmul(...)` retargets one matmul; a double-row pair is added
        out._mm = (i, stationary, moving)
    return out


def _unmasked(dst, mask, *operands):
    """A matmul's ``mask=``, over its result [M, N]: None when it selects nothing, else ``(box, dst, stationary,
    moving)`` cut to the box (box None: a constant ``True``, as a causal test on loop indices folds to, keeps them
    whole); the box's M (N) range cuts the stationary's (moving's) free dim."""
    if isinstance(mask, (bool, np.bool_)) or mask is None:
        return (None, dst, *operands) if mask is None or mask else None
    from .indexing import box_of, restrict
    box = box_of(mask, dst.shape)
    if box is None:
        return None
    if dst.ndim != 2 or any(v.ndim != 2 for v in operands):
        raise NKIError(f"{where()}: a mask on a matmul is simulated for 2-D tiles only; trim the tiles instead")
    cut = [restrict(v, [(0, v.shape[0]), b], v.shape) for v, b in zip(operands, box)]
    return (box, restrict(dst, box, dst.shape), *cut)


def _mask_result(out, stationary, moving) -> None:
    """Operands masked by indexing (``nc_matmul(w[i_m < M], x[i_n < N])``, the legacy form) give a result that
    is that box of the unmasked product: record it, so ``acc[...] += result`` adds into that box of ``acc``."""
    sroot, mroot = getattr(stationary, "_mroot", stationary), getattr(moving, "_mroot", moving)
    if sroot.ndim != 2:
        return
    sbox = getattr(stationary, "_mbox", [(0, n) for n in sroot.shape])
    mbox = getattr(moving, "_mbox", [(0, n) for n in mroot.shape])
    drop = mroot.pdim
    out._mfull = (sroot.shape[1 - sroot.pdim], *(n for d, n in enumerate(mroot.shape) if d != drop))
    out._mbox = [sbox[1 - sroot.pdim], *(b for d, b in enumerate(mbox) if d != drop)]


def _matmul(dst, stationary, moving, accumulate, mask, perf_mode) -> int:
    """One matmul, or in FP8 double-row mode (``perf_mode='double_row'``, NeuronCore-v3+) a contraction over two
    row groups at once: stationary [K, 2, M] and moving [K, 2, N], ``dst = sum_g stationary[:, g].T @
    moving[:, g]``. The two groups are issued as two accumulating matmuls and timed as such (the mode's doubled
    FP8 rate is not modelled)."""
    if not str(perf_mode or "none").startswith("double_row"):
        return ops.nc_matmul(dst, stationary, moving, accumulate, mask)
    if current().p.name in ("trn1", "inf2"):
        raise NKIError(f"{where()}: nc_matmul perf_mode={perf_mode} needs NeuronCore-v3 (trn2) but the target is "
                       f"{current().p.name}")
    if stationary.ndim != 3 or moving.ndim != 3 or stationary.shape[1] != 2 or moving.shape[1] != 2:
        raise NKIError(f"{where()}: double_row nc_matmul takes stationary [K, 2, M] and moving [K, 2, N], got "
                       f"{stationary.shape} and {moving.shape}")
    if not (stationary.dtype.startswith("float8") and moving.dtype.startswith("float8")):
        raise NKIError(f"{where()}: double_row nc_matmul takes float8 tiles, got {stationary.dtype} and "
                       f"{moving.dtype}")
    ops.nc_matmul(dst, stationary[:, 0, :], moving[:, 0, :], accumulate, mask)
    return ops.nc_matmul(dst, stationary[:, 1, :], moving[:, 1, :], True, mask)


def _to_sbuf(v: _T) -> _T:
    """A PSUM operand of the legacy return-value form (``nc_matmul(nc_transpose(x), y)``, the flash attention
    backward sample) copied to SBUF first, as the compiler placed it; the Tensor Engine reads SBUF only. The
    current form, with its explicit tiles, still refuses one."""
    if v.buf.mem != "psum":
        return v
    c = _new(v.dtype, v.shape)
    ops.tensor_copy(c, v)
    return c


def nc_transpose(*args, dst=None, data=None, engine=None, mask=None, dtype=None, **_):
    """``dst = data.T`` on the Tensor Engine (into PSUM), or on the Vector Engine (``engine=nisa.vector_engine``,
    at most 32 x 32)."""
    eng = "vector" if engine == "vector" else "tensor"
    new = len(args) == 2 or dst is not None
    dst, data = _bind(args, new, dst=dst, data=data)
    if not new:
        out = dst = _new(dtype or data.dtype, (data.free_size, data.partitions)) if eng == "vector" else \
            _new("float32", (data.free_size, data.partitions), "psum")
    if mask is not None and not isinstance(mask, (bool, np.bool_)):
        from .indexing import box_of, restrict
        box = box_of(mask, data.shape)      # over the input's indices, as the samples write it
        if box is not None:
            whole, data, dst = dst, restrict(data, box, data.shape), restrict(dst, box[::-1], dst.shape)
            current().masked_box = (whole.operand(), box[::-1])    # `t[...] = result` writes that box of t
        mask = box is not None
    if isinstance(mask, (bool, np.bool_)) and not mask:
        ops.skip(dst)
        return None if new else out     # nothing selected: no instruction (see nc_matmul)
    ops.nc_transpose(dst, data, eng)
    return None if new else out


def activation(*args, dst=None, op=None, data=None, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=None, mask=None, dtype=None, **_):
    """``dst = op(data * scale + bias)`` on the Scalar Engine; ``reduce_res`` gets the free-axis reduce."""
    new = bool(args and isinstance(args[0], _T)) or dst is not None
    dst, op, data = _bind(args, new, dst=dst, op=op, data=data)
    if new:
        ops.activation(dst, op, data, bias, scale, reduce_op, reduce_res, mask)
        return None
    out = _new(dtype or data.dtype if data.buf.mem != "psum" else dtype or "float32", data.shape)
    ops.activation(out, op, data, bias, scale, reduce_op, reduce_res, mask)
    return out


activation_reduce = activation


def tensor_tensor(*args, dst=None, data1=None, data2=None, op=None, engine=None, dtype=None, mask=None, **_):
    """``dst = op(data1, data2)`` elementwise (Vector Engine)."""
    new = len(args) >= 3 and all(isinstance(x, _T) for x in args[:3]) or dst is not None
    dst, data1, data2, op = _bind(args, new, dst=dst, data1=data1, data2=data2, op=op)
    if new:
        ops.tensor_tensor(dst, data1, data2, op, mask)
        return None
    out = _new(dtype or (data1.dtype if data1.buf.mem != "psum" else "float32"), data1.shape)
    ops.tensor_tensor(out, data1, data2, op, mask)
    return out


def tensor_scalar(*args, dst=None, data=None, op0=None, operand0=None, reverse0=False, op1=None, operand1=None,
                  reverse1=False, engine=None, dtype=None, mask=None, **_):
    """``dst = op1(op0(data, operand0), operand1)``; operands are numbers or [P, 1] columns."""
    new = (len(args) >= 2 and isinstance(args[0], _T) and isinstance(args[1], _T)) or dst is not None
    dst, data, op0, operand0 = _bind(args, new, dst=dst, data=data, op0=op0, operand0=operand0)
    out = dst if dst is not None else _new(dtype or (data.dtype if data.buf.mem != "psum" else "float32"), data.shape)
    ops.tensor_scalar(out, data, op0, operand0, reverse0, op1, operand1, reverse1, mask)
    return None if dst is not None else out


def tensor_scalar_reduce(*args, dst=None, data=None, op0=None, operand0=None, reduce_op=None, reduce_res=None,
                         reverse0=False, dtype=None, mask=None, **_):
    """``dst = op0(data, operand0)`` and ``reduce_res = reduce_op(dst)`` along free, one Vector instruction."""
    new = (len(args) >= 2 and isinstance(args[0], _T) and isinstance(args[1], _T)) or dst is not None
    dst, data, op0, operand0, reduce_op, reduce_res = _bind(args, new, dst=dst, data=data, op0=op0, operand0=operand0,
                                                            reduce_op=reduce_op, reduce_res=reduce_res)
    out = dst if dst is not None else _new(dtype or (data.dtype if data.buf.mem != "psum" else "float32"), data.shape)
    ops.tensor_scalar(out, data, op0, operand0, reverse0, mask=mask, reduce_op=reduce_op, reduce_res=reduce_res)
    return None if dst is not None else out


def _unary_new_or_legacy(emit, a, dst, data, out_shape, dtype):
    """The two call forms of a one-input instruction: ``f(dst, data)`` / ``f(dst=, data=)``, or ``out = f(data)``."""
    new = (len(a) >= 2 and isinstance(a[1], _T)) or dst is not None
    dst, data = _bind(a, new, dst=dst, data=data)
    if new:
        emit(dst, data)
        return None
    out = _new(dtype or ("float32" if data.buf.mem == "psum" else data.dtype), out_shape(data))
    emit(out, data)
    return out


def reciprocal(*args, dst=None, data=None, dtype=None, mask=None, **_):
    """``dst = 1 / data`` (Vector Engine RECIPROCAL)."""
    return _unary_new_or_legacy(ops.reciprocal, list(args), dst, data, lambda d: d.shape, dtype)


def bn_stats(*args, dst=None, data=None, dtype=None, mask=None, **_):
    """Per-partition (count, mean, var*count) of the even and odd elements: ``dst`` [P, 6]; data free <= 512."""
    return _unary_new_or_legacy(lambda o, d: ops.bn_stats(o, d, mask), list(args), dst, data,
                                lambda d: (d.partitions, 6), dtype or "float32")


def bn_aggr(*args, dst=None, data=None, dtype=None, mask=None, **_):
    """bn_stats records -> per-partition ``[mean, variance]``: ``dst`` [P, 2]."""
    return _unary_new_or_legacy(ops.bn_aggr, list(args), dst, data, lambda d: (d.partitions, 2),
                                dtype or "float32")


def max8(*args, dst=None, src=None, data=None, dtype=None, mask=None, **_):
    """The 8 largest values of each partition, descending: ``dst`` [P, 8] (Vector Engine)."""
    return _unary_new_or_legacy(ops.max8, list(args), dst, data if data is not None else src,
                                lambda d: (d.partitions, 8), dtype)


def nc_find_index8(*args, dst=None, data=None, vals=None, dtype=None, mask=None, **_):
    """Per partition, the first free index of ``data`` holding each of ``vals``' 8 values: ``dst`` [P, 8]."""
    dst, data, vals = _bind(args, len(args) == 3 or dst is not None, dst=dst, data=data, vals=vals)
    out = dst if dst is not None else _new(dtype or "uint32", (data.partitions, 8))
    ops.find_index8(out, data, vals)
    return None if dst is not None else out


def dma_transpose(*args, dst=None, src=None, axes=None, dge_mode=None, **_):
    """A DMA writing the 2-D ``src`` transposed: ``dst`` (new form) or a new SBUF tile (legacy)."""
    new = len(args) == 2 or dst is not None
    dst, src = _bind(args, new, dst=dst, src=src)
    if new:
        ops.dma_transpose(dst, src)
        return None
    out = _new(src.dtype, tuple(src.shape[::-1]))
    ops.dma_transpose(out, src)
    return out


def affine_select(*args, dst=None, pred=None, on_true_tile=None, on_false_value=None, dtype=None, mask=None, **_):
    """``pred ? on_true_tile : on_false_value`` with an affine predicate (GpSimd); both call forms."""
    new = bool(args and isinstance(args[0], _T)) or dst is not None
    dst, pred, on_true_tile, on_false_value = _bind(args, new, dst=dst, pred=pred, on_true_tile=on_true_tile,
                                                    on_false_value=on_false_value)
    out = dst if dst is not None else _new(dtype or on_true_tile.dtype, on_true_tile.shape)
    ops.affine_select(out, pred, on_true_tile, on_false_value)
    return None if dst is not None else out


def tensor_reduce(*args, dst=None, op=None, data=None, axis=None, negate=False, keepdims=False, dtype=None,
                  mask=None, **_):
    """``dst[p] = reduce(op)(data[p, ...])`` over the free axes (Vector Engine); dst is [P, 1]."""
    new = bool(args and isinstance(args[0], _T)) or dst is not None
    dst, op, data, axis = _bind(args, new, ("axis",), dst=dst, op=op, data=data, axis=axis)
    axis = axis if axis is not None else list(range(1, data.ndim))
    out = dst if dst is not None else _new(dtype or (data.dtype if data.buf.mem != "psum" else "float32"),
                                           (data.partitions, 1))
    ops.tensor_reduce(out, op, data, axis, negate, mask)
    return None if dst is not None else out


def tensor_copy(*args, dst=None, src=None, engine=None, dtype=None, mask=None, **_):
    """``dst = src`` with dtype conversion (Vector by default; ``engine=nisa.scalar_engine``)."""
    dst, src = _bind(args, len(args) == 2 or dst is not None, dst=dst, src=src)
    out = dst if dst is not None else _new(dtype or src.dtype, src.shape)
    ops.tensor_copy(out, src, _eng(engine), mask)
    return None if dst is not None else out


def iota(*args, dst=None, pattern=None, expr=None, offset=0, channel_multiplier=0, dtype=None, mask=None, **_):
    """``dst[p, f] = offset + p * channel_multiplier + f * step`` (GpSimd). Legacy: ``iota(expr, dtype)``
    with an ``nl.arange`` / ``nl.mgrid`` expression."""
    if (args and isinstance(args[0], _T)) or dst is not None:
        dst, pattern = _bind(args, True, ("pattern",), dst=dst, pattern=pattern)
        ops.iota(dst, pattern if pattern is not None else [[1, dst.free_size]], offset, channel_multiplier)
        return None
    expr, dtype = _bind(args, False, ("dtype",), expr=expr, dtype=dtype)
    dtype = dtype or "int32"
    shape = tuple(expr._pad(2).shape)
    out = _new(dtype, shape)
    ops.iota(out, expr)
    return out


def memset(*args, dst=None, shape=None, value=None, dtype=None, engine=None, mask=None, **_):
    """``dst = value`` (new) or a new ``shape`` tile of ``value`` (legacy)."""
    if (args and isinstance(args[0], _T)) or dst is not None:
        dst, value = _bind(args, True, dst=dst, value=value)
        ops.memset(dst, value)
        return None
    shape, value, dtype = _bind(args, False, ("dtype",), shape=shape, value=value, dtype=dtype)
    if dtype is None:
        raise NKIError(f"{where()}: legacy nisa.memset(shape, value, dtype) needs a dtype")
    out = _new(dtype, shape)
    ops.memset(out, value)
    return out


def dma_copy(*args, dst=None, src=None, mask=None, dst_rmw_op=None, oob_mode=None, dge_mode=None, engine=None,
             priority=None, **_):
    """Copy ``src`` to ``dst`` with a DMA (any of HBM and SBUF on either side)."""
    dst, src = _bind(args, True, dst=dst, src=src)
    ops.dma_copy(dst, src, mask, dst_rmw_op)


def _is_op(x) -> bool:
    return callable(x) or isinstance(x, str)


def _out_dtype(dtype, *tiles) -> str:
    """The legacy default result dtype: ``dtype``, else the first non-PSUM input's (PSUM values are fp32)."""
    return dtype or next((v.dtype for v in tiles if isinstance(v, _T) and v.buf.mem != "psum"), "float32")


def tensor_tensor_scan(*args, dst=None, data0=None, data1=None, initial=None, op0=None, op1=None, reverse0=False,
                       reverse1=False, dtype=None, mask=None, **_):
    """``dst[:, i] = op1(op0(data0[:, i], dst[:, i-1]), data1[:, i])`` starting from ``initial`` (Vector Engine);
    both call forms."""
    a = list(args)
    new = dst is not None or (len(a) >= 3 and all(isinstance(x, _T) for x in a[:3]) and (len(a) == 3
                                                                                         or not _is_op(a[3])))
    dst, data0, data1, initial, op0, op1 = _bind(a, new, dst=dst, data0=data0, data1=data1, initial=initial,
                                                 op0=op0, op1=op1)
    out = dst if new else _new(_out_dtype(dtype, data0, data1), data0.shape)
    ops_more.tensor_tensor_scan(out, data0, data1, initial, op0, op1, reverse0, reverse1, mask)
    return None if new else out


def scalar_tensor_tensor(*args, dst=None, data=None, op0=None, operand0=None, op1=None, operand1=None, reverse0=False,
                         reverse1=False, dtype=None, mask=None, **_):
    """``dst = op1(op0(data, operand0), operand1)`` in one Vector instruction; both call forms."""
    a = list(args)
    new = dst is not None or bool(a and isinstance(a[0], _T))
    dst, data, op0, operand0, op1, operand1 = _bind(a, new, dst=dst, data=data, op0=op0, operand0=operand0, op1=op1,
                                                    operand1=operand1)
    out = dst if new else _new(_out_dtype(dtype, data), data.shape)
    ops_more.scalar_tensor_tensor(out, data, op0, operand0, op1, operand1, reverse0, reverse1, mask)
    return None if new else out


def tensor_partition_reduce(*args, dst=None, op=None, data=None, dtype=None, mask=None, **_):
    """``dst[0, ...] = op`` over the partitions of ``data`` (GpSimd); legacy form returns a [1, ...] tile."""
    a = list(args)
    new = dst is not None or bool(a and isinstance(a[0], _T))
    dst, op, data = _bind(a, new, dst=dst, op=op, data=data)
    out = dst if new else _new(dtype or data.dtype, (1,) + tuple(data.shape[1:]))
    ops_more.partition_reduce(out, op, data)
    return None if new else out


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_op=None,
                  reverse_pred=False, name=None):
    """``dst = where(predicate, on_true, on_false)`` with an optional running max into ``reduce_res`` (Vector)."""
    ops_more.select_reduce(dst, predicate, on_true, on_false, reduce_res, reduce_cmd, reduce_op, reverse_pred)


def range_select(*args, dst=None, on_true_tile=None, comp_op0=None, comp_op1=None, bound0=None, bound1=None,
                 reduce_cmd=reduce_cmd.reset_reduce, reduce_res=None, reduce_op=None, range_start=0,
                 on_false_value=ops_more.FP32_MIN, dtype=None, **_):
    """Keep ``on_true_tile`` where ``bound0 cmp0 range_start + i cmp1 bound1`` along free, else FP32_MIN, with a
    running max (Vector, NeuronCore-v3+); both call forms."""
    a = list(args)
    new = dst is not None or (len(a) >= 2 and all(isinstance(x, _T) for x in a[:2]))
    dst, on_true_tile, comp_op0, comp_op1, bound0, bound1 = _bind(
        a, new, dst=dst, on_true_tile=on_true_tile, comp_op0=comp_op0, comp_op1=comp_op1, bound0=bound0, bound1=bound1)
    out = dst if new else _new(dtype or on_true_tile.dtype, on_true_tile.shape)
    ops_more.range_select(out, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd, reduce_res, reduce_op,
                     range_start, on_false_value)
    return None if new else out


def dropout(*args, dst=None, data=None, prob=None, dtype=None, mask=None, **_):
    """Zero each element of ``data`` with probability ``prob`` (Vector Engine PRNG); both call forms."""
    a = list(args)
    new = dst is not None or len(a) == 3 or (len(a) == 2 and prob is not None)
    dst, data, prob = _bind(a, new, dst=dst, data=data, prob=prob)
    out = dst if new else _new(dtype or data.dtype, data.shape)
    ops_more.dropout(out, data, prob, mask)
    return None if new else out


def set_rng_seed(src_seeds, name=None):
    """Seed the Vector Engine PRNG from a [1, 1] tile (the same seed, the same dropout masks)."""
    ops_more.rng_seed(src_seeds)


def local_gather(*args, dst=None, src_buffer=None, index=None, num_elem_per_idx=1, num_valid_indices=None, mask=None,
                 **_):
    """Gather ``num_elem_per_idx`` elements at each index within each 16-partition GpSimd core; both call forms
    (the legacy one returns a [P, num_valid_indices, num_elem_per_idx] tile)."""
    a = list(args)
    new = dst is not None or (len(a) >= 3 and all(isinstance(x, _T) for x in a[:3]))
    if new:
        dst = dst if dst is not None else a.pop(0)
    src_buffer = src_buffer if src_buffer is not None else a.pop(0)
    index = index if index is not None else a.pop(0)
    if a:
        num_elem_per_idx = a.pop(0)
    if a:
        num_valid_indices = a.pop(0)
    if not new:
        nv = index.free_size * 16 if num_valid_indices is None else int(num_valid_indices)
        dst = _new(src_buffer.dtype, (src_buffer.partitions, nv, int(num_elem_per_idx)))
    ops_more.local_gather(dst, src_buffer, index, num_elem_per_idx, num_valid_indices)
    return None if new else dst


def rng(dst, engine=None, name=None):
    """32 random bits per element of the integer tile ``dst``, its low bits kept (Vector Engine PRNG)."""
    if dst.dtype not in ("int8", "int16", "int32", "uint8", "uint16", "uint32"):
        raise NKIError(f"{where()}: nisa.rng writes an integer tile (int8/16/32, uint8/16/32), got {dst.dtype}")
    ops_more.rand(dst, bits=8 * ops.DTYPE_BYTES[dst.dtype])


def tensor_copy_predicated(*args, dst=None, src=None, predicate=None, reverse_pred=False, mask=None, **_):
    """``dst = src`` where ``predicate`` is non-zero (``reverse_pred``: where it is zero), ``dst`` kept elsewhere
    (Vector COPY_PREDICATED); ``src`` a tile of ``dst``'s size."""
    dst, src, predicate = _bind(args, True, dst=dst, src=src, predicate=predicate)
    if not isinstance(src, _T):
        raise NKIError(f"{where()}: tensor_copy_predicated with a number as src is not simulated; memset a tile first")
    if predicate.dtype not in ("uint8", "uint16", "uint32"):
        raise NKIError(f"{where()}: tensor_copy_predicated predicate must be uint8, uint16 or uint32, got "
                       f"{predicate.dtype}")
    if src.buf.mem == predicate.buf.mem == "psum":
        raise NKIError(f"{where()}: tensor_copy_predicated src and predicate cannot both reside in PSUM")
    ops.copy_predicated(dst, src, predicate, reverse=bool(reverse_pred))


def nc_match_replace8(*args, dst=None, data=None, vals=None, imm=None, dst_idx=None, dtype=None, mask=None, **_):
    """Replace the first occurrence of each of ``vals``' 8 values per partition of ``data`` with ``imm`` (Vector);
    both call forms (the legacy one returns the replaced tile)."""
    a = list(args)
    new = dst is not None or (len(a) >= 3 and all(isinstance(x, _T) for x in a[:3]))
    dst, data, vals, imm = _bind(a, new, dst=dst, data=data, vals=vals, imm=imm)
    out = dst if new else _new(dtype or data.dtype, data.shape)
    ops_more.match_replace8(out, data, vals, imm, dst_idx)
    return None if new else out


def nc_stream_shuffle(*args, src=None, dst=None, shuffle_mask=None, mask=None, **_):
    """Move partitions within each 32-partition quadrant: ``dst[i] = src[shuffle_mask[i]]`` (Vector)."""
    a = list(args)
    if dst is None and src is None and len(a) >= 2:     # the current form is (dst, src, mask)
        dst, src = a.pop(0), a.pop(0)
    src = src if src is not None else a.pop(0)
    dst = dst if dst is not None else a.pop(0)
    shuffle_mask = shuffle_mask if shuffle_mask is not None else a.pop(0)
    ops_more.stream_shuffle(dst, src, shuffle_mask)


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, name=None):
    """``reg = op1(op0(src[:, i], imm0), reg)``, ``dst[:, i] = reg`` on the Vector Engine."""
    ops_more.tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1, reduce_cmd)


def nc_n_gather(dst, data, indices, name=None):
    """``dst[p, j] = data[p, indices[p, j]]`` within each partition (GpSimd)."""
    ops_more.n_gather(dst, data, indices)


def sequence_bounds(*args, dst=None, segment_ids=None, dtype=None, **_):
    """The [start, end) of each element's segment (GpSimd); legacy form returns a [1, 2, n] tile."""
    a = list(args)
    new = dst is not None or len(a) == 2
    dst, segment_ids = _bind(a, new, dst=dst, segment_ids=segment_ids)
    out = dst if new else _new(dtype or segment_ids.dtype, (1, 2, segment_ids.free_size))
    ops_more.sequence_bounds(out, segment_ids)
    return None if new else out


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """Indices of the non-zero elements and their count, in partitions 0, 16, ..., 112 (GpSimd, NeuronCore-v3+)."""
    ops_more.nonzero_with_count(dst, src, index_offset, padding_val)


def tensor_copy_dynamic_src(*args, dst=None, src=None, dtype=None, engine=None, mask=None, **_):
    """``dst = src`` with ``src`` at an offset read from SBUF at run time (``t[ix, idx[0, j] + iy]``); both forms
    (legacy returns a new tile)."""
    a = list(args)
    new = dst is not None or len(a) == 2
    dst, src = _bind(a, new, dst=dst, src=src)
    out = dst if new else _new(dtype or src.dtype, src.shape)
    ops_more.tensor_copy_dynamic(out, src, "src")
    return None if new else out


def tensor_copy_dynamic_dst(*args, dst=None, src=None, dtype=None, engine=None, mask=None, **_):
    """``dst = src`` with ``dst`` at an offset read from SBUF at run time (``t[ix, idx[0, j] + iy]``)."""
    dst, src = _bind(args, True, dst=dst, src=src)
    ops_more.tensor_copy_dynamic(dst, src, "dst")


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=None, name=None):
    """``dst = sum(srcs)`` computed by a DMA engine (fp32), HBM or SBUF on either side."""
    ops_more.dma_compute(dst, srcs, reduce_op, scales)


def __getattr__(name):
    raise unsupported("nisa", name)
