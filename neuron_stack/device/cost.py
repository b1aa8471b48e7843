"""The engine-level cost model: how long one instruction occupies its engine or DMA queue.

Every formula is from reference §5.4 (NKI ISA docstrings, architecture and DMA guides) and every
constant comes from the :class:`~neuron_stack.device.profiles.DeviceProfile`; docs/cost_model.md lists each
formula with its source. Costs are in nanoseconds on the projected (simulated device) clock.

>>> from neuron_stack.device.profiles import get_profile
>>> p = get_profile("trn1")
>>> round(matmul_ns(p, n_moving=512, n_stationary=128, dtype="bfloat16"), 1)   # 512 cycles at 2.8 GHz
182.9
>>> round(matmul_ns(p, n_moving=16, n_stationary=128, dtype="bfloat16"), 1)    # floor of 64 cycles
22.9
>>> round(vector_ns(p, "TENSOR_TENSOR", n=1000, n_inputs=2), 1)                  # 2N at 1.12 GHz
1785.7
"""
from __future__ import annotations

from neuron_stack.device.profiles import DeviceProfile

_LOW_PRECISION = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def matmul_ns(p: DeviceProfile, n_moving: int, n_stationary: int, dtype: str) -> float:
    """One MATMUL (MultiplyMoving): ``max(min(64, N_stationary), N_moving)`` TensorE cycles, x4 for FP32.

    Example: ``matmul_ns(get_profile("trn1"), 512, 128, "float32")`` is 4x the bf16 time.
    """
    cycles = max(min(p.mm_init_latency_cycles, n_stationary), n_moving)
    if dtype not in _LOW_PRECISION:
        cycles *= p.fp32_matmul_factor
    return cycles / p.tensor_clock_ghz


def ldweights_ns(p: DeviceProfile, n_stationary: int, dtype: str) -> float:
    """LDWEIGHTS (LoadStationary): up to 4x faster than a MATMUL with the same free size.

    Example: ``ldweights_ns(get_profile("trn1"), 128, "bfloat16")`` -> 32 cycles at 2.8 GHz.
    """
    cycles = max(p.mm_init_latency_cycles, n_stationary) / p.ldweights_speedup
    if dtype not in _LOW_PRECISION:
        cycles *= p.fp32_matmul_factor
    return cycles / p.tensor_clock_ghz


def vector_ns(p: DeviceProfile, opcode: str, n: int, n_inputs: int = 1, dtype: str = "float32",
              fast: bool = False, alu: str = "", accumulate: bool = False) -> float:
    """A Vector Engine instruction over ``n`` elements per partition (all 128 lanes cost the same).

    One input ``max(MIN_II, N)``; two inputs ``max(MIN_II, 2N)`` unless ``fast`` (one input in PSUM,
    or both bf16 in SBUF with add/mul/sub) which costs N; SCALAR_TENSOR_TENSOR likewise (N when ``fast``:
    bf16 subtract-then-multiply, even N); REDUCE ``N`` (N/2 for bf16 add/max); RECIPROCAL ``8N``; BN_AGGR
    ``13N/3``; TENSOR_SCAN / TENSOR_TENSOR_SCAN ``2N``; TENSOR_COPY_DYNAMIC ``max(600, N)``; SELECT_REDUCE reads
    two tiles (``2N``);
    ``accumulate`` (a reduce result read out of the accumulators, as tensor_scalar_reduce) adds MIN_II.
    On NC-v3 bf16 runs in performance mode (2x, 4x for copies).
    Example: ``vector_ns(get_profile("trn1"), "REDUCE", 512)`` = 512 cycles at 1.12 GHz.
    """
    lp = dtype in _LOW_PRECISION
    if opcode in ("TENSOR_TENSOR", "SCALAR_TENSOR_TENSOR"):
        cycles = n if fast else 2 * n
    elif opcode == "REDUCE":
        cycles = n / 2 if lp and alu in ("add", "max") else n
    elif opcode == "RECIPROCAL":
        cycles = p.reciprocal_cycles_per_elem * n
    elif opcode == "BN_AGGR":
        cycles = p.bn_aggr_cycles_num * n / p.bn_aggr_cycles_den
    elif opcode == "TENSOR_COPY_DYNAMIC":       # MIN_II_DYNAMIC ~ 600 cycles (tensor_copy_dynamic_src/dst docstrings)
        cycles = max(600, n)
    elif opcode in ("TENSOR_SCAN", "TENSOR_TENSOR_SCAN"):
        cycles = 2 * n
    else:  # TENSOR_SCALAR, TENSOR_COPY, BN_STATS, MEMSET, COPY_PREDICATED, MAX8, FIND_INDEX8, RANGE_SELECT, DROPOUT
        cycles = n * max(1, n_inputs) if opcode in ("COPY_PREDICATED", "SELECT_REDUCE") else n
    cycles = max(p.min_ii_cycles, cycles) + (p.min_ii_cycles if accumulate else 0)
    return cycles / vector_perf_mode(p, opcode, dtype) / p.vector_clock_ghz


def vector_perf_mode(p: DeviceProfile, opcode: str, dtype: str) -> int:
    """The Vector Engine's performance mode for an instruction: 1, or on NC-v3 for low precision 4 (copies)
    or 2 (the rest); ``vector_ns`` divides its cycles by it and the profile's ``Instruction.performance_mode``
    shows it. Example: ``vector_perf_mode(get_profile("trn2"), "TENSOR_COPY", "bfloat16")`` = 4."""
    if dtype not in _LOW_PRECISION:
        return 1
    return p.vector_perf_copy if opcode in ("TENSOR_COPY", "TENSOR_SCALAR", "MEMSET") else p.vector_perf_other


def scalar_ns(p: DeviceProfile, n: int, accumulate: bool = False) -> float:
    """ACTIVATE: ``max(MIN_II, N)`` ScalarE cycles, plus MIN_II when it also accumulates along free.

    Example: ``scalar_ns(get_profile("trn1"), 512, accumulate=True)`` = 576 cycles at 1.4 GHz.
    """
    cycles = max(p.min_ii_cycles, n) + (p.accumulate_cycles if accumulate else 0)
    return cycles / p.scalar_clock_ghz


def gpsimd_ns(p: DeviceProfile, n: int) -> float:
    """A GpSimd instruction: ``GPSIMD_START + N`` cycles (iota, affine_select, local_gather).

    Example: ``gpsimd_ns(get_profile("trn1"), 50)`` = 200 cycles at 1.4 GHz.
    """
    return (p.gpsimd_start_cycles + n) / p.gpsimd_clock_ghz


def local_gather_ns(p: DeviceProfile, num_valid_indices: int, num_elem_per_idx: int, dtype_bytes: int) -> float:
    """``nisa.local_gather``: ``150 + (num_valid_indices * num_elem_per_idx) / C`` GpSimd cycles with
    ``C = ((28 + t*k) / (t*k)) / min(4 / dtype_size, k)``, ``t = 4`` (legacy local_gather docstring, §5.4).

    Example: ``local_gather_ns(get_profile("trn1"), 64, 4, 4)`` = 150 + 256 / (44/16) cycles at 1.4 GHz.
    """
    k, t = num_elem_per_idx, 4
    c = ((28 + t * k) / (t * k)) / min(4 / dtype_bytes, k)
    return (p.gpsimd_start_cycles + num_valid_indices * k / c) / p.gpsimd_clock_ghz


def dependent_overhead_ns(p: DeviceProfile, engine: str) -> float:
    """Static overhead of a small instruction that depends on the one just before it (~100 cycles)."""
    clock = {"vector": p.vector_clock_ghz, "scalar": p.scalar_clock_ghz, "gpsimd": p.gpsimd_clock_ghz,
             "tensor": p.tensor_clock_ghz}.get(engine, p.neuroncore_clock_ghz)
    return p.dependent_overhead_cycles / clock


def dma_ns(p: DeviceProfile, nbytes: int, n_desc: int) -> float:
    """One DMA on one queue: fixed ~1.3 us + per-descriptor cost + bytes at one DMA engine's rate.

    A descriptor moves one contiguous chunk (per partition at least), so small chunks are
    overhead-bound and chunks of 4 KiB or more run near the engine's peak (DMA guide).
    Example: ``dma_ns(get_profile("trn1"), 128 * 4096, 128)`` ~ 1.3 us + 32.8 us.
    """
    rate = p.dma_bytes_per_ns_per_engine
    return p.dma_fixed_ns + (nbytes + n_desc * p.dma_desc_overhead_bytes) / rate


def dma_min_piece_bytes(p: DeviceProfile) -> int:
    """The smallest piece a transfer is cut into when it is spread over the core's DMA queues: a piece
    whose bytes take several times the fixed cost on one engine (a finer cut changes the transfer's
    latency by less than the fixed cost it already pays once, and only multiplies instructions).

    The DMA overview (SDK nki/about/nki-dma-overview.rst) spreads each transfer over up to 16 engines,
    8 SBUF partitions each; :func:`neuron_stack.compiler.lower.tiles.split_dma` cuts on those groups.
    Example: ``dma_min_piece_bytes(get_profile("trn1"))`` = 1300 ns x 17 B/ns = 22100.
    """
    return int(p.dma_fixed_ns * p.dma_bytes_per_ns_per_engine)


def dma_efficiency(p: DeviceProfile, bytes_per_partition: int, partitions: int = 128,
                   transfers_in_flight: int | None = None) -> float:
    """Achieved / peak DMA bandwidth for back-to-back transfers of ``partitions x bytes_per_partition``
    spread over every queue of the core (the fixed cost of one transfer overlaps the others').

    Example: ``dma_efficiency(get_profile("trn1"), 64) < 0.3 < 0.9 < dma_efficiency(get_profile("trn1"), 4096)``.
    """
    total = bytes_per_partition * partitions
    t = (total + partitions * p.dma_desc_overhead_bytes) / p.dma_bytes_per_ns_per_engine
    return (total / p.dma_bytes_per_ns_per_engine) / t


def pcie_ns(p: DeviceProfile, nbytes: int) -> int:
    """Host <-> device transfer over PCIe (a CPU-fallback seam, charged by the runtime): one DMA's
    fixed cost plus the bytes at the PCIe rate. Example: 32 KB -> ~2.3 us on trn1 (1.3 + 1.0)."""
    return int(p.dma_fixed_ns + nbytes / p.pcie_gbps)


def throttle_factor(p: DeviceProfile, ns_since_ramp_start: float) -> float:
    """TensorE throughput fraction under throttling: 50% rising linearly to 100% over the ramp (trn2).

    Example: ``throttle_factor(get_profile("trn2"), 0.0) == 0.5``; always 1.0 on trn1.
    """
    if not p.throttle:
        return 1.0
    return 0.5 + 0.5 * min(1.0, max(0.0, ns_since_ramp_start) / p.throttle_ramp_ns)


def ceil_div(a: int, b: int) -> int:
    """Integer ceiling division (tile counts)."""
    return -(-a // b)


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("annotations", "math", "DeviceProfile")]
