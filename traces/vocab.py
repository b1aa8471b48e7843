"""The one vocabulary every layer shares: engine names, their display labels and lane order.

Defined here, in the hub, because every reader needs them and ``traces`` imports nothing else;
the compiler, runtime, monitor, neuron-top and the Explorer import these names instead of
spelling them out.

>>> ENGINE_LABELS["gpsimd"], SUMMARY_ENGINE_PREFIX["tensor"]
('GpSimd', 'tensor_engine')
>>> [e for e in LANE_ORDER if e in COMPUTE_ENGINES]
['sync', 'tensor', 'vector', 'scalar', 'gpsimd']
"""
from __future__ import annotations

#: Engine names used in ``instructions.engine`` and the ``<engine>_busy_ns`` columns of ``executions``.
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync", "dma", "cc", "cpu")

#: Engines that run one in-order instruction stream each (their busy time is a plain sum).
COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync")

#: Engines whose queues overlap (their active time is the union of their intervals).
CONCURRENT_ENGINES = ("dma", "cc", "cpu")

#: Engines that live on the device: everything but the host CPU (device time never includes ``cpu``).
DEVICE_ENGINES = tuple(e for e in ENGINES if e != "cpu")

#: The DMA lane (``queue``) of a core's host<->device copies on the device timeline: the runtime's
#: ``nrt_tensor_write`` / ``nrt_tensor_read`` (``host_transfer`` events), named as the real system profile
#: names its per-core track (``<iid>/NC:0/host_to_device_transfers``, reference §3.8). Not an instruction
#: queue: a copy runs between executions, so it never counts in device busy or DMA active time.
HOST_TRANSFER_QUEUE = "host_to_device_transfers"

#: Display labels, as the real profiler names its tracks (reference §3.5).
ENGINE_LABELS = {"tensor": "Tensor", "vector": "Vector", "scalar": "Scalar", "gpsimd": "GpSimd",
                 "sync": "Sync", "dma": "DMA", "cc": "CC-core", "cpu": "CPU"}

#: Lane order inside one core, top to bottom, as the real Explorer draws it: DMA queues first.
LANE_ORDER = ("dma", "sync", "tensor", "vector", "scalar", "gpsimd", "cc", "cpu")

#: Summary column prefixes the real profiler uses (``tensor_engine_active_time_percent`` ...).
SUMMARY_ENGINE_PREFIX = {"tensor": "tensor_engine", "vector": "vector_engine", "scalar": "scalar_engine",
                         "gpsimd": "gpsimd_engine", "sync": "sync_engine"}

#: ``ops.placement`` of an op that runs on the host instead of the device.
FALLBACK_PLACEMENT = "cpu_fallback"


def busy_column(engine: str) -> str:
    """The ``executions`` column holding an engine's busy time.

    >>> busy_column("dma")
    'dma_busy_ns'
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; engines are {', '.join(ENGINES)}")
    return f"{engine}_busy_ns"

#: Engines the monitor reports per core (``neuron_stack.engines``), in the order neuron-top draws them.
MONITOR_ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma", "sync")
