"""neuron_stack: capture, compile and run PyTorch models on a simulated NeuronCore.

The public API is imported lazily so that light tools (``neuron-ls``) do not pay for torch.

>>> import neuron_stack
>>> sorted(neuron_stack.__all__)[:3]
['CPUFallbackWarning', 'NeuronModule', 'PartitionerConfig']
"""
from __future__ import annotations

import sys

__all__ = ["trace", "load", "analyze", "NeuronModule", "PartitionerConfig", "CPUFallbackWarning"]


from .runtime import interrupt as _interrupt

_interrupt.install()   # profiled (inspect): an uncaught Ctrl-C is one line, not a traceback through torch

if "torch" in sys.modules:   # the neuron device; torch is never imported here (neuron-ls stays light)
    from .eager import register as _register
    _register()


def __getattr__(name: str):
    if name in __all__:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'neuron_stack' has no attribute {name!r}")
