"""Device profiles: the hardware numbers of trn1, inf2 and trn2 as data, each with its source.

Every constant the cost model uses lives here, never in code. ``metadata()`` publishes a profile
under the real profiler's Metadata field names (reference §3.8) with ``is_simulation = true``.

>>> p = get_profile("trn1")
>>> round(p.tensor_peak_flops("bfloat16") / 1e12, 1)
91.8
>>> get_profile("trn2").cores_per_chip, get_profile("trn2", lnc=1).cores_per_chip
(4, 8)
"""
from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, field, replace

_ARCH = "SDK nki/guides/architecture/trainium_inferentia2_arch.rst"
_ARCH3 = "SDK nki/guides/architecture/trainium2_arch.rst"
_DMA = "SDK nki/deep-dives/nki-dma-bandwidth-guide.rst"
_HW = "SDK about-neuron/arch/neuron-hardware/{trn1,trn2,inferentia2}-arch.rst"
_CC = "SDK neuron-runtime/explore/{intranode,internode}-collective-comm.rst"
_LNC = "SDK about-neuron/arch/neuron-features/logical-neuroncore-config.rst"


@dataclass(frozen=True)
class DeviceProfile:
    """One simulated device generation and the instance it comes in (reference §5.1)."""

    name: str                      # trn1 | inf2 | trn2
    instance_type: str             # the instance simulated by default
    neuroncore_version: str        # v2 | v3d (as neuron-top titles it)
    neuron_device_type: str        # as neuron-monitor's neuron_hardware_info
    neuron_device_version: str
    chips_per_instance: int
    cores_per_chip: int            # logical NeuronCores per chip
    # Logical NeuronCore configuration: physical cores per logical core, and the degrees the chip
    # supports (LNC=2 default on trn2, 1 elsewhere; _LNC). Every per-engine and per-queue figure below
    # is one physical core's; a logical core has ``lnc`` of each engine and ``lnc`` x 16 DMA queues.
    lnc: int = 1
    lnc_choices: tuple = (1,)
    # Tensor Engine
    pe_rows: int = 128
    pe_cols: int = 128
    tensor_clock_ghz: float = 2.8
    mm_init_latency_cycles: int = 64      # back-to-back MATMUL II floor: max(N_moving, 64)
    fp32_matmul_factor: int = 4           # FP32 matmuls run 4x slower than BF16
    ldweights_speedup: int = 4            # LoadStationary up to 4x faster than an MM of same size
    # Vector / Scalar / GpSimd
    vector_clock_ghz: float = 1.12
    vector_lanes: int = 128
    scalar_clock_ghz: float = 1.4
    scalar_lanes: int = 128
    gpsimd_clock_ghz: float = 1.4
    min_ii_cycles: int = 64               # Vector/Scalar max(MIN_II, N)
    dependent_overhead_cycles: int = 100  # dependent back-to-back small instructions
    reciprocal_cycles_per_elem: int = 8   # Vector reciprocal costs 8N
    bn_aggr_cycles_num: int = 13          # bn_aggr costs 13*N/3
    bn_aggr_cycles_den: int = 3
    accumulate_cycles: int = 64           # activation_reduce / ActReadAccumulator adds MIN_II
    vector_perf_copy: int = 1             # v3 performance mode: 4x bf16 tensor_copy/tensor_scalar
    vector_perf_other: int = 1            # v3 performance mode: 2x other bf16 Vector instructions
    gpsimd_start_cycles: int = 150        # GpSimd 150 + N
    neuroncore_clock_ghz: float = 1.4
    # On-chip memory
    partitions: int = 128
    sbuf_bytes_per_partition: int = 192 * 1024
    psum_bytes_per_partition: int = 16 * 1024
    psum_banks: int = 8
    psum_bank_fp32: int = 512             # gemm moving free size limit = one PSUM bank
    # DMA and HBM
    dma_engines_per_core: int = 16
    dma_bytes_per_ns_per_engine: float = 17.0   # 272 GB/s per NC
    # one engine's theoretical rate (NKI DMA overview: 27.2 GB/s on NeuronCore-v2 and -v3): the bound on the wider,
    # SBUF side of a casting load (an int8 weight DMA'd into bf16), whose HBM side moves at the rate above
    dma_engine_peak_bytes_per_ns: float = 27.2
    dma_fixed_ns: float = 1300.0                 # descriptor + sync + semaphore overhead
    dma_desc_overhead_bytes: int = 256           # per-descriptor cost in byte-times (calibrated, see docs)
    hbm_bytes_per_chip: int = 32 * 2**30
    hbm_gbps_per_chip: float = 820.0
    hbm_stacks_per_chip: int = 2
    # Interconnect and host
    neuronlink_gbps_per_chip: float = 384.0     # NeuronLink-v2, 4 links x 96 GB/s
    efa_gbps_per_instance: float = 100.0        # 800 Gbps EFA on trn1.32xlarge
    pcie_gbps: float = 32.0                     # host <-> device (PCIe Gen4 x16 ~ 32 GB/s)
    neuronlink_topology: str = "torus"          # chips of the instance: 4x4 2D torus (trn1, trn2) or ring (inf2)
    # Latency of one collective step (device/collective_cost.py): within an instance, the middle of the
    # intra-node collectives page's "per-hop latency of Ring/KangaRing is about 1-2 us (HBM load dependent)";
    # between instances, the inter-node page's "per-hop or point-to-point latency is ~15us" (EFA).
    intranode_step_latency_ns: float = 1500.0
    internode_step_latency_ns: float = 15000.0
    throttle: bool = False                      # TensorE ramps from 50% over ~3 us (trn2)
    throttle_ramp_ns: float = 3000.0
    sources: dict = field(default_factory=dict, compare=False)

    @property
    def physical_cores_per_chip(self) -> int:
        return self.cores_per_chip * self.lnc

    @property
    def logical_sbuf_bytes_per_partition(self) -> int:
        """SBUF bytes per partition a compiled graph's logical core may fill: every physical core's SBUF (LNC
        combines "the compute and memory resources of multiple physical NeuronCores into a single logical
        NeuronCore", SDK logical-neuroncore-config.rst), so a trn2 LNC=2 core holds 2 x 224 KiB a partition.
        The lowering sees it as one SBUF (docs/cost_model.md, LNC: what that leaves out); an NKI kernel runs
        on one physical core and gets ``sbuf_bytes_per_partition``.

        >>> [get_profile(t).logical_sbuf_bytes_per_partition // 1024 for t in ("trn2", "trn1")]
        [448, 192]
        """
        return self.lnc * self.sbuf_bytes_per_partition

    @property
    def dma_queues(self) -> int:
        """DMA queues of one logical core: every physical core's 16."""
        return self.lnc * self.dma_engines_per_core

    @property
    def cores_per_instance(self) -> int:
        return self.chips_per_instance * self.cores_per_chip

    @property
    def hbm_bytes_per_core(self) -> int:
        return self.hbm_bytes_per_chip // self.cores_per_chip

    @property
    def hbm_bytes_per_ns_per_core(self) -> float:
        return self.hbm_gbps_per_chip / self.cores_per_chip

    @property
    def dma_bytes_per_ns(self) -> float:
        """DMA bandwidth of one physical core (its 16 engines)."""
        return self.dma_engines_per_core * self.dma_bytes_per_ns_per_engine

    def tensor_peak_flops(self, dtype: str = "bfloat16") -> float:
        """Peak Tensor Engine FLOP/s of one physical core for ``dtype`` (FP32 runs at 1/4); a logical
        core has ``lnc`` times this."""
        peak = 2 * self.pe_rows * self.pe_cols * self.tensor_clock_ghz * 1e9
        return peak / self.fp32_matmul_factor if dtype == "float32" else peak

    def hardware_info(self) -> dict:
        """neuron-monitor's ``neuron_hardware_info`` for this profile's default instance (live snapshots,
        and a profile's metadata, so a replay reports the same devices as the live monitor).

        >>> get_profile("inf2").hardware_info()["neuron_device_count"]
        12
        """
        return {"neuron_device_type": self.neuron_device_type, "neuron_device_version": self.neuron_device_version,
                "neuroncore_version": self.neuroncore_version, "neuron_device_count": self.chips_per_instance,
                "neuron_device_memory_size": self.hbm_bytes_per_chip,
                "neuroncore_per_device_count": self.cores_per_chip,
                "logical_neuroncore_config": self.lnc}

    def metadata(self) -> dict[str, str]:
        """Metadata rows under the real profiler's names (reference §3.8), all strings."""
        rows = {**self.hardware_info(),
            "instance_type": self.instance_type, "is_simulation": "true",
            "device_profile": self.name, "neuroncore_version": self.neuroncore_version,
            "num_physical_cores": self.lnc, "vnc_enabled": str(self.lnc > 1).lower(),
            "dma_ddr_bandwidth": self.dma_bytes_per_ns, "num_dma_engines_per_neuroncore": self.dma_engines_per_core,
            # ours: a DMA's trigger-to-start latency, not in its duration (tells latency- from bandwidth-bound)
            "dma_fixed_latency_ns": self.dma_fixed_ns,
            "hbm_ddr_bandwidth": self.hbm_gbps_per_chip / self.hbm_stacks_per_chip,
            "tensor_engine_num_rows": self.pe_rows, "tensor_engine_num_cols": self.pe_cols,
            "tensor_engine_clock_freq": self.tensor_clock_ghz, "vector_engine_clock_freq": self.vector_clock_ghz,
            "scalar_engine_clock_freq": self.scalar_clock_ghz, "gpsimd_engine_clock_freq": self.gpsimd_clock_ghz,
            "vector_engine_num_channels": self.vector_lanes, "scalar_engine_num_channels": self.scalar_lanes,
            "neuroncore_clock_freq": self.neuroncore_clock_ghz, "ticks_per_nanosec": 1,
            # MFU's denominator: the logical core's PE arrays (LNC=2: two), so MFU stays <= 100%
            "tensor_engine_peak_bf16_flops": self.lnc * self.tensor_peak_flops("bfloat16"),
            "hbm_bytes_per_core": self.hbm_bytes_per_core,
            # ours: what SbufUsage / PsumUsage divide by, and the Tensor Engine limiter Throttle rows follow
            "sbuf_bytes_per_partition": self.sbuf_bytes_per_partition,
            "psum_bytes_per_partition": self.psum_bytes_per_partition, "psum_banks": self.psum_banks,
            "tensor_engine_throttle_ramp_ns": self.throttle_ramp_ns if self.throttle else 0,
        }
        return {k: str(v) for k, v in rows.items()}

    def as_dict(self) -> dict:
        return asdict(self)


_COMMON_SOURCES = {"tensor": _ARCH, "vector": _ARCH, "dma": _DMA, "hbm": _HW, "collectives": _CC,
                   "cost_formulas": "SDK nki isa docstrings (reference §5.4)"}

PROFILES: dict[str, DeviceProfile] = {
    "trn1": DeviceProfile(
        name="trn1", instance_type="trn1.32xlarge", neuroncore_version="v2",
        neuron_device_type="trainium", neuron_device_version="v2",
        chips_per_instance=16, cores_per_chip=2, sources=_COMMON_SOURCES),
    "inf2": DeviceProfile(
        name="inf2", instance_type="inf2.48xlarge", neuroncore_version="v2",
        neuron_device_type="inferentia2", neuron_device_version="v2",
        chips_per_instance=12, cores_per_chip=2, neuronlink_gbps_per_chip=192.0, neuronlink_topology="ring",
        efa_gbps_per_instance=12.5, sources=_COMMON_SOURCES),
    "trn2": DeviceProfile(
        name="trn2", instance_type="trn2.48xlarge", neuroncore_version="v3d",
        neuron_device_type="trainium2", neuron_device_version="v4",
        # LNC=2 (default): 8 physical NC-v3 per chip exposed as 4 logical cores (reference §4.4, _LNC)
        chips_per_instance=16, cores_per_chip=4, lnc=2, lnc_choices=(1, 2),
        tensor_clock_ghz=2.4, vector_clock_ghz=0.96, scalar_clock_ghz=1.2, gpsimd_clock_ghz=1.2,
        neuroncore_clock_ghz=1.2, sbuf_bytes_per_partition=224 * 1024,
        dma_bytes_per_ns_per_engine=23.0, hbm_bytes_per_chip=96 * 2**30, hbm_gbps_per_chip=2900.0,
        hbm_stacks_per_chip=4, neuronlink_gbps_per_chip=1280.0, efa_gbps_per_instance=400.0,
        vector_perf_copy=4, vector_perf_other=2,
        throttle=True, sources={**_COMMON_SOURCES, "tensor": _ARCH3, "lnc": _LNC}),
}


def get_profile(name: str, lnc: int | None = None) -> DeviceProfile:
    """The profile named ``name`` (trn1, inf2, trn2) at Logical NeuronCore degree ``lnc`` (default:
    ``NEURON_LOGICAL_NC_CONFIG`` where the chip supports LNC, else the profile's own). Raises
    ``ValueError`` naming the choices.

    >>> p = get_profile("trn2", lnc=1)
    >>> p.lnc, p.cores_per_instance, p.neuroncore_version, p.hbm_bytes_per_core // 2**30
    (1, 128, 'v3', 12)
    """
    try:
        p = PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}: choose one of {', '.join(PROFILES)}") from None
    n = lnc if lnc is not None else lnc_from_env(p)
    if n == p.lnc:
        return p
    if n not in p.lnc_choices:
        raise ValueError(f"logical NeuronCore config {n} is not supported on {name}: use "
                         f"{' or '.join(map(str, p.lnc_choices))} (logical-neuroncore-config.rst)")
    return _regrouped(name, n)


@functools.cache
def _regrouped(name: str, lnc: int) -> DeviceProfile:
    """``name``'s chip with its physical cores grouped ``lnc`` per logical core (one object per degree)."""
    p = PROFILES[name]
    return replace(p, lnc=lnc, cores_per_chip=p.physical_cores_per_chip // lnc,
                   neuroncore_version=p.neuroncore_version.removesuffix("d") if lnc == 1 else p.neuroncore_version)


def lnc_from_env(p: DeviceProfile) -> int:
    """``NEURON_LOGICAL_NC_CONFIG`` (1 or 2) for a chip that supports LNC, else ``p.lnc``; a bad value
    is a one-line ``ValueError``. Example: ``lnc_from_env(get_profile("trn1")) == 1``."""
    raw = os.environ.get("NEURON_LOGICAL_NC_CONFIG", "")[:16].strip()
    if not raw or len(p.lnc_choices) == 1:
        return p.lnc            # LNC applies to trn2 only; trn1/inf2 ignore it as the runtime does
    if raw not in ("1", "2"):
        raise ValueError(f"NEURON_LOGICAL_NC_CONFIG={raw!r} is not a logical NeuronCore config: set 1 or 2, "
                         "or unset it for the default (2 on trn2)")
    return int(raw)
