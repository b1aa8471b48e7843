"""Large language models on the stack: projection mode for full-size decoders (``project``) and an
Optimum-Neuron-shaped on-ramp (``NeuronModelForCausalLM``, ``NeuronModelForSequenceClassification``).

These classes are ours, shaped like Hugging Face Optimum Neuron's so its examples read the same; they
are not Optimum Neuron. See docs/llm.md.

>>> from neuron_stack.llm import project                                   # doctest: +SKIP
>>> print(project("llama-3-8b", tp_degree=8).verdict())                    # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import sys
import types

from neuron_stack.llm.configs import PRESETS, ConfigError, load_config

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


_LAZY = {"project": "project", "Projection": "project", "GraphProjection": "project", "rank_config": "project",
         "NeuronModelForCausalLM": "optimum", "NeuronModelForSequenceClassification": "optimum"}


def __getattr__(name: str):
    # lazy, so `neuron-llm` checks its inputs (llm.configs) before torch and the compiler load
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'neuron_stack.llm' has no attribute {name!r}")


class _Package(types.ModuleType):
    """Keeps ``neuron_stack.llm.project`` the function: importing the submodule of the same name would
    otherwise rebind the package attribute to the module."""

    def __setattr__(self, name, value):
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
