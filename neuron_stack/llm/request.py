"""What one call of a sub-model costs a request beside the device graph: request time = device time + these.

A projection's device time is the graph's schedule on the cost model. A request also waits for what the
runtime and the serving loop do around each call; each component below is a formula over the device
profile's cited constants (device/profiles.py), never a constant fitted to a published row:

- ``nrt_launch``: the runtime starts the execution (the NEFF's start trigger) and the host learns it finished
  (a completion semaphore); costed as one DMA's fixed overhead, the NKI DMA guide's ~1.3 us of descriptor,
  sync and semaphore-to-start time (``dma_fixed_ns``).
- ``inputs_to_device``: what position and mask preparation hands the device, each its own PCIe copy
  (``device.cost.pcie_ns``: a DMA's fixed cost + bytes at ``pcie_gbps``): input_ids, position_ids and seq_ids
  (int32) and the attention mask, which NxDI pads to the bucket (reference §2.3: "only the mask is padded").
- ``outputs_to_host``: where the host samples (Hugging Face ``generate``, transformers-neuronx) the last
  position's logits, batch x vocab, over PCIe; with NxDI's on-device sampling the sampled ids (batch int32).
- ``collectives``: the call's tensor-parallel collectives at its TP degree, hop latencies (the intra-node
  collectives page: 1-2 us per hop) and bytes (``device/collective_cost.py``), with the algorithms of the
  projection's runtime release (``neuron_release``: the pages' Mesh/RDH/KangaRing, or Neuron 2.18's Ring);
  already part of device time, shown so the fixed latency at that TP degree is visible beside the rest.

Not modelled (no public source gives their cost): the host CPU's own time to sample (a top-k over the
vocabulary), to build position ids and masks, and the serving framework's per-step Python (transformers-neuronx,
vLLM's scheduler); HTTP and queueing (the published figures are one concurrent request).

>>> from neuron_stack.device.profiles import get_profile
>>> c = call_components(get_profile("trn1"), batch=1, tokens=1, bucket=4096, vocab=128256, dtype_bytes=2,
...                     on_device_sampling=False, collective_ns=0)
>>> [x.name for x in c], added_ns(c) > 0
(['nrt_launch', 'inputs_to_device', 'outputs_to_host', 'collectives'], True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from neuron_stack.device.cost import pcie_ns
from neuron_stack.device.profiles import DeviceProfile

#: each component's source, as the report prints it
SOURCES = {
    "nrt_launch": "NKI DMA guide: ~1.3 us descriptor + sync + semaphore overhead (device profile dma_fixed_ns)",
    "inputs_to_device": "PCIe copies (device.cost.pcie_ns: one DMA's fixed cost + bytes at pcie_gbps)",
    "outputs_to_host": "PCIe copy of the logits (host sampling) or the sampled ids (on-device sampling)",
    "collectives": "the runtime release's collective algorithms at the TP degree (intra-node collectives page, "
                   "runtime release notes; in device time)",
}
#: int32: NxDI hands input_ids, position_ids, seq_ids and the attention mask to the device as int32
_ID_BYTES = 4


@dataclass(frozen=True)
class Component:
    """One component of a call's request time: its name, nanoseconds, whether device time already holds it."""

    name: str
    ns: int
    in_device_time: bool = False
    source: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def call_components(p: DeviceProfile, *, batch: int, tokens: int, bucket: int, vocab: int, dtype_bytes: int,
                    on_device_sampling: bool, collective_ns: int) -> list[Component]:
    """The components of one call of ``tokens`` tokens per sequence attending over ``bucket`` (see the module).

    Example: ``added_ns(call_components(get_profile("trn1"), batch=8, tokens=1, bucket=512, vocab=32000,
    dtype_bytes=2, on_device_sampling=True, collective_ns=0))``.
    """
    mask_len = bucket if tokens == 1 else tokens
    inputs = [batch * tokens * _ID_BYTES] * 2 + [batch * _ID_BYTES, batch * mask_len * _ID_BYTES]
    out = batch * _ID_BYTES if on_device_sampling else batch * vocab * dtype_bytes
    return [
        Component("nrt_launch", int(p.dma_fixed_ns), source=SOURCES["nrt_launch"]),
        Component("inputs_to_device", sum(pcie_ns(p, b) for b in inputs), source=SOURCES["inputs_to_device"]),
        Component("outputs_to_host", pcie_ns(p, out), source=SOURCES["outputs_to_host"]),
        Component("collectives", int(collective_ns), True, SOURCES["collectives"]),
    ]


def added_ns(components: list[Component]) -> int:
    """What the components add to device time (those not already in it)."""
    return sum(c.ns for c in components if not c.in_device_time)
