"""Large language models on the stack: projection mode for full-size decoders (``project``) and an
Optimum-Neuron-shaped on-ramp (``NeuronModelForCausalLM``, ``NeuronModelForSequenceClassification``).

These classes are ours, shaped like Hugging Face Optimum Neuron's so its examples read the same; they
are not Optimum Neuron. See docs/llm.md.

>>> from neuron_stack.llm import project                                   # doctest: +SKIP
>>> print(project("llama-3-8b", tp_degree=8).verdict())                    # doctest: +SKIP
"""

from __future__ import annotations

from neuron_stack.llm.configs import PRESETS, ConfigError, load_config
from neuron_stack.llm.project import GraphProjection, Projection, project, rank_config

__all__ = [
    "project",
    "Projection",
    "GraphProjection",
    "rank_config",
    "load_config",
    "PRESETS",
    "ConfigError",
    "NeuronModelForCausalLM",
    "NeuronModelForSequenceClassification",
]


def __getattr__(name: str):
    if name in ("NeuronModelForCausalLM", "NeuronModelForSequenceClassification"):
        from neuron_stack.llm import optimum

        return getattr(optimum, name)
    raise AttributeError(f"module 'neuron_stack.llm' has no attribute {name!r}")
