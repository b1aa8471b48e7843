"""Instruction emitters for the rest of the ISA, beside :mod:`neuron_stack.nki.ops` (the core compute
and DMA emitters whose rule checks these reuse): scans, selects with the Vector Engine's accumulator,
random numbers and dropout, GpSimd gathers and partition reductions, shuffles and dynamic copies.
Same contract: check the tile rules (naming the kernel line), apply a mask, record with a cost from
:mod:`neuron_stack.device.cost`.

>>> _reduce_cmd("reset_reduce")
'reset_reduce'
"""
from __future__ import annotations

import math

from neuron_stack.device.cost import gpsimd_ns, local_gather_ns, vector_ns

from .core import DTYPE_BYTES, FLOATS, NKIError, current, ndarray, where
from .ops import _arith, _name, _rev, _scalar_arg, masked, on_chip, resolve_alu, resolve_reduce

_INTS = ("int32", "int16", "int8", "uint32", "uint16", "uint8", "bool")
_CMP = ("equal", "less", "less_equal", "greater", "greater_equal")


def _not_both_psum(a: ndarray, b: ndarray, name: str) -> None:
    if a.buf.mem == b.buf.mem == "psum":
        raise NKIError(f"{where()}: {name} inputs cannot both reside in PSUM; copy one to SBUF (nisa.tensor_copy)")


def _same_size(dst: ndarray, srcs: list, name: str) -> None:
    for s in srcs:
        if s.partitions != dst.partitions or s.free_size != dst.free_size:
            raise NKIError(f"{where()}: {name} operand {s.shape} must have the partitions and elements per partition "
                           f"of {dst.shape}")


def _two_tiles(name: str, dst: ndarray, a: tuple, b: tuple, psum_what: str) -> None:
    """The rules of a Vector instruction reading two full tiles ``a`` and ``b`` (each ``(tile, its name)``):
    all on chip, not both in PSUM, the size of ``dst``."""
    for v, what in ((dst, "dst"), a, b):
        on_chip(v, f"{name} {what}")
    _not_both_psum(a[0], b[0], psum_what)
    _same_size(dst, [a[0], b[0]], name)


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
    _two_tiles("tensor_tensor_scan", dst, (data0, "data0"), (data1, "data1"), "tensor_tensor_scan")
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
    _two_tiles("scalar_tensor_tensor", dst, (data, "data"), (operand1, "operand1"),
               "scalar_tensor_tensor data and operand1")
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
    _two_tiles("select_reduce", dst, (predicate, "predicate"), (on_true, "on_true"),
               "select_reduce on_true and predicate")
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
