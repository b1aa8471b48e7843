"""The KV cache as device memory the model owns (NxDI's ``KVCacheManager``, reference §2.5).

One K and one V tensor per layer, BHSD: ``(kv_cache_batch_size, kv_heads_per_rank, max_length,
head_dim)``, zero-filled. KV heads are sharded over the tensor-parallel ranks with NxDI's default GQA
strategy ``REPLICATE_TO_TP_DEGREE``: with fewer KV heads than ranks each rank holds one (replicated),
else ``kv_heads / tp`` (the TP degree must divide or be a multiple of the KV head count). Its bytes are
reserved on the NeuronCore as their own ``kv_cache`` category, per rank, in ``torch_dtype`` (what the
device would hold; real-number runs compute in fp32 on the host).

>>> from transformers import LlamaConfig
>>> from neuron_stack.inference.config import NeuronConfig
>>> cfg = LlamaConfig(num_attention_heads=32, num_key_value_heads=8, hidden_size=4096, num_hidden_layers=32)
>>> nc = NeuronConfig(tp_degree=32, batch_size=4, seq_len=2048, torch_dtype="bfloat16")
>>> kv = KVCacheManager(cfg, nc, allocate=False)
>>> kv.shape, kv.bytes_per_core // 2**20
((4, 1, 2048, 128), 128)
"""

from __future__ import annotations

import math

import torch

from neuron_stack.device import clock

from .config import InferenceError, NeuronConfig
from .modeling import kv_geometry

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CATEGORY = "kv_cache"


def kv_heads_per_rank(kv_heads: int, tp_degree: int) -> int:
    """KV heads each rank holds under REPLICATE_TO_TP_DEGREE.

    >>> kv_heads_per_rank(8, 32), kv_heads_per_rank(8, 4), kv_heads_per_rank(8, 1)
    (1, 2, 8)
    """
    if kv_heads >= tp_degree:
        if kv_heads % tp_degree:
            raise InferenceError(
                f"{kv_heads} KV heads do not split over tp_degree={tp_degree}: use a TP degree "
                "that divides the KV head count, or a multiple of it"
            )
        return kv_heads // tp_degree
    if tp_degree % kv_heads:
        raise InferenceError(
            f"tp_degree={tp_degree} is not a multiple of the {kv_heads} KV heads "
            "(REPLICATE_TO_TP_DEGREE needs tp % kv_heads == 0)"
        )
    return 1


class KVCacheManager:
    """K/V tensors for every layer and slot; ``allocate_on=core`` reserves their HBM on that core."""

    def __init__(self, hf_config, nc: NeuronConfig, allocate: bool = True, allocate_on: int | None = None):
        _, kv, head_dim = kv_geometry(hf_config)
        self.layers = int(hf_config.num_hidden_layers)
        self.shape = (nc.kv_cache_batch_size, kv_heads_per_rank(kv, nc.tp_degree), nc.max_length, head_dim)
        self.bytes_per_core = 2 * self.layers * math.prod(self.shape) * ELEMENT_BYTES[nc.torch_dtype]
        self.tensors = [torch.zeros(self.shape) for _ in range(2 * self.layers)] if allocate else []
        self.target, self.core = nc.target, None
        if allocate_on is not None:
            self._reserve(allocate_on)

    def reset(self) -> None:
        for t in self.tensors:
            t.zero_()

    def _reserve(self, core: int) -> None:
        from neuron_stack.runtime.errors import OutOfDeviceMemory
        from neuron_stack.runtime.session import Session

        session = Session.get(self.target)
        used = session.device_memory[core]
        have = session.profile.hbm_bytes_per_core - sum(used.values())
        if self.bytes_per_core > have:
            raise OutOfDeviceMemory(
                f"out of device memory for the KV cache on NeuronCore {core}: needs "
                f"{self.bytes_per_core / 2**20:.1f} MiB {self.shape} x {2 * self.layers} but "
                f"{max(have, 0) / 2**20:.1f} MiB is free; use a smaller "
                "batch_size or seq_len, or a larger tp_degree"
            )
        used[CATEGORY] = used.get(CATEGORY, 0) + self.bytes_per_core
        session.live.set_device_memory(core, CATEGORY, used[CATEGORY])
        self.core, self.session = core, session
        with session.record_lock:
            rec = session.recorder
            if rec is not None:
                rec.append(
                    "memory",
                    {
                        "ts_ns": [clock.now_ns()],
                        "run_id": [session.run_id],
                        "core": [core],
                        "location": ["device"],
                        "category": [CATEGORY],
                        "bytes": [used[CATEGORY]],
                    },
                )

    def usage(self, active_slots: int) -> float:
        """The share of cache rows (slots) holding a sequence: vLLM's kv_cache_usage_perc (0..1)."""
        return active_slots / self.shape[0] if self.shape[0] else 0.0
