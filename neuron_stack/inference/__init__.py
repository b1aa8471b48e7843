"""LLM inference on the simulated NeuronCore, shaped like NxD Inference (NxDI) — our own package, not
NxDI: ``NeuronConfig``, ``InferenceConfig``, ``NeuronLlamaForCausalLM`` with ``compile`` / ``load`` /
``HuggingFaceGenerationAdapter.generate``, bucketing, an on-device KV cache, continuous batching
(:mod:`.engine`), the ``inference_demo`` CLI (:mod:`.demo`) and an OpenAI-compatible server
(:mod:`.server`). See docs/inference.md.

>>> from neuron_stack.inference import generate_buckets
>>> generate_buckets(128, 1024)
[128, 256, 512, 1024]
"""

from __future__ import annotations

from .config import (
    InferenceConfig,
    InferenceError,
    NeuronConfig,
    OnDeviceSamplingConfig,
    generate_buckets,
    get_target_bucket,
    load_pretrained_config,
)

__all__ = [
    "NeuronConfig",
    "OnDeviceSamplingConfig",
    "InferenceConfig",
    "InferenceError",
    "load_pretrained_config",
    "generate_buckets",
    "get_target_bucket",
    "NeuronCausalLM",
    "NeuronLlamaForCausalLM",
    "HuggingFaceGenerationAdapter",
    "KVCacheManager",
]


def __getattr__(name: str):  # torch-heavy classes load on first use
    if name in ("NeuronCausalLM", "NeuronLlamaForCausalLM", "HuggingFaceGenerationAdapter"):
        from . import application

        return getattr(application, name)
    if name == "KVCacheManager":
        from .kvcache import KVCacheManager

        return KVCacheManager
    raise AttributeError(f"module 'neuron_stack.inference' has no attribute {name!r}")
