"""The simulated NeuronCore ISA as data: opcodes, the engine that runs each, and the operand encoding.

Opcode names are the ones the real profiler shows (reference §3.5, §5.3: ``MATMUL``, ``LDWEIGHTS``,
``TENSOR_TENSOR``, ``ACTIVATE``, ``DMA_DIRECT2D``, ``EVENT_SEMAPHORE``...). The semantics of every
opcode are given by :mod:`neuron_stack.isa.interp`, which executes instruction streams on numpy tiles
and is the specification; docs/isa.md describes them for people.

Operands are *access patterns* over a named buffer, the way the hardware addresses SBUF, PSUM and
HBM: ``{"m": memory, "b": buffer, "dt": dtype, "o": element offset, "ap": [[stride, num], ...]}``.
For SBUF/PSUM the first ``[stride, num]`` pair is the partition dimension. Element ``(i0, i1, ...)``
lives at ``o + sum(i_k * stride_k)`` in the buffer, so permutes, slices, broadcasts (stride 0) and
im2col windows are all plain access patterns. An instruction's operands are one JSON object
(``operands`` column of the schedule table) so the table stays Arrow-friendly.

>>> ENGINE_OF["MATMUL"], ENGINE_OF["ACTIVATE"]
('tensor', 'scalar')
>>> fmt_operand({"m": "sbuf", "b": "x.0", "dt": "bfloat16", "o": 0, "ap": [[512, 128], [1, 512]]})
'sbuf:x.0@0[512,1][128,512]:bfloat16'
"""
from __future__ import annotations

#: opcode -> (engine, one-line meaning). Engines are traces.schema.ENGINES names.
OPCODES: dict[str, tuple[str, str]] = {
    # Tensor Engine (128x128 systolic array; reads SBUF, writes PSUM)
    "LDWEIGHTS": ("tensor", "load a stationary tile (<=128 partitions x <=128) into the PE array"),
    "MATMUL": ("tensor", "psum[dst] (+)= stationary.T @ moving (moving <=512 free); transpose when moving is identity"),
    # Vector Engine
    "TENSOR_TENSOR": ("vector", "dst = op(src0, src1) elementwise"),
    "TENSOR_SCALAR": ("vector", "dst = op1(op0(src, scalar0), scalar1); scalars immediate or per-partition"),
    "TENSOR_COPY": ("vector", "dst = src (with dtype conversion), e.g. PSUM evacuation"),
    "TENSOR_COPY_DYNAMIC": ("vector", "dst = src with the src (or dst) offset moved by stride x the value of src1"),
    "REDUCE": ("vector", "dst[p, 0] = reduce_op over the free axis of src[p, :]"),
    "BN_STATS": ("vector", "per-partition (count, mean, M2) of src (free size <= 512); 6-wide dst: even, odd elements"),
    "BN_AGGR": ("vector", "combine BN_STATS records into per-partition (mean, var)"),
    "RECIPROCAL": ("vector", "dst = 1 / src"),
    "MEMSET": ("vector", "dst = immediate value"),
    "COPY_PREDICATED": ("vector", "dst = where(mask != 0, src, dst)"),
    "MAX8": ("vector", "dst[p, :8] = the 8 largest values of src[p, :], descending"),
    "FIND_INDEX8": ("vector", "dst[p, j] = first free index of src[p, :] equal to vals[p, j]"),
    "TENSOR_SCAN": ("vector", "dst = inclusive scan (add or mult) of src along the free axis"),
    "TENSOR_TENSOR_SCAN": ("vector", "dst[:, i] = op1(op0(src0[:, i], dst[:, i-1] (initial at i=0)), src1[:, i])"),
    "SCALAR_TENSOR_TENSOR": ("vector", "dst = op1(op0(src0, scalar0), src1): a tensor_scalar then a tensor_tensor"),
    "SELECT_REDUCE": ("vector", "dst = where(pred != 0, on_true, on_false); optional running max (accumulators)"),
    "RANGE_SELECT": ("vector", "dst = where(cmp0(i, bound0) & cmp1(i, bound1), src, fill) over free index i; "
                               "running max"),
    "DROPOUT": ("vector", "dst = src where the engine PRNG's uniform draw >= prob, else 0"),
    "MATCH_REPLACE8": ("vector", "dst = src0 with the first occurrence of each of src1's 8 values per partition "
                                 "replaced by imm; dst[1] = their indices"),
    "SHUFFLE": ("vector", "dst[q*32 + i] = src0[q*32 + mask[i]] within each 32-partition quadrant (255: unchanged)"),
    "TENSOR_SCALAR_CUMULATIVE": ("vector", "reg = op1(op0(src0[:, i], imm0), reg); dst[:, i] = reg (accumulator "
                                           "registers per reduce_cmd)"),
    "RAND": ("vector", "dst = uniform [0, 1) draws of the engine PRNG (nl.rand), or 32 random bits (nisa.rng)"),
    "RNG_SEED": ("vector", "seed the Vector Engine PRNG (nl.random_seed)"),
    "TRANSPOSE": ("vector", "dst = src.T for a tile of at most 32 x 32 (NKI nc_transpose on the Vector Engine)"),
    # Scalar Engine
    "ACTIVATE": ("scalar", "dst = func(src * scale + bias); optional accumulate of dst along free into acc"),
    # GpSimd Engine
    "IOTA": ("gpsimd", "dst[p, f] = base + p * channel_multiplier + f * step"),
    "N_GATHER": ("gpsimd", "dst[p, j] = src0[p, src1[p, j]] over src0's flattened free elements"),
    "SEQUENCE_BOUNDS": ("gpsimd", "dst[0, 0/1, i] = start / end index of the segment holding element i (id 0: n, -1)"),
    "NONZERO_WITH_COUNT": ("gpsimd", "in partitions 0, 16, ..., 112: indices of the non-zero elements + offset, "
                                     "padding, then their count"),
    "GATHER": ("gpsimd", "indirect load: dst[p, :] = table[index[p], :] (DMA descriptors generated on GpSimd)"),
    "AFFINE_SELECT": ("gpsimd", "dst = where(affine(p, f) cmp 0, src, fill)"),
    "PARTITION_REDUCE": ("gpsimd", "dst[0, :] = reduce_op over the partitions of src"),
    "LOCAL_GATHER": ("gpsimd", "per 16-partition core: dst[p, j, :] = src[p, idx_j : idx_j + k] over the core's "
                               "indices"),
    "CUSTOM_OP": ("gpsimd", "a GpSimd library kernel for an ATen op without a dedicated lowering"),
    # DMA and sync
    "DMA_DIRECT2D": ("dma", "copy src access pattern -> dst access pattern (element order), with descriptors; "
                            "with side, that operand's start moved by stride x the value of src1 (dynamic start)"),
    "DMA_COMPUTE": ("dma", "dst = src0 + src1 + ... (the DMA engine's fp32 adder, nisa.dma_compute)"),
    "DMA_INDIRECT": ("dma", "row gather: dst[i, :] = src[index[i], :]"),
    "EVENT_SEMAPHORE": ("sync", "wait on / signal a semaphore"),
    # Collectives
    "CC_ALL_REDUCE": ("cc", "all-reduce (Mesh/RDH/KangaRing/Ring by size, collective_cost)"),
    "CC_ALL_GATHER": ("cc", "all-gather (Mesh/RDH/KangaRing/Ring by size, collective_cost)"),
    "CC_REDUCE_SCATTER": ("cc", "reduce-scatter (Mesh/RDH/KangaRing/Ring by size, collective_cost)"),
    "CC_WAIT": ("cc", "wait for a collective to complete"),
}

ENGINE_OF: dict[str, str] = {op: eng for op, (eng, _) in OPCODES.items()}

#: ALU operators of TENSOR_TENSOR / TENSOR_SCALAR (nki.language names). Semantics in interp.ALU.
ALU_OPS = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "mod", "fmod",
           "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
           "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
           "rsub", "rdivide", "atan2", "hypot", "copysign", "floor_divide", "bypass", "left_shift", "right_shift",
           "abs", "rsqrt", "reciprocal")

#: Scalar-engine activation functions (lookup tables). Semantics in interp.ACT_FUNCS.
ACT_FUNCS = ("copy", "identity", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp", "log",
             "sqrt", "rsqrt", "square", "erf", "sin", "cos", "abs", "sign", "softplus", "reciprocal",
             "neg", "exp2", "log2", "log1p", "expm1", "floor", "ceil", "round", "trunc", "tan", "arctan", "mish",
             "gelu_apprx_sigmoid", "gelu_dx", "gelu_apprx_sigmoid_dx", "silu_dx", "erf_dx")

#: Reduction operators of REDUCE / ACTIVATE accumulate.
REDUCE_OPS = ("add", "max", "min", "multiply", "logical_or", "logical_and")

def dma_queue_name(idx: int, purpose: str = "IO", trigger: str = "Sync") -> str:
    """Queue names as the profiler spells them: ``q<TriggerEngine><Purpose><idx>``.

    >>> dma_queue_name(3), dma_queue_name(0, "SpillReload")
    ('qSyncIO3', 'qSyncSpillReload0')
    """
    return f"q{trigger}{purpose}{idx}"


def fmt_operand(op: dict) -> str:
    """A compact human form of an operand, shown in the Explorer's instruction details.

    Example: ``fmt_operand({"m":"hbm","b":"x","dt":"float32","o":4,"ap":[[1,8]]}) == 'hbm:x@4[1][8]:float32'``.
    """
    steps = ",".join(str(s) for s, _ in op["ap"])
    nums = ",".join(str(n) for _, n in op["ap"])
    return f"{op['m']}:{op['b']}@{op['o']}[{steps}][{nums}]:{op['dt']}"
